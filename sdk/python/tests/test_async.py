"""The asyncio client against the live server: the same behaviours as the sync tests."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from conftest import TEMPLATE
from space_sdk import (
    AsyncCommandHandle,
    AsyncSession,
    BadRequestError,
    InvalidStateError,
    NotFoundError,
    PathNotFoundError,
    SessionState,
    SnapshotNotFoundError,
    TimeoutError,
)

pytestmark = pytest.mark.anyio

CHUNK = 1 << 20


async def test_lifecycle_create_pause_resume_connect_list_destroy(aclient, track):
    async with await AsyncSession.create(template=TEMPLATE, env={"X": "1"}, client=aclient) as session:
        track(session.id)
        assert session.state == SessionState.RUNNING
        assert (await session.commands.run("echo $X")).stdout == "1\n"
        assert (await session.pause()).state == SessionState.PAUSED
        again = await AsyncSession.connect(session.id, client=aclient)
        assert again.state == SessionState.RUNNING
        listed = await AsyncSession.list(state="running", client=aclient)
        assert session.id in [s.id for s in listed]
        info = await session.update(idle_timeout=300)
        assert info.lifetime.idle_timeout_secs == 300
    assert session.state == SessionState.DESTROYED
    with pytest.raises(NotFoundError):
        await AsyncSession.connect(session.id, client=aclient)


async def test_commands_to_completion_and_streamed(asession):
    result = await asession.commands.run("echo out; echo err >&2; exit 2")
    assert (result.exit_code, result.stdout, result.stderr) == (2, "out\n", "err\n")
    chunks = []

    async def on_stdout(text: str) -> None:  # a coroutine callback
        chunks.append(text)

    errors = []
    streamed = await asession.commands.run(
        "for i in 1 2 3; do echo $i; echo e$i >&2; sleep 0.05; done", on_stdout=on_stdout, on_stderr=errors.append
    )
    assert "".join(chunks) == streamed.stdout == "1\n2\n3\n" and len(chunks) > 1
    assert "".join(errors) == "e1\ne2\ne3\n"
    assert (await asession.commands.run("sleep 30", timeout=0.5)).timed_out


async def test_stdin_text_bytes_and_async_iterables(asession):
    assert (await asession.commands.run("cat", stdin="typed")).stdout == "typed"
    digest = hashlib.sha256()

    async def chunks():
        for i in range(8):
            block = bytes([i]) * (512 * 1024)
            digest.update(block)
            yield block

    result = await asession.commands.run("sha256sum", stdin=chunks())
    assert result.stdout.split()[0] == digest.hexdigest()


async def test_background_handles_wait_kill_and_take_stdin(asession):
    handle = await asession.commands.run("echo hi; sleep 0.2; exit 3", background=True)
    assert isinstance(handle, AsyncCommandHandle)
    assert (await handle.wait(timeout=30)).exit_code == 3 and handle.stdout == "hi\n"

    sleeper = await asession.commands.run("sleep 600", background=True)
    with pytest.raises(TimeoutError):
        await sleeper.wait(timeout=0.2)
    assert sleeper.pid in [p.pid for p in await asession.commands.list() if p.running]
    assert await sleeper.kill() is True
    assert (await sleeper.wait(timeout=30)).signal == 9

    cat = await asession.commands.run("cat", background=True, stdin=True)
    await cat.send_stdin("fed later")
    await cat.close_stdin()
    assert (await cat.wait(timeout=30)).stdout == "fed later"
    with pytest.raises(InvalidStateError):
        await cat.send_stdin("too late")

    lines = []
    seen = asyncio.Event()
    follower = await asession.commands.run("echo first; sleep 600", background=True)
    await follower.disconnect()
    again = await asession.commands.connect(follower.pid, on_stdout=lambda t: (lines.append(t), seen.set()))
    await asyncio.wait_for(seen.wait(), 30)
    assert "".join(lines) == "first\n"
    await again.kill(15)
    assert (await again.wait(timeout=30)).signal == 15


async def test_a_terminal(asession):
    pty = await asession.pty.create((20, 70))
    async with pty:
        await pty.send_input("stty size; echo done-$((2+3))\n")
        seen = b""
        while b"done-5" not in seen:
            data = await pty.read(timeout=30)
            assert data is not None, seen
            seen += data
        assert b"20 70" in seen
        await pty.resize(50, 132)
        await pty.send_input("stty size; exit 7\n")
        tail = b"".join([chunk async for chunk in pty])
        assert b"50 132" in tail
        assert (await pty.wait(timeout=30)).exit_code == 7


async def test_files_small_large_many_and_listing(asession):
    await asession.files.write("/work/a.txt", "alpha")
    assert await asession.files.read("/work/a.txt") == "alpha"
    assert await asession.files.read("/work/a.txt", format="bytes") == b"alpha"

    sent = hashlib.sha256()

    async def large():
        for i in range(64):
            block = hashlib.sha256(str(i).encode()).digest() * (CHUNK // 32)
            sent.update(block)
            yield block

    info = await asession.files.write("/work/large.bin", large())
    assert info.bytes == 64 * CHUNK
    received = hashlib.sha256()
    stream = await asession.files.read("/work/large.bin", stream=True)
    async with stream:
        async for chunk in stream:
            received.update(chunk)
    assert received.hexdigest() == sent.hexdigest()

    written = await asession.files.write_many({f"/work/many/{i}.txt": str(i) for i in range(10)})
    assert len(written) == 10
    names = sorted(e.name for e in await asession.files.list("/work/many"))
    assert names == sorted(f"{i}.txt" for i in range(10))
    await asession.files.mkdir("/work/d")
    await asession.files.move("/work/a.txt", "/work/d/a.txt")
    assert await asession.files.exists("/work/d/a.txt") and not await asession.files.exists("/work/a.txt")
    assert (await asession.files.stat("/work/d/a.txt")).size == 5
    await asession.files.remove("/work/d", recursive=True)
    with pytest.raises(PathNotFoundError):
        await asession.files.read("/work/d/a.txt")


async def test_watch(asession):
    await asession.files.mkdir("/work/w")
    async with await asession.files.watch("/work/w") as watcher:
        await asession.files.write("/work/w/f", "x")
        event = await watcher.get(timeout=30)
        while not event.path.endswith("/w/f"):  # the upload's temporary file first
            event = await watcher.get(timeout=30)
        assert event.kind in ("create", "modify", "moved_to")

    got = asyncio.Event()
    events = []

    async def on_event(event) -> None:
        events.append(event)
        if event.path.endswith("/w/g"):
            got.set()

    watcher = await asession.files.watch("/work/w", on_event=on_event)
    try:
        await asession.files.write("/work/w/g", "y")
        await asyncio.wait_for(got.wait(), 30)
    finally:
        await watcher.stop()
    assert watcher.error is None


async def test_snapshots_restore_and_fork(asession, track):
    await asession.files.write("/work/v", "1")
    snap = await asession.snapshot("disk", name="one")
    await asession.files.write("/work/v", "2")
    assert snap.id in [s.id for s in await asession.snapshots()]
    await asession.restore(snap)
    assert await asession.files.read("/work/v") == "1"
    children = await asession.fork(2)
    track([c.id for c in children])
    reads = await asyncio.gather(*(c.files.read("/work/v") for c in children))
    assert reads == ["1", "1"]
    for child in children:
        async with child:
            pass
    assert all(c.state == SessionState.DESTROYED for c in children)
    await asession.delete_snapshot(snap)
    with pytest.raises(SnapshotNotFoundError):
        await asession.restore(snap)


async def test_typed_errors(aclient, asession):
    with pytest.raises(NotFoundError) as missing:
        await AsyncSession.connect("ses_doesnotexist0000000000", client=aclient)
    assert (missing.value.code, missing.value.status) == ("not_found", 404)
    with pytest.raises(BadRequestError) as bad:
        await AsyncSession.create(template=TEMPLATE, pids=1, client=aclient)
    assert (bad.value.code, bad.value.status) == ("bad_request", 400)
    await asession.pause()
    with pytest.raises(InvalidStateError) as wrong:
        await asession.commands.run("true")
    assert (wrong.value.code, wrong.value.status) == ("invalid_state", 409)
    with pytest.raises(InvalidStateError):
        await asession.commands.run("true", on_stdout=print)
