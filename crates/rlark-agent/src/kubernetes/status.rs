//! Member cluster status → rlark status: a workload's status → the Task's phase, a
//! member Pod → the rlark Pod's status and its image pulls.
//!
//! Workloads, as RLark maps them, with two corrections (docs/compat.md):
//! - Deployment: desired 0 → `Stopped`; a `ReplicaFailure` condition → `Failed`;
//!   `Progressing` false with `ProgressDeadlineExceeded` → `Failed`; ready ≥ desired →
//!   `Running`; else `Pending` (RLark said `Failed` as soon as a replica was unavailable,
//!   which every starting Deployment is);
//! - StatefulSet: desired 0 → `Stopped`; ready ≥ desired → `Running`; else `Pending`;
//! - CloneSet (OpenKruise; RLark named it but could not run it): as a Deployment, with
//!   its `FailedScale` condition as the failure ([`super::cloneset`]);
//! - DaemonSet: stopped (the runtime's no-node selector) → `Stopped`; ready ≥ desired > 0
//!   → `Running`; else `Pending` (RLark: `Failed` when any is unavailable);
//! - batch Job (RLark had none): condition `Complete` → `Succeeded`; `Failed` →
//!   `Failed` with its reason and message (`DeadlineExceeded`, `BackoffLimitExceeded`);
//!   without conditions, `succeeded` ≥ completions → `Succeeded`, `failed` > backoffLimit
//!   → `Failed`; suspended → `Stopped`; ready ≥ parallelism → `Running`; else `Pending`.
//!
//! A Deployment, StatefulSet, CloneSet or DaemonSet status the workload controller has not caught
//! up with (`observedGeneration` < `generation`) is `Pending` unless the workload is
//! stopped or failed (a Job's status has no `observedGeneration`).

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod as MemberPod};
use rlark_api::agent::{REASON_BACKOFF, REASON_COMPLETED, REASON_ERROR};
use rlark_api::types::{PodPhase, PodStatus, PullProgress, TaskPhase};

use super::cloneset::CloneSet;
use super::workload::{STOPPED_NODE_LABEL, Workload};

/// The Task's view of its workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadState {
    /// The Task's phase.
    pub phase: TaskPhase,
    /// Why, for the Task's `status.message`.
    pub message: Option<String>,
    /// Desired replicas.
    pub replicas: i32,
    /// Ready replicas.
    pub ready: i32,
    /// Replicas that completed (Jobs).
    pub succeeded: i32,
    /// Replicas that failed (Jobs).
    pub failed: i32,
}

impl WorkloadState {
    fn new(phase: TaskPhase, message: Option<String>, replicas: i32, ready: i32) -> Self {
        Self {
            phase,
            message,
            replicas,
            ready,
            succeeded: 0,
            failed: 0,
        }
    }
}

fn stale(generation: Option<i64>, observed: Option<i64>) -> Option<String> {
    match (generation, observed) {
        (Some(g), Some(o)) if o < g => Some(format!(
            "waiting for the workload controller to observe generation {g} (at {o})"
        )),
        (Some(g), None) => Some(format!(
            "waiting for the workload controller to observe generation {g}"
        )),
        _ => None,
    }
}

/// The Task's view of `workload`.
pub fn workload_state(workload: &Workload) -> WorkloadState {
    match workload {
        Workload::Deployment(d) => deployment_state(d),
        Workload::StatefulSet(s) => statefulset_state(s),
        Workload::DaemonSet(d) => daemonset_state(d),
        Workload::Job(j) => job_state(j),
        Workload::CloneSet(c) => cloneset_state(c),
    }
}

/// The phase of a workload that keeps `desired` replicas (Deployment, StatefulSet,
/// CloneSet): 0 desired → `Stopped`; a `failure` (reason: message) → `Failed`; a status
/// older than the `generation` → `Pending`; ready ≥ desired → `Running`; else `Pending`.
fn replicated_state(
    desired: i32,
    ready: i32,
    failure: Option<String>,
    generation: Option<i64>,
    observed: Option<i64>,
) -> WorkloadState {
    if desired == 0 {
        return WorkloadState::new(TaskPhase::Stopped, None, 0, ready);
    }
    if let Some(message) = failure {
        return WorkloadState::new(TaskPhase::Failed, Some(message), desired, ready);
    }
    if let Some(message) = stale(generation, observed) {
        return WorkloadState::new(TaskPhase::Pending, Some(message), desired, ready);
    }
    if ready >= desired {
        return WorkloadState::new(TaskPhase::Running, None, desired, ready);
    }
    let message = format!("{ready}/{desired} replicas ready");
    WorkloadState::new(TaskPhase::Pending, Some(message), desired, ready)
}

