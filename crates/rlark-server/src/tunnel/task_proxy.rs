//! The task HTTP proxy: `ANY /rlark/v1/namespaces/{ns}/tasks/{name}/proxy/{port}/{path}`
//! (replica 0) and `.../tasks/{name}/replicas/{index}/proxy/{port}/{path}`: HTTP to a port
//! of a running replica, through its agent — TensorBoard, the Ray dashboard, Jupyter, any
//! web UI a task serves —, WebSocket upgrades included.
//!
//! **Who**: the rule of `crate::task_access` — admins, and the users and groups the Job's
//! `spec.access` names. A refusal is a 403 `Status` and an audit record.
//!
//! **Where**: the replica's destination as a port-forward finds it
//! ([`super::portforward::Destination`]: its node's loopback for raw and docker replicas,
//! its IP for member Pods; a raw replica in a Domain is refused with 400). The request
//! travels as [`super::routes::relay`] sends it, with the caller's rlark credentials
//! removed, `X-Forwarded-Prefix` set, and the app's absolute links, redirects and cookie
//! paths moved under the prefix ([`super::prefix`]). `.../proxy/{port}` without a trailing
//! slash redirects to `.../proxy/{port}/`, so relative links resolve.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use rlark_apiserver::audit::{AuditEntry, AuditSink};
use rlark_apiserver::auth::Identity;
use rlark_apiserver::error::ApiError;
use rlark_store::Store;

use super::Hub;
use super::portforward::Destination;
use crate::console::proxy_origin::{OnProxyOrigin, ProxyUrl};
use crate::security::AuthMethod;
use crate::task_access::{self, AccessError};

/// The routes' prefix up to the task name.
const BASE: &str = "/rlark/v1/namespaces/{namespace}/tasks/{name}";

/// State of the task proxy.
#[derive(Clone)]
pub(crate) struct TaskProxyState {
    pub hub: Arc<Hub>,
    pub store: Arc<dyn Store>,
    pub audit: Arc<dyn AuditSink>,
    /// Where browsers open task apps (`--proxy-listen`), for the refusal of the console's
    /// cookie on the console's origin; `None`: the server has no proxy origin.
    pub proxy_url: Option<ProxyUrl>,
}

pub(crate) fn router(state: TaskProxyState) -> Router {
    Router::new()
        .route(&format!("{BASE}/proxy/{{port}}"), any(slash))
        .route(&format!("{BASE}/proxy/{{port}}/"), any(root))
        .route(&format!("{BASE}/proxy/{{port}}/{{*path}}"), any(path))
        .route(
            &format!("{BASE}/replicas/{{index}}/proxy/{{port}}"),
            any(replica_slash),
        )
        .route(
            &format!("{BASE}/replicas/{{index}}/proxy/{{port}}/"),
            any(replica_root),
        )
        .route(
            &format!("{BASE}/replicas/{{index}}/proxy/{{port}}/{{*path}}"),
            any(replica_path),
        )
        .with_state(state)
}

/// The URL prefix of a replica's port.
fn prefix(namespace: &str, name: &str, index: Option<u32>, port: &str) -> String {
    match index {
        None => format!("/rlark/v1/namespaces/{namespace}/tasks/{name}/proxy/{port}"),
        Some(i) => {
            format!("/rlark/v1/namespaces/{namespace}/tasks/{name}/replicas/{i}/proxy/{port}")
        }
    }
}

fn redirect(to: String, request: &Request) -> Response {
    let query = request
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    (
        http::StatusCode::MOVED_PERMANENTLY,
        [(http::header::LOCATION, format!("{to}/{query}"))],
    )
        .into_response()
}

