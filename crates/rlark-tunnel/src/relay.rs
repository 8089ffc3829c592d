//! The pod-network relay header: the body of a [`StreamRequest::Relay`] stream header,
//! naming one flow between two members of a Domain (`docs/tunnel.md`, section "Relay").
//!
//! A relay stream is opened by an agent towards the hub (the hub fills in nothing; it takes
//! the caller's cluster from the session's certificate), by the hub towards the destination
//! agent (with [`RelayHeader::source_cluster`] set to that certified cluster), or by one
//! agent directly to another over mTLS (the caller's cluster is then the peer certificate's).
//! The acceptor answers with the ordinary [`crate::header::StreamResponse`]; after `Ok`, Tcp
//! streams carry raw bytes both ways and Udp/Icmp streams carry datagrams, each framed as a
//! big-endian `u16` length and that many bytes.
//!
//! The codec is sans-IO, canonical and checked: [`RelayHeader::decode`] never panics and
//! names the field it refuses; [`RelayHeader::encode`] refuses exactly what decoding
//! refuses, so whatever decodes re-encodes to the same bytes.
//!
//! Wire format, version 1 (all integers big-endian):
//!
//! | bytes      | field          | rule                                                    |
//! |------------|----------------|---------------------------------------------------------|
//! | 1          | version        | 1                                                       |
//! | 1          | protocol       | 1 tcp, 2 udp, 3 icmp, 4 probe                           |
//! | 1          | family         | 4 (IPv4) or 6 (IPv6), for both addresses                |
//! | 4 or 16    | source         | unicast, not loopback/unspecified/v4-mapped            |
//! | 4 or 16    | destination    | same rules                                              |
//! | 2          | port           | tcp/udp 1..=65535; icmp/probe 0                         |
//! | 2          | source_port    | udp 1..=65535; tcp any; icmp/probe 0                    |
//! | 1          | domain_len     | 1..=253                                                 |
//! | domain_len | domain         | a DNS-1123 subdomain                                    |
//! | 1          | cluster_len    | 0 (no source_cluster) or 1..=57                         |
//! | cluster_len| source_cluster | a cluster ID: a DNS-1123 label of at most 57 characters |
//!
//! Nothing may follow the last field (the stream header's length delimits the body).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};

use crate::dial::{self, DialError};
use crate::header::{MAX_HEADER_BODY, Status, StreamRequest};
use crate::mux::{Control, MuxStream};

/// The only relay header version.
pub const RELAY_VERSION: u8 = 1;
/// Longest Domain name (a DNS-1123 subdomain).
pub const MAX_DOMAIN_LEN: usize = 253;
/// Longest cluster ID (so that `rlark-<id>` is a DNS-1123 label).
pub const MAX_CLUSTER_LEN: usize = 57;
/// Largest payload of one framed datagram on a Udp/Icmp relay stream (the `u16` length).
pub const MAX_DATAGRAM: usize = u16::MAX as usize;
/// Receive window of each tunnel stream of a relayed TCP flow
/// ([`crate::mux::MuxStream::raise_window`]; capped at `MuxConfig::window`), set by the
/// stream's receiver once it knows the stream is one: the hub for both of its streams, the
/// destination agent for the stream it accepts, the source agent for the stream it opened.
/// A relayed byte crosses two tunnels and three processes, so a stream's credit comes
/// back much later than over one loopback hop, and the 512 KiB start window held a single
/// relayed stream to about 200 MB/s (docs/benchmarks.md, `rlark bench net`). Memory stays bounded
/// by the window: at most this much is buffered per stream and direction at each receiver.
pub const RELAY_WINDOW: u32 = 2 * 1024 * 1024;

const PROTO_TCP: u8 = 1;
const PROTO_UDP: u8 = 2;
const PROTO_ICMP: u8 = 3;
const PROTO_PROBE: u8 = 4;

/// The protocol of the relayed flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// One TCP connection; raw bytes both ways after `Ok`.
    Tcp,
    /// One UDP flow (source ip:port to destination ip:port); framed datagrams both ways.
    Udp,
    /// ICMP echo between the two addresses; framed ICMP messages both ways.
    Icmp,
    /// Authorize and check that the destination is a member served by the acceptor; no
    /// payload: the acceptor answers and ends the stream.
    Probe,
}

