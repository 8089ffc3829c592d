//! Pod API calls of the reconciler and its workers, retried, and what they read from Pods.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Preconditions};
use rlark_api::agent::{RUN_KEY_ANNOTATION, TASK_UID_ANNOTATION};
use rlark_api::types::{Pod, PodPhase};

use super::{ReplicaState, Shared};

/// First pause between retries of a failed API call (doubling up to [`RETRY_MAX`]).
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// While shutting down, a failing API call is tried this many times, then given up.
const SHUTDOWN_ATTEMPTS: u32 = 3;

/// Retry bookkeeping for one API operation: growing pauses; gives up only while the
/// agent shuts down.
pub(super) struct Retry {
    pause: Duration,
    after_shutdown: u32,
}

impl Retry {
    pub(super) fn new() -> Self {
        Self {
            pause: RETRY_MIN,
            after_shutdown: 0,
        }
    }

    /// Log `error`, pause, and say whether to try again.
    pub(super) async fn again(&mut self, shared: &Shared, what: &str, error: &kube::Error) -> bool {
        if shared.shutdown.is_cancelled() {
            self.after_shutdown += 1;
            if self.after_shutdown >= SHUTDOWN_ATTEMPTS {
                tracing::warn!(%error, what, "giving up: the agent is shutting down");
                return false;
            }
            self.pause = RETRY_MIN;
        }
        tracing::warn!(%error, what, retry_in_ms = self.pause.as_millis() as u64, "API call failed");
        tokio::select! {
            _ = tokio::time::sleep(self.pause) => {}
            // Shutting down: hurry through the last attempts.
            _ = shared.shutdown.cancelled(), if self.after_shutdown == 0 => {}
        }
        self.pause = (self.pause * 2).min(RETRY_MAX);
        true
    }
}

pub(super) fn is_status(error: &kube::Error, code: u16) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == code)
}

/// Delete `pod` (that very object: UID precondition); absent or replaced is fine.
pub(super) async fn delete_pod(api: &Api<Pod>, pod: &Pod) -> Result<(), kube::Error> {
    let params = DeleteParams {
        preconditions: pod.uid().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&pod.name_any(), &params).await {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(()),
        Err(e) => Err(e),
    }
}

pub(super) fn pod_phase(pod: &Pod) -> Option<PodPhase> {
    pod.status.as_ref().and_then(|s| s.phase)
}

pub(super) fn pod_is_terminal(pod: &Pod) -> bool {
    matches!(pod_phase(pod), Some(PodPhase::Succeeded | PodPhase::Failed))
}

pub(super) fn pod_reason(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.reason.as_deref())
}

/// Whether `pod` is the Pod of the run `state` was started for.
pub(super) fn is_run_of(pod: &Pod, state: &ReplicaState) -> bool {
    pod.annotations().get(TASK_UID_ANNOTATION) == Some(&state.uid)
        && pod.annotations().get(RUN_KEY_ANNOTATION) == Some(&state.run_key)
}

/// A Pod's `restartCount` (0 when unset) and `startTime` (else `start_time`, else now).
pub(super) fn pod_progress(pod: &Pod, start_time: Option<&str>) -> (i32, Timestamp) {
    let status = pod.status.as_ref();
    let restarts = status.and_then(|s| s.restart_count).unwrap_or(0);
    let start = status
        .and_then(|s| s.start_time.as_ref())
        .map(|t| t.0)
        .or_else(|| start_time.and_then(|t| t.parse().ok()))
        .unwrap_or_else(Timestamp::now);
    (restarts, start)
}

/// [`pod_progress`], from the state file alone when there is no Pod.
pub(super) fn pod_progress_or_state(pod: Option<&Pod>, state: &ReplicaState) -> (i32, Timestamp) {
    match pod {
        Some(pod) => pod_progress(pod, Some(&state.start_time)),
        None => (
            0,
            state
                .start_time
                .parse()
                .unwrap_or_else(|_| Timestamp::now()),
        ),
    }
}
