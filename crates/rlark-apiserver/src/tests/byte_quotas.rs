//! Byte quotas (issue 38, finding 2: "the 10,000-object quota counts objects, not bytes"):
//! what an agent's namespace holds and what a task token's Events about its Task hold are
//! bounded in bytes, checked before the write, 429 naming the quota. Through the real
//! router, as the agent of cluster `a` and as the token of Task `default/t`.

use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::*;
use crate::limits::Limits;

const A: &str = "rlark-a";

fn padded_lease(namespace: &str, name: &str, pad: usize) -> Value {
    let mut lease = lease(namespace, name);
    lease["metadata"]["annotations"] = json!({"pad": "p".repeat(pad)});
    lease
}

async fn harness(limits: Limits) -> Harness {
    let h = Harness::with_options(ApiServerOptions {
        limits,
        ..fast_options()
    })
    .await;
    h.create(NAMESPACES, &namespace(A)).await;
    h
}

fn assert_quota(answer: &Answer, quota: &str) {
    assert_eq!(
        answer.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        answer.body
    );
    assert_eq!(answer.reason(), "TooManyRequests");
    assert!(
        answer.message().contains(quota),
        "{:?} does not name {quota}",
        answer.message()
    );
}

#[tokio::test]
async fn an_agent_namespace_is_bounded_in_bytes() {
    let h = harness(Limits {
        max_bytes_per_agent_namespace: 100_000,
        ..Limits::default()
    })
    .await;
    let agent = Identity::agent("a");
    let uri = leases(A);
    // 30 kB Leases: three fit in 100 kB, the fourth does not.
    for i in 0..3 {
        let answer = h
            .call_as(
                Some(&agent),
                Method::POST,
                &uri,
                Some(&padded_lease(A, &format!("l{i}"), 30_000)),
            )
            .await;
        assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    }
    let answer = h
        .call_as(
            Some(&agent),
            Method::POST,
            &uri,
            Some(&padded_lease(A, "l3", 30_000)),
        )
        .await;
    assert_quota(&answer, "maxBytesPerAgentNamespace");
    assert!(answer.message().contains(A), "{}", answer.message());
    // Growing one is refused as well; shrinking and deleting are not.
    let grow = h
        .call_as(
            Some(&agent),
            Method::PUT,
            &format!("{uri}/l0"),
            Some(&padded_lease(A, "l0", 60_000)),
        )
        .await;
    assert_quota(&grow, "maxBytesPerAgentNamespace");
    let shrink = h
        .call_as(
            Some(&agent),
            Method::PUT,
            &format!("{uri}/l0"),
            Some(&padded_lease(A, "l0", 10)),
        )
        .await;
    assert_eq!(shrink.status, StatusCode::OK, "{}", shrink.body);
    // The room freed by shrinking takes one more.
    let again = h
        .call_as(
            Some(&agent),
            Method::POST,
            &uri,
            Some(&padded_lease(A, "l3", 30_000)),
        )
        .await;
    assert_eq!(again.status, StatusCode::CREATED, "{}", again.body);
    // Admins are not held to an agent's quota.
    let admin_write = h.post(&uri, &padded_lease(A, "admin", 30_000)).await;
    assert_eq!(
        admin_write.status,
        StatusCode::CREATED,
        "{}",
        admin_write.body
    );
}

fn event_about(task: &str, name: &str, pad: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "annotations": {"pad": "p".repeat(pad)}},
        "involvedObject": {"apiVersion": "rlinf.io/v1alpha1", "kind": "Task", "name": task, "namespace": "default"},
        "reason": "Progress", "message": "step", "type": "Normal",
    })
}

#[tokio::test]
async fn a_task_tokens_events_are_bounded_in_bytes() {
    let h = harness(Limits {
        max_event_bytes_per_task: 70_000,
        ..Limits::default()
    })
    .await;
    h.create(&tasks("default"), &task("default", "t")).await;
    let token = Identity::task("default", "t");
    let uri = "/api/v1/namespaces/default/events";
    // 15 kB Events (under the 16 KiB Event limit): four fit in 70 kB, the fifth does not.
    for i in 0..4 {
        let answer = h
            .call_as(
                Some(&token),
                Method::POST,
                uri,
                Some(&event_about("t", &format!("e{i}"), 15_000)),
            )
            .await;
        assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    }
    let answer = h
        .call_as(
            Some(&token),
            Method::POST,
            uri,
            Some(&event_about("t", "e4", 15_000)),
        )
        .await;
    assert_quota(&answer, "maxEventBytesPerTask");
    // Another Task's token has its own quota.
    h.create(&tasks("default"), &task("default", "u")).await;
    let other = h
        .call_as(
            Some(&Identity::task("default", "u")),
            Method::POST,
            uri,
            Some(&event_about("u", "f0", 15_000)),
        )
        .await;
    assert_eq!(other.status, StatusCode::CREATED, "{}", other.body);
}

/// An agent or task token holds a bounded number of open watches (each bounded by the
/// store's per-watch budget): the next is 429 naming the limit until one ends.
#[tokio::test]
async fn open_watches_per_identity_are_bounded() {
    let h = harness(Limits {
        max_watches_per_identity: 2,
        ..Limits::default()
    })
    .await;
    let agent = Identity::agent("a");
    let uri = format!("{}?watch=true", leases(A));
    let open = |identity: Identity| {
        let (h, uri) = (&h, uri.clone());
        async move {
            h.send_as(
                Some(&identity),
                Method::GET,
                &uri,
                "",
                None,
                Default::default(),
            )
            .await
        }
    };
    let first = open(agent.clone()).await;
    let second = open(agent.clone()).await;
    assert_eq!(
        (first.status(), second.status()),
        (StatusCode::OK, StatusCode::OK)
    );
    let third = Harness::answer(open(agent.clone()).await).await;
    assert_quota(&third, "maxWatchesPerIdentity");
    // Other identities and admins have their own.
    let other = h
        .send_as(
            Some(&Identity::agent("b")),
            Method::GET,
            &format!("{}?watch=true", leases("rlark-b")),
            "",
            None,
            Default::default(),
        )
        .await;
    assert_eq!(other.status(), StatusCode::OK);
    for _ in 0..3 {
        assert_eq!(open(admin()).await.status(), StatusCode::OK);
    }
    // A watch that ends frees its slot.
    drop(first);
    assert_eq!(open(agent).await.status(), StatusCode::OK);
}
