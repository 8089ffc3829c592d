//! The source side of the pod network: every TCP connection a replica opens ends at the
//! agent (kernel mode: nftables REDIRECTs it to the agent's listener inside the replica's
//! netns, [`REDIRECT_PORT`]; tun mode: the replica's userspace TCP stack accepts it,
//! [`crate::stack`], and hands it to [`Router::serve_tcp`]), and the router decides
//! where it goes:
//!
//! - a member of the replica's domain running on this agent → **local**: a socket made
//!   inside the destination replica's netns connects to it;
//! - a member elsewhere whose agent announced a direct address, not marked failed →
//!   **direct**: mTLS to that agent ([`crate::direct`]), which authorizes and connects;
//! - any other member → **relay**: a `relay` stream through the hub on the agent's tunnel;
//! - an address of the domain's CIDR that no member holds → the connection is closed;
//! - anything else (the control plane's loopback port passed through, the internet) →
//!   **egress**: dialed from the agent's own namespace, so a task in a domain keeps the
//!   outside TCP access it had before.
//!
//! The choice is the pure [`route`] over the [`MembershipView`] and the [`DirectMemory`].
//! A direct attempt that fails (connect, TLS, or an answer other than `forbidden` /
//! `refused`, which are final) falls back to the relay for that connection, and the peer
//! agent is relay-only for [`DIRECT_BACKOFF_INITIAL`], doubling up to
//! [`DIRECT_BACKOFF_MAX`] on each further failed try; a success forgets the failures.
//!
//! Bytes are copied both ways with half-close ([`COPY_BUFFER`] per direction), metered
//! ([`crate::metrics`]).
//!
//! Every network edge is a trait ([`PodNetns`], [`HubRelay`], [`DirectDialer`],
//! [`DestinationFn`]) so the logic is tested with in-memory and loopback stand-ins.

mod edges;
mod route;

pub use edges::*;
pub use route::*;

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rlark_tunnel::header::{self, Status};
use rlark_tunnel::relay::{Protocol, RelayHeader};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::inbound::Inbound;
use crate::membership::{Membership, MembershipView};
use crate::metrics::{DomainMetrics, Metered, PathKind};
pub use crate::pods::{Attached, BoxStream, ByteStream, COPY_BUFFER, PodNetns, Pods};
use crate::splice;

/// Where nftables sends a replica's TCP connections, on 127.0.0.1 and ::1 in its netns.
pub const REDIRECT_PORT: u16 = 15001;
/// How long setting up a local, relayed or egress connection may take.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a direct attempt may take (TCP, TLS, answer) before the relay is tried: short,
/// because a peer cut off by a firewall that drops packets only shows as silence.
pub const DIRECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Relay-only period after a peer agent's first direct failure.
pub const DIRECT_BACKOFF_INITIAL: Duration = Duration::from_secs(30);
/// Longest relay-only period.
pub const DIRECT_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Tunables of the router.
#[derive(Clone)]
pub struct RouterConfig {
    /// Where the listeners are bound in each replica's netns (127.0.0.1 and ::1).
    pub redirect_port: u16,
    /// The original destination of an accepted connection.
    pub destination: DestinationFn,
    pub setup_timeout: Duration,
    pub direct_timeout: Duration,
}

impl std::fmt::Debug for RouterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouterConfig")
            .field("redirect_port", &self.redirect_port)
            .field("setup_timeout", &self.setup_timeout)
            .field("direct_timeout", &self.direct_timeout)
            .finish_non_exhaustive()
    }
}

impl RouterConfig {
    /// The defaults, with `destination` reading the original destination.
    pub fn new(destination: DestinationFn) -> Self {
        RouterConfig {
            redirect_port: REDIRECT_PORT,
            destination,
            setup_timeout: SETUP_TIMEOUT,
            direct_timeout: DIRECT_TIMEOUT,
        }
    }
}

/// The router (see the module documentation). Cheap to clone.
#[derive(Clone)]
pub struct Router {
    inner: Arc<RouterInner>,
}

