//! Typed messages carried in [`crate::Frame::Message`] frames.
//!
//! Stream conversations (client = node, server = spaced):
//! - `Exec`: client sends `Request::Exec`, then `Data(Stdin)` and [`ExecInput`] messages;
//!   server replies `Reply::Started`, then `Data(Stdout|Stderr)` and finally `Reply::Exited`.
//!   A detached exec ends the stream after `Started`; `Attach` re-joins it later.
//! - `ReadFile`: server replies `Reply::FileStart`, `Data(File)` chunks, then `Reply::Done`.
//! - `WriteFile`: client sends `Data(File)` chunks, then `ExecInput::Eof`; server replies `Reply::Done`.
//! - `Watch`: server sends `Reply::Watching`, then `Reply::Event` until the stream closes.
//! - every other request: exactly one reply.
//!
//! Any request may be answered with `Reply::Error` instead.
//!
//! Details of these conversations (as implemented by `spaced` and [`crate::AgentClient`]):
//! - `Exec` of a program that cannot be executed is not an error: the server replies
//!   `Started{pid: 0}`, one `Data(Stderr)` line `spaced: exec: <argv0>: <reason>` and
//!   `Exited{code: 127}` (not found) or `126` (not executable, permission denied, or the
//!   child's setup failed). This holds for detached execs too. A missing or non-directory
//!   `cwd`, an empty argv or NUL bytes are `Error` replies.
//! - An exec ends when its main process exits, not at EOF of its output: processes it
//!   started in the background keep running (and may keep the pipes open); output already
//!   in the pipes at exit is sent before `Exited`, later output is discarded.
//! - Closing or resetting the client side of a non-detached exec stream before `Exited`
//!   abandons it: the server SIGKILLs the process group. Closing an `Attach` stream only
//!   detaches. A client must therefore not half-close an exec stream to signal EOF: it
//!   sends `ExecInput::Eof` (on a tty this types ^D).
//! - `Attach` is answered `Started{pid}` (or `Error{NoSuchProcess}`), then buffered output
//!   (detached processes keep the last 1 MiB per channel), live output and `Exited`.
//! - `ExecInput::Signal` and `Request::Signal` signal the process itself, not its group;
//!   timeouts (`Exited{timed_out: true}`) and abandoned execs kill the whole group.
//! - `ReadFile` sends at most `FileStart.size` bytes; `Done.bytes` is the number sent.
//! - `WriteFile` replies only `Done` or `Error`; an `Error` may arrive before the client
//!   finished sending (e.g. permission denied), after which the server closes the stream.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::file_metadata::FileMetadata;

/// What the names of the temporary files an upload is written to (then renamed into place)
/// start with: watchers that speak for another API may leave them out.
pub const UPLOAD_TEMP_PREFIX: &str = ".spaced-upload-";

/// Where a template keeps the defaults of the commands run in it (an image config's `Env`,
/// `WorkingDir` and `User`). spaced reads it once, when it starts.
pub const EXEC_DEFAULTS_PATH: &str = "/etc/space/exec-defaults.json";

/// The defaults a template gives every command, under what the session and the request say.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecDefaults {
    /// Environment under the session's and the request's.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory when the request gives none.
    #[serde(default)]
    pub cwd: Option<String>,
    /// User and group when the request gives no user.
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub gid: Option<u32>,
}

