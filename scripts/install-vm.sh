#!/usr/bin/env bash
# Builds the guest kernel and initramfs of the `vm` runtime into /var/cache/space/vm
# (idempotent; run as root):
#
#   vmlinux        Debian's cloud kernel as an ELF, booted by QEMU through its PVH entry: the
#                  bzImage would first decompress itself, which takes long under TCG
#   initrd.cpio    uncompressed newc archive: static busybox, the virtio modules, /init
#                  (scripts/vm-guest/init); the node appends a second archive holding /spaced
#   kernel-version the guest's `uname -r`
#   build-hash     hash of this script and of /init: a change of either rebuilds
#   READY          present once all of the above are complete
#
# Nothing is rebuilt while all files are present and the hash matches; a rebuild stages the
# new set beside the old one and swaps the directory, so READY never names a partial set.
set -euo pipefail

CACHE=/var/cache/space
OUT=$CACHE/vm
here=$(cd "$(dirname "$0")" && pwd)
INIT_SRC=$here/vm-guest/init
META_PACKAGE=linux-image-cloud-amd64

# Load order, dependencies first (checked against each module's own `depends=` below).
# virtio_mmio finds the microvm's devices in its ACPI tables; failover and net_failover only
# because virtio_net links against them. virtio_rng seeds the kernel's RNG from the host when
# the VM has a virtio-rng device: without a seed (no RDRAND either: TCG's qemu64 has none)
# getrandom(2) blocks, and with it spaced's first connection.
MODULES=(virtio_ring virtio virtio_mmio virtio_rng virtio_blk virtio_console failover net_failover virtio_net)
# What the root filesystem needs, should the kernel build any of it as a module.
EXT4_MODULES=(CRC16:crc16 FS_MBCACHE:mbcache JBD2:jbd2 EXT4_FS:ext4)
# Applets /init runs (besides shell builtins).
APPLETS=(sh mount insmod sleep ip hostname mkdir cp chmod rm ln sync poweroff switch_root)

die() {
  echo "install-vm.sh: $*" >&2
  exit 1
}

[ "$(id -u)" -eq 0 ] || die "run as root"
[ -f "$INIT_SRC" ] || die "missing $INIT_SRC"
for tool in apt-get dpkg-deb lz4 cpio readelf strings sha256sum flock; do
  command -v "$tool" >/dev/null || die "$tool is missing (scripts/install-deps.sh installs it)"
done

hash=$(cat "$0" "$INIT_SRC" | sha256sum | cut -d' ' -f1)
mkdir -p "$CACHE"
# One build at a time; a second caller waits and then finds the cache up to date.
exec 9>"$CACHE/vm.lock"
flock 9

up_to_date() {
  local f
  for f in vmlinux initrd.cpio kernel-version build-hash; do
    [ -s "$OUT/$f" ] || return 1
  done
  [ -e "$OUT/READY" ] && [ "$(cat "$OUT/build-hash")" = "$hash" ]
}
if up_to_date; then
  exit 0
fi