/// `reason: message` of a failure condition (its type when it has no reason).
fn failure_text(type_: &str, reason: Option<&str>, message: Option<&str>) -> String {
    format!(
        "{}: {}",
        reason.unwrap_or(type_),
        message.unwrap_or_default()
    )
}

/// An OpenKruise CloneSet (module docs).
pub fn cloneset_state(c: &CloneSet) -> WorkloadState {
    let status = c.status.clone().unwrap_or_default();
    let failure = status
        .conditions
        .iter()
        .find(|c| c.type_ == "FailedScale" && c.status == "True")
        .map(|c| failure_text(&c.type_, c.reason.as_deref(), c.message.as_deref()));
    replicated_state(
        c.spec.replicas.unwrap_or(1),
        status.ready_replicas,
        failure,
        c.metadata.generation,
        status.observed_generation,
    )
}

/// A Deployment (module docs).
pub fn deployment_state(d: &Deployment) -> WorkloadState {
    let status = d.status.clone().unwrap_or_default();
    let failure = status
        .conditions
        .iter()
        .flatten()
        .find(|c| {
            (c.type_ == "ReplicaFailure" && c.status == "True")
                || (c.type_ == "Progressing"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("ProgressDeadlineExceeded"))
        })
        .map(|c| failure_text(&c.type_, c.reason.as_deref(), c.message.as_deref()));
    replicated_state(
        d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
        status.ready_replicas.unwrap_or(0),
        failure,
        d.metadata.generation,
        status.observed_generation,
    )
}

/// A StatefulSet (module docs).
pub fn statefulset_state(s: &StatefulSet) -> WorkloadState {
    let status = s.status.clone().unwrap_or_default();
    replicated_state(
        s.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
        status.ready_replicas.unwrap_or(0),
        None,
        s.metadata.generation,
        status.observed_generation,
    )
}

/// A DaemonSet (module docs).
pub fn daemonset_state(d: &DaemonSet) -> WorkloadState {
    let status = d.status.clone().unwrap_or_default();
    let desired = status.desired_number_scheduled;
    let ready = status.number_ready;
    let stopped = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.node_selector.as_ref())
        .is_some_and(|s| s.get(STOPPED_NODE_LABEL).is_some_and(|v| v == "true"));
    if stopped {
        return WorkloadState::new(TaskPhase::Stopped, None, 0, ready);
    }
    if let Some(message) = stale(d.metadata.generation, status.observed_generation) {
        return WorkloadState::new(TaskPhase::Pending, Some(message), desired, ready);
    }
    if desired > 0 && ready >= desired {
        return WorkloadState::new(TaskPhase::Running, None, desired, ready);
    }
    let message = if desired == 0 {
        "no node matches the DaemonSet".to_string()
    } else {
        format!("{ready}/{desired} daemon pods ready")
    };
    WorkloadState::new(TaskPhase::Pending, Some(message), desired, ready)
}

/// A batch Job (module docs).
pub fn job_state(j: &Job) -> WorkloadState {
    let spec = j.spec.clone().unwrap_or_default();
    let status = j.status.clone().unwrap_or_default();
    let parallelism = spec.parallelism.unwrap_or(1);
    let completions = spec.completions.unwrap_or(parallelism);
    let ready = status.ready.unwrap_or(0);
    let mut state = WorkloadState {
        phase: TaskPhase::Pending,
        message: None,
        replicas: parallelism,
        ready,
        succeeded: status.succeeded.unwrap_or(0),
        failed: status.failed.unwrap_or(0),
    };
    let condition = |type_: &str| {
        status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == type_ && c.status == "True")
    };
    if condition("Complete").is_some() {
        state.phase = TaskPhase::Succeeded;
    } else if let Some(failed) = condition("Failed") {
        state.phase = TaskPhase::Failed;
        state.message = Some(format!(
            "{}: {}",
            failed.reason.as_deref().unwrap_or("Failed"),
            failed.message.as_deref().unwrap_or_default()
        ));
    } else if completions > 0 && state.succeeded >= completions {
        state.phase = TaskPhase::Succeeded;
    } else if state.failed > spec.backoff_limit.unwrap_or(6) {
        state.phase = TaskPhase::Failed;
        state.message = Some(format!("{} pods failed", state.failed));
    } else if spec.suspend == Some(true) {
        state.phase = TaskPhase::Stopped;
    } else if ready >= parallelism && parallelism > 0 {
        state.phase = TaskPhase::Running;
    } else {
        state.message = Some(format!("{ready}/{parallelism} pods ready"));
    }
    state
}

