//! The Task reconciler: runs the replicas of the Tasks placed on this node as processes
//! ([`crate::runtime`]) and reports one `Pod` per replica (docs/concepts.md, "Agent
//! protocol"; DESIGN §7). The control plane's Task is the truth; each pass makes reality
//! match it.
//!
//! # What it does, for cluster `C` and node `N`
//!
//! - watches the Tasks of `rlark-C` (plus a full pass every [`RESYNC_INTERVAL`], which
//!   also re-asserts the Pod status of every replica that runs or waits to restart);
//! - for every replica `i` of a Task with `spec.placement.clusterID == C` and
//!   `placement.nodes[i] == N` (`i < spec.raw.replicas`) it keeps one worker, which
//!   creates the Pod `<task>-<i>` (label `rlark.io/task-name`, annotations
//!   `rlark.io/task-uid` and [`RUN_KEY_ANNOTATION`], spec `taskNamespace`, `taskName`,
//!   `podNamespace`, `podName`, `replicaIndex`, `domain`), reports it `Running` (`node`,
//!   `startTime`, `restartCount`) once the process started — and `Pending` (with `node`)
//!   first only when starting takes longer than [`PENDING_AFTER`] (an artifact download):
//!   a Pod without a phase is pending, and every write costs the control plane a round
//!   of watch events — and when it ends `Succeeded` (exit code 0, reason `Completed`) or
//!   `Failed` (`exitCode`, `reason`, `message`), with `finishTime`;
//! - restarts exited replicas per `raw.restartPolicy` (`Never`, `OnFailure`, `Always`)
//!   after an exponential backoff ([`BACKOFF_INITIAL`] doubling up to [`BACKOFF_MAX`],
//!   reset after [`BACKOFF_RESET_AFTER`] of running), counting `restartCount`; while it
//!   waits the Pod stays `Running` with reason [`REASON_BACKOFF`] (as a Kubernetes Pod in
//!   CrashLoopBackOff does), so `Failed` always means "beyond the restart policy";
//! - `activeDeadlineSeconds` (counted from the first start of the run, restarts included)
//!   kills the process group: `Failed`, reason [`REASON_DEADLINE_EXCEEDED`];
//! - `spec.stopped: true` → SIGTERM to the process group, SIGKILL after
//!   `terminationGracePeriodSeconds` (default 30 s): `Failed`, reason [`REASON_STOPPED`],
//!   `exitCode` as observed (143 when SIGTERM ended it, 137 when SIGKILL was needed).
//!   Clearing it starts fresh replicas (old Pods deleted, new ones created);
//! - a new run (new Task UID, changed `rlark.io/restarted-at`, changed placement — see
//!   [`run_key`]) kills the old replicas, deletes their Pods and starts new ones;
//! - a deleted Task (or one no longer placed on this node, or scaled down) has its
//!   replicas killed and its Pods deleted; Pods on this node of Tasks that no longer exist
//!   are deleted when the watch (re)lists;
//! - a replica that cannot start (missing program, bad working directory, artifact) is
//!   `Failed` with the runtime's reason ([`crate::runtime::RuntimeError::reason`]) and a
//!   message naming the problem; it is not restarted (retrying cannot fix it);
//! - a Task whose `agentType` is not `Raw` is `Failed` with reason
//!   [`REASON_UNSUPPORTED_AGENT_TYPE`].
//!
//! Every Pod write is a merge patch on the `status` subresource, retried until it
//! succeeds (a Pod deleted meanwhile is created again while its replica runs), so a
//! replica whose process is gone is never left `Running`.
//!
//! A worker reads its Pod before deciding what to do only when the Pod may exist: it was
//! in the reconciler's Pod listing of the last (re)list, or a replica of an earlier agent
//! was recovered for it. A replica of a Task that appeared since creates its Pod
//! straight away (and reads it only if the create finds one after all), so a burst of new
//! Tasks costs one request less per replica.
//!
//! # Crash safety: agent restarts
//!
//! Each replica runs under its own supervisor process ([`crate::supervisor`], started by
//! [`crate::runtime::spawn_replica`]), which is not a child the agent's death takes along:
//! it writes `pid.json` (task pid, process group, start ticks, its own pid) when the
//! process starts and `exit.json` (exit code or signal, finish time) when it ends, whether
//! an agent runs or not. The agent adds `DATA_DIR/<ns>/<task>/<uid>/<i>/state.json`
//! ([`ReplicaState`]: pid, process group, start time, run key, grace period; and, once the
//! end was seen, a final status that `exit.json` cannot give — stopped, deadline, agent
//! shutdown), removed once the final status is written.
//!
//! At startup, for every state file left behind:
//! - a recorded final status is reported (if the Pod is still that run's and not final);
//! - otherwise the replica waits for the worker of its replica (same Task name and
//!   index), which, when the Task still wants that very run (same [`run_key`]), takes it
//!   over ([`crate::runtime::adopt_replica`]):
//!   - **supervisor still running → adopted**: the Pod stays `Running` with its
//!     `startTime` and `restartCount`, the deadline is counted from that start, the log
//!     keeps growing (the process writes it directly), and the later exit is reported as
//!     any other (restart policy included); a stopped Task stops it (`Stopped`);
//!   - **`exit.json` present → the real exit**: `Succeeded` / `Failed` with the recorded
//!     exit code (reason `Completed` / `Error`), or a restart per the restart policy;
//!   - **supervisor gone without `exit.json`** (a reboot, or the supervisor was
//!     SIGKILLed) → `Failed` with reason [`REASON_AGENT_LOST`] and a message saying what
//!     is unknown; what is left of its process group is killed (SIGTERM, SIGKILL after the
//!     grace period); the same for a state file without `pid.json`;
//! - replicas of another run (new Task UID, restart annotation or placement), of deleted
//!   Tasks, or scaled down, are stopped through the normal kill path (the new run's worker
//!   waits for that; Pods of runs no Task wants any more are deleted) once the first full
//!   Task listing is in (the reconciler's sweep).
//!
//! A Pod found `Running` for the current run without any state file is reported
//! `AgentLost`, unless its reason is [`REASON_BACKOFF`] (nothing runs while a replica waits
//! to restart): then it restarts now. On shutdown, processes keep running (their state
//! files stay, so the next start adopts them) unless [`TaskContext::stop_tasks_on_exit`],
//! in which case they are stopped and their Pods reported `Failed`, reason
//! [`REASON_AGENT_SHUTDOWN`]. If the agent dies (SIGKILL), its workers die with it and the
//! supervisors carry on.
//!
//! # Old runs on disk
//!
//! The directories `<task>/<uid>/` of a Task name are pruned when a new run of it starts
//! ([`prune_runs`]): the current run and the newest earlier one are kept ([`RUNS_KEPT`],
//! for the logs API's `previous=true`), older ones are deleted unless a replica there still
//! has a state file.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt as _, watcher};
use rlark_api::labels;
use rlark_api::types::{Pod, PodPhase, PodSpec, RawTaskSpec, RestartPolicy, Task};
use rlark_api::validation::MAX_ACTIVE_DEADLINE_SECONDS;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::runtime::{
    self, Adoption, DEFAULT_GRACE, ExitCause, ExitStatus, LogLimits, MAX_GRACE, ReplicaExit,
    ReplicaHandle, ReplicaSpec, process,
};
use crate::task_reports::TaskTokens;

/// Pod annotation: UID of the Task the Pod runs.
pub const TASK_UID_ANNOTATION: &str = "rlark.io/task-uid";
/// Pod annotation: the run the Pod belongs to ([`run_key`]).
pub const RUN_KEY_ANNOTATION: &str = "rlark.io/run-key";
/// Name of a replica's state file.
pub const STATE_FILE: &str = "state.json";

/// How long a fresh replica may take to start before its Pod is reported `Pending`
/// (otherwise `Running` is its first phase).
pub const PENDING_AFTER: Duration = Duration::from_millis(250);

/// Reason of a replica that exited 0.
pub const REASON_COMPLETED: &str = "Completed";
/// Reason of a replica that exited non-zero or was killed by a signal.
pub const REASON_ERROR: &str = "Error";
/// Reason of a replica ended by `spec.stopped`.
pub const REASON_STOPPED: &str = "Stopped";
/// Reason of a replica killed at its `activeDeadlineSeconds`.
pub const REASON_DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
/// Reason of a replica whose outcome the agent lost (see the module documentation).
pub const REASON_AGENT_LOST: &str = "AgentLost";
/// Reason of a replica stopped because the agent shut down with `stop_tasks_on_exit`.
pub const REASON_AGENT_SHUTDOWN: &str = "AgentShutdown";
/// Reason of a `Running` replica waiting to be restarted.
pub const REASON_BACKOFF: &str = "BackOff";
/// Reason of a replica of a Task this agent cannot run (not `agentType: Raw`).
pub const REASON_UNSUPPORTED_AGENT_TYPE: &str = "UnsupportedAgentType";

/// Full resync period of the Task watch.
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(30);
/// First restart delay.
pub const BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// Longest restart delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// A replica that ran this long restarts after [`BACKOFF_INITIAL`] again.
pub const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(600);
/// First pause between retries of a failed API call (doubling up to [`RETRY_MAX`]).
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// While shutting down, a failing API call is tried this many times, then given up.
const SHUTDOWN_ATTEMPTS: u32 = 3;

/// What the reconciler needs to know about this agent.
#[derive(Clone, Debug)]
pub struct TaskContext {
    /// Cluster ID `C`: Tasks are watched in `rlark-C`.
    pub cluster_id: String,
    /// This node's name: replicas placed on it run here.
    pub node_name: String,
    /// Where replicas live: `<data_dir>/<namespace>/<task>/<uid>/<index>/` (normally
    /// `DATA_DIR/tasks`).
    pub data_dir: PathBuf,
    /// The control plane's URL, given to processes as `RLARK_SERVER`.
    pub server_url: String,
    /// The installation's CA bundle (`DATA_DIR/identity/ca.crt`), given to processes as
    /// `RLARK_CA_FILE`.
    pub ca_file: PathBuf,
    /// Stop every replica when the agent shuts down (default: leave them running).
    pub stop_tasks_on_exit: bool,
    /// The replica supervisor command ([`ReplicaSpec::supervisor`]).
    pub supervisor: Vec<OsString>,
}

/// Errors that end [`run_tasks`]. API errors never do: they are retried.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("cluster id {0:?} is not a DNS-1123 label")]
    InvalidClusterId(String),
    #[error("the node name is empty")]
    EmptyNodeName,
    #[error("create the task data directory {}: {source}", path.display())]
    DataDir { path: PathBuf, source: io::Error },
    #[error("the Task watch ended")]
    WatchEnded,
}

/// Identity of one run of a Task on `cluster_id`: UID, restart annotation and placement
/// (the same key as the simulated agent's). `None` when the Task is not placed on this
/// cluster, or is being deleted. `spec.stopped` is not part of it.
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

/// Name of the Pod of replica `index` of `task_name`.
pub fn pod_name(task_name: &str, index: usize) -> String {
    format!("{task_name}-{index}")
}

/// The directory of replica `index` of Task `task` (UID `uid`) in `namespace`:
/// `<data_dir>/<namespace>/<task>/<uid>/<index>` (`work/`, `logs/`, `state.json`).
pub fn replica_dir(
    data_dir: &Path,
    namespace: &str,
    task: &str,
    uid: &str,
    index: usize,
) -> PathBuf {
    let uid = if uid.is_empty() { "no-uid" } else { uid };
    data_dir
        .join(namespace)
        .join(task)
        .join(uid)
        .join(index.to_string())
}

