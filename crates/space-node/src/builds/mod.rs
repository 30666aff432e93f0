//! Dockerfile builds (`space template build NAME -f Dockerfile`): the common subset of
//! Dockerfile instructions, each step that changes files committed as a btrfs layer keyed by
//! what it depends on, so an unchanged prefix of steps is reused (Docker's layer cache).
//! `RUN` steps run in a sandbox of the previous layer, with egress only to the build's allow
//! list; `COPY`/`ADD` read the uploaded context; `ENV`, `WORKDIR`, `USER`, `CMD` and
//! `ENTRYPOINT` end up as the template's defaults.

mod context;
mod run;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use space_api::{Progress, TemplateBuild, TemplateDefaults, TemplateSource};
use space_dockerfile::{Command, Instruction, Kind};
use space_storage::TemplateInfo;

use crate::{Node, NodeError, Result, blocking};
use context::CopySpec;

/// Most bytes of log a build sends on.
const MAX_LOG_BYTES: usize = 32 << 20;

/// Most bytes of `ENV` and `ARG` names and values in all (a command's environment holds
/// little more than this anyway).
const MAX_VARIABLES: usize = 1 << 20;

/// Why a build failed, naming the Dockerfile line.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("Dockerfile {0}")]
    Parse(#[from] space_dockerfile::ParseError),
    #[error("Dockerfile line {line}: {message}")]
    Step { line: usize, message: String },
    #[error("Dockerfile line {line}: `{instruction}` failed with {status}; its last output:\n{output}")]
    Failed { line: usize, instruction: String, status: String, output: String },
    #[error("Dockerfile line {line}: reading the build context")]
    Context {
        line: usize,
        #[source]
        source: std::io::Error,
    },
}

/// Where the build is: the layer the next step starts from, and what commands run with.
struct State {
    key: String,
    layer: PathBuf,
    env: BTreeMap<String, String>,
    /// Declared `ARG`s and their values (from `--build-arg`, else the default).
    args: BTreeMap<String, String>,
    workdir: String,
    user: Option<String>,
    cmd: Vec<String>,
    entrypoint: Vec<String>,
}

impl State {
    fn defaults(&self) -> TemplateDefaults {
        TemplateDefaults {
            env: self.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            working_dir: (self.workdir != "/").then(|| self.workdir.clone()),
            user: self.user.clone(),
            entrypoint: self.entrypoint.clone(),
            cmd: self.cmd.clone(),
        }
    }

    /// Refuses variables larger in all than a command's environment can be.
    fn check_size(&self, line: usize) -> std::result::Result<(), BuildError> {
        let size: usize = self.env.iter().chain(&self.args).map(|(k, v)| k.len() + v.len() + 2).sum();
        if size > MAX_VARIABLES {
            let message = format!("ENV and ARG values exceed {} KiB in all", MAX_VARIABLES >> 10);
            return Err(BuildError::Step { line, message });
        }
        Ok(())
    }

    /// Docker's substitution: `ENV` over `ARG`.
    fn substitute(&self, line: usize, word: &str) -> std::result::Result<String, BuildError> {
        let lookup = |name: &str| self.env.get(name).or_else(|| self.args.get(name)).cloned();
        space_dockerfile::substitute(word, &lookup)
            .map_err(|e| BuildError::Step { line, message: format!("{word:?}: {e}") })
    }
}