work=$(mktemp -d "$CACHE/vm-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
stage=$work/out
mkdir -p "$stage" "$work/deb"

# apt downloads as the unprivileged _apt user where it can write the target directory
# (and reach it: mktemp made the parent 0700).
if id _apt >/dev/null 2>&1; then
  chmod 0755 "$work"
  chown _apt "$work/deb"
fi
download() {
  (cd "$work/deb" && apt-get download -qq "$1") 2>"$work/apt.log"
}
if ! download "$META_PACKAGE"; then
  apt-get update -qq
  download "$META_PACKAGE" || { cat "$work/apt.log" >&2; die "cannot download $META_PACKAGE"; }
fi
# The meta package depends on exactly one versioned image: "linux-image-6.1.0-N-cloud-amd64 (= V)".
depends=$(dpkg-deb -f "$work"/deb/"$META_PACKAGE"_*.deb Depends)
image=$(printf '%s\n' "$depends" | tr ',' '\n' | sed -n 's/^ *\(linux-image-[^ ]*-cloud-amd64\) (= \([^)]*\)).*/\1=\2/p')
image=${image%%$'\n'*}
[ -n "$image" ] || die "cannot find the kernel image in '$depends'"
echo "install-vm.sh: downloading ${image%%=*} ${image#*=}"
download "$image" || { cat "$work/apt.log" >&2; die "cannot download $image"; }
deb=$(ls "$work"/deb/"${image%%=*}"_*.deb)
dpkg-deb -x "$deb" "$work/pkg"

kver=$(ls "$work/pkg/lib/modules")
[ "$(printf '%s\n' "$kver" | wc -l)" -eq 1 ] || die "expected one module directory, found: $kver"
config=$work/pkg/boot/config-$kver
vmlinuz=$work/pkg/boot/vmlinuz-$kver
[ -f "$config" ] && [ -f "$vmlinuz" ] || die "the package has no kernel or config for $kver"
grep -q '^CONFIG_PVH=y' "$config" || die "the kernel has no PVH entry (CONFIG_PVH)"

# --- vmlinux: the bzImage carries the kernel as one LZ4 legacy frame (magic 02 21 4c 18) ---
grep -q '^CONFIG_KERNEL_LZ4=y' "$config" || die "the kernel is not LZ4-compressed; extend the extraction"
# (No `| head` in these pipelines: an early exit would be a SIGPIPE failure under pipefail.)
offset=$(LC_ALL=C grep -m1 -obUaP '\x02\x21\x4c\x18' "$vmlinuz" || true)
offset=${offset%%$'\n'*}
offset=${offset%%:*}
[ -n "$offset" ] || die "no LZ4 frame in $vmlinuz"
# lz4 exits non-zero on the bytes the bzImage has after the frame; the result is checked instead.
tail -c +$((offset + 1)) "$vmlinuz" | lz4 -dc >"$stage/vmlinux" 2>/dev/null || true
[ "$(head -c 4 "$stage/vmlinux" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] || die "the extracted kernel is not an ELF file"
# The section headers sit at the end of the file: they are whole only if nothing is cut off.
readelf -S "$stage/vmlinux" >/dev/null 2>"$work/readelf.log" && [ ! -s "$work/readelf.log" ] ||
  die "the extracted kernel is truncated: $(head -n1 "$work/readelf.log")"
# The PVH entry point is the Xen ELF note XEN_ELFNOTE_PHYS32_ENTRY (18).
notes=$(readelf -n "$stage/vmlinux")
grep -q 'Xen.*0x00000012' <<<"$notes" || die "the extracted kernel has no PVH entry note"

# --- initramfs ---
root=$work/initrd
mkdir -p "$root"/{bin,dev,proc,sys,newroot,lib/modules}

busybox=$(dpkg -L busybox-static 2>/dev/null | grep -m1 -E '/bin/busybox$' || true)
[ -n "$busybox" ] && [ -x "$busybox" ] || die "busybox-static is not installed"
headers=$(readelf -l "$busybox")
grep -q INTERP <<<"$headers" && die "$busybox is not static"
cp "$busybox" "$root/bin/busybox"
applets=$("$busybox" --list)
for applet in "${APPLETS[@]}"; do
  grep -qx "$applet" <<<"$applets" || die "busybox has no $applet applet"
  ln -s busybox "$root/bin/$applet"
done
# The kernel opens /dev/console for /init's stdio before anything is mounted.
mknod -m 0600 "$root/dev/console" c 5 1

modules=("${MODULES[@]}")
for entry in "${EXT4_MODULES[@]}"; do
  option=${entry%%:*}
  case "$(sed -n "s/^CONFIG_$option=//p" "$config")" in
    y) ;;
    m) modules+=("${entry#*:}") ;;
    *) die "the kernel has no CONFIG_$option" ;;
  esac
done

# Module signatures are checked at load (CONFIG_MODULE_SIG) and cost time under TCG. Without
# CONFIG_MODULE_SIG_FORCE an unsigned module loads (and taints the kernel): cut the signature,
# which is appended as <signature><12-byte module_signature><"~Module signature appended~\n">.
strip_signature() {
  local file=$1 size magic sig_len
  size=$(stat -c %s "$file")
  magic=$(tail -c 28 "$file")
  [ "$magic" = "~Module signature appended~" ] || return 0
  # module_signature ends with the signature's length, a big-endian u32.
  sig_len=$(od -An -tu1 -j $((size - 32)) -N 4 "$file" | awk '{ print ($1 * 16777216) + ($2 * 65536) + ($3 * 256) + $4 }')
  truncate -s $((size - 28 - 12 - sig_len)) "$file"
}
grep -q '^CONFIG_MODULE_SIG_FORCE=y' "$config" && die "the kernel enforces module signatures; keep them"

moddir=$work/pkg/lib/modules/$kver
loaded=" "
: >"$root/lib/modules/load-order"
for module in "${modules[@]}"; do
  # File names may spell the module with dashes (virtio-rng.ko), and may be compressed.
  src=$(find "$moddir" -regextype posix-extended -regex ".*/($module|${module//_/-})\.ko(\.xz|\.zst|\.gz)?" -print -quit)
  [ -n "$src" ] || die "module $module not found in $kver"
  dst=$root/lib/modules/$module.ko
  case "$src" in
    *.xz) xz -dc "$src" >"$dst" ;;
    *.zst) zstd -qdc "$src" >"$dst" ;;
    *.gz) gzip -dc "$src" >"$dst" ;;
    *) cp "$src" "$dst" ;;
  esac
  # Each dependency must come earlier in the list (names in modinfo use _ for -).
  for dep in $(strings "$dst" | sed -n 's/^depends=//p' | tr ',' ' '); do
    case "$loaded" in
      *" ${dep//-/_} "*) ;;
      *) die "module $module needs $dep, which is not loaded before it" ;;
    esac
  done
  strip_signature "$dst"
  loaded="$loaded$module "
  echo "$module" >>"$root/lib/modules/load-order"
done

install -m 0755 "$INIT_SRC" "$root/init"
# Uncompressed: unpacking is faster than decompressing under TCG, and the node can append
# its archive with /spaced by plain concatenation.
(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0) >"$stage/initrd.cpio"

echo "$kver" >"$stage/kernel-version"
echo "$hash" >"$stage/build-hash"
touch "$stage/READY"

# Swap the finished set in; running VMs keep the files they opened.
rm -rf "$OUT.old"
[ -e "$OUT" ] && mv "$OUT" "$OUT.old"
mv "$stage" "$OUT"
rm -rf "$OUT.old"
echo "install-vm.sh: guest kernel $kver and initramfs in $OUT ($(du -sh "$OUT" | cut -f1))"
