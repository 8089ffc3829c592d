//! The stream header: one versioned request written by the opener (the hub) at the start of
//! every mux stream, answered by one response written by the acceptor (the agent) before any
//! payload. Wire format and examples: `docs/tunnel.md`, section "Stream header".
//!
//! The codec is sans-IO and checked: [`StreamRequest::decode`] and [`StreamResponse::decode`]
//! never panic, return `Ok(None)` while more bytes are needed, and refuse a bad field as soon
//! as the bytes that carry it have arrived (so a header longer than the limit is refused after
//! its 4-byte prefix). Encoding is canonical and [`StreamRequest::encode`] refuses exactly what
//! decoding would refuse, so whatever decodes re-encodes to the same bytes.
//! [`read_request`] and [`read_response`] read exactly one header from a stream and never a
//! byte of the payload behind it.

use std::fmt;
use std::io;
use std::net::Ipv6Addr;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

/// The only header version.
pub const VERSION: u8 = 1;
/// Largest body (request) or message (response) in bytes.
pub const MAX_HEADER_BODY: usize = 1024;
/// Bytes before the body: version, kind or status, u16 length.
pub const PREFIX_LEN: usize = 4;
/// Longest dial-tcp host name (a DNS name's maximum text length).
pub const MAX_HOST_LEN: usize = 253;
/// Longest dial-tcp timeout (10 minutes); the shortest is 1 ms.
pub const MAX_DIAL_TIMEOUT: Duration = Duration::from_millis(MAX_TIMEOUT_MS as u64);

const MAX_TIMEOUT_MS: u32 = 600_000;
const KIND_DIAL_TCP: u8 = 1;
const KIND_AGENT_API: u8 = 2;
const KIND_RELAY: u8 = 3;
/// dial-tcp body before the host: u32 timeout_ms, u16 port, u8 host_len.
const DIAL_FIXED: usize = 4 + 2 + 1;

/// Why a header was refused. Every variant is the sender's fault (answered with
/// [`Status::BadRequest`] where an answer is still possible).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// The version byte (carried here) is not [`VERSION`].
    #[error("header version {0} is not supported (only version {VERSION})")]
    UnsupportedVersion(u8),
    /// The request kind byte (carried here) names no [`StreamRequest`] kind.
    #[error("request kind {0} is unknown (1 dial-tcp, 2 agent-api, 3 relay)")]
    UnknownKind(u8),
    /// The response status byte (carried here) names no [`Status`].
    #[error("response status {0} is unknown (0..=8)")]
    UnknownStatus(u8),
    /// The length prefix (or a relay body being encoded) exceeds [`MAX_HEADER_BODY`].
    #[error("header body is {len} bytes; at most {max} are allowed")]
    TooLarge {
        /// The body length in bytes.
        len: usize,
        /// The limit in bytes ([`MAX_HEADER_BODY`]).
        max: usize,
    },
    /// A field is out of range or malformed; the text names the field.
    #[error("invalid header: {0}")]
    Invalid(String),
}

/// What a stream is for: the first thing the opener writes on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamRequest {
    /// Open a TCP connection from the agent's host to `host:port` within `timeout`
    /// (1 ms ..= 10 min, whole milliseconds). `host` is an IPv4 literal, an IPv6 literal
    /// (bare `::1` or bracketed `[::1]`) or a DNS name.
    DialTcp {
        /// IPv4 literal, IPv6 literal or DNS name; at most [`MAX_HOST_LEN`] bytes.
        host: String,
        /// TCP port, 1..=65535.
        port: u16,
        /// Bound on the dial (name resolution and connect), 1 ms ..= [`MAX_DIAL_TIMEOUT`];
        /// the agent lowers it to its own `max_dial_timeout`.
        timeout: Duration,
    },
    /// The agent's local API.
    AgentApi,
    /// Pod-network relay; the body is opaque (at most [`MAX_HEADER_BODY`] bytes).
    Relay(Bytes),
}

/// The acceptor's answer. Anything but [`Status::Ok`] is followed by the end of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Stream established; payload follows.
    Ok,
    /// The target actively refused the connection.
    Refused,
    /// No route to the target, or its name does not resolve.
    Unreachable,
    /// The dial did not complete within the request's timeout.
    Timeout,
    /// The agent does not allow this request (e.g. relay or agent API not enabled).
    Forbidden,
    /// The hub knows no connected agent for the target (written by the hub, not the agent).
    NoSuchAgent,
    /// The request header was malformed.
    BadRequest,
    /// A limit was reached (streams, dials in flight).
    Limit,
    /// Anything else.
    Internal,
}

/// The response header: a status and a human-readable message (UTF-8, at most
/// [`MAX_HEADER_BODY`] bytes; [`StreamResponse::encode`] truncates a longer one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamResponse {
    /// The outcome: [`Status::Ok`] if payload follows, else why the stream is refused.
    pub status: Status,
    /// Detail for people and logs (e.g. the dial error); empty from [`StreamResponse::ok`].
    pub message: String,
}

