//! HTTP layer: the routes the process adds around the API router, and serving one TLS
//! connection with hyper (HTTP/1.1 and HTTP/2, upgrades allowed).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::{Request, StatusCode, header};
use hyper::body::Incoming;
use prometheus_client::registry::Registry;
use rlark_apiserver::auth::Identity;
use tower::ServiceExt as _;

use crate::auth::{self, PeerCredentials};
use crate::security::Security;

/// Shared state of the process routes.
#[derive(Clone)]
pub(crate) struct ProcessState {
    /// True once the store is open and the API is being served; false again on shutdown.
    pub ready: Arc<AtomicBool>,
    /// `/readyz` is also false while the store cannot reach its database (PostgreSQL down).
    pub store: crate::ServerStore,
    /// Complete once serving starts (all metrics registered); read-only afterwards.
    pub metrics: Arc<Registry>,
}

/// `/healthz`, `/livez`, `/readyz` (anonymous) and `/metrics` (admin, viewer, peer), merged with
/// the API router. Routes merged into the result later are not covered by its panic
/// handler: the process wraps the whole router once more with [`catch_panics`].
pub(crate) fn router(state: ProcessState, api: Router) -> Router {
    let process = Router::new()
        .route("/healthz", get(ok))
        .route("/livez", get(ok))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state);
    catch_panics(process.merge(api))
}

/// `router` with every handler panic caught: the request is answered with a Kubernetes
/// `Status` 500 (`InternalError`) and the panic is logged, while the process, the
/// connection (and its other HTTP/2 streams) carry on. A panic is a bug; this keeps one bad
/// request from taking others down with it. A panic inside a streamed body after the
/// headers went out (a watch) can only end that stream.
pub(crate) fn catch_panics(router: Router) -> Router {
    router.layer(tower_http::catch_panic::CatchPanicLayer::custom(
        panic_response,
    ))
}

/// The answer to a request whose handler panicked.
fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let detail = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic payload".to_string());
    tracing::error!(panic = %detail, "a request handler panicked; answered 500");
    // The panic text stays in the log: it may describe server internals.
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "Internal error occurred: the server failed while handling the request",
        "reason": "InternalError", "code": 500,
    });
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn ok() -> &'static str {
    "ok"
}

async fn readyz(State(state): State<ProcessState>) -> Response {
    if !state.ready.load(Ordering::Acquire) {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready").into_response()
    } else if !state.store.is_available() {
        (StatusCode::SERVICE_UNAVAILABLE, "store unavailable").into_response()
    } else {
        "ok".into_response()
    }
}

async fn metrics(
    State(state): State<ProcessState>,
    identity: Option<axum::Extension<Identity>>,
) -> Response {
    let Some(axum::Extension(identity)) = identity else {
        return unauthorized();
    };
    // Scrapers run as admin, viewer or peer; agents and task tokens have no business here.
    use rlark_apiserver::auth::Role;
    if !matches!(
        identity.role(),
        Role::Admin | Role::Viewer | Role::Peer { .. }
    ) {
        let body = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("forbidden: User \"{}\" cannot get path \"/metrics\"", identity.user),
            "reason": "Forbidden", "code": 403,
        });
        return (
            StatusCode::FORBIDDEN,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response();
    }
    rlark_observe::metrics_endpoint::exposition(&state.metrics).into_response()
}

