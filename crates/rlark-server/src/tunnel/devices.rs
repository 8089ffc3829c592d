//! The robots and cameras on agents' hosts, relayed from each agent's local API through its
//! tunnel (`rlark_agent::camera_stream`, `rlark_agent::robot_actions`) — what the web
//! console's Devices page uses:
//!
//! | route | who | what |
//! |---|---|---|
//! | `GET /rlark/v1/namespaces/{ns}/nodes/{node}/cameras/{camera}/stream?fps=N` | who may get the Node | the camera's live view, MJPEG (`multipart/x-mixed-replace`); the camera must be open |
//! | `GET /rlark/v1/namespaces/{ns}/nodes/{node}/cameras` | who may get the Node | `{"items": [{"id", "name", "type", "state" (`OPEN`, `CLOSED`, `ERROR`), "width", "height", "fps"}]}`; with `?watch=1` that list as one line of `application/x-ndjson` now and whenever a camera opens, closes, fails or recovers |
//! | `POST /rlark/v1/namespaces/{ns}/nodes/{node}/cameras/{camera}/{open,close}` | admins (audited) | open (its configured settings) or close the camera; answers it as listed |
//! | `GET /rlark/v1/namespaces/{ns}/nodes/{node}/robots` | who may get the Node | `{"items": [{"id", "type", "backend", "state", "mode", "message", "ownerPid"}]}`; with `?watch=1` that list as one line of `application/x-ndjson` now and after every change of a robot's state |
//! | `POST /rlark/v1/namespaces/{ns}/nodes/{node}/robots/{robot}/{start,stop,switch,reset}` | admins (audited) | the action (body `{"mode": "M"}` for start and switch); answers the robot |
//! | `GET /rlark/v1/namespaces/{ns}/nodes/{node}/robots/{robot}/logs` | who may get the Node | `{"robotId", "lines": [...]}`: its recent output, oldest first (at most 1,000 lines) |
//! | `GET /rlark/v1/namespaces/{ns}/nodes/{node}/robots/{robot}/modes` | who may get the Node | `{"robotId", "modes": [{"name", "package", "launchFile", "args"}]}`: the modes it starts in and their launch files |
//!
//! "Who may get the Node" is the built-in policy's `get nodes.rlinf.io` in `ns`: admins,
//! viewers and the agent of that namespace. The namespace names the cluster
//! (`rlark-<clusterID>`); the hub opens an `agent-api` stream to that cluster's agent,
//! preferring the session of `node`, and streams the agent's answer back. The agent's
//! refusals keep their code (400, 403, 404, 409) and message; tunnel failures are 502.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt as _;
use http::{StatusCode, header};
use hyper_util::rt::TokioIo;
use rlark_apiserver::audit::{AuditEntry, AuditSink};
use rlark_apiserver::auth::{Identity, Role};
use rlark_apiserver::authz::{Attributes, Decision, authorize};
use rlark_apiserver::error::ApiError;

use super::Hub;
use super::logs::{AbortOnDrop, tunnel_error, valid_name};

/// The camera route.
pub(crate) const CAMERA_ROUTE: &str =
    "/rlark/v1/namespaces/{namespace}/nodes/{node}/cameras/{camera}/stream";
/// The camera list route.
pub(crate) const CAMERAS_ROUTE: &str = "/rlark/v1/namespaces/{namespace}/nodes/{node}/cameras";
/// The camera action route.
pub(crate) const CAMERA_ACTION_ROUTE: &str =
    "/rlark/v1/namespaces/{namespace}/nodes/{node}/cameras/{camera}/{action}";
/// The robot list route.
pub(crate) const ROBOTS_ROUTE: &str = "/rlark/v1/namespaces/{namespace}/nodes/{node}/robots";
/// The robot action route.
pub(crate) const ROBOT_ACTION_ROUTE: &str =
    "/rlark/v1/namespaces/{namespace}/nodes/{node}/robots/{robot}/{action}";
/// Largest robot action body passed on.
const MAX_ACTION_BODY: usize = 16 * 1024;

