//! The server replicas this agent keeps a tunnel to, beyond the configured ones.
//!
//! Every replica must be able to reach every agent without a load balancer (DESIGN §6), so
//! an agent keeps one session per replica. It is configured with at least one server URL;
//! [`follow_replicas`] asks the server it talks to (`GET /rlark/v1/replicas`, see
//! `rlark-server/src/tunnel/replicas.rs`) which replicas exist, now and every
//! [`DISCOVERY_INTERVAL`], and publishes their URLs to the tunnel client
//! (`rlark_tunnel::client::ClientConfig::discovered`), which connects to the new ones and
//! disconnects from those no longer listed (configured servers are always kept).
//!
//! A failed poll keeps the last list: an unreachable API must not cut tunnels that work.

use std::time::Duration;

use serde::Deserialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How often the list is read.
pub const DISCOVERY_INTERVAL: Duration = Duration::from_secs(30);
/// The hub's route.
pub const REPLICAS_PATH: &str = "/rlark/v1/replicas";

#[derive(Deserialize)]
struct ReplicaList {
    #[serde(default)]
    items: Vec<ReplicaItem>,
}

#[derive(Deserialize)]
struct ReplicaItem {
    url: String,
}

/// Read the hub's list once.
pub async fn list_replicas(client: &kube::Client) -> Result<Vec<String>, kube::Error> {
    let request = http::Request::get(REPLICAS_PATH)
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    let list: ReplicaList = client.request(request).await?;
    let mut urls: Vec<String> = list.items.into_iter().map(|i| i.url).collect();
    urls.sort();
    urls.dedup();
    Ok(urls)
}

/// Poll the list every `every` until `shutdown`, publishing it to `tx` when it changes.
pub async fn follow_replicas(
    client: kube::Client,
    tx: watch::Sender<Vec<String>>,
    every: Duration,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        match list_replicas(&client).await {
            Ok(urls) => {
                tx.send_if_modified(|current| {
                    if *current == urls {
                        return false;
                    }
                    tracing::info!(replicas = ?urls, "server replicas listed by the hub");
                    *current = urls;
                    true
                });
            }
            Err(error) => {
                tracing::debug!(%error, "list server replicas (keeping the last list)");
            }
        }
    }
}
