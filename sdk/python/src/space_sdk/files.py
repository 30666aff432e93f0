"""Files inside a session's sandbox (sync), streamed both ways."""

from __future__ import annotations

import builtins
import os
import threading
from typing import (
    IO,
    TYPE_CHECKING,
    Any,
    Callable,
    Iterable,
    Iterator,
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

from ._sync_ws import connect
from ._wire import UPLOAD_CHUNK, as_bytes, parse_text, ws_error
from .errors import NotFoundError, SpaceError, TimeoutError
from .models import FileInfo, FileType, WatchEvent, WriteInfo

if TYPE_CHECKING:  # pragma: no cover
    from .session import Session

Data = Union[str, bytes, bytearray, memoryview, IO[bytes], IO[str], Iterable[bytes], Iterable[str]]
WriteEntry = Union[Tuple[str, Data], Mapping[str, Any]]
ReadFormat = Literal["text", "bytes", "stream"]


def body_of(data: Data) -> Tuple[Any, bool]:
    """What httpx uploads for ``data``, and whether it can be sent again (bytes can; a stream
    cannot). Files and iterables go in chunks: a large file is never held in memory whole."""
    if isinstance(data, str):
        return data.encode("utf-8"), True
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data), True
    read = getattr(data, "read", None)
    if callable(read):
        return _file_chunks(read), False
    return (as_bytes(chunk) for chunk in data), False


def _file_chunks(read: Callable[[int], Any]) -> Iterator[bytes]:
    while True:
        chunk = read(UPLOAD_CHUNK)
        if not chunk:
            return
        yield as_bytes(chunk)


def mode_param(mode: Union[int, str, None]) -> Optional[str]:
    """The API takes octal permission bits as text (``"755"``); ``0o755`` works too."""
    if mode is None:
        return None
    return format(mode, "o") if isinstance(mode, int) else str(mode)


def write_entries(files: Union[Mapping[str, Data], Iterable[WriteEntry]]) -> List[Tuple[str, Data, Any]]:
    """``{path: data}``, ``[(path, data)]`` or ``[{"path", "data", "mode"?}]`` as triples."""
    if isinstance(files, Mapping):
        return [(path, data, None) for path, data in files.items()]
    out = []
    for entry in files:
        if isinstance(entry, Mapping):
            out.append((entry["path"], entry["data"], entry.get("mode")))
        else:
            path, data = entry
            out.append((path, data, None))
    return out


