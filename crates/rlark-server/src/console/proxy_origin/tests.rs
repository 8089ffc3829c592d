//! The proxy origin as services (`oneshot`): the console origin's router (API, console,
//! ticket route, task proxy under the session layer) and the proxy origin's router, over a
//! real SQLite store and security layer.

use std::sync::Arc;

use axum::body::Body;
use http::{Request, StatusCode, header};
use http_body_util::BodyExt as _;
use rlark_apiserver::ApiServer;
use rlark_apiserver::auth::{ADMIN_GROUP, Identity, VIEWER_GROUP};
use rlark_store::{ObjectKey, Store};
use serde_json::{Value, json};
use tower::ServiceExt as _;

use super::*;
use crate::console::{CSRF_HEADER, session_layer};
use crate::security::revocation_file::RevocationFile;
use crate::security::{Security, SecurityConfig};

const CONSOLE_HOST: &str = "127.0.0.1:8443";
const APP: &str = "/rlark/v1/namespaces/rlark-a/tasks/j1-main/proxy/6006/";

struct Fixture {
    main: Router,
    proxy: Router,
    console: Console,
    security: Arc<Security>,
    store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

struct Answer {
    status: StatusCode,
    headers: http::HeaderMap,
    text: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or(Value::Null)
    }
}

fn admin() -> Identity {
    Identity {
        user: "root".into(),
        groups: vec![ADMIN_GROUP.into()],
    }
}

fn viewer(user: &str) -> Identity {
    Identity {
        user: user.into(),
        groups: vec![VIEWER_GROUP.into()],
    }
}

/// `proxy`: whether the server has a proxy origin (a loopback listener on port 8444).
async fn fixture(proxy: bool) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(
        rlark_store::SqliteStore::open(rlark_store::SqliteStoreConfig::new(
            dir.path().join("rlark.db"),
        ))
        .await
        .unwrap(),
    );
    let ca = Arc::new(rlark_pki::Ca::load_or_create(&dir.path().join("pki")).unwrap());
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
    let url = proxy.then(|| ProxyUrl::new(None, "127.0.0.1:8444".parse().unwrap()));
    let task_proxy = crate::tunnel::task_proxy::router(crate::tunnel::task_proxy::TaskProxyState {
        hub: crate::tunnel::Hub::new("test".into(), Default::default()),
        store: Arc::clone(&store),
        audit: Arc::new(rlark_apiserver::audit::TracingAudit),
        proxy_url: url.clone(),
    });
    let state = ProxyOrigin {
        console: console.clone(),
        url,
    };
    let access = axum::Extension(crate::task_access::AccessStore(Arc::clone(&store)));
    let main = api
        .router()
        .merge(task_proxy.clone())
        .merge(super::super::router(console.clone()))
        .merge(tickets_router(state.clone()))
        .layer(access.clone())
        .layer(axum::middleware::from_fn_with_state(
            console.clone(),
            session_layer,
        ));
    let proxy = router(state, task_proxy).layer(access);
    for (key, object) in [
        (
            ObjectKey::new(task_access::JOBS, "", "j1"),
            json!({"apiVersion": "rlinf.io/v1alpha1", "kind": "Job",
                   "metadata": {"name": "j1"},
                   "spec": {"access": [{"user": "alice"}], "tasks": []}}),
        ),
        (
            ObjectKey::new(task_access::TASKS, "rlark-a", "j1-main"),
            json!({"apiVersion": "rlinf.io/v1alpha1", "kind": "Task",
                   "metadata": {"namespace": "rlark-a", "name": "j1-main",
                                "labels": {"rlinf.io/job": "j1"}},
                   "spec": {"agentType": "Raw", "role": "Actor",
                            "raw": {"entrypoint": ["true"], "replicas": 2}}}),
        ),
        (
            ObjectKey::new(task_access::TASKS, "rlark-a", "loose"),
            json!({"apiVersion": "rlinf.io/v1alpha1", "kind": "Task",
                   "metadata": {"namespace": "rlark-a", "name": "loose"},
                   "spec": {"agentType": "Raw", "role": "Actor",
                            "raw": {"entrypoint": ["true"]}}}),
        ),
    ] {
        store.create(&key, object).await.unwrap();
    }
    Fixture {
        main,
        proxy,
        console,
        security,
        store,
        _dir: dir,
    }
}

