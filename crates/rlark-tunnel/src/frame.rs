//! Mux frames, sans-IO: one frame per transport message (a WebSocket binary message).
//!
//! Layout, all integers big-endian:
//!
//! ```text
//! 0      u8   type
//! 1..5   u32  stream id
//! 5..    payload
//!   0 DATA    stream != 0, payload bytes (1 or more; the mux caps it at max_frame_payload)
//!   1 WINDOW  stream != 0, u32 credit (> 0: bytes the receiver consumed and grants again)
//!   2 OPEN    stream != 0, no payload (opener's id: client/agent odd, server/hub even)
//!   3 FIN     stream != 0, no payload (the sender will send no more DATA: half-close)
//!   4 RST     stream != 0, u8 code (0 cancel, 1 refused-limit, 2 protocol, 3 idle-timeout)
//!   5 PING    stream 0, u64 nonce
//!   6 PONG    stream 0, u64 nonce
//!   7 GOAWAY  stream 0, u8 code (0 normal, 1 protocol error; other values are accepted)
//! ```
//!
//! The encoding is canonical: whenever [`Frame::decode`] accepts a message, [`Frame::encode`]
//! of the result gives back exactly that message (the fuzz target `tunnel_frame` checks this).
//! Decoding is checked and never panics; the message length delimits the payload, so there is
//! no length field to disagree with.

use std::fmt;

use bytes::{BufMut, Bytes, BytesMut};

/// Bytes before the payload: type (1) + stream id (4).
pub const HEADER_LEN: usize = 5;

/// GOAWAY code: orderly shutdown.
pub const GOAWAY_NORMAL: u8 = 0;
/// GOAWAY code: the peer broke the protocol (bad frame, bad stream id).
pub const GOAWAY_PROTOCOL: u8 = 1;

/// The frame type byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameType {
    /// 0, DATA: stream bytes, spending the sender's credit on that stream.
    Data = 0,
    /// 1, WINDOW: the receiver grants the sender more credit on a stream.
    Window = 1,
    /// 2, OPEN: starts a new stream with the opener's id.
    Open = 2,
    /// 3, FIN: the sender's half of the stream is done (no more DATA from it).
    Fin = 3,
    /// 4, RST: aborts a stream in both directions, with an [`RstCode`].
    Rst = 4,
    /// 5, PING: keep-alive and round-trip probe on stream 0; the peer answers with PONG.
    Ping = 5,
    /// 6, PONG: the answer to a PING, echoing its nonce.
    Pong = 6,
    /// 7, GOAWAY: the sender is ending the session; no new streams are opened after it.
    GoAway = 7,
}

impl FrameType {
    /// The type for a wire byte, if known.
    pub fn from_u8(b: u8) -> Option<FrameType> {
        Some(match b {
            0 => FrameType::Data,
            1 => FrameType::Window,
            2 => FrameType::Open,
            3 => FrameType::Fin,
            4 => FrameType::Rst,
            5 => FrameType::Ping,
            6 => FrameType::Pong,
            7 => FrameType::GoAway,
            _ => return None,
        })
    }

    /// The upper-case wire name (`"DATA"`, `"GOAWAY"`, ...), as used in errors and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            FrameType::Data => "DATA",
            FrameType::Window => "WINDOW",
            FrameType::Open => "OPEN",
            FrameType::Fin => "FIN",
            FrameType::Rst => "RST",
            FrameType::Ping => "PING",
            FrameType::Pong => "PONG",
            FrameType::GoAway => "GOAWAY",
        }
    }

    /// Session frames (PING, PONG, GOAWAY) travel on stream 0; all others on a stream id != 0.
    pub fn is_session_frame(self) -> bool {
        matches!(self, FrameType::Ping | FrameType::Pong | FrameType::GoAway)
    }
}

impl fmt::Display for FrameType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a stream was reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RstCode {
    /// The application dropped the stream before it was fully closed.
    Cancel = 0,
    /// Refused: the receiver is at its concurrent-stream limit (or accepts no streams).
    RefusedLimit = 1,
    /// The stream broke the protocol (e.g. sent more than its credit).
    Protocol = 2,
    /// No DATA either way for the idle timeout.
    IdleTimeout = 3,
}

impl RstCode {
    /// The code for an RST payload byte; `None` for an unassigned value (a protocol error).
    pub fn from_u8(b: u8) -> Option<RstCode> {
        Some(match b {
            0 => RstCode::Cancel,
            1 => RstCode::RefusedLimit,
            2 => RstCode::Protocol,
            3 => RstCode::IdleTimeout,
            _ => return None,
        })
    }

