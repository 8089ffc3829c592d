//! The `docker` runtime: one replica of a Task as the Task's `docker.containers`, run by the
//! node's Docker Engine (`rlark agent --agent-type Docker`).
//!
//! # A replica
//!
//! - Every container of `docker.containers` is created and started, in order; the **first
//!   is the main container**: the replica's exit is its exit (code as the engine observed
//!   it), and the others (sidecars) are stopped with it (SIGTERM, SIGKILL after the grace
//!   period). A start that fails removes whatever was created (nothing is left behind).
//! - Images must be present on the node: the runtime never pulls (no registry is assumed
//!   reachable). A missing image fails the replica with reason [`REASON_IMAGE_NOT_PRESENT`]
//!   and the engine's message.
//! - Containers run with the host's network (as raw replicas do; Domains are not joined
//!   by this runtime yet), `command` → the image's entrypoint replaced, `args` → its
//!   command, the container's `environment` then the environment contract (`RLARK_*`,
//!   which wins), the installation's CA file bind-mounted read-only at its host path (so
//!   `RLARK_CA_FILE` is valid inside), `volumes` as bind mounts (the target must be
//!   absolute), `resources.limits` (else requests): `cpu` → `NanoCpus`, `memory` →
//!   `Memory`, `nvidia.com/gpu` → a device request of that many GPUs. A replica holding
//!   robots or cameras (`rlinf.io/...` requests) also gets the embodied runtime's socket
//!   directory bind-mounted read-write at its host path
//!   ([`ContainerSet::read_write_dirs`]), so the `RLINF_EMBODIED_*_SOCKET_PATH` values of
//!   its environment are valid inside.
//! - Labels: `rlark.io/managed-by=rlark`, the node, task namespace, name, UID, replica
//!   index, run key and container name ([`labels`]). Names: [`container_name`], at most 63
//!   characters, deterministic.
//! - The main container's output goes to the replica's `logs/current.log` ([`logs`]), so
//!   the log API serves it as a process replica's; sidecars' output to
//!   `logs/<container>.log`.
//!
//! # Supervision
//!
//! The agent waits on the engine (`POST /containers/{id}/wait`) for the main container's
//! end. A stop is SIGTERM to every container (`POST /kill?signal=SIGTERM`), then SIGKILL to
//! whatever runs after the grace period — done by the agent rather than `POST /stop?t=`,
//! so that the exit says whether the SIGKILL was needed. At the end the exit is written to
//! the replica's `exit.json` (as the raw supervisor does), the log streams are drained and
//! the containers removed: a finished replica leaves no container.
//!
//! # Adoption
//!
//! The state file records the containers' ids (main first) and the main process's host
//! pid. A later agent inspects them: a running main container is supervised again (logs
//! resume where they stopped), an exited one is finished as above, a vanished one with an
//! `exit.json` is that exit, anything else is lost. At start-up [`DockerRuntime::sweep`]
//! removes every container labelled for this node that no state file names (created by an
//! agent that died before recording it, or of a Task deleted meanwhile): no orphans.

pub mod client;
pub mod logs;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use rlark_api::types::DockerContainerSpec;
use serde_json::{Value, json};
use sha2::Digest as _;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use client::{DEFAULT_DOCKER_HOST, DockerClient, DockerError};

use super::contract::{ContainerRecord, ReplicaRecord};
use super::record::{self, ExitRecord};
use super::{
    Adopted, ExitCause, ExitStatus, LogFiles, RawRuntime, RecordedReplica, ReplicaExit,
    ReplicaSpec, RunningReplica, Runtime, RuntimeError, process,
};

