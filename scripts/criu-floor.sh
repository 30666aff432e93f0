#!/usr/bin/env bash
# The floor of an eager CRIU restore on this host: CRIU alone restoring one plain process that
# holds MIB MiB of random bytes — no namespaces, cgroups, action script, network or node.
# A sandbox restore (`restore_full_100mib` in `space bench`) does all of this and more, so it
# cannot be faster. Prints p50/p90 of N restores (wall time of `criu restore`) and the time
# CRIU's restorer spends reading the pages back (its one `preadv`). See docs/benchmarks.md.
# Usage: scripts/criu-floor.sh [N=11] [MIB=100]; needs root, python3 and
# scripts/install-criu.sh's CRIU.
set -euo pipefail
n=${1:-11}
mib=${2:-100}
prefix=/var/cache/space/criu
criu=("$prefix/lib/ld-linux-x86-64.so.2" --library-path "$prefix/lib" "$prefix/libexec/criu")
# As the node runs CRIU: its kernel-probe cache on a private tmpfs /run (space-criu's kerndat.rs).
kdat=/var/cache/space/criu-kdat
if ! mountpoint -q "$kdat"; then
    mkdir -p "$kdat" && mount -t tmpfs -o size=1m,mode=700 space-criu-kdat "$kdat"
fi
criu_restore() {
    unshare -m --propagation private sh -c 'mount --bind "$0" /run && shift && exec "$@"' \
        "$kdat" _ "${criu[@]}" restore "$@"
}

work=$(mktemp -d /var/tmp/criu-floor.XXXXXX)
holder=""
cleanup() {
    [ -n "$holder" ] && kill -9 "$holder" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

# Detached (`setsid -f`), so whoever adopts it reaps it once the dump has killed it.
setsid -f python3 -c "import os, time
b = bytearray(os.urandom($mib << 20)); print(os.getpid(), flush=True); time.sleep(1e6)" \
    </dev/null >"$work/ready" 2>/dev/null
until [ -s "$work/ready" ]; do sleep 0.05; done
holder=$(cat "$work/ready")
mkdir "$work/img"
"${criu[@]}" dump -t "$holder" -D "$work/img" -o dump.log -v4
while [ -e "/proc/$holder" ]; do sleep 0.01; done # dumped, hence killed: its pid must be free
holder=""
echo "image: $(du -sm "$work/img" | cut -f1) MiB"

for _ in $(seq "$n"); do
    rm -f "$work/pid"
    start=$(date +%s%N)
    criu_restore -D "$work/img" -o restore.log -v4 --restore-detached --pidfile "$work/pid"
    end=$(date +%s%N)
    holder=$(cat "$work/pid")
    echo $(((end - start) / 1000)) >>"$work/wall"
    # The restorer logs the preadv call and its return; the gap between them is the page copy.
    awk '/Preadv/ { t = substr($1, 2, 9) } /`- returned/ && t { print int((substr($1, 2, 9) - t) * 1e6); exit }' \
        "$work/img/restore.log" >>"$work/pages"
    kill -9 "$holder"
    while [ -e "/proc/$holder" ]; do sleep 0.01; done
    holder=""
done

summary() {
    sort -n "$2" | awk -v what="$1" '{ a[NR] = $1 }
        END { printf "%s: p50 %.1f ms  p90 %.1f ms  (n=%d)\n", what, a[int(NR / 2) + 1] / 1000, a[int(NR * 0.9 + 0.5)] / 1000, NR }'
}
summary "criu restore, ${mib} MiB" "$work/wall"
summary "  of it reading the pages back" "$work/pages"
