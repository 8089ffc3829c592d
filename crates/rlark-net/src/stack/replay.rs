//! The retransmission nudge (sans IO). ipstack keeps no retransmission timer: it resends a
//! timed-out segment only while handling an incoming packet of that connection. When one
//! of its segments is lost (the replica's kernel drops a segment sent past a window that
//! just shrank: `TcpExtBeyondWindow`) and the replica has nothing more to send, no packet
//! ever arrives and the connection stalls for good. [`AckReplay`] watches both directions
//! of the device and, for a connection where the stack has unacknowledged data and the
//! replica has been silent for [`REPLAY_AFTER`], hands back the replica's last pure ACK to
//! feed into the stack again: ipstack then runs its retransmission check. A replayed ACK
//! is one the replica really sent, so it changes no state (a duplicate, or an old ACK
//! ipstack ignores).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use etherparse::{IpNumber, IpSlice, TcpSlice};

/// Silence (no packet from the replica) with unacknowledged data before a replay; above
/// ipstack's initial retransmission timeout (1 s).
pub const REPLAY_AFTER: Duration = Duration::from_millis(1500);
/// Replays of one connection without progress before it is left alone (ipstack's own
/// timeouts end it).
pub const MAX_REPLAYS: u32 = 12;
/// Connections tracked per replica; past it the longest-silent is forgotten.
pub const MAX_FLOWS: usize = 4096;

/// One connection as seen on the device: (replica's ip:port, other end's ip:port).
type FlowId = (SocketAddr, SocketAddr);

struct Flow {
    /// The replica's last pure ACK (no payload, no SYN/FIN/RST), whole.
    last_ack: Option<Vec<u8>>,
    /// The highest acknowledgment number the replica sent.
    acked: u32,
    /// The end of what the stack sent (sequence number after its last byte).
    sent_end: u32,
    /// When the replica last sent a packet (or the last replay).
    heard: Instant,
    replays: u32,
}

/// The fields of a TCP packet the tracker needs.
struct Seen {
    source: SocketAddr,
    destination: SocketAddr,
    seq: u32,
    ack: Option<u32>,
    /// Sequence space the segment takes (payload, plus one for SYN and for FIN).
    len: u32,
    rst: bool,
    pure_ack: bool,
}

fn parse(bytes: &[u8]) -> Option<Seen> {
    let ip = IpSlice::from_slice(bytes).ok()?;
    let payload = ip.payload();
    if payload.ip_number != IpNumber::TCP || payload.fragmented {
        return None;
    }
    let tcp = TcpSlice::from_slice(payload.payload).ok()?;
    let data = u32::try_from(tcp.payload().len()).ok()?;
    let len = data + u32::from(tcp.syn()) + u32::from(tcp.fin());
    Some(Seen {
        source: SocketAddr::new(ip.source_addr(), tcp.source_port()),
        destination: SocketAddr::new(ip.destination_addr(), tcp.destination_port()),
        seq: tcp.sequence_number(),
        ack: tcp.ack().then(|| tcp.acknowledgment_number()),
        len,
        rst: tcp.rst(),
        pure_ack: tcp.ack() && len == 0 && !tcp.rst(),
    })
}

/// `a` is after `b` in sequence space (RFC 1982 serial arithmetic).
fn after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// See the module documentation.
#[derive(Default)]
pub struct AckReplay {
    flows: HashMap<FlowId, Flow>,
}

impl AckReplay {
    /// A packet from the replica (into the stack). Anything but TCP is ignored.
    pub fn from_replica(&mut self, packet: &[u8], now: Instant) {
        let Some(seen) = parse(packet) else { return };
        let id = (seen.source, seen.destination);
        if seen.rst {
            self.flows.remove(&id);
            return;
        }
        if !self.flows.contains_key(&id) {
            if self.flows.len() >= MAX_FLOWS {
                self.forget_oldest();
            }
            self.flows.insert(
                id,
                Flow {
                    last_ack: None,
                    acked: seen.ack.unwrap_or(0),
                    sent_end: seen.ack.unwrap_or(0),
                    heard: now,
                    replays: 0,
                },
            );
        }
        let Some(flow) = self.flows.get_mut(&id) else {
            return;
        };
        flow.heard = now;
        if let Some(ack) = seen.ack
            && (after(ack, flow.acked) || flow.acked == 0)
        {
            flow.acked = ack;
            flow.replays = 0;
        }
        if seen.pure_ack {
            flow.last_ack = Some(packet.to_vec());
        }
    }

