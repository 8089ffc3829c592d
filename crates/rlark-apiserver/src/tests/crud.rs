//! Create, get, update, patch, delete and the status subresource.

use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::*;
use crate::patch::{JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH};

#[tokio::test]
async fn create_fills_system_fields_and_drops_status() {
    let h = Harness::new().await;
    let mut body = job("ppo");
    body["status"] = json!({"phase": "Running"});
    body["metadata"]["uid"] = json!("client-chosen");
    let created = h.create(JOBS, &body).await;
    assert_eq!(created["kind"], "Job");
    assert_eq!(created["metadata"]["generation"], 1);
    assert_ne!(created["metadata"]["uid"], "client-chosen");
    assert!(created["metadata"]["creationTimestamp"].is_string());
    assert_eq!(
        created["status"],
        json!({"phase": "Pending"}),
        "the body's status is dropped on create; a Job starts Pending: {created}"
    );
    assert_eq!(
        created["metadata"]["resourceVersion"],
        h.revision().to_string()
    );

    let got = h.get(&format!("{JOBS}/ppo")).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.body, created);

    let again = h.post(JOBS, &job("ppo")).await;
    assert_eq!(
        (again.status, again.reason()),
        (StatusCode::CONFLICT, "AlreadyExists")
    );
    assert_eq!(again.message(), "jobs.rlinf.io \"ppo\" already exists");

    let missing = h.get(&format!("{JOBS}/nope")).await;
    assert_eq!(
        (missing.status, missing.reason()),
        (StatusCode::NOT_FOUND, "NotFound")
    );
    assert_eq!(missing.message(), "jobs.rlinf.io \"nope\" not found");
}

