//! The hub: agents' tunnel sessions, and what the server does with them.
//!
//! An agent opens `GET /api/connect` (WebSocket upgrade, agent client certificate); the
//! upgraded connection carries an `rlark_tunnel::mux` session in which the hub opens
//! streams towards the agent. The [`Hub`] keeps every live session by cluster ID (and node,
//! for node agents). Several sessions of one agent may be live at once (a reconnect while
//! the old connection drains, or one per server address); new streams go to the newest.
//! Uses: the HTTP reverse proxy (`/api/proxy/...`), HTTP `CONNECT` on the HTTPS port, and
//! `rlark port-forward`, all through [`Hub::dial`]. Streams the agents open towards the hub
//! are the pod network's relay ([`relay`]).

mod agent_refusal;
pub(crate) mod connect;
pub(crate) mod core_pods;
pub(crate) mod devices;
pub(crate) mod exec;
pub(crate) mod logs;
pub(crate) mod netcheck;
pub(crate) mod peer;
pub(crate) mod portforward;
pub(crate) mod prefix;
pub(crate) mod proxy_tls;
pub(crate) mod relay;
pub(crate) mod replica_port;
pub(crate) mod replicas;
pub(crate) mod routes;
pub(crate) mod task_proxy;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use rlark_tunnel::dial::DialError;
use rlark_tunnel::header::{Status, StreamRequest};
use rlark_tunnel::mux::{Control, MuxConfig};
use serde::Serialize;

use crate::security::Security;
pub(crate) use peer::HubStream;
pub(crate) use proxy_tls::ProxyTls;

/// Tunnel tunables (the agent side has its own copy of the mux settings).
#[derive(Clone, Debug)]
pub struct TunnelConfig {
    /// Multiplexer settings of hub sessions (windows, stream limit, keep-alive).
    pub mux: MuxConfig,
    /// Deadline of a dial through an agent when the caller gives none.
    pub dial_timeout: Duration,
    /// The URL agents reach this replica at, published in `GET /rlark/v1/replicas`
    /// (`replicas.rs`). `None`: derived from the listen address when it names one IP
    /// (`https://IP:PORT`), else from the first `tlsSans` entry; not published when neither
    /// gives one.
    pub advertise_url: Option<String>,
    /// The URL the other replicas reach this replica at, for streams to agents whose
    /// tunnel is on this replica (`peer.rs`). `None`: the advertise URL. Set it where agents
    /// reach the replicas through one load-balanced address (`advertise_url` is then the
    /// same for all of them) and each replica has an address of its own inside the
    /// installation (a StatefulSet pod's DNS name).
    pub peer_url: Option<String>,
    /// Other replicas' URLs, listed in `GET /rlark/v1/replicas` besides the ones registered
    /// in the store (for replicas that do not share a store).
    pub peers: Vec<String>,
    /// Streams one user may hold open at once to one agent (cluster) through this replica:
    /// SSH sessions and forwards, task proxy requests, exec, port-forward connections
    /// ([`Hub::user_share`]). `None` (the default): a quarter of `mux.max_streams` (1024 of
    /// 4096), so one user cannot take all of an agent's streams. File field
    /// `tunnel.maxStreamsPerUser`.
    pub max_streams_per_user: Option<usize>,
}

impl TunnelConfig {
    /// [`TunnelConfig::max_streams_per_user`], or its default.
    pub fn streams_per_user(&self) -> usize {
        self.max_streams_per_user
            .unwrap_or(self.mux.max_streams / 4)
            .max(1)
    }
}

impl Default for TunnelConfig {
    /// The mux defaults; 10 s dials.
    fn default() -> Self {
        Self {
            mux: MuxConfig::default(),
            dial_timeout: Duration::from_secs(10),
            advertise_url: None,
            peer_url: None,
            peers: Vec::new(),
            max_streams_per_user: None,
        }
    }
}