class FileStream:
    """A file being downloaded: iterate for its bytes in chunks; close it (or use ``with``)."""

    def __init__(self, response: httpx.Response, closer: Any) -> None:
        self._response = response
        self._closer = closer
        self.size = int(response.headers.get("content-length") or 0)

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._response.iter_bytes(UPLOAD_CHUNK)
        except httpx.HTTPError as e:
            raise SpaceError(f"the download broke off: {e}") from e
        finally:
            self.close()

    def read(self) -> bytes:
        return b"".join(self)

    def close(self) -> None:
        if self._closer is not None:
            closer, self._closer = self._closer, None
            closer.__exit__(None, None, None)

    def __enter__(self) -> "FileStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Watcher:
    """Changes under a directory as :class:`WatchEvent` objects: iterate (``for event in
    watcher``), :meth:`get` with a timeout, or pass ``on_event`` to have them delivered on a
    thread. The watch is in place when ``files.watch`` returns; stop it with :meth:`stop`."""

    def __init__(self, ws: Any, on_event: Optional[Callable[[WatchEvent], Any]]) -> None:
        self._ws = ws
        self._on_event = on_event
        self.error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None
        if on_event is not None:
            self._thread = threading.Thread(target=self._deliver, name="space-watch", daemon=True)
            self._thread.start()

    def _deliver(self) -> None:
        try:
            for event in self:
                assert self._on_event is not None
                self._on_event(event)
        except BaseException as e:  # kept for stop() to raise
            self.error = e

    def get(self, timeout: Optional[float] = None) -> Optional[WatchEvent]:
        """The next event; ``None`` once the watch ended. ``TimeoutError`` if none arrives
        within ``timeout`` seconds."""
        while True:
            try:
                frame = self._ws.recv(timeout)
            except ConnectionClosed:
                return None
            except builtins.TimeoutError:  # websockets' own, on the recv timeout
                raise TimeoutError(f"no file change in {timeout} s") from None
            if isinstance(frame, bytes):
                continue
            message = parse_text(frame)
            if message.get("type") == "error":
                raise ws_error(message)
            return WatchEvent.from_json(message)

    def __iter__(self) -> Iterator[WatchEvent]:
        while True:
            event = self.get()
            if event is None:
                return
            yield event

    def stop(self) -> None:
        try:
            self._ws.close()
        except Exception:  # already closed
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)

    def __enter__(self) -> "Watcher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class Files:
    """``session.files``: read, write, list and watch files in the sandbox."""

    def __init__(self, session: "Session") -> None:
        self._session = session

    @property
    def _path(self) -> str:
        return f"/v1/sessions/{self._session.id}/files"

    @overload
    def read(self, path: str, *, format: Literal["text"] = "text", stream: Literal[False] = False) -> str: ...
    @overload
    def read(self, path: str, *, format: Literal["bytes"], stream: Literal[False] = False) -> bytes: ...
    @overload
    def read(self, path: str, *, format: Literal["stream"], stream: bool = False) -> FileStream: ...
    @overload
    def read(self, path: str, *, format: ReadFormat = "text", stream: Literal[True]) -> FileStream: ...

    def read(self, path: str, *, format: ReadFormat = "text", stream: bool = False) -> Union[str, bytes, FileStream]:
        """The file at ``path``: as text (UTF-8), ``format="bytes"``, or streamed
        (``stream=True`` or ``format="stream"``: a :class:`FileStream` of chunks, for files too
        large to hold in memory)."""
        transport = self._session._transport
        closer = transport.stream("GET", f"{self._path}/content", params={"path": path})
        response = closer.__enter__()
        handle = FileStream(response, closer)
        if stream or format == "stream":
            return handle
        data = handle.read()
        return data if format == "bytes" else data.decode("utf-8", "replace")

    def download(self, path: str, dest: Union[str, os.PathLike, IO[bytes]]) -> int:
        """Streams the file at ``path`` to a local path or binary file; returns its size."""
        with self.read(path, stream=True) as chunks:
            if hasattr(dest, "write"):
                return _copy(chunks, dest)  # type: ignore[arg-type]
            with open(dest, "wb") as out:
                return _copy(chunks, out)

    def write(self, path: str, data: Data, *, mode: Union[int, str, None] = None) -> WriteInfo:
        """Writes ``data`` to ``path`` (parents are created; an existing file is replaced
        atomically). ``data``: text, bytes, a file opened for reading, or an iterable of
        chunks, streamed as it is read. ``mode``: permission bits of a new file (``0o755``)."""
        content, replayable = body_of(data)
        params = {"path": path}
        if mode is not None:
            params["mode"] = mode_param(mode)  # type: ignore[assignment]
        result = self._session._transport.json(
            "PUT",
            f"{self._path}/content",
            params=params,
            content=content,
            retry=replayable,
            headers={"content-type": "application/octet-stream"},
        )
        return WriteInfo.from_json(result)

    def upload(self, local: Union[str, os.PathLike], path: str, *, mode: Union[int, str, None] = None) -> WriteInfo:
        """Streams the local file ``local`` to ``path`` in the sandbox."""
        with open(local, "rb") as f:
            return self.write(path, f, mode=mode)

    def write_many(self, files: Union[Mapping[str, Data], Iterable[WriteEntry]]) -> List[WriteInfo]:
        """Writes several files: ``{path: data}``, ``[(path, data)]`` or
        ``[{"path": ..., "data": ..., "mode": ...}]``. Stops at the first failure."""
        return [self.write(path, data, mode=mode) for path, data, mode in write_entries(files)]

    def list(self, path: str = "/", *, depth: int = 1) -> List[FileInfo]:
        """Entries of the directory ``path``; ``depth`` > 1 descends into subdirectories."""
        entries = [
            FileInfo.from_json(e)
            for e in self._session._transport.json("GET", f"{self._path}/list", params={"path": path})["entries"]
        ]
        if depth > 1:
            for entry in list(entries):
                if entry.type == FileType.DIR:
                    entries.extend(self.list(entry.path, depth=depth - 1))
        return entries

    def stat(self, path: str) -> FileInfo:
        """What is at ``path`` (a symlink itself, not its target)."""
        return FileInfo.from_json(self._session._transport.json("GET", f"{self._path}/stat", params={"path": path}))

    get_info = stat

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
        except NotFoundError:
            return False
        return True

    def mkdir(self, path: str) -> None:
        """Creates the directory ``path`` and its missing parents."""
        self._session._transport.request("POST", f"{self._path}/mkdir", json={"path": path})

    make_dir = mkdir

    def move(self, source: str, destination: str) -> None:
        """Moves or renames ``source`` to ``destination``."""
        self._session._transport.request("POST", f"{self._path}/move", json={"from": source, "to": destination})

    rename = move

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Removes a file, or a directory with ``recursive=True``."""
        self._session._transport.request(
            "DELETE", self._path, params={"path": path, "recursive": "true" if recursive else "false"}
        )

    def watch(
        self, path: str, *, recursive: bool = False, on_event: Optional[Callable[[WatchEvent], Any]] = None
    ) -> Watcher:
        """Watches the directory ``path`` for changes (at most 8 watches per session)."""
        ws = connect(
            self._session._transport, f"/v1/sessions/{self._session.id}/watch", {"path": path, "recursive": recursive}
        )
        return Watcher(ws, on_event)

    watch_dir = watch


def _copy(chunks: Iterable[bytes], out: IO[bytes]) -> int:
    total = 0
    for chunk in chunks:
        out.write(chunk)
        total += len(chunk)
    return total


__all__ = ["Files", "FileStream", "Watcher"]