struct RouterInner {
    membership: Membership,
    metrics: DomainMetrics,
    pods: Pods,
    inbound: Inbound,
    hub: Option<Arc<dyn HubRelay>>,
    direct: Option<Arc<dyn DirectDialer>>,
    memory: Mutex<DirectMemory>,
    config: RouterConfig,
    shutdown: CancellationToken,
}

/// Failures of [`Router::attach`].
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("pod {pod} is already attached")]
    AlreadyAttached { pod: String },
    #[error("listen on {addr} inside the netns of pod {pod}: {source}")]
    Listen {
        pod: String,
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
}

impl Router {
    /// A router over `membership`. `hub`: the relay path (`None`: relay unavailable);
    /// `direct`: the direct path (`None`: never direct). Everything stops on `shutdown`.
    pub fn new(
        membership: Membership,
        metrics: DomainMetrics,
        hub: Option<Arc<dyn HubRelay>>,
        direct: Option<Arc<dyn DirectDialer>>,
        config: RouterConfig,
        shutdown: CancellationToken,
    ) -> Self {
        let pods = Pods::default();
        let inbound = Inbound::new(
            membership.clone(),
            pods.clone(),
            metrics.clone(),
            config.setup_timeout,
            shutdown.clone(),
        );
        Router {
            inner: Arc::new(RouterInner {
                membership,
                metrics,
                pods,
                inbound,
                hub,
                direct,
                memory: Mutex::new(DirectMemory::default()),
                config,
                shutdown,
            }),
        }
    }

    /// The destination side sharing this router's replicas (for the hub's relay streams
    /// and the direct listener).
    pub fn inbound(&self) -> Inbound {
        self.inner.inbound.clone()
    }

    /// The membership this router routes by.
    pub fn membership(&self) -> &Membership {
        &self.inner.membership
    }

    /// Start routing the connections of replica `pod` (a member of `domain`) whose netns is
    /// `netns` (kernel mode): listeners on 127.0.0.1 and ::1 ([`RouterConfig::redirect_port`])
    /// inside it, each with its accept loop, routing by the original destination. The ::1
    /// listener is optional (a netns without IPv6 has none). Until [`Router::detach`],
    /// inbound connections to the replica are served too.
    pub async fn attach(
        &self,
        pod: &str,
        domain: &str,
        netns: Arc<dyn PodNetns>,
    ) -> Result<(), AttachError> {
        let port = self.inner.config.redirect_port;
        self.attach_with(pod, domain, netns, &[(port, ListenerKind::Redirect)])
            .await
    }

    /// [`Router::attach`] for tun mode, where the replica's userspace TCP stack hands its
    /// connections to [`Router::serve_tcp`]: no redirect listener, but one on 127.0.0.1
    /// and ::1 inside the netns for each of `loopback_passthrough` (the host-loopback ports
    /// a task reaches as `127.0.0.1:<port>`, which never reach the TUN device), each
    /// connection dialed to the same loopback address and port in the agent's namespace.
    pub async fn attach_tun(
        &self,
        pod: &str,
        domain: &str,
        netns: Arc<dyn PodNetns>,
        loopback_passthrough: &[u16],
    ) -> Result<(), AttachError> {
        let listeners: Vec<(u16, ListenerKind)> = loopback_passthrough
            .iter()
            .map(|&port| (port, ListenerKind::Passthrough))
            .collect();
        self.attach_with(pod, domain, netns, &listeners).await
    }

