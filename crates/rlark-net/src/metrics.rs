//! Counters of the pod network's connections, for Prometheus and for the DomainPeer's
//! `status.paths`.
//!
//! Families (names relative to the registry they are registered in; in a registry with
//! prefix `rlark` they are exactly these):
//!
//! - `rlark_domain_connections_total{domain,path,outcome}`: connections a member of this
//!   agent opened (and, for `path="inbound"`, that peers opened to a member here), by how
//!   they ended being set up (`ok`, `refused`, `unreachable`, `timeout`, `forbidden`,
//!   `no-such-agent`, `error`);
//! - `rlark_domain_bytes_total{domain,path,direction}`: bytes carried, counted while they
//!   flow; `direction="out"` is what the member here sent, `"in"` what it received;
//! - `rlark_domain_active_connections{domain,path}`;
//! - `rlark_domain_direct_fallbacks_total{domain,peer}`: connections that tried the direct
//!   path to cluster `peer`, failed, and were relayed instead;
//! - `rlark_domain_refused_total{domain,reason}`: inbound connections refused by this
//!   agent's authorization, by reason (`unknown-domain`, `source-not-member`,
//!   `source-cluster-mismatch`, `destination-not-member`, `destination-not-here`,
//!   `destination-not-running`, `family-mismatch`, `no-source-cluster`, `protocol`).
//!
//! `path` is `local`, `direct`, `relay`, `egress` (a member's connection to a non-domain
//! address, dialed from the agent's own namespace) or `inbound`.
//!
//! Beside the families, [`DomainMetrics`] keeps per (domain, peer cluster, path) totals of
//! the outbound domain paths; [`write_path_status`] copies them into the DomainPeer's
//! `status.paths` at most every [`STATUS_INTERVAL`], and only when they changed.

use std::collections::BTreeMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rlark_api::types::{DomainPathStats, DomainPeer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::CancellationToken;

/// How often [`write_path_status`] looks for changed totals.
pub const STATUS_INTERVAL: Duration = Duration::from_secs(10);

/// The path a connection took.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathKind {
    /// Both ends on this agent.
    Local,
    /// mTLS straight to the destination's agent.
    Direct,
    /// Through the hub.
    Relay,
    /// To a non-domain address, from the agent's own namespace.
    Egress,
    /// Opened by a peer towards a member here (destination side).
    Inbound,
}

impl PathKind {
    /// `local`, `direct`, `relay`, `egress`, `inbound`.
    pub fn as_str(self) -> &'static str {
        match self {
            PathKind::Local => "local",
            PathKind::Direct => "direct",
            PathKind::Relay => "relay",
            PathKind::Egress => "egress",
            PathKind::Inbound => "inbound",
        }
    }
}

impl std::fmt::Display for PathKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConnectionLabels {
    domain: String,
    path: &'static str,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BytesLabels {
    domain: String,
    path: &'static str,
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabels {
    domain: String,
    path: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FallbackLabels {
    domain: String,
    peer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    domain: String,
    reason: &'static str,
}

/// Totals of one (domain, peer cluster, path).
#[derive(Debug, Default)]
struct PathTotals {
    connections: AtomicU64,
    active: AtomicU64,
    bytes: AtomicU64,
    failures: AtomicU64,
}

type PathKey = (String, String, PathKind);

/// The pod network's metrics (see the module documentation). Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct DomainMetrics {
    connections: Family<ConnectionLabels, Counter>,
    bytes: Family<BytesLabels, Counter>,
    active: Family<PathLabels, Gauge>,
    fallbacks: Family<FallbackLabels, Counter>,
    refused: Family<RefusedLabels, Counter>,
    paths: Arc<Mutex<BTreeMap<PathKey, Arc<PathTotals>>>>,
}

impl DomainMetrics {
    /// New, unregistered metrics.
    pub fn new() -> Self {
        Self::default()
    }

