//! Prometheus metrics of the API server, named after kube-apiserver's:
//! `rlark_apiserver_requests_total{verb,resource,code}`,
//! `rlark_apiserver_request_duration_seconds{verb,resource}` (not for watches, which are
//! long-running) and `rlark_apiserver_watches` (open watches).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    verb: String,
    resource: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DurationLabels {
    verb: String,
    resource: String,
}

type HistogramFamily = Family<DurationLabels, Histogram, fn() -> Histogram>;

/// The API server's metric handles (cheap to clone; clones share values).
#[derive(Clone, Debug)]
pub(crate) struct Metrics {
    requests: Family<RequestLabels, Counter>,
    durations: HistogramFamily,
    watches: Gauge,
}

fn duration_histogram() -> Histogram {
    // 5 ms .. ~20 s.
    Histogram::new(exponential_buckets(0.005, 2.0, 13))
}

impl Metrics {
    /// Create the metrics and register them into `registry`.
    pub(crate) fn new(registry: &mut Registry) -> Self {
        let metrics = Self {
            requests: Family::default(),
            durations: HistogramFamily::new_with_constructor(duration_histogram),
            watches: Gauge::default(),
        };
        registry.register(
            "rlark_apiserver_requests",
            "API requests by verb, resource and HTTP code",
            metrics.requests.clone(),
        );
        registry.register(
            "rlark_apiserver_request_duration_seconds",
            "API request latency by verb and resource (watches excluded)",
            metrics.durations.clone(),
        );
        registry.register(
            "rlark_apiserver_watches",
            "Open watch streams",
            metrics.watches.clone(),
        );
        metrics
    }

    /// Count one finished request; `elapsed` is recorded unless the verb is `watch`.
    pub(crate) fn observe(&self, verb: &str, resource: &str, code: u16, elapsed: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                verb: verb.into(),
                resource: resource.into(),
                code: code.to_string(),
            })
            .inc();
        if verb != "watch" {
            self.durations
                .get_or_create(&DurationLabels {
                    verb: verb.into(),
                    resource: resource.into(),
                })
                .observe(elapsed.as_secs_f64());
        }
    }

    /// Mark a watch open until the guard is dropped.
    pub(crate) fn watch_opened(&self) -> WatchGuard {
        self.watches.inc();
        WatchGuard(self.watches.clone())
    }
}

/// Keeps `rlark_apiserver_watches` incremented while alive.
#[derive(Debug)]
pub(crate) struct WatchGuard(Gauge);

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_exposed_under_kube_like_names() {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        metrics.observe("list", "jobs", 200, Duration::from_millis(3));
        metrics.observe("watch", "jobs", 200, Duration::from_secs(30));
        let guard = metrics.watch_opened();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                r#"rlark_apiserver_requests_total{verb="list",resource="jobs",code="200"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"rlark_apiserver_request_duration_seconds_count{verb="list",resource="jobs"} 1"#
            ),
            "{text}"
        );
        assert!(
            !text.contains(r#"rlark_apiserver_request_duration_seconds_count{verb="watch""#),
            "{text}"
        );
        assert!(text.contains("rlark_apiserver_watches 1"), "{text}");
        drop(guard);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("rlark_apiserver_watches 0"), "{text}");
    }
}
