#!/usr/bin/env bash
# The hot-path measures (creates, exec round trips, the burst, optionally the peers and the
# control plane's scale) of `space bench` against a server of its own (data dir, ports and
# cgroup parent of its own, no rolling snapshots, the schedule run every second; stopped at the
# end), so A/B runs of two builds can be interleaved on a quiet machine.
# Not part of the tests; numbers go to docs/benchmarks.md.
# Usage: [SPACE=path/to/space] [SERVER=path/to/space serving] scripts/bench-hot.sh [space bench arguments…]
#   Each `space` needs its build's space-server beside it (`serve` and `bench` run there, and the
#   bench times the `space` beside its space-server): copy both when comparing builds.
#   e.g. scripts/bench-hot.sh --n 200 --exec-n 1000 --no-peers --burst 0
#        scripts/bench-hot.sh --scale-only --scale 10000 --scale-live 500
set -euo pipefail
cd "$(dirname "$0")/.."
SPACE=${SPACE:-target/release/space}
SERVER=${SERVER:-$SPACE}
SPACED=${SPACED_BIN:-target/x86_64-unknown-linux-gnu/release/spaced}
PORT=${PORT:-7193}
WORK=$(mktemp -d /var/tmp/space-bench-hot.XXXXXX)
chmod 755 "$WORK"
PIDS=()
# shellcheck source=scripts/bench-common.sh
. scripts/bench-common.sh
cleanup() { stop_servers "$WORK"/serve; kill_cgroup space-bench-hot; remove_cgroups space-bench-hot; }
trap cleanup EXIT
"$SERVER" serve --listen 127.0.0.1:"$PORT" --data-dir "$WORK/serve" --cgroup-parent space-bench-hot \
    --spaced "$SPACED" --default-template busybox --prepare-templates busybox --pool-size-gib 8 \
    --metrics-listen 127.0.0.1:"$((PORT + 1))" --snapshot-policy off --snapshot-tick-ms 1000 ${SERVE_ARGS:-} 2>"$WORK/serve.log" &
PIDS+=($!)
wait_for http://127.0.0.1:"$PORT" "$WORK/serve/admin.key"
SPACE_DATA_DIR="$WORK/serve" SPACE_URL=http://127.0.0.1:"$PORT" SPACE_API_KEY="$(cat "$WORK/serve/admin.key")" \
    "$SPACE" bench --cgroup-parent space-bench-hot --density 0 --lifecycle-n 0 --gateway-n 0 --ports-n 0 \
    --metrics-url http://127.0.0.1:"$((PORT + 1))" "$@"
