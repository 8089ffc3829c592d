//! How the agent protocol names things: Pods, runs, heartbeat Leases.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;

use super::{RUN_KEY_ANNOTATION, TASK_UID_ANNOTATION};
use crate::labels;
use crate::types::{Pod, PodSpec, Task};

/// Prefix of a heartbeat Lease's name: `node-<node>`, in the agent namespace
/// (`rlark-<clusterID>`, [`crate::names::agent_namespace`]).
pub const LEASE_PREFIX: &str = "node-";

/// Name of the Pod of replica `index` of `task_name`: `<task>-<index>`.
pub fn pod_name(task_name: &str, index: usize) -> String {
    format!("{task_name}-{index}")
}

/// Split a Pod name `<task>-<i>` ([`pod_name`]) into the Task name and the replica index.
pub fn parse_pod_name(pod: &str) -> Option<(&str, usize)> {
    let (task, index) = pod.rsplit_once('-')?;
    if task.is_empty() || index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((task, index.parse().ok()?))
}

/// Identity of one run of a Task on `cluster_id`: UID, restart annotation
/// ([`labels::RESTARTED_AT`]) and placement. `None` when the Task is not placed on this
/// cluster, or is being deleted. `spec.stopped` is not part of it: stopping and resuming
/// is the same run.
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
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(labels::RESTARTED_AT))
        .map(String::as_str)
        .unwrap_or_default();
    Some(format!("{uid}/{restarted}/{}", placement.nodes.join(",")))
}

/// Name of the heartbeat Lease of Node `node`: `node-<node>`.
pub fn lease_name(node: &str) -> String {
    format!("{LEASE_PREFIX}{node}")
}

/// The Node a heartbeat Lease is named after (`None` for any other Lease).
pub fn lease_node(lease_name: &str) -> Option<&str> {
    lease_name.strip_prefix(LEASE_PREFIX)
}

/// The spec of `node`'s heartbeat Lease renewed at `now`: `holderIdentity` (the node),
/// `leaseDurationSeconds`, `renewTime`. A Lease created by this renewal also gets
/// `acquireTime` = `renewTime`.
pub fn lease_spec(node: &str, lease_duration_seconds: i32, now: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(node.to_string()),
        lease_duration_seconds: Some(lease_duration_seconds),
        renew_time: Some(MicroTime(now)),
        ..Default::default()
    }
}

