//! The `raw` runtime: one replica of a Task as a process group on this host, run under a
//! small supervisor process so that its exit is never missed.
//!
//! [`spawn_replica`] prepares the replica's directory (`work/`, `logs/`), fetches its
//! artifact, resolves the entrypoint (no shell; these checks happen here, so start errors
//! name the problem precisely), and starts the supervisor (`supervisor.rs`, the
//! program in [`ReplicaSpec::supervisor`]) in the working directory, with the environment
//! and with stdout and stderr appended to `logs/current.log` (size-capped rotation, see
//! [`logs`]). The supervisor leaves the agent's session, starts the program as the leader
//! of its own process group with all of that, and records it in `pid.json` and its end in
//! `exit.json` ([`record`]); `spawn_replica` returns once `pid.json` exists.
//!
//! A task in the agent (the in-agent supervision) then owns the replica:
//!
//! - it waits for the supervisor process to end (`waitpid` on its own child; a replica
//!   adopted by [`adopt_replica`] is not its child, so its supervisor's pid and start time
//!   are polled in `/proc`), then reads `exit.json`: so [`ReplicaHandle::wait`] returns the
//!   exit however late it is called (and on every later call). A supervisor that ended
//!   without `exit.json` (someone SIGKILLed it) gives [`ExitStatus::Unknown`], and what is
//!   left of the group is killed;
//! - when the main process exits on its own, the supervisor kills whatever is left of its
//!   group (SIGKILL): a replica is its whole process tree, as a container is;
//! - [`ReplicaHandle::terminate`] sends SIGTERM to the supervisor, which forwards it to the
//!   group; after the grace period the agent sends SIGKILL to the group (the supervisor
//!   does the same after its own `--grace-ms`, [`ReplicaSpec::grace`], when the agent is
//!   gone meanwhile); the rest of the group gets what is left of the grace period after
//!   the main process exits;
//! - [`ReplicaSpec::deadline`] (`activeDeadlineSeconds`) takes the same path and the exit
//!   says [`ExitCause::DeadlineExceeded`];
//! - `current.log` is rotated about every second when over its cap.
//!
//! Dropping a [`ReplicaHandle`] (or [`ReplicaHandle::detach`]) stops supervising in the
//! agent and leaves the process (and its supervisor) running: the agent does this when it
//! exits without stopping tasks, and the next agent [`adopt_replica`]s it.

mod artifact;
pub mod cgroup;
mod contract;
pub mod docker;
pub mod logs;
pub mod process;
pub mod record;
pub mod sandbox;
pub mod uids;

use rlark_process::CleanSignals as _;
use std::ffi::OsString;
use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use artifact::CACHE_DIGEST_DIR;
pub use contract::{
    Adopted, ContainerRecord, ProcessRecord, RawRuntime, RecordedReplica, ReplicaRecord,
    RunningReplica, Runtime, exit_report, timestamp,
};
pub use logs::{LOG_FILE, LogFiles, LogLimits};
pub use record::{EXIT_FILE, PID_FILE};

use record::{ExitRecord, PidRecord};

/// The grace period of a Task that does not set `terminationGracePeriodSeconds`, and the
/// longest one (one day, what admission allows): longer ones given to
/// [`ReplicaSpec::grace`] or [`ReplicaHandle::terminate`] are cut to it, so a kill time is
/// always a clock reading.
pub use rlark_api::agent::{DEFAULT_GRACE, MAX_GRACE};
/// How often the in-agent supervision checks the log size.
const ROTATE_EVERY: Duration = Duration::from_secs(1);
/// How often an adopted replica's supervisor process is checked.
pub const ADOPTED_POLL: Duration = Duration::from_millis(100);
/// How long [`spawn_replica`] waits for the supervisor's `pid.json`.
const START_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between checks for `pid.json`.
const START_POLL: Duration = Duration::from_millis(5);
/// The supervisor subcommand of the `rlark` binary.
pub const SUPERVISE_SUBCOMMAND: &str = "supervise";

