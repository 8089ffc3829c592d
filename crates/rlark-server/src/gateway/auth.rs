//! How RLark's console authenticates against rlark: `POST /api/v1/auth/login` and the
//! gateway's session cookie.
//!
//! RLark's console sends `{"username", "password"}` and then plain same-origin `fetch()`
//! calls with no header of its own. rlark maps that onto its own credentials: the password
//! is an rlark bearer token (`rlark token create --user NAME`) of an admin or viewer, the
//! user name must be the token's user, and a successful login starts an rlark console
//! session (the same store, lifetime and revocation as the rlark console's) whose id is sent
//! back in the cookie [`GATEWAY_COOKIE`] (HttpOnly, Secure, SameSite=Strict, path
//! `/api/v1/`). [`layer`] turns that cookie into the session's [`Identity`] on the gateway's
//! routes only. Requests that carry a client certificate or `Authorization: Bearer` are
//! authenticated by that, as everywhere in rlark.
//!
//! RLark's console sends no CSRF header, so a cookie request that changes state (any method
//! but GET/HEAD/OPTIONS, and WebSocket handshakes) must prove it comes from a page of this
//! origin: `Sec-Fetch-Site: same-origin`, or, from a browser that does not send that, an
//! `Origin` whose host is the request's `Host`. Anything else is a 403.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, Method, header};
use rlark_apiserver::auth::{Identity, Role};
use serde::Deserialize;
use serde_json::json;

use super::error::GatewayError;
use super::forward::StaleSession;
use crate::console::sessions::{self, Sessions};
use crate::console::{SESSION_COOKIE, cookie_value, refuse_non_json};
use crate::security::{AuthMethod, Security};

/// The gateway's session cookie. `__Secure-` makes browsers insist on Secure; the path
/// keeps it off every route but `/api/v1/...`.
pub(crate) const GATEWAY_COOKIE: &str = "__Secure-rlark_gateway";
/// The cookie's path.
const COOKIE_PATH: &str = "/api/v1/";
/// Largest login body.
const MAX_LOGIN_BODY: usize = 16 * 1024;

/// What the login route and [`layer`] share.
#[derive(Clone)]
pub(crate) struct GatewayAuth {
    pub sessions: Arc<Sessions>,
    pub security: Arc<Security>,
}

impl std::fmt::Debug for GatewayAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayAuth").finish_non_exhaustive()
    }
}

/// `Err(why)` unless a cookie request comes from a page of this origin (module docs).
fn same_origin(headers: &HeaderMap) -> Result<(), String> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = text("sec-fetch-site") {
        return if site == "same-origin" {
            Ok(())
        } else {
            Err(format!(
                "the request comes from another site (Sec-Fetch-Site: {site}); the RLark \
                 console session only works from pages of this origin"
            ))
        };
    }
    let host = text(header::HOST.as_str()).unwrap_or_default();
    match text(header::ORIGIN.as_str()) {
        Some(origin)
            if !host.is_empty() && origin.split_once("://").map(|(_, a)| a) == Some(host) =>
        {
            Ok(())
        }
        Some(origin) => Err(format!(
            "the request's Origin {origin:?} is not this server ({host:?})"
        )),
        None => Err(
            "a request that changes state with the RLark console session cookie must \
                     come from a page of this origin (it sends neither Sec-Fetch-Site nor \
                     Origin); scripts should send Authorization: Bearer TOKEN instead"
                .to_string(),
        ),
    }
}

fn changes_state(request: &Request) -> bool {
    !matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    ) || request.headers().contains_key(header::UPGRADE)
}

/// The request's `Cookie` headers without `name`.
fn drop_cookie(headers: &mut HeaderMap, name: &str) {
    if cookie_value(headers, name).is_none() {
        return;
    }
    let kept: Vec<String> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|pair| pair.split_once('=').is_none_or(|(n, _)| n != name))
        .map(str::to_string)
        .collect();
    headers.remove(header::COOKIE);
    if !kept.is_empty()
        && let Ok(value) = HeaderValue::from_str(&kept.join("; "))
    {
        headers.insert(header::COOKIE, value);
    }
}

/// Middleware over the whole process router, for the gateway's paths only: the rlark
/// console's own cookie is ignored there (it needs a CSRF header RLark's console does not
/// send), and a request with no certificate or bearer token but a live gateway cookie runs
/// as its session's identity.
pub(crate) async fn layer(
    State(auth): State<GatewayAuth>,
    mut request: Request,
    next: Next,
) -> Response {
    if !super::is_gateway_path(request.uri().path()) {
        return next.run(request).await;
    }
    drop_cookie(request.headers_mut(), SESSION_COOKIE);
    if request.extensions().get::<Identity>().is_some() {
        return next.run(request).await;
    }
    let Some(id) = cookie_value(request.headers(), GATEWAY_COOKIE).map(str::to_string) else {
        return next.run(request).await;
    };
    let session = match auth.sessions.get(&id).await {
        Ok(Some(session)) => session,
        Ok(None) => {
            request.extensions_mut().insert(StaleSession);
            return next.run(request).await;
        }
        Err(error) => {
            return GatewayError::Internal(format!("console sessions: store: {error}"))
                .into_response();
        }
    };
    if let Some(token_id) = &session.token_id
        && auth.security.bearer_token_revoked(token_id).await
    {
        if let Err(error) = auth.sessions.remove_token_sessions(token_id).await {
            tracing::warn!(%error, token = %token_id, "could not delete the sessions of a revoked token");
        }
        request.extensions_mut().insert(StaleSession);
        return next.run(request).await;
    }
    if changes_state(&request)
        && let Err(why) = same_origin(request.headers())
    {
        tracing::info!(user = %session.identity.user, reason = %why, "gateway request refused");
        return GatewayError::Forbidden(why).into_response();
    }
    request.extensions_mut().insert(session.identity.clone());
    request.extensions_mut().insert(AuthMethod::Session {
        token_id: session.token_id.clone(),
    });
    let end = sessions::SessionEnd::new(Arc::clone(&auth.sessions), sessions::digest(&id));
    request.extensions_mut().insert(end.clone());
    let response = next.run(request).await;
    sessions::end_with(response, end)
}

