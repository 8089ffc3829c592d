//! SPDY/3.1, the framing `kubectl port-forward` speaks (over an HTTP `Upgrade: SPDY/3.1`
//! or inside WebSocket binary messages), as a sans-IO codec: [`frame`] (bytes ↔
//! [`Frame`]s), [`header_block`] (name/value blocks and their per-direction zlib
//! compression), [`dictionary`] (the protocol's zlib dictionary).
//!
//! Only what a port-forward server needs is interpreted; flow control is left to the
//! caller, which for kubectl means ignoring it (see `docs/tunnel.md`).

pub mod dictionary;
pub mod frame;
pub mod header_block;

pub use frame::{Decoder, Encoder, Frame, Limits};
pub use header_block::Headers;

/// Why bytes from a peer are not SPDY/3.1 this codec accepts, or a frame cannot be encoded.
/// Every decoding error is final for the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpdyError {
    /// A control frame's version field (carried here) is not 3.
    #[error("SPDY version {0} is not supported (only 3)")]
    UnsupportedVersion(u16),
    /// A frame's length field exceeds the decoder's [`Limits`], or an encoded payload
    /// does not fit the 24-bit length field.
    #[error("SPDY frame of {len} bytes; at most {max} are allowed")]
    FrameTooLarge {
        /// The payload length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// A frame's fixed fields do not fit its length, or hold a forbidden value.
    #[error("malformed SPDY {frame} frame: {reason}")]
    Malformed {
        /// The frame type's name (`SYN_STREAM`, `DATA`, ...).
        frame: &'static str,
        /// What is wrong (`stream id 0`, `payload too short`, ...).
        reason: String,
    },
    /// The zlib stream of header blocks is corrupt, or cannot be set up.
    #[error("SPDY header compression: {0}")]
    Compression(String),
    /// A decompressed header block is not a valid name/value block.
    #[error("SPDY header block: {0}")]
    HeaderBlock(String),
}

/// The property the `spdy_frame` fuzz target checks, here so that `cargo test` runs it
/// on fixed inputs too: decoding arbitrary bytes never panics and ends (every frame
/// consumes input), and every decoded frame but [`Frame::Unknown`] re-encodes and decodes
/// to itself through a fresh encoder/decoder pair.
pub fn fuzz_decode(data: &[u8]) {
    let mut decoder = Decoder::default();
    decoder.push(data);
    let mut frames = Vec::new();
    while let Ok(Some(frame)) = decoder.next_frame() {
        frames.push(frame);
    }
    let Ok(mut encoder) = Encoder::new() else {
        return;
    };
    let mut wire = Vec::new();
    let kept: Vec<Frame> = frames
        .into_iter()
        .filter(|f| !matches!(f, Frame::Unknown { .. }))
        // Reserved bits and the slot are not kept; priority keeps its 3 bits.
        .filter(|f| encoder.encode(f, &mut wire).is_ok())
        .collect();
    let mut again = Decoder::new(Limits {
        max_data: frame::MAX_WIRE_LENGTH,
        max_control: frame::MAX_WIRE_LENGTH,
    });
    again.push(&wire);
    for frame in kept {
        assert_eq!(again.next_frame().ok().flatten(), Some(frame));
    }
    assert_eq!(again.buffered(), 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuzz_property_on_fixed_inputs() {
        let mut encoder = Encoder::new().unwrap();
        let mut wire = Vec::new();
        for (id, kind) in [(1, "error"), (3, "data")] {
            let frame = Frame::SynStream {
                stream_id: id,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: Headers(vec![
                    ("streamtype".into(), kind.into()),
                    ("port".into(), "80".into()),
                ]),
            };
            encoder.encode(&frame, &mut wire).unwrap();
        }
        encoder
            .encode(
                &Frame::Data {
                    stream_id: 3,
                    flags: 1,
                    data: bytes::Bytes::from_static(b"x"),
                },
                &mut wire,
            )
            .unwrap();
        fuzz_decode(&wire);
        // Every truncation and a flipped byte at every position: no panic, always ends.
        for cut in 0..wire.len() {
            fuzz_decode(&wire[..cut]);
            let mut flipped = wire.clone();
            flipped[cut] ^= 0x5a;
            fuzz_decode(&flipped);
        }
        fuzz_decode(&[]);
        fuzz_decode(&[0x80, 3, 0, 10, 0, 0, 0, 0]);
    }
}
