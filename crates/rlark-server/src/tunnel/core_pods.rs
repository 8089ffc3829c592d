//! The `log`, `exec` and `portforward` subresources of core `v1` Pods, the read-only view of rlark's
//! replicas that the API server serves (`rlark_apiserver::replicas`), so that `kubectl logs`
//! `kubectl exec` and `kubectl port-forward` work on replicas:
//!
//! | route | served as |
//! |---|---|
//! | `GET /api/v1/namespaces/{ns}/pods/{pod}/log` | `GET /rlark/v1/namespaces/{ns}/pods/{pod}/log` ([`super::logs`]) |
//! | `GET\|POST /api/v1/namespaces/{ns}/pods/{pod}/exec` | `/rlark/v1/namespaces/{ns}/pods/{pod}/exec` ([`super::exec`]: kubectl's remotecommand WebSocket protocol) |
//! | `GET\|POST /api/v1/namespaces/{ns}/pods/{pod}/portforward` | [`super::portforward`] (no rlark twin: SPDY/3.1 served here, TCP dialed by the agent) |
//!
//! Same identities, checks, audit and errors as the rlark routes. Two differences, both from
//! what kubectl sends: `container=main` ([`MAIN_CONTAINER`], the one container a projected
//! Pod lists, which kubectl always names) means the replica's main process or container and
//! is dropped before the request reaches the agent (a process replica has no containers);
//! and the `PodLogOptions` the agent cannot honour (`sinceSeconds`, `sinceTime`,
//! `timestamps=true`) are a 400 naming the option rather than silently ignored.
//!
//! `GET|POST /api/v1/namespaces/{ns}/pods/{pod}/portforward` is [`super::portforward`]:
//! kubectl's port-forward protocol (SPDY/3.1, over a WebSocket or an HTTP upgrade) to the
//! replica's ports through its agent.
//!
//! None of these is registered when the API server serves core Pods of its own as an extra
//! kind (`ApiServerOptions::core_pods_are_replicas` is false: a simulated member cluster).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use rlark_apiserver::error::ApiError;
use rlark_apiserver::replicas::MAIN_CONTAINER;

use super::Hub;
use super::exec::ExecState;

const LOG_ROUTE: &str = "/api/v1/namespaces/{namespace}/pods/{pod}/log";
const EXEC_ROUTE: &str = "/api/v1/namespaces/{namespace}/pods/{pod}/exec";
const PORTFORWARD_ROUTE: &str = "/api/v1/namespaces/{namespace}/pods/{pod}/portforward";

/// The routes; merged into the process router when core Pods are the replicas' view.
pub(crate) fn router(hub: Arc<Hub>, exec: ExecState) -> Router {
    Router::new()
        .route(LOG_ROUTE, get(log).with_state(hub))
        .route(
            EXEC_ROUTE,
            get(exec_route).post(exec_route).with_state(exec.clone()),
        )
        .route(
            PORTFORWARD_ROUTE,
            any(super::portforward::portforward).with_state(exec),
        )
}

/// `query` as the rlark routes take it: `container=main` dropped; `Err` names an option
/// the agent cannot honour.
fn rlark_query(query: &str) -> Result<String, String> {
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "container" if value == MAIN_CONTAINER => {}
            "sinceSeconds" | "sinceTime" if !value.is_empty() => {
                return Err(format!(
                    "{key} is not supported for replica logs: use tailLines (kubectl logs --tail)"
                ));
            }
            "timestamps" if !matches!(value, "" | "false" | "0") => {
                return Err(
                    "timestamps is not supported for replica logs: agents keep the text only"
                        .to_string(),
                );
            }
            _ => kept.push(pair),
        }
    }
    Ok(kept.join("&"))
}

/// `request` with its query rewritten by [`rlark_query`]; `Err` is the message of the 400
/// to answer.
fn rewrite(mut request: Request) -> Result<Request, String> {
    let query = rlark_query(request.uri().query().unwrap_or_default())?;
    let path = request.uri().path();
    let uri = if query.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{query}")
    };
    *request.uri_mut() = uri
        .parse()
        .map_err(|e| format!("invalid request URI: {e}"))?;
    Ok(request)
}

async fn log(state: State<Arc<Hub>>, path: Path<(String, String)>, request: Request) -> Response {
    match rewrite(request) {
        Ok(request) => super::logs::pod_log(state, path, request).await,
        Err(message) => ApiError::bad_request(message).into_response(),
    }
}

async fn exec_route(
    state: State<ExecState>,
    path: Path<(String, String)>,
    request: Request,
) -> Response {
    match rewrite(request) {
        Ok(request) => super::exec::exec(state, path, request).await,
        Err(message) => ApiError::bad_request(message).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_queries_become_rlark_queries() {
        assert_eq!(
            rlark_query("container=main&follow=true&tailLines=2").as_deref(),
            Ok("follow=true&tailLines=2")
        );
        assert_eq!(
            rlark_query("command=echo&command=hi&container=main&stdout=true&stderr=true")
                .as_deref(),
            Ok("command=echo&command=hi&stdout=true&stderr=true")
        );
        // Another container name (a docker sidecar) is passed on.
        assert_eq!(
            rlark_query("container=tb&limitBytes=5").as_deref(),
            Ok("container=tb&limitBytes=5")
        );
        assert_eq!(
            rlark_query("timestamps=false").as_deref(),
            Ok("timestamps=false")
        );
        assert!(rlark_query("sinceSeconds=10").is_err_and(|e| e.starts_with("sinceSeconds ")));
        assert!(rlark_query("timestamps=true").is_err_and(|e| e.starts_with("timestamps ")));
    }
}
