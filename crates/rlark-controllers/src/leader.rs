//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's `leaderelection`
//! does it, so two controller-managers (or a server and a controller-manager) never both
//! act.
//!
//! - A candidate **acquires** the Lease when it is absent, has no holder, or has expired
//!   (`renewTime + leaseDurationSeconds < now`). Every write is an update carrying the
//!   `resourceVersion` it read (or a create, which fails if the Lease appeared meanwhile),
//!   so of two candidates racing for the same expired Lease exactly one wins.
//! - The leader **renews** every `retry_period`. If it has not renewed successfully for
//!   `renew_deadline` (shorter than `lease_duration`), or finds another holder, it has
//!   **lost** leadership: [`Leadership::lost`] resolves and [`Leadership::watch`] turns
//!   `false`, before any other candidate can take over (assuming bounded clock skew).
//! - [`Leadership::release`] (graceful shutdown) clears `holderIdentity`, so a successor
//!   takes over at once; dropping a [`Leadership`] stops renewing **without** releasing
//!   (a crash), and a successor waits for the Lease to expire.
//!
//! The timing decisions are the pure functions [`decide`] and [`renewal_deadline_passed`].

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::Error;

/// Defaults as in client-go / kube-controller-manager.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

/// What a Lease says, reduced to what the decision needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseRecord {
    pub holder: Option<String>,
    pub renew_time: Option<Timestamp>,
    pub lease_duration: Option<Duration>,
}

impl LeaseRecord {
    pub fn from_lease(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        Self {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            renew_time: spec.renew_time.map(|t| t.0),
            lease_duration: spec
                .lease_duration_seconds
                .map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(0))),
        }
    }
}

/// What a candidate should do with an existing Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// We hold it: renew.
    Renew,
    /// Free or expired: take it over (a new term).
    TakeOver,
    /// Someone else holds it until `expires`.
    HeldByOther { holder: String, expires: Timestamp },
}

/// Decide what `identity` may do with `record` at `now` (pure). A Lease without a renew
/// time is free; one without a duration uses `default_duration`.
pub fn decide(
    now: Timestamp,
    record: &LeaseRecord,
    identity: &str,
    default_duration: Duration,
) -> Decision {
    let Some(holder) = record.holder.as_deref() else {
        return Decision::TakeOver;
    };
    if holder == identity {
        return Decision::Renew;
    }
    let Some(renewed) = record.renew_time else {
        return Decision::TakeOver;
    };
    let duration = record.lease_duration.unwrap_or(default_duration);
    let expires = renewed
        .checked_add(jiff_duration(duration))
        .unwrap_or(Timestamp::MAX);
    if expires < now {
        Decision::TakeOver
    } else {
        Decision::HeldByOther {
            holder: holder.to_string(),
            expires,
        }
    }
}

/// Whether a leader that last renewed at `last_renewed` must consider leadership lost at
/// `now` (pure).
pub fn renewal_deadline_passed(
    last_renewed: Instant,
    now: Instant,
    renew_deadline: Duration,
) -> bool {
    now.saturating_duration_since(last_renewed) >= renew_deadline
}

fn jiff_duration(d: Duration) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::try_from(d).unwrap_or(k8s_openapi::jiff::SignedDuration::MAX)
}

/// Outcome of one acquire-or-renew attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// We hold the Lease now.
    Leader,
    /// Someone else holds it.
    Follower { holder: String },
    /// Our write lost a race (409): try again.
    Conflict,
}

/// A candidate for one Lease. Cheap to clone.
#[derive(Clone)]
pub struct LeaderElector {
    client: kube::Client,
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This candidate's identity (unique per process).
    pub identity: String,
    /// How long a Lease is valid after its last renewal (15 s).
    pub lease_duration: Duration,
    /// A leader that could not renew for this long gives up (10 s; < `lease_duration`).
    pub renew_deadline: Duration,
    /// Pause between attempts, for candidates and for the leader's renewals (2 s).
    pub retry_period: Duration,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("identity", &self.identity)
            .field("lease_duration", &self.lease_duration)
            .field("renew_deadline", &self.renew_deadline)
            .field("retry_period", &self.retry_period)
            .finish_non_exhaustive()
    }
}

impl LeaderElector {
    /// A candidate with the default timings.
    pub fn new(
        client: kube::Client,
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Self {
            client,
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
        }
    }

