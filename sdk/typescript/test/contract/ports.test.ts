// Ports and preview URLs (issue 15, branch `ports`): an HTTP server inside the sandbox
// (busybox httpd) and a WebSocket upgrade through the proxy.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { request } from "node:http";
import { describe, test } from "node:test";
import { PortNotListeningError, PortReservedError, type Session } from "@space/sdk";
import { SUITE_TIMEOUT, eventually, newSession, server } from "../helpers.js";

let shared: Session | undefined;
async function session(): Promise<Session> {
  if (shared) return shared;
  shared = await newSession();
  await shared.files.write("/www/index.html", "hello from the sandbox\n");
  await shared.files.write("/www/sub/data.txt", "data\n");
  await shared.commands.run("busybox httpd -p 8000 -h /www");
  await eventually(async () => (await shared!.commands.run("netstat -ltn | grep -q ':8000 '")).exitCode === 0, "httpd to listen");
  return shared;
}

describe("ports", { timeout: SUITE_TIMEOUT }, () => {
  test("url() is the proxy path; fetch reaches the server with the API key", async () => {
    const s = await session();
    assert.equal(s.ports.url(8000), `${server().url}/v1/sessions/${s.id}/ports/8000/`);
    const response = await s.ports.fetch(8000, "/");
    assert.equal(response.status, 200);
    assert.equal(await response.text(), "hello from the sandbox\n");
    const sub = await s.ports.fetch(8000, "/sub/data.txt?x=1");
    assert.equal(await sub.text(), "data\n");
    const missing = await s.ports.fetch(8000, "/missing");
    assert.equal(missing.status, 404, "the sandbox server's own 404 is returned, not thrown");
  });

  test("without credentials a private port is refused; its token opens it; public needs nothing", async () => {
    const s = await session();
    assert.equal((await fetch(s.ports.url(8000))).status, 401);
    const access = await s.ports.expose(8000);
    assert.equal(access.port, 8000);
    assert.equal(access.public, false);
    assert.ok(access.token);
    const withToken = await fetch(s.ports.url(8000), { headers: { "x-space-port-token": access.token } });
    assert.equal(await withToken.text(), "hello from the sandbox\n");
    const inQuery = await fetch(`${s.ports.url(8000)}?space_token=${encodeURIComponent(access.token)}`);
    assert.equal(inQuery.status, 200);
    assert.ok((await s.ports.list()).some((p) => p.port === 8000));

    await s.ports.expose(8000, { public: true });
    assert.equal((await fetch(s.ports.url(8000))).status, 200);
    await s.ports.close(8000);
    assert.equal((await fetch(s.ports.url(8000))).status, 401);
  });

  test("a port nothing listens on is a 502 port_not_listening; reserved ports are refused", async () => {
    const s = await session();
    const error = await s.ports.fetch(8001).catch((e: unknown) => e);
    assert.ok(error instanceof PortNotListeningError, String(error));
    assert.equal(error.status, 502);
    await assert.rejects(s.ports.fetch(3128), PortReservedError);
  });

  test("another key's or a made-up session's ports are 404", async () => {
    const s = await session();
    const url = s.ports.url(8000).replace(s.id, "ses_00000000000000000000000000");
    const response = await fetch(url, { headers: { authorization: `Bearer ${server().apiKey}` } });
    assert.equal(response.status, 404);
  });

  test("a WebSocket upgrade passes through the proxy", async () => {
    const s = await session();
    // A one-shot WebSocket server in sh: answers the handshake of a fixed key, then echoes.
    const key = "dGhlIHNhbXBsZSBub25jZQ==";
    const accept = createHash("sha1").update(`${key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11`).digest("base64");
    await s.files.write(
      "/tmp/ws.sh",
      `#!/bin/sh\nwhile read -r line; do [ "$line" = "$(printf '\\r')" ] && break; done\n` +
        `printf 'HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\nSec-WebSocket-Accept: ${accept}\\r\\n\\r\\n'\n` +
        "exec cat\n",
      { mode: 0o755 },
    );
    await s.commands.run("nc -l -p 9000 -e /tmp/ws.sh", { background: true });
    await eventually(async () => (await s.commands.run("netstat -ltn | grep -q ':9000 '")).exitCode === 0, "nc to listen");
    const url = new URL(s.ports.url(9000));
    const echoed = await new Promise<string>((resolve, reject) => {
      const req = request({
        host: url.hostname,
        port: url.port,
        path: url.pathname,
        headers: {
          authorization: `Bearer ${server().apiKey}`,
          connection: "Upgrade",
          upgrade: "websocket",
          "sec-websocket-key": key,
          "sec-websocket-version": "13",
        },
      });
      req.on("upgrade", (response, socket) => {
        assert.equal(response.headers["sec-websocket-accept"], accept);
        socket.once("data", (data: Buffer) => {
          resolve(data.toString());
          socket.destroy();
        });
        socket.write("raw bytes after the upgrade");
      });
      req.on("response", (response) => reject(new Error(`no upgrade: HTTP ${response.statusCode}`)));
      req.on("error", reject);
      req.end();
    });
    assert.equal(echoed, "raw bytes after the upgrade");
  });
});
