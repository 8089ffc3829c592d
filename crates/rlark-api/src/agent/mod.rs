//! The agent protocol: what an agent writes and what the controllers read, in one place
//! (docs/concepts.md, "Agent protocol"; docs/tasks.md, "The replica state machine").
//!
//! - the names it uses: annotations, reasons, the heartbeat Lease (this module);
//! - how it names things: [`pod_name`], [`run_key`], [`lease_name`], the Pod of a replica
//!   ([`replica_pod`]);
//! - the Node it registers ([`NodeDescription`]);
//! - the Pod status it reports, as typed patches ([`status`]);
//! - what one replica goes through, as a sans-IO state machine ([`replica`]): the caller
//!   feeds events and the time, and executes the actions it gets back.
//! - the agent's local API as the hub and the agent speak it over `agent-api` tunnel streams
//!   ([`local`]: paths, query options, the exec WebSocket protocol's frames and status).
//!
//! Pure: no IO, no clock reads, no client. The raw agent (`rlark-agent`), the simulated
//! agent (`rlark_sim`) and the Task controller all use it, so the protocol cannot drift
//! between them.

pub mod local;
mod naming;
mod node;
pub mod replica;
pub mod status;

use std::time::Duration;

pub use naming::{
    LEASE_PREFIX, lease_name, lease_node, lease_spec, parse_pod_name, pod_name, replica_pod,
    run_key,
};
pub use node::NodeDescription;

/// Pod annotation: UID of the Task the Pod runs. A Pod of another UID belongs to an
/// earlier Task of the same name.
pub const TASK_UID_ANNOTATION: &str = "rlark.io/task-uid";
/// Pod annotation: the run the Pod belongs to ([`run_key`]).
pub const RUN_KEY_ANNOTATION: &str = "rlark.io/run-key";

/// `Node.status.reason` of a Node its agent reports healthy.
pub const REASON_AGENT_READY: &str = "AgentReady";

/// `Pod.status.reason` of a replica that exited 0.
pub const REASON_COMPLETED: &str = "Completed";
/// `Pod.status.reason` of a replica that exited non-zero or was killed by a signal.
pub const REASON_ERROR: &str = "Error";
/// `Pod.status.reason` of a replica ended by `spec.stopped`; such a replica does not fail
/// its Task.
pub const REASON_STOPPED: &str = "Stopped";
/// `Pod.status.reason` of a replica killed at its `activeDeadlineSeconds`.
pub const REASON_DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
/// `Pod.status.reason` of a replica stopped because a robot or camera it holds became
/// unhealthy and its Task says `onDeviceUnhealthy: Stop`.
pub const REASON_DEVICE_UNHEALTHY: &str = "DeviceUnhealthy";
/// `Pod.status.reason` of a replica whose outcome the agent lost (it restarted and found
/// no record of how the replica ended).
pub const REASON_AGENT_LOST: &str = "AgentLost";
/// `Pod.status.reason` of a replica stopped because its agent shut down and stops its
/// tasks on exit.
pub const REASON_AGENT_SHUTDOWN: &str = "AgentShutdown";
/// `Pod.status.reason` of a `Running` replica waiting to be restarted (as a Kubernetes Pod
/// in CrashLoopBackOff), so `Failed` always means "beyond the restart policy".
pub const REASON_BACKOFF: &str = "BackOff";
/// `Pod.status.reason` of a replica of a Task the agent cannot run (its `agentType` is not
/// the agent's).
pub const REASON_UNSUPPORTED_AGENT_TYPE: &str = "UnsupportedAgentType";

/// `Pod.status.reason` of a replica of a domain task waiting for its address while the
/// Domain's pool is full (the Domain controller lists it under the DomainPeer's `pending`).
pub const REASON_NO_DOMAIN_IP: &str = "NoDomainIP";
/// `Pod.status.reason` of a replica of a domain task whose address is not listed yet.
pub const REASON_WAITING_FOR_DOMAIN_IP: &str = "WaitingForDomainIP";
/// `Pod.status.reason` of a replica of a domain task on an agent that runs no pod network
/// (not root, no netfilter): it fails at once rather than run outside its domain.
pub const REASON_DOMAIN_NETWORK_UNAVAILABLE: &str = "DomainNetworkUnavailable";