impl Protocol {
    /// All protocols, in wire-code order.
    pub const ALL: [Protocol; 4] = [
        Protocol::Tcp,
        Protocol::Udp,
        Protocol::Icmp,
        Protocol::Probe,
    ];

    /// `tcp`, `udp`, `icmp`, `probe` (metric label values and logs).
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Icmp => "icmp",
            Protocol::Probe => "probe",
        }
    }

    /// The wire code (1..=4).
    pub fn code(self) -> u8 {
        match self {
            Protocol::Tcp => PROTO_TCP,
            Protocol::Udp => PROTO_UDP,
            Protocol::Icmp => PROTO_ICMP,
            Protocol::Probe => PROTO_PROBE,
        }
    }

    /// The protocol with this wire code, if any.
    pub fn from_code(code: u8) -> Option<Protocol> {
        match code {
            PROTO_TCP => Some(Protocol::Tcp),
            PROTO_UDP => Some(Protocol::Udp),
            PROTO_ICMP => Some(Protocol::Icmp),
            PROTO_PROBE => Some(Protocol::Probe),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One relayed flow between two members of a Domain.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RelayHeader {
    /// The Domain's name (a DNS-1123 subdomain of at most 253 characters).
    pub domain: String,
    /// What the stream carries after `Ok`: a TCP connection, a UDP flow, ICMP echo, or
    /// nothing (a probe).
    pub protocol: Protocol,
    /// The caller's virtual IP.
    pub source: IpAddr,
    /// The callee's virtual IP; the same family as `source`.
    pub destination: IpAddr,
    /// Destination port: 1..=65535 for Tcp/Udp, 0 for Icmp/Probe.
    pub port: u16,
    /// The caller's port: 1..=65535 for Udp (replies are rebuilt with it), any for Tcp
    /// (informative), 0 for Icmp/Probe.
    pub source_port: u16,
    /// The caller's cluster, set only by the hub when it forwards a relay to the destination
    /// agent (taken from the caller's tunnel certificate). The hub refuses a header that
    /// arrives from an agent with this set.
    pub source_cluster: Option<String>,
}

/// Why a relay header was refused; the text names the field. Every variant is the sender's
/// fault (answered with [`Status::BadRequest`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelayError {
    /// The relay body's version byte (carried here) is not [`RELAY_VERSION`].
    #[error("relay header version {0} is not supported (only version {RELAY_VERSION})")]
    UnsupportedVersion(u8),
    /// The body is longer than a stream header body may be.
    #[error("relay header body is {len} bytes; at most {max} are allowed")]
    TooLarge {
        /// The body length in bytes.
        len: usize,
        /// The limit in bytes ([`MAX_HEADER_BODY`]).
        max: usize,
    },
    /// The body ended inside the named field.
    #[error("relay header ends inside its {0} field")]
    Truncated(&'static str),
    /// Bytes follow the last field.
    #[error("relay header body has {0} trailing bytes after its source_cluster field")]
    Trailing(usize),
    /// A field is out of range or malformed.
    #[error("relay header field {field}: {reason}")]
    Invalid {
        /// The field's name as in the wire format (`domain`, `port`, ...).
        field: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
}

impl RelayError {
    fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        RelayError::Invalid {
            field,
            reason: reason.into(),
        }
    }

    /// The field the error is about (`version`, `body` for the size and trailing bytes).
    pub fn field(&self) -> &'static str {
        match self {
            RelayError::UnsupportedVersion(_) => "version",
            RelayError::TooLarge { .. } | RelayError::Trailing(_) => "body",
            RelayError::Truncated(field) | RelayError::Invalid { field, .. } => field,
        }
    }
}

impl RelayHeader {
    /// Checks every rule the wire format states (see the module docs).
    pub fn validate(&self) -> Result<(), RelayError> {
        check_domain(self.domain.as_bytes())?;
        check_addresses(self.source, self.destination)?;
        check_ports(self.protocol, self.port, self.source_port)?;
        if let Some(cluster) = &self.source_cluster {
            check_cluster(cluster.as_bytes())?;
        }
        Ok(())
    }

    /// The canonical wire form (the body of a [`StreamRequest::Relay`]). Refuses every value
    /// [`RelayHeader::decode`] would refuse.
    pub fn encode(&self) -> Result<Bytes, RelayError> {
        self.validate()?;
        let cluster = self.source_cluster.as_deref().unwrap_or("");
        let addr_len = if self.source.is_ipv4() { 4 } else { 16 };
        let len = 3 + 2 * addr_len + 4 + 1 + self.domain.len() + 1 + cluster.len();
        if len > MAX_HEADER_BODY {
            // Unreachable with the field limits (at most 3+32+4+1+253+1+57 = 351 bytes),
            // kept so the size contract does not rest on arithmetic elsewhere.
            return Err(RelayError::TooLarge {
                len,
                max: MAX_HEADER_BODY,
            });
        }
        let mut out = BytesMut::with_capacity(len);
        out.put_u8(RELAY_VERSION);
        out.put_u8(self.protocol.code());
        match (self.source, self.destination) {
            (IpAddr::V4(source), IpAddr::V4(destination)) => {
                out.put_u8(4);
                out.put_slice(&source.octets());
                out.put_slice(&destination.octets());
            }
            (IpAddr::V6(source), IpAddr::V6(destination)) => {
                out.put_u8(6);
                out.put_slice(&source.octets());
                out.put_slice(&destination.octets());
            }
            // validate() refused mixed families.
            _ => return Err(family_mismatch(self.source, self.destination)),
        }
        out.put_u16(self.port);
        out.put_u16(self.source_port);
        // Checked: 1..=253 and 0..=57 bytes.
        out.put_u8(self.domain.len() as u8);
        out.put_slice(self.domain.as_bytes());
        out.put_u8(cluster.len() as u8);
        out.put_slice(cluster.as_bytes());
        Ok(out.freeze())
    }

    /// Decodes a whole relay body (exactly: trailing bytes are refused). Never panics.
    pub fn decode(body: &[u8]) -> Result<Self, RelayError> {
        if body.len() > MAX_HEADER_BODY {
            return Err(RelayError::TooLarge {
                len: body.len(),
                max: MAX_HEADER_BODY,
            });
        }
        let mut reader = Reader { rest: body };
        let version = reader.u8("version")?;
        if version != RELAY_VERSION {
            return Err(RelayError::UnsupportedVersion(version));
        }
        let code = reader.u8("protocol")?;
        let protocol = Protocol::from_code(code).ok_or_else(|| {
            RelayError::invalid(
                "protocol",
                format!("code {code} is unknown (1 tcp, 2 udp, 3 icmp, 4 probe)"),
            )
        })?;
        let family = reader.u8("family")?;
        let (source, destination) = match family {
            4 => (
                IpAddr::V4(Ipv4Addr::from(reader.array::<4>("source")?)),
                IpAddr::V4(Ipv4Addr::from(reader.array::<4>("destination")?)),
            ),
            6 => (
                IpAddr::V6(Ipv6Addr::from(reader.array::<16>("source")?)),
                IpAddr::V6(Ipv6Addr::from(reader.array::<16>("destination")?)),
            ),
            other => {
                return Err(RelayError::invalid(
                    "family",
                    format!("{other} is not an address family (4 or 6)"),
                ));
            }
        };
        check_addresses(source, destination)?;
        let port = u16::from_be_bytes(reader.array::<2>("port")?);
        let source_port = u16::from_be_bytes(reader.array::<2>("source_port")?);
        check_ports(protocol, port, source_port)?;
        // The lengths' ranges are checked with the fields they measure, so a refusal names
        // `domain` / `source_cluster` whichever side (encode or decode) finds it.
        let domain_len = usize::from(reader.u8("domain_len")?);
        let domain = reader.take(domain_len, "domain")?;
        check_domain(domain)?;
        let cluster_len = usize::from(reader.u8("cluster_len")?);
        let cluster = reader.take(cluster_len, "source_cluster")?;
        let source_cluster = if cluster.is_empty() {
            None
        } else {
            check_cluster(cluster)?;
            Some(ascii(cluster, "source_cluster")?)
        };
        if !reader.rest.is_empty() {
            return Err(RelayError::Trailing(reader.rest.len()));
        }
        Ok(RelayHeader {
            domain: ascii(domain, "domain")?,
            protocol,
            source,
            destination,
            port,
            source_port,
            source_cluster,
        })
    }

    /// The stream header that carries this relay header.
    pub fn to_request(&self) -> Result<StreamRequest, RelayError> {
        Ok(StreamRequest::Relay(self.encode()?))
    }

    /// The same header with `source_cluster` set (what the hub forwards).
    pub fn with_source_cluster(&self, cluster: impl Into<String>) -> Self {
        RelayHeader {
            source_cluster: Some(cluster.into()),
            ..self.clone()
        }
    }
}

impl fmt::Display for RelayHeader {
    /// `tcp 10.8.0.2:40000 -> 10.8.0.3:80 in domain ray`, `udp [fd00::2]:5353 -> [fd00::3]:53
    /// in domain d from cluster a`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let endpoint = |f: &mut fmt::Formatter<'_>, ip: IpAddr, port: u16| match ip {
            IpAddr::V4(ip) => write!(f, "{ip}:{port}"),
            IpAddr::V6(ip) => write!(f, "[{ip}]:{port}"),
        };
        write!(f, "{} ", self.protocol)?;
        endpoint(f, self.source, self.source_port)?;
        f.write_str(" -> ")?;
        endpoint(f, self.destination, self.port)?;
        write!(f, " in domain {}", self.domain)?;
        if let Some(cluster) = &self.source_cluster {
            write!(f, " from cluster {cluster}")?;
        }
        Ok(())
    }
}

