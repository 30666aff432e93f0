"""Ports and preview URLs (issue 15, branch ``ports``): servers inside a sandbox reached
through ``/v1/sessions/{id}/ports/{port}/``, by API key, port token or publicly, over HTTP
(streamed) and WebSocket."""

from __future__ import annotations

import hashlib
import time

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from conftest import unique
from space_sdk import PortNotListeningError, Session
from space_sdk.errors import error_from_body

WEBROOT = "/www"
# A one-shot WebSocket server for busybox: answers the upgrade (the accept key is the SHA-1 of
# the client's key and the RFC 6455 GUID, in base64), then sends one text frame "hello".
WS_SERVER = r"""#!/bin/sh
key=
while IFS= read -r line; do
  line=$(printf '%s' "$line" | tr -d '\r')
  [ -z "$line" ] && break
  name=$(printf '%s' "${line%%:*}" | tr 'A-Z' 'a-z')
  [ "$name" = sec-websocket-key ] && key=$(printf '%s' "${line#*:}" | tr -d ' ')
done
hex=$(printf '%s' "${key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11" | sha1sum | cut -d' ' -f1)
accept=$(printf "$(printf '%s' "$hex" | sed 's/../\\x&/g')" | base64)
printf 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n'
printf 'Sec-WebSocket-Accept: %s\r\n\r\n' "$accept"
printf '\201\005hello'
sleep 2
"""


def wait_listening(session: Session, port: int) -> None:
    deadline = time.monotonic() + 30
    while session.commands.run(f"wget -Y off -q -O /dev/null http://127.0.0.1:{port}/").exit_code != 0:
        assert time.monotonic() < deadline, f"nothing came to listen on {port}"
        time.sleep(0.1)


@pytest.fixture
def web(session: Session) -> Session:
    """A session running busybox httpd on port 8000, serving /www."""
    session.files.write(f"{WEBROOT}/index.html", "<h1>hello from the sandbox</h1>")
    session.commands.run(f"busybox httpd -f -p 8000 -h {WEBROOT}", background=True)
    wait_listening(session, 8000)
    return session


def test_url_is_the_proxy_path_of_the_server(client, session):
    assert session.ports.url(8000) == f"{client.url}/v1/sessions/{session.id}/ports/8000/"
    assert session.ports.url(8000, "/a/b?c=1") == f"{client.url}/v1/sessions/{session.id}/ports/8000/a/b?c=1"


def test_http_through_the_proxy_with_the_api_key(web):
    response = httpx.get(web.ports.url(8000, "index.html"), headers=web.ports.headers, timeout=30)
    assert response.status_code == 200 and response.text == "<h1>hello from the sandbox</h1>"
    assert httpx.get(web.ports.url(8000), timeout=30).status_code in (401, 403)


def test_a_large_download_is_streamed_through_the_proxy(web):
    web.commands.run(f"dd if=/dev/urandom of={WEBROOT}/big.bin bs=1M count=32 2>/dev/null", check=True)
    expected = web.commands.run(f"sha256sum {WEBROOT}/big.bin").stdout.split()[0]
    digest, size = hashlib.sha256(), 0
    with httpx.stream("GET", web.ports.url(8000, "big.bin"), headers=web.ports.headers, timeout=60) as response:
        assert response.status_code == 200
        for chunk in response.iter_bytes():
            digest.update(chunk)
            size += len(chunk)
    assert (size, digest.hexdigest()) == (32 << 20, expected)


def test_a_private_port_takes_its_token_and_a_public_one_anything(web):
    access = web.ports.expose(8000)
    assert (access.port, access.public) == (8000, False) and access.token
    assert access.url.endswith(f"/v1/sessions/{web.id}/ports/8000/")
    url = web.ports.url(8000, "index.html")
    assert httpx.get(url, headers={"X-Space-Port-Token": access.token}, timeout=30).status_code == 200
    assert httpx.get(url, params={"space_token": access.token}, timeout=30).status_code == 200
    assert httpx.get(url, headers={"X-Space-Port-Token": "wrong"}, timeout=30).status_code in (401, 403)
    public = web.ports.expose(8000, public=True)
    assert public.public and httpx.get(url, timeout=30).status_code == 200
    assert 8000 in [p.port for p in web.ports.list()]
    assert web.ports.get(8000).public and web.ports.get(8000).token is None
    web.ports.close(8000)
    assert httpx.get(url, timeout=30).status_code in (401, 403)


def test_nothing_listening_is_502_port_not_listening(session):
    response = httpx.get(session.ports.url(8999), headers=session.ports.headers, timeout=60)
    assert response.status_code == 502
    error = error_from_body(response.status_code, response.content)
    assert isinstance(error, PortNotListeningError) and error.code == "port_not_listening"


def test_the_gateways_ports_are_reserved(session):
    # A linux sandbox shares its namespace's 80, 443 and 3128 with the egress gateway; a VM's
    # guest address has all its ports (nothing listens there: 502).
    response = httpx.get(session.ports.url(80), headers=session.ports.headers, timeout=30)
    expected = (400, "port_reserved") if session.info.runtime == "linux" else (502, "port_not_listening")
    assert (response.status_code, error_from_body(response.status_code, response.content).code) == expected


def test_another_tenants_session_is_404(web, server, admin):
    stranger = admin.keys.create(unique("stranger")).key
    assert httpx.get(web.ports.url(8000), headers=web.ports.headers, timeout=30).status_code == 200
    response = httpx.get(web.ports.url(8000), headers={"Authorization": f"Bearer {stranger}"}, timeout=30)
    assert response.status_code == 404
    assert error_from_body(404, response.content).code == "not_found"


def test_a_websocket_through_the_proxy(session):
    session.files.write("/ws.sh", WS_SERVER, mode=0o755)
    session.commands.run("nc -ll -p 9001 -e /ws.sh", background=True)
    deadline = time.monotonic() + 30
    while session.commands.run("netstat -ltn | grep -q ':9001 '").exit_code != 0:
        assert time.monotonic() < deadline, "the WebSocket server did not start"
        time.sleep(0.1)
    url = session.ports.url(9001).replace("http", "ws", 1)
    with ws_connect(url, additional_headers=session.ports.headers, open_timeout=30) as ws:
        assert ws.recv(timeout=30) == "hello"


def test_the_background_server_example(server):
    from test_examples import run_example

    out = run_example("background_server.py", server)
    assert out.count("<h1>hello from a sandbox</h1>") == 2, out
