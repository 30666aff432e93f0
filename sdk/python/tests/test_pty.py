"""Terminals through the sync SDK."""

from __future__ import annotations

import threading
import time

from space_sdk import PtySize


def read_until(pty, needle: bytes, limit: float = 30.0) -> bytes:
    """Terminal output up to and including ``needle``."""
    seen = b""
    deadline = time.monotonic() + limit
    while needle not in seen:
        assert time.monotonic() < deadline, f"{needle!r} never appeared; the terminal showed {seen[-500:]!r}"
        data = pty.read(timeout=max(0.1, deadline - time.monotonic()))
        assert data is not None, f"the terminal ended before {needle!r}; it showed {seen[-500:]!r}"
        seen += data
    return seen


def test_a_terminal_has_its_size_takes_input_and_resizes(session):
    with session.pty.create(PtySize(rows=30, cols=100)) as pty:
        assert pty.pid > 0
        pty.send_input("stty size; echo mark-$((6*7))\n")
        shown = read_until(pty, b"mark-42")
        assert b"30 100" in shown
        pty.resize(40, 120)
        pty.send_input("stty size; echo mark-$((6*8))\n")
        assert b"40 120" in read_until(pty, b"mark-48")
        pty.send_input("exit 5\n")
        assert pty.wait(timeout=30).exit_code == 5


def test_a_terminal_is_a_tty_and_output_goes_to_on_data(session):
    chunks = []
    got = threading.Event()

    def on_data(data: bytes) -> None:
        chunks.append(data)
        if b"is-a-tty" in b"".join(chunks):
            got.set()

    pty = session.pty.create(
        (24, 80), cmd=["sh", "-c", "[ -t 0 ] && [ -t 1 ] && echo is-a-tty; sleep 30"], on_data=on_data
    )
    try:
        assert got.wait(30), b"".join(chunks)
        pty.kill()
        result = pty.wait(timeout=30)
        assert result.signal == 9
    finally:
        pty.close()


def test_iterating_a_terminal_ends_when_its_program_exits(session):
    pty = session.pty.create(cmd=["sh", "-c", "echo one; echo two"])
    output = b"".join(pty)
    assert b"one" in output and b"two" in output
    assert pty.wait(timeout=30).exit_code == 0


def test_closing_a_terminal_kills_its_program(session):
    pty = session.pty.create(cmd=["sh", "-c", "echo $$ > /tmp/pty.pid; exec sleep 600"])
    deadline = time.monotonic() + 30
    while not session.files.exists("/tmp/pty.pid"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pty.close()
    pid = session.files.read("/tmp/pty.pid").strip()
    deadline = time.monotonic() + 30
    while session.commands.run(f"kill -0 {pid}").exit_code == 0:
        assert time.monotonic() < deadline, "the terminal's program outlived the terminal"
        time.sleep(0.1)
