//! A simulated rlark agent: it speaks the agent protocol to the control plane exactly as a
//! real agent does, but runs nothing. Replicas "exit" when the test scripted them to.
//!
//! What it does, for cluster `C` (namespace `rlark-C`, created when missing):
//! - registers one `Node` per simulated machine (labels `rlark.io/cluster-id`,
//!   `kubernetes.io/hostname`, `rlark.io/node-category`, `rlark.io/agent-type` plus any
//!   given; `spec.agentType: Raw`; status `Online` with capacity and allocatable);
//! - renews a heartbeat every [`SimAgentBuilder::heartbeat_interval`]: the Lease
//!   `node-<name>` (`coordination.k8s.io/v1`) and/or `Node.status.heartbeatTime`;
//! - watches the `Task`s of its namespace; for a Task placed on its cluster
//!   (`spec.placement.clusterID == C`) it creates one `Pod` per replica (`<task>-<index>`,
//!   label `rlark.io/task-name`), reports it `Running` on `placement.nodes[index]`, then ends
//!   it as the task's [`Behaviour`] says (`Succeeded` with exit code 0, or `Failed` with the
//!   given exit code and a message);
//! - `spec.stopped: true` on a Task ends its running Pods as `Failed` with reason `Stopped`
//!   (exit code 143, SIGTERM); clearing it again starts a fresh run;
//! - a new run (new Task UID, a changed `rlark.io/restarted-at` annotation, a changed
//!   placement, or a resume) deletes the Task's old Pods and creates new ones;
//! - a deleted Task has its Pods deleted.
//!
//! [`SimAgent::stop`] ends all of it (heartbeats and watches stop, as when a real agent
//! dies); Pods are left as they are.
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use rlark_testkit::sim_agent::{Behaviour, SimAgent, SimNode};
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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use rlark_api::labels;
use rlark_api::types::{
    AgentType, Node, NodeCategory, NodeInfo, NodeSpec, NodeStatus, Pod, PodSpec, ResourceList, Task,
};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Label every Node carries with its machine name (as kubelet's).
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// Pod annotation: the run the Pod belongs to (see [`run_key`]); lets a restarted simulated
/// agent adopt its own Pods instead of running a finished replica again.
pub const RUN_KEY_ANNOTATION: &str = "sim.rlark.io/run-key";
/// Pod annotation: UID of the Task the Pod runs.
pub const TASK_UID_ANNOTATION: &str = "rlark.io/task-uid";
/// Reason of a Pod ended by `spec.stopped`.
pub const STOPPED_REASON: &str = "Stopped";
/// Exit code of a Pod ended by `spec.stopped` (128 + SIGTERM).
pub const STOPPED_EXIT_CODE: i32 = 143;
/// Pause between retries of a failed API call inside a run.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

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

/// How the replicas of a Task end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Every replica runs for `after`, then exits 0 (`Succeeded`).
    Succeed { after: Duration },
    /// Every replica runs for `after`, then exits with `exit_code` (`Failed`).
    Fail { after: Duration, exit_code: i32 },
    /// Replicas run until stopped or deleted.
    RunForever,
}

impl Behaviour {
    /// Succeed after `after`.
    pub fn succeed_after(after: Duration) -> Self {
        Behaviour::Succeed { after }
    }

    /// Fail with `exit_code` after `after`.
    pub fn fail_after(after: Duration, exit_code: i32) -> Self {
        Behaviour::Fail { after, exit_code }
    }

    /// Never end on their own.
    pub fn run_forever() -> Self {
        Behaviour::RunForever
    }

    /// How long a replica runs before it ends on its own (`None`: never).
    pub fn runs_for(&self) -> Option<Duration> {
        match self {
            Behaviour::Succeed { after } | Behaviour::Fail { after, .. } => Some(*after),
            Behaviour::RunForever => None,
        }
    }

