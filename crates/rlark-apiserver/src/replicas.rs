//! Core `v1` Pods as a read-only projection of rlark's replicas (`pods.rlinf.io`), so that
//! the kubectl verbs that only know core Pods (`kubectl logs`, `kubectl exec`) work on
//! replicas.
//!
//! Every `/api/v1/.../pods` read (get, list, watch; namespaced and across namespaces; label
//! and field selectors; Table output) reads the stored rlark Pods and shows each through
//! [`project`]; every write is a 405 `MethodNotAllowed`, since replicas are created and
//! removed by the agents running Tasks. Both kinds are served: kubectl resolves `pods` (and
//! `po`) to the core kind, since the core group comes first in discovery, and
//! `pods.rlinf.io` (short name `rlpod`) to rlark's own.
//!
//! The `log`, `exec` and `portforward` subresources are not served by this router: the
//! server process (`rlark-server`) routes `/api/v1/namespaces/{ns}/pods/{pod}/log` and
//! `.../exec` to the agent of the replica through its tunnel, as it does for `rlark logs`
//! and `rlark exec`. A server given a core Pod kind of its own as an extra kind
//! ([`ApiServerOptions::extra_kinds`](crate::ApiServerOptions::extra_kinds), as the test
//! kit's simulated member cluster does) serves that instead of the projection.

use serde_json::{Map, Value, json};

use crate::registry::{PrinterColumn, Projection, ResourceType, column, object_schema};

/// Store resource of rlark's replicas.
pub const SOURCE: &str = "pods.rlinf.io";

/// Name of the one container a projected Pod lists: the replica's main process (or, for a
/// docker replica, its main container). `kubectl logs` and `kubectl exec` send it as
/// `container=main`; the server's core routes read it as "the main one".
pub const MAIN_CONTAINER: &str = "main";

/// The core `v1` Pod kind over rlark's replicas.
pub fn core_pods() -> ResourceType {
    ResourceType {
        group: String::new(),
        version: "v1".into(),
        kind: "Pod".into(),
        list_kind: "PodList".into(),
        plural: "pods".into(),
        singular: "pod".into(),
        short_names: vec!["po".into()],
        categories: vec!["all".into()],
        namespaced: true,
        status_subresource: false,
        printer_columns: printer_columns(),
        // kube-apiserver's Pod field selectors that kubectl users reach for.
        selectable_fields: vec!["spec.nodeName".into(), "status.phase".into()],
        schema: object_schema(
            "Pod: a replica of an rlark Task, shown as a core Pod (read-only).",
            json!({
                "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
            }),
        ),
        strategic_merge_patch: true,
        log_subresource: false,
        scale_subresource: false,
        validator: None,
        prepare: None,
        initial_status: None,
        projection: Some(Projection {
            source: SOURCE,
            project,
            read_only_because: "a core Pod here is a view of an rlark replica (pods.rlinf.io); \
                replicas are created and removed through Tasks and Jobs",
        }),
    }
}

fn printer_columns() -> Vec<PrinterColumn> {
    let wide = |mut c: PrinterColumn| {
        c.priority = 1;
        c
    };
    vec![
        column("Status", "string", ".status.phase"),
        column(
            "Restarts",
            "integer",
            ".status.containerStatuses[0].restartCount",
        ),
        column("Age", "date", ".metadata.creationTimestamp"),
        wide(column("IP", "string", ".status.podIP")),
        wide(column("Node", "string", ".spec.nodeName")),
        wide(column(
            "Task",
            "string",
            ".metadata.labels.rlark\\.io/task-name",
        )),
    ]
}