/// The first message on every stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Health,
    Exec(ExecSpec),
    /// Re-join a process started earlier: buffered output first, then live output and exit.
    Attach {
        pid: u32,
    },
    Signal {
        pid: u32,
        signal: i32,
    },
    ListProcesses,
    /// Forgets every exited process (the list, output and exit status kept for `Attach`).
    /// Used after warming up a pod, so its first user sees no process they did not start.
    ForgetExited,
    /// The node is about to take a full snapshot: pid 1 lets itself be dumped (CRIU reads it
    /// like a tracer would) until the node's next connection, which makes it non-dumpable
    /// again. Outside that window sandbox processes cannot ptrace pid 1 or take its
    /// descriptors.
    AllowCheckpoint,
    /// Sent by the node right after a `vm` sandbox was restored from a memory snapshot, before
    /// anything else: every VM restored from one state would otherwise draw the same random
    /// numbers (the kernel's RNG state is part of guest memory) and run on the snapshot's
    /// clock. The agent credits `entropy` (host `getrandom` bytes, [`RESEED_MIN_ENTROPY`] to
    /// [`RESEED_MAX_ENTROPY`]) to the kernel's pool, forces a reseed of its CRNG, sets
    /// `CLOCK_REALTIME` to `unix_time_ns` and, when given, the host name and the
    /// `/etc/machine-id` (32 lowercase hex digits: a VM restored as a new sandbox, such as a
    /// warm pod from its template, must not keep its template's). Answered `Ok`.
    Reseed {
        entropy: Vec<u8>,
        unix_time_ns: u64,
        #[serde(default)]
        hostname: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        machine_id: Option<String>,
    },
    Stat {
        path: String,
    },
    ReadFile {
        path: String,
    },
    /// Uploads a file. Its `metadata` (see [`FileMetadata`]) is set on the new file before
    /// it is renamed into place, so the file never exists without it; a file written without
    /// metadata has none (an upload replaces the file and its metadata whole). An agent
    /// whose health does not list [`crate::file_metadata::FEATURE`] would ignore the field: ask
    /// first.
    WriteFile {
        path: String,
        mode: Option<u32>,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        metadata: FileMetadata,
    },
    ListDir {
        path: String,
    },
    MakeDir {
        path: String,
    },
    Move {
        from: String,
        to: String,
    },
    Remove {
        path: String,
        recursive: bool,
    },
    Watch {
        path: String,
        recursive: bool,
    },
    /// Flushes and freezes (`FIFREEZE`) the root filesystem, or thaws it (`FITHAW`): a `vm`
    /// sandbox's disk is only consistent for a snapshot while its guest holds nothing back.
    /// Thawing a filesystem that is not frozen is fine.
    FreezeRoot {
        frozen: bool,
    },
}

/// Fewest and most entropy bytes a [`Request::Reseed`] carries (the CRNG's key is 32 bytes).
pub const RESEED_MIN_ENTROPY: usize = 32;
pub const RESEED_MAX_ENTROPY: usize = 512;

/// What to run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecSpec {
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    /// Run as this user (supplementary groups are cleared).
    pub uid: Option<u32>,
    /// Run with this group; defaults to `uid` when only `uid` is given.
    pub gid: Option<u32>,
    /// Run under a pseudo-terminal of this size; stdout then carries the terminal output.
    pub tty: Option<PtySize>,
    /// Kill the process group after this many milliseconds.
    pub timeout_ms: Option<u64>,
    /// Keep the process running after the stream closes; output is buffered for `Attach`.
    #[serde(default)]
    pub detached: bool,
    /// Whether the client will send stdin; without it stdin is /dev/null.
    #[serde(default)]
    pub stdin: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySize {
    pub rows: u16,
    pub cols: u16,
}

/// Client messages after the request on an exec, attach or write stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecInput {
    /// No more stdin (exec) or no more file data (write).
    Eof,
    Signal {
        signal: i32,
    },
    Resize(PtySize),
}

/// How a process ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitStatus {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// The process was killed because its timeout elapsed.
    #[serde(default)]
    pub timed_out: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub pid: u32,
    pub argv: Vec<String>,
    pub tty: bool,
    pub detached: bool,
    /// `None` while running.
    pub exit: Option<ExitStatus>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    pub name: String,
    pub path: String,
    pub kind: FileKind,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub modified_ms: i64,
    pub symlink_target: Option<String>,
    /// The entry's user-defined metadata (empty for entries that have none, and from
    /// agents that predate it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: FileMetadata,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchKind {
    Create,
    Modify,
    Remove,
    MovedFrom,
    MovedTo,
    /// Events were dropped (queue overflow); re-list the directory.
    Overflow,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    pub kind: WatchKind,
    pub path: String,
    pub is_dir: bool,
}