/// Failure of [`read_request`] / [`read_response`]: the stream failed or ended early, or the
/// bytes read are not a valid header.
#[derive(Debug, thiserror::Error)]
pub enum ReadHeaderError {
    /// Reading failed; `UnexpectedEof` if the stream ended inside the header.
    #[error("read stream header: {0}")]
    Io(#[source] io::Error),
    /// The bytes read are not a valid header.
    #[error(transparent)]
    Header(#[from] HeaderError),
}

impl From<ReadHeaderError> for io::Error {
    /// `Io` as is; `Header` as `InvalidData` with the [`HeaderError`] as source.
    fn from(error: ReadHeaderError) -> Self {
        match error {
            ReadHeaderError::Io(error) => error,
            ReadHeaderError::Header(error) => io::Error::new(io::ErrorKind::InvalidData, error),
        }
    }
}

impl StreamRequest {
    /// Short name of the kind, for logs: `dial-tcp`, `agent-api`, `relay`.
    pub fn kind(&self) -> &'static str {
        match self {
            StreamRequest::DialTcp { .. } => "dial-tcp",
            StreamRequest::AgentApi => "agent-api",
            StreamRequest::Relay(_) => "relay",
        }
    }

    /// The wire form. Refuses every value [`StreamRequest::decode`] would refuse (timeout
    /// outside 1 ms..=10 min or not whole milliseconds, port 0, bad host, relay body too large).
    pub fn encode(&self) -> Result<Bytes, HeaderError> {
        let (kind, len) = match self {
            StreamRequest::DialTcp {
                host,
                port,
                timeout,
            } => {
                check_timeout(*timeout)?;
                check_port(*port)?;
                check_host(host.as_bytes())?;
                (KIND_DIAL_TCP, DIAL_FIXED + host.len())
            }
            StreamRequest::AgentApi => (KIND_AGENT_API, 0),
            StreamRequest::Relay(body) => {
                if body.len() > MAX_HEADER_BODY {
                    return Err(HeaderError::TooLarge {
                        len: body.len(),
                        max: MAX_HEADER_BODY,
                    });
                }
                (KIND_RELAY, body.len())
            }
        };
        let mut out = BytesMut::with_capacity(PREFIX_LEN + len);
        out.put_u8(VERSION);
        out.put_u8(kind);
        // Checked above: len <= MAX_HEADER_BODY < u16::MAX.
        out.put_u16(len as u16);
        match self {
            StreamRequest::DialTcp {
                host,
                port,
                timeout,
            } => {
                // Checked above: whole milliseconds <= MAX_TIMEOUT_MS; host.len() <= 253.
                out.put_u32(timeout.as_millis() as u32);
                out.put_u16(*port);
                out.put_u8(host.len() as u8);
                out.put_slice(host.as_bytes());
            }
            StreamRequest::AgentApi => {}
            StreamRequest::Relay(body) => out.put_slice(body),
        }
        Ok(out.freeze())
    }

    /// Decodes one request from the start of `buf`: `Ok(None)` if more bytes are needed,
    /// `Ok(Some((request, consumed)))` — the payload starts at `buf[consumed..]` — or the
    /// first invalid field. Never panics.
    pub fn decode(buf: &[u8]) -> Result<Option<(StreamRequest, usize)>, HeaderError> {
        let Some(&version) = buf.first() else {
            return Ok(None);
        };
        if version != VERSION {
            return Err(HeaderError::UnsupportedVersion(version));
        }
        let Some(&kind) = buf.get(1) else {
            return Ok(None);
        };
        if !matches!(kind, KIND_DIAL_TCP | KIND_AGENT_API | KIND_RELAY) {
            return Err(HeaderError::UnknownKind(kind));
        }
        let Some(len) = body_len(buf)? else {
            return Ok(None);
        };
        match kind {
            KIND_DIAL_TCP if !(DIAL_FIXED + 1..=DIAL_FIXED + MAX_HOST_LEN).contains(&len) => {
                return Err(HeaderError::Invalid(format!(
                    "dial-tcp body length {len} is outside {}..={} \
                     (7 bytes of timeout, port and host_len plus a host of 1..={MAX_HOST_LEN})",
                    DIAL_FIXED + 1,
                    DIAL_FIXED + MAX_HOST_LEN
                )));
            }
            KIND_AGENT_API if len != 0 => {
                return Err(HeaderError::Invalid(format!(
                    "agent-api body length {len}: the body must be empty"
                )));
            }
            _ => {}
        }
        let Some(body) = buf.get(PREFIX_LEN..PREFIX_LEN + len) else {
            return Ok(None);
        };
        let request = match kind {
            KIND_DIAL_TCP => decode_dial(body)?,
            KIND_AGENT_API => StreamRequest::AgentApi,
            _ => StreamRequest::Relay(Bytes::copy_from_slice(body)),
        };
        Ok(Some((request, PREFIX_LEN + len)))
    }
}

/// The dial-tcp body, whose length is already known to be 8..=260.
fn decode_dial(body: &[u8]) -> Result<StreamRequest, HeaderError> {
    let (Some(timeout), Some(port), Some(&host_len), Some(host)) = (
        body.get(0..4),
        body.get(4..6),
        body.get(6),
        body.get(DIAL_FIXED..),
    ) else {
        return Err(HeaderError::Invalid(format!(
            "dial-tcp body is {} bytes; shorter than its {DIAL_FIXED}-byte fixed part",
            body.len()
        )));
    };
    let timeout_ms = u32::from_be_bytes([timeout[0], timeout[1], timeout[2], timeout[3]]);
    if !(1..=MAX_TIMEOUT_MS).contains(&timeout_ms) {
        return Err(HeaderError::Invalid(format!(
            "dial-tcp timeout_ms {timeout_ms} is outside 1..={MAX_TIMEOUT_MS}"
        )));
    }
    let port = u16::from_be_bytes([port[0], port[1]]);
    check_port(port)?;
    let host_len = usize::from(host_len);
    if !(1..=MAX_HOST_LEN).contains(&host_len) {
        return Err(HeaderError::Invalid(format!(
            "dial-tcp host_len {host_len} is outside 1..={MAX_HOST_LEN}"
        )));
    }
    if host.len() != host_len {
        let relation = if host.len() > host_len {
            "trailing bytes inside the body"
        } else {
            "the body ends inside the host"
        };
        return Err(HeaderError::Invalid(format!(
            "dial-tcp host_len {host_len} does not match the {} host bytes the body length \
             leaves ({relation})",
            host.len()
        )));
    }
    check_host(host)?;
    let host = String::from_utf8(host.to_vec())
        .map_err(|_| HeaderError::Invalid("dial-tcp host is not ASCII".to_owned()))?;
    Ok(StreamRequest::DialTcp {
        host,
        port,
        timeout: Duration::from_millis(u64::from(timeout_ms)),
    })
}

/// The u16 length at bytes 2..4, refused if above [`MAX_HEADER_BODY`]; `None` if not there yet.
fn body_len(buf: &[u8]) -> Result<Option<usize>, HeaderError> {
    let Some(&[high, low]) = buf.get(2..PREFIX_LEN) else {
        return Ok(None);
    };
    let len = usize::from(u16::from_be_bytes([high, low]));
    if len > MAX_HEADER_BODY {
        return Err(HeaderError::TooLarge {
            len,
            max: MAX_HEADER_BODY,
        });
    }
    Ok(Some(len))
}

fn check_timeout(timeout: Duration) -> Result<(), HeaderError> {
    let whole_ms = timeout.subsec_nanos().is_multiple_of(1_000_000);
    if !whole_ms || timeout.is_zero() || timeout > MAX_DIAL_TIMEOUT {
        return Err(HeaderError::Invalid(format!(
            "dial-tcp timeout {timeout:?} must be whole milliseconds in 1ms..={}s",
            MAX_DIAL_TIMEOUT.as_secs()
        )));
    }
    Ok(())
}

fn check_port(port: u16) -> Result<(), HeaderError> {
    if port == 0 {
        return Err(HeaderError::Invalid(
            "dial-tcp port 0 is not a port (1..=65535)".to_owned(),
        ));
    }
    Ok(())
}

/// 1..=253 bytes of ASCII letters, digits, `.`, `-`, `_`, `:`, and `[` `]` around an IPv6
/// literal. A `:` is only allowed in an IPv6 literal, so `host:port` cannot hide in the host.
fn check_host(host: &[u8]) -> Result<(), HeaderError> {
    if !(1..=MAX_HOST_LEN).contains(&host.len()) {
        return Err(HeaderError::Invalid(format!(
            "dial-tcp host is {} bytes; must be 1..={MAX_HOST_LEN}",
            host.len()
        )));
    }
    if let Some((offset, byte)) = host.iter().enumerate().find(|(_, byte)| {
        !(byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'-' | b'_' | b':' | b'[' | b']'))
    }) {
        return Err(HeaderError::Invalid(format!(
            "dial-tcp host has byte 0x{byte:02x} at offset {offset}; only ASCII letters, digits, \
             '.', '-', '_', ':' and '[' ']' around an IPv6 literal are allowed"
        )));
    }
    // All bytes are ASCII now, so this is infallible; refuse rather than unwrap anyway.
    let Ok(text) = std::str::from_utf8(host) else {
        return Err(HeaderError::Invalid(
            "dial-tcp host is not ASCII".to_owned(),
        ));
    };
    if text.contains(['[', ']']) {
        let inner = text.strip_prefix('[').and_then(|t| t.strip_suffix(']'));
        if inner.is_none_or(|inner| inner.parse::<Ipv6Addr>().is_err()) {
            return Err(HeaderError::Invalid(format!(
                "dial-tcp host {text:?}: '[' and ']' may only enclose an IPv6 address"
            )));
        }
    } else if text.contains(':') && text.parse::<Ipv6Addr>().is_err() {
        return Err(HeaderError::Invalid(format!(
            "dial-tcp host {text:?}: ':' is only allowed in an IPv6 address \
             (the port is a separate field)"
        )));
    }
    Ok(())
}