/// `Pod.status.reason` of a replica that could not be started.
pub const REASON_START_ERROR: &str = "StartError";
/// `Pod.status.reason` of a replica whose artifact did not match its checksum.
pub const REASON_ARTIFACT_CHECKSUM: &str = "ArtifactChecksumMismatch";
/// `Pod.status.reason` of a replica whose artifact could not be fetched.
pub const REASON_ARTIFACT_ERROR: &str = "ArtifactError";

/// Everything needed to start one replica.
#[derive(Clone, Debug)]
pub struct ReplicaSpec {
    /// Program and arguments (no shell). The program is looked up in `PATH` (the one in
    /// `env` when set there, else the agent's) unless it contains a `/`; a relative path
    /// is relative to the working directory.
    pub entrypoint: Vec<String>,
    /// Environment, in order (a later entry wins), on top of the agent's own environment.
    pub env: Vec<(String, String)>,
    /// The replica's own directory: `work/` (the default working directory) and `logs/`
    /// are created under it.
    pub replica_dir: PathBuf,
    /// `raw.workingDir`: must exist and be a readable directory; relative to `work/`.
    pub working_dir: Option<PathBuf>,
    /// `raw.artifact` URL: `http://`, `https://` or `file://` (fetched, checked, cached and
    /// unpacked as docs/tasks.md, "Artifacts", says).
    pub artifact: Option<String>,
    /// `raw.artifactSha256`.
    pub artifact_sha256: Option<String>,
    /// Root of the artifact cache (`DATA_DIR/artifacts`); `None`: downloads are not cached.
    pub artifact_cache: Option<PathBuf>,
    /// When the replica must be killed (`activeDeadlineSeconds` after its first start).
    pub deadline: Option<Instant>,
    /// SIGTERM → SIGKILL grace period of a deadline kill; also the supervisor's own
    /// (`--grace-ms`), used when it is stopped while no agent watches.
    pub grace: Duration,
    /// Log size cap.
    pub log_limits: LogLimits,
    /// The supervisor command (program and leading arguments), e.g. `[rlark, supervise]`;
    /// its flags and the task's program follow. Default: [`default_supervisor`].
    pub supervisor: Vec<OsString>,
    /// The pod network of a replica of a domain task: the process starts inside this
    /// network namespace with its own `/etc/hosts`. `None`: the host's network.
    pub network: Option<ReplicaNetwork>,
    /// The containers of a replica of a `docker` task (the docker runtime runs them; the
    /// raw runtime's fields above are then unused but for `replica_dir`, `env`, `deadline`,
    /// `grace` and `log_limits`). `None`: a process replica.
    pub containers: Option<docker::ContainerSet>,
    /// The isolation of a process replica ([`sandbox`]): written to
    /// `REPLICA_DIR/sandbox.json` and applied by the supervisor. `None`: the replica runs
    /// as the agent's user in the host's namespaces.
    pub sandbox: Option<sandbox::Sandbox>,
}

/// Where a replica of a domain task runs, network-wise (the supervisor's `--netns` and
/// `--hosts`, see [`crate::supervisor`]): a pod-network type, defined in rlark-net.
pub use rlark_net::replica::ReplicaNetwork;

/// The supervisor as a binary of its own, looked for beside the agent's executable.
pub const SUPERVISE_BINARY: &str = "rlark-supervise";

/// The supervisor command of an agent run by the `rlark` binary (`rlark agent`, `rlark
/// up`): `rlark-supervise` beside this executable when it is there and is of this build
/// ([`record::version_line`]), else `[<this executable>, supervise]`. Both run
/// the same code; the small binary starts in a third of the time (0.6 vs 1.8 ms of CPU
/// here: `rlark` is 70 MB with ~68,000 relocations and ~550 page faults per exec), which
/// is most of a start's cost in a burst (`rlark bench agent`). Chosen once per process.
/// Empty when the executable's path cannot be read (a replica then fails to start with a
/// message saying so).
pub fn default_supervisor() -> Vec<OsString> {
    static CHOSEN: std::sync::OnceLock<Vec<OsString>> = std::sync::OnceLock::new();
    CHOSEN
        .get_or_init(|| match std::env::current_exe() {
            Ok(exe) => choose_supervisor(&exe, probe_version),
            Err(error) => {
                tracing::warn!(%error, "cannot find the agent's own executable for the supervisor");
                Vec::new()
            }
        })
        .clone()
}

