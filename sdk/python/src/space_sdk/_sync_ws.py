"""The sync client's WebSockets: connecting with the API key, and one command's stream."""

from __future__ import annotations

import inspect
import threading
import time
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Union

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

from ._transport import SyncTransport
from ._wire import (
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
from .errors import APIConnectionError, SpaceError

# websockets 17 asks sync callers to choose between the historical connect() (returns the
# connection) and the coming one (a context manager); ``legacy=True`` keeps the former. Older
# versions (15, 16) have only the former and no flag.
_LEGACY_FLAG: Dict[str, Any] = {"legacy": True} if "legacy" in inspect.signature(ws_connect).parameters else {}

PING_INTERVAL = 30.0
"""The server closes WebSockets that carry nothing for ``--ws-idle-timeout`` (5 min): pings count."""


def connect(transport: SyncTransport, path: str, params: Optional[Mapping[str, Any]] = None) -> ClientConnection:
    url = transport.config.ws_url + path + ("?" + quote_params(params) if params else "")
    try:
        return ws_connect(
            url,
            additional_headers=transport.config.headers,
            compression=None,
            max_size=None,
            open_timeout=30,
            ping_interval=PING_INTERVAL,
            ping_timeout=60,
            close_timeout=5,
            **_LEGACY_FLAG,
        )
    except InvalidStatus as e:
        raise (handshake_error(e) or APIConnectionError(f"WebSocket {path} refused: {e}")) from e
    except (OSError, InvalidHandshake, TimeoutError) as e:
        raise APIConnectionError(f"cannot open a WebSocket to {transport.config.url}{path}: {e}") from e


Stdin = Union[str, bytes, bytearray, memoryview, Iterable[Any], Any]


def stdin_chunks(stdin: Any) -> Iterable[bytes]:
    """Bytes of ``stdin`` in frames: text, bytes, a binary file-like object, or an iterable."""
    if isinstance(stdin, (str, bytes, bytearray, memoryview)):
        yield from chunks_of(stdin)
        return
    read = getattr(stdin, "read", None)
    if callable(read):
        while True:
            chunk = read(UPLOAD_CHUNK)
            if not chunk:
                return
            yield as_bytes(chunk)
    for chunk in stdin:
        if chunk:
            yield as_bytes(chunk)


class ExecStream:
    """One command on an exec or attach WebSocket: its pid, output and how it ended.

    ``pump`` reads until the command exits (inline, or on a thread of its own for background
    commands and terminals); sends may come from any thread meanwhile.
    """

    def __init__(self, ws: ClientConnection, output: Output, on_exit: Optional[Callable[[], None]] = None) -> None:
        self.ws = ws
        self.output = output
        self.pid = 0
        self.exit: Optional[Dict[str, Any]] = None
        self.error: Optional[BaseException] = None
        self.done = threading.Event()
        self.started_at = time.monotonic()
        self.on_exit = on_exit
        self.skip: Dict[int, int] = {}
        """Bytes per stream that a re-attach replays and the output already has."""
        self.raw: Optional[Callable[[bytes], Any]] = None
        """Called with every output frame's bytes instead of decoding them (terminals)."""

    def read_started(self) -> int:
        """Waits for ``started`` (the command runs) and returns its pid."""
        while True:
            try:
                frame = self.ws.recv()
            except ConnectionClosed as e:
                raise APIConnectionError(f"the server closed the WebSocket before the command started: {e}") from e
            if isinstance(frame, bytes):
                continue
            message = parse_text(frame)
            if message.get("type") == "started":
                self.pid = int(message.get("pid") or 0)
                return self.pid
            if message.get("type") == "error":
                self.close()
                raise ws_error(message)

    def pump(self) -> None:
        """Reads output until the command exits, the socket closes, or a callback raises."""
        try:
            while True:
                frame = self.ws.recv()
                if isinstance(frame, bytes):
                    self._deliver(frame)
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
        except BaseException as e:  # a callback's error is the caller's, raised from wait()
            self.error = e
        finally:
            self.output.finish()
            self.close()
            self.done.set()
            if self.on_exit is not None:
                self.on_exit()

    def _deliver(self, frame: bytes) -> None:
        frame = trim_replayed(frame, self.skip)
        if self.raw is not None:
            if len(frame) > 1:
                self.raw(frame[1:])
            return
        callback, text = self.output.feed(frame)
        if callback is not None and text:
            callback(text)

    def pump_in_background(self) -> threading.Thread:
        thread = threading.Thread(target=self.pump, name=f"space-exec-{self.pid}", daemon=True)
        thread.start()
        return thread

    def send_stdin(self, data: Stdin) -> None:
        try:
            for chunk in stdin_chunks(data):
                self.ws.send(chunk)
        except ConnectionClosed as e:
            raise SpaceError(f"process {self.pid} is no longer connected (it exited or was detached): {e}") from e

    def send_control(self, kind: str, **fields: Any) -> None:
        try:
            self.ws.send(control(kind, **fields))
        except ConnectionClosed as e:
            raise SpaceError(f"process {self.pid} is no longer connected (it exited or was detached): {e}") from e

    def feed_stdin_in_background(self, stdin: Stdin) -> None:
        """Sends ``stdin`` then EOF from a thread of its own: the command may print more than
        the socket buffers before it reads its input, and output must keep being read."""

        def feed() -> None:
            try:
                self.send_stdin(stdin)
                self.send_control("eof")
            except BaseException as e:  # the command ended first, or the iterable raised
                if self.error is None and not self.done.is_set():
                    self.error = e
                    self.close()

        threading.Thread(target=feed, name=f"space-stdin-{self.pid}", daemon=True).start()

    def close(self) -> None:
        try:
            self.ws.close()
        except Exception:  # already closed or broken: nothing left to release
            pass

    def duration_ms(self) -> int:
        return int((time.monotonic() - self.started_at) * 1000)
