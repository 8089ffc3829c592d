//! Authorization through the real router: who gets 200, who gets 403 (and what the 403
//! says), that a denial touches nothing, and that every denial is audited.

use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::*;
use crate::auth::VIEWER_GROUP;
use crate::patch::MERGE_PATCH;

fn viewer() -> Identity {
    Identity {
        user: "alice".into(),
        groups: vec![VIEWER_GROUP.into()],
    }
}

fn nobody() -> Identity {
    Identity {
        user: "bob".into(),
        groups: vec!["developers".into()],
    }
}

fn events(namespace: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/events")
}

fn event_about(namespace: &str, name: &str, task: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": {"apiVersion": "rlinf.io/v1alpha1", "kind": "Task", "name": task, "namespace": namespace},
        "reason": "Started", "message": "hello", "type": "Normal"
    })
}

/// A harness with the agent namespaces `rlark-a` and `rlark-b`.
async fn harness() -> Harness {
    let h = Harness::new().await;
    h.create(NAMESPACES, &namespace("rlark-a")).await;
    h.create(NAMESPACES, &namespace("rlark-b")).await;
    h
}

/// Assert a 403 `Status` with exactly `message`, and return it.
fn assert_forbidden(answer: &Answer, message: &str) {
    assert_eq!(answer.status, StatusCode::FORBIDDEN, "{}", answer.body);
    assert_eq!(answer.body["kind"], "Status");
    assert_eq!(answer.body["code"], 403);
    assert_eq!(answer.reason(), "Forbidden");
    assert_eq!(answer.message(), message);
}

/// The audit records of denials so far.
fn denials(h: &Harness) -> Vec<crate::audit::AuditEntry> {
    h.audit
        .entries()
        .into_iter()
        .filter(|e| e.action == "denied")
        .collect()
}

#[tokio::test]
async fn viewers_read_but_do_not_write() {
    let h = harness().await;
    h.create(JOBS, &job("j1")).await;
    let alice = viewer();

    let list = h.call_as(Some(&alice), Method::GET, JOBS, None).await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.body);
    assert_eq!(list.body["items"][0]["metadata"]["name"], "j1");
    let got = h
        .call_as(Some(&alice), Method::GET, &format!("{JOBS}/j1"), None)
        .await;
    assert_eq!(got.status, StatusCode::OK);

    let before = h.revision();
    let created = h
        .call_as(Some(&alice), Method::POST, JOBS, Some(&job("j2")))
        .await;
    assert_forbidden(
        &created,
        r#"jobs.rlinf.io is forbidden: User "alice" cannot create resource "jobs" in API group "rlinf.io" at the cluster scope"#,
    );
    assert_eq!(
        created.body["details"],
        json!({"group": "rlinf.io", "kind": "jobs"})
    );
    let deleted = h
        .call_as(Some(&alice), Method::DELETE, &format!("{JOBS}/j1"), None)
        .await;
    assert_forbidden(
        &deleted,
        r#"jobs.rlinf.io "j1" is forbidden: User "alice" cannot delete resource "jobs" in API group "rlinf.io" at the cluster scope"#,
    );
    assert_eq!(
        deleted.body["details"],
        json!({"name": "j1", "group": "rlinf.io", "kind": "jobs"})
    );
    // The body is never read: garbage is refused as forbidden, not as a bad request.
    let garbage = Harness::answer(
        h.send_as(
            Some(&alice),
            Method::PUT,
            &format!("{JOBS}/j1"),
            "application/json",
            None,
            Bytes::from_static(b"{not json"),
        )
        .await,
    )
    .await;
    assert_eq!(garbage.status, StatusCode::FORBIDDEN, "{}", garbage.body);
    assert_eq!(h.revision(), before, "a denied request writes nothing");
    assert!(h.exists(&format!("{JOBS}/j1")).await);
    assert!(!h.exists(&format!("{JOBS}/j2")).await);

    let denied = denials(&h);
    assert_eq!(denied.len(), 3, "{denied:?}");
    let delete = &denied[1];
    assert_eq!(
        (
            delete.decision.as_str(),
            delete.user.as_str(),
            delete.verb.as_str(),
            delete.resource.as_str(),
            delete.namespace.as_str(),
            delete.name.as_str(),
        ),
        ("denied", "alice", "delete", "jobs.rlinf.io", "", "j1")
    );
    assert_eq!(delete.groups, vec![VIEWER_GROUP.to_string()]);
    assert_eq!(
        delete.reason,
        r#"User "alice" cannot delete resource "jobs" in API group "rlinf.io" at the cluster scope"#
    );

    // The per-request metrics count the 403s.
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &h.metrics).unwrap();
    assert!(
        text.contains(
            r#"rlark_apiserver_requests_total{verb="create",resource="jobs",code="403"} 1"#
        ),
        "{text}"
    );
}

