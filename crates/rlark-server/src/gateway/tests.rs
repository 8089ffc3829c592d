//! The gateway as a service (`oneshot`) over a real SQLite store, security layer and API
//! server, with requests in the shapes RLark's console sends (`src/pages/*.tsx`: plain
//! same-origin `fetch()`, no header of its own but `Content-Type` on writes).

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use http::{Request, StatusCode, header};
use http_body_util::BodyExt as _;
use rlark_apiserver::ApiServer;
use rlark_apiserver::auth::{ADMIN_GROUP, Identity, VIEWER_GROUP};
use rlark_store::Store;
use serde_json::{Value, json};
use tower::ServiceExt as _;

use super::*;
use crate::console::{Console, session_layer};
use crate::security::revocation_file::RevocationFile;
use crate::security::{Security, SecurityConfig};

pub(super) struct Fixture {
    router: Router,
    pub(super) store: Arc<dyn Store>,
    security: Arc<Security>,
    pub(super) console: Console,
    _dir: tempfile::TempDir,
}

pub(super) fn admin() -> Identity {
    Identity {
        user: "root".into(),
        groups: vec![ADMIN_GROUP.into()],
    }
}

pub(super) fn viewer() -> Identity {
    Identity {
        user: "vera".into(),
        groups: vec![VIEWER_GROUP.into()],
    }
}

pub(super) struct Answer {
    pub(super) status: StatusCode,
    pub(super) headers: http::HeaderMap,
    pub(super) body: Value,
}

/// The process router's shape: rlark's routes, the gateway's, the console's session layer
/// and, outermost, the gateway's.
pub(super) async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = rlark_store::SqliteStore::open(rlark_store::SqliteStoreConfig::new(
        dir.path().join("rlark.db"),
    ))
    .await
    .unwrap();
    let ca = Arc::new(rlark_pki::Ca::load_or_create(&dir.path().join("pki")).unwrap());
    let store: Arc<dyn Store> = Arc::new(store);
    let security = Security::load(
        ca,
        Arc::clone(&store),
        Arc::new(rlark_apiserver::audit::TracingAudit),
        SecurityConfig::default(),
        RevocationFile::load(&dir.path().join("revocations.json")).unwrap(),
    )
    .await
    .unwrap();
    let mut registry = prometheus_client::registry::Registry::default();
    let api = ApiServer::new(Arc::clone(&store), Default::default(), &mut registry);
    api.ensure_default_namespace().await.unwrap();
    api.ensure_namespace("rlark-c1").await.unwrap();
    let console = Console::new(Arc::clone(&security), Arc::clone(&store));
    // rlark's routes the gateway calls: the API, the real SSH key and certificate routes, and in place of
    // the replica log route (which reads from an agent through the tunnel, tested with
    // it) one that answers who asked for which replica.
    let keys = crate::ssh::key_routes::router(crate::ssh::key_routes::KeyRoutes {
        keys: crate::ssh::keys::SshKeys::new(Arc::clone(&store)),
        audit: Arc::new(rlark_apiserver::audit::TracingAudit),
        endpoint: None,
        ca_public_key: String::new(),
    });
    let log = axum::routing::get(
        |axum::extract::Path((ns, pod)): axum::extract::Path<(String, String)>,
         request: Request<Body>| async move {
            let user = request
                .extensions()
                .get::<Identity>()
                .map(|i| i.user.clone())
                .unwrap_or_default();
            if pod == "broken" {
                return Err(rlark_apiserver::error::ApiError::new(
                    502,
                    "BadGateway",
                    "no agent of cluster c1 is connected".to_string(),
                ));
            }
            Ok(format!(
                "line 1 of {ns}/{pod} for {user} ({})\nline 2\n",
                request.uri().query().unwrap_or_default()
            ))
        },
    );
    let certificates = crate::security::routes::router(crate::security::routes::RoutesState {
        security: Arc::clone(&security),
        ssh_ca: Arc::new(rlark_pki::ssh::SshCa::load_or_create(&dir.path().join("pki")).unwrap()),
        api: api.clone(),
        shutdown: tokio_util::sync::CancellationToken::new(),
    });
    let backend = api
        .router()
        .merge(keys)
        .merge(certificates)
        .route(crate::tunnel::logs::ROUTE, log);
    let gateway = Gateway::new(
        backend.clone(),
        Arc::clone(&console.sessions),
        Arc::clone(&security),
    );
    let auth = gateway.auth();
    let router = backend
        .merge(router(gateway))
        .merge(crate::console::router(console.clone()))
        .layer(axum::middleware::from_fn_with_state(
            console.clone(),
            session_layer,
        ))
        .layer(axum::middleware::from_fn_with_state(auth, auth::layer));
    Fixture {
        router,
        store,
        security,
        console,
        _dir: dir,
    }
}

