//! Root disk images of templates, for runtimes that boot from an image (`vm`): made once per
//! template version (`mkfs.ext4 -d` of the template, owners shifted to the guest's ids) in
//! `<pool>/vm-images`, then reflinked into each sandbox's root (O(1), blocks shared until
//! the guest writes them).

use std::path::PathBuf;

use space_storage::TemplateInfo;

use crate::{Node, NodeError, Result, blocking};

/// The pool directory holding template images.
const IMAGE_DIR: &str = "vm-images";
/// Size of every root filesystem a guest sees (a sparse file: only what is written takes
/// space, and the session's disk limit caps that).
pub const ROOT_IMAGE_BYTES: u64 = 8 << 30;

impl Node {
    /// The root disk image of `template`, made now if it has none yet.
    pub(crate) async fn template_image(&self, template: &TemplateInfo) -> Result<PathBuf> {
        let name = format!("{}@{}", template.name, template.version);
        let image = self.pool.root().join(IMAGE_DIR).join(format!("{name}.img"));
        if image.exists() {
            return Ok(image);
        }
        let lock = self.template_builds.lock().await.entry(format!("{name}.img")).or_default().clone();
        let _held = lock.lock().await;
        if image.exists() {
            return Ok(image);
        }
        let source = self.pool.templates().path(template)?;
        let id_map = self.pool.id_map();
        let target = image.clone();
        let started = std::time::Instant::now();
        blocking(move || {
            let dir = target.parent().expect("an image path has a parent");
            std::fs::create_dir_all(dir).map_err(|e| NodeError::Internal(format!("create {}: {e}", dir.display())))?;
            // Made aside and renamed: an image is complete or absent, even after a crash.
            let partial = target.with_extension("img.partial");
            let _ = std::fs::remove_file(&partial);
            space_runtime_vm::make_root_image(&source, &partial, ROOT_IMAGE_BYTES, id_map)?;
            std::fs::rename(&partial, &target)
                .map_err(|e| NodeError::Internal(format!("rename {}: {e}", partial.display())))
        })
        .await?;
        tracing::info!(template = %name, took = ?started.elapsed(), "made the template's root disk image");
        Ok(image)
    }
}
