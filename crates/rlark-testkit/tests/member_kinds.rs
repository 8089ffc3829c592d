//! The Kubernetes kinds of the simulated member cluster (`kubesim::kinds`) served by rlark's
//! API server through its extra-kinds hook (`ApiServerOptions::extra_kinds`): discovery,
//! status, `scale`, validation, `pods/log` answered by a log source
//! (`ApiServerOptions::pod_sources`), cascades through the garbage collector. The router is
//! driven with `tower::ServiceExt::oneshot` (no sockets) over a SQLite store in a temporary
//! directory, as an admin; nothing acts on the objects (`tests/kubesim.rs` adds the
//! simulator).
//!
//! These were rlark-apiserver's router tests of its member simulation; that the server
//! serves none of these kinds without the hook is still tested there.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use rlark_apiserver::auth::{ADMIN_GROUP, Identity};
use rlark_apiserver::pod_sources::{
    LogStream, PodLogError, PodLogRequest, PodLogSource, PodSources,
};
use rlark_apiserver::{ApiServer, ApiServerOptions};
use rlark_store::{SqliteStore, SqliteStoreConfig};
use rlark_testkit::kubesim::kinds;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// A finished (non-streaming) response.
struct Answer {
    status: StatusCode,
    body: Value,
}

impl Answer {
    fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or("")
    }
}

/// A server serving the member kinds over a fresh store.
struct Harness {
    server: ApiServer,
    router: Router,
    _dir: tempfile::TempDir,
}

impl Harness {
    async fn with_options(options: ApiServerOptions) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(
            SqliteStore::open(SqliteStoreConfig::new(dir.path().join("db")))
                .await
                .unwrap(),
        );
        let mut metrics = prometheus_client::registry::Registry::default();
        let server = ApiServer::new(store, options, &mut metrics);
        server.ensure_default_namespace().await.unwrap();
        let router = server.router();
        Self {
            server,
            router,
            _dir: dir,
        }
    }

    /// Start `run_background` (garbage collection); cancel the token to stop it.
    fn start_background(&self) -> CancellationToken {
        let token = CancellationToken::new();
        let server = self.server.clone();
        let stop = token.clone();
        tokio::spawn(async move { server.run_background(stop).await });
        token
    }

    /// Send a request as an admin.
    async fn send(
        &self,
        method: Method,
        uri: &str,
        content_type: &str,
        body: Bytes,
    ) -> http::Response<Body> {
        let mut builder = Request::builder().method(method).uri(uri);
        if !body.is_empty() {
            builder = builder.header(http::header::CONTENT_TYPE, content_type);
        }
        let mut request = builder.body(Body::from(body)).unwrap();
        request.extensions_mut().insert(Identity {
            user: "admin".into(),
            groups: vec![ADMIN_GROUP.into()],
        });
        self.router.clone().oneshot(request).await.unwrap()
    }

    async fn call(
        &self,
        method: Method,
        uri: &str,
        content_type: &str,
        body: Option<&Value>,
    ) -> Answer {
        let bytes = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let response = self.send(method, uri, content_type, bytes).await;
        let status = response.status();
        let bytes = tokio::time::timeout(Duration::from_secs(20), response.into_body().collect())
            .await
            .expect("response body did not end")
            .unwrap()
            .to_bytes();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&bytes)))
        };
        Answer { status, body }
    }

    async fn get(&self, uri: &str) -> Answer {
        self.call(Method::GET, uri, "application/json", None).await
    }

    async fn post(&self, uri: &str, body: &Value) -> Answer {
        self.call(Method::POST, uri, "application/json", Some(body))
            .await
    }

    async fn put(&self, uri: &str, body: &Value) -> Answer {
        self.call(Method::PUT, uri, "application/json", Some(body))
            .await
    }

    async fn delete(&self, uri: &str) -> Answer {
        self.call(Method::DELETE, uri, "application/json", None)
            .await
    }

    async fn patch(&self, uri: &str, content_type: &str, body: &Value) -> Answer {
        self.call(Method::PATCH, uri, content_type, Some(body))
            .await
    }

    /// Create and assert 201.
    async fn create(&self, uri: &str, body: &Value) -> Value {
        let answer = self.post(uri, body).await;
        assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
        answer.body
    }

    /// Poll until `uri` is gone (404), failing after a few seconds.
    async fn wait_gone(&self, uri: &str) {
        for _ in 0..200 {
            let answer = self.get(uri).await;
            match answer.status {
                StatusCode::NOT_FOUND => return,
                StatusCode::OK => {}
                _ => panic!("{uri}: {}", answer.body),
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("{uri} still exists: {}", self.get(uri).await.body);
    }
}

/// An ownerReference to `owner` (a stored object).
fn owner_ref(owner: &Value) -> Value {
    json!({
        "apiVersion": owner["apiVersion"], "kind": owner["kind"],
        "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]
    })
}

/// Answers with the request it got, and records it.
#[derive(Default)]
struct EchoLogs {
    seen: Mutex<Vec<PodLogRequest>>,
}

impl PodLogSource for EchoLogs {
    fn open(&self, request: &PodLogRequest) -> Result<LogStream, PodLogError> {
        self.seen.lock().unwrap().push(request.clone());
        if request.previous {
            return Err(PodLogError::BadRequest(format!(
                "previous terminated container {:?} in pod {:?} not found",
                request.container, request.pod
            )));
        }
        let text = format!(
            "log of {}/{}\nsecond line\n",
            request.pod, request.container
        );
        Ok(futures::stream::iter([Bytes::from(text)]).boxed())
    }
}

/// The member kinds, Pod logs from an [`EchoLogs`], no exec; short watch timings.
async fn member_harness() -> (Harness, Arc<EchoLogs>) {
    let logs = Arc::new(EchoLogs::default());
    let options = ApiServerOptions {
        extra_kinds: kinds::kinds(),
        pod_sources: PodSources {
            logs: Some(logs.clone()),
            exec: None,
        },
        bookmark_interval: Duration::from_millis(300),
        default_watch_timeout: Duration::from_secs(5),
        ..ApiServerOptions::default()
    };
    (Harness::with_options(options).await, logs)
}

const STS: &str = "/apis/apps/v1/namespaces/default/statefulsets";
const PODS: &str = "/api/v1/namespaces/default/pods";

fn pod(name: &str, node: Option<&str>) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "a"}},
        "spec": {"containers": [{"name": "main", "image": "busybox", "futureField": {"x": 1}}]}
    });
    if let Some(node) = node {
        pod["spec"]["nodeName"] = json!(node);
    }
    pod
}

