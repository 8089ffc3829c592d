//! The destination side of the pod network: a flow arriving for a member running here,
//! over a relay stream from the hub (the calling cluster is the header's
//! `source_cluster`, set by the hub from the caller's tunnel certificate) or over a direct
//! mTLS connection (the calling cluster is the peer certificate's), or from this agent's
//! own router (local datagrams and probes).
//!
//! Authorization ([`authorize`], pure) uses only this agent's DomainPeers: the source IP
//! must be a member of the header's domain **in the calling cluster**, and the destination
//! a member of the same domain running on this agent with its netns attached. A refusal is
//! answered `forbidden` with a message naming what failed, and counted
//! (`rlark_domain_refused_total{reason}`). Then:
//!
//! - Tcp: a socket made inside the destination replica's netns connects to
//!   `destination:port`; `refused` / `unreachable` / `timeout` answers come from the
//!   connect error; after `ok`, bytes are copied both ways with half-close;
//! - Probe: `ok`, then the end of the stream;
//! - Udp/Icmp: handed to the datagram plane ([`InboundDatagrams`]); without one, `forbidden`
//!   ("udp and icmp are not enabled on this agent").

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use rlark_tunnel::header::{Status, StreamResponse};
use rlark_tunnel::mux::MuxStream;
use rlark_tunnel::relay::{Protocol, RelayHeader};
use tokio::io::AsyncWriteExt as _;
use tokio_util::sync::CancellationToken;

use crate::datagram::DatagramPlane;
use crate::membership::{Member, Membership, MembershipView};
use crate::metrics::{DomainMetrics, Metered, PathKind};
use crate::pods::{BoxStream, COPY_BUFFER, Pods};

/// How long writing a refusal may take.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves Udp/Icmp flows for a member here once they are authorized and answered `ok`
/// (the datagram plane: `net::datagram::serve_inbound` with the destination's TUN device).
pub trait InboundDatagrams: Send + Sync + 'static {
    /// Whether replica `pod`'s datagrams can be served, checked before the `ok` answer so a
    /// replica without a plane is answered `unreachable` rather than `ok` and a closed
    /// stream. The default says yes and leaves it to [`InboundDatagrams::serve`].
    fn serves(&self, pod: &str) -> bool {
        let _ = pod;
        true
    }
    /// Carry `header`'s datagrams between `stream` and replica `pod`'s netns until the
    /// stream ends.
    fn serve(&self, header: RelayHeader, pod: String, stream: BoxStream) -> BoxFuture<'static, ()>;
}

/// The datagram planes of this agent's replicas, by pod name: serves inbound Udp/Icmp
/// flows with the destination replica's plane. Cheap to clone.
#[derive(Clone, Default)]
pub struct DatagramPlanes {
    planes: Arc<std::sync::Mutex<std::collections::HashMap<String, DatagramPlane>>>,
}

impl DatagramPlanes {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, DatagramPlane>> {
        self.planes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Serve replica `pod`'s inbound datagrams with `plane` (replacing an earlier one).
    pub fn insert(&self, pod: &str, plane: DatagramPlane) {
        self.lock().insert(pod.to_string(), plane);
    }

    /// Stop serving replica `pod`; returns its plane.
    pub fn remove(&self, pod: &str) -> Option<DatagramPlane> {
        self.lock().remove(pod)
    }
}

impl InboundDatagrams for DatagramPlanes {
    fn serves(&self, pod: &str) -> bool {
        self.lock().contains_key(pod)
    }

    fn serve(&self, header: RelayHeader, pod: String, stream: BoxStream) -> BoxFuture<'static, ()> {
        let plane = self.lock().get(&pod).cloned();
        Box::pin(async move {
            let Some(plane) = plane else {
                return;
            };
            if let Err(error) = plane.serve_inbound(header.clone(), stream).await {
                tracing::debug!(flow = %header, %pod, %error, "inbound datagram flow ended");
            }
        })
    }
}

/// Why a flow is refused: a metric label and a message for the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// `unknown-domain`, `no-source-cluster`, `source-not-member`,
    /// `source-cluster-mismatch`, `destination-not-member`, `destination-not-here`,
    /// `destination-not-running`, `family-mismatch`.
    pub reason: &'static str,
    pub message: String,
}

fn refuse(reason: &'static str, message: String) -> Refusal {
    Refusal { reason, message }
}

