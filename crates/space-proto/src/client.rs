//! [`AgentClient`]: the node's typed client for `spaced`, over [`MuxClient`].
//!
//! Everything the sandbox sends is hostile. Nothing here panics on peer input: frames
//! that do not fit the conversation become [`AgentError::Protocol`], error messages are
//! truncated, a file download never yields more than the size announced, and a write is
//! only acknowledged by the exact byte count that was sent. Calls do not time out by
//! themselves (an exec legitimately runs for days); wrap them in `tokio::time::timeout`
//! where a bound is wanted, e.g. around [`AgentClient::connect`].

use std::path::Path;

use bytes::Bytes;
use futures::stream::{BoxStream, SplitSink};
use futures::{SinkExt, Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::codec::{DATA_CHUNK, DataChannel, Frame, FrameError};
use crate::duplex::{FrameReceiver, FrameSender, OnSendersDropped, duplex};
use crate::file_metadata::{self, FileMetadata};
use crate::messages::{
    ErrorKind, ExecInput, ExecSpec, ExitStatus, FileStat, ProcessInfo, PtySize, Reply, Request, WatchEvent,
};
use crate::mux::{FramedStream, Hello, MuxClient, MuxError, handshake, next_frame, send_message};

/// Longest error message kept from the sandbox.
const MAX_REMOTE_MESSAGE: usize = 4096;

/// Why a call to the sandbox agent failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The agent answered with `Reply::Error`.
    #[error("sandbox agent: {message} ({kind:?})")]
    Remote { kind: ErrorKind, message: String },
    /// The agent sent something that does not fit the protocol.
    #[error("sandbox agent broke the protocol: {0}")]
    Protocol(String),
    /// The connection or the stream ended before the operation finished.
    #[error("connection to the sandbox agent is closed")]
    Closed,
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl AgentError {
    /// The remote error kind, if the agent reported one.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            AgentError::Remote { kind, .. } => Some(*kind),
            _ => None,
        }
    }
}

impl From<FrameError> for AgentError {
    fn from(err: FrameError) -> Self {
        match err {
            FrameError::Io(e) if is_disconnect(&e) => AgentError::Closed,
            FrameError::Io(e) => AgentError::Io(e),
            other => AgentError::Protocol(other.to_string()),
        }
    }
}

impl From<MuxError> for AgentError {
    fn from(err: MuxError) -> Self {
        match err {
            MuxError::Closed => AgentError::Closed,
            MuxError::Frame(e) => e.into(),
            other => AgentError::Protocol(other.to_string()),
        }
    }
}

fn is_disconnect(err: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        err.kind(),
        K::BrokenPipe | K::ConnectionReset | K::ConnectionAborted | K::UnexpectedEof | K::WriteZero | K::NotConnected
    )
}

fn remote(kind: ErrorKind, mut message: String) -> AgentError {
    if message.len() > MAX_REMOTE_MESSAGE {
        let mut end = MAX_REMOTE_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push('…');
    }
    AgentError::Remote { kind, message }
}

/// A reply that does not belong here; names only the variant (the payload may be huge).
fn unexpected(reply: &Reply) -> AgentError {
    let name = match reply {
        Reply::Error { .. } => "error",
        Reply::Health { .. } => "health",
        Reply::Started { .. } => "started",
        Reply::Exited { .. } => "exited",
        Reply::Processes { .. } => "processes",
        Reply::Stat { .. } => "stat",
        Reply::Entries { .. } => "entries",
        Reply::FileStart { .. } => "file_start",
        Reply::Done { .. } => "done",
        Reply::Watching => "watching",
        Reply::Event { .. } => "event",
        Reply::Ok => "ok",
    };
    AgentError::Protocol(format!("unexpected reply `{name}`"))
}

