#!/usr/bin/env bash
# Creates spread over three nodes by one control replica, then by two: three `space node run`s
# (each with a data dir, warm pool and cgroup parent of its own) and two `space control`
# replicas over one PostgreSQL database (started by scripts/with-postgres.sh), all on this
# machine. `space bench --spread N` issues N creates through replica 1 alone, then through
# both in turn, 32 at a time, and reports each run's throughput, latencies, errors and how the
# sessions fell on the nodes. Not part of the tests; numbers go to docs/benchmarks.md.
# Usage: scripts/bench-replicas.sh [CREATES] (default 1000), with `space` built (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${SPACE_TEST_POSTGRES_URL:-}" ]; then
    exec scripts/with-postgres.sh "$0" "$@"
fi
CREATES=${1:-1000}
SPACE=${SPACE:-target/release/space}
SPACED=${SPACED_BIN:-target/x86_64-unknown-linux-gnu/release/spaced}
WORK=$(mktemp -d /var/tmp/space-bench-replicas.XXXXXX)
# Sandboxes' mapped root must be able to reach their roots below it.
chmod 755 "$WORK"
PIDS=()
# shellcheck source=scripts/bench-common.sh
. scripts/bench-common.sh
cleanup() {
    stop_servers "$WORK"/node-a "$WORK"/node-b "$WORK"/node-c
    # The nodes' warm pods outlive them.
    for node in a b c; do kill_cgroup "space-bench-replicas-$node"; done
    sleep 1
    remove_cgroups space-bench-replicas-
}
trap cleanup EXIT

psql "$SPACE_TEST_POSTGRES_URL" -X -q -c "CREATE DATABASE bench_replicas" >/dev/null
base=${SPACE_TEST_POSTGRES_URL%%\?*}
DATABASE="${base%/*}/bench_replicas?${SPACE_TEST_POSTGRES_URL#*\?}"

"$SPACE" cluster init --dir "$WORK/cluster" >/dev/null
nodes=()
port=7301
for node in a b c; do
    "$SPACE" cluster issue --dir "$WORK/cluster" --role node "bench-$node" --host 127.0.0.1 >/dev/null
    "$SPACE" node run --listen "127.0.0.1:$port" --name "bench-$node" --cluster-dir "$WORK/cluster" \
        --data-dir "$WORK/node-$node" --cgroup-parent "space-bench-replicas-$node" --spaced "$SPACED" \
        --default-template busybox --default-runtime linux --pool busybox=8 --pool-size-gib 16 \
        2>"$WORK/node-$node.log" &
    PIDS+=($!)
    nodes+=(--node "127.0.0.1:$port")
    port=$((port + 1))
done
for replica in 1 2; do
    "$SPACE" cluster issue --dir "$WORK/cluster" --role control "bench-control-$replica" >/dev/null
    # Every replica uses the key file the first one made (docs/operator-guide.md).
    "$SPACE" control --listen "127.0.0.1:731$replica" "${nodes[@]}" --name "bench-control-$replica" \
        --cluster-dir "$WORK/cluster" --database "$DATABASE" --data-dir "$WORK/control-$replica" \
        --key-file "$WORK/control-1/keys/master.key" --default-template busybox --prepare-templates busybox \
        2>"$WORK/control-$replica.log" &
    PIDS+=($!)
    [ "$replica" = 1 ] && wait_for http://127.0.0.1:7311 "$WORK/control-1/admin.key"
done
wait_for http://127.0.0.1:7312 "$WORK/control-1/admin.key"
# CPU seconds (user + system) each server process used: where the runs' time went.
cpu_seconds() { # PID
    awk -v tick="$(getconf CLK_TCK)" '{ printf "%.1f", ($14 + $15) / tick }' "/proc/$1/stat"
}
cpu_report() { # LABEL
    local line="$1: machine busy $(awk '/^cpu / { printf "%.1f", ($2 + $3 + $4 + $7 + $8) / 100 }' /proc/stat) s, idle \
$(awk '/^cpu / { printf "%.1f", ($5 + $6) / 100 }' /proc/stat) s;" i=0
    for name in node-a node-b node-c control-1 control-2; do
        line+=" $name $(cpu_seconds "${PIDS[$i]}") s"
        i=$((i + 1))
    done
    echo "$line"
}
cpu_report "CPU before"
"$SPACE" --url http://127.0.0.1:7311 --api-key "$(cat "$WORK/control-1/admin.key")" bench --spread-only \
    --spread "$CREATES" --spread-via http://127.0.0.1:7312 --out "$WORK/results"
cpu_report "CPU after"
