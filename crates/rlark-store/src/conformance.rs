//! Backend-independent conformance suite for [`Store`] implementations.
//!
//! Every backend runs [`run_all`] in its tests with a factory that returns a fresh, empty store.
//! Outside this crate the suite is behind the cargo feature `conformance` (off by default), which
//! a backend's crate enables for its tests only:
//!
//! ```toml
//! [dev-dependencies]
//! rlark-store = { workspace = true, features = ["conformance"] }
//! ```
//!
//! ```ignore
//! rlark_store::conformance::run_all(|| async { MyStore::open_temporary().await }).await;
//! ```
//!
//! Each check is also public, takes a fresh store by value and panics with a message naming the
//! check and what went wrong. Checks only rely on the contract: revisions are compared for
//! order, never assumed to be dense, except that a fresh store's watch from `revision()` works.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};

use crate::{
    EventType, ListOptions, ObjectKey, Revision, Store, StoreError, WatchEvent, WatchStream,
};

/// How long a check waits for an expected watch event before failing.
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a check waits to be confident that no event is coming.
const QUIET_PERIOD: Duration = Duration::from_millis(200);

const WIDGETS: &str = "widgets.test.rlark.io";
const GADGETS: &str = "gadgets.test.rlark.io";

/// Run every check, each on a store made by `make` (which must return a fresh, empty store).
pub async fn run_all<F, Fut, S>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
    S: Store,
{
    macro_rules! run {
        ($($check:ident),* $(,)?) => {
            $(
                eprintln!("conformance: {}", stringify!($check));
                $check(make().await).await;
            )*
        };
    }
    run!(
        create_and_get,
        create_rejects_duplicates_and_invalid_objects,
        update_semantics,
        generation_rules,
        noop_update_writes_nothing,
        delete_semantics,
        revisions_are_global_and_increasing,
        list_semantics,
        list_pagination,
        encodings_follow_every_write,
        usage_follows_every_write,
        watch_replays_then_streams,
        watch_filters,
        watch_from_future_revision,
        compaction_expires_old_watches,
        list_at_older_revisions,
        concurrent_creates,
        concurrent_creates_of_one_key,
        concurrent_conflicting_updates,
        watch_during_concurrent_writes,
    );
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn key(resource: &str, namespace: &str, name: &str) -> ObjectKey {
    ObjectKey::new(resource, namespace, name)
}

/// A Kubernetes-shaped object named by `key` with the given `spec`.
fn object(key: &ObjectKey, spec: Value) -> Value {
    let mut metadata = json!({ "name": key.name });
    if !key.namespace.is_empty() {
        metadata["namespace"] = json!(key.namespace);
    }
    json!({
        "apiVersion": "test.rlark.io/v1",
        "kind": "Widget",
        "metadata": metadata,
        "spec": spec,
    })
}

/// `metadata.resourceVersion` as a revision; panics if absent or not a number.
fn rv(object: &Value) -> Revision {
    let text = object
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("object without string metadata.resourceVersion: {object}"));
    text.parse()
        .unwrap_or_else(|_| panic!("resourceVersion {text:?} is not a decimal revision"))
}

fn meta<'a>(object: &'a Value, field: &str) -> &'a Value {
    object
        .get("metadata")
        .and_then(|m| m.get(field))
        .unwrap_or(&Value::Null)
}

fn generation(object: &Value) -> i64 {
    meta(object, "generation")
        .as_i64()
        .unwrap_or_else(|| panic!("object without integer metadata.generation: {object}"))
}

/// Await a store call that must succeed.
async fn must<T>(what: &str, call: impl Future<Output = Result<T, StoreError>>) -> T {
    ok(what, call.await)
}

fn ok<T>(what: &str, result: Result<T, StoreError>) -> T {
    match result {
        Ok(value) => value,
        Err(e) => panic!("{what}: unexpected error {e:?}"),
    }
}

async fn watch<S: Store>(
    store: &S,
    check: &str,
    namespace: Option<&str>,
    from: Revision,
) -> WatchStream {
    match store.watch(WIDGETS, namespace, from).await {
        Ok(stream) => stream,
        Err(e) => panic!("{check}: watch from {from} failed: {e:?}"),
    }
}

async fn next_event(stream: &mut WatchStream, check: &str) -> WatchEvent {
    match tokio::time::timeout(EVENT_TIMEOUT, stream.next()).await {
        Ok(Some(Ok(event))) => event,
        Ok(Some(Err(e))) => panic!("{check}: watch stream yielded error {e:?}"),
        Ok(None) => panic!("{check}: watch stream ended unexpectedly"),
        Err(_) => panic!("{check}: no watch event within {EVENT_TIMEOUT:?}"),
    }
}

async fn assert_quiet(stream: &mut WatchStream, check: &str) {
    if let Ok(item) = tokio::time::timeout(QUIET_PERIOD, stream.next()).await {
        panic!("{check}: expected no further watch event, got {item:?}");
    }
}

fn assert_event(
    event: &WatchEvent,
    check: &str,
    event_type: EventType,
    key: &ObjectKey,
    revision: Revision,
) {
    assert_eq!(
        (event.event_type, &event.key, event.revision),
        (event_type, key, revision),
        "{check}: unexpected event (type, key, revision)"
    );
    assert_eq!(
        rv(&event.object),
        event.revision,
        "{check}: event object resourceVersion != event revision"
    );
}

/// `list_encoded` as it must be: the same items as `list`, each with its exact encoding.
async fn assert_encodings<S: Store>(store: &S, check: &str) -> Vec<(String, String)> {
    let plain = must(check, store.list(WIDGETS, &ListOptions::default())).await;
    let encoded = must(check, store.list_encoded(WIDGETS, &ListOptions::default())).await;
    assert_eq!(encoded.revision, plain.revision, "{check}: list revisions");
    let objects: Vec<&Value> = encoded.items.iter().map(|i| &*i.object).collect();
    let expected: Vec<&Value> = plain.items.iter().map(|o| &**o).collect();
    assert_eq!(objects, expected, "{check}: list_encoded objects != list");
    encoded
        .items
        .iter()
        .map(|item| {
            let json = serde_json::to_string(&*item.object).unwrap_or_default();
            assert_eq!(
                &*item.json, json,
                "{check}: stale or wrong encoding for {}",
                item.object
            );
            (
                meta(&item.object, "name").as_str().unwrap_or("").to_owned(),
                json,
            )
        })
        .collect()
}

