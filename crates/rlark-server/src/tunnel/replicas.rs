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
    /// `registered` or `configured`.
    pub source: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renewed_at: Option<String>,
}

/// This replica's registration and the list.
pub(crate) struct Replicas {
    store: Arc<dyn Store>,
    /// This replica: (name, advertise URL).
    me: Option<(String, String)>,
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
    /// `advertise`: this replica's URL, if it has one; `peers`: configured other replicas.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        replica: String,
        advertise: Option<String>,
        peers: Vec<String>,
    ) -> Arc<Replicas> {
        Arc::new(Replicas {
            store,
            me: advertise.map(|url| (replica, url)),
            peers,
        })
    }

    /// Renew this replica's record every [`RENEW_EVERY`] until `shutdown` (and delete stale
    /// records of other replicas). The record is left to expire on shutdown (see the module
    /// documentation). Without an advertise URL there is nothing to do.
    pub(crate) async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let Some((replica, url)) = self.me.clone() else {
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
            if let Err(error) = self.renew(&replica, &url).await {
                tracing::warn!(%error, %url, "renew the replica record");
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
                match self.store.delete(&key(&record.url), None).await {
                    Ok(_) | Err(StoreError::NotFound(_)) => {}
                    Err(error) => return Err(error),
                }
            }
        }
        Ok(())
    }

    async fn renew(&self, replica: &str, url: &str) -> Result<(), StoreError> {
        let record = ReplicaRecord {
            url: url.to_string(),
            replica: replica.to_string(),
            renewed_at: now().to_rfc3339_opts(SecondsFormat::Millis, true),
        };
        let object = json!({
            "metadata": {"name": record_name(url)},
            "spec": record,
        });
        match self.store.update(&key(url), object.clone(), None).await {
            Ok(_) => Ok(()),
            Err(StoreError::NotFound(_)) => match self.store.create(&key(url), object).await {
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
                source: "registered",
                replica: Some(record.replica),
                renewed_at: Some(record.renewed_at),
            });
        }
        if let Some((replica, url)) = &self.me
            && !out.iter().any(|r| &r.url == url)
        {
            out.push(ReplicaInfo {
                url: url.clone(),
                source: "registered",
                replica: Some(replica.clone()),
                renewed_at: None,
            });
        }
        for peer in &self.peers {
            if !out.iter().any(|r| &r.url == peer) {
                out.push(ReplicaInfo {
                    url: peer.clone(),
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
    async fn replicas_sharing_a_store_list_each_other_and_configured_peers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = store(dir.path()).await;
        let a = Replicas::new(
            Arc::clone(&store),
            "a:1".into(),
            Some("https://a:1".into()),
            vec!["https://c:3".into(), "https://b:2".into()],
        );
        let b = Replicas::new(
            Arc::clone(&store),
            "b:2".into(),
            Some("https://b:2".into()),
            vec![],
        );
        // Before any renewal each lists itself (and its peers).
        assert_eq!(
            urls(&a.list().await.expect("list")),
            ["https://a:1", "https://c:3", "https://b:2"]
        );
        a.renew("a:1", "https://a:1").await.expect("renew a");
        b.renew("b:2", "https://b:2").await.expect("renew b");
        let from_b = b.list().await.expect("list");
        let mut seen = urls(&from_b);
        seen.sort();
        assert_eq!(seen, ["https://a:1", "https://b:2"]);
        assert!(from_b.iter().all(|r| r.source == "registered"));
        // A renewal is an update of the same record.
        a.renew("a:1", "https://a:1").await.expect("renew again");
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
