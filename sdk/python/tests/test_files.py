"""Files through the sync SDK: small and large (streamed, never held whole), write_many,
listing, moving, removing, watching."""

from __future__ import annotations

import hashlib
import io
import threading
import tracemalloc

import pytest

from space_sdk import BadRequestError, FileType, PathNotFoundError, TimeoutError

LARGE = 64 << 20
CHUNK = 1 << 20


def blocks(count: int, digest):
    """``count`` MiB of data that is not all alike, hashed into ``digest`` as it is made."""
    for i in range(count):
        block = hashlib.sha256(str(i).encode()).digest() * (CHUNK // 32)
        digest.update(block)
        yield block


def test_small_files_round_trip_as_text_and_bytes(session):
    info = session.files.write("/work/a/b/hello.txt", "héllo\n")
    assert (info.path, info.bytes) == ("/work/a/b/hello.txt", len("héllo\n".encode()))
    assert session.files.read("/work/a/b/hello.txt") == "héllo\n"
    raw = bytes(range(256)) * 10
    session.files.write("/work/raw.bin", raw)
    assert session.files.read("/work/raw.bin", format="bytes") == raw
    session.files.write("/work/empty", b"")
    assert session.files.read("/work/empty", format="bytes") == b""
    session.files.write("/work/from-file", io.BytesIO(b"from a file object"))
    assert session.files.read("/work/from-file") == "from a file object"


def test_mode_sets_permissions(session):
    session.files.write("/work/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    assert session.files.stat("/work/run.sh").mode & 0o777 == 0o755
    assert session.commands.run("/work/run.sh").stdout == "ran\n"
    session.files.write("/work/private", "x", mode="600")
    assert session.files.stat("/work/private").mode & 0o777 == 0o600


def test_a_large_file_is_streamed_both_ways_without_being_held_in_memory(session, tmp_path):
    sent = hashlib.sha256()
    tracemalloc.start()
    try:
        info = session.files.write("/work/large.bin", blocks(LARGE // CHUNK, sent))
        _, peak_up = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        received = hashlib.sha256()
        size = 0
        with session.files.read("/work/large.bin", stream=True) as stream:
            assert stream.size == LARGE
            for chunk in stream:
                received.update(chunk)
                size += len(chunk)
        _, peak_down = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.bytes == LARGE and size == LARGE
    assert received.hexdigest() == sent.hexdigest()
    assert session.commands.run("sha256sum /work/large.bin").stdout.split()[0] == sent.hexdigest()
    assert peak_up < 8 << 20 and peak_down < 8 << 20, f"peaks {peak_up} / {peak_down} bytes: not streamed"

    local = tmp_path / "large.bin"
    assert session.files.download("/work/large.bin", local) == LARGE
    with open(local, "rb") as f:
        copy = session.files.write("/work/copy.bin", f)
    assert copy.bytes == LARGE
    assert session.commands.run("cmp /work/large.bin /work/copy.bin").exit_code == 0


def test_write_many_writes_every_file(session):
    results = session.files.write_many({"/work/m/1.txt": "one", "/work/m/2.txt": b"two"})
    assert [r.path for r in results] == ["/work/m/1.txt", "/work/m/2.txt"]
    session.files.write_many([("/work/m/3.txt", "three"), {"path": "/work/m/4.sh", "data": "echo 4", "mode": 0o700}])
    names = sorted(e.name for e in session.files.list("/work/m"))
    assert names == ["1.txt", "2.txt", "3.txt", "4.sh"]
    assert session.files.read("/work/m/3.txt") == "three"
    assert session.files.stat("/work/m/4.sh").mode & 0o777 == 0o700


def test_list_stat_exists_mkdir_move_and_remove(session):
    session.files.mkdir("/work/tree/sub")
    session.files.write("/work/tree/sub/leaf", "leaf")
    session.files.write("/work/tree/top", "top")
    top = {e.name: e for e in session.files.list("/work/tree")}
    assert set(top) == {"sub", "top"} and top["sub"].type == FileType.DIR and top["sub"].is_dir
    assert top["top"].size == 3 and top["top"].path == "/work/tree/top"
    deep = {e.path for e in session.files.list("/work/tree", depth=2)}
    assert "/work/tree/sub/leaf" in deep
    assert session.files.exists("/work/tree/top") and not session.files.exists("/work/tree/nope")
    session.files.move("/work/tree/top", "/work/tree/moved")
    assert not session.files.exists("/work/tree/top") and session.files.read("/work/tree/moved") == "top"
    session.files.remove("/work/tree/moved")
    assert not session.files.exists("/work/tree/moved")
    with pytest.raises(BadRequestError) as not_empty:
        session.files.remove("/work/tree")
    assert not_empty.value.code == "directory_not_empty"
    session.files.remove("/work/tree", recursive=True)
    assert not session.files.exists("/work/tree")


def test_missing_paths_raise_path_not_found(session):
    for call in (
        lambda: session.files.read("/nope/file"),
        lambda: session.files.stat("/nope"),
        lambda: session.files.list("/nope"),
        lambda: session.files.remove("/nope"),
    ):
        with pytest.raises(PathNotFoundError) as missing:
            call()
        assert (missing.value.code, missing.value.status) == ("file_not_found", 404)


def test_watch_reports_changes(session):
    session.files.mkdir("/work/watched/deep")
    with session.files.watch("/work/watched") as watcher:
        session.files.write("/work/watched/new.txt", "x")
        # An upload goes to a temporary file renamed into place: events for it come first.
        events = [watcher.get(timeout=30)]
        while not events[-1].path.endswith("/new.txt"):
            events.append(watcher.get(timeout=30))
        assert events[-1].kind in ("create", "modify", "moved_to") and not events[-1].is_dir, events
        with pytest.raises(TimeoutError):
            while True:  # drain what the write produced; then nothing more comes
                watcher.get(timeout=0.5)


def test_a_recursive_watch_delivers_to_a_callback(session):
    session.files.mkdir("/work/rec/a/b")
    seen = []
    done = threading.Event()

    def on_event(event) -> None:
        seen.append(event)
        if any(e.path.endswith("b/deep.txt") for e in seen):
            done.set()

    watcher = session.files.watch("/work/rec", recursive=True, on_event=on_event)
    try:
        session.files.write("/work/rec/a/b/deep.txt", "deep")
        assert done.wait(30), seen
    finally:
        watcher.stop()
    assert watcher.error is None
