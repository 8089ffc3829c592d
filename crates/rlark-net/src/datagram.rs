//! The datagram plane of one replica: UDP and ICMP echo between domain members, and UDP
//! egress, over the replica's TUN device.
//!
//! In a replica's network namespace the default routes point at the TUN device, and in
//! kernel mode TCP is redirected by nftables before it gets there; so what the agent reads
//! from the TUN is UDP and ICMP. One [`DatagramPlane`] per replica reads it:
//!
//! ```text
//!  replica netns                    agent                                  peer agent
//!  ┌──────────┐  IP packet  ┌──────────────────┐ relay/direct stream ┌───────────────┐
//!  │ task     │────TUN────▶ │ classify → flow  │══ u16 len + bytes ══▶│ serve_inbound │─TUN─▶ task
//!  │ socket   │◀───TUN───── │ rebuild packet   │◀═════════════════════│ (reverse flow)│◀TUN── replies
//!  └──────────┘             └──────────────────┘                      └───────────────┘
//! ```
//!
//! - **UDP to the domain's CIDR**: one flow per (source ip:port, destination ip:port), one
//!   stream per flow opened through the [`Opener`] (the router's local/direct/relay choice)
//!   with a [`RelayHeader`] of protocol `Udp`. Frames are `u16` big-endian length + UDP
//!   payload, both ways; replies are re-built as packets from the peer's ip:port to the
//!   task's ip:port.
//! - **ICMP echo to the domain's CIDR**: one flow per (destination, echo identifier),
//!   protocol `Icmp`; frames carry the ICMP message. Only echo replies with the flow's
//!   identifier are delivered back; they are re-built with fresh checksums.
//! - **UDP elsewhere (egress)**: a UDP socket in the agent's namespace per flow, so a task
//!   in a domain keeps DNS and other outside UDP; replies are re-built the same way. ICMP
//!   to non-domain addresses is dropped.
//! - **Inbound** ([`DatagramPlane::serve_inbound`], called by the router once it has
//!   authorized a `Udp`/`Icmp` stream and answered `Ok`): frames become packets from the
//!   caller's virtual IP into this replica's TUN; the replica's answers (the reverse
//!   5-tuple, or echo replies with that identifier) are taken off the TUN by the same reader
//!   and framed back on that stream instead of starting a new outbound flow. The
//!   replica's kernel answers echo requests itself.
//!
//! A packet whose source is not one of the replica's own addresses is dropped: the source
//! of every header the plane sends is an address the replica holds, so a task cannot speak
//! for another member. Bounds: at most [`Limits::max_flows`] flows (the oldest is evicted),
//! at most [`Limits::max_queued_bytes`] bytes queued towards streams and sockets, idle
//! flows end after [`Limits::udp_idle`] / [`Limits::icmp_idle`]. Every dropped packet is
//! counted in `rlark_domain_datagrams_dropped_total{reason}`.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use ipnet::IpNet;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use rlark_tunnel::relay::{Protocol, RelayHeader};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::packet::{
    EchoKind, Packet, PacketError, Transport, build_echo, build_udp, parse_echo_message,
};

/// A bidirectional byte stream carrying framed datagrams.
pub trait DatagramStream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> DatagramStream for T {}

/// A boxed [`DatagramStream`].
pub type BoxStream = Box<dyn DatagramStream>;

/// Opens the stream of one outbound flow towards the member `header.destination`. The
/// router implements it with the same local/direct/relay choice as TCP; the stream it
/// returns is positioned after an `Ok` answer (a refusal is an error).
pub trait Opener: Send + Sync + 'static {
    fn open(&self, header: RelayHeader) -> BoxFuture<'_, io::Result<BoxStream>>;
}

/// The replica's packet device: the TUN in its netns ([`super::tun::Tun`], shared as
/// `Arc<Tun>` from [`super::netns::ReplicaNetns::tun`]), or a test double.
/// `recv` reads one whole IP packet; `send` writes one.
pub trait PacketIo: Send + Sync + 'static {
    fn recv<'a>(&'a self, buf: &'a mut [u8]) -> BoxFuture<'a, io::Result<usize>>;
    fn send<'a>(&'a self, packet: &'a [u8]) -> BoxFuture<'a, io::Result<()>>;
}

impl PacketIo for super::tun::Tun {
    fn recv<'a>(&'a self, buf: &'a mut [u8]) -> BoxFuture<'a, io::Result<usize>> {
        Box::pin(super::tun::Tun::recv(self, buf))
    }

    fn send<'a>(&'a self, packet: &'a [u8]) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(super::tun::Tun::send(self, packet))
    }
}

/// Bounds of one plane.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Flows (outbound, inbound and egress) at once; a new one evicts the oldest.
    pub max_flows: usize,
    /// Bytes of datagrams queued towards streams and egress sockets, all flows together;
    /// past it packets are dropped (`queue_full`).
    pub max_queued_bytes: usize,
    /// Datagrams queued per flow while its stream opens or is slow.
    pub flow_queue: usize,
    /// A UDP flow with no datagram either way for this long ends.
    pub udp_idle: Duration,
    /// An ICMP echo flow with no message either way for this long ends.
    pub icmp_idle: Duration,
    /// How long opening a flow's stream may take.
    pub open_timeout: Duration,
    /// After a failed open, packets of that flow are dropped (`open_failed`) for this
    /// long before the next attempt, so a task sending to an unreachable member does not
    /// open a stream per packet.
    pub failed_hold: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_flows: 1024,
            max_queued_bytes: 4 << 20,
            flow_queue: 256,
            udp_idle: Duration::from_secs(60),
            icmp_idle: Duration::from_secs(10),
            open_timeout: Duration::from_secs(10),
            failed_hold: Duration::from_secs(2),
        }
    }
}

/// What one replica's plane needs to know.
#[derive(Debug, Clone)]
pub struct PlaneConfig {
    /// The replica's Domain (the `domain` of every header it sends).
    pub domain: String,
    /// The Domain's CIDRs: destinations inside go to members, others to egress.
    pub cidrs: Vec<IpNet>,
    /// The replica's own virtual IPs: the only sources it may send from.
    pub addresses: Vec<IpAddr>,
    pub limits: Limits,
}

/// Labels of `rlark_domain_datagrams_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DatagramLabels {
    pub domain: String,
    /// `udp` or `icmp`.
    pub protocol: String,
    /// `out` (replica → member), `in` (member → replica), `egress_out`, `egress_in`.
    pub direction: String,
}

/// Labels of `rlark_domain_datagrams_dropped_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    pub reason: String,
}

/// The plane's counters (shared by every replica's plane; cheap to clone).
#[derive(Clone, Debug, Default)]
pub struct DatagramMetrics {
    pub datagrams: Family<DatagramLabels, Counter>,
    pub dropped: Family<DropLabels, Counter>,
}

