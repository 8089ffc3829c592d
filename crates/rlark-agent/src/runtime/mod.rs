//! The `raw` runtime: one replica of a Task as a process group on this host.
//!
//! [`spawn_replica`] prepares the replica's directory (`work/`, `logs/`), fetches its
//! artifact, resolves the entrypoint (no shell), and starts the process as the leader of
//! its own process group, with stdout and stderr appended to `logs/current.log`
//! (size-capped rotation, see [`logs`]). A supervisor task then owns the child:
//!
//! - it records the exit once, so [`ReplicaHandle::wait`] returns it however late it is
//!   called (and on every later call);
//! - when the main process exits on its own, whatever is left of its group is killed
//!   (SIGKILL): a replica is its whole process tree, as a container is;
//! - [`ReplicaHandle::terminate`] sends SIGTERM to the group, waits up to the grace period
//!   for every member to exit, then sends SIGKILL to the group;
//! - [`ReplicaSpec::deadline`] (`activeDeadlineSeconds`) takes the same path and the exit
//!   says [`ExitCause::DeadlineExceeded`];
//! - `current.log` is rotated about every second when over its cap.
//!
//! Dropping a [`ReplicaHandle`] (or [`ReplicaHandle::detach`]) stops supervising and
//! leaves the process running: the agent does this when it exits without stopping tasks.

mod artifact;
pub mod logs;
pub mod process;

use std::ffi::OsString;
use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use artifact::HTTP_UNSUPPORTED;
pub use logs::{LOG_FILE, LogFiles, LogLimits};

/// Grace period between SIGTERM and SIGKILL when the Task does not set
/// `terminationGracePeriodSeconds`.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);
/// How often the supervisor checks the log size.
const ROTATE_EVERY: Duration = Duration::from_secs(1);

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
    /// `raw.artifact` URL (only `file://` is fetched, see [`HTTP_UNSUPPORTED`]).
    pub artifact: Option<String>,
    /// `raw.artifactSha256`.
    pub artifact_sha256: Option<String>,
    /// When the replica must be killed (`activeDeadlineSeconds` after its first start).
    pub deadline: Option<Instant>,
    /// SIGTERM → SIGKILL grace period of a deadline kill.
    pub grace: Duration,
    /// Log size cap.
    pub log_limits: LogLimits,
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
            deadline: None,
            grace: DEFAULT_GRACE,
            log_limits: LogLimits::default(),
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
}

