//! SPDY/3.1 framing, sans IO: [`Decoder`] turns the bytes a peer sent into [`Frame`]s,
//! [`Encoder`] turns frames into bytes. Each owns its direction's header compression
//! ([`super::header_block`]), so a connection has exactly one of each.
//!
//! Wire format (all integers big-endian):
//!
//! ```text
//! control: |1| version (15) | type (16) | flags (8) | length (24) | payload
//! data:    |0| stream id (31)           | flags (8) | length (24) | payload
//! ```
//!
//! Every input is untrusted: lengths are checked against [`Limits`] before anything is
//! buffered beyond them, each frame type's fixed fields against its length, reserved bits
//! are ignored as the spec says, and stream ids of zero where one is required are errors.
//! Unknown control frame types are returned as [`Frame::Unknown`] (the spec says to ignore
//! them), never an error.

use bytes::{Buf, Bytes, BytesMut};

use super::SpdyError;
use super::header_block::{Deflater, Headers, Inflater};

/// The protocol version this codec speaks.
pub const VERSION: u16 = 3;
/// `FLAG_FIN` of SYN_STREAM, SYN_REPLY, HEADERS and DATA: the sender's last frame.
pub const FLAG_FIN: u8 = 0x01;
/// `FLAG_UNIDIRECTIONAL` of SYN_STREAM.
pub const FLAG_UNIDIRECTIONAL: u8 = 0x02;
/// Length of every frame header.
pub const HEADER_LEN: usize = 8;
/// The largest length the 24-bit field can carry.
pub const MAX_WIRE_LENGTH: usize = (1 << 24) - 1;

/// RST_STREAM status codes (SPDY/3.1 section 2.4.2).
pub mod rst {
    /// 1: the stream broke the protocol (e.g. a SYN_STREAM with headers the receiver
    /// cannot use).
    pub const PROTOCOL_ERROR: u32 = 1;
    /// 2: a frame arrived for a stream that is not active.
    pub const INVALID_STREAM: u32 = 2;
    /// 3: the stream was refused before any of it was processed; safe to retry.
    pub const REFUSED_STREAM: u32 = 3;
    /// 5: the stream is no longer needed.
    pub const CANCEL: u32 = 5;
    /// 6: the stream failed for a reason of the sender's own, not the protocol.
    pub const INTERNAL_ERROR: u32 = 6;
    /// 8: a SYN_STREAM reused the id of a stream that is still open.
    pub const STREAM_IN_USE: u32 = 8;
}

/// GOAWAY status codes.
pub mod goaway {
    /// 0: normal end of the session.
    pub const OK: u32 = 0;
    /// 1: the session ends because the peer broke the protocol.
    pub const PROTOCOL_ERROR: u32 = 1;
    /// 2: the session ends for a reason of the sender's own.
    pub const INTERNAL_ERROR: u32 = 2;
}

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const SETTINGS: u16 = 4;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const WINDOW_UPDATE: u16 = 9;

