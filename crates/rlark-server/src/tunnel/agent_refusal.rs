//! What the server answers when an agent refuses a request relayed to it (logs, exec,
//! devices): the agent's own message, with the status a Kubernetes client expects.

use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use rlark_apiserver::error::ApiError;

/// Most of an agent's error answer that is read.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// The response for the agent of `cluster` answering `response` (not the success the
/// caller wanted): 400, 404 and 409 pass through with the agent's message (its body, read
/// within `deadline`, at most 64 KiB), anything else becomes 502 naming the agent's code.
pub(crate) async fn refusal(
    response: http::Response<hyper::body::Incoming>,
    cluster: &str,
    deadline: Duration,
) -> Response {
    let status = response.status();
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
    match status.as_u16() {
        400 => ApiError::bad_request(message),
        403 => ApiError::new(403, "Forbidden", message),
        404 => ApiError::new(404, "NotFound", message),
        409 => ApiError::new(409, "Conflict", message),
        code => ApiError::new(
            502,
            "BadGateway",
            format!("the agent of cluster {cluster:?} answered {code}: {message}"),
        ),
    }
    .into_response()
}
