//! `rlark-sim`: the simulated agent and the network-namespace topology, for `rlark-bench`
//! and tests. It owns [`SimAgent`] (below) and [`topology`] (a server and agents each in
//! their own network namespace on one bridge). It may depend on the agent, the API and the
//! tunnel; nothing in the product (`rlark`, the server, the agent) may depend on it, which
//! CI checks with `cargo tree` (scripts/test.sh).
//!
//! A simulated agent for `rlark bench` and tests: it speaks the agent protocol to the
//! control plane exactly as a real agent does (`docs/concepts.md`, "Agent protocol"), but
//! runs no process: each replica's simulated process plays the Task's scripted
//! [`Behaviour`] instead. Everything the protocol fixes — names, annotations, reasons, the
//! Node description, the Pod status of each transition, and what happens to a replica
//! (restart policy and backoff, deadline, stop) — comes from `rlark_api::agent`, the same
//! module the real agent and the Task controller use.
//!
//! What it does, for cluster `C` (namespace `rlark-C`, created when missing):
//! - registers one `Node` per simulated machine ([`SimNode`], as a
//!   `rlark_api::agent::NodeDescription`) and renews a heartbeat every
//!   [`SimAgentBuilder::heartbeat_interval`]: the Lease `node-<name>` and/or
//!   `Node.status.heartbeatTime` ([`HeartbeatMode`]);
//! - watches the `Task`s of its namespace; for a Task placed on its cluster
//!   (`spec.placement.clusterID == C`) it creates one `Pod` per replica
//!   (`rlark_api::agent::replica_pod`), reports it `Running` on `placement.nodes[index]`
//!   (`Pending` first with a [`SimAgentBuilder::start_delay`]); each replica's process
//!   runs for the behaviour's time and exits with its code, and the protocol's replica
//!   state machine (`rlark_api::agent::replica`) decides the rest: `Succeeded`/`Failed`,
//!   or a restart after a backoff as `raw.restartPolicy` says, a kill at
//!   `raw.activeDeadlineSeconds`;
//! - `spec.stopped: true` on a Task kills its running replicas (they exit at once on
//!   SIGTERM, [`STOPPED_EXIT_CODE`]) and they end `Failed` with reason `Stopped`; clearing
//!   it again starts a fresh run;
//! - a new run (new Task UID, a changed `rlark.io/restarted-at` annotation, a changed
//!   placement, or a resume) deletes the Task's old Pods and creates new ones;
//! - a deleted Task has its Pods deleted.
//!
//! [`SimAgent::stop`] ends all of it (heartbeats and watches stop, as when a real agent
//! dies); Pods are left as they are. A simulated agent started again adopts the Pods of its
//! runs (their `rlark.io/run-key` annotation) instead of running finished replicas again.
//!
//! It needs only a `kube::Client` allowed to write its namespace's Nodes, Leases and Pods
//! (an admin's, or the agent identity of cluster `C`): no data directory, no supervisor.
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use rlark_sim::{Behaviour, SimAgent, SimNode};
//! let agent = SimAgent::builder("gpu")
//!     .node(SimNode::new("gpu-0").resource("nvidia.com/gpu", "2").resource("cpu", "16"))
//!     .behaviour("train-*", Behaviour::succeed_after(Duration::from_millis(200)))
//!     .behaviour("train-eval", Behaviour::fail_after(Duration::ZERO, 3))
//!     .start(client)
//!     .await?;
//! // ...
//! agent.stop().await?;
//! # Ok(()) }
//! ```

// The zero-unwrap discipline as a rule, as in the product crates.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod behaviour;
mod node;
mod runs;
pub mod topology;

pub use behaviour::{Behaviour, Behaviours};
pub use node::SimNode;

/// Exit code of a simulated process killed by SIGTERM (128 + 15): a replica ended by
/// `spec.stopped` or at its deadline reports it. A simulated process exits at once on
/// SIGTERM, so the grace period is never used up.
pub const STOPPED_EXIT_CODE: i32 = 143;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use rlark_api::types::{Node, NodePhase, NodeStatus, Pod, ResourceList};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Errors of the simulated agent, named by the failed step.
#[derive(Debug, thiserror::Error)]
pub enum SimAgentError {
    #[error("cluster id {0:?} is not a DNS-1123 label")]
    InvalidClusterId(String),
    #[error("create namespace {namespace}: {source}")]
    CreateNamespace {
        namespace: String,
        source: kube::Error,
    },
    #[error("register node {node}: {source}")]
    RegisterNode { node: String, source: kube::Error },
    #[error("update node {node}: {source}")]
    UpdateNode { node: String, source: kube::Error },
    #[error("write heartbeat lease of node {node}: {source}")]
    Lease { node: String, source: kube::Error },
    #[error("node {0} is not a node of this agent")]
    UnknownNode(String),
    #[error("node {0} is already a node of this agent")]
    DuplicateNode(String),
    #[error("agent task failed: {0}")]
    Join(String),
}

