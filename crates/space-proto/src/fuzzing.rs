//! The decoder property checked by the `frame_decoder` fuzz target (`fuzz/`, nightly,
//! not in CI) and, over deterministic pseudo-random inputs, by this module's unit test.
//!
//! For any bytes: decoding never panics; splitting the input into arbitrary pieces does
//! not change the frames decoded or whether decoding fails; every decoded frame survives
//! an encode/decode round trip; and parsing each message frame as any message type
//! returns (an error) rather than panicking.

use bytes::BytesMut;
use tokio_util::codec::{Decoder, Encoder};

use crate::codec::{Frame, FrameCodec};
use crate::messages::{ExecInput, Reply, Request};
use crate::mux::Hello;

/// Frames decoded from `data` fed `step` bytes at a time, and whether decoding failed.
fn decode(data: &[u8], step: usize) -> (Vec<Frame>, bool) {
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    for piece in data.chunks(step.max(1)) {
        buf.extend_from_slice(piece);
        loop {
            match FrameCodec.decode(&mut buf) {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => break,
                // The stream is unusable after an error; a real reader stops here too.
                Err(_) => return (frames, true),
            }
        }
    }
    (frames, false)
}

/// Checks the property for one input. The first byte chooses the piece size.
pub fn check_decoder(data: &[u8]) {
    let Some((&step, rest)) = data.split_first() else {
        return;
    };
    let whole = decode(rest, rest.len());
    let pieces = decode(rest, usize::from(step));
    assert_eq!(whole, pieces, "feeding the input in pieces changed the result");
    for frame in whole.0 {
        if let Frame::Message(_) = &frame {
            let _ = frame.parse::<Request>();
            let _ = frame.parse::<Reply>();
            let _ = frame.parse::<ExecInput>();
            let _ = frame.parse::<Hello>();
        }
        let mut buf = BytesMut::new();
        FrameCodec.encode(frame.clone(), &mut buf).expect("a decoded frame encodes");
        let again = FrameCodec.decode(&mut buf).expect("re-decodes").expect("complete");
        assert_eq!(again, frame, "round trip changed the frame");
        assert!(buf.is_empty(), "round trip left bytes behind");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::DataChannel;
    use crate::messages::{ExecSpec, PtySize};

    /// xorshift64*: deterministic, no dependencies.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    /// Valid frames to start from, so mutations reach the JSON parsers, not just the header.
    fn seeds() -> Vec<Vec<u8>> {
        let frames = vec![
            Frame::message(&Request::Exec(ExecSpec {
                argv: vec!["sh".into(), "-c".into(), "echo hi".into()],
                tty: Some(PtySize { rows: 24, cols: 80 }),
                ..Default::default()
            }))
            .unwrap(),
            Frame::message(&Request::WriteFile {
                path: "/tmp/x".into(),
                mode: Some(0o644),
                metadata: Default::default(),
            })
            .unwrap(),
            Frame::message(&Reply::Exited { status: Default::default() }).unwrap(),
            Frame::message(&Reply::error(crate::messages::ErrorKind::NotFound, "nope")).unwrap(),
            Frame::message(&ExecInput::Resize(PtySize { rows: 1, cols: 2 })).unwrap(),
            Frame::message(&Hello { protocol: 1, agent: "spaced".into() }).unwrap(),
            Frame::Data(DataChannel::Stdout, bytes::Bytes::from_static(b"output")),
        ];
        frames
            .into_iter()
            .map(|frame| {
                let mut buf = BytesMut::new();
                FrameCodec.encode(frame, &mut buf).unwrap();
                buf.to_vec()
            })
            .collect()
    }

    /// One input: a few seed frames concatenated, then random mutations.
    fn input(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
        let mut data = vec![rng.next() as u8];
        for _ in 0..=rng.below(3) {
            data.extend_from_slice(&seeds[rng.below(seeds.len())]);
        }
        for _ in 0..rng.below(6) {
            let at = rng.below(data.len());
            match rng.below(4) {
                0 => data[at] = rng.next() as u8,
                1 => data.insert(at, rng.next() as u8),
                2 => data.truncate(at.max(1)),
                _ => data.extend((0..rng.below(32)).map(|_| rng.next() as u8)),
            }
        }
        data
    }

    #[test]
    fn decoder_survives_pseudo_random_input() {
        let mut rng = Rng(0x5eed_f00d_5ace);
        let seeds = seeds();
        for _ in 0..5000 {
            check_decoder(&input(&mut rng, &seeds));
        }
        // Pure noise too.
        for _ in 0..2000 {
            let len = rng.below(64);
            let noise: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            check_decoder(&noise);
        }
    }
}