/// The container whose end is the Pod's: the one named `main`, else the first.
fn main_status(pod: &MemberPod) -> Option<&ContainerStatus> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses
        .iter()
        .find(|c| c.name == "main")
        .or_else(|| statuses.first())
}

/// Waiting reasons of an image pull that does not succeed.
pub const PULL_FAILURES: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
];

/// The rlark Pod status of member Pod `pod`: phase (`Unknown` → `Pending`), node, IP,
/// restart count (sum over its containers), start time; once finished the main
/// container's exit code, `finishTime`, and a reason (the Pod's own, e.g. `Evicted` or
/// `DeadlineExceeded`, else the container's, e.g. `OOMKilled`, else `Completed`/`Error`);
/// while Pending or Running the first waiting container's reason and message
/// (`ErrImagePull`, `ImagePullBackOff` with the pull error, `ContainerCreating`, ...),
/// `CrashLoopBackOff` reported as [`REASON_BACKOFF`] as raw replicas waiting to restart
/// are; while Pending its image pulls ([`pull_progress`]).
pub fn pod_status(pod: &MemberPod) -> PodStatus {
    let status = pod.status.clone().unwrap_or_default();
    let phase = match status.phase.as_deref() {
        Some("Running") => PodPhase::Running,
        Some("Succeeded") => PodPhase::Succeeded,
        Some("Failed") => PodPhase::Failed,
        _ => PodPhase::Pending,
    };
    let containers: Vec<&ContainerStatus> = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .collect();
    let restarts = containers.iter().map(|c| c.restart_count).sum::<i32>();
    let mut out = PodStatus {
        phase: Some(phase),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        ip: status.pod_ip.clone(),
        restart_count: Some(restarts),
        start_time: status.start_time.clone(),
        pull_progress: pull_progress(pod),
        tensor_board: super::tensorboard::status(pod),
        ..Default::default()
    };
    match phase {
        PodPhase::Succeeded | PodPhase::Failed => {
            let terminated = main_status(pod)
                .and_then(|c| c.state.as_ref())
                .and_then(|s| s.terminated.as_ref());
            out.exit_code = terminated.map(|t| t.exit_code);
            out.finish_time = containers
                .iter()
                .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.clone())
                .max_by(|a, b| a.0.cmp(&b.0));
            let fallback = if phase == PodPhase::Succeeded {
                REASON_COMPLETED
            } else {
                REASON_ERROR
            };
            out.reason = Some(
                status
                    .reason
                    .clone()
                    .or_else(|| terminated.and_then(|t| t.reason.clone()))
                    .unwrap_or_else(|| fallback.to_string()),
            );
            out.message = status
                .message
                .clone()
                .or_else(|| terminated.and_then(|t| t.message.clone()));
        }
        PodPhase::Pending | PodPhase::Running => {
            let waiting = containers
                .iter()
                .filter_map(|c| c.state.as_ref()?.waiting.as_ref())
                .find(|w| w.reason.is_some());
            if let Some(waiting) = waiting {
                let reason = waiting.reason.clone().unwrap_or_default();
                out.reason = Some(if reason == "CrashLoopBackOff" {
                    REASON_BACKOFF.to_string()
                } else {
                    reason
                });
                out.message = waiting.message.clone();
            } else if phase == PodPhase::Pending {
                let unschedulable = status
                    .conditions
                    .iter()
                    .flatten()
                    .find(|c| c.type_ == "PodScheduled" && c.status == "False");
                out.reason = unschedulable
                    .and_then(|c| c.reason.clone())
                    .or_else(|| status.reason.clone());
                out.message = unschedulable
                    .and_then(|c| c.message.clone())
                    .or_else(|| status.message.clone());
            }
        }
    }
    out
}