/// One live tunnel session of an agent.
pub(crate) struct AgentSession {
    pub id: u64,
    pub cluster_id: String,
    pub node: Option<String>,
    pub remote: std::net::SocketAddr,
    pub connected_since: SystemTime,
    /// Serial of the client certificate the session was opened with.
    pub serial: String,
    pub control: Control,
}

/// What `GET /api/v1/tunnels` and `rlark get tunnels` show per session.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TunnelInfo {
    #[serde(rename = "clusterID")]
    pub cluster_id: String,
    pub node: Option<String>,
    /// The server replica holding the session.
    pub replica: String,
    pub remote: String,
    pub connected_since: String,
    pub streams_open: usize,
    pub streams_total: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Smallest PING round trip measured on the session (µs); absent before the first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_rtt_micros: Option<u64>,
}

/// Dial counters by outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct DialLabels {
    status: String,
}

/// Which session of a cluster a stream goes through.
#[derive(Debug, Clone, Copy)]
enum Pick<'a> {
    /// The newest of this node, else the newest of any node.
    Prefer(Option<&'a str>),
    /// The newest of this node, else none.
    Exactly(&'a str),
}

/// The registry of agent sessions.
pub(crate) struct Hub {
    replica: String,
    config: TunnelConfig,
    next_id: AtomicU64,
    sessions: Mutex<HashMap<String, Vec<Arc<AgentSession>>>>,
    dials: Family<DialLabels, Counter>,
    connects: Counter,
    proxy_tls: ProxyTls,
    relay: relay::Relay,
    /// The other replicas, for agents this one has no session with (set once at start).
    peers: std::sync::OnceLock<peer::PeerLink>,
    /// Open streams per (cluster ID, user) of the streams opened for a user.
    shares: Arc<Mutex<HashMap<(String, String), usize>>>,
    /// Streams refused because their user held their share of the agent's streams.
    share_refused: Counter,
}

/// One stream's place in its user's share of an agent's streams ([`Hub::user_share`]),
/// given back when dropped.
pub(crate) struct StreamShare {
    shares: Arc<Mutex<HashMap<(String, String), usize>>>,
    key: (String, String),
}

impl Drop for StreamShare {
    fn drop(&mut self) {
        let mut shares = self
            .shares
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = shares.get_mut(&self.key) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                shares.remove(&self.key);
            }
        }
    }
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("replica", &self.replica)
            .finish_non_exhaustive()
    }
}

impl Hub {
    pub(crate) fn new(replica: String, config: TunnelConfig) -> Arc<Hub> {
        Arc::new(Hub {
            replica,
            config,
            next_id: AtomicU64::new(1),
            sessions: Mutex::new(HashMap::new()),
            dials: Family::default(),
            connects: Counter::default(),
            proxy_tls: ProxyTls::new(),
            relay: relay::Relay::default(),
            peers: std::sync::OnceLock::new(),
            shares: Arc::default(),
            share_refused: Counter::default(),
        })
    }

    /// A place for one more stream of `user` to the agent of `cluster_id` — taken before
    /// the stream is opened and attached to it ([`HubStream::with_share`]) — or a
    /// `limit` error naming the share when `user` already holds
    /// [`TunnelConfig::streams_per_user`] of them: so one user (an SSH channel flood, a
    /// flood of proxy requests) cannot take all of an agent's streams from the others.
    pub(crate) fn user_share(
        &self,
        cluster_id: &str,
        user: &str,
    ) -> Result<StreamShare, DialError> {
        let max = self.config.streams_per_user();
        let key = (cluster_id.to_string(), user.to_string());
        let mut shares = self
            .shares
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = shares.entry(key.clone()).or_default();
        if *count >= max {
            drop(shares);
            self.share_refused.inc();
            tracing::warn!(
                cluster = cluster_id,
                user,
                max,
                "stream refused: the user holds its share of the agent's tunnel streams"
            );
            return Err(DialError {
                status: Status::Limit,
                message: format!(
                    "user {user:?} has {max} streams open to the agent of cluster \
                     {cluster_id:?}, the most one user may hold (tunnel.maxStreamsPerUser); \
                     close some and retry"
                ),
            });
        }
        *count += 1;
        Ok(StreamShare {
            shares: Arc::clone(&self.shares),
            key,
        })
    }

