//! `RUN`: the command runs in a `linux` sandbox on a writable copy of the parent layer, as
//! the step's user, in its working directory, with its environment; it reaches only the
//! build's allow list, through the gateway as a session does. When it exits 0 its root
//! becomes the step's layer; otherwise the build fails with its exit status and last lines.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;

use space_api::egress::NetworkPolicy;
use space_api::{RuntimeKind, SandboxId, SessionId, TemplateBuild};
use space_dockerfile::Instruction;
use space_gateway::{SessionCa, SessionEgress};
use space_proto::ExecSpec;
use space_proto::client::ExecEvent;
use space_runtime::{Limits, RootDisk};

use super::{BuildError, State, key};
use crate::{Node, NodeError, Result, blocking, hostname_for, poisoned};

/// What a step's sandbox may use.
const STEP_LIMITS: Limits = Limits { memory_mib: 4096, millicpus: 2000, pids: 4096 };
/// A step that runs longer is killed and fails the build.
const STEP_TIMEOUT_MS: u64 = 60 * 60 * 1000;
/// Lines of a failed step's output its error repeats.
const TAIL_LINES: usize = 30;
/// Longer output lines are cut (a progress bar without newlines is one line).
const MAX_LINE: usize = 4096;
/// How long past the step's own timeout the node waits for the sandbox to report its end.
const STEP_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// The step's session files (its CA, written when it joined the gateway), which every
/// session writes afresh: a template keeps none of a build's.
fn forget_session_files(root: &std::path::Path) -> Result<()> {
    for path in [space_gateway::CA_CERT_PATH, space_gateway::CA_BUNDLE_PATH] {
        let rel = std::path::Path::new(path.trim_start_matches('/'));
        space_image::remove_in_root(root, rel).map_err(|e| NodeError::Internal(format!("removing {path}: {e}")))?;
    }
    Ok(())
}

/// A command of a step, resolved against the state.
struct Command {
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    cwd: String,
    uid: u32,
    gid: u32,
}

impl Node {
    /// `RUN`, or its cached layer.
    pub(super) async fn run(
        &self,
        mut state: State,
        instruction: &Instruction,
        argv: Vec<String>,
        build: &TemplateBuild,
        log: &(impl Fn(String) + Sync),
    ) -> Result<State> {
        let line = instruction.line;
        let mut env = state.args.clone();
        env.extend(state.env.clone());
        let env_text: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let user = state.user.clone().unwrap_or_else(|| "0".into());
        let allow = build.allow.join(",");
        let kind = format!("{:?}", instruction.kind);
        let key = key(&state.key, &["run", &kind, &env_text.join("\0"), &state.workdir, &user, &allow]);
        if let Some(layer) = self.cached(&key, build.no_cache, log)? {
            state.layer = layer;
            state.key = key;
            return Ok(state);
        }
        let account = space_storage::resolve_user(&state.layer, &user)
            .map_err(|message| BuildError::Step { line, message: format!("USER: {message}") })?;
        env.extend(space_gateway::sandbox_env());
        if let Some(home) = account.home.filter(|_| !env.contains_key("HOME")) {
            env.insert("HOME".into(), home);
        }
        let command = Command { argv, env, cwd: state.workdir.clone(), uid: account.uid, gid: account.gid };
        state.layer = self.run_in_sandbox(&state.layer, &key, command, instruction, build, log).await?;
        state.key = key;
        Ok(state)
    }

    /// Runs `command` in a sandbox on a copy of `parent`; its root becomes layer `key` when
    /// the command succeeds. The sandbox is gone afterwards, however it went.
    async fn run_in_sandbox(
        &self,
        parent: &std::path::Path,
        key: &str,
        command: Command,
        instruction: &Instruction,
        build: &TemplateBuild,
        log: &(impl Fn(String) + Sync),
    ) -> Result<PathBuf> {
        let id = SandboxId::generate();
        let session = SessionId::generate();
        self.build_sandboxes.lock().map_err(poisoned)?.insert(id.clone());
        // spaced enforces the step's timeout; this bounds a step whose pid 1 was stopped too.
        let deadline = std::time::Duration::from_millis(STEP_TIMEOUT_MS) + STEP_GRACE;
        let ran =
            tokio::time::timeout(deadline, self.run_step_sandbox(&id, &session, parent, command, &build.allow, log))
                .await
                .unwrap_or_else(|_| {
                    Err(BuildError::Step { line: instruction.line, message: "the step outlived its timeout".into() }
                        .into())
                });
        self.gateway.forget_session(&session);
        let stopped = self.stop_sandbox(&id).await;
        let outcome = match (ran, stopped) {
            (_, Err(e)) | (Err(e), _) => Err(e),
            (Ok((status, _)), Ok(())) if status.code == Some(0) => {
                let (pool, layers, key, sid) = (self.pool.clone(), self.pool.layers(), key.to_owned(), id.clone());
                let replace = build.no_cache;
                blocking(move || {
                    let staged = layers.stage(&pool.sandbox_root_path(&sid), &key)?;
                    forget_session_files(staged.path())?;
                    Ok(layers.commit(staged, replace)?)
                })
                .await
            }
            (Ok((status, tail)), Ok(())) => Err(BuildError::Failed {
                line: instruction.line,
                instruction: super::printable(&instruction.text),
                status: describe(&status),
                output: Vec::from(tail).join("\n"),
            }
            .into()),
        };
        let (pool, sid) = (self.pool.clone(), id.clone());
        let retired = blocking(move || Ok(pool.retire_sandbox_root(&sid)?)).await;
        self.build_sandboxes.lock().map_err(poisoned)?.remove(&id);
        self.reclaim.notify_one();
        retired?;
        outcome
    }