/// `list_encoded` (and the optional `WatchEvent::json`) always carries the encoding of the
/// current object: after creates, updates, several writes of one key in flight at once, and
/// deletes; a no-op update keeps the encoding.
pub async fn encodings_follow_every_write<S: Store>(store: S) {
    const CHECK: &str = "encodings_follow_every_write";
    let (a, b) = (key(WIDGETS, "ns", "a"), key(WIDGETS, "ns", "b"));
    let mut events = watch(&store, CHECK, None, store.revision()).await;
    must(CHECK, store.create(&a, object(&a, json!({"size": 1})))).await;
    must(CHECK, store.create(&b, object(&b, json!({"size": 1})))).await;
    let created = assert_encodings(&store, CHECK).await;
    assert_eq!(created.len(), 2, "{CHECK}: two objects listed");

    must(
        CHECK,
        store.update(&a, object(&a, json!({"size": 2})), None),
    )
    .await;
    let updated = assert_encodings(&store, CHECK).await;
    assert_ne!(
        updated[0], created[0],
        "{CHECK}: update changed a's encoding"
    );
    assert_eq!(updated[1], created[1], "{CHECK}: b untouched");

    // A no-op update writes nothing: same encoding.
    must(
        CHECK,
        store.update(&a, object(&a, json!({"size": 2})), None),
    )
    .await;
    assert_eq!(
        assert_encodings(&store, CHECK).await,
        updated,
        "{CHECK}: no-op"
    );

    // Several writes of one key at once (a backend may commit them together).
    let writes = (3..8).map(|size| store.update(&a, object(&a, json!({"size": size})), None));
    for result in futures::future::join_all(writes).await {
        ok(CHECK, result);
    }
    let racing = assert_encodings(&store, CHECK).await;
    let current = must(CHECK, store.get(&a)).await;
    assert_eq!(
        racing[0].1,
        serde_json::to_string(&current).unwrap_or_default(),
        "{CHECK}: encoding of the last write"
    );

    must(CHECK, store.delete(&b, None)).await;
    let deleted = assert_encodings(&store, CHECK).await;
    assert_eq!(deleted, racing[..1], "{CHECK}: deleted object not listed");

    // Every event so far: 2 creates, 1 + 5 updates, 1 delete.
    for _ in 0..9 {
        let event = next_event(&mut events, CHECK).await;
        if let Some(json) = &event.json {
            assert_eq!(
                **json,
                serde_json::to_string(&*event.object).unwrap_or_default(),
                "{CHECK}: event encoding of {:?} at {}",
                event.event_type,
                event.revision
            );
        }
    }
    assert_quiet(&mut events, CHECK).await;
}

// ---------------------------------------------------------------------------------------------
// Create / get

/// `create` fills uid, creationTimestamp, generation and resourceVersion; `get` returns it.
/// [`Store::usage`]: objects and JSON bytes per namespace, per resource and in all, after
/// creates, growing and shrinking updates and deletes.
pub async fn usage_follows_every_write<S: Store>(store: S) {
    const CHECK: &str = "usage_follows_every_write";
    let usage = |namespace: &'static str, resource: Option<&'static str>| {
        let store = &store;
        async move { must(CHECK, store.usage(namespace, resource)).await }
    };
    let json_len = |object: &Value| serde_json::to_string(object).map_or(0, |s| s.len()) as u64;
    assert_eq!(usage("a", None).await, crate::Usage::default());
    let w1 = key(WIDGETS, "a", "w1");
    let w2 = key(WIDGETS, "a", "w2");
    let g1 = key(GADGETS, "a", "g1");
    let other = key(WIDGETS, "b", "w1");
    let w1_v1 = must(
        CHECK,
        store.create(&w1, object(&w1, json!({"pad": "x".repeat(1000)}))),
    )
    .await;
    let w2_v1 = must(CHECK, store.create(&w2, object(&w2, json!({})))).await;
    let g1_v1 = must(CHECK, store.create(&g1, object(&g1, json!({})))).await;
    must(
        CHECK,
        store.create(&other, object(&other, json!({"pad": "y".repeat(5000)}))),
    )
    .await;
    let widgets = usage("a", Some(WIDGETS)).await;
    assert_eq!(widgets.objects, 2, "{CHECK}: widgets in a");
    assert_eq!(
        widgets.bytes,
        json_len(&w1_v1) + json_len(&w2_v1),
        "{CHECK}: widget bytes in a"
    );
    let all = usage("a", None).await;
    assert_eq!(all.objects, 3, "{CHECK}: objects in a");
    assert_eq!(
        all.bytes,
        widgets.bytes + json_len(&g1_v1),
        "{CHECK}: bytes in a"
    );
    // An update that shrinks w1 counts its new size only.
    let w1_v2 = must(
        CHECK,
        store.update(&w1, object(&w1, json!({"pad": "x"})), None),
    )
    .await;
    assert_eq!(
        usage("a", Some(WIDGETS)).await.bytes,
        json_len(&w1_v2) + json_len(&w2_v1),
        "{CHECK}: after shrinking w1"
    );
    must(CHECK, store.delete(&w2, None)).await;
    must(CHECK, store.delete(&g1, None)).await;
    assert_eq!(
        usage("a", None).await,
        crate::Usage {
            objects: 1,
            bytes: json_len(&w1_v2)
        },
        "{CHECK}: after the deletes"
    );
    assert_eq!(
        usage("b", None).await.objects,
        1,
        "{CHECK}: other namespace untouched"
    );
    assert_eq!(usage("c", Some(WIDGETS)).await, crate::Usage::default());
}

