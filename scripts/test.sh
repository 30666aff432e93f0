#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests and root-only integration tests that
# create real sandboxes. Run as root on Debian 12.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The committed OpenAPI document must pass a real validator (the drift test among the unit
# tests checks that it is what the code generates). The validator lives in a venv of its own,
# made once.
OPENAPI_VENV=/var/cache/space/openapi-venv
if [ ! -x "$OPENAPI_VENV/bin/openapi-spec-validator" ]; then
  python3 -m venv "$OPENAPI_VENV"
  "$OPENAPI_VENV/bin/pip" install --quiet 'openapi-spec-validator==0.9.0'
fi
"$OPENAPI_VENV/bin/openapi-spec-validator" docs/openapi.json
# cargo-nextest runs the tests, each in a process of its own with a bound on its time (see
# .config/nextest.toml), built once into the cache. (No crate has doc tests to run.)
NEXTEST_VERSION=0.9.151
export PATH="/var/cache/space/nextest/bin:$PATH"
if ! cargo nextest --version 2>/dev/null | grep -q "nextest $NEXTEST_VERSION"; then
  cargo install --locked --quiet --root /var/cache/space/nextest --version "$NEXTEST_VERSION" cargo-nextest
fi
cargo build-spaced
export SPACED_BIN="$PWD/target/x86_64-unknown-linux-gnu/release/spaced"
# (tests/replicas.rs needs PostgreSQL and the BYOK tests need OpenBao: they run in later passes.)
cargo nextest run --workspace -E 'not ((package(space-cli) & binary(replicas)) | binary(byok) | binary(openbao))'
# The store's tests and the control plane's contract tests again, against PostgreSQL (a
# server of their own, in a temporary directory) instead of SQLite; and two control replicas
# sharing a PostgreSQL database and a node.
scripts/with-postgres.sh cargo nextest run \
  -E 'package(space-store) | (package(space-control) & binary(contract)) | (package(space-cli) & binary(replicas))'
# The contract tests again with the control plane reaching its node over the node API's
# wire form (mutual TLS on loopback) instead of in-process.
SPACE_CONTRACT_NODE=wire cargo nextest run -p space-control --test contract
# The root suites that hold for both topologies, again with the control plane and its node in
# processes of their own (`space control` driving `space node run` over mutual TLS).
SPACE_TEST_TOPOLOGY=split cargo nextest run -p space-cli --test exec --test files --test lifecycle --test suspend --test egress --test ports --test recovery --test pool
# Tenants' own keys (BYOK) against a real KMS: OpenBao, started in memory on a loopback port.
scripts/with-openbao.sh cargo nextest run -E '(package(space-cli) & binary(byok)) | (package(space-keys) & binary(openbao))'
# The blob store's and the volume manager's tests again, against S3-compatible storage
# (SeaweedFS, started on loopback ports of its own) instead of a local directory.
scripts/with-s3.sh cargo nextest run -p space-blob -p space-volume
# The suites that hold for both runtimes, again with every session a QEMU microvm (the vm
# runtime; tests/vm.rs above checks what only a VM has).
SPACE_TEST_RUNTIME=vm cargo nextest run -p space-cli --test exec --test files --test egress --test pool --test recovery --test ports --test-threads 2
# The SDKs against a live server of their own (Python; TypeScript when sdk/typescript exists).
scripts/test-sdks.sh
