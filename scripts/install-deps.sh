#!/usr/bin/env bash
# Installs the host packages space needs on Debian 12 (idempotent; run as root).
set -euo pipefail

# Installs the packages among "$@" that are missing; apt's own options first, up to "--".
install_missing() {
  local options=() need=() pkg
  while [ "$1" != -- ]; do
    options+=("$1")
    shift
  done
  shift
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
  done
  if [ ${#need[@]} -gt 0 ]; then
    echo "installing: ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${options[@]}" "${need[@]}" >/dev/null
  fi
}

install_missing -- btrfs-progs debootstrap busybox-static iproute2 util-linux tar xz-utils zstd ca-certificates gcc libc6-dev curl
# scripts/test.sh validates docs/openapi.json with a validator from PyPI, in a venv.
command -v python3 >/dev/null || install_missing -- python3 python3-venv
# The `vm` runtime: QEMU, and what install-vm.sh builds the guest with (binutils: readelf,
# strings). Without recommends: QEMU's pull in display, audio and firmware packages that a
# headless microvm never uses.
install_missing --no-install-recommends -- qemu-system-x86 lz4 cpio binutils
# PostgreSQL for the tests that run against it (scripts/with-postgres.sh starts a server of
# their own; `space serve` needs none: SQLite is its default).
install_missing --no-install-recommends -- postgresql
# The image tests make OCI images with umoci, convert and push them with skopeo, and pull them
# from a registry of their own (docker-registry; htpasswd makes its login) on loopback
# (crates/space-cli/tests/images.rs).
install_missing --no-install-recommends -- umoci skopeo docker-registry apache2-utils
# lxcfs: linux sandboxes' /proc/meminfo, uptime, … answer from their own cgroups (one daemon
# for the host; see the script).
install_missing --no-install-recommends -- lxcfs
"$(dirname "$0")/start-lxcfs.sh"
if ! command -v cargo >/dev/null; then
  echo "cargo is missing: install the Rust toolchain (https://rustup.rs), version from rust-toolchain.toml" >&2
  exit 1
fi
# CRIU >= 4.2 for full snapshots, suspend and resume (Debian 12's is too old; see the script).
"$(dirname "$0")/install-criu.sh"
# The `vm` runtime's guest kernel and initramfs, in /var/cache/space/vm (see the script).
"$(dirname "$0")/install-vm.sh"