/// Variables of the environment contract that are set only in some cases: the Task's
/// `raw.environment` (or anything else) cannot provide them when rlark does not.
const OPTIONAL_CONTRACT: &[&str] = &["RLARK_DOMAIN", "RLARK_RAY_ROLE", "RLARK_HEAD_ADDRESS"];

/// The environment of replica `index` of `task`, in order (a later entry wins):
///
/// 1. `envFrom.input`: each variable gets the value its JSONPath selects in `spec.input`
///    (a string as is, anything else as compact JSON). A path that parses to nothing is
///    refused at admission; for a Task stored before that check (or written straight into
///    the store) the variable is left unset and a warning logged;
/// 2. the Task's `raw.environment` (it wins over `envFrom`, as `env` does in Kubernetes);
/// 3. rlark's contract, which cannot be overridden: `RLARK_SERVER`, `RLARK_CLUSTER_ID`,
///    `RLARK_NODE_NAME`, `RLARK_NAMESPACE`, `RLARK_JOB` (the Task's `rlinf.io/job` label,
///    else its Job owner; empty for a bare Task), `RLARK_TASK`, `RLARK_TASK_UID`,
///    `RLARK_TASK_ROLE` (`Actor`, `Rollout`, `Env`), `RLARK_POD_NAME`,
///    `RLARK_REPLICA_INDEX`, `RLARK_NODE_RANK_START` (annotation
///    `rlark.io/ray-node-rank-start`: the replicas of the Job's earlier tasks; 0 when absent
///    or not a number), `RLARK_NODE_RANK` (= start + replica index: unique across the
///    Job), `RLARK_TOTAL_NODES` (annotation `rlark.io/ray-total-nodes`, the Job's replicas
///    over all its tasks as RLark counts them; the Task's own replicas when absent or not a
///    number, so a bare Task keeps its earlier meaning); and only when known:
///    `RLARK_DOMAIN` (`spec.domain`), `RLARK_RAY_ROLE` (`head` | `worker`, annotation
///    `rlark.io/ray-role`), `RLARK_HEAD_ADDRESS` (`<head task>-0.<domain>`: replica 0 of
///    the task named by `rlark.io/ray-head-task-name`, under the name the domain network
///    gives it; the head task gets it too). The optional ones are removed from the Task's
///    own variables when rlark does not set them.
///
/// When the replica starts, `RLARK_REPORT_URL`, `RLARK_TOKEN` and `RLARK_CA_FILE` follow
/// (see [`crate::task_reports`]; absent when no task token could be minted).
/// The process also inherits the agent's own environment underneath.
pub fn replica_env(task: &Task, index: usize, ctx: &TaskContext) -> Vec<(String, String)> {
    let name = task.name_any();
    let (mut env, missing) = task.spec.input_env();
    for error in &missing {
        tracing::warn!(
            namespace = task.namespace().unwrap_or_default(),
            task = %name,
            %error,
            "an envFrom.input variable is left unset"
        );
    }
    env.extend(
        task.spec
            .raw
            .iter()
            .flat_map(|raw| raw.environment.iter())
            .map(|v| (v.name.clone(), v.value.clone())),
    );
    let job = task
        .labels()
        .get(labels::JOB)
        .cloned()
        .or_else(|| {
            task.owner_references()
                .iter()
                .find(|o| o.kind == "Job")
                .map(|o| o.name.clone())
        })
        .unwrap_or_default();
    let annotations = task.annotations();
    let number = |key: &str| annotations.get(key).and_then(|v| v.parse::<u64>().ok());
    let rank_start = number(labels::RAY_NODE_RANK_START).unwrap_or(0);
    let total_nodes = number(labels::RAY_TOTAL_NODES)
        .unwrap_or_else(|| u64::try_from(task.spec.replicas()).unwrap_or(0));
    let index_u64 = u64::try_from(index).unwrap_or(u64::MAX);
    let mut contract: Vec<(&str, String)> = vec![
        ("RLARK_SERVER", ctx.server_url.clone()),
        ("RLARK_CLUSTER_ID", ctx.cluster_id.clone()),
        ("RLARK_NODE_NAME", ctx.node_name.clone()),
        ("RLARK_NAMESPACE", task.namespace().unwrap_or_default()),
        ("RLARK_JOB", job),
        ("RLARK_TASK", name.clone()),
        ("RLARK_TASK_UID", task.uid().unwrap_or_default()),
        ("RLARK_TASK_ROLE", task.spec.role.as_str().to_string()),
        ("RLARK_POD_NAME", pod_name(&name, index)),
        ("RLARK_REPLICA_INDEX", index.to_string()),
        ("RLARK_NODE_RANK_START", rank_start.to_string()),
        (
            "RLARK_NODE_RANK",
            rank_start.saturating_add(index_u64).to_string(),
        ),
        ("RLARK_TOTAL_NODES", total_nodes.to_string()),
    ];
    let domain = task.spec.domain.as_deref().filter(|d| !d.is_empty());
    if let Some(domain) = domain {
        contract.push(("RLARK_DOMAIN", domain.to_string()));
    }
    if let Some(role) = annotations.get(labels::RAY_ROLE).filter(|r| !r.is_empty()) {
        contract.push(("RLARK_RAY_ROLE", role.clone()));
    }
    let head = annotations
        .get(labels::RAY_HEAD_TASK_NAME)
        .filter(|h| !h.is_empty());
    if let (Some(head), Some(domain)) = (head, domain) {
        contract.push((
            "RLARK_HEAD_ADDRESS",
            format!("{}.{domain}", pod_name(head, 0)),
        ));
    }
    env.retain(|(key, _)| !OPTIONAL_CONTRACT.contains(&key.as_str()));
    env.extend(contract.into_iter().map(|(k, v)| (k.to_string(), v)));
    env
}

/// `state.json` of a started replica (see the module documentation).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaState {
    /// Namespace of the Task (and Pod).
    pub namespace: String,
    /// Task name.
    pub task: String,
    /// Task UID.
    pub uid: String,
    /// Replica index.
    pub index: usize,
    /// [`run_key`] of the run.
    pub run_key: String,
    /// Pid of the main process.
    pub pid: u32,
    /// Its process group.
    pub pgid: i32,
    /// Its start in clock ticks after boot (`/proc/<pid>/stat`), to tell it from a later
    /// process with the same pid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proc_start_ticks: Option<u64>,
    /// When it was started (RFC 3339).
    pub start_time: String,
    /// SIGTERM → SIGKILL grace period.
    pub grace_seconds: u64,
    /// The final Pod status, once the exit was seen but before it was reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_status: Option<Value>,
}

impl ReplicaState {
    /// Read a state file.
    pub fn read(path: &Path) -> io::Result<ReplicaState> {
        let text = std::fs::read(path)?;
        serde_json::from_slice(&text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// Write a state file atomically (temporary file, then rename).
    pub fn write(&self, path: &Path) -> io::Result<()> {
        let text = serde_json::to_vec_pretty(self).map_err(io::Error::other)?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, path)
    }
}

/// Run the reconciler until `shutdown` is cancelled (see the module documentation).
/// Returns an error only for a bad context or when the data directory cannot be created.
pub async fn run_tasks(
    client: kube::Client,
    ctx: TaskContext,
    shutdown: CancellationToken,
) -> Result<(), TaskError> {
    if rlark_api::names::dns1123_label(&ctx.cluster_id).is_err() {
        return Err(TaskError::InvalidClusterId(ctx.cluster_id));
    }
    if ctx.node_name.is_empty() {
        return Err(TaskError::EmptyNodeName);
    }
    std::fs::create_dir_all(&ctx.data_dir).map_err(|source| TaskError::DataDir {
        path: ctx.data_dir.clone(),
        source,
    })?;
    let namespace = rlark_api::names::agent_namespace(&ctx.cluster_id);
    let shared = Arc::new(Shared {
        client,
        ctx,
        namespace,
        shutdown,
        task_tokens: TaskTokens::default(),
        recovered: Mutex::new(BTreeMap::new()),
    });
    tokio::select! {
        _ = shared.shutdown.cancelled() => return Ok(()),
        _ = recover(&shared) => {}
    }
    let mut reconciler = Reconciler {
        shared,
        tasks: BTreeMap::new(),
        workers: BTreeMap::new(),
        retired: BTreeMap::new(),
        generation: 0,
        swept: false,
        listed_pods: None,
    };
    let result = reconciler.watch().await;
    reconciler.stop_workers().await;
    result
}

/// State shared by the reconciler and its workers.
struct Shared {
    client: kube::Client,
    ctx: TaskContext,
    namespace: String,
    shutdown: CancellationToken,
    /// Task tokens of the runs started here (the event environment).
    task_tokens: TaskTokens,
    /// Replicas left by an earlier agent, by replica, until their worker (or the sweep)
    /// takes them.
    recovered: Mutex<BTreeMap<ReplicaId, Vec<Recovered>>>,
}

impl Shared {
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Take the replicas an earlier agent left for replica `id`.
    fn take_recovered(&self, id: &ReplicaId) -> Vec<Recovered> {
        self.recovered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id)
            .unwrap_or_default()
    }
}

/// Retry bookkeeping for one API operation: growing pauses; gives up only while the
/// agent shuts down.
struct Retry {
    pause: Duration,
    after_shutdown: u32,
}

impl Retry {
    fn new() -> Self {
        Self {
            pause: RETRY_MIN,
            after_shutdown: 0,
        }
    }

    /// Log `error`, pause, and say whether to try again.
    async fn again(&mut self, shared: &Shared, what: &str, error: &kube::Error) -> bool {
        if shared.shutdown.is_cancelled() {
            self.after_shutdown += 1;
            if self.after_shutdown >= SHUTDOWN_ATTEMPTS {
                tracing::warn!(%error, what, "giving up: the agent is shutting down");
                return false;
            }
            self.pause = RETRY_MIN;
        }
        tracing::warn!(%error, what, retry_in_ms = self.pause.as_millis() as u64, "API call failed");
        tokio::select! {
            _ = tokio::time::sleep(self.pause) => {}
            // Shutting down: hurry through the last attempts.
            _ = shared.shutdown.cancelled(), if self.after_shutdown == 0 => {}
        }
        self.pause = (self.pause * 2).min(RETRY_MAX);
        true
    }
}

fn is_status(error: &kube::Error, code: u16) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == code)
}

// ---------------------------------------------------------------------------------------
// Startup recovery
// ---------------------------------------------------------------------------------------

/// A replica left by an earlier agent (its state file has no final status), waiting for
/// the worker of its replica to adopt or end it (or for [`Reconciler::sweep`]).
#[derive(Debug)]
struct Recovered {
    /// Its `state.json`.
    path: PathBuf,
    state: ReplicaState,
}

impl Recovered {
    fn replica_dir(&self) -> PathBuf {
        self.path
            .parent()
            .map_or_else(PathBuf::new, Path::to_path_buf)
    }

    fn grace(&self) -> Duration {
        // Written by an agent, perhaps an older one that did not cut the grace period.
        Duration::from_secs(self.state.grace_seconds).min(MAX_GRACE)
    }

    fn remove_state(&self) {
        remove_state_file(&self.path);
    }
}

fn remove_state_file(path: &Path) {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => {
            tracing::warn!(file = %path.display(), %error, "remove replica state file");
        }
        _ => {}
    }
}