/// Decodes a message frame as a reply; `Reply::Error` becomes [`AgentError::Remote`].
fn reply_of(frame: &Frame) -> Result<Reply, AgentError> {
    match frame.parse::<Reply>()? {
        Reply::Error { kind, message } => Err(remote(kind, message)),
        reply => Ok(reply),
    }
}

/// The next reply on a stream; the stream ending is [`AgentError::Closed`].
async fn recv_reply<S>(stream: &mut S) -> Result<Reply, AgentError>
where
    S: Stream<Item = Result<Frame, FrameError>> + Unpin,
{
    match stream.next().await {
        None => Err(AgentError::Closed),
        Some(Err(e)) => Err(e.into()),
        Some(Ok(Frame::Data(channel, _))) => Err(AgentError::Protocol(format!("unexpected {channel:?} data"))),
        Some(Ok(frame)) => reply_of(&frame),
    }
}

/// Splits a payload into frames no larger than [`DATA_CHUNK`].
fn pieces(data: Bytes) -> impl Iterator<Item = Bytes> {
    let len = data.len();
    (0..len).step_by(DATA_CHUNK).map(move |start| data.slice(start..len.min(start + DATA_CHUNK)))
}

/// What `Request::Health` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentHealth {
    pub agent_version: String,
    pub uptime_ms: u64,
    /// Processes started by the agent that are still running.
    pub processes: u32,
    /// What the agent does beyond the requests every agent answers.
    pub features: Vec<String>,
}

/// Chunks of a downloaded file.
pub type FileChunks = BoxStream<'static, Result<Bytes, AgentError>>;
/// Events of a watch; ends with `Err(Closed)` if the agent ends it.
pub type WatchEvents = BoxStream<'static, Result<WatchEvent, AgentError>>;

/// A connection to one sandbox's agent. Cheap to clone; every operation opens its own
/// multiplexed stream, so any number may run concurrently.
#[derive(Clone, Debug)]
pub struct AgentClient {
    mux: MuxClient,
    peer: Hello,
}

impl AgentClient {
    /// Connects to an agent listening on a unix socket.
    pub async fn connect_unix(path: impl AsRef<Path>) -> Result<Self, AgentError> {
        let io = tokio::net::UnixStream::connect(path).await?;
        Self::connect(io).await
    }