/// Opens a relay stream on `control`: writes the stream header carrying `header`, reads the
/// acceptor's response within `timeout`. Ok: the stream, positioned at the first payload
/// byte. A header that cannot be encoded is [`Status::BadRequest`] and opens nothing; the
/// other errors are [`dial::open`]'s.
pub async fn open(
    control: &Control,
    header: &RelayHeader,
    timeout: Duration,
) -> Result<MuxStream, DialError> {
    let request = header
        .to_request()
        .map_err(|e| DialError::new(Status::BadRequest, e.to_string()))?;
    dial::open(control, &request, timeout).await
}

/// A cursor over the body that names the field it runs out in.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], RelayError> {
        if self.rest.len() < n {
            return Err(RelayError::Truncated(field));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, RelayError> {
        Ok(self.array::<1>(field)?[0])
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], RelayError> {
        let bytes = self.take(N, field)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }
}

fn ascii(bytes: &[u8], field: &'static str) -> Result<String, RelayError> {
    // The callers checked the bytes are ASCII; refuse rather than unwrap anyway.
    String::from_utf8(bytes.to_vec()).map_err(|_| RelayError::invalid(field, "is not ASCII"))
}

fn family_mismatch(source: IpAddr, destination: IpAddr) -> RelayError {
    RelayError::invalid(
        "destination",
        format!("{destination} is not of the same address family as the source {source}"),
    )
}

