//! The console's routes and session layer as a service (`oneshot`), over a real SQLite
//! store and security layer: login, CSRF, cross-site refusal, authorization through the
//! API's policy, logout, token revocation.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use http::{Request, StatusCode, header};
use http_body_util::BodyExt as _;
use rlark_apiserver::ApiServer;
use rlark_apiserver::auth::{ADMIN_GROUP, Identity, VIEWER_GROUP};
use serde_json::{Value, json};
use tower::ServiceExt as _;

use super::*;
use crate::security::revocation_file::RevocationFile;
use crate::security::{Security, SecurityConfig};

struct Fixture {
    router: Router,
    console: Console,
    security: Arc<Security>,
    _dir: tempfile::TempDir,
}

fn admin() -> Identity {
    Identity {
        user: "root".into(),
        groups: vec![ADMIN_GROUP.into()],
    }
}

fn viewer() -> Identity {
    Identity {
        user: "vera".into(),
        groups: vec![VIEWER_GROUP.into()],
    }
}

async fn fixture() -> Fixture {
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
    let console = Console::new(Arc::clone(&security), Arc::clone(&store));
    let router = api
        .router()
        .merge(router(console.clone()))
        .merge(crate::changes::router(store))
        .layer(axum::middleware::from_fn_with_state(
            console.clone(),
            session_layer,
        ));
    Fixture {
        router,
        console,
        security,
        _dir: dir,
    }
}

struct Answer {
    status: StatusCode,
    headers: http::HeaderMap,
    body: Value,
}

impl Fixture {
    async fn send(&self, request: Request<Body>) -> Answer {
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

    async fn login(&self, body: Value) -> Answer {
        self.send(
            Request::post("/rlark/v1/console/login")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_string()))
                .unwrap(),
        )
        .await
    }

    /// Log in with a one-time link for `identity`: (cookie header value, CSRF token).
    async fn session_for(&self, identity: Identity) -> (String, String) {
        let code = self.console.sessions.create_link(identity).await.unwrap();
        let answer = self.login(json!({"code": code})).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        (
            cookie_of(&answer.headers),
            answer.body["csrfToken"].as_str().unwrap().to_string(),
        )
    }
}

/// `name=value` of the Set-Cookie header, checking its attributes.
fn cookie_of(headers: &http::HeaderMap) -> String {
    let set = headers[header::SET_COOKIE].to_str().unwrap();
    for attribute in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/"] {
        assert!(set.contains(attribute), "{set}");
    }
    assert!(set.starts_with("__Host-rlark_session="), "{set}");
    set.split(';').next().unwrap().to_string()
}

fn job(name: &str) -> Value {
    json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "Job",
        "metadata": {"name": name},
        "spec": {"tasks": [{"name": "main", "agentType": "Raw", "role": "Actor", "raw": {"entrypoint": ["true"], "replicas": 1}}]}
    })
}

fn create_job(cookie: &str, csrf: Option<&str>, name: &str) -> Request<Body> {
    let mut builder = Request::post("/apis/rlinf.io/v1alpha1/jobs")
        .header(header::COOKIE, cookie)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::HOST, "rlark.test:6443");
    if let Some(csrf) = csrf {
        builder = builder.header(CSRF_HEADER, csrf);
    }
    builder.body(Body::from(job(name).to_string())).unwrap()
}

fn get(path: &str, cookie: &str) -> Request<Body> {
    Request::get(path)
        .header(header::COOKIE, cookie)
        .body(Body::empty())
        .unwrap()
}

#[tokio::test]
async fn a_one_time_link_logs_in_once_and_the_session_reads_and_writes_with_csrf() {
    let f = fixture().await;
    let code = f.console.sessions.create_link(admin()).await.unwrap();
    let answer = f.login(json!({"code": code})).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.body["user"], "root");
    assert_eq!(answer.body["role"], "admin");
    assert_eq!(answer.body["canWrite"], true);
    let cookie = cookie_of(&answer.headers);
    let csrf = answer.body["csrfToken"].as_str().unwrap().to_string();
    // The link is spent.
    let again = f.login(json!({"code": code})).await;
    assert_eq!(again.status, StatusCode::UNAUTHORIZED);
    assert!(
        again.body["message"]
            .as_str()
            .unwrap()
            .contains("used or expired"),
        "{}",
        again.body
    );

    // The cookie authenticates API reads.
    let nodes = f.send(get("/apis/rlinf.io/v1alpha1/nodes", &cookie)).await;
    assert_eq!(nodes.status, StatusCode::OK, "{}", nodes.body);
    let session = f.send(get("/rlark/v1/console/session", &cookie)).await;
    assert_eq!(session.body["csrfToken"], csrf.as_str());
    assert_eq!(answer.body["loginWith"], "link");
    assert_eq!(session.body["loginWith"], "link");

    // Writes need the CSRF token.
    let missing = f.send(create_job(&cookie, None, "j1")).await;
    assert_eq!(missing.status, StatusCode::FORBIDDEN);
    assert!(
        missing.body["message"].as_str().unwrap().contains("CSRF"),
        "{}",
        missing.body
    );
    let wrong = f.send(create_job(&cookie, Some("0123"), "j1")).await;
    assert_eq!(wrong.status, StatusCode::FORBIDDEN);
    let created = f.send(create_job(&cookie, Some(&csrf), "j1")).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);

    // A cross-site request is refused even with the token.
    let mut cross = create_job(&cookie, Some(&csrf), "j2");
    cross
        .headers_mut()
        .insert(header::ORIGIN, "https://evil.example".parse().unwrap());
    assert_eq!(f.send(cross).await.status, StatusCode::FORBIDDEN);
    let mut same = create_job(&cookie, Some(&csrf), "j3");
    same.headers_mut()
        .insert(header::ORIGIN, "https://rlark.test:6443".parse().unwrap());
    assert_eq!(f.send(same).await.status, StatusCode::CREATED);
}