    /// Handshakes over `io` and spawns the multiplexer driver on the current runtime.
    pub async fn connect<T>(mut io: T) -> Result<Self, AgentError>
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let name = format!("space-node/{}", env!("CARGO_PKG_VERSION"));
        let peer = handshake(&mut io, &name).await?;
        let (mux, driver) = MuxClient::new(io);
        tokio::spawn(driver);
        Ok(AgentClient { mux, peer })
    }

    /// The agent's hello (its name and version).
    pub fn peer(&self) -> &Hello {
        &self.peer
    }

    /// Whether the connection has ended; every call then fails with [`AgentError::Closed`].
    pub fn is_closed(&self) -> bool {
        self.mux.is_closed()
    }

    /// Resolves once the connection has ended.
    pub async fn closed(&self) {
        self.mux.closed().await
    }

    /// Closes the connection for every clone of this client (streams in use end with an
    /// error); the agent then closes its end.
    pub fn close(&self) {
        self.mux.close();
    }

    /// A raw stream, for protocol extensions and tests.
    pub async fn open_stream(&self) -> Result<FramedStream, AgentError> {
        Ok(self.mux.open().await?)
    }

    /// Opens a stream, sends `request` and reads the first reply.
    async fn request(&self, request: &Request) -> Result<(FramedStream, Reply), AgentError> {
        let mut stream = self.open_stream().await?;
        send_message(&mut stream, request).await?;
        let reply = recv_reply(&mut stream).await?;
        Ok((stream, reply))
    }

    async fn call(&self, request: &Request) -> Result<Reply, AgentError> {
        Ok(self.request(request).await?.1)
    }

    async fn call_ok(&self, request: &Request) -> Result<(), AgentError> {
        match self.call(request).await? {
            Reply::Ok => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    pub async fn health(&self) -> Result<AgentHealth, AgentError> {
        match self.call(&Request::Health).await? {
            Reply::Health { agent_version, uptime_ms, processes, features } => {
                Ok(AgentHealth { agent_version, uptime_ms, processes, features })
            }
            other => Err(unexpected(&other)),
        }
    }

    /// Starts a process. A program that cannot be executed still yields a session (pid 0,
    /// a stderr line, exit code 127 or 126). A detached session ends right after the pid.
    pub async fn exec(&self, spec: ExecSpec) -> Result<ExecSession, AgentError> {
        let detached = spec.detached;
        let (stream, reply) = self.request(&Request::Exec(spec)).await?;
        ExecSession::new(stream, reply, detached)
    }

    /// Re-joins a process: output buffered for it (detached processes only), live output,
    /// exit. Dropping the session detaches without affecting the process.
    pub async fn attach(&self, pid: u32) -> Result<ExecSession, AgentError> {
        let (stream, reply) = self.request(&Request::Attach { pid }).await?;
        ExecSession::new(stream, reply, false)
    }

    /// Signals a process started by the agent.
    pub async fn signal(&self, pid: u32, signal: i32) -> Result<(), AgentError> {
        self.call_ok(&Request::Signal { pid, signal }).await
    }

    /// Running and recently exited processes started by the agent.
    pub async fn processes(&self) -> Result<Vec<ProcessInfo>, AgentError> {
        match self.call(&Request::ListProcesses).await? {
            Reply::Processes { processes } => Ok(processes),
            other => Err(unexpected(&other)),
        }
    }

    /// Lets pid 1 be checkpointed until the next connection (see [`Request::AllowCheckpoint`]).
    pub async fn allow_checkpoint(&self) -> Result<(), AgentError> {
        self.call_ok(&Request::AllowCheckpoint).await
    }

    /// Freezes (flushed first) or thaws the sandbox's root filesystem.
    pub async fn freeze_root(&self, frozen: bool) -> Result<(), AgentError> {
        self.call_ok(&Request::FreezeRoot { frozen }).await
    }

    /// Gives a restored VM's kernel fresh entropy, the current time and optionally a host name
    /// and machine id (see [`Request::Reseed`]).
    pub async fn reseed(
        &self,
        entropy: Vec<u8>,
        unix_time_ns: u64,
        hostname: Option<String>,
        machine_id: Option<String>,
    ) -> Result<(), AgentError> {
        self.call_ok(&Request::Reseed { entropy, unix_time_ns, hostname, machine_id }).await
    }

    /// Forgets every exited process; running ones stay.
    pub async fn forget_exited(&self) -> Result<(), AgentError> {
        self.call_ok(&Request::ForgetExited).await
    }

    /// `lstat`: a symlink is described, not followed.
    pub async fn stat(&self, path: &str) -> Result<FileStat, AgentError> {
        match self.call(&Request::Stat { path: path.into() }).await? {
            Reply::Stat { stat } => Ok(*stat),
            other => Err(unexpected(&other)),
        }
    }

    /// Entries of a directory, sorted by name.
    pub async fn list_dir(&self, path: &str) -> Result<Vec<FileStat>, AgentError> {
        match self.call(&Request::ListDir { path: path.into() }).await? {
            Reply::Entries { entries } => Ok(entries),
            other => Err(unexpected(&other)),
        }
    }

    /// `mkdir -p`.
    pub async fn make_dir(&self, path: &str) -> Result<(), AgentError> {
        self.call_ok(&Request::MakeDir { path: path.into() }).await
    }

    /// Renames (or copies and removes, across filesystems).
    pub async fn move_path(&self, from: &str, to: &str) -> Result<(), AgentError> {
        self.call_ok(&Request::Move { from: from.into(), to: to.into() }).await
    }

    /// Removes a file, symlink or empty directory; any directory with `recursive`.
    pub async fn remove(&self, path: &str, recursive: bool) -> Result<(), AgentError> {
        self.call_ok(&Request::Remove { path: path.into(), recursive }).await
    }

    /// Downloads a file: its size, then its contents in chunks. The stream ends after
    /// the agent confirms the byte count, and fails rather than exceed the size.
    pub async fn read_file(&self, path: &str) -> Result<(u64, FileChunks), AgentError> {
        match self.request(&Request::ReadFile { path: path.into() }).await? {
            (stream, Reply::FileStart { size }) => Ok((size, file_chunks(stream, size))),
            (_, other) => Err(unexpected(&other)),
        }
    }

    /// Uploads `data` to `path` (mode default 0644); returns the bytes written. The file
    /// appears atomically when the upload succeeds; an error from `data` aborts it.
    pub async fn write_file<S>(&self, path: &str, mode: Option<u32>, data: S) -> Result<u64, AgentError>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send,
    {
        self.upload_file(Request::WriteFile { path: path.into(), mode, metadata: FileMetadata::new() }, data).await
    }

    /// [`Self::write_file`], the file appearing with `metadata` (none if it is empty). An
    /// agent that cannot store metadata (one restored from a snapshot older than the
    /// feature) is asked first, and the upload refused as [`ErrorKind::Unsupported`]
    /// before anything is written.
    pub async fn write_file_with_metadata<S>(
        &self,
        path: &str,
        mode: Option<u32>,
        metadata: FileMetadata,
        data: S,
    ) -> Result<u64, AgentError>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send,
    {
        if !metadata.is_empty() && !self.health().await?.features.iter().any(|f| f == file_metadata::FEATURE) {
            let why = "this sandbox's agent cannot store file metadata (it runs the code of an older \
                       snapshot): upload without metadata, or use a sandbox created since";
            return Err(remote(ErrorKind::Unsupported, why.into()));
        }
        self.upload_file(Request::WriteFile { path: path.into(), mode, metadata }, data).await
    }

    async fn upload_file<S>(&self, request: Request, data: S) -> Result<u64, AgentError>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send,
    {
        let mut stream = self.open_stream().await?;
        send_message(&mut stream, &request).await?;
        let (mut sink, mut replies) = stream.split();
        let upload = upload(&mut sink, data);
        tokio::select! {
            // Biased: when the final `Done` is already in, the upload has finished too.
            biased;
            sent = upload => {
                let sent = sent?;
                match recv_reply(&mut replies).await? {
                    Reply::Done { bytes } if bytes == sent => Ok(bytes),
                    Reply::Done { bytes } => {
                        Err(AgentError::Protocol(format!("agent wrote {bytes} bytes, {sent} were sent")))
                    }
                    other => Err(unexpected(&other)),
                }
            }
            // Before the upload ends the agent only speaks to refuse it.
            reply = recv_reply(&mut replies) => Err(match reply {
                Err(e) => e,
                Ok(other) => unexpected(&other),
            }),
        }
    }

    /// Watches a path (recursively: its subdirectories too, including new ones).
    /// Dropping the stream ends the watch.
    pub async fn watch(&self, path: &str, recursive: bool) -> Result<WatchEvents, AgentError> {
        match self.request(&Request::Watch { path: path.into(), recursive }).await? {
            (stream, Reply::Watching) => Ok(watch_events(stream)),
            (_, other) => Err(unexpected(&other)),
        }
    }
}

async fn upload<S>(sink: &mut SplitSink<FramedStream, Frame>, data: S) -> Result<u64, AgentError>
where
    S: Stream<Item = Result<Bytes, std::io::Error>>,
{
    let mut data = std::pin::pin!(data);
    let mut sent = 0u64;
    while let Some(chunk) = data.next().await {
        let chunk = chunk?;
        sent += chunk.len() as u64;
        for piece in pieces(chunk) {
            sink.send(Frame::Data(DataChannel::File, piece)).await?;
        }
    }
    sink.send(Frame::message(&ExecInput::Eof)?).await?;
    Ok(sent)
}

fn file_chunks(stream: FramedStream, size: u64) -> FileChunks {
    let state = Some((stream, 0u64));
    futures::stream::unfold(state, move |state| async move {
        let (mut stream, received) = state?;
        match next_chunk(&mut stream, size, received).await {
            Ok(Some(chunk)) => {
                let received = received + chunk.len() as u64;
                Some((Ok(chunk), Some((stream, received))))
            }
            Ok(None) => None,
            Err(e) => Some((Err(e), None)),
        }
    })
    .boxed()
}

/// The next chunk of a download; `None` once `Done` confirmed what was received.
async fn next_chunk(stream: &mut FramedStream, size: u64, received: u64) -> Result<Option<Bytes>, AgentError> {
    let frame = next_frame(stream).await?.ok_or(AgentError::Closed)?;
    match frame {
        Frame::Data(DataChannel::File, data) if received + data.len() as u64 <= size => Ok(Some(data)),
        Frame::Data(DataChannel::File, _) => Err(AgentError::Protocol(format!("file is longer than {size} bytes"))),
        Frame::Data(channel, _) => Err(AgentError::Protocol(format!("unexpected {channel:?} data"))),
        Frame::Message(_) => match reply_of(&frame)? {
            Reply::Done { bytes } if bytes == received => Ok(None),
            Reply::Done { bytes } => {
                Err(AgentError::Protocol(format!("agent sent {received} bytes but reported {bytes}")))
            }
            other => Err(unexpected(&other)),
        },
    }
}

fn watch_events(stream: FramedStream) -> WatchEvents {
    futures::stream::unfold(Some(stream), |state| async move {
        let mut stream = state?;
        match recv_reply(&mut stream).await {
            Ok(Reply::Event { event }) => Some((Ok(event), Some(stream))),
            Ok(other) => Some((Err(unexpected(&other)), None)),
            Err(e) => Some((Err(e), None)),
        }
    })
    .boxed()
}

/// What a process produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    Stdout(Bytes),
    Stderr(Bytes),
    Exit(ExitStatus),
}

