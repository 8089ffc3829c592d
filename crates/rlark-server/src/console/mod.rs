//! The web console: its embedded single-page app (`web/`, served at `/`), browser sessions
//! and the `/rlark/v1/` routes only the console needs (docs/console.md, docs/api.md).
//!
//! A browser logs in with a bearer token or a one-time login link and gets a session cookie
//! (`__Host-rlark_session`: HttpOnly, Secure, SameSite=Strict, path `/`). [`session_layer`]
//! turns that cookie into the same [`Identity`] request extension a certificate or bearer
//! token becomes in `crate::auth`, so every console call goes through the API's own
//! authorization. Requests authenticated by the cookie that change state must carry the
//! session's CSRF token in [`CSRF_HEADER`] and, when they send `Origin`, this server's own.

mod assets;
mod clusters;
pub(crate) mod proxy_origin;
pub(crate) mod sessions;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use rlark_apiserver::auth::{Identity, Role};
use rlark_apiserver::error::ApiError;
use rlark_store::Store;
use serde::Deserialize;
use serde_json::json;

use crate::security::{AuthMethod, Security};
use sessions::Sessions;

/// The session cookie. `__Host-` makes browsers insist on Secure, path `/` and no Domain.
pub(crate) const SESSION_COOKIE: &str = "__Host-rlark_session";
/// The header that carries the session's CSRF token on state-changing requests.
pub(crate) const CSRF_HEADER: &str = "x-rlark-csrf";
/// Largest login request body.
const MAX_LOGIN_BODY: usize = 16 * 1024;

/// Shared by the console routes and [`session_layer`].
#[derive(Clone)]
pub(crate) struct Console {
    pub sessions: Arc<Sessions>,
    pub security: Arc<Security>,
    pub store: Arc<dyn Store>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console").finish_non_exhaustive()
    }
}

impl Console {
    pub(crate) fn new(security: Arc<Security>, store: Arc<dyn Store>) -> Self {
        Self {
            sessions: Arc::new(Sessions::new(Arc::clone(&store))),
            security,
            store,
        }
    }
}

/// The console's routes: the app at `/` and `/assets/...`, and under `/rlark/v1/`:
/// `console/login`, `console/session`, `console/logout`, `console/links`, `clusters`.
pub(crate) fn router(console: Console) -> Router {
    Router::new()
        .route("/", get(assets::index))
        .route("/assets/{*path}", get(assets::asset))
        .route("/favicon.svg", get(assets::favicon))
        .route("/rlark/v1/console/login", post(login))
        .route("/rlark/v1/console/session", get(session))
        .route("/rlark/v1/console/logout", post(logout))
        .route("/rlark/v1/console/links", post(create_link))
        .route("/rlark/v1/clusters", get(clusters::summary))
        .with_state(console)
}

/// The value of cookie `name`, if the request sends it.
pub(crate) fn cookie_value<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, value)| value)
}

/// The session cookie's value, if the request sends one.
fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    cookie_value(headers, SESSION_COOKIE)
}

fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Middleware over the whole process router: a request that carries no other credential
/// but a live session cookie runs as the session's identity (`AuthMethod::Session`). A
/// stale or unknown cookie leaves the request anonymous (routes answer 401). A cookie
/// request that changes state without the session's CSRF token, or from another origin, is
/// refused with 403 before any route sees it.
pub(crate) async fn session_layer(
    State(console): State<Console>,
    mut request: Request,
    next: Next,
) -> Response {
    if request.extensions().get::<Identity>().is_some() {
        return next.run(request).await;
    }
    let Some(id) = session_cookie(request.headers()).map(str::to_string) else {
        return next.run(request).await;
    };
    let session = match console.sessions.get(&id).await {
        Ok(Some(session)) => session,
        Ok(None) => return next.run(request).await,
        Err(error) => return store_failure(&error),
    };
    if let Some(token_id) = &session.token_id
        && console.security.bearer_token_revoked(token_id).await
    {
        if let Err(error) = console.sessions.remove_token_sessions(token_id).await {
            tracing::warn!(%error, token = %token_id, "could not delete the sessions of a revoked token");
        }
        tracing::info!(user = %session.identity.user, token = %token_id, "console session ended: its token was revoked");
        return next.run(request).await;
    }
    if let Some(why) = cross_site(&request) {
        tracing::info!(user = %session.identity.user, reason = why, "console request refused");
        return forbidden(why);
    }
    if !is_safe(request.method()) {
        let sent = request
            .headers()
            .get(CSRF_HEADER)
            .and_then(|v| v.to_str().ok());
        match sent {
            Some(sent) if sessions::same_secret(sent, &session.csrf) => {}
            Some(_) => return forbidden("the CSRF token does not match this session"),
            None => {
                return forbidden(
                    "a request authenticated by the console session cookie must send its CSRF token in X-Rlark-CSRF",
                );
            }
        }
    }
    request.extensions_mut().insert(session.identity.clone());
    request.extensions_mut().insert(AuthMethod::Session {
        token_id: session.token_id.clone(),
    });
    // Streams opened with the session (watches, logs, events, WebSockets) end with it.
    let end = sessions::SessionEnd::new(Arc::clone(&console.sessions), sessions::digest(&id));
    request.extensions_mut().insert(end.clone());
    let response = next.run(request).await;
    sessions::end_with(response, end)
}

