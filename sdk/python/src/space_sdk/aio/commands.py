"""Running commands in a session (asyncio). Callbacks may be plain functions or coroutines."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Literal, Mapping, Optional, Union, overload

from .. import _wire
from .._wire import Command, Duration, Output, User
from ..errors import (
    CommandExitError,
    InvalidStateError,
    ProcessNotFoundError,
    SandboxUnavailableError,
    SpaceError,
    TimeoutError,
)
from ..models import CommandResult, ProcessInfo
from ._ws import AsyncExecStream, connect

if TYPE_CHECKING:  # pragma: no cover
    from .session import AsyncSession

OutputCallback = Callable[[str], Any]

PROBE_FIRST, PROBE_LAST = 2.0, 10.0
EXIT_GRACE = 1.0


async def _wait_event(event: asyncio.Event, timeout: float) -> bool:
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except asyncio.TimeoutError:
        return False
    return True


class AsyncCommandHandle:
    """A command running in the background; see :class:`space_sdk.CommandHandle`."""

    def __init__(
        self,
        session: "AsyncSession",
        pid: int,
        stream: Optional[AsyncExecStream],
        result: Optional[CommandResult] = None,
    ) -> None:
        self._session = session
        self.pid = pid
        self._stream = stream
        self._result = result

    def __repr__(self) -> str:
        return f"<AsyncCommandHandle pid={self.pid} exit_code={self.exit_code!r}>"

    @property
    def stdout(self) -> str:
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
        result = self._finished()
        return result.exit_code if result else None

    @property
    def running(self) -> bool:
        return self._finished() is None

    def _finished(self) -> Optional[CommandResult]:
        if self._result is None and self._stream is not None and self._stream.exit is not None:
            self._result = _wire.result_from_exit(
                self.pid, self._stream.exit, self._stream.output, self._stream.duration_ms()
            )
        return self._result

    async def wait(self, timeout: Optional[float] = None, *, check: bool = False) -> CommandResult:
        """Waits until the command exits; ``timeout`` bounds the wait, not the command. A
        connection that ended or went stale before the exit is replaced (see the sync one)."""
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
            if await _wait_event(stream.done, probe if remaining is None else min(probe, remaining)):
                if stream.error is not None:
                    cuts += 1
                    if not _wire.is_cut(stream.error) or cuts > _wire.MAX_REATTACH:
                        raise stream.error
                if stream.exit is None and not await self._follow_again():
                    return self._check(await self._gone(), check)
                continue
            probe = min(probe * 2, PROBE_LAST)
            info = await self._session.commands._info(self.pid)
            if (info is None or not info.running) and not await _wait_event(stream.done, EXIT_GRACE):
                if not await self._follow_again():
                    return self._check(await self._gone(), check)
        return self._check(self._finished() or await self._gone(), check)

    @staticmethod
    def _check(result: CommandResult, check: bool) -> CommandResult:
        if check and not result.ok:
            raise CommandExitError(result)
        return result

    async def _follow_again(self) -> bool:
        old = self._stream
        assert old is not None
        await old.close()
        ws = None
        for tries in range(1, _wire.MAX_REATTACH + 1):
            try:
                ws = await connect(self._session._transport, f"/v1/sessions/{self._session.id}/processes/{self.pid}/attach")
                break
            except ProcessNotFoundError:
                return False
            except SandboxUnavailableError:
                # The agent is out of reach for a moment (a full snapshot holds it back).
                if tries == _wire.MAX_REATTACH:
                    raise
                await asyncio.sleep(_wire.REATTACH_PAUSE * tries)
        assert ws is not None
        stream = AsyncExecStream(ws, old.output)
        stream.started_at = old.started_at
        stream.skip = _wire.replay_skip(old.output)
        await stream.read_started()
        stream.pid = self.pid
        self._stream = stream
        stream.pump_in_background()
        return True

    async def _gone(self) -> CommandResult:
        info = await self._session.commands._info(self.pid)
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

    async def kill(self, signal: int = 9) -> bool:
        return await self._session.commands.kill(self.pid, signal)

    async def send_stdin(self, data: Any) -> None:
        await self._require_stream().send_stdin(data)

    async def close_stdin(self) -> None:
        await self._require_stream().send_control("eof")

    async def disconnect(self) -> None:
        if self._stream is not None:
            await self._stream.close()

    def _require_stream(self) -> AsyncExecStream:
        if self._stream is None or self._stream.done.is_set():
            raise InvalidStateError(
                f"process {self.pid} is not connected: it exited or was disconnected", code="invalid_state"
            )
        return self._stream


class AsyncCommands:
    """``session.commands`` of an :class:`AsyncSession`."""

    def __init__(self, session: "AsyncSession") -> None:
        self._session = session
        self._feeders: Dict[int, AsyncExecStream] = {}

    @property
    def _path(self) -> str:
        return f"/v1/sessions/{self._session.id}"

    @overload
    async def run(
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
        stdin: Any = None,
        check: bool = False,
    ) -> CommandResult: ...

    @overload
    async def run(
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
        stdin: Any = None,
        check: bool = False,
    ) -> AsyncCommandHandle: ...

    async def run(
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
    ) -> Union[CommandResult, AsyncCommandHandle]:
        """Runs ``cmd``; see :meth:`space_sdk.Commands.run`."""
        body = _wire.exec_body(cmd, cwd=cwd, env=env, ids=await self._session._user_ids(user), timeout=timeout)
        if background:
            return await self._background(body, on_stdout, on_stderr, stdin)
        fits_json, text = _wire.small_text_stdin(stdin)
        if fits_json and on_stdout is None and on_stderr is None:
            if text is not None:
                body["stdin"] = text
            limit = _wire.request_timeout_for(timeout, self._session._transport.config.request_timeout)
            data = await self._session._transport.json(
                "POST", f"{self._path}/exec", json=body, timeout=limit, retry=False
            )
            result = CommandResult.from_json(data)
        else:
            result = await self._stream(body, on_stdout, on_stderr, stdin)
        if check and not result.ok:
            raise CommandExitError(result)
        return result

    async def _stream(
        self, body: Dict[str, Any], on_stdout: Optional[OutputCallback], on_stderr: Optional[OutputCallback], stdin: Any
    ) -> CommandResult:
        ws = await connect(self._session._transport, f"{self._path}/exec/ws")
        stream = AsyncExecStream(ws, Output(on_stdout, on_stderr))
        try:
            await ws.send(json.dumps({**body, "stdin": stdin is not None}))
            await stream.read_started()
            if stdin is not None:
                stream.feed_stdin_in_background(stdin)
            await stream.pump()
        finally:
            await stream.close()
        if stream.error is not None:
            raise stream.error
        if stream.exit is None:
            raise SpaceError(f"the server closed the WebSocket before process {stream.pid} exited (it was killed)")
        return _wire.result_from_exit(stream.pid, stream.exit, stream.output, stream.duration_ms())

    async def _background(
        self, body: Dict[str, Any], on_stdout: Optional[OutputCallback], on_stderr: Optional[OutputCallback], stdin: Any
    ) -> AsyncCommandHandle:
        body["background"] = True
        if stdin is not None:
            body["stdin"] = ""  # an open pipe, fed over the attach socket
        data = await self._session._transport.json("POST", f"{self._path}/exec", json=body, retry=False)
        pid = int(data.get("pid") or 0)
        if pid == 0:
            cmd = body["cmd"]
            result = CommandResult(
                pid=0, exit_code=127, stderr=f"{cmd[0]}: cannot be executed (not found or not executable)\n"
            )
            return AsyncCommandHandle(self._session, 0, None, result)
        handle = await self.connect(pid, on_stdout=on_stdout, on_stderr=on_stderr)
        if stdin is not None and stdin is not True:
            assert handle._stream is not None
            handle._stream.feed_stdin_in_background(stdin)
        return handle

    async def connect(
        self, pid: int, *, on_stdout: Optional[OutputCallback] = None, on_stderr: Optional[OutputCallback] = None
    ) -> AsyncCommandHandle:
        """Follows a running (or recently exited) process: buffered output first, then live."""
        ws = await connect(self._session._transport, f"{self._path}/processes/{pid}/attach")
        stream = AsyncExecStream(ws, Output(on_stdout, on_stderr))
        await stream.read_started()
        stream.pid = pid
        stream.pump_in_background()
        return AsyncCommandHandle(self._session, pid, stream)

    async def list(self) -> List[ProcessInfo]:
        data = await self._session._transport.json("GET", f"{self._path}/processes")
        return [ProcessInfo.from_json(p) for p in data.get("processes", [])]

    async def _info(self, pid: int) -> Optional[ProcessInfo]:
        return next((p for p in await self.list() if p.pid == pid), None)

    async def kill(self, pid: int, signal: int = 9) -> bool:
        info = await self._info(pid)
        if info is not None and not info.running:
            return False
        try:
            await self._session._transport.request(
                "POST", f"{self._path}/processes/{pid}/signal", json={"signal": signal}
            )
        except ProcessNotFoundError:
            return False
        return True

    async def send_stdin(self, pid: int, data: Any) -> None:
        """Writes to the stdin of process ``pid``; see :meth:`space_sdk.Commands.send_stdin`."""
        await (await self._feeder(pid)).send_stdin(data)

    async def close_stdin(self, pid: int) -> None:
        await (await self._feeder(pid)).send_control("eof")

    async def _close(self) -> None:
        feeders, self._feeders = list(self._feeders.values()), {}
        for stream in feeders:
            await stream.close()

    async def _feeder(self, pid: int) -> AsyncExecStream:
        stream = self._feeders.get(pid)
        if stream is None or stream.done.is_set():
            stream = (await self.connect(pid))._stream
            assert stream is not None
            self._feeders[pid] = stream
        return stream


__all__ = ["AsyncCommands", "AsyncCommandHandle"]