/// [`default_supervisor`] for the executable `exe`, with `version` asking a candidate
/// binary for its `--version` line (None: it did not answer).
fn choose_supervisor(exe: &Path, version: impl Fn(&Path) -> Option<String>) -> Vec<OsString> {
    let small = exe.with_file_name(SUPERVISE_BINARY);
    if small.is_file() {
        let expected = record::version_line();
        match version(&small) {
            Some(line) if line == expected => {
                tracing::debug!(supervisor = %small.display(), "replica supervisor");
                return vec![small.into_os_string()];
            }
            found => tracing::warn!(
                supervisor = %small.display(),
                found = found.as_deref().unwrap_or("no answer"),
                %expected,
                "not using a supervisor binary of another version; using `rlark supervise`"
            ),
        }
    }
    vec![
        exe.as_os_str().to_os_string(),
        OsString::from(SUPERVISE_SUBCOMMAND),
    ]
}

/// `BINARY --version`'s first line, if it answers within 2 s with exit status 0.
fn probe_version(binary: &Path) -> Option<String> {
    let mut child = std::process::Command::new(binary)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(_)) | Err(_) => return None,
            Ok(None) if std::time::Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take()?, &mut out).ok()?;
    out.lines().next().map(str::to_string)
}

impl ReplicaSpec {
    /// A spec for `entrypoint` in `replica_dir`; everything else default.
    pub fn new(entrypoint: Vec<String>, replica_dir: impl Into<PathBuf>) -> Self {
        Self {
            entrypoint,
            env: Vec::new(),
            replica_dir: replica_dir.into(),
            working_dir: None,
            artifact: None,
            artifact_sha256: None,
            artifact_cache: None,
            deadline: None,
            grace: DEFAULT_GRACE,
            log_limits: LogLimits::default(),
            supervisor: default_supervisor(),
            network: None,
            containers: None,
            sandbox: None,
        }
    }

    /// The default working directory, `<replica_dir>/work`.
    pub fn default_work_dir(&self) -> PathBuf {
        self.replica_dir.join("work")
    }

    /// The log files, `<replica_dir>/logs/current.log` and its rotated copies.
    pub fn log_files(&self) -> LogFiles {
        LogFiles::new(&self.replica_dir.join("logs"), self.log_limits)
    }
}

/// Why a replica could not be started. [`RuntimeError::reason`] is the Pod reason.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("the entrypoint is empty")]
    EmptyEntrypoint,
    #[error("entrypoint {program:?} not found: {detail}")]
    EntrypointNotFound { program: String, detail: String },
    #[error("working directory {}: {reason}", path.display())]
    WorkingDir { path: PathBuf, reason: String },
    #[error("start {program:?}: {source}")]
    Spawn { program: String, source: io::Error },
    #[error("start the replica supervisor {program:?}: {detail}")]
    Supervisor { program: String, detail: String },
    #[error("prepare {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("artifact {url}: checksum mismatch: expected sha256 {expected}, got sha256 {actual}")]
    ArtifactChecksumMismatch {
        url: String,
        expected: String,
        actual: String,
    },
    #[error("artifact {url}: {message}")]
    Artifact { url: String, message: String },
    #[error("replica preparation failed: {0}")]
    Internal(String),
    /// The agent's isolation policy refused what the Task asks, or the host could not
    /// isolate the replica.
    #[error("isolation: {0}")]
    Isolation(String),
    /// A container replica could not be started; `reason` is the Pod reason.
    #[error("{message}")]
    Container {
        reason: &'static str,
        message: String,
    },
}