/// The cache key of a step: its parent's key and what it depends on, each part
/// length-prefixed so that no two different lists of parts hash alike.
fn key(parent: &str, parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in std::iter::once(&parent).chain(parts) {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// `text` with control characters (NUL, terminal escapes) replaced: a log line goes into
/// the database (which may refuse NUL) and onto the terminal of whoever follows the build.
fn printable(text: &str) -> String {
    text.chars().map(|c| if c.is_control() && c != '\t' { '\u{fffd}' } else { c }).collect()
}

/// A build's log on its way out: printable, and at most [`MAX_LOG_BYTES`] of it (a step can
/// print without end; the rest is counted and said at the end).
struct CappedLog<L> {
    log: L,
    bytes: std::sync::atomic::AtomicUsize,
    dropped: std::sync::atomic::AtomicUsize,
}

impl<L: Fn(String)> CappedLog<L> {
    fn new(log: L) -> Self {
        CappedLog { log, bytes: 0.into(), dropped: 0.into() }
    }

    fn line(&self, text: String) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.bytes.fetch_add(text.len() + 1, Relaxed) > MAX_LOG_BYTES {
            self.dropped.fetch_add(1, Relaxed);
            return;
        }
        (self.log)(printable(&text));
    }

    fn finish(&self) {
        let dropped = self.dropped.load(std::sync::atomic::Ordering::Relaxed);
        if dropped > 0 {
            (self.log)(format!("({dropped} more lines not logged: a build logs at most {} MiB)", MAX_LOG_BYTES >> 20));
        }
    }
}

/// `ARG`s before `FROM` (they serve `FROM` only), and the rest.
fn split_at_from(instructions: &[Instruction]) -> (&[Instruction], &[Instruction]) {
    let at = instructions.iter().position(|i| matches!(i.kind, Kind::From { .. })).unwrap_or(instructions.len());
    instructions.split_at(at)
}

fn argv(command: &Command) -> Vec<String> {
    match command {
        Command::Shell(line) => vec!["/bin/sh".into(), "-c".into(), line.clone()],
        Command::Exec(argv) => argv.clone(),
    }
}

/// The registry reference a `FROM` names (`docker://…`), or none for a space template (`NAME`,
/// whose names hold none of `:/`). Images on the node's host (`oci:`, `docker-archive:`) are
/// refused: what is on the host is the admin's to import (`space template import`), not a
/// Dockerfile's to read.
fn from_image(image: &str) -> std::result::Result<Option<String>, String> {
    match TemplateSource::parse(image) {
        TemplateSource::Registry { reference } => Ok(Some(reference)),
        _ if !image.contains([':', '/']) => Ok(None),
        _ => Err(format!(
            "FROM takes a template name or a registry image (docker://HOST/REPO:TAG), not {image:?}: \
             import an image on the server's host first (space template import NAME IMAGE), then FROM NAME"
        )),
    }
}

impl Node {
    /// Builds `build` as a new version of template `name`; `log` gets every step's header and
    /// output, line by line.
    pub async fn build_template(
        &self,
        name: &str,
        build: &TemplateBuild,
        report: impl Fn(Progress) + Send + Sync + 'static,
        log: impl Fn(String) + Send + Sync + 'static,
    ) -> Result<TemplateInfo> {
        space_storage::validate_template_name(name)?;
        let _building = self.builds.read().await;
        let capped = CappedLog::new(log);
        let log = |line: String| capped.line(line);
        let built = self.build_steps(name, build, report, &log).await;
        capped.finish();
        built
    }

    async fn build_steps(
        &self,
        name: &str,
        build: &TemplateBuild,
        report: impl Fn(Progress) + Send + Sync + 'static,
        log: &(impl Fn(String) + Sync),
    ) -> Result<TemplateInfo> {
        let file = space_dockerfile::parse(&build.dockerfile).map_err(BuildError::from)?;
        let (globals, steps) = split_at_from(&file.instructions);
        let mut global_args = BTreeMap::new();
        for instruction in globals {
            if let Kind::Arg { name, default } = &instruction.kind {
                global_args.insert(name.clone(), build.args.get(name).cloned().or(default.clone()).unwrap_or_default());
            }
        }
        let total = steps.len();
        let mut state: Option<State> = None;
        for (i, instruction) in steps.iter().enumerate() {
            log(format!("Step {}/{total} : {}", i + 1, instruction.text));
            let phase = format!("step {}/{total}: line {}", i + 1, instruction.line);
            report(Progress { phase, done: i as u64, total: Some(total as u64) });
            state = Some(match state {
                None => self.from(instruction, &global_args, build, log).await?,
                Some(state) => self.step(state, instruction, build, log).await?,
            });
        }
        let state = state.ok_or_else(|| BuildError::Step { line: 1, message: "the Dockerfile has no FROM".into() })?;
        for unused in build.args.keys().filter(|a| !state.args.contains_key(*a) && !global_args.contains_key(*a)) {
            log(format!("warning: --build-arg {unused} is not an ARG of the Dockerfile"));
        }
        let pool = self.pool.clone();
        let (name, layer, defaults) = (name.to_owned(), state.layer.clone(), state.defaults());
        let source = format!("dockerfile ({} steps)", total);
        blocking(move || Ok(pool.templates().publish_layer(&name, &layer, source, defaults, &|_| {})?)).await
    }

    /// `FROM`: the base's layer and defaults.
    async fn from(
        &self,
        instruction: &Instruction,
        args: &BTreeMap<String, String>,
        build: &TemplateBuild,
        log: &(impl Fn(String) + Sync),
    ) -> Result<State> {
        let Kind::From { image } = &instruction.kind else {
            return Err(
                BuildError::Step { line: instruction.line, message: "a Dockerfile starts with FROM".into() }.into()
            );
        };
        let lookup = |name: &str| args.get(name).cloned();
        let image = space_dockerfile::substitute(image, &lookup)
            .map_err(|e| BuildError::Step { line: instruction.line, message: format!("{image:?}: {e}") })?;
        let base = from_image(&image).map_err(|message| BuildError::Step { line: instruction.line, message })?;
        let (key, layer, defaults) = match base {
            Some(_) if !build.registry => {
                let message =
                    "FROM docker://… pulls through the node's network, which only the operator's builds may: \
                               upload the image (space template import --upload) and FROM its name"
                        .to_owned();
                return Err(BuildError::Step { line: instruction.line, message }.into());
            }
            Some(reference) => self.image_layer(&reference, build.no_cache, log).await?,
            None => {
                // `..` is how scoped names are written: a tenant's FROM names its own template
                // or a global one, never another tenant's by its scoped name.
                if build.own_prefix.is_some() && image.contains("..") {
                    let message = format!("FROM {image:?}: template names hold no `..`");
                    return Err(BuildError::Step { line: instruction.line, message }.into());
                }
                let own = build.own_prefix.as_ref().map(|prefix| format!("{prefix}{image}"));
                let name = match own.as_deref().and_then(|own| self.resolve_template(own)) {
                    Some(own) => own.name,
                    None => image.clone(),
                };
                let base = self.ensure_template(&name, |_| {}).await?;
                // The builder's scope is part of the key: no tenant's build reuses (and so
                // learns of) a layer another tenant's build made.
                let owner = build.own_prefix.as_deref().unwrap_or_default();
                let (version, created) = (base.version.to_string(), base.created_at_ms.to_string());
                let key = key("", &["template", &base.name, &version, &created, owner]);
                (key, self.pool.templates().path(&base)?, base.defaults.unwrap_or_default())
            }
        };
        let env = defaults.env.iter().filter_map(|e| e.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect();
        Ok(State {
            key,
            layer,
            env,
            args: BTreeMap::new(),
            workdir: defaults.working_dir.unwrap_or_else(|| "/".into()),
            user: defaults.user,
            cmd: defaults.cmd,
            entrypoint: defaults.entrypoint,
        })
    }

    /// One instruction after `FROM`.
    async fn step(
        &self,
        mut state: State,
        instruction: &Instruction,
        build: &TemplateBuild,
        log: &(impl Fn(String) + Sync),
    ) -> Result<State> {
        let line = instruction.line;
        match &instruction.kind {
            Kind::From { .. } => {
                return Err(BuildError::Step { line, message: "one FROM per Dockerfile".into() }.into());
            }
            Kind::Arg { name, default } => {
                let value = match (build.args.get(name), default) {
                    (Some(value), _) => value.clone(),
                    (None, Some(default)) => state.substitute(line, default)?,
                    (None, None) => String::new(),
                };
                state.args.insert(name.clone(), value);
                state.check_size(line)?;
            }
            Kind::Env { vars } => {
                for (name, value) in vars {
                    let value = state.substitute(line, value)?;
                    state.env.insert(name.clone(), value);
                    state.check_size(line)?;
                }
            }
            Kind::User { user } => state.user = Some(state.substitute(line, user)?),
            Kind::Cmd { command } => state.cmd = argv(command),
            Kind::Entrypoint { command } => state.entrypoint = argv(command),
            Kind::Workdir { path } => {
                let path = state.substitute(line, path)?;
                state.workdir = absolute(&state.workdir, &path).display().to_string();
                let key = key(&state.key, &["workdir", &state.workdir]);
                let (rel, owner) = (PathBuf::from(state.workdir.trim_start_matches('/')), self.pool.id_map().root());
                state = self
                    .layer_step(state, key, build.no_cache, log, move |root| {
                        space_image::make_dirs_in_root(root, &rel, owner)
                            .map_err(|e| BuildError::Step { line, message: format!("making the directory: {e}") })
                    })
                    .await?;
            }
            Kind::Run { command } => state = self.run(state, instruction, argv(command), build, log).await?,
            Kind::Copy { sources, dest, chown, chmod, add: _ } => {
                let spec = self.copy_spec(&state, line, sources, dest, chown.as_deref(), chmod.as_deref())?;
                state = self.copy(state, spec, build, log).await?;
            }
        }
        Ok(state)
    }

    /// The cached layer of `key`, unless the build runs without its cache; said in the log.
    fn cached(&self, key: &str, no_cache: bool, log: &impl Fn(String)) -> Result<Option<PathBuf>> {
        let layers = self.pool.layers();
        let layer = if no_cache { None } else { layers.get(key)? };
        if layer.is_some() {
            layers.touch(key)?;
            log(" ---> Using cache".into());
        }
        Ok(layer)
    }

    /// A step that changes files on the host side: `change` fills a writable copy of the
    /// parent layer, unless the layer of `key` is cached.
    async fn layer_step(
        &self,
        mut state: State,
        key: String,
        no_cache: bool,
        log: &(impl Fn(String) + Sync),
        change: impl FnOnce(&Path) -> std::result::Result<(), BuildError> + Send + 'static,
    ) -> Result<State> {
        if let Some(layer) = self.cached(&key, no_cache, log)? {
            state.layer = layer;
            state.key = key;
            return Ok(state);
        }
        let layers = self.pool.layers();
        let parent = state.layer.clone();
        let made = key.clone();
        state.layer = blocking(move || {
            let staged = layers.stage(&parent, &made)?;
            change(staged.path())?;
            Ok(layers.commit(staged, no_cache)?)
        })
        .await?;
        state.key = key;
        Ok(state)
    }

    fn copy_spec(
        &self,
        state: &State,
        line: usize,
        sources: &[String],
        dest: &str,
        chown: Option<&str>,
        chmod: Option<&str>,
    ) -> std::result::Result<CopySpec, BuildError> {
        let sources = sources.iter().map(|s| state.substitute(line, s)).collect::<std::result::Result<Vec<_>, _>>()?;
        let dest_text = state.substitute(line, dest)?;
        let dest = absolute(&state.workdir, &dest_text);
        let rel = dest.strip_prefix("/").unwrap_or(&dest).to_path_buf();
        let is_dir = space_image::is_dir_in_root(&state.layer, &rel);
        let into_dir = dest_text.ends_with('/')
            || sources.len() > 1
            || is_dir
            || sources.iter().any(|s| s.contains(['*', '?', '[']));
        if sources.len() > 1 && !dest_text.ends_with('/') && !is_dir {
            let message =
                format!("with several sources the destination must be a directory ending in /, not {dest_text}");
            return Err(BuildError::Step { line, message });
        }
        let (uid, gid) = match chown {
            Some(spec) => {
                let spec = state.substitute(line, spec)?;
                let account = space_storage::resolve_user(&state.layer, &spec)
                    .map_err(|message| BuildError::Step { line, message: format!("--chown: {message}") })?;
                (account.uid, account.gid)
            }
            None => (0, 0),
        };
        let mode = chmod
            .map(|m| u32::from_str_radix(m, 8))
            .transpose()
            .map_err(|e| BuildError::Step { line, message: format!("--chmod: {e}") })?;
        Ok(CopySpec { line, sources, dest, into_dir, uid, gid, mode })
    }

    /// `COPY`/`ADD`: the selected context entries applied to a copy of the parent layer.
    async fn copy(
        &self,
        state: State,
        spec: CopySpec,
        build: &TemplateBuild,
        log: &(impl Fn(String) + Sync),
    ) -> Result<State> {
        let scratch = self.config.data_dir.join("build-scratch");
        let context = build.context.clone();
        let line = spec.line;
        let selection = blocking(move || {
            std::fs::create_dir_all(&scratch)
                .map_err(|e| NodeError::Internal(format!("{}: {e}", scratch.display())))?;
            Ok(context::select(context.as_deref(), &spec, &scratch)?)
        })
        .await?;
        let key = key(&state.key, &["copy", &selection.digest]);
        let map = self.pool.id_map();
        self.layer_step(state, key, build.no_cache, log, move |root| {
            let limits = space_image::Limits { max_id: map.count - 1, id_base: map.root(), ..Default::default() };
            let mut budget = space_image::Budget::new(limits);
            let tar = std::fs::File::open(selection.tar.path()).map_err(|e| BuildError::Context { line, source: e })?;
            space_image::Unpacker::new(root, &mut budget)
                .and_then(|mut unpacker| unpacker.apply(0, tar))
                .map_err(|e| BuildError::Step { line, message: format!("copying: {e}") })
        })
        .await
    }

    /// A layer of an OCI image (`FROM docker://…`), unpacked once per image digest.
    async fn image_layer(
        &self,
        reference: &str,
        no_cache: bool,
        log: &(impl Fn(String) + Sync),
    ) -> Result<(String, PathBuf, TemplateDefaults)> {
        let image = self.pull_image(reference, |_, _, _| {}).await?;
        let key = key("", &["image", &image.id.to_string()]);
        let defaults = image.defaults();
        if let Some(layer) = self.cached(&key, no_cache, log)? {
            return Ok((key, layer, defaults));
        }
        let layers = self.pool.layers();
        let map = self.pool.id_map();
        let made = key.clone();
        let layer = blocking(move || {
            let limits = space_image::Limits { max_id: map.count - 1, ..Default::default() };
            let staged = layers.stage_filled(&made, map, |root| {
                image.unpack(root, limits, &|_, _, _| {})?;
                Ok(())
            })?;
            Ok(layers.commit(staged, no_cache)?)
        })
        .await?;
        Ok((key, layer, defaults))
    }
}

/// `path` against the working directory `workdir`, as the image sees it.
fn absolute(workdir: &str, path: &str) -> PathBuf {
    let mut out = PathBuf::from("/");
    for part in Path::new(workdir).join(path).components() {
        match part {
            std::path::Component::Normal(p) => out.push(p),
            std::path::Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_against_the_working_directory() {
        assert_eq!(absolute("/", "app"), PathBuf::from("/app"));
        assert_eq!(absolute("/app", "src/../lib"), PathBuf::from("/app/lib"));
        assert_eq!(absolute("/app", "/etc"), PathBuf::from("/etc"));
        assert_eq!(absolute("/", "../../x"), PathBuf::from("/x"));
    }

    #[test]
    fn keys_depend_on_parent_and_parts() {
        assert_eq!(key("a", &["run", "x"]), key("a", &["run", "x"]));
        assert_ne!(key("a", &["run", "x"]), key("b", &["run", "x"]));
        assert_ne!(key("a", &["run", "xy"]), key("a", &["run x", "y"]));
    }

    #[test]
    fn from_names_a_template_or_an_image() {
        assert_eq!(from_image("debian"), Ok(None));
        assert_eq!(from_image("docker://127.0.0.1:5000/app:1"), Ok(Some("127.0.0.1:5000/app:1".into())));
        for host_path in ["oci:/tmp/layout:v1", "docker-archive:/etc/shadow", "/etc", "oci-archive:x.tar"] {
            assert!(from_image(host_path).unwrap_err().contains("space template import"), "{host_path}");
        }
    }
}