/// A running exec or attach. Dropping it (both halves, after [`ExecSession::split`])
/// before the exit is seen abandons the stream: for a non-detached exec the agent then
/// kills the process group.
pub struct ExecSession {
    pid: u32,
    input: ExecInputHandle,
    events: ExecEvents,
}

impl ExecSession {
    fn new(stream: FramedStream, reply: Reply, detached: bool) -> Result<Self, AgentError> {
        let Reply::Started { pid } = reply else {
            return Err(unexpected(&reply));
        };
        // Input and output may be used from different tasks: hand the stream to a pump.
        // Dropping every handle drops the stream, which the agent sees as abandonment.
        let (tx, rx) = duplex(stream, OnSendersDropped::KeepOpen);
        let input = ExecInputHandle { tx };
        Ok(ExecSession { pid, input, events: ExecEvents { rx, detached, done: false } })
    }

    /// The process id in the sandbox (0 when the program could not be executed).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// A handle to send input; clones may be used from other tasks.
    pub fn input(&self) -> ExecInputHandle {
        self.input.clone()
    }

    /// The next output or the exit; `Ok(None)` after the exit (or, for a detached exec,
    /// right away).
    pub async fn next_event(&mut self) -> Result<Option<ExecEvent>, AgentError> {
        self.events.next_event().await
    }