#[tokio::test]
async fn a_viewer_session_reads_but_cannot_write_even_with_csrf() {
    let f = fixture().await;
    let (cookie, csrf) = f.session_for(viewer()).await;
    let session = f.send(get("/rlark/v1/console/session", &cookie)).await;
    assert_eq!(session.body["role"], "viewer");
    assert_eq!(session.body["canWrite"], false);
    let jobs = f.send(get("/apis/rlinf.io/v1alpha1/jobs", &cookie)).await;
    assert_eq!(jobs.status, StatusCode::OK);
    let forged = f.send(create_job(&cookie, Some(&csrf), "j1")).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    assert!(
        forged.body["message"]
            .as_str()
            .unwrap()
            .contains("User \"vera\" cannot create"),
        "{}",
        forged.body
    );
    // Nor may a viewer mint login links.
    let link = f
        .send(
            Request::post("/rlark/v1/console/links")
                .header(header::COOKIE, &cookie)
                .header(CSRF_HEADER, &csrf)
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(link.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn logout_revokes_the_session() {
    let f = fixture().await;
    let (cookie, csrf) = f.session_for(admin()).await;
    let logout = |csrf: Option<&str>| {
        let mut builder = Request::post("/rlark/v1/console/logout").header(header::COOKIE, &cookie);
        if let Some(csrf) = csrf {
            builder = builder.header(CSRF_HEADER, csrf);
        }
        builder.body(Body::empty()).unwrap()
    };
    // Logout changes state: it needs the CSRF token too (no logout by a forged form).
    assert_eq!(f.send(logout(None)).await.status, StatusCode::FORBIDDEN);
    let out = f.send(logout(Some(&csrf))).await;
    assert_eq!(out.status, StatusCode::OK);
    let cleared = out.headers[header::SET_COOKIE].to_str().unwrap();
    assert!(cleared.contains("Max-Age=0"), "{cleared}");
    // The old cookie authenticates nothing any more.
    let after = f.send(get("/rlark/v1/console/session", &cookie)).await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED);
    let api = f.send(get("/apis/rlinf.io/v1alpha1/jobs", &cookie)).await;
    assert_eq!(api.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_bearer_token_logs_in_and_its_revocation_ends_the_session() {
    let f = fixture().await;
    let (token, record) = f
        .security
        .create_bearer_token(&viewer(), None, None, &admin())
        .await
        .unwrap();
    let answer = f.login(json!({"token": token.expose()})).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.body["user"], "vera");
    assert_eq!(answer.body["loginWith"], "token");
    let cookie = cookie_of(&answer.headers);
    assert_eq!(
        f.send(get("/rlark/v1/console/session", &cookie)).await.body["loginWith"],
        "token"
    );
    assert_eq!(
        f.send(get("/apis/rlinf.io/v1alpha1/jobs", &cookie))
            .await
            .status,
        StatusCode::OK
    );
    f.security
        .revoke_bearer_token(&record.id, &admin())
        .await
        .unwrap();
    // The admin page's token list shows it revoked, without its secret's hash.
    let listed = f.security.bearer_tokens().await.unwrap();
    let mine = listed.iter().find(|t| t.id == record.id).unwrap();
    assert!(mine.revoked_at.is_some());
    assert_eq!(
        f.send(get("/apis/rlinf.io/v1alpha1/jobs", &cookie))
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    // A bad token is refused with the reason, and sets no cookie.
    let bad = f.login(json!({"token": "rlk-nope.nope"})).await;
    assert_eq!(bad.status, StatusCode::UNAUTHORIZED);
    assert!(bad.headers.get(header::SET_COOKIE).is_none());
}

#[tokio::test]
async fn login_refuses_bad_bodies_and_non_people() {
    let f = fixture().await;
    let not_json = f
        .send(
            Request::post("/rlark/v1/console/login")
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(Body::from("token=x"))
                .unwrap(),
        )
        .await;
    assert_eq!(not_json.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let both = f.login(json!({"token": "a", "code": "b"})).await;
    assert_eq!(both.status, StatusCode::BAD_REQUEST);
    let unknown = f.login(json!({"password": "x"})).await;
    assert_eq!(unknown.status, StatusCode::BAD_REQUEST);
    assert!(
        unknown.body["message"]
            .as_str()
            .unwrap()
            .contains("password"),
        "{}",
        unknown.body
    );
    let code = f
        .console
        .sessions
        .create_link(Identity::agent("edge-1"))
        .await
        .unwrap();
    let agent = f.login(json!({"code": code})).await;
    assert_eq!(agent.status, StatusCode::FORBIDDEN);
    // Anonymous callers get 401 from the console routes and the API alike.
    let anonymous = f
        .send(
            Request::get("/rlark/v1/clusters")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn the_app_is_served_with_a_content_security_policy() {
    let f = fixture().await;
    let page = f
        .router
        .clone()
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert_eq!(
        page.headers()[header::CONTENT_SECURITY_POLICY],
        assets::CONTENT_SECURITY_POLICY
    );
    // Nothing inline may run or apply: no 'unsafe-inline' (nor 'unsafe-eval') anywhere, and
    // scripts and styles come from this server only.
    let csp = page.headers()[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(!csp.contains("unsafe-"), "{csp}");
    let directive = |name: &str| {
        csp.split(';')
            .map(str::trim)
            .find(|d| d.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} in {csp}"))
            .to_owned()
    };
    assert_eq!(directive("script-src"), "script-src 'self'");
    assert_eq!(directive("style-src"), "style-src 'self'");
    assert!(
        page.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let html = page.into_body().collect().await.unwrap().to_bytes();
    let html = String::from_utf8_lossy(&html);
    assert!(html.contains("<div id=\"app\">"), "{html}");
    // Every asset the page names is served.
    for src in html.split("\"/assets/").skip(1) {
        let name = src.split('"').next().unwrap();
        let asset = f
            .router
            .clone()
            .oneshot(
                Request::get(format!("/assets/{name}"))
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(asset.status(), StatusCode::OK, "{name}");
    }
    let missing = f
        .router
        .clone()
        .oneshot(Request::get("/assets/nope.js").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_cluster_summary_counts_nodes_gpus_devices_and_running_jobs() {
    let f = fixture().await;
    let (cookie, _) = f.session_for(viewer()).await;
    let store = &f.console.store;
    let node = |ns: &str, name: &str, phase: &str, gpus: &str, used: &str| {
        json!({
            "apiVersion": "rlinf.io/v1alpha1", "kind": "Node",
            "metadata": {"namespace": ns, "name": name, "labels": {"rlark.io/cluster-id": ns.trim_start_matches("rlark-")}},
            "spec": {"agentType": "Process"},
            "status": {"phase": phase,
                "allocatable": {"cpu": "8", "nvidia.com/gpu": gpus, "rlinf.io/device": "1"},
                "used": {"nvidia.com/gpu": used}}
        })
    };
    for (ns, name, phase, gpus, used) in [
        ("rlark-a", "n1", "Online", "4", "1"),
        ("rlark-a", "n2", "Offline", "4", "0"),
        ("rlark-b", "n3", "Online", "0", "0"),
    ] {
        store
            .create(
                &rlark_store::ObjectKey::new("nodes.rlinf.io", ns, name),
                node(ns, name, phase, gpus, used),
            )
            .await
            .unwrap();
    }
    store
        .create(
            &rlark_store::ObjectKey::new("tasks.rlinf.io", "default", "j1-main"),
            json!({
                "apiVersion": "rlinf.io/v1alpha1", "kind": "Task",
                "metadata": {"namespace": "default", "name": "j1-main", "labels": {"rlinf.io/job": "j1"}},
                "spec": {"placement": {"clusterID": "a", "nodes": ["n1"]}},
                "status": {"phase": "Running"}
            }),
        )
        .await
        .unwrap();
    let answer = f.send(get("/rlark/v1/clusters", &cookie)).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let items = answer.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{}", answer.body);
    let a = &items[0];
    assert_eq!(a["id"], "a");
    assert_eq!(a["phase"], "Degraded");
    assert_eq!(a["totalNodes"], 2);
    assert_eq!(a["onlineNodes"], 1);
    assert_eq!(a["gpus"], json!({"total": 8.0, "used": 1.0, "free": 7.0}));
    assert_eq!(a["devices"]["total"], 2.0);
    assert_eq!(a["runningJobs"], 1);
    assert_eq!(items[1]["phase"], "Online");
    assert_eq!(items[1]["runningJobs"], 0);
}

/// The next line of a streamed body (waits up to 5 s).
async fn next_line(body: &mut Body, pending: &mut String) -> Value {
    loop {
        if let Some(end) = pending.find('\n') {
            let line: String = pending.drain(..=end).collect();
            return serde_json::from_str(line.trim()).unwrap();
        }
        let frame = tokio::time::timeout(std::time::Duration::from_secs(5), body.frame())
            .await
            .expect("a line within 5 s")
            .expect("the stream goes on")
            .unwrap();
        if let Ok(data) = frame.into_data() {
            pending.push_str(std::str::from_utf8(&data).unwrap());
        }
    }
}

#[tokio::test]
async fn the_change_stream_pushes_list_changes_after_a_bookmark() {
    let f = fixture().await;
    let (cookie, _) = f.session_for(admin()).await;
    let response = f
        .router
        .clone()
        .oneshot(get(
            "/rlark/v1/console/changes?resources=tokens%2Cjointokens,revocations",
            &cookie,
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "application/x-ndjson"
    );
    let mut body = response.into_body();
    let mut pending = String::new();
    let bookmark = next_line(&mut body, &mut pending).await;
    assert_eq!(bookmark["type"], "BOOKMARK");
    let from: u64 = bookmark["revision"].as_str().unwrap().parse().unwrap();

    let (_, record) = f
        .security
        .create_bearer_token(&viewer(), None, None, &admin())
        .await
        .unwrap();
    let changed = next_line(&mut body, &mut pending).await;
    assert_eq!(changed["type"], "CHANGED");
    assert_eq!(changed["resource"], "tokens");
    assert!(
        changed["revision"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > from
    );

    f.security
        .create_bootstrap_token(std::time::Duration::from_secs(600), "edge", false, &admin())
        .await
        .unwrap();
    assert_eq!(
        next_line(&mut body, &mut pending).await["resource"],
        "jointokens"
    );
    // Revoking a bearer token marks its record (revokedAt).
    f.security
        .revoke_bearer_token(&record.id, &admin())
        .await
        .unwrap();
    assert_eq!(
        next_line(&mut body, &mut pending).await["resource"],
        "tokens"
    );
}

#[tokio::test]
async fn the_change_stream_tells_users_only_of_what_they_may_read() {
    use crate::ssh::keys::{RegisteredWith, SshKeys};
    let f = fixture().await;
    let (cookie, _) = f.session_for(viewer()).await;
    // Admin-only lists are refused whole; unknown or no lists are a 400.
    for (query, status) in [
        ("resources=sshkeys,tokens", StatusCode::FORBIDDEN),
        ("resources=certificates", StatusCode::FORBIDDEN),
        ("resources=sshkeys,nope", StatusCode::BAD_REQUEST),
        ("", StatusCode::BAD_REQUEST),
    ] {
        let answer = f
            .send(get(&format!("/rlark/v1/console/changes?{query}"), &cookie))
            .await;
        assert_eq!(answer.status, status, "{query}: {}", answer.body);
    }
    let anonymous = f
        .router
        .clone()
        .oneshot(
            Request::get("/rlark/v1/console/changes?resources=sshkeys")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);

    // A viewer hears of its own keys only.
    let response = f
        .router
        .clone()
        .oneshot(get("/rlark/v1/console/changes?resources=sshkeys", &cookie))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut pending = String::new();
    assert_eq!(next_line(&mut body, &mut pending).await["type"], "BOOKMARK");
    let keys = SshKeys::new(Arc::clone(&f.console.store));
    let tess = Identity {
        user: "tess".into(),
        groups: vec![VIEWER_GROUP.into()],
    };
    let token = RegisteredWith::Token { id: "rlk-t".into() };
    keys.add(
        &tess,
        token.clone(),
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOOtxj4LhwUlaAiHqP6EZyv/tcuKjsSekP5wpaQh2H18 tess@t",
        None,
    )
    .await
    .unwrap();
    keys.add(
        &viewer(),
        token,
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGV3GgMbq5H/ja0SHjCssfWMxoN45A2jSSAn2reUsJrA vera@t",
        None,
    )
    .await
    .unwrap();
    // The first line after the bookmark is vera's key, not tess's (written first).
    let changed = next_line(&mut body, &mut pending).await;
    assert_eq!(changed["resource"], "sshkeys");
    let vera_revision: u64 = changed["revision"].as_str().unwrap().parse().unwrap();
    assert_eq!(vera_revision, f.console.store.revision());
}