    async fn attach_with(
        &self,
        pod: &str,
        domain: &str,
        netns: Arc<dyn PodNetns>,
        ports: &[(u16, ListenerKind)],
    ) -> Result<(), AttachError> {
        if self.inner.pods.netns(pod).is_some() {
            return Err(AttachError::AlreadyAttached {
                pod: pod.to_string(),
            });
        }
        let mut listeners = Vec::new();
        for &(port, kind) in ports {
            let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
            let listener = netns
                .listen(v4)
                .await
                .map_err(|source| AttachError::Listen {
                    pod: pod.to_string(),
                    addr: v4,
                    source,
                })?;
            listeners.push((listener, kind.destination(v4)));
            match netns.listen(v6).await {
                Ok(listener) => listeners.push((listener, kind.destination(v6))),
                Err(error) => {
                    tracing::debug!(%pod, %error, "no IPv6 listener in the replica's netns");
                }
            }
        }
        let stop = self.inner.shutdown.child_token();
        {
            let mut pods = self.inner.pods.lock();
            if pods.contains_key(pod) {
                return Err(AttachError::AlreadyAttached {
                    pod: pod.to_string(),
                });
            }
            pods.insert(
                pod.to_string(),
                Attached {
                    domain: domain.to_string(),
                    netns,
                    stop: stop.clone(),
                },
            );
        }
        for (listener, destination) in listeners {
            tokio::spawn(accept_loop(
                self.clone(),
                pod.to_string(),
                domain.to_string(),
                listener,
                destination,
                stop.clone(),
            ));
        }
        let ports: Vec<u16> = ports.iter().map(|(port, _)| *port).collect();
        tracing::info!(%pod, %domain, ?ports, "replica attached to the pod network");
        Ok(())
    }

    /// Stop routing replica `pod`: its listeners close and its open connections end.
    /// Returns whether it was attached.
    pub fn detach(&self, pod: &str) -> bool {
        let removed = self.inner.pods.lock().remove(pod);
        match removed {
            Some(attached) => {
                attached.stop.cancel();
                tracing::info!(%pod, "replica detached from the pod network");
                true
            }
            None => false,
        }
    }