impl Fixture {
    pub(super) async fn send(&self, request: Request<Body>) -> Answer {
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        Answer {
            status,
            headers,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        }
    }

    /// A bearer token of `identity`.
    pub(super) async fn token(&self, identity: &Identity) -> String {
        let (token, _) = self
            .security
            .create_bearer_token(identity, None, None, &admin())
            .await
            .unwrap();
        token.expose().to_string()
    }

    /// RLark's login call.
    pub(super) async fn login(&self, username: &str, password: &str) -> Answer {
        self.send(
            Request::post("/api/v1/auth/login")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(
                    json!({"username": username, "password": password}).to_string(),
                ))
                .unwrap(),
        )
        .await
    }

    /// Log `identity` in as RLark's console does: the cookie (`name=value`).
    pub(super) async fn cookie_for(&self, identity: &Identity) -> String {
        let token = self.token(identity).await;
        let answer = self.login(&identity.user, &token).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        let set = answer.headers[header::SET_COOKIE].to_str().unwrap();
        for attribute in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/api/v1/"] {
            assert!(set.contains(attribute), "{set}");
        }
        assert!(set.starts_with("__Secure-rlark_gateway="), "{set}");
        set.split(';').next().unwrap().to_string()
    }
}

/// A same-origin `fetch()` of RLark's console, as a browser sends it.
pub(super) fn fetch(method: &str, path: &str, cookie: &str, body: Option<Value>) -> Request<Body> {
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header(header::COOKIE, cookie)
        .header(header::HOST, "rlark.test:6443")
        .header("sec-fetch-site", "same-origin");
    if method != "GET" {
        builder = builder.header(header::ORIGIN, "https://rlark.test:6443");
    }
    match body {
        Some(body) => builder
            .header(
                header::CONTENT_TYPE,
                if method == "PATCH" {
                    "application/merge-patch+json"
                } else {
                    "application/json"
                },
            )
            .body(Body::from(body.to_string()))
            .unwrap(),
        None => builder.body(Body::empty()).unwrap(),
    }
}

fn job(name: &str) -> Value {
    json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "Job",
        "metadata": {"name": name},
        "spec": {"tasks": [{"name": "main", "role": "Actor", "raw": {"entrypoint": ["true"], "replicas": 1}}]}
    })
}

const JOBS: &str = "/api/v1/rlinf.io/v1alpha1/jobs";

#[tokio::test]
async fn without_credentials_every_route_is_a_401_naming_the_login() {
    let f = fixture().await;
    for path in [
        JOBS,
        "/api/v1/rlinf.io/v1alpha1/nodes",
        "/api/v1/clusters",
        "/api/v1/storage/storageclass",
    ] {
        let answer = f
            .send(Request::get(path).body(Body::empty()).unwrap())
            .await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{path}");
        assert!(
            answer.body["error"]
                .as_str()
                .unwrap()
                .contains("POST /api/v1/auth/login"),
            "{}",
            answer.body
        );
    }
    // A cookie of no live session says so.
    let stale = f
        .send(fetch("GET", JOBS, "__Secure-rlark_gateway=nope", None))
        .await;
    assert_eq!(stale.status, StatusCode::UNAUTHORIZED);
    assert!(
        stale.body["error"].as_str().unwrap().contains("expired"),
        "{}",
        stale.body
    );
}