    /// The status patch (its `status` value) that ends a replica, or `None` for
    /// [`Behaviour::RunForever`].
    pub fn final_status(&self, now: Timestamp) -> Option<serde_json::Value> {
        match self {
            Behaviour::Succeed { .. } => Some(json!({
                "phase": "Succeeded",
                "exitCode": 0,
                "reason": "Completed",
                "message": "process exited with code 0",
                "finishTime": Time(now),
            })),
            Behaviour::Fail { exit_code, .. } => Some(json!({
                "phase": "Failed",
                "exitCode": exit_code,
                "reason": "Error",
                "message": format!("process exited with code {exit_code}"),
                "finishTime": Time(now),
            })),
            Behaviour::RunForever => None,
        }
    }
}

/// Behaviours by Task name: exact names, and patterns ending in `*` (a prefix). An exact
/// name wins over patterns, a longer pattern over a shorter one; otherwise the default.
#[derive(Clone, Debug)]
pub struct Behaviours {
    exact: HashMap<String, Behaviour>,
    prefixes: Vec<(String, Behaviour)>,
    default: Behaviour,
}

impl Default for Behaviours {
    fn default() -> Self {
        Self {
            exact: HashMap::new(),
            prefixes: Vec::new(),
            default: Behaviour::succeed_after(Duration::ZERO),
        }
    }
}

impl Behaviours {
    /// Set the behaviour of Tasks named `pattern` (or starting with it, when it ends in `*`).
    pub fn set(&mut self, pattern: &str, behaviour: Behaviour) {
        match pattern.strip_suffix('*') {
            Some(prefix) => {
                self.prefixes.retain(|(p, _)| p != prefix);
                self.prefixes.push((prefix.to_string(), behaviour));
                // Longest prefix first, so the most specific pattern matches first.
                self.prefixes
                    .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
            }
            None => {
                self.exact.insert(pattern.to_string(), behaviour);
            }
        }
    }

    /// Set the behaviour of Tasks nothing else matches (default: succeed at once).
    pub fn set_default(&mut self, behaviour: Behaviour) {
        self.default = behaviour;
    }

    /// The behaviour of the Task named `task_name`.
    pub fn lookup(&self, task_name: &str) -> &Behaviour {
        if let Some(b) = self.exact.get(task_name) {
            return b;
        }
        self.prefixes
            .iter()
            .find(|(prefix, _)| task_name.starts_with(prefix.as_str()))
            .map_or(&self.default, |(_, b)| b)
    }
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

/// One simulated machine.
#[derive(Clone, Debug, PartialEq)]
pub struct SimNode {
    /// Node name (also its `kubernetes.io/hostname`).
    pub name: String,
    /// `rlark.io/node-category`.
    pub category: NodeCategory,
    /// Extra labels.
    pub labels: BTreeMap<String, String>,
    /// Total resources.
    pub capacity: ResourceList,
    /// Resources for tasks; `None` = the capacity.
    pub allocatable: Option<ResourceList>,
}

impl SimNode {
    /// A `cloud` node with no resources and no extra labels.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            category: NodeCategory::Cloud,
            labels: BTreeMap::new(),
            capacity: ResourceList::new(),
            allocatable: None,
        }
    }

    /// Set `rlark.io/node-category`.
    pub fn category(mut self, category: NodeCategory) -> Self {
        self.category = category;
        self
    }

    /// Add a label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Add a resource to the capacity (Kubernetes quantity syntax: `"8"`, `"500m"`, `"64Gi"`).
    pub fn resource(mut self, name: impl Into<String>, quantity: impl Into<String>) -> Self {
        self.capacity.insert(name.into(), Quantity(quantity.into()));
        self
    }

    /// Make allocatable differ from capacity.
    pub fn allocatable(mut self, allocatable: ResourceList) -> Self {
        self.allocatable = Some(allocatable);
        self
    }

    /// The resources available to tasks.
    pub fn allocatable_resources(&self) -> &ResourceList {
        self.allocatable.as_ref().unwrap_or(&self.capacity)
    }

    /// Every label the Node carries for cluster `cluster_id`.
    pub fn all_labels(&self, cluster_id: &str) -> BTreeMap<String, String> {
        let mut all = self.labels.clone();
        all.insert(labels::CLUSTER_ID.into(), cluster_id.into());
        all.insert(HOSTNAME_LABEL.into(), self.name.clone());
        all.insert(labels::NODE_CATEGORY.into(), self.category.as_str().into());
        all.insert(labels::AGENT_TYPE.into(), AgentType::Raw.as_str().into());
        all
    }

    /// The Node object (metadata and spec; status see [`SimNode::status`]).
    pub fn to_node(&self, cluster_id: &str) -> Node {
        let mut node = Node::new(
            &self.name,
            NodeSpec {
                agent_type: AgentType::Raw,
                unschedulable: false,
            },
        );
        node.metadata.namespace = Some(rlark_api::names::agent_namespace(cluster_id));
        node.metadata.labels = Some(self.all_labels(cluster_id));
        node
    }

    /// The status the agent reports: `Online`, resources, heartbeat `now`.
    pub fn status(&self, now: Timestamp) -> NodeStatus {
        NodeStatus {
            phase: Some(rlark_api::types::NodePhase::Online),
            reason: Some("AgentReady".into()),
            node_info: Some(NodeInfo {
                architecture: Some(std::env::consts::ARCH.into()),
                agent_version: Some(format!("sim-{}", env!("CARGO_PKG_VERSION"))),
                operating_system: Some(std::env::consts::OS.into()),
                kernel_version: None,
            }),
            capacity: self.capacity.clone(),
            allocatable: self.allocatable_resources().clone(),
            heartbeat_time: Some(Time(now)),
            ..Default::default()
        }
    }
}