/// The image pulls of member Pod `pod` while it is Pending, one per container (init
/// containers first): `Done` once the image is there (the container has an image ID),
/// `Failed` or `BackOff` with the error as message for [`PULL_FAILURES`], else `Pulling`.
/// Kubernetes does not report bytes, so `downloaded`, `total` and `speed` are 0.
pub fn pull_progress(pod: &MemberPod) -> Vec<PullProgress> {
    let status = pod.status.clone().unwrap_or_default();
    if status.phase.as_deref().is_some_and(|p| p != "Pending") {
        return Vec::new();
    }
    let spec = pod.spec.clone().unwrap_or_default();
    let images = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()));
    let statuses: Vec<&ContainerStatus> = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .collect();
    images
        .map(|(name, image)| {
            let container = statuses.iter().find(|c| c.name == name);
            let waiting = container
                .and_then(|c| c.state.as_ref())
                .and_then(|s| s.waiting.as_ref());
            let reason = waiting
                .and_then(|w| w.reason.as_deref())
                .unwrap_or_default();
            let pulled = container.is_some_and(|c| !c.image_id.is_empty());
            let (state, message) = if PULL_FAILURES.contains(&reason) {
                let state = if reason == "ImagePullBackOff" {
                    "BackOff"
                } else {
                    "Failed"
                };
                (state, waiting.and_then(|w| w.message.clone()))
            } else if pulled {
                ("Done", None)
            } else {
                ("Pulling", None)
            };
            PullProgress {
                image,
                downloaded: 0,
                total: 0,
                speed: 0.0,
                status: state.to_string(),
                message,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).expect("fixture")
    }

    fn phase_of(w: Workload) -> (TaskPhase, Option<String>) {
        let s = workload_state(&w);
        (s.phase, s.message)
    }

    #[test]
    fn cloneset_table() {
        use TaskPhase::*;
        let clones = |replicas: i32, generation: i64, status: Value| {
            Workload::CloneSet(from(json!({
                "apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet",
                "metadata": {"name": "c", "generation": generation},
                "spec": {"replicas": replicas, "selector": {}, "template": {}},
                "status": status,
            })))
        };
        assert_eq!(phase_of(clones(0, 1, json!({}))), (Stopped, None));
        assert_eq!(
            phase_of(clones(
                2,
                1,
                json!({"observedGeneration": 1, "replicas": 2, "readyReplicas": 2})
            )),
            (Running, None)
        );
        assert_eq!(
            phase_of(clones(
                2,
                1,
                json!({"observedGeneration": 1, "readyReplicas": 1})
            )),
            (Pending, Some("1/2 replicas ready".into()))
        );
        assert_eq!(
            phase_of(clones(
                2,
                3,
                json!({"observedGeneration": 2, "readyReplicas": 2})
            ))
            .0,
            Pending
        );
        assert_eq!(
            phase_of(clones(
                2,
                1,
                json!({"observedGeneration": 1, "conditions": [
                {"type": "FailedScale", "status": "True", "reason": "CreatePodFailed",
                 "message": "exceeded quota"}]})
            )),
            (Failed, Some("CreatePodFailed: exceeded quota".into()))
        );
    }

    #[test]
    fn deployment_statefulset_daemonset_table() {
        use TaskPhase::*;
        let deploy = |replicas: i32, status: Value| {
            Workload::Deployment(from(json!({"metadata": {"generation": 2},
                "spec": {"replicas": replicas, "selector": {}, "template": {}},
                "status": status})))
        };
        let sts = |replicas: i32, status: Value| {
            Workload::StatefulSet(from(json!({"metadata": {"generation": 1},
                "spec": {"replicas": replicas, "selector": {}, "template": {}, "serviceName": ""},
                "status": status})))
        };
        let ds = |selector: Value, status: Value| {
            Workload::DaemonSet(from(json!({"metadata": {"generation": 1},
                "spec": {"selector": {}, "template": {"spec": {"containers": [],
                                                               "nodeSelector": selector}}},
                "status": status})))
        };
        let replica_failure = json!({"observedGeneration": 2, "replicas": 1, "conditions": [
            {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
             "message": "exceeded quota"}]});
        let deadline = json!({"observedGeneration": 2, "conditions": [
            {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
             "message": "took too long"}]});
        let cases: Vec<(&str, Workload, TaskPhase, Option<&str>)> = vec![
            ("deploy stopped", deploy(0, json!({})), Stopped, None),
            (
                "deploy ready",
                deploy(2, json!({"observedGeneration": 2, "readyReplicas": 2})),
                Running,
                None,
            ),
            (
                "deploy starting",
                deploy(
                    2,
                    json!({"observedGeneration": 2, "readyReplicas": 1,
                "unavailableReplicas": 1}),
                ),
                Pending,
                Some("1/2 replicas ready"),
            ),
            (
                "deploy stale",
                deploy(2, json!({"observedGeneration": 1, "readyReplicas": 2})),
                Pending,
                Some("waiting for the workload controller to observe generation 2 (at 1)"),
            ),
            (
                "deploy replica failure",
                deploy(2, replica_failure),
                Failed,
                Some("FailedCreate: exceeded quota"),
            ),
            (
                "deploy deadline",
                deploy(2, deadline),
                Failed,
                Some("ProgressDeadlineExceeded: took too long"),
            ),
            (
                "sts stopped",
                sts(0, json!({"readyReplicas": 1})),
                Stopped,
                None,
            ),
            (
                "sts ready",
                sts(3, json!({"observedGeneration": 1, "readyReplicas": 3})),
                Running,
                None,
            ),
            (
                "sts starting",
                sts(3, json!({"observedGeneration": 1, "readyReplicas": 2})),
                Pending,
                Some("2/3 replicas ready"),
            ),
            (
                "ds ready",
                ds(
                    json!({}),
                    json!({"observedGeneration": 1, "desiredNumberScheduled": 2,
                "numberReady": 2, "currentNumberScheduled": 2, "numberMisscheduled": 0}),
                ),
                Running,
                None,
            ),
            (
                "ds starting",
                ds(
                    json!({}),
                    json!({"observedGeneration": 1, "desiredNumberScheduled": 2,
                "numberReady": 1, "numberUnavailable": 1, "currentNumberScheduled": 2,
                "numberMisscheduled": 0}),
                ),
                Pending,
                Some("1/2 daemon pods ready"),
            ),
            (
                "ds no node",
                ds(
                    json!({}),
                    json!({"observedGeneration": 1, "desiredNumberScheduled": 0,
                "numberReady": 0, "currentNumberScheduled": 0, "numberMisscheduled": 0}),
                ),
                Pending,
                Some("no node matches the DaemonSet"),
            ),
            (
                "ds stopped",
                ds(
                    json!({STOPPED_NODE_LABEL: "true"}),
                    json!({"desiredNumberScheduled": 0,
                "numberReady": 0, "currentNumberScheduled": 0, "numberMisscheduled": 0}),
                ),
                Stopped,
                None,
            ),
        ];
        for (name, workload, phase, message) in cases {
            assert_eq!(
                phase_of(workload),
                (phase, message.map(str::to_string)),
                "{name}"
            );
        }
    }

    #[test]
    fn batch_job_table() {
        use TaskPhase::*;
        let job = |spec: Value, status: Value| {
            let mut spec = spec;
            spec["template"] = json!({});
            Workload::Job(from(json!({"spec": spec, "status": status})))
        };
        let base = json!({"parallelism": 2, "completions": 2, "backoffLimit": 0});
        let cases: Vec<(&str, Workload, TaskPhase, Option<&str>)> = vec![
            (
                "complete",
                job(
                    base.clone(),
                    json!({"succeeded": 2, "conditions": [
                {"type": "Complete", "status": "True"}]}),
                ),
                Succeeded,
                None,
            ),
            (
                "deadline",
                job(
                    base.clone(),
                    json!({"failed": 1, "conditions": [
                {"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                 "message": "Job was active longer than specified deadline"}]}),
                ),
                Failed,
                Some("DeadlineExceeded: Job was active longer than specified deadline"),
            ),
            (
                "backoff",
                job(
                    base.clone(),
                    json!({"failed": 1, "conditions": [
                {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                 "message": "Job has reached the specified backoff limit"}]}),
                ),
                Failed,
                Some("BackoffLimitExceeded: Job has reached the specified backoff limit"),
            ),
            (
                "a false condition counts for nothing",
                job(
                    base.clone(),
                    json!({"ready": 2,
                "conditions": [{"type": "Failed", "status": "False"}]}),
                ),
                Running,
                None,
            ),
            (
                "succeeded without condition",
                job(base.clone(), json!({"succeeded": 2})),
                Succeeded,
                None,
            ),
            (
                "failed without condition",
                job(base.clone(), json!({"failed": 1})),
                Failed,
                Some("1 pods failed"),
            ),
            (
                "suspended",
                job(json!({"parallelism": 2, "suspend": true}), json!({})),
                Stopped,
                None,
            ),
            (
                "running",
                job(base.clone(), json!({"ready": 2, "active": 2})),
                Running,
                None,
            ),
            (
                "starting",
                job(base.clone(), json!({"ready": 1, "active": 2})),
                Pending,
                Some("1/2 pods ready"),
            ),
        ];
        for (name, workload, phase, message) in cases {
            assert_eq!(
                phase_of(workload),
                (phase, message.map(str::to_string)),
                "{name}"
            );
        }
        let counts = workload_state(&job(base, json!({"succeeded": 1, "failed": 0, "ready": 1})));
        assert_eq!((counts.replicas, counts.ready, counts.succeeded), (2, 1, 1));
    }

    fn member_pod(phase: &str, statuses: Value, extra_status: Value) -> MemberPod {
        let mut status = json!({"phase": phase, "podIP": "10.1.0.7",
                                "startTime": "2026-12-02T00:00:00Z",
                                "containerStatuses": statuses});
        if let (Some(s), Some(extra)) = (status.as_object_mut(), extra_status.as_object()) {
            s.extend(extra.clone());
        }
        from(json!({"metadata": {"name": "ppo-actor-0"},
            "spec": {"nodeName": "gpu-1", "containers": [
                {"name": "main", "image": "rlinf/rlinf:latest"},
                {"name": "side", "image": "busybox"}]},
            "status": status}))
    }

    fn cs(name: &str, state: Value, restarts: i32, image_id: &str) -> Value {
        json!({"name": name, "state": state, "restartCount": restarts, "image": "x",
               "imageID": image_id, "ready": false})
    }

    /// (name, pod, phase, reason, message, exit code, restarts)
    type PodCase = (
        &'static str,
        MemberPod,
        PodPhase,
        Option<&'static str>,
        Option<&'static str>,
        Option<i32>,
        i32,
    );

    #[test]
    fn member_pods_become_rlark_pod_statuses() {
        use PodPhase::*;
        let terminated = |code: i32, reason: &str| {
            json!({"terminated": {"exitCode": code, "reason": reason,
                                  "finishedAt": "2026-12-02T00:05:00Z"}})
        };
        let waiting = |reason: &str, message: &str| json!({"waiting": {"reason": reason, "message": message}});
        let running = json!({"running": {"startedAt": "2026-12-02T00:01:00Z"}});
        // (name, pod, phase, reason, message, exit code, restarts)
        let cases: Vec<PodCase> = vec![
            (
                "pulling fails",
                member_pod(
                    "Pending",
                    json!([
                        cs("main", waiting("ErrImagePull", "pull access denied"), 0, ""),
                        cs("side", waiting("ContainerCreating", ""), 0, "")
                    ]),
                    json!({}),
                ),
                Pending,
                Some("ErrImagePull"),
                Some("pull access denied"),
                None,
                0,
            ),
            (
                "pull backoff",
                member_pod(
                    "Pending",
                    json!([cs(
                        "main",
                        waiting("ImagePullBackOff", "Back-off pulling image"),
                        0,
                        ""
                    )]),
                    json!({}),
                ),
                Pending,
                Some("ImagePullBackOff"),
                Some("Back-off pulling image"),
                None,
                0,
            ),
            (
                "unschedulable",
                member_pod(
                    "Pending",
                    json!([]),
                    json!({"conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/3 nodes are available"}]}),
                ),
                Pending,
                Some("Unschedulable"),
                Some("0/3 nodes are available"),
                None,
                0,
            ),
            (
                "running",
                member_pod(
                    "Running",
                    json!([
                        cs("main", running.clone(), 0, "sha256:1"),
                        cs("side", running.clone(), 1, "sha256:2")
                    ]),
                    json!({}),
                ),
                Running,
                None,
                None,
                None,
                1,
            ),
            (
                "crash loop",
                member_pod(
                    "Running",
                    json!([
                        cs(
                            "main",
                            waiting("CrashLoopBackOff", "back-off 10s"),
                            3,
                            "sha256:1"
                        ),
                        cs("side", running.clone(), 0, "sha256:2")
                    ]),
                    json!({}),
                ),
                Running,
                Some(REASON_BACKOFF),
                Some("back-off 10s"),
                None,
                3,
            ),
            (
                "succeeded",
                member_pod(
                    "Succeeded",
                    json!([cs("main", terminated(0, "Completed"), 0, "sha256:1")]),
                    json!({}),
                ),
                Succeeded,
                Some("Completed"),
                None,
                Some(0),
                0,
            ),
            (
                "failed: the main container's code",
                member_pod(
                    "Failed",
                    json!([
                        cs("side", terminated(0, "Completed"), 0, "sha256:2"),
                        cs("main", terminated(3, "Error"), 0, "sha256:1")
                    ]),
                    json!({}),
                ),
                Failed,
                Some("Error"),
                None,
                Some(3),
                0,
            ),
            (
                "oom",
                member_pod(
                    "Failed",
                    json!([cs("main", terminated(137, "OOMKilled"), 0, "sha256:1")]),
                    json!({}),
                ),
                Failed,
                Some("OOMKilled"),
                None,
                Some(137),
                0,
            ),
            (
                "deadline",
                member_pod(
                    "Failed",
                    json!([cs("main", terminated(143, "Error"), 0, "sha256:1")]),
                    json!({"reason": "DeadlineExceeded", "message": "Pod was active too long"}),
                ),
                Failed,
                Some("DeadlineExceeded"),
                Some("Pod was active too long"),
                Some(143),
                0,
            ),
            (
                "evicted, no container status",
                member_pod(
                    "Failed",
                    json!([]),
                    json!({"reason": "Evicted", "message": "low on memory"}),
                ),
                Failed,
                Some("Evicted"),
                Some("low on memory"),
                None,
                0,
            ),
            (
                "unknown",
                member_pod("Unknown", json!([]), json!({})),
                Pending,
                None,
                None,
                None,
                0,
            ),
        ];
        for (name, pod, phase, reason, message, exit_code, restarts) in cases {
            let s = pod_status(&pod);
            assert_eq!(s.phase, Some(phase), "{name}");
            assert_eq!(s.reason.as_deref(), reason, "{name}");
            assert_eq!(
                s.message.as_deref().filter(|m| !m.is_empty()),
                message,
                "{name}"
            );
            assert_eq!(s.exit_code, exit_code, "{name}");
            assert_eq!(s.restart_count, Some(restarts), "{name}");
            assert_eq!(s.node.as_deref(), Some("gpu-1"), "{name}");
            assert_eq!(s.ip.as_deref(), Some("10.1.0.7"), "{name}");
            let finished = matches!(phase, Succeeded | Failed) && exit_code.is_some();
            assert_eq!(s.finish_time.is_some(), finished, "{name}");
        }
    }

    #[test]
    fn image_pulls_while_pending() {
        let pod = member_pod(
            "Pending",
            json!([
                cs(
                    "main",
                    json!({"waiting": {"reason": "ImagePullBackOff",
                                              "message": "Back-off pulling image"}}),
                    0,
                    ""
                ),
                cs(
                    "side",
                    json!({"waiting": {"reason": "ContainerCreating"}}),
                    0,
                    "sha256:2"
                ),
            ]),
            json!({}),
        );
        let pulls: Vec<(String, String, Option<String>)> = pull_progress(&pod)
            .into_iter()
            .map(|p| (p.image, p.status, p.message))
            .collect();
        assert_eq!(
            pulls,
            [
                (
                    "rlinf/rlinf:latest".to_string(),
                    "BackOff".to_string(),
                    Some("Back-off pulling image".to_string())
                ),
                ("busybox".to_string(), "Done".to_string(), None),
            ]
        );
        let fresh = member_pod("Pending", json!([]), json!({}));
        let states: Vec<String> = pull_progress(&fresh)
            .into_iter()
            .map(|p| p.status)
            .collect();
        assert_eq!(states, ["Pulling", "Pulling"]);
        let running = member_pod("Running", json!([]), json!({}));
        assert!(pull_progress(&running).is_empty(), "only while Pending");
    }
}