/// The Pod of replica `index` of `task` for the run `run_key` (no status): named
/// [`pod_name`] in the Task's namespace, label [`labels::TASK_NAME`], annotations
/// [`TASK_UID_ANNOTATION`] and [`RUN_KEY_ANNOTATION`], spec `taskNamespace`, `taskName`,
/// `podNamespace`, `podName`, `replicaIndex`, `domain`.
pub fn replica_pod(task: &Task, index: usize, run_key: &str) -> Pod {
    let task_name = task.metadata.name.clone().unwrap_or_default();
    let namespace = task.metadata.namespace.clone();
    let name = pod_name(&task_name, index);
    let mut pod = Pod::new(
        &name,
        PodSpec {
            domain: task.spec.domain.clone(),
            task_namespace: namespace.clone(),
            task_name: Some(task_name.clone()),
            pod_namespace: namespace.clone(),
            pod_name: Some(name.clone()),
            replica_index: Some(i32::try_from(index).unwrap_or(i32::MAX)),
        },
    );
    pod.metadata = ObjectMeta {
        name: Some(name),
        namespace,
        labels: Some(BTreeMap::from([(labels::TASK_NAME.to_string(), task_name)])),
        annotations: Some(BTreeMap::from([
            (
                TASK_UID_ANNOTATION.to_string(),
                task.metadata.uid.clone().unwrap_or_default(),
            ),
            (RUN_KEY_ANNOTATION.to_string(), run_key.to_string()),
        ])),
        ..ObjectMeta::default()
    };
    pod
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::TaskPlacement;

    fn task(uid: &str, nodes: &[&str]) -> Task {
        let mut task = Task::new(
            "j-a",
            serde_json::from_value(serde_json::json!({
                "agentType": "Raw",
                "role": "Rollout",
                "raw": {"entrypoint": ["true"], "replicas": nodes.len()},
            }))
            .expect("spec"),
        );
        task.metadata.namespace = Some("rlark-c".into());
        task.metadata.uid = Some(uid.into());
        task.spec.placement = Some(TaskPlacement {
            cluster_id: "c".into(),
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
        });
        task
    }

    #[test]
    fn run_keys_change_with_a_new_run_only() {
        let t = task("u1", &["n1", "n2"]);
        let key = run_key(&t, "c").expect("placed");
        assert_eq!(key, "u1//n1,n2");
        assert_eq!(run_key(&t, "other"), None);
        let mut stopped = t.clone();
        stopped.spec.stopped = true;
        assert_eq!(run_key(&stopped, "c").as_ref(), Some(&key));
        let mut restarted = t.clone();
        restarted.metadata.annotations = Some(BTreeMap::from([(
            labels::RESTARTED_AT.to_string(),
            "2026-01-01T00:00:00Z".to_string(),
        )]));
        assert_ne!(run_key(&restarted, "c").as_ref(), Some(&key));
        assert_ne!(
            run_key(&task("u2", &["n1", "n2"]), "c").as_ref(),
            Some(&key)
        );
        assert_ne!(
            run_key(&task("u1", &["n2", "n1"]), "c").as_ref(),
            Some(&key)
        );
        let mut deleting = t.clone();
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
        );
        assert_eq!(run_key(&deleting, "c"), None);
        assert_eq!(run_key(&task("u1", &[]), "c"), None, "no nodes: not placed");
    }

    #[test]
    fn replica_pods_follow_the_protocol() {
        let t = task("u1", &["n1", "n2"]);
        let pod = replica_pod(&t, 1, "u1//n1,n2");
        assert_eq!(pod.metadata.name.as_deref(), Some("j-a-1"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("rlark-c"));
        let labels = pod.metadata.labels.as_ref().expect("labels");
        assert_eq!(labels[labels::TASK_NAME], "j-a");
        let annotations = pod.metadata.annotations.as_ref().expect("annotations");
        assert_eq!(annotations[TASK_UID_ANNOTATION], "u1");
        assert_eq!(annotations[RUN_KEY_ANNOTATION], "u1//n1,n2");
        assert_eq!(pod.spec.pod_name.as_deref(), Some("j-a-1"));
        assert_eq!(pod.spec.task_name.as_deref(), Some("j-a"));
        assert_eq!(pod.spec.task_namespace.as_deref(), Some("rlark-c"));
        assert_eq!(pod.spec.replica_index, Some(1));
        assert!(pod.status.is_none());
    }

    #[test]
    fn pod_names_split_into_task_and_index() {
        assert_eq!(parse_pod_name("ppo-actor-0"), Some(("ppo-actor", 0)));
        assert_eq!(parse_pod_name("a-12"), Some(("a", 12)));
        for bad in ["a", "a-", "-1", "a-x", "a-+1"] {
            assert_eq!(parse_pod_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn leases_are_named_after_their_node() {
        assert_eq!(lease_name("gpu-0"), "node-gpu-0");
        assert_eq!(lease_node(&lease_name("gpu-0")), Some("gpu-0"));
        assert_eq!(lease_node("leader"), None);
        let spec = lease_spec("gpu-0", 40, Timestamp::UNIX_EPOCH);
        assert_eq!(spec.holder_identity.as_deref(), Some("gpu-0"));
        assert_eq!(spec.lease_duration_seconds, Some(40));
        assert_eq!(spec.renew_time, Some(MicroTime(Timestamp::UNIX_EPOCH)));
        assert_eq!(spec.acquire_time, None);
    }
}
