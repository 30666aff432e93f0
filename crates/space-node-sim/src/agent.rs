//! A simulated `spaced`: the real agent protocol (handshake, multiplexed streams, frames) over
//! an in-process byte stream, answering from a sandbox's in-memory files and process list.
//! So the control plane's exec and files paths run their real client code.
//!
//! Commands it runs: `echo ARGS…` (prints them), `true`, `false` (exit 1), `cat PATH` (prints
//! a file of the in-memory tree). Any other program fails as an unknown one does under the
//! real agent: pid 0, one stderr line, exit 127. Watches are refused as unsupported.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Bytes, BytesMut};
use space_proto::{
    DataChannel, ErrorKind, ExecInput, ExecSpec, ExitStatus, FileKind, FileStat, Frame, FramedStream, ProcessInfo,
    Reply, Request, next_frame, send_message,
};

/// A sandbox's filesystem and processes, as far as the simulation keeps them.
#[derive(Debug, Clone)]
pub(crate) struct Contents {
    files: BTreeMap<String, Bytes>,
    dirs: BTreeSet<String>,
    processes: Vec<ProcessInfo>,
    next_pid: u32,
}

impl Contents {
    /// A new root: `/`, `/tmp`, `/etc`, and `/etc/template` naming what it was made from.
    pub(crate) fn new_root(template: &str) -> Contents {
        let dirs = ["/", "/tmp", "/etc"].map(String::from).into();
        let files = BTreeMap::from([("/etc/template".to_owned(), Bytes::from(format!("{template}\n")))]);
        Contents { files, dirs, processes: Vec::new(), next_pid: 2 }
    }

    /// What a disk snapshot keeps: the files, no processes.
    pub(crate) fn files_only(&self) -> Contents {
        Contents { processes: Vec::new(), ..self.clone() }
    }

    pub(crate) fn size(&self) -> u64 {
        self.files.values().map(|f| f.len() as u64).sum()
    }

    fn stat(&self, path: &str) -> Option<FileStat> {
        let (kind, size) = match (self.files.get(path), self.dirs.contains(path)) {
            (Some(data), _) => (FileKind::File, data.len() as u64),
            (None, true) => (FileKind::Dir, 0),
            (None, false) => return None,
        };
        let name = path.rsplit('/').next().unwrap_or_default().to_owned();
        let mode = if kind == FileKind::Dir { 0o755 } else { 0o644 };
        Some(FileStat {
            name,
            path: path.to_owned(),
            kind,
            size,
            mode,
            uid: 0,
            gid: 0,
            modified_ms: 0,
            symlink_target: None,
            metadata: Default::default(),
        })
    }

    fn children(&self, dir: &str) -> Vec<String> {
        let all = self.files.keys().chain(self.dirs.iter());
        let mut children: Vec<String> = all.filter(|p| *p != "/" && parent(p) == dir).cloned().collect();
        children.sort();
        children
    }

    fn make_dir(&mut self, path: &str) -> Result<(), Reply> {
        if self.files.contains_key(path) {
            return Err(Reply::error(ErrorKind::AlreadyExists, format!("{path} is a file")));
        }
        if path != "/" {
            self.make_dir(parent(path))?;
        }
        self.dirs.insert(path.to_owned());
        Ok(())
    }

    fn remove(&mut self, path: &str, recursive: bool) -> Result<(), Reply> {
        if self.files.remove(path).is_some() {
            return Ok(());
        }
        if !self.dirs.contains(path) || path == "/" {
            return Err(not_found(path));
        }
        if !recursive && !self.children(path).is_empty() {
            return Err(Reply::error(ErrorKind::DirectoryNotEmpty, format!("{path} is not empty")));
        }
        let inside = format!("{path}/");
        self.files.retain(|p, _| !p.starts_with(&inside));
        self.dirs.retain(|p| p != path && !p.starts_with(&inside));
        Ok(())
    }

    fn move_file(&mut self, from: &str, to: &str) -> Result<(), Reply> {
        let data = self.files.remove(from).ok_or_else(|| not_found(from))?;
        self.files.insert(to.to_owned(), data);
        Ok(())
    }

    /// Runs `spec` to its end: (pid, stdout, stderr, exit code).
    fn run(&mut self, spec: &ExecSpec) -> (u32, String, String, i32) {
        let argv: Vec<&str> = spec.argv.iter().map(String::as_str).collect();
        let (out, err, code) = match argv.as_slice() {
            ["echo", args @ ..] => (format!("{}\n", args.join(" ")), String::new(), 0),
            ["true"] => (String::new(), String::new(), 0),
            ["false"] => (String::new(), String::new(), 1),
            ["cat", path] => match self.files.get(*path) {
                Some(data) => (String::from_utf8_lossy(data).into_owned(), String::new(), 0),
                None => (String::new(), format!("cat: {path}: No such file or directory\n"), 1),
            },
            [program, ..] => {
                return (0, String::new(), format!("spaced: exec: {program}: not found (simulated)\n"), 127);
            }
            [] => return (0, String::new(), "spaced: exec: empty argv\n".into(), 127),
        };
        let pid = self.next_pid;
        self.next_pid += 1;
        let exit = Some(ExitStatus { code: Some(code), ..ExitStatus::default() });
        let info = ProcessInfo { pid, argv: spec.argv.clone(), tty: spec.tty.is_some(), detached: spec.detached, exit };
        self.processes.push(info);
        (pid, out, err, code)
    }
}

