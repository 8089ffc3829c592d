//! Checked views over IP packets and their builders: what the datagram plane
//! ([`super::datagram`]) reads from a replica's TUN device and writes back into it.
//!
//! Sans-IO: [`Packet::parse`] and [`parse_echo_message`] are pure functions over untrusted
//! bytes (a replica's kernel on one side, a remote agent's frames on the other); they
//! never panic and refuse what they cannot read with a [`PacketError`] naming the layer and
//! the reason. [`build_udp`] and [`build_echo`] make complete IPv4/IPv6 packets with
//! correct header and transport checksums (IPv6: over the pseudo-header).
//!
//! Parsing and building use [etherparse]: bounds-checked slice views (no copy), IPv6
//! extension headers walked, builders that compute every checksum, one small dependency
//! (arrayvec) and fuzzed upstream. smoltcp's `wire` module was the other candidate; its
//! current release pulls bitflags 1 next to the tree's bitflags 2, heapless and managed,
//! and the plane needs no TCP state machine from it.
//!
//! What is read: IPv4 and IPv6; UDP (ports, payload bounded by the UDP length field);
//! ICMPv4 echo in IPv4 and ICMPv6 echo in IPv6 (id, sequence, data); TCP (the ports only,
//! for a userspace TCP mode). Other ICMP messages and other protocols are reported as
//! such, not refused. Fragments are refused ([`PacketError::Fragmented`]): the TUN's MTU
//! is large and the plane does not reassemble. Checksums of parsed packets are not
//! verified: TUN packets come from the replica's own kernel, and whatever crosses the
//! network is re-built here with fresh checksums.
//!
//! [etherparse]: https://docs.rs/etherparse

use std::net::{IpAddr, SocketAddr};

use etherparse::err::packet::BuildVecWriteError;
use etherparse::{
    Icmpv4Slice, Icmpv4Type, Icmpv6Slice, Icmpv6Type, IpHeaders, IpNumber, IpSlice, PacketBuilder,
    PacketBuilderStep, TcpSlice, UdpSlice,
};

/// The TTL / hop limit of the packets the plane builds: they are delivered into the
/// replica's own namespace, so any value the kernel accepts would do; 64 is Linux's.
pub const HOP_LIMIT: u8 = 64;

/// Whether an ICMP echo message asks or answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EchoKind {
    /// Echo request (ICMPv4 type 8, ICMPv6 type 128).
    Request,
    /// Echo reply (ICMPv4 type 0, ICMPv6 type 129).
    Reply,
}

/// An ICMP echo message (either family): identifier, sequence number and data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Echo<'a> {
    pub kind: EchoKind,
    pub id: u16,
    pub seq: u16,
    pub data: &'a [u8],
}

/// The transport part of a parsed packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport<'a> {
    /// UDP: ports and the payload (as long as the UDP length field says).
    Udp {
        source_port: u16,
        destination_port: u16,
        payload: &'a [u8],
    },
    /// TCP: the ports only.
    Tcp {
        source_port: u16,
        destination_port: u16,
    },
    /// ICMP echo (ICMPv4 in IPv4, ICMPv6 in IPv6).
    Echo(Echo<'a>),
    /// Any other ICMP message of the packet's family (type and code).
    Icmp { icmp_type: u8, code: u8 },
    /// Any other protocol, or ICMP of the other family: the IP protocol number.
    Other { protocol: u8 },
}

/// A checked view of one IP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<'a> {
    /// The IP source address.
    pub source: IpAddr,
    /// The IP destination address (same family as `source`).
    pub destination: IpAddr,
    /// The transport header's meaning.
    pub transport: Transport<'a>,
    /// The IP payload (after any IPv6 extension headers), as long as the IP header says:
    /// for ICMP the whole ICMP message, which is what the plane frames.
    pub ip_payload: &'a [u8],
}