pub async fn create_and_get<S: Store>(store: S) {
    const CHECK: &str = "create_and_get";
    let k = key(WIDGETS, "default", "a");
    let before = store.revision();
    let created = must(CHECK, store.create(&k, object(&k, json!({"size": 1})))).await;

    let uid = meta(&created, "uid").as_str().unwrap_or_default();
    assert!(
        uuid::Uuid::parse_str(uid).is_ok(),
        "{CHECK}: uid {uid:?} is not a UUID"
    );
    let ts = meta(&created, "creationTimestamp")
        .as_str()
        .unwrap_or_default();
    assert!(
        chrono::DateTime::parse_from_rfc3339(ts).is_ok() && ts.len() == 20 && ts.ends_with('Z'),
        "{CHECK}: creationTimestamp {ts:?} is not RFC 3339 UTC with seconds precision"
    );
    assert_eq!(generation(&created), 1, "{CHECK}: generation after create");
    assert!(
        rv(&created) > before,
        "{CHECK}: resourceVersion {} not above the previous revision {before}",
        rv(&created)
    );
    assert_eq!(
        rv(&created),
        store.revision(),
        "{CHECK}: revision() after create"
    );
    assert_eq!(
        created["spec"],
        json!({"size": 1}),
        "{CHECK}: spec was altered"
    );
    assert_eq!(meta(&created, "name"), "a", "{CHECK}: metadata.name");
    assert_eq!(
        meta(&created, "namespace"),
        "default",
        "{CHECK}: metadata.namespace"
    );

    let got = must(CHECK, store.get(&k)).await;
    assert_eq!(
        got.as_deref(),
        Some(&*created),
        "{CHECK}: get returns the created object"
    );
    for absent in [
        key(WIDGETS, "default", "b"),
        key(WIDGETS, "other", "a"),
        key(GADGETS, "default", "a"),
    ] {
        let got = must(CHECK, store.get(&absent)).await;
        assert!(
            got.is_none(),
            "{CHECK}: get {absent:?} should be None, got {got:?}"
        );
    }

    // A uid already set by the caller is kept; a caller-set resourceVersion is overwritten.
    let k2 = key(WIDGETS, "default", "with-uid");
    let mut o = object(&k2, json!({}));
    o["metadata"]["uid"] = json!("11111111-2222-4333-8444-555555555555");
    o["metadata"]["resourceVersion"] = json!("999999");
    let created2 = must(CHECK, store.create(&k2, o)).await;
    assert_eq!(
        meta(&created2, "uid"),
        "11111111-2222-4333-8444-555555555555",
        "{CHECK}: preset uid kept"
    );
    assert_eq!(
        rv(&created2),
        store.revision(),
        "{CHECK}: caller resourceVersion must be replaced"
    );
    assert_ne!(
        meta(&created2, "uid"),
        meta(&created, "uid"),
        "{CHECK}: uids must differ"
    );

    // Cluster-scoped object: empty namespace, no metadata.namespace.
    let cluster = key(GADGETS, "", "global");
    let created3 = must(CHECK, store.create(&cluster, object(&cluster, json!({})))).await;
    assert!(
        meta(&created3, "namespace").is_null(),
        "{CHECK}: cluster-scoped object got a namespace"
    );
    let got = must(CHECK, store.get(&cluster)).await;
    assert_eq!(
        got.as_deref(),
        Some(&*created3),
        "{CHECK}: get cluster-scoped object"
    );
}

/// Duplicate keys answer `AlreadyExists`, malformed objects `InvalidObject`; neither writes.
pub async fn create_rejects_duplicates_and_invalid_objects<S: Store>(store: S) {
    const CHECK: &str = "create_rejects_duplicates_and_invalid_objects";
    let k = key(WIDGETS, "ns", "dup");
    let first = must(CHECK, store.create(&k, object(&k, json!({"v": 1})))).await;
    let revision = store.revision();
    match store.create(&k, object(&k, json!({"v": 2}))).await {
        Err(StoreError::AlreadyExists(got)) => assert_eq!(got, k, "{CHECK}: AlreadyExists key"),
        other => panic!("{CHECK}: second create should be AlreadyExists, got {other:?}"),
    }
    let stored = must(CHECK, store.get(&k)).await;
    assert_eq!(
        stored.as_deref(),
        Some(&*first),
        "{CHECK}: failed create changed the object"
    );

    let cluster = key(GADGETS, "", "c");
    let mut wrong_name = object(&k, json!({}));
    wrong_name["metadata"]["name"] = json!("other");
    let mut wrong_ns = object(&k, json!({}));
    wrong_ns["metadata"]["namespace"] = json!("elsewhere");
    let mut missing_ns = object(&k, json!({}));
    missing_ns["metadata"]
        .as_object_mut()
        .map(|m| m.remove("namespace"));
    let mut ns_on_cluster = object(&cluster, json!({}));
    ns_on_cluster["metadata"]["namespace"] = json!("ns");
    let cases = [
        ("metadata.name differs from the key", k.clone(), wrong_name),
        (
            "metadata.namespace differs from the key",
            k.clone(),
            wrong_ns,
        ),
        (
            "namespaced key without metadata.namespace",
            k.clone(),
            missing_ns,
        ),
        (
            "cluster-scoped key with metadata.namespace",
            cluster.clone(),
            ns_on_cluster,
        ),
        ("not an object", cluster.clone(), json!([1, 2])),
        ("no metadata", cluster.clone(), json!({"kind": "Widget"})),
    ];
    for (what, k, o) in cases {
        match store.create(&k, o).await {
            Err(StoreError::InvalidObject(_)) => {}
            other => panic!("{CHECK}: {what}: expected InvalidObject, got {other:?}"),
        }
    }
    assert_eq!(
        store.revision(),
        revision,
        "{CHECK}: rejected creates must not advance the revision"
    );
    assert!(
        must(CHECK, store.get(&cluster)).await.is_none(),
        "{CHECK}: invalid object was stored"
    );
}

// ---------------------------------------------------------------------------------------------
// Update

/// `update`: NotFound, Conflict on a stale revision, unconditional without `expected`, uid and
/// creationTimestamp kept from the stored object.
pub async fn update_semantics<S: Store>(store: S) {
    const CHECK: &str = "update_semantics";
    let k = key(WIDGETS, "ns", "u");
    match store.update(&k, object(&k, json!({})), None).await {
        Err(StoreError::NotFound(got)) => assert_eq!(got, k, "{CHECK}: NotFound key"),
        other => panic!("{CHECK}: update of an absent object should be NotFound, got {other:?}"),
    }
    let created = must(CHECK, store.create(&k, object(&k, json!({"v": 1})))).await;
    let rev1 = rv(&created);

    // The client tampers with uid and creationTimestamp: the stored ones win.
    let mut o = object(&k, json!({"v": 2}));
    o["metadata"]["uid"] = json!("not-the-uid");
    o["metadata"]["creationTimestamp"] = json!("1999-01-01T00:00:00Z");
    let updated = must(CHECK, store.update(&k, o, Some(rev1))).await;
    let rev2 = rv(&updated);
    assert!(
        rev2 > rev1,
        "{CHECK}: update revision {rev2} not above {rev1}"
    );
    assert_eq!(rev2, store.revision(), "{CHECK}: revision() after update");
    assert_eq!(
        updated["spec"],
        json!({"v": 2}),
        "{CHECK}: update did not replace spec"
    );
    assert_eq!(
        meta(&updated, "uid"),
        meta(&created, "uid"),
        "{CHECK}: uid must be kept"
    );
    assert_eq!(
        meta(&updated, "creationTimestamp"),
        meta(&created, "creationTimestamp"),
        "{CHECK}: creationTimestamp must be kept"
    );
    let got = must(CHECK, store.get(&k)).await;
    assert_eq!(got.as_deref(), Some(&*updated), "{CHECK}: get after update");

    // Stale precondition.
    match store
        .update(&k, object(&k, json!({"v": 3})), Some(rev1))
        .await
    {
        Err(StoreError::Conflict {
            key: got,
            expected,
            actual,
        }) => {
            assert_eq!(
                (got, expected, actual),
                (k.clone(), rev1, rev2),
                "{CHECK}: Conflict fields"
            );
        }
        other => panic!("{CHECK}: stale update should be Conflict, got {other:?}"),
    }
    assert_eq!(
        store.revision(),
        rev2,
        "{CHECK}: a conflicting update must not write"
    );

    // Unconditional update; also with uid/creationTimestamp removed by the client.
    let mut o = object(&k, json!({"v": 4}));
    o["metadata"]["resourceVersion"] = json!("1");
    let updated = must(CHECK, store.update(&k, o, None)).await;
    assert!(
        rv(&updated) > rev2,
        "{CHECK}: unconditional update revision"
    );
    assert_eq!(
        meta(&updated, "uid"),
        meta(&created, "uid"),
        "{CHECK}: uid restored when omitted"
    );

    let mut wrong = object(&k, json!({}));
    wrong["metadata"]["name"] = json!("other");
    match store.update(&k, wrong, None).await {
        Err(StoreError::InvalidObject(_)) => {}
        other => {
            panic!("{CHECK}: update with a different name should be InvalidObject, got {other:?}")
        }
    }
}