/// Authorize `header` from calling cluster `cluster` (`None`: a relay stream whose header
/// lacks the hub's `source_cluster`) against `view`; `running(pod)` says whether a local
/// member's netns is attached. Ok: the destination member.
pub fn authorize<'v>(
    view: &'v MembershipView,
    header: &RelayHeader,
    cluster: Option<&str>,
    running: impl Fn(&str) -> bool,
) -> Result<&'v Member, Refusal> {
    let domain = &header.domain;
    let Some(cluster) = cluster else {
        return Err(refuse(
            "no-source-cluster",
            "the relay header names no source cluster (only the hub may forward relays)".into(),
        ));
    };
    if header.source.is_ipv4() != header.destination.is_ipv4() {
        return Err(refuse(
            "family-mismatch",
            format!(
                "source {} and destination {} are of different address families",
                header.source, header.destination
            ),
        ));
    }
    if view.domain(domain).is_none() {
        return Err(refuse(
            "unknown-domain",
            format!("domain {domain} has no member on this agent"),
        ));
    }
    let Some(source) = view.member(domain, header.source) else {
        return Err(refuse(
            "source-not-member",
            format!(
                "source {} is not a member of domain {domain}",
                header.source
            ),
        ));
    };
    if source.cluster != cluster {
        return Err(refuse(
            "source-cluster-mismatch",
            format!(
                "source {} is {}/{} of cluster {}, not of the calling cluster {cluster}",
                header.source, source.namespace, source.pod, source.cluster
            ),
        ));
    }
    let Some(destination) = view.member(domain, header.destination) else {
        return Err(refuse(
            "destination-not-member",
            format!(
                "destination {} is not a member of domain {domain}",
                header.destination
            ),
        ));
    };
    if !destination.local {
        return Err(refuse(
            "destination-not-here",
            format!(
                "destination {} ({}/{}) does not run on this agent",
                header.destination, destination.namespace, destination.pod
            ),
        ));
    }
    if !running(&destination.pod) {
        return Err(refuse(
            "destination-not-running",
            format!(
                "destination {} ({}/{}) is not running on this agent",
                header.destination, destination.namespace, destination.pod
            ),
        ));
    }
    Ok(destination)
}

/// The answer status for a failed connect.
pub fn connect_status(error: &io::Error) -> Status {
    match error.kind() {
        io::ErrorKind::ConnectionRefused => Status::Refused,
        io::ErrorKind::TimedOut => Status::Timeout,
        _ => Status::Unreachable,
    }
}

/// The destination side (see the module documentation). Cheap to clone.
#[derive(Clone)]
pub struct Inbound {
    inner: Arc<InboundInner>,
}

struct InboundInner {
    membership: Membership,
    pods: Pods,
    metrics: DomainMetrics,
    connect_timeout: Duration,
    datagrams: std::sync::RwLock<Option<Arc<dyn InboundDatagrams>>>,
    shutdown: CancellationToken,
}

impl Inbound {
    /// Built by the router (`Router::new`); shares its replicas.
    pub(crate) fn new(
        membership: Membership,
        pods: Pods,
        metrics: DomainMetrics,
        connect_timeout: Duration,
        shutdown: CancellationToken,
    ) -> Self {
        Inbound {
            inner: Arc::new(InboundInner {
                membership,
                pods,
                metrics,
                connect_timeout,
                datagrams: std::sync::RwLock::new(None),
                shutdown,
            }),
        }
    }

    /// Serve Udp/Icmp flows with `datagrams` from now on.
    pub fn set_datagrams(&self, datagrams: Arc<dyn InboundDatagrams>) {
        *self
            .inner
            .datagrams
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(datagrams);
    }

