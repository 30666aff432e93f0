//! Templates imported from OCI images (an image layout or a `docker save` archive): the
//! layers unpacked by `space-image`, the image config's `Env`, `WorkingDir` and `User` kept
//! as the defaults of every command ([`space_proto::EXEC_DEFAULTS_PATH`], read by spaced).

use std::collections::BTreeMap;
use std::path::Path;

use space_api::{TemplateDefaults, TemplateSource};
use space_image::{Image, Limits};
use space_proto::{EXEC_DEFAULTS_PATH, ExecDefaults};

use crate::error::{Result, StorageError};
use crate::progress::{Progress, ProgressFn};
use crate::template::{Origin, TemplateInfo, TemplateStore};

/// Largest /etc/passwd or /etc/group read to resolve the image's user.
const MAX_ACCOUNTS_FILE: u64 = 4 << 20;

impl TemplateStore {
    /// Imports `source` as a new version of template `name`.
    pub fn import(&self, name: &str, source: &TemplateSource, progress: ProgressFn) -> Result<TemplateInfo> {
        match source {
            TemplateSource::Path { path } if path.is_dir() => self.import_dir(name, path, progress),
            TemplateSource::Path { path } => self.import_tar(name, path, progress),
            TemplateSource::OciLayout { dir, tag } => {
                self.import_image(name, &space_image::open_layout(dir, tag.as_deref())?, source, progress)
            }
            TemplateSource::DockerArchive { file } => {
                self.import_image(name, &space_image::open_docker_archive(file)?, source, progress)
            }
            TemplateSource::OciArchive { file, tag } => {
                self.import_image(name, &space_image::open_oci_archive(file, tag.as_deref())?, source, progress)
            }
            TemplateSource::Registry { reference } => Err(StorageError::BadTemplateContent {
                path: reference.into(),
                reason: "a registry image is pulled by the node first (space_image::pull), then imported".into(),
            }),
        }
    }

    /// Unpacks `image` as a new version of `name`, unless the newest version already is
    /// this image (same digest), which is returned as it is.
    pub fn import_image(
        &self,
        name: &str,
        image: &Image,
        source: &TemplateSource,
        progress: ProgressFn,
    ) -> Result<TemplateInfo> {
        let digest = image.id.to_string();
        if let Some(newest) = self.resolve(name)?
            && newest.digest.as_deref() == Some(digest.as_str())
        {
            tracing::info!(template = %format!("{name}@{}", newest.version), %digest, "image already imported");
            return Ok(newest);
        }
        let defaults = image.defaults();
        let limits = Limits { max_id: self.id_map().count - 1, ..Limits::default() };
        let origin = Origin { source: source.to_string(), digest: Some(digest), defaults: Some(defaults.clone()) };
        self.build(name, origin, progress, |staging| {
            let report = |phase: String, done, total| progress(Progress::new(phase, done, total));
            image.unpack(staging, limits, &report)?;
            write_exec_defaults(staging, &defaults, limits.max_id, 0)
        })
    }
}

/// Writes what spaced applies to every command: the image's environment, working directory
/// and user (resolved to numbers with the image's own account files), owned by host id
/// `owner` (0 in a tree shifted afterwards, the pool's base in a shifted one).
pub(crate) fn write_exec_defaults(root: &Path, defaults: &TemplateDefaults, max_id: u32, owner: u32) -> Result<()> {
    let bad = |reason: String| StorageError::BadTemplateContent { path: root.to_path_buf(), reason };
    if defaults.working_dir.as_deref().is_some_and(|d| d.contains('\0')) {
        return Err(bad("the image's WorkingDir contains a NUL byte".into()));
    }
    let mut exec = ExecDefaults { env: BTreeMap::new(), cwd: defaults.working_dir.clone(), uid: None, gid: None };
    for entry in &defaults.env {
        let Some((key, value)) = entry.split_once('=') else { continue };
        if !key.is_empty() && !key.contains('\0') && !value.contains('\0') {
            exec.env.insert(key.to_owned(), value.to_owned());
        }
    }
    if let Some(user) = &defaults.user {
        let account = resolve_user(root, user).map_err(bad)?;
        if account.uid > max_id || account.gid > max_id {
            let reason = format!(
                "the image's user {user:?} is {}:{}, outside the sandbox's ids 0-{max_id}",
                account.uid, account.gid
            );
            return Err(bad(reason));
        }
        exec.uid = Some(account.uid);
        exec.gid = Some(account.gid);
        if let Some(home) = account.home {
            exec.env.entry("HOME".into()).or_insert(home);
        }
    }
    let json = serde_json::to_vec_pretty(&exec).map_err(|e| bad(e.to_string()))?;
    let rel = EXEC_DEFAULTS_PATH.trim_start_matches('/');
    space_image::write_in_root(root, Path::new(rel), &json, owner)
        .map_err(|e| StorageError::io("write", root.join(rel), e))
}