/// `Pod.status.reason` of a replica whose image is not on the node.
pub const REASON_IMAGE_NOT_PRESENT: &str = "ErrImageNeverPull";
/// `Pod.status.reason` of a replica the engine refused to create or start.
pub const REASON_CONTAINER_ERROR: &str = "CreateContainerError";
/// Label on every container the agent creates.
pub const LABEL_MANAGED_BY: &str = "rlark.io/managed-by";
/// Its value.
pub const MANAGED_BY: &str = "rlark";
/// Label: the node (agent) that runs the container.
pub const LABEL_NODE: &str = "rlark.io/node";
/// Label: the Task's namespace.
pub const LABEL_NAMESPACE: &str = "rlark.io/task-namespace";
/// Label: the Task's name.
pub const LABEL_TASK: &str = "rlark.io/task";
/// Label: the Task's UID.
pub const LABEL_TASK_UID: &str = "rlark.io/task-uid";
/// Label: the replica index.
pub const LABEL_REPLICA: &str = "rlark.io/replica-index";
/// Label: the run key.
pub const LABEL_RUN_KEY: &str = "rlark.io/run-key";
/// Label: the container's name in the Task.
pub const LABEL_CONTAINER: &str = "rlark.io/container";
/// Longest container name.
pub const MAX_NAME: usize = 63;
/// File in a replica's directory naming its containers (a JSON array, main first),
/// written at each start: the local API's `container=` of logs and exec picks by it.
pub const CONTAINERS_FILE: &str = "containers.json";

/// The file in a docker replica's `logs/` with the output of `container` (`None`: the
/// main one), given the replica's container names (main first, [`CONTAINERS_FILE`]):
/// `current.log` for the main container, `<name>.log` for a sidecar. `Err` names the
/// containers there are.
pub fn container_log_file(names: &[String], container: Option<&str>) -> Result<String, String> {
    match container_index(names, container)? {
        0 => Ok(super::LOG_FILE.to_string()),
        i => Ok(format!("{}.log", names[i])),
    }
}

/// Index of `container` (`None`: the main one, 0) among a replica's container `names`
/// (main first); `Err` for a name that is not there, listing them, or for any name when
/// the replica has no containers (a process replica).
pub fn container_index(names: &[String], container: Option<&str>) -> Result<usize, String> {
    let Some(container) = container else {
        return Ok(0);
    };
    if names.is_empty() {
        return Err(format!(
            "container {container:?}: this replica runs processes, not containers (omit the \
             container)"
        ));
    }
    names.iter().position(|n| n == container).ok_or_else(|| {
        format!(
            "container {container:?} is not in this replica: its containers are {}",
            names.join(", ")
        )
    })
}
/// How long the log streams may take to end after the containers stopped.
const LOG_DRAIN: Duration = Duration::from_secs(5);
/// Pause before retrying a failed engine wait.
const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// What a replica of a `docker` task runs (in [`ReplicaSpec::containers`]).
#[derive(Clone, Debug, Default)]
pub struct ContainerSet {
    /// The Task's containers; the first is the main one.
    pub containers: Vec<DockerContainerSpec>,
    /// Identity labels ([`labels`]).
    pub labels: BTreeMap<String, String>,
    /// Container names, one per container ([`container_name`]).
    pub names: Vec<String>,
    /// Host files mounted read-only at the same path (the CA file).
    pub read_only_files: Vec<PathBuf>,
    /// Host directories mounted read-write at the same path (the embodied runtime's socket
    /// directory of a replica holding devices: connecting to a unix socket needs write
    /// access to it).
    pub read_write_dirs: Vec<PathBuf>,
}

