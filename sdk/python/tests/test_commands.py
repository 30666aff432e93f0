"""Commands through the sync SDK: to completion, streamed, with stdin, in the background."""

from __future__ import annotations

import hashlib
import io
import threading

import pytest

from space_sdk import CommandExitError, CommandHandle, InvalidStateError, TimeoutError


def test_a_command_line_and_an_argv_run_to_completion(session):
    result = session.commands.run("echo hello; echo oops >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "hello\n", "oops\n")
    assert not result.ok and result.pid > 0
    result = session.commands.run(["printf", "%s|", "a b", "c"])
    assert (result.exit_code, result.stdout) == (0, "a b|c|")


def test_cwd_env_and_user_apply(session):
    session.files.mkdir("/work/dir")
    assert session.commands.run("pwd", cwd="/work/dir").stdout == "/work/dir\n"
    assert session.commands.run("echo $A-$B", env={"A": "1", "B": "two"}).stdout == "1-two\n"
    assert session.commands.run("id -u", user=1000).stdout == "1000\n"
    assert session.commands.run("id -u; id -g", user="1234:4321").stdout.split() == ["1234", "4321"]
    assert session.commands.run("id -u", user="root").stdout == "0\n"


def test_a_user_name_is_looked_up_in_the_sandbox(session):
    assert session.commands.run("id -un", user="nobody").stdout.strip() == "nobody"


def test_check_raises_with_the_result(session):
    with pytest.raises(CommandExitError) as failed:
        session.commands.run("echo bad >&2; exit 2", check=True)
    assert failed.value.result.exit_code == 2 and "bad" in str(failed.value)
    assert session.commands.run("true", check=True).ok


def test_a_command_over_its_timeout_is_killed(session):
    result = session.commands.run("sleep 30", timeout=0.5)
    assert result.timed_out and result.exit_code is None and result.signal == 9
    streamed = session.commands.run("sleep 30", timeout=0.5, on_stdout=lambda _: None)
    assert streamed.timed_out


def test_a_missing_program_exits_127(session):
    result = session.commands.run(["no-such-program"])
    assert result.exit_code == 127 and "no-such-program" in result.stderr


def test_callbacks_get_output_as_it_comes_in_order(session):
    seen = {"out": [], "err": []}
    result = session.commands.run(
        "for i in 1 2 3 4 5; do echo out$i; echo err$i >&2; sleep 0.05; done",
        on_stdout=seen["out"].append,
        on_stderr=seen["err"].append,
    )
    assert result.exit_code == 0
    assert "".join(seen["out"]) == result.stdout == "".join(f"out{i}\n" for i in range(1, 6))
    assert "".join(seen["err"]) == result.stderr == "".join(f"err{i}\n" for i in range(1, 6))
    assert len(seen["out"]) > 1, "output arrived in one piece: it was not streamed"


def test_a_callback_that_raises_stops_the_command_and_raises(session):
    def boom(text: str) -> None:
        raise ValueError("stop")

    with pytest.raises(ValueError):
        session.commands.run("echo x; sleep 30", on_stdout=boom)


def test_multibyte_output_split_across_frames_is_not_garbled(session):
    text = "é✓" * 50000
    session.files.write("/tmp/utf8", text)
    chunks = []
    result = session.commands.run("cat /tmp/utf8", on_stdout=chunks.append)
    assert result.stdout == text and "".join(chunks) == text and "\ufffd" not in result.stdout


def test_stdin_text_bytes_files_and_iterables(session):
    assert session.commands.run("cat", stdin="hello\n").stdout == "hello\n"
    raw = bytes(range(256))
    assert session.commands.run("od -An -tx1 | tr -d ' \\n'", stdin=raw).stdout == raw.hex()
    assert session.commands.run("wc -c", stdin=io.BytesIO(b"x" * 100000)).stdout.strip() == "100000"
    assert session.commands.run("cat", stdin=iter([b"a", "b", b"c"])).stdout == "abc"


def test_large_streamed_stdin_arrives_whole(session):
    digest = hashlib.sha256()

    def chunks():
        for i in range(32):
            block = bytes([i]) * (256 * 1024)
            digest.update(block)
            yield block

    result = session.commands.run("sha256sum", stdin=chunks())
    assert result.stdout.split()[0] == digest.hexdigest()


def test_background_commands_return_a_handle_at_once(session):
    handle = session.commands.run("echo started; sleep 0.3; echo done; exit 4", background=True)
    assert isinstance(handle, CommandHandle) and handle.pid > 0
    result = handle.wait()
    assert (result.exit_code, result.stdout) == (4, "started\ndone\n")
    assert handle.exit_code == 4 and not handle.running and handle.stdout == "started\ndone\n"


def test_background_output_reaches_callbacks(session):
    lines = []
    got_line = threading.Event()

    def on_stdout(text: str) -> None:
        lines.append(text)
        got_line.set()

    handle = session.commands.run("echo ready; sleep 30", background=True, on_stdout=on_stdout)
    assert got_line.wait(30), "no output from the background command"
    assert "".join(lines) == "ready\n" and handle.running
    assert handle.kill() is True
    result = handle.wait()
    assert result.signal == 9 and result.exit_code is None
    assert handle.kill() is False


def test_background_stdin_is_fed_through_the_handle(session):
    handle = session.commands.run("cat; echo eof", background=True, stdin=True)
    handle.send_stdin("line one\n")
    handle.send_stdin(b"line two\n")
    handle.close_stdin()
    result = handle.wait(timeout=30)
    assert result.stdout == "line one\nline two\neof\n"
    with pytest.raises(InvalidStateError):
        handle.send_stdin("too late")


def test_background_stdin_given_up_front(session):
    handle = session.commands.run("wc -c", background=True, stdin=b"z" * 5000)
    assert handle.wait(timeout=30).stdout.strip() == "5000"


def test_list_connect_and_kill_background_processes(session):
    handle = session.commands.run("echo one; sleep 600", background=True)
    handle.disconnect()
    processes = {p.pid: p for p in session.commands.list()}
    assert processes[handle.pid].running and processes[handle.pid].background
    again = session.commands.connect(handle.pid)
    assert again.running
    assert session.commands.kill(handle.pid, 15) is True
    result = again.wait(timeout=30)
    assert result.signal == 15 and result.stdout == "one\n"
    assert not {p.pid: p for p in session.commands.list()}[handle.pid].running


def test_send_stdin_by_pid(session):
    handle = session.commands.run("head -n 1", background=True, stdin=True)
    session.commands.send_stdin(handle.pid, "by pid\n")
    assert handle.wait(timeout=30).stdout == "by pid\n"


def test_wait_with_a_timeout_leaves_the_command_running(session):
    handle = session.commands.run("sleep 600", background=True)
    with pytest.raises(TimeoutError):
        handle.wait(timeout=0.2)
    assert handle.running
    handle.kill()
    assert handle.wait(timeout=30).signal == 9


def test_a_background_command_that_cannot_start(session):
    handle = session.commands.run(["no-such-program"], background=True)
    assert handle.wait().exit_code == 127
