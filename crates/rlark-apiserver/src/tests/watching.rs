//! Watches, the way kube-runtime's watcher and kubectl use them.

use std::time::Duration;

use http::StatusCode;
use serde_json::json;

use super::*;
use crate::patch::MERGE_PATCH;

#[tokio::test]
async fn kube_rs_watcher_sequence() {
    let h = Harness::new().await;
    h.create(JOBS, &job("before")).await;
    // kube-runtime's watcher: paginated list, then watch from the list's revision.
    let list = h.get(&format!("{JOBS}?&limit=500")).await;
    let rv = list.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!rv.is_empty());
    assert!(list.body["metadata"].get("continue").is_none());

    // Changes between the list and the watch are replayed from the change log.
    h.create(JOBS, &job("after")).await;
    h.patch(
        &format!("{JOBS}/after"),
        MERGE_PATCH,
        &json!({"metadata": {"labels": {"x": "y"}}}),
    )
    .await;
    let started = tokio::time::Instant::now();
    let (status, mut events) = h
        .watch(
            &format!(
                "{JOBS}?&watch=true&timeoutSeconds=1&allowWatchBookmarks=true&resourceVersion={rv}"
            ),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    // And live ones follow.
    h.delete(&format!("{JOBS}/before")).await;

    let mut changes = Vec::new();
    let mut last = None;
    while let Some(event) = events.next().await {
        if event["type"] == "BOOKMARK" {
            assert_eq!(event["object"]["kind"], "Job");
            assert_eq!(event["object"]["apiVersion"], "rlinf.io/v1alpha1");
        } else {
            assert!(event["object"]["metadata"]["resourceVersion"].is_string());
            changes.push(summary(&event));
        }
        last = Some(event);
    }
    let kinds: Vec<(&str, &str)> = changes
        .iter()
        .map(|(t, n)| (t.as_str(), n.as_str()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("ADDED", "after"),
            ("MODIFIED", "after"),
            ("DELETED", "before")
        ]
    );
    // The stream closes at timeoutSeconds, with a bookmark right before.
    let last = last.unwrap();
    assert_eq!(last["type"], "BOOKMARK");
    assert_eq!(
        last["object"]["metadata"]["resourceVersion"],
        h.revision().to_string()
    );
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < Duration::from_secs(5),
        "{elapsed:?}"
    );
}