async fn slash(
    Path((namespace, name, port)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    redirect(prefix(&namespace, &name, None, &port), &request)
}

async fn replica_slash(
    Path((namespace, name, index, port)): Path<(String, String, u32, String)>,
    request: Request,
) -> Response {
    redirect(prefix(&namespace, &name, Some(index), &port), &request)
}

async fn root(
    State(state): State<TaskProxyState>,
    Path((namespace, name, port)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    serve(state, namespace, name, None, port, String::new(), request).await
}

async fn path(
    State(state): State<TaskProxyState>,
    Path((namespace, name, port, path)): Path<(String, String, String, String)>,
    request: Request,
) -> Response {
    serve(state, namespace, name, None, port, path, request).await
}

async fn replica_root(
    State(state): State<TaskProxyState>,
    Path((namespace, name, index, port)): Path<(String, String, u32, String)>,
    request: Request,
) -> Response {
    serve(
        state,
        namespace,
        name,
        Some(index),
        port,
        String::new(),
        request,
    )
    .await
}

async fn replica_path(
    State(state): State<TaskProxyState>,
    Path((namespace, name, index, port, path)): Path<(String, String, u32, String, String)>,
    request: Request,
) -> Response {
    serve(state, namespace, name, Some(index), port, path, request).await
}

fn access_error(error: AccessError, name: &str) -> Response {
    error.into_api_error(name).into_response()
}

async fn serve(
    state: TaskProxyState,
    namespace: String,
    name: String,
    index: Option<u32>,
    port_text: String,
    path: String,
    request: Request,
) -> Response {
    let Some(identity) = request.extensions().get::<Identity>().cloned() else {
        return ApiError::unauthorized().into_response();
    };
    let on_proxy_origin = request.extensions().get::<OnProxyOrigin>().is_some();
    if !on_proxy_origin
        && matches!(
            request.extensions().get::<AuthMethod>(),
            Some(AuthMethod::Session { .. })
        )
    {
        return console_cookie_refused(state.proxy_url.as_ref(), &request, &name);
    }
    let Some(port) = port_text.parse::<u16>().ok().filter(|p| *p > 0) else {
        return ApiError::bad_request(format!("port {port_text:?} is not a port (1-65535)"))
            .into_response();
    };
    let task = match task_access::find_task(&*state.store, &name, Some(&namespace)).await {
        Ok(task) => task,
        Err(error) => return access_error(error, &name),
    };
    let audit = |decision: &str, reason: String| {
        state.audit.record(AuditEntry {
            verb: "proxy".into(),
            resource: "tasks.rlinf.io/proxy".into(),
            namespace: namespace.clone(),
            name: name.clone(),
            reason,
            ..AuditEntry::now(
                if decision == "denied" {
                    "denied"
                } else {
                    "proxy"
                },
                decision,
            )
            .by(Some(&identity))
        });
    };
    if let Err(error) = task_access::authorize(&*state.store, &identity, &task).await {
        audit("denied", error.to_string());
        return access_error(error, &name);
    }
    let replica = match task_access::running_replica(&*state.store, task, index.unwrap_or(0)).await
    {
        Ok(replica) => replica,
        Err(error) => return access_error(error, &name),
    };
    let destination = match Destination::of(&replica.pod, Some(&replica.task)) {
        Ok(destination) => destination,
        Err(message) => return ApiError::bad_request(message).into_response(),
    };
    // One user's requests cannot take all of the agent's streams from the others.
    let share = match state.hub.user_share(replica.cluster(), &identity.user) {
        Ok(share) => share,
        Err(error) => {
            return ApiError::new(429, "TooManyRequests", error.message).into_response();
        }
    };
    let stream = match destination.dial(&state.hub, replica.cluster(), port).await {
        Ok(stream) => stream.with_share(share),
        Err(error) => {
            return super::routes::dial_error_response(
                &format!("{}:{port} of {}", destination.host, replica.pod_name),
                replica.cluster(),
                &error,
            );
        }
    };
    let websocket = request
        .headers()
        .get(http::header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    if websocket {
        audit(
            "allowed",
            format!("WebSocket to port {port} of {} /{path}", replica.pod_name),
        );
    }
    tracing::debug!(user = %identity.user, pod = %replica.pod_name, port, path = %path, "task proxy");
    let prefix = prefix(&namespace, &name, index, &port_text);
    let mut response = super::routes::relay(
        Box::new(stream),
        &format!("{}:{port}", destination.host),
        &path,
        request,
        Some(&prefix),
    )
    .await;
    strip_rlark_cookies(response.headers_mut());
    response
}

/// The answer on the console's origin to a proxy request authenticated by the console's
/// cookie: task apps are user code, and on the console's origin their scripts could read the
/// console's CSRF token and act as the user.
fn console_cookie_refused(proxy_url: Option<&ProxyUrl>, request: &Request, name: &str) -> Response {
    let message = match proxy_url {
        Some(url) => {
            let host = request
                .headers()
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok());
            format!(
                "task apps are not served to the console's session on the console's origin: \
                 open the app from the console (it gets a one-time link to the task proxy's \
                 origin {}); bearer tokens and client certificates may use this route",
                url.for_console(host)
            )
        }
        None => "task apps are not served to the console's session: this server has no task \
                 proxy origin (rlark server --proxy-listen); bearer tokens and client \
                 certificates may use this route"
            .to_string(),
    };
    ApiError::forbidden_resource("rlinf.io", "tasks", Some(name), &message).into_response()
}

/// Drop the app's `Set-Cookie`s of rlark's own cookies (`__Host-rlark...`): an app may not
/// set or overwrite the console's or the proxy origin's session.
pub(crate) fn strip_rlark_cookies(headers: &mut http::HeaderMap) {
    let kept: Vec<http::HeaderValue> = headers
        .get_all(http::header::SET_COOKIE)
        .iter()
        .filter(|v| !super::routes::is_rlark_cookie(v.as_bytes()))
        .cloned()
        .collect();
    if kept.len() == headers.get_all(http::header::SET_COOKIE).iter().count() {
        return;
    }
    headers.remove(http::header::SET_COOKIE);
    for value in kept {
        headers.append(http::header::SET_COOKIE, value);
    }
}