/// The identity labels of the containers of replica `index` of a task.
pub fn labels(
    node: &str,
    namespace: &str,
    task: &str,
    uid: &str,
    index: usize,
    run_key: &str,
) -> BTreeMap<String, String> {
    [
        (LABEL_MANAGED_BY, MANAGED_BY.to_string()),
        (LABEL_NODE, node.to_string()),
        (LABEL_NAMESPACE, namespace.to_string()),
        (LABEL_TASK, task.to_string()),
        (LABEL_TASK_UID, uid.to_string()),
        (LABEL_REPLICA, index.to_string()),
        (LABEL_RUN_KEY, run_key.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The engine name of `container` of replica `index` of a task:
/// `rlark-<task>-<index>-<container>-<hash>` with `hash` 8 hex digits of the namespace,
/// task UID and container (so runs and namespaces never collide); cut to
/// [`MAX_NAME`] characters, keeping the hash, when longer.
pub fn container_name(
    namespace: &str,
    task: &str,
    uid: &str,
    index: usize,
    container: &str,
) -> String {
    let digest = sha2::Sha256::digest(format!("{namespace}/{task}/{uid}/{index}/{container}"));
    let hash = hex::encode(&digest[..4]);
    let readable = format!("rlark-{task}-{index}-{container}");
    let room = MAX_NAME - hash.len() - 1;
    let mut cut: String = readable.chars().take(room).collect();
    while cut.ends_with(['-', '.', '_']) {
        cut.pop();
    }
    format!("{cut}-{hash}")
}

/// Amounts of a container's `resources` for the engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Limits {
    /// `NanoCpus`.
    nano_cpus: Option<i64>,
    /// `Memory`, bytes.
    memory: Option<i64>,
    /// GPUs of the device request.
    gpus: Option<i64>,
}

/// The engine's amounts of `container`'s `resources` (limits, else requests).
fn resource_limits(container: &DockerContainerSpec) -> Result<Limits, String> {
    let Some(resources) = &container.resources else {
        return Ok(Limits::default());
    };
    let amount = |name: &str, scale: i32| -> Result<Option<i64>, String> {
        let Some(quantity) = resources
            .limits
            .get(name)
            .or_else(|| resources.requests.get(name))
        else {
            return Ok(None);
        };
        let value = rlark_api::quantity::parse_quantity(&quantity.0)
            .map_err(|e| format!("resources {name} {:?}: {e}", quantity.0))?;
        let scaled = value
            .ceil_scaled(scale)
            .and_then(|v| i64::try_from(v).ok())
            .filter(|v| *v >= 0)
            .ok_or_else(|| format!("resources {name} {:?} is out of range", quantity.0))?;
        Ok(Some(scaled))
    };
    Ok(Limits {
        nano_cpus: amount("cpu", -9)?,
        memory: amount("memory", 0)?,
        gpus: amount("nvidia.com/gpu", 0)?,
    })
}

/// The engine's create body for `container` (see the module documentation).
fn create_body(
    set: &ContainerSet,
    container: &DockerContainerSpec,
    env: &[(String, String)],
) -> Result<Value, String> {
    // The container's own variables, then the contract; a later one wins, kept once.
    let mut merged: Vec<(String, String)> = Vec::new();
    for (name, value) in container
        .environment
        .iter()
        .map(|v| (v.name.clone(), v.value.clone()))
        .chain(env.iter().cloned())
    {
        merged.retain(|(n, _)| *n != name);
        merged.push((name, value));
    }
    let env: Vec<String> = merged.iter().map(|(n, v)| format!("{n}={v}")).collect();
    let mut binds = Vec::new();
    for volume in &container.volumes {
        if !volume.target.starts_with('/') {
            return Err(format!(
                "container {}: volume target {:?} is not an absolute path",
                container.name, volume.target
            ));
        }
        if volume.source.is_empty() {
            return Err(format!(
                "container {}: volume for {:?} has no source",
                container.name, volume.target
            ));
        }
        binds.push(format!("{}:{}", volume.source, volume.target));
    }
    for file in &set.read_only_files {
        if file.is_file() {
            binds.push(format!("{0}:{0}:ro", file.display()));
        }
    }
    for dir in &set.read_write_dirs {
        binds.push(format!("{0}:{0}", dir.display()));
    }
    let Limits {
        nano_cpus,
        memory,
        gpus,
    } = resource_limits(container)?;
    let mut labels = set.labels.clone();
    labels.insert(LABEL_CONTAINER.to_string(), container.name.clone());
    let mut host = json!({
        "NetworkMode": "host",
        "Binds": binds,
        "RestartPolicy": { "Name": "no" },
    });
    if let Some(nano) = nano_cpus {
        host["NanoCpus"] = json!(nano);
    }
    if let Some(memory) = memory {
        host["Memory"] = json!(memory);
    }
    if let Some(gpus) = gpus.filter(|g| *g > 0) {
        host["DeviceRequests"] = json!([{
            "Driver": "nvidia",
            "Count": gpus,
            "Capabilities": [["gpu"]],
        }]);
    }
    let mut body = json!({
        "Image": container.image,
        "Env": env,
        "Labels": labels,
        "HostConfig": host,
        "AttachStdout": false,
        "AttachStderr": false,
        "Tty": false,
    });
    if !container.command.is_empty() {
        body["Entrypoint"] = json!(container.command);
    }
    if !container.args.is_empty() {
        body["Cmd"] = json!(container.args);
    }
    Ok(body)
}

/// The docker runtime (see the module documentation). Process records (replicas a raw
/// agent left on this host) are handed to the raw runtime.
#[derive(Clone, Debug)]
pub struct DockerRuntime {
    client: DockerClient,
    node: String,
}

impl DockerRuntime {
    /// A runtime over `client`, for the containers of node `node`.
    pub fn new(client: DockerClient, node: impl Into<String>) -> Self {
        Self {
            client,
            node: node.into(),
        }
    }

    /// The engine client.
    pub fn client(&self) -> &DockerClient {
        &self.client
    }

    async fn start_set(&self, spec: ReplicaSpec) -> Result<DockerReplica, RuntimeError> {
        let set = spec.containers.clone().ok_or_else(|| {
            RuntimeError::Internal("the docker runtime was given no containers".to_string())
        })?;
        if set.containers.is_empty() || set.names.len() != set.containers.len() {
            return Err(RuntimeError::Internal(
                "the docker task has no containers".to_string(),
            ));
        }
        let logs_dir = spec.replica_dir.join("logs");
        std::fs::create_dir_all(&logs_dir).map_err(|source| RuntimeError::Io {
            path: logs_dir.clone(),
            source,
        })?;
        let names: Vec<&str> = set.containers.iter().map(|c| c.name.as_str()).collect();
        record::write(&spec.replica_dir.join(CONTAINERS_FILE), &names).map_err(|source| {
            RuntimeError::Io {
                path: spec.replica_dir.join(CONTAINERS_FILE),
                source,
            }
        })?;
        // A new run of the replica starts without an earlier run's exit or log position.
        for stale in [
            spec.replica_dir.join(record::EXIT_FILE),
            logs_dir.join(logs::SINCE_FILE),
        ] {
            let _ = record::remove(&stale);
        }
        let mut bodies = Vec::new();
        for container in &set.containers {
            match self.client.image_exists(&container.image).await {
                Ok(true) => {}
                Ok(false) => {
                    return Err(RuntimeError::Container {
                        reason: REASON_IMAGE_NOT_PRESENT,
                        message: format!(
                            "container {}: image {:?} is not present on the node, and the \
                             docker runtime does not pull images",
                            container.name, container.image
                        ),
                    });
                }
                Err(error) => return Err(engine_error(&container.name, &error)),
            }
            let body = create_body(&set, container, &spec.env).map_err(|message| {
                RuntimeError::Container {
                    reason: REASON_CONTAINER_ERROR,
                    message,
                }
            })?;
            bodies.push(body);
        }
        let mut ids: Vec<String> = Vec::new();
        let started = async {
            for ((container, name), body) in set.containers.iter().zip(&set.names).zip(&bodies) {
                // A container of that name left by an earlier run or agent goes first.
                if let Ok(Some(old)) = self.client.inspect(name).await {
                    self.client
                        .remove(&old.id)
                        .await
                        .map_err(|e| engine_error(&container.name, &e))?;
                }
                let id = self
                    .client
                    .create_container(name, body)
                    .await
                    .map_err(|e| engine_error(&container.name, &e))?;
                ids.push(id);
            }
            for (container, id) in set.containers.iter().zip(&ids) {
                self.client
                    .start_container(id)
                    .await
                    .map_err(|e| engine_error(&container.name, &e))?;
            }
            let main = self
                .client
                .inspect(&ids[0])
                .await
                .map_err(|e| engine_error(&set.containers[0].name, &e))?
                .ok_or_else(|| RuntimeError::Container {
                    reason: REASON_CONTAINER_ERROR,
                    message: format!(
                        "container {} vanished right after its start",
                        set.containers[0].name
                    ),
                })?;
            Ok::<_, RuntimeError>(main)
        }
        .await;
        let main = match started {
            Ok(main) => main,
            Err(error) => {
                for id in &ids {
                    if let Err(e) = self.client.remove(id).await {
                        tracing::warn!(container = %id, error = %e, "remove a container of a failed start");
                    }
                }
                return Err(error);
            }
        };
        let record = ContainerRecord {
            ids: ids.clone(),
            names: set.containers.iter().map(|c| c.name.clone()).collect(),
            pid: main.state.pid,
            start_ticks: process::proc_stat(main.state.pid).map(|s| s.start_ticks),
        };
        let started_at = parse_time(&main.state.started_at).unwrap_or_else(SystemTime::now);
        Ok(DockerReplica::supervise(
            self.client.clone(),
            record,
            true,
            started_at,
            spec.replica_dir.clone(),
            spec.log_limits,
            spec.deadline,
            spec.grace,
        ))
    }

    async fn adopt_set(
        &self,
        spec: &ReplicaSpec,
        recorded: &ContainerRecord,
        grace: Duration,
    ) -> Adopted {
        let Some(main_id) = recorded.ids.first() else {
            return Adopted::Lost("the state file names no container".to_string());
        };
        let main = match self.client.inspect(main_id).await {
            Ok(main) => main,
            Err(error) => {
                return Adopted::Lost(format!(
                    "the Docker engine cannot be asked about container {main_id}: {error}; \
                     the outcome of the run is unknown"
                ));
            }
        };
        let Some(main) = main else {
            // Finished while no agent watched (and removed), or removed by someone else.
            let exit = record::read::<ExitRecord>(&spec.replica_dir.join(record::EXIT_FILE))
                .ok()
                .flatten();
            for id in &recorded.ids[1..] {
                let _ = self.client.remove(id).await;
            }
            return match exit.and_then(|e| e.status().map(|s| (s, e))) {
                Some((status, exit)) => Adopted::Exited(ReplicaExit {
                    status,
                    cause: ExitCause::Exited,
                    killed: exit.killed,
                    finished_at: exit.finished_at(),
                }),
                None => Adopted::Lost(format!(
                    "container {main_id} was removed while no agent watched; the outcome of \
                     the run is unknown"
                )),
            };
        };
        let mut record = recorded.clone();
        record.pid = main.state.pid;
        record.start_ticks = process::proc_stat(main.state.pid).map(|s| s.start_ticks);
        let started_at = parse_time(&main.state.started_at).unwrap_or_else(SystemTime::now);
        let mut replica = DockerReplica::supervise(
            self.client.clone(),
            record,
            false,
            started_at,
            spec.replica_dir.clone(),
            spec.log_limits,
            spec.deadline,
            grace,
        );
        if main.state.running {
            Adopted::Running(Box::new(replica))
        } else {
            Adopted::Exited(replica.wait().await)
        }
    }

    /// Remove every container labelled for this node that none of `known` (container ids
    /// of the replicas state files name) is: left by an agent that died between creating
    /// and recording it, or of a replica whose state is gone. Returns how many went.
    pub async fn sweep(&self, known: &[String]) -> Result<usize, DockerError> {
        let found = self
            .client
            .list(&[
                format!("{LABEL_MANAGED_BY}={MANAGED_BY}"),
                format!("{LABEL_NODE}={}", self.node),
            ])
            .await?;
        let mut removed = 0;
        for container in found {
            if known.contains(&container.id) {
                continue;
            }
            tracing::info!(container = %container.id, names = ?container.names, task = container.labels.get(LABEL_TASK).map(String::as_str).unwrap_or(""), "removing a container no replica owns");
            self.client.remove(&container.id).await?;
            removed += 1;
        }
        Ok(removed)
    }
}

impl Runtime for DockerRuntime {
    fn start(
        &self,
        spec: ReplicaSpec,
    ) -> BoxFuture<'static, Result<Box<dyn RunningReplica>, RuntimeError>> {
        let runtime = self.clone();
        Box::pin(async move {
            if spec.containers.is_none() {
                return RawRuntime.start(spec).await;
            }
            let replica = runtime.start_set(spec).await?;
            Ok(Box::new(replica) as Box<dyn RunningReplica>)
        })
    }

    fn adopt<'a>(
        &'a self,
        spec: &'a ReplicaSpec,
        recorded: &'a RecordedReplica,
    ) -> BoxFuture<'a, Adopted> {
        Box::pin(async move {
            match &recorded.record {
                ReplicaRecord::Container(container) => {
                    self.adopt_set(spec, container, recorded.grace).await
                }
                ReplicaRecord::Process(_) => RawRuntime.adopt(spec, recorded).await,
            }
        })
    }

    fn sweep<'a>(&'a self, known: &'a [ReplicaRecord]) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let ids: Vec<String> = known
                .iter()
                .filter_map(|r| match r {
                    ReplicaRecord::Container(c) => Some(c.ids.clone()),
                    ReplicaRecord::Process(_) => None,
                })
                .flatten()
                .collect();
            match DockerRuntime::sweep(self, &ids).await {
                Ok(0) => {}
                Ok(removed) => tracing::info!(removed, "removed containers no replica owns"),
                Err(error) => tracing::warn!(%error, "cannot look for containers no replica owns"),
            }
        })
    }
}