impl RuntimeError {
    /// The `Pod.status.reason` of a replica that failed this way.
    pub fn reason(&self) -> &'static str {
        match self {
            RuntimeError::ArtifactChecksumMismatch { .. } => REASON_ARTIFACT_CHECKSUM,
            RuntimeError::Artifact { .. } => REASON_ARTIFACT_ERROR,
            RuntimeError::Container { reason, .. } => reason,
            _ => REASON_START_ERROR,
        }
    }
}

/// How the main process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// It exited with this code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
    /// Unknown: the supervisor process ended without recording the exit (it was
    /// SIGKILLed), or the in-agent supervision failed.
    Unknown,
}

impl ExitStatus {
    /// The shell's exit code: the code, or 128 + the signal; `None` when unknown.
    pub fn code(&self) -> Option<i32> {
        match self {
            ExitStatus::Code(c) => Some(*c),
            ExitStatus::Signal(s) => Some(128 + s),
            ExitStatus::Unknown => None,
        }
    }

    /// Exited with code 0.
    pub fn success(&self) -> bool {
        *self == ExitStatus::Code(0)
    }
}

impl std::fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExitStatus::Code(c) => write!(f, "exited with code {c}"),
            ExitStatus::Signal(s) => write!(f, "was killed by {}", process::signal_name(*s)),
            ExitStatus::Unknown => write!(f, "ended with an unknown status"),
        }
    }
}

/// Why the replica ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitCause {
    /// The main process exited on its own.
    Exited,
    /// [`ReplicaHandle::terminate`] ended it.
    Terminated,
    /// Its deadline passed and it was killed.
    DeadlineExceeded,
}

/// The end of a replica, as [`ReplicaHandle::wait`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaExit {
    /// How the main process ended.
    pub status: ExitStatus,
    /// Why.
    pub cause: ExitCause,
    /// The group had to be sent SIGKILL after the grace period.
    pub killed: bool,
    /// When the exit was seen.
    pub finished_at: SystemTime,
}

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

