//! `POST /rlark/v1/namespaces/{ns}/tasks/{name}/netcheck`: open a test connection from one
//! replica of a Domain task to another member and report the path the source agent took
//! (`local`, `direct` or `relay`) and how long the connection took to set up
//! (`rlark net check`; issue 16 §4).
//!
//! **Who**: admins only (it makes an agent open connections).
//!
//! **Request body** (JSON):
//!
//! | field | meaning |
//! |---|---|
//! | `replica` | the source replica index (default 0): the Pod `<name>-<replica>` |
//! | `to` | the destination: a virtual IP (`"10.8.0.3"`), or `{"task", "namespace", "replica"}` (replica default 0), resolved to its address in a Domain the source replica is in |
//! | `port` | optional destination port (1..=65535); without it the agent probes the member (authorization and membership, no payload) |
//!
//! **How**: the namespace names the source cluster (`rlark-<clusterID>`). The Task must exist
//! and have the replica. The hub opens an `agent-api` stream to that cluster's agent (the
//! session of the source Pod's node preferred) and sends `POST /v1/net/check` with
//! `{"pod": "<name>-<replica>", "to": "<ip>", "port": p}` (port omitted when not given).
//! The agent answers `200 {"path": "local|direct|relay", "setupMicros": n}`, or an error
//! status with a JSON object whose `message` (or `error`) says why; a `200` that carries
//! `error` is a failed check too.
//!
//! **Answer**: `200 {"kind": "NetCheck", "from": {"namespace", "pod"}, "to": {"ip", "port"},
//! "path", "setupMicros"}`; errors as Kubernetes `Status` objects: 400 for a bad body or an
//! unresolvable destination, 404 for a missing Task, 502 for a check that failed at the agent
//! or a tunnel failure (with the agent's reason), 403 for non-admins.

use std::net::IpAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::{StatusCode, header};
use hyper_util::rt::TokioIo;
use rlark_apiserver::auth::{Identity, Role};
use rlark_apiserver::error::ApiError;
use rlark_store::{ObjectKey, Store};
use serde_json::{Value, json};

use super::Hub;

/// The route, as registered.
pub(crate) const ROUTE: &str = "/rlark/v1/namespaces/{namespace}/tasks/{name}/netcheck";
/// The agent API path of the check.
pub const AGENT_PATH: &str = "/v1/net/check";
/// Store resource of Tasks.
const TASKS: &str = "tasks.rlinf.io";
/// Largest request body read.
const MAX_BODY: usize = 16 * 1024;
/// Largest agent answer read.
const MAX_ANSWER: usize = 64 * 1024;

/// State of the route.
#[derive(Clone)]
pub(crate) struct NetCheckState {
    hub: Arc<Hub>,
    store: Arc<dyn Store>,
}

impl NetCheckState {
    pub(crate) fn new(hub: Arc<Hub>, store: Arc<dyn Store>) -> Self {
        Self { hub, store }
    }
}

/// The route; merged into the process router.
pub(crate) fn router(state: NetCheckState) -> Router {
    Router::new().route(ROUTE, post(netcheck)).with_state(state)
}

/// The destination as the request names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum To {
    Ip(IpAddr),
    Replica {
        namespace: String,
        task: String,
        replica: u32,
    },
}

/// A parsed request body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CheckRequest {
    pub replica: u32,
    pub to: To,
    pub port: Option<u16>,
}

fn replica_of(value: Option<&Value>, field: &str) -> Result<u32, String> {
    match value {
        None | Some(Value::Null) => Ok(0),
        Some(value) => value
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| format!("{field} must be a replica index (0 or more), not {value}")),
    }
}

