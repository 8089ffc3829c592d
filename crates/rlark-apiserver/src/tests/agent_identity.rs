//! What an agent writes cannot pass for another cluster or component (issue 14, finding
//! 2): identity labels are the server's, Nodes are bounded in number and capacity and
//! marked as agent-reported, Events report as the agent. Through the real router, as the
//! agent of cluster `a`.

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::*;
use crate::patch::MERGE_PATCH;

const A: &str = "rlark-a";

fn agent_a() -> Identity {
    Identity::agent("a")
}

fn nodes(namespace: &str) -> String {
    format!("/apis/rlinf.io/v1alpha1/namespaces/{namespace}/nodes")
}

fn events(namespace: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/events")
}

fn node(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"agentType": "Raw"}
    })
}

async fn harness_with(options: ApiServerOptions) -> Harness {
    let h = Harness::with_options(options).await;
    h.create(NAMESPACES, &namespace(A)).await;
    h.create(NAMESPACES, &namespace("rlark-b")).await;
    h
}

async fn harness() -> Harness {
    harness_with(fast_options()).await
}

/// A merge patch as `identity`.
async fn patch_as(h: &Harness, identity: &Identity, uri: &str, body: &Value) -> Answer {
    Harness::answer(
        h.send_as(
            Some(identity),
            Method::PATCH,
            uri,
            MERGE_PATCH,
            None,
            Bytes::from(body.to_string()),
        )
        .await,
    )
    .await
}

/// Assert a 403 whose message contains `needle`; and that the denial was audited.
fn assert_refused(h: &Harness, answer: &Answer, needle: &str) {
    assert_eq!(answer.status, StatusCode::FORBIDDEN, "{}", answer.body);
    assert_eq!(answer.reason(), "Forbidden");
    assert!(
        answer.message().contains(needle),
        "{:?} lacks {needle:?}",
        answer.message()
    );
    let audited = h
        .audit
        .entries()
        .into_iter()
        .any(|e| e.action == "denied" && e.reason.contains(needle));
    assert!(audited, "denial not audited: {needle}");
}