/// Which heartbeat the agent renews.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeartbeatMode {
    /// Lease `node-<name>` only.
    Lease,
    /// `Node.status.heartbeatTime` only.
    Status,
    /// Both (the default).
    Both,
}

/// Builder of a [`SimAgent`].
#[derive(Clone, Debug)]
pub struct SimAgentBuilder {
    cluster_id: String,
    nodes: Vec<SimNode>,
    behaviours: Behaviours,
    heartbeat_interval: Duration,
    lease_duration: Duration,
    heartbeat_mode: HeartbeatMode,
    run_tasks: bool,
    start_delay: Duration,
}

impl SimAgentBuilder {
    /// Add a machine.
    pub fn node(mut self, node: SimNode) -> Self {
        self.nodes.push(node);
        self
    }

    /// Behaviour of Tasks named `pattern` (exact, or a prefix when it ends in `*`).
    pub fn behaviour(mut self, pattern: &str, behaviour: Behaviour) -> Self {
        self.behaviours.set(pattern, behaviour);
        self
    }

    /// Behaviour of Tasks no pattern matches (default: succeed at once).
    pub fn default_behaviour(mut self, behaviour: Behaviour) -> Self {
        self.behaviours.set_default(behaviour);
        self
    }

    /// How often heartbeats are renewed (default 1 s).
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = interval;
        self
    }

    /// `leaseDurationSeconds` of the heartbeat Leases (default 40 s; rounded up to seconds).
    pub fn lease_duration(mut self, duration: Duration) -> Self {
        self.lease_duration = duration;
        self
    }

    /// Which heartbeat to renew (default both).
    pub fn heartbeat_mode(mut self, mode: HeartbeatMode) -> Self {
        self.heartbeat_mode = mode;
        self
    }

    /// Whether to run Tasks at all (default true). With false the agent only registers its
    /// Nodes and heartbeats, e.g. to measure placement alone.
    pub fn run_tasks(mut self, run: bool) -> Self {
        self.run_tasks = run;
        self
    }

    /// Time between creating a replica's Pod (`Pending`) and reporting it `Running`
    /// (default 0: reported `Running` at once).
    pub fn start_delay(mut self, delay: Duration) -> Self {
        self.start_delay = delay;
        self
    }

    /// Register the Nodes (namespace, Node, status, Lease) and start heartbeats and the
    /// Task watch. Returns once the Nodes are registered `Online`.
    pub async fn start(self, client: kube::Client) -> Result<SimAgent, SimAgentError> {
        if rlark_api::names::dns1123_label(&self.cluster_id).is_err() {
            return Err(SimAgentError::InvalidClusterId(self.cluster_id));
        }
        let namespace = rlark_api::names::agent_namespace(&self.cluster_id);
        let shared = Arc::new(Shared {
            client: client.clone(),
            cluster_id: self.cluster_id.clone(),
            namespace: namespace.clone(),
            nodes: Mutex::new(Vec::new()),
            paused_nodes: Mutex::new(HashSet::new()),
            heartbeats_paused: AtomicBool::new(false),
            behaviours: Mutex::new(self.behaviours),
            lease_duration_seconds: i32::try_from(self.lease_duration.as_secs_f64().ceil() as u64)
                .unwrap_or(i32::MAX)
                .max(1),
            heartbeat_mode: self.heartbeat_mode,
            start_delay: self.start_delay,
            runs_started: AtomicUsize::new(0),
            run_log: Mutex::new(Vec::new()),
        });
        ensure_namespace(&client, &namespace).await?;
        for node in self.nodes {
            shared.add_node(node).await?;
        }
        let shutdown = CancellationToken::new();
        let mut tasks = Vec::new();
        tasks.push(tokio::spawn(heartbeat_loop(
            shared.clone(),
            self.heartbeat_interval,
            shutdown.clone(),
        )));
        if self.run_tasks {
            tasks.push(tokio::spawn(runs::task_loop(
                shared.clone(),
                shutdown.clone(),
            )));
        }
        Ok(SimAgent {
            shared,
            shutdown,
            tasks,
        })
    }
}

