//! `GET /api/v1/clusters[/{cluster_id}]`: RLark's cluster view, built from rlark's Nodes
//! (and, for the running Jobs, Tasks) read through the API as the caller.
//!
//! A cluster is every Node labelled `rlark.io/cluster-id=<id>` (or, without the label, in
//! the agent namespace `rlark-<id>`). The answer is RLark's: `{"success": true, "data":
//! [ClusterInfo]}`, and for one cluster `{"success": true, "data": {ClusterInfo...,
//! "nodes": [Node]}}` (404 `{"success": false, ...}` for an unknown id). `cloudNodes`,
//! `embodiedNodes` and `robots` count the Nodes by `rlark.io/node-category` (`cloud`,
//! `edge`, `robot`); `region`, `location`, `gpuModels` and `robotModels` come from RLark's
//! node labels (`rlark.io/region`, `rlark.io/city`, `rlark.io/model`) where Nodes carry
//! them; `cpuUsage` and `gpuUsage` are the percentages of allocatable CPU and GPUs in use
//! (`status.used` over `status.allocatable`); `runningJobs` counts the Jobs with a Running
//! Task placed on the cluster.

use std::collections::{BTreeMap, BTreeSet};

use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use rlark_api::labels;
use serde_json::{Value, json};

use super::Gateway;
use super::error::GatewayError;
use super::forward::Caller;

const GPU: &str = "nvidia.com/gpu";

#[derive(Default)]
struct Cluster {
    nodes: Vec<Value>,
    online: u64,
    cloud: u64,
    edge: u64,
    robots: u64,
    gpu_models: BTreeSet<String>,
    robot_models: BTreeSet<String>,
    region: String,
    location: String,
    cpu: (f64, f64),
    gpus: (f64, f64),
    running_jobs: BTreeSet<String>,
}

fn quantity(value: &Value) -> f64 {
    match value {
        Value::Number(n) => n.as_f64().unwrap_or(0.0),
        Value::String(s) => rlark_api::quantity::parse_quantity(s)
            .map(|q| q.to_f64())
            .unwrap_or(0.0),
        _ => 0.0,
    }
}

fn percent(used: f64, total: f64) -> u64 {
    if total > 0.0 {
        ((used / total) * 100.0).round().clamp(0.0, 100.0) as u64
    } else {
        0
    }
}

/// The cluster id of a Node: its label, else its agent namespace's suffix.
fn cluster_of(node: &Value) -> Option<String> {
    let metadata = &node["metadata"];
    metadata["labels"][labels::CLUSTER_ID]
        .as_str()
        .or_else(|| {
            metadata["namespace"]
                .as_str()
                .and_then(|ns| ns.strip_prefix("rlark-"))
        })
        .filter(|id| !id.is_empty())
        .map(str::to_string)
}

fn items(list: Value) -> Vec<Value> {
    match list {
        Value::Object(mut o) => match o.remove("items") {
            Some(Value::Array(items)) => items,
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

impl Cluster {
    fn add(&mut self, node: Value) {
        let labels = &node["metadata"]["labels"];
        let label = |key: &str| labels[key].as_str().unwrap_or_default().to_string();
        if node["status"]["phase"] == "Online" {
            self.online += 1;
        }
        let model = label("rlark.io/model");
        match labels[labels::NODE_CATEGORY].as_str() {
            Some("cloud") => {
                self.cloud += 1;
                if !model.is_empty() {
                    self.gpu_models.insert(model);
                }
            }
            Some("edge") => self.edge += 1,
            Some("robot") => {
                self.robots += 1;
                if !model.is_empty() {
                    self.robot_models.insert(model);
                }
            }
            _ => {}
        }
        if self.region.is_empty() {
            self.region = label("rlark.io/region");
        }
        if self.location.is_empty() {
            self.location = node["metadata"]["annotations"]["rlark.io/city"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| label("rlark.io/city"));
        }
        let status = &node["status"];
        self.cpu.0 += quantity(&status["allocatable"]["cpu"]);
        self.cpu.1 += quantity(&status["used"]["cpu"]);
        self.gpus.0 += quantity(&status["allocatable"][GPU]);
        self.gpus.1 += quantity(&status["used"][GPU]);
        self.nodes.push(node);
    }

    fn info(&self, id: &str) -> Value {
        let total = self.nodes.len() as u64;
        let phase = if total == 0 || self.online == 0 {
            "Offline"
        } else if self.online == total {
            "Online"
        } else {
            "Degraded"
        };
        let kind = match (self.cloud > 0, self.edge + self.robots > 0) {
            (true, false) => "Cloud",
            (false, true) => "Embodied",
            _ => "Hybrid",
        };
        json!({
            "id": id,
            "name": id,
            "type": kind,
            "region": self.region,
            "location": self.location,
            "phase": phase,
            "totalNodes": total,
            "onlineNodes": self.online,
            "offlineNodes": total - self.online,
            "cloudNodes": self.cloud,
            "embodiedNodes": self.edge,
            "robots": self.robots,
            "gpuModels": self.gpu_models,
            "robotModels": self.robot_models,
            "cpuUsage": percent(self.cpu.1, self.cpu.0),
            "gpuUsage": percent(self.gpus.1, self.gpus.0),
            "robotUsage": 0,
            "runningJobs": self.running_jobs.len(),
            "description": "",
        })
    }
}

impl Gateway {
    async fn clusters(&self, caller: &Caller) -> Result<BTreeMap<String, Cluster>, GatewayError> {
        let nodes = items(
            self.backend
                .get(caller, "/apis/rlinf.io/v1alpha1/nodes")
                .await?,
        );
        let tasks = items(
            self.backend
                .get(caller, "/apis/rlinf.io/v1alpha1/tasks")
                .await?,
        );
        let mut clusters: BTreeMap<String, Cluster> = BTreeMap::new();
        for node in nodes {
            if let Some(id) = cluster_of(&node) {
                clusters.entry(id).or_default().add(node);
            }
        }
        for task in &tasks {
            if task["status"]["phase"] != "Running" {
                continue;
            }
            let (Some(id), Some(job)) = (
                task["spec"]["placement"]["clusterID"].as_str(),
                task["metadata"]["labels"][labels::JOB].as_str(),
            ) else {
                continue;
            };
            if let Some(cluster) = clusters.get_mut(id) {
                cluster.running_jobs.insert(job.to_string());
            }
        }
        Ok(clusters)
    }
}

/// `GET /api/v1/clusters`.
pub(crate) async fn list(
    State(gateway): State<Gateway>,
    request: Request,
) -> Result<Response, GatewayError> {
    let caller = Caller::of(request.extensions())?;
    let clusters = gateway.clusters(&caller).await?;
    let data: Vec<Value> = clusters.iter().map(|(id, c)| c.info(id)).collect();
    Ok(axum::Json(json!({"success": true, "data": data})).into_response())
}

/// `GET /api/v1/clusters/{cluster_id}`.
pub(crate) async fn get(
    State(gateway): State<Gateway>,
    Path(id): Path<String>,
    request: Request,
) -> Result<Response, GatewayError> {
    let caller = Caller::of(request.extensions())?;
    let mut clusters = gateway.clusters(&caller).await?;
    let Some(cluster) = clusters.remove(&id) else {
        return Err(GatewayError::NotFound(format!("cluster {id:?} not found")));
    };
    let mut data = cluster.info(&id);
    data["nodes"] = Value::Array(cluster.nodes);
    Ok(axum::Json(json!({"success": true, "data": data})).into_response())
}
