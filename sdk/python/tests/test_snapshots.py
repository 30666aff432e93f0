"""Snapshots, restore and fork through the sync SDK."""

from __future__ import annotations

import pytest

from space_sdk import Session, SessionState, SnapshotKind, SnapshotNotFoundError


def test_a_disk_snapshot_is_restored(session):
    session.files.write("/work/state.txt", "v1")
    snap = session.snapshot("disk", name="v1")
    assert (snap.kind, snap.name, snap.session_id) == (SnapshotKind.DISK, "v1", session.id)
    session.files.write("/work/state.txt", "v2")
    session.files.write("/work/later.txt", "later")
    assert snap.id in [s.id for s in session.snapshots()]
    restored = session.restore(snap)
    assert restored is session and session.state == SessionState.RUNNING
    assert session.files.read("/work/state.txt") == "v1"
    assert not session.files.exists("/work/later.txt")
    assert session.get_snapshot(snap.id).id == snap.id


def test_restore_takes_an_id_and_snapshots_can_be_deleted(session):
    first = session.snapshot()
    session.files.write("/work/x", "x")
    session.restore(first.id)
    assert not session.files.exists("/work/x")
    session.delete_snapshot(first)
    assert first.id not in [s.id for s in session.snapshots()]
    with pytest.raises(SnapshotNotFoundError) as missing:
        session.restore(first)
    assert (missing.value.code, missing.value.status) == ("snapshot_not_found", 404)


def test_a_full_snapshot_keeps_processes(session):
    sleeper = session.commands.run(["sleep", "600"], background=True)
    snap = session.snapshot("full", name="with-sleep")
    assert snap.kind == SnapshotKind.FULL
    sleeper.kill()
    sleeper.wait(timeout=30)
    assert session.commands.run("pidof sleep").exit_code != 0
    session.restore(snap)
    assert session.commands.run("pidof sleep").exit_code == 0, "the process did not come back with the snapshot"


def test_a_background_command_is_followed_across_a_full_snapshot(session):
    # A full snapshot ends the streams open at that moment; the handle attaches again and
    # gets the rest of the output, none of it twice.
    lines = []
    handle = session.commands.run("echo a; sleep 2; echo b; echo e >&2", background=True, on_stdout=lines.append)
    session.snapshot("full")
    result = handle.wait(timeout=60)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "a\nb\n", "e\n")
    assert "".join(lines) == "a\nb\n"


def test_fork_makes_independent_sessions_that_continue_from_now(client, session, track):
    session.files.write("/work/origin.txt", "from the parent")
    children = track(session.fork(2))
    assert len(children) == 2 and all(isinstance(c, Session) for c in children)
    assert len({c.id for c in children} | {session.id}) == 3
    for i, child in enumerate(children):
        assert child.state == SessionState.RUNNING
        assert child.files.read("/work/origin.txt") == "from the parent"
        child.files.write("/work/mine.txt", f"child {i}")
    assert [c.files.read("/work/mine.txt") for c in children] == ["child 0", "child 1"]
    assert not session.files.exists("/work/mine.txt")


def test_fork_from_a_snapshot(session, track):
    session.files.write("/work/when.txt", "at the snapshot")
    snap = session.snapshot(name="fork-point")
    session.files.write("/work/when.txt", "after it")
    (child,) = track(session.fork(from_snapshot=snap))
    with child:
        assert child.files.read("/work/when.txt") == "at the snapshot"
    assert child.state == SessionState.DESTROYED


def test_a_snapshot_that_outlives_its_session_is_forked_from_after_it(session, track):
    session.files.write("/work/kept.txt", "kept")
    snap = session.snapshot(outlives_session=True)
    plain = session.snapshot()
    assert (snap.outlives_session, plain.outlives_session) == (True, False)
    session.destroy()
    assert [s.id for s in session.snapshots()] == [snap.id]
    (child,) = track(session.fork(from_snapshot=snap))
    with child:
        assert child.files.read("/work/kept.txt") == "kept"
    session.delete_snapshot(snap)
    with pytest.raises(SnapshotNotFoundError):
        session.fork(from_snapshot=snap)
