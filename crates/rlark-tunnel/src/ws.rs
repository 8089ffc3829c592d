//! RFC 6455 WebSocket framing, sans-IO: frame headers, masking, close payloads.
//!
//! The tunnel's data plane ([`crate::transport::WsTransport`]) uses this codec instead of
//! tungstenite's message path so that a frame's payload is read straight into the buffer
//! that becomes the mux frame and written with one vectored write after its header, without
//! intermediate message copies. The HTTP upgrade (handshake) stays with tungstenite/hyper.
//!
//! What a receiver accepts here is exactly what RFC 6455 section 5 allows, minus what no
//! extension was negotiated for:
//!
//! * RSV1-3 must be 0; opcodes other than continuation, text, binary, close, ping and pong
//!   are refused.
//! * Frames from a client must be masked and frames from a server must not be (section
//!   5.1); the receiver names its own role.
//! * Control frames (close, ping, pong) carry at most 125 bytes and are never fragmented.
//! * Payload lengths use the minimal encoding (7-bit, 16-bit for 126..=65535, 64-bit above)
//!   and a 64-bit length has its most significant bit clear (section 5.2). The encoding is
//!   canonical: every accepted header re-encodes to the same bytes.
//! * A close payload is empty or a valid status code followed by UTF-8 text (section 5.5.1,
//!   7.4).
//!
//! Fragmented messages, the size limit and what to do with each opcode are the transport's
//! business; [`FrameHeader::check`] covers the per-frame rules.

use std::fmt;

/// Longest frame header: 2 bytes, 8 bytes of extended length, 4 bytes of masking key.
pub const MAX_HEADER_LEN: usize = 14;
/// Largest payload of a control frame (RFC 6455 section 5.5).
pub const MAX_CONTROL_PAYLOAD: usize = 125;

/// Close status 1000: normal closure.
pub const CLOSE_NORMAL: u16 = 1000;
/// Close status 1002: protocol error.
pub const CLOSE_PROTOCOL: u16 = 1002;

/// Which end of the WebSocket this is: clients mask what they send, servers do not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The side that connected (the agent): masks every frame it sends.
    Client,
    /// The side that accepted (the hub): sends unmasked frames, requires masked ones.
    Server,
}

/// Frame opcodes defined by RFC 6455.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum OpCode {
    /// 0x0: a further fragment of the message the last text or binary frame started.
    Continuation = 0x0,
    /// 0x1: starts a UTF-8 text message (refused on the tunnel, which is binary only).
    Text = 0x1,
    /// 0x2: starts a binary message; on the tunnel each message is one mux frame.
    Binary = 0x2,
    /// 0x8: close handshake; the payload is empty or a status code and a UTF-8 reason.
    Close = 0x8,
    /// 0x9: ping; the receiver answers with a pong carrying the same payload.
    Ping = 0x9,
    /// 0xa: pong, the answer to a ping (an unsolicited pong is allowed and ignored).
    Pong = 0xa,
}

impl OpCode {
    /// The opcode for the low 4 bits of a frame's first byte; `None` for a reserved value.
    pub fn from_u8(b: u8) -> Option<OpCode> {
        Some(match b {
            0x0 => OpCode::Continuation,
            0x1 => OpCode::Text,
            0x2 => OpCode::Binary,
            0x8 => OpCode::Close,
            0x9 => OpCode::Ping,
            0xa => OpCode::Pong,
            _ => return None,
        })
    }

    /// Close, ping and pong.
    pub fn is_control(self) -> bool {
        (self as u8) & 0x8 != 0
    }
}

impl fmt::Display for OpCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpCode::Continuation => "continuation",
            OpCode::Text => "text",
            OpCode::Binary => "binary",
            OpCode::Close => "close",
            OpCode::Ping => "ping",
            OpCode::Pong => "pong",
        })
    }
}

