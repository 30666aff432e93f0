#!/usr/bin/env bash
# Runs a command with a PostgreSQL server of its own, for the tests that run against
# PostgreSQL (the store's tests and the control plane's contract tests; scripts/test.sh):
# makes a cluster in a temporary directory with Debian's PostgreSQL (`postgresql`), starts it
# on a free loopback port as the `postgres` user (PostgreSQL refuses to run as root), runs the
# command with SPACE_TEST_POSTGRES_URL naming it, then stops the server and removes its
# directory, also when the command fails or the script is interrupted. Exits with the
# command's status.
#
# The cluster is disposable: it trusts loopback connections and does not fsync (each test
# creates a database of its own, which with fsync costs a flush of every file copied).
#
#   scripts/with-postgres.sh cargo nextest run -p space-store
set -euo pipefail

if [ "$(id -u)" != 0 ]; then
  echo "with-postgres.sh runs the server as the postgres user and needs root" >&2
  exit 1
fi
if [ $# -eq 0 ]; then
  echo "usage: scripts/with-postgres.sh COMMAND [ARG]..." >&2
  exit 2
fi
PG_BIN=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -1)
if [ -z "$PG_BIN" ] || ! id postgres >/dev/null 2>&1; then
  echo "PostgreSQL is not installed (Debian's postgresql package; scripts/install-deps.sh installs it)" >&2
  exit 1
fi

DIR=$(mktemp -d /var/tmp/space-postgres-XXXXXX)
chown postgres: "$DIR"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
as_postgres() { runuser -u postgres -- "$@"; }

cleanup() {
  local status=$?
  set +e
  if [ -f "$DIR/data/postmaster.pid" ]; then
    as_postgres "$PG_BIN/pg_ctl" -D "$DIR/data" -m immediate -w stop >/dev/null 2>&1
  fi
  rm -rf "$DIR"
  exit "$status"
}
trap cleanup EXIT INT TERM

as_postgres "$PG_BIN/initdb" -D "$DIR/data" -U postgres -A trust -E UTF8 --no-locale >"$DIR/initdb.log" 2>&1 \
  || { cat "$DIR/initdb.log" >&2; exit 1; }
if ! as_postgres "$PG_BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 \
  -o "-c listen_addresses=127.0.0.1 -p $PORT -k $DIR -c fsync=off -c max_connections=400" start >/dev/null; then
  cat "$DIR/server.log" >&2
  exit 1
fi
echo "== PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PORT ($DIR)"
export SPACE_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$PORT/postgres?sslmode=disable"
set +e
"$@"
status=$?
set -e
exit "$status"
