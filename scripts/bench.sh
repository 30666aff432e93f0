#!/usr/bin/env bash
# Benchmarks against a running `space serve` (default http://127.0.0.1:7070) on this machine,
# side by side with runc and bwrap on the same root filesystem, and the egress gateway side by
# side with mitmproxy (the gateway measures start a server of their own); not part of the tests.
# Results: bench/results/<time>.jsonl with the machine description. See docs/benchmarks.md.
# Extra arguments go to `space bench` (e.g. --n 50 --density 0 --cgroup-parent NAME, or
# --gateway-only).
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v runc >/dev/null || missing+=(runc)
command -v bwrap >/dev/null || missing+=(bubblewrap)
python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
fi
# mitmproxy (PyPI), measured side by side with the egress gateway; kept in a cached venv.
MITMPROXY=/var/cache/space/mitmproxy
if [ ! -x "$MITMPROXY/bin/mitmdump" ]; then
    mkdir -p "$(dirname "$MITMPROXY")"
    python3 -m venv "$MITMPROXY"
    "$MITMPROXY/bin/pip" install -q 'mitmproxy>=11,<13'
fi
space template build busybox >/dev/null
exec space bench "$@"