#[tokio::test]
async fn login_takes_an_rlark_token_as_the_password_and_names_what_is_wrong() {
    let f = fixture().await;
    let token = f.token(&admin()).await;
    let answer = f.login("root", &token).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.body["ok"], true);
    assert_eq!(answer.body["role"], "admin");
    assert_eq!(answer.body["user"], "root");

    let wrong = f.login("root", "hunter2").await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(wrong.headers.get(header::SET_COOKIE).is_none());
    let message = wrong.body["error"].as_str().unwrap();
    assert!(message.contains("rlark bearer token"), "{message}");

    let other = f.login("user", &token).await;
    assert_eq!(other.status, StatusCode::UNAUTHORIZED);
    assert!(
        other.body["error"]
            .as_str()
            .unwrap()
            .contains("belongs to user \"root\", not \"user\""),
        "{}",
        other.body
    );

    let empty = f.login("root", "").await;
    assert_eq!(empty.status, StatusCode::BAD_REQUEST);

    // The viewer's role.
    let token = f.token(&viewer()).await;
    assert_eq!(f.login("vera", &token).await.body["role"], "viewer");
}

#[tokio::test]
async fn the_console_creates_lists_gets_patches_updates_and_deletes_jobs() {
    let f = fixture().await;
    let cookie = f.cookie_for(&admin()).await;

    // CreateJob.tsx: POST the Job object.
    let created = f.send(fetch("POST", JOBS, &cookie, Some(job("j1")))).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    assert_eq!(created.body["kind"], "Job");
    assert_eq!(created.body["metadata"]["name"], "j1");
    // rlark fills agentType in from the runtime block.
    assert_eq!(created.body["spec"]["tasks"][0]["agentType"], "Raw");

    // Jobs.tsx reads `items` of the list.
    let list = f.send(fetch("GET", JOBS, &cookie, None)).await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.body);
    assert_eq!(list.body["kind"], "JobList");
    assert_eq!(list.body["items"][0]["metadata"]["name"], "j1");

    let one = f
        .send(fetch("GET", &format!("{JOBS}/j1"), &cookie, None))
        .await;
    assert_eq!(one.status, StatusCode::OK);
    assert_eq!(one.body["metadata"]["name"], "j1");

    // Stop: a merge patch.
    let stopped = f
        .send(fetch(
            "PATCH",
            &format!("{JOBS}/j1"),
            &cookie,
            Some(json!({"spec": {"stopped": true}})),
        ))
        .await;
    assert_eq!(stopped.status, StatusCode::OK, "{}", stopped.body);
    assert_eq!(stopped.body["spec"]["stopped"], true);

    // Edit: PUT the object without a resourceVersion, as CreateJob.tsx does.
    let mut edited = job("j1");
    edited["metadata"]["labels"] = json!({"team": "rl"});
    let updated = f
        .send(fetch("PUT", &format!("{JOBS}/j1"), &cookie, Some(edited)))
        .await;
    assert_eq!(updated.status, StatusCode::OK, "{}", updated.body);
    assert_eq!(updated.body["metadata"]["labels"]["team"], "rl");

    // An error of the API comes back with its code, as `error`.
    let invalid = f
        .send(fetch(
            "POST",
            JOBS,
            &cookie,
            Some(json!({"apiVersion": "rlinf.io/v1alpha1", "kind": "Job", "metadata": {"name": "Bad_Name"}, "spec": {"tasks": []}})),
        ))
        .await;
    assert_eq!(
        invalid.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        invalid.body
    );
    assert!(invalid.body["error"].as_str().unwrap().contains("Bad_Name"));

    let deleted = f
        .send(fetch("DELETE", &format!("{JOBS}/j1"), &cookie, None))
        .await;
    assert_eq!(deleted.status, StatusCode::OK, "{}", deleted.body);
    assert_eq!(deleted.body, json!({"message": "deleted"}));
    let gone = f
        .send(fetch("GET", &format!("{JOBS}/j1"), &cookie, None))
        .await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    assert_eq!(gone.body["reason"], "NotFound");
}

#[tokio::test]
async fn a_viewer_reads_but_cannot_write_as_through_the_api() {
    let f = fixture().await;
    let admin_cookie = f.cookie_for(&admin()).await;
    let created = f
        .send(fetch("POST", JOBS, &admin_cookie, Some(job("j1"))))
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);

    let cookie = f.cookie_for(&viewer()).await;
    let list = f.send(fetch("GET", JOBS, &cookie, None)).await;
    assert_eq!(list.status, StatusCode::OK);
    assert_eq!(list.body["items"].as_array().unwrap().len(), 1);
    let delete = f
        .send(fetch("DELETE", &format!("{JOBS}/j1"), &cookie, None))
        .await;
    assert_eq!(delete.status, StatusCode::FORBIDDEN, "{}", delete.body);
    assert!(
        delete.body["error"].as_str().unwrap().contains("vera"),
        "{}",
        delete.body
    );
    let create = f.send(fetch("POST", JOBS, &cookie, Some(job("j2")))).await;
    assert_eq!(create.status, StatusCode::FORBIDDEN);
    // Still there.
    let one = f
        .send(fetch("GET", &format!("{JOBS}/j1"), &admin_cookie, None))
        .await;
    assert_eq!(one.status, StatusCode::OK);
}