/// Why a cookie request is cross-site: its `Origin` (sent by browsers on every POST and
/// WebSocket handshake) is not this server (`https://` + `Host`, or the HTTP/2 authority).
fn cross_site(request: &Request) -> Option<&'static str> {
    let origin = request.headers().get(header::ORIGIN)?;
    let Ok(origin) = origin.to_str() else {
        return Some("the request's Origin is not this server");
    };
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()))
        .unwrap_or_default();
    if origin == "null" || host.is_empty() || origin != format!("https://{host}") {
        return Some("the request's Origin is not this server");
    }
    None
}

fn forbidden(message: &str) -> Response {
    ApiError::new(403, "Forbidden", message.to_string()).into_response()
}

/// A failure of the session store: 500, logged.
fn store_failure(error: &rlark_store::StoreError) -> Response {
    tracing::error!(%error, "console session store failed");
    ApiError::new(
        500,
        "InternalError",
        format!("console sessions: store: {error}"),
    )
    .into_response()
}

fn unauthorized(message: &str) -> Response {
    ApiError::new(401, "Unauthorized", message.to_string()).into_response()
}

fn bad_request(message: String) -> Response {
    ApiError::new(400, "BadRequest", message).into_response()
}

/// `POST /rlark/v1/console/login` body: exactly one of the two.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginRequest {
    /// A bearer token (`rlark token create --user NAME`).
    #[serde(default)]
    token: Option<String>,
    /// A one-time login link's code.
    #[serde(default)]
    code: Option<String>,
}

/// Whether `identity` may write through the console: only admins may change anything the
/// console offers (the viewer role is read-only, see `rlark_apiserver::authz`).
fn can_write(identity: &Identity) -> bool {
    identity.role() == Role::Admin
}

fn role_name(identity: &Identity) -> &'static str {
    match identity.role() {
        Role::Admin => "admin",
        Role::Viewer => "viewer",
        _ => "other",
    }
}

#[allow(
    clippy::expect_used,
    reason = "the value is a server-made session id or secret (base64url/hex) or empty"
)]
fn cookie(value: &str, max_age: u64) -> HeaderValue {
    HeaderValue::from_str(&format!(
        "{SESSION_COOKIE}={value}; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age={max_age}"
    ))
    .expect("cookie header is ASCII")
}

/// How a cookie session was created: with a bearer token (`"token"`, its id in
/// `token_id`) or a one-time link (`"link"`). The console uses it to say why registering an
/// SSH key needs a token session (a key lives as long as the credential it was registered
/// with, and a link is none).
fn login_with(token_id: Option<&String>) -> &'static str {
    if token_id.is_some() { "token" } else { "link" }
}

fn session_json(
    identity: &Identity,
    csrf: Option<&str>,
    expires: Option<std::time::SystemTime>,
    login: Option<&'static str>,
) -> serde_json::Value {
    json!({
        "loginWith": login,
        "user": identity.user,
        "groups": identity.groups,
        "role": role_name(identity),
        "canWrite": can_write(identity),
        "csrfToken": csrf,
        "expiresAt": expires.map(|t| chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
    })
}

/// `None` when `request` declares a JSON body, else the 415 answer for `what` ("login", "a
/// ticket request"). Requiring the type keeps cross-site form posts (which cannot send it
/// without a preflight) out.
pub(crate) fn refuse_non_json(request: &Request, what: &str) -> Option<Response> {
    let json_body = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    (!json_body).then(|| {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("{what} takes a JSON body (Content-Type: application/json)"),
        )
        .into_response()
    })
}

