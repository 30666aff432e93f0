#!/usr/bin/env bash
# Starts lxcfs at /var/lib/lxcfs unless a working one is there (idempotent; run as root).
# Linux sandboxes see its /proc/meminfo, cpuinfo, stat, uptime, swaps and diskstats and its
# /sys/devices/system/cpu/online, which answer from each sandbox's own cgroups
# (space_host::lxcfs; without it they show the host's). `--enable-cfs` makes the CPU count
# in cpuinfo, stat and cpu/online follow the sandbox's CFS quota rather than the host's;
# `-o direct_io` makes every read ask the daemon: a file's content depends on who reads it,
# and a sandbox reads through a bind of the file, whose size the kernel otherwise keeps from
# an earlier reader and cuts a longer answer to.
# Hosts with systemd run Debian's lxcfs unit (with a drop-in adding the flag); elsewhere the
# daemon is started detached.
set -euo pipefail
dir=/var/lib/lxcfs
pidfile=/run/lxcfs.pid
answers() { grep -q " $dir [^ ]* [^-]*- fuse.lxcfs " /proc/self/mountinfo && head -c1 "$dir/proc/uptime" >/dev/null 2>&1; }
flags="--enable-cfs -o direct_io"
# The daemon serving the mount writes its pid here; one started without the flags counts
# CPUs from the host.
with_flags() { [ -r "$pidfile" ] && tr '\0' ' ' <"/proc/$(cat "$pidfile")/cmdline" 2>/dev/null | grep -q -- "$flags"; }
working() { answers && with_flags; }
working && exit 0
if [ -d /run/systemd/system ]; then
  mkdir -p /etc/systemd/system/lxcfs.service.d
  printf '[Service]\nExecStart=\nExecStart=/usr/bin/lxcfs %s %s\n' "$flags" "$dir" \
    >/etc/systemd/system/lxcfs.service.d/space.conf
  systemctl daemon-reload
  systemctl restart lxcfs
else
  old=$(cat "$pidfile" 2>/dev/null || true)
  if answers && [ -n "$old" ] && [ "$(cat "/proc/$old/comm" 2>/dev/null)" = lxcfs ]; then
    # A working daemon without the flags: replace it (sandboxes started on it see ENOTCONN
    # until they are restarted or restored). It must be gone before the new one takes the
    # pidfile.
    kill "$old" || true
    for _ in $(seq 50); do
      kill -0 "$old" 2>/dev/null || break
      sleep 0.1
    done
  fi
  # A mount whose daemon died (or was just stopped) answers ENOTCONN to every read: take it
  # away first. (A daemon that stops unmounts it itself, perhaps meanwhile.)
  if grep -q " $dir " /proc/self/mountinfo; then
    umount -l "$dir" || true
  fi
  mkdir -p "$dir"
  # shellcheck disable=SC2086 # the flags are words
  setsid lxcfs $flags --pidfile="$pidfile" "$dir" </dev/null >>/var/log/lxcfs.log 2>&1 &
fi
for _ in $(seq 50); do
  working && exit 0
  sleep 0.1
done
echo "start-lxcfs.sh: lxcfs did not come up at $dir with $flags (see /var/log/lxcfs.log)" >&2
exit 1
