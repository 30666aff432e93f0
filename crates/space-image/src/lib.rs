//! OCI images for templates: read an image layout, a `docker save` archive or a registry
//! pull, verify every digest, and apply the layers to a root filesystem without anything in
//! the image reaching outside it.

mod archive;
mod at;
mod digest;
mod error;
mod guard;
mod image;
mod layout;
mod registry;
mod unpack;

pub use archive::{open_docker_archive, open_oci_archive};
pub use at::{is_dir_in_root, make_dirs_in_root, read_in_root, remove_in_root, write_in_root};
pub use digest::{Digest, Hashing};
pub use error::{ImageError, Result};
pub use guard::TarGuard;
pub use image::{Blob, Image, Layer, Report};
pub use layout::open_layout;
pub use registry::{PullReport, RegistryRef, pull};
pub use unpack::{Budget, Limits, Unpacker};
