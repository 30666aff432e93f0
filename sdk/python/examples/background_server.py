"""A web server started in the background inside a sandbox, reached from outside through
the port proxy (``session.ports.url``), privately with the API key and then publicly.

    SPACE_URL=http://127.0.0.1:7070 SPACE_API_KEY=... python examples/background_server.py

With a debian template that has Python, ``python3 -m http.server 8000`` works the same way.
"""

from __future__ import annotations

import time

import httpx

from space_sdk import Session


def main() -> None:
    with Session.create(template="busybox") as session:
        session.files.write("/www/index.html", "<h1>hello from a sandbox</h1>\n")
        server = session.commands.run("busybox httpd -f -v -p 8000 -h /www", background=True)
        print(f"httpd runs as pid {server.pid} in {session.id}")
        # Until it listens (-Y off: busybox wget would ask the egress proxy, which refuses loopback).
        deadline = time.monotonic() + 30
        while session.commands.run("wget -Y off -q -O /dev/null http://127.0.0.1:8000/").exit_code != 0:
            if time.monotonic() > deadline:
                raise SystemExit("httpd did not come up: " + server.stderr)
            time.sleep(0.1)

        url = session.ports.url(8000)
        print("private URL (send the API key):", url)
        print(httpx.get(url, headers=session.ports.headers).text, end="")

        access = session.ports.expose(8000, public=True)
        print("public URL (no key needed):", session.ports.url(8000), access.preview_url or "")
        print(httpx.get(session.ports.url(8000)).text, end="")

        server.kill()
        print("httpd log:", server.wait().stderr.strip().splitlines()[-1:])


if __name__ == "__main__":
    main()