/// Handle the state files left by an earlier agent (see the module documentation): a
/// recorded final status is reported now; every other replica waits in
/// [`Shared::recovered`] for its worker.
async fn recover(shared: &Shared) {
    let root = shared.ctx.data_dir.join(&shared.namespace);
    let files = tokio::task::spawn_blocking(move || find_state_files(&root))
        .await
        .unwrap_or_default();
    let mut left = Vec::new();
    for path in files {
        let state = match ReplicaState::read(&path) {
            Ok(state) if state.namespace == shared.namespace => state,
            Ok(_) => continue,
            Err(error) => {
                tracing::warn!(file = %path.display(), %error, "unreadable replica state file; removing it");
                remove_state_file(&path);
                continue;
            }
        };
        left.push(Recovered { path, state });
    }
    let (reported, waiting): (Vec<Recovered>, Vec<Recovered>) = left
        .into_iter()
        .partition(|r| r.state.final_status.is_some());
    futures::future::join_all(reported.iter().map(|r| async move {
        let status = r.state.final_status.clone().unwrap_or_default();
        if report_left_status(shared, &r.state, status).await {
            tracing::info!(task = %r.state.task, index = r.state.index, "reported the final status an earlier agent recorded");
            r.remove_state();
        }
    }))
    .await;
    let mut recovered = shared.recovered.lock().unwrap_or_else(|e| e.into_inner());
    for r in waiting {
        tracing::info!(task = %r.state.task, index = r.state.index, pid = r.state.pid, "found a replica left by an earlier agent");
        recovered
            .entry((r.state.task.clone(), r.state.index))
            .or_default()
            .push(r);
    }
}

/// `<root>/<task>/<uid>/<index>/state.json` files.
fn find_state_files(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for task in subdirs(root) {
        for uid in subdirs(&task) {
            for index in subdirs(&uid) {
                let file = index.join(STATE_FILE);
                if file.is_file() {
                    files.push(file);
                }
            }
        }
    }
    files
}

/// The subdirectories of `dir` (none when it cannot be read).
fn subdirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

/// Write `status` to the Pod of `state`'s replica if the Pod is still that run's and not
/// final yet. Returns false only when the agent shut down first.
async fn report_left_status(shared: &Shared, state: &ReplicaState, status: Value) -> bool {
    let api: Api<Pod> = shared.pods();
    let name = pod_name(&state.task, state.index);
    let mut retry = Retry::new();
    loop {
        let attempt = async {
            let Some(pod) = api.get_opt(&name).await? else {
                return Ok(());
            };
            if is_run_of(&pod, state) && !pod_is_terminal(&pod) {
                api.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await?;
            }
            Ok(())
        };
        match attempt.await {
            Ok(()) => return true,
            Err(error) if is_status(&error, 404) => return true,
            Err(error) => {
                if !retry
                    .again(shared, "report a replica left by an earlier agent", &error)
                    .await
                {
                    return false;
                }
            }
        }
    }
}

/// Whether `pod` is the Pod of the run `state` was started for.
fn is_run_of(pod: &Pod, state: &ReplicaState) -> bool {
    pod.annotations().get(TASK_UID_ANNOTATION) == Some(&state.uid)
        && pod.annotations().get(RUN_KEY_ANNOTATION) == Some(&state.run_key)
}

/// The `AgentLost` status of a replica whose outcome is unknown.
fn lost_status(message: String) -> Value {
    json!({
        "phase": "Failed",
        "reason": REASON_AGENT_LOST,
        "exitCode": null,
        "message": message,
        "finishTime": Time(Timestamp::now()),
    })
}

/// A replica recorded without a supervisor record (`pid.json`; a start by an agent that
/// ran processes without supervisors): its process group is killed, its outcome unknown.
/// Returns the `AgentLost` message.
async fn end_unrecorded(state: &ReplicaState) -> String {
    let leader_running = process::process_running(state.pid, state.proc_start_ticks);
    // Without its leader, the group can only still exist with our stragglers in it (a
    // process group id is not reused while any member lives).
    let leader_pid_taken = process::proc_stat(state.pid).is_some();
    let group_left = leader_running || (!leader_pid_taken && process::group_exists(state.pgid));
    if group_left {
        process::kill_group(state.pgid, Duration::from_secs(state.grace_seconds)).await;
    }
    let what = if leader_running {
        "it was still running without a supervisor, so the agent killed its process group"
    } else if group_left {
        "its main process had exited unseen and the rest of its process group was killed"
    } else {
        "it has exited since without the agent seeing how"
    };
    format!(
        "the agent restarted while this replica (pid {}) was running, and no supervisor \
         recorded its exit: {what}; the outcome of the run is unknown",
        state.pid
    )
}

/// End a replica left by an earlier agent that no worker takes over (another run, a Task
/// deleted, stopped placing it here, or scaled down): a running one is stopped (SIGTERM,
/// SIGKILL after its grace period), stragglers are killed; with `delete_own_pod`, the Pod is
/// deleted if it is still that run's. The state file goes.
async fn end_recovered(shared: &Shared, r: Recovered, delete_own_pod: bool) {
    let mut spec = ReplicaSpec::new(Vec::new(), r.replica_dir());
    spec.grace = r.grace();
    spec.log_limits = LogLimits::default();
    match runtime::adopt_replica(&spec).await {
        Adoption::Running(mut handle) => {
            let exit = handle.terminate(r.grace()).await;
            tracing::info!(task = %r.state.task, index = r.state.index, status = %exit.status, "stopped a replica left by an earlier agent that is no longer wanted");
        }
        Adoption::Exited(_) | Adoption::Lost(_) => {}
        Adoption::NoRecord => {
            end_unrecorded(&r.state).await;
        }
    }
    if delete_own_pod {
        let api = shared.pods();
        let name = pod_name(&r.state.task, r.state.index);
        let mut retry = Retry::new();
        loop {
            let result = match api.get_opt(&name).await {
                Ok(Some(pod)) if is_run_of(&pod, &r.state) => delete_pod(&api, &pod).await,
                Ok(_) => Ok(()),
                Err(error) => Err(error),
            };
            match result {
                Ok(()) => break,
                Err(error) => {
                    if !retry.again(shared, "delete pod", &error).await {
                        break;
                    }
                }
            }
        }
    }
    r.remove_state();
}

// ---------------------------------------------------------------------------------------
// The reconciler
// ---------------------------------------------------------------------------------------

/// One replica: Task name and index.
type ReplicaId = (String, usize);

/// What the reconciler wants from a worker.
#[derive(Clone, Debug)]
enum Command {
    /// Run (or keep running) this Task's replica; `resync` changes on every resync.
    Run { task: Arc<Task>, resync: u64 },
    /// A new run replaces this one: kill the process; the next worker replaces the Pod.
    Supersede,
    /// The replica is no longer wanted here: kill the process and delete the Pod.
    Remove,
    /// The agent stops: leave the process (or stop it, per `stop_tasks_on_exit`).
    Shutdown,
}

/// A worker: dropping it (the reconciler aborted, as when the agent crashes) aborts it,
/// so nothing of a dead agent keeps acting on its replicas.
struct WorkerHandle {
    key: String,
    commands: watch::Sender<Command>,
    join: AbortOnDropHandle<()>,
}

impl WorkerHandle {
    fn update(&self, task: Arc<Task>, resync: u64) {
        self.commands.send_if_modified(|current| {
            let same = matches!(current, Command::Run { task: old, resync: r }
                if *r == resync && old.resource_version() == task.resource_version());
            if !same {
                *current = Command::Run { task, resync };
            }
            !same
        });
    }
}

struct Reconciler {
    shared: Arc<Shared>,
    /// The Tasks of the namespace, by name, as last listed and watched.
    tasks: BTreeMap<String, Arc<Task>>,
    workers: BTreeMap<ReplicaId, WorkerHandle>,
    /// Workers told to go (and ends of replicas left by an earlier agent) that may still
    /// be running; a new worker for the same replica waits for the old one.
    retired: BTreeMap<ReplicaId, AbortOnDropHandle<()>>,
    generation: u64,
    /// [`Reconciler::sweep`] ran.
    swept: bool,
    /// Names of the Pods of the namespace in the listing taken at the last (re)list of the
    /// Tasks (`None`: that listing failed). A worker whose Pod was not there creates it
    /// without reading it first.
    listed_pods: Option<HashSet<String>>,
}

impl Reconciler {
    async fn watch(&mut self) -> Result<(), TaskError> {
        let api: Api<Task> = Api::namespaced(self.shared.client.clone(), &self.shared.namespace);
        let mut stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut listing: Option<BTreeMap<String, Arc<Task>>> = None;
        let mut synced = false;
        let mut resync =
            tokio::time::interval_at(Instant::now() + RESYNC_INTERVAL, RESYNC_INTERVAL);
        let shutdown = self.shared.shutdown.clone();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = resync.tick() => self.generation += 1,
                event = stream.next() => match event {
                    None => return Err(TaskError::WatchEnded),
                    Some(Ok(watcher::Event::Apply(task))) => {
                        self.tasks.insert(task.name_any(), Arc::new(task));
                    }
                    Some(Ok(watcher::Event::Delete(task))) => {
                        self.tasks.remove(&task.name_any());
                    }
                    Some(Ok(watcher::Event::Init)) => listing = Some(BTreeMap::new()),
                    Some(Ok(watcher::Event::InitApply(task))) => {
                        if let Some(listing) = listing.as_mut() {
                            listing.insert(task.name_any(), Arc::new(task));
                        }
                    }
                    Some(Ok(watcher::Event::InitDone)) => {
                        if let Some(listing) = listing.take() {
                            self.tasks = listing;
                        }
                        synced = true;
                        self.delete_orphan_pods().await;
                    }
                    Some(Err(error)) => {
                        tracing::warn!(%error, "task watch failed (retrying)");
                        continue;
                    }
                },
            }
            if synced {
                self.reconcile();
                if !self.swept {
                    self.sweep();
                    self.swept = true;
                }
            }
            self.retired.retain(|_, join| !join.is_finished());
        }
    }

    /// The replicas that should run here: id → (run key, Task).
    fn desired(&self) -> BTreeMap<ReplicaId, (String, Arc<Task>)> {
        let ctx = &self.shared.ctx;
        let mut desired = BTreeMap::new();
        for (name, task) in &self.tasks {
            let Some(key) = run_key(task, &ctx.cluster_id) else {
                continue;
            };
            let replicas = usize::try_from(task.spec.replicas().max(0)).unwrap_or(0);
            let nodes = task
                .spec
                .placement
                .as_ref()
                .map(|p| p.nodes.as_slice())
                .unwrap_or_default();
            for (index, node) in nodes.iter().enumerate().take(replicas) {
                if *node == ctx.node_name {
                    desired.insert((name.clone(), index), (key.clone(), task.clone()));
                }
            }
        }
        desired
    }

    /// One pass: start, update, replace and retire workers so they match the Tasks.
    fn reconcile(&mut self) {
        let desired = self.desired();
        let unwanted: Vec<ReplicaId> = self
            .workers
            .keys()
            .filter(|id| !desired.contains_key(*id))
            .cloned()
            .collect();
        for id in unwanted {
            if let Some(worker) = self.workers.remove(&id) {
                worker.commands.send_replace(Command::Remove);
                self.retired.insert(id, worker.join);
            }
        }
        for (id, (key, task)) in desired {
            if let Some(worker) = self.workers.get(&id)
                && worker.key == key
            {
                worker.update(task, self.generation);
                continue;
            }
            let previous = match self.workers.remove(&id) {
                Some(old) => {
                    old.commands.send_replace(Command::Supersede);
                    Some(old.join)
                }
                None => self.retired.remove(&id),
            };
            let (commands, receiver) = watch::channel(Command::Run {
                task: task.clone(),
                resync: self.generation,
            });
            let pod = pod_name(&id.0, id.1);
            let pod_may_exist = self
                .listed_pods
                .as_ref()
                .is_none_or(|listed| listed.contains(&pod));
            let worker = Worker {
                shared: self.shared.clone(),
                pod,
                pod_may_exist,
                index: id.1,
                key: key.clone(),
                commands: receiver,
                task,
                resync: self.generation,
                reported: Map::new(),
                state: None,
                resume: None,
            };
            let join = AbortOnDropHandle::new(tokio::spawn(worker.run(previous)));
            self.workers.insert(
                id,
                WorkerHandle {
                    key,
                    commands,
                    join,
                },
            );
        }
    }

    /// End the replicas left by an earlier agent that no worker took over after the first
    /// full listing (see [`end_recovered`]); a later worker of the same replica waits for
    /// that end.
    fn sweep(&mut self) {
        let left: Vec<(ReplicaId, Vec<Recovered>)> = {
            let mut recovered = self
                .shared
                .recovered
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let ids: Vec<ReplicaId> = recovered
                .keys()
                .filter(|id| !self.workers.contains_key(*id))
                .cloned()
                .collect();
            ids.into_iter()
                .filter_map(|id| recovered.remove(&id).map(|r| (id, r)))
                .collect()
        };
        for (id, replicas) in left {
            let shared = self.shared.clone();
            let previous = self.retired.remove(&id);
            let join = tokio::spawn(async move {
                if let Some(previous) = previous {
                    let _ = previous.await;
                }
                for r in replicas {
                    end_recovered(&shared, r, true).await;
                }
            });
            self.retired.insert(id, AbortOnDropHandle::new(join));
        }
    }

    /// Delete the Pods on this node whose Task no longer exists (deleted while the agent
    /// was away or the watch was down). One attempt; the next relist tries again.
    /// Also records the listed names ([`Reconciler::listed_pods`]).
    async fn delete_orphan_pods(&mut self) {
        let api = self.shared.pods();
        let pods = match api
            .list(&ListParams::default().labels(labels::TASK_NAME))
            .await
        {
            Ok(list) => list.items,
            Err(error) => {
                tracing::warn!(%error, "list pods to clean up");
                self.listed_pods = None;
                return;
            }
        };
        self.listed_pods = Some(pods.iter().map(kube::ResourceExt::name_any).collect());
        for pod in pods {
            let task = pod
                .labels()
                .get(labels::TASK_NAME)
                .cloned()
                .unwrap_or_default();
            let on_this_node = pod.status.as_ref().and_then(|s| s.node.as_deref())
                == Some(self.shared.ctx.node_name.as_str());
            let ours_running = self.workers.keys().any(|(t, _)| *t == task);
            if on_this_node && !ours_running && !self.tasks.contains_key(&task) {
                tracing::info!(pod = %pod.name_any(), task = %task, "deleting the pod of a deleted task");
                if let Err(error) = delete_pod(&api, &pod).await {
                    tracing::warn!(%error, pod = %pod.name_any(), "delete orphan pod");
                }
            }
        }
    }

    /// Tell every worker the agent stops and wait for all of them.
    async fn stop_workers(&mut self) {
        let mut joins: Vec<AbortOnDropHandle<()>> = Vec::new();
        for (_, worker) in std::mem::take(&mut self.workers) {
            worker.commands.send_replace(Command::Shutdown);
            joins.push(worker.join);
        }
        joins.extend(std::mem::take(&mut self.retired).into_values());
        for join in joins {
            if let Err(error) = join.await {
                tracing::warn!(%error, "replica worker failed");
            }
        }
    }
}

