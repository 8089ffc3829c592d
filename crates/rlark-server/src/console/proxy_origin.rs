//! The task proxy's own origin (`rlark server --proxy-listen`, docs/ssh.md "The task
//! proxy's origin"): task apps — user code — run in an admin's browser on an origin that is
//! not the console's, so their scripts cannot read the console's CSRF token or act as the
//! admin.
//!
//! - On the console's origin, `POST /rlark/v1/console/proxy-tickets` (a console session with
//!   its CSRF token, a bearer token or a client certificate) checks that the caller may
//!   reach the task (`crate::task_access`) and answers `{url}`: the proxy origin's
//!   `/rlark/v1/proxy-login?ticket=T`, `T` a random one-time ticket valid for
//!   [`TICKET_TTL`], stored as its digest (every replica can redeem it, once).
//! - On the proxy origin, `GET /rlark/v1/proxy-login?ticket=T` redeems it, sets the proxy
//!   cookie [`PROXY_COOKIE`] (HttpOnly, Secure, SameSite=Lax, path `/`; a proxy session in
//!   the store, bound to the console session, token or certificate that asked, so a logout
//!   or revocation ends it) and answers 303 to the task app, so the ticket does not stay in
//!   the address bar. [`proxy_cookie_layer`] turns that cookie into the caller's identity
//!   for the proxy routes — the only routes that origin serves besides the login and
//!   `/healthz` ([`router`]). The console's cookie means nothing there.
//!
//! On the console's origin the proxy routes refuse a request authenticated by the console
//! cookie (`crate::tunnel::task_proxy`); bearer tokens and certificates keep working there.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderValue, StatusCode, header};
use rlark_apiserver::auth::Identity;
use rlark_apiserver::error::ApiError;
use serde::Deserialize;
use serde_json::json;

use super::sessions::{self, PROXY_SESSIONS, PROXY_TICKETS, ProxyGrant, SessionEnd, TICKET_TTL};
use super::{Console, bad_request, forbidden, store_failure, unauthorized};
use crate::security::AuthMethod;
use crate::task_access::{self, AccessError};

/// The proxy origin's session cookie.
pub(crate) const PROXY_COOKIE: &str = "__Host-rlark_proxy";
/// The route that redeems a ticket, on the proxy origin.
pub(crate) const LOGIN_ROUTE: &str = "/rlark/v1/proxy-login";
/// The route that hands out tickets, on the console's origin.
pub(crate) const TICKETS_ROUTE: &str = "/rlark/v1/console/proxy-tickets";
/// Longest life of a proxy session (never beyond the console session that asked).
const PROXY_SESSION_TTL: Duration = sessions::SESSION_TTL;
/// Largest ticket request body.
const MAX_TICKET_BODY: usize = 16 * 1024;
/// Longest app path a ticket carries.
const MAX_PATH: usize = 2048;

/// Request extension of every request that came in on the proxy origin's listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OnProxyOrigin;

/// Where browsers reach the proxy origin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ProxyUrl {
    /// `proxyURL`, or a specific non-loopback listen address: `https://HOST[:PORT]`.
    Fixed(String),
    /// Derived from a loopback or wildcard listener: `localhost` for a console reached as
    /// an IP address, `127.0.0.1` for one reached as `localhost` — two different sites
    /// (cookies are not isolated by port), both in the serving certificate.
    Loopback { port: u16 },
}

impl ProxyUrl {
    /// From the configured `proxyURL`, else from the bound proxy listener's address.
    pub(crate) fn new(configured: Option<&str>, bound: SocketAddr) -> Self {
        if let Some(url) = configured {
            return Self::Fixed(url.trim_end_matches('/').to_string());
        }
        let ip = bound.ip();
        if ip.is_loopback() || ip.is_unspecified() {
            Self::Loopback { port: bound.port() }
        } else {
            Self::Fixed(format!("https://{bound}"))
        }
    }

    /// The base URL for a browser that reached the console at `console_host` (the `Host`
    /// header, port included or not).
    pub(crate) fn for_console(&self, console_host: Option<&str>) -> String {
        match self {
            Self::Fixed(url) => url.clone(),
            Self::Loopback { port } => {
                let host = console_host.map(host_without_port).unwrap_or_default();
                if host.eq_ignore_ascii_case("localhost") {
                    format!("https://127.0.0.1:{port}")
                } else {
                    format!("https://localhost:{port}")
                }
            }
        }
    }
}