/// Why bytes are not a packet the plane can use, or a packet cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// A header is truncated or inconsistent.
    #[error("malformed {layer}: {reason}")]
    Malformed { layer: &'static str, reason: String },
    /// An IP fragment: the plane does not reassemble.
    #[error("IP fragment (fragments are not reassembled)")]
    Fragmented,
    /// An ICMP message that is not the echo message expected.
    #[error("ICMP {family} message type {icmp_type} code {code} is not an echo request or reply")]
    NotEcho {
        family: &'static str,
        icmp_type: u8,
        code: u8,
    },
    /// Source and destination of a packet to build are of different families.
    #[error("address family mismatch: from {from} to {to}")]
    FamilyMismatch { from: IpAddr, to: IpAddr },
    /// The payload does not fit in one packet.
    #[error("payload of {len} bytes does not fit in one {what} packet")]
    TooBig { what: &'static str, len: usize },
}

fn malformed(layer: &'static str, reason: impl ToString) -> PacketError {
    PacketError::Malformed {
        layer,
        reason: reason.to_string(),
    }
}

impl<'a> Packet<'a> {
    /// Parses one IP packet (IPv4 or IPv6, by the version nibble), as read from a TUN
    /// device without packet information header. Trailing bytes after the length the IP
    /// header states are ignored. Never panics.
    pub fn parse(bytes: &'a [u8]) -> Result<Packet<'a>, PacketError> {
        let ip = IpSlice::from_slice(bytes).map_err(|e| malformed("IP header", e))?;
        let payload = ip.payload();
        if payload.fragmented {
            return Err(PacketError::Fragmented);
        }
        let (source, destination) = (ip.source_addr(), ip.destination_addr());
        let v6 = matches!(ip, IpSlice::Ipv6(_));
        let data = payload.payload;
        let transport = match payload.ip_number {
            IpNumber::UDP => {
                let udp = UdpSlice::from_slice(data).map_err(|e| malformed("UDP header", e))?;
                Transport::Udp {
                    source_port: udp.source_port(),
                    destination_port: udp.destination_port(),
                    payload: udp.payload(),
                }
            }
            IpNumber::TCP => {
                let tcp = TcpSlice::from_slice(data).map_err(|e| malformed("TCP header", e))?;
                Transport::Tcp {
                    source_port: tcp.source_port(),
                    destination_port: tcp.destination_port(),
                }
            }
            IpNumber::ICMP if !v6 => icmpv4(data)?,
            IpNumber::IPV6_ICMP if v6 => icmpv6(data)?,
            other => Transport::Other { protocol: other.0 },
        };
        Ok(Packet {
            source,
            destination,
            transport,
            ip_payload: data,
        })
    }
}

fn icmpv4(message: &[u8]) -> Result<Transport<'_>, PacketError> {
    let icmp = Icmpv4Slice::from_slice(message).map_err(|e| malformed("ICMPv4 header", e))?;
    Ok(match icmp.icmp_type() {
        Icmpv4Type::EchoRequest(h) => Transport::Echo(Echo {
            kind: EchoKind::Request,
            id: h.id,
            seq: h.seq,
            data: icmp.payload(),
        }),
        Icmpv4Type::EchoReply(h) => Transport::Echo(Echo {
            kind: EchoKind::Reply,
            id: h.id,
            seq: h.seq,
            data: icmp.payload(),
        }),
        _ => Transport::Icmp {
            icmp_type: icmp.type_u8(),
            code: icmp.code_u8(),
        },
    })
}

fn icmpv6(message: &[u8]) -> Result<Transport<'_>, PacketError> {
    let icmp = Icmpv6Slice::from_slice(message).map_err(|e| malformed("ICMPv6 header", e))?;
    Ok(match icmp.icmp_type() {
        Icmpv6Type::EchoRequest(h) => Transport::Echo(Echo {
            kind: EchoKind::Request,
            id: h.id,
            seq: h.seq,
            data: icmp.payload(),
        }),
        Icmpv6Type::EchoReply(h) => Transport::Echo(Echo {
            kind: EchoKind::Reply,
            id: h.id,
            seq: h.seq,
            data: icmp.payload(),
        }),
        _ => Transport::Icmp {
            icmp_type: icmp.type_u8(),
            code: icmp.code_u8(),
        },
    })
}

