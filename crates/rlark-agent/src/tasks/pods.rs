//! Pod API calls of the reconciler and its workers, retried, and what they read from Pods.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use rlark_api::agent::status::StatusPatch;
use rlark_api::agent::{RUN_KEY_ANNOTATION, TASK_UID_ANNOTATION, replica_pod};
use rlark_api::types::{Pod, PodPhase};
use serde_json::json;

use super::worker::Worker;
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

/// The Pod API of one replica's worker.
impl Worker {
    /// The Pod, if any; `None` when the agent shut down before it could be read.
    pub(super) async fn get_pod(&self) -> Option<Option<Pod>> {
        let api = self.shared.pods();
        let mut retry = Retry::new();
        loop {
            match api.get_opt(&self.pod).await {
                Ok(pod) => {
                    tracing::debug!(pod = %self.pod, exists = pod.is_some(), "pod read");
                    return Some(pod);
                }
                Err(error) => {
                    if !retry.again(&self.shared, "read pod", &error).await {
                        return None;
                    }
                }
            }
        }
    }

    /// The Pod object of this replica for this run (no status).
    fn new_pod(&self) -> Pod {
        let mut pod = replica_pod(&self.task, self.index, &self.key);
        // The Task was read from this namespace.
        pod.metadata.namespace = Some(self.shared.namespace.clone());
        pod.spec.task_namespace = Some(self.shared.namespace.clone());
        pod.spec.pod_namespace = Some(self.shared.namespace.clone());
        pod
    }

    /// Create this run's Pod, expecting none: `Some(true)` when created, `Some(false)` when
    /// a Pod of that name exists, `None` when the agent shut down first (other errors are
    /// retried).
    pub(super) async fn create_new_pod(&self) -> Option<bool> {
        self.try_create_pod(false).await
    }

    /// Create this run's Pod; one of another run in the way is deleted first. Returns
    /// false only when the agent shut down first.
    pub(super) async fn create_pod(&self) -> bool {
        self.try_create_pod(true).await == Some(true)
    }

    /// Create this run's Pod, retrying errors: `Some(true)` once it exists and is this
    /// run's, `None` when the agent shut down first. A Pod already there (409): with
    /// `replace`, adopted when it is ours, else deleted and the create retried; without,
    /// `Some(false)` at once.
    async fn try_create_pod(&self, replace: bool) -> Option<bool> {
        let api = self.shared.pods();
        let pod = self.new_pod();
        let mut retry = Retry::new();
        loop {
            let error = match api.create(&PostParams::default(), &pod).await {
                Ok(_) => {
                    tracing::debug!(pod = %self.pod, "pod created");
                    return Some(true);
                }
                Err(error) if is_status(&error, 409) && !replace => return Some(false),
                Err(error) if is_status(&error, 409) => match api.get_opt(&self.pod).await {
                    Ok(Some(existing)) if self.is_ours(&existing) => return Some(true),
                    Ok(Some(existing)) => match delete_pod(&api, &existing).await {
                        Ok(()) => error,
                        Err(e) => e,
                    },
                    Ok(None) => error,
                    Err(e) => e,
                },
                Err(error) => error,
            };
            if !retry.again(&self.shared, "create pod", &error).await {
                return None;
            }
        }
    }

    /// Delete `pod`; false only when the agent shut down first.
    pub(super) async fn delete_pod(&self, pod: &Pod) -> bool {
        let api = self.shared.pods();
        let mut retry = Retry::new();
        loop {
            match delete_pod(&api, pod).await {
                Ok(()) => return true,
                Err(error) => {
                    if !retry.again(&self.shared, "delete pod", &error).await {
                        return false;
                    }
                }
            }
        }
    }

    /// Delete this run's Pod (not one another run or node put under the same name).
    pub(super) async fn delete_own_pod(&self) {
        if let Some(Some(pod)) = self.get_pod().await
            && self.is_ours(&pod)
        {
            self.delete_pod(&pod).await;
        }
    }

    /// Merge-patch the Pod's status with `patch` (retried). With `recreate`, a Pod that
    /// disappeared is created again with everything reported so far. Returns whether the
    /// write happened.
    pub(super) async fn write_status(&mut self, patch: StatusPatch, recreate: bool) -> bool {
        patch.apply(&mut self.reported);
        let api = self.shared.pods();
        let params = PatchParams::default();
        let body = json!({ "status": patch.to_json() });
        let mut retry = Retry::new();
        loop {
            let error = match api
                .patch_status(&self.pod, &params, &Patch::Merge(&body))
                .await
            {
                Ok(_) => {
                    tracing::debug!(pod = %self.pod, phase = ?patch.phase(), "pod status written");
                    return true;
                }
                Err(error) if is_status(&error, 404) && !recreate => return false,
                Err(error) if is_status(&error, 404) => {
                    if !self.create_pod().await {
                        return false;
                    }
                    let full = json!({ "status": self.reported });
                    match api
                        .patch_status(&self.pod, &params, &Patch::Merge(&full))
                        .await
                    {
                        Ok(_) => return true,
                        Err(error) => error,
                    }
                }
                Err(error) => error,
            };
            if !retry.again(&self.shared, "write pod status", &error).await {
                return false;
            }
        }
    }
}