/// Delete `pod` (that very object: UID precondition); absent or replaced is fine.
async fn delete_pod(api: &Api<Pod>, pod: &Pod) -> Result<(), kube::Error> {
    let params = DeleteParams {
        preconditions: pod.uid().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&pod.name_any(), &params).await {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(()),
        Err(e) => Err(e),
    }
}

fn pod_phase(pod: &Pod) -> Option<PodPhase> {
    pod.status.as_ref().and_then(|s| s.phase)
}

fn pod_is_terminal(pod: &Pod) -> bool {
    matches!(pod_phase(pod), Some(PodPhase::Succeeded | PodPhase::Failed))
}

fn pod_reason(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.reason.as_deref())
}

// ---------------------------------------------------------------------------------------
// One replica's worker
// ---------------------------------------------------------------------------------------

/// Where a worker stands between steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Start the replica (its Pod exists, or is created by the first status write).
    Start,
    /// The run ended (succeeded, failed, lost): nothing runs, nothing will.
    Finished,
    /// Ended by `spec.stopped`: a resume starts it again.
    Stopped,
    /// The worker ends.
    Exit,
}

/// How supervising a running process ended.
enum Supervised {
    Exited(ReplicaExit),
    Stopped(ReplicaExit),
    Leave(Step),
}

/// How waiting for a restart ended.
enum Waited {
    Restart,
    Stopped,
    Deadline,
    Leave(Step),
}

struct Worker {
    shared: Arc<Shared>,
    pod: String,
    /// The Pod was listed at the last relist (or no listing succeeded): read it before
    /// acting. Otherwise it is created straight away.
    pod_may_exist: bool,
    index: usize,
    key: String,
    commands: watch::Receiver<Command>,
    /// The Task as last seen.
    task: Arc<Task>,
    resync: u64,
    /// The Pod status as this worker last wrote it (re-asserted on resync).
    reported: Map<String, Value>,
    /// The state file of the running process.
    state: Option<ReplicaState>,
    /// Where [`Worker::run_replica`] takes up a run an earlier agent started.
    resume: Option<Resume>,
}

/// A run taken over from an earlier agent.
struct Resume {
    /// Restarts so far (the Pod's `restartCount`).
    restarts: i32,
    /// The run's first start (the Pod's `startTime`).
    first_start: Timestamp,
    /// `activeDeadlineSeconds` after `first_start`.
    deadline: Option<Instant>,
    /// Where the run stands.
    at: Resumed,
}

enum Resumed {
    /// Its process runs: supervise it.
    Running(ReplicaHandle),
    /// Its process ended while no agent watched: go on from that exit (restart policy).
    Exited(ReplicaExit),
    /// It was waiting to restart: start it again now.
    Restart,
}

impl Worker {
    async fn run(mut self, previous: Option<AbortOnDropHandle<()>>) {
        if let Some(previous) = previous {
            let _ = previous.await;
        }
        let recovered = self
            .shared
            .take_recovered(&(self.task.name_any(), self.index));
        let mut step = self.first_step(recovered).await;
        loop {
            step = match step {
                Step::Start => self.run_replica().await,
                Step::Finished | Step::Stopped => self.idle(step).await,
                Step::Exit => return,
            };
        }
    }

    fn uid(&self) -> String {
        self.task.uid().unwrap_or_default()
    }

    fn replica_dir(&self) -> PathBuf {
        replica_dir(
            &self.shared.ctx.data_dir,
            &self.shared.namespace,
            &self.task.name_any(),
            &self.uid(),
            self.index,
        )
    }

    fn grace(&self) -> Duration {
        grace_period(self.task.spec.raw.as_ref())
    }

    fn is_ours(&self, pod: &Pod) -> bool {
        pod.annotations().get(RUN_KEY_ANNOTATION) == Some(&self.key)
    }

    /// Decide from what an earlier agent left (`recovered`) and the existing Pod (an
    /// earlier agent's, an earlier run's, or none).
    async fn first_step(&mut self, recovered: Vec<Recovered>) -> Step {
        tracing::debug!(pod = %self.pod, recovered = recovered.len(), "replica worker started");
        // Replicas of other runs end first: this run may use the same directory.
        let mut mine = None;
        for r in recovered {
            if mine.is_none() && r.state.run_key == self.key && r.state.uid == self.uid() {
                mine = Some(r);
            } else {
                end_recovered(&self.shared, r, false).await;
            }
        }
        if mine.is_none() && !self.pod_may_exist && !self.task.spec.stopped {
            // A replica of a Task that appeared since the last listing: its Pod is new.
            self.prefetch_task_token();
            match self.create_new_pod().await {
                Some(true) => {
                    self.reported = Map::new();
                    return Step::Start;
                }
                // There after all (another run's, or created since the listing): read it.
                Some(false) => {}
                None => return Step::Exit,
            }
        }
        let Some(existing) = self.get_pod().await else {
            return Step::Exit;
        };
        let existing = existing.filter(|pod| {
            // A Pod under deletion is as good as gone.
            pod.metadata.deletion_timestamp.is_none()
        });
        let ours = existing.as_ref().filter(|pod| self.is_ours(pod));
        if let Some(pod) = ours {
            self.reported = status_map(pod);
        }
        if let Some(r) = mine {
            return self.adopt(r, ours.cloned()).await;
        }
        if self.task.spec.stopped {
            if let Some(pod) = ours
                && !pod_is_terminal(pod)
            {
                let status = json!({
                    "phase": "Failed",
                    "reason": REASON_STOPPED,
                    "message": "stopped on request before this agent ran the replica",
                    "finishTime": Time(Timestamp::now()),
                });
                self.write_status(status, false).await;
            }
            return Step::Stopped;
        }
        match (ours, &existing) {
            (Some(pod), _) => match pod_phase(pod) {
                Some(PodPhase::Succeeded) => Step::Finished,
                Some(PodPhase::Failed) if pod_reason(pod) == Some(REASON_STOPPED) => {
                    // Stopped, and the Task is not stopped any more: a resume.
                    self.fresh_pod(existing.as_ref()).await
                }
                Some(PodPhase::Failed) => Step::Finished,
                Some(PodPhase::Running) if pod_reason(pod) == Some(REASON_BACKOFF) => {
                    // An earlier agent stopped while the replica waited to restart
                    // (nothing runs then): restart it now.
                    let (restarts, first_start) = pod_progress(pod, None);
                    tracing::info!(pod = %self.pod, restarts, "restarting a replica an earlier agent left waiting to restart");
                    self.resume = Some(Resume {
                        restarts: restarts.saturating_add(1),
                        first_start,
                        deadline: self.deadline_from(first_start),
                        at: Resumed::Restart,
                    });
                    Step::Start
                }
                Some(PodPhase::Running) => {
                    let status = lost_status(
                        "the agent has no record of this replica's process (it was reported \
                         Running before the agent restarted); the outcome of the run is unknown"
                            .to_string(),
                    );
                    self.write_status(status, false).await;
                    Step::Finished
                }
                // Created but never started: start it.
                Some(PodPhase::Pending) | None => Step::Start,
            },
            (None, _) => self.fresh_pod(existing.as_ref()).await,
        }
    }

    /// Take over this run's replica `r`, left by an earlier agent: adopt its running
    /// process, or go on from its recorded exit, or report it lost.
    async fn adopt(&mut self, r: Recovered, pod: Option<Pod>) -> Step {
        let (restarts, first_start) = pod_progress_or_state(pod.as_ref(), &r.state);
        let deadline = self.deadline_from(first_start);
        let mut spec = ReplicaSpec::new(Vec::new(), self.replica_dir());
        spec.deadline = deadline;
        spec.grace = self.grace();
        spec.supervisor = self.shared.ctx.supervisor.clone();
        self.state = Some(r.state.clone());
        let at = match runtime::adopt_replica(&spec).await {
            Adoption::Running(handle) => {
                tracing::info!(pod = %self.pod, pid = handle.pid(), supervisor = handle.supervisor_pid(), "adopted a running replica");
                Resumed::Running(handle)
            }
            Adoption::Exited(exit) => {
                tracing::info!(pod = %self.pod, status = %exit.status, "a replica ended while no agent ran");
                Resumed::Exited(exit)
            }
            Adoption::Lost(message) => {
                self.finish(lost_status(message)).await;
                return self.after_final();
            }
            Adoption::NoRecord => {
                let message = end_unrecorded(&r.state).await;
                self.finish(lost_status(message)).await;
                return self.after_final();
            }
        };
        if self.task.spec.stopped {
            let status = match at {
                Resumed::Running(mut handle) => {
                    tracing::info!(pod = %self.pod, "stopping replica (task stopped)");
                    let exit = handle.terminate(self.grace()).await;
                    stopped_status(Some(&exit), self.grace(), restarts)
                }
                Resumed::Exited(exit) => final_status(&exit, restarts),
                Resumed::Restart => stopped_status(None, self.grace(), restarts),
            };
            self.finish(status).await;
            return Step::Stopped;
        }
        self.resume = Some(Resume {
            restarts,
            first_start,
            deadline,
            at,
        });
        Step::Start
    }

