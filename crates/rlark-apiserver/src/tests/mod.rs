//! Router tests: the whole API (`ApiServer::router`) driven with `tower::ServiceExt::oneshot`
//! (no sockets) over a real SQLite store in a temporary directory.

mod agent_identity;
mod authz;
mod bad_input;
mod byte_quotas;
mod collection;
mod crud;
mod extra_kinds;
mod list_cache;
mod listing;
mod replicas;
mod watching;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::BodyExt;
use rlark_store::{SqliteStore, SqliteStoreConfig, Store};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::audit::MemoryAudit;
use crate::auth::{ADMIN_GROUP, Identity};
use crate::{ApiServer, ApiServerOptions};

/// The identity `send` and friends act as: a member of the admin group.
pub(super) fn admin() -> Identity {
    Identity {
        user: "admin".into(),
        groups: vec![ADMIN_GROUP.into()],
    }
}

/// A server over a fresh store.
pub(super) struct Harness {
    pub server: ApiServer,
    pub router: Router,
    pub store: Arc<SqliteStore>,
    pub metrics: prometheus_client::registry::Registry,
    /// Every audit record of the server.
    pub audit: MemoryAudit,
    _dir: tempfile::TempDir,
}

/// A finished (non-streaming) response.
#[derive(Debug)]
pub(super) struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Answer {
    /// `reason` of a Status body.
    pub fn reason(&self) -> &str {
        self.body["reason"].as_str().unwrap_or("")
    }

    pub fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or("")
    }

    pub fn warnings(&self) -> Vec<String> {
        self.headers
            .get_all(http::header::WARNING)
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect()
    }

    pub fn rv(&self) -> u64 {
        self.body["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    }

    pub fn causes(&self) -> Vec<(String, String)> {
        self.body["details"]["causes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                (
                    c["field"].as_str().unwrap_or("").to_string(),
                    c["reason"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    }
}

pub(super) const JOBS: &str = "/apis/rlinf.io/v1alpha1/jobs";
pub(super) const WORKFLOWS: &str = "/apis/rlinf.io/v1alpha1/workflows";
pub(super) const DOMAINS: &str = "/apis/rlinf.io/v1alpha1/domains";
pub(super) const NAMESPACES: &str = "/api/v1/namespaces";

pub(super) fn leases(namespace: &str) -> String {
    format!("/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases")
}

pub(super) fn tasks(namespace: &str) -> String {
    format!("/apis/rlinf.io/v1alpha1/namespaces/{namespace}/tasks")
}

/// A valid Job spec with one task.
pub(super) fn job_spec() -> Value {
    json!({"tasks": [{"name": "actor", "role": "Actor", "agentType": "Raw", "raw": {"entrypoint": ["python3", "-c", "print(1)"]}}]})
}

pub(super) fn job(name: &str) -> Value {
    json!({"apiVersion": "rlinf.io/v1alpha1", "kind": "Job", "metadata": {"name": name}, "spec": job_spec()})
}

pub(super) fn task(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "Task",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"role": "Actor", "agentType": "Raw", "raw": {"entrypoint": ["true"]}}
    })
}

pub(super) fn workflow(name: &str) -> Value {
    json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "Workflow", "metadata": {"name": name},
        "spec": {"jobTemplates": [
            {"name": "eval", "dependencies": ["train"], "spec": job_spec()},
            {"name": "train", "spec": job_spec()}
        ]}
    })
}

pub(super) fn lease(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"holderIdentity": "me", "leaseDurationSeconds": 15}
    })
}

pub(super) fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

/// An ownerReference to `owner` (a stored object).
pub(super) fn owner_ref(owner: &Value) -> Value {
    json!({
        "apiVersion": owner["apiVersion"], "kind": owner["kind"],
        "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]
    })
}

/// Options with short watch timings, so tests run fast.
pub(super) fn fast_options() -> ApiServerOptions {
    ApiServerOptions {
        bookmark_interval: Duration::from_millis(300),
        default_watch_timeout: Duration::from_secs(5),
        ..ApiServerOptions::default()
    }
}

impl Harness {
    pub async fn new() -> Self {
        Self::with_options(fast_options()).await
    }