fn engine_error(container: &str, error: &DockerError) -> RuntimeError {
    RuntimeError::Container {
        reason: REASON_CONTAINER_ERROR,
        message: format!("container {container}: {error}"),
    }
}

/// An RFC 3339 time of the engine (`None` for its zero time).
fn parse_time(text: &str) -> Option<SystemTime> {
    let time = chrono::DateTime::parse_from_rfc3339(text).ok()?;
    (time.timestamp() > 0).then(|| SystemTime::from(time.with_timezone(&chrono::Utc)))
}

/// A replica's containers under supervision (see the module documentation).
#[derive(Debug)]
pub struct DockerReplica {
    record: ContainerRecord,
    started_at: SystemTime,
    terminate: watch::Sender<Option<Duration>>,
    exit: watch::Receiver<Option<ReplicaExit>>,
    task: Option<JoinHandle<()>>,
}

impl DockerReplica {
    /// Supervise the containers of `record`; `fresh` when they were just started (not
    /// adopted), so each log gets a separator when it holds an earlier start's output.
    #[allow(clippy::too_many_arguments)]
    fn supervise(
        client: DockerClient,
        record: ContainerRecord,
        fresh: bool,
        started_at: SystemTime,
        replica_dir: PathBuf,
        log_limits: super::LogLimits,
        deadline: Option<Instant>,
        grace: Duration,
    ) -> Self {
        let (terminate, terminate_rx) = watch::channel(None);
        let (exit_tx, exit) = watch::channel(None);
        let supervision = Supervision {
            client,
            ids: record.ids.clone(),
            names: record.names.clone(),
            fresh,
            replica_dir,
            log_limits,
            deadline,
            grace: grace.min(super::MAX_GRACE),
        };
        let task = tokio::spawn(async move {
            let exit = supervision.run(terminate_rx).await;
            let _ = exit_tx.send(Some(exit));
        });
        Self {
            record,
            started_at,
            terminate,
            exit,
            task: Some(task),
        }
    }

