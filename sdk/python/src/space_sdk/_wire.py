"""What the sync and async clients share about the wire: argument normalisation, request
bodies, and the exec WebSocket's framing (``docs/api.md``, "Exec, streaming").

Exec WebSocket (``GET /v1/sessions/{id}/exec/ws``, and ``…/processes/{pid}/attach``):
the client's first text frame is an ``ExecStart``; then binary frames are stdin and text
frames ``{"type": "eof" | "signal" | "resize"}``. The server's binary frames are one channel
byte (1 stdout, 2 stderr) and the bytes; its text frames are ``started``, ``exit`` or
``error``.
"""

from __future__ import annotations

import codecs
import datetime
import json
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import BadRequestError, SandboxUnavailableError, SpaceError, error_for, error_from_body
from .models import CommandResult

CHANNEL_STDOUT = 1
CHANNEL_STDERR = 2
STDIN_CHUNK = 256 * 1024
"""Stdin is sent in frames of at most this many bytes."""
UPLOAD_CHUNK = 1 << 20
"""File-like objects are read (and uploaded) this many bytes at a time."""
RING_CAPACITY = 1 << 20
"""Output ``spaced`` keeps per stream of a background process, replayed to a new attach."""
MAX_REATTACH = 8
"""Attaches again of one handle after its stream was cut, and tries of one attach."""
REATTACH_PAUSE = 0.25
"""Seconds before trying an attach again while the agent is out of reach (longer each time)."""

Command = Union[str, Sequence[str]]
User = Union[int, str, None]
Duration = Union[int, float, datetime.timedelta, None]


def argv(cmd: Command) -> List[str]:
    """A shell command line runs with ``sh -c`` (as E2B's do with bash); a list is the argv."""
    if isinstance(cmd, str):
        return ["sh", "-c", cmd]
    args = [os.fspath(a) if not isinstance(a, str) else a for a in cmd]
    if not args:
        raise BadRequestError("the command is empty: give a command line or a non-empty argv", code="bad_request")
    return args


def seconds(value: Duration, what: str) -> Optional[int]:
    """Whole seconds of a duration given as seconds or a ``timedelta`` (at least 1)."""
    if value is None:
        return None
    secs = value.total_seconds() if isinstance(value, datetime.timedelta) else float(value)
    if secs <= 0:
        raise BadRequestError(f"{what} must be positive, got {value!r}", code="bad_request")
    return max(1, int(round(secs)))


def millis(value: Duration) -> Optional[int]:
    if value is None:
        return None
    secs = value.total_seconds() if isinstance(value, datetime.timedelta) else float(value)
    if secs <= 0:
        raise BadRequestError(f"timeout must be positive, got {value!r}", code="bad_request")
    return max(1, int(secs * 1000))


def parse_user(user: User) -> Optional[Tuple[int, Optional[int]]]:
    """``(uid, gid)`` for numeric users: ``0``, ``"root"``, ``"1000"``, ``"1000:1000"``.
    ``None`` for a user name, which the caller resolves inside the sandbox."""
    if user is None:
        return None
    if isinstance(user, int):
        return (user, None)
    if user == "root":
        return (0, 0)
    uid, _, gid = user.partition(":")
    if uid.isdigit() and (not gid or gid.isdigit()):
        return (int(uid), int(gid) if gid else None)
    return None


def exec_body(
    cmd: Command,
    *,
    cwd: Optional[str],
    env: Optional[Mapping[str, str]],
    ids: Optional[Tuple[int, Optional[int]]],
    timeout: Duration,
) -> Dict[str, Any]:
    """The fields ``ExecRequest`` and ``ExecStart`` share."""
    body: Dict[str, Any] = {"cmd": argv(cmd)}
    if env:
        body["env"] = {str(k): str(v) for k, v in env.items()}
    if cwd is not None:
        body["cwd"] = cwd
    if ids is not None:
        body["uid"] = ids[0]
        if ids[1] is not None:
            body["gid"] = ids[1]
    if timeout is not None:
        body["timeout_ms"] = millis(timeout)
    return body


def request_timeout_for(timeout: Duration, default: float) -> Optional[float]:
    """How long an HTTP call running a command may take: its own timeout and a margin, or no
    limit for a command without one (it may run for hours)."""
    if timeout is None:
        return None
    secs = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    return max(default, secs + 30.0)


def small_text_stdin(stdin: Any) -> Tuple[bool, Optional[str]]:
    """Whether ``stdin`` can go in a JSON ``ExecRequest`` (it is text) and as what."""
    if stdin is None:
        return True, None
    if isinstance(stdin, str):
        return True, stdin
    if isinstance(stdin, (bytes, bytearray, memoryview)):
        try:
            return True, bytes(stdin).decode("utf-8")
        except UnicodeDecodeError:
            return False, None
    return False, None