/// `generation` bumps on changes outside metadata/status/apiVersion/kind only.
pub async fn generation_rules<S: Store>(store: S) {
    const CHECK: &str = "generation_rules";
    let k = key(WIDGETS, "ns", "g");
    let mut current =
        (*must(CHECK, store.create(&k, object(&k, json!({"replicas": 1})))).await).clone();
    assert_eq!(generation(&current), 1, "{CHECK}: generation after create");

    // (description, edit, expected generation afterwards)
    type Edit = fn(&mut Value);
    let steps: [(&str, Edit, i64); 7] = [
        (
            "status change",
            |o| o["status"] = json!({"phase": "Running"}),
            1,
        ),
        (
            "label change",
            |o| o["metadata"]["labels"] = json!({"app": "x"}),
            1,
        ),
        (
            "annotation change",
            |o| o["metadata"]["annotations"] = json!({"note": "y"}),
            1,
        ),
        ("spec change", |o| o["spec"]["replicas"] = json!(2), 2),
        ("new top-level field", |o| o["data"] = json!({"k": "v"}), 3),
        (
            "client-sent generation is ignored",
            |o| o["metadata"]["generation"] = json!(99),
            3,
        ),
        (
            "top-level field removed",
            |o| {
                o.as_object_mut().map(|m| m.remove("data"));
            },
            4,
        ),
    ];
    for (what, edit, want) in steps {
        let before = rv(&current);
        let mut next = current.clone();
        edit(&mut next);
        let updated = must(CHECK, store.update(&k, next, Some(before))).await;
        assert_eq!(
            generation(&updated),
            want,
            "{CHECK}: generation after {what}"
        );
        current = (*updated).clone();
    }
}

/// An update equal to the stored object (apart from resourceVersion) writes nothing: same
/// object, same revision, no event.
pub async fn noop_update_writes_nothing<S: Store>(store: S) {
    const CHECK: &str = "noop_update_writes_nothing";
    let k = key(WIDGETS, "ns", "n");
    let created = must(CHECK, store.create(&k, object(&k, json!({"x": [1, 2]})))).await;
    let revision = store.revision();
    let mut stream = watch(&store, CHECK, None, revision).await;

    // Same content, stale resourceVersion in the body, metadata fields omitted by the client.
    let mut same = object(&k, json!({"x": [1, 2]}));
    same["metadata"]["resourceVersion"] = json!("1");
    let result = must(CHECK, store.update(&k, same, None)).await;
    assert_eq!(
        *result, *created,
        "{CHECK}: no-op update must return the stored object"
    );
    assert_eq!(
        store.revision(),
        revision,
        "{CHECK}: no-op update advanced the revision"
    );
    let result = must(
        CHECK,
        store.update(&k, (*created).clone(), Some(rv(&created))),
    )
    .await;
    assert_eq!(
        rv(&result),
        rv(&created),
        "{CHECK}: no-op update with precondition changed resourceVersion"
    );

    // The next real write is the next event: the no-ops produced none.
    let changed = must(CHECK, store.update(&k, object(&k, json!({"x": [3]})), None)).await;
    let event = next_event(&mut stream, CHECK).await;
    assert_event(&event, CHECK, EventType::Modified, &k, rv(&changed));
    assert_quiet(&mut stream, CHECK).await;
}

// ---------------------------------------------------------------------------------------------
// Delete

/// `delete`: NotFound, Conflict, returns the object with the deletion revision, frees the key.
pub async fn delete_semantics<S: Store>(store: S) {
    const CHECK: &str = "delete_semantics";
    let k = key(WIDGETS, "ns", "d");
    match store.delete(&k, None).await {
        Err(StoreError::NotFound(got)) => assert_eq!(got, k, "{CHECK}: NotFound key"),
        other => panic!("{CHECK}: delete of an absent object should be NotFound, got {other:?}"),
    }
    let created = must(CHECK, store.create(&k, object(&k, json!({"v": 1})))).await;
    let updated = must(CHECK, store.update(&k, object(&k, json!({"v": 2})), None)).await;
    match store.delete(&k, Some(rv(&created))).await {
        Err(StoreError::Conflict {
            expected, actual, ..
        }) => {
            assert_eq!(
                (expected, actual),
                (rv(&created), rv(&updated)),
                "{CHECK}: Conflict fields"
            );
        }
        other => panic!("{CHECK}: stale delete should be Conflict, got {other:?}"),
    }
    assert!(
        must(CHECK, store.get(&k)).await.is_some(),
        "{CHECK}: conflicting delete removed the object"
    );

    let deleted = must(CHECK, store.delete(&k, Some(rv(&updated)))).await;
    assert!(
        rv(&deleted) > rv(&updated),
        "{CHECK}: deletion revision must be new"
    );
    assert_eq!(
        rv(&deleted),
        store.revision(),
        "{CHECK}: deletion advances revision()"
    );
    assert_eq!(
        deleted["spec"],
        json!({"v": 2}),
        "{CHECK}: deleted object is the last state"
    );
    assert_eq!(
        meta(&deleted, "uid"),
        meta(&created, "uid"),
        "{CHECK}: deleted object uid"
    );
    assert!(
        must(CHECK, store.get(&k)).await.is_none(),
        "{CHECK}: object still there after delete"
    );
    assert!(
        matches!(store.delete(&k, None).await, Err(StoreError::NotFound(_))),
        "{CHECK}: second delete should be NotFound"
    );
    let listed = must(CHECK, store.list(WIDGETS, &ListOptions::default())).await;
    assert!(
        listed.items.is_empty(),
        "{CHECK}: deleted object still listed"
    );

    let again = must(CHECK, store.create(&k, object(&k, json!({"v": 3})))).await;
    assert!(rv(&again) > rv(&deleted), "{CHECK}: re-create revision");
    assert_eq!(
        generation(&again),
        1,
        "{CHECK}: re-created object starts at generation 1"
    );
    assert_ne!(
        meta(&again, "uid"),
        meta(&created, "uid"),
        "{CHECK}: re-created object needs a new uid"
    );
}

