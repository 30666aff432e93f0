# Shared by the benchmark scripts that start servers of their own (bench-split.sh,
# bench-move.sh): source it after setting WORK and PIDS.

# Stops the servers in PIDS, deletes the sandbox roots left in each data dir given, unmounts
# their pools and removes WORK.
stop_servers() { # DATA_DIR...
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    for dir in "$@"; do
        [ -d "$dir/pool/sandboxes" ] && for s in "$dir"/pool/sandboxes/*/rootfs; do
            btrfs subvolume delete -c "$s" >/dev/null 2>&1 || true
        done
        umount -l "$dir/pool" 2>/dev/null || true
        # The node's tmpfs for images in clear (space-node's in_memory.rs).
        umount -l "$dir/memory" 2>/dev/null || true
    done
    rm -rf "$WORK"
}

# Waits until the server at URL answers with the busybox template, with the key in KEYFILE.
wait_for() { # URL KEYFILE
    for _ in $(seq 600); do
        if [ -s "$2" ] && curl -sf -H "Authorization: Bearer $(cat "$2")" "$1/v1/templates" | grep -q busybox; then
            return 0
        fi
        sleep 0.2
    done
    echo "no server at $1" >&2
    exit 1
}

# SIGKILLs every process in the pids cgroups below PARENT: the sandboxes and warm pods a
# stopped node left running (`spaced` outlives it). A sandbox the node was tearing down when it
# stopped may be left frozen, and a frozen process takes no signal: thaw first.
kill_cgroup() { # PARENT
    local dir=/sys/fs/cgroup/pids/$1
    [ -d "$dir" ] || return 0
    find "/sys/fs/cgroup/freezer/$1" -name freezer.state 2>/dev/null | while read -r state; do
        echo THAWED >"$state" 2>/dev/null || true
    done
    find "$dir" -name cgroup.procs -exec cat {} + 2>/dev/null | while read -r pid; do
        kill -9 "$pid" 2>/dev/null || true
    done
}

# Removes the (empty, once its servers stopped) cgroups named PREFIX* under every v1 controller.
remove_cgroups() { # PREFIX
    for dir in /sys/fs/cgroup/*/"$1"*; do
        [ -d "$dir" ] && find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
}
