//! The contract between the Task reconciler (`tasks/`) and a runtime: what the
//! per-replica worker asks of whatever runs its replica. The raw runtime ([`RawRuntime`]:
//! a process group under a supervisor process, this module's parent) implements it, and so
//! does the docker runtime ([`super::docker::DockerRuntime`]: containers of the node's
//! engine).

use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use k8s_openapi::jiff::Timestamp;
use rlark_api::agent::status::{self, ExitReport};

use super::{
    Adoption, ExitCause, ReplicaExit, ReplicaHandle, ReplicaSpec, RuntimeError, adopt_replica,
    process, spawn_replica,
};

/// A way to run replicas.
///
/// A runtime owns the replica while the agent runs and keeps running it when the agent
/// exits or dies: starting, waiting and stopping go through it; a later agent takes a
/// replica back with [`Runtime::adopt`]. Everything a replica leaves on disk lives in
/// [`ReplicaSpec::replica_dir`] (`logs/current.log` included), so the logs API works the
/// same for every runtime (exec into a container goes through its engine, `exec.rs`).
pub trait Runtime: Send + Sync {
    /// Start replica `spec`. Returns once it runs (or could not be started: the error's
    /// [`RuntimeError::reason`] is the Pod reason, its message names the problem; nothing is
    /// left behind then). It must be killed at [`ReplicaSpec::deadline`] (the exit then
    /// says [`ExitCause::DeadlineExceeded`]) and keep running when the agent goes away.
    fn start(
        &self,
        spec: ReplicaSpec,
    ) -> BoxFuture<'static, Result<Box<dyn RunningReplica>, RuntimeError>>;

    /// Take over the replica in `spec.replica_dir` that an earlier agent started (`spec`
    /// gives the deadline and grace period of the supervision from now on; its entrypoint
    /// and environment are not used). `recorded` is what the agent recorded of it when it
    /// started. A replica whose end cannot be known is [`Adopted::Lost`], with whatever is
    /// left of it killed before this returns.
    fn adopt<'a>(
        &'a self,
        spec: &'a ReplicaSpec,
        recorded: &'a RecordedReplica,
    ) -> BoxFuture<'a, Adopted>;

    /// Called once at start-up, before any replica is started or adopted, with every
    /// replica the state files name: remove what this runtime runs that none of them is
    /// (nothing for the raw runtime: its processes are found through their state files).
    fn sweep<'a>(&'a self, known: &'a [ReplicaRecord]) -> BoxFuture<'a, ()> {
        let _ = known;
        Box::pin(async {})
    }
}

/// A replica that runs (or ran), started or adopted by a [`Runtime`].
pub trait RunningReplica: Send + Sync {
    /// What identifies it for the agent's state file.
    fn record(&self) -> ReplicaRecord;

    /// When it (its current process) started.
    fn started_at(&self) -> SystemTime;

    /// The processes whose session members and descendants are the replica (a raw
    /// replica's supervisor, a container's init), for the embodied runtime's device
    /// authorization (`rlark_embodied::access`). Empty when they cannot be told.
    fn roots(&self) -> Vec<rlark_proto::holders::ProcessRef> {
        Vec::new()
    }

    /// Wait for its end. Cancel-safe; after the end every call returns it at once.
    fn wait(&mut self) -> BoxFuture<'_, ReplicaExit>;

    /// Stop it: SIGTERM (or the runtime's equivalent), SIGKILL after `grace` if anything of
    /// it is left, and wait for its end. Returns at once when it ended already.
    fn terminate(&mut self, grace: Duration) -> BoxFuture<'_, ReplicaExit>;

    /// Stop supervising it and leave it running (the next agent adopts it).
    fn detach(self: Box<Self>);
}

/// What identifies a replica's main process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessRecord {
    /// Pid of the main process.
    pub pid: u32,
    /// Its process group.
    pub pgid: i32,
    /// Its start in clock ticks after boot, to tell it from a later process with the pid.
    pub start_ticks: Option<u64>,
}

/// What identifies a replica's containers (the docker runtime).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerRecord {
    /// Engine ids of its containers, the main one first.
    pub ids: Vec<String>,
    /// Their names in the Task, in the same order.
    pub names: Vec<String>,
    /// Host pid of the main container's main process (0 when unknown).
    pub pid: u32,
    /// Its start in clock ticks after boot.
    pub start_ticks: Option<u64>,
}

/// What identifies a replica: a process group (raw) or containers (docker).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicaRecord {
    /// A process group on this host.
    Process(ProcessRecord),
    /// Containers of the node's Docker engine.
    Container(ContainerRecord),
}

impl ReplicaRecord {
    /// Host pid of the replica's main process (for logs and the local API's liveness
    /// check; 0 when unknown).
    pub fn pid(&self) -> u32 {
        match self {
            ReplicaRecord::Process(p) => p.pid,
            ReplicaRecord::Container(c) => c.pid,
        }
    }
}

/// What the agent recorded of a started replica (in its state file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedReplica {
    /// Its main process, or its containers.
    pub record: ReplicaRecord,
    /// The SIGTERM → SIGKILL grace period it was started with.
    pub grace: Duration,
}

/// What [`Runtime::adopt`] found.
pub enum Adopted {
    /// It still runs: supervised from now on as a started one is.
    Running(Box<dyn RunningReplica>),
    /// It ended while no agent watched.
    Exited(ReplicaExit),
    /// Its end cannot be known; what is left of it was killed. The message says what is
    /// unknown.
    Lost(String),
}

