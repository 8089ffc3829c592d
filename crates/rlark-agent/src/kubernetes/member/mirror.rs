//! Pure: what the control plane sees of a member cluster's Pods. A member Pod of a
//! Task's workload becomes an rlark Pod of the same name in the agent namespace (status
//! from [`crate::kubernetes::status::pod_status`]); a Task that cannot run on the member
//! cluster at all (its objects refused, its template invalid, its workload failed without
//! a failed Pod, another agentType) gets one `Failed` "failure Pod" saying why, so the
//! Task controller fails the Task as it fails one with a failed raw replica.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Event, Pod as MemberPod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use rlark_api::agent::{RUN_KEY_ANNOTATION, TASK_UID_ANNOTATION};
use rlark_api::labels;
use rlark_api::types::{Pod, PodPhase, PodSpec, PodStatus, Task};
use serde_json::{Map, Value};

use crate::kubernetes::{names, pulls, status};

/// Annotation of a mirrored rlark Pod: `<member namespace>/<member pod name>` (the logs
/// and exec of the Pod go there).
pub const MEMBER_POD_ANNOTATION: &str = "rlark.io/member-pod";
/// Annotation of a failure Pod: the reason the Task cannot run on the member cluster.
pub const MEMBER_FAILURE_ANNOTATION: &str = "rlark.io/member-failure";
/// Label a StatefulSet's Pods carry with their ordinal (Kubernetes 1.28+).
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
/// Annotation an Indexed Job's Pods carry with their completion index.
pub const COMPLETION_INDEX_ANNOTATION: &str = "batch.kubernetes.io/job-completion-index";

/// The member objects were refused (a 422/400/413 from the member API).
pub const REASON_FAILED_CREATE: &str = "FailedCreate";
/// The Task's workload or template gives no valid object.
pub const REASON_INVALID_WORKLOAD: &str = "InvalidWorkload";
/// The workload failed (its status says so) without a failed Pod to show it.
pub const REASON_WORKLOAD_FAILED: &str = "WorkloadFailed";

/// The replica index of member Pod `pod`: the StatefulSet ordinal (label
/// [`POD_INDEX_LABEL`], else the `-<n>` suffix of a StatefulSet-owned Pod's name), an
/// Indexed Job's completion index; `None` for Deployment and DaemonSet Pods (the Task
/// controller then counts each Pod as its own replica).
pub fn replica_index(pod: &MemberPod) -> Option<i32> {
    if let Some(i) = pod
        .labels()
        .get(POD_INDEX_LABEL)
        .and_then(|v| v.parse().ok())
    {
        return Some(i);
    }
    if let Some(i) = pod
        .annotations()
        .get(COMPLETION_INDEX_ANNOTATION)
        .and_then(|v| v.parse().ok())
    {
        return Some(i);
    }
    let owned_by_sts = pod
        .owner_references()
        .iter()
        .any(|o| o.kind == "StatefulSet" && o.controller == Some(true));
    if owned_by_sts {
        let name = pod.name_any();
        return name.rsplit_once('-').and_then(|(_, n)| n.parse().ok());
    }
    None
}

fn identity(task: &Task, run_key: &str, name: String, extra: (&str, String)) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: task.namespace(),
        labels: Some(BTreeMap::from([(
            labels::TASK_NAME.to_string(),
            task.name_any(),
        )])),
        annotations: Some(BTreeMap::from([
            (
                TASK_UID_ANNOTATION.to_string(),
                task.uid().unwrap_or_default(),
            ),
            (RUN_KEY_ANNOTATION.to_string(), run_key.to_string()),
            (extra.0.to_string(), extra.1),
        ])),
        ..Default::default()
    }
}