/// Parses and checks the body; the error names the field.
pub(crate) fn parse_request(body: &[u8]) -> Result<CheckRequest, String> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    let Value::Object(fields) = &value else {
        return Err("the body must be a JSON object".to_owned());
    };
    if let Some(unknown) = fields
        .keys()
        .find(|k| !matches!(k.as_str(), "replica" | "to" | "port"))
    {
        return Err(format!(
            "unknown field {unknown:?} (known: replica, to, port)"
        ));
    }
    let replica = replica_of(fields.get("replica"), "replica")?;
    let port = match fields.get("port") {
        None | Some(Value::Null) => None,
        Some(value) => Some(
            value
                .as_u64()
                .and_then(|p| u16::try_from(p).ok())
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("port must be 1..=65535, not {value}"))?,
        ),
    };
    let to = match fields.get("to") {
        None | Some(Value::Null) => {
            return Err("to is required: an IP address or {task, namespace, replica}".to_owned());
        }
        Some(Value::String(ip)) => To::Ip(
            ip.parse()
                .map_err(|_| format!("to {ip:?} is not an IP address"))?,
        ),
        Some(Value::Object(to)) => {
            if let Some(unknown) = to
                .keys()
                .find(|k| !matches!(k.as_str(), "task" | "namespace" | "replica"))
            {
                return Err(format!(
                    "unknown field to.{unknown} (known: task, namespace, replica)"
                ));
            }
            let text = |name: &str| {
                to.get(name)
                    .and_then(Value::as_str)
                    .filter(|s| valid_name(s))
                    .map(str::to_owned)
                    .ok_or_else(|| {
                        format!("to.{name} must be a name (lowercase letters, digits, '-', '.')")
                    })
            };
            To::Replica {
                task: text("task")?,
                namespace: text("namespace")?,
                replica: replica_of(to.get("replica"), "to.replica")?,
            }
        }
        Some(other) => {
            return Err(format!(
                "to must be an IP address string or {{task, namespace, replica}}, not {other}"
            ));
        }
    };
    Ok(CheckRequest { replica, to, port })
}

