//! Server replicas an agent should keep a tunnel to: `GET /rlark/v1/replicas`.
//!
//! Any replica can reach any agent only if every agent keeps a session to every replica
//! (DESIGN §6: no load balancer, no server count). An agent is configured with at least one
//! server URL; from there it asks this route which replicas exist and connects to each
//! (`rlark_agent::discovery`). The list is the union of:
//!
//! - **registered** replicas: each replica with an advertise URL
//!   ([`super::TunnelConfig::advertise_url`]) keeps a record in the store
//!   (`replicas.tunnel.rlark.io`, not served by the API), renewed every [`RENEW_EVERY`];
//!   records not renewed for [`REPLICA_TTL`] are ignored, and deleted by the next renewal of
//!   any replica. Replicas sharing a store therefore find each other with no configuration.
//!   A stopping replica does **not** delete its record (it expires): the store's change log
//!   lives in memory, so a write at shutdown, after the last revision watchers have seen,
//!   would make every watcher relist after a restart;
//!   A replica's record also holds its peer URL ([`super::TunnelConfig::peer_url`]) when it
//!   has one apart from its advertise URL: replicas behind one load-balanced URL all
//!   advertise that URL (agents connect once, through the balancer) and reach each other at
//!   their own addresses (`peer.rs`). Records are named after the peer URL (the advertise
//!   URL when there is none), so such replicas do not share a record;
//! - **configured** peers ([`super::TunnelConfig::peers`]): for replicas that do not share a
//!   store.
//!
//! Who may read it: agents, admins, viewers and peers (it holds URLs, no secret).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, SecondsFormat, Utc};
use rlark_apiserver::auth::{Identity, Role};
use rlark_apiserver::error::ApiError;
use rlark_store::{ListOptions, ObjectKey, Store, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest as _, Sha256};
use tokio_util::sync::CancellationToken;

/// Store resource of replica records (name: a digest of the URL).
pub(crate) const REPLICAS: &str = "replicas.tunnel.rlark.io";
/// The route.
pub(crate) const ROUTE: &str = "/rlark/v1/replicas";
/// How often a replica renews its record.
pub const RENEW_EVERY: Duration = Duration::from_secs(10);
/// A record not renewed for this long is stale.
pub const REPLICA_TTL: Duration = Duration::from_secs(30);

/// Check a replica URL: `https://host[:port][/path]` (`wss://` too), nothing else.
pub(crate) fn check_url(url: &str) -> Result<(), String> {
    let rest = ["https://", "wss://"]
        .iter()
        .find_map(|scheme| url.strip_prefix(scheme))
        .ok_or_else(|| format!("{url:?} must start with https:// (or wss://)"))?;
    let host = rest.split('/').next().unwrap_or_default();
    if host.is_empty() || host.contains(['@', '?', '#', ' ']) {
        return Err(format!("{url:?} has no usable host"));
    }
    Ok(())
}

/// One replica record in the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReplicaRecord {
    url: String,
    /// Where the other replicas reach this one, when not at `url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    peer_url: Option<String>,
    /// The replica's name in tunnel listings (host:port).
    replica: String,
    /// RFC 3339.
    renewed_at: String,
}

/// One entry of the list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaInfo {
    pub url: String,
    /// Where the other replicas reach this one, when not at `url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_url: Option<String>,
    /// `registered` or `configured`.
    pub source: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renewed_at: Option<String>,
}

impl ReplicaInfo {
    /// The URL other replicas open peer streams at.
    pub(crate) fn peer_address(&self) -> &str {
        self.peer_url.as_deref().unwrap_or(&self.url)
    }
}

impl ReplicaRecord {
    fn peer_address(&self) -> &str {
        self.peer_url.as_deref().unwrap_or(&self.url)
    }
}

/// This replica: its name in tunnel listings, the URL agents reach it at, and the URL the
/// other replicas reach it at when that differs.
#[derive(Clone, Debug)]
struct Me {
    replica: String,
    url: String,
    peer_url: Option<String>,
}

impl Me {
    fn peer_address(&self) -> &str {
        self.peer_url.as_deref().unwrap_or(&self.url)
    }
}

/// This replica's registration and the list.
pub(crate) struct Replicas {
    store: Arc<dyn Store>,
    me: Option<Me>,
    peers: Vec<String>,
}

