"""Sessions' lives through the sync SDK: create, context manager, connect, list, pause,
resume, suspend, update."""

from __future__ import annotations

import pytest

from conftest import TEMPLATE
from space_sdk import InvalidStateError, NotFoundError, Session, SessionState


def test_create_runs_a_session_with_what_was_asked(client, track):
    session = track(
        Session.create(
            template=TEMPLATE, env={"GREETING": "hi"}, cpus=0.5, memory_mib=256, idle_timeout=600, client=client
        )
    )
    assert session.state == SessionState.RUNNING and session.state == "running"
    assert session.id.startswith("ses_")
    info = session.info
    assert (info.template, info.resources.cpus, info.resources.memory_mib) == (TEMPLATE, 0.5, 256)
    assert info.lifetime.idle_timeout_secs == 600
    assert session.commands.run("echo $GREETING").stdout == "hi\n"
    assert session.refresh().id == session.id


def test_the_context_manager_destroys_the_session_unless_kept(client, track):
    with Session.create(template=TEMPLATE, client=client) as session:
        track(session)
        assert session.commands.run("true").exit_code == 0
    assert session.state == SessionState.DESTROYED
    with pytest.raises(NotFoundError):
        Session.connect(session.id, client=client)

    with Session.create(template=TEMPLATE, keep=True, client=client) as kept:
        track(kept)
    assert Session.connect(kept.id, client=client).refresh().state == SessionState.RUNNING


def test_a_failing_block_still_destroys_its_session(client, track):
    with pytest.raises(RuntimeError):
        with Session.create(template=TEMPLATE, client=client) as session:
            track(session)
            raise RuntimeError("the agent failed")
    assert session.state == SessionState.DESTROYED
    assert session.id not in [s.id for s in Session.list(client=client)]


def test_connect_and_list_find_the_session(client, session):
    again = Session.connect(session.id, client=client)
    assert again.id == session.id and again.state == SessionState.RUNNING
    ids = [s.id for s in Session.list(client=client)]
    assert session.id in ids
    running = Session.list(state="running", client=client)
    assert session.id in [s.id for s in running] and all(s.state == "running" for s in running)
    assert session.id not in [s.id for s in Session.list(state="paused", client=client)]
    assert session.id in [s.id for s in Session.list(template=TEMPLATE, client=client)]


def test_pause_freezes_and_resume_thaws(session):
    session.commands.run("echo before > /tmp/state")
    assert session.pause().state == SessionState.PAUSED
    with pytest.raises(InvalidStateError) as refused:
        session.commands.run("true")
    assert (refused.value.status, refused.value.code) == (409, "invalid_state")
    assert session.resume().state == SessionState.RUNNING
    assert session.files.read("/tmp/state") == "before\n"


def test_connect_resumes_a_paused_session(client, session):
    session.pause()
    again = Session.connect(session.id, client=client)
    assert again.state == SessionState.RUNNING
    assert again.commands.run("true").exit_code == 0
    assert Session.connect(session.id, resume=False, client=client).state == SessionState.RUNNING


def test_suspend_frees_the_sandbox_and_connect_resumes_it_with_its_processes(client, session):
    session.files.write("/tmp/note", "kept across suspend")
    sleeper = session.commands.run("sleep 600", background=True)
    session.commands.run("true")
    assert session.suspend().state == SessionState.SUSPENDED
    assert session.info.sandbox_id is None
    again = Session.connect(session.id, client=client)
    assert again.state == SessionState.RUNNING
    assert again.files.read("/tmp/note") == "kept across suspend"
    running = [p.pid for p in again.commands.list() if p.running]
    assert sleeper.pid in running, f"the background process {sleeper.pid} did not survive: {again.commands.list()}"


def test_update_changes_the_lifetime(session):
    info = session.update(idle_timeout=120, max_age=3600)
    assert (info.lifetime.idle_timeout_secs, info.lifetime.max_age_secs) == (120, 3600)
    info = session.update(idle_timeout=0)
    assert (info.lifetime.idle_timeout_secs, info.lifetime.max_age_secs) == (None, 3600)


def test_stats_and_events_describe_the_session(session):
    session.commands.run("true")
    stats = session.stats()
    assert stats.sandbox is not None and stats.sandbox.memory_limit_bytes == 512 << 20
    kinds = [e.to_state for e in session.events()]
    assert SessionState.RUNNING in kinds


def test_destroy_is_idempotent(session):
    session.destroy()
    assert session.state == SessionState.DESTROYED
    session.destroy()