fn check_addresses(source: IpAddr, destination: IpAddr) -> Result<(), RelayError> {
    check_unicast(source, "source")?;
    check_unicast(destination, "destination")?;
    if source.is_ipv4() != destination.is_ipv4() {
        return Err(family_mismatch(source, destination));
    }
    Ok(())
}

/// A member's virtual IP is a unicast address of a Domain's CIDR: never unspecified,
/// loopback, multicast, limited broadcast, or an IPv4 address dressed as IPv6 (which would
/// let one member be named in two families).
fn check_unicast(ip: IpAddr, field: &'static str) -> Result<(), RelayError> {
    let problem = match ip {
        IpAddr::V4(v4) if v4.is_unspecified() => Some("the unspecified address"),
        IpAddr::V4(v4) if v4.is_loopback() => Some("a loopback address"),
        IpAddr::V4(v4) if v4.is_multicast() => Some("a multicast address"),
        IpAddr::V4(v4) if v4.is_broadcast() => Some("the broadcast address"),
        IpAddr::V6(v6) if v6.is_unspecified() => Some("the unspecified address"),
        IpAddr::V6(v6) if v6.is_loopback() => Some("a loopback address"),
        IpAddr::V6(v6) if v6.is_multicast() => Some("a multicast address"),
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => Some("an IPv4-mapped IPv6 address"),
        _ => None,
    };
    match problem {
        Some(problem) => Err(RelayError::invalid(
            field,
            format!("{ip} is {problem}; a member's address is unicast"),
        )),
        None => Ok(()),
    }
}