fn valid_name(name: &str) -> bool {
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

/// The replica count of a Task object (`spec.raw.replicas`, `spec.kubernetes.workload.replicas`,
/// else 1).
fn replicas(task: &Value) -> i64 {
    task.pointer("/spec/raw")
        .map(|raw| raw.get("replicas").and_then(Value::as_i64).unwrap_or(1))
        .or_else(|| {
            task.pointer("/spec/kubernetes").map(|k| {
                k.pointer("/workload/replicas")
                    .and_then(Value::as_i64)
                    .unwrap_or(1)
            })
        })
        .unwrap_or(1)
}

fn bad_gateway(message: String) -> Response {
    ApiError::new(502, "BadGateway", message).into_response()
}

async fn netcheck(
    State(state): State<NetCheckState>,
    Path((namespace, name)): Path<(String, String)>,
    request: Request,
) -> Response {
    let Some(identity) = request.extensions().get::<Identity>().cloned() else {
        return ApiError::unauthorized().into_response();
    };
    if identity.role() != Role::Admin {
        return ApiError::new(
            403,
            "Forbidden",
            format!(
                "forbidden: User \"{}\" cannot create tasks/netcheck in namespace \
                 \"{namespace}\" (admins only)",
                identity.user
            ),
        )
        .into_response();
    }
    let Some(cluster) = namespace
        .strip_prefix("rlark-")
        .filter(|c| crate::security::validate_cluster_id(c).is_ok())
        .map(str::to_owned)
    else {
        return ApiError::bad_request(format!(
            "namespace {namespace:?} is not an agent namespace: a replica runs on the agent of \
             a cluster, so the namespace must be rlark-<clusterID>"
        ))
        .into_response();
    };
    if !valid_name(&name) {
        return ApiError::bad_request(format!("invalid task name {name:?}")).into_response();
    }
    let body = match axum::body::to_bytes(request.into_body(), MAX_BODY).await {
        Ok(body) => body,
        Err(error) => {
            return ApiError::bad_request(format!(
                "read the body (at most {MAX_BODY} bytes): {error}"
            ))
            .into_response();
        }
    };
    let check = match parse_request(&body) {
        Ok(check) => check,
        Err(message) => return ApiError::bad_request(message).into_response(),
    };
    let task = match state
        .store
        .get(&ObjectKey::new(TASKS, namespace.as_str(), name.as_str()))
        .await
    {
        Ok(Some(task)) => task,
        Ok(None) => {
            return ApiError::new(
                404,
                "NotFound",
                format!("{TASKS} \"{name}\" not found in {namespace}"),
            )
            .into_response();
        }
        Err(error) => {
            return ApiError::new(
                500,
                "InternalError",
                format!("read task {namespace}/{name}: {error}"),
            )
            .into_response();
        }
    };
    let count = replicas(&task);
    if i64::from(check.replica) >= count {
        return ApiError::bad_request(format!(
            "task {namespace}/{name} has {count} replica(s): replica {} does not exist",
            check.replica
        ))
        .into_response();
    }
    let pod = format!("{name}-{}", check.replica);
    let to = match &check.to {
        To::Ip(ip) => *ip,
        To::Replica {
            namespace: to_namespace,
            task: to_task,
            replica,
        } => {
            let to_pod = format!("{to_task}-{replica}");
            match state
                .hub
                .relay()
                .index
                .address_of((&namespace, &pod), (to_namespace, &to_pod))
            {
                Ok(ip) => ip,
                Err(message) => return ApiError::bad_request(message).into_response(),
            }
        }
    };
    let node = state
        .hub
        .relay()
        .node_of(&(namespace.clone(), pod.clone()))
        .await;
    let stream = match state.hub.dial_agent_api(&cluster, node.as_deref()).await {
        Ok(stream) => stream,
        Err(error) => return super::logs::tunnel_error(&cluster, &error),
    };
    let what = format!("net check from {namespace}/{pod} to {to}");
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(pair) => pair,
        Err(error) => return bad_gateway(format!("{what}: {error}")),
    };
    let conn = tokio::spawn(async move {
        if let Err(error) = conn.await {
            tracing::debug!(%error, "agent API connection ended");
        }
    });
    let mut agent_body = json!({"pod": pod, "to": to.to_string()});
    if let Some(port) = check.port {
        agent_body["port"] = json!(port);
    }
    let out = match http::Request::post(AGENT_PATH)
        .header(header::HOST, "agent")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(agent_body.to_string()))
    {
        Ok(out) => out,
        Err(error) => return ApiError::bad_request(error.to_string()).into_response(),
    };
    // The check includes a connection setup bounded by the agent; allow it the tunnel's
    // dial timeout plus a margin for the answer.
    let deadline = state.hub.config().dial_timeout + std::time::Duration::from_secs(5);
    let exchange = async {
        let response = sender.send_request(out).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let bytes = axum::body::to_bytes(Body::new(response.into_body()), MAX_ANSWER)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>((status, bytes))
    };
    let result = tokio::time::timeout(deadline, exchange).await;
    conn.abort();
    let (status, bytes) = match result {
        Ok(Ok(answer)) => answer,
        Ok(Err(error)) => return bad_gateway(format!("{what}: {error}")),
        Err(_) => {
            return bad_gateway(format!(
                "{what}: the agent of cluster {cluster:?} did not answer within {deadline:?}"
            ));
        }
    };
    match interpret(status, &bytes) {
        Ok((path, setup_micros)) => axum::Json(json!({
            "kind": "NetCheck",
            "apiVersion": "rlark/v1",
            "from": {"namespace": namespace, "pod": pod},
            "to": {"ip": to.to_string(), "port": check.port},
            "path": path,
            "setupMicros": setup_micros,
        }))
        .into_response(),
        Err((code, message)) => {
            let message = format!("{what}: {message}");
            match code {
                400 => ApiError::bad_request(message).into_response(),
                404 => ApiError::new(404, "NotFound", message).into_response(),
                _ => bad_gateway(message),
            }
        }
    }
}