/// `host` of `host[:port]` (IPv6 in brackets kept as is).
fn host_without_port(authority: &str) -> &str {
    if authority.starts_with('[') {
        return authority
            .split_once(']')
            .map_or(authority, |(h, _)| &authority[..=h.len()]);
    }
    authority.split(':').next().unwrap_or(authority)
}

/// The proxy origin's routes and the ticket route share this.
#[derive(Clone)]
pub(crate) struct ProxyOrigin {
    pub console: Console,
    /// `None`: the server has no proxy origin.
    pub url: Option<ProxyUrl>,
}

/// The console origin's `POST /rlark/v1/console/proxy-tickets` (merged under the session
/// layer, which checks the CSRF token of cookie requests).
pub(crate) fn tickets_router(state: ProxyOrigin) -> Router {
    Router::new()
        .route(TICKETS_ROUTE, post(create_ticket))
        .with_state(state)
}

/// The proxy origin's whole router: `task_proxy` (the task proxy routes), the login,
/// `/healthz`; everything else 404. Requests are authenticated by the proxy cookie
/// ([`proxy_cookie_layer`]), a bearer token or a client certificate, never by the console's
/// cookie.
pub(crate) fn router(state: ProxyOrigin, task_proxy: Router) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(LOGIN_ROUTE, get(login))
        .with_state(state.clone())
        .merge(task_proxy)
        .fallback(not_here)
        .layer(axum::middleware::from_fn_with_state(
            state,
            proxy_cookie_layer,
        ))
        .layer(axum::Extension(OnProxyOrigin))
}

async fn not_here() -> Response {
    ApiError::new(
        404,
        "NotFound",
        "the task proxy's origin serves only task apps (/rlark/v1/namespaces/NS/tasks/NAME/proxy/PORT/); \
         the console and the API are on the server's main address"
            .to_string(),
    )
    .into_response()
}

/// `POST /rlark/v1/console/proxy-tickets` body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TicketRequest {
    namespace: String,
    task: String,
    #[serde(default)]
    replica: Option<u32>,
    port: u16,
    /// Below the app's root; a leading `/` is dropped.
    #[serde(default)]
    path: Option<String>,
}

/// The app path of a ticket request: below the root, no scheme or host tricks.
fn app_path(path: Option<&str>) -> Result<String, String> {
    let path = path.unwrap_or_default();
    let path = path.strip_prefix('/').unwrap_or(path);
    if path.len() > MAX_PATH {
        return Err(format!("path is longer than {MAX_PATH} bytes"));
    }
    if path.starts_with('/') || path.contains('\\') || path.chars().any(|c| c.is_control()) {
        return Err(format!(
            "path {path:?} must be a path below the app's root (no leading //, no \\, no control characters)"
        ));
    }
    Ok(path.to_string())
}

/// The proxy path of a task's port (`crate::tunnel::task_proxy`'s routes).
fn proxy_path(namespace: &str, task: &str, replica: Option<u32>, port: u16) -> String {
    match replica {
        None => format!("/rlark/v1/namespaces/{namespace}/tasks/{task}/proxy/{port}"),
        Some(i) => {
            format!("/rlark/v1/namespaces/{namespace}/tasks/{task}/replicas/{i}/proxy/{port}")
        }
    }
}

fn access_error(error: AccessError, name: &str) -> Response {
    error.into_api_error(name).into_response()
}

/// What a request was authenticated with, as a grant binds it; `None` for no credential.
fn binding(request: &Request) -> Option<(Option<String>, Option<String>, Option<String>)> {
    match request.extensions().get::<AuthMethod>()? {
        AuthMethod::Session { token_id } => {
            let id = super::session_cookie(request.headers())?;
            Some((Some(sessions::digest(id)), token_id.clone(), None))
        }
        AuthMethod::Bearer { id } | AuthMethod::ProxyCookie { token_id: Some(id) } => {
            Some((None, Some(id.clone()), None))
        }
        AuthMethod::Certificate { serial } => Some((None, None, Some(serial.clone()))),
        AuthMethod::ProxyCookie { token_id: None } => None,
    }
}

