#!/usr/bin/env bash
# Import of an OCI image from a local layout against `tar -x` of the same layer into the same
# btrfs pool. The image is the debian template's root (one gzip layer, made once and cached in
# /var/cache/space/bench-image). Each import gets a new name, so none is skipped as already
# present; tar's extractions end with a sync of the pool, as an import ends with one. Not part
# of the tests; numbers go to docs/benchmarks.md.
# Usage: scripts/bench-image.sh [N] (default 3), with `space` built (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-3}
SPACE=${SPACE:-target/release/space}
SPACED=${SPACED_BIN:-target/x86_64-unknown-linux-gnu/release/spaced}
ROOT_TAR=$(ls -t /var/cache/space/templates/debian-*.tar 2>/dev/null | head -1)
CACHE=/var/cache/space/bench-image
WORK=$(mktemp -d /var/tmp/space-bench-image.XXXXXX)
PIDS=()
# shellcheck source=scripts/bench-common.sh
. scripts/bench-common.sh
cleanup() {
    for d in "$WORK"/serve/pool/tar-*; do btrfs subvolume delete "$d" >/dev/null 2>&1 || true; done
    stop_servers "$WORK"/serve
    kill_cgroup space-bench-image
    remove_cgroups space-bench-image
}
trap cleanup EXIT
[ -n "$ROOT_TAR" ] || { echo "no debian tree in /var/cache/space/templates: build the debian template once (space template build debian)" >&2; exit 1; }

if [ ! -f "$CACHE/oci/index.json" ]; then
    rm -rf "$CACHE" && mkdir -p "$CACHE/oci/blobs/sha256"
    # Without debootstrap's device nodes, which images do not carry (an import refuses them).
    python3 - "$ROOT_TAR" "$CACHE/root.tar" <<'PY'
import sys, tarfile
with tarfile.open(sys.argv[1]) as src, tarfile.open(sys.argv[2], "w", format=tarfile.PAX_FORMAT) as dst:
    for member in src:
        if not (member.ischr() or member.isblk()):
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
PY
    gzip -c "$CACHE/root.tar" >"$CACHE/layer.gz"
    python3 - "$CACHE" "$CACHE/root.tar" <<'PY'
import hashlib, json, os, sys
cache, root_tar = sys.argv[1], sys.argv[2]
blobs = os.path.join(cache, "oci/blobs/sha256")
def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
def put(data):
    digest = hashlib.sha256(data).hexdigest()
    open(os.path.join(blobs, digest), "wb").write(data)
    return {"digest": "sha256:" + digest, "size": len(data)}
layer = sha(os.path.join(cache, "layer.gz"))
os.rename(os.path.join(cache, "layer.gz"), os.path.join(blobs, layer))
config = put(json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
                         "rootfs": {"type": "layers", "diff_ids": ["sha256:" + sha(root_tar)]}}).encode())
config["mediaType"] = "application/vnd.oci.image.config.v1+json"
size = os.path.getsize(os.path.join(blobs, layer))
manifest = put(json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": config,
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": "sha256:" + layer, "size": size}]}).encode())
manifest["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
manifest["annotations"] = {"org.opencontainers.image.ref.name": "bench"}
json.dump({"schemaVersion": 2, "manifests": [manifest]}, open(os.path.join(cache, "oci/index.json"), "w"))
open(os.path.join(cache, "oci/oci-layout"), "w").write('{"imageLayoutVersion":"1.0.0"}')
PY
    rm "$CACHE/root.tar"
fi
LAYER=$(find "$CACHE/oci/blobs/sha256" -size +10M | head -1)
echo "image: $(gzip -dc "$LAYER" | wc -c | awk '{print int($1/1048576)}') MiB uncompressed, $(du -m "$LAYER" | cut -f1) MiB gzip, $(tar -tzf "$LAYER" | wc -l) entries"

"$SPACE" serve --listen 127.0.0.1:7193 --data-dir "$WORK/serve" --cgroup-parent space-bench-image --spaced "$SPACED" \
    --pool-size-gib 12 2>"$WORK/serve.log" &
PIDS+=($!)
wait_for http://127.0.0.1:7193 "$WORK/serve/admin.key"
export SPACE_URL=http://127.0.0.1:7193 SPACE_API_KEY
SPACE_API_KEY=$(cat "$WORK/serve/admin.key")
POOL="$WORK/serve/pool"
ms() { date +%s%3N; }
for i in $(seq "$N"); do
    btrfs subvolume create "$POOL/tar-$i" >/dev/null
    sync -f "$POOL"
    t0=$(ms)
    tar --extract --gzip --numeric-owner --preserve-permissions --xattrs --file "$LAYER" --directory "$POOL/tar-$i"
    sync -f "$POOL"
    t1=$(ms)
    "$SPACE" template import "bench-$i" "oci:$CACHE/oci:bench" >/dev/null
    t2=$(ms)
    echo "run $i: tar -x ${tar_ms:=$((t1 - t0))} ms, import $((t2 - t1)) ms"
    unset tar_ms
done