async fn login(State(console): State<Console>, request: Request) -> Response {
    if let Some(refused) = refuse_non_json(&request, "login") {
        return refused;
    }
    let bytes = match axum::body::to_bytes(request.into_body(), MAX_LOGIN_BODY).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return bad_request(format!("login body is larger than {MAX_LOGIN_BODY} bytes"));
        }
    };
    let body: LoginRequest = match serde_json::from_slice(&bytes) {
        Ok(body) => body,
        Err(e) => return bad_request(format!("invalid login body: {e}")),
    };
    let (identity, token_id) = match (body.token, body.code) {
        (Some(token), None) => match console.security.authenticate_bearer(&token).await {
            Ok((identity, id)) => (identity, Some(id)),
            Err(error) => {
                tracing::info!(reason = %error.message, "console login refused");
                return unauthorized(&format!("login refused: {}", error.message));
            }
        },
        (None, Some(code)) => match console.sessions.redeem_link(code.trim()).await {
            Err(error) => return store_failure(&error),
            Ok(Some(identity)) => (identity, None),
            Ok(None) => {
                tracing::info!("console login refused: unknown, used or expired link");
                return unauthorized(
                    "login refused: this login link is unknown, used or expired; make a new \
                     one with `rlark token login-link` (as an admin)",
                );
            }
        },
        _ => return bad_request("login needs exactly one of `token` or `code`".to_string()),
    };
    if !matches!(identity.role(), Role::Admin | Role::Viewer) {
        return forbidden(&format!(
            "user {:?} is neither an admin nor a viewer: the console is for people, not agents or tasks",
            identity.user
        ));
    }
    let (id, session) = match console.sessions.create(identity.clone(), token_id).await {
        Ok(created) => created,
        Err(error) => return store_failure(&error),
    };
    tracing::info!(user = %identity.user, role = role_name(&identity), "console login");
    let mut response = axum::Json(session_json(
        &identity,
        Some(&session.csrf),
        Some(session.expires),
        Some(login_with(session.token_id.as_ref())),
    ))
    .into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        cookie(&id, sessions::SESSION_TTL.as_secs()),
    );
    response
}

/// `GET /rlark/v1/console/session`: who the caller is, what they may do, and (for a
/// cookie session) the CSRF token.
async fn session(State(console): State<Console>, request: Request) -> Response {
    let Some(identity) = request.extensions().get::<Identity>() else {
        return unauthorized("not logged in");
    };
    let cookie = session_cookie(request.headers()).filter(|_| {
        matches!(
            request.extensions().get::<AuthMethod>(),
            Some(AuthMethod::Session { .. })
        )
    });
    let session = match cookie {
        Some(id) => match console.sessions.get(id).await {
            Ok(session) => session,
            Err(error) => return store_failure(&error),
        },
        None => None,
    };
    axum::Json(session_json(
        identity,
        session.as_ref().map(|s| s.csrf.as_str()),
        session.as_ref().map(|s| s.expires),
        session.as_ref().map(|s| login_with(s.token_id.as_ref())),
    ))
    .into_response()
}

/// `POST /rlark/v1/console/logout`: ends the cookie's session (at once, on every replica)
/// and clears the cookie.
async fn logout(State(console): State<Console>, request: Request) -> Response {
    let Some(id) = session_cookie(request.headers()) else {
        return unauthorized("no console session to log out of");
    };
    if !matches!(
        request.extensions().get::<AuthMethod>(),
        Some(AuthMethod::Session { .. })
    ) {
        return unauthorized("no live console session to log out of");
    }
    let user = request
        .extensions()
        .get::<Identity>()
        .map(|i| i.user.clone());
    if let Err(error) = console.sessions.remove(id).await {
        return store_failure(&error);
    }
    tracing::info!(user = ?user, "console logout");
    let mut response = (StatusCode::OK, axum::Json(json!({"loggedOut": true}))).into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, cookie("", 0));
    response
}

/// `POST /rlark/v1/console/links` (admins): a one-time login link for the caller's own
/// identity. Answers `{"code", "path", "expiresInSeconds"}`; the link is `https://SERVER` +
/// `path`, its code in the URL fragment, which browsers never send to the server.
async fn create_link(State(console): State<Console>, request: Request) -> Response {
    let Some(identity) = request.extensions().get::<Identity>() else {
        return unauthorized("Unauthorized");
    };
    if identity.role() != Role::Admin {
        return forbidden(&format!(
            "User {:?} cannot create console login links (admins only)",
            identity.user
        ));
    }
    let code = match console.sessions.create_link(identity.clone()).await {
        Ok(code) => code,
        Err(error) => return store_failure(&error),
    };
    tracing::info!(user = %identity.user, "console login link created");
    axum::Json(json!({
        "code": code,
        "path": login_path(&code),
        "expiresInSeconds": sessions::LINK_TTL.as_secs(),
    }))
    .into_response()
}

/// The path (and fragment) of a login link with `code`.
pub(crate) fn login_path(code: &str) -> String {
    format!("/#login={code}")
}

#[cfg(test)]
mod tests;
