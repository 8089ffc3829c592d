//! Without extra kinds ([`crate::ApiServerOptions::extra_kinds`]) the server serves none
//! of the Kubernetes kinds a member cluster has. The extra kinds themselves (the test kit's
//! simulated member cluster) are tested in `rlark-testkit` (`tests/member_kinds.rs`).

use http::StatusCode;

use super::Harness;

const STS: &str = "/apis/apps/v1/namespaces/default/statefulsets";

#[tokio::test]
async fn kubernetes_kinds_are_absent_without_the_option() {
    let h = Harness::new().await;
    for uri in [
        STS,
        "/apis/batch/v1/namespaces/default/jobs",
        "/api/v1/nodes",
        "/api/v1/namespaces/default/services",
        "/api/v1/namespaces/default/configmaps",
        "/api/v1/namespaces/default/secrets",
        "/api/v1/namespaces/default/persistentvolumeclaims",
    ] {
        assert_eq!(h.get(uri).await.status, StatusCode::NOT_FOUND, "{uri}");
    }
    assert_eq!(h.get("/apis/apps/v1").await.status, StatusCode::NOT_FOUND);
    let core = h.get("/api/v1").await;
    let names: Vec<&str> = core.body["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    // Core Pods are served, as the read-only view of rlark's replicas (`replicas.rs`).
    assert_eq!(
        names,
        [
            "namespaces",
            "namespaces/status",
            "events",
            "pods",
            "pods/log",
            "pods/exec"
        ]
    );
}