/// The rlark Pod mirroring member Pod `member` of `task`'s run `run_key`: same name, in
/// the Task's namespace, label `rlark.io/task-name`, annotations task UID, run key and
/// [`MEMBER_POD_ANNOTATION`]; spec naming the Task, the member Pod and its replica index;
/// status from [`status::pod_status`] (its `node` is the member Pod's `spec.nodeName`),
/// its image pulls completed by `pull_events`, the member Pod's `Pulling`/`Pulled` Events
/// ([`pulls::with_events`]).
pub fn mirrored_pod(member: &MemberPod, task: &Task, run_key: &str, pull_events: &[&Event]) -> Pod {
    let member_ns = member.namespace().unwrap_or_default();
    let name = member.name_any();
    let metadata = identity(
        task,
        run_key,
        name.clone(),
        (MEMBER_POD_ANNOTATION, format!("{member_ns}/{name}")),
    );
    let spec = PodSpec {
        domain: None,
        task_namespace: task.namespace(),
        task_name: Some(task.name_any()),
        pod_namespace: Some(member_ns),
        pod_name: Some(name),
        replica_index: replica_index(member),
    };
    let mut status = status::pod_status(member);
    if !status.pull_progress.is_empty() {
        status.pull_progress = pulls::with_events(status.pull_progress, pull_events);
    }
    Pod {
        metadata,
        spec,
        status: Some(status),
    }
}

/// Name of `task`'s failure Pod: `<task>-workload`, as a DNS-1123 label (no member Pod
/// is named so: workload Pods end in an ordinal or a generated suffix).
pub fn failure_pod_name(task: &str) -> String {
    names::dns_label(&format!("{task}-workload"), 63)
}

/// The failure Pod of `task`'s run `run_key`: replica 0, `Failed` with `reason` and
/// `message`, finished `now`.
pub fn failure_pod(task: &Task, run_key: &str, reason: &str, message: &str, now: Timestamp) -> Pod {
    let name = failure_pod_name(&task.name_any());
    let metadata = identity(
        task,
        run_key,
        name.clone(),
        (MEMBER_FAILURE_ANNOTATION, reason.to_string()),
    );
    let spec = PodSpec {
        domain: None,
        task_namespace: task.namespace(),
        task_name: Some(task.name_any()),
        pod_namespace: None,
        pod_name: Some(name),
        replica_index: Some(0),
    };
    Pod {
        metadata,
        spec,
        status: Some(PodStatus {
            phase: Some(PodPhase::Failed),
            reason: Some(reason.to_string()),
            message: Some(message.to_string()),
            restart_count: Some(0),
            finish_time: Some(Time(now)),
            ..Default::default()
        }),
    }
}

