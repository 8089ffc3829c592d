//! Process metrics that are read at scrape time.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use rlark_store::Store;

use crate::ServerStore;

/// Store revision and write-path counters, read from the store on every scrape.
pub(crate) struct StoreCollector {
    pub store: ServerStore,
}

impl std::fmt::Debug for StoreCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreCollector")
            .field("store", &self.store.location())
            .finish()
    }
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> std::fmt::Result {
    // Revisions stay far below i64::MAX; saturate rather than wrap if one ever does not.
    let metric = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
    let metric_encoder = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(metric_encoder)
}

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> std::fmt::Result {
    let metric = ConstCounter::new(value);
    let metric_encoder = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(metric_encoder)
}

impl Collector for StoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        gauge(
            &mut encoder,
            "rlark_store_revision",
            "Latest committed store revision.",
            self.store.revision(),
        )?;
        gauge(
            &mut encoder,
            "rlark_store_compacted_revision",
            "Oldest revision a watch may start from.",
            self.store.compacted_revision(),
        )?;
        let log = self.store.change_log();
        gauge(
            &mut encoder,
            "rlark_store_change_log_events",
            "Events held by the store's in-memory change log for watches.",
            log.events,
        )?;
        gauge(
            &mut encoder,
            "rlark_store_change_log_bytes",
            "Estimated bytes of the objects the store's in-memory change log holds.",
            log.bytes,
        )?;
        let stats = self.store.stats();
        counter(
            &mut encoder,
            "rlark_store_commits",
            "Store transactions committed.",
            stats.commits,
        )?;
        counter(
            &mut encoder,
            "rlark_store_writes",
            "Object writes committed.",
            stats.writes,
        )?;
        counter(
            &mut encoder,
            "rlark_store_failed_commits",
            "SQLite transactions that failed.",
            stats.failed_commits,
        )?;
        counter(
            &mut encoder,
            "rlark_store_watches_cut",
            "Watches cut because their client fell more than store.watchBufferBytes behind (it relists).",
            stats.watches_cut,
        )?;
        // Seconds as a float counter: with rlark_store_commits_total, the mean commit latency.
        let seconds = ConstCounter::new(stats.commit_micros as f64 / 1e6);
        let metric_encoder = encoder.encode_descriptor(
            "rlark_store_commit_duration_seconds",
            "Time spent committing store transactions (encoding and the database commit).",
            None,
            seconds.metric_type(),
        )?;
        seconds.encode(metric_encoder)?;
        Ok(())
    }
}

/// Listener connection counts (see `limits`), read on every scrape.
#[derive(Debug)]
pub(crate) struct ConnectionsCollector {
    pub gate: std::sync::Arc<crate::limits::Gate>,
}

impl Collector for ConnectionsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (general, reserve) = self.gate.open_connections();
        gauge(
            &mut encoder,
            "rlark_connections_open",
            "Open client connections in the general budget.",
            general as u64,
        )?;
        gauge(
            &mut encoder,
            "rlark_connections_reserve_open",
            "Open client connections in the reserve (admin clients and health probes).",
            reserve as u64,
        )?;
        gauge(
            &mut encoder,
            "rlark_connections_max",
            "Global cap of the general connection budget.",
            self.gate.max_connections() as u64,
        )?;
        counter(
            &mut encoder,
            "rlark_connections_refused",
            "Connections closed at accept because the budget and the reserve were exhausted.",
            self.gate.refused(),
        )?;
        Ok(())
    }
}