impl DatagramMetrics {
    /// Registers the families as `domain_datagrams` and `domain_datagrams_dropped`
    /// (counters get `_total`) under the registry's prefix: in a registry with prefix
    /// `rlark` (as `net::metrics` expects) they are
    /// `rlark_domain_datagrams_total{domain,protocol,direction}` and
    /// `rlark_domain_datagrams_dropped_total{reason}`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "domain_datagrams",
            "Datagrams (UDP payloads, ICMP echo messages) carried for domain replicas",
            self.datagrams.clone(),
        );
        registry.register(
            "domain_datagrams_dropped",
            "Datagrams the agent's datagram plane dropped, by reason",
            self.dropped.clone(),
        );
    }

    fn count(&self, domain: &str, protocol: &str, direction: &str) {
        self.datagrams
            .get_or_create(&DatagramLabels {
                domain: domain.to_string(),
                protocol: protocol.to_string(),
                direction: direction.to_string(),
            })
            .inc();
    }

    fn drop(&self, reason: DropReason) {
        self.dropped
            .get_or_create(&DropLabels {
                reason: reason.as_str().to_string(),
            })
            .inc();
    }

    /// Counts one dropped datagram (in tun mode also a TCP packet) for `reason`.
    pub fn count_drop(&self, reason: DropReason) {
        self.drop(reason);
    }

    /// Dropped datagrams so far for `reason` (tests, `rlark describe`).
    pub fn dropped_count(&self, reason: DropReason) -> u64 {
        self.dropped
            .get_or_create(&DropLabels {
                reason: reason.as_str().to_string(),
            })
            .get()
    }
}

/// Why the plane dropped a datagram (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Not a packet the parser accepts.
    Malformed,
    /// An IP fragment.
    Fragment,
    /// The source address is not one of the replica's own.
    SpoofedSource,
    /// TCP when the plane has no TCP stack (kernel mode redirects TCP before the TUN),
    /// non-echo ICMP, another protocol, ICMP outside the domain,
    /// multicast/broadcast/link-local destinations, port 0.
    Unsupported,
    /// An echo reply (or a reply to a flow) that matches no flow.
    NoFlow,
    /// The queue bound (per flow or per plane) is full.
    QueueFull,
    /// The flow's stream could not be opened (or was refused).
    OpenFailed,
    /// A frame from a peer that is not what the flow carries (wrong ICMP type or id).
    BadFrame,
    /// Too big to rebuild as one packet.
    TooBig,
    /// Writing into the TUN or an egress socket failed.
    WriteFailed,
    /// Tun mode: the queue of TCP packets into the replica's userspace TCP stack is full
    /// ([`super::stack::TCP_QUEUE`]).
    TcpQueueFull,
}

impl DropReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Malformed => "malformed",
            DropReason::Fragment => "fragment",
            DropReason::SpoofedSource => "spoofed_source",
            DropReason::Unsupported => "unsupported",
            DropReason::NoFlow => "no_flow",
            DropReason::QueueFull => "queue_full",
            DropReason::OpenFailed => "open_failed",
            DropReason::BadFrame => "bad_frame",
            DropReason::TooBig => "too_big",
            DropReason::WriteFailed => "write_failed",
            DropReason::TcpQueueFull => "tcp_queue_full",
        }
    }
}

/// Why [`DatagramPlane::serve_inbound`] could not serve a stream.
#[derive(Debug, thiserror::Error)]
pub enum DatagramError {
    #[error("relay protocol {0} is not a datagram protocol (udp or icmp)")]
    NotDatagram(Protocol),
    #[error("destination {0} is not an address of this replica")]
    NotLocal(IpAddr),
    #[error("first ICMP frame: {0}")]
    FirstFrame(String),
    #[error("the datagram plane is shut down")]
    ShutDown,
    #[error("reading the stream: {0}")]
    Io(#[from] io::Error),
}

/// Which way an echo flow goes, seen from the replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlowKind {
    /// UDP, either direction (a 5-tuple is the same flow both ways).
    Udp,
    /// The replica pings a member: it sends requests, the stream brings replies.
    EchoOut,
    /// A member pings the replica: the stream brings requests, the replica's kernel replies.
    EchoIn,
}

/// A flow as the replica sees it: `local` is the replica's ip:port (echo: ip and echo
/// identifier), `remote` the other end's (echo: ip and 0). A packet read from the TUN has
/// local = its source, remote = its destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub kind: FlowKind,
    pub local: SocketAddr,
    pub remote: SocketAddr,
}

/// Where a new flow's datagrams go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// To a member, through an [`Opener`] stream with this header.
    Member(RelayHeader),
    /// Out of the agent's namespace through a UDP socket.
    Egress,
    /// Only to an existing flow (echo replies to an inbound ping).
    ExistingOnly,
}

/// What to do with one packet read from the TUN (pure: [`classify`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision<'a> {
    /// Hand `datagram` (UDP payload or ICMP message) to the flow `key`, creating it along
    /// `route` if it does not exist.
    Forward {
        key: FlowKey,
        route: Route,
        datagram: &'a [u8],
    },
    /// A TCP packet from one of the replica's own addresses: for the replica's userspace
    /// TCP stack in tun mode ([`super::stack`]), dropped (`unsupported`) without one.
    Tcp,
    Drop(DropReason),
}

fn is_domain(cidrs: &[IpNet], ip: IpAddr) -> bool {
    cidrs.iter().any(|net| net.contains(&ip))
}

fn not_routable(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            v4.is_multicast() || v4.is_broadcast() || v4.is_unspecified() || v4.is_loopback()
        }
        IpAddr::V6(v6) => {
            v6.is_multicast()
                || v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_unicast_link_local()
        }
    }
}

/// Decides what a packet read from the replica's TUN becomes. Sans-IO.
pub fn classify<'a>(config: &PlaneConfig, bytes: &'a [u8]) -> Decision<'a> {
    let packet = match Packet::parse(bytes) {
        Ok(packet) => packet,
        Err(PacketError::Fragmented) => return Decision::Drop(DropReason::Fragment),
        Err(_) => return Decision::Drop(DropReason::Malformed),
    };
    // The kernel's own chatter (IPv6 router solicitations, MLD) goes to multicast from
    // link-local sources: not ours to carry, and not spoofing.
    if not_routable(packet.destination) {
        return Decision::Drop(DropReason::Unsupported);
    }
    if !config.addresses.contains(&packet.source) {
        return Decision::Drop(DropReason::SpoofedSource);
    }
    let in_domain = is_domain(&config.cidrs, packet.destination);
    match packet.transport {
        Transport::Udp {
            source_port,
            destination_port,
            payload,
        } => {
            if source_port == 0 || destination_port == 0 {
                return Decision::Drop(DropReason::Unsupported);
            }
            let key = FlowKey {
                kind: FlowKind::Udp,
                local: SocketAddr::new(packet.source, source_port),
                remote: SocketAddr::new(packet.destination, destination_port),
            };
            let route = if in_domain {
                Route::Member(RelayHeader {
                    domain: config.domain.clone(),
                    protocol: Protocol::Udp,
                    source: packet.source,
                    destination: packet.destination,
                    port: destination_port,
                    source_port,
                    source_cluster: None,
                })
            } else {
                Route::Egress
            };
            Decision::Forward {
                key,
                route,
                datagram: payload,
            }
        }
        Transport::Tcp { .. } => Decision::Tcp,
        Transport::Echo(echo) if in_domain => {
            let (kind, route) = match echo.kind {
                EchoKind::Request => (
                    FlowKind::EchoOut,
                    Route::Member(RelayHeader {
                        domain: config.domain.clone(),
                        protocol: Protocol::Icmp,
                        source: packet.source,
                        destination: packet.destination,
                        port: 0,
                        source_port: 0,
                        source_cluster: None,
                    }),
                ),
                EchoKind::Reply => (FlowKind::EchoIn, Route::ExistingOnly),
            };
            Decision::Forward {
                key: FlowKey {
                    kind,
                    local: SocketAddr::new(packet.source, echo.id),
                    remote: SocketAddr::new(packet.destination, 0),
                },
                route,
                datagram: packet.ip_payload,
            }
        }
        _ => Decision::Drop(DropReason::Unsupported),
    }
}