/// State shared by the agent's loops and its handle.
struct Shared {
    client: kube::Client,
    cluster_id: String,
    namespace: String,
    nodes: Mutex<Vec<SimNode>>,
    paused_nodes: Mutex<HashSet<String>>,
    heartbeats_paused: AtomicBool,
    behaviours: Mutex<Behaviours>,
    lease_duration_seconds: i32,
    heartbeat_mode: HeartbeatMode,
    start_delay: Duration,
    runs_started: AtomicUsize,
    run_log: Mutex<Vec<String>>,
}

/// Lock a mutex, ignoring poisoning: every critical section here only moves plain data, so
/// a panic inside one cannot leave it half-updated.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    fn nodes_api(&self) -> Api<Node> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn pods_api(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn leases_api(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    async fn add_node(&self, node: SimNode) -> Result<(), SimAgentError> {
        if lock(&self.nodes).iter().any(|n| n.name == node.name) {
            return Err(SimAgentError::DuplicateNode(node.name));
        }
        self.register(&node).await?;
        lock(&self.nodes).push(node);
        Ok(())
    }

    /// Create or update the Node, report its status, write its Lease.
    async fn register(&self, node: &SimNode) -> Result<(), SimAgentError> {
        let api = self.nodes_api();
        let description = node.description();
        let object = description.to_node(&self.cluster_id);
        let register_err = |source| SimAgentError::RegisterNode {
            node: node.name.clone(),
            source,
        };
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let patch = json!({
                    "metadata": {"labels": object.metadata.labels},
                    "spec": {"agentType": "Raw"},
                });
                api.patch(&node.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(register_err)?;
            }
            Err(e) => return Err(register_err(e)),
        }
        let status = json!({ "status": description.status(Timestamp::now()) });
        api.patch_status(&node.name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(register_err)?;
        if self.heartbeat_mode != HeartbeatMode::Status {
            self.renew_lease(&node.name).await?;
        }
        Ok(())
    }

    async fn renew_lease(&self, node: &str) -> Result<(), SimAgentError> {
        rlark_agent::node::renew_node_lease(&self.leases_api(), node, self.lease_duration_seconds)
            .await
            .map_err(|source| SimAgentError::Lease {
                node: node.to_string(),
                source,
            })
    }

    async fn beat(&self, node: &str) -> Result<(), SimAgentError> {
        if self.heartbeat_mode != HeartbeatMode::Status {
            self.renew_lease(node).await?;
        }
        if self.heartbeat_mode != HeartbeatMode::Lease {
            let patch = json!({ "status": NodeStatus {
                phase: Some(NodePhase::Online),
                heartbeat_time: Some(Time(Timestamp::now())),
                ..NodeStatus::default()
            }});
            self.nodes_api()
                .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|source| SimAgentError::UpdateNode {
                    node: node.to_string(),
                    source,
                })?;
        }
        Ok(())
    }

    fn behaviour(&self, task_name: &str) -> Behaviour {
        lock(&self.behaviours).lookup(task_name).clone()
    }
}

/// A running simulated agent. Dropping it without [`SimAgent::stop`] cancels its loops too
/// (they notice at their next step).
pub struct SimAgent {
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for SimAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimAgent")
            .field("cluster_id", &self.shared.cluster_id)
            .finish_non_exhaustive()
    }
}

impl Drop for SimAgent {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl SimAgent {
    /// A builder for the agent of cluster `cluster_id` (namespace `rlark-<cluster_id>`).
    pub fn builder(cluster_id: impl Into<String>) -> SimAgentBuilder {
        SimAgentBuilder {
            cluster_id: cluster_id.into(),
            nodes: Vec::new(),
            behaviours: Behaviours::default(),
            heartbeat_interval: Duration::from_secs(1),
            lease_duration: Duration::from_secs(40),
            heartbeat_mode: HeartbeatMode::Both,
            run_tasks: true,
            start_delay: Duration::ZERO,
        }
    }

    /// The cluster ID.
    pub fn cluster_id(&self) -> &str {
        &self.shared.cluster_id
    }

