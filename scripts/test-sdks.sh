#!/usr/bin/env bash
# The SDKs' test suites against a live server: starts `space serve` (busybox default template,
# E2B endpoint on a second port) on a free loopback port with a data dir and cgroup parent of
# its own, runs the Python SDK's pytest suite, the MCP server's, E2B's Python and JS SDKs
# against the E2B endpoint (tests/e2b) and, when sdk/typescript/package.json exists, the
# TypeScript SDK's `npm test` (all read SPACE_URL and SPACE_API_KEY), then stops the server
# and removes what it made,
# also when a suite fails or the script is interrupted. Fails if any suite failed.
#
# Run as root from the repository root (scripts/test.sh calls it after the Rust tests).
# Binaries: $SPACE_BIN, else target/debug/space (what `cargo test` built; `cargo build -p
# space-cli` builds it when missing); spaced: $SPACED_BIN, else target/x86_64-unknown-linux-gnu/release/spaced (`cargo
# build-spaced`). The Python venv is /var/cache/space/sdk-venv, made again only when the SDK's
# requirements (sdk/python/pyproject.toml) change; SPACE_SDK_VENV overrides its place.
# Extra arguments go to pytest (e.g. `scripts/test-sdks.sh -k files -x`).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "test-sdks.sh creates real sandboxes and needs root" >&2
  exit 1
fi

SPACE_BIN=${SPACE_BIN:-target/debug/space}
# `space serve` and `space mcp` run in the space-server beside it.
if [ ! -x "$SPACE_BIN" ] || [ ! -x "$(dirname "$SPACE_BIN")/space-server" ]; then
  echo "== building $SPACE_BIN"
  cargo build -p space-cli
fi
SPACE_BIN=$(realpath "$SPACE_BIN")
SPACED=${SPACED_BIN:-target/x86_64-unknown-linux-gnu/release/spaced}
if [ ! -x "$SPACED" ]; then
  echo "no spaced at $SPACED: run \`cargo build-spaced\` or set SPACED_BIN" >&2
  exit 1
fi

CGROUP_PARENT=space-sdk-tests
DATA_DIR=$(mktemp -d /var/tmp/space-sdk-tests-XXXXXX)
chmod 755 "$DATA_DIR" # sandboxes run as mapped uids: every parent of their roots must be searchable
LOG="$DATA_DIR.log"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
E2B_PORT=$(free_port)
SERVER_PID=