    /// Separates input and output, e.g. for the two directions of a WebSocket bridge.
    pub fn split(self) -> (ExecInputHandle, ExecEvents) {
        (self.input, self.events)
    }

    /// Collects all output until the exit, keeping at most `limit` bytes per channel
    /// (the rest is read and dropped; `truncated` says so).
    pub async fn wait_with_output(mut self, limit: usize) -> Result<ExecOutput, AgentError> {
        let mut output = ExecOutput::default();
        loop {
            let (buf, data) = match self.next_event().await?.ok_or(AgentError::Closed)? {
                ExecEvent::Stdout(data) => (&mut output.stdout, data),
                ExecEvent::Stderr(data) => (&mut output.stderr, data),
                ExecEvent::Exit(status) => {
                    output.status = status;
                    return Ok(output);
                }
            };
            let room = limit.saturating_sub(buf.len());
            output.truncated |= data.len() > room;
            buf.extend_from_slice(&data[..data.len().min(room)]);
        }
    }
}

/// Everything an exec produced (see [`ExecSession::wait_with_output`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub status: ExitStatus,
    pub truncated: bool,
}

/// The output half of an [`ExecSession`].
pub struct ExecEvents {
    rx: FrameReceiver,
    detached: bool,
    done: bool,
}

impl ExecEvents {
    /// See [`ExecSession::next_event`].
    pub async fn next_event(&mut self) -> Result<Option<ExecEvent>, AgentError> {
        if self.done {
            return Ok(None);
        }
        let Some(frame) = self.rx.recv().await.transpose()? else {
            self.done = true;
            return if self.detached { Ok(None) } else { Err(AgentError::Closed) };
        };
        let event = match frame {
            Frame::Data(DataChannel::Stdout, data) => ExecEvent::Stdout(data),
            Frame::Data(DataChannel::Stderr, data) => ExecEvent::Stderr(data),
            Frame::Data(channel, _) => {
                return self.fail(AgentError::Protocol(format!("unexpected {channel:?} data")));
            }
            Frame::Message(_) => match reply_of(&frame) {
                Ok(Reply::Exited { status }) => {
                    self.done = true;
                    ExecEvent::Exit(status)
                }
                Ok(other) => return self.fail(unexpected(&other)),
                Err(e) => return self.fail(e),
            },
        };
        Ok(Some(event))
    }