/// Identity of one run of a Task on `cluster_id`: UID, restart annotation and placement.
/// `None` when the Task is not placed on this cluster (or is being deleted).
pub fn run_key(task: &Task, cluster_id: &str) -> Option<String> {
    if task.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let placement = task.spec.placement.as_ref()?;
    if placement.cluster_id != cluster_id || placement.nodes.is_empty() {
        return None;
    }
    let uid = task.metadata.uid.as_deref().unwrap_or_default();
    let restarted = task
        .annotations()
        .get(labels::RESTARTED_AT)
        .map(String::as_str)
        .unwrap_or_default();
    Some(format!("{uid}/{restarted}/{}", placement.nodes.join(",")))
}

/// Name of replica `index` of `task_name`.
pub fn pod_name(task_name: &str, index: usize) -> String {
    format!("{task_name}-{index}")
}

/// The Pod object for replica `index` of `task` (no status; see [`running_status`]).
pub fn replica_pod(task: &Task, index: usize, run_key: &str) -> Pod {
    let name = task.name_any();
    let mut pod = Pod::new(
        &pod_name(&name, index),
        PodSpec {
            domain: task.spec.domain.clone(),
            task_namespace: task.namespace(),
            task_name: Some(name.clone()),
            pod_namespace: task.namespace(),
            pod_name: Some(pod_name(&name, index)),
            replica_index: Some(i32::try_from(index).unwrap_or(i32::MAX)),
        },
    );
    pod.metadata = ObjectMeta {
        name: Some(pod_name(&name, index)),
        namespace: task.namespace(),
        labels: Some(BTreeMap::from([(labels::TASK_NAME.to_string(), name)])),
        annotations: Some(BTreeMap::from([
            (RUN_KEY_ANNOTATION.to_string(), run_key.to_string()),
            (
                TASK_UID_ANNOTATION.to_string(),
                task.metadata.uid.clone().unwrap_or_default(),
            ),
        ])),
        ..Default::default()
    };
    pod
}

/// The status value of a replica that started on `node` at `now`.
pub fn running_status(node: &str, now: Timestamp) -> serde_json::Value {
    json!({
        "phase": "Running",
        "node": node,
        "startTime": Time(now),
        "restartCount": 0,
    })
}

