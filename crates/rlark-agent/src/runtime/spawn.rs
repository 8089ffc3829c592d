//! Starting a raw replica under its supervisor, adopting one an earlier agent left, and the
//! handle that reports its exit.

use super::*;
use setup::prepare;
use supervision::{Supervised, Watched, kill, supervise};

/// A running (or finished) replica. See the module documentation.
#[derive(Debug)]
pub struct ReplicaHandle {
    pid: u32,
    pgid: i32,
    start_ticks: Option<u64>,
    supervisor_pid: u32,
    supervisor_start_ticks: Option<u64>,
    started_at: SystemTime,
    work_dir: PathBuf,
    log_path: PathBuf,
    terminate: watch::Sender<Option<Duration>>,
    exit: watch::Receiver<Option<ReplicaExit>>,
    supervisor: Option<JoinHandle<()>>,
}

impl ReplicaHandle {
    /// Pid of the main process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its process group (= its pid).
    pub fn pgid(&self) -> i32 {
        self.pgid
    }

    /// Its start time in clock ticks after boot (`/proc/<pid>/stat`), when readable.
    pub fn start_ticks(&self) -> Option<u64> {
        self.start_ticks
    }

    /// Pid of its supervisor process.
    pub fn supervisor_pid(&self) -> u32 {
        self.supervisor_pid
    }

    /// The supervisor's start time in clock ticks after boot, when it was readable.
    pub fn supervisor_start_ticks(&self) -> Option<u64> {
        self.supervisor_start_ticks
    }

    /// When it was started.
    pub fn started_at(&self) -> SystemTime {
        self.started_at
    }

    /// The working directory it runs in (for an adopted replica: the replica's default
    /// working directory, `work/`, whatever `raw.workingDir` said).
    pub fn work_dir(&self) -> &Path {
        &self.work_dir
    }

    /// `logs/current.log`.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The exit, if it happened already.
    pub fn try_exit(&self) -> Option<ReplicaExit> {
        *self.exit.borrow()
    }

    /// Wait for the exit. Cancel-safe; after the exit every call returns it at once.
    pub async fn wait(&mut self) -> ReplicaExit {
        let seen = match self.exit.wait_for(Option::is_some).await {
            Ok(exit) => *exit,
            // The supervision ended without recording an exit (a panic): say so.
            Err(_) => None,
        };
        seen.or_else(|| self.try_exit())
            .unwrap_or_else(unknown_exit)
    }

    /// Stop the replica: SIGTERM to its process group (through its supervisor), SIGKILL to
    /// the group after `grace` if anything of it is left, and wait for the exit. Returns at
    /// once (the recorded exit) when it has ended already; a deadline kill in progress is
    /// waited for.
    pub async fn terminate(&mut self, grace: Duration) -> ReplicaExit {
        if self.try_exit().is_none() {
            self.terminate.send_if_modified(|current| {
                if current.is_none() {
                    *current = Some(grace);
                    true
                } else {
                    false
                }
            });
        }
        self.wait().await
    }

    /// Stop supervising and leave the process running (no more deadline, rotation, or
    /// exit report here; its supervisor process still records the exit). The same
    /// happens on drop.
    pub fn detach(mut self) {
        if let Some(supervisor) = self.supervisor.take() {
            supervisor.abort();
        }
    }
}

impl Drop for ReplicaHandle {
    fn drop(&mut self) {
        if let Some(supervisor) = self.supervisor.take() {
            supervisor.abort();
        }
    }
}

pub(super) fn unknown_exit() -> ReplicaExit {
    ReplicaExit {
        status: ExitStatus::Unknown,
        cause: ExitCause::Exited,
        killed: false,
        finished_at: SystemTime::now(),
    }
}

