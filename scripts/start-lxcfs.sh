#!/usr/bin/env bash
# Starts lxcfs at /var/lib/lxcfs unless a working one is there (idempotent; run as root).
# Linux sandboxes see its /proc/meminfo, cpuinfo, stat, uptime, swaps and diskstats, which
# answer from each sandbox's own cgroups (space_host::lxcfs; without it they show the host's).
# Hosts with systemd run Debian's lxcfs unit; elsewhere the daemon is started detached.
set -euo pipefail
dir=/var/lib/lxcfs
working() { grep -q " $dir [^ ]* [^-]*- fuse.lxcfs " /proc/self/mountinfo && head -c1 "$dir/proc/uptime" >/dev/null 2>&1; }
working && exit 0
# A mount whose daemon died answers ENOTCONN to every read: take it away first.
if grep -q " $dir " /proc/self/mountinfo; then
  umount -l "$dir"
fi
if [ -d /run/systemd/system ]; then
  systemctl restart lxcfs
else
  mkdir -p "$dir"
  setsid lxcfs "$dir" </dev/null >>/var/log/lxcfs.log 2>&1 &
fi
for _ in $(seq 50); do
  working && exit 0
  sleep 0.1
done
echo "start-lxcfs.sh: lxcfs did not come up at $dir (see /var/log/lxcfs.log)" >&2
exit 1
