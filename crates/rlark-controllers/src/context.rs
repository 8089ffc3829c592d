//! What every reconciler shares: client, tunables, event recorder, metrics, and the error
//! backoff the error policies use.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Tunables of the controllers.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// A Node whose heartbeat is older than this becomes `Offline` (default 40 s, as the
    /// kubelet's node-monitor grace period).
    pub node_grace_period: Duration,
    /// How often the Node controller checks heartbeats.
    pub node_check_interval: Duration,
    /// Requeue interval of a Job waiting for capacity (it is also woken by Node and Task
    /// changes).
    pub unschedulable_requeue: Duration,
    /// Name written as the `reportingController` / `source.component` of Events.
    pub component: String,
    /// Identity used for leader election (unique per process).
    pub identity: String,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            node_grace_period: Duration::from_secs(40),
            node_check_interval: Duration::from_secs(5),
            unschedulable_requeue: Duration::from_secs(30),
            component: "rlark-controller-manager".into(),
            identity: format!("rlark-controller-manager-{}", uuid::Uuid::new_v4()),
        }
    }
}

/// Shared state handed to every reconciler.
#[derive(Clone)]
pub struct Context {
    pub client: kube::Client,
    pub config: ControllerConfig,
    pub recorder: crate::events::Recorder,
    /// Reconcile counters and durations, per controller.
    pub metrics: Arc<Metrics>,
}

