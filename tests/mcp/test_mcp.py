"""`space mcp` driven by the official MCP client SDK (`mcp` on PyPI) against a real server.

Needs SPACE_URL and SPACE_API_KEY (a running `space serve` whose default or `busybox`
template exists) and SPACE_BIN (the `space` binary under test). Missing ones fail the run:
a suite that cannot run must not pass.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

TOOLS = {
    "create_session",
    "list_sessions",
    "run_command",
    "read_file",
    "write_file",
    "list_files",
    "snapshot",
    "restore",
    "fork",
    "expose_port",
    "destroy_session",
}
MISSING_SESSION = "ses_" + "0" * 20
MISSING_SNAPSHOT = "snap_" + "0" * 20


def required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: this suite needs SPACE_URL, SPACE_API_KEY and SPACE_BIN (see tests/mcp)")
    return value


class Space:
    """The server under test, reached both through MCP and (for cleanup) its HTTP API."""

    def __init__(self) -> None:
        self.url = required_env("SPACE_URL").rstrip("/")
        self.key = required_env("SPACE_API_KEY")
        self.bin = required_env("SPACE_BIN")
        if not os.access(self.bin, os.X_OK):
            pytest.fail(f"SPACE_BIN={self.bin} is not an executable")
        self.created: list[str] = []

    def api(self, method: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        request = urllib.request.Request(self.url + path, method=method)
        request.add_header("Authorization", f"Bearer {self.key}")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def stdio(self, mode: str = "auto") -> Client:
        env = {"SPACE_URL": self.url, "SPACE_API_KEY": self.key}
        return Client(StdioServerParameters(command=self.bin, args=["mcp"], env=env), mode=mode)

    def destroy_leftovers(self) -> None:
        for session_id in self.created:
            self.api("DELETE", f"/v1/sessions/{session_id}")


@pytest.fixture
def space() -> Iterator[Space]:
    space = Space()
    try:
        yield space
    finally:
        space.destroy_leftovers()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class McpHttp:
    """`space mcp --listen` as a child process, stopped by its pid when the test ends."""

    def __init__(self, space: Space, extra: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        env = dict(os.environ, SPACE_URL=space.url, SPACE_API_KEY=space.key)
        self.process = subprocess.Popen(
            [space.bin, "mcp", "--listen", f"127.0.0.1:{self.port}", *extra],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"space mcp --listen exited: {self.process.stderr.read().decode()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        pytest.fail("space mcp --listen did not listen within 30 s")

    def post(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, str]:
        data = json.dumps(body).encode()
        request = urllib.request.Request(self.url, data=data, method="POST")
        request.add_header("Content-Type", "application/json")
        request.add_header("Accept", "application/json, text/event-stream")
        for name, value in headers.items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def mcp_http(space: Space) -> Iterator[McpHttp]:
    server = McpHttp(space, [])
    try:
        yield server
    finally:
        server.stop()


def run(body: Callable[[], Awaitable[None]]) -> None:
    anyio.run(body)


def text_of(result: Any) -> str:
    return "".join(block.text for block in result.content if block.type == "text")


async def ok(client: Client, tool: str, **arguments: Any) -> Any:
    """Calls a tool that must succeed; its text content is the JSON of its structured content."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, f"{tool} failed: {text_of(result)}"
    assert json.loads(text_of(result)) == result.structured_content
    return result.structured_content


