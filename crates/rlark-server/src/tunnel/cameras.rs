//! `GET /rlark/v1/namespaces/{ns}/nodes/{node}/cameras/{camera}/stream?fps=N`: the live view
//! of a camera on an agent's host, as MJPEG (`multipart/x-mixed-replace`), relayed from the
//! agent's local API (`GET /v1/cameras/{camera}/stream`, `rlark_agent::camera_stream`)
//! through its tunnel. A browser shows it in an `<img>`: the web console's Devices page.
//!
//! **Who**: whoever may get the Node (`get nodes.rlinf.io` in `ns`: admins, viewers, the
//! agent of that namespace), as the built-in policy decides. Viewing does not change the
//! camera (it must already be open).
//!
//! **How**: as replica logs (`logs.rs`): the namespace names the cluster
//! (`rlark-<clusterID>`), the hub opens an `agent-api` stream to that cluster's agent,
//! preferring the session of `node`, and streams the agent's answer back. The agent's
//! refusals keep their code (400, 404, 409) and message; tunnel failures are 502.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use http::{StatusCode, header};
use hyper_util::rt::TokioIo;
use rlark_apiserver::auth::Identity;
use rlark_apiserver::authz::{Attributes, Decision, authorize};
use rlark_apiserver::error::ApiError;

use super::Hub;
use super::logs::{AbortOnDrop, tunnel_error, valid_name};

/// The route, as registered.
pub(crate) const ROUTE: &str =
    "/rlark/v1/namespaces/{namespace}/nodes/{node}/cameras/{camera}/stream";
/// Most of an agent's error answer that is read.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// `GET` of [`ROUTE`].
pub(crate) async fn stream(
    State(hub): State<Arc<Hub>>,
    Path((namespace, node, camera)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    let Some(identity) = request.extensions().get::<Identity>().cloned() else {
        return ApiError::unauthorized().into_response();
    };
    let attributes = Attributes {
        verb: "get".into(),
        group: "rlinf.io".into(),
        resource: "nodes".into(),
        subresource: None,
        namespace: Some(namespace.clone()),
        name: Some(node.clone()),
    };
    if let Decision::Deny(reason) = authorize(&identity, &attributes) {
        return ApiError::new(403, "Forbidden", reason).into_response();
    }
    let Some(cluster) = namespace
        .strip_prefix("rlark-")
        .filter(|c| crate::security::validate_cluster_id(c).is_ok())
        .map(str::to_string)
    else {
        return ApiError::bad_request(format!(
            "namespace {namespace:?} is not an agent namespace (rlark-<clusterID>): cameras are \
             on the hosts of agents"
        ))
        .into_response();
    };
    if !valid_name(&node) {
        return ApiError::bad_request(format!("invalid node name {node:?}")).into_response();
    }
    // The agent checks the camera id and fps; only keep them from changing the path.
    if camera.contains('/') || camera.contains('?') {
        return ApiError::bad_request(format!("invalid camera id {camera:?}")).into_response();
    }
    let stream = match hub.dial_agent_api(&cluster, Some(&node)).await {
        Ok(stream) => stream,
        Err(error) => return tunnel_error(&cluster, &error),
    };
    let bad_gateway = |error: String| {
        ApiError::new(
            502,
            "BadGateway",
            format!("camera {camera} on node {namespace}/{node}: {error}"),
        )
        .into_response()
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
    let mut uri = format!("/v1/cameras/{camera}/stream");
    if let Some(query) = request.uri().query() {
        uri.push('?');
        uri.push_str(query);
    }
    let out = match http::Request::get(&uri)
        .header(header::HOST, "agent")
        .body(Body::empty())
    {
        Ok(out) => out,
        Err(error) => return ApiError::bad_request(error.to_string()).into_response(),
    };
    let deadline = hub.config().dial_timeout;
    let response = match tokio::time::timeout(deadline, sender.send_request(out)).await {
        Ok(Ok(response)) => response,
        Ok(Err(error)) => return bad_gateway(error.to_string()),
        Err(_) => return bad_gateway(format!("the agent did not answer within {deadline:?}")),
    };
    drop(sender);
    let status = response.status();
    if status != StatusCode::OK {
        let body = axum::body::to_bytes(Body::new(response.into_body()), MAX_ERROR_BODY);
        let text = match tokio::time::timeout(deadline, body).await {
            Ok(Ok(bytes)) => String::from_utf8_lossy(&bytes).trim().to_string(),
            _ => String::new(),
        };
        let message = if text.is_empty() {
            format!("the agent of cluster {cluster:?} answered {status}")
        } else {
            text
        };
        return match status.as_u16() {
            400 => ApiError::bad_request(message),
            404 => ApiError::new(404, "NotFound", message),
            409 => ApiError::new(409, "Conflict", message),
            code => ApiError::new(
                502,
                "BadGateway",
                format!("the agent of cluster {cluster:?} answered {code}: {message}"),
            ),
        }
        .into_response();
    }
    tracing::debug!(user = %identity.user, %namespace, %node, %camera, "camera view started");
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .cloned()
        .unwrap_or_else(|| http::HeaderValue::from_static("multipart/x-mixed-replace"));
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