#[tokio::test]
async fn cookie_writes_must_come_from_this_origin_and_bearer_tokens_need_no_cookie() {
    let f = fixture().await;
    let cookie = f.cookie_for(&admin()).await;
    let mut cross = fetch("POST", JOBS, &cookie, Some(job("j1")));
    cross
        .headers_mut()
        .insert("sec-fetch-site", "cross-site".parse().unwrap());
    let answer = f.send(cross).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    assert!(
        answer.body["error"]
            .as_str()
            .unwrap()
            .contains("another site")
    );

    // An older browser without Sec-Fetch-Site: Origin must be this host.
    let mut other_origin = fetch("POST", JOBS, &cookie, Some(job("j1")));
    other_origin.headers_mut().remove("sec-fetch-site");
    other_origin
        .headers_mut()
        .insert(header::ORIGIN, "https://evil.example".parse().unwrap());
    assert_eq!(f.send(other_origin).await.status, StatusCode::FORBIDDEN);

    // Behind a plain-HTTP proxy on localhost that keeps Host: the Origin's host matches.
    let mut proxied = fetch("POST", JOBS, &cookie, Some(job("j1")));
    proxied.headers_mut().remove("sec-fetch-site");
    proxied
        .headers_mut()
        .insert(header::HOST, "localhost:8080".parse().unwrap());
    proxied
        .headers_mut()
        .insert(header::ORIGIN, "http://localhost:8080".parse().unwrap());
    assert_eq!(f.send(proxied).await.status, StatusCode::CREATED);

    // No browser headers at all: refused for a cookie.
    let bare = Request::delete(format!("{JOBS}/j1"))
        .header(header::COOKIE, &cookie)
        .body(Body::empty())
        .unwrap();
    let answer = f.send(bare).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    assert!(answer.body["error"].as_str().unwrap().contains("Bearer"));

    // The API's own credentials work on the gateway's routes too (the server sets the
    // Identity from a certificate or bearer token before the router; here, directly).
    let mut scripted = Request::delete(format!("{JOBS}/j1"))
        .body(Body::empty())
        .unwrap();
    scripted.extensions_mut().insert(admin());
    assert_eq!(f.send(scripted).await.status, StatusCode::OK);
}

#[tokio::test]
async fn the_rlark_console_cookie_does_not_get_in_the_way_of_the_gateway() {
    let f = fixture().await;
    // A browser logged in to rlark's own console at the same origin.
    let code = f.console.sessions.create_link(viewer()).await.unwrap();
    let console_login = f
        .send(
            Request::post("/rlark/v1/console/login")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(json!({"code": code}).to_string()))
                .unwrap(),
        )
        .await;
    let console_cookie = console_login.headers[header::SET_COOKIE]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    // Without a gateway session it does not authenticate gateway calls.
    let answer = f.send(fetch("GET", JOBS, &console_cookie, None)).await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    // RLark's login works next to it (no CSRF header needed), and the gateway cookie
    // decides who writes.
    let token = f.token(&admin()).await;
    let login = f
        .send(
            Request::post("/api/v1/auth/login")
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::COOKIE, &console_cookie)
                .body(Body::from(
                    json!({"username": "root", "password": token}).to_string(),
                ))
                .unwrap(),
        )
        .await;
    assert_eq!(login.status, StatusCode::OK, "{}", login.body);
    let gateway_cookie = login.headers[header::SET_COOKIE]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let both = format!("{console_cookie}; {gateway_cookie}");
    let created = f.send(fetch("POST", JOBS, &both, Some(job("j1")))).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
}

