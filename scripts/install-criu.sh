#!/usr/bin/env bash
# Installs CRIU >= 4.2 into a private prefix, /var/cache/space/criu (idempotent; run as root).
#
# Debian 12's criu (3.17) fails on current kernels (vdso bounds) and trixie's 4.1 cannot dump
# inet sockets on kernels >= 6.16, so this takes forky's: debootstrap a throwaway minbase root
# with criu in it, copy out the binary, the libraries it links and the dynamic loader, and
# start it through a wrapper that runs that loader with that library path. Nothing of the
# host's own libraries or packages changes.
set -euo pipefail

PREFIX=/var/cache/space/criu
WRAPPER="$PREFIX/bin/criu"
MIN_VERSION=4.2
SUITE=forky
MIRROR=http://deb.debian.org/debian

# Prints the version `criu --version` reports through $1 ("4.2.1"), or nothing.
criu_version() {
  "$1" --version 2>/dev/null | sed -n 's/^Version: *\([0-9][0-9.]*\).*/\1/p' | head -n1
}

# Whether version $1 >= version $2.
version_ge() {
  [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]
}

if [ "$(id -u)" -ne 0 ]; then
  echo "install-criu.sh: run as root" >&2
  exit 1
fi

if [ -x "$WRAPPER" ]; then
  have=$(criu_version "$WRAPPER")
  if [ -n "$have" ] && version_ge "$have" "$MIN_VERSION"; then
    exit 0
  fi
fi

command -v debootstrap >/dev/null || { echo "install-criu.sh: debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }

mkdir -p /var/cache/space
work=$(mktemp -d /var/cache/space/criu-build.XXXXXX)
# debootstrap mounts /proc and /sys inside the chroot; an interrupted run can leave them.
cleanup() {
  set +e # best effort: an error here must not skip the removal
  grep -o " $work/[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m"; done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT

chroot_dir="$work/root"
stage="$work/prefix"
echo "install-criu.sh: debootstrapping a $SUITE root with criu (about 30 s)"
if ! debootstrap --variant=minbase --include=criu "$SUITE" "$chroot_dir" "$MIRROR" \
  /usr/share/debootstrap/scripts/sid >"$work/debootstrap.log" 2>&1; then
  tail -n 30 "$work/debootstrap.log" >&2
  echo "install-criu.sh: debootstrap failed" >&2
  exit 1
fi

binary=$(chroot "$chroot_dir" sh -c 'command -v criu')
mkdir -p "$stage/bin" "$stage/lib" "$stage/libexec"
cp -L "$chroot_dir$binary" "$stage/libexec/criu"

# ldd runs inside the chroot so it resolves against forky's libraries, not the host's.
# Lines look like "libfoo.so.1 => /lib/.../libfoo.so.1 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)".
loader=
while read -r line; do
  case "$line" in
    *"=> not found"*)
      echo "install-criu.sh: criu needs a library the chroot lacks: $line" >&2
      exit 1
      ;;
    *" => /"*)
      name=${line%% =>*}
      path=${line#*=> }
      path=${path%% (*}
      cp -L "$chroot_dir$path" "$stage/lib/$name"
      ;;
    /*)
      path=${line%% (*}
      loader=$(basename "$path")
      cp -L "$chroot_dir$path" "$stage/lib/$loader"
      ;;
  esac
done < <(chroot "$chroot_dir" ldd "$binary")
[ -n "$loader" ] || { echo "install-criu.sh: ldd named no dynamic loader for $binary" >&2; exit 1; }

cat >"$stage/bin/criu" <<EOF
#!/bin/sh
# CRIU from Debian $SUITE with its own libraries (written by scripts/install-criu.sh).
exec $PREFIX/lib/$loader --library-path $PREFIX/lib $PREFIX/libexec/criu "\$@"
EOF
chmod 0755 "$stage/bin/criu" "$stage/libexec/criu" "$stage/lib/$loader"

# Swap the finished prefix in (the wrapper's paths point at $PREFIX, so check it there).
rm -rf "$PREFIX.old"
[ -e "$PREFIX" ] && mv "$PREFIX" "$PREFIX.old"
mv "$stage" "$PREFIX"
rm -rf "$PREFIX.old"

have=$(criu_version "$WRAPPER")
if [ -z "$have" ] || ! version_ge "$have" "$MIN_VERSION"; then
  echo "install-criu.sh: installed criu reports version '${have:-?}', need >= $MIN_VERSION" >&2
  exit 1
fi
# `criu check` may list optional features this kernel lacks (e.g. soft-dirty tracking for
# incremental dumps); dump and restore work without them.
echo "install-criu.sh: criu check says:"
"$WRAPPER" check 2>&1 | sed 's/^/  /' || true
echo "installed criu $have at $WRAPPER ($(du -sh "$PREFIX" | cut -f1))"