    pub async fn with_options(options: ApiServerOptions) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(
            SqliteStore::open(SqliteStoreConfig::new(dir.path().join("db")))
                .await
                .unwrap(),
        );
        let mut metrics = prometheus_client::registry::Registry::default();
        let audit = MemoryAudit::default();
        let server = ApiServer::new(store.clone(), options, &mut metrics)
            .with_audit(Arc::new(audit.clone()));
        server.ensure_default_namespace().await.unwrap();
        let router = server.router();
        Self {
            server,
            router,
            store,
            metrics,
            audit,
            _dir: dir,
        }
    }

    /// Start `run_background` (garbage collection); cancel the token to stop it.
    pub fn start_background(&self) -> CancellationToken {
        let token = CancellationToken::new();
        let server = self.server.clone();
        let stop = token.clone();
        tokio::spawn(async move { server.run_background(stop).await });
        token
    }

    pub fn revision(&self) -> u64 {
        self.store.revision()
    }

    /// Send a request as an authenticated admin.
    pub async fn send(
        &self,
        method: Method,
        uri: &str,
        content_type: &str,
        accept: Option<&str>,
        body: Bytes,
    ) -> http::Response<Body> {
        self.send_as(Some(&admin()), method, uri, content_type, accept, body)
            .await
    }

    /// Send a request as `identity` (`None`: unauthenticated).
    pub async fn send_as(
        &self,
        identity: Option<&Identity>,
        method: Method,
        uri: &str,
        content_type: &str,
        accept: Option<&str>,
        body: Bytes,
    ) -> http::Response<Body> {
        let mut builder = Request::builder().method(method).uri(uri);
        if !body.is_empty() {
            builder = builder.header(http::header::CONTENT_TYPE, content_type);
        }
        if let Some(accept) = accept {
            builder = builder.header(http::header::ACCEPT, accept);
        }
        let mut request = builder.body(Body::from(body)).unwrap();
        if let Some(identity) = identity {
            request.extensions_mut().insert(identity.clone());
        }
        self.router.clone().oneshot(request).await.unwrap()
    }

    pub async fn answer(response: http::Response<Body>) -> Answer {
        let status = response.status();
        let headers = response.headers().clone();
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
        Answer {
            status,
            headers,
            body,
        }
    }

    pub async fn call(&self, method: Method, uri: &str, body: Option<&Value>) -> Answer {
        self.call_as(Some(&admin()), method, uri, body).await
    }

    /// A JSON request as `identity` (`None`: unauthenticated).
    pub async fn call_as(
        &self,
        identity: Option<&Identity>,
        method: Method,
        uri: &str,
        body: Option<&Value>,
    ) -> Answer {
        let bytes = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        Self::answer(
            self.send_as(identity, method, uri, "application/json", None, bytes)
                .await,
        )
        .await
    }

    pub async fn get(&self, uri: &str) -> Answer {
        self.call(Method::GET, uri, None).await
    }

    pub async fn post(&self, uri: &str, body: &Value) -> Answer {
        self.call(Method::POST, uri, Some(body)).await
    }

    pub async fn put(&self, uri: &str, body: &Value) -> Answer {
        self.call(Method::PUT, uri, Some(body)).await
    }

    pub async fn delete(&self, uri: &str) -> Answer {
        self.call(Method::DELETE, uri, None).await
    }

    pub async fn patch(&self, uri: &str, content_type: &str, body: &Value) -> Answer {
        Self::answer(
            self.send(
                Method::PATCH,
                uri,
                content_type,
                None,
                Bytes::from(body.to_string()),
            )
            .await,
        )
        .await
    }

    /// Create and assert 201.
    pub async fn create(&self, uri: &str, body: &Value) -> Value {
        let answer = self.post(uri, body).await;
        assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
        answer.body
    }

    /// Whether `uri` answers 200.
    pub async fn exists(&self, uri: &str) -> bool {
        let answer = self.get(uri).await;
        assert!(
            matches!(answer.status.as_u16(), 200 | 404),
            "{}",
            answer.body
        );
        answer.status == StatusCode::OK
    }

    /// Poll until `uri` is gone (404), failing after a few seconds.
    pub async fn wait_gone(&self, uri: &str) {
        for _ in 0..200 {
            if !self.exists(uri).await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("{uri} still exists: {}", self.get(uri).await.body);
    }

    /// Start a watch; the stream yields one parsed event per line.
    pub async fn watch(&self, uri: &str, accept: Option<&str>) -> (StatusCode, EventStream) {
        let response = self.send(Method::GET, uri, "", accept, Bytes::new()).await;
        let status = response.status();
        (
            status,
            EventStream {
                body: futures::StreamExt::boxed(response.into_body().into_data_stream()),
                buffer: Vec::new(),
            },
        )
    }
}