impl fmt::Display for StreamRequest {
    /// `dial-tcp 10.0.0.1:80 (timeout 10s)`, `dial-tcp [::1]:22 (timeout 1500ms)`,
    /// `agent-api`, `relay (12 bytes)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamRequest::DialTcp {
                host,
                port,
                timeout,
            } => {
                if host.contains(':') && !host.starts_with('[') {
                    write!(f, "dial-tcp [{host}]:{port}")?;
                } else {
                    write!(f, "dial-tcp {host}:{port}")?;
                }
                let ms = timeout.as_millis();
                if !timeout.subsec_nanos().is_multiple_of(1_000_000) {
                    write!(f, " (timeout {timeout:?})")
                } else if ms.is_multiple_of(1000) {
                    write!(f, " (timeout {}s)", ms / 1000)
                } else {
                    write!(f, " (timeout {ms}ms)")
                }
            }
            StreamRequest::AgentApi => f.write_str("agent-api"),
            StreamRequest::Relay(body) => write!(f, "relay ({} bytes)", body.len()),
        }
    }
}

impl Status {
    /// Every status, in wire-code order.
    pub const ALL: [Status; 9] = [
        Status::Ok,
        Status::Refused,
        Status::Unreachable,
        Status::Timeout,
        Status::Forbidden,
        Status::NoSuchAgent,
        Status::BadRequest,
        Status::Limit,
        Status::Internal,
    ];