    /// Replace the timings. `renew_deadline` must be shorter than `lease_duration` and
    /// `retry_period` shorter than `renew_deadline`, else [`Error::Invalid`].
    pub fn with_timings(
        mut self,
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Result<Self, Error> {
        if renew_deadline >= lease_duration
            || retry_period >= renew_deadline
            || retry_period.is_zero()
        {
            return Err(Error::Invalid(format!(
                "leader election timings must satisfy 0 < retry period ({retry_period:?}) < renew deadline ({renew_deadline:?}) < lease duration ({lease_duration:?})"
            )));
        }
        self.lease_duration = lease_duration;
        self.renew_deadline = renew_deadline;
        self.retry_period = retry_period;
        Ok(self)
    }

    fn api(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    /// One attempt to acquire or renew the Lease at the current time.
    pub async fn try_acquire_or_renew(&self) -> Result<Attempt, Error> {
        let api = self.api();
        let now = Timestamp::now();
        let Some(mut lease) = api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    namespace: Some(self.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(self.duration_seconds()),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Leader),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Conflict),
                Err(e) => Err(e.into()),
            };
        };
        let record = LeaseRecord::from_lease(&lease);
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        match decide(now, &record, &self.identity, self.lease_duration) {
            Decision::HeldByOther { holder, .. } => return Ok(Attempt::Follower { holder }),
            Decision::Renew => {
                spec.renew_time = Some(MicroTime(now));
                spec.lease_duration_seconds = Some(self.duration_seconds());
            }
            Decision::TakeOver => {
                spec.holder_identity = Some(self.identity.clone());
                spec.lease_duration_seconds = Some(self.duration_seconds());
                spec.acquire_time = Some(MicroTime(now));
                spec.renew_time = Some(MicroTime(now));
                spec.lease_transitions =
                    Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
            }
        }
        // `lease.metadata.resourceVersion` is the one we read: a concurrent writer makes
        // this fail with 409 instead of both candidates winning.
        match api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(Attempt::Leader),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Conflict),
            Err(e) => Err(e.into()),
        }
    }

    /// Campaign until this candidate leads (then renew in the background) or `shutdown` is
    /// cancelled (`None`). API errors are logged and retried every `retry_period`.
    pub async fn acquire(&self, shutdown: &CancellationToken) -> Option<Leadership> {
        let mut last_holder = None::<String>;
        loop {
            let attempt = tokio::select! {
                _ = shutdown.cancelled() => return None,
                attempt = tokio::time::timeout(self.retry_period, self.try_acquire_or_renew()) => attempt,
            };
            match attempt {
                Ok(Ok(Attempt::Leader)) => {
                    tracing::info!(identity = %self.identity, lease = %self.name, "became leader");
                    return Some(self.lead());
                }
                Ok(Ok(Attempt::Follower { holder })) => {
                    if last_holder.as_deref() != Some(holder.as_str()) {
                        tracing::info!(%holder, lease = %self.name, "lease held by another candidate; waiting");
                        last_holder = Some(holder);
                    }
                }
                Ok(Ok(Attempt::Conflict)) => {
                    tracing::debug!(lease = %self.name, "lost a race for the lease");
                }
                Ok(Err(error)) => {
                    tracing::warn!(%error, lease = %self.name, "leader election attempt failed")
                }
                Err(_) => tracing::warn!(lease = %self.name, "leader election attempt timed out"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = tokio::time::sleep(jittered(self.retry_period)) => {}
            }
        }
    }

    /// Start renewing (we just acquired the Lease).
    fn lead(&self) -> Leadership {
        let (tx, rx) = watch::channel(true);
        let stop = CancellationToken::new();
        let elector = self.clone();
        let token = stop.clone();
        let task = tokio::spawn(async move { elector.renew_loop(tx, token).await });
        Leadership {
            elector: self.clone(),
            leader: rx,
            stop,
            task: Some(task),
        }
    }

    async fn renew_loop(self, tx: watch::Sender<bool>, stop: CancellationToken) {
        let mut last_renewed = Instant::now();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.retry_period) => {}
            }
            // Never wait past the deadline for one attempt.
            let left = self
                .renew_deadline
                .saturating_sub(Instant::now().saturating_duration_since(last_renewed));
            let attempt = tokio::select! {
                _ = stop.cancelled() => return,
                attempt = tokio::time::timeout(left.max(Duration::from_millis(1)), self.try_acquire_or_renew()) => attempt,
            };
            match attempt {
                Ok(Ok(Attempt::Leader)) => last_renewed = Instant::now(),
                Ok(Ok(Attempt::Follower { holder })) => {
                    tracing::warn!(%holder, lease = %self.name, "leadership lost: the lease has another holder");
                    let _ = tx.send(false);
                    return;
                }
                Ok(Ok(Attempt::Conflict)) => {
                    tracing::debug!(lease = %self.name, "lease renewal conflicted; retrying")
                }
                Ok(Err(error)) => {
                    tracing::warn!(%error, lease = %self.name, "lease renewal failed")
                }
                Err(_) => tracing::warn!(lease = %self.name, "lease renewal timed out"),
            }
            if renewal_deadline_passed(last_renewed, Instant::now(), self.renew_deadline) {
                tracing::warn!(
                    lease = %self.name,
                    renew_deadline_ms = self.renew_deadline.as_millis() as u64,
                    "leadership lost: could not renew the lease in time"
                );
                let _ = tx.send(false);
                return;
            }
        }
    }

    /// Give the Lease up if we hold it: clear the holder so a successor need not wait for
    /// expiry.
    pub async fn release(&self) -> Result<(), Error> {
        let api = self.api();
        let Some(mut lease) = api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let record = LeaseRecord::from_lease(&lease);
        if record.holder.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        api.replace(&self.name, &PostParams::default(), &lease)
            .await?;
        tracing::info!(identity = %self.identity, lease = %self.name, "released leadership");
        Ok(())
    }
}