    async fn wait(&mut self) -> ReplicaExit {
        loop {
            if let Some(exit) = *self.exit.borrow_and_update() {
                return exit;
            }
            if self.exit.changed().await.is_err() {
                // The supervision ended without an exit (it panicked).
                return self.exit.borrow().unwrap_or(ReplicaExit {
                    status: ExitStatus::Unknown,
                    cause: ExitCause::Exited,
                    killed: false,
                    finished_at: SystemTime::now(),
                });
            }
        }
    }
}

impl Drop for DockerReplica {
    fn drop(&mut self) {
        // Stop supervising; the containers keep running for the next agent.
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl RunningReplica for DockerReplica {
    fn record(&self) -> ReplicaRecord {
        ReplicaRecord::Container(self.record.clone())
    }

    fn started_at(&self) -> SystemTime {
        self.started_at
    }

    /// The main container's init (its processes descend from it).
    fn roots(&self) -> Vec<rlark_proto::holders::ProcessRef> {
        let pid = i32::try_from(self.record.pid).ok().filter(|p| *p > 0);
        match (pid, self.record.start_ticks) {
            (Some(pid), Some(start_ticks)) => {
                vec![rlark_proto::holders::ProcessRef { pid, start_ticks }]
            }
            _ => Vec::new(),
        }
    }

    fn wait(&mut self) -> BoxFuture<'_, ReplicaExit> {
        Box::pin(DockerReplica::wait(self))
    }

    fn terminate(&mut self, grace: Duration) -> BoxFuture<'_, ReplicaExit> {
        Box::pin(async move {
            if self.exit.borrow().is_none() {
                let _ = self.terminate.send(Some(grace.min(super::MAX_GRACE)));
            }
            DockerReplica::wait(self).await
        })
    }