async fn send(router: &Router, request: Request<Body>) -> Answer {
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        text: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

impl Fixture {
    /// A console session for `identity`: (cookie, CSRF token).
    async fn session_for(&self, identity: Identity) -> (String, String) {
        let code = self.console.sessions.create_link(identity).await.unwrap();
        let answer = send(
            &self.main,
            Request::post("/rlark/v1/console/login")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(json!({"code": code}).to_string()))
                .unwrap(),
        )
        .await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
        let set = answer.headers[header::SET_COOKIE].to_str().unwrap();
        (
            set.split(';').next().unwrap().to_string(),
            answer.json()["csrfToken"].as_str().unwrap().to_string(),
        )
    }

    /// `POST /rlark/v1/console/proxy-tickets` with a session cookie (and `csrf`).
    async fn ticket(&self, cookie: &str, csrf: Option<&str>, body: Value) -> Answer {
        let mut builder = Request::post(TICKETS_ROUTE)
            .header(header::COOKIE, cookie)
            .header(header::HOST, CONSOLE_HOST)
            .header(header::ORIGIN, format!("https://{CONSOLE_HOST}"))
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(csrf) = csrf {
            builder = builder.header(CSRF_HEADER, csrf);
        }
        send(
            &self.main,
            builder.body(Body::from(body.to_string())).unwrap(),
        )
        .await
    }

    /// Redeem the ticket of `url` on the proxy origin.
    async fn redeem(&self, url: &str) -> Answer {
        let path = url.split_once("8444").unwrap().1;
        send(&self.proxy, Request::get(path).body(Body::empty()).unwrap()).await
    }

    async fn logout(&self, cookie: &str, csrf: &str) {
        let out = send(
            &self.main,
            Request::post("/rlark/v1/console/logout")
                .header(header::COOKIE, cookie)
                .header(CSRF_HEADER, csrf)
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(out.status, StatusCode::OK, "{}", out.text);
    }
}

fn get_with_cookie(path: &str, cookie: &str) -> Request<Body> {
    Request::get(path)
        .header(header::COOKIE, cookie)
        .body(Body::empty())
        .unwrap()
}

fn app_ticket() -> Value {
    json!({"namespace": "rlark-a", "task": "j1-main", "port": 6006})
}

#[tokio::test]
async fn a_ticket_logs_in_on_the_proxy_origin_once_and_logout_ends_it() {
    let f = fixture(true).await;
    let (cookie, csrf) = f.session_for(admin()).await;
    // A write: the session's CSRF token is needed.
    let refused = f.ticket(&cookie, None, app_ticket()).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.text);
    let answer = f.ticket(&cookie, Some(&csrf), app_ticket()).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    assert_eq!(answer.headers[header::CACHE_CONTROL], "no-store");
    let url = answer.json()["url"].as_str().unwrap().to_string();
    // The console was reached as 127.0.0.1: the proxy origin is another site, localhost.
    assert!(
        url.starts_with("https://localhost:8444/rlark/v1/proxy-login?ticket="),
        "{url}"
    );
    let ticket = url.rsplit_once('=').unwrap().1;
    assert!(ticket.len() >= 32, "at least 128 bits: {ticket}");
    // Stored as its digest only.
    let listed = f
        .store
        .list(sessions::PROXY_TICKETS, &Default::default())
        .await
        .unwrap();
    assert!(
        !serde_json::to_string(&listed.items)
            .unwrap()
            .contains(ticket)
    );

    let login = f.redeem(&url).await;
    assert_eq!(login.status, StatusCode::SEE_OTHER, "{}", login.text);
    assert_eq!(login.headers[header::LOCATION], APP);
    let set = login.headers[header::SET_COOKIE].to_str().unwrap();
    for attribute in ["HttpOnly", "Secure", "SameSite=Lax", "Path=/"] {
        assert!(set.contains(attribute), "{set}");
    }
    assert!(set.starts_with("__Host-rlark_proxy="), "{set}");
    let proxy_cookie = set.split(';').next().unwrap().to_string();

    // Once only.
    let again = f.redeem(&url).await;
    assert_eq!(again.status, StatusCode::FORBIDDEN);
    assert!(again.text.contains("already used"), "{}", again.text);

    // The proxy cookie authenticates the proxy route: past authentication, the replica
    // does not run (400), where an anonymous request gets 401.
    let app = send(&f.proxy, get_with_cookie(APP, &proxy_cookie)).await;
    assert_eq!(app.status, StatusCode::BAD_REQUEST, "{}", app.text);
    assert!(app.text.contains("not been started"), "{}", app.text);
    let anonymous = send(&f.proxy, Request::get(APP).body(Body::empty()).unwrap()).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    // The console's cookie means nothing on the proxy origin.
    let console_cookie = send(&f.proxy, get_with_cookie(APP, &cookie)).await;
    assert_eq!(console_cookie.status, StatusCode::UNAUTHORIZED);

    // Logging out of the console ends the proxy session too.
    f.logout(&cookie, &csrf).await;
    let after = send(&f.proxy, get_with_cookie(APP, &proxy_cookie)).await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED, "{}", after.text);
}