    /// Ends the session with `err`: after a protocol violation nothing more is trusted.
    fn fail(&mut self, err: AgentError) -> Result<Option<ExecEvent>, AgentError> {
        self.done = true;
        Err(err)
    }
}

/// Sends stdin, EOF, signals and resizes to an exec or attach stream. Cloneable; sends
/// are queued (bounded) and fail with [`AgentError::Closed`] once the stream is gone.
#[derive(Clone)]
pub struct ExecInputHandle {
    tx: FrameSender,
}

impl ExecInputHandle {
    /// Writes to the process's stdin (or terminal). Needs `ExecSpec::stdin` or a tty.
    pub async fn send_stdin(&self, data: Bytes) -> Result<(), AgentError> {
        for piece in pieces(data) {
            self.tx.send(Frame::Data(DataChannel::Stdin, piece)).await.map_err(|_| AgentError::Closed)?;
        }
        Ok(())
    }

    /// Ends stdin (on a terminal: types ^D).
    pub async fn close_stdin(&self) -> Result<(), AgentError> {
        self.send(&ExecInput::Eof).await
    }

    /// Signals the process (not its group).
    pub async fn signal(&self, signal: i32) -> Result<(), AgentError> {
        self.send(&ExecInput::Signal { signal }).await
    }

    /// Resizes the terminal of a tty exec.
    pub async fn resize(&self, size: PtySize) -> Result<(), AgentError> {
        self.send(&ExecInput::Resize(size)).await
    }