/// The merge patch of a Pod's `status` that turns `current` into `desired` (fields
/// `desired` lacks are removed); `None` when they are equal. Times already reported are
/// kept (a failure Pod's `finishTime` is the first report's).
pub fn status_patch(current: Option<&PodStatus>, desired: &PodStatus) -> Option<Value> {
    let mut desired = desired.clone();
    if let Some(current) = current {
        if desired.finish_time.is_some() && current.finish_time.is_some() {
            desired.finish_time = current.finish_time.clone();
        }
        if *current == desired {
            return None;
        }
    }
    let old = current
        .map(|c| serde_json::to_value(c).unwrap_or(Value::Null))
        .unwrap_or(Value::Null);
    let mut new = match serde_json::to_value(&desired) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    };
    if let Value::Object(old) = old {
        for key in old.keys() {
            if !new.contains_key(key) {
                new.insert(key.clone(), Value::Null);
            }
        }
    }
    Some(Value::Object(new))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes::workload::testing::task;
    use serde_json::json;

    fn member(value: Value) -> MemberPod {
        serde_json::from_value(value).expect("member pod")
    }

    #[test]
    fn replica_index_from_statefulset_job_or_none() {
        let cases = [
            (
                json!({"metadata": {"name": "a-3", "labels": {"apps.kubernetes.io/pod-index": "3"}}}),
                Some(3),
            ),
            (
                json!({"metadata": {"name": "a-2", "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "a", "uid": "u", "controller": true}]}}),
                Some(2),
            ),
            (
                json!({"metadata": {"name": "j-x7k2p", "annotations": {"batch.kubernetes.io/job-completion-index": "1"}}}),
                Some(1),
            ),
            (
                json!({"metadata": {"name": "d-5d9f-abcde", "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "d-5d9f", "uid": "u", "controller": true}]}}),
                None,
            ),
            (json!({"metadata": {"name": "j-x7k2p"}}), None),
        ];
        for (pod, want) in cases {
            assert_eq!(replica_index(&member(pod.clone())), want, "{pod}");
        }
    }

    #[test]
    fn mirrored_pod_names_the_member_pod_and_its_node() {
        let t = task("train", 1);
        let pod = member(json!({
            "metadata": {"name": "train-0", "namespace": "w",
                "labels": {"apps.kubernetes.io/pod-index": "0"}},
            "spec": {"nodeName": "gpu-0", "containers": [{"name": "main", "image": "x"}]},
            "status": {"phase": "Failed", "containerStatuses": [{"name": "main", "image": "x",
                "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 3, "reason": "Error"}}}]}
        }));
        let mirrored = mirrored_pod(&pod, &t, "run-1", &[]);
        assert_eq!(mirrored.name_any(), "train-0");
        assert_eq!(mirrored.namespace(), t.namespace());
        assert_eq!(mirrored.annotations()[MEMBER_POD_ANNOTATION], "w/train-0");
        assert_eq!(mirrored.annotations()[RUN_KEY_ANNOTATION], "run-1");
        assert_eq!(mirrored.labels()[labels::TASK_NAME], "train");
        assert_eq!(mirrored.spec.replica_index, Some(0));
        assert_eq!(mirrored.spec.task_name.as_deref(), Some("train"));
        let status = mirrored.status.expect("status");
        assert_eq!(status.phase, Some(PodPhase::Failed));
        assert_eq!(status.exit_code, Some(3));
        assert_eq!(status.node.as_deref(), Some("gpu-0"));
    }

    #[test]
    fn failure_pod_fails_replica_zero() {
        let t = task("bad", 2);
        let now = Timestamp::from_second(100).expect("time");
        let pod = failure_pod(&t, "k", REASON_FAILED_CREATE, "refused", now);
        assert_eq!(pod.name_any(), "bad-workload");
        assert_eq!(pod.spec.replica_index, Some(0));
        assert_eq!(
            pod.annotations()[MEMBER_FAILURE_ANNOTATION],
            REASON_FAILED_CREATE
        );
        let status = pod.status.expect("status");
        assert_eq!(status.phase, Some(PodPhase::Failed));
        assert_eq!(status.message.as_deref(), Some("refused"));
        let long = failure_pod_name(&"x".repeat(100));
        assert!(long.len() <= 63, "{long}");
    }

    #[test]
    fn status_patch_removes_gone_fields_and_skips_equal() {
        let running = PodStatus {
            phase: Some(PodPhase::Pending),
            reason: Some("ContainerCreating".into()),
            node: Some("n".into()),
            ..Default::default()
        };
        assert_eq!(status_patch(Some(&running), &running), None);
        let next = PodStatus {
            phase: Some(PodPhase::Running),
            node: Some("n".into()),
            ..Default::default()
        };
        let patch = status_patch(Some(&running), &next).expect("a patch");
        assert_eq!(patch["phase"], "Running");
        assert_eq!(patch["reason"], Value::Null);
        let first = status_patch(None, &next).expect("a patch");
        assert_eq!(first["node"], "n");
        // A failure reported again keeps its first finish time: no write.
        let t0 = PodStatus {
            phase: Some(PodPhase::Failed),
            finish_time: Some(Time(Timestamp::from_second(1).expect("t"))),
            ..Default::default()
        };
        let t1 = PodStatus {
            finish_time: Some(Time(Timestamp::from_second(2).expect("t"))),
            ..t0.clone()
        };
        assert_eq!(status_patch(Some(&t0), &t1), None);
    }
}