/// The parent directory of an absolute path (`/` for `/` itself).
fn parent(path: &str) -> &str {
    match path.rsplit_once('/') {
        Some(("", _)) | None => "/",
        Some((parent, _)) => parent,
    }
}

fn not_found(path: &str) -> Reply {
    Reply::error(ErrorKind::NotFound, format!("{path}: no such file or directory"))
}

/// What a sandbox's agent answers from: its contents and whether it is frozen.
#[derive(Debug)]
pub(crate) struct Inside {
    contents: Mutex<Contents>,
    frozen: AtomicBool,
}

impl Inside {
    pub(crate) fn new(contents: Contents) -> Arc<Inside> {
        Arc::new(Inside { contents: Mutex::new(contents), frozen: AtomicBool::new(false) })
    }

    pub(crate) fn contents(&self) -> MutexGuard<'_, Contents> {
        // Plain data, never left half-changed by a panic: keep going.
        self.contents.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn set_frozen(&self, frozen: bool) {
        self.frozen.store(frozen, Ordering::SeqCst);
    }

    pub(crate) fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::SeqCst)
    }
}

/// Serves the agent protocol on `io` until the connection ends.
pub(crate) async fn serve(mut io: tokio::io::DuplexStream, inside: Arc<Inside>) {
    if space_proto::handshake(&mut io, "space-node-sim").await.is_err() {
        return;
    }
    let served = space_proto::serve(io, move |stream| answer(stream, inside.clone())).await;
    if let Err(e) = served {
        tracing::debug!(error = %e, "simulated agent connection ended");
    }
}

/// Answers the one request a stream carries.
async fn answer(mut stream: FramedStream, inside: Arc<Inside>) {
    let Ok(Some(frame)) = next_frame(&mut stream).await else { return };
    let request: Request = match frame.parse() {
        Ok(request) => request,
        Err(e) => return reply(&mut stream, Reply::error(ErrorKind::InvalidInput, e.to_string())).await,
    };
    // A frozen sandbox's agent would not answer at all; the simulation says why instead.
    if inside.is_frozen() {
        return reply(&mut stream, Reply::error(ErrorKind::Other, "the sandbox is frozen (simulated)")).await;
    }
    match request {
        Request::Exec(spec) => exec(&mut stream, &inside, spec).await,
        Request::ReadFile { path } => read_file(&mut stream, &inside, &path).await,
        Request::WriteFile { path, .. } => write_file(&mut stream, &inside, &path).await,
        other => {
            let answer = immediate(&inside, other);
            reply(&mut stream, answer).await
        }
    }
}

/// The answer of a request that is one reply.
fn immediate(inside: &Inside, request: Request) -> Reply {
    let mut contents = inside.contents();
    let done = |result: Result<(), Reply>| result.err().unwrap_or(Reply::Ok);
    match request {
        Request::Health => {
            let processes = contents.processes.iter().filter(|p| p.exit.is_none()).count() as u32;
            Reply::Health { agent_version: "sim".into(), uptime_ms: 0, processes, features: Vec::new() }
        }
        Request::ListProcesses => Reply::Processes { processes: contents.processes.clone() },
        Request::Signal { pid, .. } | Request::Attach { pid } if !contents.processes.iter().any(|p| p.pid == pid) => {
            Reply::error(ErrorKind::NoSuchProcess, format!("no process {pid}"))
        }
        // Every simulated process has exited already: a signal changes nothing.
        Request::Signal { .. } => Reply::Ok,
        Request::Attach { pid } => {
            let status = contents.processes.iter().find(|p| p.pid == pid).and_then(|p| p.exit).unwrap_or_default();
            Reply::Exited { status }
        }
        Request::ForgetExited => {
            contents.processes.retain(|p| p.exit.is_none());
            Reply::Ok
        }
        Request::AllowCheckpoint | Request::FreezeRoot { .. } | Request::Reseed { .. } => Reply::Ok,
        Request::Stat { path } => {
            contents.stat(&path).map_or_else(|| not_found(&path), |stat| Reply::Stat { stat: Box::new(stat) })
        }
        Request::ListDir { path } => match contents.stat(&path) {
            None => not_found(&path),
            Some(stat) if stat.kind != FileKind::Dir => {
                Reply::error(ErrorKind::NotADirectory, format!("{path} is not a directory"))
            }
            Some(_) => {
                let entries = contents.children(&path).iter().filter_map(|p| contents.stat(p)).collect();
                Reply::Entries { entries }
            }
        },
        Request::MakeDir { path } => done(contents.make_dir(&path)),
        Request::Move { from, to } => done(contents.move_file(&from, &to)),
        Request::Remove { path, recursive } => done(contents.remove(&path, recursive)),
        Request::Watch { .. } => Reply::error(ErrorKind::Unsupported, "the simulated agent has no file watches"),
        Request::Exec(_) | Request::ReadFile { .. } | Request::WriteFile { .. } => {
            Reply::error(ErrorKind::InvalidInput, "a streamed request")
        }
    }
}

