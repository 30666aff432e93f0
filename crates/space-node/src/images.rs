//! Root disk images of templates, for runtimes that boot from an image (`vm`): made once per
//! template version, then reflinked into each sandbox's root.

use std::path::PathBuf;

use space_storage::TemplateInfo;

use crate::{Node, NodeError, Result};

impl Node {
    /// The root disk image of `template`, made now if it has none yet.
    pub(crate) async fn template_image(&self, template: &TemplateInfo) -> Result<PathBuf> {
        Err(NodeError::Internal(format!("no disk image of {}@{} can be made yet", template.name, template.version)))
    }
}
