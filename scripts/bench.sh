#!/usr/bin/env bash
# Benchmarks against a running `space serve` (default http://127.0.0.1:7070) on this machine,
# side by side with runc and bwrap on the same root filesystem; not part of the tests.
# Results: bench/results/<time>.jsonl with the machine description. See docs/benchmarks.md.
# Extra arguments go to `space bench` (e.g. --n 50 --density 0 --cgroup-parent NAME).
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v runc >/dev/null || missing+=(runc)
command -v bwrap >/dev/null || missing+=(bubblewrap)
if [ ${#missing[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
fi
space template build busybox >/dev/null
exec space bench "$@"