#[tokio::test]
async fn logout_ends_the_session_and_a_revoked_token_ends_it_too() {
    let f = fixture().await;
    let cookie = f.cookie_for(&admin()).await;
    let out = f
        .send(fetch("POST", "/api/v1/auth/logout", &cookie, None))
        .await;
    assert_eq!(out.status, StatusCode::OK, "{}", out.body);
    assert!(
        out.headers[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );
    assert_eq!(
        f.send(fetch("GET", JOBS, &cookie, None)).await.status,
        StatusCode::UNAUTHORIZED
    );

    let (token, record) = f
        .security
        .create_bearer_token(&viewer(), None, None, &admin())
        .await
        .unwrap();
    let login = f.login("vera", &token.expose()).await;
    let cookie = login.headers[header::SET_COOKIE]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    assert_eq!(
        f.send(fetch("GET", JOBS, &cookie, None)).await.status,
        StatusCode::OK
    );
    f.security
        .revoke_bearer_token(&record.id, &admin())
        .await
        .unwrap();
    let after = f.send(fetch("GET", JOBS, &cookie, None)).await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED);
    assert!(after.body["error"].as_str().unwrap().contains("expired"));
}

#[tokio::test]
async fn namespaced_kinds_take_a_namespace_or_find_the_one_object_of_a_name() {
    let f = fixture().await;
    let cookie = f.cookie_for(&admin()).await;
    let node = json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "Node",
        "metadata": {"namespace": "rlark-c1", "name": "n1", "labels": {"rlark.io/cluster-id": "c1"}},
        "spec": {"agentType": "Raw"}
    });
    f.store
        .create(
            &rlark_store::ObjectKey::new("nodes.rlinf.io", "rlark-c1", "n1"),
            node,
        )
        .await
        .unwrap();
    let nodes = "/api/v1/rlinf.io/v1alpha1/nodes";
    // Every namespace.
    let list = f.send(fetch("GET", nodes, &cookie, None)).await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.body);
    assert_eq!(list.body["items"][0]["metadata"]["name"], "n1");
    // One namespace.
    let list = f
        .send(fetch(
            "GET",
            &format!("{nodes}?namespace=default"),
            &cookie,
            None,
        ))
        .await;
    assert_eq!(list.body["items"], json!([]));
    // Selectors pass through.
    let list = f
        .send(fetch(
            "GET",
            &format!("{nodes}?labelSelector=rlark.io%2Fcluster-id%3Dc1"),
            &cookie,
            None,
        ))
        .await;
    assert_eq!(
        list.body["items"].as_array().unwrap().len(),
        1,
        "{}",
        list.body
    );
    // By name, with and without ?namespace=.
    for path in [
        format!("{nodes}/n1?namespace=rlark-c1"),
        format!("{nodes}/n1"),
    ] {
        let one = f.send(fetch("GET", &path, &cookie, None)).await;
        assert_eq!(one.status, StatusCode::OK, "{path}: {}", one.body);
        assert_eq!(one.body["metadata"]["namespace"], "rlark-c1");
    }
    // AdminPage.tsx cordons with a merge patch naming the namespace.
    let cordoned = f
        .send(fetch(
            "PATCH",
            &format!("{nodes}/n1?namespace=rlark-c1"),
            &cookie,
            Some(json!({"spec": {"unschedulable": true}})),
        ))
        .await;
    assert_eq!(cordoned.status, StatusCode::OK, "{}", cordoned.body);
    assert_eq!(cordoned.body["spec"]["unschedulable"], true);
    let missing = f
        .send(fetch("GET", &format!("{nodes}/n9"), &cookie, None))
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    // A name that is no object name never reaches the API.
    let bad = f
        .send(fetch(
            "GET",
            &format!("{nodes}/..%2Fsecrets"),
            &cookie,
            None,
        ))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    // A namespaced create needs a namespace.
    let task = json!({"apiVersion": "rlinf.io/v1alpha1", "kind": "Task", "metadata": {"name": "t1"}, "spec": {}});
    let refused = f
        .send(fetch(
            "POST",
            "/api/v1/rlinf.io/v1alpha1/tasks",
            &cookie,
            Some(task),
        ))
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert!(
        refused.body["error"]
            .as_str()
            .unwrap()
            .contains("namespace")
    );
    let unknown = f
        .send(fetch(
            "GET",
            "/api/v1/rlinf.io/v1alpha1/secrets",
            &cookie,
            None,
        ))
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn clusters_come_in_rlarks_shape_from_rlarks_nodes() {
    let f = fixture().await;
    let cookie = f.cookie_for(&viewer()).await;
    let node = |ns: &str, name: &str, phase: &str, category: &str, used: &str| {
        json!({
            "apiVersion": "rlinf.io/v1alpha1", "kind": "Node",
            "metadata": {"namespace": ns, "name": name, "labels": {
                "rlark.io/cluster-id": ns.trim_start_matches("rlark-"),
                "rlark.io/node-category": category, "rlark.io/model": "A100"}},
            "spec": {"agentType": "Raw"},
            "status": {"phase": phase,
                "allocatable": {"cpu": "8", "nvidia.com/gpu": "4"},
                "used": {"cpu": "2", "nvidia.com/gpu": used}}
        })
    };
    for (ns, name, phase, category, used) in [
        ("rlark-a", "n1", "Online", "cloud", "1"),
        ("rlark-a", "n2", "Offline", "cloud", "0"),
        ("rlark-b", "n3", "Online", "robot", "0"),
    ] {
        f.store
            .create(
                &rlark_store::ObjectKey::new("nodes.rlinf.io", ns, name),
                node(ns, name, phase, category, used),
            )
            .await
            .unwrap();
    }
    f.store
        .create(
            &rlark_store::ObjectKey::new("tasks.rlinf.io", "rlark-a", "j1-main"),
            json!({
                "apiVersion": "rlinf.io/v1alpha1", "kind": "Task",
                "metadata": {"namespace": "rlark-a", "name": "j1-main", "labels": {"rlinf.io/job": "j1"}},
                "spec": {"placement": {"clusterID": "a", "nodes": ["n1"]}},
                "status": {"phase": "Running"}
            }),
        )
        .await
        .unwrap();
    let answer = f
        .send(fetch("GET", "/api/v1/clusters", &cookie, None))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.body["success"], true);
    let data = answer.body["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    let a = &data[0];
    assert_eq!(a["id"], "a");
    assert_eq!(a["name"], "a");
    assert_eq!(a["type"], "Cloud");
    assert_eq!(a["phase"], "Degraded");
    assert_eq!(a["totalNodes"], 2);
    assert_eq!(a["onlineNodes"], 1);
    assert_eq!(a["offlineNodes"], 1);
    assert_eq!(a["cloudNodes"], 2);
    assert_eq!(a["gpuModels"], json!(["A100"]));
    assert_eq!(a["gpuUsage"], 13);
    assert_eq!(a["cpuUsage"], 25);
    assert_eq!(a["runningJobs"], 1);
    assert_eq!(data[1]["type"], "Embodied");
    assert_eq!(data[1]["robots"], 1);
    assert_eq!(data[1]["robotModels"], json!(["A100"]));
    assert_eq!(data[1]["phase"], "Online");

    let one = f
        .send(fetch("GET", "/api/v1/clusters/a", &cookie, None))
        .await;
    assert_eq!(one.status, StatusCode::OK);
    assert_eq!(one.body["data"]["nodes"].as_array().unwrap().len(), 2);
    assert_eq!(one.body["data"]["totalNodes"], 2);
    let none = f
        .send(fetch("GET", "/api/v1/clusters/zz", &cookie, None))
        .await;
    assert_eq!(none.status, StatusCode::NOT_FOUND);
    assert_eq!(none.body["success"], false);
    assert!(none.body["message"].as_str().unwrap().contains("zz"));
}

