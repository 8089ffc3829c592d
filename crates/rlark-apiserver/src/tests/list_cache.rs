//! The store's cached JSON behind lists, streamed list bodies and shared watch encodings.
//!
//! Lists copy each object's JSON from the store's memory instead of encoding it. These tests
//! check, through the real handlers, that after every kind of write a list shows the new
//! bytes: each listed item must equal a GET of the same object (GET encodes the object
//! afresh, so a stale cached encoding shows up as a difference) and the value the write
//! answered.

use std::collections::BTreeMap;

use http::{Method, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};

use super::*;
use crate::patch::{JSON_PATCH, MERGE_PATCH};

const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";
const METADATA: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";

/// A list as the raw bytes sent, parsed, with the number of body frames it came in.
async fn raw_list(h: &Harness, uri: &str, accept: Option<&str>) -> (Value, usize) {
    let response = h.send(Method::GET, uri, "", accept, Bytes::new()).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let (mut bytes, mut frames) = (Vec::new(), 0);
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            bytes.extend_from_slice(&data);
            frames += 1;
        }
    }
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&bytes)));
    (value, frames)
}

/// The listed items by name.
fn by_name(list: &Value) -> BTreeMap<String, Value> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["metadata"]["name"].as_str().unwrap().to_string(),
                i.clone(),
            )
        })
        .collect()
}

/// List `collection` and check it against fresh GETs of every item and against
/// `expected` (name → the object the last write answered; absent = must not be listed).
/// Also the Table and PartialObjectMetadata lists show the same resourceVersions.
async fn assert_list_is_fresh(
    h: &Harness,
    collection: &str,
    expected: &BTreeMap<&str, Option<Value>>,
    step: &str,
) {
    let (list, _) = raw_list(h, collection, None).await;
    let items = by_name(&list);
    for (name, item) in &items {
        let fresh = h.get(&format!("{collection}/{name}")).await;
        assert_eq!(
            fresh.status,
            StatusCode::OK,
            "{step}: {name} listed but gone"
        );
        assert_eq!(*item, fresh.body, "{step}: listed {name} differs from GET");
    }
    for (name, written) in expected {
        match written {
            Some(written) => assert_eq!(
                items.get(*name),
                Some(written),
                "{step}: {name} is not listed as written"
            ),
            None => assert!(!items.contains_key(*name), "{step}: {name} still listed"),
        }
    }
    let versions: BTreeMap<String, Value> = items
        .iter()
        .map(|(n, i)| (n.clone(), i["metadata"]["resourceVersion"].clone()))
        .collect();
    let (metadata, _) = raw_list(h, collection, Some(METADATA)).await;
    let metadata_versions: BTreeMap<String, Value> = by_name(&metadata)
        .into_iter()
        .map(|(n, i)| (n, i["metadata"]["resourceVersion"].clone()))
        .collect();
    assert_eq!(
        metadata_versions, versions,
        "{step}: PartialObjectMetadataList"
    );
    let (table, _) = raw_list(h, collection, Some(TABLE)).await;
    let table_versions: BTreeMap<String, Value> = table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let meta = &row["object"]["metadata"];
            (
                meta["name"].as_str().unwrap().to_string(),
                meta["resourceVersion"].clone(),
            )
        })
        .collect();
    assert_eq!(table_versions, versions, "{step}: Table");
}