    /// Serve one flow arriving over `path` (relay, direct or local) from calling cluster
    /// `cluster`: authorize, answer, carry. Returns when the flow is over (or the agent
    /// stops).
    pub async fn serve(
        &self,
        header: RelayHeader,
        cluster: Option<String>,
        stream: BoxStream,
        path: PathKind,
    ) {
        let shutdown = self.inner.shutdown.clone();
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = self.serve_inner(&header, cluster.as_deref(), stream, path) => {}
        }
    }

    async fn serve_inner(
        &self,
        header: &RelayHeader,
        cluster: Option<&str>,
        mut stream: BoxStream,
        path: PathKind,
    ) {
        let stream = &mut stream;
        let inner = &self.inner;
        let view = inner.membership.view();
        let destination = match authorize(&view, header, cluster, |pod| {
            inner.pods.netns(pod).is_some()
        }) {
            Ok(member) => member.clone(),
            Err(refusal) => {
                inner.metrics.refused(&header.domain, refusal.reason);
                tracing::info!(
                    flow = %header,
                    caller = cluster.unwrap_or("-"),
                    %path,
                    reason = refusal.reason,
                    message = %refusal.message,
                    "pod-network flow refused"
                );
                answer(stream, Status::Forbidden, refusal.message).await;
                return;
            }
        };
        let peer = cluster.unwrap_or_default();
        match header.protocol {
            Protocol::Probe => {
                answer(stream, Status::Ok, String::new()).await;
            }
            Protocol::Tcp => {
                let Some(netns) = inner.pods.netns(&destination.pod) else {
                    answer(
                        stream,
                        Status::Unreachable,
                        "the destination stopped".into(),
                    )
                    .await;
                    return;
                };
                let addr = SocketAddr::new(header.destination, header.port);
                let mut tcp = match netns.connect(addr, inner.connect_timeout).await {
                    Ok(tcp) => tcp,
                    Err(error) => {
                        let status = connect_status(&error);
                        inner.metrics.failed(
                            &header.domain,
                            peer,
                            PathKind::Inbound,
                            status.as_str(),
                        );
                        answer(
                            stream,
                            status,
                            format!("connect to {addr} in pod {}: {error}", destination.pod),
                        )
                        .await;
                        return;
                    }
                };
                let _ = tcp.set_nodelay(true);
                if stream
                    .write_all(&StreamResponse::ok().encode())
                    .await
                    .is_err()
                {
                    return;
                }
                let meter = inner
                    .metrics
                    .opened(&header.domain, peer, PathKind::Inbound);
                let mut member = Metered::new(&mut tcp, meter);
                // A relay's mux stream is written to the member from its received frames'
                // own buffers (one copy less per byte than copy_bidirectional's).
                let carried = match (**stream).as_any_mut().downcast_mut::<MuxStream>() {
                    Some(mux) => rlark_tunnel::agent::splice(mux, &mut member, COPY_BUFFER)
                        .await
                        .map(|_| ()),
                    None => tokio::io::copy_bidirectional_with_sizes(
                        &mut member,
                        stream,
                        COPY_BUFFER,
                        COPY_BUFFER,
                    )
                    .await
                    .map(|_| ()),
                };
                if let Err(error) = carried {
                    tracing::debug!(flow = %header, %error, "inbound connection ended with an error");
                }
            }
            Protocol::Udp | Protocol::Icmp => {
                let datagrams = inner
                    .datagrams
                    .read()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone();
                let Some(datagrams) = datagrams else {
                    inner.metrics.refused(&header.domain, "protocol");
                    answer(
                        stream,
                        Status::Forbidden,
                        "udp and icmp are not enabled on this agent".into(),
                    )
                    .await;
                    return;
                };
                if !datagrams.serves(&destination.pod) {
                    answer(
                        stream,
                        Status::Unreachable,
                        format!("pod {} has no datagram plane", destination.pod),
                    )
                    .await;
                    return;
                }
                if stream
                    .write_all(&StreamResponse::ok().encode())
                    .await
                    .is_err()
                {
                    return;
                }
                let taken = std::mem::replace(
                    stream,
                    Box::new(tokio::io::join(tokio::io::empty(), tokio::io::sink())),
                );
                datagrams
                    .serve(header.clone(), destination.pod.clone(), taken)
                    .await;
            }
        }
    }
}

/// Relay streams the hub opens towards this agent: the calling cluster is the one the hub
/// put in `source_cluster` (from the caller's tunnel certificate).
impl rlark_tunnel::agent::RelayHandler for Inbound {
    fn serve(&self, header: RelayHeader, stream: rlark_tunnel::mux::MuxStream) {
        if header.protocol == Protocol::Tcp {
            stream.raise_window(rlark_tunnel::relay::RELAY_WINDOW);
        }
        let inbound = self.clone();
        tokio::spawn(async move {
            let cluster = header.source_cluster.clone();
            inbound
                .serve(header, cluster, Box::new(stream), PathKind::Relay)
                .await;
        });
    }
}

