//! The protocol between the node and `spaced`, the daemon that runs as pid 1 of every sandbox.
//!
//! Layers, bottom up:
//! 1. any byte stream (a unix socket for linux sandboxes, virtio-serial for VMs);
//! 2. a [`handshake`]: both sides send a [`Hello`] frame and check the protocol version;
//! 3. [`mux`]: yamux streams over the byte stream (flow control per stream, so one slow
//!    download never stalls another exec);
//! 4. on each stream, [`codec::Frame`]s: typed JSON [`messages`] and raw data chunks;
//! 5. [`client::AgentClient`]: the node's typed client on top.
//!
//! A stream must only be polled by one task (see [`duplex`], which gives several tasks
//! channels to one stream instead).
//!
//! Each operation opens one stream: the client sends a [`messages::Request`] first, then
//! operation-specific frames. Everything the sandbox sends is hostile input: the decoder
//! bounds every length and never panics (see `fuzz/` and the `fuzzing` module).

pub mod client;
pub mod codec;
pub mod duplex;
pub mod file_metadata;
#[doc(hidden)]
pub mod fuzzing;
pub mod messages;
pub mod mux;
mod stream;

pub use client::{
    AgentClient, AgentError, AgentHealth, ExecEvent, ExecEvents, ExecInputHandle, ExecOutput, ExecSession, FileChunks,
    WatchEvents,
};
pub use codec::{DataChannel, Frame, FrameCodec, FrameError};
pub use duplex::{FrameReceiver, FrameSender, OnSendersDropped, duplex};
pub use file_metadata::FileMetadata;
pub use messages::*;
pub use mux::{FramedStream, Hello, MuxClient, MuxError, PROTOCOL_VERSION, handshake, next_frame, send_message, serve};
pub use stream::MuxStream;