fn check_ports(protocol: Protocol, port: u16, source_port: u16) -> Result<(), RelayError> {
    match protocol {
        Protocol::Tcp | Protocol::Udp if port == 0 => Err(RelayError::invalid(
            "port",
            format!("0 is not a port; {protocol} needs 1..=65535"),
        )),
        Protocol::Udp if source_port == 0 => Err(RelayError::invalid(
            "source_port",
            "0 is not a port; udp needs the caller's port 1..=65535 to address replies",
        )),
        Protocol::Icmp | Protocol::Probe if port != 0 => Err(RelayError::invalid(
            "port",
            format!("{port}: {protocol} has no port (must be 0)"),
        )),
        Protocol::Icmp | Protocol::Probe if source_port != 0 => Err(RelayError::invalid(
            "source_port",
            format!("{source_port}: {protocol} has no port (must be 0)"),
        )),
        _ => Ok(()),
    }
}

/// A DNS-1123 subdomain: 1..=253 bytes, dot-separated labels of `[a-z0-9-]` that start and
/// end with a letter or digit.
fn check_domain(domain: &[u8]) -> Result<(), RelayError> {
    if !(1..=MAX_DOMAIN_LEN).contains(&domain.len()) {
        return Err(RelayError::invalid(
            "domain",
            format!("is {} bytes; must be 1..={MAX_DOMAIN_LEN}", domain.len()),
        ));
    }
    for label in domain.split(|&b| b == b'.') {
        if let Some(reason) = label_problem(label) {
            return Err(RelayError::invalid(
                "domain",
                format!(
                    "{:?} is not a DNS-1123 subdomain: {reason}",
                    String::from_utf8_lossy(domain)
                ),
            ));
        }
    }
    Ok(())
}

/// A cluster ID: 1..=57 bytes of `[a-z0-9-]`, starting and ending with a letter or digit
/// (so `rlark-<id>` is a namespace name).
fn check_cluster(cluster: &[u8]) -> Result<(), RelayError> {
    if !(1..=MAX_CLUSTER_LEN).contains(&cluster.len()) {
        return Err(RelayError::invalid(
            "source_cluster",
            format!("is {} bytes; must be 1..={MAX_CLUSTER_LEN}", cluster.len()),
        ));
    }
    if let Some(reason) = label_problem(cluster) {
        return Err(RelayError::invalid(
            "source_cluster",
            format!(
                "{:?} is not a cluster ID: {reason}",
                String::from_utf8_lossy(cluster)
            ),
        ));
    }
    Ok(())
}

