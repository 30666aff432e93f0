//! Images assembled here byte by byte (tar entries, gzip, JSON), then read and unpacked by
//! the crate: whiteouts, opaque directories, links, xattrs, and the hostile cases refused.
//! Needs root (entries are chowned).

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde_json::json;
use sha2::{Digest as _, Sha256};
use space_image::{ImageError, Limits, open_docker_archive, open_layout};

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A layer under construction.
struct Layer(tar::Builder<Vec<u8>>);

impl Layer {
    fn new() -> Self {
        Layer(tar::Builder::new(Vec::new()))
    }

    fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(1_700_000_000);
        header.set_size(size);
        header
    }

    fn dir(mut self, path: &str) -> Self {
        let mut h = Self::header(tar::EntryType::Directory, 0o755, 0);
        self.0.append_data(&mut h, path, &[][..]).unwrap();
        self
    }

    fn file(self, path: &str, body: &str) -> Self {
        self.owned_file(path, body, 0o644, 0)
    }

    fn owned_file(mut self, path: &str, body: &str, mode: u32, id: u64) -> Self {
        let mut h = Self::header(tar::EntryType::Regular, mode, body.len() as u64);
        h.set_uid(id);
        h.set_gid(id);
        self.0.append_data(&mut h, path, body.as_bytes()).unwrap();
        self
    }

    /// Writes the header by hand so that paths the tar crate would refuse still get in.
    fn raw(mut self, kind: tar::EntryType, path: &str, link: &str) -> Self {
        let mut h = Self::header(kind, 0o644, 0);
        let name = &mut h.as_old_mut().name;
        name[..path.len()].copy_from_slice(path.as_bytes());
        if !link.is_empty() {
            h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        h.set_cksum();
        self.0.append(&h, &[][..]).unwrap();
        self
    }

    /// A regular file whose (long) path goes in a GNU long-name entry.
    fn raw_long(mut self, path: &str) -> Self {
        let mut h = Self::header(tar::EntryType::Regular, 0o644, 0);
        self.0.append_data(&mut h, path, &[][..]).unwrap();
        self
    }

    fn xattr_file(self, path: &str, key: &str, value: &str) -> Self {
        self.xattr_bytes(path, key, value.as_bytes())
    }

    fn xattr_bytes(mut self, path: &str, key: &str, value: &[u8]) -> Self {
        let key = format!("SCHILY.xattr.{key}");
        self.0.append_pax_extensions([(key.as_str(), value)]).unwrap();
        self.owned_file(path, "with xattr", 0o755, 0)
    }

    /// The uncompressed tar.
    fn tar(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// Writes an OCI layout with one image tagged `tag` made of `layers` (gzipped).
fn layout(dir: &Path, tag: &str, layers: Vec<Vec<u8>>) -> PathBuf {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| {
        let hex = sha(bytes);
        std::fs::write(blobs.join(&hex), bytes).unwrap();
        json!({"digest": format!("sha256:{hex}"), "size": bytes.len()})
    };
    let diff_ids: Vec<String> = layers.iter().map(|l| format!("sha256:{}", sha(l))).collect();
    let mut layer_descriptors = Vec::new();
    for layer in &layers {
        let mut d = put(&gzip(layer));
        d["mediaType"] = json!("application/vnd.oci.image.layer.v1.tar+gzip");
        layer_descriptors.push(d);
    }
    let config = json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/usr/bin:/bin", "GREETING=hello"], "WorkingDir": "/srv", "User": "1000:1000", "Cmd": ["sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    let mut config_d = put(config.to_string().as_bytes());
    config_d["mediaType"] = json!("application/vnd.oci.image.config.v1+json");
    let manifest = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_d, "layers": layer_descriptors});
    let mut manifest_d = put(manifest.to_string().as_bytes());
    manifest_d["mediaType"] = json!("application/vnd.oci.image.manifest.v1+json");
    manifest_d["annotations"] = json!({"org.opencontainers.image.ref.name": tag});
    let index = json!({"schemaVersion": 2, "manifests": [manifest_d]});
    std::fs::write(dir.join("index.json"), index.to_string()).unwrap();
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    dir.to_path_buf()
}