    /// A packet from the stack (to the replica).
    pub fn from_stack(&mut self, packet: &[u8]) {
        let Some(seen) = parse(packet) else { return };
        let id = (seen.destination, seen.source);
        if seen.rst {
            self.flows.remove(&id);
            return;
        }
        if let Some(flow) = self.flows.get_mut(&id) {
            let end = seen.seq.wrapping_add(seen.len);
            if after(end, flow.sent_end) || flow.sent_end == 0 {
                flow.sent_end = end;
            }
        }
    }

    /// The ACKs to feed into the stack again now: one per connection where the stack has
    /// unacknowledged data and the replica has been silent for [`REPLAY_AFTER`] (at most
    /// [`MAX_REPLAYS`] times without progress).
    pub fn due(&mut self, now: Instant) -> Vec<Vec<u8>> {
        let mut due = Vec::new();
        for flow in self.flows.values_mut() {
            let waiting = after(flow.sent_end, flow.acked);
            if !waiting
                || flow.replays >= MAX_REPLAYS
                || now.saturating_duration_since(flow.heard) < REPLAY_AFTER
            {
                continue;
            }
            if let Some(ack) = &flow.last_ack {
                due.push(ack.clone());
                flow.replays += 1;
                flow.heard = now;
            }
        }
        due
    }

    /// Connections tracked now.
    pub fn len(&self) -> usize {
        self.flows.len()
    }

