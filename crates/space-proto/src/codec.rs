//! Per-stream framing: `kind:u8 channel:u8 len:u32le payload[len]`.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{Serialize, de::DeserializeOwned};
use tokio_util::codec::{Decoder, Encoder};

/// Largest JSON message accepted (requests, replies, directory listings).
pub const MAX_MESSAGE_LEN: usize = 4 * 1024 * 1024;
/// Largest data chunk accepted; senders use [`DATA_CHUNK`].
pub const MAX_DATA_LEN: usize = 1024 * 1024;
/// Size of the data chunks the platform sends.
pub const DATA_CHUNK: usize = 64 * 1024;

const HEADER_LEN: usize = 6;
const KIND_MESSAGE: u8 = 0;
const KIND_DATA: u8 = 1;

/// Which byte stream a data frame belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum DataChannel {
    Stdin = 0,
    Stdout = 1,
    Stderr = 2,
    /// File contents (upload or download).
    File = 3,
}

impl DataChannel {
    fn from_u8(value: u8) -> Option<Self> {
        match value {
            0 => Some(Self::Stdin),
            1 => Some(Self::Stdout),
            2 => Some(Self::Stderr),
            3 => Some(Self::File),
            _ => None,
        }
    }
}

/// One unit on a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A JSON-encoded message ([`crate::messages`]).
    Message(Bytes),
    /// Raw bytes of one channel.
    Data(DataChannel, Bytes),
}

impl Frame {
    /// Encodes a typed message into a frame.
    pub fn message<T: Serialize>(value: &T) -> Result<Self, FrameError> {
        let json = serde_json::to_vec(value).map_err(|e| FrameError::Json(e.to_string()))?;
        Ok(Frame::Message(Bytes::from(json)))
    }

    /// Decodes this frame as a typed message; data frames are an error.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, FrameError> {
        match self {
            Frame::Message(bytes) => serde_json::from_slice(bytes).map_err(|e| FrameError::Json(e.to_string())),
            Frame::Data(..) => Err(FrameError::UnexpectedData),
        }
    }
}

/// Why a frame could not be decoded or encoded.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("unknown data channel {0}")]
    UnknownChannel(u8),
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    TooLong { len: usize, max: usize },
    #[error("malformed message: {0}")]
    Json(String),
    #[error("expected a message, got data")]
    UnexpectedData,
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// tokio-util codec for [`Frame`].
#[derive(Debug, Default, Clone, Copy)]
pub struct FrameCodec;

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        if src.len() < HEADER_LEN {
            return Ok(None);
        }
        let kind = src[0];
        let channel = src[1];
        let len = u32::from_le_bytes([src[2], src[3], src[4], src[5]]) as usize;
        let max = match kind {
            KIND_MESSAGE => MAX_MESSAGE_LEN,
            KIND_DATA => MAX_DATA_LEN,
            other => return Err(FrameError::UnknownKind(other)),
        };
        if len > max {
            return Err(FrameError::TooLong { len, max });
        }
        let data_channel = if kind == KIND_DATA {
            Some(DataChannel::from_u8(channel).ok_or(FrameError::UnknownChannel(channel))?)
        } else {
            None
        };
        if src.len() < HEADER_LEN + len {
            src.reserve(HEADER_LEN + len - src.len());
            return Ok(None);
        }
        src.advance(HEADER_LEN);
        let payload = src.split_to(len).freeze();
        Ok(Some(match data_channel {
            Some(ch) => Frame::Data(ch, payload),
            None => Frame::Message(payload),
        }))
    }
}

impl Encoder<Frame> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), FrameError> {
        let (kind, channel, payload, max) = match frame {
            Frame::Message(p) => (KIND_MESSAGE, 0, p, MAX_MESSAGE_LEN),
            Frame::Data(ch, p) => (KIND_DATA, ch as u8, p, MAX_DATA_LEN),
        };
        if payload.len() > max {
            return Err(FrameError::TooLong { len: payload.len(), max });
        }
        dst.reserve(HEADER_LEN + payload.len());
        dst.put_u8(kind);
        dst.put_u8(channel);
        dst.put_u32_le(payload.len() as u32);
        dst.extend_from_slice(&payload);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(frame: Frame) -> Frame {
        let mut buf = BytesMut::new();
        FrameCodec.encode(frame, &mut buf).unwrap();
        FrameCodec.decode(&mut buf).unwrap().unwrap()
    }

    #[test]
    fn frames_roundtrip() {
        let data = Frame::Data(DataChannel::Stderr, Bytes::from_static(b"oops"));
        assert_eq!(roundtrip(data.clone()), data);
        let msg = Frame::Message(Bytes::from_static(b"{}"));
        assert_eq!(roundtrip(msg.clone()), msg);
    }

    #[test]
    fn partial_input_waits_for_more() {
        let mut buf = BytesMut::new();
        FrameCodec.encode(Frame::Data(DataChannel::Stdout, Bytes::from_static(b"hello")), &mut buf).unwrap();
        let mut partial = BytesMut::from(&buf[..8]);
        assert!(FrameCodec.decode(&mut partial).unwrap().is_none());
    }

    #[test]
    fn hostile_lengths_and_kinds_are_rejected() {
        let mut huge = BytesMut::from(&[KIND_DATA, 1, 0xff, 0xff, 0xff, 0xff][..]);
        assert!(matches!(FrameCodec.decode(&mut huge), Err(FrameError::TooLong { .. })));
        let mut kind = BytesMut::from(&[9u8, 0, 0, 0, 0, 0][..]);
        assert!(matches!(FrameCodec.decode(&mut kind), Err(FrameError::UnknownKind(9))));
        let mut chan = BytesMut::from(&[KIND_DATA, 7, 0, 0, 0, 0][..]);
        assert!(matches!(FrameCodec.decode(&mut chan), Err(FrameError::UnknownChannel(7))));
    }

    #[test]
    fn malformed_json_is_an_error_not_a_panic() {
        let frame = Frame::Message(Bytes::from_static(b"{\"type\":"));
        assert!(frame.parse::<crate::messages::Reply>().is_err());
    }
}