/// A WebSocket protocol violation by the peer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WsError {
    /// RSV1-3 (the carried 3-bit value) are not all 0, though no extension was negotiated.
    #[error("websocket frame with reserved bits {0:#05b} set (no extension was negotiated)")]
    ReservedBits(u8),
    /// The opcode nibble (carried here) is reserved by RFC 6455.
    #[error("websocket frame with unknown opcode {0:#x}")]
    UnknownOpcode(u8),
    /// A server received a frame without a masking key.
    #[error("unmasked websocket frame from the client (RFC 6455 requires clients to mask)")]
    UnmaskedFromClient,
    /// A client received a frame with a masking key.
    #[error("masked websocket frame from the server (RFC 6455 forbids servers to mask)")]
    MaskedFromServer,
    /// A control frame declares more than [`MAX_CONTROL_PAYLOAD`] payload bytes.
    #[error(
        "websocket {opcode} frame with a {len}-byte payload (control frames carry at most 125)"
    )]
    ControlTooLong {
        /// The control frame's opcode (close, ping or pong).
        opcode: OpCode,
        /// The declared payload length in bytes.
        len: u64,
    },
    /// A control frame (of the carried opcode) without the FIN bit.
    #[error("fragmented websocket {0} frame (control frames are never fragmented)")]
    FragmentedControl(OpCode),
    /// The payload length (carried here) uses a longer encoding than it needs.
    #[error("websocket payload length {0} not in its minimal encoding")]
    NonMinimalLength(u64),
    /// A 64-bit payload length with its most significant bit set (not allowed, section 5.2).
    #[error("websocket 64-bit payload length with the most significant bit set")]
    LengthHighBit,
    /// A frame, or a fragmented message so far, is larger than the receiver's limit.
    #[error("websocket message of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// The frame's payload length, or the message's length with this fragment, in bytes.
        len: u64,
        /// The receiver's limit in bytes.
        max: usize,
    },
    /// A continuation frame arrived when no fragmented message was in progress.
    #[error("websocket continuation frame without a message to continue")]
    UnexpectedContinuation,
    /// A new data frame (of the carried opcode) arrived before the fragmented message ended.
    #[error("websocket {0} frame inside a fragmented message (expected a continuation)")]
    ExpectedContinuation(OpCode),
    /// A text message on the tunnel, which carries binary messages only.
    #[error("text message on the tunnel websocket (the tunnel speaks binary messages only)")]
    TextMessage,
    /// A close payload of 1 byte: too short for the 2-byte status code.
    #[error("websocket close frame with a 1-byte payload")]
    CloseTruncated,
    /// A close status (carried here) that no endpoint may send (RFC 6455 section 7.4).
    #[error("websocket close frame with invalid status code {0}")]
    CloseCode(u16),
    /// A close reason that is not valid UTF-8.
    #[error("websocket close frame with a reason that is not UTF-8")]
    CloseReason,
}

/// One frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Last frame of its message.
    pub fin: bool,
    /// What the frame carries: a message fragment or a control frame.
    pub opcode: OpCode,
    /// The masking key, present on (and only on) frames sent by a client.
    pub mask: Option<[u8; 4]>,
    /// Payload length.
    pub len: u64,
}