/// State of the device routes.
#[derive(Clone)]
pub(crate) struct DevicesState {
    pub hub: Arc<Hub>,
    pub audit: Arc<dyn AuditSink>,
}

/// The routes; merged into the process router.
pub(crate) fn router(state: DevicesState) -> Router {
    Router::new()
        .route(CAMERA_ROUTE, get(camera))
        .route(CAMERAS_ROUTE, get(cameras))
        .route(CAMERA_ACTION_ROUTE, post(camera_action))
        .route(ROBOTS_ROUTE, get(robots))
        .route(ROBOT_ACTION_ROUTE, post(robot_action).get(robot_read))
        .with_state(state)
}

/// The identity, if it may get Node `namespace/node`; else the refusal.
fn may_get_node(request: &Request, namespace: &str, node: &str) -> Result<Identity, Box<ApiError>> {
    let Some(identity) = request.extensions().get::<Identity>().cloned() else {
        return Err(Box::new(ApiError::unauthorized()));
    };
    let attributes = Attributes {
        verb: "get".into(),
        group: "rlinf.io".into(),
        resource: "nodes".into(),
        subresource: None,
        namespace: Some(namespace.to_string()),
        name: Some(node.to_string()),
    };
    match authorize(&identity, &attributes) {
        Decision::Allow => Ok(identity),
        Decision::Deny(reason) => Err(Box::new(ApiError::new(403, "Forbidden", reason))),
    }
}

/// The cluster of agent namespace `namespace`, after checking `node` and `device`.
fn cluster_of(namespace: &str, node: &str, device: &str) -> Result<String, Box<ApiError>> {
    let Some(cluster) = namespace
        .strip_prefix("rlark-")
        .filter(|c| crate::security::validate_cluster_id(c).is_ok())
    else {
        return Err(Box::new(ApiError::bad_request(format!(
            "namespace {namespace:?} is not an agent namespace (rlark-<clusterID>): devices are \
             on the hosts of agents"
        ))));
    };
    if !valid_name(node) {
        return Err(Box::new(ApiError::bad_request(format!(
            "invalid node name {node:?}"
        ))));
    }
    // The agent checks device ids; only keep them from changing the path.
    if device.is_empty() || device.contains(['/', '?', '#', '%']) {
        return Err(Box::new(ApiError::bad_request(format!(
            "invalid device id {device:?}"
        ))));
    }
    Ok(cluster.to_string())
}

/// Send `method uri` with `body` to the local API of the agent of `cluster` (preferring
/// `node`'s session) and stream its answer back; `what` names the target in errors.
async fn relay(
    hub: &Hub,
    cluster: &str,
    node: &str,
    method: http::Method,
    uri: String,
    body: Body,
    what: &str,
) -> Response {
    let stream = match hub.dial_agent_api(cluster, Some(node)).await {
        Ok(stream) => stream,
        Err(error) => return tunnel_error(cluster, &error),
    };
    let bad_gateway = |error: String| {
        ApiError::new(502, "BadGateway", format!("{what}: {error}")).into_response()
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(pair) => pair,
        Err(error) => return bad_gateway(error.to_string()),
    };
    let conn = tokio::spawn(async move {
        if let Err(error) = conn.await {
            tracing::debug!(%error, "agent API connection ended");
        }
    });
    let guard = AbortOnDrop(conn.abort_handle());
    let mut out = http::Request::builder()
        .method(method)
        .uri(&uri)
        .header(header::HOST, "agent");
    if body_is_json(&uri) {
        out = out.header(header::CONTENT_TYPE, "application/json");
    }
    let out = match out.body(body) {
        Ok(out) => out,
        Err(error) => return ApiError::bad_request(error.to_string()).into_response(),
    };
    // A robot start waits for its launch: the agent bounds it (30 s), this a little later.
    let deadline = hub
        .config()
        .dial_timeout
        .max(std::time::Duration::from_secs(35));
    let response = match tokio::time::timeout(deadline, sender.send_request(out)).await {
        Ok(Ok(response)) => response,
        Ok(Err(error)) => return bad_gateway(error.to_string()),
        Err(_) => return bad_gateway(format!("the agent did not answer within {deadline:?}")),
    };
    drop(sender);
    let status = response.status();
    if status != StatusCode::OK {
        return super::agent_refusal::refusal(response, cluster, deadline).await;
    }
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .cloned()
        .unwrap_or_else(|| http::HeaderValue::from_static("application/octet-stream"));
    let body = Body::new(response.into_body())
        .into_data_stream()
        .map(move |chunk| {
            let _keep = &guard;
            chunk
        });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CACHE_CONTROL, "no-cache, no-store")
        .header(header::X_CONTENT_TYPE_OPTIONS, "nosniff")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn body_is_json(uri: &str) -> bool {
    uri.starts_with("/v1/robots/")
}

