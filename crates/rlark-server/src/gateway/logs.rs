//! A Job's logs and a Pod's events, as RLark's console reads them (`Jobs.tsx`).
//!
//! `GET /api/v1/rlinf.io/v1alpha1/jobs/{name}/logs` answers `{"pods": [{taskName, podName,
//! phase, node, logs, namespace, name}]}`: every Pod of every Task of the Job (Tasks by
//! label `rlinf.io/job`, Pods by `rlark.io/task-name`, as `rlark logs job/NAME`), with the
//! last 1000 lines of each replica that ran, read through rlark's replica log route
//! (`/rlark/v1/namespaces/{ns}/pods/{pod}/log`, from the agent of the Pod's cluster) as the
//! caller. A Pod that has not run says so in `logs`; a Pod whose log cannot be read carries
//! the reason there (`error fetching logs: ...`), as RLark's gateway does.
//!
//! `GET /api/v1/rlinf.io/v1alpha1/pods/{name}/events` answers `{"events": [{type, reason,
//! message, lastTime, count, source, objectKind, objectName}]}`: the core Events rlark
//! recorded about the Pod (`involvedObject.name`), in RLark's NodeEvent shape.

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use http::Method;
use rlark_api::agent::local::percent_encode;
use rlark_api::labels;
use serde_json::{Value, json};

use super::Gateway;
use super::error::GatewayError;
use super::forward::{Caller, upstream_error};
use super::resources::{check_name, kind};

/// Lines of each replica's log (RLark's gateway reads as many).
const TAIL_LINES: u32 = 1000;
/// Largest log read per replica.
const MAX_LOG: usize = 8 * 1024 * 1024;

fn items(list: &Value) -> &[Value] {
    list["items"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_string()
}

impl Gateway {
    /// The last lines of replica `namespace/pod`, or why not.
    async fn replica_log(&self, caller: &Caller, namespace: &str, pod: &str) -> String {
        let uri = format!("/rlark/v1/namespaces/{namespace}/pods/{pod}/log?tail={TAIL_LINES}");
        let response = match self
            .backend
            .send(caller, Method::GET, &uri, None, Body::empty())
            .await
        {
            Ok(response) => response,
            Err(error) => return format!("error fetching logs: {error}"),
        };
        if !response.status().is_success() {
            return format!("error fetching logs: {}", upstream_error(response).await);
        }
        match axum::body::to_bytes(response.into_body(), MAX_LOG).await {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(error) => format!("error fetching logs: {error}"),
        }
    }
}

/// `GET /api/v1/rlinf.io/v1alpha1/jobs/{name}/logs`.
pub(crate) async fn job_logs(
    State(gateway): State<Gateway>,
    Path(job): Path<String>,
    request: Request,
) -> Result<Response, GatewayError> {
    let caller = Caller::of(request.extensions())?;
    check_name("job name", &job)?;
    // The Job itself first: an unknown Job is a 404, not an empty list.
    gateway
        .backend
        .get(&caller, &format!("/apis/rlinf.io/v1alpha1/jobs/{job}"))
        .await?;
    let tasks = gateway
        .backend
        .get(
            &caller,
            &format!(
                "/apis/rlinf.io/v1alpha1/tasks?labelSelector={}",
                percent_encode(&format!("{}={job}", labels::JOB))
            ),
        )
        .await?;
    let mut pods = Vec::new();
    for task in items(&tasks) {
        let namespace = text(&task["metadata"]["namespace"]);
        let task_name = text(&task["metadata"]["name"]);
        let list = gateway
            .backend
            .get(
                &caller,
                &format!(
                    "/apis/rlinf.io/v1alpha1/namespaces/{namespace}/pods?labelSelector={}",
                    percent_encode(&format!("{}={task_name}", labels::TASK_NAME))
                ),
            )
            .await?;
        for pod in items(&list) {
            let name = text(&pod["metadata"]["name"]);
            let phase = text(&pod["status"]["phase"]);
            let logs = if matches!(phase.as_str(), "Running" | "Succeeded" | "Failed") {
                gateway.replica_log(&caller, &namespace, &name).await
            } else {
                let phase = if phase.is_empty() { "Pending" } else { &phase };
                format!("pod is {phase}, no logs available")
            };
            let pod_name = pod["spec"]["podName"]
                .as_str()
                .filter(|n| !n.is_empty())
                .map_or_else(|| name.clone(), str::to_string);
            pods.push(json!({
                "taskName": task_name,
                "podName": pod_name,
                "phase": phase,
                "node": text(&pod["status"]["node"]),
                "logs": logs,
                "namespace": namespace,
                "name": name,
            }));
        }
    }
    Ok(axum::Json(json!({"pods": pods})).into_response())
}

/// One core Event in RLark's NodeEvent shape.
fn node_event(event: &Value) -> Value {
    let last = ["lastTimestamp", "eventTime", "firstTimestamp"]
        .iter()
        .find_map(|field| event[*field].as_str().filter(|t| !t.is_empty()))
        .unwrap_or_default();
    json!({
        "type": text(&event["type"]),
        "reason": text(&event["reason"]),
        "message": text(&event["message"]),
        "lastTime": last,
        "count": event["count"].as_i64().unwrap_or(1),
        "source": event["source"]["component"].as_str()
            .or_else(|| event["reportingComponent"].as_str())
            .unwrap_or_default(),
        "objectKind": text(&event["involvedObject"]["kind"]),
        "objectName": text(&event["involvedObject"]["name"]),
    })
}

/// `GET /api/v1/rlinf.io/v1alpha1/pods/{name}/events[?namespace=]`.
pub(crate) async fn pod_events(
    State(gateway): State<Gateway>,
    Path(pod): Path<String>,
    request: Request,
) -> Result<Response, GatewayError> {
    let caller = Caller::of(request.extensions())?;
    check_name("pod name", &pod)?;
    let given = request
        .uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| pair.strip_prefix("namespace="))
        .filter(|ns| !ns.is_empty())
        .map(str::to_string);
    let namespace = match given {
        Some(ns) => {
            check_name("namespace", &ns)?;
            ns
        }
        None => gateway.locate(&caller, kind("pods")?, &pod).await?,
    };
    let list = gateway
        .backend
        .get(
            &caller,
            &format!(
                "/api/v1/namespaces/{namespace}/events?fieldSelector={}",
                percent_encode(&format!("involvedObject.name={pod}"))
            ),
        )
        .await?;
    let events: Vec<Value> = items(&list)
        .iter()
        .filter(|e| {
            let kind = e["involvedObject"]["kind"].as_str().unwrap_or("Pod");
            kind == "Pod"
        })
        .map(node_event)
        .collect();
    Ok(axum::Json(json!({"events": events})).into_response())
}