    fn detach(self: Box<Self>) {
        drop(self);
    }
}

/// The in-agent supervision of one replica's containers.
struct Supervision {
    client: DockerClient,
    ids: Vec<String>,
    names: Vec<String>,
    /// Just started (a separator goes into a log holding an earlier start), not adopted.
    fresh: bool,
    replica_dir: PathBuf,
    log_limits: super::LogLimits,
    deadline: Option<Instant>,
    grace: Duration,
}

impl Supervision {
    async fn run(self, mut terminate: watch::Receiver<Option<Duration>>) -> ReplicaExit {
        let logs_dir = self.replica_dir.join("logs");
        let mut pumps = Vec::new();
        for (i, id) in self.ids.iter().enumerate() {
            let files = if i == 0 {
                LogFiles::new(&logs_dir, self.log_limits)
            } else {
                let sidecar = self.names.get(i).map_or("sidecar", String::as_str);
                LogFiles::named(&logs_dir, &format!("{sidecar}.log"), self.log_limits)
            };
            pumps.push(tokio_util::task::AbortOnDropHandle::new(tokio::spawn(
                logs::pump(self.client.clone(), id.clone(), files, self.fresh),
            )));
        }
        let main = self.ids[0].clone();
        let wait_main = async {
            loop {
                match self.client.wait_not_running(&main).await {
                    Ok(_) => return,
                    Err(error) => {
                        tracing::warn!(container = %main, %error, "waiting for the container failed; retrying");
                        if let Ok(None) = self.client.inspect(&main).await {
                            return;
                        }
                        tokio::time::sleep(RETRY_PAUSE).await;
                    }
                }
            }
        };
        let deadline = async {
            match self.deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let requested = async {
            loop {
                if let Some(grace) = *terminate.borrow_and_update() {
                    return grace;
                }
                if terminate.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::pin!(wait_main);
        let (cause, killed) = tokio::select! {
            () = &mut wait_main => {
                // Sidecars go with the main container.
                let killed = self.stop(&self.ids[1..], self.grace).await;
                (ExitCause::Exited, killed)
            }
            grace = requested => (ExitCause::Terminated, self.stop(&self.ids, grace).await),
            () = deadline => (ExitCause::DeadlineExceeded, self.stop(&self.ids, self.grace).await),
        };
        let status = match self.client.inspect(&main).await {
            Ok(Some(inspect)) => {
                ExitStatus::Code(i32::try_from(inspect.state.exit_code).unwrap_or(-1))
            }
            Ok(None) => ExitStatus::Unknown,
            Err(error) => {
                tracing::warn!(container = %main, %error, "cannot read the container's exit");
                ExitStatus::Unknown
            }
        };
        // The rest of the output, before the containers (and their logs) go.
        let _ = tokio::time::timeout(LOG_DRAIN, futures::future::join_all(pumps.iter_mut())).await;
        let mut exit_record = ExitRecord::exited(status);
        exit_record.killed = killed;
        let exit_path = self.replica_dir.join(record::EXIT_FILE);
        if let Err(error) = record::write(&exit_path, &exit_record) {
            tracing::warn!(file = %exit_path.display(), %error, "record the replica's exit");
        }
        for id in &self.ids {
            if let Err(error) = self.client.remove(id).await {
                tracing::warn!(container = %id, %error, "remove a finished container");
            }
        }
        ReplicaExit {
            status,
            cause,
            killed,
            finished_at: SystemTime::now(),
        }
    }

    /// SIGTERM to `ids`, SIGKILL after `grace` to those still running; returns whether a
    /// SIGKILL was needed.
    async fn stop(&self, ids: &[String], grace: Duration) -> bool {
        if ids.is_empty() {
            return false;
        }
        for id in ids {
            if let Err(error) = self.client.kill(id, "SIGTERM").await {
                tracing::warn!(container = %id, %error, "SIGTERM a container");
            }
        }
        let all_stopped =
            futures::future::join_all(ids.iter().map(|id| self.client.wait_not_running(id)));
        if tokio::time::timeout(grace, all_stopped).await.is_ok() {
            return false;
        }
        for id in ids {
            if let Err(error) = self.client.kill(id, "SIGKILL").await {
                tracing::warn!(container = %id, %error, "SIGKILL a container");
            }
        }
        let _ = tokio::time::timeout(
            Duration::from_secs(30),
            futures::future::join_all(ids.iter().map(|id| self.client.wait_not_running(id))),
        )
        .await;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_log_files_and_unknown_names() {
        let names = vec!["main".to_string(), "tb".to_string()];
        assert_eq!(
            container_log_file(&names, None).as_deref(),
            Ok("current.log")
        );
        assert_eq!(
            container_log_file(&names, Some("main")).as_deref(),
            Ok("current.log")
        );
        assert_eq!(
            container_log_file(&names, Some("tb")).as_deref(),
            Ok("tb.log")
        );
        assert_eq!(
            container_log_file(&names, Some("nope")),
            Err("container \"nope\" is not in this replica: its containers are main, tb".into())
        );
        assert_eq!(container_index(&[], None), Ok(0));
        assert!(
            container_index(&[], Some("main"))
                .is_err_and(|e| e.contains("runs processes, not containers")),
        );
    }
    use rlark_api::types::{DockerVolumeRef, EnvVar, ResourceRequirements};

    #[test]
    fn names_are_short_deterministic_and_distinct() {
        let a = container_name("rlark-c", "job-env", "u1", 0, "main");
        assert_eq!(a, container_name("rlark-c", "job-env", "u1", 0, "main"));
        assert!(a.starts_with("rlark-job-env-0-main-"), "{a}");
        assert_ne!(a, container_name("rlark-c", "job-env", "u2", 0, "main"));
        assert_ne!(a, container_name("rlark-d", "job-env", "u1", 0, "main"));
        let long = "x".repeat(200);
        let cut = container_name("rlark-c", &long, "u1", 3, "main");
        assert_eq!(cut.len(), MAX_NAME, "{cut}");
        assert_ne!(cut, container_name("rlark-c", &long, "u1", 4, "main"));
    }

    #[test]
    fn create_bodies_carry_env_mounts_resources_and_labels() {
        let mut container = DockerContainerSpec {
            name: "main".into(),
            image: "img:1".into(),
            command: vec!["/bin/sh".into()],
            args: vec!["-c".into(), "true".into()],
            environment: vec![
                EnvVar {
                    name: "A".into(),
                    value: "1".into(),
                },
                EnvVar {
                    name: "RLARK_TASK".into(),
                    value: "mine".into(),
                },
            ],
            volumes: vec![DockerVolumeRef {
                source: "/data".into(),
                target: "/in".into(),
            }],
            resources: Some(ResourceRequirements::default()),
        };
        let resources = container.resources.as_mut().unwrap();
        resources.limits.insert(
            "cpu".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("500m".into()),
        );
        resources.limits.insert(
            "memory".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("64Mi".into()),
        );
        resources.requests.insert(
            "nvidia.com/gpu".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("2".into()),
        );
        let mut set = ContainerSet {
            labels: labels("n1", "rlark-c", "t", "u", 0, "k"),
            ..ContainerSet::default()
        };
        let env = vec![("RLARK_TASK".to_string(), "t".to_string())];
        let body = create_body(&set, &container, &env).expect("body");
        assert_eq!(body["Env"], json!(["A=1", "RLARK_TASK=t"]));
        assert_eq!(body["Entrypoint"], json!(["/bin/sh"]));
        assert_eq!(body["Cmd"], json!(["-c", "true"]));
        assert_eq!(body["HostConfig"]["Binds"], json!(["/data:/in"]));
        assert_eq!(body["HostConfig"]["NanoCpus"], 500_000_000);
        assert_eq!(body["HostConfig"]["Memory"], 64 * 1024 * 1024);
        assert_eq!(body["HostConfig"]["DeviceRequests"][0]["Count"], 2);
        assert_eq!(body["Labels"][LABEL_MANAGED_BY], MANAGED_BY);
        assert_eq!(body["Labels"][LABEL_CONTAINER], "main");
        assert_eq!(body["Labels"][LABEL_NODE], "n1");

        // A replica holding devices: the runtime's socket directory at the same path.
        set.read_write_dirs
            .push(PathBuf::from("/run/rlark-embodied"));
        let body = create_body(&set, &container, &env).expect("body");
        assert_eq!(
            body["HostConfig"]["Binds"],
            json!(["/data:/in", "/run/rlark-embodied:/run/rlark-embodied"])
        );

        container.volumes[0].target = "relative".into();
        let error = create_body(&set, &container, &env).expect_err("relative target");
        assert!(
            error.contains("\"relative\" is not an absolute path"),
            "{error}"
        );
        container.volumes.clear();
        container.resources.as_mut().unwrap().limits.insert(
            "cpu".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("lots".into()),
        );
        let error = create_body(&set, &container, &env).expect_err("bad cpu");
        assert!(error.contains("resources cpu \"lots\""), "{error}");
    }
}