    /// Carry streams for agents without a session here through the other replicas
    /// (`peer.rs`). Once; later calls are ignored.
    pub(crate) fn set_peer_link(&self, link: peer::PeerLink) {
        let _ = self.peers.set(link);
    }

    pub(crate) fn config(&self) -> &TunnelConfig {
        &self.config
    }

    /// The pod-network relay (agent-opened streams).
    pub(crate) fn relay(&self) -> &relay::Relay {
        &self.relay
    }

    /// TLS towards `https` proxy targets.
    pub(crate) fn proxy_tls(&self) -> &ProxyTls {
        &self.proxy_tls
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Arc<AgentSession>>>> {
        self.sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Register a session; returns its id (for [`Hub::unregister`]).
    pub(crate) fn register(
        &self,
        cluster_id: String,
        node: Option<String>,
        remote: std::net::SocketAddr,
        serial: String,
        control: Control,
    ) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let session = Arc::new(AgentSession {
            id,
            cluster_id: cluster_id.clone(),
            node,
            remote,
            connected_since: SystemTime::now(),
            serial,
            control,
        });
        self.lock().entry(cluster_id).or_default().push(session);
        self.connects.inc();
        id
    }

    /// Forget a session (it ended).
    pub(crate) fn unregister(&self, cluster_id: &str, id: u64) {
        let mut sessions = self.lock();
        if let Some(list) = sessions.get_mut(cluster_id) {
            list.retain(|s| s.id != id);
            if list.is_empty() {
                sessions.remove(cluster_id);
            }
        }
    }

    /// The newest live session of `cluster_id`, preferring one of `node` when given
    /// (falling back to any session of the cluster).
    fn pick(&self, cluster_id: &str, node: Option<&str>) -> Option<Control> {
        self.pick_by(cluster_id, Pick::Prefer(node))
    }

    /// The newest live session of `cluster_id` that `pick` accepts.
    fn pick_by(&self, cluster_id: &str, pick: Pick<'_>) -> Option<Control> {
        let sessions = self.lock();
        let list = sessions.get(cluster_id)?;
        let live = |s: &&Arc<AgentSession>| !s.control.is_closed();
        let node = match pick {
            Pick::Exactly(node) => {
                return list
                    .iter()
                    .rev()
                    .filter(live)
                    .find(|s| s.node.as_deref() == Some(node))
                    .map(|s| s.control.clone());
            }
            Pick::Prefer(node) => node,
        };
        let by_node = node.and_then(|n| {
            list.iter()
                .rev()
                .filter(live)
                .find(|s| s.node.as_deref() == Some(n))
        });
        by_node
            .or_else(|| list.iter().rev().find(live))
            .map(|s| s.control.clone())
    }

    /// Open a stream to `host:port` as seen from the agent of `cluster_id`, with the
    /// tunnel's deadline; typed errors (`no-such-agent`, `refused`, `timeout`, ...).
    pub(crate) async fn dial(
        &self,
        cluster_id: &str,
        node: Option<&str>,
        host: &str,
        port: u16,
    ) -> Result<HubStream, DialError> {
        self.dial_through(cluster_id, Pick::Prefer(node), host, port)
            .await
    }

    /// [`Hub::dial`] through the session of `node` only, never another node's: for
    /// addresses that mean something different on each host (its loopback, where a raw
    /// replica's ports are).
    pub(crate) async fn dial_on_node(
        &self,
        cluster_id: &str,
        node: &str,
        host: &str,
        port: u16,
    ) -> Result<HubStream, DialError> {
        self.dial_through(cluster_id, Pick::Exactly(node), host, port)
            .await
    }

    /// A `DialTcp` stream through the session `pick` chooses.
    async fn dial_through(
        &self,
        cluster_id: &str,
        pick: Pick<'_>,
        host: &str,
        port: u16,
    ) -> Result<HubStream, DialError> {
        let request = StreamRequest::DialTcp {
            host: host.to_string(),
            port,
            timeout: self.config.dial_timeout,
        };
        // The agent gets the whole dial timeout; the answer may take a moment longer.
        let deadline = self.config.dial_timeout + Duration::from_secs(1);
        self.open(cluster_id, pick, &request, deadline).await
    }

    /// Open a stream to the local API of the agent of `cluster_id` (logs; later exec).
    pub(crate) async fn dial_agent_api(
        &self,
        cluster_id: &str,
        node: Option<&str>,
    ) -> Result<HubStream, DialError> {
        self.open(
            cluster_id,
            Pick::Prefer(node),
            &StreamRequest::AgentApi,
            self.config.dial_timeout,
        )
        .await
    }

    /// [`Hub::dial_agent_api`] through the session of `node` only (what the agent of that
    /// node alone knows: its replicas' ports).
    pub(crate) async fn dial_agent_api_on_node(
        &self,
        cluster_id: &str,
        node: &str,
    ) -> Result<HubStream, DialError> {
        self.open(
            cluster_id,
            Pick::Exactly(node),
            &StreamRequest::AgentApi,
            self.config.dial_timeout,
        )
        .await
    }

    /// Open a stream with `request` through one of this replica's sessions of the agent, or,
    /// when it has none, through the replica that has one (`peer.rs`).
    async fn open(
        &self,
        cluster_id: &str,
        pick: Pick<'_>,
        request: &StreamRequest,
        deadline: Duration,
    ) -> Result<HubStream, DialError> {
        let local = self.open_local(cluster_id, pick, request, deadline).await;
        match (local, self.peers.get()) {
            (Err(error), Some(peers)) if error.status == Status::NoSuchAgent => {
                let result = peers.open(cluster_id, pick, request, deadline).await;
                self.dials
                    .get_or_create(&DialLabels {
                        status: match &result {
                            Ok(_) => "peer".to_string(),
                            Err(e) => format!("peer-{}", e.status.as_str()),
                        },
                    })
                    .inc();
                result
            }
            (local, _) => local,
        }
    }

    /// Pick one of this replica's sessions of the agent, open a stream with `request`, and
    /// count the outcome.
    async fn open_local(
        &self,
        cluster_id: &str,
        pick: Pick<'_>,
        request: &StreamRequest,
        deadline: Duration,
    ) -> Result<HubStream, DialError> {
        let result = match self.pick_by(cluster_id, pick) {
            None => Err(DialError {
                status: Status::NoSuchAgent,
                message: match pick {
                    Pick::Exactly(node) => format!(
                        "the agent of node {node:?} (cluster {cluster_id:?}) is not connected \
                         to this server"
                    ),
                    Pick::Prefer(_) => {
                        format!("no agent of cluster {cluster_id:?} is connected to this server")
                    }
                },
            }),
            Some(control) => rlark_tunnel::dial::open(&control, request, deadline)
                .await
                .map(HubStream::local),
        };
        let status = match &result {
            Ok(_) => "ok",
            Err(e) => e.status.as_str(),
        };
        self.dials
            .get_or_create(&DialLabels {
                status: status.to_string(),
            })
            .inc();
        result
    }

    /// Every live session, oldest first per cluster.
    pub(crate) fn list(&self) -> Vec<TunnelInfo> {
        let sessions = self.lock();
        let mut out: Vec<TunnelInfo> = sessions
            .values()
            .flatten()
            .filter(|s| !s.control.is_closed())
            .map(|s| {
                let stats = s.control.stats();
                TunnelInfo {
                    cluster_id: s.cluster_id.clone(),
                    node: s.node.clone(),
                    replica: self.replica.clone(),
                    remote: s.remote.to_string(),
                    connected_since: chrono::DateTime::<chrono::Utc>::from(s.connected_since)
                        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    streams_open: stats.streams_open,
                    streams_total: stats.streams_total,
                    bytes_in: stats.bytes_in,
                    bytes_out: stats.bytes_out,
                    min_rtt_micros: stats
                        .min_rtt
                        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
                }
            })
            .collect();
        out.sort_by(|a, b| {
            (&a.cluster_id, &a.connected_since).cmp(&(&b.cluster_id, &b.connected_since))
        });
        out
    }

    /// Close every session whose certificate has been revoked, whenever a revocation
    /// happens, until `shutdown`. (An upgraded connection no longer belongs to the HTTP
    /// connection task that would otherwise close it.)
    pub(crate) async fn enforce_revocations(
        self: Arc<Self>,
        security: Arc<Security>,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        let mut changes = security.subscribe();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                changed = changes.changed() => if changed.is_err() { return },
            }
            let revoked: Vec<Arc<AgentSession>> = self
                .lock()
                .values()
                .flatten()
                .filter(|s| security.is_revoked(&s.serial))
                .cloned()
                .collect();
            for session in revoked {
                tracing::info!(
                    cluster = %session.cluster_id,
                    serial = %session.serial,
                    "closing tunnel: its certificate was revoked"
                );
                session.control.close();
            }
        }
    }

    /// Close every session (server shutdown).
    pub(crate) fn close_all(&self) {
        for session in self.lock().values().flatten() {
            session.control.close();
        }
    }
}

