#!/usr/bin/env bash
# Time from a node's death to its sessions being resumable elsewhere: `space control` with two
# `space node run`s sharing a blob store directory. Each sample creates a session running a
# counter, takes a full snapshot and waits until it is durable, then kills (SIGKILL) the node
# the session runs on and every process of its sandboxes, and measures from the kill to the
# session showing `interrupted` (it can be resumed from then on), and to it running again on
# the other node after `resume`. The killed node is started again on its data dir before the
# next sample. Not part of the tests; numbers go to docs/benchmarks.md.
# Usage: scripts/bench-failover.sh [SAMPLES] (default 5), with `space` built (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
SAMPLES=${1:-5}
SPACE=${SPACE:-target/release/space}
SPACED=${SPACED_BIN:-target/x86_64-unknown-linux-gnu/release/spaced}
WORK=$(mktemp -d /var/tmp/space-bench-failover.XXXXXX)
# Sandboxes' mapped root must be able to reach their roots below it.
chmod 755 "$WORK"
PIDS=()
# shellcheck source=scripts/bench-common.sh
. scripts/bench-common.sh
cleanup() {
    for node in a b; do kill_cgroup "space-bench-failover-$node"; done
    stop_servers "$WORK"/node-a "$WORK"/node-b
    remove_cgroups space-bench-failover-
}
trap cleanup EXIT
URL=http://127.0.0.1:7201
declare -A NODE_PID NODE_PORT=([a]=7202 [b]=7203)

start_node() { # NAME
    "$SPACE" node run --listen "127.0.0.1:${NODE_PORT[$1]}" --name "bench-$1" --cluster-dir "$WORK/cluster" \
        --data-dir "$WORK/node-$1" --cgroup-parent "space-bench-failover-$1" --spaced "$SPACED" \
        --blob-store "$WORK/blobs" --default-template busybox --default-runtime linux --pool busybox=1 \
        --pool-size-gib 8 2>>"$WORK/node-$1.log" &
    NODE_PID[$1]=$!
    PIDS+=($!)
}

api() { # METHOD PATH [BODY]
    curl -sf -X "$1" -H "Authorization: Bearer $KEY" -H 'content-type: application/json' \
        ${3:+--data "$3"} "$URL$2"
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# Waits until node bench-NAME is in STATE in `GET /v1/nodes`.
wait_node() { # NAME STATE
    for _ in $(seq 600); do
        [ "$(api GET /v1/nodes | jq -r ".nodes[] | select(.id == \"bench-$1\") | .state")" = "$2" ] && return 0
        sleep 0.1
    done
    echo "node bench-$1 never became $2" >&2
    exit 1
}

"$SPACE" cluster init --dir "$WORK/cluster" >/dev/null
nodes=()
for node in a b; do
    "$SPACE" cluster issue --dir "$WORK/cluster" --role node "bench-$node" --host 127.0.0.1 >/dev/null
    start_node "$node"
    nodes+=(--node "127.0.0.1:${NODE_PORT[$node]}")
done
"$SPACE" cluster issue --dir "$WORK/cluster" --role control bench-control >/dev/null
"$SPACE" control --listen 127.0.0.1:7201 "${nodes[@]}" --name bench-control --cluster-dir "$WORK/cluster" \
    --data-dir "$WORK/control" --default-template busybox --prepare-templates busybox 2>"$WORK/control.log" &
PIDS+=($!)
wait_for "$URL" "$WORK/control/admin.key"
KEY=$(cat "$WORK/control/admin.key")

echo "sample,node,to_interrupted_ms,to_running_elsewhere_ms"
for sample in $(seq "$SAMPLES"); do
    wait_node a ready
    wait_node b ready
    id=$(api POST /v1/sessions '{}' | jq -r .id)
    api POST "/v1/sessions/$id/exec" \
        '{"cmd":["sh","-c","i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 0.1; done"],"background":true}' >/dev/null
    api POST "/v1/sessions/$id/snapshots" '{"kind":"full"}' >/dev/null
    for _ in $(seq 300); do
        [ "$(api GET "/v1/sessions/$id/snapshots" | jq -r '.snapshots[-1].durable')" = true ] && break
        sleep 0.1
    done
    victim=$(api GET "/v1/sessions/$id" | jq -r .node)
    victim=${victim#bench-}
    kill -9 "${NODE_PID[$victim]}"
    kill_cgroup "space-bench-failover-$victim"
    killed=$(now_ms)
    until [ "$(api GET "/v1/sessions/$id" | jq -r .state)" = interrupted ]; do sleep 0.05; done
    interrupted=$(now_ms)
    api POST "/v1/sessions/$id/resume" '{}' >/dev/null
    running=$(now_ms)
    echo "$sample,bench-$victim,$((interrupted - killed)),$((running - killed))"
    api DELETE "/v1/sessions/$id" >/dev/null
    wait "${NODE_PID[$victim]}" 2>/dev/null || true
    start_node "$victim"
done
