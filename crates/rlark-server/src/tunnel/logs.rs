//! `GET /rlark/v1/namespaces/{ns}/pods/{pod}/log`: the log of a replica, read by its agent.
//!
//! | parameter | meaning |
//! |---|---|
//! | `tail=N` (or `tailLines=N`) | only the last N lines |
//! | `follow=true` | keep streaming until the replica's process exits (or the client leaves) |
//! | `previous=true` | the previous run of the replica (an earlier Task of the same name) |
//! | `limitBytes=N` | at most N bytes |
//! | `container=NAME` | that container of a docker replica (kubectl's `-c`; default: the main one) |
//!
//! **Who**: admins and viewers (a viewer may read every replica's output: logs are part of
//! what "read everything" means in rlark; do not print secrets in task output), and the
//! users and groups the replica's Job names in `spec.access` (docs/ssh.md). Anyone else,
//! agents and task tokens included, gets 403. Reads are not audited.
//!
//! **How**: the namespace names the cluster (`rlark-<clusterID>`; any other namespace is a
//! 400). The hub opens an `agent-api` stream to the agent of that cluster
//! ([`super::Hub::dial_agent_api`]; any session of the cluster, since the route does not
//! read the Pod's node — node-level agents come later), sends
//! `GET /logs/{ns}/{pod}?...` over HTTP/1.1 on it, and streams the answer back as
//! `text/plain`. The agent's errors come back as `Status` objects with the agent's code
//! (404 for a replica that never ran there) and message; tunnel errors as 502 with the
//! reason (no agent connected, timeout, ...: not 503/504, which Kubernetes
//! clients retry for minutes).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use http::{StatusCode, header};
use hyper_util::rt::TokioIo;
use rlark_apiserver::auth::{Identity, Role};
use rlark_apiserver::error::ApiError;
use rlark_tunnel::header::Status;

use super::Hub;
use rlark_api::agent::local::LogOptions;
use rlark_tunnel::dial::DialError;

/// The route, as registered.
pub(crate) const ROUTE: &str = "/rlark/v1/namespaces/{namespace}/pods/{pod}/log";
/// Prefix of agent namespaces.
const AGENT_NAMESPACE_PREFIX: &str = "rlark-";

/// Whether `name` is a DNS-1123 label (a container name).
fn valid_label(name: &str) -> bool {
    name.len() <= 63 && !name.contains('.') && valid_name(name)
}

/// Whether `name` can be a Pod name (and so a path component on the agent).
pub(super) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .last()
            .is_some_and(|b| b.is_ascii_alphanumeric())
}

/// The `container` query parameter (kubectl's `-c`): `None` when absent or empty, else a
/// DNS-1123 label (it names a container of the Task, and is passed on to the agent); `Err`
/// names a bad value.
pub(super) fn container_param(query: Option<&str>) -> Result<Option<String>, String> {
    let mut found = None;
    for pair in query.unwrap_or_default().split('&') {
        if let Some(value) = pair.strip_prefix("container=").filter(|v| !v.is_empty()) {
            if !valid_label(value) {
                return Err(format!(
                    "invalid container name {value:?}: a container name is a DNS-1123 label \
                     (lower case letters, digits and '-', starting and ending with a letter \
                     or digit, at most 63 characters)"
                ));
            }
            found = Some(value.to_string());
        }
    }
    Ok(found)
}

/// `query` (an agent API query string) with `container=NAME` added when given.
pub(super) fn with_container(query: String, container: Option<&str>) -> String {
    match container {
        None => query,
        Some(name) if query.is_empty() => format!("container={name}"),
        Some(name) => format!("{query}&container={name}"),
    }
}