#[tokio::test]
async fn agent_certificates_are_listed_for_admins_only() {
    let f = fixture().await;
    let cookie = f.cookie_for(&admin()).await;
    let list = f
        .send(fetch("GET", "/api/v1/certificates/agent", &cookie, None))
        .await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.body);
    assert!(list.body.is_array(), "{}", list.body);
    let viewer = f.cookie_for(&viewer()).await;
    let refused = f
        .send(fetch("GET", "/api/v1/certificates/agent", &viewer, None))
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);
    let sign = f
        .send(fetch(
            "GET",
            "/api/v1/certificates/agent/edge",
            &cookie,
            None,
        ))
        .await;
    assert_eq!(sign.status, StatusCode::NOT_IMPLEMENTED, "{}", sign.body);
}

#[tokio::test]
async fn features_rlark_does_not_have_answer_501_naming_them() {
    let f = fixture().await;
    let cookie = f.cookie_for(&admin()).await;
    for (method, path, feature) in [
        ("GET", "/api/v1/storage/storageclass", "storage classes"),
        ("GET", "/api/v1/image-registries", "image registries"),
        ("DELETE", "/api/v1/image-registries/r1", "image registries"),
        ("GET", "/api/v1/system-config", "system config"),
        ("GET", "/api/v1/addons", "addons"),
        ("GET", "/api/v1/installed-addons", "addons"),
        ("POST", "/api/v1/clusters/c1/addons", "addons"),
        (
            "POST",
            "/api/v1/certificates/agent",
            "agent certificates issued by the gateway",
        ),
        (
            "GET",
            "/api/v1/rlinf.io/v1alpha1/jobs/j1/metrics",
            "job metrics",
        ),
    ] {
        let answer = f.send(fetch(method, path, &cookie, None)).await;
        assert_eq!(answer.status, StatusCode::NOT_IMPLEMENTED, "{path}");
        assert_eq!(answer.body["feature"], feature, "{path}");
        assert!(
            answer.body["error"]
                .as_str()
                .unwrap()
                .contains("not provided by rlark"),
            "{}",
            answer.body
        );
    }
}