/// The core Pod view of a stored rlark Pod: metadata as stored (name, namespace, uid,
/// resourceVersion, creationTimestamp, labels, annotations, ownerReferences, deletion),
/// `spec.nodeName` and one container [`MAIN_CONTAINER`], and a status mapped from the
/// replica's (phase, podIP, times, reason, message, the container's restart count and
/// state with its exit code).
pub fn project(object: &Value) -> Value {
    let status = object.get("status").cloned().unwrap_or(Value::Null);
    let text = |field: &str| status.get(field).and_then(Value::as_str);
    let phase = text("phase").unwrap_or("Pending");
    let node = text("node");
    let started = text("startTime");
    let finished = text("finishTime");
    let exit_code = status.get("exitCode").and_then(Value::as_i64);
    let restarts = status
        .get("restartCount")
        .and_then(Value::as_i64)
        .unwrap_or(0);

    let mut metadata = Map::new();
    if let Some(Value::Object(stored)) = object.get("metadata") {
        for field in [
            "name",
            "namespace",
            "uid",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "deletionTimestamp",
            "labels",
            "annotations",
            "ownerReferences",
        ] {
            if let Some(value) = stored.get(field) {
                metadata.insert(field.to_string(), value.clone());
            }
        }
    }

    let mut spec = json!({
        "containers": [{"name": MAIN_CONTAINER, "image": ""}],
        "restartPolicy": "Never",
    });
    if let Some(node) = node {
        spec["nodeName"] = json!(node);
    }

    let state = match phase {
        "Running" => {
            let mut running = json!({});
            if let Some(at) = started {
                running["startedAt"] = json!(at);
            }
            json!({"running": running})
        }
        "Succeeded" | "Failed" => {
            let default_code = i64::from(phase == "Failed");
            let mut terminated = json!({
                "exitCode": exit_code.unwrap_or(default_code),
                "reason": text("reason").unwrap_or(if phase == "Succeeded" { "Completed" } else { "Error" }),
            });
            if let Some(message) = text("message") {
                terminated["message"] = json!(message);
            }
            if let Some(at) = started {
                terminated["startedAt"] = json!(at);
            }
            if let Some(at) = finished {
                terminated["finishedAt"] = json!(at);
            }
            json!({"terminated": terminated})
        }
        _ => json!({"waiting": {"reason": text("reason").unwrap_or("ContainerCreating")}}),
    };
    let running = phase == "Running";
    let mut core_status = json!({
        "phase": phase,
        "containerStatuses": [{
            "name": MAIN_CONTAINER,
            "image": "",
            "imageID": "",
            "ready": running,
            "started": running,
            "restartCount": restarts,
            "state": state,
        }],
    });
    for (from, to) in [
        ("reason", "reason"),
        ("message", "message"),
        ("startTime", "startTime"),
    ] {
        if let Some(value) = text(from) {
            core_status[to] = json!(value);
        }
    }
    if let Some(ip) = text("ip") {
        core_status["podIP"] = json!(ip);
        core_status["podIPs"] = json!([{"ip": ip}]);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
        "status": core_status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_replica_is_a_running_pod() {
        let stored = json!({
            "apiVersion": "rlinf.io/v1alpha1", "kind": "Pod",
            "metadata": {"name": "train-0", "namespace": "rlark-a", "uid": "u1",
                         "resourceVersion": "7", "creationTimestamp": "2026-12-01T10:00:00Z",
                         "labels": {"rlark.io/task-name": "train"}, "managedFields": []},
            "spec": {"taskName": "train", "replicaIndex": 0},
            "status": {"phase": "Running", "node": "n1", "ip": "10.0.0.5", "restartCount": 2,
                       "startTime": "2026-12-01T10:00:01Z"}
        });
        let pod = project(&stored);
        assert_eq!(pod["apiVersion"], "v1");
        assert_eq!(pod["kind"], "Pod");
        assert_eq!(
            pod["metadata"],
            json!({"name": "train-0", "namespace": "rlark-a", "uid": "u1", "resourceVersion": "7",
                   "creationTimestamp": "2026-12-01T10:00:00Z",
                   "labels": {"rlark.io/task-name": "train"}})
        );
        assert_eq!(pod["spec"]["nodeName"], "n1");
        assert_eq!(pod["spec"]["containers"][0]["name"], "main");
        assert_eq!(pod["status"]["phase"], "Running");
        assert_eq!(pod["status"]["podIP"], "10.0.0.5");
        let container = &pod["status"]["containerStatuses"][0];
        assert_eq!(container["restartCount"], 2);
        assert_eq!(container["ready"], true);
        assert_eq!(
            container["state"],
            json!({"running": {"startedAt": "2026-12-01T10:00:01Z"}})
        );
    }

    #[test]
    fn finished_and_pending_replicas_keep_exit_code_and_reason() {
        let failed = project(&json!({
            "metadata": {"name": "t-0"},
            "status": {"phase": "Failed", "exitCode": 3, "reason": "Exited", "message": "boom",
                       "finishTime": "2026-12-01T10:01:00Z"}
        }));
        assert_eq!(
            failed["status"]["containerStatuses"][0]["state"],
            json!({"terminated": {"exitCode": 3, "reason": "Exited", "message": "boom",
                                  "finishedAt": "2026-12-01T10:01:00Z"}})
        );
        assert!(failed["spec"].get("nodeName").is_none());
        let succeeded = project(&json!({"status": {"phase": "Succeeded"}}));
        assert_eq!(
            succeeded["status"]["containerStatuses"][0]["state"]["terminated"],
            json!({"exitCode": 0, "reason": "Completed"})
        );
        // No status yet: a Pending Pod whose container is being created.
        let new = project(&json!({"metadata": {"name": "t-1"}}));
        assert_eq!(new["status"]["phase"], "Pending");
        assert_eq!(
            new["status"]["containerStatuses"][0]["state"],
            json!({"waiting": {"reason": "ContainerCreating"}})
        );
    }
}
