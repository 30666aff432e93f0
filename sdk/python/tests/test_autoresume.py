"""Suspended sessions wake on use when created with ``auto_resume`` (issue 15, branch
``keys``); otherwise calls get 409 ``session_suspended`` saying how to resume."""

from __future__ import annotations

import time

import pytest

from space_sdk import SessionState, SessionSuspendedError


def test_calls_on_an_auto_resume_session_resume_it(new_session):
    session = new_session(auto_resume=True)
    assert session.info.auto_resume is True
    session.files.write("/work/kept", "still here")
    session.suspend()
    assert session.refresh().state == SessionState.SUSPENDED
    assert session.commands.run("cat /work/kept").stdout == "still here"
    assert session.refresh().state == SessionState.RUNNING
    session.suspend()
    assert session.files.read("/work/kept") == "still here"
    session.suspend()
    session.commands.list()
    assert session.refresh().state == SessionState.RUNNING


def test_a_session_suspended_by_its_idle_timeout_wakes_on_use(new_session):
    session = new_session(auto_resume=True, idle_timeout=1)
    deadline = time.monotonic() + 120
    while session.refresh().state != SessionState.SUSPENDED:
        assert time.monotonic() < deadline, f"never suspended by its idle timeout: {session.state}"
        time.sleep(0.5)
    assert session.commands.run("echo awake").stdout == "awake\n"


def test_without_auto_resume_calls_get_409_session_suspended(new_session):
    session = new_session()
    session.suspend()
    for call in (lambda: session.commands.run("true"), lambda: session.files.read("/etc/hostname")):
        with pytest.raises(SessionSuspendedError) as asleep:
            call()
        error = asleep.value
        assert (error.status, error.code) == (409, "session_suspended")
        assert "resume" in error.message
    assert session.refresh().state == SessionState.SUSPENDED