/// Reads the agent's answer: `(path, setupMicros)`, or the status to answer and why.
pub(crate) fn interpret(status: StatusCode, body: &[u8]) -> Result<(String, u64), (u16, String)> {
    let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let reason = |value: &Value| {
        let text = |v: &Value| v.as_str().map(str::to_owned);
        value.get("message").and_then(text).or_else(|| {
            value
                .get("error")
                .and_then(|e| text(e).or_else(|| e.get("message").and_then(text)))
        })
    };
    if status != StatusCode::OK {
        let message = reason(&value)
            .or_else(|| {
                let text = String::from_utf8_lossy(body).trim().to_owned();
                (!text.is_empty()).then_some(text)
            })
            .unwrap_or_else(|| format!("the agent answered {status}"));
        let code = match status.as_u16() {
            400 => 400,
            404 => 404,
            _ => 502,
        };
        return Err((code, message));
    }
    if value.get("error").is_some_and(|e| !e.is_null()) {
        return Err((
            502,
            reason(&value).unwrap_or_else(|| value["error"].to_string()),
        ));
    }
    let path = value
        .get("path")
        .and_then(Value::as_str)
        .filter(|p| matches!(*p, "local" | "direct" | "relay"))
        .ok_or_else(|| {
            (
                502,
                format!("the agent's answer has no path (local, direct or relay): {value}"),
            )
        })?;
    let setup = value
        .get("setupMicros")
        .and_then(Value::as_u64)
        .ok_or_else(|| {
            (
                502,
                format!("the agent's answer has no setupMicros: {value}"),
            )
        })?;
    Ok((path.to_owned(), setup))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_name_the_bad_field() {
        assert_eq!(
            parse_request(br#"{"to": "10.8.0.3"}"#),
            Ok(CheckRequest {
                replica: 0,
                to: To::Ip("10.8.0.3".parse().unwrap()),
                port: None
            })
        );
        assert_eq!(
            parse_request(
                br#"{"replica": 2, "to": {"task": "j-h", "namespace": "rlark-b"}, "port": 8080}"#
            ),
            Ok(CheckRequest {
                replica: 2,
                to: To::Replica {
                    namespace: "rlark-b".into(),
                    task: "j-h".into(),
                    replica: 0
                },
                port: Some(8080)
            })
        );
        for (body, field) in [
            (&b"nope"[..], "not JSON"),
            (b"[]", "JSON object"),
            (br#"{}"#, "to is required"),
            (br#"{"to": "10.8.0"}"#, "to \"10.8.0\""),
            (br#"{"to": 5}"#, "to must be"),
            (br#"{"to": "10.8.0.3", "port": 0}"#, "port"),
            (br#"{"to": "10.8.0.3", "port": 70000}"#, "port"),
            (br#"{"to": "10.8.0.3", "replica": -1}"#, "replica"),
            (br#"{"to": "10.8.0.3", "extra": 1}"#, "\"extra\""),
            (br#"{"to": {"task": "B"}}"#, "to.task"),
            (br#"{"to": {"task": "b"}}"#, "to.namespace"),
            (
                br#"{"to": {"task": "b", "namespace": "n", "replica": "x"}}"#,
                "to.replica",
            ),
            (
                br#"{"to": {"task": "b", "namespace": "n", "x": 1}}"#,
                "to.x",
            ),
        ] {
            let error = parse_request(body).unwrap_err();
            assert!(
                error.contains(field),
                "{}: {error}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn agent_answers_are_interpreted() {
        let ok = StatusCode::OK;
        assert_eq!(
            interpret(ok, br#"{"path": "relay", "setupMicros": 1500}"#),
            Ok(("relay".into(), 1500))
        );
        assert_eq!(
            interpret(ok, br#"{"error": "connection refused"}"#),
            Err((502, "connection refused".into()))
        );
        assert_eq!(
            interpret(ok, br#"{"error": {"message": "forbidden by b"}}"#),
            Err((502, "forbidden by b".into()))
        );
        assert!(interpret(ok, br#"{"path": "teleport", "setupMicros": 1}"#).is_err());
        assert!(interpret(ok, br#"{"path": "local"}"#).is_err());
        assert_eq!(
            interpret(StatusCode::NOT_FOUND, br#"{"message": "no pod j-w-7"}"#),
            Err((404, "no pod j-w-7".into()))
        );
        assert_eq!(
            interpret(StatusCode::BAD_REQUEST, b"plain text"),
            Err((400, "plain text".into()))
        );
        assert_eq!(
            interpret(StatusCode::INTERNAL_SERVER_ERROR, b""),
            Err((502, "the agent answered 500 Internal Server Error".into()))
        );
    }

    #[test]
    fn replica_counts() {
        assert_eq!(replicas(&json!({"spec": {"raw": {"replicas": 3}}})), 3);
        assert_eq!(replicas(&json!({"spec": {"raw": {}}})), 1);
        assert_eq!(
            replicas(&json!({"spec": {"kubernetes": {"workload": {"replicas": 2}}}})),
            2
        );
        assert_eq!(replicas(&json!({"spec": {}})), 1);
    }
}