/// One global revision across resources and namespaces, strictly increasing with every write.
pub async fn revisions_are_global_and_increasing<S: Store>(store: S) {
    const CHECK: &str = "revisions_are_global_and_increasing";
    let mut last = store.revision();
    for i in 0..5 {
        for (resource, ns) in [
            (WIDGETS, "a"),
            (GADGETS, "a"),
            (WIDGETS, "b"),
            (GADGETS, ""),
        ] {
            let k = key(resource, ns, &format!("o{i}"));
            for step in 0..2 {
                let result = if step == 0 {
                    store.create(&k, object(&k, json!({"i": i}))).await
                } else {
                    store
                        .update(&k, object(&k, json!({"i": i + 100})), None)
                        .await
                };
                let written = ok(CHECK, result);
                let revision = rv(&written);
                assert!(
                    revision > last,
                    "{CHECK}: revision {revision} after {last} for {k:?}"
                );
                assert_eq!(
                    store.revision(),
                    revision,
                    "{CHECK}: revision() is the last write"
                );
                last = revision;
            }
            if i % 2 == 0 {
                let deleted = must(CHECK, store.delete(&k, None)).await;
                assert!(
                    rv(&deleted) > last,
                    "{CHECK}: deletion revision not increasing"
                );
                last = rv(&deleted);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// List

fn names(items: &[Arc<Value>]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|o| {
            let ns = meta(o, "namespace").as_str().unwrap_or_default().to_owned();
            (ns, meta(o, "name").as_str().unwrap_or_default().to_owned())
        })
        .collect()
}

async fn create_spread<S: Store>(store: &S, check: &str) -> Vec<(String, String)> {
    let mut all = Vec::new();
    // Inserted out of order on purpose.
    for ns in ["b", "a", "c", "aa"] {
        for name in ["z", "m", "a", "m2", "b"] {
            let k = key(WIDGETS, ns, name);
            must(check, store.create(&k, object(&k, json!({})))).await;
            all.push((ns.to_owned(), name.to_owned()));
        }
    }
    // Same names in another resource must never show up.
    for ns in ["a", "b"] {
        let k = key(GADGETS, ns, "m");
        must(check, store.create(&k, object(&k, json!({})))).await;
    }
    all.sort();
    all
}

/// Lists are sorted by (namespace, name), filtered by namespace and resource, at the current
/// revision.
pub async fn list_semantics<S: Store>(store: S) {
    const CHECK: &str = "list_semantics";
    let empty = must(CHECK, store.list(WIDGETS, &ListOptions::default())).await;
    assert!(
        empty.items.is_empty() && empty.continue_after.is_none(),
        "{CHECK}: empty store lists nothing"
    );
    let all = create_spread(&store, CHECK).await;

    let listed = must(CHECK, store.list(WIDGETS, &ListOptions::default())).await;
    assert_eq!(
        names(&listed.items),
        all,
        "{CHECK}: full list order/content"
    );
    assert_eq!(listed.revision, store.revision(), "{CHECK}: list revision");
    assert!(
        listed.continue_after.is_none() && listed.remaining == 0,
        "{CHECK}: unlimited list is complete"
    );
    for item in &listed.items {
        let k = key(
            WIDGETS,
            meta(item, "namespace").as_str().unwrap_or_default(),
            meta(item, "name").as_str().unwrap_or_default(),
        );
        let got = must(CHECK, store.get(&k)).await;
        assert_eq!(
            got.as_deref(),
            Some(&**item),
            "{CHECK}: listed item equals get"
        );
    }

    for ns in ["a", "aa", "b", "c"] {
        let options = ListOptions {
            namespace: Some(ns.to_owned()),
            ..Default::default()
        };
        let listed = must(CHECK, store.list(WIDGETS, &options)).await;
        let want: Vec<_> = all.iter().filter(|(n, _)| n == ns).cloned().collect();
        assert_eq!(
            names(&listed.items),
            want,
            "{CHECK}: namespace {ns:?} filter"
        );
    }
    let options = ListOptions {
        namespace: Some("nope".into()),
        ..Default::default()
    };
    assert!(
        must(CHECK, store.list(WIDGETS, &options))
            .await
            .items
            .is_empty(),
        "{CHECK}: unknown namespace"
    );
    let unknown = must(
        CHECK,
        store.list("unknown.test.rlark.io", &ListOptions::default()),
    )
    .await;
    assert!(
        unknown.items.is_empty(),
        "{CHECK}: unknown resource lists nothing"
    );
    assert_eq!(
        unknown.revision,
        store.revision(),
        "{CHECK}: empty list still carries the revision"
    );
    let gadgets = must(CHECK, store.list(GADGETS, &ListOptions::default())).await;
    assert_eq!(gadgets.items.len(), 2, "{CHECK}: other resource count");

    // limit 0 means no limit; start_after without limit.
    let options = ListOptions {
        limit: Some(0),
        ..Default::default()
    };
    assert_eq!(
        must(CHECK, store.list(WIDGETS, &options)).await.items.len(),
        all.len(),
        "{CHECK}: limit 0"
    );
    let options = ListOptions {
        start_after: Some(("b".into(), "m".into())),
        ..Default::default()
    };
    let want: Vec<_> = all
        .iter()
        .filter(|k| *k > &("b".to_owned(), "m".to_owned()))
        .cloned()
        .collect();
    assert_eq!(
        names(&must(CHECK, store.list(WIDGETS, &options)).await.items),
        want,
        "{CHECK}: start_after"
    );
}

/// Paging with `limit` and `start_after = continue_after` covers every object exactly once.
pub async fn list_pagination<S: Store>(store: S) {
    const CHECK: &str = "list_pagination";
    let all = create_spread(&store, CHECK).await;
    for namespace in [None, Some("a"), Some("c")] {
        let want: Vec<_> = all
            .iter()
            .filter(|(ns, _)| namespace.is_none_or(|n| n == ns))
            .cloned()
            .collect();
        for limit in [1, 2, 3, 4, 7, want.len(), want.len() + 1, 100] {
            let mut seen = Vec::new();
            let mut start_after = None;
            let mut pages = 0;
            loop {
                pages += 1;
                assert!(
                    pages <= want.len() + 1,
                    "{CHECK}: pagination does not terminate"
                );
                let options = ListOptions {
                    namespace: namespace.map(str::to_owned),
                    start_after: start_after.clone(),
                    limit: Some(limit),
                };
                let page = must(CHECK, store.list(WIDGETS, &options)).await;
                assert!(
                    page.items.len() <= limit,
                    "{CHECK}: page larger than limit {limit}"
                );
                seen.extend(names(&page.items));
                match page.continue_after {
                    Some(next) => {
                        assert_eq!(
                            page.items.len(),
                            limit,
                            "{CHECK}: short page with continue_after"
                        );
                        assert_eq!(next.resource, WIDGETS, "{CHECK}: continue_after resource");
                        assert_eq!(
                            Some(&(next.namespace.clone(), next.name.clone())),
                            seen.last(),
                            "{CHECK}: continue_after is the last item returned"
                        );
                        assert_eq!(
                            page.remaining as usize,
                            want.len() - seen.len(),
                            "{CHECK}: remaining (limit {limit}, ns {namespace:?})"
                        );
                        start_after = Some((next.namespace, next.name));
                    }
                    None => {
                        assert_eq!(page.remaining, 0, "{CHECK}: remaining on the last page");
                        break;
                    }
                }
            }
            assert_eq!(
                seen, want,
                "{CHECK}: pages (limit {limit}, namespace {namespace:?}) must cover every object once, in order"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Watch

/// A watch from a revision replays exactly the later events in order, then streams live ones;
/// a Deleted event carries the deletion revision.
pub async fn watch_replays_then_streams<S: Store>(store: S) {
    const CHECK: &str = "watch_replays_then_streams";
    let (ka, kb, kc) = (
        key(WIDGETS, "ns", "a"),
        key(WIDGETS, "ns", "b"),
        key(WIDGETS, "ns2", "c"),
    );
    let start = store.revision();
    let a1 = must(CHECK, store.create(&ka, object(&ka, json!({"v": 1})))).await;
    let b1 = must(CHECK, store.create(&kb, object(&kb, json!({"v": 1})))).await;
    let a2 = must(CHECK, store.update(&ka, object(&ka, json!({"v": 2})), None)).await;

    // From the start: all three.
    let mut stream = watch(&store, CHECK, None, start).await;
    for (event_type, k, o) in [
        (EventType::Added, &ka, &a1),
        (EventType::Added, &kb, &b1),
        (EventType::Modified, &ka, &a2),
    ] {
        let event = next_event(&mut stream, CHECK).await;
        assert_event(&event, CHECK, event_type, k, rv(o));
        assert_eq!(
            *event.object, **o,
            "{CHECK}: event object equals the written object"
        );
    }

    // From a1: only the later two, then live events.
    let mut stream = watch(&store, CHECK, None, rv(&a1)).await;
    assert_event(
        &next_event(&mut stream, CHECK).await,
        CHECK,
        EventType::Added,
        &kb,
        rv(&b1),
    );
    assert_event(
        &next_event(&mut stream, CHECK).await,
        CHECK,
        EventType::Modified,
        &ka,
        rv(&a2),
    );
    let deleted = must(CHECK, store.delete(&kb, None)).await;
    let c1 = must(CHECK, store.create(&kc, object(&kc, json!({})))).await;
    let event = next_event(&mut stream, CHECK).await;
    assert_event(&event, CHECK, EventType::Deleted, &kb, rv(&deleted));
    assert_eq!(
        event.object["spec"],
        json!({"v": 1}),
        "{CHECK}: Deleted event carries the last state"
    );
    assert_eq!(
        meta(&event.object, "uid"),
        meta(&b1, "uid"),
        "{CHECK}: Deleted event uid"
    );
    assert_event(
        &next_event(&mut stream, CHECK).await,
        CHECK,
        EventType::Added,
        &kc,
        rv(&c1),
    );
    assert_quiet(&mut stream, CHECK).await;

    // From the current revision: nothing until the next write.
    let mut stream = watch(&store, CHECK, None, store.revision()).await;
    assert_quiet(&mut stream, CHECK).await;
    let a3 = must(
        CHECK,
        store.update(&ka, object(&ka, json!({"v": 3})), Some(rv(&a2))),
    )
    .await;
    assert_event(
        &next_event(&mut stream, CHECK).await,
        CHECK,
        EventType::Modified,
        &ka,
        rv(&a3),
    );
}

/// Watches see only their resource and, when given, their namespace.
pub async fn watch_filters<S: Store>(store: S) {
    const CHECK: &str = "watch_filters";
    let from = store.revision();
    let mut in_a = watch(&store, CHECK, Some("a"), from).await;
    let mut all = watch(&store, CHECK, None, from).await;
    let (wa, wb, ga, cluster) = (
        key(WIDGETS, "a", "x"),
        key(WIDGETS, "b", "x"),
        key(GADGETS, "a", "x"),
        key(GADGETS, "", "x"),
    );
    let owb = must(CHECK, store.create(&wb, object(&wb, json!({})))).await;
    must(CHECK, store.create(&ga, object(&ga, json!({})))).await;
    must(CHECK, store.create(&cluster, object(&cluster, json!({})))).await;
    let owa = must(CHECK, store.create(&wa, object(&wa, json!({})))).await;

    assert_event(
        &next_event(&mut in_a, CHECK).await,
        CHECK,
        EventType::Added,
        &wa,
        rv(&owa),
    );
    assert_quiet(&mut in_a, CHECK).await;
    assert_event(
        &next_event(&mut all, CHECK).await,
        CHECK,
        EventType::Added,
        &wb,
        rv(&owb),
    );
    assert_event(
        &next_event(&mut all, CHECK).await,
        CHECK,
        EventType::Added,
        &wa,
        rv(&owa),
    );
    assert_quiet(&mut all, CHECK).await;

    // Replay is filtered the same way.
    let mut replay = watch(&store, CHECK, Some("b"), from).await;
    assert_event(
        &next_event(&mut replay, CHECK).await,
        CHECK,
        EventType::Added,
        &wb,
        rv(&owb),
    );
    assert_quiet(&mut replay, CHECK).await;
}

/// Watching from a revision not reached yet waits; events at or below it are skipped.
pub async fn watch_from_future_revision<S: Store>(store: S) {
    const CHECK: &str = "watch_from_future_revision";
    let from = store.revision() + 1;
    let mut stream = watch(&store, CHECK, None, from).await;
    let mut expected = Vec::new();
    for i in 0..3 {
        let k = key(WIDGETS, "ns", &format!("f{i}"));
        let written = must(CHECK, store.create(&k, object(&k, json!({})))).await;
        if rv(&written) > from {
            expected.push((k, rv(&written)));
        }
    }
    assert!(
        !expected.is_empty(),
        "{CHECK}: three writes did not pass revision {from}"
    );
    for (k, revision) in &expected {
        assert_event(
            &next_event(&mut stream, CHECK).await,
            CHECK,
            EventType::Added,
            k,
            *revision,
        );
    }
    assert_quiet(&mut stream, CHECK).await;
}

/// After `compact(r)`, watches from below `r` answer `Expired`; from `r` they replay the rest.
pub async fn compaction_expires_old_watches<S: Store>(store: S) {
    const CHECK: &str = "compaction_expires_old_watches";
    let mut revisions = Vec::new();
    for i in 0..5 {
        let k = key(WIDGETS, "ns", &format!("c{i}"));
        let written = must(CHECK, store.create(&k, object(&k, json!({})))).await;
        revisions.push(rv(&written));
    }
    let r3 = revisions[2];
    must(CHECK, store.compact(r3)).await;
    assert_eq!(
        store.compacted_revision(),
        r3,
        "{CHECK}: compacted_revision after compact"
    );
    match store.watch(WIDGETS, None, revisions[1]).await {
        Err(StoreError::Expired { requested, oldest }) => {
            assert_eq!(
                (requested, oldest),
                (revisions[1], r3),
                "{CHECK}: Expired fields"
            );
        }
        Err(e) => panic!("{CHECK}: watch from a compacted revision should be Expired, got {e:?}"),
        Ok(_) => panic!("{CHECK}: watch from a compacted revision should be Expired, got a stream"),
    }
    let mut stream = watch(&store, CHECK, None, r3).await;
    for revision in &revisions[3..] {
        let event = next_event(&mut stream, CHECK).await;
        assert_eq!(
            event.revision, *revision,
            "{CHECK}: replay after compaction"
        );
    }
    assert_quiet(&mut stream, CHECK).await;

    // Compacting backwards is a no-op; compacting past the present stops at the present.
    must(CHECK, store.compact(revisions[0])).await;
    assert_eq!(
        store.compacted_revision(),
        r3,
        "{CHECK}: compaction went backwards"
    );
    must(CHECK, store.compact(Revision::MAX)).await;
    assert_eq!(
        store.compacted_revision(),
        store.revision(),
        "{CHECK}: compact beyond the present"
    );
    let mut stream = watch(&store, CHECK, None, store.revision()).await;
    let k = key(WIDGETS, "ns", "after");
    let written = must(CHECK, store.create(&k, object(&k, json!({})))).await;
    assert_event(
        &next_event(&mut stream, CHECK).await,
        CHECK,
        EventType::Added,
        &k,
        rv(&written),
    );
}

/// Lists at an older revision the change log covers show the state then (one snapshot across
/// pages); below the log's floor, or for an object whose state then is older than the log,
/// they are `Expired`; at the current revision they are the live list.
pub async fn list_at_older_revisions<S: Store>(store: S) {
    const CHECK: &str = "list_at_older_revisions";
    let names_at = |revision: Revision, limit: Option<usize>| {
        let store = &store;
        async move {
            let mut names = Vec::new();
            let mut start_after = None;
            loop {
                let options = ListOptions {
                    namespace: Some("ns".into()),
                    start_after: start_after.take(),
                    limit,
                };
                let page = store.list_encoded_at(WIDGETS, &options, revision).await?;
                assert_eq!(page.revision, revision, "{CHECK}: page revision");
                for item in &page.items {
                    assert_eq!(
                        *item.json,
                        serde_json::to_string(&*item.object).expect("json"),
                        "{CHECK}: encoding"
                    );
                    names.push(format!(
                        "{}={}",
                        item.object["metadata"]["name"].as_str().unwrap_or(""),
                        item.object["spec"]["v"]
                    ));
                }
                match page.continue_after {
                    Some(after) => start_after = Some((after.namespace, after.name)),
                    None => return Ok::<_, StoreError>(names),
                }
            }
        }
    };
    let (a, b, c) = (
        key(WIDGETS, "ns", "a"),
        key(WIDGETS, "ns", "b"),
        key(WIDGETS, "ns", "c"),
    );
    let r1 = rv(&*must(CHECK, store.create(&a, object(&a, json!({"v": 1})))).await);
    let r2 = rv(&*must(CHECK, store.create(&b, object(&b, json!({"v": 1})))).await);
    let r3 = rv(&*must(CHECK, store.update(&a, object(&a, json!({"v": 2})), None)).await);
    let r4 = rv(&*must(CHECK, store.delete(&b, None)).await);
    let r5 = rv(&*must(CHECK, store.create(&c, object(&c, json!({"v": 1})))).await);
    let expected = [
        (r1, vec!["a=1"]),
        (r2, vec!["a=1", "b=1"]),
        (r3, vec!["a=2", "b=1"]),
        (r4, vec!["a=2"]),
        (r5, vec!["a=2", "c=1"]),
    ];
    for (revision, names) in &expected {
        for limit in [None, Some(1)] {
            let listed = names_at(*revision, limit)
                .await
                .unwrap_or_else(|e| panic!("{CHECK}: list at {revision}: {e:?}"));
            assert_eq!(
                &listed, names,
                "{CHECK}: list at {revision}, limit {limit:?}"
            );
        }
    }
    // Writes after the first page do not show in the next pages of an older snapshot.
    let d = key(WIDGETS, "ns", "d");
    must(CHECK, store.create(&d, object(&d, json!({"v": 1})))).await;
    assert_eq!(
        names_at(r5, Some(1)).await.expect("list"),
        vec!["a=2", "c=1"],
        "{CHECK}: snapshot"
    );

    // Below the floor, and an object whose state then is older than the log: Expired.
    must(CHECK, store.compact(r5)).await;
    assert!(
        matches!(names_at(r4, None).await, Err(StoreError::Expired { .. })),
        "{CHECK}: list below the floor"
    );
    must(CHECK, store.update(&c, object(&c, json!({"v": 2})), None)).await;
    assert!(
        matches!(names_at(r5, None).await, Err(StoreError::Expired { .. })),
        "{CHECK}: c's state at r5 is older than the log"
    );
    let now = store.revision();
    assert_eq!(
        names_at(now, None).await.expect("list at the present"),
        vec!["a=2", "c=2", "d=1"],
        "{CHECK}: list at the present"
    );
}

// ---------------------------------------------------------------------------------------------
// Concurrency

/// 32 tasks × 50 creates: every write acknowledged, revisions distinct, everything listed.
pub async fn concurrent_creates<S: Store>(store: S) {
    const CHECK: &str = "concurrent_creates";
    const TASKS: usize = 32;
    const PER_TASK: usize = 50;
    let store = Arc::new(store);
    let start = store.revision();
    let mut handles = Vec::new();
    for t in 0..TASKS {
        let store = Arc::clone(&store);
        handles.push(tokio::spawn(async move {
            let mut revisions = Vec::with_capacity(PER_TASK);
            for i in 0..PER_TASK {
                let k = key(WIDGETS, &format!("ns{}", t % 4), &format!("t{t}-{i}"));
                let written =
                    must(CHECK, store.create(&k, object(&k, json!({"t": t, "i": i})))).await;
                revisions.push(rv(&written));
            }
            revisions
        }));
    }
    let mut all = HashSet::new();
    for handle in handles {
        let revisions = handle
            .await
            .unwrap_or_else(|e| panic!("{CHECK}: task failed: {e}"));
        // Per task, writes are sequential, so their revisions increase.
        assert!(
            revisions.windows(2).all(|w| w[0] < w[1]),
            "{CHECK}: sequential writes out of order"
        );
        for revision in revisions {
            assert!(
                revision > start,
                "{CHECK}: revision {revision} not above start {start}"
            );
            assert!(
                all.insert(revision),
                "{CHECK}: revision {revision} given twice"
            );
        }
    }
    assert_eq!(all.len(), TASKS * PER_TASK, "{CHECK}: acknowledged writes");
    assert_eq!(
        all.iter().max().copied(),
        Some(store.revision()),
        "{CHECK}: revision() is the newest write"
    );
    let listed = must(CHECK, store.list(WIDGETS, &ListOptions::default())).await;
    assert_eq!(
        listed.items.len(),
        TASKS * PER_TASK,
        "{CHECK}: listed objects"
    );
}

/// Racing creates of one key: exactly one wins, the others get `AlreadyExists`.
pub async fn concurrent_creates_of_one_key<S: Store>(store: S) {
    const CHECK: &str = "concurrent_creates_of_one_key";
    let store = Arc::new(store);
    for round in 0..10 {
        let k = key(WIDGETS, "ns", &format!("race{round}"));
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (store, k) = (Arc::clone(&store), k.clone());
                tokio::spawn(
                    async move { store.create(&k, object(&k, json!({"writer": i}))).await },
                )
            })
            .collect();
        let mut won = 0;
        for handle in handles {
            match handle
                .await
                .unwrap_or_else(|e| panic!("{CHECK}: task failed: {e}"))
            {
                Ok(_) => won += 1,
                Err(StoreError::AlreadyExists(_)) => {}
                Err(e) => panic!("{CHECK}: unexpected error {e:?}"),
            }
        }
        assert_eq!(
            won, 1,
            "{CHECK}: round {round}: {won} creates of one key succeeded"
        );
    }
}

/// Two updates with the same `expected` revision race: exactly one wins, the other gets
/// `Conflict`.
pub async fn concurrent_conflicting_updates<S: Store>(store: S) {
    const CHECK: &str = "concurrent_conflicting_updates";
    let store = Arc::new(store);
    let k = key(WIDGETS, "ns", "contended");
    let created = must(CHECK, store.create(&k, object(&k, json!({"n": 0})))).await;
    let mut current = rv(&created);
    for round in 0..20 {
        let handles: Vec<_> = (0..2)
            .map(|writer| {
                let (store, k) = (Arc::clone(&store), k.clone());
                let o = object(&k, json!({"round": round, "writer": writer}));
                tokio::spawn(async move { store.update(&k, o, Some(current)).await })
            })
            .collect();
        let mut winners = Vec::new();
        for handle in handles {
            match handle
                .await
                .unwrap_or_else(|e| panic!("{CHECK}: task failed: {e}"))
            {
                Ok(o) => winners.push(rv(&o)),
                Err(StoreError::Conflict { expected, .. }) => {
                    assert_eq!(expected, current, "{CHECK}: Conflict.expected");
                }
                Err(e) => panic!("{CHECK}: unexpected error {e:?}"),
            }
        }
        assert_eq!(
            winners.len(),
            1,
            "{CHECK}: round {round}: {} updates won",
            winners.len()
        );
        current = winners[0];
        let stored = must(CHECK, store.get(&k))
            .await
            .unwrap_or_else(|| panic!("{CHECK}: object vanished"));
        assert_eq!(
            rv(&stored),
            current,
            "{CHECK}: stored revision is the winner's"
        );
    }
}

/// A watch started while writers are busy sees every later write exactly once, in order.
pub async fn watch_during_concurrent_writes<S: Store>(store: S) {
    const CHECK: &str = "watch_during_concurrent_writes";
    const TASKS: usize = 4;
    const PER_TASK: usize = 100;
    let store = Arc::new(store);
    let start = store.revision();
    let handles: Vec<_> = (0..TASKS)
        .map(|t| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let mut revisions = Vec::new();
                for i in 0..PER_TASK {
                    let k = key(WIDGETS, "ns", &format!("w{t}-{i}"));
                    let written = must(CHECK, store.create(&k, object(&k, json!({})))).await;
                    revisions.push(rv(&written));
                }
                revisions
            })
        })
        .collect();
    // Join in while the writers are running.
    let mut waited = Duration::ZERO;
    while store.revision() < start + (TASKS * PER_TASK / 4) as Revision && waited < EVENT_TIMEOUT {
        tokio::time::sleep(Duration::from_millis(1)).await;
        waited += Duration::from_millis(1);
    }
    let from = store.revision();
    let mut stream = watch(&*store, CHECK, None, from).await;
    let mut expected = Vec::new();
    for handle in handles {
        let revisions = handle
            .await
            .unwrap_or_else(|e| panic!("{CHECK}: task failed: {e}"));
        expected.extend(revisions.into_iter().filter(|r| *r > from));
    }
    expected.sort_unstable();
    let mut got = Vec::with_capacity(expected.len());
    for _ in 0..expected.len() {
        got.push(next_event(&mut stream, CHECK).await.revision);
    }
    assert_eq!(
        got, expected,
        "{CHECK}: events after {from} (no gaps, no duplicates, in order)"
    );
    assert_quiet(&mut stream, CHECK).await;
}