    async fn run_step_sandbox(
        &self,
        id: &SandboxId,
        session: &SessionId,
        parent: &std::path::Path,
        command: Command,
        allow: &[String],
        log: &(impl Fn(String) + Sync),
    ) -> Result<(space_proto::ExitStatus, VecDeque<String>)> {
        let hostname = hostname_for(id);
        let (pool, sid, source) = (self.pool.clone(), id.clone(), parent.to_path_buf());
        let identity = crate::egress::sandbox_identity(&hostname);
        let root = blocking(move || Ok(pool.create_build_root(&sid, &source, identity)?)).await?;
        // Charged to a session of its own, bounded: a step cannot fill the pool other
        // tenants' sessions write to.
        let disk =
            space_node_api::DiskQuota { session: session.clone(), limit_bytes: self.config.build_step_disk_bytes };
        let (pool, sid) = (self.pool.clone(), id.clone());
        blocking(move || crate::charge(&pool, &sid, Some(&disk))).await?;
        self.boot(id, RuntimeKind::Linux, RootDisk::Directory(root), STEP_LIMITS, &hostname, None).await?;
        // A session of its own, as a session's sandbox has: the gateway then decides the
        // step's traffic by the allow list (none: nothing) and the step trusts its CA.
        let policy = NetworkPolicy { allow: allow.to_vec(), ..NetworkPolicy::default() };
        let ca = SessionCa::generate(session).map_err(|e| NodeError::Gateway(e.to_string()))?;
        self.gateway.set_session(session, SessionEgress { policy, ca, grants: Vec::new() });
        self.join_session_network(id, session).await?;
        let agent = self.agent(id).await?;
        let spec = ExecSpec {
            argv: command.argv,
            env: command.env,
            cwd: Some(command.cwd),
            uid: Some(command.uid),
            gid: Some(command.gid),
            timeout_ms: Some(STEP_TIMEOUT_MS),
            ..ExecSpec::default()
        };
        let agent_error =
            |e: space_proto::client::AgentError| NodeError::Agent { sandbox: id.clone(), reason: e.to_string() };
        let mut exec = agent.exec(spec).await.map_err(agent_error)?;
        let mut lines = Lines::default();
        loop {
            match exec.next_event().await.map_err(agent_error)? {
                Some(ExecEvent::Stdout(bytes)) | Some(ExecEvent::Stderr(bytes)) => lines.push(&bytes, log),
                Some(ExecEvent::Exit(status)) => {
                    lines.flush(log);
                    return Ok((status, lines.tail));
                }
                None => {
                    let reason = "the step's command stream ended before its exit".to_owned();
                    return Err(NodeError::Agent { sandbox: id.clone(), reason });
                }
            }
        }
    }
}

fn describe(status: &space_proto::ExitStatus) -> String {
    match (status.timed_out, status.code, status.signal) {
        (true, _, _) => format!("a timeout ({} min)", STEP_TIMEOUT_MS / 60_000),
        (_, Some(code), _) => format!("exit code {code}"),
        (_, None, Some(signal)) => format!("signal {signal}"),
        _ => "an unknown status".into(),
    }
}

/// A step's output cut into lines, the last few kept for its error.
#[derive(Default)]
struct Lines {
    partial: Vec<u8>,
    tail: VecDeque<String>,
}

impl Lines {
    fn push(&mut self, bytes: &[u8], log: &impl Fn(String)) {
        for &b in bytes {
            if b == b'\n' || self.partial.len() >= MAX_LINE {
                self.emit(log);
            }
            if b != b'\n' {
                self.partial.push(b);
            }
        }
    }

    fn flush(&mut self, log: &impl Fn(String)) {
        if !self.partial.is_empty() {
            self.emit(log);
        }
    }

    fn emit(&mut self, log: &impl Fn(String)) {
        let line = super::printable(String::from_utf8_lossy(&self.partial).trim_end_matches('\r'));
        self.partial.clear();
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(line.clone());
        log(line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_cut_into_lines_and_the_tail_kept() {
        let seen = std::sync::Mutex::new(Vec::new());
        let log = |l: String| seen.lock().unwrap().push(l);
        let mut lines = Lines::default();
        lines.push(b"a\r\nb\x1b[2J\0", &log);
        lines.push(b"c\n", &log);
        for i in 0..40 {
            lines.push(format!("{i}\n").as_bytes(), &log);
        }
        lines.push(b"end", &log);
        lines.flush(&log);
        let seen = seen.into_inner().unwrap();
        assert_eq!(&seen[..2], ["a", "b\u{fffd}[2J\u{fffd}c"]);
        assert_eq!(seen.last().unwrap(), "end");
        assert_eq!(lines.tail.len(), TAIL_LINES);
        assert_eq!(lines.tail.back().unwrap(), "end");
    }
}