/// Prometheus view of the hub.
#[derive(Debug)]
pub(crate) struct HubCollector {
    pub hub: Arc<Hub>,
}

impl prometheus_client::collector::Collector for HubCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let list = self.hub.list();
        let sessions = ConstGauge::new(list.len() as i64);
        sessions.encode(encoder.encode_descriptor(
            "rlark_tunnel_sessions",
            "Live agent tunnel sessions on this server",
            None,
            sessions.metric_type(),
        )?)?;
        let streams = ConstGauge::new(list.iter().map(|t| t.streams_open as i64).sum::<i64>());
        streams.encode(encoder.encode_descriptor(
            "rlark_tunnel_streams_open",
            "Open streams over all tunnel sessions",
            None,
            streams.metric_type(),
        )?)?;
        let bytes_in = prometheus_client::metrics::counter::ConstCounter::new(
            list.iter().map(|t| t.bytes_in).sum::<u64>(),
        );
        bytes_in.encode(encoder.encode_descriptor(
            "rlark_tunnel_live_received_bytes",
            "Payload bytes received from agents over the live sessions",
            None,
            bytes_in.metric_type(),
        )?)?;
        let bytes_out = prometheus_client::metrics::counter::ConstCounter::new(
            list.iter().map(|t| t.bytes_out).sum::<u64>(),
        );
        bytes_out.encode(encoder.encode_descriptor(
            "rlark_tunnel_live_sent_bytes",
            "Payload bytes sent to agents over the live sessions",
            None,
            bytes_out.metric_type(),
        )?)?;
        self.hub.dials.encode(encoder.encode_descriptor(
            "rlark_tunnel_dials",
            "Dials through agents by outcome (ok, refused, timeout, no-such-agent, ...)",
            None,
            self.hub.dials.metric_type(),
        )?)?;
        self.hub.share_refused.encode(encoder.encode_descriptor(
            "rlark_tunnel_user_share_refused",
            "Streams to an agent refused because their user held its share of the agent's \
             streams (tunnel.maxStreamsPerUser)",
            None,
            self.hub.share_refused.metric_type(),
        )?)?;
        self.hub.connects.encode(encoder.encode_descriptor(
            "rlark_tunnel_connects",
            "Agent tunnel sessions accepted",
            None,
            self.hub.connects.metric_type(),
        )?)?;
        let relay = self.hub.relay();
        relay.streams.encode(encoder.encode_descriptor(
            "rlark_tunnel_relay_streams",
            "Pod-network relay streams opened by agents, by domain and outcome (ok, forbidden, \
             bad-request, unreachable, no-such-agent, ...)",
            None,
            relay.streams.metric_type(),
        )?)?;
        relay.bytes.encode(encoder.encode_descriptor(
            "rlark_tunnel_relay_bytes",
            "Bytes relayed between agents, by domain and direction (counted when a relay ends)",
            None,
            relay.bytes.metric_type(),
        )?)?;
        relay.active.encode(encoder.encode_descriptor(
            "rlark_tunnel_relay_active",
            "Relays being spliced right now, by domain",
            None,
            relay.active.metric_type(),
        )?)?;
        Ok(())
    }
}