# Stops the server, kills what is left in its cgroups, unmounts its pool and removes its data
# dir. Only what this run made: its own data dir, its own cgroup parent.
cleanup() {
  local status=$?
  set +e
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID"
    for _ in $(seq 1 100); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVER_PID" 2>/dev/null
    wait "$SERVER_PID" 2>/dev/null
  fi
  for _ in $(seq 1 50); do
    local busy=0 dir pid
    while IFS= read -r dir; do
      for pid in $(cat "$dir/cgroup.procs" 2>/dev/null); do busy=1; kill -KILL "$pid" 2>/dev/null; done
      [ -e "$dir/freezer.state" ] && echo THAWED >"$dir/freezer.state" 2>/dev/null
      rmdir "$dir" 2>/dev/null
    done < <(find /sys/fs/cgroup/*/"$CGROUP_PARENT" /sys/fs/cgroup/"$CGROUP_PARENT" -mindepth 1 -depth -type d 2>/dev/null)
    [ "$busy" = 0 ] && break
    sleep 0.1
  done
  rmdir /sys/fs/cgroup/*/"$CGROUP_PARENT" /sys/fs/cgroup/"$CGROUP_PARENT" 2>/dev/null
  local mount loop
  while read -r _ mount _; do
    case "$mount" in "$DATA_DIR"/*|"$DATA_DIR") umount -l "$mount" 2>/dev/null ;; esac
  done < <(sort -r -k2 /proc/mounts)
  for loop in $(losetup -j "$DATA_DIR/pool.img" -O NAME -n 2>/dev/null); do losetup -d "$loop" 2>/dev/null; done
  if grep -q " $DATA_DIR" /proc/mounts; then
    echo "$DATA_DIR is still mounted: left in place" >&2
  else
    rm -rf "$DATA_DIR"
  fi
  if [ "$status" = 0 ]; then rm -f "$LOG"; else echo "server log kept at $LOG" >&2; fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== starting space serve on 127.0.0.1:$PORT (data $DATA_DIR)"
# debian too: E2B's SDKs run commands under /bin/bash, which busybox lacks. A fast schedule
# tick, so that E2B timeouts are enforced within a second. A domain for E2B's get_host (its
# hosts are sent to the endpoint by their Host header; nothing resolves them); no preview
# domain, which the other suites do not expect.
"$SPACE_BIN" serve --listen "127.0.0.1:$PORT" --e2b-listen "127.0.0.1:$E2B_PORT" --data-dir "$DATA_DIR" \
  --cgroup-parent "$CGROUP_PARENT" --snapshot-tick-ms 500 --e2b-domain e2b.test \
  --default-template busybox --prepare-templates busybox,debian --pool-size-gib 8 \
  --default-runtime "${SPACE_TEST_RUNTIME:-linux}" --spaced "$SPACED" </dev/null >/dev/null 2>"$LOG" &
SERVER_PID=$!

export SPACE_URL="http://127.0.0.1:$PORT"
ready=0
for _ in $(seq 1 1200); do
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "space serve exited; its log:" >&2
    cat "$LOG" >&2
    exit 1
  fi
  if [ -s "$DATA_DIR/admin.key" ]; then
    SPACE_API_KEY=$(cat "$DATA_DIR/admin.key")
    templates=$(curl -sf -H "Authorization: Bearer $SPACE_API_KEY" "$SPACE_URL/v1/templates" || true)
    if grep -q '"name":"busybox"' <<<"$templates" && grep -q '"name":"debian"' <<<"$templates"; then
      ready=1
      break
    fi
  fi
  sleep 0.1
done
if [ "$ready" != 1 ]; then
  echo "space serve was not ready in 120 s; its log:" >&2
  cat "$LOG" >&2
  exit 1
fi
export SPACE_API_KEY

# The venv: its requirements are sdk/python/pyproject.toml's; the SDK itself is installed
# again on every run (it is small, and its code may have changed).
VENV=${SPACE_SDK_VENV:-/var/cache/space/sdk-venv}
STAMP=$(sha256sum sdk/python/pyproject.toml | cut -d' ' -f1)
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/.requirements" 2>/dev/null)" != "$STAMP" ]; then
  echo "== making the venv $VENV"
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "./sdk/python[test]"
  echo "$STAMP" >"$VENV/.requirements"
fi
"$VENV/bin/pip" install -q --no-deps --force-reinstall ./sdk/python

failed=0
echo "== Python SDK tests"
(cd sdk/python && "$VENV/bin/python" -m pytest -p no:cacheprovider "$@") || failed=1

# A venv at DIR holding REQUIREMENTS (pinned), made again only when they change.
pinned_venv() { # REQUIREMENTS DIR
  if ! cmp -s "$1" "$2/requirements.txt"; then
    echo "== making the venv $2"
    rm -rf "$2" && python3 -m venv "$2"
    "$2/bin/pip" install -q -r "$1"
    cp "$1" "$2/requirements.txt"
  fi
}

# The MCP server: the official MCP client SDK (PyPI `mcp`, pinned) drives `space mcp`.
MCP_VENV=${MCP_VENV:-/var/cache/space/mcp-venv}
pinned_venv tests/mcp/requirements.txt "$MCP_VENV"
echo "== MCP server tests"
SPACE_BIN="$SPACE_BIN" "$MCP_VENV/bin/pytest" -q -p no:cacheprovider tests/mcp || failed=1

# E2B's own SDKs (PyPI and npm `e2b`, pinned) against the E2B endpoint, unchanged.
E2B_VENV=${E2B_VENV:-/var/cache/space/e2b-venv}
pinned_venv tests/e2b/requirements.txt "$E2B_VENV"
export E2B_API_URL="http://127.0.0.1:$E2B_PORT" E2B_SANDBOX_URL="http://127.0.0.1:$E2B_PORT" E2B_TEST_DOMAIN=e2b.test
echo "== E2B Python SDK tests"
"$E2B_VENV/bin/pytest" -q -p no:cacheprovider tests/e2b || failed=1
echo "== E2B JS SDK tests"
E2B_API_KEY=$(curl -sf -X POST -H "Authorization: Bearer $SPACE_API_KEY" -H 'content-type: application/json' \
  -d '{"tenant":"e2b-js"}' "$SPACE_URL/v1/keys" | python3 -c 'import json, sys; print(json.load(sys.stdin)["key"])')
(cd tests/e2b/js && npm ci --no-audit --no-fund && E2B_API_KEY="$E2B_API_KEY" npm test) || failed=1

if [ -f sdk/typescript/package.json ]; then
  echo "== TypeScript SDK tests"
  (cd sdk/typescript && npm ci --no-audit --no-fund && npm test) || failed=1
fi

if [ "$failed" != 0 ]; then
  echo "SDK tests failed" >&2
  exit 1
fi
echo "SDK tests passed"