/// When the certificates this server presents and signs with expire: the active CA and the
/// serving certificate (issued at start), as `rlark_certificate_expiry_timestamp_seconds`.
#[derive(Debug)]
pub(crate) struct CertificatesCollector {
    /// (certificate, not-after in seconds since the Unix epoch).
    pub expiries: Vec<(&'static str, i64)>,
}

impl CertificatesCollector {
    /// The expiry of each named PEM certificate; one that does not parse is left out (and
    /// logged), which the expiry alert's `absent()` rule reports.
    pub fn from_pems(certs: &[(&'static str, &str)]) -> Self {
        let expiries = certs
            .iter()
            .filter_map(|(name, pem)| match rlark_pki::CertInfo::from_pem(pem) {
                Ok(info) => {
                    let secs = info
                        .not_after
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
                    Some((*name, secs))
                }
                Err(error) => {
                    tracing::warn!(certificate = name, %error, "certificate expiry not exported");
                    None
                }
            })
            .collect();
        CertificatesCollector { expiries }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct CertificateLabel {
    certificate: &'static str,
}

impl Collector for CertificatesCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let family = prometheus_client::metrics::family::Family::<
            CertificateLabel,
            prometheus_client::metrics::gauge::Gauge,
        >::default();
        for (certificate, expiry) in &self.expiries {
            family
                .get_or_create(&CertificateLabel { certificate })
                .set(*expiry);
        }
        let metric_encoder = encoder.encode_descriptor(
            "rlark_certificate_expiry_timestamp_seconds",
            "When a certificate of this server expires (ca: the active CA, serving: the TLS \
             certificate), seconds since the Unix epoch.",
            None,
            family.metric_type(),
        )?;
        family.encode(metric_encoder)
    }
}

/// Counts over the stored objects that alerts need, refreshed by [`ClusterGauges::run`]
/// (a store list is async; a collector is not): Nodes by phase and Jobs the scheduler
/// cannot place.
#[derive(Clone, Debug, Default)]
pub(crate) struct ClusterGauges {
    nodes: prometheus_client::metrics::family::Family<
        PhaseLabel,
        prometheus_client::metrics::gauge::Gauge,
    >,
    jobs_unschedulable: prometheus_client::metrics::gauge::Gauge,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct PhaseLabel {
    phase: String,
}

/// How often [`ClusterGauges::run`] recounts.
const CLUSTER_GAUGES_INTERVAL: std::time::Duration = std::time::Duration::from_secs(15);

/// The phases a Node reports (`rlark_nodes{phase}` has each, zero when none is in it).
const NODE_PHASES: [&str; 3] = ["Online", "Offline", "Unknown"];

impl ClusterGauges {
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "rlark_nodes",
            "Nodes by status.phase (recounted every 15 s).",
            self.nodes.clone(),
        );
        registry.register(
            "rlark_jobs_unschedulable",
            "Jobs whose Unschedulable condition is True (recounted every 15 s).",
            self.jobs_unschedulable.clone(),
        );
    }

    /// Count `nodes` and `jobs` (stored objects) into the gauges.
    pub fn update(
        &self,
        nodes: &[std::sync::Arc<serde_json::Value>],
        jobs: &[std::sync::Arc<serde_json::Value>],
    ) {
        let mut counts: std::collections::BTreeMap<String, i64> =
            NODE_PHASES.iter().map(|p| (p.to_string(), 0)).collect();
        for node in nodes {
            let phase = node["status"]["phase"].as_str().unwrap_or("Unknown");
            *counts.entry(phase.to_string()).or_default() += 1;
        }
        for (phase, count) in counts {
            self.nodes.get_or_create(&PhaseLabel { phase }).set(count);
        }
        let unschedulable = jobs
            .iter()
            .filter(|job| {
                job["status"]["conditions"].as_array().is_some_and(|conds| {
                    conds
                        .iter()
                        .any(|c| c["type"] == "Unschedulable" && c["status"] == "True")
                })
            })
            .count();
        self.jobs_unschedulable
            .set(i64::try_from(unschedulable).unwrap_or(i64::MAX));
    }

    /// Recount every [`CLUSTER_GAUGES_INTERVAL`] until `shutdown`; a failed list keeps the
    /// last counts (and is logged).
    pub async fn run(self, store: ServerStore, shutdown: tokio_util::sync::CancellationToken) {
        let all = rlark_store::ListOptions::default();
        loop {
            let listed = futures::future::try_join(
                store.list("nodes.rlinf.io", &all),
                store.list("jobs.rlinf.io", &all),
            )
            .await;
            match listed {
                Ok((nodes, jobs)) => self.update(&nodes.items, &jobs.items),
                Err(error) => tracing::warn!(%error, "counting nodes and jobs for metrics failed"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(CLUSTER_GAUGES_INTERVAL) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    fn text(registry: &prometheus_client::registry::Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).expect("encode");
        out
    }

    #[test]
    fn nodes_are_counted_by_phase_and_unschedulable_jobs_by_condition() {
        let gauges = ClusterGauges::default();
        let mut registry = prometheus_client::registry::Registry::default();
        gauges.register(&mut registry);
        let nodes = [
            json!({"status": {"phase": "Online"}}),
            json!({"status": {"phase": "Online"}}),
            json!({"status": {"phase": "Offline"}}),
            json!({"metadata": {"name": "new"}}),
        ]
        .map(Arc::new);
        let jobs = [
            json!({"status": {"conditions": [{"type": "Unschedulable", "status": "True"}]}}),
            json!({"status": {"conditions": [{"type": "Unschedulable", "status": "False"}]}}),
            json!({"status": {}}),
        ]
        .map(Arc::new);
        gauges.update(&nodes, &jobs);
        let out = text(&registry);
        assert!(out.contains("rlark_nodes{phase=\"Online\"} 2"), "{out}");
        assert!(out.contains("rlark_nodes{phase=\"Offline\"} 1"), "{out}");
        assert!(out.contains("rlark_nodes{phase=\"Unknown\"} 1"), "{out}");
        assert!(out.contains("rlark_jobs_unschedulable 1"), "{out}");
        // Counts go back to zero when the nodes are gone.
        gauges.update(&[], &[]);
        let out = text(&registry);
        assert!(out.contains("rlark_nodes{phase=\"Offline\"} 0"), "{out}");
        assert!(out.contains("rlark_jobs_unschedulable 0"), "{out}");
    }

    #[test]
    fn certificate_expiries_are_exported_and_bad_pems_left_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = rlark_pki::Ca::load_or_create(dir.path()).expect("ca");
        let serving = ca
            .issue_serving(
                &["localhost".to_string()],
                std::time::Duration::from_secs(3600),
            )
            .expect("serving");
        let collector = CertificatesCollector::from_pems(&[
            ("ca", ca.cert_pem()),
            ("serving", &serving.cert_pem),
            ("broken", "not a certificate"),
        ]);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        assert_eq!(collector.expiries.len(), 2);
        let serving_expiry = collector.expiries[1].1;
        assert!(
            (now + 3500..=now + 3700).contains(&serving_expiry),
            "{serving_expiry}"
        );
        assert!(
            collector.expiries[0].1 > serving_expiry,
            "the CA outlives the serving cert"
        );
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(collector));
        let out = text(&registry);
        assert!(
            out.contains("rlark_certificate_expiry_timestamp_seconds{certificate=\"serving\"} "),
            "{out}"
        );
    }
}