async fn text(h: &Harness, uri: &str) -> (StatusCode, String) {
    let response = h.send(Method::GET, uri, "", Bytes::new()).await;
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test]
async fn discovery_lists_the_kinds_and_their_subresources() {
    let (h, _) = member_harness().await;
    let core = h.get("/api/v1").await;
    let names: Vec<&str> = core.body["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    for name in [
        "pods",
        "pods/status",
        "pods/log",
        "pods/exec",
        "services",
        "configmaps",
        "secrets",
        "persistentvolumeclaims",
        "nodes",
        "nodes/status",
    ] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    let apps = h.get("/apis/apps/v1").await;
    let sts = apps.body["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "statefulsets/scale")
        .expect("statefulsets/scale listed");
    assert_eq!(
        (sts["group"].as_str(), sts["kind"].as_str()),
        (Some("autoscaling"), Some("Scale"))
    );
    let groups = h.get("/apis").await;
    let names: Vec<&str> = groups.body["groups"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|g| g["name"].as_str())
        .collect();
    // Built-in groups first, as kube-apiserver lists them before CRD groups.
    let position = |g: &str| names.iter().position(|n| *n == g).unwrap();
    assert!(position("apps") < position("rlinf.io") && position("batch") < position("rlinf.io"));
    // kubectl reads the OpenAPI documents (apply, explain): they describe the new kinds.
    let v3 = h.get("/openapi/v3/apis/apps/v1").await;
    assert_eq!(v3.status, StatusCode::OK);
    let schemas = v3.body["components"]["schemas"].as_object().unwrap();
    assert!(
        schemas.keys().any(|k| k.ends_with("StatefulSet")),
        "{:?}",
        schemas.keys()
    );
    assert_eq!(h.get("/openapi/v3/api/v1").await.status, StatusCode::OK);
    assert_eq!(h.get("/openapi/v2").await.status, StatusCode::OK);
}

#[tokio::test]
async fn workloads_are_stored_with_status_and_scale() {
    let (h, _) = member_harness().await;
    let sts = h
        .create(
            STS,
            &json!({
                "apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": {"name": "actor"},
                "spec": {"replicas": 2, "serviceName": "actor",
                         "selector": {"matchLabels": {"app": "a"}},
                         "template": {"metadata": {"labels": {"app": "a"}},
                                      "spec": {"containers": [{"name": "main", "image": "x"}]}}},
                "status": {"replicas": 9}
            }),
        )
        .await;
    // Status is a subresource: ignored on create, unknown spec fields kept.
    assert!(
        sts.get("status")
            .is_none_or(|s| s.get("replicas").is_none()),
        "{sts}"
    );
    assert_eq!(
        sts["spec"]["template"]["spec"]["containers"][0]["image"],
        "x"
    );
    let status = h
        .patch(
            &format!("{STS}/actor/status"),
            "application/merge-patch+json",
            &json!({"status": {"replicas": 2, "readyReplicas": 1}}),
        )
        .await;
    assert_eq!(status.status, StatusCode::OK, "{}", status.body);
    let scale = h.get(&format!("{STS}/actor/scale")).await;
    assert_eq!(scale.status, StatusCode::OK, "{}", scale.body);
    assert_eq!(scale.body["kind"], "Scale");
    assert_eq!(scale.body["spec"]["replicas"], 2);
    assert_eq!(scale.body["status"]["replicas"], 2);
    assert_eq!(scale.body["status"]["selector"], "app=a");
    let scaled = h
        .patch(
            &format!("{STS}/actor/scale"),
            "application/merge-patch+json",
            &json!({"spec": {"replicas": 0}}),
        )
        .await;
    assert_eq!(scaled.status, StatusCode::OK, "{}", scaled.body);
    assert_eq!(scaled.body["spec"]["replicas"], 0);
    assert_eq!(
        h.get(&format!("{STS}/actor")).await.body["spec"]["replicas"],
        0
    );
    let bad = h
        .put(
            &format!("{STS}/actor/scale"),
            &json!({"apiVersion": "autoscaling/v1", "kind": "Scale", "spec": {"replicas": -3}}),
        )
        .await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", bad.body);
    let put = h
        .put(
            &format!("{STS}/actor/scale"),
            &json!({"apiVersion": "autoscaling/v1", "kind": "Scale", "spec": {"replicas": 4}}),
        )
        .await;
    assert_eq!(put.body["spec"]["replicas"], 4);
    // An object kube-apiserver would refuse is refused with its wording.
    let invalid = h
        .post(
            "/apis/batch/v1/namespaces/default/jobs",
            &json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
                    "spec": {"template": {"spec": {"containers": [{"name": "main"}]}}}}),
        )
        .await;
    assert_eq!(invalid.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        invalid.message(),
        "Job.batch \"j\" is invalid: [spec.template.spec.containers[0].image: Required value, spec.template.spec.restartPolicy: Unsupported value: \"Always\": supported values: \"OnFailure\", \"Never\"]"
    );
    // Strategic merge patch is accepted on the built-in kinds.
    let smp = h
        .patch(
            &format!("{STS}/actor"),
            "application/strategic-merge-patch+json",
            &json!({"metadata": {"labels": {"x": "y"}}}),
        )
        .await;
    assert_eq!(smp.status, StatusCode::OK, "{}", smp.body);
    // No scale for DaemonSets, no log for StatefulSets.
    assert_eq!(
        h.get("/apis/apps/v1/namespaces/default/daemonsets/d/scale")
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        h.get(&format!("{STS}/actor/log")).await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn pod_logs_come_from_the_source_after_the_servers_checks() {
    let (h, logs) = member_harness().await;
    h.create(PODS, &pod("unscheduled", None)).await;
    let (status, body) = text(&h, &format!("{PODS}/unscheduled/log")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("does not have a host assigned"), "{body}");
    h.create(PODS, &pod("p", Some("n1"))).await;
    let (status, body) = text(&h, &format!("{PODS}/p/log")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body.contains("is waiting to start: ContainerCreating"),
        "{body}"
    );
    let running = h
        .patch(
            &format!("{PODS}/p/status"),
            "application/merge-patch+json",
            &json!({"status": {"phase": "Running", "containerStatuses": [
                {"name": "main", "restartCount": 0, "state": {"running": {}}}]}}),
        )
        .await;
    assert_eq!(running.status, StatusCode::OK, "{}", running.body);
    let (status, body) = text(&h, &format!("{PODS}/p/log?tailLines=5&timestamps=true")).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "log of p/main\nsecond line\n")
    );
    let (_, body) = text(&h, &format!("{PODS}/p/log?limitBytes=6")).await;
    assert_eq!(body, "log of");
    let (status, body) = text(&h, &format!("{PODS}/p/log?container=other")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body.contains("container other is not valid for pod p"),
        "{body}"
    );
    let (status, body) = text(&h, &format!("{PODS}/p/log?previous=true")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("previous terminated container"), "{body}");
    assert_eq!(
        text(&h, &format!("{PODS}/nope/log")).await.0,
        StatusCode::NOT_FOUND
    );
    let seen = logs.seen.lock().unwrap().clone();
    assert_eq!(seen[0].tail_lines, Some(5));
    assert!(seen[0].timestamps);
    assert_eq!(
        (seen[0].namespace.as_str(), seen[0].container.as_str()),
        ("default", "main")
    );
    // Writes to a log are refused.
    let post = h.post(&format!("{PODS}/p/log"), &json!({})).await;
    assert_eq!(post.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn owner_references_cascade_through_the_garbage_collector() {
    let (h, _) = member_harness().await;
    let stop = h.start_background();
    let sts = h
        .create(
            STS,
            &json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "s"},
                    "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "a"}},
                             "template": {"metadata": {"labels": {"app": "a"}},
                                          "spec": {"containers": [{"name": "main", "image": "x"}]}}}}),
        )
        .await;
    let mut child = pod("s-0", Some("n1"));
    child["metadata"]["ownerReferences"] = json!([owner_ref(&sts)]);
    h.create(PODS, &child).await;
    assert_eq!(h.delete(&format!("{STS}/s")).await.status, StatusCode::OK);
    h.wait_gone(&format!("{PODS}/s-0")).await;
    stop.cancel();
}