fn unknown_exit() -> ReplicaExit {
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
        .kill_on_drop(false)
        // Whatever signals the agent inherited ignored or blocked, the replica starts
        // clean (the supervisor does the same for the task).
        .clean_signals();
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
async fn wait_started(
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
fn kill_stragglers(started: &PidRecord) -> bool {
    let leader_pid_taken = process::proc_stat(started.pid).is_some();
    if leader_pid_taken || !process::group_exists(started.pgid) {
        return false;
    }
    kill(started.pgid);
    true
}

/// The handle of a replica whose supervisor is `watched`, with its in-agent supervision
/// running.
fn supervise_replica(
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

/// What [`prepare`] made ready.
struct Prepared {
    program: PathBuf,
    work_dir: PathBuf,
    logs: LogFiles,
    stdout: std::fs::File,
    stderr: std::fs::File,
}

/// Directories, artifact, program lookup, log file. Blocking.
fn prepare(spec: &ReplicaSpec) -> Result<Prepared, RuntimeError> {
    let Some(program) = spec.entrypoint.first().filter(|p| !p.is_empty()) else {
        return Err(RuntimeError::EmptyEntrypoint);
    };
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| RuntimeError::Io { path, source }
    };
    let default_work = spec.default_work_dir();
    std::fs::create_dir_all(&default_work).map_err(io_err(&default_work))?;
    let logs = spec.log_files();
    if let Some(dir) = logs.path().parent() {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    }
    // The records of an earlier start of this replica (a restart) must not be mistaken
    // for this one's.
    for name in [PID_FILE, EXIT_FILE] {
        let path = spec.replica_dir.join(name);
        record::remove(&path).map_err(io_err(&path))?;
    }
    let work_dir = match &spec.working_dir {
        Some(dir) => {
            let dir = default_work.join(dir);
            check_dir(&dir)?;
            dir
        }
        None => default_work,
    };
    if let Some(url) = &spec.artifact {
        let cache = spec.artifact_cache.as_deref();
        artifact::fetch(url, spec.artifact_sha256.as_deref(), cache, &work_dir)?;
    }
    if let Some(sandbox) = &spec.sandbox {
        give_work_dir(
            &spec.default_work_dir(),
            sandbox.uid,
            sandbox.gid,
            spec.artifact.is_some(),
        )?;
    }
    let path_var = spec
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| OsString::from(v))
        .or_else(|| std::env::var_os("PATH"));
    let program = resolve_program(program, &work_dir, path_var.as_deref())?;
    if let Err(error) = logs.rotate_if_needed() {
        tracing::warn!(log = %logs.path().display(), %error, "rotate replica log");
    }
    let stdout = logs.open_append().map_err(io_err(logs.path()))?;
    let stderr = stdout.try_clone().map_err(io_err(logs.path()))?;
    Ok(Prepared {
        program,
        work_dir,
        logs,
        stdout,
        stderr,
    })
}

/// Make `work` (and, after an artifact was unpacked into it, everything in it that root
/// owns) the replica user's. Symbolic links are changed themselves, never followed, and
/// directories reached through them are not entered.
fn give_work_dir(work: &Path, uid: u32, gid: u32, recursive: bool) -> Result<(), RuntimeError> {
    use nix::fcntl::AtFlags;
    use nix::unistd::{Gid, Uid, fchownat};
    use std::os::unix::fs::MetadataExt as _;
    let chown = |path: &Path| {
        fchownat(
            nix::fcntl::AT_FDCWD,
            path,
            Some(Uid::from_raw(uid)),
            Some(Gid::from_raw(gid)),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|e| RuntimeError::Io {
            path: path.to_path_buf(),
            source: io::Error::from(e),
        })
    };
    chown(work)?;
    if !recursive {
        return Ok(());
    }
    let mut pending = vec![work.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|source| RuntimeError::Io {
            path: dir.clone(),
            source,
        })?;
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.uid() == 0 {
                chown(&path)?;
            }
            if meta.is_dir() {
                pending.push(path);
            }
        }
    }
    Ok(())
}

/// `raw.workingDir` must be an existing, readable directory.
fn check_dir(dir: &Path) -> Result<(), RuntimeError> {
    let failed = |reason: String| RuntimeError::WorkingDir {
        path: dir.to_path_buf(),
        reason,
    };
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(failed("does not exist".into())),
        Err(e) => Err(failed(format!("cannot be read: {e}"))),
        Ok(meta) if !meta.is_dir() => Err(failed("is not a directory".into())),
        Ok(_) => std::fs::read_dir(dir)
            .map(drop)
            .map_err(|e| failed(format!("cannot be read: {e}"))),
    }
}

/// The file to execute for `program`: a path (relative to `work_dir`) when it contains a
/// `/`, else the first executable file of that name in `path_var`.
pub(crate) fn resolve_program(
    program: &str,
    work_dir: &Path,
    path_var: Option<&std::ffi::OsStr>,
) -> Result<PathBuf, RuntimeError> {
    let not_found = |detail: String| RuntimeError::EntrypointNotFound {
        program: program.to_string(),
        detail,
    };
    if program.contains('/') {
        let path = work_dir.join(program);
        return match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() && is_executable(&meta) => Ok(path),
            Ok(meta) if meta.is_file() => {
                Err(not_found(format!("{} is not executable", path.display())))
            }
            Ok(_) => Err(not_found(format!("{} is not a file", path.display()))),
            Err(e) => Err(not_found(format!("{}: {e}", path.display()))),
        };
    }
    let Some(path_var) = path_var.filter(|p| !p.is_empty()) else {
        return Err(not_found("PATH is empty".to_string()));
    };
    for dir in std::env::split_paths(path_var) {
        let candidate = work_dir.join(dir).join(program);
        if let Ok(meta) = std::fs::metadata(&candidate)
            && meta.is_file()
            && is_executable(&meta)
        {
            return Ok(candidate);
        }
    }
    Err(not_found(format!(
        "no executable {program:?} in PATH ({})",
        path_var.to_string_lossy()
    )))
}

