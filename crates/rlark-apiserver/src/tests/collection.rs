//! Garbage collection: ownerReferences, propagation policies, namespaces.

use http::{Method, StatusCode};
use serde_json::json;

use super::*;

/// A Workflow owning a Job owning a Task (what the controllers build), returned as
/// (workflow, job, task) URLs.
async fn family(h: &Harness, suffix: &str) -> (String, String, String) {
    let wf = h.create(WORKFLOWS, &workflow(&format!("wf{suffix}"))).await;
    let mut job = job(&format!("wf{suffix}-train"));
    job["metadata"]["ownerReferences"] = json!([owner_ref(&wf)]);
    let job = h.create(JOBS, &job).await;
    let mut task = task("default", &format!("wf{suffix}-train-actor"));
    task["metadata"]["ownerReferences"] = json!([owner_ref(&job)]);
    h.create(&tasks("default"), &task).await;
    (
        format!("{WORKFLOWS}/wf{suffix}"),
        format!("{JOBS}/wf{suffix}-train"),
        format!("{}/wf{suffix}-train-actor", tasks("default")),
    )
}

#[tokio::test]
async fn background_deletion_cascades_through_owners() {
    let h = Harness::new().await;
    let stop = h.start_background();
    let (wf, job, task) = family(&h, "1").await;
    assert_eq!(h.delete(&wf).await.status, StatusCode::OK);
    h.wait_gone(&job).await;
    h.wait_gone(&task).await;
    stop.cancel();
}

#[tokio::test]
async fn dependents_with_finalizers_are_marked_not_removed() {
    let h = Harness::new().await;
    let stop = h.start_background();
    let owner = h.create(JOBS, &job("owner")).await;
    let mut dependent = task("default", "held");
    dependent["metadata"]["ownerReferences"] = json!([owner_ref(&owner)]);
    dependent["metadata"]["finalizers"] = json!(["rlinf.io/agent"]);
    h.create(&tasks("default"), &dependent).await;
    let url = format!("{}/held", tasks("default"));
    h.delete(&format!("{JOBS}/owner")).await;
    for _ in 0..200 {
        if h.get(&url).await.body["metadata"]["deletionTimestamp"].is_string() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(h.get(&url).await.body["metadata"]["deletionTimestamp"].is_string());
    h.patch(
        &url,
        crate::patch::MERGE_PATCH,
        &json!({"metadata": {"finalizers": []}}),
    )
    .await;
    h.wait_gone(&url).await;
    stop.cancel();
}

#[tokio::test]
async fn a_dependent_with_a_surviving_owner_stays() {
    let h = Harness::new().await;
    let stop = h.start_background();
    let a = h.create(JOBS, &job("a")).await;
    let b = h.create(JOBS, &job("b")).await;
    let mut dependent = task("default", "shared");
    dependent["metadata"]["ownerReferences"] = json!([owner_ref(&a), owner_ref(&b)]);
    h.create(&tasks("default"), &dependent).await;
    h.delete(&format!("{JOBS}/a")).await;
    let url = format!("{}/shared", tasks("default"));
    // The reference to the vanished owner is dropped; the object stays.
    for _ in 0..200 {
        if h.get(&url).await.body["metadata"]["ownerReferences"]
            .as_array()
            .unwrap()
            .len()
            == 1
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let got = h.get(&url).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(
        got.body["metadata"]["ownerReferences"],
        json!([owner_ref(&b)])
    );
    stop.cancel();
}

#[tokio::test]
async fn startup_sweep_removes_orphans() {
    let h = Harness::new().await;
    // Created while no collector runs; the owner is gone before it starts.
    let (wf, job, task) = family(&h, "2").await;
    h.delete(&wf).await;
    assert!(h.exists(&job).await);
    let stop = h.start_background();
    h.wait_gone(&job).await;
    h.wait_gone(&task).await;
    stop.cancel();
}

#[tokio::test]
async fn foreground_deletion_waits_for_dependents() {
    let h = Harness::new().await;
    let (wf, job, task) = family(&h, "3").await;
    // The task holds on (an agent's finalizer), so the whole chain has to wait for it.
    h.patch(
        &task,
        crate::patch::MERGE_PATCH,
        &json!({"metadata": {"finalizers": ["rlinf.io/agent"]}}),
    )
    .await;
    let body =
        json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"});
    let answer = h.call(Method::DELETE, &wf, Some(&body)).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(
        answer.body["metadata"]["finalizers"],
        json!(["foregroundDeletion"])
    );
    assert!(answer.body["metadata"]["deletionTimestamp"].is_string());
    let stop = h.start_background();
    // The job is deleted in the foreground too, and waits for the task.
    for _ in 0..200 {
        if h.get(&task).await.body["metadata"]["deletionTimestamp"].is_string() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let held_job = h.get(&job).await;
    assert_eq!(
        held_job.body["metadata"]["finalizers"],
        json!(["foregroundDeletion"]),
        "{}",
        held_job.body
    );
    assert!(h.exists(&wf).await, "held until the dependents are gone");
    h.patch(
        &task,
        crate::patch::MERGE_PATCH,
        &json!({"metadata": {"finalizers": null}}),
    )
    .await;
    h.wait_gone(&task).await;
    h.wait_gone(&job).await;
    h.wait_gone(&wf).await;
    stop.cancel();
}

#[tokio::test]
async fn orphan_deletion_keeps_dependents() {
    let h = Harness::new().await;
    let stop = h.start_background();
    let (wf, job, task) = family(&h, "4").await;
    let answer = h.delete(&format!("{wf}?propagationPolicy=Orphan")).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(!h.exists(&wf).await);
    // Give the collector a chance to (wrongly) act.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let job = h.get(&job).await;
    assert_eq!(job.status, StatusCode::OK);
    assert!(
        job.body["metadata"]
            .get("ownerReferences")
            .is_none_or(|r| r.as_array().unwrap().is_empty())
    );
    assert!(
        h.exists(&task).await,
        "the job's own dependents are untouched"
    );
    stop.cancel();
}

#[tokio::test]
async fn namespace_deletion_empties_and_removes_the_namespace() {
    let h = Harness::new().await;
    let stop = h.start_background();
    h.create(NAMESPACES, &namespace("team")).await;
    h.create(&leases("team"), &lease("team", "l")).await;
    let mut held = task("team", "held");
    held["metadata"]["finalizers"] = json!(["rlinf.io/agent"]);
    h.create(&tasks("team"), &held).await;

    let answer = h.delete(&format!("{NAMESPACES}/team")).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body["status"]["phase"], "Terminating");
    assert!(answer.body["metadata"]["deletionTimestamp"].is_string());

    let refused = h.post(&leases("team"), &lease("team", "new")).await;
    assert_eq!(
        (refused.status, refused.reason()),
        (StatusCode::FORBIDDEN, "Forbidden")
    );
    assert!(
        refused.message().contains("because it is being terminated"),
        "{}",
        refused.message()
    );

    h.wait_gone(&format!("{}/l", leases("team"))).await;
    let task_url = format!("{}/held", tasks("team"));
    assert!(h.exists(&task_url).await, "the finalizer holds the task");
    assert!(
        h.exists(&format!("{NAMESPACES}/team")).await,
        "the task holds the namespace"
    );
    h.patch(
        &task_url,
        crate::patch::MERGE_PATCH,
        &json!({"metadata": {"finalizers": null}}),
    )
    .await;
    h.wait_gone(&task_url).await;
    h.wait_gone(&format!("{NAMESPACES}/team")).await;
    stop.cancel();
}