/// A 31-bit field: the top bit is reserved and ignored on receipt.
const ID_MASK: u32 = 0x7fff_ffff;

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// SYN_STREAM (type 1): opens a stream. kubectl port-forward opens two per forwarded
    /// connection, an `error` and a `data` stream, named by their headers.
    SynStream {
        /// The new stream's id (31 bits, not 0): odd when the client opens it.
        stream_id: u32,
        /// The stream this one is pushed in answer to (server push); 0 for none.
        associated_to: u32,
        /// 0 (highest) ..= 7.
        priority: u8,
        /// [`FLAG_FIN`] (the opener sends nothing more) and/or [`FLAG_UNIDIRECTIONAL`].
        flags: u8,
        /// The stream's headers, decompressed (for kubectl: `streamtype`, `port`,
        /// `requestid`).
        headers: Headers,
    },
    /// SYN_REPLY (type 2): the acceptor's answer to a SYN_STREAM, accepting the stream.
    SynReply {
        /// The stream being accepted (not 0).
        stream_id: u32,
        /// [`FLAG_FIN`] if the acceptor sends nothing more on the stream.
        flags: u8,
        /// The reply headers, decompressed.
        headers: Headers,
    },
    /// RST_STREAM (type 3): ends a stream abnormally, in both directions.
    RstStream {
        /// The stream being reset (not 0).
        stream_id: u32,
        /// Why: one of the [`rst`] codes.
        status: u32,
    },
    /// SETTINGS (type 4): session parameters (window size, stream limit, ...).
    Settings {
        /// 0x01 asks the receiver to clear settings it persisted for this peer.
        flags: u8,
        /// (flags, id, value) per entry; the id has 24 bits.
        entries: Vec<(u8, u32, u32)>,
    },
    /// PING (type 6): the receiver sends it back unchanged; a sender uses odd ids if it is
    /// the client, even ones if it is the server.
    Ping {
        /// Chosen by the sender; identifies the answer.
        id: u32,
    },
    /// GOAWAY (type 7): the sender ends the session and accepts no new streams.
    GoAway {
        /// The last stream opened by the receiver that the sender answered (SYN_REPLY or
        /// RST_STREAM); streams above it were not processed.
        last_good_stream_id: u32,
        /// Why: one of the [`goaway`] codes.
        status: u32,
    },
    /// HEADERS (type 8): more headers for an open stream.
    Headers {
        /// The stream the headers belong to (not 0).
        stream_id: u32,
        /// [`FLAG_FIN`] if the sender sends nothing more on the stream.
        flags: u8,
        /// The headers, decompressed.
        headers: Headers,
    },
    /// WINDOW_UPDATE (type 9): flow-control credit for the receiver of the frame.
    WindowUpdate {
        /// The stream the credit is for; 0 for the whole session (SPDY/3.1).
        stream_id: u32,
        /// Bytes granted: 1 ..= 2^31 - 1.
        delta: u32,
    },
    /// A data frame: stream bytes.
    Data {
        /// The stream the bytes belong to (not 0).
        stream_id: u32,
        /// [`FLAG_FIN`] if this is the sender's last frame on the stream.
        flags: u8,
        /// The payload, at most [`Limits::max_data`] bytes when decoded.
        data: Bytes,
    },
    /// A control frame of a type this codec does not know (CREDENTIAL, or a future one):
    /// to be ignored.
    Unknown {
        /// The control frame type from the header.
        kind: u16,
        /// The frame's flags byte.
        flags: u8,
    },
}

/// Size limits a [`Decoder`] enforces.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most payload bytes of one DATA frame.
    pub max_data: usize,
    /// Most payload bytes of one control frame (the compressed header block included).
    pub max_control: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // kubectl writes at most 32 KiB per frame (Go's io.Copy buffer).
            max_data: 1024 * 1024,
            max_control: 64 * 1024,
        }
    }
}

/// Bytes in, frames out.
#[derive(Debug)]
pub struct Decoder {
    buffer: BytesMut,
    inflater: Inflater,
    limits: Limits,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new(Limits::default())
    }
}

impl Decoder {
    /// A decoder for one direction of a new connection (empty buffer, fresh header
    /// decompression) that refuses frames over `limits`.
    pub fn new(limits: Limits) -> Decoder {
        Decoder {
            buffer: BytesMut::new(),
            inflater: Inflater::new(),
            limits,
        }
    }