/// Newline-delimited JSON events of a watch response.
pub(super) struct EventStream {
    body: futures::stream::BoxStream<'static, Result<Bytes, axum::Error>>,
    buffer: Vec<u8>,
}

impl EventStream {
    /// The next event, `None` when the stream ended. Fails the test after 10 s.
    pub async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                return Some(serde_json::from_slice(&line).unwrap());
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), self.body.next())
                .await
                .expect("no watch event within 10 s");
            match chunk {
                Some(chunk) => self.buffer.extend_from_slice(&chunk.unwrap()),
                None => {
                    assert!(self.buffer.is_empty(), "partial event at end of stream");
                    return None;
                }
            }
        }
    }

    /// Every remaining event until the stream ends.
    pub async fn rest(&mut self) -> Vec<Value> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            events.push(event);
        }
        events
    }
}

/// (type, name) of an event.
pub(super) fn summary(event: &Value) -> (String, String) {
    (
        event["type"].as_str().unwrap_or("").to_string(),
        event["object"]["metadata"]["name"]
            .as_str()
            .unwrap_or("")
            .to_string(),
    )
}

#[tokio::test]
async fn every_route_requires_an_identity() {
    let h = Harness::new().await;
    for uri in [
        JOBS,
        "/api",
        "/apis",
        "/version",
        "/openapi/v2",
        "/no/such/path",
    ] {
        let request = Request::builder().uri(uri).body(Body::empty()).unwrap();
        let answer = Harness::answer(h.router.clone().oneshot(request).await.unwrap()).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{uri}");
        assert_eq!(
            (answer.body["kind"].as_str(), answer.reason()),
            (Some("Status"), "Unauthorized"),
            "{uri}"
        );
    }
    // With an identity the same routes work.
    assert_eq!(h.get("/api").await.status, StatusCode::OK);
    assert_eq!(h.get(JOBS).await.status, StatusCode::OK);
}

#[tokio::test]
async fn default_namespace_exists_and_is_protected() {
    let h = Harness::new().await;
    let ns = h.get("/api/v1/namespaces/default").await;
    assert_eq!(ns.body["status"]["phase"], "Active");
    assert_eq!(ns.body["spec"]["finalizers"], json!(["kubernetes"]));
    assert_eq!(
        ns.body["metadata"]["labels"]["kubernetes.io/metadata.name"],
        "default"
    );
    // Idempotent.
    h.server.ensure_default_namespace().await.unwrap();
    let answer = h.delete("/api/v1/namespaces/default").await;
    assert_eq!(
        (answer.status, answer.reason()),
        (StatusCode::FORBIDDEN, "Forbidden")
    );
}

#[tokio::test]
async fn metrics_count_requests_and_watches() {
    let h = Harness::new().await;
    h.get(JOBS).await;
    h.get(&format!("{JOBS}/missing")).await;
    let (_, events) = h
        .watch(&format!("{JOBS}?watch=true&timeoutSeconds=5"), None)
        .await;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &h.metrics).unwrap();
    assert!(
        text.contains(
            r#"rlark_apiserver_requests_total{verb="list",resource="jobs",code="200"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"rlark_apiserver_requests_total{verb="get",resource="jobs",code="404"} 1"#),
        "{text}"
    );
    assert!(text.contains("rlark_apiserver_watches 1"), "{text}");
    drop(events);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &h.metrics).unwrap();
    assert!(text.contains("rlark_apiserver_watches 0"), "{text}");
}