    /// `ok`, `refused`, `unreachable`, `timeout`, `forbidden`, `no-such-agent`,
    /// `bad-request`, `limit`, `internal`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Refused => "refused",
            Status::Unreachable => "unreachable",
            Status::Timeout => "timeout",
            Status::Forbidden => "forbidden",
            Status::NoSuchAgent => "no-such-agent",
            Status::BadRequest => "bad-request",
            Status::Limit => "limit",
            Status::Internal => "internal",
        }
    }

    /// The wire code (0..=8).
    pub fn code(self) -> u8 {
        match self {
            Status::Ok => 0,
            Status::Refused => 1,
            Status::Unreachable => 2,
            Status::Timeout => 3,
            Status::Forbidden => 4,
            Status::NoSuchAgent => 5,
            Status::BadRequest => 6,
            Status::Limit => 7,
            Status::Internal => 8,
        }
    }

    /// The status with this wire code, if any.
    pub fn from_code(code: u8) -> Option<Status> {
        Status::ALL.get(usize::from(code)).copied()
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl StreamResponse {
    /// Status ok, empty message.
    pub fn ok() -> Self {
        StreamResponse {
            status: Status::Ok,
            message: String::new(),
        }
    }

    /// A status with a message, truncated (at a character boundary) to [`MAX_HEADER_BODY`]
    /// bytes.
    pub fn error(status: Status, message: impl Into<String>) -> Self {
        let mut message = message.into();
        message.truncate(message.floor_char_boundary(MAX_HEADER_BODY));
        StreamResponse { status, message }
    }

    /// The wire form. Infallible: a message longer than [`MAX_HEADER_BODY`] bytes is
    /// truncated at a character boundary (so only such a message does not round-trip).
    pub fn encode(&self) -> Bytes {
        let message = &self.message[..self.message.floor_char_boundary(MAX_HEADER_BODY)];
        let mut out = BytesMut::with_capacity(PREFIX_LEN + message.len());
        out.put_u8(VERSION);
        out.put_u8(self.status.code());
        // message.len() <= MAX_HEADER_BODY < u16::MAX.
        out.put_u16(message.len() as u16);
        out.put_slice(message.as_bytes());
        out.freeze()
    }

    /// Decodes one response from the start of `buf`: `Ok(None)` if more bytes are needed,
    /// `Ok(Some((response, consumed)))` — the payload starts at `buf[consumed..]` — or the
    /// first invalid field. Never panics.
    pub fn decode(buf: &[u8]) -> Result<Option<(StreamResponse, usize)>, HeaderError> {
        let Some(&version) = buf.first() else {
            return Ok(None);
        };
        if version != VERSION {
            return Err(HeaderError::UnsupportedVersion(version));
        }
        let Some(&code) = buf.get(1) else {
            return Ok(None);
        };
        let status = Status::from_code(code).ok_or(HeaderError::UnknownStatus(code))?;
        let Some(len) = body_len(buf)? else {
            return Ok(None);
        };
        let Some(message) = buf.get(PREFIX_LEN..PREFIX_LEN + len) else {
            return Ok(None);
        };
        let message = std::str::from_utf8(message).map_err(|error| {
            HeaderError::Invalid(format!(
                "response message is not UTF-8 (invalid at byte {})",
                error.valid_up_to()
            ))
        })?;
        let response = StreamResponse {
            status,
            message: message.to_owned(),
        };
        Ok(Some((response, PREFIX_LEN + len)))
    }
}

impl fmt::Display for StreamResponse {
    /// `ok`, or `<status>: <message>` when there is a message.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            f.write_str(self.status.as_str())
        } else {
            write!(f, "{}: {}", self.status, self.message)
        }
    }
}

/// Reads exactly one request header from `reader` — the 4-byte prefix, then the body it
/// announces — and not a byte more: the payload that follows stays unread. A bad prefix
/// (version, kind, length) is refused before any body byte is read.
pub async fn read_request<R: AsyncRead + Unpin>(
    reader: &mut R,
) -> Result<StreamRequest, ReadHeaderError> {
    read_header(reader, StreamRequest::decode).await
}

/// Reads exactly one response header from `reader`; like [`read_request`].
pub async fn read_response<R: AsyncRead + Unpin>(
    reader: &mut R,
) -> Result<StreamResponse, ReadHeaderError> {
    read_header(reader, StreamResponse::decode).await
}

type Decoder<T> = fn(&[u8]) -> Result<Option<(T, usize)>, HeaderError>;