fn is_executable(meta: &std::fs::Metadata) -> bool {
    meta.permissions().mode() & 0o111 != 0
}

/// The supervisor process a replica's in-agent supervision watches.
#[derive(Debug)]
enum Watched {
    /// Started by this agent: its child, waited for.
    Child {
        child: tokio::process::Child,
        pid: u32,
    },
    /// Adopted: started by an earlier agent; polled in `/proc`.
    Adopted { pid: u32, start_ticks: Option<u64> },
}

impl Watched {
    /// Wait until the supervisor process has ended.
    async fn ended(&mut self) {
        match self {
            Watched::Child { child, pid } => {
                if let Err(error) = child.wait().await {
                    tracing::warn!(pid = *pid, %error, "wait for the replica supervisor");
                    // Not our child after all: watch it like an adopted one.
                    while process::process_running(*pid, None) {
                        tokio::time::sleep(ADOPTED_POLL).await;
                    }
                }
            }
            Watched::Adopted { pid, start_ticks } => {
                while process::process_running(*pid, *start_ticks) {
                    tokio::time::sleep(ADOPTED_POLL).await;
                }
            }
        }
    }

    /// Send `signal` to the supervisor process (it forwards SIGTERM to the task's group).
    fn signal(&self, signal: Signal) {
        let pid = match self {
            // Unreaped, so its pid cannot have been reused.
            Watched::Child { pid, .. } => *pid,
            Watched::Adopted { pid, start_ticks } => {
                if !process::process_running(*pid, *start_ticks) {
                    return;
                }
                *pid
            }
        };
        let Ok(raw) = i32::try_from(pid) else {
            return;
        };
        match nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), signal) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(error) => tracing::warn!(pid, %error, %signal, "signal the replica supervisor"),
        }
    }
}

/// What the in-agent supervision task owns.
struct Supervised {
    watched: Watched,
    pgid: i32,
    exit_path: PathBuf,
    deadline: Option<Instant>,
    deadline_grace: Duration,
    terminate: watch::Receiver<Option<Duration>>,
    exit: watch::Sender<Option<ReplicaExit>>,
    logs: LogFiles,
}

async fn supervise(mut s: Supervised) {
    // Set once a stop (or the deadline) began: why, and when SIGKILL follows.
    let mut stopping: Option<(ExitCause, Instant)> = None;
    let mut killed = false;
    let mut kill_done = false;
    let mut terminate_open = true;
    let mut rotate = tokio::time::interval(ROTATE_EVERY);
    rotate.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let kill_at = stopping.map(|(_, at)| at);
        tokio::select! {
            () = s.watched.ended() => break,
            _ = sleep_until_opt(s.deadline), if stopping.is_none() => {
                s.watched.signal(Signal::SIGTERM);
                stopping = Some((ExitCause::DeadlineExceeded, Instant::now() + s.deadline_grace.min(MAX_GRACE)));
            }
            changed = s.terminate.changed(), if stopping.is_none() && terminate_open => {
                match changed {
                    Ok(()) => {
                        if let Some(grace) = *s.terminate.borrow_and_update() {
                            s.watched.signal(Signal::SIGTERM);
                            stopping = Some((ExitCause::Terminated, Instant::now() + grace.min(MAX_GRACE)));
                        }
                    }
                    Err(_) => terminate_open = false,
                }
            }
            _ = sleep_until_opt(kill_at), if !kill_done => {
                kill_done = true;
                if process::group_exists(s.pgid) {
                    kill(s.pgid);
                    killed = true;
                }
            }
            _ = rotate.tick() => rotate_logs(&s.logs).await,
        }
    }
    let recorded = match record::read::<ExitRecord>(&s.exit_path) {
        Ok(recorded) => recorded,
        Err(error) => {
            tracing::warn!(file = %s.exit_path.display(), %error, "read the replica's exit record");
            None
        }
    };
    let (status, finished_at) = match recorded.as_ref().and_then(|r| r.status().map(|st| (r, st))) {
        Some((record, status)) => {
            killed |= record.killed;
            (status, record.finished_at())
        }
        None => {
            // The supervisor died (SIGKILL) without recording the exit: nothing may be
            // left of a replica nobody supervises any more.
            tracing::warn!(
                pgid = s.pgid,
                "the replica supervisor ended without recording the exit; killing the group"
            );
            kill(s.pgid);
            (ExitStatus::Unknown, SystemTime::now())
        }
    };
    let cause = stopping.map_or(ExitCause::Exited, |(cause, _)| cause);
    rotate_logs(&s.logs).await;
    s.exit.send_replace(Some(ReplicaExit {
        status,
        cause,
        killed,
        finished_at,
    }));
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn kill(pgid: i32) {
    if let Err(error) = process::signal_group(pgid, Signal::SIGKILL) {
        tracing::warn!(pgid, %error, "SIGKILL replica process group");
    }
}