/// `GET` of [`CAMERAS_ROUTE`].
async fn cameras(
    State(state): State<DevicesState>,
    Path((namespace, node)): Path<(String, String)>,
    request: Request,
) -> Response {
    device_list(state, "cameras", namespace, node, request).await
}

/// The list of a node's devices of `kind` (`robots` or `cameras`, as the agent's path
/// names them), for whoever may read the Node.
async fn device_list(
    state: DevicesState,
    kind: &str,
    namespace: String,
    node: String,
    request: Request,
) -> Response {
    if let Err(error) = may_get_node(&request, &namespace, &node) {
        return error.into_response();
    }
    let cluster = match cluster_of(&namespace, &node, kind) {
        Ok(cluster) => cluster,
        Err(error) => return error.into_response(),
    };
    let what = format!("{kind} of node {namespace}/{node}");
    // Robots and cameras can be followed: the agent streams the list again after every
    // change.
    let watch = request
        .uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .any(|pair| pair == "watch=1" || pair == "watch=true");
    let uri = if watch {
        format!("/v1/{kind}?watch=1")
    } else {
        format!("/v1/{kind}")
    };
    relay(
        &state.hub,
        &cluster,
        &node,
        http::Method::GET,
        uri,
        Body::empty(),
        &what,
    )
    .await
}

/// `POST` of [`CAMERA_ACTION_ROUTE`]: admins only, audited.
async fn camera_action(
    State(state): State<DevicesState>,
    Path(target): Path<(String, String, String, String)>,
    request: Request,
) -> Response {
    device_action(state, "cameras", &["open", "close"], target, request).await
}