/// Turns a frame received on flow `key`'s stream into the packet to write into the
/// replica's TUN (from the remote end to the replica). Sans-IO.
pub fn frame_to_packet(key: &FlowKey, frame: &[u8]) -> Result<Vec<u8>, DropReason> {
    let built = match key.kind {
        FlowKind::Udp => build_udp(key.remote, key.local, frame),
        FlowKind::EchoOut | FlowKind::EchoIn => {
            let echo =
                parse_echo_message(key.local.is_ipv6(), frame).map_err(|_| DropReason::BadFrame)?;
            let expected = if key.kind == FlowKind::EchoOut {
                EchoKind::Reply
            } else {
                EchoKind::Request
            };
            if echo.kind != expected || echo.id != key.local.port() {
                return Err(DropReason::BadFrame);
            }
            build_echo(key.remote.ip(), key.local.ip(), &echo)
        }
    };
    built.map_err(|e| match e {
        PacketError::TooBig { .. } => DropReason::TooBig,
        _ => DropReason::BadFrame,
    })
}

/// Encodes one frame: `u16` big-endian length, then the datagram. A datagram longer than
/// `u16::MAX` cannot be framed.
pub fn encode_frame(datagram: &[u8]) -> Option<Vec<u8>> {
    let len = u16::try_from(datagram.len()).ok()?;
    let mut frame = Vec::with_capacity(2 + datagram.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(datagram);
    Some(frame)
}

/// Reads one frame into `buf` (replacing its contents). `Ok(false)`: the stream ended
/// cleanly between frames; an end inside a frame is `UnexpectedEof`.
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
) -> io::Result<bool> {
    let mut len = [0u8; 2];
    match reader.read(&mut len[..1]).await? {
        0 => return Ok(false),
        _ => reader.read_exact(&mut len[1..]).await?,
    };
    buf.resize(usize::from(u16::from_be_bytes(len)), 0);
    reader.read_exact(buf).await?;
    Ok(true)
}

/// A datagram queued towards a flow's stream or socket; its bytes count against
/// [`Limits::max_queued_bytes`] until it is dropped.
struct Queued {
    data: Vec<u8>,
    queued: Arc<AtomicUsize>,
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.queued.fetch_sub(self.data.len(), Ordering::Relaxed);
    }
}

struct FlowEntry {
    id: u64,
    tx: mpsc::Sender<Queued>,
    cancel: CancellationToken,
}

/// The flows of one plane, bounded; the oldest (lowest id) is evicted first.
struct FlowTable {
    flows: HashMap<FlowKey, FlowEntry>,
    next_id: u64,
    max: usize,
}

impl FlowTable {
    /// Adds a flow (replacing one with the same key) and returns its id; evicts the
    /// oldest when full. Replaced and evicted flows are cancelled.
    fn insert(&mut self, key: FlowKey, tx: mpsc::Sender<Queued>, cancel: CancellationToken) -> u64 {
        if let Some(old) = self.flows.remove(&key) {
            old.cancel.cancel();
        }
        while self.flows.len() >= self.max.max(1) {
            let Some(oldest) = self.flows.iter().min_by_key(|(_, e)| e.id).map(|(k, _)| *k) else {
                break;
            };
            if let Some(entry) = self.flows.remove(&oldest) {
                tracing::debug!(flow = ?oldest, "datagram flow evicted (flow table full)");
                entry.cancel.cancel();
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        self.flows.insert(key, FlowEntry { id, tx, cancel });
        id
    }

    fn remove(&mut self, key: &FlowKey, id: u64) {
        if self.flows.get(key).is_some_and(|e| e.id == id) {
            self.flows.remove(key);
        }
    }
}

struct Inner {
    config: PlaneConfig,
    io: Arc<dyn PacketIo>,
    /// Tun mode: where TCP packets go (the replica's userspace stack).
    tcp: Option<mpsc::Sender<Vec<u8>>>,
    opener: Arc<dyn Opener>,
    metrics: DatagramMetrics,
    table: Mutex<FlowTable>,
    queued: Arc<AtomicUsize>,
    shutdown: CancellationToken,
    epoch: Instant,
}

/// One replica's datagram plane: the TUN reader and its flows. Cheap to clone; when the
/// last handle is dropped (or [`DatagramPlane::shutdown`] is called) the reader and every
/// flow end.
#[derive(Clone)]
pub struct DatagramPlane {
    inner: Arc<Inner>,
    _guard: Arc<DropGuard>,
}

impl DatagramPlane {
    /// Starts the plane: spawns the task that reads `io` until shutdown. TCP packets are
    /// dropped (`unsupported`).
    pub fn start(
        config: PlaneConfig,
        io: Arc<dyn PacketIo>,
        opener: Arc<dyn Opener>,
        metrics: DatagramMetrics,
    ) -> DatagramPlane {
        Self::start_with_tcp(config, io, opener, metrics, None)
    }

    /// [`DatagramPlane::start`], and (tun mode) every TCP packet from the replica's own
    /// addresses is offered to `tcp` (the replica's userspace stack) without waiting: a
    /// full queue drops it (`tcp_queue_full`).
    pub fn start_with_tcp(
        config: PlaneConfig,
        io: Arc<dyn PacketIo>,
        opener: Arc<dyn Opener>,
        metrics: DatagramMetrics,
        tcp: Option<mpsc::Sender<Vec<u8>>>,
    ) -> DatagramPlane {
        let shutdown = CancellationToken::new();
        let inner = Arc::new(Inner {
            table: Mutex::new(FlowTable {
                flows: HashMap::new(),
                next_id: 0,
                max: config.limits.max_flows,
            }),
            config,
            io,
            tcp,
            opener,
            metrics,
            queued: Arc::new(AtomicUsize::new(0)),
            shutdown: shutdown.clone(),
            epoch: Instant::now(),
        });
        tokio::spawn(read_tun(inner.clone()));
        DatagramPlane {
            inner,
            _guard: Arc::new(shutdown.drop_guard()),
        }
    }

    /// Ends the reader and every flow now.
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
    }

    /// Flows open now (outbound, inbound and egress).
    pub fn flow_count(&self) -> usize {
        self.inner.table.lock().map(|t| t.flows.len()).unwrap_or(0)
    }

    /// Serves one inbound `Udp` or `Icmp` stream that the caller has already authorized
    /// and answered `Ok` to: frames become packets from `header.source` (`:source_port`)
    /// to `header.destination` (`:port`) in this replica's TUN, and the replica's answers
    /// go back as frames. Returns when the stream ends, the flow idles out or is evicted,
    /// or the plane shuts down. An `Icmp` stream's first frame must be an echo request:
    /// its identifier names the flow.
    pub async fn serve_inbound<S>(
        &self,
        header: RelayHeader,
        stream: S,
    ) -> Result<(), DatagramError>
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let inner = &self.inner;
        if !inner.config.addresses.contains(&header.destination) {
            return Err(DatagramError::NotLocal(header.destination));
        }
        let (mut reader, writer) = tokio::io::split(stream);
        let (key, first) = match header.protocol {
            Protocol::Udp => (
                FlowKey {
                    kind: FlowKind::Udp,
                    local: SocketAddr::new(header.destination, header.port),
                    remote: SocketAddr::new(header.source, header.source_port),
                },
                None,
            ),
            Protocol::Icmp => {
                let mut frame = Vec::new();
                let read = tokio::time::timeout(
                    inner.config.limits.icmp_idle,
                    read_frame(&mut reader, &mut frame),
                );
                match read.await {
                    Ok(Ok(true)) => {}
                    Ok(Ok(false)) => return Ok(()),
                    Ok(Err(e)) => return Err(e.into()),
                    Err(_) => return Err(DatagramError::FirstFrame("no frame in time".into())),
                }
                let echo = parse_echo_message(header.destination.is_ipv6(), &frame)
                    .map_err(|e| DatagramError::FirstFrame(e.to_string()))?;
                if echo.kind != EchoKind::Request {
                    return Err(DatagramError::FirstFrame("not an echo request".into()));
                }
                let key = FlowKey {
                    kind: FlowKind::EchoIn,
                    local: SocketAddr::new(header.destination, echo.id),
                    remote: SocketAddr::new(header.source, 0),
                };
                (key, Some(frame))
            }
            other => return Err(DatagramError::NotDatagram(other)),
        };
        if inner.shutdown.is_cancelled() {
            return Err(DatagramError::ShutDown);
        }
        let (tx, rx) = mpsc::channel(inner.config.limits.flow_queue.max(1));
        let cancel = inner.shutdown.child_token();
        let id = lock(&inner.table).insert(key, tx, cancel.clone());
        if let Some(frame) = first {
            deliver(inner, &key, &frame).await;
        }
        pump(inner, key, reader, writer, rx, cancel).await;
        lock(&inner.table).remove(&key, id);
        Ok(())
    }
}