impl std::fmt::Debug for Replicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicas")
            .field("me", &self.me)
            .field("peers", &self.peers)
            .finish_non_exhaustive()
    }
}

fn record_name(url: &str) -> String {
    let digest = Sha256::digest(url.as_bytes());
    format!("r-{}", hex::encode(&digest[..8]))
}

fn key(url: &str) -> ObjectKey {
    ObjectKey::new(REPLICAS, "", record_name(url))
}

fn now() -> DateTime<Utc> {
    Utc::now()
}

impl Replicas {
    /// `advertise`: this replica's URL for agents, if it has one; `peer_url`: its URL for
    /// the other replicas when that differs (alone, it is used for both); `peers`:
    /// configured other replicas.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        replica: String,
        advertise: Option<String>,
        peer_url: Option<String>,
        peers: Vec<String>,
    ) -> Arc<Replicas> {
        let me = match (advertise, peer_url) {
            (Some(url), peer_url) => Some(Me {
                replica,
                peer_url: peer_url.filter(|peer| *peer != url),
                url,
            }),
            (None, Some(url)) => Some(Me {
                replica,
                url,
                peer_url: None,
            }),
            (None, None) => None,
        };
        Arc::new(Replicas { store, me, peers })
    }

    /// The URL the other replicas reach this one at, if it has one.
    pub(crate) fn my_peer_address(&self) -> Option<String> {
        self.me.as_ref().map(|me| me.peer_address().to_string())
    }

    /// Renew this replica's record every [`RENEW_EVERY`] until `shutdown` (and delete stale
    /// records of other replicas). The record is left to expire on shutdown (see the module
    /// documentation). Without an advertise URL there is nothing to do.
    pub(crate) async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let Some(me) = self.me.clone() else {
            return;
        };
        let mut tick = tokio::time::interval(RENEW_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            if let Err(error) = self.renew(&me).await {
                tracing::warn!(%error, url = %me.url, "renew the replica record");
            }
            if let Err(error) = self.prune_stale().await {
                tracing::debug!(%error, "prune stale replica records");
            }
        }
    }

    /// Delete records not renewed within [`REPLICA_TTL`].
    async fn prune_stale(&self) -> Result<(), StoreError> {
        let listed = self.store.list(REPLICAS, &ListOptions::default()).await?;
        for record in listed.items.iter().filter_map(|o| record_of(o)) {
            if !fresh(&record) {
                match self.store.delete(&key(record.peer_address()), None).await {
                    Ok(_) | Err(StoreError::NotFound(_)) => {}
                    Err(error) => return Err(error),
                }
            }
        }
        Ok(())
    }

    async fn renew(&self, me: &Me) -> Result<(), StoreError> {
        let record = ReplicaRecord {
            url: me.url.clone(),
            peer_url: me.peer_url.clone(),
            replica: me.replica.clone(),
            renewed_at: now().to_rfc3339_opts(SecondsFormat::Millis, true),
        };
        let name = me.peer_address();
        let object = json!({
            "metadata": {"name": record_name(name)},
            "spec": record,
        });
        match self.store.update(&key(name), object.clone(), None).await {
            Ok(_) => Ok(()),
            Err(StoreError::NotFound(_)) => match self.store.create(&key(name), object).await {
                Ok(_) | Err(StoreError::AlreadyExists(_)) => Ok(()),
                Err(error) => Err(error),
            },
            Err(error) => Err(error),
        }
    }

    /// The list: registered replicas renewed within [`REPLICA_TTL`] (this one included,
    /// even before its first renewal), then configured peers not already listed.
    pub(crate) async fn list(&self) -> Result<Vec<ReplicaInfo>, StoreError> {
        let listed = self.store.list(REPLICAS, &ListOptions::default()).await?;
        let mut out: Vec<ReplicaInfo> = Vec::new();
        for record in listed.items.iter().filter_map(|o| record_of(o)) {
            // A read never writes: stale records are pruned by the renewals.
            if !fresh(&record) {
                continue;
            }
            out.push(ReplicaInfo {
                url: record.url,
                peer_url: record.peer_url,
                source: "registered",
                replica: Some(record.replica),
                renewed_at: Some(record.renewed_at),
            });
        }
        if let Some(me) = &self.me
            && !out.iter().any(|r| r.peer_address() == me.peer_address())
        {
            out.push(ReplicaInfo {
                url: me.url.clone(),
                peer_url: me.peer_url.clone(),
                source: "registered",
                replica: Some(me.replica.clone()),
                renewed_at: None,
            });
        }
        for peer in &self.peers {
            if !out
                .iter()
                .any(|r| &r.url == peer || r.peer_address() == peer)
            {
                out.push(ReplicaInfo {
                    url: peer.clone(),
                    peer_url: None,
                    source: "configured",
                    replica: None,
                    renewed_at: None,
                });
            }
        }
        Ok(out)
    }
}

