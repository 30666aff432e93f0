//! Arbitrary bytes into the frame decoder, as if sent by a compromised sandbox: decoding
//! must never panic, must not depend on how the bytes are split into reads, and every
//! message frame is parsed as `Request`, `Reply`, `ExecInput` and `Hello`.
//! The property lives in `space_proto::fuzzing` so that a unit test runs it in CI too.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    space_proto::fuzzing::check_decoder(data);
});