/// First restart delay.
pub const BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// Longest restart delay (the delay doubles after each restart up to this).
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// A replica that ran this long restarts after [`BACKOFF_INITIAL`] again.
pub const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(600);
/// How long a fresh replica may take to start before its Pod is reported `Pending`
/// (otherwise `Running` is its first phase).
pub const PENDING_AFTER: Duration = Duration::from_millis(250);

/// Grace period between SIGTERM and SIGKILL when the Task does not set
/// `terminationGracePeriodSeconds`.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);
/// Longest grace period a stop waits between SIGTERM and SIGKILL (what admission allows
/// for `terminationGracePeriodSeconds`), so a kill time is always a clock reading.
pub const MAX_GRACE: Duration =
    Duration::from_secs(crate::validation::MAX_TERMINATION_GRACE_PERIOD_SECONDS.unsigned_abs());
/// Shortest `leaseDurationSeconds` written (the controllers' default grace period).
pub const MIN_LEASE_DURATION: Duration = Duration::from_secs(40);

/// The SIGTERM → SIGKILL wait of a replica (`terminationGracePeriodSeconds`):
/// [`DEFAULT_GRACE`] when unset, zero when negative, at most [`MAX_GRACE`]. Admission
/// refuses values out of that range, but a Task stored before it did must not make a stop
/// wait for ever or a kill time overflow the clock.
pub fn grace_period(termination_grace_period_seconds: Option<i64>) -> Duration {
    termination_grace_period_seconds.map_or(DEFAULT_GRACE, |s| {
        Duration::from_secs(u64::try_from(s).unwrap_or(0)).min(MAX_GRACE)
    })
}

/// When `activeDeadlineSeconds` ends for a run that started `elapsed` before `now` (`now`
/// when it has passed); `None` without a deadline (unset or negative). The deadline is cut
/// to [`crate::validation::MAX_ACTIVE_DEADLINE_SECONDS`] (what admission allows) so that
/// any stored value, even `i64::MAX`, gives an instant the clock can represent.
///
/// Generic over the clock: `I` is any instant type (`tokio::time::Instant`, or a
/// `Duration` since an epoch in tests).
pub fn deadline_after<I>(
    active_deadline_seconds: Option<i64>,
    now: I,
    elapsed: Duration,
) -> Option<I>
where
    I: std::ops::Add<Duration, Output = I>,
{
    let seconds = u64::try_from(active_deadline_seconds?).ok()?;
    let limit = Duration::from_secs(seconds).min(Duration::from_secs(
        crate::validation::MAX_ACTIVE_DEADLINE_SECONDS.unsigned_abs(),
    ));
    Some(now + limit.saturating_sub(elapsed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::MAX_ACTIVE_DEADLINE_SECONDS;

    #[test]
    fn grace_periods_are_cut_to_what_the_clock_can_hold() {
        assert_eq!(grace_period(None), DEFAULT_GRACE);
        assert_eq!(grace_period(Some(5)), Duration::from_secs(5));
        assert_eq!(grace_period(Some(-1)), Duration::ZERO);
        assert_eq!(grace_period(Some(i64::MAX)), MAX_GRACE);
    }

    #[test]
    fn deadlines_are_cut_and_count_elapsed_time() {
        let now = Duration::from_secs(100);
        let longest = Duration::from_secs(MAX_ACTIVE_DEADLINE_SECONDS.unsigned_abs());
        assert_eq!(deadline_after(None, now, Duration::ZERO), None);
        assert_eq!(deadline_after(Some(-1), now, Duration::ZERO), None);
        assert_eq!(
            deadline_after(Some(i64::MAX), now, Duration::ZERO),
            Some(now + longest)
        );
        assert_eq!(
            deadline_after(Some(60), now, Duration::from_secs(45)),
            Some(now + Duration::from_secs(15))
        );
        assert_eq!(deadline_after(Some(60), now, Duration::MAX), Some(now));
    }
}
