"""Interactive terminals in a session (sync): ``session.pty.create(...)``."""

from __future__ import annotations

import json
import queue
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Optional, Tuple, Union

from . import _wire
from ._sync_ws import ExecStream, Stdin, connect
from ._wire import Command, Duration, Output, User
from .errors import SpaceError, TimeoutError
from .models import CommandResult

if TYPE_CHECKING:  # pragma: no cover
    from .session import Session

LOGIN_SHELL = ["sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi"]
"""What a terminal runs unless told otherwise: bash where the template has it, else sh."""


@dataclass(frozen=True)
class PtySize:
    rows: int = 24
    cols: int = 80


SizeLike = Union[PtySize, Tuple[int, int], None]


def term_size(size: SizeLike) -> PtySize:
    if size is None:
        return PtySize()
    if isinstance(size, PtySize):
        return size
    rows, cols = size
    return PtySize(rows=int(rows), cols=int(cols))


class PtyHandle:
    """A terminal running a program. Output is raw bytes (escape sequences included): to
    ``on_data`` if given, else to iteration (``for data in pty``) and :meth:`read`.
    The program is killed when the handle is closed (or its ``with`` block ends)."""

    def __init__(self, stream: ExecStream, on_data: Optional[Callable[[bytes], Any]]) -> None:
        self._stream = stream
        self._queue: "queue.Queue[Optional[bytes]]" = queue.Queue()
        self._on_data = on_data
        stream.raw = on_data if on_data is not None else self._queue.put
        stream.on_exit = lambda: self._queue.put(None)
        self._ended = False

    @property
    def pid(self) -> int:
        return self._stream.pid

    def __enter__(self) -> "PtyHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __iter__(self) -> Iterator[bytes]:
        while True:
            data = self.read()
            if data is None:
                return
            yield data

    def read(self, timeout: Optional[float] = None) -> Optional[bytes]:
        """The next output (bytes), or ``None`` once the program exited. ``TimeoutError`` if
        nothing arrives within ``timeout`` seconds."""
        if self._on_data is not None:
            raise SpaceError("this terminal delivers its output to on_data; read() has nothing to return")
        if self._ended:
            return None
        try:
            data = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no terminal output in {timeout} s") from None
        if data is None:
            self._ended = True
        return data

    def send_input(self, data: Stdin) -> None:
        """Types ``data`` (text or bytes) into the terminal."""
        self._stream.send_stdin(data)

    def resize(self, rows: int, cols: int) -> None:
        self._stream.send_control("resize", rows=int(rows), cols=int(cols))

    def kill(self, signal: int = 9) -> None:
        """Signals the program (default SIGKILL)."""
        self._stream.send_control("signal", signal=int(signal))

    def wait(self, timeout: Optional[float] = None) -> CommandResult:
        """Waits until the program exits; ``stdout`` of the result is empty (output went to
        the reader)."""
        if not self._stream.done.wait(timeout):
            raise TimeoutError(f"terminal process {self.pid} still runs after {timeout} s")
        if self._stream.error is not None:
            raise self._stream.error
        if self._stream.exit is None:
            raise SpaceError(f"the terminal's WebSocket closed before process {self.pid} exited")
        return _wire.result_from_exit(self.pid, self._stream.exit, Output(), self._stream.duration_ms())

    @property
    def exit_code(self) -> Optional[int]:
        return self._stream.exit.get("exit_code") if self._stream.exit else None

    def close(self) -> None:
        """Closes the terminal; a program still running in it is killed."""
        self._stream.close()
        self._stream.done.wait(10)


class Pty:
    """``session.pty``: terminals."""

    def __init__(self, session: "Session") -> None:
        self._session = session

    def create(
        self,
        size: SizeLike = None,
        *,
        cmd: Optional[Command] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: User = None,
        timeout: Duration = None,
        on_data: Optional[Callable[[bytes], Any]] = None,
    ) -> PtyHandle:
        """Starts ``cmd`` (default: a login shell, bash where there is one) on a terminal of
        ``size`` (rows, cols; default 24x80)."""
        dims = term_size(size)
        body = _wire.exec_body(cmd or LOGIN_SHELL, cwd=cwd, env=env, ids=self._session._user_ids(user), timeout=timeout)
        body.update(tty={"rows": dims.rows, "cols": dims.cols}, stdin=True)
        ws = connect(self._session._transport, f"/v1/sessions/{self._session.id}/exec/ws")
        stream = ExecStream(ws, Output())
        try:
            ws.send(json.dumps(body))
            stream.read_started()
        except BaseException:
            stream.close()
            raise
        handle = PtyHandle(stream, on_data)
        stream.pump_in_background()
        return handle


__all__ = ["Pty", "PtyHandle", "PtySize", "LOGIN_SHELL"]