/// `period` plus up to 20 % (from the clock's sub-second digits: spreads candidates that
/// started together without a random-number dependency).
fn jittered(period: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let fraction = f64::from(nanos % 1000) / 1000.0 * 0.2;
    period.mul_f64(1.0 + fraction)
}

/// Held leadership. While it exists (and until [`Leadership::lost`] resolves) the Lease is
/// renewed in the background. Dropping it stops renewing without releasing the Lease.
pub struct Leadership {
    elector: LeaderElector,
    leader: watch::Receiver<bool>,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("elector", &self.elector)
            .field("leader", &*self.leader.borrow())
            .finish_non_exhaustive()
    }
}

impl Leadership {
    /// Whether leadership is still held (false once lost; it never turns true again).
    pub fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }

    /// A receiver that turns `false` when leadership is lost.
    pub fn watch(&self) -> watch::Receiver<bool> {
        self.leader.clone()
    }

    /// Resolves when leadership is lost (at once if it already was).
    pub async fn lost(&self) {
        let mut rx = self.leader.clone();
        // Err: the renew task ended (stopped or panicked): leadership is not held.
        let _ = rx.wait_for(|leader| !*leader).await;
    }

    /// Stop renewing and release the Lease (graceful shutdown).
    pub async fn release(mut self) -> Result<(), Error> {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        self.elector.release().await
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn record(holder: Option<&str>, renewed: Option<i64>, duration: Option<u64>) -> LeaseRecord {
        LeaseRecord {
            holder: holder.map(String::from),
            renew_time: renewed.map(ts),
            lease_duration: duration.map(Duration::from_secs),
        }
    }

    const D: Duration = Duration::from_secs(15);

    #[test]
    fn decisions() {
        assert_eq!(
            decide(ts(0), &record(None, Some(0), Some(15)), "me", D),
            Decision::TakeOver
        );
        assert_eq!(
            decide(ts(0), &record(Some("me"), Some(-100), Some(15)), "me", D),
            Decision::Renew
        );
        assert_eq!(
            decide(ts(15), &record(Some("other"), Some(0), Some(15)), "me", D),
            Decision::HeldByOther {
                holder: "other".into(),
                expires: ts(15)
            }
        );
        assert_eq!(
            decide(ts(16), &record(Some("other"), Some(0), Some(15)), "me", D),
            Decision::TakeOver
        );
        // Released lease: duration 1 s.
        assert_eq!(
            decide(ts(2), &record(Some("other"), Some(0), Some(1)), "me", D),
            Decision::TakeOver
        );
        // No duration: ours.
        assert!(matches!(
            decide(ts(10), &record(Some("other"), Some(0), None), "me", D),
            Decision::HeldByOther { .. }
        ));
        assert_eq!(
            decide(ts(10), &record(Some("other"), None, Some(15)), "me", D),
            Decision::TakeOver
        );
    }

    #[test]
    fn renew_deadline() {
        let start = Instant::now();
        let deadline = Duration::from_secs(10);
        assert!(!renewal_deadline_passed(
            start,
            start + Duration::from_secs(9),
            deadline
        ));
        assert!(renewal_deadline_passed(start, start + deadline, deadline));
        assert!(!renewal_deadline_passed(
            start + Duration::from_secs(1),
            start,
            deadline
        ));
    }

    #[test]
    fn lease_record_from_lease() {
        let lease = Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: Some(String::new()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(ts(3))),
                ..Default::default()
            }),
        };
        assert_eq!(
            LeaseRecord::from_lease(&lease),
            record(None, Some(3), Some(15))
        );
    }

    #[test]
    fn jitter_is_bounded() {
        let j = jittered(Duration::from_secs(2));
        assert!(j >= Duration::from_secs(2) && j <= Duration::from_millis(2400));
    }
}
