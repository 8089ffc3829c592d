//! The Task reconciler: runs the replicas of the Tasks placed on this node as processes
//! ([`crate::runtime`]) and reports one `Pod` per replica (docs/concepts.md, "Agent
//! protocol"; DESIGN §7). The control plane's Task is the truth; each pass makes reality
//! match it.
//!
//! The protocol (names, reasons, Pod statuses) and what one replica goes through (restart
//! policy, backoff, deadline, stop, adoption) are decided by the pure
//! [`rlark_api::agent`] module, its [`rlark_api::agent::replica::Replica`] state machine
//! above all (docs/tasks.md, "The replica state machine"); this module is the IO around
//! it, one concept per file:
//!
//! - `reconciler`: the Task watch, which replicas run here, one worker each;
//! - `worker`: one replica's worker, which creates its Pod, feeds the state machine and
//!   executes its actions through a [`Runtime`](crate::runtime::Runtime);
//! - `pods`: Pod reads and writes, retried;
//! - `recovery`: the state files an earlier agent left;
//! - `state`: the state file itself; `prune`: old run directories; `env`: the
//!   environment contract; `tensorboard`: TensorBoard beside a replica of a Task with
//!   `tensorBoardDir`.
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

mod env;
pub use env::task_job;
pub mod isolation;
mod pods;
mod prune;
mod reconciler;
mod recovery;
mod state;
pub(crate) mod tensorboard;
mod worker;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::Api;
use rlark_api::types::{Pod, RawTaskSpec};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::runtime::docker::DockerRuntime;
use crate::runtime::{RawRuntime, Runtime};
use crate::task_reports::TaskTokens;

pub use env::replica_env;
pub use prune::{RUNS_KEPT, prune_runs};
pub use rlark_api::agent::{
    BACKOFF_INITIAL, BACKOFF_MAX, BACKOFF_RESET_AFTER, PENDING_AFTER, REASON_AGENT_LOST,
    REASON_AGENT_SHUTDOWN, REASON_BACKOFF, REASON_COMPLETED, REASON_DEADLINE_EXCEEDED,
    REASON_ERROR, REASON_STOPPED, REASON_UNSUPPORTED_AGENT_TYPE, RUN_KEY_ANNOTATION,
    TASK_UID_ANNOTATION, pod_name, run_key,
};
pub use state::{ReplicaState, STATE_FILE};

use recovery::Recovered;

/// Full resync period of the Task watch.
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(30);

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
    /// The pod network replicas of domain tasks join.
    pub network: PodNetwork,
    /// The runtime of a Docker agent (replicas of `docker` tasks run as containers);
    /// `None`: a Raw agent (processes).
    pub docker: Option<DockerRuntime>,
    /// The host's robots and cameras (`--embodied-socket-dir`); `None`: no embodied
    /// runtime, and a replica that requests devices fails to start.
    pub devices: Option<crate::devices::DeviceAccess>,
    /// How raw replicas are isolated ([`isolation`]); `None`: not at all.
    pub isolation: Option<isolation::Isolation>,
}

pub use rlark_net::replica::PodNetwork;

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
    let shared_docker = ctx.docker.clone();
    let shared = Arc::new(Shared {
        client,
        ctx,
        namespace,
        shutdown,
        task_tokens: TaskTokens::default(),
        recovered: Mutex::new(BTreeMap::new()),
        runtime: match shared_docker {
            Some(docker) => Arc::new(docker) as Arc<dyn Runtime>,
            None => Arc::new(RawRuntime),
        },
    });
    tokio::select! {
        _ = shared.shutdown.cancelled() => return Ok(()),
        _ = recovery::recover(&shared) => {}
    }
    let mut reconciler = reconciler::Reconciler::new(shared);
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
    /// What runs the replicas.
    runtime: Arc<dyn Runtime>,
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

/// One replica: Task name and index.
type ReplicaId = (String, usize);

/// The SIGTERM → SIGKILL wait of a replica of `raw` (`terminationGracePeriodSeconds`,
/// see [`rlark_api::agent::grace_period`]).
pub fn grace_period(raw: Option<&RawTaskSpec>) -> Duration {
    rlark_api::agent::grace_period(raw.and_then(|r| r.termination_grace_period_seconds))
}

/// When `activeDeadlineSeconds` of `raw` ends for a run that started `elapsed` before
/// `now` (see [`rlark_api::agent::deadline_after`]).
pub fn run_deadline(raw: &RawTaskSpec, now: Instant, elapsed: Duration) -> Option<Instant> {
    rlark_api::agent::deadline_after(raw.active_deadline_seconds, now, elapsed)
}

/// Fixtures of the unit tests of this module's files.
#[cfg(test)]
mod testing {
    use std::collections::BTreeMap;

    use rlark_api::labels;
    use rlark_api::types::{Task, TaskPlacement};
    use serde_json::json;

    use super::TaskContext;

    pub(crate) fn task(uid: &str, nodes: &[&str]) -> Task {
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

    pub(crate) fn ctx() -> TaskContext {
        TaskContext {
            cluster_id: "c".into(),
            node_name: "n1".into(),
            data_dir: "/data/tasks".into(),
            server_url: "https://cp:6443".into(),
            ca_file: "/data/identity/ca.crt".into(),
            stop_tasks_on_exit: false,
            supervisor: Vec::new(),
            network: super::PodNetwork::default(),
            docker: None,
            devices: None,
            isolation: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{ctx, task};
    use super::*;
    use crate::runtime::{DEFAULT_GRACE, MAX_GRACE};
    use kube::ResourceExt as _;
    use rlark_api::labels;
    use rlark_api::validation::MAX_ACTIVE_DEADLINE_SECONDS;
    use serde_json::json;

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
}