fn record_of(object: &serde_json::Value) -> Option<ReplicaRecord> {
    serde_json::from_value(object.get("spec")?.clone()).ok()
}

/// Renewed within [`REPLICA_TTL`].
fn fresh(record: &ReplicaRecord) -> bool {
    let cutoff = now() - chrono::Duration::from_std(REPLICA_TTL).unwrap_or_default();
    DateTime::parse_from_rfc3339(&record.renewed_at)
        .is_ok_and(|at| at.with_timezone(&Utc) >= cutoff)
}

/// `GET /rlark/v1/replicas`.
pub(crate) async fn list(State(replicas): State<Arc<Replicas>>, request: Request) -> Response {
    let Some(identity) = request.extensions().get::<Identity>().cloned() else {
        return ApiError::unauthorized().into_response();
    };
    if !matches!(
        identity.role(),
        Role::Admin | Role::Viewer | Role::Peer { .. } | Role::Agent { .. }
    ) {
        return ApiError::new(
            403,
            "Forbidden",
            format!(
                "forbidden: User \"{}\" cannot list server replicas",
                identity.user
            ),
        )
        .into_response();
    }
    match replicas.list().await {
        Ok(items) => axum::Json(json!({
            "kind": "ServerReplicaList",
            "apiVersion": "v1",
            "items": items,
        }))
        .into_response(),
        Err(error) => {
            ApiError::new(500, "InternalError", format!("list replicas: {error}")).into_response()
        }
    }
}