fn base() -> Vec<u8> {
    Layer::new()
        .dir("etc")
        .file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n")
        .dir("a")
        .file("a/gone", "lower")
        .file("a/kept", "lower")
        .dir("d")
        .file("d/old", "lower")
        .dir("d/sub")
        .file("d/sub/deep", "lower")
        .owned_file("bin-suid", "#!", 0o4755, 1000)
        .raw(tar::EntryType::Symlink, "abs", "/etc")
        .raw(tar::EntryType::Link, "hard", "a/kept")
        .raw(tar::EntryType::Fifo, "pipe", "")
        .tar()
}

fn upper() -> Vec<u8> {
    Layer::new()
        .file("a/.wh.gone", "")
        .dir("d")
        .file("d/.wh..wh..opq", "")
        .file("d/new", "upper")
        .file("abs/through-symlink", "inside")
        .xattr_file("x", "user.space", "yes")
        .tar()
}

fn unpack(layout_dir: &Path, root: &Path, limits: Limits) -> Result<(), ImageError> {
    let image = open_layout(layout_dir, Some("v1"))?;
    image.unpack(root, limits, &|_, _, _| {}).map(drop)
}

#[test]
fn layers_apply_in_order_with_whiteouts_links_and_xattrs() {
    let dir = tempfile::tempdir().unwrap();
    let oci = layout(&dir.path().join("oci"), "v1", vec![base(), upper()]);
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let image = open_layout(&oci, Some("v1")).unwrap();
    let defaults = image.defaults();
    assert_eq!(defaults.env, ["PATH=/usr/bin:/bin", "GREETING=hello"]);
    assert_eq!((defaults.working_dir.as_deref(), defaults.user.as_deref()), (Some("/srv"), Some("1000:1000")));
    assert_eq!(defaults.cmd, ["sh"]);
    image.unpack(&root, Limits::default(), &|_, _, _| {}).unwrap();

    assert!(!root.join("a/gone").exists(), "the whiteout removed the lower file");
    assert_eq!(std::fs::read_to_string(root.join("a/kept")).unwrap(), "lower");
    let mut d: Vec<_> = std::fs::read_dir(root.join("d")).unwrap().map(|e| e.unwrap().file_name()).collect();
    d.sort();
    assert_eq!(d, ["new"], "the opaque directory keeps only the upper layer's entries");
    let suid = std::fs::metadata(root.join("bin-suid")).unwrap();
    assert_eq!((suid.mode() & 0o7777, suid.uid(), suid.gid()), (0o4755, 1000, 1000));
    assert_eq!(std::fs::read_link(root.join("abs")).unwrap(), Path::new("/etc"));
    assert_eq!(
        std::fs::read_to_string(root.join("etc/through-symlink")).unwrap(),
        "inside",
        "an absolute symlink resolves inside the root"
    );
    assert!(!Path::new("/etc/through-symlink").exists());
    assert_eq!(
        std::fs::metadata(root.join("hard")).unwrap().ino(),
        std::fs::metadata(root.join("a/kept")).unwrap().ino()
    );
    assert!(std::fs::symlink_metadata(root.join("pipe")).unwrap().file_type().is_fifo());
    let value = xattr_get(&root.join("x"), "user.space");
    assert_eq!(value.as_deref(), Some(&b"yes"[..]));
    assert_eq!(std::fs::metadata(root.join("a/kept")).unwrap().mtime(), 1_700_000_000);
}