async fn create_ticket(State(state): State<ProxyOrigin>, request: Request) -> Response {
    let Some(identity) = request.extensions().get::<Identity>().cloned() else {
        return unauthorized("Unauthorized");
    };
    let Some(url) = &state.url else {
        return ApiError::new(
            503,
            "ServiceUnavailable",
            "this server has no task proxy origin (rlark server --proxy-listen): browsers \
             cannot open task apps; a bearer token or client certificate still reaches \
             /rlark/v1/namespaces/NS/tasks/NAME/proxy/PORT/"
                .to_string(),
        )
        .into_response();
    };
    let Some((session, token_id, cert_serial)) = binding(&request) else {
        return forbidden(
            "a ticket to the task proxy's origin is asked for with a console session, a bearer \
             token or a client certificate",
        );
    };
    if let Some(refused) = super::refuse_non_json(&request, "a ticket request") {
        return refused;
    }
    let console_host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()))
        .map(str::to_string);
    let bytes = match axum::body::to_bytes(request.into_body(), MAX_TICKET_BODY).await {
        Ok(bytes) => bytes,
        Err(_) => return bad_request(format!("body is larger than {MAX_TICKET_BODY} bytes")),
    };
    let body: TicketRequest = match serde_json::from_slice(&bytes) {
        Ok(body) => body,
        Err(e) => return bad_request(format!("invalid ticket request: {e}")),
    };
    if body.port == 0 {
        return bad_request("port must be between 1 and 65535".to_string());
    }
    let path = match app_path(body.path.as_deref()) {
        Ok(path) => path,
        Err(message) => return bad_request(message),
    };
    let store = &*state.console.store;
    let task = match task_access::find_task(store, &body.task, Some(&body.namespace)).await {
        Ok(task) => task,
        Err(error) => return access_error(error, &body.task),
    };
    if let Err(error) = task_access::authorize(store, &identity, &task).await {
        tracing::info!(user = %identity.user, task = %body.task, namespace = %body.namespace, "proxy ticket refused");
        return access_error(error, &body.task);
    }
    if let Some(index) = body.replica {
        let replicas = task_access::replicas_of(&task);
        if u64::from(index) >= replicas {
            return access_error(
                AccessError::NotFound(format!(
                    "task {}/{} has {replicas} replica(s): replica {index} does not exist",
                    body.namespace, body.task
                )),
                &body.task,
            );
        }
    }
    let grant = ProxyGrant {
        user: identity.user.clone(),
        groups: identity.groups.clone(),
        session,
        token_id,
        cert_serial,
        namespace: body.namespace,
        task: body.task,
        replica: body.replica,
        port: body.port,
        path,
        expires_unix: sessions::unix(SystemTime::now() + TICKET_TTL),
    };
    let ticket = match state
        .console
        .sessions
        .create_grant(PROXY_TICKETS, &grant)
        .await
    {
        Ok(ticket) => ticket,
        Err(error) => return store_failure(&error),
    };
    tracing::info!(user = %identity.user, task = %grant.task, namespace = %grant.namespace, port = grant.port, "proxy ticket issued");
    let mut response = axum::Json(json!({
        "url": format!("{}{LOGIN_ROUTE}?ticket={ticket}", url.for_console(console_host.as_deref())),
        "expiresInSeconds": TICKET_TTL.as_secs(),
    }))
    .into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Whether the credential `grant` is bound to still stands; with a console session, when
/// that session expires.
async fn still_bound(
    console: &Console,
    grant: &ProxyGrant,
) -> Result<Option<Option<SystemTime>>, Response> {
    let mut until = None;
    if let Some(digest) = &grant.session {
        match console.sessions.get_by_digest(digest).await {
            Ok(Some(session)) => until = Some(session.expires),
            Ok(None) => return Ok(None),
            Err(error) => return Err(store_failure(&error)),
        }
    }
    if let Some(id) = &grant.token_id
        && console.security.bearer_token_revoked(id).await
    {
        return Ok(None);
    }
    if let Some(serial) = &grant.cert_serial
        && console.security.is_revoked(serial)
    {
        return Ok(None);
    }
    Ok(Some(until))
}

/// A small HTML page (the login is a browser navigation) with `status`.
fn page(status: StatusCode, title: &str, message: &str) -> Response {
    let escape = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
    };
    let html = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{title}</title></head>\
         <body><h1>{title}</h1><p>{message}</p></body></html>",
        title = escape(title),
        message = escape(message),
    );
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; frame-ancestors 'none'",
            ),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        html,
    )
        .into_response()
}

#[derive(Deserialize)]
struct LoginQuery {
    #[serde(default)]
    ticket: Option<String>,
}

#[allow(
    clippy::expect_used,
    reason = "the value is a server-made session id or secret (base64url/hex) or empty"
)]
fn proxy_cookie(value: &str, max_age: u64) -> HeaderValue {
    HeaderValue::from_str(&format!(
        "{PROXY_COOKIE}={value}; Path=/; HttpOnly; Secure; SameSite=Lax; Max-Age={max_age}"
    ))
    .expect("cookie header is ASCII")
}

