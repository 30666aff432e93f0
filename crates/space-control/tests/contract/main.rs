//! Contract tests of the control plane over a simulated node (hardening item 31): what the
//! API promises about errors, tenancy, idempotency and the session state machine, checked
//! against the real control plane without root. The same promises are checked end to end,
//! with real sandboxes and as root, by `crates/space-cli/tests`.

mod auto_resume;
mod builds;
mod database;
mod disk;
mod drain;
mod durable;
mod errors;
mod exec_files;
mod failures;
mod harness;
mod idempotency;
mod interrupted;
mod keys;
mod lifecycle;
mod nodes;
mod oauth;
mod observability;
mod placement;
mod pool;
mod ports;
mod quotas;
mod recovery;
mod retention;
mod runtimes;
mod session_meta;
mod session_tokens;
mod templates;
mod tenancy;
