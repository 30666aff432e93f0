#!/usr/bin/env bash
# Suspend and resume of a session holding 100 MiB: on `space serve` (one node, no blob store:
# the session stays) against a control plane with two nodes sharing a blob store directory (the
# snapshot goes to the blob store, and the session resumes on the other node), interleaved
# (A, B, A, B) on this machine. Each server gets its data dir, ports and cgroup parent; all are
# stopped at the end. Not part of the tests; numbers go to docs/benchmarks.md.
# Usage: scripts/bench-move.sh [ROUNDS] [SAMPLES] (default 2 and 10), with `space` built
# (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-2}
SAMPLES=${2:-10}
SPACE=${SPACE:-target/release/space}
SPACED=${SPACED_BIN:-target/x86_64-unknown-linux-gnu/release/spaced}
WORK=$(mktemp -d /var/tmp/space-bench-move.XXXXXX)
# Sandboxes' mapped root must be able to reach their roots below it.
chmod 755 "$WORK"
PIDS=()
# shellcheck source=scripts/bench-common.sh
. scripts/bench-common.sh
cleanup() {
    # BENCH_LOGS=DIR keeps the servers' logs (their timings) there.
    if [ -n "${BENCH_LOGS:-}" ]; then mkdir -p "$BENCH_LOGS" && cp "$WORK"/*.log "$BENCH_LOGS"/; fi
    stop_servers "$WORK"/serve "$WORK"/node-a "$WORK"/node-b
    remove_cgroups space-bench-move-
}
trap cleanup EXIT
common=(--default-template busybox --default-runtime linux --pool busybox=0 --pool-size-gib 8)
"$SPACE" serve --listen 127.0.0.1:7191 --data-dir "$WORK/serve" --cgroup-parent space-bench-move-serve \
    --spaced "$SPACED" --prepare-templates busybox "${common[@]}" 2>"$WORK/serve.log" &
PIDS+=($!)
"$SPACE" cluster init --dir "$WORK/cluster" >/dev/null
nodes=()
for node in a b; do
    port=$((7193 + ${#nodes[@]}))
    "$SPACE" cluster issue --dir "$WORK/cluster" --role node "bench-$node" --host 127.0.0.1 >/dev/null
    "$SPACE" node run --listen "127.0.0.1:$port" --name "bench-$node" --cluster-dir "$WORK/cluster" \
        --data-dir "$WORK/node-$node" --cgroup-parent "space-bench-move-$node" --spaced "$SPACED" \
        --blob-store "$WORK/blobs" "${common[@]}" 2>"$WORK/node-$node.log" &
    PIDS+=($!)
    nodes+=(--node "127.0.0.1:$port")
done
"$SPACE" cluster issue --dir "$WORK/cluster" --role control bench-control >/dev/null
"$SPACE" control --listen 127.0.0.1:7192 "${nodes[@]}" --name bench-control --cluster-dir "$WORK/cluster" \
    --data-dir "$WORK/control" --default-template busybox --prepare-templates busybox 2>"$WORK/control.log" &
PIDS+=($!)
wait_for http://127.0.0.1:7191 "$WORK/serve/admin.key"
wait_for http://127.0.0.1:7192 "$WORK/control/admin.key"
measure() { # NAME URL KEYFILE
    echo "== $1"
    "$SPACE" --url "$2" --api-key "$(cat "$3")" bench --no-peers --burst 0 --density 0 --lifecycle-n 0 \
        --gateway-n 0 --ports-n 0 --n 2 --exec-n 1 --pool 1 --move-n "$SAMPLES" --out "$WORK/results"
}
for round in $(seq "$ROUNDS"); do
    echo "# round $round"
    measure "space serve (one node, no blob store)" http://127.0.0.1:7191 "$WORK/serve/admin.key"
    measure "space control, two nodes sharing a blob store" http://127.0.0.1:7192 "$WORK/control/admin.key"
done