/// The raw runtime: a process group on this host under a supervisor process
/// ([`spawn_replica`], [`adopt_replica`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct RawRuntime;

impl Runtime for RawRuntime {
    fn start(
        &self,
        spec: ReplicaSpec,
    ) -> BoxFuture<'static, Result<Box<dyn RunningReplica>, RuntimeError>> {
        Box::pin(async move {
            let handle = spawn_replica(spec).await?;
            Ok(Box::new(handle) as Box<dyn RunningReplica>)
        })
    }

    fn adopt<'a>(
        &'a self,
        spec: &'a ReplicaSpec,
        recorded: &'a RecordedReplica,
    ) -> BoxFuture<'a, Adopted> {
        Box::pin(async move {
            let ReplicaRecord::Process(process) = recorded.record.clone() else {
                return Adopted::Lost(
                    "the replica ran in containers, and this agent runs processes (its agent \
                     type changed); the containers were left as they are and the outcome of \
                     the run is unknown"
                        .to_string(),
                );
            };
            match adopt_replica(spec).await {
                Adoption::Running(handle) => Adopted::Running(Box::new(handle)),
                Adoption::Exited(exit) => Adopted::Exited(exit),
                Adoption::Lost(message) => Adopted::Lost(message),
                Adoption::NoRecord => Adopted::Lost(end_unrecorded(process, recorded.grace).await),
            }
        })
    }
}

/// A replica recorded without a supervisor record (`pid.json`; a start by an agent that
/// ran processes without supervisors): its process group is killed, its outcome unknown.
/// Returns the `AgentLost` message.
async fn end_unrecorded(recorded: ProcessRecord, grace: Duration) -> String {
    let leader_running = process::process_running(recorded.pid, recorded.start_ticks);
    // Without its leader, the group can only still exist with our stragglers in it (a
    // process group id is not reused while any member lives).
    let leader_pid_taken = process::proc_stat(recorded.pid).is_some();
    let group_left = leader_running || (!leader_pid_taken && process::group_exists(recorded.pgid));
    if group_left {
        process::kill_group(recorded.pgid, grace).await;
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
        recorded.pid
    )
}

impl RunningReplica for ReplicaHandle {
    fn record(&self) -> ReplicaRecord {
        ReplicaRecord::Process(ProcessRecord {
            pid: self.pid(),
            pgid: self.pgid(),
            start_ticks: self.start_ticks(),
        })
    }

    fn started_at(&self) -> SystemTime {
        ReplicaHandle::started_at(self)
    }

    /// The supervisor: it leads the replica's session and reaps its orphans.
    fn roots(&self) -> Vec<rlark_proto::holders::ProcessRef> {
        let pid = i32::try_from(self.supervisor_pid()).ok();
        match (pid, self.supervisor_start_ticks()) {
            (Some(pid), Some(start_ticks)) => {
                vec![rlark_proto::holders::ProcessRef { pid, start_ticks }]
            }
            _ => Vec::new(),
        }
    }

    fn wait(&mut self) -> BoxFuture<'_, ReplicaExit> {
        Box::pin(ReplicaHandle::wait(self))
    }

    fn terminate(&mut self, grace: Duration) -> BoxFuture<'_, ReplicaExit> {
        Box::pin(ReplicaHandle::terminate(self, grace))
    }

    fn detach(self: Box<Self>) {
        ReplicaHandle::detach(*self);
    }
}

/// A wall-clock time as a [`Timestamp`] (now when it cannot be one).
pub fn timestamp(time: SystemTime) -> Timestamp {
    Timestamp::try_from(time).unwrap_or_else(|_| Timestamp::now())
}

/// `exit` as the agent protocol reports it ([`status::ExitReport`]).
pub fn exit_report(exit: &ReplicaExit) -> ExitReport {
    ExitReport {
        code: exit.status.code(),
        description: exit.status.to_string(),
        cause: match exit.cause {
            ExitCause::Exited => status::ExitCause::Exited,
            ExitCause::Terminated => status::ExitCause::Terminated,
            ExitCause::DeadlineExceeded => status::ExitCause::DeadlineExceeded,
        },
        killed: exit.killed,
        finished_at: timestamp(exit.finished_at),
    }
}

#[cfg(test)]
mod tests {
    use rlark_api::agent::{REASON_AGENT_LOST, REASON_DEADLINE_EXCEEDED, REASON_STOPPED};
    use serde_json::Value;

    use super::super::DEFAULT_GRACE;
    use super::*;

    #[test]
    fn statuses_say_how_the_replica_ended() {
        let exit = |status, cause, killed| ReplicaExit {
            status,
            cause,
            killed,
            finished_at: SystemTime::now(),
        };
        use super::super::ExitStatus::{Code, Signal};
        // The statuses of the protocol, from the runtime's exits.
        let final_status =
            |exit: &ReplicaExit, restarts| status::exited(&exit_report(exit), restarts).to_json();
        let stopped_status = |exit: Option<&ReplicaExit>, grace, restarts| {
            status::stopped(
                exit.map(exit_report).as_ref(),
                grace,
                restarts,
                Timestamp::now(),
            )
            .to_json()
        };
        let deadline_status = |seconds, exit: Option<&ReplicaExit>, grace, restarts| {
            status::deadline_exceeded(
                seconds,
                exit.map(exit_report).as_ref(),
                grace,
                restarts,
                Timestamp::now(),
            )
            .to_json()
        };
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
            &exit(super::super::ExitStatus::Unknown, ExitCause::Exited, false),
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