impl FrameHeader {
    /// Parses a header at the start of `buf`: `Ok(None)` if `buf` holds only part of it,
    /// else the header and its length in bytes. Refuses what no sender may produce (reserved
    /// bits, unknown opcodes, non-minimal or 2^63+ lengths, oversized or fragmented control
    /// frames) as soon as the byte carrying it is there. Never panics.
    pub fn parse(buf: &[u8]) -> Result<Option<(FrameHeader, usize)>, WsError> {
        let Some(&[b0, b1]) = buf.first_chunk::<2>() else {
            return Ok(None);
        };
        let rsv = (b0 >> 4) & 0x7;
        if rsv != 0 {
            return Err(WsError::ReservedBits(rsv));
        }
        let opcode = OpCode::from_u8(b0 & 0xf).ok_or(WsError::UnknownOpcode(b0 & 0xf))?;
        let fin = b0 & 0x80 != 0;
        let masked = b1 & 0x80 != 0;
        let len7 = b1 & 0x7f;
        if opcode.is_control() {
            if !fin {
                return Err(WsError::FragmentedControl(opcode));
            }
            if usize::from(len7) > MAX_CONTROL_PAYLOAD {
                return Err(WsError::ControlTooLong {
                    opcode,
                    len: u64::from(len7),
                });
            }
        }
        let ext = match len7 {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        let header_len = 2 + ext + if masked { 4 } else { 0 };
        let Some(head) = buf.get(..header_len) else {
            return Ok(None);
        };
        let len = match len7 {
            126 => {
                let len = u64::from(u16::from_be_bytes([head[2], head[3]]));
                if len < 126 {
                    return Err(WsError::NonMinimalLength(len));
                }
                len
            }
            127 => {
                let mut b = [0u8; 8];
                b.copy_from_slice(&head[2..10]);
                let len = u64::from_be_bytes(b);
                if len >> 63 != 0 {
                    return Err(WsError::LengthHighBit);
                }
                if len <= u64::from(u16::MAX) {
                    return Err(WsError::NonMinimalLength(len));
                }
                len
            }
            n => u64::from(n),
        };
        let mask = masked.then(|| {
            let k = &head[header_len - 4..header_len];
            [k[0], k[1], k[2], k[3]]
        });
        Ok(Some((
            FrameHeader {
                fin,
                opcode,
                mask,
                len,
            },
            header_len,
        )))
    }

    /// The rules that depend on who receives the frame and on the size limit: a server
    /// accepts only masked frames, a client only unmasked ones; no frame exceeds `max`.
    pub fn check(&self, receiver: Role, max: usize) -> Result<(), WsError> {
        match (receiver, self.mask.is_some()) {
            (Role::Server, false) => return Err(WsError::UnmaskedFromClient),
            (Role::Client, true) => return Err(WsError::MaskedFromServer),
            _ => {}
        }
        if self.len > max as u64 {
            return Err(WsError::TooLarge { len: self.len, max });
        }
        Ok(())
    }

    /// Encodes the header (minimal length encoding) into `out`; returns its length.
    pub fn encode(&self, out: &mut [u8; MAX_HEADER_LEN]) -> usize {
        out[0] = (u8::from(self.fin) << 7) | self.opcode as u8;
        let mask_bit = if self.mask.is_some() { 0x80 } else { 0 };
        let mut n = 2;
        if self.len < 126 {
            out[1] = mask_bit | self.len as u8;
        } else if self.len <= u64::from(u16::MAX) {
            out[1] = mask_bit | 126;
            out[2..4].copy_from_slice(&(self.len as u16).to_be_bytes());
            n = 4;
        } else {
            out[1] = mask_bit | 127;
            out[2..10].copy_from_slice(&self.len.to_be_bytes());
            n = 10;
        }
        if let Some(key) = self.mask {
            out[n..n + 4].copy_from_slice(&key);
            n += 4;
        }
        n
    }

    /// Length of [`FrameHeader::encode`]'s output.
    pub fn encoded_len(&self) -> usize {
        let ext = match self.len {
            0..126 => 0,
            126..=0xffff => 2,
            _ => 8,
        };
        2 + ext + if self.mask.is_some() { 4 } else { 0 }
    }
}

/// XORs `buf` with the masking key (RFC 6455 section 5.3), `buf[0]` being the payload's
/// first byte. Masking and unmasking are the same operation. Works on 8-byte words so the
/// cost per byte stays small next to the copies and the encryption around it.
pub fn apply_mask(buf: &mut [u8], key: [u8; 4]) {
    let k = u64::from_ne_bytes([
        key[0], key[1], key[2], key[3], key[0], key[1], key[2], key[3],
    ]);
    let mut words = buf.chunks_exact_mut(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        w.copy_from_slice(&(u64::from_ne_bytes(b) ^ k).to_ne_bytes());
    }
    // The tail starts at a multiple of 8, so at key[0].
    for (i, b) in words.into_remainder().iter_mut().enumerate() {
        *b ^= key[i % 4];
    }
}

/// Appends `src` to `dst`, masked with `key`.
pub fn extend_masked<B: bytes::BufMut + AsMut<[u8]>>(dst: &mut B, src: &[u8], key: [u8; 4]) {
    let start = dst.as_mut().len();
    dst.put_slice(src);
    apply_mask(&mut dst.as_mut()[start..], key);
}

/// Checks a close frame's payload: empty, or a status code a peer may send followed by a
/// UTF-8 reason. Returns the code, if any.
pub fn parse_close(payload: &[u8]) -> Result<Option<u16>, WsError> {
    match payload {
        [] => Ok(None),
        [_] => Err(WsError::CloseTruncated),
        [hi, lo, reason @ ..] => {
            let code = u16::from_be_bytes([*hi, *lo]);
            // Section 7.4: 1004-1006 and 1015 must never be sent; 1016-2999 are reserved
            // for this and later RFCs (1012-1014 were registered since); 3000-4999 are for
            // libraries and applications.
            let sendable = matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999);
            if !sendable {
                return Err(WsError::CloseCode(code));
            }
            if std::str::from_utf8(reason).is_err() {
                return Err(WsError::CloseReason);
            }
            Ok(Some(code))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(fin: bool, opcode: OpCode, mask: Option<[u8; 4]>, len: u64) -> FrameHeader {
        FrameHeader {
            fin,
            opcode,
            mask,
            len,
        }
    }

    fn encode(h: &FrameHeader) -> Vec<u8> {
        let mut out = [0u8; MAX_HEADER_LEN];
        let n = h.encode(&mut out);
        assert_eq!(n, h.encoded_len());
        out[..n].to_vec()
    }

    #[test]
    fn exact_wire_bytes() {
        // RFC 6455 section 5.7 examples.
        assert_eq!(
            encode(&header(true, OpCode::Text, None, 5)),
            [0x81, 0x05],
            "unmasked text 'Hello'"
        );
        assert_eq!(
            encode(&header(
                true,
                OpCode::Text,
                Some([0x37, 0xfa, 0x21, 0x3d]),
                5
            )),
            [0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d]
        );
        assert_eq!(
            encode(&header(false, OpCode::Text, None, 3)),
            [0x01, 0x03],
            "first fragment"
        );
        assert_eq!(
            encode(&header(true, OpCode::Continuation, None, 2)),
            [0x80, 0x02]
        );
        assert_eq!(encode(&header(true, OpCode::Ping, None, 5)), [0x89, 0x05]);
        assert_eq!(
            encode(&header(true, OpCode::Binary, None, 256)),
            [0x82, 0x7e, 0x01, 0x00]
        );
        assert_eq!(
            encode(&header(true, OpCode::Binary, None, 65536)),
            [0x82, 0x7f, 0, 0, 0, 0, 0, 1, 0, 0]
        );
        // The masked example's payload: "Hello" masked with 37 fa 21 3d.
        let mut hello = *b"Hello";
        apply_mask(&mut hello, [0x37, 0xfa, 0x21, 0x3d]);
        assert_eq!(hello, [0x7f, 0x9f, 0x4d, 0x51, 0x58]);
    }

    #[test]
    fn roundtrip_lengths_and_masks() {
        for len in [0u64, 1, 125, 126, 127, 65535, 65536, 1 << 20, (1 << 63) - 1] {
            for mask in [None, Some([1, 2, 3, 4])] {
                for opcode in [OpCode::Binary, OpCode::Continuation, OpCode::Text] {
                    for fin in [true, false] {
                        let h = header(fin, opcode, mask, len);
                        let enc = encode(&h);
                        assert_eq!(FrameHeader::parse(&enc), Ok(Some((h, enc.len()))));
                        // Every strict prefix is incomplete, never an error.
                        for cut in 0..enc.len() {
                            assert_eq!(FrameHeader::parse(&enc[..cut]), Ok(None), "{h:?}");
                        }
                        // Trailing bytes (the payload) are not part of the header.
                        let mut more = enc.clone();
                        more.extend_from_slice(b"payload");
                        assert_eq!(FrameHeader::parse(&more), Ok(Some((h, enc.len()))));
                    }
                }
            }
        }
    }

    #[test]
    fn error_paths() {
        use WsError::*;
        let cases: Vec<(&[u8], WsError)> = vec![
            (&[0xc2, 0x00], ReservedBits(0b100)),
            (&[0x92, 0x00], ReservedBits(0b001)),
            (&[0x83, 0x00], UnknownOpcode(3)),
            (&[0x8b, 0x00], UnknownOpcode(0xb)),
            (&[0x8f, 0x00], UnknownOpcode(0xf)),
            (&[0x09, 0x00], FragmentedControl(OpCode::Ping)),
            (&[0x08, 0x00], FragmentedControl(OpCode::Close)),
            (
                &[0x8a, 0x7e],
                ControlTooLong {
                    opcode: OpCode::Pong,
                    len: 126,
                },
            ),
            (&[0x82, 0x7e, 0x00, 0x7d], NonMinimalLength(125)),
            (
                &[0x82, 0x7f, 0, 0, 0, 0, 0, 0, 0xff, 0xff],
                NonMinimalLength(65535),
            ),
            (&[0x82, 0x7f, 0x80, 0, 0, 0, 0, 0, 0, 0], LengthHighBit),
        ];
        for (bytes, want) in cases {
            assert_eq!(FrameHeader::parse(bytes), Err(want.clone()), "{bytes:02x?}");
            assert!(!want.to_string().is_empty());
        }
        let masked = header(true, OpCode::Binary, Some([0; 4]), 10);
        let plain = header(true, OpCode::Binary, None, 10);
        assert_eq!(masked.check(Role::Server, 100), Ok(()));
        assert_eq!(plain.check(Role::Client, 100), Ok(()));
        assert_eq!(plain.check(Role::Server, 100), Err(UnmaskedFromClient));
        assert_eq!(masked.check(Role::Client, 100), Err(MaskedFromServer));
        assert_eq!(
            plain.check(Role::Client, 9),
            Err(TooLarge { len: 10, max: 9 })
        );
    }

    #[test]
    fn mask_matches_the_bytewise_definition() {
        let key = [0xde, 0xad, 0xbe, 0xef];
        for len in 0..70 {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let mut fast = data.clone();
            apply_mask(&mut fast, key);
            let slow: Vec<u8> = data
                .iter()
                .enumerate()
                .map(|(i, b)| b ^ key[i % 4])
                .collect();
            assert_eq!(fast, slow, "len {len}");
            let mut via_extend = bytes::BytesMut::from(&b"hdr"[..]);
            extend_masked(&mut via_extend, &data, key);
            assert_eq!(&via_extend[3..], &slow[..]);
            apply_mask(&mut fast, key);
            assert_eq!(fast, data, "masking twice is the identity");
        }
    }

    #[test]
    fn close_payloads() {
        assert_eq!(parse_close(b""), Ok(None));
        assert_eq!(parse_close(&[0x03]), Err(WsError::CloseTruncated));
        assert_eq!(parse_close(&[0x03, 0xe8]), Ok(Some(1000)));
        assert_eq!(parse_close(b"\x03\xe9going away"), Ok(Some(1001)));
        assert_eq!(parse_close(&[0x0f, 0xa0]), Ok(Some(4000)));
        for bad in [
            0u16,
            999,
            1004,
            1005,
            1006,
            1015,
            1016,
            2999,
            5000,
            u16::MAX,
        ] {
            assert_eq!(
                parse_close(&bad.to_be_bytes()),
                Err(WsError::CloseCode(bad))
            );
        }
        assert_eq!(
            parse_close(&[0x03, 0xe8, 0xff, 0xfe]),
            Err(WsError::CloseReason)
        );
    }
}