#[tokio::test]
async fn list_cache_is_invalidated_by_every_kind_of_write() {
    let h = Harness::new().await;
    let stop = h.start_background();
    let url = |name: &str| format!("{JOBS}/{name}");
    let mut jobs: BTreeMap<&str, Option<Value>> = BTreeMap::new();

    // Create.
    let created = h.create(JOBS, &job("a")).await;
    jobs.insert("a", Some(created.clone()));
    jobs.insert("b", Some(h.create(JOBS, &job("b")).await));
    assert_list_is_fresh(&h, JOBS, &jobs, "create").await;

    // Update (PUT).
    let mut body = created.clone();
    body["spec"]["stopped"] = json!(true);
    let updated = h.put(&url("a"), &body).await;
    assert_eq!(updated.status, StatusCode::OK, "{}", updated.body);
    jobs.insert("a", Some(updated.body));
    assert_list_is_fresh(&h, JOBS, &jobs, "update").await;

    // Merge patch and JSON patch.
    let merged = h
        .patch(
            &url("a"),
            MERGE_PATCH,
            &json!({"metadata": {"labels": {"team": "rl"}}}),
        )
        .await;
    assert_eq!(merged.status, StatusCode::OK, "{}", merged.body);
    jobs.insert("a", Some(merged.body));
    assert_list_is_fresh(&h, JOBS, &jobs, "merge patch").await;
    let patched = h
        .patch(
            &url("a"),
            JSON_PATCH,
            &json!([{"op": "remove", "path": "/spec/stopped"}]),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{}", patched.body);
    jobs.insert("a", Some(patched.body));
    assert_list_is_fresh(&h, JOBS, &jobs, "json patch").await;

    // Status subresource: PUT and PATCH.
    let mut body = h.get(&url("a")).await.body;
    body["status"] = json!({"phase": "Running"});
    let status = h.put(&format!("{}/status", url("a")), &body).await;
    assert_eq!(status.status, StatusCode::OK, "{}", status.body);
    jobs.insert("a", Some(status.body));
    assert_list_is_fresh(&h, JOBS, &jobs, "status update").await;
    let status = h
        .patch(
            &format!("{}/status", url("a")),
            MERGE_PATCH,
            &json!({"status": {"phase": "Succeeded"}}),
        )
        .await;
    assert_eq!(status.status, StatusCode::OK, "{}", status.body);
    assert_eq!(status.body["status"]["phase"], "Succeeded");
    jobs.insert("a", Some(status.body));
    assert_list_is_fresh(&h, JOBS, &jobs, "status patch").await;

    // Delete of an object with a finalizer: an update (deletionTimestamp), then the
    // finalizer's removal deletes it.
    let held = h
        .patch(
            &url("b"),
            MERGE_PATCH,
            &json!({"metadata": {"finalizers": ["rlinf.io/test"]}}),
        )
        .await;
    assert_eq!(held.status, StatusCode::OK, "{}", held.body);
    let marked = h.delete(&url("b")).await;
    assert_eq!(marked.status, StatusCode::OK, "{}", marked.body);
    assert!(marked.body["metadata"]["deletionTimestamp"].is_string());
    jobs.insert("b", Some(marked.body));
    assert_list_is_fresh(&h, JOBS, &jobs, "delete marks").await;
    let released = h
        .patch(
            &url("b"),
            MERGE_PATCH,
            &json!({"metadata": {"finalizers": null}}),
        )
        .await;
    assert_eq!(released.status, StatusCode::OK, "{}", released.body);
    jobs.insert("b", None);
    assert_list_is_fresh(&h, JOBS, &jobs, "finalizer removed").await;

    // Plain delete.
    assert_eq!(h.delete(&url("a")).await.status, StatusCode::OK);
    jobs.insert("a", None);
    assert_list_is_fresh(&h, JOBS, &jobs, "delete").await;

    // Garbage collection: deleting the owner deletes its dependents, which must leave the
    // list (the collector's deletes go through the same store path as the API's).
    let owner = h.create(JOBS, &job("owner")).await;
    let tasks_url = tasks("default");
    let mut tasks_expected: BTreeMap<&str, Option<Value>> = BTreeMap::new();
    for name in ["t1", "t2"] {
        let mut dependent = task("default", name);
        dependent["metadata"]["ownerReferences"] = json!([owner_ref(&owner)]);
        tasks_expected.insert(name, Some(h.create(&tasks_url, &dependent).await));
    }
    tasks_expected.insert(
        "free",
        Some(h.create(&tasks_url, &task("default", "free")).await),
    );
    assert_list_is_fresh(&h, &tasks_url, &tasks_expected, "dependents created").await;
    assert_eq!(h.delete(&url("owner")).await.status, StatusCode::OK);
    h.wait_gone(&format!("{tasks_url}/t1")).await;
    h.wait_gone(&format!("{tasks_url}/t2")).await;
    tasks_expected.insert("t1", None);
    tasks_expected.insert("t2", None);
    assert_list_is_fresh(&h, &tasks_url, &tasks_expected, "garbage collected").await;

    // Delete collection.
    let answer = h.call(Method::DELETE, &tasks_url, None).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(by_name(&answer.body).len(), 1, "{}", answer.body);
    tasks_expected.insert("free", None);
    assert_list_is_fresh(&h, &tasks_url, &tasks_expected, "delete collection").await;
    stop.cancel();
}

fn padded_lease(i: usize) -> Value {
    let mut body = lease("default", &format!("l{i:03}"));
    body["metadata"]["annotations"] = json!({"pad": "x".repeat(1024)});
    body
}

#[tokio::test]
async fn large_lists_stream_the_state_they_were_read_at() {
    let h = Harness::new().await;
    let collection = leases("default");
    for i in 0..120 {
        h.create(&collection, &padded_lease(i)).await;
    }
    let (before, frames) = raw_list(&h, &collection, None).await;
    // 120 KiB of items: more than one chunk.
    assert!(frames > 1, "{frames} frames");
    assert_eq!(by_name(&before).len(), 120);
    let listed_at = before["metadata"]["resourceVersion"].clone();

    // The head is sent; the body is not read yet. Writes now must not show in it.
    let response = h
        .send(Method::GET, &collection, "", None, Bytes::new())
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .is_none()
    );
    for i in 0..10 {
        assert_eq!(
            h.delete(&format!("{collection}/l{i:03}")).await.status,
            StatusCode::OK
        );
    }
    h.patch(
        &format!("{collection}/l050"),
        MERGE_PATCH,
        &json!({"metadata": {"labels": {"late": "yes"}}}),
    )
    .await;
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let streamed: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(streamed, before, "the body is the page as read");
    assert_eq!(streamed["metadata"]["resourceVersion"], listed_at);

    // The next list shows the writes.
    let (after, _) = raw_list(&h, &collection, None).await;
    let items = by_name(&after);
    assert_eq!(items.len(), 110);
    assert_eq!(items["l050"]["metadata"]["labels"]["late"], "yes");

    // Small lists are ordinary fixed-length responses.
    let response = h
        .send(
            Method::GET,
            &format!("{collection}?limit=2"),
            "",
            None,
            Bytes::new(),
        )
        .await;
    assert!(
        response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .is_some()
    );
}