/// A user as ids in the sandbox.
#[derive(Debug, PartialEq, Eq)]
pub struct Account {
    pub uid: u32,
    pub gid: u32,
    pub home: Option<String>,
}

/// `user`, `uid`, `user:group`, `uid:gid` (any mix), as Docker reads an image's `User`.
pub fn resolve_user(root: &Path, spec: &str) -> std::result::Result<Account, String> {
    let (user, group) = match spec.split_once(':') {
        Some((user, group)) => (user, Some(group)),
        None => (spec, None),
    };
    let passwd = accounts(root, "etc/passwd")?;
    let entry = passwd.iter().find(|fields| {
        fields.first().map(String::as_str) == Some(user)
            || (user.parse::<u32>().is_ok() && fields.get(2).map(String::as_str) == Some(user))
    });
    let mut account = match (user.parse::<u32>(), entry) {
        (_, Some(fields)) => Account {
            uid: number(fields.get(2), spec)?,
            gid: number(fields.get(3), spec)?,
            home: fields.get(5).filter(|h| !h.is_empty()).cloned(),
        },
        (Ok(uid), None) => Account { uid, gid: uid, home: None },
        (Err(_), None) => return Err(format!("the image's user {user:?} is not in its /etc/passwd")),
    };
    if let Some(group) = group {
        account.gid = match group.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => {
                let groups = accounts(root, "etc/group")?;
                let fields = groups
                    .iter()
                    .find(|f| f.first().map(String::as_str) == Some(group))
                    .ok_or_else(|| format!("the image's group {group:?} is not in its /etc/group"))?;
                number(fields.get(2), spec)?
            }
        };
    }
    Ok(account)
}

fn number(field: Option<&String>, spec: &str) -> std::result::Result<u32, String> {
    field.and_then(|f| f.parse().ok()).ok_or_else(|| format!("the image's account file has a bad entry for {spec:?}"))
}

/// The lines of an account file of the image, split at ':'. Missing is empty.
fn accounts(root: &Path, rel: &str) -> std::result::Result<Vec<Vec<String>>, String> {
    let bytes = space_image::read_in_root(root, Path::new(rel), MAX_ACCOUNTS_FILE)
        .map_err(|e| format!("cannot read the image's /{rel}: {e}"))?
        .unwrap_or_default();
    Ok(String::from_utf8_lossy(&bytes).lines().map(|l| l.split(':').map(str::to_owned).collect()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_resolve_with_the_image_account_files() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("etc")).unwrap();
        std::fs::write(
            root.path().join("etc/passwd"),
            "root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(root.path().join("etc/group"), "root:x:0:\nstaff:x:50:\n").unwrap();
        let home = |h: &str| Some(h.to_owned());
        assert_eq!(
            resolve_user(root.path(), "app").unwrap(),
            Account { uid: 1000, gid: 1001, home: home("/home/app") }
        );
        assert_eq!(
            resolve_user(root.path(), "1000").unwrap(),
            Account { uid: 1000, gid: 1001, home: home("/home/app") }
        );
        assert_eq!(resolve_user(root.path(), "app:staff").unwrap().gid, 50);
        assert_eq!(resolve_user(root.path(), "4242:7").unwrap(), Account { uid: 4242, gid: 7, home: None });
        assert!(resolve_user(root.path(), "nobody").unwrap_err().contains("not in its /etc/passwd"));
        assert!(resolve_user(root.path(), "app:wheel").unwrap_err().contains("not in its /etc/group"));
    }
}