    /// Append bytes received from the peer.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// Bytes buffered that do not yet form a whole frame.
    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }

    /// The next whole frame, `None` when more bytes are needed. An error is final: the
    /// stream position (and the header compression state) is lost, so the connection ends.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, SpdyError> {
        let Some(header) = self.buffer.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let header = *header;
        let length =
            usize::from(header[5]) << 16 | usize::from(header[6]) << 8 | usize::from(header[7]);
        let flags = header[4];
        let control = header[0] & 0x80 != 0;
        // Checked before waiting for the payload, so a peer cannot make us buffer more
        // than the limit by announcing a long frame.
        let max = if control {
            self.limits.max_control
        } else {
            self.limits.max_data
        };
        if length > max {
            return Err(SpdyError::FrameTooLarge { len: length, max });
        }
        if control {
            let version = u16::from_be_bytes([header[0], header[1]]) & 0x7fff;
            if version != VERSION {
                return Err(SpdyError::UnsupportedVersion(version));
            }
        }
        if self.buffer.len() < HEADER_LEN + length {
            return Ok(None);
        }
        self.buffer.advance(HEADER_LEN);
        let payload = self.buffer.split_to(length).freeze();
        if !control {
            let stream_id = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
            if stream_id == 0 {
                return Err(malformed("DATA", "stream id 0"));
            }
            return Ok(Some(Frame::Data {
                stream_id,
                flags,
                data: payload,
            }));
        }
        let kind = u16::from_be_bytes([header[2], header[3]]);
        self.control(kind, flags, payload).map(Some)
    }

    fn control(&mut self, kind: u16, flags: u8, payload: Bytes) -> Result<Frame, SpdyError> {
        let mut p = payload.as_ref();
        Ok(match kind {
            SYN_STREAM => {
                let stream_id = stream_id(&mut p, "SYN_STREAM")?;
                let associated_to = u32_of(&mut p, "SYN_STREAM")? & ID_MASK;
                let priority = u8_of(&mut p, "SYN_STREAM")? >> 5;
                let _slot = u8_of(&mut p, "SYN_STREAM")?;
                let headers = self.inflater.decompress(p)?;
                Frame::SynStream {
                    stream_id,
                    associated_to,
                    priority,
                    flags,
                    headers,
                }
            }
            SYN_REPLY => {
                let stream_id = stream_id(&mut p, "SYN_REPLY")?;
                let headers = self.inflater.decompress(p)?;
                Frame::SynReply {
                    stream_id,
                    flags,
                    headers,
                }
            }
            HEADERS => {
                let stream_id = stream_id(&mut p, "HEADERS")?;
                let headers = self.inflater.decompress(p)?;
                Frame::Headers {
                    stream_id,
                    flags,
                    headers,
                }
            }
            RST_STREAM => {
                exact(p, 8, "RST_STREAM")?;
                let stream_id = stream_id(&mut p, "RST_STREAM")?;
                let status = u32_of(&mut p, "RST_STREAM")?;
                Frame::RstStream { stream_id, status }
            }
            SETTINGS => {
                let count = u32_of(&mut p, "SETTINGS")? as usize;
                if count.checked_mul(8) != Some(p.len()) {
                    return Err(malformed(
                        "SETTINGS",
                        format!("{count} entries in {} bytes", p.len()),
                    ));
                }
                let mut entries = Vec::with_capacity(count);
                for _ in 0..count {
                    let word = u32_of(&mut p, "SETTINGS")?;
                    let value = u32_of(&mut p, "SETTINGS")?;
                    entries.push(((word >> 24) as u8, word & 0x00ff_ffff, value));
                }
                Frame::Settings { flags, entries }
            }
            PING => {
                exact(p, 4, "PING")?;
                Frame::Ping {
                    id: u32_of(&mut p, "PING")?,
                }
            }
            GOAWAY => {
                exact(p, 8, "GOAWAY")?;
                let last_good_stream_id = u32_of(&mut p, "GOAWAY")? & ID_MASK;
                let status = u32_of(&mut p, "GOAWAY")?;
                Frame::GoAway {
                    last_good_stream_id,
                    status,
                }
            }
            WINDOW_UPDATE => {
                exact(p, 8, "WINDOW_UPDATE")?;
                let stream_id = u32_of(&mut p, "WINDOW_UPDATE")? & ID_MASK;
                let delta = u32_of(&mut p, "WINDOW_UPDATE")? & ID_MASK;
                if delta == 0 {
                    return Err(malformed("WINDOW_UPDATE", "delta 0"));
                }
                Frame::WindowUpdate { stream_id, delta }
            }
            kind => Frame::Unknown { kind, flags },
        })
    }
}

fn malformed(frame: &'static str, reason: impl Into<String>) -> SpdyError {
    SpdyError::Malformed {
        frame,
        reason: reason.into(),
    }
}

