//! Chunks written on a thread of their own, so that writing one overlaps sealing the next
//! (sealing reads a stream, which only one thread can): on a machine with two cores a file is
//! encrypted in about the time of the slower of the two instead of their sum. Buffers come
//! back from the writer for reuse (a fresh 1 MiB buffer per chunk would be a page fault per
//! 4 KiB).

use std::fs::File;
use std::io::Write;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

/// Buffers in flight: the chunk being sealed, the one read ahead, and two being written.
const BUFFERS: usize = 4;

pub(super) struct Writer {
    full: SyncSender<Vec<u8>>,
    empty: Receiver<Vec<u8>>,
    thread: JoinHandle<std::io::Result<File>>,
}

impl Writer {
    /// Writes to `file` what [`Writer::write`] is given, in order.
    pub(super) fn start(file: File, buffer_len: usize) -> std::io::Result<Writer> {
        let (full, to_write) = sync_channel::<Vec<u8>>(BUFFERS);
        let (written, empty) = sync_channel::<Vec<u8>>(BUFFERS);
        for _ in 0..BUFFERS {
            written.send(Vec::with_capacity(buffer_len)).map_err(std::io::Error::other)?;
        }
        let thread = std::thread::Builder::new().name("space-keys-writer".into()).spawn(move || {
            let mut file = file;
            for buffer in to_write {
                file.write_all(&buffer)?;
                // The other end is gone once the last chunk is handed over.
                let _ = written.send(buffer);
            }
            Ok(file)
        })?;
        Ok(Writer { full, empty, thread })
    }

    /// An empty buffer (with room for a chunk) to fill; `None` once the writer has failed
    /// (see [`Writer::finish`]).
    pub(super) fn buffer(&self) -> Option<Vec<u8>> {
        let mut buffer = self.empty.recv().ok()?;
        buffer.clear();
        Some(buffer)
    }

    /// Hands `buffer` over to be written; `false` once the writer has failed.
    pub(super) fn write(&self, buffer: Vec<u8>) -> bool {
        self.full.send(buffer).is_ok()
    }

    /// Waits until everything handed over is written; the file, or the writer's error.
    pub(super) fn finish(self) -> std::io::Result<File> {
        drop(self.full);
        self.thread.join().map_err(|_| std::io::Error::other("the writing thread panicked"))?
    }
}