fn xattr_get(path: &Path, key: &str) -> Option<Vec<u8>> {
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let key = std::ffi::CString::new(key).unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: valid NUL-terminated strings and a buffer of the given length.
    let n = unsafe { libc::lgetxattr(path.as_ptr(), key.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (n >= 0).then(|| buf[..n as usize].to_vec())
}

fn refused(layers: Vec<Vec<u8>>, limits: Limits) -> ImageError {
    let dir = tempfile::tempdir().unwrap();
    let oci = layout(&dir.path().join("oci"), "v1", layers);
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    unpack(&oci, &root, limits).unwrap_err()
}

#[test]
fn hostile_layers_are_refused() {
    let escape = Layer::new().raw(tar::EntryType::Regular, "../escaped", "").tar();
    let error = refused(vec![escape], Limits::default());
    assert!(error.to_string().contains("would escape the root"), "{error}");

    let link_out = Layer::new().raw(tar::EntryType::Link, "h", "../../etc/shadow").tar();
    let error = refused(vec![link_out], Limits::default());
    assert!(error.to_string().contains("escape the root"), "{error}");

    let device = Layer::new().raw(tar::EntryType::Char, "dev-sda", "").tar();
    let error = refused(vec![device], Limits::default());
    assert!(matches!(&error, ImageError::Refused { reason, .. } if reason == "is a device node"), "{error}");

    let foreign = Layer::new().owned_file("f", "x", 0o644, 70_000).tar();
    let error = refused(vec![foreign], Limits::default());
    assert!(error.to_string().contains("outside the sandbox's ids"), "{error}");

    let many = (0..50).fold(Layer::new(), |l, i| l.file(&format!("f{i}"), "x")).tar();
    let error = refused(vec![many.clone()], Limits { max_entries: 10, ..Limits::default() });
    assert!(matches!(error, ImageError::TooLarge { what: "entries", limit: 10 }), "{error}");
    let error = refused(vec![many], Limits { max_bytes: 20, ..Limits::default() });
    assert!(matches!(error, ImageError::TooLarge { what: "bytes", limit: 20 }), "{error}");
}

#[test]
fn altered_or_truncated_blobs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let oci = layout(&dir.path().join("oci"), "v1", vec![base()]);
    let manifest = open_layout(&oci, Some("v1")).unwrap();
    let blob = manifest.layers[0].blob.file.clone();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();

    // Same length, one byte changed inside the gzip stream's data.
    let mut bytes = std::fs::read(&blob).unwrap();
    let original = bytes.clone();
    let at = bytes.len() - 12;
    bytes[at] ^= 0xff;
    std::fs::write(&blob, &bytes).unwrap();
    let error = unpack(&oci, &root, Limits::default()).unwrap_err();
    assert!(matches!(error, ImageError::DigestMismatch { .. } | ImageError::Malformed { .. }), "{error}");

    // Truncated: the size no longer matches the descriptor.
    std::fs::write(&blob, &original[..original.len() / 2]).unwrap();
    let error = open_layout(&oci, Some("v1")).unwrap_err();
    assert!(error.to_string().contains("its descriptor says"), "{error}");

    std::fs::write(&blob, &original).unwrap();
    let error = open_layout(&oci, Some("v2")).unwrap_err();
    assert!(matches!(&error, ImageError::NoSuchTag { available, .. } if available == "v1"), "{error}");
    std::fs::write(oci.join("index.json"), "{").unwrap();
    assert!(matches!(open_layout(&oci, None).unwrap_err(), ImageError::Malformed { .. }));
}

/// A `docker save` archive: manifest.json, `<hex>.json` config, `<id>/layer.tar` layers.
#[test]
fn docker_archives_are_read_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let layers = [base(), upper()];
    let config = json!({"architecture": "amd64", "os": "linux", "config": {"Env": ["A=1"]},
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| format!("sha256:{}", sha(l))).collect::<Vec<_>>()}})
    .to_string();
    let config_name = format!("{}.json", sha(config.as_bytes()));
    let mut archive = tar::Builder::new(Vec::new());
    let mut add = |name: &str, bytes: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        archive.append_data(&mut h, name, bytes).unwrap();
    };
    add("l1/layer.tar", &layers[0]);
    add("l2/layer.tar", &layers[1]);
    add(&config_name, config.as_bytes());
    let manifest = json!([{"Config": config_name, "RepoTags": ["t:1"], "Layers": ["l1/layer.tar", "l2/layer.tar"]}]);
    add("manifest.json", manifest.to_string().as_bytes());
    let file = dir.path().join("image.tar");
    std::fs::write(&file, archive.into_inner().unwrap()).unwrap();

    let image = open_docker_archive(&file).unwrap();
    assert_eq!(image.defaults().env, ["A=1"]);
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    image.unpack(&root, Limits::default(), &|_, _, _| {}).unwrap();
    assert_eq!(std::fs::read_to_string(root.join("d/new")).unwrap(), "upper");
    assert!(!root.join("a/gone").exists());

    // A layer swapped for another no longer matches the config's diff ids.
    let mut swapped = image.clone();
    let first = swapped.layers[0].blob.clone();
    swapped.layers[0].blob = swapped.layers[1].blob.clone();
    swapped.layers[1].blob = first;
    let root2 = dir.path().join("root2");
    std::fs::create_dir(&root2).unwrap();
    let error = swapped.unpack(&root2, Limits::default(), &|_, _, _| {}).unwrap_err();
    assert!(matches!(error, ImageError::DigestMismatch { .. }), "{error}");
}