def chunks_of(data: Union[str, bytes, bytearray, memoryview], size: int = STDIN_CHUNK) -> List[bytes]:
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    return [raw[i : i + size] for i in range(0, len(raw), size)]


def as_bytes(chunk: Union[str, bytes, bytearray, memoryview]) -> bytes:
    return chunk.encode("utf-8") if isinstance(chunk, str) else bytes(chunk)


def control(kind: str, **fields: Any) -> str:
    return json.dumps({"type": kind, **fields})


class Output:
    """Output of one command as it arrives: raw bytes kept per stream, text decoded
    incrementally (a character split across frames is not garbled) and handed to callbacks."""

    def __init__(
        self,
        on_stdout: Optional[Callable[[str], Any]] = None,
        on_stderr: Optional[Callable[[str], Any]] = None,
    ) -> None:
        self.callbacks = {CHANNEL_STDOUT: on_stdout, CHANNEL_STDERR: on_stderr}
        self.decoders = {c: codecs.getincrementaldecoder("utf-8")("replace") for c in self.callbacks}
        self.text: Dict[int, List[str]] = {CHANNEL_STDOUT: [], CHANNEL_STDERR: []}
        self.received: Dict[int, int] = {CHANNEL_STDOUT: 0, CHANNEL_STDERR: 0}
        """Raw bytes received per stream (to skip them when a new attach replays them)."""
        self.truncated = False

    def feed(self, frame: bytes) -> Tuple[Optional[Callable[[str], Any]], str]:
        """Records one binary frame; returns the callback to call (if any) with the text."""
        if not frame:
            return None, ""
        channel = frame[0]
        if channel not in self.decoders:
            return None, ""
        self.received[channel] += len(frame) - 1
        text = self.decoders[channel].decode(frame[1:])
        self.text[channel].append(text)
        return self.callbacks[channel], text

    def finish(self) -> None:
        for channel, decoder in self.decoders.items():
            rest = decoder.decode(b"", final=True)
            if rest:
                self.text[channel].append(rest)

    @property
    def stdout(self) -> str:
        return "".join(self.text[CHANNEL_STDOUT])

    @property
    def stderr(self) -> str:
        return "".join(self.text[CHANNEL_STDERR])


def parse_text(text: str) -> Dict[str, Any]:
    try:
        message = json.loads(text)
    except ValueError as e:
        raise SpaceError(f"the server sent a WebSocket message that is not JSON: {text[:200]!r}") from e
    if not isinstance(message, dict):
        raise SpaceError(f"the server sent an unexpected WebSocket message: {text[:200]!r}")
    return message


def ws_error(message: Mapping[str, Any]) -> SpaceError:
    """The exception for an ``error`` message on a WebSocket (it carries a code, no status)."""
    return error_for(str(message.get("code") or ""), None, str(message.get("message") or "WebSocket error"))


def is_cut(error: SpaceError) -> bool:
    """Whether a stream that ended with ``error`` was only cut from its process, which goes on
    (a full snapshot, a suspend or a restart lets go of the sandbox's agent): attach again to
    learn more."""
    return isinstance(error, SandboxUnavailableError)


def replay_skip(output: Output) -> Dict[int, int]:
    """How many bytes of each stream a new attach replays that ``output`` already has: all
    of them while the process's buffer has not wrapped; beyond that the replay cannot be
    lined up and the output is marked truncated."""
    skip = {}
    for channel, count in output.received.items():
        if count < RING_CAPACITY:
            skip[channel] = count
        else:
            output.truncated = True
    return skip


def trim_replayed(frame: bytes, skip: Dict[int, int]) -> bytes:
    """``frame`` without the bytes of its stream still to be skipped (``b""`` if nothing is left)."""
    if not frame or not skip.get(frame[0]):
        return frame
    channel, payload = frame[0], frame[1:]
    cut = min(skip[channel], len(payload))
    skip[channel] -= cut
    return bytes([channel]) + payload[cut:] if cut < len(payload) else b""


def result_from_exit(pid: int, exit: Mapping[str, Any], output: Output, duration_ms: int) -> CommandResult:
    output.finish()
    return CommandResult(
        pid=pid,
        exit_code=exit.get("exit_code"),
        signal=exit.get("signal"),
        timed_out=bool(exit.get("timed_out")),
        oom_killed=bool(exit.get("oom_killed")),
        stdout=output.stdout,
        stderr=output.stderr,
        truncated=output.truncated,
        duration_ms=duration_ms,
    )


def handshake_error(exc: BaseException) -> Optional[SpaceError]:
    """The API error behind a refused WebSocket upgrade (404 for a session that is not yours,
    409 for one not running, 429 for too many watches), if ``exc`` is one."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if status is None:
        return None
    return error_from_body(int(status), bytes(getattr(response, "body", b"") or b""))


def quote_params(params: Mapping[str, Any]) -> str:
    from urllib.parse import urlencode

    return urlencode({k: ("true" if v is True else "false" if v is False else v) for k, v in params.items()})
