#!/usr/bin/env bash
# Installs the host packages space needs on Debian 12 (idempotent; run as root).
set -euo pipefail
need=()
for pkg in btrfs-progs debootstrap busybox-static iproute2 util-linux tar xz-utils zstd ca-certificates gcc libc6-dev; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null; then
  echo "cargo is missing: install the Rust toolchain (https://rustup.rs), version from rust-toolchain.toml" >&2
  exit 1
fi
# CRIU >= 4.2 for full snapshots, suspend and resume (Debian 12's is too old; see the script).
"$(dirname "$0")/install-criu.sh"