/// `GET /rlark/v1/proxy-login?ticket=T` on the proxy origin.
async fn login(
    State(state): State<ProxyOrigin>,
    axum::extract::Query(query): axum::extract::Query<LoginQuery>,
) -> Response {
    let refused = |why: &str| {
        page(
            StatusCode::FORBIDDEN,
            "This link to a task app cannot be used",
            &format!(
                "{why} Open the app again from the rlark console: each link works once, for 60 seconds."
            ),
        )
    };
    let Some(ticket) = query.ticket.filter(|t| !t.is_empty()) else {
        return page(
            StatusCode::BAD_REQUEST,
            "No ticket",
            "This address opens a task app with a one-time ticket from the rlark console; it has none.",
        );
    };
    let grant = match state.console.sessions.redeem_ticket(&ticket).await {
        Ok(Some(grant)) => grant,
        Ok(None) => {
            tracing::info!("proxy login refused: unknown, used or expired ticket");
            return refused("The link is unknown, already used or expired.");
        }
        Err(error) => return store_failure(&error),
    };
    let session_until = match still_bound(&state.console, &grant).await {
        Ok(Some(until)) => until,
        Ok(None) => {
            tracing::info!(user = %grant.user, "proxy login refused: the credential that asked has ended");
            return refused("The console session (or token) that asked for it has ended.");
        }
        Err(response) => return response,
    };
    let mut expires = SystemTime::now() + PROXY_SESSION_TTL;
    if let Some(until) = session_until {
        expires = expires.min(until);
    }
    let session = ProxyGrant {
        expires_unix: sessions::unix(expires),
        ..grant.clone()
    };
    let secret = match state
        .console
        .sessions
        .create_grant(PROXY_SESSIONS, &session)
        .await
    {
        Ok(secret) => secret,
        Err(error) => return store_failure(&error),
    };
    tracing::info!(user = %grant.user, task = %grant.task, namespace = %grant.namespace, "proxy login");
    let max_age = expires
        .duration_since(SystemTime::now())
        .unwrap_or_default()
        .as_secs();
    let location = format!(
        "{}/{}",
        proxy_path(&grant.namespace, &grant.task, grant.replica, grant.port),
        grant.path
    );
    let mut response = (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, location),
            (header::CACHE_CONTROL, "no-store".to_string()),
            (header::REFERRER_POLICY, "no-referrer".to_string()),
        ],
    )
        .into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, proxy_cookie(&secret, max_age));
    response
}

/// Middleware of the proxy origin: a request without a certificate or bearer token but
/// with a live proxy cookie runs as the proxy session's user (`AuthMethod::ProxyCookie`).
/// Its streams (WebSockets included) end within about a second of the end of the console
/// session the proxy session is bound to, of the revocation of its token or certificate,
/// or of the proxy session's expiry. A stale cookie leaves the request anonymous.
pub(crate) async fn proxy_cookie_layer(
    State(state): State<ProxyOrigin>,
    mut request: Request,
    next: Next,
) -> Response {
    if request.extensions().get::<Identity>().is_some() {
        return next.run(request).await;
    }
    let Some(secret) = super::cookie_value(request.headers(), PROXY_COOKIE).map(str::to_string)
    else {
        return next.run(request).await;
    };
    let grant = match state.console.sessions.proxy_session(&secret).await {
        Ok(Some(grant)) => grant,
        Ok(None) => return next.run(request).await,
        Err(error) => return store_failure(&error),
    };
    match still_bound(&state.console, &grant).await {
        Ok(Some(_)) => {}
        Ok(None) => return next.run(request).await,
        Err(response) => return response,
    }
    request.extensions_mut().insert(grant.identity());
    request.extensions_mut().insert(AuthMethod::ProxyCookie {
        token_id: grant.token_id.clone(),
    });
    // Its streams end with the console session, the token or certificate, or the proxy
    // session itself.
    let still = {
        let console = state.console.clone();
        let grant = grant.clone();
        let secret = secret.clone();
        std::sync::Arc::new(move || {
            let console = console.clone();
            let grant = grant.clone();
            let secret = secret.clone();
            Box::pin(async move {
                let live = !matches!(console.sessions.proxy_session(&secret).await, Ok(None));
                live && !matches!(still_bound(&console, &grant).await, Ok(None))
            }) as std::pin::Pin<Box<dyn Future<Output = bool> + Send>>
        })
    };
    let end = SessionEnd::with_check(
        std::sync::Arc::clone(&state.console.sessions),
        grant.session.clone(),
        still,
    );
    request.extensions_mut().insert(end.clone());
    let response = next.run(request).await;
    sessions::end_with(response, end)
}

#[cfg(test)]
mod tests;