    /// Whether no connection is tracked.
    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }

    fn forget_oldest(&mut self) {
        if let Some(id) = self
            .flows
            .iter()
            .min_by_key(|(_, flow)| flow.heard)
            .map(|(id, _)| *id)
        {
            self.flows.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use etherparse::PacketBuilder;

    use super::*;

    const REPLICA: &str = "10.88.0.2:40000";
    const REMOTE: &str = "10.88.0.9:80";

    #[derive(Default)]
    struct Flags {
        syn: bool,
        fin: bool,
        rst: bool,
        ack: Option<u32>,
    }

    fn tcp(from: &str, to: &str, seq: u32, flags: Flags, payload: &[u8]) -> Vec<u8> {
        let (from, to): (SocketAddr, SocketAddr) = (from.parse().unwrap(), to.parse().unwrap());
        let (std::net::IpAddr::V4(a), std::net::IpAddr::V4(b)) = (from.ip(), to.ip()) else {
            panic!("IPv4 here");
        };
        let mut builder =
            PacketBuilder::ipv4(a.octets(), b.octets(), 64).tcp(from.port(), to.port(), seq, 65535);
        if flags.syn {
            builder = builder.syn();
        }
        if flags.fin {
            builder = builder.fin();
        }
        if flags.rst {
            builder = builder.rst();
        }
        if let Some(ack) = flags.ack {
            builder = builder.ack(ack);
        }
        let mut packet = Vec::new();
        builder.write(&mut packet, payload).unwrap();
        packet
    }

    fn ack(n: u32) -> Flags {
        Flags {
            ack: Some(n),
            ..Flags::default()
        }
    }

    #[test]
    fn a_silent_replica_with_data_outstanding_gets_its_last_ack_replayed() {
        let t0 = Instant::now();
        let mut replay = AckReplay::default();
        // Handshake: SYN from the replica, SYN-ACK from the stack, ACK.
        let syn = Flags {
            syn: true,
            ..Flags::default()
        };
        replay.from_replica(&tcp(REPLICA, REMOTE, 999, syn, b""), t0);
        let syn_ack = Flags {
            syn: true,
            ack: Some(1000),
            ..Flags::default()
        };
        replay.from_stack(&tcp(REMOTE, REPLICA, 100, syn_ack, b""));
        let last_ack = tcp(REPLICA, REMOTE, 1000, ack(101), b"");
        replay.from_replica(&last_ack, t0);
        assert_eq!(replay.len(), 1);
        // Nothing outstanding: nothing to replay however long the silence.
        assert!(replay.due(t0 + Duration::from_secs(60)).is_empty());

        // The stack sends 3000 bytes; the replica acknowledges 1000 of them and falls
        // silent (the rest was lost).
        replay.from_stack(&tcp(REMOTE, REPLICA, 101, ack(1000), &[7; 1000]));
        replay.from_stack(&tcp(REMOTE, REPLICA, 1101, ack(1000), &[7; 2000]));
        let t1 = t0 + Duration::from_secs(1);
        let partial = tcp(REPLICA, REMOTE, 1000, ack(1101), b"");
        replay.from_replica(&partial, t1);
        assert!(
            replay.due(t1 + REPLAY_AFTER / 2).is_empty(),
            "not silent long enough"
        );
        let due = replay.due(t1 + REPLAY_AFTER);
        assert_eq!(due, vec![partial.clone()], "the replica's own last ACK");
        // Not again at once; again after another silent period.
        assert!(replay.due(t1 + REPLAY_AFTER).is_empty());
        assert_eq!(replay.due(t1 + REPLAY_AFTER * 2).len(), 1);
        // Bounded without progress.
        let mut at = t1 + REPLAY_AFTER * 2;
        let mut more = 0;
        for _ in 0..(MAX_REPLAYS * 2) {
            at += REPLAY_AFTER;
            more += replay.due(at).len();
        }
        assert_eq!(more as u32, MAX_REPLAYS - 2);

        // Progress resets the count; everything acknowledged ends the replays.
        replay.from_replica(&tcp(REPLICA, REMOTE, 1000, ack(2101), b""), at);
        assert_eq!(replay.due(at + REPLAY_AFTER).len(), 1);
        replay.from_replica(&tcp(REPLICA, REMOTE, 1000, ack(3101), b""), at);
        assert!(replay.due(at + REPLAY_AFTER * 3).is_empty());

        // A data packet from the replica is never replayed (its last pure ACK is).
        replay.from_stack(&tcp(REMOTE, REPLICA, 3101, ack(1000), &[1; 10]));
        replay.from_replica(&tcp(REPLICA, REMOTE, 1000, ack(3101), b"hello"), at);
        let due = replay.due(at + REPLAY_AFTER);
        assert_eq!(due.len(), 1);
        assert!(parse(&due[0]).is_some_and(|s| s.pure_ack));

        // A reset forgets the connection.
        let rst = Flags {
            rst: true,
            ..Flags::default()
        };
        replay.from_replica(&tcp(REPLICA, REMOTE, 1005, rst, b""), at);
        assert!(replay.is_empty());
    }

    #[test]
    fn sequence_numbers_wrap() {
        assert!(after(5, u32::MAX - 5));
        assert!(!after(u32::MAX - 5, 5));
        assert!(!after(7, 7));
    }

    #[test]
    fn non_tcp_and_garbage_are_ignored_and_flows_are_bounded() {
        let t0 = Instant::now();
        let mut replay = AckReplay::default();
        replay.from_replica(&[0x45, 0, 0, 1], t0);
        replay.from_stack(&[0x60]);
        let mut udp = Vec::new();
        PacketBuilder::ipv4([10, 88, 0, 2], [10, 88, 0, 9], 64)
            .udp(5000, 53)
            .write(&mut udp, b"q")
            .unwrap();
        replay.from_replica(&udp, t0);
        assert!(replay.is_empty());
        for port in 0..(MAX_FLOWS as u16 + 10) {
            let from = format!("10.88.0.2:{}", 1000 + port);
            replay.from_replica(&tcp(&from, REMOTE, 1, ack(1), b""), t0);
        }
        assert_eq!(replay.len(), MAX_FLOWS);
    }
}