/// Start one replica (see the module documentation). Errors say what is wrong in terms
/// of the Task (missing program, bad working directory, artifact) and never leave a
/// process behind.
pub async fn spawn_replica(spec: ReplicaSpec) -> Result<ReplicaHandle, RuntimeError> {
    let prepared_spec = spec.clone();
    let prepared = tokio::task::spawn_blocking(move || prepare(&prepared_spec))
        .await
        .map_err(|e| RuntimeError::Internal(e.to_string()))??;
    let Some((supervisor, leading)) = spec.supervisor.split_first() else {
        return Err(RuntimeError::Supervisor {
            program: String::new(),
            detail: "no supervisor command is configured".to_string(),
        });
    };
    let supervisor_name = supervisor.to_string_lossy().into_owned();

    let mut command = tokio::process::Command::new(supervisor);
    command
        .args(leading)
        .arg("--dir")
        .arg(&spec.replica_dir)
        .arg("--grace-ms")
        .arg(spec.grace.as_millis().to_string())
        .arg("--arg0")
        .arg(&spec.entrypoint[0]);
    if let Some(network) = &spec.network {
        command
            .arg("--netns")
            .arg(&network.netns_path)
            .arg("--hosts")
            .arg(&network.hosts_file);
    }
    if let Some(sandbox) = &spec.sandbox {
        let path = sandbox
            .write(&spec.replica_dir)
            .map_err(|e| RuntimeError::Isolation(e.to_string()))?;
        command.arg("--sandbox").arg(path);
    } else {
        // A sandbox of an earlier start must not make exec enter a replica that has none.
        let path = spec.replica_dir.join(sandbox::SANDBOX_FILE);
        record::remove(&path).map_err(|source| RuntimeError::Io { path, source })?;
    }
    command
        .arg("--")
        .arg(&prepared.program)
        .args(&spec.entrypoint[1..])
        .current_dir(&prepared.work_dir)
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::from(prepared.stdout))
        .stderr(Stdio::from(prepared.stderr))
        // No `pre_exec` hook here: without one the standard library starts the supervisor
        // with `posix_spawn` (a `vfork`-style clone that shares the agent's memory until the
        // exec) rather than `fork`, which copies the page tables of the agent, a large
        // multi-threaded process, on every start. Whatever signals the agent inherited
        // ignored or blocked, the supervisor resets them itself as it starts
        // (`supervisor::main`) and starts the task clean.
        .kill_on_drop(false);
    let mut child = command.spawn().map_err(|e| RuntimeError::Supervisor {
        program: supervisor_name.clone(),
        detail: e.to_string(),
    })?;
    let started = wait_started(&mut child, &spec.replica_dir, &prepared.program).await?;
    let watched = Watched::Child {
        child,
        pid: started.supervisor_pid,
    };
    Ok(supervise_replica(
        &spec,
        &started,
        watched,
        prepared.work_dir,
        prepared.logs,
    ))
}

/// Wait until the supervisor wrote `pid.json` (at most [`START_TIMEOUT`]). A supervisor
/// that exits first could not start the program: its `exit.json` says why.
pub(super) async fn wait_started(
    child: &mut tokio::process::Child,
    dir: &Path,
    program: &Path,
) -> Result<PidRecord, RuntimeError> {
    let program_name = program.display().to_string();
    let pid_path = dir.join(PID_FILE);
    let until = Instant::now() + START_TIMEOUT;
    loop {
        match record::read::<PidRecord>(&pid_path) {
            Ok(Some(started)) => return Ok(started),
            Ok(None) => {}
            Err(error) => {
                return Err(RuntimeError::Internal(format!(
                    "read {}: {error}",
                    pid_path.display()
                )));
            }
        }
        match child.try_wait() {
            Ok(Some(status)) => {
                return Err(match record::read::<ExitRecord>(&dir.join(EXIT_FILE)) {
                    Ok(Some(ExitRecord {
                        error: Some(error),
                        errno,
                        ..
                    })) => RuntimeError::Spawn {
                        program: program_name,
                        source: match errno {
                            Some(errno) => io::Error::from_raw_os_error(errno),
                            None => io::Error::other(error),
                        },
                    },
                    _ => RuntimeError::Internal(format!(
                        "the replica supervisor {status} before starting {program_name} \
                         (its messages are in the replica log)"
                    )),
                });
            }
            Ok(None) => {}
            Err(error) => {
                return Err(RuntimeError::Internal(format!(
                    "wait for the replica supervisor: {error}"
                )));
            }
        }
        if Instant::now() >= until {
            // Whatever it started is unrecorded: stop it rather than lose track of it.
            let _ = child.start_kill();
            return Err(RuntimeError::Internal(format!(
                "the replica supervisor did not record the start of {program_name} within \
                 {START_TIMEOUT:?}"
            )));
        }
        tokio::time::sleep(START_POLL).await;
    }
}