/// `GET` of [`CAMERA_ROUTE`].
async fn camera(
    State(state): State<DevicesState>,
    Path((namespace, node, camera)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    let identity = match may_get_node(&request, &namespace, &node) {
        Ok(identity) => identity,
        Err(error) => return error.into_response(),
    };
    let cluster = match cluster_of(&namespace, &node, &camera) {
        Ok(cluster) => cluster,
        Err(error) => return error.into_response(),
    };
    let mut uri = format!("/v1/cameras/{camera}/stream");
    if let Some(query) = request.uri().query() {
        uri.push('?');
        uri.push_str(query);
    }
    tracing::debug!(user = %identity.user, %namespace, %node, %camera, "camera view");
    let what = format!("camera {camera} on node {namespace}/{node}");
    relay(
        &state.hub,
        &cluster,
        &node,
        http::Method::GET,
        uri,
        Body::empty(),
        &what,
    )
    .await
}

/// `GET` of [`ROBOTS_ROUTE`].
async fn robots(
    State(state): State<DevicesState>,
    Path((namespace, node)): Path<(String, String)>,
    request: Request,
) -> Response {
    device_list(state, "robots", namespace, node, request).await
}

/// `GET` of [`ROBOT_ACTION_ROUTE`]: a robot's `logs` or `modes`, for whoever may read the
/// Node.
async fn robot_read(
    State(state): State<DevicesState>,
    Path((namespace, node, robot, read)): Path<(String, String, String, String)>,
    request: Request,
) -> Response {
    if let Err(error) = may_get_node(&request, &namespace, &node) {
        return error.into_response();
    }
    if read != "logs" && read != "modes" {
        return ApiError::new(
            405,
            "MethodNotAllowed",
            format!("GET reads a robot's logs or modes, not {read:?}; robot actions are POST"),
        )
        .into_response();
    }
    let cluster = match cluster_of(&namespace, &node, &robot) {
        Ok(cluster) => cluster,
        Err(error) => return error.into_response(),
    };
    let what = format!("{read} of robot {robot} on node {namespace}/{node}");
    relay(
        &state.hub,
        &cluster,
        &node,
        http::Method::GET,
        format!("/v1/robots/{robot}/{read}"),
        Body::empty(),
        &what,
    )
    .await
}

/// `POST` of [`ROBOT_ACTION_ROUTE`]: admins only, audited.
async fn robot_action(
    State(state): State<DevicesState>,
    Path(target): Path<(String, String, String, String)>,
    request: Request,
) -> Response {
    let actions = &["start", "stop", "switch", "reset"];
    device_action(state, "robots", actions, target, request).await
}

/// An action on a device (`kind`: `robots` or `cameras`, as the agent's path names them):
/// admins only, audited (action `robot` or `camera`), relayed with its body. `target` is
/// `(namespace, node, device, action)` from the path.
async fn device_action(
    state: DevicesState,
    kind: &str,
    actions: &[&str],
    target: (String, String, String, String),
    request: Request,
) -> Response {
    let (namespace, node, device, action) = target;
    let Some(identity) = request.extensions().get::<Identity>().cloned() else {
        return ApiError::unauthorized().into_response();
    };
    let noun = kind.trim_end_matches('s');
    let audit = |decision: &str, reason: String| {
        state.audit.record(AuditEntry {
            verb: action.clone(),
            resource: kind.to_string(),
            namespace: namespace.clone(),
            name: format!("{node}/{device}"),
            reason,
            ..AuditEntry::now(noun, decision).by(Some(&identity))
        });
    };
    if identity.role() != Role::Admin {
        let reason = format!(
            "{kind} is forbidden: User \"{}\" cannot {action} {noun} {device} on node \
             {namespace}/{node}: only admins act on devices",
            identity.user
        );
        audit("denied", reason.clone());
        return ApiError::new(403, "Forbidden", reason).into_response();
    }
    let cluster = match cluster_of(&namespace, &node, &device) {
        Ok(cluster) => cluster,
        Err(error) => return error.into_response(),
    };
    if !actions.contains(&action.as_str()) {
        return ApiError::bad_request(format!(
            "unknown {noun} action {action:?}; expected {}",
            actions.join(", ")
        ))
        .into_response();
    }
    let body = match axum::body::to_bytes(request.into_body(), MAX_ACTION_BODY).await {
        Ok(body) => body,
        Err(_) => {
            return ApiError::bad_request(format!(
                "the body is larger than {MAX_ACTION_BODY} bytes"
            ))
            .into_response();
        }
    };
    audit(
        "allowed",
        format!("body {}", String::from_utf8_lossy(&body).trim()),
    );
    let what = format!("{action} {noun} {device} on node {namespace}/{node}");
    let uri = format!("/v1/{kind}/{device}/{action}");
    relay(
        &state.hub,
        &cluster,
        &node,
        http::Method::POST,
        uri,
        Body::from(body),
        &what,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_on_agent_namespaces_with_plain_ids() {
        assert_eq!(
            cluster_of("rlark-edge", "vm-edge", "cam-0").ok(),
            Some("edge".to_string())
        );
        for (ns, node, device) in [
            ("default", "n", "cam-0"),
            ("rlark-", "n", "cam-0"),
            ("rlark-edge", "Bad_Node", "cam-0"),
            ("rlark-edge", "n", "a/b"),
            ("rlark-edge", "n", "a%2fb"),
            ("rlark-edge", "n", ""),
        ] {
            let error = cluster_of(ns, node, device).unwrap_err();
            assert_eq!(error.code, 400, "{ns} {node} {device}");
        }
    }
}
