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
//!
//! Files: `setup` (directories, program, artifacts before a start), `spawn` (start, adopt,
//! the handle), `supervision` (the exit, deadline and grace, log rotation), beside the
//! runtimes (`contract`, `docker`), the supervisor's records (`record`), logs, and the
//! isolation parts (`sandbox`, `cgroup`, `uids`).

mod artifact;
pub mod cgroup;
mod contract;
pub mod docker;
pub mod logs;
pub mod process;
pub mod record;
pub mod sandbox;
mod setup;
mod spawn;
mod supervision;
pub mod uids;

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
pub(crate) use setup::resolve_program;
pub use spawn::{Adoption, ReplicaHandle, adopt_replica, spawn_replica};

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