    /// The step after a final status written at adoption.
    fn after_final(&self) -> Step {
        if self.task.spec.stopped {
            Step::Stopped
        } else {
            Step::Finished
        }
    }

    /// `activeDeadlineSeconds` after `first_start`, as an instant (now when it passed).
    fn deadline_from(&self, first_start: Timestamp) -> Option<Instant> {
        let elapsed = SystemTime::now()
            .duration_since(SystemTime::from(first_start))
            .unwrap_or_default();
        run_deadline(self.task.spec.raw.as_ref()?, Instant::now(), elapsed)
    }

    /// Replace `existing` (if any) by a new Pod for this run.
    async fn fresh_pod(&mut self, existing: Option<&Pod>) -> Step {
        self.reported = Map::new();
        self.prefetch_task_token();
        if let Some(pod) = existing
            && !self.delete_pod(pod).await
        {
            return Step::Exit;
        }
        if self.create_pod().await {
            Step::Start
        } else {
            Step::Exit
        }
    }

    /// A replica of a new run starts next: mint the run's task token (one API round trip)
    /// while its Pod is created, rather than after. `start` finds it in the cache, or
    /// waits for this very mint.
    fn prefetch_task_token(&self) {
        if self.task.spec.raw.is_some() {
            let shared = Arc::clone(&self.shared);
            let task = Arc::clone(&self.task);
            tokio::spawn(async move {
                shared
                    .task_tokens
                    .env(
                        &shared.client,
                        &shared.ctx.server_url,
                        &shared.ctx.ca_file,
                        &task,
                    )
                    .await;
            });
        }
    }

    /// Nothing runs: follow the Task until a resume, a removal or the end.
    async fn idle(&mut self, step: Step) -> Step {
        loop {
            match self.next_command().await {
                Command::Run { task, resync } => {
                    self.task = task;
                    if step == Step::Stopped && !self.task.spec.stopped {
                        let existing = match self.get_pod().await {
                            Some(pod) => pod.filter(|p| self.is_ours(p)),
                            None => return Step::Exit,
                        };
                        return self.fresh_pod(existing.as_ref()).await;
                    }
                    // A final status was written successfully (or is kept in the state
                    // file): nothing to re-assert for a replica that does not run.
                    self.resync = resync;
                }
                Command::Supersede | Command::Shutdown => return Step::Exit,
                Command::Remove => {
                    self.delete_own_pod().await;
                    return Step::Exit;
                }
            }
        }
    }