/// Classes of failure the node maps onto API errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    NotFound,
    PermissionDenied,
    AlreadyExists,
    NotADirectory,
    IsADirectory,
    DirectoryNotEmpty,
    InvalidInput,
    NoSuchProcess,
    Unsupported,
    /// `ENOSPC`: the filesystem is full.
    StorageFull,
    /// `EDQUOT`: the session's disk limit is reached.
    QuotaExceeded,
    Other,
}

/// Server messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    Error {
        kind: ErrorKind,
        message: String,
    },
    Health {
        agent_version: String,
        uptime_ms: u64,
        processes: u32,
        /// What this agent does beyond the requests every agent answers (agents restored
        /// from old snapshots run the code they were dumped with).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        features: Vec<String>,
    },
    Started {
        pid: u32,
    },
    Exited {
        status: ExitStatus,
    },
    Processes {
        processes: Vec<ProcessInfo>,
    },
    Stat {
        /// Boxed: every reply would otherwise be as large as a stat.
        stat: Box<FileStat>,
    },
    Entries {
        entries: Vec<FileStat>,
    },
    FileStart {
        size: u64,
    },
    /// End of a read or write: the number of bytes transferred.
    Done {
        bytes: u64,
    },
    Watching,
    Event {
        event: WatchEvent,
    },
    Ok,
}

impl ExitStatus {
    /// Exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

impl Reply {
    pub fn error(kind: ErrorKind, message: impl Into<String>) -> Self {
        Reply::Error { kind, message: message.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Frame;

    /// The wire form of `Reseed` is part of the protocol: an agent of another build must read
    /// what this node sends.
    #[test]
    fn reseed_encoding() {
        let request = Request::Reseed {
            entropy: vec![0, 1, 255],
            unix_time_ns: 1_764_600_000_123_456_789,
            hostname: None,
            machine_id: None,
        };
        let json = serde_json::to_string(&request).unwrap();
        assert_eq!(json, r#"{"op":"reseed","entropy":[0,1,255],"unix_time_ns":1764600000123456789,"hostname":null}"#);
        let frame = Frame::message(&request).unwrap();
        assert_eq!(frame.parse::<Request>().unwrap(), request);
        // An older node's request without a host name still parses.
        let old: Request = serde_json::from_str(r#"{"op":"reseed","entropy":[7],"unix_time_ns":5}"#).unwrap();
        assert_eq!(old, Request::Reseed { entropy: vec![7], unix_time_ns: 5, hostname: None, machine_id: None });
        let named = Request::Reseed {
            entropy: vec![1; 64],
            unix_time_ns: u64::MAX,
            hostname: Some("b".into()),
            machine_id: Some("0123456789abcdef0123456789abcdef".into()),
        };
        assert_eq!(Frame::message(&named).unwrap().parse::<Request>().unwrap(), named);
        // Entropy is bytes: anything else is a bad request, not a truncated value.
        assert!(serde_json::from_str::<Request>(r#"{"op":"reseed","entropy":[256],"unix_time_ns":5}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"reseed","entropy":[1],"unix_time_ns":-1}"#).is_err());
    }

    /// Metadata is optional both ways: a request or stat without it reads as empty, and an
    /// upload without it is written as older nodes wrote it.
    #[test]
    fn file_metadata_is_optional_on_the_wire() {
        let plain = Request::WriteFile { path: "/f".into(), mode: None, metadata: FileMetadata::new() };
        assert_eq!(serde_json::to_string(&plain).unwrap(), r#"{"op":"write_file","path":"/f","mode":null}"#);
        let old: Request = serde_json::from_str(r#"{"op":"write_file","path":"/f","mode":null}"#).unwrap();
        assert_eq!(old, plain);
        let stat = r#"{"name":"f","path":"/f","kind":"file","size":1,"mode":420,"uid":0,"gid":0,"modified_ms":0,"symlink_target":null}"#;
        assert!(serde_json::from_str::<FileStat>(stat).unwrap().metadata.is_empty());
        let health: Reply =
            serde_json::from_str(r#"{"type":"health","agent_version":"0","uptime_ms":1,"processes":0}"#).unwrap();
        assert!(matches!(health, Reply::Health { features, .. } if features.is_empty()));
    }
}