/// What [`adopt_replica`] found in a replica directory left by an earlier agent.
#[derive(Debug)]
pub enum Adoption {
    /// Its supervisor still runs: supervised from now on as a started one is.
    Running(ReplicaHandle),
    /// It ended while no agent watched; the exit as its supervisor recorded it.
    Exited(ReplicaExit),
    /// Its supervisor is gone without recording an exit (a reboot, or it was SIGKILLed).
    /// What is left of the process group was killed; the message says what is unknown.
    Lost(String),
    /// No `pid.json`: no supervisor ever recorded a start here (a replica started by an
    /// agent without supervisors, or a start that never completed).
    NoRecord,
}

/// Take over the replica in `spec.replica_dir` that an earlier agent started (see
/// [`Adoption`]). `spec` gives the deadline, grace period and log limits of the in-agent
/// supervision (its entrypoint and environment are not used). Blocking reads of two small
/// files; a process group left without its supervisor is killed (SIGTERM, SIGKILL after
/// `spec.grace`) before this returns.
pub async fn adopt_replica(spec: &ReplicaSpec) -> Adoption {
    let dir = &spec.replica_dir;
    let started = match record::read::<PidRecord>(&dir.join(PID_FILE)) {
        Ok(Some(started)) => started,
        Ok(None) => return Adoption::NoRecord,
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "unreadable pid.json");
            return Adoption::NoRecord;
        }
    };
    if process::process_running(started.supervisor_pid, started.supervisor_start_ticks) {
        let watched = Watched::Adopted {
            pid: started.supervisor_pid,
            start_ticks: started.supervisor_start_ticks,
        };
        let handle = supervise_replica(
            spec,
            &started,
            watched,
            spec.default_work_dir(),
            spec.log_files(),
        );
        return Adoption::Running(handle);
    }
    let exit = match record::read::<ExitRecord>(&dir.join(EXIT_FILE)) {
        Ok(exit) => exit,
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "unreadable exit.json");
            None
        }
    };
    match exit.as_ref().and_then(|e| e.status().map(|s| (e, s))) {
        Some((record, status)) => {
            // The supervisor may have died between its record and its cleanup.
            kill_stragglers(&started);
            Adoption::Exited(ReplicaExit {
                status,
                cause: ExitCause::Exited,
                killed: record.killed,
                finished_at: record.finished_at(),
            })
        }
        None => {
            let leader_running = process::process_running(started.pid, started.proc_start_ticks);
            let what = if leader_running {
                process::kill_group(started.pgid, spec.grace).await;
                "the process was still running unsupervised and its process group was killed"
            } else if kill_stragglers(&started) {
                "the process had exited unseen and the rest of its process group was killed"
            } else {
                "the process has exited unseen"
            };
            Adoption::Lost(format!(
                "its supervisor (pid {}) ended without recording the exit of process {}: {what}; \
                 the outcome of the run is unknown",
                started.supervisor_pid, started.pid
            ))
        }
    }
}

/// SIGKILL what is left of the group of a main process that is gone; returns whether
/// anything was left. Without its leader, the group can only still exist with the
/// replica's stragglers in it (a process group id is not reused while any member lives).
pub(super) fn kill_stragglers(started: &PidRecord) -> bool {
    let leader_pid_taken = process::proc_stat(started.pid).is_some();
    if leader_pid_taken || !process::group_exists(started.pgid) {
        return false;
    }
    kill(started.pgid);
    true
}

/// The handle of a replica whose supervisor is `watched`, with its in-agent supervision
/// running.
pub(super) fn supervise_replica(
    spec: &ReplicaSpec,
    started: &PidRecord,
    watched: Watched,
    work_dir: PathBuf,
    logs: LogFiles,
) -> ReplicaHandle {
    let (terminate_tx, terminate_rx) = watch::channel(None);
    let (exit_tx, exit_rx) = watch::channel(None);
    let log_path = logs.path().to_path_buf();
    let supervisor = tokio::spawn(supervise(Supervised {
        watched,
        pgid: started.pgid,
        exit_path: spec.replica_dir.join(EXIT_FILE),
        deadline: spec.deadline,
        deadline_grace: spec.grace,
        terminate: terminate_rx,
        exit: exit_tx,
        logs,
    }));
    ReplicaHandle {
        pid: started.pid,
        pgid: started.pgid,
        start_ticks: started.proc_start_ticks,
        supervisor_pid: started.supervisor_pid,
        supervisor_start_ticks: started.supervisor_start_ticks,
        started_at: started.started_at.into(),
        work_dir,
        log_path,
        terminate: terminate_tx,
        exit: exit_rx,
        supervisor: Some(supervisor),
    }
}