async fn read_header<R: AsyncRead + Unpin, T>(
    reader: &mut R,
    decode: Decoder<T>,
) -> Result<T, ReadHeaderError> {
    let mut buf = vec![0u8; PREFIX_LEN];
    reader
        .read_exact(&mut buf)
        .await
        .map_err(ReadHeaderError::Io)?;
    // The prefix is checked (and may already be the whole header) before the body is read.
    if let Some((value, _)) = decode(&buf)? {
        return Ok(value);
    }
    let Some(len) = body_len(&buf)? else {
        return Err(HeaderError::Invalid("header prefix incomplete".to_owned()).into());
    };
    buf.resize(PREFIX_LEN + len, 0);
    reader
        .read_exact(&mut buf[PREFIX_LEN..])
        .await
        .map_err(ReadHeaderError::Io)?;
    match decode(&buf)? {
        Some((value, consumed)) if consumed == buf.len() => Ok(value),
        // Unreachable with the decoders above (a complete header always decodes).
        _ => Err(HeaderError::Invalid(format!(
            "{} header bytes do not form a complete header",
            buf.len()
        ))
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dial(host: &str, port: u16, timeout_ms: u64) -> StreamRequest {
        StreamRequest::DialTcp {
            host: host.to_owned(),
            port,
            timeout: Duration::from_millis(timeout_ms),
        }
    }

    fn valid_requests() -> Vec<StreamRequest> {
        vec![
            dial("10.0.0.1", 80, 10_000),
            dial("::1", 22, 1),
            dial("[fe80::1:2]", 65535, 600_000),
            dial("[::ffff:10.1.2.3]", 1, 1500),
            dial("2001:db8::8a2e:370:7334", 443, 30_000),
            dial("my-svc.my_ns.svc.cluster.local.", 8080, 5000),
            dial("x", 9, 999),
            dial(&"a".repeat(MAX_HOST_LEN), 443, 10_000),
            StreamRequest::AgentApi,
            StreamRequest::Relay(Bytes::new()),
            StreamRequest::Relay(Bytes::from_static(b"\x00\xffopaque")),
            StreamRequest::Relay(Bytes::from(vec![0xa5; MAX_HEADER_BODY])),
        ]
    }

    fn valid_responses() -> Vec<StreamResponse> {
        let mut out = vec![StreamResponse::ok()];
        for status in Status::ALL {
            out.push(StreamResponse::error(status, ""));
            out.push(StreamResponse::error(
                status,
                format!("{status}: connect 10.0.0.1:80: connection refused"),
            ));
        }
        out.push(StreamResponse::error(Status::Internal, "ünïcødé ✓ \n\t"));
        out.push(StreamResponse::error(
            Status::Limit,
            "m".repeat(MAX_HEADER_BODY),
        ));
        out
    }

    fn request_err(bytes: &[u8]) -> HeaderError {
        match StreamRequest::decode(bytes) {
            Err(error) => error,
            other => panic!("{bytes:02x?} decoded to {other:?}"),
        }
    }

    fn response_err(bytes: &[u8]) -> HeaderError {
        match StreamResponse::decode(bytes) {
            Err(error) => error,
            other => panic!("{bytes:02x?} decoded to {other:?}"),
        }
    }

    /// A dial-tcp header with raw field values (no validation).
    fn raw_dial(timeout_ms: u32, port: u16, host_len: u8, host: &[u8]) -> Vec<u8> {
        let len = DIAL_FIXED + host.len();
        let mut out = vec![VERSION, KIND_DIAL_TCP];
        out.extend_from_slice(&(len as u16).to_be_bytes());
        out.extend_from_slice(&timeout_ms.to_be_bytes());
        out.extend_from_slice(&port.to_be_bytes());
        out.push(host_len);
        out.extend_from_slice(host);
        out
    }

    fn assert_invalid(error: HeaderError, field: &str) {
        match &error {
            HeaderError::Invalid(text) => assert!(
                text.contains(field),
                "error {text:?} does not name the field {field:?}"
            ),
            other => panic!("expected Invalid naming {field:?}, got {other:?}"),
        }
    }

    #[test]
    fn every_request_kind_round_trips() {
        for request in valid_requests() {
            let bytes = request.encode().expect("valid request encodes");
            assert_eq!(
                StreamRequest::decode(&bytes),
                Ok(Some((request.clone(), bytes.len())))
            );
            // Payload behind the header is not consumed.
            let mut with_payload = bytes.to_vec();
            with_payload.extend_from_slice(b"GET / HTTP/1.1\r\n");
            assert_eq!(
                StreamRequest::decode(&with_payload),
                Ok(Some((request, bytes.len())))
            );
        }
    }

    #[test]
    fn every_status_round_trips() {
        for (code, status) in Status::ALL.into_iter().enumerate() {
            assert_eq!(usize::from(status.code()), code);
            assert_eq!(Status::from_code(status.code()), Some(status));
        }
        assert_eq!(Status::from_code(9), None);
        for response in valid_responses() {
            let bytes = response.encode();
            assert_eq!(
                StreamResponse::decode(&bytes),
                Ok(Some((response.clone(), bytes.len())))
            );
            let mut with_payload = bytes.to_vec();
            with_payload.extend_from_slice(b"SSH-2.0-OpenSSH");
            assert_eq!(
                StreamResponse::decode(&with_payload),
                Ok(Some((response, bytes.len())))
            );
        }
    }

    #[test]
    fn status_names() {
        let names: Vec<_> = Status::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            names,
            [
                "ok",
                "refused",
                "unreachable",
                "timeout",
                "forbidden",
                "no-such-agent",
                "bad-request",
                "limit",
                "internal"
            ]
        );
        assert_eq!(Status::NoSuchAgent.to_string(), "no-such-agent");
    }

    #[test]
    fn display() {
        assert_eq!(
            dial("10.0.0.1", 80, 10_000).to_string(),
            "dial-tcp 10.0.0.1:80 (timeout 10s)"
        );
        assert_eq!(
            dial("::1", 22, 1500).to_string(),
            "dial-tcp [::1]:22 (timeout 1500ms)"
        );
        assert_eq!(
            dial("[::1]", 22, 1).to_string(),
            "dial-tcp [::1]:22 (timeout 1ms)"
        );
        assert_eq!(StreamRequest::AgentApi.to_string(), "agent-api");
        assert_eq!(
            StreamRequest::Relay(Bytes::from_static(b"abc")).to_string(),
            "relay (3 bytes)"
        );
        assert_eq!(StreamResponse::ok().to_string(), "ok");
        assert_eq!(
            StreamResponse::error(Status::Refused, "connection refused").to_string(),
            "refused: connection refused"
        );
    }

    #[test]
    fn every_prefix_of_a_valid_header_needs_more() {
        for request in valid_requests() {
            let bytes = request.encode().expect("encodes");
            for n in 0..bytes.len() {
                assert_eq!(
                    StreamRequest::decode(&bytes[..n]),
                    Ok(None),
                    "{request} {n}"
                );
            }
        }
        for response in valid_responses() {
            let bytes = response.encode();
            for n in 0..bytes.len() {
                assert_eq!(
                    StreamResponse::decode(&bytes[..n]),
                    Ok(None),
                    "{response} {n}"
                );
            }
        }
    }

    #[test]
    fn version_is_checked_from_the_first_byte() {
        for version in [0, 2, 255] {
            assert_eq!(
                request_err(&[version]),
                HeaderError::UnsupportedVersion(version)
            );
            assert_eq!(
                response_err(&[version, 0, 0, 0]),
                HeaderError::UnsupportedVersion(version)
            );
        }
    }

    #[test]
    fn kind_is_checked() {
        for kind in [0, 4, 255] {
            assert_eq!(request_err(&[1, kind]), HeaderError::UnknownKind(kind));
        }
    }

    #[test]
    fn status_is_checked() {
        for code in [9, 128, 255] {
            assert_eq!(response_err(&[1, code]), HeaderError::UnknownStatus(code));
        }
    }

    #[test]
    fn length_over_the_limit_is_refused_from_the_prefix() {
        for len in [1025u16, 4096, u16::MAX] {
            let [high, low] = len.to_be_bytes();
            let too_large = HeaderError::TooLarge {
                len: usize::from(len),
                max: MAX_HEADER_BODY,
            };
            assert_eq!(request_err(&[1, KIND_RELAY, high, low]), too_large);
            assert_eq!(request_err(&[1, KIND_DIAL_TCP, high, low]), too_large);
            assert_eq!(response_err(&[1, 0, high, low]), too_large);
        }
        assert_eq!(
            StreamRequest::Relay(Bytes::from(vec![0; MAX_HEADER_BODY + 1])).encode(),
            Err(HeaderError::TooLarge {
                len: MAX_HEADER_BODY + 1,
                max: MAX_HEADER_BODY
            })
        );
    }

    #[test]
    fn dial_body_length_is_checked_from_the_prefix() {
        for len in [0u16, 7, 261, 1024] {
            let [high, low] = len.to_be_bytes();
            assert_invalid(
                request_err(&[1, KIND_DIAL_TCP, high, low]),
                "dial-tcp body length",
            );
        }
    }

    #[test]
    fn agent_api_body_must_be_empty() {
        assert_invalid(
            request_err(&[1, KIND_AGENT_API, 0, 1]),
            "agent-api body length",
        );
    }

    #[test]
    fn timeout_is_checked() {
        for ms in [0, MAX_TIMEOUT_MS + 1, u32::MAX] {
            assert_invalid(request_err(&raw_dial(ms, 80, 1, b"h")), "timeout_ms");
        }
        for timeout in [
            Duration::ZERO,
            MAX_DIAL_TIMEOUT + Duration::from_millis(1),
            Duration::from_micros(1500),
            Duration::from_nanos(1),
        ] {
            let request = StreamRequest::DialTcp {
                host: "h".into(),
                port: 80,
                timeout,
            };
            assert_invalid(request.encode().unwrap_err(), "timeout");
        }
        assert!(dial("h", 80, 600_000).encode().is_ok());
    }

    #[test]
    fn port_is_checked() {
        assert_invalid(request_err(&raw_dial(1000, 0, 1, b"h")), "port");
        assert_invalid(dial("h", 0, 1000).encode().unwrap_err(), "port");
    }

    #[test]
    fn host_len_is_checked() {
        // host_len 0 with one byte left in the body.
        assert_invalid(request_err(&raw_dial(1000, 80, 0, b"h")), "host_len 0");
        assert_invalid(
            request_err(&raw_dial(1000, 80, 254, &[b'a'; 253])),
            "host_len 254",
        );
    }

    #[test]
    fn body_length_must_match_host_len() {
        // Trailing bytes inside the body.
        let error = request_err(&raw_dial(1000, 80, 4, b"hostX"));
        assert_invalid(error.clone(), "host_len 4");
        assert_invalid(error, "trailing bytes");
        // Too few: the body ends inside the host.
        let error = request_err(&raw_dial(1000, 80, 6, b"host"));
        assert_invalid(error.clone(), "host_len 6");
        assert_invalid(error, "ends inside the host");
    }

    #[test]
    fn host_is_checked() {
        let bad_hosts: [&[u8]; 13] = [
            b"a b",
            b"a\x00b",
            b"a\nb",
            b"a\x7f",
            "bücher.de".as_bytes(),
            b"\xff\xfe",
            b"a/b",
            b"user@host",
            b"host:80",
            b"[10.0.0.1]",
            b"[::1",
            b"::1]",
            b"[[::1]]",
        ];
        for host in bad_hosts {
            let error = request_err(&raw_dial(1000, 80, host.len() as u8, host));
            assert_invalid(error, "dial-tcp host");
            if let Ok(text) = std::str::from_utf8(host) {
                assert_invalid(dial(text, 80, 1000).encode().unwrap_err(), "dial-tcp host");
            }
        }
        assert_invalid(dial("", 80, 1000).encode().unwrap_err(), "dial-tcp host");
        assert_invalid(
            dial(&"a".repeat(MAX_HOST_LEN + 1), 80, 1000)
                .encode()
                .unwrap_err(),
            "dial-tcp host",
        );
    }

    #[test]
    fn message_must_be_utf8() {
        let error = response_err(&[1, 2, 0, 3, b'a', 0xc3, 0x28]);
        assert_invalid(error, "message");
    }

    #[test]
    fn long_messages_are_truncated_at_a_char_boundary() {
        // 'é' is two bytes: 1023 bytes of 'a' then 'é' would end at 1025.
        let message = format!("{}é", "a".repeat(MAX_HEADER_BODY - 1));
        let raw = StreamResponse {
            status: Status::Internal,
            message: message.clone(),
        };
        let (decoded, _) = StreamResponse::decode(&raw.encode())
            .expect("valid")
            .expect("complete");
        assert_eq!(decoded.message, "a".repeat(MAX_HEADER_BODY - 1));
        assert_eq!(
            StreamResponse::error(Status::Internal, message),
            decoded,
            "error() truncates the same way"
        );
    }

    /// The examples in docs/tunnel.md, byte for byte.
    #[test]
    fn documented_examples() {
        let hex = |bytes: &[u8]| {
            bytes
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(
            hex(&dial("10.0.0.1", 80, 10_000).encode().expect("valid")),
            "01 01 00 0f 00 00 27 10 00 50 08 31 30 2e 30 2e 30 2e 31"
        );
        assert_eq!(
            hex(&dial("::1", 22, 1500).encode().expect("valid")),
            "01 01 00 0a 00 00 05 dc 00 16 03 3a 3a 31"
        );
        assert_eq!(
            hex(&StreamRequest::AgentApi.encode().expect("valid")),
            "01 02 00 00"
        );
        assert_eq!(hex(&StreamResponse::ok().encode()), "01 00 00 00");
        assert_eq!(
            hex(&StreamResponse::error(Status::Refused, "connection refused").encode()),
            "01 01 00 12 63 6f 6e 6e 65 63 74 69 6f 6e 20 72 65 66 75 73 65 64"
        );
        // The refused examples.
        assert_eq!(request_err(&[2]), HeaderError::UnsupportedVersion(2));
        assert_eq!(request_err(&[1, 4]), HeaderError::UnknownKind(4));
        assert_eq!(
            request_err(&[1, 3, 0x07, 0xd0]),
            HeaderError::TooLarge {
                len: 2000,
                max: MAX_HEADER_BODY
            }
        );
        assert_invalid(
            request_err(&[
                1, 1, 0, 0x0c, 0, 0, 0x03, 0xe8, 0, 0x50, 4, b'h', b'o', b's', b't', b'X',
            ]),
            "trailing bytes",
        );
        assert_invalid(
            request_err(&[1, 1, 0, 8, 0, 0, 0x03, 0xe8, 0, 0, 1, b'h']),
            "port 0",
        );
    }

    /// Deterministic mutation fuzzing on stable (the cargo-fuzz target `tunnel_header` goes
    /// further): bit flips, truncations, insertions, removals and byte overwrites of valid
    /// encodings. Decoding never panics; whatever decodes re-encodes to exactly the bytes
    /// it was decoded from; every refusal has a reason.
    #[test]
    fn decoders_survive_mutated_input() {
        struct XorShift(u64);
        impl XorShift {
            fn next(&mut self) -> u64 {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                self.0
            }
            fn below(&mut self, n: usize) -> usize {
                (self.next() % n.max(1) as u64) as usize
            }
        }
        fn mutate(rng: &mut XorShift, seed: &[u8]) -> Vec<u8> {
            let mut data = seed.to_vec();
            for _ in 0..=rng.below(3) {
                match rng.below(5) {
                    0 if !data.is_empty() => {
                        let i = rng.below(data.len());
                        data[i] ^= 1 << rng.below(8);
                    }
                    1 if !data.is_empty() => data.truncate(rng.below(data.len())),
                    2 => {
                        let i = rng.below(data.len() + 1);
                        data.insert(i, rng.next() as u8);
                    }
                    3 if !data.is_empty() => {
                        let i = rng.below(data.len());
                        data.remove(i);
                    }
                    _ if !data.is_empty() => {
                        // Overwrite with an interesting byte (lengths, boundaries).
                        let i = rng.below(data.len());
                        data[i] = [0, 1, 2, 3, 4, 7, 8, 9, 0x3a, 0x5b, 0x7f, 0xff][rng.below(12)];
                    }
                    _ => {}
                }
            }
            data
        }

        let requests: Vec<Vec<u8>> = valid_requests()
            .iter()
            .map(|r| r.encode().expect("valid").to_vec())
            .collect();
        let responses: Vec<Vec<u8>> = valid_responses()
            .iter()
            .map(|r| r.encode().to_vec())
            .collect();
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        let (mut accepted, mut accepted_dials, mut refused, mut partial) = (0, 0, 0, 0);
        for round in 0..20_000 {
            let input = mutate(&mut rng, &requests[round % requests.len()]);
            match StreamRequest::decode(&input) {
                Ok(Some((request, consumed))) => {
                    accepted += 1;
                    if matches!(request, StreamRequest::DialTcp { .. }) {
                        accepted_dials += 1;
                    }
                    let bytes = request.encode().expect("what decodes, encodes");
                    assert_eq!(&bytes[..], &input[..consumed], "{request}");
                }
                Ok(None) => partial += 1,
                Err(error) => {
                    refused += 1;
                    assert!(!error.to_string().is_empty());
                }
            }
            let input = mutate(&mut rng, &responses[round % responses.len()]);
            match StreamResponse::decode(&input) {
                Ok(Some((response, consumed))) => {
                    accepted += 1;
                    assert_eq!(&response.encode()[..], &input[..consumed]);
                }
                Ok(None) => partial += 1,
                Err(error) => {
                    refused += 1;
                    assert!(!error.to_string().is_empty());
                }
            }
        }
        // The mutator exercises all three outcomes, and dials survive some mutations.
        assert!(accepted > 1000 && refused > 1000 && partial > 1000 && accepted_dials > 100);
    }

    #[tokio::test]
    async fn read_request_leaves_the_payload_unread() {
        for request in valid_requests() {
            // Capacity 1: the header arrives one byte at a time.
            let (mut reader, mut writer) = tokio::io::duplex(1);
            let header = request.encode().expect("valid");
            let writing = tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                writer.write_all(&header).await?;
                writer.write_all(b"PAYLOAD").await?;
                writer.shutdown().await
            });
            assert_eq!(read_request(&mut reader).await.expect("reads"), request);
            let mut rest = Vec::new();
            reader.read_to_end(&mut rest).await.expect("rest");
            assert_eq!(rest, b"PAYLOAD");
            writing.await.expect("join").expect("write");
        }
    }

    #[tokio::test]
    async fn read_response_leaves_the_payload_unread() {
        for response in valid_responses() {
            let mut input = response.encode().to_vec();
            input.extend_from_slice(b"PAYLOAD");
            let mut reader = &input[..];
            assert_eq!(read_response(&mut reader).await.expect("reads"), response);
            assert_eq!(reader, b"PAYLOAD");
        }
    }

    #[tokio::test]
    async fn an_oversized_header_is_refused_after_its_prefix() {
        use tokio::io::AsyncWriteExt;
        let (mut reader, mut writer) = tokio::io::duplex(64);
        // The prefix announces 2000 body bytes; only 3 follow and the writer stays open, so
        // waiting for the body would hang.
        writer
            .write_all(&[1, KIND_RELAY, 0x07, 0xd0, b'x', b'y', b'z'])
            .await
            .expect("write");
        let result = tokio::time::timeout(Duration::from_secs(5), read_request(&mut reader))
            .await
            .expect("refused without waiting for the body");
        assert!(matches!(
            result,
            Err(ReadHeaderError::Header(HeaderError::TooLarge {
                len: 2000,
                max: MAX_HEADER_BODY
            }))
        ));
        let mut rest = [0u8; 3];
        reader.read_exact(&mut rest).await.expect("rest");
        assert_eq!(&rest, b"xyz", "only the prefix was read");

        let mut bad_dial: &[u8] = &raw_dial(1000, 0, 1, b"h");
        let error = read_request(&mut bad_dial).await.unwrap_err();
        assert!(
            matches!(&error, ReadHeaderError::Header(HeaderError::Invalid(text)) if text.contains("port"))
        );
        let io_error = io::Error::from(error);
        assert_eq!(io_error.kind(), io::ErrorKind::InvalidData);
        assert!(
            io_error
                .get_ref()
                .and_then(|e| e.downcast_ref::<HeaderError>())
                .is_some()
        );
    }

    #[tokio::test]
    async fn a_stream_ending_inside_the_header_is_unexpected_eof() {
        let header = dial("example.com", 443, 10_000).encode().expect("valid");
        for n in 0..header.len() {
            let mut reader = &header[..n];
            match read_request(&mut reader).await {
                Err(ReadHeaderError::Io(error)) => {
                    assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof)
                }
                other => panic!("{n} bytes: {other:?}"),
            }
        }
        let mut empty: &[u8] = &[];
        assert!(matches!(
            read_response(&mut empty).await,
            Err(ReadHeaderError::Io(_))
        ));
    }
}