    async fn send(&self, input: &ExecInput) -> Result<(), AgentError> {
        let frame = Frame::message(input)?;
        self.tx.send(frame).await.map_err(|_| AgentError::Closed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_split_into_chunks() {
        let data = Bytes::from(vec![7u8; DATA_CHUNK * 2 + 5]);
        let sizes: Vec<_> = pieces(data).map(|p| p.len()).collect();
        assert_eq!(sizes, vec![DATA_CHUNK, DATA_CHUNK, 5]);
        assert_eq!(pieces(Bytes::new()).count(), 0);
    }

    #[test]
    fn remote_messages_are_truncated_on_a_char_boundary() {
        let err = remote(ErrorKind::Other, "é".repeat(MAX_REMOTE_MESSAGE));
        let AgentError::Remote { message, .. } = err else { panic!("not remote") };
        assert!(message.len() <= MAX_REMOTE_MESSAGE + '…'.len_utf8());
    }

    /// A fake agent that answers every stream with `frames`, to check that hostile
    /// replies become errors.
    async fn fake_agent(frames: Vec<Frame>) -> AgentClient {
        let (a, mut b) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            handshake(&mut b, "fake").await.ok()?;
            crate::mux::serve(b, move |mut s| {
                let frames = frames.clone();
                async move {
                    let _ = next_frame(&mut s).await;
                    for frame in frames {
                        let _ = s.send(frame).await;
                    }
                    let _ = s.close().await;
                }
            })
            .await
            .ok()
        });
        AgentClient::connect(a).await.unwrap()
    }

    /// An agent of a build before file metadata would drop it: it is asked first and the
    /// upload refused before it starts.
    #[tokio::test]
    async fn metadata_is_not_sent_to_an_agent_that_would_drop_it() {
        let old = r#"{"type":"health","agent_version":"0.1.0","uptime_ms":5,"processes":0}"#;
        let client = fake_agent(vec![Frame::Message(Bytes::from_static(old.as_bytes()))]).await;
        let metadata = FileMetadata::from([("k".into(), "v".into())]);
        let refused =
            client.write_file_with_metadata("/f", None, metadata, futures::stream::empty()).await.unwrap_err();
        assert_eq!(refused.kind(), Some(ErrorKind::Unsupported));
        assert!(refused.to_string().contains("cannot store file metadata"), "{refused}");
    }

    #[tokio::test]
    async fn hostile_replies_are_errors_not_panics() {
        let client = fake_agent(vec![Frame::Message(Bytes::from_static(b"{\"type\":\"nope\"}"))]).await;
        assert!(matches!(client.health().await, Err(AgentError::Protocol(_))));
        let client = fake_agent(vec![Frame::message(&Reply::Ok).unwrap()]).await;
        assert!(matches!(client.health().await, Err(AgentError::Protocol(_))));
        let client = fake_agent(vec![]).await;
        assert!(matches!(client.stat("/").await, Err(AgentError::Closed)));
    }

    #[tokio::test]
    async fn downloads_never_exceed_the_announced_size() {
        let client = fake_agent(vec![
            Frame::message(&Reply::FileStart { size: 3 }).unwrap(),
            Frame::Data(DataChannel::File, Bytes::from_static(b"abcdef")),
        ])
        .await;
        let (size, mut chunks) = client.read_file("/x").await.unwrap();
        assert_eq!(size, 3);
        assert!(matches!(chunks.next().await, Some(Err(AgentError::Protocol(_)))));
        assert!(chunks.next().await.is_none());
    }

    #[tokio::test]
    async fn exec_stream_without_exit_is_closed() {
        let client = fake_agent(vec![
            Frame::message(&Reply::Started { pid: 5 }).unwrap(),
            Frame::Data(DataChannel::Stdout, Bytes::from_static(b"hi")),
        ])
        .await;
        let mut session = client.exec(ExecSpec { argv: vec!["x".into()], ..Default::default() }).await.unwrap();
        assert_eq!(session.pid(), 5);
        assert_eq!(session.next_event().await.unwrap(), Some(ExecEvent::Stdout(Bytes::from_static(b"hi"))));
        assert!(matches!(session.next_event().await, Err(AgentError::Closed)));
        assert!(matches!(session.next_event().await, Ok(None)));
    }
}
