//! The Pods the simulated agent writes: one per replica, named and annotated as the real
//! agent's, with the statuses of a replica that started, ended or was stopped.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use rlark_api::labels;
use rlark_api::types::{Pod, PodSpec, Task};
use serde_json::json;

/// Pod annotation: the run the Pod belongs to (see [`run_key`]); lets a restarted simulated
/// agent adopt its own Pods instead of running a finished replica again.
pub const RUN_KEY_ANNOTATION: &str = "sim.rlark.io/run-key";
/// Pod annotation: UID of the Task the Pod runs.
pub const TASK_UID_ANNOTATION: &str = "rlark.io/task-uid";
/// Reason of a Pod ended by `spec.stopped`.
pub const STOPPED_REASON: &str = "Stopped";
/// Exit code of a Pod ended by `spec.stopped` (128 + SIGTERM).
pub const STOPPED_EXIT_CODE: i32 = 143;

/// Identity of one run of a Task on `cluster_id`: UID, restart annotation and placement.
/// `None` when the Task is not placed on this cluster (or is being deleted).
pub fn run_key(task: &Task, cluster_id: &str) -> Option<String> {
    if task.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let placement = task.spec.placement.as_ref()?;
    if placement.cluster_id != cluster_id || placement.nodes.is_empty() {
        return None;
    }
    let uid = task.metadata.uid.as_deref().unwrap_or_default();
    let restarted = task
        .annotations()
        .get(labels::RESTARTED_AT)
        .map(String::as_str)
        .unwrap_or_default();
    Some(format!("{uid}/{restarted}/{}", placement.nodes.join(",")))
}

/// Name of replica `index` of `task_name`.
pub fn pod_name(task_name: &str, index: usize) -> String {
    format!("{task_name}-{index}")
}

/// The Pod object for replica `index` of `task` (no status; see [`running_status`]).
pub fn replica_pod(task: &Task, index: usize, run_key: &str) -> Pod {
    let name = task.name_any();
    let mut pod = Pod::new(
        &pod_name(&name, index),
        PodSpec {
            domain: task.spec.domain.clone(),
            task_namespace: task.namespace(),
            task_name: Some(name.clone()),
            pod_namespace: task.namespace(),
            pod_name: Some(pod_name(&name, index)),
            replica_index: Some(i32::try_from(index).unwrap_or(i32::MAX)),
        },
    );
    pod.metadata = ObjectMeta {
        name: Some(pod_name(&name, index)),
        namespace: task.namespace(),
        labels: Some(BTreeMap::from([(labels::TASK_NAME.to_string(), name)])),
        annotations: Some(BTreeMap::from([
            (RUN_KEY_ANNOTATION.to_string(), run_key.to_string()),
            (
                TASK_UID_ANNOTATION.to_string(),
                task.metadata.uid.clone().unwrap_or_default(),
            ),
        ])),
        ..Default::default()
    };
    pod
}

/// The status value of a replica that started on `node` at `now`.
pub fn running_status(node: &str, now: Timestamp) -> serde_json::Value {
    json!({
        "phase": "Running",
        "node": node,
        "startTime": Time(now),
        "restartCount": 0,
    })
}

/// The status value of a replica ended by `spec.stopped`.
pub fn stopped_status(now: Timestamp) -> serde_json::Value {
    json!({
        "phase": "Failed",
        "reason": STOPPED_REASON,
        "exitCode": STOPPED_EXIT_CODE,
        "message": "stopped on request (SIGTERM)",
        "finishTime": Time(now),
    })
}

pub(super) fn pod_is_terminal(pod: &Pod) -> bool {
    use rlark_api::types::PodPhase;
    matches!(
        pod.status.as_ref().and_then(|s| s.phase),
        Some(PodPhase::Succeeded | PodPhase::Failed)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::runs::placeholder_spec;
    use rlark_api::types::TaskPlacement;

    fn task(name: &str, uid: &str, placement: Option<(&str, &[&str])>) -> Task {
        let mut task = Task::new(name, placeholder_spec());
        task.metadata.namespace = Some("rlark-a".into());
        task.metadata.uid = Some(uid.into());
        task.spec.placement = placement.map(|(c, nodes)| TaskPlacement {
            cluster_id: c.into(),
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
        });
        task
    }

    #[test]
    fn run_key_changes_with_uid_restart_and_placement() {
        let t = task("j-a", "u1", Some(("a", &["n1", "n2"])));
        let k1 = run_key(&t, "a").expect("placed here");
        assert_eq!(run_key(&t, "b"), None, "placed on another cluster");
        assert_eq!(run_key(&task("j-a", "u1", None), "a"), None, "not placed");
        assert_ne!(
            run_key(&task("j-a", "u2", Some(("a", &["n1", "n2"]))), "a"),
            Some(k1.clone())
        );
        assert_ne!(
            run_key(&task("j-a", "u1", Some(("a", &["n2", "n1"]))), "a"),
            Some(k1.clone())
        );
        let mut restarted = t.clone();
        restarted
            .annotations_mut()
            .insert(labels::RESTARTED_AT.into(), "2025-01-01T00:00:00Z".into());
        assert_ne!(run_key(&restarted, "a"), Some(k1.clone()));
        let mut deleting = t.clone();
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert_eq!(run_key(&deleting, "a"), None);
        // Status and stop do not change the run.
        let mut stopped = t.clone();
        stopped.spec.stopped = true;
        assert_eq!(run_key(&stopped, "a"), Some(k1));
    }

    #[test]
    fn replica_pods_follow_the_protocol() {
        let mut t = task("j-a", "u1", Some(("a", &["n1", "n2"])));
        t.spec.domain = Some("d".into());
        let pod = replica_pod(&t, 1, "key");
        assert_eq!(pod.name_any(), "j-a-1");
        assert_eq!(pod.namespace().as_deref(), Some("rlark-a"));
        assert_eq!(pod.labels()[labels::TASK_NAME], "j-a");
        assert_eq!(pod.annotations()[RUN_KEY_ANNOTATION], "key");
        assert_eq!(pod.annotations()[TASK_UID_ANNOTATION], "u1");
        assert_eq!(pod.spec.task_name.as_deref(), Some("j-a"));
        assert_eq!(pod.spec.task_namespace.as_deref(), Some("rlark-a"));
        assert_eq!(pod.spec.replica_index, Some(1));
        assert_eq!(pod.spec.domain.as_deref(), Some("d"));
        let running = running_status("n2", Timestamp::UNIX_EPOCH);
        assert_eq!(running["phase"], "Running");
        assert_eq!(running["node"], "n2");
        assert!(running["startTime"].is_string());
    }

    #[test]
    fn stopped_status_says_stopped() {
        let now = Timestamp::UNIX_EPOCH;
        let stopped = stopped_status(now);
        assert_eq!(stopped["reason"], STOPPED_REASON);
        assert_eq!(stopped["exitCode"], STOPPED_EXIT_CODE);
    }
}