fn lock(table: &Mutex<FlowTable>) -> std::sync::MutexGuard<'_, FlowTable> {
    // A panic while holding the lock cannot leave the map inconsistent (single calls).
    table
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn protocol_label(kind: FlowKind) -> &'static str {
    match kind {
        FlowKind::Udp => "udp",
        FlowKind::EchoOut | FlowKind::EchoIn => "icmp",
    }
}

/// Writes a frame from the flow's stream into the TUN as a packet.
async fn deliver(inner: &Inner, key: &FlowKey, frame: &[u8]) {
    match frame_to_packet(key, frame) {
        Ok(packet) => match inner.io.send(&packet).await {
            Ok(()) => inner
                .metrics
                .count(&inner.config.domain, protocol_label(key.kind), "in"),
            Err(error) => {
                tracing::debug!(flow = ?key, %error, "writing a datagram into the TUN failed");
                inner.metrics.drop(DropReason::WriteFailed);
            }
        },
        Err(reason) => inner.metrics.drop(reason),
    }
}

/// The TUN reader: classifies each packet and hands it to its flow.
async fn read_tun(inner: Arc<Inner>) {
    let mut buf = vec![0u8; 65536];
    loop {
        let n = tokio::select! {
            _ = inner.shutdown.cancelled() => break,
            read = inner.io.recv(&mut buf) => match read {
                Ok(n) => n,
                Err(error) => {
                    tracing::warn!(domain = %inner.config.domain, %error, "reading the replica's TUN failed; its datagram plane stops");
                    break;
                }
            },
        };
        match classify(&inner.config, &buf[..n]) {
            Decision::Drop(reason) => inner.metrics.drop(reason),
            Decision::Tcp => match &inner.tcp {
                Some(tcp) => {
                    match tcp.try_send(buf[..n].to_vec()) {
                        Ok(()) => {}
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            inner.metrics.drop(DropReason::TcpQueueFull);
                        }
                        // The stack is gone (the replica is being released).
                        Err(mpsc::error::TrySendError::Closed(_)) => {
                            inner.metrics.drop(DropReason::Unsupported);
                        }
                    }
                }
                None => inner.metrics.drop(DropReason::Unsupported),
            },
            Decision::Forward {
                key,
                route,
                datagram,
            } => dispatch(&inner, key, route, datagram),
        }
    }
    // Flows hold child tokens of `shutdown`; cancel them when the reader ends for any reason.
    inner.shutdown.cancel();
}

fn dispatch(inner: &Arc<Inner>, key: FlowKey, route: Route, datagram: &[u8]) {
    let len = datagram.len();
    if inner.queued.fetch_add(len, Ordering::Relaxed) + len > inner.config.limits.max_queued_bytes {
        inner.queued.fetch_sub(len, Ordering::Relaxed);
        inner.metrics.drop(DropReason::QueueFull);
        return;
    }
    let item = Queued {
        data: datagram.to_vec(),
        queued: inner.queued.clone(),
    };
    let mut table = lock(&inner.table);
    if let Some(entry) = table.flows.get(&key) {
        match entry.tx.try_send(item) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => inner.metrics.drop(DropReason::QueueFull),
            // The flow's stream failed to open: it holds its entry for `failed_hold`.
            Err(mpsc::error::TrySendError::Closed(_)) => inner.metrics.drop(DropReason::OpenFailed),
        }
        return;
    }
    if route == Route::ExistingOnly {
        inner.metrics.drop(DropReason::NoFlow);
        return;
    }
    let (tx, rx) = mpsc::channel(inner.config.limits.flow_queue.max(1));
    // A fresh channel has room for one.
    let _ = tx.try_send(item);
    let cancel = inner.shutdown.child_token();
    let id = table.insert(key, tx, cancel.clone());
    drop(table);
    let inner = inner.clone();
    tokio::spawn(async move {
        match route {
            Route::Member(header) => run_member(&inner, key, header, rx, cancel).await,
            Route::Egress => run_egress(&inner, key, rx, cancel).await,
            Route::ExistingOnly => {}
        }
        lock(&inner.table).remove(&key, id);
    });
}