/// A ticket request is JSON or nothing: a cross-site form post cannot send that type
/// without a preflight.
#[tokio::test]
async fn a_ticket_request_without_a_json_body_is_refused() {
    let f = fixture(true).await;
    let (cookie, csrf) = f.session_for(admin()).await;
    let request = Request::post(TICKETS_ROUTE)
        .header(header::COOKIE, &cookie)
        .header(header::HOST, CONSOLE_HOST)
        .header(header::ORIGIN, format!("https://{CONSOLE_HOST}"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(CSRF_HEADER, &csrf)
        .body(Body::from("namespace=rlark-a"))
        .unwrap();
    let answer = send(&f.main, request).await;
    assert_eq!(
        answer.status,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "{}",
        answer.text
    );
    assert!(
        answer.text.contains("a ticket request takes a JSON body"),
        "{}",
        answer.text
    );
}

#[tokio::test]
async fn expired_and_unknown_tickets_are_refused() {
    let f = fixture(true).await;
    let expired = sessions::ProxyGrant {
        user: "root".into(),
        groups: vec![ADMIN_GROUP.into()],
        session: None,
        token_id: None,
        cert_serial: None,
        namespace: "rlark-a".into(),
        task: "j1-main".into(),
        replica: None,
        port: 6006,
        path: String::new(),
        expires_unix: sessions::unix(SystemTime::now()) - 1,
    };
    let ticket = f
        .console
        .sessions
        .create_grant(PROXY_TICKETS, &expired)
        .await
        .unwrap();
    for ticket in [ticket.as_str(), "0123456789abcdef"] {
        let answer = send(
            &f.proxy,
            Request::get(format!("{LOGIN_ROUTE}?ticket={ticket}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{ticket}");
        assert!(answer.headers.get(header::SET_COOKIE).is_none());
        assert!(answer.text.contains("expired"), "{}", answer.text);
    }
}

#[tokio::test]
async fn only_callers_who_may_reach_the_task_get_a_ticket() {
    let f = fixture(true).await;
    // vera is a viewer the Job does not grant; alice is granted by user.
    let (vera, vera_csrf) = f.session_for(viewer("vera")).await;
    let answer = f.ticket(&vera, Some(&vera_csrf), app_ticket()).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN, "{}", answer.text);
    assert!(answer.text.contains("does not grant"), "{}", answer.text);
    let (alice, alice_csrf) = f.session_for(viewer("alice")).await;
    let answer = f.ticket(&alice, Some(&alice_csrf), app_ticket()).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    // A task of no Job is for admins only.
    let loose = json!({"namespace": "rlark-a", "task": "loose", "port": 80});
    let answer = f.ticket(&alice, Some(&alice_csrf), loose.clone()).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN, "{}", answer.text);
    let (root, root_csrf) = f.session_for(admin()).await;
    assert_eq!(
        f.ticket(&root, Some(&root_csrf), loose).await.status,
        StatusCode::OK
    );
    // A replica the task does not have, a path leaving the app, an unknown task.
    for (body, status) in [
        (
            json!({"namespace": "rlark-a", "task": "j1-main", "replica": 2, "port": 1}),
            StatusCode::NOT_FOUND,
        ),
        (
            json!({"namespace": "rlark-a", "task": "j1-main", "port": 1, "path": "//evil.example/"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"namespace": "rlark-a", "task": "nope", "port": 1}),
            StatusCode::NOT_FOUND,
        ),
    ] {
        let answer = f.ticket(&root, Some(&root_csrf), body.clone()).await;
        assert_eq!(answer.status, status, "{body}: {}", answer.text);
    }
    // A replica and a path land there after the login.
    let answer = f
        .ticket(
            &alice,
            Some(&alice_csrf),
            json!({"namespace": "rlark-a", "task": "j1-main", "replica": 1, "port": 8265, "path": "/#/jobs"}),
        )
        .await;
    let login = f.redeem(answer.json()["url"].as_str().unwrap()).await;
    assert_eq!(
        login.headers[header::LOCATION],
        "/rlark/v1/namespaces/rlark-a/tasks/j1-main/replicas/1/proxy/8265/#/jobs"
    );
}

#[tokio::test]
async fn a_console_reached_as_localhost_gets_the_proxy_at_127_0_0_1() {
    let url = ProxyUrl::new(None, "0.0.0.0:8444".parse().unwrap());
    assert_eq!(
        url.for_console(Some("localhost:8443")),
        "https://127.0.0.1:8444"
    );
    assert_eq!(
        url.for_console(Some("127.0.0.1:8443")),
        "https://localhost:8444"
    );
    assert_eq!(
        url.for_console(Some("[::1]:8443")),
        "https://localhost:8444"
    );
    let fixed = ProxyUrl::new(
        Some("https://apps.example.com/"),
        "0.0.0.0:8444".parse().unwrap(),
    );
    assert_eq!(
        fixed.for_console(Some("localhost")),
        "https://apps.example.com"
    );
    assert_eq!(
        ProxyUrl::new(None, "10.0.0.5:8444".parse().unwrap()).for_console(None),
        "https://10.0.0.5:8444"
    );
}

#[tokio::test]
async fn without_a_proxy_origin_no_ticket_is_issued() {
    let f = fixture(false).await;
    let (cookie, csrf) = f.session_for(admin()).await;
    let answer = f.ticket(&cookie, Some(&csrf), app_ticket()).await;
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        answer.text
    );
    assert!(answer.text.contains("--proxy-listen"), "{}", answer.text);
    let app = send(&f.main, get_with_cookie(APP, &cookie)).await;
    assert_eq!(app.status, StatusCode::FORBIDDEN, "{}", app.text);
    assert!(app.text.contains("no task proxy origin"), "{}", app.text);
}

#[tokio::test]
async fn the_console_cookie_is_refused_on_the_main_origins_proxy_routes_but_tokens_work() {
    let f = fixture(true).await;
    let (cookie, _) = f.session_for(admin()).await;
    let mut request = get_with_cookie(APP, &cookie);
    request
        .headers_mut()
        .insert(header::HOST, CONSOLE_HOST.parse().unwrap());
    let refused = send(&f.main, request).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.text);
    assert!(
        refused.text.contains("https://localhost:8444"),
        "names the proxy origin: {}",
        refused.text
    );
    // A bearer token (as `crate::auth` resolves it) passes: the replica does not run.
    let (token, record) = f
        .security
        .create_bearer_token(&admin(), None, None, &admin())
        .await
        .unwrap();
    let _ = token;
    let mut request = Request::get(APP).body(Body::empty()).unwrap();
    request.extensions_mut().insert(admin());
    request.extensions_mut().insert(AuthMethod::Bearer {
        id: record.id.clone(),
    });
    let bearer = send(&f.main, request).await;
    assert_eq!(bearer.status, StatusCode::BAD_REQUEST, "{}", bearer.text);
    assert!(bearer.text.contains("not been started"), "{}", bearer.text);

    // A bearer token gets a ticket too, bound to the token: its revocation ends the login.
    let mut request = Request::post(TICKETS_ROUTE)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(app_ticket().to_string()))
        .unwrap();
    request.extensions_mut().insert(admin());
    request.extensions_mut().insert(AuthMethod::Bearer {
        id: record.id.clone(),
    });
    let answer = send(&f.main, request).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    f.security
        .revoke_bearer_token(&record.id, &admin())
        .await
        .unwrap();
    let login = f.redeem(answer.json()["url"].as_str().unwrap()).await;
    assert_eq!(login.status, StatusCode::FORBIDDEN, "{}", login.text);
}

