"""API errors arrive as typed exceptions carrying the code, the status and the message."""

from __future__ import annotations

import pickle
import socket

import pytest

from conftest import TEMPLATE
from space_sdk import (
    APIConnectionError,
    AuthenticationError,
    BadRequestError,
    Client,
    ConfigurationError,
    ConflictError,
    InvalidStateError,
    NotFoundError,
    ProcessNotFoundError,
    Session,
    SpaceError,
    error_for,
)


def test_a_missing_session_is_404_not_found(client):
    with pytest.raises(NotFoundError) as missing:
        Session.connect("ses_doesnotexist0000000000", client=client)
    error = missing.value
    assert (error.code, error.status) == ("not_found", 404)
    assert "ses_doesnotexist" in error.message and isinstance(error, SpaceError)
    assert "not_found" in str(error) and "404" in str(error)


def test_bad_input_is_400_with_a_message_that_says_what_to_do(client):
    with pytest.raises(BadRequestError) as bad:
        Session.create(template=TEMPLATE, memory_mib=1, client=client)
    assert (bad.value.code, bad.value.status) == ("bad_request", 400)
    assert "memory_mib" in bad.value.message
    with pytest.raises(BadRequestError) as unknown:
        Session.create(template="no-such-template", client=client)
    assert (unknown.value.code, unknown.value.status) == ("unknown_template", 400)
    assert "busybox" in unknown.value.message


def test_a_call_in_the_wrong_state_is_409(session):
    session.pause()
    with pytest.raises(InvalidStateError) as wrong:
        session.files.write("/work/x", "x")
    assert isinstance(wrong.value, ConflictError)
    assert (wrong.value.code, wrong.value.status) == ("invalid_state", 409) and "paused" in wrong.value.message
    with pytest.raises(InvalidStateError):
        session.commands.list()


def test_websocket_calls_raise_the_same_errors(session):
    session.pause()
    with pytest.raises(InvalidStateError) as streamed:
        session.commands.run("true", on_stdout=print)
    assert streamed.value.status == 409
    with pytest.raises(InvalidStateError):
        session.files.watch("/")
    session.resume()
    with pytest.raises(ProcessNotFoundError) as gone:
        session.commands.connect(999999)
    assert gone.value.code == "no_such_process"


def test_a_wrong_key_is_401(server):
    with pytest.raises(AuthenticationError) as denied:
        Client(server["url"], "not-a-key").templates()
    assert (denied.value.status, denied.value.code) == (401, "unauthorized")


def test_an_unreachable_server_is_a_connection_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(APIConnectionError):
        Client(f"http://127.0.0.1:{port}", "key").templates()


def test_configuration_is_required(monkeypatch):
    monkeypatch.delenv("SPACE_API_KEY", raising=False)
    with pytest.raises(ConfigurationError):
        Client("http://127.0.0.1:1")
    with pytest.raises(ConfigurationError):
        Client("ftp://example", "key")


def test_errors_map_by_code_then_by_status_and_survive_pickling():
    error = error_for("session_suspended", None, "resume it")
    assert isinstance(error, InvalidStateError) and error.status == 409
    newer = error_for("some_future_code", 404, "gone")
    assert type(newer) is NotFoundError and newer.code == "some_future_code"
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), again.code, again.status, again.message) == (type(error), error.code, 409, "resume it")
    from space_sdk import TimeoutError as SdkTimeout

    assert isinstance(error_for("timeout", 504, "slow"), TimeoutError) and issubclass(SdkTimeout, SpaceError)
