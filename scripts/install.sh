#!/usr/bin/env bash
# Installs what is missing, builds space, space-server and spaced, and puts them in
# /usr/local/bin (`space` hands the server's commands to `space-server` beside it).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo build --release -p space-cli
cargo build-spaced
install -m 0755 target/release/space /usr/local/bin/space
install -m 0755 target/release/space-server /usr/local/bin/space-server
install -m 0755 target/x86_64-unknown-linux-gnu/release/spaced /usr/local/bin/spaced
echo "installed /usr/local/bin/space, /usr/local/bin/space-server and /usr/local/bin/spaced"