fn exact(p: &[u8], len: usize, frame: &'static str) -> Result<(), SpdyError> {
    if p.len() != len {
        return Err(malformed(
            frame,
            format!("payload of {} bytes, not {len}", p.len()),
        ));
    }
    Ok(())
}

fn u8_of(p: &mut &[u8], frame: &'static str) -> Result<u8, SpdyError> {
    let Some((&byte, rest)) = p.split_first() else {
        return Err(malformed(frame, "payload too short"));
    };
    *p = rest;
    Ok(byte)
}

fn u32_of(p: &mut &[u8], frame: &'static str) -> Result<u32, SpdyError> {
    let Some((head, rest)) = p.split_first_chunk::<4>() else {
        return Err(malformed(frame, "payload too short"));
    };
    *p = rest;
    Ok(u32::from_be_bytes(*head))
}

/// A 31-bit stream id that must not be 0.
fn stream_id(p: &mut &[u8], frame: &'static str) -> Result<u32, SpdyError> {
    let id = u32_of(p, frame)? & ID_MASK;
    if id == 0 {
        return Err(malformed(frame, "stream id 0"));
    }
    Ok(id)
}

/// Frames in, bytes out.
#[derive(Debug)]
pub struct Encoder {
    deflater: Deflater,
}

impl Encoder {
    /// An encoder for one direction of a new connection (fresh header compression).
    /// Fails only if zlib cannot load the SPDY dictionary ([`SpdyError::Compression`]).
    pub fn new() -> Result<Encoder, SpdyError> {
        Ok(Encoder {
            deflater: Deflater::new()?,
        })
    }

    /// Append `frame`'s encoding to `out`. Errors: a payload longer than the 24-bit length
    /// field, a stream id over 31 bits, or a compression failure.
    pub fn encode(&mut self, frame: &Frame, out: &mut Vec<u8>) -> Result<(), SpdyError> {
        match frame {
            Frame::Data {
                stream_id,
                flags,
                data,
            } => {
                let id = checked_id(*stream_id)?;
                let len = checked_len(data.len())?;
                out.extend_from_slice(&id.to_be_bytes());
                out.push(*flags);
                out.extend_from_slice(&len);
                out.extend_from_slice(data);
                Ok(())
            }
            Frame::SynStream {
                stream_id,
                associated_to,
                priority,
                flags,
                headers,
            } => {
                let mut payload = Vec::new();
                payload.extend_from_slice(&checked_id(*stream_id)?.to_be_bytes());
                payload.extend_from_slice(&checked_id(*associated_to)?.to_be_bytes());
                payload.push((priority & 0x07) << 5);
                payload.push(0);
                payload.extend_from_slice(&self.deflater.compress(headers)?);
                control(out, SYN_STREAM, *flags, &payload)
            }
            Frame::SynReply {
                stream_id,
                flags,
                headers,
            } => {
                let mut payload = checked_id(*stream_id)?.to_be_bytes().to_vec();
                payload.extend_from_slice(&self.deflater.compress(headers)?);
                control(out, SYN_REPLY, *flags, &payload)
            }
            Frame::Headers {
                stream_id,
                flags,
                headers,
            } => {
                let mut payload = checked_id(*stream_id)?.to_be_bytes().to_vec();
                payload.extend_from_slice(&self.deflater.compress(headers)?);
                control(out, HEADERS, *flags, &payload)
            }
            Frame::RstStream { stream_id, status } => {
                let mut payload = checked_id(*stream_id)?.to_be_bytes().to_vec();
                payload.extend_from_slice(&status.to_be_bytes());
                control(out, RST_STREAM, 0, &payload)
            }
            Frame::Settings { flags, entries } => {
                let count = u32::try_from(entries.len())
                    .map_err(|_| malformed("SETTINGS", "too many entries"))?;
                let mut payload = count.to_be_bytes().to_vec();
                for (entry_flags, id, value) in entries {
                    if *id > 0x00ff_ffff {
                        return Err(malformed("SETTINGS", format!("id {id} over 24 bits")));
                    }
                    payload.extend_from_slice(&(u32::from(*entry_flags) << 24 | id).to_be_bytes());
                    payload.extend_from_slice(&value.to_be_bytes());
                }
                control(out, SETTINGS, *flags, &payload)
            }
            Frame::Ping { id } => control(out, PING, 0, &id.to_be_bytes()),
            Frame::GoAway {
                last_good_stream_id,
                status,
            } => {
                let mut payload = checked_id(*last_good_stream_id)?.to_be_bytes().to_vec();
                payload.extend_from_slice(&status.to_be_bytes());
                control(out, GOAWAY, 0, &payload)
            }
            Frame::WindowUpdate { stream_id, delta } => {
                let mut payload = checked_id(*stream_id)?.to_be_bytes().to_vec();
                payload.extend_from_slice(&checked_id(*delta)?.to_be_bytes());
                control(out, WINDOW_UPDATE, 0, &payload)
            }
            Frame::Unknown { kind, .. } => Err(malformed(
                "unknown",
                format!("control frame type {kind} cannot be encoded"),
            )),
        }
    }
}