async def error(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """Calls a tool that must fail as a tool error (isError), not a protocol error."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, f"{tool} should have failed: {text_of(result)}"
    detail = result.structured_content["error"]
    assert detail["code"] in text_of(result) and detail["message"], result
    return detail


async def create(client: Client, space: Space, **arguments: Any) -> dict[str, Any]:
    session = await ok(client, "create_session", template="busybox", **arguments)
    space.created.append(session["id"])
    assert session["id"].startswith("ses_") and session["state"] == "running", session
    return session


async def smoke(client: Client, space: Space) -> None:
    """What every transport and protocol version must do: list, create, run, fail, destroy."""
    tools = await client.list_tools()
    assert {tool.name for tool in tools.tools} == TOOLS
    session = await create(client, space)
    result = await ok(client, "run_command", session_id=session["id"], command="echo hi")
    assert (result["exit_code"], result["stdout"], result["stderr"]) == (0, "hi\n", "")
    assert (await error(client, "run_command", session_id=MISSING_SESSION, command="true"))["code"] == "not_found"
    destroyed = await ok(client, "destroy_session", session_id=session["id"])
    assert destroyed["state"] == "destroyed"


def test_tools_are_listed_with_schemas_a_model_can_follow(space: Space) -> None:
    async def body() -> None:
        async with space.stdio() as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert set(tools) == TOOLS
            for tool in tools.values():
                assert tool.description and len(tool.description) > 30, tool.name
                schema = tool.input_schema
                assert schema["type"] == "object", tool.name
                for name, prop in schema.get("properties", {}).items():
                    assert prop.get("description"), f"{tool.name}.{name} has no description"
            run_command = tools["run_command"].input_schema
            assert set(run_command["required"]) == {"session_id", "command"}
            assert tools["list_sessions"].annotations.read_only_hint is True
            assert tools["destroy_session"].annotations.destructive_hint is True

    run(body)


def test_a_session_lifecycle_through_the_tools(space: Space) -> None:
    async def body() -> None:
        async with space.stdio() as client:
            session = await create(client, space, env={"GREETING": "hello"})
            sid = session["id"]

            result = await ok(client, "run_command", session_id=sid, command="echo hi")
            assert (result["exit_code"], result["stdout"], result["timed_out"]) == (0, "hi\n", False)
            assert (result["stdout_truncated"], result["stderr_truncated"]) == (False, False)
            result = await ok(client, "run_command", session_id=sid, command=["sh", "-c", "echo $GREETING >&2; exit 3"])
            assert (result["exit_code"], result["stdout"], result["stderr"]) == (3, "", "hello\n")
            result = await ok(client, "run_command", session_id=sid, command="pwd; cat", cwd="/tmp", stdin="in")
            assert result["stdout"] == "/tmp\nin"

            written = await ok(client, "write_file", session_id=sid, path="/tmp/mcp/hello.txt", content="hello, mcp\n")
            assert written["bytes"] == len("hello, mcp\n")
            read = await ok(client, "read_file", session_id=sid, path="/tmp/mcp/hello.txt")
            assert (read["content"], read["encoding"], read["truncated"]) == ("hello, mcp\n", "utf-8", False)
            await ok(client, "write_file", session_id=sid, path="/tmp/mcp/blob", content="/wCA", encoding="base64")
            read = await ok(client, "read_file", session_id=sid, path="/tmp/mcp/blob")
            assert (read["content"], read["encoding"], read["bytes"]) == ("/wCA", "base64", 3)
            listing = await ok(client, "list_files", session_id=sid, path="/tmp/mcp")
            entries = {entry["name"]: entry for entry in listing["entries"]}
            assert set(entries) == {"hello.txt", "blob"}
            assert (entries["hello.txt"]["type"], entries["hello.txt"]["size"]) == ("file", 11)
            assert entries["hello.txt"]["mode"] == "644"

            snapshot = await ok(client, "snapshot", session_id=sid, kind="disk", name="before-rm")
            assert snapshot["id"].startswith("snap_") and snapshot["kind"] == "disk", snapshot
            await ok(client, "run_command", session_id=sid, command="rm /tmp/mcp/hello.txt")
            gone = await error(client, "read_file", session_id=sid, path="/tmp/mcp/hello.txt")
            assert gone["code"] == "file_not_found", gone
            restored = await ok(client, "restore", session_id=sid, snapshot_id=snapshot["id"])
            assert restored["state"] == "running"
            read = await ok(client, "read_file", session_id=sid, path="/tmp/mcp/hello.txt")
            assert read["content"] == "hello, mcp\n"
            missing = await error(client, "restore", session_id=sid, snapshot_id=MISSING_SNAPSHOT)
            assert missing["code"] == "snapshot_not_found" and missing["status"] == 404, missing

            forks = (await ok(client, "fork", session_id=sid, count=1))["sessions"]
            assert len(forks) == 1 and forks[0]["id"] != sid
            space.created.append(forks[0]["id"])
            read = await ok(client, "read_file", session_id=forks[0]["id"], path="/tmp/mcp/hello.txt")
            assert read["content"] == "hello, mcp\n"
            listed = {s["id"] for s in (await ok(client, "list_sessions"))["sessions"]}
            assert {sid, forks[0]["id"]} <= listed

            for session_id in (forks[0]["id"], sid):
                assert (await ok(client, "destroy_session", session_id=session_id))["state"] == "destroyed"
            gone = await error(client, "run_command", session_id=sid, command="true")
            assert (gone["code"], gone["status"]) == ("invalid_state", 409), gone

    run(body)


def test_commands_time_out_and_long_output_is_cut(space: Space) -> None:
    async def body() -> None:
        async with space.stdio() as client:
            sid = (await create(client, space))["id"]
            result = await ok(client, "run_command", session_id=sid, command="sleep 30", timeout_secs=1)
            assert result["timed_out"] is True
            result = await ok(
                client, "run_command", session_id=sid, command="seq 1 100000", max_output_bytes=1000
            )
            assert result["exit_code"] == 0 and result["stdout_truncated"] is True
            assert result["stdout"].startswith("1\n2\n3\n") and result["stdout"].endswith("99999\n100000\n")
            assert "bytes omitted" in result["stdout"] and len(result["stdout"]) < 1100
            binary = "/" * 136  # 102 bytes of 0xff, which no UTF-8 text has
            await ok(client, "write_file", session_id=sid, path="/tmp/ff", content=binary, encoding="base64")
            read = await ok(client, "read_file", session_id=sid, path="/tmp/ff", max_bytes=10)
            assert (read["bytes"], read["truncated"], read["encoding"]) == (10, True, "base64")
            assert read["content"] == "/////////////w=="

    run(body)


def test_api_errors_are_tool_errors_carrying_the_code(space: Space) -> None:
    async def body() -> None:
        async with space.stdio() as client:
            missing = await error(client, "run_command", session_id=MISSING_SESSION, command="echo hi")
            assert (missing["code"], missing["status"]) == ("not_found", 404), missing
            malformed = await error(client, "run_command", session_id="my-session", command="echo hi")
            assert malformed["code"] == "bad_request" and "not a valid session id" in malformed["message"]
            no_command = await error(client, "run_command", session_id=MISSING_SESSION)
            assert no_command["code"] == "bad_request" and "command" in no_command["message"]
            unknown = await error(client, "create_session", template="no-such-template")
            assert unknown["code"] == "unknown_template" and unknown["status"] == 400, unknown
            # The server is still usable after errors.
            assert "sessions" in await ok(client, "list_sessions")

    run(body)


def test_expose_port_returns_the_port_url_where_the_server_has_ports(space: Space) -> None:
    status, openapi = space.api("GET", "/v1/openapi.json")
    assert status == 200
    # Issue 15's ports API (`POST /v1/sessions/{id}/ports/{port}`), built on another branch.
    has_ports = any("/ports/" in path for path in json.loads(openapi)["paths"])

    async def body() -> None:
        async with space.stdio() as client:
            sid = (await create(client, space))["id"]
            serve = "mkdir -p /www && echo port-ok > /www/index.html && exec busybox httpd -f -p 8000 -h /www"
            started = await ok(client, "run_command", session_id=sid, command=serve, background=True)
            assert started["pid"] > 0
            if not has_ports:
                # A server without the ports API (before issue 15's ports branch) answers 404.
                refused = await error(client, "expose_port", session_id=sid, port=8000)
                assert (refused["code"], refused["status"]) == ("not_found", 404), refused
                return
            access = await ok(client, "expose_port", session_id=sid, port=8000)
            assert access["port"] == 8000 and access["public"] is False and access["token"], access
            url = urllib.parse.urljoin(space.url + "/", access["url"])
            assert f"/v1/sessions/{sid}/ports/8000" in url
            deadline = time.monotonic() + 30
            while True:  # until httpd listens
                request = urllib.request.Request(url, headers={"X-Space-Port-Token": access["token"]})
                try:
                    with urllib.request.urlopen(request, timeout=10) as response:
                        assert response.read() == b"port-ok\n"
                        break
                except urllib.error.HTTPError as e:
                    if e.code != 502 or time.monotonic() > deadline:
                        raise
                    await anyio.sleep(0.2)

    run(body)


def test_stdio_with_the_initialize_handshake(space: Space) -> None:
    async def body() -> None:
        async with space.stdio("legacy") as client:
            await smoke(client, space)

    run(body)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_streamable_http(space: Space, mcp_http: McpHttp, mode: str) -> None:
    async def body() -> None:
        async with Client(mcp_http.url, mode=mode) as client:
            await smoke(client, space)

    run(body)


def test_streamable_http_refuses_browsers_and_requests_without_the_token(space: Space) -> None:
    server = McpHttp(space, ["--auth-token", "s3cret-token"])
    try:
        ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        status, text = server.post(ping, {})
        assert status == 401 and "Bearer" in text, (status, text)
        status, _ = server.post(ping, {"Authorization": "Bearer wrong"})
        assert status == 401
        status, text = server.post(ping, {"Authorization": "Bearer s3cret-token", "Origin": "https://evil.example"})
        assert status == 403 and "Origin" in text, (status, text)

        async def body() -> None:
            import httpx2  # the HTTP client the mcp SDK is built on

            headers = {"Authorization": "Bearer s3cret-token"}
            async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http:
                from mcp.client.streamable_http import streamable_http_client

                async with Client(streamable_http_client(server.url, http_client=http)) as client:
                    await smoke(client, space)

        run(body)
    finally:
        server.stop()


def test_listen_refuses_a_non_loopback_address_without_a_token(space: Space) -> None:
    result = subprocess.run(
        [space.bin, "mcp", "--listen", "0.0.0.0:0"],
        env=dict(os.environ, SPACE_URL=space.url, SPACE_API_KEY=space.key),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0 and "not a loopback address" in result.stderr, result
