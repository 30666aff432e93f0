//! The node's storage: a btrfs pool (the data dir itself when it is btrfs, else a sparse
//! image loop-mounted at `<data_dir>/pool`), read-only templates with id-shifted ownership,
//! and writable sandbox roots made by O(1) snapshots.
//!
//! Layout under the pool root (see `docs/storage.md`):
//!
//! ```text
//! templates/<name>@<version>        read-only subvolume, owned by the id map
//! templates/<name>@<version>.json   its metadata (written last: no metadata, no template)
//! sandboxes/<sandbox id>/rootfs     writable snapshot of a template
//! snapshots/                        session snapshots
//! pods/                             warm-pool slots
//! trash/<sandbox id>[.<n>]/rootfs   retired sandbox roots, deleted in the background
//! build-cache/<key>                 read-only layers of Dockerfile builds
//! ```
//!
//! Everything here blocks on disk I/O and needs root; async callers use `spawn_blocking`.

pub mod btrfs;
mod builtin;
mod cmd;
mod debian;
mod disk;
mod error;
mod identity;
mod import;
mod layers;
pub mod mount;
mod oci;
mod pool;
mod progress;
pub mod quota;
mod reflink;
mod shift;
mod snapshots;
mod template;
mod transfer;
mod usage;
mod util;

pub use builtin::{BUILTINS, DEFAULT_TEMPLATE_CACHE_DIR};
pub use debian::cache_file as debian_cache_file;
pub use error::{Result, StorageError};
pub use identity::{SandboxIdentity, validate_hostname, write_etc_dir_files};
pub use import::Compression;
pub use layers::{Layers, StagedLayer};
pub use oci::{Account, resolve_user};
pub use pool::{Backing, Pool, PoolOptions, ROOT_IMAGE};
pub use progress::{Progress, ProgressFn, no_progress};
pub use reflink::reflink;
pub use space_api::IdMap;
pub use template::{TemplateInfo, TemplateStore, validate_template_name};
pub use usage::{apparent_size, exclusive_size};
