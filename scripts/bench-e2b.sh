#!/usr/bin/env bash
# Create to first output of `echo hi` through E2B's Python SDK (against `space serve
# --e2b-listen`) and through space's own Python SDK, on one server of its own (data dir, ports
# and cgroup parent of its own, stopped at the end), interleaved. Not part of the tests;
# numbers go to docs/benchmarks.md.
# Usage: scripts/bench-e2b.sh [N] (default 100), with `space` built (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-100}
SPACE=${SPACE:-target/release/space}
SPACED=${SPACED_BIN:-target/x86_64-unknown-linux-gnu/release/spaced}
WORK=$(mktemp -d /var/tmp/space-bench-e2b.XXXXXX)
chmod 755 "$WORK"
PIDS=()
# shellcheck source=scripts/bench-common.sh
. scripts/bench-common.sh
cleanup() { stop_servers "$WORK"/serve; kill_cgroup space-bench-e2b; remove_cgroups space-bench-e2b; }
trap cleanup EXIT
"$SPACE" serve --listen 127.0.0.1:7191 --e2b-listen 127.0.0.1:7192 --data-dir "$WORK/serve" \
    --cgroup-parent space-bench-e2b --spaced "$SPACED" --default-template debian --prepare-templates busybox,debian \
    --pool debian=8 --pool-size-gib 8 2>"$WORK/serve.log" &
PIDS+=($!)
wait_for http://127.0.0.1:7191 "$WORK/serve/admin.key"
until curl -sf -H "Authorization: Bearer $(cat "$WORK/serve/admin.key")" http://127.0.0.1:7191/v1/templates \
    | grep -q '"name":"debian"'; do sleep 0.2; done

VENV=/var/cache/space/e2b-bench-venv
STAMP=$(cat tests/e2b/requirements.txt sdk/python/pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$VENV/.stamp" 2>/dev/null)" != "$STAMP" ]; then
    rm -rf "$VENV" && python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q -r tests/e2b/requirements.txt ./sdk/python
    echo "$STAMP" >"$VENV/.stamp"
fi
"$VENV/bin/pip" install -q --no-deps --force-reinstall ./sdk/python
E2B_API_URL=http://127.0.0.1:7192 E2B_SANDBOX_URL=http://127.0.0.1:7192 SPACE_URL=http://127.0.0.1:7191 \
    SPACE_API_KEY="$(cat "$WORK/serve/admin.key")" "$VENV/bin/python" tests/e2b/bench.py -n "$N"