    /// Run the replica, with restarts, until it ends for good or the worker is told
    /// otherwise. Takes up [`Worker::resume`] when set.
    async fn run_replica(&mut self) -> Step {
        let node = self.shared.ctx.node_name.clone();
        let resume = self.resume.take();
        // A fresh run is reported Pending (fields of an earlier run cleared) only when its
        // first process takes a while to start ([`PENDING_AFTER`]): `Running` clears the
        // same fields, and one write less per start matters in a burst.
        let mut pending = resume.is_none().then(|| {
            json!({
                "phase": "Pending",
                "node": node,
                "reason": null,
                "message": null,
                "exitCode": null,
                "startTime": null,
                "finishTime": null,
                "restartCount": 0,
            })
        });
        let Some(raw) = self.task.spec.raw.clone() else {
            let status = json!({
                "phase": "Failed",
                "reason": REASON_UNSUPPORTED_AGENT_TYPE,
                "message": format!(
                    "this agent runs raw tasks only; the task's agentType is {}",
                    self.task.spec.agent_type
                ),
                "finishTime": Time(Timestamp::now()),
            });
            self.write_status(status, true).await;
            return Step::Finished;
        };
        let deadline_secs = raw
            .active_deadline_seconds
            .and_then(|s| u64::try_from(s).ok());
        let fresh_run = resume.is_none();
        let (mut deadline, mut first_start, mut restarts, mut resumed) = match resume {
            None => (None, None, 0, None),
            Some(r) => (r.deadline, Some(r.first_start), r.restarts, Some(r.at)),
        };
        let mut backoff = BACKOFF_INITIAL;
        loop {
            let raw = self.task.spec.raw.clone().unwrap_or_else(|| raw.clone());
            if deadline.is_none() {
                deadline = run_deadline(&raw, Instant::now(), Duration::ZERO);
            }
            let (exit, started_at) = match resumed.take() {
                Some(Resumed::Exited(exit)) => {
                    let started_at = self
                        .state
                        .as_ref()
                        .and_then(|s| s.start_time.parse::<Timestamp>().ok())
                        .map_or(exit.finished_at, SystemTime::from);
                    (exit, started_at)
                }
                adopted => {
                    let mut handle = match adopted {
                        Some(Resumed::Running(handle)) => handle,
                        _ => match self.start(&raw, deadline, restarts, pending.take()).await {
                            Some(handle) => handle,
                            None => return Step::Finished,
                        },
                    };
                    let start_time = *first_start.get_or_insert(timestamp(handle.started_at()));
                    let running = json!({
                        "phase": "Running",
                        "node": node,
                        "startTime": Time(start_time),
                        "restartCount": restarts,
                        "reason": null,
                        "message": null,
                        "exitCode": null,
                        "finishTime": null,
                    });
                    self.write_status(running, true).await;
                    if fresh_run && restarts == 0 {
                        self.prune_old_runs().await;
                    }
                    match self.supervise(&mut handle).await {
                        Supervised::Leave(step) => return step,
                        Supervised::Stopped(exit) => {
                            let status = stopped_status(Some(&exit), self.grace(), restarts);
                            self.finish(status).await;
                            return Step::Stopped;
                        }
                        Supervised::Exited(exit) => (exit, handle.started_at()),
                    }
                }
            };
            if exit.cause == ExitCause::DeadlineExceeded {
                let status = deadline_status(deadline_secs, Some(&exit), self.grace(), restarts);
                self.finish(status).await;
                return Step::Finished;
            }
            let restart = match raw.restart_policy {
                RestartPolicy::Never => false,
                RestartPolicy::OnFailure => !exit.status.success(),
                RestartPolicy::Always => true,
            };
            if !restart {
                self.finish_exited(final_status(&exit, restarts)).await;
                return Step::Finished;
            }
            // Restart after a backoff; the Pod stays Running meanwhile.
            let ran_for = exit
                .finished_at
                .duration_since(started_at)
                .unwrap_or_default();
            if ran_for >= BACKOFF_RESET_AFTER {
                backoff = BACKOFF_INITIAL;
            }
            let waiting = json!({
                "phase": "Running",
                "reason": REASON_BACKOFF,
                "message": format!(
                    "the process {}; restarting in {}s (restart {})",
                    exit.status,
                    backoff.as_secs(),
                    restarts + 1
                ),
                "exitCode": exit.status.code(),
            });
            self.write_status(waiting, true).await;
            // After the BackOff write: an agent that stops in between finds the exit
            // again (state file) or the BackOff reason, and restarts either way.
            self.remove_state();
            match self.wait_restart(backoff, deadline).await {
                Waited::Restart => {}
                Waited::Leave(step) => return step,
                Waited::Stopped => {
                    let status = stopped_status(None, self.grace(), restarts);
                    self.finish(status).await;
                    return Step::Stopped;
                }
                Waited::Deadline => {
                    let status = deadline_status(deadline_secs, None, self.grace(), restarts);
                    self.finish(status).await;
                    return Step::Finished;
                }
            }
            restarts += 1;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// Start the replica's process (and record it in the state file); `None` after
    /// reporting a start error. `pending` (the Pending status of a fresh run) is written,
    /// concurrently, when starting takes longer than [`PENDING_AFTER`], and always before
    /// whatever is reported next.
    async fn start(
        &mut self,
        raw: &RawTaskSpec,
        deadline: Option<Instant>,
        restarts: i32,
        pending: Option<Value>,
    ) -> Option<ReplicaHandle> {
        let mut spec = self.replica_spec(raw, deadline);
        let shared = Arc::clone(&self.shared);
        let task = Arc::clone(&self.task);
        let pod = self.pod.clone();
        let starting = async move {
            let reports = shared.task_tokens.env(
                &shared.client,
                &shared.ctx.server_url,
                &shared.ctx.ca_file,
                &task,
            );
            spec.env.extend(reports.await);
            tracing::debug!(%pod, "task token ready; starting the process");
            runtime::spawn_replica(spec).await
        };
        let spawned = match pending {
            Some(pending) => {
                tokio::pin!(starting);
                tokio::select! {
                    spawned = &mut starting => spawned,
                    () = tokio::time::sleep(PENDING_AFTER) => {
                        let (_, spawned) =
                            tokio::join!(self.write_status(pending, true), starting);
                        spawned
                    }
                }
            }
            None => starting.await,
        };
        match spawned {
            Ok(handle) => {
                self.save_state(&handle);
                tracing::info!(pod = %self.pod, pid = handle.pid(), restarts, "replica started");
                Some(handle)
            }
            Err(error) => {
                tracing::warn!(pod = %self.pod, %error, "replica did not start");
                let status = json!({
                    "phase": "Failed",
                    "reason": error.reason(),
                    "message": error.to_string(),
                    "finishTime": Time(Timestamp::now()),
                    "restartCount": restarts,
                });
                self.write_status(status, true).await;
                None
            }
        }
    }

    /// Apply the retention rule to this Task's older runs ([`prune_runs`]).
    async fn prune_old_runs(&self) {
        let task_dir = self
            .shared
            .ctx
            .data_dir
            .join(&self.shared.namespace)
            .join(self.task.name_any());
        let current = self.uid();
        let removed = tokio::task::spawn_blocking(move || prune_runs(&task_dir, &current))
            .await
            .unwrap_or_default();
        for dir in removed {
            tracing::info!(dir = %dir.display(), "removed the directory of an old run");
        }
    }

    fn replica_spec(&self, raw: &RawTaskSpec, deadline: Option<Instant>) -> ReplicaSpec {
        let mut spec = ReplicaSpec::new(raw.entrypoint.clone(), self.replica_dir());
        spec.env = replica_env(&self.task, self.index, &self.shared.ctx);
        spec.working_dir = raw.working_dir.as_ref().map(PathBuf::from);
        spec.artifact = raw.artifact.clone();
        spec.artifact_sha256 = raw.artifact_sha256.clone();
        spec.artifact_cache = self
            .shared
            .ctx
            .data_dir
            .parent()
            .map(|d| d.join("artifacts"));
        spec.deadline = deadline;
        spec.grace = self.grace();
        spec.supervisor = self.shared.ctx.supervisor.clone();
        spec
    }

    /// Watch the running process and the Task together.
    async fn supervise(&mut self, handle: &mut ReplicaHandle) -> Supervised {
        loop {
            let command = tokio::select! {
                exit = handle.wait() => return Supervised::Exited(exit),
                command = self.next_command() => command,
            };
            match command {
                Command::Run { task, resync } => {
                    self.task = task;
                    if self.task.spec.stopped {
                        tracing::info!(pod = %self.pod, "stopping replica (task stopped)");
                        return Supervised::Stopped(handle.terminate(self.grace()).await);
                    }
                    self.maybe_resync(resync).await;
                }
                Command::Supersede => {
                    handle.terminate(self.grace()).await;
                    self.remove_state();
                    return Supervised::Leave(Step::Exit);
                }
                Command::Remove => {
                    handle.terminate(self.grace()).await;
                    self.remove_state();
                    self.delete_own_pod().await;
                    return Supervised::Leave(Step::Exit);
                }
                Command::Shutdown => {
                    if self.shared.ctx.stop_tasks_on_exit {
                        let exit = handle.terminate(self.grace()).await;
                        self.finish(shutdown_status(Some(&exit))).await;
                    } else {
                        // Keep running; the state file tells the next agent about it.
                        tracing::info!(pod = %self.pod, pid = handle.pid(), "leaving replica running");
                    }
                    return Supervised::Leave(Step::Exit);
                }
            }
        }
    }

    /// Wait `backoff` before a restart, following the Task meanwhile.
    async fn wait_restart(&mut self, backoff: Duration, deadline: Option<Instant>) -> Waited {
        let restart_at = Instant::now() + backoff;
        loop {
            let command = tokio::select! {
                _ = tokio::time::sleep_until(restart_at) => return Waited::Restart,
                _ = sleep_until_opt(deadline) => return Waited::Deadline,
                command = self.next_command() => command,
            };
            match command {
                Command::Run { task, resync } => {
                    self.task = task;
                    if self.task.spec.stopped {
                        return Waited::Stopped;
                    }
                    self.maybe_resync(resync).await;
                }
                Command::Supersede => return Waited::Leave(Step::Exit),
                Command::Remove => {
                    self.delete_own_pod().await;
                    return Waited::Leave(Step::Exit);
                }
                Command::Shutdown => {
                    if self.shared.ctx.stop_tasks_on_exit {
                        self.finish(shutdown_status(None)).await;
                    }
                    return Waited::Leave(Step::Exit);
                }
            }
        }
    }

    /// The next command (the reconciler gone counts as a shutdown).
    async fn next_command(&mut self) -> Command {
        match self.commands.changed().await {
            Ok(()) => self.commands.borrow_and_update().clone(),
            Err(_) => Command::Shutdown,
        }
    }

    /// On a resync, write the whole status again (a lost write is repaired, a deleted
    /// Pod of a running replica created again).
    async fn maybe_resync(&mut self, resync: u64) {
        if resync == self.resync {
            return;
        }
        self.resync = resync;
        if !self.reported.is_empty() {
            self.write_status(Value::Object(self.reported.clone()), true)
                .await;
        }
    }

    /// Report the final status of a process that exited and is not restarted
    /// (`Succeeded`, or `Failed` with its exit code). Unlike [`Worker::finish`] it is not
    /// written to the state file first: the supervisor's `exit.json` already holds the
    /// exit, and an agent that dies before the Pod write finds it there and reports the same
    /// status (adoption, then the restart policy). One file rewrite (a new inode and a
    /// freed one) less per replica.
    async fn finish_exited(&mut self, status: Value) {
        if self.write_status(status, true).await {
            self.remove_state();
        }
    }

    /// Report the final status: first into the state file (so it survives an agent
    /// crash before the write), then to the Pod; then drop the state file.
    async fn finish(&mut self, status: Value) {
        let path = self.replica_dir().join(STATE_FILE);
        if let Some(state) = self.state.as_mut() {
            state.final_status = Some(status.clone());
            if let Err(error) = state.write(&path) {
                tracing::warn!(file = %path.display(), %error, "write replica state file");
            }
        }
        if self.write_status(status, true).await {
            self.remove_state();
        }
    }

    fn save_state(&mut self, handle: &ReplicaHandle) {
        let state = ReplicaState {
            namespace: self.shared.namespace.clone(),
            task: self.task.name_any(),
            uid: self.uid(),
            index: self.index,
            run_key: self.key.clone(),
            pid: handle.pid(),
            pgid: handle.pgid(),
            proc_start_ticks: handle.start_ticks(),
            start_time: timestamp(handle.started_at()).to_string(),
            grace_seconds: self.grace().as_secs(),
            final_status: None,
        };
        let path = self.replica_dir().join(STATE_FILE);
        if let Err(error) = state.write(&path) {
            tracing::warn!(file = %path.display(), %error, "write replica state file");
        }
        self.state = Some(state);
    }

    fn remove_state(&mut self) {
        if self.state.take().is_some() {
            let path = self.replica_dir().join(STATE_FILE);
            match std::fs::remove_file(&path) {
                Err(error) if error.kind() != io::ErrorKind::NotFound => {
                    tracing::warn!(file = %path.display(), %error, "remove replica state file");
                }
                _ => {}
            }
        }
    }

    // --- Pod API -----------------------------------------------------------------------

    /// The Pod, if any; `None` when the agent shut down before it could be read.
    async fn get_pod(&self) -> Option<Option<Pod>> {
        let api = self.shared.pods();
        let mut retry = Retry::new();
        loop {
            match api.get_opt(&self.pod).await {
                Ok(pod) => {
                    tracing::debug!(pod = %self.pod, exists = pod.is_some(), "pod read");
                    return Some(pod);
                }
                Err(error) => {
                    if !retry.again(&self.shared, "read pod", &error).await {
                        return None;
                    }
                }
            }
        }
    }

    /// The Pod object of this replica for this run (no status).
    fn new_pod(&self) -> Pod {
        let name = self.task.name_any();
        let namespace = self.shared.namespace.clone();
        let mut pod = Pod::new(
            &self.pod,
            PodSpec {
                domain: self.task.spec.domain.clone(),
                task_namespace: Some(namespace.clone()),
                task_name: Some(name.clone()),
                pod_namespace: Some(namespace.clone()),
                pod_name: Some(self.pod.clone()),
                replica_index: Some(i32::try_from(self.index).unwrap_or(i32::MAX)),
            },
        );
        pod.metadata = ObjectMeta {
            name: Some(self.pod.clone()),
            namespace: Some(namespace),
            labels: Some(BTreeMap::from([(labels::TASK_NAME.to_string(), name)])),
            annotations: Some(BTreeMap::from([
                (TASK_UID_ANNOTATION.to_string(), self.uid()),
                (RUN_KEY_ANNOTATION.to_string(), self.key.clone()),
            ])),
            ..ObjectMeta::default()
        };
        pod
    }

    /// Create this run's Pod, expecting none: `Some(true)` when created, `Some(false)` when
    /// a Pod of that name exists, `None` when the agent shut down first (other errors are
    /// retried).
    async fn create_new_pod(&self) -> Option<bool> {
        self.try_create_pod(false).await
    }

    /// Create this run's Pod; one of another run in the way is deleted first. Returns
    /// false only when the agent shut down first.
    async fn create_pod(&self) -> bool {
        self.try_create_pod(true).await == Some(true)
    }

    /// Create this run's Pod, retrying errors: `Some(true)` once it exists and is this
    /// run's, `None` when the agent shut down first. A Pod already there (409): with
    /// `replace`, adopted when it is ours, else deleted and the create retried; without,
    /// `Some(false)` at once.
    async fn try_create_pod(&self, replace: bool) -> Option<bool> {
        let api = self.shared.pods();
        let pod = self.new_pod();
        let mut retry = Retry::new();
        loop {
            let error = match api.create(&PostParams::default(), &pod).await {
                Ok(_) => {
                    tracing::debug!(pod = %self.pod, "pod created");
                    return Some(true);
                }
                Err(error) if is_status(&error, 409) && !replace => return Some(false),
                Err(error) if is_status(&error, 409) => match api.get_opt(&self.pod).await {
                    Ok(Some(existing)) if self.is_ours(&existing) => return Some(true),
                    Ok(Some(existing)) => match delete_pod(&api, &existing).await {
                        Ok(()) => error,
                        Err(e) => e,
                    },
                    Ok(None) => error,
                    Err(e) => e,
                },
                Err(error) => error,
            };
            if !retry.again(&self.shared, "create pod", &error).await {
                return None;
            }
        }
    }

    /// Delete `pod`; false only when the agent shut down first.
    async fn delete_pod(&self, pod: &Pod) -> bool {
        let api = self.shared.pods();
        let mut retry = Retry::new();
        loop {
            match delete_pod(&api, pod).await {
                Ok(()) => return true,
                Err(error) => {
                    if !retry.again(&self.shared, "delete pod", &error).await {
                        return false;
                    }
                }
            }
        }
    }

    /// Delete this run's Pod (not one another run or node put under the same name).
    async fn delete_own_pod(&self) {
        if let Some(Some(pod)) = self.get_pod().await
            && self.is_ours(&pod)
        {
            self.delete_pod(&pod).await;
        }
    }

    /// Merge-patch the Pod's status with `patch` (retried). With `recreate`, a Pod that
    /// disappeared is created again with everything reported so far. Returns whether the
    /// write happened.
    async fn write_status(&mut self, patch: Value, recreate: bool) -> bool {
        if let Value::Object(fields) = &patch {
            for (key, value) in fields {
                if value.is_null() {
                    self.reported.remove(key);
                } else {
                    self.reported.insert(key.clone(), value.clone());
                }
            }
        }
        let api = self.shared.pods();
        let params = PatchParams::default();
        let mut retry = Retry::new();
        loop {
            let body = json!({ "status": patch });
            let error = match api
                .patch_status(&self.pod, &params, &Patch::Merge(&body))
                .await
            {
                Ok(_) => {
                    tracing::debug!(pod = %self.pod, phase = ?patch.get("phase"), "pod status written");
                    return true;
                }
                Err(error) if is_status(&error, 404) && !recreate => return false,
                Err(error) if is_status(&error, 404) => {
                    if !self.create_pod().await {
                        return false;
                    }
                    let full = json!({ "status": Value::Object(self.reported.clone()) });
                    match api
                        .patch_status(&self.pod, &params, &Patch::Merge(&full))
                        .await
                    {
                        Ok(_) => return true,
                        Err(error) => error,
                    }
                }
                Err(error) => error,
            };
            if !retry.again(&self.shared, "write pod status", &error).await {
                return false;
            }
        }
    }
}

/// A Pod's `restartCount` (0 when unset) and `startTime` (else `start_time`, else now).
fn pod_progress(pod: &Pod, start_time: Option<&str>) -> (i32, Timestamp) {
    let status = pod.status.as_ref();
    let restarts = status.and_then(|s| s.restart_count).unwrap_or(0);
    let start = status
        .and_then(|s| s.start_time.as_ref())
        .map(|t| t.0)
        .or_else(|| start_time.and_then(|t| t.parse().ok()))
        .unwrap_or_else(Timestamp::now);
    (restarts, start)
}

/// [`pod_progress`], from the state file alone when there is no Pod.
fn pod_progress_or_state(pod: Option<&Pod>, state: &ReplicaState) -> (i32, Timestamp) {
    match pod {
        Some(pod) => pod_progress(pod, Some(&state.start_time)),
        None => (
            0,
            state
                .start_time
                .parse()
                .unwrap_or_else(|_| Timestamp::now()),
        ),
    }
}

/// Runs of one Task name kept on disk: the current one and the one before it (the logs
/// API's `previous=true`).
pub const RUNS_KEPT: usize = 2;

/// Retention of a Task's run directories `<task_dir>/<uid>/`: besides `current_uid`, the
/// newest other run is kept (by the latest change to it or its replica directories) and
/// the older ones are deleted — except any that still holds a state file (a replica
/// running, or whose final status is not reported yet). Returns the directories removed.
pub fn prune_runs(task_dir: &Path, current_uid: &str) -> Vec<PathBuf> {
    let modified = |dir: &Path| {
        std::iter::once(dir.to_path_buf())
            .chain(subdirs(dir))
            .filter_map(|d| std::fs::metadata(d).and_then(|m| m.modified()).ok())
            .max()
            .unwrap_or(SystemTime::UNIX_EPOCH)
    };
    let mut others: Vec<(SystemTime, PathBuf)> = subdirs(task_dir)
        .into_iter()
        .filter(|dir| dir.file_name().and_then(|n| n.to_str()) != Some(current_uid))
        .map(|dir| (modified(&dir), dir))
        .collect();
    others.sort_by(|a, b| b.cmp(a));
    let mut removed = Vec::new();
    for (_, dir) in others.into_iter().skip(RUNS_KEPT - 1) {
        if subdirs(&dir).iter().any(|r| r.join(STATE_FILE).exists()) {
            continue;
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => removed.push(dir),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "remove the directory of an old run");
            }
        }
    }
    removed
}

