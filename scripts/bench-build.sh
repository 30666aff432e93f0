#!/usr/bin/env bash
# A Dockerfile build on the debian template (a venv, two COPYs, two RUNs), then N rebuilds
# with nothing changed, each timed from the CLI's start to its end (pack and send the
# context, parse, look up every step's layer, publish the version). Starts a server of its
# own; not part of the tests; numbers go to docs/benchmarks.md.
# Usage: scripts/bench-build.sh [N] (default 10), with `space` built (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-10}
SPACE=${SPACE:-target/release/space}
SPACED=${SPACED_BIN:-target/x86_64-unknown-linux-gnu/release/spaced}
WORK=$(mktemp -d /var/tmp/space-bench-build.XXXXXX)
chmod 755 "$WORK" # sandboxes reach their roots below it as their own root
PIDS=()
# shellcheck source=scripts/bench-common.sh
. scripts/bench-common.sh
cleanup() {
    stop_servers "$WORK"/serve
    kill_cgroup space-bench-build
    remove_cgroups space-bench-build
}
trap cleanup EXIT

CTX="$WORK/ctx"
mkdir -p "$CTX/src"
printf 'requests==2.32.3\n' >"$CTX/requirements.txt"
for i in $(seq 200); do printf 'def f%d():\n    return %d\n' "$i" "$i" >"$CTX/src/mod$i.py"; done
printf 'print("hello")\n' >"$CTX/src/main.py"
cat >"$CTX/Dockerfile" <<'DOCKERFILE'
FROM debian
ENV APP_HOME=/srv/app PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR $APP_HOME
COPY requirements.txt ./
RUN python3 -m venv /opt/venv && python -c "import sys; print(sys.prefix)"
COPY src/ ./src/
RUN python -m compileall -q src && ls src | wc -l
CMD ["python", "src/main.py"]
DOCKERFILE

"$SPACE" serve --listen 127.0.0.1:7194 --data-dir "$WORK/serve" --cgroup-parent space-bench-build --spaced "$SPACED" \
    --pool "" --pool-size-gib 12 2>"$WORK/serve.log" &
PIDS+=($!)
wait_for http://127.0.0.1:7194 "$WORK/serve/admin.key"
export SPACE_URL=http://127.0.0.1:7194 SPACE_API_KEY
SPACE_API_KEY=$(cat "$WORK/serve/admin.key")
"$SPACE" template build debian >/dev/null
ms() { date +%s%3N; }
t0=$(ms)
"$SPACE" template build app "$CTX" >"$WORK/first.log"
echo "first build (no cache): $(($(ms) - t0)) ms"
times=()
for i in $(seq "$N"); do
    t0=$(ms)
    "$SPACE" template build app "$CTX" >"$WORK/rebuild.log"
    times+=($(($(ms) - t0)))
    grep -c "Using cache" "$WORK/rebuild.log" | grep -qx 5 || { echo "rebuild $i ran a step" >&2; cat "$WORK/rebuild.log" >&2; exit 1; }
done
printf '%s\n' "${times[@]}" | sort -n | awk -v n="$N" '{a[NR]=$1} END {
    p50 = a[int((n + 1) / 2)]; p90 = a[int(n * 0.9 + 0.999)]
    printf "cached rebuild, nothing changed (n=%d): p50 %d ms, p90 %d ms, min %d, max %d\n", n, p50, p90, a[1], a[n] }'
# The server's share: each rebuild's operation, from its creation to its end.
curl -sf -H "Authorization: Bearer $SPACE_API_KEY" "$SPACE_URL/v1/templates/builds" | python3 -c '
import json, sys
spans = sorted(b["updated_at"] - b["created_at"] for b in json.load(sys.stdin)["builds"][:-1])
print(f"server side of the rebuilds (n={len(spans)}): p50 {spans[(len(spans) - 1) // 2]} ms, max {spans[-1]} ms")'