/// The advertise URL when none is configured: `https://IP:PORT` for a listener on one IP,
/// else `https://<first TLS SAN>:PORT`, else none.
pub(crate) fn default_advertise_url(
    listen: std::net::SocketAddr,
    tls_sans: &[String],
) -> Option<String> {
    let port = listen.port();
    match listen.ip() {
        ip if !ip.is_unspecified() && ip.is_ipv6() => Some(format!("https://[{ip}]:{port}")),
        ip if !ip.is_unspecified() => Some(format!("https://{ip}:{port}")),
        _ => tls_sans.first().map(|san| {
            if san.contains(':') {
                format!("https://[{san}]:{port}")
            } else {
                format!("https://{san}:{port}")
            }
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(items: &[ReplicaInfo]) -> Vec<&str> {
        items.iter().map(|r| r.url.as_str()).collect()
    }

    async fn store(dir: &std::path::Path) -> Arc<dyn Store> {
        let config = rlark_store::SqliteStoreConfig::new(dir.join("db"));
        Arc::new(rlark_store::SqliteStore::open(config).await.expect("store"))
    }

    #[test]
    fn urls_are_checked() {
        assert!(check_url("https://a:8443").is_ok());
        assert!(check_url("wss://a/prefix").is_ok());
        for bad in [
            "http://a",
            "a:8443",
            "https://",
            "https://u@a",
            "https:///x",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn advertise_urls_default_from_the_listener() {
        let at = |s: &str| s.parse::<std::net::SocketAddr>().expect("addr");
        assert_eq!(
            default_advertise_url(at("10.0.0.5:8443"), &[]).as_deref(),
            Some("https://10.0.0.5:8443")
        );
        assert_eq!(
            default_advertise_url(at("[::1]:8443"), &[]).as_deref(),
            Some("https://[::1]:8443")
        );
        assert_eq!(default_advertise_url(at("0.0.0.0:8443"), &[]), None);
        assert_eq!(
            default_advertise_url(at("0.0.0.0:8443"), &["cp.example".into()]).as_deref(),
            Some("https://cp.example:8443")
        );
    }

    #[tokio::test]
    async fn replicas_behind_one_balanced_url_keep_records_of_their_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = store(dir.path()).await;
        let lb = "https://rlark.example.com:443";
        let replica = |i: usize| {
            Replicas::new(
                Arc::clone(&store),
                format!("0.0.0.0:8443#{i}"),
                Some(lb.into()),
                Some(format!("https://rlark-{i}.rlark-peers.ns.svc:8443")),
                vec![],
            )
        };
        let (r0, r1) = (replica(0), replica(1));
        assert_eq!(
            r1.my_peer_address().as_deref(),
            Some("https://rlark-1.rlark-peers.ns.svc:8443")
        );
        r0.renew(r0.me.as_ref().unwrap()).await.expect("renew 0");
        r1.renew(r1.me.as_ref().unwrap()).await.expect("renew 1");
        let listed = r0.list().await.expect("list");
        // Agents see the balancer twice (they connect once: discovery deduplicates) ...
        assert_eq!(urls(&listed), [lb, lb]);
        // ... and each replica's own peer address is there for the peer link.
        let mut peers: Vec<&str> = listed.iter().map(ReplicaInfo::peer_address).collect();
        peers.sort_unstable();
        assert_eq!(
            peers,
            [
                "https://rlark-0.rlark-peers.ns.svc:8443",
                "https://rlark-1.rlark-peers.ns.svc:8443"
            ]
        );
        let wire = serde_json::to_value(&listed[0]).expect("json");
        assert!(wire["peerUrl"].as_str().is_some(), "{wire}");
        // A peer URL equal to the advertise URL is not repeated; one alone serves for both.
        let same = Replicas::new(
            Arc::clone(&store),
            "x".into(),
            Some("https://x:1".into()),
            Some("https://x:1".into()),
            vec![],
        );
        assert_eq!(same.me.as_ref().unwrap().peer_url, None);
        let alone = Replicas::new(
            Arc::clone(&store),
            "y".into(),
            None,
            Some("https://y:1".into()),
            vec![],
        );
        assert_eq!(alone.me.as_ref().unwrap().url, "https://y:1");
        assert_eq!(alone.my_peer_address().as_deref(), Some("https://y:1"));
    }

    #[tokio::test]
    async fn replicas_sharing_a_store_list_each_other_and_configured_peers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = store(dir.path()).await;
        let a = Replicas::new(
            Arc::clone(&store),
            "a:1".into(),
            Some("https://a:1".into()),
            None,
            vec!["https://c:3".into(), "https://b:2".into()],
        );
        let b = Replicas::new(
            Arc::clone(&store),
            "b:2".into(),
            Some("https://b:2".into()),
            None,
            vec![],
        );
        // Before any renewal each lists itself (and its peers).
        assert_eq!(
            urls(&a.list().await.expect("list")),
            ["https://a:1", "https://c:3", "https://b:2"]
        );
        a.renew(a.me.as_ref().unwrap()).await.expect("renew a");
        b.renew(b.me.as_ref().unwrap()).await.expect("renew b");
        let from_b = b.list().await.expect("list");
        let mut seen = urls(&from_b);
        seen.sort();
        assert_eq!(seen, ["https://a:1", "https://b:2"]);
        assert!(from_b.iter().all(|r| r.source == "registered"));
        // A renewal is an update of the same record.
        a.renew(a.me.as_ref().unwrap()).await.expect("renew again");
        assert_eq!(
            store
                .list(REPLICAS, &ListOptions::default())
                .await
                .expect("list")
                .items
                .len(),
            2
        );

        // A record older than the TTL is ignored, and removed by the next renewal.
        let stale = json!({
            "metadata": {"name": record_name("https://gone:9")},
            "spec": {"url": "https://gone:9", "replica": "gone:9", "renewedAt": "2020-01-01T00:00:00Z"},
        });
        store
            .create(&key("https://gone:9"), stale)
            .await
            .expect("stale");
        assert!(!urls(&b.list().await.expect("list")).contains(&"https://gone:9"));
        assert!(
            store
                .get(&key("https://gone:9"))
                .await
                .expect("get")
                .is_some(),
            "a list does not write"
        );
        b.prune_stale().await.expect("prune");
        assert!(
            store
                .get(&key("https://gone:9"))
                .await
                .expect("get")
                .is_none()
        );

        // Stopping leaves the record to expire: no write after the last one watchers saw.
        let revision = store.revision();
        let token = CancellationToken::new();
        token.cancel();
        Arc::clone(&b).run(token).await;
        assert_eq!(store.revision(), revision, "stopping writes nothing");
        assert!(store.get(&key("https://b:2")).await.expect("get").is_some());
    }
}