/// Write an answer (and, for anything but a Tcp `ok`, the end of the stream), bounded.
async fn answer(stream: &mut BoxStream, status: Status, message: String) {
    let response = if status == Status::Ok {
        StreamResponse::ok()
    } else {
        StreamResponse::error(status, message)
    };
    let write = async {
        stream.write_all(&response.encode()).await?;
        stream.shutdown().await
    };
    if let Ok(Err(error)) = tokio::time::timeout(ANSWER_TIMEOUT, write).await {
        tracing::debug!(%error, "could not write the answer");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::tests::{me, peer, pod};
    use std::net::IpAddr;

    fn header(source: &str, destination: &str) -> RelayHeader {
        RelayHeader {
            domain: "d1".into(),
            protocol: Protocol::Tcp,
            source: source.parse().unwrap(),
            destination: destination.parse().unwrap(),
            port: 80,
            source_port: 40000,
            source_cluster: Some("b".into()),
        }
    }

    #[test]
    fn authorization_table() {
        let peers = [
            peer(
                "d1",
                "10.88.0.0/16",
                vec![
                    pod("a", "srv-0", "10.88.0.2", "n1"),
                    pod("a", "stopped-0", "10.88.0.5", "n1"),
                    pod("a", "elsewhere-0", "10.88.0.6", "n2"),
                    pod("b", "cli-0", "10.88.0.3", "nb"),
                    pod("c", "other-0", "10.88.0.4", "nc"),
                ],
            ),
            peer(
                "d2",
                "10.99.0.0/16",
                vec![pod("a", "x-0", "10.99.0.2", "n1")],
            ),
        ];
        let (view, problems) = MembershipView::build(&peers, &me());
        assert!(problems.is_empty());
        let running = |pod: &str| pod != "stopped-0";
        // (case, header, calling cluster, Ok(destination pod) or Err(refusal reason))
        type Case<'a> = (
            &'a str,
            RelayHeader,
            Option<&'a str>,
            Result<&'a str, &'a str>,
        );
        let cases: Vec<Case> = vec![
            (
                "member to member",
                header("10.88.0.3", "10.88.0.2"),
                Some("b"),
                Ok("srv-0"),
            ),
            (
                "same-cluster caller (local flows)",
                header("10.88.0.2", "10.88.0.2"),
                Some("a"),
                Ok("srv-0"),
            ),
            (
                "wrong cluster: c forges b's member",
                header("10.88.0.3", "10.88.0.2"),
                Some("c"),
                Err("source-cluster-mismatch"),
            ),
            (
                "no source cluster",
                header("10.88.0.3", "10.88.0.2"),
                None,
                Err("no-source-cluster"),
            ),
            (
                "source not a member",
                header("10.88.0.99", "10.88.0.2"),
                Some("b"),
                Err("source-not-member"),
            ),
            (
                "destination not a member",
                header("10.88.0.3", "10.88.0.98"),
                Some("b"),
                Err("destination-not-member"),
            ),
            (
                "destination is another agent's",
                header("10.88.0.3", "10.88.0.4"),
                Some("b"),
                Err("destination-not-here"),
            ),
            (
                "destination of this cluster on another node",
                header("10.88.0.3", "10.88.0.6"),
                Some("b"),
                Err("destination-not-here"),
            ),
            (
                "destination not running",
                header("10.88.0.3", "10.88.0.5"),
                Some("b"),
                Err("destination-not-running"),
            ),
            (
                "destination of another domain",
                header("10.88.0.3", "10.99.0.2"),
                Some("b"),
                Err("destination-not-member"),
            ),
            (
                "family mismatch",
                header("10.88.0.3", "fd00::2"),
                Some("b"),
                Err("family-mismatch"),
            ),
            (
                "unknown domain",
                RelayHeader {
                    domain: "nope".into(),
                    ..header("10.88.0.3", "10.88.0.2")
                },
                Some("b"),
                Err("unknown-domain"),
            ),
        ];
        for (name, header, cluster, expected) in cases {
            let got = authorize(&view, &header, cluster, running);
            match (got, expected) {
                (Ok(member), Ok(pod)) => assert_eq!(member.pod, pod, "{name}"),
                (Err(refusal), Err(reason)) => {
                    assert_eq!(refusal.reason, reason, "{name}: {}", refusal.message);
                    assert!(!refusal.message.is_empty());
                }
                (got, expected) => panic!("{name}: got {got:?}, expected {expected:?}"),
            }
        }
        // The message names what failed.
        let refusal =
            authorize(&view, &header("10.88.0.3", "10.88.0.2"), Some("c"), running).unwrap_err();
        assert_eq!(
            refusal.message,
            "source 10.88.0.3 is rlark-b/cli-0 of cluster b, not of the calling cluster c"
        );
        let _: IpAddr = "10.88.0.2".parse().unwrap();
    }

    /// The hub's side of a tunnel session to an agent whose relay streams `inbound` serves.
    fn tunnel_to(inbound: Inbound) -> rlark_tunnel::mux::Control {
        use rlark_tunnel::mux::{MuxConfig, Role, Session};
        let (hub_end, agent_end) = rlark_tunnel::transport::memory_pair(16);
        let (hub, _hub_in) = Session::new(hub_end, Role::Server, MuxConfig::default());
        let (_agent, agent_in) = Session::new(agent_end, Role::Client, MuxConfig::default());
        let config = rlark_tunnel::agent::AgentConfig {
            relay: Some(Arc::new(inbound)),
            ..Default::default()
        };
        tokio::spawn(async move {
            let _agent = _agent;
            rlark_tunnel::agent::serve(agent_in, config).await;
        });
        hub
    }

    #[tokio::test]
    async fn relay_streams_from_the_hub() {
        use crate::router::tests::{LoopbackNetns, echo_server};
        use crate::router::{Router, RouterConfig};
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let me_b = crate::membership::LocalIdentity {
            cluster: "b".into(),
            node: "nb".into(),
        };
        let membership = Membership::new(me_b);
        membership.replace(&[peer(
            "d1",
            "10.88.0.0/16",
            vec![
                pod("a", "cli-0", "10.88.0.2", "na"),
                pod("b", "srv-0", "10.88.0.3", "nb"),
            ],
        )]);
        let metrics = DomainMetrics::new();
        let router = Router::new(
            membership,
            metrics.clone(),
            None,
            None,
            RouterConfig::new(Arc::new(|_: &tokio::net::TcpStream| {
                Err(io::Error::other("unused"))
            })),
            CancellationToken::new(),
        );
        router
            .attach("srv-0", "d1", Arc::new(LoopbackNetns::default()))
            .await
            .unwrap();
        let hub = tunnel_to(router.inbound());
        let echo = echo_server().await;
        let mut h = header("10.88.0.2", "10.88.0.3");
        h.port = echo.port();
        h.source_cluster = Some("a".into());
        let timeout = Duration::from_secs(10);
        let mut stream = rlark_tunnel::relay::open(&hub, &h, timeout).await.unwrap();
        stream.write_all(b"relayed").await.unwrap();
        stream.shutdown().await.unwrap();
        let mut back = Vec::new();
        tokio::time::timeout(timeout, stream.read_to_end(&mut back))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(back, b"relayed");

        // The hub vouches for cluster c: a's member is not c's.
        h.source_cluster = Some("c".into());
        let e = rlark_tunnel::relay::open(&hub, &h, timeout)
            .await
            .err()
            .unwrap();
        assert_eq!(e.status, Status::Forbidden);
        assert!(e.message.contains("not of the calling cluster c"), "{e}");
        // No cluster at all (not from the hub).
        h.source_cluster = None;
        let e = rlark_tunnel::relay::open(&hub, &h, timeout)
            .await
            .err()
            .unwrap();
        assert_eq!(e.status, Status::Forbidden);
        // Nothing listens on the port: refused, from the destination's netns.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        h.port = closed.local_addr().unwrap().port();
        drop(closed);
        h.source_cluster = Some("a".into());
        let e = rlark_tunnel::relay::open(&hub, &h, timeout)
            .await
            .err()
            .unwrap();
        assert_eq!(e.status, Status::Refused, "{e}");
        // A probe is answered without touching the replica.
        let probe = RelayHeader {
            protocol: Protocol::Probe,
            port: 0,
            source_port: 0,
            ..h.clone()
        };
        let mut stream = rlark_tunnel::relay::open(&hub, &probe, timeout)
            .await
            .unwrap();
        let mut rest = Vec::new();
        stream.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        // Detached: the destination is no longer served.
        assert!(router.detach("srv-0"));
        let e = rlark_tunnel::relay::open(&hub, &probe, timeout)
            .await
            .err()
            .unwrap();
        assert!(e.message.contains("is not running on this agent"), "{e}");
        let stats = metrics.path_stats("d1");
        assert!(
            stats.is_empty(),
            "inbound flows are no outbound paths: {stats:?}"
        );
    }

    #[test]
    fn connect_errors_map_to_statuses() {
        assert_eq!(
            connect_status(&io::ErrorKind::ConnectionRefused.into()),
            Status::Refused
        );
        assert_eq!(
            connect_status(&io::ErrorKind::TimedOut.into()),
            Status::Timeout
        );
        assert_eq!(
            connect_status(&io::ErrorKind::HostUnreachable.into()),
            Status::Unreachable
        );
    }
}