#[tokio::test]
async fn the_proxy_origin_serves_only_its_routes() {
    let f = fixture(true).await;
    for path in [
        "/",
        "/assets/index.js",
        "/api/v1/namespaces",
        "/apis/rlinf.io/v1alpha1/jobs",
        "/rlark/v1/console/session",
        "/rlark/v1/clusters",
        "/metrics",
    ] {
        let mut request = Request::get(path).body(Body::empty()).unwrap();
        // Even an admin's certificate or token reaches nothing else there.
        request.extensions_mut().insert(admin());
        let answer = send(&f.proxy, request).await;
        assert_eq!(
            answer.status,
            StatusCode::NOT_FOUND,
            "{path}: {}",
            answer.text
        );
    }
    let post = send(
        &f.proxy,
        Request::post(TICKETS_ROUTE).body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(post.status, StatusCode::NOT_FOUND);
    let health = send(
        &f.proxy,
        Request::get("/healthz").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(health.status, StatusCode::OK);
}

#[tokio::test]
async fn logout_ends_an_open_stream_of_the_session() {
    let f = fixture(true).await;
    let (cookie, csrf) = f.session_for(admin()).await;
    let response = f
        .main
        .clone()
        .oneshot(get_with_cookie(
            "/apis/rlinf.io/v1alpha1/jobs?watch=true&timeoutSeconds=60",
            &cookie,
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    // The watch stays open (its first events come, then nothing).
    let open = async {
        while let Some(frame) = body.frame().await {
            frame.unwrap();
        }
    };
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(500), open)
            .await
            .is_err(),
        "the watch ended by itself"
    );
    f.logout(&cookie, &csrf).await;
    let started = std::time::Instant::now();
    let ended = async {
        while let Some(frame) = body.frame().await {
            frame.unwrap();
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(3), ended)
        .await
        .expect("the watch ends with the session");
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
}