    /// The agent namespace `rlark-<clusterID>`.
    pub fn namespace(&self) -> &str {
        &self.shared.namespace
    }

    /// Names of the simulated Nodes.
    pub fn node_names(&self) -> Vec<String> {
        lock(&self.shared.nodes)
            .iter()
            .map(|n| n.name.clone())
            .collect()
    }

    /// Change the behaviour of Tasks named `pattern` for runs that start from now on.
    pub fn set_behaviour(&self, pattern: &str, behaviour: Behaviour) {
        lock(&self.shared.behaviours).set(pattern, behaviour);
    }

    /// Stop renewing every heartbeat (the agent looks dead to the control plane).
    pub fn pause_heartbeats(&self) {
        self.shared.heartbeats_paused.store(true, Ordering::SeqCst);
    }

    /// Renew heartbeats again.
    pub fn resume_heartbeats(&self) {
        self.shared.heartbeats_paused.store(false, Ordering::SeqCst);
    }

    /// Stop renewing the heartbeat of one Node.
    pub fn pause_node_heartbeat(&self, node: &str) {
        lock(&self.shared.paused_nodes).insert(node.to_string());
    }

    /// Renew the heartbeat of one Node again.
    pub fn resume_node_heartbeat(&self, node: &str) {
        lock(&self.shared.paused_nodes).remove(node);
    }

    /// Add a machine at run time ("a third GPU appears"): registered `Online` on return.
    pub async fn add_node(&self, node: SimNode) -> Result<(), SimAgentError> {
        self.shared.add_node(node).await
    }

    /// Change the capacity and allocatable of a Node (e.g. a GPU freed or added).
    pub async fn set_resources(
        &self,
        node: &str,
        capacity: ResourceList,
        allocatable: Option<ResourceList>,
    ) -> Result<(), SimAgentError> {
        let updated = {
            let mut nodes = lock(&self.shared.nodes);
            let entry = nodes
                .iter_mut()
                .find(|n| n.name == node)
                .ok_or_else(|| SimAgentError::UnknownNode(node.to_string()))?;
            entry.capacity = capacity;
            entry.allocatable = allocatable;
            entry.clone()
        };
        let patch = json!({ "status": NodeStatus {
            allocatable: updated.allocatable_resources().clone(),
            capacity: updated.capacity,
            ..NodeStatus::default()
        }});
        self.shared
            .nodes_api()
            .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| SimAgentError::UpdateNode {
                node: node.to_string(),
                source,
            })?;
        Ok(())
    }

    /// How many runs (sets of replicas) this agent started, adopted ones excluded.
    pub fn runs_started(&self) -> usize {
        self.shared.runs_started.load(Ordering::SeqCst)
    }

    /// Names of the Tasks whose runs this agent started, in start order (a Task run twice
    /// appears twice).
    pub fn run_log(&self) -> Vec<String> {
        lock(&self.shared.run_log).clone()
    }

    /// Stop: heartbeats and the Task watch end; Pods are left as they are (a dead agent).
    pub async fn stop(mut self) -> Result<(), SimAgentError> {
        self.shutdown.cancel();
        let mut first_error = None;
        for task in self.tasks.drain(..) {
            if let Err(e) = task.await
                && first_error.is_none()
            {
                first_error = Some(SimAgentError::Join(e.to_string()));
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

async fn ensure_namespace(client: &kube::Client, namespace: &str) -> Result<(), SimAgentError> {
    let api: Api<Namespace> = Api::all(client.clone());
    let object = Namespace {
        metadata: ObjectMeta {
            name: Some(namespace.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(source) => Err(SimAgentError::CreateNamespace {
            namespace: namespace.to_string(),
            source,
        }),
    }
}

async fn heartbeat_loop(shared: Arc<Shared>, interval: Duration, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(10)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        if shared.heartbeats_paused.load(Ordering::SeqCst) {
            continue;
        }
        let names: Vec<String> = {
            let paused = lock(&shared.paused_nodes);
            lock(&shared.nodes)
                .iter()
                .filter(|n| !paused.contains(&n.name))
                .map(|n| n.name.clone())
                .collect()
        };
        for name in names {
            let beat = shared.beat(&name);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                result = beat => {
                    if let Err(error) = result {
                        tracing::warn!(%error, node = %name, "sim agent heartbeat failed");
                    }
                }
            }
        }
    }
}
