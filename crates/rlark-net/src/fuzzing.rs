//! Fuzz target bodies over the pod network's parsers of untrusted input (IP packets), as
//! plain functions: the cargo-fuzz target `agent_packet` in `fuzz/` (nightly, libFuzzer)
//! calls them, and so do this crate's stable mutation tests. Not an API: compiled for tests
//! and with the `fuzzing` feature only.
// A fuzz target states its invariants as panics: that is how the fuzzer reports them.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::packet::{
    Echo, EchoKind, Packet, PacketError, Transport, build_echo, build_udp, parse_echo_message,
};

/// IP packets as a replica's TUN device gives them, and ICMP messages as an `Icmp` relay
/// stream frames them: parsing never panics, every refusal has a reason, and what parses
/// as UDP or ICMP echo re-builds into a packet that parses back to the same addresses and
/// transport (`parse(build(x)) == x`). Returns whether the input parsed as a packet.
pub fn packet(data: &[u8]) -> bool {
    let accepted = match Packet::parse(data) {
        Ok(packet) => {
            rebuild(&packet);
            true
        }
        Err(error) => {
            assert!(!error.to_string().is_empty());
            false
        }
    };
    for ipv6 in [false, true] {
        match parse_echo_message(ipv6, data) {
            Ok(echo) => {
                let (from, to) = if ipv6 {
                    (
                        IpAddr::V6(Ipv6Addr::LOCALHOST),
                        IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                    )
                } else {
                    (
                        IpAddr::V4(Ipv4Addr::LOCALHOST),
                        IpAddr::V4(Ipv4Addr::BROADCAST),
                    )
                };
                rebuild(&Packet {
                    source: from,
                    destination: to,
                    transport: Transport::Echo(echo),
                    ip_payload: data,
                });
            }
            Err(error) => assert!(!error.to_string().is_empty()),
        }
    }
    accepted
}

fn rebuild(packet: &Packet<'_>) {
    let built = match packet.transport {
        Transport::Udp {
            source_port,
            destination_port,
            payload,
        } => build_udp(
            SocketAddr::new(packet.source, source_port),
            SocketAddr::new(packet.destination, destination_port),
            payload,
        ),
        Transport::Echo(echo) => build_echo(packet.source, packet.destination, &echo),
        _ => return,
    };
    match built {
        Ok(bytes) => {
            let again = Packet::parse(&bytes).expect("a built packet parses");
            assert_eq!(again.source, packet.source);
            assert_eq!(again.destination, packet.destination);
            assert_eq!(again.transport, packet.transport);
        }
        // A payload parsed from an IPv6 jumbogram (or past 64 KiB) has no single packet.
        Err(PacketError::TooBig { .. }) => {}
        Err(other) => panic!("re-building a parsed packet failed: {other}"),
    }
}

/// Runs [`packet`] over `rounds` deterministic mutations (bit flips, truncations,
/// insertions, removals, byte overwrites) of valid UDP and echo packets of both families.
/// Returns how many inputs parsed as packets and how many were refused.
pub fn mutate_packets(rounds: usize) -> (usize, usize) {
    let a4 = IpAddr::V4(Ipv4Addr::new(10, 88, 0, 2));
    let b4 = IpAddr::V4(Ipv4Addr::new(10, 88, 0, 9));
    let a6 = IpAddr::V6(Ipv6Addr::new(0xfd00, 0x88, 0, 0, 0, 0, 0, 2));
    let b6 = IpAddr::V6(Ipv6Addr::new(0xfd00, 0x88, 0, 0, 0, 0, 0, 9));
    let mut seeds = Vec::new();
    for (from, to) in [(a4, b4), (a6, b6)] {
        for payload in [&b""[..], b"payload", &[7u8; 64]] {
            seeds.push(
                build_udp(
                    SocketAddr::new(from, 5353),
                    SocketAddr::new(to, 53),
                    payload,
                )
                .expect("seed"),
            );
            for kind in [EchoKind::Request, EchoKind::Reply] {
                let echo = Echo {
                    kind,
                    id: 77,
                    seq: 3,
                    data: payload,
                };
                let packet = build_echo(from, to, &echo).expect("seed");
                let header = if from.is_ipv6() { 40 } else { 20 };
                seeds.push(packet[header..].to_vec());
                seeds.push(packet);
            }
        }
    }
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let (mut accepted, mut refused) = (0, 0);
    for round in 0..rounds {
        let input = rng.mutate(&seeds[round % seeds.len()]);
        if packet(&input) {
            accepted += 1;
        } else {
            refused += 1;
        }
    }
    (accepted, refused)
}

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

    fn mutate(&mut self, seed: &[u8]) -> Vec<u8> {
        let mut data = seed.to_vec();
        for _ in 0..=self.below(3) {
            match self.below(5) {
                0 if !data.is_empty() => {
                    let i = self.below(data.len());
                    data[i] ^= 1 << self.below(8);
                }
                1 if !data.is_empty() => data.truncate(self.below(data.len())),
                2 => {
                    let i = self.below(data.len() + 1);
                    data.insert(i, self.next() as u8);
                }
                3 if !data.is_empty() => {
                    let i = self.below(data.len());
                    data.remove(i);
                }
                _ if !data.is_empty() => {
                    // Interesting bytes: versions, header lengths, protocol numbers,
                    // ICMP types, fragment flags, lengths.
                    let i = self.below(data.len());
                    data[i] =
                        [0, 1, 6, 8, 17, 0x20, 0x3a, 0x45, 0x60, 0x80, 0x81, 0xff][self.below(12)];
                }
                _ => {}
            }
        }
        data
    }
}