#[tokio::test]
async fn namespaced_create_checks_the_namespace() {
    let h = Harness::new().await;
    let created = h.create(&leases("default"), &lease("default", "l1")).await;
    assert_eq!(created["metadata"]["namespace"], "default");
    // Namespace filled from the URL when the body has none.
    let mut body = lease("default", "l2");
    body["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("namespace");
    assert_eq!(
        h.create(&leases("default"), &body).await["metadata"]["namespace"],
        "default"
    );

    let before = h.revision();
    let answer = h.post(&leases("default"), &lease("other", "l3")).await;
    assert_eq!(
        (answer.status, answer.reason()),
        (StatusCode::BAD_REQUEST, "BadRequest")
    );
    assert_eq!(
        answer.message(),
        "the namespace of the provided object does not match the namespace sent on the request"
    );

    let answer = h.post(&leases("ghost"), &lease("ghost", "l3")).await;
    assert_eq!(
        (answer.status, answer.message()),
        (StatusCode::NOT_FOUND, "namespaces \"ghost\" not found")
    );
    assert_eq!(h.revision(), before, "nothing was written");

    // Cluster-wide collection URLs of namespaced kinds only list and watch.
    let answer = h
        .post(
            "/apis/coordination.k8s.io/v1/leases",
            &lease("default", "l4"),
        )
        .await;
    assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED);
    let all = h.get("/apis/coordination.k8s.io/v1/leases").await;
    assert_eq!(all.body["items"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn generate_name_and_dry_run() {
    let h = Harness::new().await;
    let mut body = job("");
    body["metadata"] = json!({"generateName": "run-"});
    let created = h.create(JOBS, &body).await;
    let name = created["metadata"]["name"].as_str().unwrap();
    assert!(name.starts_with("run-") && name.len() == 9, "{name}");

    let before = h.revision();
    let answer = h.post(&format!("{JOBS}?dryRun=All"), &job("dry")).await;
    assert_eq!(answer.status, StatusCode::CREATED);
    assert!(answer.body["metadata"]["uid"].is_string());
    assert_eq!(h.revision(), before);
    assert!(!h.exists(&format!("{JOBS}/dry")).await);
}

#[tokio::test]
async fn namespaces_get_defaults_and_yaml_bodies_work() {
    let h = Harness::new().await;
    let yaml = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: dev\n";
    let response = h
        .send(
            Method::POST,
            NAMESPACES,
            "application/yaml",
            None,
            yaml.into(),
        )
        .await;
    let answer = Harness::answer(response).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    assert_eq!(answer.body["status"], json!({"phase": "Active"}));
    assert_eq!(answer.body["spec"], json!({"finalizers": ["kubernetes"]}));
    assert_eq!(
        answer.body["metadata"]["labels"],
        json!({"kubernetes.io/metadata.name": "dev"})
    );
}

#[tokio::test]
async fn update_semantics() {
    let h = Harness::new().await;
    let created = h.create(JOBS, &job("j")).await;
    let url = format!("{JOBS}/j");

    // Spec change with the current resourceVersion: generation bumps, status ignored.
    let mut body = created.clone();
    body["spec"]["stopped"] = json!(true);
    body["status"] = json!({"phase": "Running"});
    let updated = h.put(&url, &body).await;
    assert_eq!(updated.status, StatusCode::OK, "{}", updated.body);
    assert_eq!(updated.body["spec"]["stopped"], true);
    assert_eq!(updated.body["metadata"]["generation"], 2);
    assert_eq!(
        updated.body["status"],
        json!({"phase": "Pending"}),
        "the stored status"
    );

    // The old resourceVersion is now stale: 409 and nothing written.
    let before = h.revision();
    let stale = h.put(&url, &body).await;
    assert_eq!(
        (stale.status, stale.reason()),
        (StatusCode::CONFLICT, "Conflict")
    );
    assert_eq!(
        stale.message(),
        "Operation cannot be fulfilled on jobs.rlinf.io \"j\": the object has been modified; please apply your changes to the latest version and try again"
    );
    assert_eq!(h.revision(), before);

    // Without a resourceVersion the update is unconditional.
    let mut body = updated.body.clone();
    body["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    body["spec"]["stopped"] = json!(false);
    assert_eq!(h.put(&url, &body).await.status, StatusCode::OK);

    // /status changes only status.
    let mut body = h.get(&url).await.body;
    body["status"] = json!({"phase": "Running"});
    body["spec"]["stopped"] = json!(true);
    body["metadata"]["labels"] = json!({"ignored": "yes"});
    let status = h.put(&format!("{url}/status"), &body).await;
    assert_eq!(status.status, StatusCode::OK, "{}", status.body);
    assert_eq!(status.body["status"]["phase"], "Running");
    assert_eq!(
        status.body["spec"]["stopped"], false,
        "spec unchanged by /status"
    );
    assert!(status.body["metadata"].get("labels").is_none());

    // Immutable and mismatched metadata.
    let mut body = status.body.clone();
    body["metadata"]["uid"] = json!("another");
    let answer = h.put(&url, &body).await;
    assert_eq!(
        (answer.status, answer.causes()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            vec![("metadata.uid".into(), "FieldValueInvalid".into())]
        )
    );
    let mut body = status.body.clone();
    body["metadata"]["name"] = json!("other");
    assert_eq!(h.put(&url, &body).await.status, StatusCode::BAD_REQUEST);
    // PUT does not create.
    assert_eq!(
        h.put(&format!("{JOBS}/nope"), &job("nope")).await.status,
        StatusCode::NOT_FOUND
    );
    // Timestamps are kept whatever the client sends.
    let mut body = status.body.clone();
    body["metadata"]["creationTimestamp"] = json!("2000-01-01T00:00:00Z");
    body["metadata"]["labels"] = json!({"a": "b"});
    let kept = h.put(&url, &body).await;
    assert_eq!(
        kept.body["metadata"]["creationTimestamp"],
        created["metadata"]["creationTimestamp"]
    );
    assert_eq!(
        kept.body["status"]["phase"], "Running",
        "status kept by a main-resource update"
    );
}

#[tokio::test]
async fn patches() {
    let h = Harness::new().await;
    h.create(JOBS, &job("p")).await;
    let url = format!("{JOBS}/p");

    let merged = h
        .patch(
            &url,
            MERGE_PATCH,
            &json!({"metadata": {"labels": {"team": "rl"}}, "spec": {"stopped": true}}),
        )
        .await;
    assert_eq!(merged.status, StatusCode::OK, "{}", merged.body);
    assert_eq!(merged.body["metadata"]["labels"]["team"], "rl");
    assert_eq!(merged.body["spec"]["stopped"], true);

    let patched = h
        .patch(&url, JSON_PATCH, &json!([{"op": "test", "path": "/spec/stopped", "value": true}, {"op": "remove", "path": "/spec/stopped"}]))
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{}", patched.body);
    assert!(patched.body["spec"].get("stopped").is_none());

    let before = h.revision();
    let failed = h
        .patch(
            &url,
            JSON_PATCH,
            &json!([{"op": "test", "path": "/spec/stopped", "value": true}]),
        )
        .await;
    assert_eq!(
        (failed.status, failed.reason()),
        (StatusCode::UNPROCESSABLE_ENTITY, "Invalid")
    );
    let stale = h
        .patch(
            &url,
            MERGE_PATCH,
            &json!({"metadata": {"resourceVersion": "1"}, "spec": {"stopped": true}}),
        )
        .await;
    assert_eq!(
        (stale.status, stale.reason()),
        (StatusCode::CONFLICT, "Conflict")
    );
    let smp = h
        .patch(&url, STRATEGIC_MERGE_PATCH, &json!({"spec": {}}))
        .await;
    assert_eq!(smp.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let apply = h
        .patch(&url, "application/apply-patch+yaml", &json!({}))
        .await;
    assert_eq!(
        (apply.status, apply.reason()),
        (StatusCode::UNSUPPORTED_MEDIA_TYPE, "UnsupportedMediaType")
    );
    assert!(
        apply.message().contains("application/merge-patch+json"),
        "{}",
        apply.message()
    );
    let invalid = h.patch(&url, MERGE_PATCH, &json!({"spec": {"tasks": [{"name": "x", "role": "Boss", "agentType": "Raw", "raw": {"entrypoint": ["a"]}}]}})).await;
    assert_eq!(
        invalid.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        invalid.body
    );
    assert_eq!(h.revision(), before, "failed patches write nothing");
    assert_eq!(
        h.patch(&format!("{JOBS}/nope"), MERGE_PATCH, &json!({}))
            .await
            .status,
        StatusCode::NOT_FOUND
    );

    // Status patches touch only status.
    let status = h
        .patch(
            &format!("{url}/status"),
            MERGE_PATCH,
            &json!({"status": {"phase": "Running"}, "spec": {"stopped": true}}),
        )
        .await;
    assert_eq!(status.status, StatusCode::OK, "{}", status.body);
    assert_eq!(status.body["status"]["phase"], "Running");
    assert!(status.body["spec"].get("stopped").is_none());
    // And main-resource patches cannot touch status.
    let main = h
        .patch(&url, MERGE_PATCH, &json!({"status": {"phase": "Failed"}}))
        .await;
    assert_eq!(main.body["status"]["phase"], "Running");
}

#[tokio::test]
async fn strategic_merge_patch_on_builtin_kinds() {
    let h = Harness::new().await;
    h.create(&leases("default"), &lease("default", "l")).await;
    let url = format!("{}/l", leases("default"));
    let patched = h
        .patch(
            &url,
            STRATEGIC_MERGE_PATCH,
            &json!({"metadata": {"labels": {"a": "1"}, "finalizers": ["x.io/f"], "$setElementOrder/finalizers": ["x.io/f"]},
                    "spec": {"holderIdentity": "you", "$retainKeys": ["holderIdentity"]}}),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{}", patched.body);
    assert_eq!(patched.body["spec"], json!({"holderIdentity": "you"}));
    assert_eq!(patched.body["metadata"]["finalizers"], json!(["x.io/f"]));
    assert!(!patched.body.to_string().contains("$setElementOrder"));
    let patched = h
        .patch(
            &url,
            STRATEGIC_MERGE_PATCH,
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["x.io/f"]}}),
        )
        .await;
    assert_eq!(patched.body["metadata"]["finalizers"], json!([]));
}

#[tokio::test]
async fn delete_with_and_without_finalizers() {
    let h = Harness::new().await;
    h.create(JOBS, &job("plain")).await;
    let deleted = h.delete(&format!("{JOBS}/plain")).await;
    assert_eq!(deleted.status, StatusCode::OK);
    assert_eq!(deleted.body["metadata"]["name"], "plain");
    assert!(!h.exists(&format!("{JOBS}/plain")).await);
    assert_eq!(
        h.delete(&format!("{JOBS}/plain")).await.status,
        StatusCode::NOT_FOUND
    );

    let mut body = job("held");
    body["metadata"]["finalizers"] = json!(["rlinf.io/cleanup"]);
    h.create(JOBS, &body).await;
    let url = format!("{JOBS}/held");
    let marked = h.delete(&url).await;
    assert_eq!(marked.status, StatusCode::OK);
    assert!(marked.body["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(marked.body["metadata"]["deletionGracePeriodSeconds"], 0);
    assert!(h.exists(&url).await, "finalizers hold the object");
    // Deleting again changes nothing.
    assert_eq!(
        h.delete(&url).await.body["metadata"]["deletionTimestamp"],
        marked.body["metadata"]["deletionTimestamp"]
    );

    // No new finalizers while deleting.
    let added = h
        .patch(
            &url,
            MERGE_PATCH,
            &json!({"metadata": {"finalizers": ["rlinf.io/cleanup", "rlinf.io/other"]}}),
        )
        .await;
    assert_eq!(
        (added.status, added.causes()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            vec![("metadata.finalizers".into(), "FieldValueForbidden".into())]
        )
    );
    // An update cannot clear deletionTimestamp ...
    let mut body = h.get(&url).await.body;
    body["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("deletionTimestamp");
    body["metadata"]["labels"] = json!({"still": "deleting"});
    assert!(h.put(&url, &body).await.body["metadata"]["deletionTimestamp"].is_string());
    // ... and releasing the last finalizer deletes it.
    let released = h
        .patch(
            &url,
            MERGE_PATCH,
            &json!({"metadata": {"finalizers": null}}),
        )
        .await;
    assert_eq!(released.status, StatusCode::OK, "{}", released.body);
    assert!(!h.exists(&url).await);
}

#[tokio::test]
async fn delete_options() {
    let h = Harness::new().await;
    let created = h.create(JOBS, &job("d")).await;
    let url = format!("{JOBS}/d");
    let call = |body: Value| {
        let h = &h;
        let url = url.clone();
        async move { h.call(Method::DELETE, &url, Some(&body)).await }
    };
    let answer = call(
        json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "wrong"}}),
    )
    .await;
    assert_eq!(
        (answer.status, answer.reason()),
        (StatusCode::CONFLICT, "Conflict")
    );
    assert!(
        answer
            .message()
            .contains("Precondition failed: UID in precondition: wrong"),
        "{}",
        answer.message()
    );
    let answer = call(json!({"preconditions": {"resourceVersion": "1"}})).await;
    assert_eq!(answer.status, StatusCode::CONFLICT);
    let answer = call(json!({"propagationPolicy": "Sideways"})).await;
    assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY);
    let answer = call(json!({"dryRun": ["All"]})).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(h.exists(&url).await, "dry run deletes nothing");
    let answer = call(json!({"preconditions": {"uid": created["metadata"]["uid"], "resourceVersion": created["metadata"]["resourceVersion"]}})).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert!(!h.exists(&url).await);
}

#[tokio::test]
async fn delete_collection_honours_selectors() {
    let h = Harness::new().await;
    for (name, team) in [("a", "x"), ("b", "x"), ("c", "y")] {
        let mut body = lease("default", name);
        body["metadata"]["labels"] = json!({"team": team});
        h.create(&leases("default"), &body).await;
    }
    let answer = h
        .delete(&format!("{}?labelSelector=team%3Dx", leases("default")))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.body["kind"], "LeaseList");
    assert_eq!(answer.body["items"].as_array().unwrap().len(), 2);
    let left = h.get(&leases("default")).await;
    let names: Vec<&str> = left.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["c"]);
}