impl RuntimeError {
    /// The `Pod.status.reason` of a replica that failed this way.
    pub fn reason(&self) -> &'static str {
        match self {
            RuntimeError::ArtifactChecksumMismatch { .. } => REASON_ARTIFACT_CHECKSUM,
            RuntimeError::Artifact { .. } => REASON_ARTIFACT_ERROR,
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
    /// Unknown: the supervisor ended without seeing the exit (it cannot normally happen).
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

    fn from_std(status: std::process::ExitStatus) -> Self {
        match (status.code(), status.signal()) {
            (Some(code), _) => ExitStatus::Code(code),
            (None, Some(signal)) => ExitStatus::Signal(signal),
            (None, None) => ExitStatus::Unknown,
        }
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
    start_ticks: Option<u64>,
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
        i32::try_from(self.pid).unwrap_or(i32::MAX)
    }

    /// Its start time in clock ticks after boot (`/proc/<pid>/stat`), when readable.
    pub fn start_ticks(&self) -> Option<u64> {
        self.start_ticks
    }

    /// When it was started.
    pub fn started_at(&self) -> SystemTime {
        self.started_at
    }

    /// The working directory it runs in.
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
            // The supervisor ended without recording an exit (a panic): say so.
            Err(_) => None,
        };
        seen.or_else(|| self.try_exit())
            .unwrap_or_else(unknown_exit)
    }

    /// Stop the replica: SIGTERM to its process group, SIGKILL to the group after `grace`
    /// if anything of it is left, and wait for the exit. Returns at once (the recorded
    /// exit) when it has ended already; a deadline kill in progress is waited for.
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
    /// exit report). The same happens on drop.
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

    let mut command = tokio::process::Command::new(&prepared.program);
    command
        .arg0(&spec.entrypoint[0])
        .args(&spec.entrypoint[1..])
        .current_dir(&prepared.work_dir)
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::from(prepared.stdout))
        .stderr(Stdio::from(prepared.stderr))
        .process_group(0)
        .kill_on_drop(false);
    let child = command.spawn().map_err(|source| RuntimeError::Spawn {
        program: prepared.program.display().to_string(),
        source,
    })?;
    let started_at = SystemTime::now();
    let Some(pid) = child.id() else {
        // Only when it was reaped already, which cannot happen before a wait.
        return Err(RuntimeError::Internal(
            "the started process has no pid".to_string(),
        ));
    };
    let start_ticks = process::proc_stat(pid).map(|s| s.start_ticks);
    let (terminate_tx, terminate_rx) = watch::channel(None);
    let (exit_tx, exit_rx) = watch::channel(None);
    let supervisor = tokio::spawn(supervise(Supervised {
        child,
        pgid: i32::try_from(pid).unwrap_or(i32::MAX),
        deadline: spec.deadline,
        deadline_grace: spec.grace,
        terminate: terminate_rx,
        exit: exit_tx,
        logs: prepared.logs.clone(),
    }));
    Ok(ReplicaHandle {
        pid,
        start_ticks,
        started_at,
        work_dir: prepared.work_dir,
        log_path: prepared.logs.path().to_path_buf(),
        terminate: terminate_tx,
        exit: exit_rx,
        supervisor: Some(supervisor),
    })
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
    let work_dir = match &spec.working_dir {
        Some(dir) => {
            let dir = default_work.join(dir);
            check_dir(&dir)?;
            dir
        }
        None => default_work,
    };
    if let Some(url) = &spec.artifact {
        artifact::fetch(url, spec.artifact_sha256.as_deref(), &work_dir)?;
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
fn resolve_program(
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

/// What the supervisor task owns.
struct Supervised {
    child: tokio::process::Child,
    pgid: i32,
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
    let mut terminate_open = true;
    let mut rotate = tokio::time::interval(ROTATE_EVERY);
    rotate.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let status = loop {
        let kill_at = stopping.map(|(_, at)| at);
        tokio::select! {
            status = s.child.wait() => break status,
            _ = sleep_until_opt(s.deadline), if stopping.is_none() => {
                term(s.pgid);
                stopping = Some((ExitCause::DeadlineExceeded, Instant::now() + s.deadline_grace));
            }
            changed = s.terminate.changed(), if stopping.is_none() && terminate_open => {
                match changed {
                    Ok(()) => {
                        if let Some(grace) = *s.terminate.borrow_and_update() {
                            term(s.pgid);
                            stopping = Some((ExitCause::Terminated, Instant::now() + grace));
                        }
                    }
                    Err(_) => terminate_open = false,
                }
            }
            _ = sleep_until_opt(kill_at), if !killed => {
                kill(s.pgid);
                killed = true;
            }
            _ = rotate.tick() => rotate_logs(&s.logs).await,
        }
    };
    let cause = match stopping {
        None => {
            // The main process ended on its own: the rest of its tree goes with it.
            kill(s.pgid);
            ExitCause::Exited
        }
        Some((cause, kill_at)) => {
            // Give the rest of the group what is left of the grace period.
            if !killed {
                let left = kill_at.saturating_duration_since(Instant::now());
                if !process::wait_group_gone(s.pgid, left).await {
                    kill(s.pgid);
                    killed = true;
                }
            }
            cause
        }
    };
    let status = match status {
        Ok(status) => ExitStatus::from_std(status),
        Err(error) => {
            tracing::warn!(pgid = s.pgid, %error, "wait for replica process");
            ExitStatus::Unknown
        }
    };
    rotate_logs(&s.logs).await;
    s.exit.send_replace(Some(ReplicaExit {
        status,
        cause,
        killed,
        finished_at: SystemTime::now(),
    }));
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn term(pgid: i32) {
    if let Err(error) = process::signal_group(pgid, Signal::SIGTERM) {
        tracing::warn!(pgid, %error, "SIGTERM replica process group");
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

    fn sh(script: &str, dir: &Path) -> ReplicaSpec {
        ReplicaSpec::new(
            vec!["sh".into(), "-c".into(), script.into()],
            dir.join("replica"),
        )
    }

    #[tokio::test]
    async fn exit_is_recorded_even_when_nobody_waits_yet() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut spec = sh("echo out; echo err >&2; exit 3", dir.path());
        spec.env.push(("X".into(), "1".into()));
        let mut handle = spawn_replica(spec).await.expect("spawn");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let exit = handle.wait().await;
        assert_eq!(exit.status, ExitStatus::Code(3));
        assert_eq!(exit.cause, ExitCause::Exited);
        assert_eq!(handle.wait().await, exit, "the same exit on every call");
        assert_eq!(handle.terminate(Duration::ZERO).await, exit);
        let log = std::fs::read_to_string(handle.log_path()).expect("log");
        assert!(log.contains("out") && log.contains("err"), "{log}");
        assert!(handle.work_dir().ends_with("replica/work"));
    }

    #[tokio::test]
    async fn terminate_kills_the_group_after_the_grace_period() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = sh("trap '' TERM; sleep 30 & sleep 30", dir.path());
        let mut handle = spawn_replica(spec).await.expect("spawn");
        let pgid = handle.pgid();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(process::group_exists(pgid));
        let exit = handle.terminate(Duration::from_millis(300)).await;
        assert_eq!(exit.cause, ExitCause::Terminated);
        assert!(exit.killed, "TERM is ignored, so KILL was needed");
        assert_eq!(exit.status, ExitStatus::Signal(9));
        assert!(process::wait_group_gone(pgid, Duration::from_secs(5)).await);
    }

    #[tokio::test]
    async fn a_deadline_kills_the_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut spec = sh("sleep 30", dir.path());
        spec.deadline = Some(Instant::now() + Duration::from_millis(200));
        spec.grace = Duration::from_secs(5);
        let mut handle = spawn_replica(spec).await.expect("spawn");
        let exit = handle.wait().await;
        assert_eq!(exit.cause, ExitCause::DeadlineExceeded);
        assert!(!exit.killed, "sleep dies of SIGTERM");
        assert_eq!(exit.status.code(), Some(143));
    }

    #[tokio::test]
    async fn start_errors_name_what_is_wrong() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = ReplicaSpec::new(vec!["/nonexistent/bin".into()], dir.path().join("r"));
        let err = spawn_replica(spec).await.expect_err("missing binary");
        assert!(err.to_string().contains("/nonexistent/bin"), "{err}");
        assert_eq!(err.reason(), REASON_START_ERROR);

        let spec = ReplicaSpec::new(vec!["no-such-program-xyz".into()], dir.path().join("r"));
        let err = spawn_replica(spec).await.expect_err("not in PATH");
        assert!(err.to_string().contains("no-such-program-xyz"), "{err}");

        let mut spec = sh("true", dir.path());
        spec.working_dir = Some("/nonexistent/dir".into());
        let err = spawn_replica(spec).await.expect_err("missing working dir");
        assert!(err.to_string().contains("/nonexistent/dir"), "{err}");

        let spec = ReplicaSpec::new(Vec::new(), dir.path().join("r"));
        assert!(matches!(
            spawn_replica(spec).await,
            Err(RuntimeError::EmptyEntrypoint)
        ));
    }

    #[tokio::test]
    async fn relative_programs_and_the_working_dir_are_honoured() {
        let dir = tempfile::tempdir().expect("tempdir");
        let work = dir.path().join("elsewhere");
        std::fs::create_dir_all(&work).expect("mkdir");
        let script = work.join("run.sh");
        std::fs::write(&script, "#!/bin/sh\npwd\necho \"$GREETING\"\n").expect("write");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut spec = ReplicaSpec::new(vec!["./run.sh".into()], dir.path().join("r"));
        spec.working_dir = Some(work.clone());
        spec.env.push(("GREETING".into(), "hi".into()));
        let mut handle = spawn_replica(spec).await.expect("spawn");
        assert!(handle.wait().await.status.success());
        let log = std::fs::read_to_string(handle.log_path()).expect("log");
        assert!(
            log.contains(&work.display().to_string()) && log.contains("hi"),
            "{log}"
        );
    }

    #[tokio::test]
    async fn the_rest_of_the_group_dies_with_the_main_process() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = sh("sleep 30 & echo $! > child.pid; exit 0", dir.path());
        let mut handle = spawn_replica(spec).await.expect("spawn");
        assert!(handle.wait().await.status.success());
        let pid: u32 = std::fs::read_to_string(handle.work_dir().join("child.pid"))
            .expect("pid file")
            .trim()
            .parse()
            .expect("pid");
        let deadline = Instant::now() + Duration::from_secs(5);
        while process::process_running(pid, None) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            !process::process_running(pid, None),
            "straggler {pid} survived"
        );
    }
}