#[tokio::test]
async fn the_server_owns_a_nodes_identity_labels() {
    let h = harness().await;
    let agent = agent_a();

    // Missing identity labels are filled in, and the Node is marked as the agent's.
    let created = h
        .call_as(
            Some(&agent),
            Method::POST,
            &nodes(A),
            Some(&node("n1", json!({"zone": "lab"}))),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let labels = &created.body["metadata"]["labels"];
    assert_eq!(labels["rlark.io/cluster-id"], "a");
    assert_eq!(labels["kubernetes.io/hostname"], "n1");
    assert_eq!(labels["zone"], "lab");
    assert_eq!(
        created.body["metadata"]["annotations"]["rlark.io/reported-by"],
        "system:rlark:agent:a"
    );
    // The agent's own spelling is accepted as is.
    let own = h
        .call_as(
            Some(&agent),
            Method::POST,
            &nodes(A),
            Some(&node(
                "n2",
                json!({"rlark.io/cluster-id": "a", "kubernetes.io/hostname": "n2"}),
            )),
        )
        .await;
    assert_eq!(own.status, StatusCode::CREATED, "{}", own.body);

    // Forgeries: another cluster, another machine name.
    let before = h.revision();
    let forged = h
        .call_as(
            Some(&agent),
            Method::POST,
            &nodes(A),
            Some(&node("forged", json!({"rlark.io/cluster-id": "other"}))),
        )
        .await;
    assert_refused(
        &h,
        &forged,
        r#"may not set label "rlark.io/cluster-id" to "other": it is the agent's cluster ID ("a"), set by the server"#,
    );
    assert_eq!(
        forged.message(),
        r#"nodes.rlinf.io "forged" is forbidden: User "system:rlark:agent:a" may not set label "rlark.io/cluster-id" to "other": it is the agent's cluster ID ("a"), set by the server"#
    );
    let renamed = h
        .call_as(
            Some(&agent),
            Method::POST,
            &nodes(A),
            Some(&node("n3", json!({"kubernetes.io/hostname": "gpu-box"}))),
        )
        .await;
    assert_refused(
        &h,
        &renamed,
        r#"may not set label "kubernetes.io/hostname" to "gpu-box": it is the Node's name ("n3")"#,
    );
    assert_eq!(h.revision(), before, "a refused write wrote something");

    // Relabelling an existing Node, by merge patch or by PUT, is refused as well.
    let relabel = patch_as(
        &h,
        &agent,
        &format!("{}/n1", nodes(A)),
        &json!({"metadata": {"labels": {"rlark.io/cluster-id": "other"}}}),
    )
    .await;
    assert_refused(&h, &relabel, r#"label "rlark.io/cluster-id" to "other""#);
    let mut put = created.body.clone();
    put["metadata"]["labels"]["rlark.io/cluster-id"] = json!("other");
    let replaced = h
        .call_as(
            Some(&agent),
            Method::PUT,
            &format!("{}/n1", nodes(A)),
            Some(&put),
        )
        .await;
    assert_refused(&h, &replaced, r#"label "rlark.io/cluster-id" to "other""#);
    // Dropping the labels puts them back.
    let dropped = patch_as(
        &h,
        &agent,
        &format!("{}/n1", nodes(A)),
        &json!({"metadata": {"labels": {"rlark.io/cluster-id": null, "kubernetes.io/hostname": null}}}),
    )
    .await;
    assert_eq!(dropped.status, StatusCode::OK, "{}", dropped.body);
    assert_eq!(
        dropped.body["metadata"]["labels"]["rlark.io/cluster-id"],
        "a"
    );
    assert_eq!(
        dropped.body["metadata"]["labels"]["kubernetes.io/hostname"],
        "n1"
    );
    // ... so nothing changed at all.
    assert_eq!(h.revision(), before);

    // Admins may set anything; the agent's status reports on such a Node still go through
    // (it did not write the label) and mark the Node as reported by the agent again.
    let by_admin = h
        .patch(
            &format!("{}/n1", nodes(A)),
            MERGE_PATCH,
            &json!({"metadata": {"labels": {"rlark.io/cluster-id": "other"},
                                 "annotations": {"rlark.io/reported-by": "admin"}}}),
        )
        .await;
    assert_eq!(by_admin.status, StatusCode::OK, "{}", by_admin.body);
    assert_eq!(
        by_admin.body["metadata"]["labels"]["rlark.io/cluster-id"],
        "other"
    );
    let status = patch_as(
        &h,
        &agent,
        &format!("{}/n1/status", nodes(A)),
        &json!({"status": {"phase": "Online", "capacity": {"cpu": "8"}}}),
    )
    .await;
    assert_eq!(status.status, StatusCode::OK, "{}", status.body);
    assert_eq!(
        status.body["metadata"]["labels"]["rlark.io/cluster-id"],
        "other"
    );
    assert_eq!(
        status.body["metadata"]["annotations"]["rlark.io/reported-by"],
        "system:rlark:agent:a"
    );
}

#[tokio::test]
async fn reported_capacity_is_bounded() {
    let h = harness().await;
    let agent = agent_a();
    let created = h
        .call_as(
            Some(&agent),
            Method::POST,
            &nodes(A),
            Some(&node("n1", json!({}))),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let uri = format!("{}/n1/status", nodes(A));
    let before = h.revision();
    let absurd = patch_as(
        &h,
        &agent,
        &uri,
        &json!({"status": {"phase": "Online",
                           "capacity": {"cpu": "64", "nvidia.com/gpu": "1000000"},
                           "allocatable": {"memory": "1Ei"}}}),
    )
    .await;
    assert_eq!(
        absurd.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        absurd.body
    );
    assert_eq!(
        absurd.causes(),
        [
            (
                "status.capacity[nvidia.com/gpu]".to_string(),
                "FieldValueInvalid".to_string()
            ),
            (
                "status.allocatable[memory]".to_string(),
                "FieldValueInvalid".to_string()
            ),
        ],
        "{}",
        absurd.body
    );
    assert!(
        absurd
            .message()
            .contains(r#""1000000": must be at most 65536"#),
        "{}",
        absurd.message()
    );
    assert_eq!(h.revision(), before);
    let sane = patch_as(
        &h,
        &agent,
        &uri,
        &json!({"status": {"phase": "Online", "capacity": {"cpu": "64", "nvidia.com/gpu": "8"}}}),
    )
    .await;
    assert_eq!(sane.status, StatusCode::OK, "{}", sane.body);
}

#[tokio::test]
async fn an_agent_registers_a_bounded_number_of_nodes() {
    let h = harness_with(ApiServerOptions {
        max_nodes_per_agent: 2,
        ..fast_options()
    })
    .await;
    let agent = agent_a();
    for name in ["n1", "n2"] {
        let created = h
            .call_as(
                Some(&agent),
                Method::POST,
                &nodes(A),
                Some(&node(name, json!({}))),
            )
            .await;
        assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    }
    let before = h.revision();
    let third = h
        .call_as(
            Some(&agent),
            Method::POST,
            &nodes(A),
            Some(&node("n3", json!({}))),
        )
        .await;
    assert_refused(
        &h,
        &third,
        r#"User "system:rlark:agent:a" may register at most 2 Nodes in namespace "rlark-a" (api.maxNodesPerAgent) and it has 2 already"#,
    );
    assert_eq!(h.revision(), before);
    // Updates of registered Nodes go on; the admin is not limited; other agents count
    // their own Nodes.
    let beat = patch_as(
        &h,
        &agent,
        &format!("{}/n2/status", nodes(A)),
        &json!({"status": {"phase": "Online"}}),
    )
    .await;
    assert_eq!(beat.status, StatusCode::OK, "{}", beat.body);
    h.create(&nodes(A), &node("by-admin", json!({}))).await;
    let b = h
        .call_as(
            Some(&Identity::agent("b")),
            Method::POST,
            &nodes("rlark-b"),
            Some(&node("b1", json!({}))),
        )
        .await;
    assert_eq!(b.status, StatusCode::CREATED, "{}", b.body);
    // Node names are the installation's: cluster a's `n1` is not b's to register (issue
    // 38), and the refusal names the holder.
    let taken = h
        .call_as(
            Some(&Identity::agent("b")),
            Method::POST,
            &nodes("rlark-b"),
            Some(&node("n1", json!({}))),
        )
        .await;
    assert_eq!(taken.status, StatusCode::CONFLICT, "{}", taken.body);
    assert!(
        taken.body["message"]
            .as_str()
            .is_some_and(|m| m.contains(r#"held by cluster "a""#)),
        "{}",
        taken.body
    );
    // Once a Node is gone, the agent may register another.
    h.delete(&format!("{}/by-admin", nodes(A))).await;
    h.delete(&format!("{}/n1", nodes(A))).await;
    let again = h
        .call_as(
            Some(&agent),
            Method::POST,
            &nodes(A),
            Some(&node("n3", json!({}))),
        )
        .await;
    assert_eq!(again.status, StatusCode::CREATED, "{}", again.body);
}

#[tokio::test]
async fn agent_events_report_as_the_agent() {
    let h = harness().await;
    let agent = agent_a();
    let event = |name: &str, extra: Value| {
        let mut event = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name},
            "involvedObject": {"apiVersion": "rlinf.io/v1alpha1", "kind": "Task", "name": "t1"},
            "reason": "Pulled", "message": "image pulled", "type": "Normal"
        });
        for (key, value) in extra.as_object().into_iter().flatten() {
            event[key] = value.clone();
        }
        event
    };

    // What is missing is filled in.
    let created = h
        .call_as(
            Some(&agent),
            Method::POST,
            &events(A),
            Some(&event("e1", json!({}))),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    assert_eq!(created.body["reportingComponent"], "rlark-agent");
    assert_eq!(created.body["reportingInstance"], "a");
    assert_eq!(
        created.body["source"],
        json!({"component": "rlark-agent", "host": "a"})
    );
    assert_eq!(created.body["involvedObject"]["namespace"], A);
    // The agent's own values are accepted.
    let own = h
        .call_as(
            Some(&agent),
            Method::POST,
            &events(A),
            Some(&event(
                "e2",
                json!({"reportingComponent": "rlark-agent", "reportingInstance": "a",
                       "source": {"component": "rlark-agent"},
                       "related": {"kind": "Node", "name": "n1", "namespace": A}}),
            )),
        )
        .await;
    assert_eq!(own.status, StatusCode::CREATED, "{}", own.body);

    // Claiming another component, another cluster, or objects elsewhere is refused.
    let before = h.revision();
    for (extra, needle) in [
        (
            json!({"reportingComponent": "rlark-controller-manager"}),
            r#"reportingComponent must be "rlark-agent", not "rlark-controller-manager""#,
        ),
        (
            json!({"source": {"component": "rlark-controller-manager"}}),
            r#"source.component must be "rlark-agent", not "rlark-controller-manager""#,
        ),
        (
            json!({"reportingInstance": "other"}),
            r#"reportingInstance must be "a", not "other""#,
        ),
        (
            json!({"source": {"host": "other"}}),
            r#"source.host must be "a", not "other""#,
        ),
        (
            json!({"involvedObject": {"kind": "Task", "name": "t1", "namespace": "rlark-other"}}),
            r#"involvedObject.namespace must be "rlark-a", not "rlark-other""#,
        ),
        (
            json!({"related": {"kind": "Job", "name": "j", "namespace": "default"}}),
            r#"related.namespace must be "rlark-a", not "default""#,
        ),
    ] {
        let forged = h
            .call_as(
                Some(&agent),
                Method::POST,
                &events(A),
                Some(&event("forged", extra.clone())),
            )
            .await;
        assert_refused(&h, &forged, needle);
        assert!(
            forged.message().starts_with(
                r#"events "forged" is forbidden: User "system:rlark:agent:a" may only write events reported by the agent of cluster "a": "#
            ),
            "{extra}: {}",
            forged.message()
        );
    }
    assert_eq!(h.revision(), before);

    // An Event another component wrote in the agent's namespace cannot be rewritten by it.
    let controller_event = event(
        "from-controller",
        json!({"reportingComponent": "rlark-controller-manager",
               "source": {"component": "rlark-controller-manager"}}),
    );
    h.create(&events(A), &controller_event).await;
    let rewrite = patch_as(
        &h,
        &agent,
        &format!("{}/from-controller", events(A)),
        &json!({"message": "all good, nothing to see"}),
    )
    .await;
    assert_refused(&h, &rewrite, r#"reportingComponent must be "rlark-agent""#);
    // Its own Events it may bump.
    let bump = patch_as(
        &h,
        &agent,
        &format!("{}/e1", events(A)),
        &json!({"count": 2}),
    )
    .await;
    assert_eq!(bump.status, StatusCode::OK, "{}", bump.body);
}

#[tokio::test]
async fn an_agent_cannot_place_a_task_on_another_cluster() {
    let h = harness().await;
    let agent = agent_a();
    let mut placed = task(A, "t1");
    placed["spec"]["placement"] = json!({"clusterID": "a", "nodes": ["n1"]});
    h.create(&tasks(A), &placed).await;
    let moved = patch_as(
        &h,
        &agent,
        &format!("{}/t1", tasks(A)),
        &json!({"spec": {"placement": {"clusterID": "other"}}}),
    )
    .await;
    assert_refused(
        &h,
        &moved,
        r#"may not place a task on cluster "other": spec.placement.clusterID must be the agent's cluster ID "a""#,
    );
    let mut labelled = task(A, "t2");
    labelled["metadata"]["labels"] = json!({"rlark.io/cluster-id": "other"});
    let created = h
        .call_as(Some(&agent), Method::POST, &tasks(A), Some(&labelled))
        .await;
    assert_refused(&h, &created, r#"label "rlark.io/cluster-id" to "other""#);
    // Its status reports go through.
    let status = patch_as(
        &h,
        &agent,
        &format!("{}/t1/status", tasks(A)),
        &json!({"status": {"phase": "Running"}}),
    )
    .await;
    assert_eq!(status.status, StatusCode::OK, "{}", status.body);
}