    /// The lower-case name (`"cancel"`, `"refused-limit"`, ...), as used in errors and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            RstCode::Cancel => "cancel",
            RstCode::RefusedLimit => "refused-limit",
            RstCode::Protocol => "protocol",
            RstCode::IdleTimeout => "idle-timeout",
        }
    }
}

impl fmt::Display for RstCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One mux frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Stream bytes. DATA beyond the granted credit, or after FIN, is answered with
    /// RST [`RstCode::Protocol`].
    Data {
        /// The stream the bytes belong to (never 0).
        stream: u32,
        /// The bytes: at least one; the mux sends at most its `max_frame_payload`.
        payload: Bytes,
    },
    /// More credit for the peer: it may send `credit` more DATA bytes on `stream`.
    Window {
        /// The stream the credit is for (never 0).
        stream: u32,
        /// Bytes granted, added to the sender's remaining credit; never 0.
        credit: u32,
    },
    /// Opens a stream; both directions start with [`crate::mux::INITIAL_WINDOW`] credit.
    Open {
        /// The new id: odd when the agent (client) opens, even when the hub (server) does.
        stream: u32,
    },
    /// Half-close: the sender sends no more DATA on `stream` (it may still receive).
    Fin {
        /// The stream being half-closed (never 0).
        stream: u32,
    },
    /// Aborts a stream in both directions; data still queued for sending is dropped.
    Rst {
        /// The stream being reset (never 0).
        stream: u32,
        /// Why the stream was reset.
        code: RstCode,
    },
    /// Keep-alive and round-trip probe (stream 0); answered by a PONG with the same nonce.
    Ping {
        /// Chosen by the sender; echoed in the PONG so it can be matched to this PING.
        nonce: u64,
    },
    /// The answer to a PING (stream 0).
    Pong {
        /// The nonce of the PING being answered.
        nonce: u64,
    },
    /// The session is ending (stream 0): the receiver opens no more streams on it.
    GoAway {
        /// [`GOAWAY_NORMAL`] or [`GOAWAY_PROTOCOL`]; other values are accepted as they are.
        code: u8,
    },
}

/// A message that is not a valid frame.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The message is shorter than [`HEADER_LEN`].
    #[error("frame of {len} bytes is shorter than the {HEADER_LEN}-byte header")]
    Truncated {
        /// The message length in bytes.
        len: usize,
    },
    /// The type byte (carried here) is not one of [`FrameType`].
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    /// A fixed-size payload (WINDOW, OPEN, FIN, RST, PING, PONG, GOAWAY) has the wrong size.
    #[error("{kind} frame payload must be {expected} bytes, got {got}")]
    BadLength {
        /// The frame's type.
        kind: FrameType,
        /// The payload size that type requires, in bytes.
        expected: usize,
        /// The payload size received, in bytes.
        got: usize,
    },
    /// A DATA frame with no payload bytes.
    #[error("empty DATA frame")]
    EmptyData,
    /// A stream frame (of the carried type) on stream 0, which only session frames use.
    #[error("{0} frame on stream 0")]
    ZeroStream(FrameType),
    /// A session frame (PING, PONG, GOAWAY) on a stream id other than 0.
    #[error("{kind} frame must be on stream 0, got stream {stream}")]
    NonZeroStream {
        /// The frame's type.
        kind: FrameType,
        /// The stream id it carried.
        stream: u32,
    },
    /// The RST code byte (carried here) is not one of [`RstCode`].
    #[error("unknown RST code {0}")]
    UnknownRstCode(u8),
    /// A WINDOW frame granting 0 bytes.
    #[error("WINDOW frame with zero credit")]
    ZeroCredit,
}

/// Appends the 5-byte header of a frame to `dst`.
pub fn put_header(dst: &mut impl BufMut, kind: FrameType, stream: u32) {
    dst.put_u8(kind as u8);
    dst.put_u32(stream);
}

impl Frame {
    /// The type this frame encodes as.
    pub fn frame_type(&self) -> FrameType {
        match self {
            Frame::Data { .. } => FrameType::Data,
            Frame::Window { .. } => FrameType::Window,
            Frame::Open { .. } => FrameType::Open,
            Frame::Fin { .. } => FrameType::Fin,
            Frame::Rst { .. } => FrameType::Rst,
            Frame::Ping { .. } => FrameType::Ping,
            Frame::Pong { .. } => FrameType::Pong,
            Frame::GoAway { .. } => FrameType::GoAway,
        }
    }