/// A file capability (cap_net_raw, effective), as `setcap cap_net_raw+ep` writes it (v2).
fn net_raw_capability() -> Vec<u8> {
    let words: [u32; 5] = [0x0200_0001, 1 << 13, 0, 0, 0];
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

#[test]
fn whiteouts_opaque_dirs_and_capabilities_follow_the_spec() {
    let dir = tempfile::tempdir().unwrap();
    let lower = Layer::new().dir("d").dir("d/sub").file("d/sub/old", "lower").file("keep", "lower").tar();
    let upper = Layer::new()
        .dir("d")
        .dir("d/sub")
        .file("d/sub/new", "upper")
        .file("d/.wh..wh..opq", "")
        .file("q", "this layer")
        .file(".wh.q", "")
        .raw(tar::EntryType::Link, "keep", "keep")
        .xattr_bytes("ping", "security.capability", &net_raw_capability())
        .tar();
    let oci = layout(&dir.path().join("oci"), "v1", vec![lower, upper]);
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    unpack(&oci, &root, Limits::default()).unwrap();
    assert!(!root.join("d/sub/old").exists(), "an opaque directory hides lower files at every depth");
    assert_eq!(std::fs::read_to_string(root.join("d/sub/new")).unwrap(), "upper");
    assert_eq!(std::fs::read_to_string(root.join("q")).unwrap(), "this layer", "a whiteout hides only lower layers");
    assert_eq!(std::fs::read_to_string(root.join("keep")).unwrap(), "lower", "a hard link to itself is a no-op");
    let caps = xattr_get(&root.join("ping"), "security.capability");
    assert_eq!(caps.as_deref(), Some(&net_raw_capability()[..]), "the capability survives the chown");
}

#[test]
fn whiteouts_and_paths_cannot_reach_outside_the_root() {
    for name in [".wh...", ".wh..", "sub/.wh..."] {
        let dir = tempfile::tempdir().unwrap();
        let sibling = dir.path().join("sibling");
        std::fs::write(&sibling, "outside").unwrap();
        let oci = layout(&dir.path().join("oci"), "v1", vec![Layer::new().dir("sub").file(name, "").tar()]);
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("inside"), "kept").unwrap();
        let error = unpack(&oci, &root, Limits::default()).unwrap_err();
        assert!(error.to_string().contains("whiteout of no file"), "{name}: {error}");
        assert!(sibling.exists() && root.join("inside").exists(), "{name}: nothing was removed");
    }
    let deep = vec!["a"; 300].join("/");
    let error = refused(vec![Layer::new().raw_long(&deep).tar()], Limits::default());
    assert!(error.to_string().contains("deeper than any image needs"), "{error}");
}