fn checked_id(id: u32) -> Result<u32, SpdyError> {
    if id > ID_MASK {
        return Err(malformed("frame", format!("id {id} over 31 bits")));
    }
    Ok(id)
}

fn checked_len(len: usize) -> Result<[u8; 3], SpdyError> {
    if len > MAX_WIRE_LENGTH {
        return Err(SpdyError::FrameTooLarge {
            len,
            max: MAX_WIRE_LENGTH,
        });
    }
    let [_, a, b, c] = (len as u32).to_be_bytes();
    Ok([a, b, c])
}

fn control(out: &mut Vec<u8>, kind: u16, flags: u8, payload: &[u8]) -> Result<(), SpdyError> {
    let len = checked_len(payload.len())?;
    out.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.push(flags);
    out.extend_from_slice(&len);
    out.extend_from_slice(payload);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> Headers {
        Headers(
            pairs
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        )
    }

    fn every_kind() -> Vec<Frame> {
        vec![
            Frame::SynStream {
                stream_id: 1,
                associated_to: 0,
                priority: 7,
                flags: FLAG_FIN,
                headers: headers(&[("streamtype", "error"), ("port", "80"), ("requestid", "0")]),
            },
            Frame::SynReply {
                stream_id: 1,
                flags: 0,
                headers: headers(&[]),
            },
            Frame::Headers {
                stream_id: 3,
                flags: 0,
                headers: headers(&[("a", "b")]),
            },
            Frame::RstStream {
                stream_id: 3,
                status: rst::CANCEL,
            },
            Frame::Settings {
                flags: 0,
                entries: vec![(0, 4, 100), (1, 7, 65536)],
            },
            Frame::Ping { id: 1 },
            Frame::GoAway {
                last_good_stream_id: 5,
                status: goaway::OK,
            },
            Frame::WindowUpdate {
                stream_id: 1,
                delta: 65536,
            },
            Frame::Data {
                stream_id: 3,
                flags: 0,
                data: Bytes::from_static(b"hello"),
            },
            Frame::Data {
                stream_id: 3,
                flags: FLAG_FIN,
                data: Bytes::new(),
            },
        ]
    }

    #[test]
    fn frames_round_trip_byte_by_byte() {
        let mut encoder = Encoder::new().unwrap();
        let mut wire = Vec::new();
        for frame in every_kind() {
            encoder.encode(&frame, &mut wire).unwrap();
        }
        let mut decoder = Decoder::default();
        let mut got = Vec::new();
        // One byte at a time: every partial state must wait, not fail.
        for byte in &wire {
            decoder.push(&[*byte]);
            while let Some(frame) = decoder.next_frame().unwrap() {
                got.push(frame);
            }
        }
        assert_eq!(got, every_kind());
        assert_eq!(decoder.buffered(), 0);
    }

    #[test]
    fn known_bytes() {
        let mut wire = Vec::new();
        let mut encoder = Encoder::new().unwrap();
        encoder.encode(&Frame::Ping { id: 7 }, &mut wire).unwrap();
        assert_eq!(wire, [0x80, 3, 0, 6, 0, 0, 0, 4, 0, 0, 0, 7]);
        wire.clear();
        encoder
            .encode(
                &Frame::Data {
                    stream_id: 5,
                    flags: FLAG_FIN,
                    data: Bytes::from_static(b"ab"),
                },
                &mut wire,
            )
            .unwrap();
        assert_eq!(wire, [0, 0, 0, 5, 1, 0, 0, 2, b'a', b'b']);
        // An unknown control type (CREDENTIAL, 10) is returned for the caller to ignore,
        // and the reserved bit of ids is ignored.
        let mut decoder = Decoder::default();
        decoder.push(&[0x80, 3, 0, 10, 0, 0, 0, 1, 9]);
        decoder.push(&[0x80, 3, 0, 3, 0, 0, 0, 8, 0x80, 0, 0, 1, 0, 0, 0, 5]);
        assert_eq!(
            decoder.next_frame().unwrap(),
            Some(Frame::Unknown { kind: 10, flags: 0 })
        );
        assert_eq!(
            decoder.next_frame().unwrap(),
            Some(Frame::RstStream {
                stream_id: 1,
                status: rst::CANCEL
            })
        );
    }

    fn decode_err(bytes: &[u8]) -> SpdyError {
        let mut decoder = Decoder::new(Limits {
            max_data: 16,
            max_control: 32,
        });
        decoder.push(bytes);
        decoder.next_frame().unwrap_err()
    }

    #[test]
    fn untrusted_input_is_refused_with_a_reason() {
        // Announced lengths over the limits fail before the payload arrives.
        assert!(matches!(
            decode_err(&[0, 0, 0, 1, 0, 0, 0, 17]),
            SpdyError::FrameTooLarge { len: 17, max: 16 }
        ));
        assert!(matches!(
            decode_err(&[0x80, 3, 0, 1, 0, 0xff, 0xff, 0xff]),
            SpdyError::FrameTooLarge { .. }
        ));
        assert!(matches!(
            decode_err(&[0x80, 2, 0, 1, 0, 0, 0, 0]),
            SpdyError::UnsupportedVersion(2)
        ));
        assert!(matches!(
            decode_err(&[0, 0, 0, 0, 0, 0, 0, 0]),
            SpdyError::Malformed { frame: "DATA", .. }
        ));
        assert!(matches!(
            decode_err(&[0x80, 3, 0, 6, 0, 0, 0, 3, 0, 0, 0]),
            SpdyError::Malformed { frame: "PING", .. }
        ));
        assert!(matches!(
            decode_err(&[0x80, 3, 0, 4, 0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff]),
            SpdyError::Malformed {
                frame: "SETTINGS",
                ..
            }
        ));
        assert!(matches!(
            decode_err(&[0x80, 3, 0, 9, 0, 0, 0, 8, 0, 0, 0, 1, 0, 0, 0, 0]),
            SpdyError::Malformed {
                frame: "WINDOW_UPDATE",
                ..
            }
        ));
        assert!(matches!(
            decode_err(&[0x80, 3, 0, 1, 0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            SpdyError::Malformed {
                frame: "SYN_STREAM",
                ..
            }
        ));
        // A SYN_STREAM whose header block is not zlib.
        assert!(matches!(
            decode_err(&[
                0x80, 3, 0, 1, 0, 0, 0, 12, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 2
            ]),
            SpdyError::Compression(_) | SpdyError::HeaderBlock(_)
        ));
    }

    #[test]
    fn oversized_frames_cannot_be_encoded() {
        let mut encoder = Encoder::new().unwrap();
        let frame = Frame::Data {
            stream_id: 1,
            flags: 0,
            data: Bytes::from(vec![0; MAX_WIRE_LENGTH + 1]),
        };
        assert!(encoder.encode(&frame, &mut Vec::new()).is_err());
        assert!(
            encoder
                .encode(&Frame::Ping { id: 0 }, &mut Vec::new())
                .is_ok()
        );
        assert!(
            encoder
                .encode(
                    &Frame::RstStream {
                        stream_id: u32::MAX,
                        status: 0
                    },
                    &mut Vec::new()
                )
                .is_err()
        );
    }
}