/// An outbound flow towards a member: open its stream, then pump.
async fn run_member(
    inner: &Inner,
    key: FlowKey,
    header: RelayHeader,
    mut rx: mpsc::Receiver<Queued>,
    cancel: CancellationToken,
) {
    let opened = if let Err(error) = header.validate() {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            error.to_string(),
        ))
    } else {
        tokio::select! {
            _ = cancel.cancelled() => return,
            opened = tokio::time::timeout(inner.config.limits.open_timeout, inner.opener.open(header.clone())) => {
                opened.unwrap_or_else(|_| Err(io::Error::new(io::ErrorKind::TimedOut, "opening the flow's stream timed out")))
            }
        }
    };
    match opened {
        Ok(stream) => {
            let (reader, writer) = tokio::io::split(stream);
            pump(inner, key, reader, writer, rx, cancel).await;
        }
        Err(error) => {
            tracing::debug!(%header, %error, "datagram flow could not open its stream");
            rx.close();
            while rx.try_recv().is_ok() {
                inner.metrics.drop(DropReason::OpenFailed);
            }
            // Keep the (closed) entry a while: its packets are dropped, not re-opened.
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = tokio::time::sleep(inner.config.limits.failed_hold) => {}
            }
        }
    }
}

impl Inner {
    fn now_millis(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn idle_limit(&self, kind: FlowKind) -> Duration {
        match kind {
            FlowKind::Udp => self.config.limits.udp_idle,
            FlowKind::EchoOut | FlowKind::EchoIn => self.config.limits.icmp_idle,
        }
    }
}

/// Ends when no activity was noted in `last` for `idle`.
async fn idle_timer(inner: &Inner, last: &AtomicU64, idle: Duration) {
    loop {
        let since = inner
            .now_millis()
            .saturating_sub(last.load(Ordering::Relaxed));
        let since = Duration::from_millis(since);
        if since >= idle {
            return;
        }
        tokio::time::sleep(idle - since).await;
    }
}

/// Moves a flow's datagrams both ways until the stream ends, the queue closes (evicted),
/// it idles out or is cancelled.
async fn pump<R, W>(
    inner: &Inner,
    key: FlowKey,
    mut reader: R,
    mut writer: W,
    mut rx: mpsc::Receiver<Queued>,
    cancel: CancellationToken,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let last = AtomicU64::new(inner.now_millis());
    let protocol = protocol_label(key.kind);
    let up = async {
        while let Some(item) = rx.recv().await {
            let Some(frame) = encode_frame(&item.data) else {
                inner.metrics.drop(DropReason::TooBig);
                continue;
            };
            drop(item);
            if writer.write_all(&frame).await.is_err() {
                inner.metrics.drop(DropReason::WriteFailed);
                return;
            }
            last.store(inner.now_millis(), Ordering::Relaxed);
            inner.metrics.count(&inner.config.domain, protocol, "out");
        }
    };
    let down = async {
        let mut frame = Vec::new();
        while let Ok(true) = read_frame(&mut reader, &mut frame).await {
            last.store(inner.now_millis(), Ordering::Relaxed);
            deliver(inner, &key, &frame).await;
        }
    };
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = up => {}
        _ = down => {}
        _ = idle_timer(inner, &last, inner.idle_limit(key.kind)) => {
            tracing::debug!(flow = ?key, "datagram flow idle");
        }
    }
    let _ = writer.shutdown().await;
}