#[tokio::test]
async fn table_and_metadata_renderings() {
    let h = Harness::new().await;
    h.create(JOBS, &job("t")).await;
    let table = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
    let list = Harness::answer(
        h.send(Method::GET, JOBS, "", Some(table), Default::default())
            .await,
    )
    .await;
    assert_eq!(list.body["kind"], "Table");
    assert_eq!(list.body["rows"].as_array().unwrap().len(), 1);
    assert!(list.body["metadata"]["resourceVersion"].is_string());
    let one = Harness::answer(
        h.send(
            Method::GET,
            &format!("{JOBS}/t"),
            "",
            Some(table),
            Default::default(),
        )
        .await,
    )
    .await;
    assert_eq!(one.body["kind"], "Table");
    assert_eq!(one.body["rows"][0]["cells"][0], "t");

    let meta = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
    let list = Harness::answer(
        h.send(Method::GET, JOBS, "", Some(meta), Default::default())
            .await,
    )
    .await;
    assert_eq!(list.body["kind"], "PartialObjectMetadataList");
    assert_eq!(list.body["items"][0]["kind"], "PartialObjectMetadata");
    assert!(list.body["items"][0].get("spec").is_none());
}

/// A length-delimited protobuf field (all test payloads are shorter than 128 bytes).
fn field(number: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![(number << 3) | 2, u8::try_from(payload.len()).unwrap()];
    out.extend_from_slice(payload);
    out
}

#[tokio::test]
async fn protobuf_namespaces_like_kubectl_create_namespace() {
    let h = Harness::new().await;
    let type_meta = [field(1, b"v1"), field(2, b"Namespace")].concat();
    let namespace = field(1, &field(1, b"proto"));
    let body = [
        b"k8s\0".to_vec(),
        field(1, &type_meta),
        field(2, &namespace),
    ]
    .concat();
    let response = h
        .send(
            Method::POST,
            NAMESPACES,
            "application/vnd.kubernetes.protobuf",
            None,
            body.into(),
        )
        .await;
    let answer = Harness::answer(response).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    assert_eq!(answer.body["metadata"]["name"], "proto");
    assert_eq!(answer.body["status"]["phase"], "Active");
}
