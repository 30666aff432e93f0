"""Files inside a session's sandbox (asyncio), streamed both ways."""

from __future__ import annotations

import asyncio
import inspect
import os
from typing import (
    IO,
    TYPE_CHECKING,
    Any,
    AsyncIterator,
    Callable,
    Iterable,
    List,
    Literal,
    Mapping,
    Optional,
    Tuple,
    Union,
    overload,
)

import httpx
from websockets.exceptions import ConnectionClosed

from .._wire import UPLOAD_CHUNK, as_bytes, parse_text, ws_error
from ..errors import NotFoundError, SpaceError, TimeoutError
from ..files import Data, ReadFormat, WriteEntry, mode_param, write_entries
from ..models import FileInfo, FileType, WatchEvent, WriteInfo
from ._ws import connect, maybe_await

if TYPE_CHECKING:  # pragma: no cover
    from .session import AsyncSession

WRITE_MANY_CONCURRENCY = 4
"""Files ``write_many`` uploads at once."""


async def _file_chunks(read: Callable[[int], Any]) -> AsyncIterator[bytes]:
    while True:
        chunk = read(UPLOAD_CHUNK)
        if inspect.isawaitable(chunk):  # an async file object (aiofiles and the like)
            chunk = await chunk
        else:
            await asyncio.sleep(0)
        if not chunk:
            return
        yield as_bytes(chunk)


async def _iter_chunks(data: Any) -> AsyncIterator[bytes]:
    if hasattr(data, "__aiter__"):
        async for chunk in data:
            yield as_bytes(chunk)
        return
    for chunk in data:
        yield as_bytes(chunk)


def async_body_of(data: Any) -> Tuple[Any, bool]:
    """What httpx uploads for ``data`` (async iterables for streams) and whether it can be
    sent again."""
    if isinstance(data, str):
        return data.encode("utf-8"), True
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data), True
    read = getattr(data, "read", None)
    if callable(read):
        return _file_chunks(read), False
    return _iter_chunks(data), False


class AsyncFileStream:
    """A file being downloaded: ``async for chunk in stream``; close it (or ``async with``)."""

    def __init__(self, response: httpx.Response, closer: Any) -> None:
        self._response = response
        self._closer = closer
        self.size = int(response.headers.get("content-length") or 0)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_bytes(UPLOAD_CHUNK):
                yield chunk
        except httpx.HTTPError as e:
            raise SpaceError(f"the download broke off: {e}") from e
        finally:
            await self.close()

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self])

    async def close(self) -> None:
        if self._closer is not None:
            closer, self._closer = self._closer, None
            await closer.__aexit__(None, None, None)

    async def __aenter__(self) -> "AsyncFileStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncWatcher:
    """Changes under a directory: ``async for event in watcher``, :meth:`get`, or
    ``on_event`` (a function or coroutine function, called from a task)."""

    def __init__(self, ws: Any, on_event: Optional[Callable[[WatchEvent], Any]]) -> None:
        self._ws = ws
        self.error: Optional[BaseException] = None
        self._task: Optional["asyncio.Task[None]"] = None
        if on_event is not None:
            self._task = asyncio.ensure_future(self._deliver(on_event))

    async def _deliver(self, on_event: Callable[[WatchEvent], Any]) -> None:
        try:
            async for event in self:
                await maybe_await(on_event(event))
        except Exception as e:  # kept for the caller
            self.error = e

    async def get(self, timeout: Optional[float] = None) -> Optional[WatchEvent]:
        while True:
            try:
                frame = await asyncio.wait_for(self._ws.recv(), timeout)
            except ConnectionClosed:
                return None
            except asyncio.TimeoutError:
                raise TimeoutError(f"no file change in {timeout} s") from None
            if isinstance(frame, bytes):
                continue
            message = parse_text(frame)
            if message.get("type") == "error":
                raise ws_error(message)
            return WatchEvent.from_json(message)

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[WatchEvent]:
        while True:
            event = await self.get()
            if event is None:
                return
            yield event

    async def stop(self) -> None:
        try:
            await self._ws.close()
        except Exception:  # already closed
            pass
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, 10)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                pass

    async def __aenter__(self) -> "AsyncWatcher":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()