    /// Whether a direct attempt to `address` is allowed now (tests, diagnostics).
    pub fn direct_allowed(&self, address: &str) -> bool {
        self.memory().allows(address, Instant::now())
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, DirectMemory> {
        self.inner
            .memory
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Open a test connection from replica `pod` to `to` (`port`: a TCP connection to that
    /// port, closed at once; none: a probe, which the destination's agent authorizes
    /// without touching the replica) along the same route as its connections, and measure
    /// the setup.
    pub async fn check(
        &self,
        pod: &str,
        to: IpAddr,
        port: Option<u16>,
    ) -> Result<CheckResult, RouteError> {
        let domain = self
            .inner
            .pods
            .domain(pod)
            .ok_or_else(|| RouteError::UnknownPod {
                pod: pod.to_string(),
            })?;
        let view = self.inner.membership.view();
        let Some(domain_view) = view.domain(&domain) else {
            return Err(RouteError::Unavailable {
                reason: format!("domain {domain} is not known to this agent yet"),
            });
        };
        if !domain_view.cidr.contains(&to) {
            return Err(RouteError::NotInDomain {
                to,
                domain,
                cidr: domain_view.cidr.to_string(),
            });
        }
        let (protocol, port) = match port {
            Some(port) => (Protocol::Tcp, port),
            None => (Protocol::Probe, 0),
        };
        let header = self.header(&view, pod, &domain, protocol, to, port, 0)?;
        let started = Instant::now();
        let (path, stream) = self.open(&view, pod, header).await?;
        let setup = started.elapsed();
        drop(stream);
        Ok(CheckResult { path, setup })
    }

    /// Open a flow described by `protocol`, `to` and `port` from replica `pod` (the
    /// datagram plane's opener: Udp and Icmp). Ok: the stream after the destination's `Ok`.
    pub async fn open_flow(
        &self,
        pod: &str,
        protocol: Protocol,
        to: IpAddr,
        port: u16,
        source_port: u16,
    ) -> Result<(PathKind, BoxStream), RouteError> {
        let domain = self
            .inner
            .pods
            .domain(pod)
            .ok_or_else(|| RouteError::UnknownPod {
                pod: pod.to_string(),
            })?;
        let view = self.inner.membership.view();
        let header = self.header(&view, pod, &domain, protocol, to, port, source_port)?;
        self.open(&view, pod, header).await
    }

    /// Open the flow `header` describes for replica `pod` (the datagram plane's opener,
    /// whose headers come from packets the replica wrote): the header's domain must be the
    /// replica's and its source one of the replica's own addresses, so a replica cannot
    /// speak for another by forging a packet's source address. Its `source_cluster` is
    /// cleared (only the hub sets it).
    pub async fn open_header(
        &self,
        pod: &str,
        mut header: RelayHeader,
    ) -> Result<(PathKind, BoxStream), RouteError> {
        let domain = self
            .inner
            .pods
            .domain(pod)
            .ok_or_else(|| RouteError::UnknownPod {
                pod: pod.to_string(),
            })?;
        let view = self.inner.membership.view();
        let own = view.addresses_of(&domain, pod);
        if header.domain != domain || !own.contains(&header.source) {
            return Err(RouteError::Spoofed {
                pod: pod.to_string(),
                address: header.source,
                domain: header.domain,
            });
        }
        header.source_cluster = None;
        self.open(&view, pod, header).await
    }

    /// The relay header of a flow from `pod`.
    #[allow(clippy::too_many_arguments)]
    fn header(
        &self,
        view: &MembershipView,
        pod: &str,
        domain: &str,
        protocol: Protocol,
        to: IpAddr,
        port: u16,
        source_port: u16,
    ) -> Result<RelayHeader, RouteError> {
        let Some(source) = view.source_address(domain, pod, to) else {
            let why = match view.pending(pod) {
                Some((_, entry)) => format!(": {} ({})", entry.reason, entry.message),
                None => String::new(),
            };
            return Err(RouteError::NoAddress {
                pod: pod.to_string(),
                domain: domain.to_string(),
                family: if to.is_ipv4() { "IPv4" } else { "IPv6" },
                why,
            });
        };
        Ok(RelayHeader {
            domain: domain.to_string(),
            protocol,
            source,
            destination: to,
            port,
            source_port,
            source_cluster: None,
        })
    }

    /// Open `header`'s flow along its route; every protocol, every path. Counts failures.
    async fn open(
        &self,
        view: &MembershipView,
        pod: &str,
        header: RelayHeader,
    ) -> Result<(PathKind, BoxStream), RouteError> {
        let (path, opened) = self.open_route(view, pod, header).await?;
        Ok((path, opened.into_stream()))
    }

    /// [`Router::open`], keeping a local TCP flow's kernel socket as it is (to be spliced).
    async fn open_route(
        &self,
        view: &MembershipView,
        pod: &str,
        header: RelayHeader,
    ) -> Result<(PathKind, Opened), RouteError> {
        let domain = header.domain.clone();
        let route = route(
            view,
            &domain,
            header.destination,
            &self.memory(),
            Instant::now(),
        );
        match route {
            Route::Egress => Err(RouteError::NotInDomain {
                to: header.destination,
                domain: domain.clone(),
                cidr: view
                    .domain(&domain)
                    .map(|d| d.cidr.to_string())
                    .unwrap_or_default(),
            }),
            Route::NoMember => Err(RouteError::NoMember {
                to: header.destination,
                domain,
            }),
            Route::Local { pod: destination } => {
                let own = self.inner.membership.identity().cluster.clone();
                let stream = match header.protocol {
                    Protocol::Tcp => {
                        let netns = self.inner.pods.netns(&destination);
                        let addr = SocketAddr::new(header.destination, header.port);
                        match netns {
                            None => Err(RouteError::Failed {
                                path: PathKind::Local,
                                status: Status::Unreachable,
                                message: format!(
                                    "pod {destination} is a member here but is not running"
                                ),
                            }),
                            Some(netns) => netns
                                .connect(addr, self.inner.config.setup_timeout)
                                .await
                                .map(Opened::Socket)
                                .map_err(|e| RouteError::Failed {
                                    path: PathKind::Local,
                                    status: crate::inbound::connect_status(&e),
                                    message: format!("connect to {addr} in pod {destination}: {e}"),
                                }),
                        }
                    }
                    _ => self.open_in_process(header, &own).await.map(Opened::Stream),
                };
                match stream {
                    Ok(stream) => Ok((PathKind::Local, stream)),
                    Err(error) => {
                        if let RouteError::Failed { status, .. } = &error {
                            self.inner.metrics.failed(
                                &domain,
                                &own,
                                PathKind::Local,
                                status.as_str(),
                            );
                        }
                        tracing::debug!(%pod, %error, "local flow failed");
                        Err(error)
                    }
                }
            }
            Route::Direct { address, cluster } => {
                let direct = self.inner.direct.clone();
                if let Some(direct) = direct {
                    let attempt = direct
                        .open(
                            address.clone(),
                            cluster.clone(),
                            header.clone(),
                            self.inner.config.direct_timeout,
                        )
                        .await;
                    match attempt {
                        Ok(stream) => {
                            self.memory().succeeded(&address);
                            return Ok((PathKind::Direct, Opened::Stream(stream)));
                        }
                        Err(error) => {
                            let status = error.status();
                            self.inner.metrics.failed(
                                &domain,
                                &cluster,
                                PathKind::Direct,
                                status.as_str(),
                            );
                            if !error.falls_back() {
                                tracing::info!(%pod, flow = %header, %error, "direct path refused the flow");
                                return Err(RouteError::Failed {
                                    path: PathKind::Direct,
                                    status,
                                    message: error.to_string(),
                                });
                            }
                            let period = self.memory().failed(&address, Instant::now());
                            self.inner.metrics.fallback(&domain, &cluster);
                            tracing::warn!(%pod, peer = %cluster, %address, %error, relay_only_for = ?period, "direct path failed: relaying");
                        }
                    }
                }
                self.relay(header, &cluster)
                    .await
                    .map(|(path, stream)| (path, Opened::Stream(stream)))
            }
            Route::Relay { cluster } => self
                .relay(header, &cluster)
                .await
                .map(|(path, stream)| (path, Opened::Stream(stream))),
        }
    }

    async fn relay(
        &self,
        header: RelayHeader,
        cluster: &str,
    ) -> Result<(PathKind, BoxStream), RouteError> {
        let domain = header.domain.clone();
        let Some(hub) = self.inner.hub.clone() else {
            self.inner
                .metrics
                .failed(&domain, cluster, PathKind::Relay, "unavailable");
            return Err(RouteError::Unavailable {
                reason: "the relay through the hub is not available on this agent".into(),
            });
        };
        match hub.open(header, self.inner.config.setup_timeout).await {
            Ok(stream) => Ok((PathKind::Relay, stream)),
            Err(error) => {
                self.inner
                    .metrics
                    .failed(&domain, cluster, PathKind::Relay, error.status.as_str());
                Err(RouteError::Failed {
                    path: PathKind::Relay,
                    status: error.status,
                    message: error.message,
                })
            }
        }
    }

    /// A flow to a member of this agent served by this agent's own inbound side through an
    /// in-process pipe, so local datagrams and probes are authorized and delivered exactly
    /// as remote ones.
    async fn open_in_process(
        &self,
        header: RelayHeader,
        own_cluster: &str,
    ) -> Result<BoxStream, RouteError> {
        let (mut near, far) = tokio::io::duplex(COPY_BUFFER);
        let inbound = self.inner.inbound.clone();
        let cluster = own_cluster.to_string();
        tokio::spawn(async move {
            inbound
                .serve(header, Some(cluster), Box::new(far), PathKind::Local)
                .await;
        });
        let answer = tokio::time::timeout(
            self.inner.config.setup_timeout,
            header::read_response(&mut near),
        )
        .await;
        let failed = |status: Status, message: String| RouteError::Failed {
            path: PathKind::Local,
            status,
            message,
        };
        match answer {
            Err(_) => Err(failed(Status::Timeout, "no answer in time".into())),
            Ok(Err(e)) => Err(failed(Status::Internal, e.to_string())),
            Ok(Ok(response)) if response.status == Status::Ok => Ok(Box::new(near)),
            Ok(Ok(response)) => Err(failed(response.status, response.message)),
        }
    }

    /// Route one connection that replica `pod`'s userspace TCP stack accepted (tun mode):
    /// `source` is the replica's ip:port, `destination` where it connected to. The same
    /// routing as a redirected connection of kernel mode; ends when the connection is done
    /// or the replica is detached. A pod that is not attached gets its connection closed.
    pub async fn serve_tcp(
        &self,
        pod: &str,
        conn: BoxStream,
        source: SocketAddr,
        destination: SocketAddr,
    ) {
        let attached = {
            let pods = self.inner.pods.lock();
            pods.get(pod).map(|a| (a.domain.clone(), a.stop.clone()))
        };
        let Some((domain, stop)) = attached else {
            tracing::debug!(%pod, %source, %destination, "connection of a pod that is not attached: closed");
            return;
        };
        tokio::select! {
            () = stop.cancelled() => {}
            () = self.route_connection(pod, &domain, conn, source.port(), destination) => {}
        }
    }

    /// Route one accepted connection of replica `pod`: to `destination` when given (a
    /// passthrough listener), else to its original destination.
    async fn handle(
        &self,
        pod: &str,
        domain: &str,
        conn: TcpStream,
        destination: Option<SocketAddr>,
    ) {
        let destination = match destination {
            Some(destination) => destination,
            None => match (self.inner.config.destination)(&conn) {
                Ok(destination) => destination,
                Err(error) => {
                    tracing::warn!(%pod, %error, "no original destination: connection closed");
                    return;
                }
            },
        };
        let _ = conn.set_nodelay(true);
        let source_port = conn.peer_addr().map(|a| a.port()).unwrap_or(0);
        self.route_connection(pod, domain, conn, source_port, destination)
            .await;
    }

    /// Route one connection of replica `pod` (from its `source_port`) to `destination`
    /// and copy it both ways until done.
    async fn route_connection<C>(
        &self,
        pod: &str,
        domain: &str,
        mut conn: C,
        source_port: u16,
        destination: SocketAddr,
    ) where
        C: ReplicaConn,
    {
        let view = self.inner.membership.view();
        let route = route(
            &view,
            domain,
            destination.ip(),
            &self.memory(),
            Instant::now(),
        );
        let (path, peer, opened): (PathKind, String, Opened) = match route {
            Route::Egress => {
                let dialed = tokio::time::timeout(
                    self.inner.config.setup_timeout,
                    TcpStream::connect(destination),
                )
                .await;
                match dialed {
                    Ok(Ok(tcp)) => {
                        let _ = tcp.set_nodelay(true);
                        (PathKind::Egress, String::new(), Opened::Socket(tcp))
                    }
                    Ok(Err(error)) => {
                        let status = crate::inbound::connect_status(&error);
                        self.inner
                            .metrics
                            .failed(domain, "", PathKind::Egress, status.as_str());
                        tracing::debug!(%pod, %destination, %error, "egress connect failed");
                        return;
                    }
                    Err(_) => {
                        self.inner
                            .metrics
                            .failed(domain, "", PathKind::Egress, "timeout");
                        return;
                    }
                }
            }
            Route::NoMember => {
                tracing::info!(%pod, %domain, %destination, "no member holds this address: connection closed");
                return;
            }
            Route::Local { .. } | Route::Direct { .. } | Route::Relay { .. } => {
                let peer = match &route {
                    Route::Direct { cluster, .. } | Route::Relay { cluster } => cluster.clone(),
                    _ => self.inner.membership.identity().cluster.clone(),
                };
                let header = match self.header(
                    &view,
                    pod,
                    domain,
                    Protocol::Tcp,
                    destination.ip(),
                    destination.port(),
                    source_port,
                ) {
                    Ok(header) => header,
                    Err(error) => {
                        tracing::warn!(%pod, %error, "connection closed");
                        return;
                    }
                };
                match self.open_route(&view, pod, header).await {
                    Ok((path, opened)) => (path, peer, opened),
                    Err(error) => {
                        tracing::debug!(%pod, %destination, %error, "connection not set up");
                        return;
                    }
                }
            }
        };
        let meter = self.inner.metrics.opened(domain, &peer, path);
        // Kernel socket to kernel socket (kernel mode's local and egress paths): spliced,
        // never copied through the agent (net::splice). Anything else: copied.
        let opened = match opened {
            Opened::Socket(socket) => match conn.kernel_socket() {
                Some(member) => {
                    let moved =
                        splice::bidirectional(member, &socket, |direction, n| match direction {
                            splice::Direction::AToB => meter.sent(n),
                            splice::Direction::BToA => meter.received(n),
                        })
                        .await;
                    match moved {
                        Ok((out, back)) => {
                            tracing::debug!(%pod, %destination, %path, out, back, "connection done (spliced)");
                        }
                        Err(error) => {
                            tracing::debug!(%pod, %destination, %path, %error, "connection ended with an error");
                        }
                    }
                    return;
                }
                None => Opened::Socket(socket),
            },
            other => other,
        };
        let mut stream = opened.into_stream();
        let mut member = Metered::new(&mut conn, meter);
        match tokio::io::copy_bidirectional_with_sizes(
            &mut member,
            &mut stream,
            COPY_BUFFER,
            COPY_BUFFER,
        )
        .await
        {
            Ok((out, back)) => {
                tracing::debug!(%pod, %destination, %path, out, back, "connection done");
            }
            Err(error) => {
                tracing::debug!(%pod, %destination, %path, %error, "connection ended with an error");
            }
        }
        let _ = stream.shutdown().await;
    }
}

/// A flow's far end as the router opened it.
enum Opened {
    /// A kernel TCP socket (a member on this agent, or egress): spliceable.
    Socket(TcpStream),
    /// Anything else (the direct path's TLS, a relay stream, an in-process pipe).
    Stream(BoxStream),
}

impl Opened {
    fn into_stream(self) -> BoxStream {
        match self {
            Opened::Socket(socket) => Box::new(socket),
            Opened::Stream(stream) => stream,
        }
    }
}

/// A replica's end of a connection the router serves: kernel mode's is the redirected
/// kernel socket (which can be spliced), tun mode's a userspace stack's stream.
pub trait ReplicaConn: AsyncRead + AsyncWrite + Unpin {
    /// The kernel socket, when it is one.
    fn kernel_socket(&self) -> Option<&TcpStream> {
        None
    }
}

impl ReplicaConn for TcpStream {
    fn kernel_socket(&self) -> Option<&TcpStream> {
        Some(self)
    }
}

impl ReplicaConn for BoxStream {}

/// What a listener of a replica's netns is for.
#[derive(Clone, Copy, Debug)]
enum ListenerKind {
    /// Kernel mode's redirect listener: each connection goes to its original destination.
    Redirect,
    /// Tun mode's loopback passthrough: each connection goes to the listener's own address
    /// in the agent's namespace.
    Passthrough,
}

impl ListenerKind {
    /// The fixed destination of a listener of this kind bound to `bound` (`None`: the
    /// original destination of each connection).
    fn destination(self, bound: SocketAddr) -> Option<SocketAddr> {
        match self {
            ListenerKind::Redirect => None,
            ListenerKind::Passthrough => Some(bound),
        }
    }
}

/// Accept connections of replica `pod` until `stop`; each is routed (to `destination` when
/// given, else to its original destination) in its own task, which ends with `stop` too.
async fn accept_loop(
    router: Router,
    pod: String,
    domain: String,
    listener: TcpListener,
    destination: Option<SocketAddr>,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((conn, _)) => {
                let (router, pod, domain, stop) =
                    (router.clone(), pod.clone(), domain.clone(), stop.clone());
                tokio::spawn(async move {
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = router.handle(&pod, &domain, conn, destination) => {}
                    }
                });
            }
            Err(error) => {
                // EMFILE and friends: wait a little rather than spin.
                tracing::warn!(%pod, %error, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