#[test]
fn gateway_paths_are_only_the_gateways() {
    for path in [
        "/api/v1/rlinf.io/v1alpha1/jobs",
        "/api/v1/clusters",
        "/api/v1/clusters/a",
        "/api/v1/auth/login",
        "/api/v1/storage/storageclass",
        "/api/v1/system-config",
        "/api/v1/ssh-user-keys/0",
        "/api/v1/certificates/agent",
    ] {
        assert!(is_gateway_path(path), "{path}");
    }
    for path in [
        "/api/v1",
        "/api/v1/namespaces/default/pods",
        "/api/v1/tunnels",
        "/api/v1/clustersx",
        "/apis/rlinf.io/v1alpha1/jobs",
        "/rlark/v1/clusters",
    ] {
        assert!(!is_gateway_path(path), "{path}");
    }
}

async fn put(f: &Fixture, resource: &str, namespace: &str, object: Value) {
    let name = object["metadata"]["name"].as_str().unwrap().to_string();
    f.store
        .create(
            &rlark_store::ObjectKey::new(resource, namespace, &name),
            object,
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_jobs_logs_are_its_pods_logs_read_as_the_caller() {
    let f = fixture().await;
    let cookie = f.cookie_for(&viewer()).await;
    put(&f, "jobs.rlinf.io", "", job("j1")).await;
    put(
        &f,
        "tasks.rlinf.io",
        "rlark-c1",
        json!({"apiVersion": "rlinf.io/v1alpha1", "kind": "Task",
            "metadata": {"namespace": "rlark-c1", "name": "j1-main", "labels": {"rlinf.io/job": "j1"}},
            "spec": {}}),
    )
    .await;
    for (name, phase) in [
        ("j1-main-0", "Running"),
        ("j1-main-1", "Pending"),
        ("broken", "Failed"),
    ] {
        put(
            &f,
            "pods.rlinf.io",
            "rlark-c1",
            json!({"apiVersion": "rlinf.io/v1alpha1", "kind": "Pod",
                "metadata": {"namespace": "rlark-c1", "name": name, "labels": {"rlark.io/task-name": "j1-main"}},
                "spec": {"taskName": "j1-main", "taskNamespace": "rlark-c1"},
                "status": {"phase": phase, "node": "n1"}}),
        )
        .await;
    }
    let answer = f
        .send(fetch("GET", &format!("{JOBS}/j1/logs"), &cookie, None))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let pods = answer.body["pods"].as_array().unwrap();
    assert_eq!(pods.len(), 3, "{}", answer.body);
    let by_name = |n: &str| pods.iter().find(|p| p["podName"] == n).unwrap();
    let running = by_name("j1-main-0");
    assert_eq!(running["taskName"], "j1-main");
    assert_eq!(running["phase"], "Running");
    assert_eq!(running["node"], "n1");
    assert_eq!(
        running["logs"],
        "line 1 of rlark-c1/j1-main-0 for vera (tail=1000)\nline 2\n"
    );
    assert_eq!(
        by_name("j1-main-1")["logs"],
        "pod is Pending, no logs available"
    );
    let broken = by_name("broken")["logs"].as_str().unwrap();
    assert!(
        broken.starts_with("error fetching logs: no agent of cluster c1"),
        "{broken}"
    );
    let unknown = f
        .send(fetch("GET", &format!("{JOBS}/nope/logs"), &cookie, None))
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_pods_events_come_in_rlarks_node_event_shape() {
    let f = fixture().await;
    let cookie = f.cookie_for(&viewer()).await;
    put(
        &f,
        "pods.rlinf.io",
        "rlark-c1",
        json!({"apiVersion": "rlinf.io/v1alpha1", "kind": "Pod",
            "metadata": {"namespace": "rlark-c1", "name": "p1"}, "spec": {}}),
    )
    .await;
    for (name, object) in [("e1", "p1"), ("e2", "p2")] {
        put(
            &f,
            "events",
            "rlark-c1",
            json!({"apiVersion": "v1", "kind": "Event",
                "metadata": {"namespace": "rlark-c1", "name": name},
                "involvedObject": {"kind": "Pod", "name": object, "namespace": "rlark-c1"},
                "type": "Warning", "reason": "FailedScheduling", "message": "no node fits",
                "count": 3, "lastTimestamp": "2025-01-01T00:00:00Z",
                "source": {"component": "rlark-scheduler"}}),
        )
        .await;
    }
    let answer = f
        .send(fetch(
            "GET",
            "/api/v1/rlinf.io/v1alpha1/pods/p1/events",
            &cookie,
            None,
        ))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(
        answer.body["events"],
        json!([{"type": "Warning", "reason": "FailedScheduling", "message": "no node fits",
            "lastTime": "2025-01-01T00:00:00Z", "count": 3, "source": "rlark-scheduler",
            "objectKind": "Pod", "objectName": "p1"}])
    );
    let missing = f
        .send(fetch(
            "GET",
            "/api/v1/rlinf.io/v1alpha1/pods/p9/events",
            &cookie,
            None,
        ))
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
}

const SSH_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl";

#[tokio::test]
async fn ssh_user_keys_map_onto_rlarks_keys_of_the_caller() {
    let f = fixture().await;
    let cookie = f.cookie_for(&viewer()).await;
    let keys = "/api/v1/ssh-user-keys";
    let empty = f.send(fetch("GET", keys, &cookie, None)).await;
    assert_eq!(empty.status, StatusCode::OK, "{}", empty.body);
    assert_eq!(empty.body, json!([]));

    // SSHKeys.tsx's body.
    let added = f
        .send(fetch(
            "POST",
            keys,
            &cookie,
            Some(json!({"user": "vera", "public_key": SSH_KEY, "notes": "laptop"})),
        ))
        .await;
    assert_eq!(added.status, StatusCode::CREATED, "{}", added.body);
    assert_eq!(added.body["index"], 0);
    assert_eq!(added.body["notes"], "laptop");

    let list = f.send(fetch("GET", keys, &cookie, None)).await;
    let items = list.body.as_array().unwrap();
    assert_eq!(items.len(), 1, "{}", list.body);
    assert_eq!(items[0]["user"], "vera");
    assert_eq!(items[0]["public_key"], format!("{SSH_KEY} laptop"));
    assert!(items[0]["added_at"].as_str().unwrap().starts_with("20"));

    // Someone else's key: rlark registers keys for the caller only.
    let other = f
        .send(fetch(
            "POST",
            keys,
            &cookie,
            Some(json!({"user": "bob", "public_key": SSH_KEY})),
        ))
        .await;
    assert_eq!(other.status, StatusCode::FORBIDDEN);
    assert!(
        other.body["error"]
            .as_str()
            .unwrap()
            .contains("not \"bob\"")
    );

    // Another user's keys are not the viewer's to list.
    let theirs = f
        .send(fetch("GET", &format!("{keys}?user=root"), &cookie, None))
        .await;
    assert_eq!(theirs.status, StatusCode::FORBIDDEN);

    let out_of_range = f
        .send(fetch(
            "DELETE",
            &format!("{keys}/3?user=vera"),
            &cookie,
            None,
        ))
        .await;
    assert_eq!(out_of_range.status, StatusCode::NOT_FOUND);
    let deleted = f
        .send(fetch(
            "DELETE",
            &format!("{keys}/0?user=vera"),
            &cookie,
            None,
        ))
        .await;
    assert_eq!(deleted.status, StatusCode::OK, "{}", deleted.body);
    let list = f.send(fetch("GET", keys, &cookie, None)).await;
    assert_eq!(list.body, json!([]));
}
