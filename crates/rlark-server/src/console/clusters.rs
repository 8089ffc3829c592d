//! `GET /rlark/v1/clusters`: clusters derived from Nodes, like RLark's `/api/v1/clusters`
//! (docs/api.md): one entry per agent namespace `rlark-<clusterID>`, with its Nodes online
//! and offline, GPUs and devices allocatable and used, and the Jobs running Tasks there.

use std::collections::{BTreeMap, BTreeSet};

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use rlark_apiserver::auth::Identity;
use rlark_apiserver::authz::{Attributes, authorize};
use rlark_apiserver::error::ApiError;
use rlark_store::ListOptions;
use serde_json::{Value, json};

use super::Console;

/// The GPU resource name.
const GPU: &str = "nvidia.com/gpu";
/// Every device plugin resource starts with this (`rlinf.io/device`, `rlinf.io/device-arm`).
const DEVICE_PREFIX: &str = "rlinf.io/device";
/// Page size of the store reads.
const PAGE: usize = 1000;

#[derive(Default)]
struct Cluster {
    total_nodes: u64,
    online_nodes: u64,
    cordoned_nodes: u64,
    gpus: (f64, f64),
    devices: (f64, f64),
    running_jobs: BTreeSet<String>,
}

fn list_attributes(resource: &str) -> Attributes {
    Attributes {
        verb: "list".into(),
        group: "rlinf.io".into(),
        resource: resource.into(),
        subresource: None,
        namespace: None,
        name: None,
    }
}

/// A quantity as a number (`"2"`, `2`, `"500m"`); 0 for anything else.
fn quantity(value: Option<&Value>) -> f64 {
    match value {
        Some(Value::Number(n)) => n.as_f64().unwrap_or(0.0),
        Some(Value::String(s)) => rlark_api::quantity::parse_quantity(s)
            .map(|q| q.to_f64())
            .unwrap_or(0.0),
        _ => 0.0,
    }
}

/// The sum of every resource under `list` whose name `matches`.
fn sum(list: Option<&Value>, matches: impl Fn(&str) -> bool) -> f64 {
    list.and_then(Value::as_object)
        .map(|o| {
            o.iter()
                .filter(|(k, _)| matches(k))
                .map(|(_, v)| quantity(Some(v)))
                .sum()
        })
        .unwrap_or(0.0)
}

async fn list_all(
    console: &Console,
    resource: &str,
) -> Result<Vec<std::sync::Arc<Value>>, ApiError> {
    let mut items = Vec::new();
    let mut options = ListOptions {
        limit: Some(PAGE),
        ..ListOptions::default()
    };
    loop {
        let page =
            console.store.list(resource, &options).await.map_err(|e| {
                ApiError::new(500, "InternalError", format!("list {resource}: {e}"))
            })?;
        items.extend(page.items);
        match page.continue_after {
            Some(key) => options.start_after = Some((key.namespace.clone(), key.name.clone())),
            None => return Ok(items),
        }
    }
}

fn cluster_of_namespace(namespace: &str) -> Option<&str> {
    namespace.strip_prefix("rlark-").filter(|id| !id.is_empty())
}

pub(crate) async fn summary(State(console): State<Console>, request: Request) -> Response {
    let Some(identity) = request.extensions().get::<Identity>().cloned() else {
        return ApiError::new(401, "Unauthorized", "Unauthorized").into_response();
    };
    for resource in ["nodes", "tasks"] {
        if let rlark_apiserver::authz::Decision::Deny(reason) =
            authorize(&identity, &list_attributes(resource))
        {
            return ApiError::new(403, "Forbidden", reason).into_response();
        }
    }
    let nodes = match list_all(&console, "nodes.rlinf.io").await {
        Ok(nodes) => nodes,
        Err(e) => return e.into_response(),
    };
    let tasks = match list_all(&console, "tasks.rlinf.io").await {
        Ok(tasks) => tasks,
        Err(e) => return e.into_response(),
    };
    let mut clusters: BTreeMap<String, Cluster> = BTreeMap::new();
    for node in &nodes {
        let namespace = node["metadata"]["namespace"].as_str().unwrap_or_default();
        let Some(id) = node["metadata"]["labels"][rlark_api::labels::CLUSTER_ID]
            .as_str()
            .or_else(|| cluster_of_namespace(namespace))
        else {
            continue;
        };
        let cluster = clusters.entry(id.to_string()).or_default();
        cluster.total_nodes += 1;
        let status = &node["status"];
        if status["phase"] == "Online" {
            cluster.online_nodes += 1;
        }
        if node["spec"]["unschedulable"] == true {
            cluster.cordoned_nodes += 1;
        }
        let is_device = |k: &str| k.starts_with(DEVICE_PREFIX);
        cluster.gpus.0 += sum(status.get("allocatable"), |k| k == GPU);
        cluster.gpus.1 += sum(status.get("used"), |k| k == GPU);
        cluster.devices.0 += sum(status.get("allocatable"), is_device);
        cluster.devices.1 += sum(status.get("used"), is_device);
    }
    for task in &tasks {
        if task["status"]["phase"] != "Running" {
            continue;
        }
        let Some(id) = task["spec"]["placement"]["clusterID"].as_str() else {
            continue;
        };
        let Some(job) = task["metadata"]["labels"][rlark_api::labels::JOB].as_str() else {
            continue;
        };
        if let Some(cluster) = clusters.get_mut(id) {
            cluster.running_jobs.insert(job.to_string());
        }
    }
    let items: Vec<Value> = clusters
        .into_iter()
        .map(|(id, c)| {
            let phase = if c.online_nodes == c.total_nodes {
                "Online"
            } else if c.online_nodes == 0 {
                "Offline"
            } else {
                "Degraded"
            };
            json!({
                "id": id,
                "namespace": format!("rlark-{id}"),
                "phase": phase,
                "totalNodes": c.total_nodes,
                "onlineNodes": c.online_nodes,
                "offlineNodes": c.total_nodes - c.online_nodes,
                "cordonedNodes": c.cordoned_nodes,
                "gpus": {"total": c.gpus.0, "used": c.gpus.1, "free": (c.gpus.0 - c.gpus.1).max(0.0)},
                "devices": {"total": c.devices.0, "used": c.devices.1, "free": (c.devices.0 - c.devices.1).max(0.0)},
                "runningJobs": c.running_jobs.len(),
            })
        })
        .collect();
    axum::Json(json!({"kind": "ClusterSummaryList", "items": items})).into_response()
}
