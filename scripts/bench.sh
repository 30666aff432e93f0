#!/usr/bin/env bash
# Benchmarks against a running `space serve` (default http://127.0.0.1:7070); not part of the tests.
# Results: bench/results/<time>.jsonl with the machine description.
set -euo pipefail
cd "$(dirname "$0")/.."
space template build busybox >/dev/null
exec space bench "$@"