async fn reply(stream: &mut FramedStream, reply: Reply) {
    let _ = send_message(stream, &reply).await;
}

async fn exec(stream: &mut FramedStream, inside: &Inside, spec: ExecSpec) {
    let (pid, out, err, code) = inside.contents().run(&spec);
    reply(stream, Reply::Started { pid }).await;
    if spec.detached {
        return;
    }
    for (channel, text) in [(DataChannel::Stdout, out), (DataChannel::Stderr, err)] {
        if !text.is_empty() {
            let _ = futures::SinkExt::send(stream, Frame::Data(channel, text.into())).await;
        }
    }
    reply(stream, Reply::Exited { status: ExitStatus { code: Some(code), ..ExitStatus::default() } }).await;
}

async fn read_file(stream: &mut FramedStream, inside: &Inside, path: &str) {
    let found = inside.contents().files.get(path).cloned();
    let Some(data) = found else {
        let is_dir = inside.contents().dirs.contains(path);
        let refusal = if is_dir { Reply::error(ErrorKind::IsADirectory, path) } else { not_found(path) };
        return reply(stream, refusal).await;
    };
    reply(stream, Reply::FileStart { size: data.len() as u64 }).await;
    let bytes = data.len() as u64;
    if !data.is_empty() {
        let _ = futures::SinkExt::send(stream, Frame::Data(DataChannel::File, data)).await;
    }
    reply(stream, Reply::Done { bytes }).await;
}

/// Receives the upload to its end, then the file appears whole (as the real agent does).
async fn write_file(stream: &mut FramedStream, inside: &Inside, path: &str) {
    let parent_is_dir = inside.contents().dirs.contains(parent(path));
    if !parent_is_dir {
        return reply(stream, not_found(parent(path))).await;
    }
    let mut data = BytesMut::new();
    loop {
        match next_frame(stream).await {
            Ok(Some(Frame::Data(DataChannel::File, chunk))) => data.extend_from_slice(&chunk),
            Ok(Some(frame)) if matches!(frame.parse(), Ok(ExecInput::Eof)) => break,
            // Anything else, or the stream gone: the upload is abandoned and nothing written.
            _ => return,
        }
    }
    let bytes = data.len() as u64;
    inside.contents().files.insert(path.to_owned(), data.freeze());
    reply(stream, Reply::Done { bytes }).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_of_absolute_paths() {
        assert_eq!([parent("/"), parent("/tmp"), parent("/tmp/a/b")], ["/", "/", "/tmp/a"]);
    }

    /// The tree behaves as the real agent's errors say: the control plane maps their kinds.
    #[test]
    fn the_tree_refuses_as_a_filesystem_would() {
        let mut tree = Contents::new_root("t@1");
        tree.make_dir("/tmp/d/e").unwrap();
        tree.files.insert("/tmp/d/e/f".into(), Bytes::from_static(b"x"));
        let kind = |reply: Reply| match reply {
            Reply::Error { kind, .. } => kind,
            other => panic!("{other:?}"),
        };
        assert_eq!(kind(tree.remove("/tmp/d", false).unwrap_err()), ErrorKind::DirectoryNotEmpty);
        assert_eq!(kind(tree.make_dir("/tmp/d/e/f").unwrap_err()), ErrorKind::AlreadyExists);
        assert_eq!(kind(tree.remove("/", true).unwrap_err()), ErrorKind::NotFound);
        tree.remove("/tmp/d", true).unwrap();
        assert_eq!(tree.children("/tmp"), Vec::<String>::new());
        assert!(tree.stat("/tmp/d/e/f").is_none());
    }

    #[test]
    fn a_disk_snapshot_keeps_files_but_no_processes() {
        let mut tree = Contents::new_root("t@1");
        let (pid, out, _, code) = tree.run(&ExecSpec { argv: vec!["echo".into(), "hi".into()], ..ExecSpec::default() });
        assert_eq!((out.as_str(), code), ("hi\n", 0));
        assert!(pid > 1);
        let (pid, _, err, code) = tree.run(&ExecSpec { argv: vec!["nope".into()], ..ExecSpec::default() });
        assert_eq!((pid, code), (0, 127), "{err}");
        let disk = tree.files_only();
        assert_eq!((disk.processes.len(), tree.processes.len()), (0, 1));
        assert_eq!(disk.stat("/etc/template").map(|s| s.size), Some(4));
    }
}