/// `GET /rlark/v1/namespaces/{namespace}/pods/{pod}/log`.
pub(crate) async fn pod_log(
    State(hub): State<Arc<Hub>>,
    Path((namespace, pod)): Path<(String, String)>,
    request: Request,
) -> Response {
    let Some(identity) = request.extensions().get::<Identity>().cloned() else {
        return ApiError::unauthorized().into_response();
    };
    let store = request
        .extensions()
        .get::<crate::task_access::AccessStore>()
        .cloned();
    let granted = match (&store, identity.role()) {
        (_, Role::Admin | Role::Viewer) => true,
        (Some(store), _) => {
            crate::task_access::pod_granted(&*store.0, &identity, &namespace, &pod).await
        }
        (None, _) => false,
    };
    if !granted {
        return ApiError::new(
            403,
            "Forbidden",
            format!(
                "forbidden: User \"{}\" cannot get pods/log in namespace \"{namespace}\" \
                 (admins, viewers and the users the replica's Job grants in spec.access)",
                identity.user
            ),
        )
        .into_response();
    }
    let query = match LogOptions::parse(request.uri().query()) {
        Ok(query) => query,
        Err(message) => return ApiError::bad_request(message).into_response(),
    };
    let container = match container_param(request.uri().query()) {
        Ok(container) => container,
        Err(message) => return ApiError::bad_request(message).into_response(),
    };
    let Some(cluster) = namespace
        .strip_prefix(AGENT_NAMESPACE_PREFIX)
        .filter(|c| crate::security::validate_cluster_id(c).is_ok())
        .map(str::to_string)
    else {
        return ApiError::bad_request(format!(
            "namespace {namespace:?} is not an agent namespace: replica logs are read from \
             the agent of the cluster, so the namespace must be rlark-<clusterID>"
        ))
        .into_response();
    };
    if !valid_name(&pod) {
        return ApiError::bad_request(format!("invalid pod name {pod:?}")).into_response();
    }

    let stream = match hub.dial_agent_api(&cluster, None).await {
        Ok(stream) => stream,
        Err(error) => return tunnel_error(&cluster, &error),
    };
    let bad_gateway = |error: String| {
        ApiError::new(
            502,
            "BadGateway",
            format!("logs of pod {namespace}/{pod} from the agent of cluster {cluster:?}: {error}"),
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
    // The connection (and its tunnel stream) ends with the response body at the latest.
    let guard = AbortOnDrop(conn.abort_handle());
    let mut uri = rlark_api::agent::local::logs_path(&namespace, &pod);
    let q = with_container(query.to_query(), container.as_deref());
    if !q.is_empty() {
        uri.push('?');
        uri.push_str(&q);
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
        Err(_) => {
            return ApiError::new(
                502,
                "BadGateway",
                format!(
                    "logs of pod {namespace}/{pod}: the agent of cluster {cluster:?} did not \
                     answer within {deadline:?}"
                ),
            )
            .into_response();
        }
    };
    drop(sender);
    let status = response.status();
    if status != StatusCode::OK {
        return super::agent_refusal::refusal(response, &cluster, deadline).await;
    }
    let body = Body::new(response.into_body())
        .into_data_stream()
        .map(move |chunk| {
            let _keep = &guard;
            chunk
        });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// The `Status` of a failed `agent-api` dial. Unlike the proxy's mapping
/// (`routes::dial_error_response`), "no agent connected" and "timeout" are 502, not 503 and
/// 504: Kubernetes clients (kube-rs, client-go) retry 503 and 504 for minutes with backoff,
/// and an agent that is not connected is not a reason to hang `rlark logs`.
pub(super) fn tunnel_error(cluster: &str, error: &DialError) -> Response {
    let message = match error.status {
        Status::NoSuchAgent => format!(
            "the agent of cluster {cluster:?} is not connected to this server: {}",
            error.message
        ),
        Status::Forbidden => format!(
            "the agent of cluster {cluster:?} serves no local API (an older agent?): {}",
            error.message
        ),
        _ => format!("the agent API of cluster {cluster:?}: {error}"),
    };
    match error.status {
        Status::BadRequest => ApiError::bad_request(message),
        _ => ApiError::new(502, "BadGateway", message),
    }
    .into_response()
}

/// Aborts a task when dropped.
pub(super) struct AbortOnDrop(pub(super) tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_parameter_is_checked_and_passed_on() {
        assert_eq!(container_param(None), Ok(None));
        assert_eq!(container_param(Some("tail=3&container=")), Ok(None));
        assert_eq!(
            container_param(Some("follow=true&container=tb")),
            Ok(Some("tb".to_string()))
        );
        assert!(
            container_param(Some("container=../x"))
                .is_err_and(|e| e.contains("invalid container name \"../x\""))
        );
        assert_eq!(with_container(String::new(), Some("tb")), "container=tb");
        assert_eq!(
            with_container("tail=1".into(), Some("tb")),
            "tail=1&container=tb"
        );
        assert_eq!(with_container("tail=1".into(), None), "tail=1");
    }

    #[test]
    fn pod_names_are_checked() {
        assert!(valid_name("job-main-0"));
        for bad in ["", "..", "a/b", "A-0", "-a", "a-"] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
