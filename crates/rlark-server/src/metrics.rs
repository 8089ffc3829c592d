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