#[tokio::test]
async fn agents_write_only_in_their_own_namespace() {
    let h = harness().await;
    let agent = Identity::agent("a");

    let created = h
        .call_as(
            Some(&agent),
            Method::POST,
            &tasks("rlark-a"),
            Some(&task("rlark-a", "t1")),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let patched = Harness::answer(
        h.send_as(
            Some(&agent),
            Method::PATCH,
            &format!("{}/t1/status", tasks("rlark-a")),
            MERGE_PATCH,
            None,
            Bytes::from(json!({"status": {"phase": "Running"}}).to_string()),
        )
        .await,
    )
    .await;
    assert_eq!(patched.status, StatusCode::OK, "{}", patched.body);
    let own_ns = h
        .call_as(
            Some(&agent),
            Method::GET,
            &format!("{NAMESPACES}/rlark-a"),
            None,
        )
        .await;
    assert_eq!(own_ns.status, StatusCode::OK, "{}", own_ns.body);

    let before = h.revision();
    let foreign = h
        .call_as(
            Some(&agent),
            Method::POST,
            &tasks("rlark-b"),
            Some(&task("rlark-b", "t1")),
        )
        .await;
    assert_forbidden(
        &foreign,
        r#"tasks.rlinf.io is forbidden: User "system:rlark:agent:a" cannot create resource "tasks" in API group "rlinf.io" in the namespace "rlark-b""#,
    );
    let read = h
        .call_as(Some(&agent), Method::GET, &tasks("rlark-b"), None)
        .await;
    assert_eq!(read.status, StatusCode::FORBIDDEN);
    let everywhere = h
        .call_as(
            Some(&agent),
            Method::GET,
            "/apis/rlinf.io/v1alpha1/tasks",
            None,
        )
        .await;
    assert_forbidden(
        &everywhere,
        r#"tasks.rlinf.io is forbidden: User "system:rlark:agent:a" cannot list resource "tasks" in API group "rlinf.io" at the cluster scope"#,
    );
    let (watch_status, _) = {
        let response = h
            .send_as(
                Some(&agent),
                Method::GET,
                "/apis/rlinf.io/v1alpha1/tasks?watch=true",
                "",
                None,
                Bytes::new(),
            )
            .await;
        (response.status(), response)
    };
    assert_eq!(watch_status, StatusCode::FORBIDDEN);
    let job = h
        .call_as(Some(&agent), Method::POST, JOBS, Some(&job("j1")))
        .await;
    assert_eq!(job.status, StatusCode::FORBIDDEN);
    assert_eq!(h.revision(), before, "a denied request writes nothing");

    let denied = denials(&h);
    assert_eq!(denied.len(), 5, "{denied:?}");
    assert_eq!(
        (
            denied[0].user.as_str(),
            denied[0].verb.as_str(),
            denied[0].resource.as_str(),
            denied[0].namespace.as_str()
        ),
        (
            "system:rlark:agent:a",
            "create",
            "tasks.rlinf.io",
            "rlark-b"
        )
    );
    assert!(denied.iter().all(|e| e.decision == "denied"));
}

#[tokio::test]
async fn task_tokens_read_themselves_and_post_events_about_themselves() {
    let h = harness().await;
    h.create(&tasks("rlark-a"), &task("rlark-a", "t1")).await;
    h.create(&tasks("rlark-a"), &task("rlark-a", "t2")).await;
    let token = Identity::task("rlark-a", "t1");

    let own = h
        .call_as(
            Some(&token),
            Method::GET,
            &format!("{}/t1", tasks("rlark-a")),
            None,
        )
        .await;
    assert_eq!(own.status, StatusCode::OK, "{}", own.body);
    assert_eq!(own.body["metadata"]["name"], "t1");
    let other = h
        .call_as(
            Some(&token),
            Method::GET,
            &format!("{}/t2", tasks("rlark-a")),
            None,
        )
        .await;
    assert_forbidden(
        &other,
        r#"tasks.rlinf.io "t2" is forbidden: User "system:rlark:task:rlark-a:t1" cannot get resource "tasks" in API group "rlinf.io" in the namespace "rlark-a""#,
    );
    let list = h
        .call_as(Some(&token), Method::GET, &tasks("rlark-a"), None)
        .await;
    assert_eq!(list.status, StatusCode::FORBIDDEN);

    let posted = h
        .call_as(
            Some(&token),
            Method::POST,
            &events("rlark-a"),
            Some(&event_about("rlark-a", "e1", "t1")),
        )
        .await;
    assert_eq!(posted.status, StatusCode::CREATED, "{}", posted.body);

    let before = h.revision();
    let about_other = h
        .call_as(
            Some(&token),
            Method::POST,
            &events("rlark-a"),
            Some(&event_about("rlark-a", "e2", "t2")),
        )
        .await;
    assert_forbidden(
        &about_other,
        r#"events "e2" is forbidden: User "system:rlark:task:rlark-a:t1" may only create events whose involvedObject is its own Task (kind "Task", name "t1", namespace "rlark-a")"#,
    );
    assert_eq!(
        about_other.body["details"],
        json!({"name": "e2", "kind": "events"})
    );
    let elsewhere = h
        .call_as(
            Some(&token),
            Method::POST,
            &events("rlark-b"),
            Some(&event_about("rlark-b", "e3", "t1")),
        )
        .await;
    assert_eq!(elsewhere.status, StatusCode::FORBIDDEN);
    let read_events = h
        .call_as(Some(&token), Method::GET, &events("rlark-a"), None)
        .await;
    assert_eq!(read_events.status, StatusCode::FORBIDDEN);
    assert_eq!(h.revision(), before, "a denied request writes nothing");

    let denied = denials(&h);
    assert_eq!(denied.len(), 5, "{denied:?}");
    let event = &denied[2];
    assert_eq!(
        (
            event.verb.as_str(),
            event.resource.as_str(),
            event.namespace.as_str(),
            event.name.as_str()
        ),
        ("create", "events", "rlark-a", "e2")
    );
    assert!(event.reason.contains("its own Task"), "{}", event.reason);
}

#[tokio::test]
async fn discovery_is_open_to_every_authenticated_identity() {
    let h = harness().await;
    for identity in [viewer(), nobody(), Identity::agent("a")] {
        for uri in [
            "/api",
            "/api/v1",
            "/apis",
            "/apis/rlinf.io/v1alpha1",
            "/version",
            "/openapi/v2",
        ] {
            let answer = h.call_as(Some(&identity), Method::GET, uri, None).await;
            assert_eq!(answer.status, StatusCode::OK, "{} {uri}", identity.user);
        }
    }
    // Without a role, resources stay closed.
    let jobs = h.call_as(Some(&nobody()), Method::GET, JOBS, None).await;
    assert_forbidden(
        &jobs,
        r#"jobs.rlinf.io is forbidden: User "bob" cannot list resource "jobs" in API group "rlinf.io" at the cluster scope"#,
    );
    // Anonymous requests are still 401, for discovery and resources alike, and not audited
    // as denials.
    for uri in ["/apis", JOBS] {
        let answer = h.call_as(None, Method::GET, uri, None).await;
        assert_eq!(
            (answer.status, answer.reason()),
            (StatusCode::UNAUTHORIZED, "Unauthorized"),
            "{uri}"
        );
    }
    assert_eq!(denials(&h).len(), 1);
}