/// Parses a bare ICMP message (no IP header) of the given family, as a datagram frame of
/// an `Icmp` relay stream carries it: it must be an echo request or reply. The checksum
/// is not verified (the message is re-built by [`build_echo`] before it reaches a
/// kernel). Never panics.
pub fn parse_echo_message(ipv6: bool, message: &[u8]) -> Result<Echo<'_>, PacketError> {
    let transport = if ipv6 {
        icmpv6(message)?
    } else {
        icmpv4(message)?
    };
    match transport {
        Transport::Echo(echo) => Ok(echo),
        Transport::Icmp { icmp_type, code } => Err(PacketError::NotEcho {
            family: if ipv6 { "v6" } else { "v4" },
            icmp_type,
            code,
        }),
        // icmpv4/icmpv6 only return Echo or Icmp.
        _ => Err(malformed("ICMP header", "not an ICMP message")),
    }
}

/// The IP layer of a packet from `from` to `to` (same family).
fn ip_step(from: IpAddr, to: IpAddr) -> Result<PacketBuilderStep<IpHeaders>, PacketError> {
    match (from, to) {
        (IpAddr::V4(f), IpAddr::V4(t)) => {
            Ok(PacketBuilder::ipv4(f.octets(), t.octets(), HOP_LIMIT))
        }
        (IpAddr::V6(f), IpAddr::V6(t)) => {
            Ok(PacketBuilder::ipv6(f.octets(), t.octets(), HOP_LIMIT))
        }
        _ => Err(PacketError::FamilyMismatch { from, to }),
    }
}

fn build_error(what: &'static str, len: usize, error: BuildVecWriteError) -> PacketError {
    match error {
        BuildVecWriteError::PayloadLen(_) => PacketError::TooBig { what, len },
        other => malformed(what, other),
    }
}

/// Builds an IPv4 or IPv6 UDP packet from `from` to `to` carrying `payload`, with the
/// IPv4 header checksum and the UDP checksum over the pseudo-header. A payload that does
/// not fit the length fields is [`PacketError::TooBig`].
pub fn build_udp(from: SocketAddr, to: SocketAddr, payload: &[u8]) -> Result<Vec<u8>, PacketError> {
    let step = ip_step(from.ip(), to.ip())?.udp(from.port(), to.port());
    let mut out = Vec::with_capacity(step.size(payload.len()));
    step.write_to_vec(&mut out, payload)
        .map_err(|e| build_error("UDP", payload.len(), e))?;
    Ok(out)
}