async fn rotate_logs(logs: &LogFiles) {
    let files = logs.clone();
    match tokio::task::spawn_blocking(move || files.rotate_if_needed()).await {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => {
            tracing::warn!(log = %logs.path().display(), %error, "rotate replica log");
        }
        Err(error) => tracing::warn!(%error, "rotate replica log"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_small_supervisor_binary_is_used_only_when_it_speaks_this_protocol() {
        let dir = tempfile::tempdir().expect("tempdir");
        let exe = dir.path().join("rlark");
        std::fs::write(&exe, b"").expect("exe");
        let fallback = vec![exe.clone().into_os_string(), OsString::from("supervise")];
        let asked = std::cell::Cell::new(0);
        let answer = |line: Option<String>| {
            let asked = &asked;
            move |_: &Path| {
                asked.set(asked.get() + 1);
                line.clone()
            }
        };
        // No rlark-supervise beside the executable: `rlark supervise`, nothing probed.
        assert_eq!(choose_supervisor(&exe, answer(None)), fallback);
        assert_eq!(asked.get(), 0);
        let small = dir.path().join(SUPERVISE_BINARY);
        std::fs::write(&small, b"").expect("small");
        // Present and of this build: used.
        assert_eq!(
            choose_supervisor(&exe, answer(Some(record::version_line()))),
            vec![small.clone().into_os_string()]
        );
        // Another version or protocol, or no answer: not used.
        let other = "rlark-supervise 0.0.1 protocol 1".to_string();
        assert_eq!(choose_supervisor(&exe, answer(Some(other))), fallback);
        assert_eq!(choose_supervisor(&exe, answer(None)), fallback);
        // Same version and protocol, other sources (a stale build): not used either.
        let stale = format!(
            "rlark-supervise {} protocol {} source 0000000000000000",
            env!("CARGO_PKG_VERSION"),
            record::PROTOCOL
        );
        assert_ne!(stale, record::version_line());
        assert_eq!(choose_supervisor(&exe, answer(Some(stale))), fallback);
        assert_eq!(asked.get(), 4);
    }

    #[test]
    fn probing_a_binary_reads_its_first_line_and_gives_up_on_failure() {
        // System binaries, not scripts written here: a script being written while another
        // test thread forks can fail to exec (ETXTBSY).
        // GNU echo answers `--version` with several lines ("echo (GNU coreutils) 9.1", ...);
        // another echo prints the argument.
        let line = probe_version(Path::new("/bin/echo")).expect("echo answers");
        assert!(
            line.starts_with("echo (") || line == "--version",
            "{line:?}"
        );
        assert_eq!(probe_version(Path::new("/bin/false")), None);
        assert_eq!(
            probe_version(Path::new("/nonexistent/rlark-supervise")),
            None
        );
    }
}
