//! Calls into rlark's own routes (the Kubernetes API, replica logs, SSH keys, certificates)
//! as the gateway's caller. The gateway never decides who may do what: it rewrites a RLark
//! console request into the rlark request that does the same thing and sends it, in
//! process, with the caller's [`Identity`] (and how it was authenticated), so rlark's
//! authorization, admission and audit apply exactly as if the caller had used the API.

use std::net::SocketAddr;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use axum::response::Response;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use rlark_apiserver::auth::Identity;
use serde_json::Value;
use tower::ServiceExt as _;

use super::error::GatewayError;
use crate::console::sessions::SessionEnd;
use crate::security::AuthMethod;

/// Largest error body read from a backend answer.
const MAX_ERROR_BODY: usize = 1024 * 1024;
/// Largest JSON body the gateway reads from a backend answer to reshape it.
const MAX_JSON_BODY: usize = 256 * 1024 * 1024;

/// Who is calling: the request extensions passed on to rlark's routes.
#[derive(Clone, Debug)]
pub(crate) struct Caller {
    pub identity: Identity,
    method: Option<AuthMethod>,
    remote: Option<ConnectInfo<SocketAddr>>,
    end: Option<SessionEnd>,
}

/// Set by the gateway's session layer on a request whose gateway cookie names no live
/// session, so the 401 can say so.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StaleSession;

impl Caller {
    /// The caller of a request: 401 when it carries no credentials.
    pub(crate) fn of(extensions: &http::Extensions) -> Result<Self, GatewayError> {
        let Some(identity) = extensions.get::<Identity>() else {
            let message = if extensions.get::<StaleSession>().is_some() {
                "your RLark console session has expired or was ended (logged out, or its \
                 token was revoked): log in again"
            } else {
                "not logged in: log in with POST /api/v1/auth/login (your rlark user name, \
                 and an rlark bearer token as the password), or send Authorization: Bearer TOKEN"
            };
            return Err(GatewayError::Unauthenticated(message.to_string()));
        };
        Ok(Self {
            identity: identity.clone(),
            method: extensions.get::<AuthMethod>().cloned(),
            remote: extensions.get::<ConnectInfo<SocketAddr>>().copied(),
            end: extensions.get::<SessionEnd>().cloned(),
        })
    }

    /// Put the caller on a request to rlark's routes.
    pub(crate) fn stamp(&self, extensions: &mut http::Extensions) {
        extensions.insert(self.identity.clone());
        if let Some(method) = &self.method {
            extensions.insert(method.clone());
        }
        if let Some(remote) = self.remote {
            extensions.insert(remote);
        }
        if let Some(end) = &self.end {
            extensions.insert(end.clone());
        }
    }
}

/// A JSON answer of a backend route.
pub(crate) struct JsonAnswer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

/// rlark's routes, without the gateway.
#[derive(Clone)]
pub(crate) struct Backend {
    router: Router,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend").finish_non_exhaustive()
    }
}

impl Backend {
    pub(crate) fn new(router: Router) -> Self {
        Self { router }
    }

    /// rlark's routes, to serve over another connection (the terminal's).
    pub(crate) fn router(&self) -> Router {
        self.router.clone()
    }

    /// Send `method uri` with `body` (of `content_type`) as `caller`; the backend's answer
    /// as is, whatever its status.
    pub(crate) async fn send(
        &self,
        caller: &Caller,
        method: Method,
        uri: &str,
        content_type: Option<&'static str>,
        body: Body,
    ) -> Result<Response, GatewayError> {
        let mut request = http::Request::builder()
            .method(method)
            .uri(uri)
            .header(header::ACCEPT, "application/json")
            .body(body)
            .map_err(|e| GatewayError::BadRequest(format!("request to {uri}: {e}")))?;
        if let Some(content_type) = content_type {
            request
                .headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        }
        caller.stamp(request.extensions_mut());
        match self.router.clone().oneshot(request).await {
            Ok(response) => Ok(response),
            Err(never) => match never {},
        }
    }

    /// Like [`Self::send`], but a non-2xx answer becomes [`GatewayError::Upstream`] and a
    /// 2xx answer is returned as is (status, headers and body stream).
    pub(crate) async fn pass(
        &self,
        caller: &Caller,
        method: Method,
        uri: &str,
        content_type: Option<&'static str>,
        body: Body,
    ) -> Result<Response, GatewayError> {
        let response = self.send(caller, method, uri, content_type, body).await?;
        if response.status().is_success() {
            Ok(response)
        } else {
            Err(upstream_error(response).await)
        }
    }

    /// Send and read a 2xx JSON answer; a non-2xx answer is [`GatewayError::Upstream`].
    pub(crate) async fn json(
        &self,
        caller: &Caller,
        method: Method,
        uri: &str,
        content_type: Option<&'static str>,
        body: Body,
    ) -> Result<JsonAnswer, GatewayError> {
        let response = self.pass(caller, method, uri, content_type, body).await?;
        let (parts, body) = response.into_parts();
        let bytes = read(body, MAX_JSON_BODY, uri).await?;
        let body = serde_json::from_slice(&bytes)
            .map_err(|e| GatewayError::Internal(format!("{uri} answered invalid JSON: {e}")))?;
        Ok(JsonAnswer {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// `GET uri` as JSON.
    pub(crate) async fn get(&self, caller: &Caller, uri: &str) -> Result<Value, GatewayError> {
        Ok(self
            .json(caller, Method::GET, uri, None, Body::empty())
            .await?
            .body)
    }
}

async fn read(body: Body, limit: usize, uri: &str) -> Result<Bytes, GatewayError> {
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|e| GatewayError::Internal(format!("read the answer of {uri}: {e}")))
}

/// A backend error answer as a gateway error: a Kubernetes `Status` keeps its message and
/// reason; any other body is the message.
pub(crate) async fn upstream_error(response: Response) -> GatewayError {
    let code = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), MAX_ERROR_BODY)
        .await
        .unwrap_or_default();
    let status: Option<Value> = serde_json::from_slice(&bytes).ok();
    let field = |name: &str| {
        status
            .as_ref()
            .and_then(|s| s.get(name))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let message = field("message").unwrap_or_else(|| {
        let text = String::from_utf8_lossy(&bytes).trim().to_string();
        if text.is_empty() {
            code.canonical_reason().unwrap_or("error").to_string()
        } else {
            text
        }
    });
    GatewayError::Upstream {
        code,
        reason: field("reason")
            .unwrap_or_else(|| code.canonical_reason().unwrap_or("Error").replace(' ', "")),
        message,
    }
}