impl Context {
    /// A context whose recorder writes as `config.component` and with fresh metrics
    /// (register them with [`Metrics::register`] to expose them).
    pub fn new(client: kube::Client, config: ControllerConfig) -> Self {
        let recorder = crate::events::Recorder::new(client.clone(), config.component.clone());
        Self {
            client,
            config,
            recorder,
            metrics: Arc::new(Metrics::default()),
        }
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Labels of `rlark_controller_reconciles_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// `job`, `task`, `workflow`, `node`.
    pub controller: String,
    /// `success` or `error`.
    pub result: String,
}

/// Label of the per-controller duration histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabel {
    pub controller: String,
}

/// Label of the per-Domain gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DomainLabel {
    pub domain: String,
}

/// Prometheus metrics of the controllers:
///
/// - `rlark_controller_reconciles_total{controller,result}` (result `success`|`error`),
/// - `rlark_controller_reconcile_duration_seconds{controller}` (histogram),
/// - `rlark_controller_leader` (1 while this process runs the controllers),
/// - `rlark_domain_allocated_addresses{domain}`: addresses held by live replicas,
/// - `rlark_domain_capacity_addresses{domain}`: usable addresses of the Domain's CIDR (a
///   float: an IPv6 pool can exceed every integer gauge).
#[derive(Debug)]
pub struct Metrics {
    reconciles: Family<ReconcileLabels, Counter>,
    durations: Family<ControllerLabel, Histogram>,
    leader: Gauge,
    domain_allocated: Family<DomainLabel, Gauge>,
    domain_capacity: Family<DomainLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// The Domains whose gauges are set (a `Family` cannot list its label sets), so the
    /// gauges of Domains deleted while no watch saw it can be found ([`Metrics::retain_domains`]).
    domains: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            reconciles: Family::default(),
            durations: Family::new_with_constructor(|| {
                // 1 ms .. ~16 s.
                Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                    0.001, 2.0, 15,
                ))
            }),
            leader: Gauge::default(),
            domain_allocated: Family::default(),
            domain_capacity: Family::default(),
            domains: std::sync::Mutex::default(),
        }
    }
}

impl Metrics {
    /// Add these metrics to `registry` (they are shared: clones of the handles are
    /// registered, so later observations show up).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "rlark_controller_reconciles",
            "Reconciles by controller and result (success, error).",
            self.reconciles.clone(),
        );
        registry.register(
            "rlark_controller_reconcile_duration_seconds",
            "Duration of reconciles by controller.",
            self.durations.clone(),
        );
        registry.register(
            "rlark_controller_leader",
            "1 while this process holds leadership and runs the controllers.",
            self.leader.clone(),
        );
        registry.register(
            "rlark_domain_allocated_addresses",
            "Addresses of a Domain held by live replicas.",
            self.domain_allocated.clone(),
        );
        registry.register(
            "rlark_domain_capacity_addresses",
            "Usable addresses of a Domain's CIDR.",
            self.domain_capacity.clone(),
        );
    }

    /// Set the gauges of Domain `domain`.
    pub fn set_domain(&self, domain: &str, allocated: usize, capacity: u128) {
        let label = DomainLabel {
            domain: domain.to_string(),
        };
        self.domains
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(domain.to_string());
        self.domain_allocated
            .get_or_create(&label)
            .set(i64::try_from(allocated).unwrap_or(i64::MAX));
        // f64 of a u128: rounding is fine for a capacity.
        self.domain_capacity
            .get_or_create(&label)
            .set(capacity as f64);
    }

    /// Drop the gauges of a Domain that is going away or gone: its label sets leave the
    /// encoded metrics.
    pub fn forget_domain(&self, domain: &str) {
        let label = DomainLabel {
            domain: domain.to_string(),
        };
        self.domains
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(domain);
        self.domain_allocated.remove(&label);
        self.domain_capacity.remove(&label);
    }

    /// Drop the gauges of every Domain for which `keep` is false (after a relist, the
    /// Domains no longer listed).
    pub fn retain_domains(&self, keep: impl Fn(&str) -> bool) {
        let gone: Vec<String> = self
            .domains
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|name| !keep(name))
            .cloned()
            .collect();
        for name in gone {
            self.forget_domain(&name);
        }
    }

    /// Addresses of `domain` held by live replicas, as last set (for tests).
    pub fn domain_allocated(&self, domain: &str) -> i64 {
        self.domain_allocated
            .get_or_create(&DomainLabel {
                domain: domain.to_string(),
            })
            .get()
    }

    /// Count one reconcile of `controller` that took `elapsed`.
    pub fn observe(&self, controller: &str, success: bool, elapsed: Duration) {
        self.reconciles
            .get_or_create(&ReconcileLabels {
                controller: controller.to_string(),
                result: if success { "success" } else { "error" }.to_string(),
            })
            .inc();
        self.durations
            .get_or_create(&ControllerLabel {
                controller: controller.to_string(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Run one reconcile future and observe its outcome and duration.
    pub async fn measure<T, E>(
        &self,
        controller: &str,
        reconcile: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        #[allow(
            clippy::disallowed_methods,
            clippy::disallowed_types,
            reason = "a reconcile's duration is wall-clock work, also while tokio's clock is paused"
        )]
        let started = std::time::Instant::now();
        let result = reconcile.await;
        self.observe(controller, result.is_ok(), started.elapsed());
        result
    }

    /// Reconciles of `controller` with `result` so far (for tests and benchmarks).
    pub fn reconciles(&self, controller: &str, result: &str) -> u64 {
        self.reconciles
            .get_or_create(&ReconcileLabels {
                controller: controller.to_string(),
                result: result.to_string(),
            })
            .get()
    }

    /// Set the leader gauge.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }
}

/// Capped exponential backoff per object for error policies: the n-th consecutive failure
/// of one object waits `base * 2^(n-1)`, at most `cap`; a success resets it.
#[derive(Debug)]
pub struct ErrorBackoff {
    base: Duration,
    cap: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl ErrorBackoff {
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            failures: Mutex::default(),
        }
    }

    /// Record a failure of `key` and return how long to wait before retrying it.
    pub fn next(&self, key: &str) -> Duration {
        let mut failures = self.lock();
        let n = failures.entry(key.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        backoff_delay(self.base, self.cap, *n)
    }

    /// Forget the failures of `key` (after a successful reconcile).
    pub fn reset(&self, key: &str) {
        let mut failures = self.lock();
        if !failures.is_empty() {
            failures.remove(key);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        // Plain counters: a poisoned map is still consistent.
        self.failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Default for ErrorBackoff {
    /// 500 ms doubling up to 5 minutes.
    fn default() -> Self {
        Self::new(Duration::from_millis(500), Duration::from_secs(300))
    }
}

/// `base * 2^(failures-1)`, capped (pure).
pub fn backoff_delay(base: Duration, cap: Duration, failures: u32) -> Duration {
    let exponent = failures.saturating_sub(1).min(30);
    base.saturating_mul(1u32 << exponent).min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let base = Duration::from_millis(500);
        let cap = Duration::from_secs(5);
        assert_eq!(backoff_delay(base, cap, 1), base);
        assert_eq!(backoff_delay(base, cap, 2), Duration::from_secs(1));
        assert_eq!(backoff_delay(base, cap, 4), Duration::from_secs(4));
        assert_eq!(backoff_delay(base, cap, 5), cap);
        assert_eq!(backoff_delay(base, cap, u32::MAX), cap);

        let backoff = ErrorBackoff::new(base, cap);
        assert_eq!(backoff.next("a"), base);
        assert_eq!(backoff.next("a"), Duration::from_secs(1));
        assert_eq!(backoff.next("b"), base);
        backoff.reset("a");
        assert_eq!(backoff.next("a"), base);
    }

    #[test]
    fn metrics_count_and_encode() {
        let metrics = Metrics::default();
        metrics.observe("task", true, Duration::from_millis(3));
        metrics.observe("task", false, Duration::from_millis(3));
        metrics.observe("task", true, Duration::from_millis(3));
        metrics.set_leader(true);
        assert_eq!(metrics.reconciles("task", "success"), 2);
        assert_eq!(metrics.reconciles("task", "error"), 1);
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                r#"rlark_controller_reconciles_total{controller="task",result="success"} 2"#
            ),
            "{text}"
        );
        assert!(text.contains("rlark_controller_leader 1"), "{text}");
        assert!(
            text.contains(
                "rlark_controller_reconcile_duration_seconds_count{controller=\"task\"} 3"
            ),
            "{text}"
        );
    }
}
