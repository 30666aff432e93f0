"""The async client's WebSockets: connecting with the API key, and one command's stream."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, AsyncIterator, Callable, Dict, Mapping, Optional

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from .._transport import AsyncTransport
from .._wire import (
    UPLOAD_CHUNK,
    Output,
    as_bytes,
    chunks_of,
    control,
    handshake_error,
    parse_text,
    quote_params,
    trim_replayed,
    ws_error,
)
from ..errors import APIConnectionError, SpaceError

PING_INTERVAL = 30.0


async def connect(transport: AsyncTransport, path: str, params: Optional[Mapping[str, Any]] = None) -> ClientConnection:
    url = transport.config.ws_url + path + ("?" + quote_params(params) if params else "")
    try:
        return await ws_connect(
            url,
            additional_headers=transport.config.headers,
            compression=None,
            max_size=None,
            open_timeout=30,
            ping_interval=PING_INTERVAL,
            ping_timeout=60,
            close_timeout=5,
        )
    except InvalidStatus as e:
        raise (handshake_error(e) or APIConnectionError(f"WebSocket {path} refused: {e}")) from e
    except (OSError, InvalidHandshake, asyncio.TimeoutError) as e:
        raise APIConnectionError(f"cannot open a WebSocket to {transport.config.url}{path}: {e}") from e


async def maybe_await(value: Any) -> None:
    if inspect.isawaitable(value):
        await value


async def stdin_chunks(stdin: Any) -> AsyncIterator[bytes]:
    """Bytes of ``stdin`` in frames: text, bytes, a file-like object (its ``read`` may be a
    coroutine), an iterable or an async iterable."""
    if isinstance(stdin, (str, bytes, bytearray, memoryview)):
        for chunk in chunks_of(stdin):
            yield chunk
        return
    read = getattr(stdin, "read", None)
    if callable(read):
        while True:
            chunk = read(UPLOAD_CHUNK)
            if inspect.isawaitable(chunk):
                chunk = await chunk
            else:
                await asyncio.sleep(0)
            if not chunk:
                return
            yield as_bytes(chunk)
    if hasattr(stdin, "__aiter__"):
        async for chunk in stdin:
            if chunk:
                yield as_bytes(chunk)
        return
    for chunk in stdin:
        if chunk:
            yield as_bytes(chunk)


class AsyncExecStream:
    """One command on an exec or attach WebSocket (see the sync ``ExecStream``)."""

    def __init__(self, ws: ClientConnection, output: Output) -> None:
        self.ws = ws
        self.output = output
        self.pid = 0
        self.exit: Optional[Dict[str, Any]] = None
        self.error: Optional[BaseException] = None
        self.done = asyncio.Event()
        self.started_at = time.monotonic()
        self.skip: Dict[int, int] = {}
        """Bytes per stream that a re-attach replays and the output already has."""
        self.raw: Optional[Callable[[bytes], Any]] = None
        self.on_exit: Optional[Callable[[], Any]] = None
        self._tasks: "set[asyncio.Task[Any]]" = set()

    async def read_started(self) -> int:
        while True:
            try:
                frame = await self.ws.recv()
            except ConnectionClosed as e:
                raise APIConnectionError(f"the server closed the WebSocket before the command started: {e}") from e
            if isinstance(frame, bytes):
                continue
            message = parse_text(frame)
            if message.get("type") == "started":
                self.pid = int(message.get("pid") or 0)
                return self.pid
            if message.get("type") == "error":
                await self.close()
                raise ws_error(message)

    async def pump(self) -> None:
        try:
            while True:
                frame = await self.ws.recv()
                if isinstance(frame, bytes):
                    await self._deliver(frame)
                    continue
                message = parse_text(frame)
                kind = message.get("type")
                if kind == "exit":
                    self.exit = message
                    break
                if kind == "error":
                    self.error = ws_error(message)
                    break
        except ConnectionClosed:
            pass
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # a callback's error is the caller's, raised from wait()
            self.error = e
        finally:
            self.output.finish()
            await self.close()
            self.done.set()
            if self.on_exit is not None:
                self.on_exit()

    async def _deliver(self, frame: bytes) -> None:
        frame = trim_replayed(frame, self.skip)
        if self.raw is not None:
            if len(frame) > 1:
                await maybe_await(self.raw(frame[1:]))
            return
        callback, text = self.output.feed(frame)
        if callback is not None and text:
            await maybe_await(callback(text))

    def _spawn(self, coro: Any) -> "asyncio.Task[Any]":
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def pump_in_background(self) -> "asyncio.Task[Any]":
        return self._spawn(self.pump())

    async def send_stdin(self, data: Any) -> None:
        try:
            async for chunk in stdin_chunks(data):
                await self.ws.send(chunk)
        except ConnectionClosed as e:
            raise SpaceError(f"process {self.pid} is no longer connected (it exited or was detached): {e}") from e

    async def send_control(self, kind: str, **fields: Any) -> None:
        try:
            await self.ws.send(control(kind, **fields))
        except ConnectionClosed as e:
            raise SpaceError(f"process {self.pid} is no longer connected (it exited or was detached): {e}") from e

    def feed_stdin_in_background(self, stdin: Any) -> None:
        async def feed() -> None:
            try:
                await self.send_stdin(stdin)
                await self.send_control("eof")
            except Exception as e:  # the command ended first, or the iterable raised
                if self.error is None and not self.done.is_set():
                    self.error = e
                    await self.close()

        self._spawn(feed())

    async def close(self) -> None:
        try:
            await self.ws.close()
        except Exception:  # already closed or broken
            pass

    def duration_ms(self) -> int:
        return int((time.monotonic() - self.started_at) * 1000)
