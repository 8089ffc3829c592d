//! Core `v1` Pods as the read-only view of rlark's replicas (`replicas.rs`).

use http::{Method, StatusCode};
use serde_json::json;

use super::*;
use crate::patch::MERGE_PATCH;

const RLPODS: &str = "/apis/rlinf.io/v1alpha1/namespaces/rlark-a/pods";
const PODS: &str = "/api/v1/namespaces/rlark-a/pods";
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

/// A server with namespace `rlark-a` and replica `name` there (its status as given).
async fn with_replica(h: &Harness, name: &str, status: serde_json::Value) {
    if !h.exists("/api/v1/namespaces/rlark-a").await {
        h.create("/api/v1/namespaces", &namespace("rlark-a")).await;
    }
    h.create(
        RLPODS,
        &json!({"apiVersion": "rlinf.io/v1alpha1", "kind": "Pod",
                "metadata": {"name": name, "labels": {"rlark.io/task-name": "train"}},
                "spec": {"taskName": "train", "replicaIndex": 0}}),
    )
    .await;
    let patched = h
        .patch(
            &format!("{RLPODS}/{name}/status"),
            MERGE_PATCH,
            &json!({ "status": status }),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{}", patched.body);
}

#[tokio::test]
async fn replicas_read_as_core_pods() {
    let h = Harness::new().await;
    with_replica(
        &h,
        "train-0",
        json!({"phase": "Running", "node": "n1", "ip": "10.1.0.2", "restartCount": 1}),
    )
    .await;
    with_replica(&h, "train-1", json!({"phase": "Failed", "exitCode": 7})).await;

    let one = h.get(&format!("{PODS}/train-0")).await;
    assert_eq!(one.status, StatusCode::OK, "{}", one.body);
    assert_eq!(
        (&one.body["apiVersion"], &one.body["kind"]),
        (&json!("v1"), &json!("Pod"))
    );
    assert_eq!(one.body["metadata"]["namespace"], "rlark-a");
    assert!(one.body["metadata"]["uid"].is_string());
    assert_eq!(one.body["spec"]["nodeName"], "n1");
    assert_eq!(one.body["status"]["podIP"], "10.1.0.2");
    assert_eq!(
        one.body["status"]["containerStatuses"][0]["restartCount"],
        1
    );
    let failed = h.get(&format!("{PODS}/train-1")).await;
    assert_eq!(
        failed.body["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
        7
    );
    let missing = h.get(&format!("{PODS}/nope")).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.message(), "pods \"nope\" not found");

    // Across namespaces, and with kube-apiserver's Pod field and label selectors.
    let all = h.get("/api/v1/pods").await;
    assert_eq!(all.body["kind"], "PodList");
    assert_eq!(all.body["apiVersion"], "v1");
    let names: Vec<&str> = all.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["train-0", "train-1"]);
    assert!(
        all.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["kind"] == "Pod" && p["apiVersion"] == "v1")
    );
    for (query, expected) in [
        ("fieldSelector=status.phase%3DRunning", vec!["train-0"]),
        ("fieldSelector=spec.nodeName%3Dn1", vec!["train-0"]),
        ("fieldSelector=status.phase%3DSucceeded", vec![]),
        (
            "labelSelector=rlark.io%2Ftask-name%3Dtrain",
            vec!["train-0", "train-1"],
        ),
    ] {
        let listed = h.get(&format!("/api/v1/pods?{query}")).await;
        assert_eq!(listed.status, StatusCode::OK, "{query}: {}", listed.body);
        let names: Vec<&str> = listed.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, expected, "{query}");
    }

    // `kubectl get pods`: a Table with the Pod columns.
    let table = Harness::answer(
        h.send(Method::GET, PODS, "", Some(TABLE), Default::default())
            .await,
    )
    .await;
    assert_eq!(table.body["kind"], "Table");
    let columns: Vec<&str> = table.body["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        ["Name", "Status", "Restarts", "Age", "IP", "Node", "Task"]
    );
    assert_eq!(
        table.body["rows"][0]["cells"].as_array().unwrap()[..3],
        [json!("train-0"), json!("Running"), json!(1)]
    );

    // rlark's own kind is still served as stored.
    let own = h.get(&format!("{RLPODS}/train-0")).await;
    assert_eq!(own.body["apiVersion"], "rlinf.io/v1alpha1");
    assert_eq!(own.body["status"]["node"], "n1");
}

#[tokio::test]
async fn watching_core_pods_shows_replica_changes() {
    let h = Harness::new().await;
    with_replica(&h, "train-0", json!({"phase": "Pending"})).await;
    let (status, mut events) = h
        .watch(
            &format!("{PODS}?watch=true&timeoutSeconds=2&fieldSelector=status.phase%3DRunning"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    h.patch(
        &format!("{RLPODS}/train-0/status"),
        MERGE_PATCH,
        &json!({"status": {"phase": "Running", "node": "n2"}}),
    )
    .await;
    // The field selector reads the projected object: the Pod enters the selection.
    let event = events.next().await.expect("an event");
    assert_eq!(event["type"], "ADDED");
    assert_eq!(event["object"]["kind"], "Pod");
    assert_eq!(event["object"]["apiVersion"], "v1");
    assert_eq!(event["object"]["spec"]["nodeName"], "n2");
    assert_eq!(
        event["object"]["status"]["containerStatuses"][0]["state"]["running"],
        json!({})
    );
}

#[tokio::test]
async fn core_pods_are_read_only() {
    let h = Harness::new().await;
    with_replica(&h, "train-0", json!({"phase": "Running"})).await;
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
                     "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    let object = format!("{PODS}/train-0");
    for answer in [
        h.post(PODS, &pod).await,
        h.put(&object, &pod).await,
        h.patch(
            &object,
            MERGE_PATCH,
            &json!({"metadata": {"labels": {"a": "b"}}}),
        )
        .await,
        h.delete(&object).await,
        h.call(Method::DELETE, PODS, None).await,
    ] {
        assert_eq!(
            answer.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{}",
            answer.body
        );
        assert_eq!(answer.reason(), "MethodNotAllowed");
        assert_eq!(
            answer.message(),
            "pods are read-only: a core Pod here is a view of an rlark replica \
             (pods.rlinf.io); replicas are created and removed through Tasks and Jobs"
        );
    }
    // Nothing changed.
    let own = h.get(&format!("{RLPODS}/train-0")).await;
    assert_eq!(own.status, StatusCode::OK);
    assert!(
        own.body["metadata"]
            .get("labels")
            .is_some_and(|l| l.get("a").is_none())
    );
}