fn status_map(pod: &Pod) -> Map<String, Value> {
    match pod.status.as_ref().map(serde_json::to_value) {
        Some(Ok(Value::Object(map))) => map,
        _ => Map::new(),
    }
}

fn timestamp(time: SystemTime) -> Timestamp {
    Timestamp::try_from(time).unwrap_or_else(|_| Timestamp::now())
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The final status of a replica that exited (beyond its restart policy). An unknown
/// exit (the supervisor was killed before it could record it) is `AgentLost`.
fn final_status(exit: &ReplicaExit, restarts: i32) -> Value {
    let finish = Time(timestamp(exit.finished_at));
    if exit.status == ExitStatus::Unknown {
        json!({
            "phase": "Failed",
            "exitCode": null,
            "reason": REASON_AGENT_LOST,
            "message": "the replica's supervisor process ended without recording how the \
                        process ended (it was killed); what was left of the process group was \
                        killed; the outcome of the run is unknown",
            "finishTime": finish,
            "restartCount": restarts,
        })
    } else if exit.status.success() {
        json!({
            "phase": "Succeeded",
            "exitCode": 0,
            "reason": REASON_COMPLETED,
            "message": "process exited with code 0",
            "finishTime": finish,
            "restartCount": restarts,
        })
    } else {
        json!({
            "phase": "Failed",
            "exitCode": exit.status.code(),
            "reason": REASON_ERROR,
            "message": format!("process {}", exit.status),
            "finishTime": finish,
            "restartCount": restarts,
        })
    }
}

/// What happened to the group when it was stopped.
fn kill_detail(exit: &ReplicaExit, grace: Duration) -> String {
    if exit.killed {
        format!(
            "SIGTERM sent to the process group, SIGKILL after the {}s grace period; the process {}",
            grace.as_secs(),
            exit.status
        )
    } else {
        format!(
            "SIGTERM sent to the process group; the process {}",
            exit.status
        )
    }
}

/// The SIGTERM → SIGKILL wait of a replica of `raw` (`terminationGracePeriodSeconds`):
/// [`DEFAULT_GRACE`] when unset, zero when negative, at most [`MAX_GRACE`]. Admission
/// refuses values out of that range, but a Task stored before it did must not make a stop
/// wait for ever or a kill time overflow the clock.
pub fn grace_period(raw: Option<&RawTaskSpec>) -> Duration {
    raw.and_then(|r| r.termination_grace_period_seconds)
        .map_or(DEFAULT_GRACE, |s| {
            Duration::from_secs(u64::try_from(s).unwrap_or(0)).min(MAX_GRACE)
        })
}

/// When `activeDeadlineSeconds` of `raw` ends for a run that started `elapsed` before
/// `now` (`now` when it has passed); `None` without a deadline (unset or negative). The
/// deadline is cut to [`MAX_ACTIVE_DEADLINE_SECONDS`] (what admission allows) so that any
/// stored value, even `i64::MAX`, gives an instant the clock can represent and the replica
/// runs instead of the worker panicking.
pub fn run_deadline(raw: &RawTaskSpec, now: Instant, elapsed: Duration) -> Option<Instant> {
    let seconds = u64::try_from(raw.active_deadline_seconds?).ok()?;
    let limit = Duration::from_secs(seconds).min(Duration::from_secs(
        MAX_ACTIVE_DEADLINE_SECONDS.unsigned_abs(),
    ));
    Some(now + limit.saturating_sub(elapsed))
}

fn stopped_status(exit: Option<&ReplicaExit>, grace: Duration, restarts: i32) -> Value {
    let message = match exit {
        Some(exit) => format!("stopped on request: {}", kill_detail(exit, grace)),
        None => "stopped on request while waiting to restart".to_string(),
    };
    json!({
        "phase": "Failed",
        "reason": REASON_STOPPED,
        "exitCode": exit.and_then(|e| e.status.code()),
        "message": message,
        "finishTime": Time(Timestamp::now()),
        "restartCount": restarts,
    })
}

fn deadline_status(
    seconds: Option<u64>,
    exit: Option<&ReplicaExit>,
    grace: Duration,
    restarts: i32,
) -> Value {
    let limit = seconds.map_or_else(String::new, |s| format!(" of {s}s"));
    let message = match exit {
        Some(exit) => format!(
            "active deadline{limit} exceeded: {}",
            kill_detail(exit, grace)
        ),
        None => format!("active deadline{limit} exceeded while waiting to restart"),
    };
    json!({
        "phase": "Failed",
        "reason": REASON_DEADLINE_EXCEEDED,
        "exitCode": exit.and_then(|e| e.status.code()),
        "message": message,
        "finishTime": Time(Timestamp::now()),
        "restartCount": restarts,
    })
}

fn shutdown_status(exit: Option<&ReplicaExit>) -> Value {
    json!({
        "phase": "Failed",
        "reason": REASON_AGENT_SHUTDOWN,
        "exitCode": exit.and_then(|e| e.status.code()),
        "message": "the agent shut down and stops its tasks on exit",
        "finishTime": Time(Timestamp::now()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlark_api::types::TaskPlacement;

    fn task(uid: &str, nodes: &[&str]) -> Task {
        let mut task = Task::new(
            "j-a",
            serde_json::from_value(json!({
                "agentType": "Raw",
                "role": "Rollout",
                "raw": {"entrypoint": ["true"], "replicas": nodes.len(),
                        "environment": [{"name": "A", "value": "1"},
                                        {"name": "RLARK_TASK", "value": "spoofed"}]},
            }))
            .expect("spec"),
        );
        task.metadata.namespace = Some("rlark-c".into());
        task.metadata.uid = Some(uid.into());
        task.metadata.labels = Some(BTreeMap::from([(labels::JOB.into(), "j".into())]));
        task.spec.placement = Some(TaskPlacement {
            cluster_id: "c".into(),
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
        });
        task
    }

    fn ctx() -> TaskContext {
        TaskContext {
            cluster_id: "c".into(),
            node_name: "n1".into(),
            data_dir: "/data/tasks".into(),
            server_url: "https://cp:6443".into(),
            ca_file: "/data/identity/ca.crt".into(),
            stop_tasks_on_exit: false,
            supervisor: Vec::new(),
        }
    }

    /// Regression (issue 14): `activeDeadlineSeconds: 9223372036854775807` panicked the
    /// replica worker (`Instant + Duration` overflow), leaving the Task Pending forever.
    /// Any stored value now gives a deadline the clock can represent, and a grace period
    /// that is at most [`MAX_GRACE`].
    #[test]
    fn extreme_deadlines_and_grace_periods_are_cut_instead_of_panicking() {
        let now = Instant::now();
        let longest = Duration::from_secs(MAX_ACTIVE_DEADLINE_SECONDS.unsigned_abs());
        let mut raw: RawTaskSpec =
            serde_json::from_value(json!({"entrypoint": ["true"]})).expect("raw");
        for huge in [
            i64::MAX,
            i64::MAX - 1,
            MAX_ACTIVE_DEADLINE_SECONDS + 1,
            1 << 53,
        ] {
            raw.active_deadline_seconds = Some(huge);
            raw.termination_grace_period_seconds = Some(huge);
            assert_eq!(run_deadline(&raw, now, Duration::ZERO), Some(now + longest));
            assert_eq!(
                run_deadline(&raw, now, Duration::MAX),
                Some(now),
                "elapsed beyond any deadline"
            );
            assert_eq!(grace_period(Some(&raw)), MAX_GRACE);
        }
        for negative in [-1, i64::MIN] {
            raw.active_deadline_seconds = Some(negative);
            raw.termination_grace_period_seconds = Some(negative);
            assert_eq!(run_deadline(&raw, now, Duration::ZERO), None);
            assert_eq!(grace_period(Some(&raw)), Duration::ZERO);
        }
        raw.active_deadline_seconds = Some(60);
        raw.termination_grace_period_seconds = None;
        assert_eq!(
            run_deadline(&raw, now, Duration::from_secs(45)),
            Some(now + Duration::from_secs(15))
        );
        assert_eq!(grace_period(Some(&raw)), DEFAULT_GRACE);
        assert_eq!(grace_period(None), DEFAULT_GRACE);
    }

    /// Property test over the agent's spec handling: every numeric field of a raw Task
    /// (replicas, deadline, grace period, and the rank annotations the Job controller
    /// writes) set to extreme values, in a deterministic sequence, never panics the pure
    /// functions that turn a Task into a replica's environment, deadline and grace period.
    #[test]
    fn spec_handling_survives_extreme_numbers() {
        const EXTREMES: [i64; 9] = [
            0,
            1,
            -1,
            i32::MAX as i64,
            i32::MIN as i64,
            u32::MAX as i64,
            MAX_ACTIVE_DEADLINE_SECONDS,
            i64::MAX,
            i64::MIN,
        ];
        let now = Instant::now();
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let mut pick = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            EXTREMES[(rng % EXTREMES.len() as u64) as usize]
        };
        for _ in 0..500 {
            let mut t = task("u1", &["n1", "n2"]);
            let raw = t.spec.raw.as_mut().expect("raw");
            raw.replicas = i32::try_from(pick()).unwrap_or(i32::MAX);
            raw.active_deadline_seconds = Some(pick());
            raw.termination_grace_period_seconds = Some(pick());
            let annotations = t.annotations_mut();
            annotations.insert(labels::RAY_NODE_RANK_START.into(), pick().to_string());
            annotations.insert(labels::RAY_TOTAL_NODES.into(), pick().to_string());
            let raw = t.spec.raw.as_ref().expect("raw");
            let elapsed = Duration::from_secs(pick().unsigned_abs());
            if let Some(deadline) = run_deadline(raw, now, elapsed) {
                assert!(deadline >= now);
            }
            assert!(grace_period(Some(raw)) <= MAX_GRACE);
            let index = usize::try_from(pick()).unwrap_or(usize::MAX);
            let env = replica_env(&t, index, &ctx());
            assert!(env.iter().any(|(k, _)| k == "RLARK_NODE_RANK"));
            let _ = run_key(&t, "c");
        }
    }

    #[test]
    fn run_keys_change_with_a_new_run_only() {
        let t = task("u1", &["n1", "n2"]);
        let key = run_key(&t, "c").expect("placed");
        assert_eq!(run_key(&t, "other"), None);
        let mut stopped = t.clone();
        stopped.spec.stopped = true;
        assert_eq!(run_key(&stopped, "c").as_ref(), Some(&key));
        let mut restarted = t.clone();
        restarted
            .annotations_mut()
            .insert(labels::RESTARTED_AT.into(), "2026-01-01T00:00:00Z".into());
        assert_ne!(run_key(&restarted, "c").as_ref(), Some(&key));
        assert_ne!(
            run_key(&task("u2", &["n1", "n2"]), "c").as_ref(),
            Some(&key)
        );
        assert_ne!(
            run_key(&task("u1", &["n2", "n1"]), "c").as_ref(),
            Some(&key)
        );
    }

    #[test]
    fn the_environment_contract_wins_over_the_task_environment() {
        let t = task("u1", &["n1", "n2"]);
        let env: BTreeMap<String, String> = replica_env(&t, 1, &ctx()).into_iter().collect();
        assert_eq!(env["A"], "1");
        assert_eq!(env["RLARK_TASK"], "j-a");
        assert_eq!(env["RLARK_JOB"], "j");
        assert_eq!(env["RLARK_TASK_ROLE"], "Rollout");
        assert_eq!(env["RLARK_REPLICA_INDEX"], "1");
        assert_eq!(env["RLARK_TOTAL_NODES"], "2");
        assert_eq!(env["RLARK_SERVER"], "https://cp:6443");
        assert_eq!(env["RLARK_CLUSTER_ID"], "c");
        assert_eq!(env["RLARK_NODE_NAME"], "n1");
        assert_eq!(env["RLARK_POD_NAME"], "j-a-1");
        // A bare Task (no Ray annotations): ranks are the replica indexes, no domain.
        assert_eq!(env["RLARK_NODE_RANK_START"], "0");
        assert_eq!(env["RLARK_NODE_RANK"], "1");
        for absent in ["RLARK_DOMAIN", "RLARK_RAY_ROLE", "RLARK_HEAD_ADDRESS"] {
            assert!(!env.contains_key(absent), "{absent} set: {env:?}");
        }
    }

    #[test]
    fn ranks_roles_and_the_head_address_follow_the_job() {
        let mut t = task("u1", &["n1", "n2"]);
        t.spec.domain = Some("net1".into());
        t.annotations_mut().extend([
            (labels::RAY_NODE_RANK_START.to_string(), "3".to_string()),
            (labels::RAY_TOTAL_NODES.to_string(), "7".to_string()),
            (
                labels::RAY_ROLE.to_string(),
                labels::RAY_ROLE_WORKER.to_string(),
            ),
            (
                labels::RAY_HEAD_TASK_NAME.to_string(),
                "j-actor".to_string(),
            ),
        ]);
        let env: BTreeMap<String, String> = replica_env(&t, 1, &ctx()).into_iter().collect();
        assert_eq!(env["RLARK_NODE_RANK_START"], "3");
        assert_eq!(env["RLARK_NODE_RANK"], "4");
        assert_eq!(
            env["RLARK_TOTAL_NODES"], "7",
            "the Job's nodes, not the Task's 2"
        );
        assert_eq!(env["RLARK_DOMAIN"], "net1");
        assert_eq!(env["RLARK_RAY_ROLE"], "worker");
        assert_eq!(env["RLARK_HEAD_ADDRESS"], "j-actor-0.net1");

        // Without a domain there is no name to give: no head address (and no domain).
        let mut no_domain = t.clone();
        no_domain.spec.domain = None;
        let env: BTreeMap<String, String> =
            replica_env(&no_domain, 0, &ctx()).into_iter().collect();
        assert!(!env.contains_key("RLARK_HEAD_ADDRESS"), "{env:?}");
        assert!(!env.contains_key("RLARK_DOMAIN"), "{env:?}");
        assert_eq!(env["RLARK_NODE_RANK"], "3");

        // Unreadable annotations fall back: rank start 0, the Task's replicas.
        let mut garbled = t.clone();
        garbled.annotations_mut().extend([
            (labels::RAY_NODE_RANK_START.to_string(), "-1".to_string()),
            (labels::RAY_TOTAL_NODES.to_string(), "many".to_string()),
        ]);
        let env: BTreeMap<String, String> = replica_env(&garbled, 1, &ctx()).into_iter().collect();
        assert_eq!(env["RLARK_NODE_RANK"], "1");
        assert_eq!(env["RLARK_TOTAL_NODES"], "2");

        // The optional contract variables cannot be supplied by the Task when rlark sets
        // none, and are rlark's when it does.
        let mut spoofing = no_domain.clone();
        spoofing.annotations_mut().remove(labels::RAY_ROLE);
        if let Some(raw) = spoofing.spec.raw.as_mut() {
            for name in ["RLARK_DOMAIN", "RLARK_HEAD_ADDRESS", "RLARK_RAY_ROLE"] {
                raw.environment.push(rlark_api::types::EnvVar {
                    name: name.into(),
                    value: "spoofed".into(),
                });
            }
        }
        let env: BTreeMap<String, String> = replica_env(&spoofing, 0, &ctx()).into_iter().collect();
        assert!(env.values().all(|v| v != "spoofed"), "{env:?}");
    }

    #[test]
    fn env_from_input_sets_variables_from_the_task_input() {
        let mut t = task("u1", &["n1"]);
        t.spec.input = Some(json!({
            "question": "2+2", "answer": 4, "exact": true, "none": null,
            "sample": {"prompt": "hi", "ids": [1, 2]},
        }));
        t.spec.env_from = Some(
            serde_json::from_value(json!({"input": [
                {"name": "QUESTION", "path": "$.question"},
                {"name": "ANSWER", "path": "$.answer"},
                {"name": "EXACT", "path": "$['exact']"},
                {"name": "NONE", "path": "$.none"},
                {"name": "SAMPLE", "path": "$.sample"},
                {"name": "IDS", "path": "$.sample.ids"},
                {"name": "FIRST_ID", "path": "$.sample.ids[0]"},
                {"name": "MISSING", "path": "$.sample.nothing"},
                {"name": "A", "path": "$.question"},
            ]}))
            .expect("envFrom"),
        );
        let env: BTreeMap<String, String> = replica_env(&t, 0, &ctx()).into_iter().collect();
        assert_eq!(env["QUESTION"], "2+2", "a string as is");
        assert_eq!(env["ANSWER"], "4", "a number as JSON");
        assert_eq!(env["EXACT"], "true");
        assert_eq!(env["NONE"], "null");
        assert_eq!(
            env["SAMPLE"], r#"{"prompt":"hi","ids":[1,2]}"#,
            "compact JSON"
        );
        assert_eq!(env["IDS"], "[1,2]");
        assert_eq!(env["FIRST_ID"], "1");
        assert!(
            !env.contains_key("MISSING"),
            "a path matching nothing: unset"
        );
        assert_eq!(env["A"], "1", "raw.environment wins over envFrom");
        assert_eq!(env["RLARK_TASK"], "j-a", "the contract wins over both");
    }

    #[test]
    fn replica_dirs_and_state_files_round_trip() {
        let dir = tempfile::tempdir().expect("tempdir");
        let replica = replica_dir(dir.path(), "rlark-c", "j-a", "u1", 0);
        assert!(replica.ends_with("rlark-c/j-a/u1/0"));
        std::fs::create_dir_all(&replica).expect("mkdir");
        let state = ReplicaState {
            namespace: "rlark-c".into(),
            task: "j-a".into(),
            uid: "u1".into(),
            index: 0,
            run_key: "u1//n1".into(),
            pid: 42,
            pgid: 42,
            proc_start_ticks: Some(7),
            start_time: "2026-01-01T00:00:00Z".into(),
            grace_seconds: 30,
            final_status: None,
        };
        let path = replica.join(STATE_FILE);
        state.write(&path).expect("write");
        assert_eq!(ReplicaState::read(&path).expect("read"), state);
        assert_eq!(find_state_files(&dir.path().join("rlark-c")), vec![path]);
    }

    #[test]
    fn old_runs_are_pruned_but_the_previous_one_and_unreported_ones_stay() {
        let dir = tempfile::tempdir().expect("tempdir");
        let task_dir = dir.path().join("rlark-c").join("j-a");
        let run = |uid: &str, age_secs: u64, state: bool| {
            let replica = task_dir.join(uid).join("0");
            std::fs::create_dir_all(replica.join("logs")).expect("mkdir");
            if state {
                std::fs::write(replica.join(STATE_FILE), "{}").expect("state");
            }
            let when = SystemTime::now() - Duration::from_secs(age_secs);
            for d in [task_dir.join(uid), replica] {
                std::fs::File::open(&d)
                    .and_then(|f| f.set_modified(when))
                    .expect("set mtime");
            }
        };
        run("u1", 400, false);
        run("u2", 300, true);
        run("u3", 200, false);
        run("u4", 100, false);
        run("u5", 0, false);
        let mut removed = prune_runs(&task_dir, "u5");
        removed.sort();
        assert_eq!(removed, [task_dir.join("u1"), task_dir.join("u3")]);
        let mut left: Vec<String> = subdirs(&task_dir)
            .iter()
            .filter_map(|d| d.file_name()?.to_str().map(str::to_string))
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["u2", "u4", "u5"],
            "current, previous, and one with a state file"
        );
        assert!(
            prune_runs(&task_dir, "u5").is_empty(),
            "nothing more to prune"
        );
        assert!(prune_runs(&dir.path().join("missing"), "u1").is_empty());
    }

    #[test]
    fn statuses_say_how_the_replica_ended() {
        let exit = |status, cause, killed| ReplicaExit {
            status,
            cause,
            killed,
            finished_at: SystemTime::now(),
        };
        use runtime::ExitStatus::{Code, Signal};
        let ok = final_status(&exit(Code(0), ExitCause::Exited, false), 0);
        assert_eq!(
            (ok["phase"].as_str(), ok["exitCode"].as_i64()),
            (Some("Succeeded"), Some(0))
        );
        let failed = final_status(&exit(Code(3), ExitCause::Exited, false), 2);
        assert_eq!(failed["phase"], "Failed");
        assert_eq!(failed["exitCode"], 3);
        assert_eq!(failed["restartCount"], 2);
        assert_eq!(failed["message"], "process exited with code 3");
        let stopped = stopped_status(
            Some(&exit(Signal(9), ExitCause::Terminated, true)),
            Duration::from_secs(5),
            0,
        );
        assert_eq!(stopped["reason"], REASON_STOPPED);
        assert_eq!(stopped["exitCode"], 137);
        assert!(
            stopped["message"]
                .as_str()
                .is_some_and(|m| m.contains("SIGKILL after the 5s"))
        );
        let unknown = final_status(
            &exit(runtime::ExitStatus::Unknown, ExitCause::Exited, false),
            1,
        );
        assert_eq!(unknown["reason"], REASON_AGENT_LOST);
        assert_eq!(unknown["exitCode"], Value::Null);
        assert!(
            unknown["message"]
                .as_str()
                .is_some_and(|m| m.contains("unknown"))
        );
        let deadline = deadline_status(
            Some(1),
            Some(&exit(Signal(15), ExitCause::DeadlineExceeded, false)),
            DEFAULT_GRACE,
            0,
        );
        assert_eq!(deadline["reason"], REASON_DEADLINE_EXCEEDED);
        assert_eq!(deadline["exitCode"], 143);
        assert!(
            deadline["message"]
                .as_str()
                .is_some_and(|m| m.contains("of 1s"))
        );
    }
}
