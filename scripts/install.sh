#!/usr/bin/env bash
# Installs what is missing, builds space and spaced, and puts them in /usr/local/bin.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo build --release -p space-cli
cargo build-spaced
install -m 0755 target/release/space /usr/local/bin/space
install -m 0755 target/x86_64-unknown-linux-gnu/release/spaced /usr/local/bin/spaced
echo "installed /usr/local/bin/space and /usr/local/bin/spaced"