#[tokio::test]
async fn streamed_lists_keep_paging_and_selectors() {
    let h = Harness::new().await;
    let collection = leases("default");
    for i in 0..120 {
        let mut body = padded_lease(i);
        body["metadata"]["labels"] = json!({"even": (i % 2 == 0).to_string()});
        h.create(&collection, &body).await;
    }
    let mut names = Vec::new();
    let mut uri = format!("{collection}?limit=50&labelSelector=even%3Dtrue");
    loop {
        let (page, _) = raw_list(&h, &uri, None).await;
        names.extend(by_name(&page).into_keys());
        match page["metadata"]["continue"].as_str() {
            Some(token) => {
                uri = format!("{collection}?limit=50&labelSelector=even%3Dtrue&continue={token}")
            }
            None => break,
        }
    }
    let expected: Vec<String> = (0..120).step_by(2).map(|i| format!("l{i:03}")).collect();
    assert_eq!(names, expected);
}

/// Watchers of one format share one encoding per event: W watchers, E events, E renders.
#[tokio::test]
async fn watch_events_are_encoded_once_per_format() {
    let h = Harness::new().await;
    let encodings = std::sync::Arc::clone(&h.server.inner.event_encodings);
    let from = h.revision();
    let watch_uri = format!("{JOBS}?watch=true&resourceVersion={from}&timeoutSeconds=5");
    let mut json_watchers = Vec::new();
    for _ in 0..5 {
        let (status, events) = h.watch(&watch_uri, None).await;
        assert_eq!(status, StatusCode::OK);
        json_watchers.push(events);
    }
    let mut metadata_watchers = Vec::new();
    for _ in 0..3 {
        let accept = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
        metadata_watchers.push(h.watch(&watch_uri, Some(accept)).await.1);
    }
    let renders_before = encodings.renders();
    for name in ["w1", "w2", "w3"] {
        h.create(JOBS, &job(name)).await;
    }
    let mut lines = Vec::new();
    for watcher in json_watchers.iter_mut().chain(metadata_watchers.iter_mut()) {
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(watcher.next().await.unwrap());
        }
        lines.push(seen);
    }
    // Every watcher saw the three creates, as its format shows them.
    for seen in &lines {
        let names: Vec<_> = seen.iter().map(summary).collect();
        assert_eq!(
            names,
            ["w1", "w2", "w3"].map(|n| ("ADDED".to_string(), n.to_string()))
        );
    }
    assert!(lines[..5].iter().all(|seen| *seen == lines[0]));
    assert_eq!(lines[5][0]["object"]["kind"], "PartialObjectMetadata");
    assert!(lines[5..].iter().all(|seen| *seen == lines[5]));
    // Three events in two formats: six encodings, not 3 × 8.
    assert_eq!(encodings.renders() - renders_before, 6);

    // Table watchers: the first event carries each watcher's column definitions; after that
    // the rows are shared (two renderings at most, should the events straddle a second).
    let mut table_watchers = Vec::new();
    let from = h.revision();
    let table_uri = format!("{JOBS}?watch=true&resourceVersion={from}&timeoutSeconds=5");
    for _ in 0..4 {
        table_watchers.push(h.watch(&table_uri, Some(TABLE)).await.1);
    }
    h.create(JOBS, &job("t1")).await;
    for watcher in &mut table_watchers {
        let first = watcher.next().await.unwrap();
        assert!(
            !first["object"]["columnDefinitions"]
                .as_array()
                .unwrap()
                .is_empty()
        );
    }
    let renders_before = encodings.renders();
    h.create(JOBS, &job("t2")).await;
    for watcher in &mut table_watchers {
        let event = watcher.next().await.unwrap();
        assert_eq!(event["object"]["kind"], "Table");
        assert_eq!(event["object"]["rows"][0]["cells"][0], "t2");
        assert_eq!(event["object"]["columnDefinitions"], json!([]));
    }
    let table_renders = encodings.renders() - renders_before;
    assert!(
        (1..=2).contains(&table_renders),
        "{table_renders} Table renderings for 4 watchers"
    );
}