/// Parse a CONNECT authority `<host>.<clusterID>.agent:<port>` (the host may itself contain
/// dots, e.g. an IPv4 address). Returns (host, cluster ID, port).
pub(crate) fn parse_agent_authority(authority: &str) -> Result<(String, String, u16), String> {
    let (name, port) = authority
        .rsplit_once(':')
        .ok_or_else(|| format!("{authority:?} has no port; use <host>.<clusterID>.agent:<port>"))?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("{authority:?}: port {port:?} is not a number in 1..=65535"))?;
    let rest = name.strip_suffix(".agent").ok_or_else(|| {
        format!("{authority:?} is not an agent address; use <host>.<clusterID>.agent:<port>")
    })?;
    let (host, cluster) = rest.rsplit_once('.').ok_or_else(|| {
        format!("{authority:?} names no host; use <host>.<clusterID>.agent:<port>")
    })?;
    if host.is_empty() || cluster.is_empty() {
        return Err(format!(
            "{authority:?}: host and cluster ID must not be empty"
        ));
    }
    crate::security::validate_cluster_id(cluster).map_err(|e| e.message)?;
    Ok((host.to_string(), cluster.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_share_of_an_agents_streams_is_capped_and_given_back() {
        let hub = Hub::new(
            "r".into(),
            TunnelConfig {
                max_streams_per_user: Some(2),
                ..TunnelConfig::default()
            },
        );
        let a1 = hub.user_share("a", "vera").expect("first");
        let _a2 = hub.user_share("a", "vera").expect("second");
        let refused = hub.user_share("a", "vera").err().expect("third");
        assert_eq!(refused.status, Status::Limit);
        assert!(
            refused.message.contains("tunnel.maxStreamsPerUser"),
            "{}",
            refused.message
        );
        assert_eq!(hub.share_refused.get(), 1);
        // Another user, another agent: their own shares.
        let _admin = hub.user_share("a", "admin").expect("admin");
        let _other_agent = hub.user_share("b", "vera").expect("agent b");
        // A closed stream gives its place back.
        drop(a1);
        let _again = hub.user_share("a", "vera").expect("after a close");
        // The default is a quarter of the stream limit.
        assert_eq!(TunnelConfig::default().streams_per_user(), 1024);
    }

    #[test]
    fn agent_authorities_parse() {
        assert_eq!(
            parse_agent_authority("127.0.0.1.edge.agent:9100").unwrap(),
            ("127.0.0.1".to_string(), "edge".to_string(), 9100)
        );
        assert_eq!(
            parse_agent_authority("db.internal.site-2.agent:5432").unwrap(),
            ("db.internal".to_string(), "site-2".to_string(), 5432)
        );
        for bad in [
            "127.0.0.1.edge.agent",
            "127.0.0.1.edge:80",
            "edge.agent:80",
            ".edge.agent:80",
            "h.EDGE.agent:80",
            "h.edge.agent:0",
            "h.edge.agent:x",
        ] {
            assert!(parse_agent_authority(bad).is_err(), "{bad}");
        }
    }
}