fn label_problem(label: &[u8]) -> Option<String> {
    let (Some(&first), Some(&last)) = (label.first(), label.last()) else {
        return Some("empty label".to_owned());
    };
    if let Some(&byte) = label
        .iter()
        .find(|&&b| !(b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
    {
        return Some(format!(
            "byte 0x{byte:02x}: only lowercase letters, digits, '-' (and '.' between labels)"
        ));
    }
    if first == b'-' || last == b'-' {
        return Some("a label must start and end with a letter or digit".to_owned());
    }
    None
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::header::{self, StreamResponse};
    use crate::mutation::{Rng, mutate};
    use crate::mux::{MuxConfig, Role, Session};
    use crate::transport::memory_pair;

    fn v4(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn tcp() -> RelayHeader {
        RelayHeader {
            domain: "ray".into(),
            protocol: Protocol::Tcp,
            source: v4("10.8.0.2"),
            destination: v4("10.8.0.3"),
            port: 80,
            source_port: 40000,
            source_cluster: None,
        }
    }

    fn valid_headers() -> Vec<RelayHeader> {
        let v6 = RelayHeader {
            domain: "a.b-c.d0".into(),
            protocol: Protocol::Udp,
            source: v4("fd00::2"),
            destination: v4("fd00::3"),
            port: 53,
            source_port: 5353,
            source_cluster: Some("edge-1".into()),
        };
        vec![
            tcp(),
            RelayHeader {
                source_port: 0,
                ..tcp()
            },
            tcp().with_source_cluster("a"),
            tcp().with_source_cluster("c".repeat(MAX_CLUSTER_LEN)),
            v6.clone(),
            RelayHeader {
                protocol: Protocol::Icmp,
                port: 0,
                source_port: 0,
                ..v6.clone()
            },
            RelayHeader {
                protocol: Protocol::Probe,
                port: 0,
                source_port: 0,
                ..tcp()
            },
            RelayHeader {
                domain: format!("{}.{}", "a".repeat(126), "b".repeat(126)),
                port: 65535,
                source_port: 65535,
                ..tcp()
            },
            RelayHeader {
                domain: "0".into(),
                ..tcp()
            },
        ]
    }

    fn field_of(result: Result<impl fmt::Debug, RelayError>) -> &'static str {
        result.expect_err("refused").field()
    }

    #[test]
    fn valid_headers_round_trip() {
        for header in valid_headers() {
            let bytes = header.encode().expect("valid");
            assert_eq!(RelayHeader::decode(&bytes), Ok(header.clone()), "{header}");
            // Wrapped in a stream header, it survives that codec too.
            let request = header.to_request().expect("valid");
            let (decoded, _) = StreamRequest::decode(&request.encode().expect("fits"))
                .expect("valid")
                .expect("complete");
            assert_eq!(decoded, request);
        }
    }

    /// The example in docs/tunnel.md, byte for byte.
    #[test]
    fn documented_example() {
        let hex = |bytes: &[u8]| {
            bytes
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(
            hex(&tcp().encode().expect("valid")),
            "01 01 04 0a 08 00 02 0a 08 00 03 00 50 9c 40 03 72 61 79 00"
        );
        assert_eq!(
            hex(&tcp().with_source_cluster("a").encode().expect("valid")),
            "01 01 04 0a 08 00 02 0a 08 00 03 00 50 9c 40 03 72 61 79 01 61"
        );
        assert_eq!(
            tcp().with_source_cluster("a").to_string(),
            "tcp 10.8.0.2:40000 -> 10.8.0.3:80 in domain ray from cluster a"
        );
    }

    #[test]
    fn encode_refuses_what_decode_refuses() {
        let cases: Vec<(RelayHeader, &str)> = vec![
            (
                RelayHeader {
                    destination: v4("fd00::3"),
                    ..tcp()
                },
                "destination",
            ),
            (RelayHeader { port: 0, ..tcp() }, "port"),
            (
                RelayHeader {
                    protocol: Protocol::Udp,
                    source_port: 0,
                    ..tcp()
                },
                "source_port",
            ),
            (
                RelayHeader {
                    protocol: Protocol::Icmp,
                    source_port: 0,
                    ..tcp()
                },
                "port",
            ),
            (
                RelayHeader {
                    protocol: Protocol::Probe,
                    port: 0,
                    source_port: 1,
                    ..tcp()
                },
                "source_port",
            ),
            (
                RelayHeader {
                    domain: String::new(),
                    ..tcp()
                },
                "domain",
            ),
            (
                RelayHeader {
                    domain: "Ray".into(),
                    ..tcp()
                },
                "domain",
            ),
            (
                RelayHeader {
                    domain: "a..b".into(),
                    ..tcp()
                },
                "domain",
            ),
            (
                RelayHeader {
                    domain: "-a".into(),
                    ..tcp()
                },
                "domain",
            ),
            (
                RelayHeader {
                    domain: "a.".into(),
                    ..tcp()
                },
                "domain",
            ),
            (
                RelayHeader {
                    domain: "a".repeat(254),
                    ..tcp()
                },
                "domain",
            ),
            (
                RelayHeader {
                    domain: "bücher".into(),
                    ..tcp()
                },
                "domain",
            ),
            (tcp().with_source_cluster(""), "source_cluster"),
            (tcp().with_source_cluster("A"), "source_cluster"),
            (tcp().with_source_cluster("a.b"), "source_cluster"),
            (tcp().with_source_cluster("a-"), "source_cluster"),
            (
                tcp().with_source_cluster("c".repeat(MAX_CLUSTER_LEN + 1)),
                "source_cluster",
            ),
            (
                RelayHeader {
                    source: v4("0.0.0.0"),
                    ..tcp()
                },
                "source",
            ),
            (
                RelayHeader {
                    source: v4("127.0.0.1"),
                    ..tcp()
                },
                "source",
            ),
            (
                RelayHeader {
                    destination: v4("224.0.0.1"),
                    ..tcp()
                },
                "destination",
            ),
            (
                RelayHeader {
                    destination: v4("255.255.255.255"),
                    ..tcp()
                },
                "destination",
            ),
            (
                RelayHeader {
                    source: v4("::ffff:10.8.0.2"),
                    destination: v4("fd00::3"),
                    ..tcp()
                },
                "source",
            ),
            (
                RelayHeader {
                    source: v4("fd00::3"),
                    destination: v4("::1"),
                    ..tcp()
                },
                "destination",
            ),
        ];
        for (header, field) in cases {
            let error = header.encode().expect_err("refused");
            assert_eq!(error.field(), field, "{header:?}: {error}");
            assert!(error.to_string().contains(field), "{error}");
            if header.source_cluster.as_deref() == Some("") {
                // On the wire an empty cluster is the absent one, so Some("") has no wire
                // form to refuse: encode refuses it so that it cannot silently become None.
                continue;
            }
            // The same values, forced onto the wire, are refused by decode naming the field.
            let raw = raw(&header);
            let decoded = RelayHeader::decode(&raw);
            assert_eq!(field_of(decoded), field, "{header:?}");
        }
    }

    /// Encodes without validating (what a hostile sender could write).
    fn raw(header: &RelayHeader) -> Vec<u8> {
        let mut out = vec![RELAY_VERSION, header.protocol.code()];
        match header.source {
            IpAddr::V4(ip) => {
                out.push(4);
                out.extend_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                out.push(6);
                out.extend_from_slice(&ip.octets());
            }
        }
        // A family mismatch on the wire: the destination is read in the source's family.
        match (header.source, header.destination) {
            (IpAddr::V4(_), IpAddr::V6(_)) => out.extend_from_slice(&[0; 16]),
            (IpAddr::V6(_), IpAddr::V4(ip)) => out.extend_from_slice(&ip.octets()),
            (_, IpAddr::V4(ip)) => out.extend_from_slice(&ip.octets()),
            (_, IpAddr::V6(ip)) => out.extend_from_slice(&ip.octets()),
        }
        out.extend_from_slice(&header.port.to_be_bytes());
        out.extend_from_slice(&header.source_port.to_be_bytes());
        out.push(header.domain.len().min(255) as u8);
        out.extend_from_slice(header.domain.as_bytes());
        let cluster = header.source_cluster.as_deref().unwrap_or("");
        out.push(cluster.len() as u8);
        out.extend_from_slice(cluster.as_bytes());
        out
    }

    #[test]
    fn structural_refusals_name_the_field() {
        let good = tcp().encode().expect("valid").to_vec();
        assert_eq!(field_of(RelayHeader::decode(&[])), "version");
        assert_eq!(
            RelayHeader::decode(&[2, 1]),
            Err(RelayError::UnsupportedVersion(2))
        );
        assert_eq!(field_of(RelayHeader::decode(&[1, 0, 4])), "protocol");
        assert_eq!(field_of(RelayHeader::decode(&[1, 5, 4])), "protocol");
        assert_eq!(field_of(RelayHeader::decode(&[1, 1, 5])), "family");
        assert_eq!(field_of(RelayHeader::decode(&[1, 1, 0])), "family");
        // Every proper prefix is truncated in the field that the cut falls into.
        let fields = [
            "version",
            "protocol",
            "family",
            "source",
            "source",
            "source",
            "source",
            "destination",
            "destination",
            "destination",
            "destination",
            "port",
            "port",
            "source_port",
            "source_port",
            "domain_len",
            "domain",
            "domain",
            "domain",
            "cluster_len",
        ];
        assert_eq!(fields.len(), good.len());
        for (cut, field) in fields.iter().enumerate() {
            assert_eq!(
                RelayHeader::decode(&good[..cut]),
                Err(RelayError::Truncated(field)),
                "cut at {cut}"
            );
        }
        let mut trailing = good.clone();
        trailing.extend_from_slice(b"xy");
        assert_eq!(RelayHeader::decode(&trailing), Err(RelayError::Trailing(2)));
        // A cluster_len that runs past the end.
        let mut long = good.clone();
        *long.last_mut().expect("cluster_len") = 3;
        long.push(b'a');
        assert_eq!(
            RelayHeader::decode(&long),
            Err(RelayError::Truncated("source_cluster"))
        );
        let mut over = good.clone();
        *over.last_mut().expect("cluster_len") = 58;
        over.extend_from_slice(&[b'a'; 58]);
        assert_eq!(field_of(RelayHeader::decode(&over)), "source_cluster");
        let mut zero_domain = good[..15].to_vec();
        zero_domain.extend_from_slice(&[0, 0]);
        assert_eq!(field_of(RelayHeader::decode(&zero_domain)), "domain");
        assert!(matches!(
            RelayHeader::decode(&vec![1; MAX_HEADER_BODY + 1]),
            Err(RelayError::TooLarge { .. })
        ));
    }

    /// Deterministic mutation fuzzing on stable (the cargo-fuzz target `relay_header` goes
    /// further): decoding never panics, whatever decodes re-encodes to exactly its input,
    /// every refusal names a field.
    #[test]
    fn decode_survives_mutated_input() {
        let seeds: Vec<Vec<u8>> = valid_headers()
            .iter()
            .map(|h| h.encode().expect("valid").to_vec())
            .collect();
        let seed_refs: Vec<&[u8]> = seeds.iter().map(Vec::as_slice).collect();
        let mut rng = Rng(0x5eed_0016_4e1a_7000);
        let (mut accepted, mut refused) = (0, 0);
        for round in 0..30_000 {
            let mut input = seeds[round % seeds.len()].clone();
            mutate(&mut rng, &mut input, &seed_refs, |rng, input| {
                // The interesting bytes: protocol, family, length fields.
                let i = rng.below(input.len());
                input[i] = [0, 1, 2, 3, 4, 5, 6, 16, 57, 58, 253, 254, 255][rng.below(13)];
            });
            match RelayHeader::decode(&input) {
                Ok(header) => {
                    accepted += 1;
                    let bytes = header.encode().expect("what decodes, encodes");
                    assert_eq!(&bytes[..], &input[..], "{header}");
                }
                Err(error) => {
                    refused += 1;
                    assert!(!error.field().is_empty());
                    assert!(error.to_string().contains(error.field()), "{error}");
                }
            }
        }
        assert!(accepted > 1000 && refused > 1000, "{accepted} {refused}");
    }

    #[tokio::test]
    async fn open_carries_the_header_and_returns_the_answer() {
        let (a, b) = memory_pair(16);
        let (hub, _hub_in) = Session::new(a, Role::Server, MuxConfig::default());
        let (_agent, mut agent_in) = Session::new(b, Role::Client, MuxConfig::default());
        let acceptor = tokio::spawn(async move {
            // First stream: accepted, echoes one message.
            let mut s = agent_in.next().await.expect("stream");
            let StreamRequest::Relay(body) = header::read_request(&mut s).await.expect("req")
            else {
                panic!("not a relay request");
            };
            assert_eq!(RelayHeader::decode(&body), Ok(tcp()));
            s.write_all(&StreamResponse::ok().encode())
                .await
                .expect("w");
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).await.expect("r");
            s.write_all(&buf).await.expect("w");
            s.shutdown().await.expect("shutdown");
            // Second: refused.
            let mut s = agent_in.next().await.expect("stream");
            header::read_request(&mut s).await.expect("req");
            let answer = StreamResponse::error(Status::Forbidden, "source is not a member");
            s.write_all(&answer.encode()).await.expect("w");
            s.shutdown().await.expect("shutdown");
            let _ = s.read(&mut [0u8; 1]).await;
        });
        let mut s = open(&hub, &tcp(), Duration::from_secs(5))
            .await
            .expect("open");
        s.write_all(b"ping").await.expect("w");
        let mut back = Vec::new();
        s.read_to_end(&mut back).await.expect("r");
        assert_eq!(back, b"ping");
        let err = open(&hub, &tcp(), Duration::from_secs(5))
            .await
            .expect_err("refused");
        assert_eq!(
            err,
            DialError::new(Status::Forbidden, "source is not a member")
        );
        // Unencodable: BadRequest, nothing opened.
        let before = hub.stats().streams_total;
        let err = open(
            &hub,
            &RelayHeader { port: 0, ..tcp() },
            Duration::from_secs(5),
        )
        .await
        .expect_err("bad");
        assert_eq!(err.status, Status::BadRequest);
        assert!(err.message.contains("port"), "{err}");
        assert_eq!(hub.stats().streams_total, before);
        acceptor.await.expect("join");
    }
}