    /// The stream id (0 for session frames).
    pub fn stream_id(&self) -> u32 {
        match self {
            Frame::Data { stream, .. }
            | Frame::Window { stream, .. }
            | Frame::Open { stream }
            | Frame::Fin { stream }
            | Frame::Rst { stream, .. } => *stream,
            Frame::Ping { .. } | Frame::Pong { .. } | Frame::GoAway { .. } => 0,
        }
    }

    /// Encoded size in bytes.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN
            + match self {
                Frame::Data { payload, .. } => payload.len(),
                Frame::Window { .. } => 4,
                Frame::Open { .. } | Frame::Fin { .. } => 0,
                Frame::Rst { .. } | Frame::GoAway { .. } => 1,
                Frame::Ping { .. } | Frame::Pong { .. } => 8,
            }
    }

    /// Appends the encoding to `dst`. Infallible: a frame that breaks the rules (DATA on
    /// stream 0, empty DATA, zero credit) encodes to a message that [`Frame::decode`] rejects.
    pub fn encode_into(&self, dst: &mut BytesMut) {
        dst.reserve(self.encoded_len());
        put_header(dst, self.frame_type(), self.stream_id());
        match self {
            Frame::Data { payload, .. } => dst.extend_from_slice(payload),
            Frame::Window { credit, .. } => dst.put_u32(*credit),
            Frame::Open { .. } | Frame::Fin { .. } => {}
            Frame::Rst { code, .. } => dst.put_u8(*code as u8),
            Frame::Ping { nonce } | Frame::Pong { nonce } => dst.put_u64(*nonce),
            Frame::GoAway { code } => dst.put_u8(*code),
        }
    }

    /// The frame as one transport message.
    pub fn encode(&self) -> Bytes {
        let mut buf = BytesMut::with_capacity(self.encoded_len());
        self.encode_into(&mut buf);
        buf.freeze()
    }

    /// Decodes one message (checked; never panics). A DATA payload is copied; see
    /// [`Frame::decode_bytes`] for the zero-copy variant.
    pub fn decode(msg: &[u8]) -> Result<Frame, FrameError> {
        Self::decode_with(msg, |range| Bytes::copy_from_slice(&msg[range]))
    }

    /// Decodes one message, the DATA payload sharing `msg`'s buffer (no copy).
    pub fn decode_bytes(msg: Bytes) -> Result<Frame, FrameError> {
        Self::decode_with(&msg, |range| msg.slice(range))
    }

    fn decode_with(
        msg: &[u8],
        payload_of: impl FnOnce(std::ops::Range<usize>) -> Bytes,
    ) -> Result<Frame, FrameError> {
        let (head, body) = match msg.split_first_chunk::<HEADER_LEN>() {
            Some(split) => split,
            None => return Err(FrameError::Truncated { len: msg.len() }),
        };
        let kind = FrameType::from_u8(head[0]).ok_or(FrameError::UnknownType(head[0]))?;
        let stream = u32::from_be_bytes([head[1], head[2], head[3], head[4]]);
        if kind.is_session_frame() {
            if stream != 0 {
                return Err(FrameError::NonZeroStream { kind, stream });
            }
        } else if stream == 0 {
            return Err(FrameError::ZeroStream(kind));
        }
        let exact = |expected: usize| -> Result<(), FrameError> {
            if body.len() == expected {
                Ok(())
            } else {
                Err(FrameError::BadLength {
                    kind,
                    expected,
                    got: body.len(),
                })
            }
        };
        Ok(match kind {
            FrameType::Data => {
                if body.is_empty() {
                    return Err(FrameError::EmptyData);
                }
                Frame::Data {
                    stream,
                    payload: payload_of(HEADER_LEN..msg.len()),
                }
            }
            FrameType::Window => {
                exact(4)?;
                let credit = body
                    .first_chunk::<4>()
                    .map_or(0, |b| u32::from_be_bytes(*b));
                if credit == 0 {
                    return Err(FrameError::ZeroCredit);
                }
                Frame::Window { stream, credit }
            }
            FrameType::Open => {
                exact(0)?;
                Frame::Open { stream }
            }
            FrameType::Fin => {
                exact(0)?;
                Frame::Fin { stream }
            }
            FrameType::Rst => {
                exact(1)?;
                let code = body[0];
                Frame::Rst {
                    stream,
                    code: RstCode::from_u8(code).ok_or(FrameError::UnknownRstCode(code))?,
                }
            }
            FrameType::Ping | FrameType::Pong => {
                exact(8)?;
                let nonce = body
                    .first_chunk::<8>()
                    .map_or(0, |b| u64::from_be_bytes(*b));
                if kind == FrameType::Ping {
                    Frame::Ping { nonce }
                } else {
                    Frame::Pong { nonce }
                }
            }
            FrameType::GoAway => {
                exact(1)?;
                Frame::GoAway { code: body[0] }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mutation::{Rng, mutate};

    fn samples() -> Vec<Frame> {
        vec![
            Frame::Data {
                stream: 1,
                payload: Bytes::from_static(b"x"),
            },
            Frame::Data {
                stream: u32::MAX,
                payload: Bytes::from(vec![0xa5; 70_000]),
            },
            Frame::Window {
                stream: 2,
                credit: 1,
            },
            Frame::Window {
                stream: 7,
                credit: u32::MAX,
            },
            Frame::Open { stream: 3 },
            Frame::Fin { stream: 4 },
            Frame::Rst {
                stream: 5,
                code: RstCode::Cancel,
            },
            Frame::Rst {
                stream: 5,
                code: RstCode::RefusedLimit,
            },
            Frame::Rst {
                stream: 6,
                code: RstCode::Protocol,
            },
            Frame::Rst {
                stream: 6,
                code: RstCode::IdleTimeout,
            },
            Frame::Ping { nonce: 0 },
            Frame::Ping { nonce: u64::MAX },
            Frame::Pong {
                nonce: 0x0102_0304_0506_0708,
            },
            Frame::GoAway {
                code: GOAWAY_NORMAL,
            },
            Frame::GoAway {
                code: GOAWAY_PROTOCOL,
            },
            Frame::GoAway { code: 200 },
        ]
    }

    #[test]
    fn roundtrip_every_type() {
        for f in samples() {
            let enc = f.encode();
            assert_eq!(enc.len(), f.encoded_len(), "{f:?}");
            assert_eq!(Frame::decode(&enc).unwrap(), f);
            assert_eq!(Frame::decode_bytes(enc.clone()).unwrap(), f);
            assert_eq!(enc[0], f.frame_type() as u8);
            assert_eq!(&enc[1..5], &f.stream_id().to_be_bytes());
        }
    }

    #[test]
    fn exact_wire_bytes() {
        assert_eq!(
            &Frame::Data {
                stream: 0x0102_0304,
                payload: Bytes::from_static(b"hi"),
            }
            .encode()[..],
            &[0, 1, 2, 3, 4, b'h', b'i']
        );
        assert_eq!(
            &Frame::Window {
                stream: 9,
                credit: 0x0a0b_0c0d
            }
            .encode()[..],
            &[1, 0, 0, 0, 9, 0x0a, 0x0b, 0x0c, 0x0d]
        );
        assert_eq!(&Frame::Open { stream: 1 }.encode()[..], &[2, 0, 0, 0, 1]);
        assert_eq!(&Frame::Fin { stream: 2 }.encode()[..], &[3, 0, 0, 0, 2]);
        assert_eq!(
            &Frame::Rst {
                stream: 3,
                code: RstCode::IdleTimeout
            }
            .encode()[..],
            &[4, 0, 0, 0, 3, 3]
        );
        assert_eq!(
            &Frame::Ping { nonce: 258 }.encode()[..],
            &[5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2]
        );
        assert_eq!(
            &Frame::Pong { nonce: 1 }.encode()[..],
            &[6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]
        );
        assert_eq!(&Frame::GoAway { code: 1 }.encode()[..], &[7, 0, 0, 0, 0, 1]);
    }

    #[test]
    fn decode_bytes_shares_the_buffer() {
        let enc = Frame::Data {
            stream: 1,
            payload: Bytes::from(vec![7u8; 1000]),
        }
        .encode();
        let base = enc.as_ptr() as usize;
        match Frame::decode_bytes(enc).unwrap() {
            Frame::Data { payload, .. } => {
                assert_eq!(payload.as_ptr() as usize, base + HEADER_LEN);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn error_paths() {
        use FrameError::*;
        let cases: Vec<(&[u8], FrameError)> = vec![
            (&[], Truncated { len: 0 }),
            (&[0, 0, 0, 1], Truncated { len: 4 }),
            (&[8, 0, 0, 0, 1], UnknownType(8)),
            (&[255, 0, 0, 0, 0], UnknownType(255)),
            (&[0, 0, 0, 0, 1], EmptyData),
            (&[0, 0, 0, 0, 0, 1], ZeroStream(FrameType::Data)),
            (&[1, 0, 0, 0, 0, 0, 0, 0, 1], ZeroStream(FrameType::Window)),
            (&[2, 0, 0, 0, 0], ZeroStream(FrameType::Open)),
            (&[3, 0, 0, 0, 0], ZeroStream(FrameType::Fin)),
            (&[4, 0, 0, 0, 0, 0], ZeroStream(FrameType::Rst)),
            (
                &[1, 0, 0, 0, 1, 0, 0, 1],
                BadLength {
                    kind: FrameType::Window,
                    expected: 4,
                    got: 3,
                },
            ),
            (
                &[1, 0, 0, 0, 1, 0, 0, 0, 1, 0],
                BadLength {
                    kind: FrameType::Window,
                    expected: 4,
                    got: 5,
                },
            ),
            (&[1, 0, 0, 0, 1, 0, 0, 0, 0], ZeroCredit),
            (
                &[2, 0, 0, 0, 1, 0],
                BadLength {
                    kind: FrameType::Open,
                    expected: 0,
                    got: 1,
                },
            ),
            (
                &[3, 0, 0, 0, 1, 9, 9],
                BadLength {
                    kind: FrameType::Fin,
                    expected: 0,
                    got: 2,
                },
            ),
            (
                &[4, 0, 0, 0, 1],
                BadLength {
                    kind: FrameType::Rst,
                    expected: 1,
                    got: 0,
                },
            ),
            (
                &[4, 0, 0, 0, 1, 0, 0],
                BadLength {
                    kind: FrameType::Rst,
                    expected: 1,
                    got: 2,
                },
            ),
            (&[4, 0, 0, 0, 1, 4], UnknownRstCode(4)),
            (
                &[5, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0],
                NonZeroStream {
                    kind: FrameType::Ping,
                    stream: 1,
                },
            ),
            (
                &[5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                BadLength {
                    kind: FrameType::Ping,
                    expected: 8,
                    got: 7,
                },
            ),
            (
                &[6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                BadLength {
                    kind: FrameType::Pong,
                    expected: 8,
                    got: 9,
                },
            ),
            (
                &[6, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                NonZeroStream {
                    kind: FrameType::Pong,
                    stream: 0x8000_0000,
                },
            ),
            (
                &[7, 0, 0, 0, 2, 0],
                NonZeroStream {
                    kind: FrameType::GoAway,
                    stream: 2,
                },
            ),
            (
                &[7, 0, 0, 0, 0],
                BadLength {
                    kind: FrameType::GoAway,
                    expected: 1,
                    got: 0,
                },
            ),
        ];
        for (msg, want) in cases {
            assert_eq!(Frame::decode(msg), Err(want.clone()), "{msg:?}");
            assert_eq!(
                Frame::decode_bytes(Bytes::copy_from_slice(msg)),
                Err(want.clone())
            );
            assert!(!want.to_string().is_empty());
        }
    }

    /// Mutates valid encodings (bit flips, byte sets, truncation, extension, splices) and
    /// checks: decode never panics, and whatever decodes re-encodes to the same bytes.
    #[test]
    fn mutation_loop_never_panics_and_is_canonical() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let encoded: Vec<Vec<u8>> = samples()
            .iter()
            .map(|f| {
                let mut v = f.encode().to_vec();
                v.truncate(64);
                v
            })
            .collect();
        let seeds: Vec<&[u8]> = encoded.iter().map(Vec::as_slice).collect();
        let mut accepted = 0usize;
        for _ in 0..200_000 {
            let mut msg = seeds[rng.below(seeds.len())].to_vec();
            // Small type bytes are the interesting ones.
            mutate(&mut rng, &mut msg, &seeds, |rng, msg| {
                msg[0] = rng.below(10) as u8
            });
            let a = Frame::decode(&msg);
            let b = Frame::decode_bytes(Bytes::copy_from_slice(&msg));
            assert_eq!(a, b);
            if let Ok(f) = a {
                accepted += 1;
                assert_eq!(&f.encode()[..], &msg[..]);
            }
        }
        assert!(accepted > 1000, "mutations should produce valid frames too");
    }

    #[test]
    fn names() {
        for b in 0..=255u8 {
            if let Some(t) = FrameType::from_u8(b) {
                assert_eq!(t as u8, b);
                assert!(!t.to_string().is_empty());
            }
            if let Some(c) = RstCode::from_u8(b) {
                assert_eq!(c as u8, b);
                assert!(!c.to_string().is_empty());
            }
        }
        assert!(FrameType::Ping.is_session_frame());
        assert!(!FrameType::Data.is_session_frame());
    }
}