/// The status value of a replica ended by `spec.stopped`.
pub fn stopped_status(now: Timestamp) -> serde_json::Value {
    json!({
        "phase": "Failed",
        "reason": STOPPED_REASON,
        "exitCode": STOPPED_EXIT_CODE,
        "message": "stopped on request (SIGTERM)",
        "finishTime": Time(now),
    })
}

fn pod_is_terminal(pod: &Pod) -> bool {
    use rlark_api::types::PodPhase;
    matches!(
        pod.status.as_ref().and_then(|s| s.phase),
        Some(PodPhase::Succeeded | PodPhase::Failed)
    )
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
            tasks.push(tokio::spawn(task_loop(shared.clone(), shutdown.clone())));
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
        let object = node.to_node(&self.cluster_id);
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
        let status = json!({ "status": node.status(Timestamp::now()) });
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
            let patch =
                json!({"status": {"phase": "Online", "heartbeatTime": Time(Timestamp::now())}});
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
        let patch = json!({"status": {
            "capacity": updated.capacity,
            "allocatable": updated.allocatable_resources(),
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

/// Where a run of a Task stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RunState {
    /// Creating Pods / replicas running.
    Active,
    /// Every replica ended on its own.
    Finished,
    /// Ended (or never started) because the Task is stopped.
    Stopped,
}

/// The agent's handle on one run of one Task.
struct RunHandle {
    /// [`run_key`] of the run; empty for the clean-up after a deletion.
    key: String,
    updates: watch::Sender<Task>,
    state: Arc<Mutex<RunState>>,
    cancel: CancellationToken,
    join: JoinHandle<()>,
}

async fn task_loop(shared: Arc<Shared>, shutdown: CancellationToken) {
    let api: Api<Task> = Api::namespaced(shared.client.clone(), &shared.namespace);
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut runs: HashMap<String, RunHandle> = HashMap::new();
    let mut listed: Option<HashSet<String>> = None;
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => break,
            event = stream.next() => event,
        };
        let Some(event) = event else { break };
        match event {
            Ok(watcher::Event::Apply(task)) => dispatch(&shared, &mut runs, task, &shutdown),
            Ok(watcher::Event::Delete(task)) => {
                forget(&shared, &mut runs, &task.name_any(), &shutdown);
            }
            Ok(watcher::Event::Init) => listed = Some(HashSet::new()),
            Ok(watcher::Event::InitApply(task)) => {
                if let Some(listed) = listed.as_mut() {
                    listed.insert(task.name_any());
                }
                dispatch(&shared, &mut runs, task, &shutdown);
            }
            Ok(watcher::Event::InitDone) => {
                let listed = listed.take().unwrap_or_default();
                // Tasks deleted while the watch was down.
                let gone: Vec<String> = runs
                    .keys()
                    .filter(|name| !listed.contains(*name))
                    .cloned()
                    .collect();
                for name in gone {
                    forget(&shared, &mut runs, &name, &shutdown);
                }
                // Pods of Tasks deleted while the agent was not running.
                let orphans = shared.clone();
                tokio::spawn(async move {
                    delete_orphan_pods(&orphans, &listed).await;
                });
            }
            Err(error) => tracing::debug!(%error, "sim agent task watch error (retrying)"),
        }
    }
    for (_, run) in runs.drain() {
        run.cancel.cancel();
        let _ = run.join.await;
    }
}

/// Route a Task (added or changed) to its run, starting a new run when needed.
fn dispatch(
    shared: &Arc<Shared>,
    runs: &mut HashMap<String, RunHandle>,
    task: Task,
    shutdown: &CancellationToken,
) {
    let name = task.name_any();
    let Some(key) = run_key(&task, &shared.cluster_id) else {
        // Not (or no longer) placed here, or being deleted: end any run and its Pods.
        if runs.get(&name).is_some_and(|r| !r.key.is_empty()) {
            forget(shared, runs, &name, shutdown);
        }
        return;
    };
    if let Some(run) = runs.get(&name)
        && run.key == key
    {
        let state = *lock(&run.state);
        let resumed = state == RunState::Stopped && !task.spec.stopped;
        if !resumed {
            run.updates.send_replace(task);
            return;
        }
    }
    // A new run: a new Task, a restart, a new placement, or a resume.
    let previous = runs.remove(&name).map(|run| {
        run.cancel.cancel();
        run.join
    });
    // Pods of an earlier run may be adopted only by the first run this agent starts for
    // the Task (the agent restarted); a resume always starts afresh.
    let may_adopt = previous.is_none();
    let (updates, receiver) = watch::channel(task.clone());
    let state = Arc::new(Mutex::new(RunState::Active));
    let cancel = shutdown.child_token();
    let join = tokio::spawn(run_task(
        shared.clone(),
        task,
        key.clone(),
        receiver,
        state.clone(),
        cancel.clone(),
        previous,
        may_adopt,
    ));
    runs.insert(
        name,
        RunHandle {
            key,
            updates,
            state,
            cancel,
            join,
        },
    );
}

/// The Task is gone: end its run and delete its Pods (after the run has ended).
fn forget(
    shared: &Arc<Shared>,
    runs: &mut HashMap<String, RunHandle>,
    name: &str,
    shutdown: &CancellationToken,
) {
    let previous = runs.remove(name).map(|run| {
        run.cancel.cancel();
        run.join
    });
    let cleanup_shared = shared.clone();
    let task_name = name.to_string();
    let cancel = shutdown.child_token();
    let guard = cancel.clone();
    let join = tokio::spawn(async move {
        if let Some(previous) = previous {
            let _ = previous.await;
        }
        tokio::select! {
            _ = guard.cancelled() => {}
            _ = delete_pods(&cleanup_shared, &task_name) => {}
        }
    });
    // A placeholder run (empty key) so a Task recreated with the same name waits for the
    // clean-up before creating its Pods.
    let (updates, _) = watch::channel(Task::new(name, placeholder_spec()));
    runs.insert(
        name.to_string(),
        RunHandle {
            key: String::new(),
            updates,
            state: Arc::new(Mutex::new(RunState::Finished)),
            cancel,
            join,
        },
    );
}

fn placeholder_spec() -> rlark_api::types::TaskSpec {
    rlark_api::types::TaskSpec {
        agent_type: AgentType::Raw,
        role: rlark_api::types::TaskRole::Actor,
        domain: None,
        downstream_name: None,
        node_selector: BTreeMap::new(),
        node_name: None,
        placement: None,
        stopped: false,
        node_lost_policy: None,
        kubernetes: None,
        docker: None,
        raw: None,
        tensor_board_dir: None,
        prepare_script: None,
        run_script: None,
        ssh_public_key: None,
        input: None,
        env_from: None,
    }
}

async fn delete_pods(shared: &Shared, task_name: &str) {
    let api = shared.pods_api();
    let list_params = ListParams::default().labels(&format!("{}={task_name}", labels::TASK_NAME));
    loop {
        match api.list(&list_params).await {
            Ok(list) => {
                let mut ok = true;
                for pod in list.items {
                    if let Err(error) = delete_pod(&api, &pod.name_any()).await {
                        tracing::warn!(%error, pod = %pod.name_any(), "sim agent: delete pod");
                        ok = false;
                    }
                }
                if ok {
                    return;
                }
            }
            Err(error) => tracing::warn!(%error, task = task_name, "sim agent: list pods"),
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

async fn delete_orphan_pods(shared: &Shared, tasks: &HashSet<String>) {
    let api = shared.pods_api();
    let Ok(list) = api
        .list(&ListParams::default().labels(labels::TASK_NAME))
        .await
    else {
        return;
    };
    for pod in list.items {
        let owner = pod.labels().get(labels::TASK_NAME).cloned();
        if owner.is_some_and(|t| !tasks.contains(&t)) {
            let _ = api.delete(&pod.name_any(), &DeleteParams::default()).await;
        }
    }
}

/// Retry `op` until it succeeds (a real agent keeps trying; the run's cancellation ends it).
async fn retry<T, F, Fut>(what: &str, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    loop {
        match op().await {
            Ok(v) => return v,
            Err(error) => {
                tracing::warn!(%error, what, "sim agent: API call failed, retrying");
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
}

/// Delete a Pod; an absent one is fine.
async fn delete_pod(api: &Api<Pod>, name: &str) -> Result<(), kube::Error> {
    match api.delete(name, &DeleteParams::default()).await {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        other => other.map(|_| ()),
    }
}

/// Create a Pod; one left over under the same name (from a run that ended while this one
/// started) is deleted and the error returned, so the caller retries.
async fn create_pod(api: &Api<Pod>, pod: &Pod) -> Result<Pod, kube::Error> {
    match api.create(&PostParams::default(), pod).await {
        Err(kube::Error::Api(s)) if s.code == 409 => {
            delete_pod(api, &pod.name_any()).await?;
            Err(kube::Error::Api(s))
        }
        other => other,
    }
}

/// Merge-patch a Pod's status with `{"status": status}`; an absent Pod is fine.
async fn patch_pod_status(
    api: &Api<Pod>,
    name: &str,
    status: &serde_json::Value,
) -> Result<(), kube::Error> {
    let patch = json!({ "status": status });
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        other => other.map(|_| ()),
    }
}

/// One run of one Task, until it ends, the Task changes its mind, or the agent stops.
#[allow(clippy::too_many_arguments)]
async fn run_task(
    shared: Arc<Shared>,
    task: Task,
    key: String,
    updates: watch::Receiver<Task>,
    state: Arc<Mutex<RunState>>,
    cancel: CancellationToken,
    previous: Option<JoinHandle<()>>,
    may_adopt: bool,
) {
    if let Some(previous) = previous {
        let _ = previous.await;
    }
    let name = task.name_any();
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = run_body(&shared, task, &key, updates, &state, may_adopt) => {}
    }
    tracing::debug!(task = %name, "sim agent run ended");
}

async fn run_body(
    shared: &Shared,
    task: Task,
    key: &str,
    mut updates: watch::Receiver<Task>,
    state: &Mutex<RunState>,
    may_adopt: bool,
) {
    let name = task.name_any();
    let api = shared.pods_api();
    let list_params = ListParams::default().labels(&format!("{}={name}", labels::TASK_NAME));
    let nodes = task
        .spec
        .placement
        .as_ref()
        .map(|p| p.nodes.clone())
        .unwrap_or_default();
    let existing = retry("list pods", || api.list(&list_params)).await.items;

    if task.spec.stopped {
        stop_pods(&api, &existing).await;
        *lock(state) = RunState::Stopped;
        return;
    }

    let behaviour = shared.behaviour(&name);
    let adopt = may_adopt
        && existing.len() == nodes.len()
        && existing
            .iter()
            .all(|p| p.annotations().get(RUN_KEY_ANNOTATION).map(String::as_str) == Some(key));
    let mut pods: Vec<Pod> = if adopt {
        if existing.iter().all(pod_is_terminal) {
            *lock(state) = RunState::Finished;
            return;
        }
        existing
    } else {
        for pod in &existing {
            let pod_name = pod.name_any();
            retry("delete stale pod", || delete_pod(&api, &pod_name)).await;
        }
        shared.runs_started.fetch_add(1, Ordering::SeqCst);
        lock(&shared.run_log).push(name.clone());
        let mut created = Vec::with_capacity(nodes.len());
        for (index, node) in nodes.iter().enumerate() {
            let pod = replica_pod(&task, index, key);
            let pod = retry("create pod", || create_pod(&api, &pod)).await;
            if !shared.start_delay.is_zero() {
                let pod_name = pod.name_any();
                let pending = json!({"phase": "Pending", "node": node});
                retry("report pod pending", || {
                    patch_pod_status(&api, &pod_name, &pending)
                })
                .await;
            }
            created.push(pod);
        }
        if !shared.start_delay.is_zero() {
            tokio::time::sleep(shared.start_delay).await;
        }
        let now = Timestamp::now();
        for (pod, node) in created.iter().zip(&nodes) {
            let pod_name = pod.name_any();
            let running = running_status(node, now);
            retry("report pod running", || {
                patch_pod_status(&api, &pod_name, &running)
            })
            .await;
        }
        created
    };

    // Replicas run until the behaviour ends them or the Task is stopped.
    let ends_at = behaviour
        .runs_for()
        .map(|d| tokio::time::Instant::now() + d);
    loop {
        let timer = async {
            match ends_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = timer => {
                if let Some(status) = behaviour.final_status(Timestamp::now()) {
                    for pod in pods.iter().filter(|p| !pod_is_terminal(p)) {
                        let pod_name = pod.name_any();
                        retry("report pod finished", || {
                            patch_pod_status(&api, &pod_name, &status)
                        })
                        .await;
                    }
                }
                *lock(state) = RunState::Finished;
                return;
            }
            changed = updates.changed() => {
                if changed.is_err() {
                    // The agent dropped the run's handle: it is being replaced or stopped.
                    return;
                }
                if updates.borrow_and_update().spec.stopped {
                    pods.retain(|p| !pod_is_terminal(p));
                    stop_pods(&api, &pods).await;
                    *lock(state) = RunState::Stopped;
                    return;
                }
            }
        }
    }
}

/// End every non-terminal Pod in `pods` as stopped.
async fn stop_pods(api: &Api<Pod>, pods: &[Pod]) {
    let status = stopped_status(Timestamp::now());
    for pod in pods.iter().filter(|p| !pod_is_terminal(p)) {
        let pod_name = pod.name_any();
        retry("report pod stopped", || {
            patch_pod_status(api, &pod_name, &status)
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlark_api::types::TaskPlacement;

    fn task(name: &str, uid: &str, placement: Option<(&str, &[&str])>) -> Task {
        let mut task = Task::new(name, placeholder_spec());
        task.metadata.namespace = Some("rlark-a".into());
        task.metadata.uid = Some(uid.into());
        task.spec.placement = placement.map(|(c, nodes)| TaskPlacement {
            cluster_id: c.into(),
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
        });
        task
    }

    #[test]
    fn behaviour_lookup_prefers_exact_then_longest_prefix() {
        let mut b = Behaviours::default();
        b.set("wf-*", Behaviour::run_forever());
        b.set("wf-train-*", Behaviour::fail_after(Duration::ZERO, 2));
        b.set(
            "wf-train-actor",
            Behaviour::succeed_after(Duration::from_secs(1)),
        );
        assert_eq!(
            b.lookup("wf-train-actor"),
            &Behaviour::succeed_after(Duration::from_secs(1))
        );
        assert_eq!(
            b.lookup("wf-train-rollout"),
            &Behaviour::fail_after(Duration::ZERO, 2)
        );
        assert_eq!(b.lookup("wf-eval-x"), &Behaviour::run_forever());
        assert_eq!(b.lookup("other"), &Behaviour::succeed_after(Duration::ZERO));
        b.set_default(Behaviour::run_forever());
        assert_eq!(b.lookup("other"), &Behaviour::run_forever());
        // Replacing a pattern keeps one entry.
        b.set("wf-*", Behaviour::succeed_after(Duration::ZERO));
        assert_eq!(b.prefixes.len(), 2);
    }

    #[test]
    fn final_status_says_how_the_replica_ended() {
        let now = Timestamp::UNIX_EPOCH;
        let ok = Behaviour::succeed_after(Duration::ZERO)
            .final_status(now)
            .expect("ends");
        assert_eq!(ok["phase"], "Succeeded");
        assert_eq!(ok["exitCode"], 0);
        let failed = Behaviour::fail_after(Duration::ZERO, 7)
            .final_status(now)
            .expect("ends");
        assert_eq!(failed["phase"], "Failed");
        assert_eq!(failed["exitCode"], 7);
        assert!(failed["message"].as_str().is_some_and(|m| m.contains('7')));
        assert!(Behaviour::run_forever().final_status(now).is_none());
        assert_eq!(Behaviour::run_forever().runs_for(), None);
        let stopped = stopped_status(now);
        assert_eq!(stopped["reason"], STOPPED_REASON);
        assert_eq!(stopped["exitCode"], STOPPED_EXIT_CODE);
    }

    #[test]
    fn run_key_changes_with_uid_restart_and_placement() {
        let t = task("j-a", "u1", Some(("a", &["n1", "n2"])));
        let k1 = run_key(&t, "a").expect("placed here");
        assert_eq!(run_key(&t, "b"), None, "placed on another cluster");
        assert_eq!(run_key(&task("j-a", "u1", None), "a"), None, "not placed");
        assert_ne!(
            run_key(&task("j-a", "u2", Some(("a", &["n1", "n2"]))), "a"),
            Some(k1.clone())
        );
        assert_ne!(
            run_key(&task("j-a", "u1", Some(("a", &["n2", "n1"]))), "a"),
            Some(k1.clone())
        );
        let mut restarted = t.clone();
        restarted
            .annotations_mut()
            .insert(labels::RESTARTED_AT.into(), "2025-01-01T00:00:00Z".into());
        assert_ne!(run_key(&restarted, "a"), Some(k1.clone()));
        let mut deleting = t.clone();
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert_eq!(run_key(&deleting, "a"), None);
        // Status and stop do not change the run.
        let mut stopped = t.clone();
        stopped.spec.stopped = true;
        assert_eq!(run_key(&stopped, "a"), Some(k1));
    }

    #[test]
    fn replica_pods_follow_the_protocol() {
        let mut t = task("j-a", "u1", Some(("a", &["n1", "n2"])));
        t.spec.domain = Some("d".into());
        let pod = replica_pod(&t, 1, "key");
        assert_eq!(pod.name_any(), "j-a-1");
        assert_eq!(pod.namespace().as_deref(), Some("rlark-a"));
        assert_eq!(pod.labels()[labels::TASK_NAME], "j-a");
        assert_eq!(pod.annotations()[RUN_KEY_ANNOTATION], "key");
        assert_eq!(pod.annotations()[TASK_UID_ANNOTATION], "u1");
        assert_eq!(pod.spec.task_name.as_deref(), Some("j-a"));
        assert_eq!(pod.spec.task_namespace.as_deref(), Some("rlark-a"));
        assert_eq!(pod.spec.replica_index, Some(1));
        assert_eq!(pod.spec.domain.as_deref(), Some("d"));
        let running = running_status("n2", Timestamp::UNIX_EPOCH);
        assert_eq!(running["phase"], "Running");
        assert_eq!(running["node"], "n2");
        assert!(running["startTime"].is_string());
    }

    #[test]
    fn nodes_carry_protocol_labels_and_resources() {
        let node = SimNode::new("gpu-0")
            .category(NodeCategory::Edge)
            .label("zone", "lab")
            .resource("nvidia.com/gpu", "2")
            .resource("cpu", "8");
        let object = node.to_node("c1");
        assert_eq!(object.namespace().as_deref(), Some("rlark-c1"));
        let l = object.labels();
        assert_eq!(l[labels::CLUSTER_ID], "c1");
        assert_eq!(l[HOSTNAME_LABEL], "gpu-0");
        assert_eq!(l[labels::NODE_CATEGORY], "edge");
        assert_eq!(l["zone"], "lab");
        assert_eq!(object.spec.agent_type, AgentType::Raw);
        let status = node.status(Timestamp::UNIX_EPOCH);
        assert_eq!(status.phase, Some(rlark_api::types::NodePhase::Online));
        assert_eq!(status.allocatable["nvidia.com/gpu"], Quantity("2".into()));
        assert_eq!(status.capacity, status.allocatable);
        let less = node.allocatable(ResourceList::from([(
            "nvidia.com/gpu".to_string(),
            Quantity("1".into()),
        )]));
        assert_eq!(less.status(Timestamp::UNIX_EPOCH).allocatable.len(), 1);
        assert_eq!(less.status(Timestamp::UNIX_EPOCH).capacity.len(), 2);
    }
}