/// An egress flow: a UDP socket in the agent's namespace, connected to the destination.
async fn run_egress(
    inner: &Inner,
    key: FlowKey,
    mut rx: mpsc::Receiver<Queued>,
    cancel: CancellationToken,
) {
    let bind: SocketAddr = match key.remote {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = match UdpSocket::bind(bind).await {
        Ok(socket) => socket,
        Err(error) => return egress_failed(inner, key, rx, error).await,
    };
    if let Err(error) = socket.connect(key.remote).await {
        return egress_failed(inner, key, rx, error).await;
    }
    let last = AtomicU64::new(inner.now_millis());
    let up = async {
        while let Some(item) = rx.recv().await {
            match socket.send(&item.data).await {
                Ok(_) => {
                    last.store(inner.now_millis(), Ordering::Relaxed);
                    inner
                        .metrics
                        .count(&inner.config.domain, "udp", "egress_out");
                }
                // e.g. ECONNREFUSED from an earlier ICMP port unreachable: keep the flow.
                Err(_) => inner.metrics.drop(DropReason::WriteFailed),
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; 65536];
        loop {
            let n = match socket.recv(&mut buf).await {
                Ok(n) => n,
                // A refused earlier send surfaces here; the socket stays usable.
                Err(error) if error.kind() == io::ErrorKind::ConnectionRefused => continue,
                Err(_) => return,
            };
            last.store(inner.now_millis(), Ordering::Relaxed);
            match build_udp(key.remote, key.local, &buf[..n]) {
                Ok(packet) => match inner.io.send(&packet).await {
                    Ok(()) => inner
                        .metrics
                        .count(&inner.config.domain, "udp", "egress_in"),
                    Err(_) => inner.metrics.drop(DropReason::WriteFailed),
                },
                Err(_) => inner.metrics.drop(DropReason::TooBig),
            }
        }
    };
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = up => {}
        _ = down => {}
        _ = idle_timer(inner, &last, inner.config.limits.udp_idle) => {}
    }
}

async fn egress_failed(
    inner: &Inner,
    key: FlowKey,
    mut rx: mpsc::Receiver<Queued>,
    error: io::Error,
) {
    tracing::debug!(flow = ?key, %error, "egress UDP socket failed");
    rx.close();
    while rx.try_recv().is_ok() {
        inner.metrics.drop(DropReason::WriteFailed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex as StdMutex;

    use super::*;
    use crate::packet::Echo;

    const A4: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 88, 0, 2));
    const B4: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 88, 0, 9));
    const A6: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0x88, 0, 0, 0, 0, 0, 2));
    const B6: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0x88, 0, 0, 0, 0, 0, 9));
    const WAIT: Duration = Duration::from_secs(5);

    fn config(addresses: Vec<IpAddr>, limits: Limits) -> PlaneConfig {
        PlaneConfig {
            domain: "ray".into(),
            cidrs: vec![
                "10.88.0.0/16".parse().unwrap(),
                "fd00:88::/64".parse().unwrap(),
            ],
            addresses,
            limits,
        }
    }

    /// A TUN double: `inject` is what the replica's kernel sends, `written` what the
    /// plane writes into the device.
    struct MemIo {
        inbound: tokio::sync::Mutex<mpsc::Receiver<Vec<u8>>>,
        out: mpsc::UnboundedSender<Vec<u8>>,
    }

    struct MemTun {
        inject: mpsc::Sender<Vec<u8>>,
        written: mpsc::UnboundedReceiver<Vec<u8>>,
    }

    impl MemTun {
        async fn next(&mut self) -> Vec<u8> {
            tokio::time::timeout(WAIT, self.written.recv())
                .await
                .expect("a packet in time")
                .expect("the plane is running")
        }

        async fn nothing_within(&mut self, wait: Duration) {
            if let Ok(Some(packet)) = tokio::time::timeout(wait, self.written.recv()).await {
                panic!("unexpected packet {:?}", Packet::parse(&packet));
            }
        }
    }

    fn mem_io() -> (Arc<MemIo>, MemTun) {
        let (inject, inbound) = mpsc::channel(64);
        let (out, written) = mpsc::unbounded_channel();
        (
            Arc::new(MemIo {
                inbound: tokio::sync::Mutex::new(inbound),
                out,
            }),
            MemTun { inject, written },
        )
    }

    impl PacketIo for MemIo {
        fn recv<'a>(&'a self, buf: &'a mut [u8]) -> BoxFuture<'a, io::Result<usize>> {
            Box::pin(async move {
                let packet = self.inbound.lock().await.recv().await;
                let packet = packet.ok_or_else(|| io::Error::other("test device closed"))?;
                buf[..packet.len()].copy_from_slice(&packet);
                Ok(packet.len())
            })
        }

        fn send<'a>(&'a self, packet: &'a [u8]) -> BoxFuture<'a, io::Result<()>> {
            let _ = self.out.send(packet.to_vec());
            Box::pin(async { Ok(()) })
        }
    }

    /// Connects planes directly: a stream to the plane holding the destination, served
    /// there by `serve_inbound` (what the router does after authorizing).
    #[derive(Default)]
    struct LoopOpener {
        peers: StdMutex<Vec<DatagramPlane>>,
        opened: StdMutex<Vec<RelayHeader>>,
        fail: bool,
        /// Never finish opening (datagrams stay queued).
        hang: bool,
    }

    impl Opener for LoopOpener {
        fn open(&self, header: RelayHeader) -> BoxFuture<'_, io::Result<BoxStream>> {
            self.opened.lock().unwrap().push(header.clone());
            let peer = self
                .peers
                .lock()
                .unwrap()
                .iter()
                .find(|p| p.inner.config.addresses.contains(&header.destination))
                .cloned();
            let (fail, hang) = (self.fail, self.hang);
            Box::pin(async move {
                if hang {
                    futures::future::pending::<()>().await;
                }
                let peer = match peer {
                    Some(peer) if !fail => peer,
                    _ => return Err(io::Error::new(io::ErrorKind::ConnectionRefused, "refused")),
                };
                let (near, far) = tokio::io::duplex(64 * 1024);
                tokio::spawn(async move { peer.serve_inbound(header, far).await });
                Ok(Box::new(near) as BoxStream)
            })
        }
    }

    fn opened(opener: &LoopOpener) -> Vec<RelayHeader> {
        opener.opened.lock().unwrap().clone()
    }

    struct Pair {
        a: DatagramPlane,
        b: DatagramPlane,
        a_tun: MemTun,
        b_tun: MemTun,
        a_opener: Arc<LoopOpener>,
        b_opener: Arc<LoopOpener>,
        metrics: DatagramMetrics,
    }

    fn pair(a_ip: IpAddr, b_ip: IpAddr, limits: Limits) -> Pair {
        let metrics = DatagramMetrics::default();
        let (a_io, a_tun) = mem_io();
        let (b_io, b_tun) = mem_io();
        let a_opener = Arc::new(LoopOpener::default());
        let b_opener = Arc::new(LoopOpener::default());
        let a = DatagramPlane::start(
            config(vec![a_ip], limits.clone()),
            a_io,
            a_opener.clone(),
            metrics.clone(),
        );
        let b = DatagramPlane::start(
            config(vec![b_ip], limits),
            b_io,
            b_opener.clone(),
            metrics.clone(),
        );
        a_opener.peers.lock().unwrap().push(b.clone());
        b_opener.peers.lock().unwrap().push(a.clone());
        Pair {
            a,
            b,
            a_tun,
            b_tun,
            a_opener,
            b_opener,
            metrics,
        }
    }

    fn udp(from: IpAddr, fp: u16, to: IpAddr, tp: u16, payload: &[u8]) -> Vec<u8> {
        build_udp(SocketAddr::new(from, fp), SocketAddr::new(to, tp), payload).unwrap()
    }

    fn echo(from: IpAddr, to: IpAddr, kind: EchoKind, id: u16, seq: u16) -> Vec<u8> {
        build_echo(
            from,
            to,
            &Echo {
                kind,
                id,
                seq,
                data: b"0123456789abcdef",
            },
        )
        .unwrap()
    }

    #[tokio::test]
    async fn udp_and_ping_between_two_planes_in_both_families() {
        for (a_ip, b_ip) in [(A4, B4), (A6, B6)] {
            let mut p = pair(a_ip, b_ip, Limits::default());
            // A's task sends a UDP datagram to B's VIP: B's TUN gets the same packet.
            let request = udp(a_ip, 40000, b_ip, 53, b"question");
            p.a_tun.inject.send(request.clone()).await.unwrap();
            assert_eq!(p.b_tun.next().await, request);
            // B's task answers: A's TUN gets the reply, and B opened nothing (the reply
            // belongs to the inbound flow).
            let reply = udp(b_ip, 53, a_ip, 40000, b"answer");
            p.b_tun.inject.send(reply.clone()).await.unwrap();
            assert_eq!(p.a_tun.next().await, reply);
            // A second datagram of the flow uses the same stream.
            let again = udp(a_ip, 40000, b_ip, 53, b"");
            p.a_tun.inject.send(again.clone()).await.unwrap();
            assert_eq!(p.b_tun.next().await, again);
            assert_eq!(
                opened(&p.a_opener),
                vec![RelayHeader {
                    domain: "ray".into(),
                    protocol: Protocol::Udp,
                    source: a_ip,
                    destination: b_ip,
                    port: 53,
                    source_port: 40000,
                    source_cluster: None,
                }]
            );
            assert!(opened(&p.b_opener).is_empty());

            // Ping: the request reaches B's TUN, B's kernel's reply reaches A's.
            let ping = echo(a_ip, b_ip, EchoKind::Request, 0x77, 1);
            p.a_tun.inject.send(ping.clone()).await.unwrap();
            assert_eq!(p.b_tun.next().await, ping);
            let pong = echo(b_ip, a_ip, EchoKind::Reply, 0x77, 1);
            p.b_tun.inject.send(pong.clone()).await.unwrap();
            assert_eq!(p.a_tun.next().await, pong);
            assert_eq!(opened(&p.a_opener).len(), 2);
            assert_eq!(opened(&p.a_opener)[1].protocol, Protocol::Icmp);
            // A reply with another identifier belongs to no flow.
            p.b_tun
                .inject
                .send(echo(b_ip, a_ip, EchoKind::Reply, 0x78, 1))
                .await
                .unwrap();
            p.a_tun.nothing_within(Duration::from_millis(200)).await;
            assert_eq!(p.metrics.dropped_count(DropReason::NoFlow), 1);
            let out = p.metrics.datagrams.get_or_create(&DatagramLabels {
                domain: "ray".into(),
                protocol: "udp".into(),
                direction: "out".into(),
            });
            assert_eq!(out.get(), 3, "two from A, one from B");
            assert_eq!(p.a.flow_count(), 2);
            assert_eq!(p.b.flow_count(), 2);
            p.a.shutdown();
            p.b.shutdown();
        }
    }

    /// A network namespace made by a test (root), deleted on drop.
    struct TestNetns(String);

    impl TestNetns {
        fn new(name: &str) -> TestNetns {
            let _ = ip(&["netns", "del", name]);
            ip(&["netns", "add", name]).expect("ip netns add (the test runs as root)");
            TestNetns(name.to_string())
        }
    }

    impl Drop for TestNetns {
        fn drop(&mut self) {
            let _ = ip(&["netns", "del", &self.0]);
        }
    }

    fn ip(args: &[&str]) -> Result<(), String> {
        let out = std::process::Command::new("ip")
            .args(args)
            .output()
            .map_err(|e| format!("ip {args:?}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "ip {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// Egress sockets are the agent's: here the "agent's namespace" is a netns of the
    /// test's own with a server on a non-loopback address (a task's kernel never routes
    /// loopback to its TUN, and the plane refuses to carry loopback destinations, which
    /// would reach the agent's own loopback services).
    #[test]
    fn udp_outside_the_domain_leaves_through_an_egress_socket() {
        let ns = TestNetns::new("h16dgram-egress");
        ip(&["-n", &ns.0, "link", "set", "lo", "up"]).unwrap();
        ip(&["-n", &ns.0, "addr", "add", "10.99.0.1/32", "dev", "lo"]).unwrap();
        let path = format!("/run/netns/{}", ns.0);
        std::thread::spawn(move || {
            let netns = std::fs::File::open(&path).unwrap();
            nix::sched::setns(netns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(egress_in_this_namespace());
        })
        .join()
        .expect("the egress test passed");
    }

    async fn egress_in_this_namespace() {
        let server = UdpSocket::bind("10.99.0.1:0").await.unwrap();
        let server_addr = server.local_addr().unwrap();
        let mut p = pair(A4, B4, Limits::default());
        // The replica's own address is its source; the egress socket is the agent's.
        p.a_tun
            .inject
            .send(udp(A4, 5353, server_addr.ip(), server_addr.port(), b"dns?"))
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = tokio::time::timeout(WAIT, server.recv_from(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf[..n], b"dns?");
        server.send_to(b"dns!", from).await.unwrap();
        assert_eq!(
            p.a_tun.next().await,
            udp(server_addr.ip(), server_addr.port(), A4, 5353, b"dns!")
        );
        assert!(opened(&p.a_opener).is_empty());
        // Loopback is not carried.
        let local = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let local_addr = local.local_addr().unwrap();
        p.a_tun
            .inject
            .send(udp(A4, 5354, local_addr.ip(), local_addr.port(), b"x"))
            .await
            .unwrap();
        let got = tokio::time::timeout(Duration::from_millis(300), local.recv_from(&mut buf)).await;
        assert!(got.is_err(), "a loopback datagram was carried");
        assert_eq!(p.metrics.dropped_count(DropReason::Unsupported), 1);
        p.a.shutdown();
        p.b.shutdown();
    }

    #[tokio::test]
    async fn flows_are_bounded_evicted_oldest_first_and_idle_out() {
        let limits = Limits {
            max_flows: 2,
            udp_idle: Duration::from_millis(300),
            ..Limits::default()
        };
        let mut p = pair(A4, B4, limits);
        for port in [1001, 1002, 1003] {
            let packet = udp(A4, port, B4, 7, b"x");
            p.a_tun.inject.send(packet.clone()).await.unwrap();
            assert_eq!(p.b_tun.next().await, packet);
        }
        assert_eq!(p.a.flow_count(), 2);
        // The first flow was evicted: its next datagram opens a new stream.
        let packet = udp(A4, 1001, B4, 7, b"y");
        p.a_tun.inject.send(packet.clone()).await.unwrap();
        assert_eq!(p.b_tun.next().await, packet);
        assert_eq!(opened(&p.a_opener).len(), 4);
        // Idle flows end on both sides.
        let deadline = Instant::now() + WAIT;
        while p.a.flow_count() + p.b.flow_count() > 0 {
            assert!(Instant::now() < deadline, "flows did not idle out");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        p.a.shutdown();
        p.b.shutdown();
    }

    #[tokio::test]
    async fn a_failed_open_is_held_so_packets_do_not_reopen_per_datagram() {
        let metrics = DatagramMetrics::default();
        let (io, tun) = mem_io();
        let opener = Arc::new(LoopOpener {
            fail: true,
            ..LoopOpener::default()
        });
        let plane = DatagramPlane::start(
            config(vec![A4], Limits::default()),
            io,
            opener.clone(),
            metrics.clone(),
        );
        for _ in 0..5 {
            tun.inject.send(udp(A4, 4000, B4, 9, b"x")).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let deadline = Instant::now() + WAIT;
        while metrics.dropped_count(DropReason::OpenFailed) < 5 {
            assert!(Instant::now() < deadline, "drops not counted");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(opened(&opener).len(), 1);
        plane.shutdown();
    }

    #[tokio::test]
    async fn queued_bytes_are_bounded_across_flows() {
        let metrics = DatagramMetrics::default();
        let (io, tun) = mem_io();
        let opener = Arc::new(LoopOpener {
            hang: true,
            ..LoopOpener::default()
        });
        let limits = Limits {
            max_queued_bytes: 20,
            ..Limits::default()
        };
        let plane = DatagramPlane::start(
            config(vec![A4], limits),
            io,
            opener.clone(),
            metrics.clone(),
        );
        // 8 + 8 bytes fit (two flows), the third 8 does not; an empty datagram still does.
        for (port, payload) in [
            (1, &b"12345678"[..]),
            (2, b"12345678"),
            (3, b"12345678"),
            (4, b""),
        ] {
            tun.inject
                .send(udp(A4, port, B4, 9, payload))
                .await
                .unwrap();
        }
        let deadline = Instant::now() + WAIT;
        while plane.flow_count() < 3 {
            assert!(Instant::now() < deadline, "flows not created");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(metrics.dropped_count(DropReason::QueueFull), 1);
        assert_eq!(plane.inner.queued.load(Ordering::Relaxed), 16);
        // Ending the flows releases what they held.
        plane.shutdown();
        let deadline = Instant::now() + WAIT;
        while plane.inner.queued.load(Ordering::Relaxed) != 0 {
            assert!(Instant::now() < deadline, "queued bytes not released");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn serve_inbound_refuses_what_it_cannot_serve() {
        let p = pair(A4, B4, Limits::default());
        let header = |protocol, destination| RelayHeader {
            domain: "ray".into(),
            protocol,
            source: A4,
            destination,
            port: if protocol == Protocol::Udp { 53 } else { 0 },
            source_port: if protocol == Protocol::Udp { 1 } else { 0 },
            source_cluster: None,
        };
        let (_near, far) = tokio::io::duplex(1024);
        let error = p.b.serve_inbound(header(Protocol::Tcp, B4), far).await;
        assert!(matches!(
            error,
            Err(DatagramError::NotDatagram(Protocol::Tcp))
        ));
        let (_near, far) = tokio::io::duplex(1024);
        let error = p.b.serve_inbound(header(Protocol::Udp, A4), far).await;
        assert!(matches!(error, Err(DatagramError::NotLocal(ip)) if ip == A4));
        // An Icmp stream whose first frame is an echo reply.
        let (mut near, far) = tokio::io::duplex(1024);
        let reply = echo(A4, B4, EchoKind::Reply, 1, 1);
        near.write_all(&encode_frame(&reply[20..]).unwrap())
            .await
            .unwrap();
        let error = p.b.serve_inbound(header(Protocol::Icmp, B4), far).await;
        assert!(
            matches!(&error, Err(DatagramError::FirstFrame(m)) if m.contains("echo request")),
            "{error:?}"
        );
        p.a.shutdown();
        p.b.shutdown();
    }

    #[test]
    fn classify_table() {
        let limits = Limits::default();
        let cfg = config(vec![A4, A6], limits);
        let c8 = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 8));
        let header = |protocol, destination, port, source_port| {
            Route::Member(RelayHeader {
                domain: "ray".into(),
                protocol,
                source: if matches!(destination, IpAddr::V6(_)) {
                    A6
                } else {
                    A4
                },
                destination,
                port,
                source_port,
                source_cluster: None,
            })
        };
        let key = |kind, local: SocketAddr, remote: SocketAddr| FlowKey {
            kind,
            local,
            remote,
        };
        let s = SocketAddr::new;
        type Expected = Result<(FlowKey, Route), DropReason>;
        let cases: Vec<(&str, Vec<u8>, Expected)> = vec![
            (
                "udp to a member",
                udp(A4, 5000, B4, 53, b"q"),
                Ok((
                    key(FlowKind::Udp, s(A4, 5000), s(B4, 53)),
                    header(Protocol::Udp, B4, 53, 5000),
                )),
            ),
            (
                "udp6 to a member",
                udp(A6, 5000, B6, 53, b"q"),
                Ok((
                    key(FlowKind::Udp, s(A6, 5000), s(B6, 53)),
                    header(Protocol::Udp, B6, 53, 5000),
                )),
            ),
            (
                "udp elsewhere",
                udp(A4, 5000, c8, 53, b"q"),
                Ok((key(FlowKind::Udp, s(A4, 5000), s(c8, 53)), Route::Egress)),
            ),
            (
                "ping a member",
                echo(A4, B4, EchoKind::Request, 9, 1),
                Ok((
                    key(FlowKind::EchoOut, s(A4, 9), s(B4, 0)),
                    header(Protocol::Icmp, B4, 0, 0),
                )),
            ),
            (
                "answer a member's ping",
                echo(A6, B6, EchoKind::Reply, 9, 1),
                Ok((
                    key(FlowKind::EchoIn, s(A6, 9), s(B6, 0)),
                    Route::ExistingOnly,
                )),
            ),
            (
                "ping elsewhere",
                echo(A4, c8, EchoKind::Request, 9, 1),
                Err(DropReason::Unsupported),
            ),
            (
                "spoofed source",
                udp(B4, 5000, A4, 53, b"q"),
                Err(DropReason::SpoofedSource),
            ),
            (
                "multicast",
                udp(
                    A4,
                    5000,
                    IpAddr::V4(Ipv4Addr::new(224, 0, 0, 251)),
                    5353,
                    b"q",
                ),
                Err(DropReason::Unsupported),
            ),
            (
                "link-local v6 (router solicitation)",
                echo(
                    IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1)),
                    IpAddr::V6(Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2)),
                    EchoKind::Request,
                    1,
                    1,
                ),
                Err(DropReason::Unsupported),
            ),
            (
                "port 0",
                udp(A4, 5000, B4, 0, b"q"),
                Err(DropReason::Unsupported),
            ),
            ("garbage", vec![0x45, 0, 0], Err(DropReason::Malformed)),
        ];
        for (name, bytes, expected) in cases {
            let got = match classify(&cfg, &bytes) {
                Decision::Forward { key, route, .. } => Ok((key, route)),
                Decision::Drop(reason) => Err(reason),
                Decision::Tcp => panic!("{name}: not a TCP packet"),
            };
            assert_eq!(got, expected, "{name}");
        }
        let mut fragment = udp(A4, 5000, B4, 53, b"q");
        fragment[6] = 0x20;
        assert_eq!(
            classify(&cfg, &fragment),
            Decision::Drop(DropReason::Fragment)
        );
    }

    #[test]
    fn frames_become_packets_towards_the_replica_only_when_they_fit_the_flow() {
        let udp_key = FlowKey {
            kind: FlowKind::Udp,
            local: SocketAddr::new(A4, 5000),
            remote: SocketAddr::new(B4, 53),
        };
        assert_eq!(
            frame_to_packet(&udp_key, b"answer"),
            Ok(udp(B4, 53, A4, 5000, b"answer"))
        );
        let out = FlowKey {
            kind: FlowKind::EchoOut,
            local: SocketAddr::new(A6, 9),
            remote: SocketAddr::new(B6, 0),
        };
        let reply = echo(B6, A6, EchoKind::Reply, 9, 4);
        assert_eq!(frame_to_packet(&out, &reply[40..]), Ok(reply.clone()));
        let other_id = echo(B6, A6, EchoKind::Reply, 10, 4);
        assert_eq!(
            frame_to_packet(&out, &other_id[40..]),
            Err(DropReason::BadFrame)
        );
        let request = echo(B6, A6, EchoKind::Request, 9, 4);
        assert_eq!(
            frame_to_packet(&out, &request[40..]),
            Err(DropReason::BadFrame)
        );
        let inbound = FlowKey {
            kind: FlowKind::EchoIn,
            ..out
        };
        assert_eq!(frame_to_packet(&inbound, &request[40..]), Ok(request));
        assert_eq!(
            frame_to_packet(&inbound, b"\x80"),
            Err(DropReason::BadFrame)
        );
        // An ICMPv4 message on an IPv6 flow is not an echo there.
        let v4 = echo(B4, A4, EchoKind::Reply, 9, 4);
        assert_eq!(frame_to_packet(&out, &v4[20..]), Err(DropReason::BadFrame));
        let big = vec![0u8; 65_535];
        assert_eq!(frame_to_packet(&udp_key, &big), Err(DropReason::TooBig));
    }

    #[test]
    fn metrics_are_exposed_under_the_rlark_prefix() {
        let metrics = DatagramMetrics::default();
        let mut registry = Registry::with_prefix("rlark");
        metrics.register(&mut registry);
        metrics.count("ray", "udp", "out");
        metrics.drop(DropReason::SpoofedSource);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                r#"rlark_domain_datagrams_total{domain="ray",protocol="udp",direction="out"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"rlark_domain_datagrams_dropped_total{reason="spoofed_source"} 1"#),
            "{text}"
        );
    }

    #[tokio::test]
    async fn frames_are_length_prefixed_and_a_cut_frame_is_an_error() {
        let mut bytes = Vec::new();
        for datagram in [&b"one"[..], b"", &[9u8; 300]] {
            bytes.extend(encode_frame(datagram).unwrap());
        }
        let mut reader = &bytes[..];
        let mut frame = Vec::new();
        for expected in [&b"one"[..], b"", &[9u8; 300]] {
            assert!(read_frame(&mut reader, &mut frame).await.unwrap());
            assert_eq!(frame, expected);
        }
        assert!(!read_frame(&mut reader, &mut frame).await.unwrap());
        assert_eq!(encode_frame(&vec![0; 65_536]), None);
        for cut in [1, 2, 4] {
            let mut reader = &bytes[..cut];
            let error = read_frame(&mut reader, &mut frame).await.unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof, "cut at {cut}");
        }
    }
}