/// `POST /api/v1/auth/login` body (RLark's).
#[derive(Deserialize)]
struct LoginBody {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
}

fn role_name(identity: &Identity) -> &'static str {
    match identity.role() {
        Role::Admin => "admin",
        _ => "viewer",
    }
}

#[allow(
    clippy::expect_used,
    reason = "the value is a server-made session id (base64url) or empty"
)]
fn cookie(value: &str, max_age: u64) -> HeaderValue {
    HeaderValue::from_str(&format!(
        "{GATEWAY_COOKIE}={value}; Path={COOKIE_PATH}; HttpOnly; Secure; SameSite=Strict; Max-Age={max_age}"
    ))
    .expect("cookie header is ASCII")
}

/// `POST /api/v1/auth/login`: `{"username", "password"}` → `{"ok": true, "role", "user",
/// "expiresAt"}` and the session cookie.
pub(crate) async fn login(
    State(auth): State<GatewayAuth>,
    request: Request,
) -> Result<Response, GatewayError> {
    if refuse_non_json(&request, "login").is_some() {
        return Err(GatewayError::UnsupportedMediaType(
            "login takes a JSON body (Content-Type: application/json)".to_string(),
        ));
    }
    let bytes = axum::body::to_bytes(request.into_body(), MAX_LOGIN_BODY)
        .await
        .map_err(|_| {
            GatewayError::BadRequest(format!("login body is larger than {MAX_LOGIN_BODY} bytes"))
        })?;
    let body: LoginBody = serde_json::from_slice(&bytes)
        .map_err(|e| GatewayError::BadRequest(format!("invalid login body: {e}")))?;
    let username = body.username.trim();
    if username.is_empty() || body.password.trim().is_empty() {
        return Err(GatewayError::BadRequest(
            "username and password are required".to_string(),
        ));
    }
    let (identity, token_id) = match auth.security.authenticate_bearer(&body.password).await {
        Ok(found) => found,
        Err(error) => {
            tracing::info!(user = username, reason = %error.message, "gateway login refused");
            return Err(GatewayError::Unauthenticated(format!(
                "login refused: the password must be an rlark bearer token of user \
                 {username:?} (`rlark token create --user {username}`): {}",
                error.message
            )));
        }
    };
    if identity.user != username {
        tracing::info!(user = username, token_user = %identity.user, "gateway login refused: user mismatch");
        return Err(GatewayError::Unauthenticated(format!(
            "login refused: this token belongs to user {:?}, not {username:?}",
            identity.user
        )));
    }
    if !matches!(identity.role(), Role::Admin | Role::Viewer) {
        return Err(GatewayError::Forbidden(format!(
            "user {:?} is neither an admin nor a viewer: the console is for people, not agents or tasks",
            identity.user
        )));
    }
    let (id, session) = auth
        .sessions
        .create(identity.clone(), Some(token_id))
        .await
        .map_err(|e| GatewayError::Internal(format!("console sessions: store: {e}")))?;
    tracing::info!(user = %identity.user, role = role_name(&identity), "gateway login");
    let expires = chrono::DateTime::<chrono::Utc>::from(session.expires)
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let mut response = axum::Json(json!({
        "ok": true,
        "role": role_name(&identity),
        "user": identity.user,
        "expiresAt": expires,
    }))
    .into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        cookie(&id, sessions::SESSION_TTL.as_secs()),
    );
    Ok(response)
}

/// `POST /api/v1/auth/logout` (rlark's addition; RLark's console only forgets its login):
/// ends the cookie's session and clears the cookie.
pub(crate) async fn logout(
    State(auth): State<GatewayAuth>,
    request: Request,
) -> Result<Response, GatewayError> {
    let live = matches!(
        request.extensions().get::<AuthMethod>(),
        Some(AuthMethod::Session { .. })
    );
    let id = cookie_value(request.headers(), GATEWAY_COOKIE).filter(|_| live);
    let Some(id) = id else {
        return Err(GatewayError::Unauthenticated(
            "no live RLark console session to log out of".to_string(),
        ));
    };
    auth.sessions
        .remove(id)
        .await
        .map_err(|e| GatewayError::Internal(format!("console sessions: store: {e}")))?;
    let mut response = axum::Json(json!({"ok": true})).into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, cookie("", 0));
    Ok(response)
}