    /// Register the families in `registry` as `domain_connections`, `domain_bytes`,
    /// `domain_active_connections`, `domain_direct_fallbacks` and `domain_refused` (counters
    /// get `_total`), under the registry's prefix.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "domain_connections",
            "Pod-network connections, by domain, path and setup outcome",
            self.connections.clone(),
        );
        registry.register(
            "domain_bytes",
            "Pod-network bytes carried, by domain, path and direction (out: sent by the member here)",
            self.bytes.clone(),
        );
        registry.register(
            "domain_active_connections",
            "Pod-network connections open now, by domain and path",
            self.active.clone(),
        );
        registry.register(
            "domain_direct_fallbacks",
            "Connections whose direct path to a peer cluster failed and were relayed",
            self.fallbacks.clone(),
        );
        registry.register(
            "domain_refused",
            "Inbound pod-network connections refused by this agent, by reason",
            self.refused.clone(),
        );
    }

    fn totals(&self, domain: &str, peer: &str, path: PathKind) -> Option<Arc<PathTotals>> {
        if !matches!(path, PathKind::Local | PathKind::Direct | PathKind::Relay) {
            return None;
        }
        let mut paths = self.paths.lock().unwrap_or_else(PoisonError::into_inner);
        Some(
            paths
                .entry((domain.to_string(), peer.to_string(), path))
                .or_default()
                .clone(),
        )
    }

    /// A connection of `domain` towards cluster `peer` (empty for egress) was set up over
    /// `path`: counts it `ok` and returns the guard that counts its bytes and keeps it
    /// active until dropped.
    pub fn opened(&self, domain: &str, peer: &str, path: PathKind) -> ConnectionMeter {
        self.connections
            .get_or_create(&ConnectionLabels {
                domain: domain.to_string(),
                path: path.as_str(),
                outcome: "ok".into(),
            })
            .inc();
        let active = self
            .active
            .get_or_create(&PathLabels {
                domain: domain.to_string(),
                path: path.as_str(),
            })
            .clone();
        active.inc();
        let totals = self.totals(domain, peer, path);
        if let Some(totals) = &totals {
            totals.connections.fetch_add(1, Ordering::Relaxed);
            totals.active.fetch_add(1, Ordering::Relaxed);
        }
        let bytes = |direction| {
            self.bytes
                .get_or_create(&BytesLabels {
                    domain: domain.to_string(),
                    path: path.as_str(),
                    direction,
                })
                .clone()
        };
        ConnectionMeter {
            out: bytes("out"),
            incoming: bytes("in"),
            active,
            totals,
        }
    }

    /// A connection of `domain` towards `peer` over `path` could not be set up:
    /// `outcome` is the status (`refused`, `unreachable`, `timeout`, `forbidden`, ...).
    pub fn failed(&self, domain: &str, peer: &str, path: PathKind, outcome: &str) {
        self.connections
            .get_or_create(&ConnectionLabels {
                domain: domain.to_string(),
                path: path.as_str(),
                outcome: outcome.to_string(),
            })
            .inc();
        if let Some(totals) = self.totals(domain, peer, path) {
            totals.failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The direct path to cluster `peer` failed for a connection of `domain`; it is relayed.
    pub fn fallback(&self, domain: &str, peer: &str) {
        self.fallbacks
            .get_or_create(&FallbackLabels {
                domain: domain.to_string(),
                peer: peer.to_string(),
            })
            .inc();
    }

    /// An inbound connection of `domain` was refused for `reason`.
    pub fn refused(&self, domain: &str, reason: &'static str) {
        self.refused
            .get_or_create(&RefusedLabels {
                domain: domain.to_string(),
                reason,
            })
            .inc();
    }

    /// The totals of `domain`'s outbound paths, as `status.paths` entries sorted by peer
    /// and path.
    pub fn path_stats(&self, domain: &str) -> Vec<DomainPathStats> {
        let paths = self.paths.lock().unwrap_or_else(PoisonError::into_inner);
        paths
            .iter()
            .filter(|((d, _, _), _)| d == domain)
            .map(|((_, peer, path), totals)| DomainPathStats {
                peer: peer.clone(),
                path: path.as_str().to_string(),
                connections: totals.connections.load(Ordering::Relaxed),
                active: totals.active.load(Ordering::Relaxed),
                bytes: totals.bytes.load(Ordering::Relaxed),
                failures: totals.failures.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Every domain with totals.
    pub fn domains(&self) -> Vec<String> {
        let paths = self.paths.lock().unwrap_or_else(PoisonError::into_inner);
        let mut domains: Vec<String> = paths.keys().map(|(d, _, _)| d.clone()).collect();
        domains.dedup();
        domains
    }
}

/// Counts one open connection's bytes; the connection stops being active when it is
/// dropped.
#[derive(Debug)]
pub struct ConnectionMeter {
    out: Counter,
    incoming: Counter,
    active: Gauge,
    totals: Option<Arc<PathTotals>>,
}

impl ConnectionMeter {
    /// `n` bytes sent by the member here.
    pub fn sent(&self, n: u64) {
        self.out.inc_by(n);
        if let Some(totals) = &self.totals {
            totals.bytes.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// `n` bytes received by the member here.
    pub fn received(&self, n: u64) {
        self.incoming.inc_by(n);
        if let Some(totals) = &self.totals {
            totals.bytes.fetch_add(n, Ordering::Relaxed);
        }
    }
}

impl Drop for ConnectionMeter {
    fn drop(&mut self) {
        self.active.dec();
        if let Some(totals) = &self.totals {
            totals.active.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The member-side stream of a connection, counting what passes through it: bytes read
/// from it were sent by the member, bytes written to it are received by the member.
pub struct Metered<S> {
    inner: S,
    meter: ConnectionMeter,
}

impl<S> Metered<S> {
    pub fn new(inner: S, meter: ConnectionMeter) -> Self {
        Metered { inner, meter }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len().saturating_sub(before);
        if n > 0 {
            self.meter.sent(n as u64);
        }
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = result {
            self.meter.received(n as u64);
        }
        result
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Every [`STATUS_INTERVAL`] until `shutdown`: for each domain whose totals changed since
/// the last successful write, a merge patch of `status.paths` on the DomainPeer
/// `namespace/<domain>`. A failed write (the DomainPeer is gone, the server is away) is
/// logged and retried at the next tick.
pub async fn write_path_status(
    metrics: DomainMetrics,
    client: kube::Client,
    namespace: String,
    shutdown: CancellationToken,
) {
    let api: Api<DomainPeer> = Api::namespaced(client, &namespace);
    let mut written: BTreeMap<String, Vec<DomainPathStats>> = BTreeMap::new();
    let mut tick = tokio::time::interval(STATUS_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        for domain in metrics.domains() {
            let paths = metrics.path_stats(&domain);
            if written.get(&domain) == Some(&paths) {
                continue;
            }
            let patch = serde_json::json!({ "status": { "paths": paths } });
            match api
                .patch_status(&domain, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    written.insert(domain, paths);
                }
                Err(error) => {
                    tracing::debug!(%error, %domain, %namespace, "write domain path status (retrying)");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    fn text(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    #[tokio::test]
    async fn connections_bytes_and_path_totals() {
        let metrics = DomainMetrics::new();
        let mut registry = Registry::with_prefix("rlark");
        metrics.register(&mut registry);

        let (a, mut b) = tokio::io::duplex(1024);
        let mut member = Metered::new(a, metrics.opened("d1", "b", PathKind::Relay));
        b.write_all(b"hello").await.unwrap();
        let mut buf = [0u8; 5];
        member.read_exact(&mut buf).await.unwrap();
        member.write_all(b"hi").await.unwrap();
        metrics.failed("d1", "b", PathKind::Direct, "timeout");
        metrics.fallback("d1", "b");
        metrics.refused("d1", "source-not-member");
        let egress = metrics.opened("d1", "", PathKind::Egress);

        let stats = metrics.path_stats("d1");
        assert_eq!(stats.len(), 2, "{stats:?}");
        let relay = stats.iter().find(|s| s.path == "relay").unwrap();
        assert_eq!(
            (
                relay.peer.as_str(),
                relay.connections,
                relay.active,
                relay.bytes
            ),
            ("b", 1, 1, 7)
        );
        let direct = stats.iter().find(|s| s.path == "direct").unwrap();
        assert_eq!((direct.connections, direct.failures), (0, 1));

        let body = text(&registry);
        for line in [
            r#"rlark_domain_connections_total{domain="d1",path="relay",outcome="ok"} 1"#,
            r#"rlark_domain_connections_total{domain="d1",path="direct",outcome="timeout"} 1"#,
            r#"rlark_domain_bytes_total{domain="d1",path="relay",direction="out"} 5"#,
            r#"rlark_domain_bytes_total{domain="d1",path="relay",direction="in"} 2"#,
            r#"rlark_domain_active_connections{domain="d1",path="relay"} 1"#,
            r#"rlark_domain_active_connections{domain="d1",path="egress"} 1"#,
            r#"rlark_domain_direct_fallbacks_total{domain="d1",peer="b"} 1"#,
            r#"rlark_domain_refused_total{domain="d1",reason="source-not-member"} 1"#,
        ] {
            assert!(body.contains(line), "{line}\n{body}");
        }
        drop(member);
        drop(egress);
        assert_eq!(metrics.path_stats("d1")[1].active, 0);
        let body = text(&registry);
        assert!(
            body.contains(r#"rlark_domain_active_connections{domain="d1",path="relay"} 0"#),
            "{body}"
        );
        assert_eq!(metrics.domains(), vec!["d1".to_string()]);
    }
}