class AsyncFiles:
    """``session.files`` of an :class:`AsyncSession`; see :class:`space_sdk.Files`."""

    def __init__(self, session: "AsyncSession") -> None:
        self._session = session

    @property
    def _path(self) -> str:
        return f"/v1/sessions/{self._session.id}/files"

    @overload
    async def read(self, path: str, *, format: Literal["text"] = "text", stream: Literal[False] = False) -> str: ...
    @overload
    async def read(self, path: str, *, format: Literal["bytes"], stream: Literal[False] = False) -> bytes: ...
    @overload
    async def read(self, path: str, *, format: Literal["stream"], stream: bool = False) -> AsyncFileStream: ...
    @overload
    async def read(self, path: str, *, format: ReadFormat = "text", stream: Literal[True]) -> AsyncFileStream: ...

    async def read(
        self, path: str, *, format: ReadFormat = "text", stream: bool = False
    ) -> Union[str, bytes, AsyncFileStream]:
        closer = self._session._transport.stream("GET", f"{self._path}/content", params={"path": path})
        response = await closer.__aenter__()
        handle = AsyncFileStream(response, closer)
        if stream or format == "stream":
            return handle
        data = await handle.read()
        return data if format == "bytes" else data.decode("utf-8", "replace")

    async def download(self, path: str, dest: Union[str, os.PathLike, IO[bytes]]) -> int:
        """Streams the file at ``path`` to a local path or binary file; returns its size."""
        total = 0
        handle = await self.read(path, stream=True)
        out = dest if hasattr(dest, "write") else open(dest, "wb")
        try:
            async with handle:
                async for chunk in handle:
                    out.write(chunk)
                    total += len(chunk)
        finally:
            if out is not dest:
                out.close()  # type: ignore[union-attr]
        return total

    async def write(self, path: str, data: Any, *, mode: Union[int, str, None] = None) -> WriteInfo:
        content, replayable = async_body_of(data)
        params = {"path": path}
        if mode is not None:
            params["mode"] = mode_param(mode)  # type: ignore[assignment]
        result = await self._session._transport.json(
            "PUT",
            f"{self._path}/content",
            params=params,
            content=content,
            retry=replayable,
            headers={"content-type": "application/octet-stream"},
        )
        return WriteInfo.from_json(result)

    async def upload(
        self, local: Union[str, os.PathLike], path: str, *, mode: Union[int, str, None] = None
    ) -> WriteInfo:
        with open(local, "rb") as f:
            return await self.write(path, f, mode=mode)

    async def write_many(self, files: Union[Mapping[str, Data], Iterable[WriteEntry]]) -> List[WriteInfo]:
        """Writes several files, a few at a time; raises the first failure."""
        gate = asyncio.Semaphore(WRITE_MANY_CONCURRENCY)

        async def one(path: str, data: Any, mode: Any) -> WriteInfo:
            async with gate:
                return await self.write(path, data, mode=mode)

        return list(await asyncio.gather(*(one(p, d, m) for p, d, m in write_entries(files))))

    async def list(self, path: str = "/", *, depth: int = 1) -> List[FileInfo]:
        data = await self._session._transport.json("GET", f"{self._path}/list", params={"path": path})
        entries = [FileInfo.from_json(e) for e in data["entries"]]
        if depth > 1:
            for entry in [e for e in entries if e.type == FileType.DIR]:
                entries.extend(await self.list(entry.path, depth=depth - 1))
        return entries

    async def stat(self, path: str) -> FileInfo:
        return FileInfo.from_json(
            await self._session._transport.json("GET", f"{self._path}/stat", params={"path": path})
        )

    get_info = stat

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
        except NotFoundError:
            return False
        return True

    async def mkdir(self, path: str) -> None:
        await self._session._transport.request("POST", f"{self._path}/mkdir", json={"path": path})

    make_dir = mkdir

    async def move(self, source: str, destination: str) -> None:
        await self._session._transport.request("POST", f"{self._path}/move", json={"from": source, "to": destination})

    rename = move

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        params = {"path": path, "recursive": "true" if recursive else "false"}
        await self._session._transport.request("DELETE", self._path, params=params)

    async def watch(
        self, path: str, *, recursive: bool = False, on_event: Optional[Callable[[WatchEvent], Any]] = None
    ) -> AsyncWatcher:
        ws = await connect(
            self._session._transport, f"/v1/sessions/{self._session.id}/watch", {"path": path, "recursive": recursive}
        )
        return AsyncWatcher(ws, on_event)

    watch_dir = watch


__all__ = ["AsyncFiles", "AsyncFileStream", "AsyncWatcher"]
