#!/usr/bin/env bash
# Warm create and exec through a control plane that reaches its node over the node API
# (`space control` driving `space node run`, mutual TLS on loopback) against `space serve` with
# its node in process, on this machine, in the same run and interleaved (A, B, A, B). Each
# server gets a data dir, ports and cgroup parent of its own and is stopped at the end. Not
# part of the tests; numbers go to docs/benchmarks.md.
# Usage: scripts/bench-split.sh [ROUNDS] (default 2), with `space` built (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-2}
SPACE=${SPACE:-target/release/space}
SPACED=${SPACED_BIN:-target/x86_64-unknown-linux-gnu/release/spaced}
WORK=$(mktemp -d /var/tmp/space-bench-split.XXXXXX)
# Sandboxes' mapped root must be able to reach their roots below it.
chmod 755 "$WORK"
PIDS=()
# shellcheck source=scripts/bench-common.sh
. scripts/bench-common.sh
cleanup() { stop_servers "$WORK"/serve "$WORK"/node; }
trap cleanup EXIT
common=(--default-template busybox --default-runtime linux --pool busybox=8 --pool-size-gib 8)
"$SPACE" serve --listen 127.0.0.1:7181 --data-dir "$WORK/serve" --cgroup-parent space-bench-serve \
    --spaced "$SPACED" --prepare-templates busybox "${common[@]}" 2>"$WORK/serve.log" &
PIDS+=($!)
"$SPACE" cluster init --dir "$WORK/cluster" >/dev/null
"$SPACE" cluster issue --dir "$WORK/cluster" --role node bench-node --host 127.0.0.1 >/dev/null
"$SPACE" cluster issue --dir "$WORK/cluster" --role control bench-control >/dev/null
"$SPACE" node run --listen 127.0.0.1:7183 --name bench-node --cluster-dir "$WORK/cluster" --data-dir "$WORK/node" \
    --cgroup-parent space-bench-split --spaced "$SPACED" "${common[@]}" 2>"$WORK/node.log" &
PIDS+=($!)
"$SPACE" control --listen 127.0.0.1:7182 --node 127.0.0.1:7183 --name bench-control --cluster-dir "$WORK/cluster" \
    --data-dir "$WORK/control" --default-template busybox --prepare-templates busybox 2>"$WORK/control.log" &
PIDS+=($!)
wait_for http://127.0.0.1:7181 "$WORK/serve/admin.key"
wait_for http://127.0.0.1:7182 "$WORK/control/admin.key"
measure() { # NAME URL KEYFILE CGROUP_PARENT
    echo "== $1"
    "$SPACE" --url "$2" --api-key "$(cat "$3")" bench --no-peers --burst 0 --density 0 --lifecycle-n 0 \
        --gateway-n 0 --ports-n 0 --n 200 --exec-n 1000 --cgroup-parent "$4" --out "$WORK/results"
}
for round in $(seq "$ROUNDS"); do
    echo "# round $round"
    measure "space serve (node in process)" http://127.0.0.1:7181 "$WORK/serve/admin.key" space-bench-serve
    measure "space control -> space node run (mutual TLS)" http://127.0.0.1:7182 "$WORK/control/admin.key" space-bench-split
done
