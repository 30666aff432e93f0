"""Interactive terminals in a session (asyncio)."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Mapping, Optional

from .. import _wire
from .._wire import Command, Duration, Output, User
from ..errors import SpaceError, TimeoutError
from ..models import CommandResult
from ..pty import LOGIN_SHELL, SizeLike, term_size
from ._ws import AsyncExecStream, connect

if TYPE_CHECKING:  # pragma: no cover
    from .session import AsyncSession


class AsyncPtyHandle:
    """A terminal running a program; see :class:`space_sdk.PtyHandle`. ``on_data`` may be a
    coroutine function."""

    def __init__(self, stream: AsyncExecStream, on_data: Optional[Callable[[bytes], Any]]) -> None:
        self._stream = stream
        self._queue: "asyncio.Queue[Optional[bytes]]" = asyncio.Queue()
        self._on_data = on_data
        stream.raw = on_data if on_data is not None else self._queue.put_nowait
        stream.on_exit = lambda: self._queue.put_nowait(None)
        self._ended = False

    @property
    def pid(self) -> int:
        return self._stream.pid

    async def __aenter__(self) -> "AsyncPtyHandle":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[bytes]:
        while True:
            data = await self.read()
            if data is None:
                return
            yield data

    async def read(self, timeout: Optional[float] = None) -> Optional[bytes]:
        """The next output, or ``None`` once the program exited."""
        if self._on_data is not None:
            raise SpaceError("this terminal delivers its output to on_data; read() has nothing to return")
        if self._ended:
            return None
        try:
            data = await asyncio.wait_for(self._queue.get(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"no terminal output in {timeout} s") from None
        if data is None:
            self._ended = True
        return data

    async def send_input(self, data: Any) -> None:
        await self._stream.send_stdin(data)

    async def resize(self, rows: int, cols: int) -> None:
        await self._stream.send_control("resize", rows=int(rows), cols=int(cols))

    async def kill(self, signal: int = 9) -> None:
        await self._stream.send_control("signal", signal=int(signal))

    async def wait(self, timeout: Optional[float] = None) -> CommandResult:
        try:
            await asyncio.wait_for(self._stream.done.wait(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"terminal process {self.pid} still runs after {timeout} s") from None
        if self._stream.error is not None:
            raise self._stream.error
        if self._stream.exit is None:
            raise SpaceError(f"the terminal's WebSocket closed before process {self.pid} exited")
        return _wire.result_from_exit(self.pid, self._stream.exit, Output(), self._stream.duration_ms())

    @property
    def exit_code(self) -> Optional[int]:
        return self._stream.exit.get("exit_code") if self._stream.exit else None

    async def close(self) -> None:
        await self._stream.close()
        try:
            await asyncio.wait_for(self._stream.done.wait(), 10)
        except asyncio.TimeoutError:
            pass


class AsyncPty:
    """``session.pty`` of an :class:`AsyncSession`."""

    def __init__(self, session: "AsyncSession") -> None:
        self._session = session

    async def create(
        self,
        size: SizeLike = None,
        *,
        cmd: Optional[Command] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: User = None,
        timeout: Duration = None,
        on_data: Optional[Callable[[bytes], Any]] = None,
    ) -> AsyncPtyHandle:
        dims = term_size(size)
        ids = await self._session._user_ids(user)
        body = _wire.exec_body(cmd or LOGIN_SHELL, cwd=cwd, env=env, ids=ids, timeout=timeout)
        body.update(tty={"rows": dims.rows, "cols": dims.cols}, stdin=True)
        ws = await connect(self._session._transport, f"/v1/sessions/{self._session.id}/exec/ws")
        stream = AsyncExecStream(ws, Output())
        try:
            await ws.send(json.dumps(body))
            await stream.read_started()
        except BaseException:
            await stream.close()
            raise
        handle = AsyncPtyHandle(stream, on_data)
        stream.pump_in_background()
        return handle


__all__ = ["AsyncPty", "AsyncPtyHandle"]