/// Events waiting together (here: replayed from the change log) go out as one chunk, so a
/// burst of writes costs a watcher one TLS record and one write, not one per event.
#[tokio::test]
async fn events_waiting_together_go_out_in_one_chunk() {
    let h = Harness::new().await;
    let rv = h.revision().to_string();
    for i in 0..30 {
        h.create(JOBS, &job(&format!("burst-{i}"))).await;
    }
    let (status, mut events) = h
        .watch(
            &format!("{JOBS}?watch=true&timeoutSeconds=1&resourceVersion={rv}"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let first = tokio::time::timeout(Duration::from_secs(10), events.body.next())
        .await
        .expect("no chunk within 10 s")
        .expect("the stream ended")
        .expect("body error");
    let lines: Vec<&[u8]> = first
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(
        lines.len(),
        30,
        "one chunk should carry all 30 waiting events"
    );
    // Each line is one whole event, in order.
    for (i, line) in lines.iter().enumerate() {
        let event: serde_json::Value = serde_json::from_slice(line).expect("event JSON");
        assert_eq!(summary(&event), ("ADDED".to_string(), format!("burst-{i}")));
    }
}

#[tokio::test]
async fn watch_from_a_compacted_revision_is_an_in_stream_410() {
    let h = Harness::new().await;
    h.create(JOBS, &job("a")).await;
    let old = h.revision();
    h.create(JOBS, &job("b")).await;
    h.store.compact(h.revision()).await.unwrap();
    let (status, mut events) = h
        .watch(
            &format!("{JOBS}?watch=true&resourceVersion={}", old - 1),
            None,
        )
        .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "an HTTP 410 would make kube-runtime retry forever"
    );
    let event = events.next().await.unwrap();
    assert_eq!(event["type"], "ERROR");
    assert_eq!(event["object"]["kind"], "Status");
    assert_eq!(event["object"]["code"], 410);
    assert_eq!(event["object"]["reason"], "Expired");
    assert!(
        events.next().await.is_none(),
        "the stream ends after the error"
    );
}

#[tokio::test]
async fn watch_without_revision_starts_with_the_current_objects() {
    let h = Harness::new().await;
    h.create(JOBS, &job("a")).await;
    h.create(JOBS, &job("b")).await;
    let (_, mut events) = h
        .watch(&format!("{JOBS}?watch=1&timeoutSeconds=10"), None)
        .await;
    assert_eq!(
        summary(&events.next().await.unwrap()),
        ("ADDED".into(), "a".into())
    );
    assert_eq!(
        summary(&events.next().await.unwrap()),
        ("ADDED".into(), "b".into())
    );
    h.delete(&format!("{JOBS}/a")).await;
    assert_eq!(
        summary(&events.next().await.unwrap()),
        ("DELETED".into(), "a".into())
    );

    // resourceVersion=0 means the same ("any").
    let (_, mut events) = h
        .watch(
            &format!("{JOBS}?watch=true&resourceVersion=0&timeoutSeconds=1"),
            None,
        )
        .await;
    assert_eq!(
        summary(&events.next().await.unwrap()),
        ("ADDED".into(), "b".into())
    );
    assert!(events.next().await.is_none(), "no bookmarks were asked for");
}

#[tokio::test]
async fn send_initial_events_ends_with_an_annotated_bookmark() {
    let h = Harness::new().await;
    h.create(JOBS, &job("a")).await;
    let uri = format!(
        "{JOBS}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=0&allowWatchBookmarks=true&timeoutSeconds=1"
    );
    let (status, mut events) = h.watch(&uri, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        summary(&events.next().await.unwrap()),
        ("ADDED".into(), "a".into())
    );
    let end = events.next().await.unwrap();
    assert_eq!(end["type"], "BOOKMARK");
    assert_eq!(
        end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert_eq!(
        end["object"]["metadata"]["resourceVersion"],
        h.revision().to_string()
    );

    let answer = Harness::answer(
        h.send(
            http::Method::GET,
            &format!("{JOBS}?watch=true&sendInitialEvents=true"),
            "",
            None,
            Default::default(),
        )
        .await,
    )
    .await;
    assert_eq!(
        (answer.status, answer.reason()),
        (StatusCode::UNPROCESSABLE_ENTITY, "Invalid")
    );
}

#[tokio::test]
async fn selectors_apply_with_transitions() {
    let h = Harness::new().await;
    let (_, mut events) = h
        .watch(
            &format!(
                "{}?watch=true&labelSelector=app%3Dweb&timeoutSeconds=30",
                leases("default")
            ),
            None,
        )
        .await;
    let url = format!("{}/l", leases("default"));
    h.create(&leases("default"), &lease("default", "l")).await;
    h.create(&leases("default"), &lease("default", "other"))
        .await;
    h.patch(
        &url,
        MERGE_PATCH,
        &json!({"metadata": {"labels": {"app": "web"}}}),
    )
    .await;
    h.patch(
        &url,
        MERGE_PATCH,
        &json!({"spec": {"holderIdentity": "you"}}),
    )
    .await;
    h.patch(
        &url,
        MERGE_PATCH,
        &json!({"metadata": {"labels": {"app": "db"}}}),
    )
    .await;
    h.patch(
        &url,
        MERGE_PATCH,
        &json!({"spec": {"holderIdentity": "them"}}),
    )
    .await;
    h.delete(&url).await;
    // A matching sentinel marks the end of what to look at.
    let mut sentinel = lease("default", "zz");
    sentinel["metadata"]["labels"] = json!({"app": "web"});
    h.create(&leases("default"), &sentinel).await;
    let mut got = Vec::new();
    loop {
        let event = summary(&events.next().await.unwrap());
        if event.1 == "zz" {
            break;
        }
        got.push(event);
    }
    let expected: Vec<(String, String)> = [("ADDED", "l"), ("MODIFIED", "l"), ("DELETED", "l")]
        .iter()
        .map(|(t, n)| (t.to_string(), n.to_string()))
        .collect();
    assert_eq!(got, expected);
}

#[tokio::test]
async fn selector_watch_from_a_revision_knows_who_matches() {
    let h = Harness::new().await;
    let mut body = lease("default", "l");
    body["metadata"]["labels"] = json!({"app": "web"});
    h.create(&leases("default"), &body).await;
    let rv = h.revision();
    let (_, mut events) = h
        .watch(
            &format!(
                "{}?watch=true&labelSelector=app%3Dweb&resourceVersion={rv}&timeoutSeconds=10",
                leases("default")
            ),
            None,
        )
        .await;
    h.patch(
        &format!("{}/l", leases("default")),
        MERGE_PATCH,
        &json!({"metadata": {"labels": {"app": "db"}}}),
    )
    .await;
    assert_eq!(
        summary(&events.next().await.unwrap()),
        ("DELETED".into(), "l".into())
    );
}

#[tokio::test]
async fn single_object_watches() {
    let h = Harness::new().await;
    h.create(JOBS, &job("a")).await;
    h.create(JOBS, &job("b")).await;
    // `kubectl get b -w`: field selector on the name.
    let (_, mut by_field) = h
        .watch(
            &format!("{JOBS}?watch=true&fieldSelector=metadata.name%3Db&timeoutSeconds=3"),
            None,
        )
        .await;
    // The older object-URL form.
    let (_, mut by_url) = h
        .watch(&format!("{JOBS}/b?watch=true&timeoutSeconds=3"), None)
        .await;
    h.patch(
        &format!("{JOBS}/a"),
        MERGE_PATCH,
        &json!({"spec": {"stopped": true}}),
    )
    .await;
    h.patch(
        &format!("{JOBS}/b"),
        MERGE_PATCH,
        &json!({"spec": {"stopped": true}}),
    )
    .await;
    for events in [&mut by_field, &mut by_url] {
        let got: Vec<(String, String)> = events.rest().await.iter().map(summary).collect();
        assert_eq!(
            got,
            vec![
                ("ADDED".to_string(), "b".to_string()),
                ("MODIFIED".to_string(), "b".to_string())
            ]
        );
    }
}

#[tokio::test]
async fn table_watches_for_kubectl() {
    let h = Harness::new().await;
    h.create(JOBS, &job("a")).await;
    let accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
    let (_, mut events) = h
        .watch(&format!("{JOBS}?watch=true&timeoutSeconds=5"), Some(accept))
        .await;
    let first = events.next().await.unwrap();
    assert_eq!(first["type"], "ADDED");
    assert_eq!(first["object"]["kind"], "Table");
    assert!(
        !first["object"]["columnDefinitions"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert_eq!(first["object"]["rows"][0]["cells"][0], "a");
    h.create(JOBS, &job("b")).await;
    let second = events.next().await.unwrap();
    assert_eq!(second["object"]["rows"][0]["cells"][0], "b");
    assert!(
        second["object"]["columnDefinitions"]
            .as_array()
            .is_none_or(Vec::is_empty)
    );
}

#[tokio::test]
async fn idle_watches_get_periodic_bookmarks() {
    let h = Harness::new().await; // bookmark every 300 ms
    h.create(JOBS, &job("a")).await;
    let rv = h.revision();
    let (_, mut events) = h
        .watch(
            &format!(
                "{JOBS}?watch=true&allowWatchBookmarks=true&resourceVersion={rv}&timeoutSeconds=3"
            ),
            None,
        )
        .await;
    // Other resources move the store on; bookmarks follow (one tick late, see watch.rs).
    h.create(&leases("default"), &lease("default", "l")).await;
    let all = events.rest().await;
    assert!(all.len() >= 3, "{all:?}");
    assert!(all.iter().all(|e| e["type"] == "BOOKMARK"));
    let last = all.last().unwrap();
    assert_eq!(
        last["object"]["metadata"]["resourceVersion"],
        h.revision().to_string()
    );
}

#[tokio::test]
async fn watches_end_when_the_server_shuts_down() {
    let h = Harness::new().await;
    let stop = h.start_background();
    let (_, mut events) = h
        .watch(&format!("{JOBS}?watch=true&timeoutSeconds=60"), None)
        .await;
    stop.cancel();
    let ended = tokio::time::timeout(Duration::from_secs(5), events.rest()).await;
    assert!(ended.is_ok(), "watch still open after shutdown");
}

/// Regression (issue 14): `timeoutSeconds=9223372036854775807` (any value that parses) made
/// the handler compute `Instant::now() + timeout` and panic. The watch is now served, its
/// deadline cut to [`crate::watch::MAX_WATCH_TIMEOUT`].
#[tokio::test]
async fn huge_watch_timeouts_are_served() {
    let h = Harness::new().await;
    h.create(JOBS, &job("a")).await;
    for timeout in [i64::MAX as u64, u64::MAX] {
        let (status, mut events) = h
            .watch(&format!("{JOBS}?watch=true&timeoutSeconds={timeout}"), None)
            .await;
        assert_eq!(status, StatusCode::OK, "timeoutSeconds={timeout}");
        assert_eq!(
            summary(&events.next().await.unwrap()),
            ("ADDED".into(), "a".into())
        );
    }
}
