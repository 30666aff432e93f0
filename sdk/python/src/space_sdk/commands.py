"""Running commands in a session (sync): to completion, streamed, or in the background."""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Literal, Mapping, Optional, Union, overload

from . import _wire
from ._sync_ws import ExecStream, Stdin, connect
from ._wire import Command, Duration, Output, User
from .errors import (
    CommandExitError,
    InvalidStateError,
    ProcessNotFoundError,
    SandboxUnavailableError,
    SpaceError,
    TimeoutError,
)
from .models import CommandResult, ProcessInfo

if TYPE_CHECKING:  # pragma: no cover
    from .session import Session

OutputCallback = Callable[[str], Any]

PROBE_FIRST, PROBE_LAST = 2.0, 10.0
"""Seconds between looks at the process table while waiting (doubling from the first)."""
EXIT_GRACE = 1.0
"""How long the exit may take to arrive after the table says the process ended."""


class CommandHandle:
    """A command running in the background (``commands.run(..., background=True)`` or
    ``commands.connect(pid)``). It keeps running in the sandbox when the handle goes away;
    the handle streams its output (to callbacks, and into ``stdout``/``stderr``)."""

    def __init__(
        self, session: "Session", pid: int, stream: Optional[ExecStream], result: Optional[CommandResult] = None
    ) -> None:
        self._session = session
        self.pid = pid
        self._stream = stream
        self._result = result
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<CommandHandle pid={self.pid} exit_code={self.exit_code!r}>"

    @property
    def stdout(self) -> str:
        """Output so far (all of it once the command exited)."""
        if self._result is not None:
            return self._result.stdout
        return self._stream.output.stdout if self._stream else ""

    @property
    def stderr(self) -> str:
        if self._result is not None:
            return self._result.stderr
        return self._stream.output.stderr if self._stream else ""

    @property
    def exit_code(self) -> Optional[int]:
        """The exit code once the command exited, else ``None``."""
        result = self._finished()
        return result.exit_code if result else None

    @property
    def running(self) -> bool:
        return self._finished() is None

    def _finished(self) -> Optional[CommandResult]:
        if self._result is None and self._stream is not None and self._stream.exit is not None:
            with self._lock:
                if self._result is None:
                    self._result = _wire.result_from_exit(
                        self.pid, self._stream.exit, self._stream.output, self._stream.duration_ms()
                    )
        return self._result

    def wait(self, timeout: Optional[float] = None, *, check: bool = False) -> CommandResult:
        """Waits until the command exits and returns how it ended and all it printed.

        ``timeout`` (seconds) bounds the wait, not the command: the command keeps running
        when it passes (``TimeoutError``). ``check=True`` raises ``CommandExitError`` unless
        the command exited 0.

        While waiting, the process table is looked at now and then: a connection that
        ended, or went quiet, before the exit (a full snapshot of the session ends streams,
        and so does a server restart) is replaced by a new one, which replays the output."""
        deadline = None if timeout is None else time.monotonic() + timeout
        probe = PROBE_FIRST
        cuts = 0
        while self._finished() is None:
            stream = self._stream
            if stream is None:
                break
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"process {self.pid} still runs after {timeout} s (it keeps running)")
            if stream.done.wait(probe if remaining is None else min(probe, remaining)):
                if stream.error is not None:
                    cuts += 1
                    if not _wire.is_cut(stream.error) or cuts > _wire.MAX_REATTACH:
                        raise stream.error
                if stream.exit is None and not self._follow_again():
                    return self._check(self._gone(), check)
                continue
            probe = min(probe * 2, PROBE_LAST)
            info = self._session.commands._info(self.pid)
            if (info is None or not info.running) and not stream.done.wait(EXIT_GRACE):
                if not self._follow_again():  # the exit never came on this connection
                    return self._check(self._gone(), check)
        return self._check(self._finished() or self._gone(), check)

    @staticmethod
    def _check(result: CommandResult, check: bool) -> CommandResult:
        if check and not result.ok:
            raise CommandExitError(result)
        return result

    def _follow_again(self) -> bool:
        """Attaches again (the old connection ended or went stale), skipping the output that
        already arrived; ``False`` if the process is no longer in the table."""
        old = self._stream
        assert old is not None
        old.close()
        ws = None
        for tries in range(1, _wire.MAX_REATTACH + 1):
            try:
                ws = connect(self._session._transport, f"/v1/sessions/{self._session.id}/processes/{self.pid}/attach")
                break
            except ProcessNotFoundError:
                return False
            except SandboxUnavailableError:
                # The agent is out of reach for a moment (a full snapshot holds it back).
                if tries == _wire.MAX_REATTACH:
                    raise
                time.sleep(_wire.REATTACH_PAUSE * tries)
        assert ws is not None
        stream = ExecStream(ws, old.output)
        stream.started_at = old.started_at
        stream.skip = _wire.replay_skip(old.output)
        stream.read_started()
        stream.pid = self.pid
        self._stream = stream
        stream.pump_in_background()
        return True

    def _gone(self) -> CommandResult:
        """The process left the table before its exit reached us: what is known of it."""
        info = self._session.commands._info(self.pid)
        output = self._stream.output if self._stream else Output()
        output.finish()
        self._result = CommandResult(
            pid=self.pid,
            exit_code=info.exit_code if info else None,
            signal=info.signal if info else None,
            stdout=output.stdout,
            stderr=output.stderr,
            truncated=True,
            duration_ms=self._stream.duration_ms() if self._stream else 0,
        )
        return self._result

    def kill(self, signal: int = 9) -> bool:
        """Sends ``signal`` (default SIGKILL); ``False`` if the process had already exited."""
        return self._session.commands.kill(self.pid, signal)

    def send_stdin(self, data: Stdin) -> None:
        """Writes to the command's stdin (it must have been started with ``stdin=True`` or
        with input)."""
        self._require_stream().send_stdin(data)

    def close_stdin(self) -> None:
        """Ends the command's stdin (EOF)."""
        self._require_stream().send_control("eof")

    def disconnect(self) -> None:
        """Stops following the command; it keeps running (``commands.connect(pid)`` again)."""
        if self._stream is not None:
            self._stream.close()

    def _require_stream(self) -> ExecStream:
        if self._stream is None or self._stream.done.is_set():
            raise InvalidStateError(
                f"process {self.pid} is not connected: it exited or was disconnected", code="invalid_state"
            )
        return self._stream