/// A Kubernetes `Status` 401 whose message says why the credentials were refused.
pub(crate) fn unauthorized_because(why: &str) -> Response {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("Unauthorized: {why}"), "reason": "Unauthorized", "code": 401,
    });
    (
        StatusCode::UNAUTHORIZED,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// A Kubernetes `Status` 401, as kube-apiserver answers anonymous requests.
pub(crate) fn unauthorized() -> Response {
    let body = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}"#;
    (
        StatusCode::UNAUTHORIZED,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// `Strict-Transport-Security` on every answer: browsers that reached this origin once over
/// HTTPS never try it over plain HTTP for a year. No `includeSubDomains`: other hosts under
/// the server's domain are not rlark's to decide.
pub(crate) const HSTS: &str = "max-age=31536000";

/// Whether an answer to a request for `host` (the `Host` header or the URI's authority)
/// gets [`HSTS`]: not for `localhost` and `*.localhost` (the task proxy origin of
/// `rlark up`): HSTS holds for a host whatever its port, so it would force HTTPS on every
/// other development server of that browser on `localhost`. (Browsers ignore it for IP
/// addresses anyway, RFC 6797 §8.1.)
pub(crate) fn hsts_applies(host: Option<&str>) -> bool {
    let Some(host) = host else {
        return true;
    };
    let name = match host.rsplit_once(':') {
        // `[v6]:port`, `name:port`; a bare IPv6 literal has several colons.
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !name.ends_with(':') => {
            name
        }
        _ => host,
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    !(name == "localhost" || name.ends_with(".localhost"))
}

/// Set the headers every HTTPS answer of every listener carries (API, console, task proxy
/// origin — [`secure_responses`]): `X-Content-Type-Options: nosniff`, so a browser never
/// runs a body as a type it was not declared as (a task app's upload, a log as HTML), and
/// [`HSTS`] when `hsts` ([`hsts_applies`]). An answer from a proxied task app gets them
/// too (its own values are replaced, or removed on `localhost`).
pub(crate) fn set_security_headers(headers: &mut http::HeaderMap, hsts: bool) {
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        http::HeaderValue::from_static("nosniff"),
    );
    if hsts {
        headers.insert(
            header::STRICT_TRANSPORT_SECURITY,
            http::HeaderValue::from_static(HSTS),
        );
    } else {
        headers.remove(header::STRICT_TRANSPORT_SECURITY);
    }
}

/// The one layer that puts [`set_security_headers`] on every response of a connection's
/// service — the outermost one, so the connection limits' own answers (503 on a reserve
/// connection) and authentication failures carry them too.
pub(crate) fn secure_responses<S>(
    inner: S,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send + 'static,
> + Clone
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    hyper::service::service_fn(move |request: Request<Incoming>| {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| request.uri().authority().map(|a| a.as_str()));
        let hsts = hsts_applies(host);
        let call = inner.call(request);
        async move {
            let mut response = call.await?;
            set_security_headers(response.headers_mut(), hsts);
            Ok(response)
        }
    })
}

/// The hyper service of one connection: authenticates each request, then hands it to the
/// router. Presented-but-invalid credentials get a 401 `Status` naming the problem.
pub(crate) fn connection_service(
    router: Router,
    peer: Arc<PeerCredentials>,
    security: Arc<Security>,
    tunnel: crate::tunnel::exec::ExecState,
    remote: SocketAddr,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send + 'static,
> + Clone {
    hyper::service::service_fn(move |mut request: Request<Incoming>| {
        let router = router.clone();
        let peer = Arc::clone(&peer);
        let security = Arc::clone(&security);
        let tunnel = tunnel.clone();
        let span = tracing::debug_span!(
            "request",
            method = %request.method(),
            path = %request.uri().path(),
            user = tracing::field::Empty,
        );
        let started = Instant::now();
        // Recorded into this request's span itself: when it is disabled (debug off),
        // `Span::current()` would be the connection's span, and every request of the
        // connection would append one more `user=` to it.
        let request_span = span.clone();
        let fut = async move {
            match auth::authenticate(&peer, request.headers(), &security).await {
                Ok(Some((identity, method))) => {
                    request_span.record("user", identity.user.as_str());
                    request.extensions_mut().insert(identity);
                    request.extensions_mut().insert(method);
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::debug!(reason = %error.message, "authentication failed");
                    return Ok(unauthorized_because(&error.message));
                }
            }
            request.extensions_mut().insert(ConnectInfo(remote));
            // CONNECT carries an authority, not a path: it never reaches the router.
            if request.method() == http::Method::CONNECT {
                return Ok(crate::tunnel::connect::handle(tunnel, request).await);
            }
            let response = router.oneshot(request).await;
            if let Ok(response) = &response {
                tracing::debug!(
                    status = response.status().as_u16(),
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "request done"
                );
            }
            response
        };
        tracing::Instrument::instrument(fut, span)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    fn request(path: &str) -> Request<Body> {
        Request::builder().uri(path).body(Body::empty()).unwrap()
    }

    async fn answer(router: &Router, path: &str) -> (StatusCode, serde_json::Value) {
        let response = router
            .clone()
            .oneshot(request(path))
            .await
            .expect("infallible");
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or_default())
    }

    #[test]
    fn hsts_is_not_sent_to_localhost_names() {
        for host in [
            "rlark.example.com",
            "rlark.example.com:8443",
            "127.0.0.1:8443",
            "[::1]:8443",
            "localhost.example.com",
        ] {
            assert!(hsts_applies(Some(host)), "{host}");
        }
        assert!(hsts_applies(None));
        for host in [
            "localhost",
            "localhost:9444",
            "LOCALHOST.",
            "apps.localhost:1",
        ] {
            assert!(!hsts_applies(Some(host)), "{host}");
        }
        let mut headers = http::HeaderMap::new();
        headers.insert(
            header::STRICT_TRANSPORT_SECURITY,
            http::HeaderValue::from_static("max-age=0"),
        );
        set_security_headers(&mut headers, true);
        assert_eq!(headers[header::STRICT_TRANSPORT_SECURITY], HSTS);
        assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        set_security_headers(&mut headers, false);
        assert!(headers.get(header::STRICT_TRANSPORT_SECURITY).is_none());
    }

    async fn panics_with_str() -> &'static str {
        panic!("secret internals")
    }

    async fn panics_with_string() -> &'static str {
        panic!("{}", String::from("formatted secret"))
    }

    /// A handler panic (a `&str` or a formatted `String` payload) becomes a Kubernetes
    /// `Status` 500 without the panic text, and the same router keeps serving.
    #[tokio::test]
    async fn handler_panics_are_answered_500_and_serving_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let store = rlark_store::SqliteStore::open(rlark_store::SqliteStoreConfig::new(
            dir.path().join("rlark.db"),
        ))
        .await
        .unwrap();
        let router = router(
            ProcessState {
                ready: Arc::new(AtomicBool::new(true)),
                store: crate::ServerStore::Sqlite(store),
                metrics: Arc::new(Registry::default()),
            },
            Router::new()
                .route("/panic", get(panics_with_str))
                .route("/panic-string", get(panics_with_string)),
        );
        for path in ["/panic", "/panic-string"] {
            let (status, body) = answer(&router, path).await;
            assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{path}");
            assert_eq!(body["kind"], "Status");
            assert_eq!(body["reason"], "InternalError");
            assert_eq!(body["code"], 500);
            assert!(!body.to_string().contains("secret"), "{body}");
        }
        let response = router.clone().oneshot(request("/healthz")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);

        // What the process merges in later is covered by the outer `catch_panics`.
        let outer = catch_panics(router.merge(Router::new().route("/late", get(panics_with_str))));
        assert_eq!(
            answer(&outer, "/late").await.0,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
