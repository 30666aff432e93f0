#!/usr/bin/env bash
# Runs a command with a PostgreSQL server of its own, for the tests that run against
# PostgreSQL (the store's tests and the control plane's contract tests; scripts/test.sh):
# makes a cluster in a temporary directory with Debian's PostgreSQL (`postgresql`), starts it
# on a free loopback port as the `postgres` user (PostgreSQL refuses to run as root), runs the
# command with SPACE_TEST_POSTGRES_URL naming it, then stops the server and removes its
# directory, also when the command fails or the script is interrupted. Exits with the
# command's status.
#
# The server takes only TLS connections, with a certificate for 127.0.0.1 from a CA made here,
# and the URL verifies it (sslmode=verify-full): every test on PostgreSQL goes over TLS.
# SPACE_TEST_POSTGRES_OTHER_CA names a second CA, which did not sign the server's certificate.
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

# A CA, the server's certificate signed by it, and another CA.
make_ca() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=$2" \
    -keyout "$DIR/$1.key" -out "$DIR/$1.pem" 2>/dev/null
}
make_ca ca "space test CA"
make_ca other-ca "another CA"
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=127.0.0.1" \
  -keyout "$DIR/data/server.key" -out "$DIR/server.csr" 2>/dev/null
openssl x509 -req -in "$DIR/server.csr" -CA "$DIR/ca.pem" -CAkey "$DIR/ca.key" -CAcreateserial -days 2 \
  -extfile <(printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n') -out "$DIR/data/server.crt" 2>/dev/null
chown postgres: "$DIR/data/server.key" "$DIR/data/server.crt"
chmod 600 "$DIR/data/server.key"
chmod 644 "$DIR/ca.pem" "$DIR/other-ca.pem"
cat >>"$DIR/data/postgresql.conf" <<'CONF'
ssl = on
ssl_cert_file = 'server.crt'
ssl_key_file = 'server.key'
CONF
# Loopback over TLS only (the unix socket stays for pg_ctl).
cat >"$DIR/data/pg_hba.conf" <<'HBA'
local all all trust
hostssl all all 127.0.0.1/32 trust
hostnossl all all 0.0.0.0/0 reject
HBA
if ! as_postgres "$PG_BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 \
  -o "-c listen_addresses=127.0.0.1 -p $PORT -k $DIR -c fsync=off -c max_connections=400" start >/dev/null; then
  cat "$DIR/server.log" >&2
  exit 1
fi
echo "== PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PORT ($DIR)"
export SPACE_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$PORT/postgres?sslmode=verify-full&sslrootcert=$DIR/ca.pem"
export SPACE_TEST_POSTGRES_OTHER_CA="$DIR/other-ca.pem"
set +e
"$@"
status=$?
set -e
exit "$status"