/// Builds an ICMP echo packet from `from` to `to` (ICMPv4 in IPv4, ICMPv6 in IPv6), with
/// every checksum (ICMPv6: over the pseudo-header).
pub fn build_echo(from: IpAddr, to: IpAddr, echo: &Echo<'_>) -> Result<Vec<u8>, PacketError> {
    let ip = ip_step(from, to)?;
    let mut out = Vec::new();
    // Each arm has its own builder type; the write is the same.
    macro_rules! write {
        ($step:expr) => {{
            let step = $step;
            out.reserve(step.size(echo.data.len()));
            step.write_to_vec(&mut out, echo.data)
        }};
    }
    let written = match (from, echo.kind) {
        (IpAddr::V4(_), EchoKind::Request) => write!(ip.icmpv4_echo_request(echo.id, echo.seq)),
        (IpAddr::V4(_), EchoKind::Reply) => write!(ip.icmpv4_echo_reply(echo.id, echo.seq)),
        (IpAddr::V6(_), EchoKind::Request) => write!(ip.icmpv6_echo_request(echo.id, echo.seq)),
        (IpAddr::V6(_), EchoKind::Reply) => write!(ip.icmpv6_echo_reply(echo.id, echo.seq)),
    };
    written.map_err(|e| build_error("ICMP echo", echo.data.len(), e))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    const A4: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 88, 0, 2));
    const B4: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 88, 0, 9));
    const A6: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0x88, 0, 0, 0, 0, 0, 2));
    const B6: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0x88, 0, 0, 0, 0, 0, 9));

    /// RFC 1071 ones' complement sum, written independently of etherparse: a correct
    /// checksum makes the sum over the covered bytes (with the checksum in place) 0xffff.
    fn ones_sum(chunks: &[&[u8]]) -> u16 {
        let mut sum: u32 = 0;
        for chunk in chunks {
            for pair in chunk.chunks(2) {
                let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
                sum += u32::from(word);
            }
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum as u16
    }

    fn pseudo_header(from: IpAddr, to: IpAddr, protocol: u8, len: usize) -> Vec<u8> {
        let mut p = Vec::new();
        match (from, to) {
            (IpAddr::V4(f), IpAddr::V4(t)) => {
                p.extend_from_slice(&f.octets());
                p.extend_from_slice(&t.octets());
                p.extend_from_slice(&[0, protocol]);
                p.extend_from_slice(&(len as u16).to_be_bytes());
            }
            (IpAddr::V6(f), IpAddr::V6(t)) => {
                p.extend_from_slice(&f.octets());
                p.extend_from_slice(&t.octets());
                p.extend_from_slice(&(len as u32).to_be_bytes());
                p.extend_from_slice(&[0, 0, 0, protocol]);
            }
            _ => panic!("family mismatch in the test"),
        }
        p
    }

    /// Checks the IPv4 header checksum and the transport checksum of a built packet.
    fn assert_checksums(packet: &[u8]) {
        let parsed = Packet::parse(packet).expect("built packets parse");
        let (protocol, header_len) = match parsed.source {
            IpAddr::V4(_) => {
                let ihl = usize::from(packet[0] & 0x0f) * 4;
                assert_eq!(ones_sum(&[&packet[..ihl]]), 0xffff, "IPv4 header checksum");
                (packet[9], ihl)
            }
            IpAddr::V6(_) => (packet[6], 40),
        };
        let transport = &packet[header_len..];
        let covered_by_pseudo = protocol != 1; // ICMPv4 has no pseudo-header
        let pseudo = if covered_by_pseudo {
            pseudo_header(parsed.source, parsed.destination, protocol, transport.len())
        } else {
            Vec::new()
        };
        assert_eq!(
            ones_sum(&[&pseudo, transport]),
            0xffff,
            "transport checksum of protocol {protocol}"
        );
    }

    #[test]
    fn udp_round_trips_with_checksums_in_both_families() {
        for (from, to) in [(A4, B4), (A6, B6)] {
            for payload in [&b""[..], b"x", b"hello, domain", &[0xab; 1400]] {
                let packet = build_udp(
                    SocketAddr::new(from, 40000),
                    SocketAddr::new(to, 53),
                    payload,
                )
                .unwrap();
                assert_checksums(&packet);
                let parsed = Packet::parse(&packet).unwrap();
                assert_eq!(parsed.source, from);
                assert_eq!(parsed.destination, to);
                assert_eq!(
                    parsed.transport,
                    Transport::Udp {
                        source_port: 40000,
                        destination_port: 53,
                        payload,
                    }
                );
                assert_eq!(parsed.ip_payload.len(), 8 + payload.len());
            }
        }
    }

    #[test]
    fn echo_round_trips_with_checksums_in_both_families() {
        for (from, to) in [(A4, B4), (A6, B6)] {
            for kind in [EchoKind::Request, EchoKind::Reply] {
                let echo = Echo {
                    kind,
                    id: 0x1234,
                    seq: 7,
                    data: b"abcdefgh01234567",
                };
                let packet = build_echo(from, to, &echo).unwrap();
                assert_checksums(&packet);
                let parsed = Packet::parse(&packet).unwrap();
                assert_eq!((parsed.source, parsed.destination), (from, to), "{kind:?}");
                assert_eq!(parsed.transport, Transport::Echo(echo));
                // The framed ICMP message parses back to the same echo.
                assert_eq!(
                    parse_echo_message(from.is_ipv6(), parsed.ip_payload),
                    Ok(echo)
                );
            }
        }
    }

    /// A hand-written packet (not from the builder): the kernel's `ping` echo request
    /// from 10.88.0.2 to 10.88.0.9 with id 0x0b0c, seq 1 and 4 bytes of data.
    #[test]
    fn parses_a_hand_written_ipv4_echo_request() {
        let mut packet = vec![
            0x45, 0, 0, 32, 0x12, 0x34, 0x40, 0, 64, 1, 0, 0, 10, 88, 0, 2, 10, 88, 0,
            9, // IPv4
            8, 0, 0, 0, 0x0b, 0x0c, 0, 1, // ICMP echo request, id, seq
            b'p', b'i', b'n', b'g',
        ];
        let ip = !ones_sum(&[&packet[..20]]);
        packet[10..12].copy_from_slice(&ip.to_be_bytes());
        let icmp = !ones_sum(&[&packet[20..]]);
        packet[22..24].copy_from_slice(&icmp.to_be_bytes());
        let parsed = Packet::parse(&packet).unwrap();
        assert_eq!((parsed.source, parsed.destination), (A4, B4));
        assert_eq!(
            parsed.transport,
            Transport::Echo(Echo {
                kind: EchoKind::Request,
                id: 0x0b0c,
                seq: 1,
                data: b"ping",
            })
        );
        // Trailing bytes past the IPv4 total length are not part of the packet.
        packet.extend_from_slice(b"junk");
        assert_eq!(Packet::parse(&packet).unwrap().ip_payload.len(), 12);
    }

    #[test]
    fn other_protocols_and_icmp_messages_are_reported_not_refused() {
        let udp = build_udp(SocketAddr::new(A4, 1), SocketAddr::new(B4, 2), b"x").unwrap();
        // The same bytes relabelled as TCP are too short for a TCP header.
        let mut as_tcp = udp.clone();
        as_tcp[9] = 6;
        assert!(matches!(
            Packet::parse(&as_tcp),
            Err(PacketError::Malformed {
                layer: "TCP header",
                ..
            })
        ));
        // ICMPv6 inside IPv4 is not ICMP of the packet's family.
        let mut v6_in_v4 = udp.clone();
        v6_in_v4[9] = 58;
        assert_eq!(
            Packet::parse(&v6_in_v4).unwrap().transport,
            Transport::Other { protocol: 58 }
        );
        // GRE.
        let mut gre = udp.clone();
        gre[9] = 47;
        assert_eq!(
            Packet::parse(&gre).unwrap().transport,
            Transport::Other { protocol: 47 }
        );
        // ICMPv4 destination unreachable (port): an ICMP message, not an echo.
        let echo = build_echo(
            A4,
            B4,
            &Echo {
                kind: EchoKind::Request,
                id: 1,
                seq: 1,
                data: b"",
            },
        )
        .unwrap();
        let mut unreachable = echo.clone();
        unreachable[20] = 3;
        unreachable[21] = 3;
        assert_eq!(
            Packet::parse(&unreachable).unwrap().transport,
            Transport::Icmp {
                icmp_type: 3,
                code: 3
            }
        );
        assert_eq!(
            parse_echo_message(false, &unreachable[20..]),
            Err(PacketError::NotEcho {
                family: "v4",
                icmp_type: 3,
                code: 3
            })
        );
        // Type 8 is an echo request in ICMPv4 but not in ICMPv6.
        assert!(matches!(
            parse_echo_message(true, &echo[20..]),
            Err(PacketError::NotEcho {
                family: "v6",
                icmp_type: 8,
                ..
            })
        ));
        // A TCP SYN's ports.
        let mut syn = vec![
            0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 88, 0, 2, 10, 88, 0, 9,
        ];
        syn.extend_from_slice(&[0x9c, 0x40, 0x1f, 0x90, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02]);
        syn.extend_from_slice(&[0xff, 0xff, 0, 0, 0, 0]);
        assert_eq!(
            Packet::parse(&syn).unwrap().transport,
            Transport::Tcp {
                source_port: 40000,
                destination_port: 8080
            }
        );
    }

    #[test]
    fn malformed_and_fragmented_packets_are_refused_with_the_layer_named() {
        let udp4 = build_udp(SocketAddr::new(A4, 1), SocketAddr::new(B4, 2), b"abcd").unwrap();
        let udp6 = build_udp(SocketAddr::new(A6, 1), SocketAddr::new(B6, 2), b"abcd").unwrap();
        let mut more_fragments = udp4.clone();
        more_fragments[6] = 0x20;
        let mut offset = udp4.clone();
        offset[7] = 1;
        let mut udp_len_too_long = udp4.clone();
        udp_len_too_long[24..26].copy_from_slice(&100u16.to_be_bytes());
        let mut total_len_too_long = udp4.clone();
        total_len_too_long[2..4].copy_from_slice(&200u16.to_be_bytes());
        let mut version_7 = udp4.clone();
        version_7[0] = 0x75;
        let mut ihl_4 = udp4.clone();
        ihl_4[0] = 0x44;
        let mut v6_payload_len_too_long = udp6.clone();
        v6_payload_len_too_long[4..6].copy_from_slice(&500u16.to_be_bytes());
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("empty", vec![], "IP header"),
            ("one byte", vec![0x45], "IP header"),
            ("version 7", version_7, "IP header"),
            ("IHL below 5", ihl_4, "IP header"),
            (
                "IPv4 total length past the end",
                total_len_too_long,
                "IP header",
            ),
            (
                "IPv6 payload length past the end",
                v6_payload_len_too_long,
                "IP header",
            ),
            ("IPv4 header cut", udp4[..19].to_vec(), "IP header"),
            ("IPv6 header cut", udp6[..39].to_vec(), "IP header"),
            ("UDP length past the end", udp_len_too_long, "UDP header"),
        ];
        for (name, bytes, layer) in cases {
            match Packet::parse(&bytes) {
                Err(PacketError::Malformed { layer: got, reason }) => {
                    assert_eq!(got, layer, "{name}: {reason}");
                    assert!(!reason.is_empty(), "{name}");
                }
                other => panic!("{name}: {other:?}"),
            }
        }
        for (name, bytes) in [("more fragments", more_fragments), ("offset", offset)] {
            assert_eq!(
                Packet::parse(&bytes),
                Err(PacketError::Fragmented),
                "{name}"
            );
        }
    }

    #[test]
    fn builders_refuse_family_mismatch_and_oversized_payloads() {
        assert_eq!(
            build_udp(SocketAddr::new(A4, 1), SocketAddr::new(B6, 2), b""),
            Err(PacketError::FamilyMismatch { from: A4, to: B6 })
        );
        let echo = Echo {
            kind: EchoKind::Reply,
            id: 1,
            seq: 2,
            data: b"",
        };
        assert_eq!(
            build_echo(A6, B4, &echo),
            Err(PacketError::FamilyMismatch { from: A6, to: B4 })
        );
        let big = vec![0u8; 70_000];
        assert_eq!(
            build_udp(SocketAddr::new(A4, 1), SocketAddr::new(B4, 2), &big),
            Err(PacketError::TooBig {
                what: "UDP",
                len: 70_000
            })
        );
        let echo = Echo { data: &big, ..echo };
        assert!(matches!(
            build_echo(A6, B6, &echo),
            Err(PacketError::TooBig { .. })
        ));
        // The largest IPv4 UDP payload fits; one byte more does not.
        let max = vec![0u8; 65_535 - 20 - 8];
        assert!(build_udp(SocketAddr::new(A4, 1), SocketAddr::new(B4, 2), &max).is_ok());
        let over = vec![0u8; 65_535 - 20 - 8 + 1];
        assert!(build_udp(SocketAddr::new(A4, 1), SocketAddr::new(B4, 2), &over).is_err());
    }

    /// Deterministic mutation fuzzing on stable (the cargo-fuzz target `agent_packet`
    /// goes further) over the same body, [`crate::fuzzing::packet`].
    #[test]
    fn parsers_survive_mutated_input() {
        let (accepted, refused) = crate::fuzzing::mutate_packets(30_000);
        assert!(
            accepted > 1_000 && refused > 1_000,
            "{accepted} accepted, {refused} refused"
        );
    }
}