class Commands:
    """``session.commands``: run, list, connect to and kill commands."""

    def __init__(self, session: "Session") -> None:
        self._session = session
        self._feeders: Dict[int, ExecStream] = {}
        self._lock = threading.Lock()

    @property
    def _path(self) -> str:
        return f"/v1/sessions/{self._session.id}"

    @overload
    def run(
        self,
        cmd: Command,
        *,
        background: Literal[False] = False,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: User = None,
        timeout: Duration = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        stdin: Optional[Stdin] = None,
        check: bool = False,
    ) -> CommandResult: ...

    @overload
    def run(
        self,
        cmd: Command,
        *,
        background: Literal[True],
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: User = None,
        timeout: Duration = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        stdin: Union[Stdin, bool, None] = None,
        check: bool = False,
    ) -> CommandHandle: ...

    def run(
        self,
        cmd: Command,
        *,
        background: bool = False,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: User = None,
        timeout: Duration = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        stdin: Any = None,
        check: bool = False,
    ) -> Union[CommandResult, CommandHandle]:
        """Runs ``cmd`` (a shell command line, run with ``sh -c``, or an argv list).

        Waits for it and returns a :class:`CommandResult`, or with ``background=True`` returns
        a :class:`CommandHandle` at once. ``on_stdout``/``on_stderr`` get output as it comes.
        ``stdin`` is text, bytes, a binary file or an iterable of chunks (sent, then EOF), or
        for a background command ``True``: an open stdin fed with ``handle.send_stdin``.
        ``timeout`` (seconds) kills the command when it runs longer (``result.timed_out``).
        ``check=True`` raises :class:`CommandExitError` when it does not exit 0.
        """
        body = _wire.exec_body(cmd, cwd=cwd, env=env, ids=self._session._user_ids(user), timeout=timeout)
        if background:
            return self._background(body, on_stdout, on_stderr, stdin)
        fits_json, text = _wire.small_text_stdin(stdin)
        if fits_json and on_stdout is None and on_stderr is None:
            if text is not None:
                body["stdin"] = text
            limit = _wire.request_timeout_for(timeout, self._session._transport.config.request_timeout)
            data = self._session._transport.json("POST", f"{self._path}/exec", json=body, timeout=limit, retry=False)
            result = CommandResult.from_json(data)
        else:
            result = self._stream(body, on_stdout, on_stderr, stdin)
        if check and not result.ok:
            raise CommandExitError(result)
        return result

    def _stream(
        self, body: Dict[str, Any], on_stdout: Optional[OutputCallback], on_stderr: Optional[OutputCallback], stdin: Any
    ) -> CommandResult:
        ws = connect(self._session._transport, f"{self._path}/exec/ws")
        stream = ExecStream(ws, Output(on_stdout, on_stderr))
        try:
            ws.send(json.dumps({**body, "stdin": stdin is not None}))
            stream.read_started()
            if stdin is not None:
                stream.feed_stdin_in_background(stdin)
            stream.pump()
        finally:
            stream.close()
        if stream.error is not None:
            raise stream.error
        if stream.exit is None:
            raise SpaceError(f"the server closed the WebSocket before process {stream.pid} exited (it was killed)")
        return _wire.result_from_exit(stream.pid, stream.exit, stream.output, stream.duration_ms())

    def _background(
        self, body: Dict[str, Any], on_stdout: Optional[OutputCallback], on_stderr: Optional[OutputCallback], stdin: Any
    ) -> CommandHandle:
        body["background"] = True
        if stdin is not None:
            body["stdin"] = ""  # an open pipe, fed over the attach socket
        data = self._session._transport.json("POST", f"{self._path}/exec", json=body, retry=False)
        pid = int(data.get("pid") or 0)
        if pid == 0:
            return CommandHandle(self._session, 0, None, _not_started(body["cmd"]))
        handle = self.connect(pid, on_stdout=on_stdout, on_stderr=on_stderr)
        if stdin is not None and stdin is not True:
            assert handle._stream is not None
            handle._stream.feed_stdin_in_background(stdin)
        return handle

    def connect(
        self, pid: int, *, on_stdout: Optional[OutputCallback] = None, on_stderr: Optional[OutputCallback] = None
    ) -> CommandHandle:
        """Follows a running (or recently exited) process: its buffered output first (the
        last MiB of each stream), then live output and its exit."""
        ws = connect(self._session._transport, f"{self._path}/processes/{pid}/attach")
        stream = ExecStream(ws, Output(on_stdout, on_stderr))
        stream.read_started()
        stream.pid = pid
        stream.pump_in_background()
        return CommandHandle(self._session, pid, stream)

    def list(self) -> List[ProcessInfo]:
        """Processes started in the session: running ones and recently exited ones."""
        data = self._session._transport.json("GET", f"{self._path}/processes")
        return [ProcessInfo.from_json(p) for p in data.get("processes", [])]

    def _info(self, pid: int) -> Optional[ProcessInfo]:
        return next((p for p in self.list() if p.pid == pid), None)

    def kill(self, pid: int, signal: int = 9) -> bool:
        """Sends ``signal`` (default 9, SIGKILL) to process ``pid``; ``False`` if it had
        already exited."""
        info = self._info(pid)
        if info is not None and not info.running:
            return False
        try:
            self._session._transport.request("POST", f"{self._path}/processes/{pid}/signal", json={"signal": signal})
        except ProcessNotFoundError:
            return False
        return True

    def send_stdin(self, pid: int, data: Stdin) -> None:
        """Writes to the stdin of process ``pid`` (started with ``stdin=True``). The SDK keeps
        one connection per process for this until the process exits: input sent on a
        connection that closes right after may never reach the process."""
        self._feeder(pid).send_stdin(data)

    def close_stdin(self, pid: int) -> None:
        """Ends the stdin of process ``pid`` (EOF)."""
        self._feeder(pid).send_control("eof")

    def _close(self) -> None:
        with self._lock:
            feeders, self._feeders = list(self._feeders.values()), {}
        for stream in feeders:
            stream.close()

    def _feeder(self, pid: int) -> ExecStream:
        with self._lock:
            stream = self._feeders.get(pid)
            if stream is None or stream.done.is_set():
                stream = self.connect(pid)._stream
                assert stream is not None
                self._feeders[pid] = stream
            return stream


def _not_started(cmd: List[str]) -> CommandResult:
    """What a background command that could not be executed looks like (as a shell says it)."""
    return CommandResult(pid=0, exit_code=127, stderr=f"{cmd[0]}: cannot be executed (not found or not executable)\n")


__all__ = ["Commands", "CommandHandle"]
