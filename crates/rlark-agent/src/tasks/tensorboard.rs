//! TensorBoard beside a raw replica, for its Task's `tensorBoardDir` (docs/ssh.md, "The
//! task HTTP proxy").
//!
//! A Docker replica gets the same, on the host directory of the main container's bind mount
//! that holds `tensorBoardDir` ([`docker_log_dir`]; containers share the host's network).
//!
//! While a replica of a `Raw` Task that sets `tensorBoardDir` runs, the agent runs
//! `tensorboard --logdir DIR --host 127.0.0.1 --port PORT` beside it: `DIR` is
//! `tensorBoardDir` resolved against the replica's working directory, `PORT` a free port of
//! the node's loopback, the program the first executable `tensorboard` in the replica's
//! `PATH` (the Task's `PATH` when it sets one, else the agent's: the same lookup as the
//! entrypoint's). It runs as a child of the agent in its own process group, with the
//! replica's environment and its output appended to `<replica dir>/tensorboard.log`; it is
//! killed (its whole group) when the replica ends, is stopped or left to the next agent,
//! and when the agent exits (the next agent starts a new one for the replica it adopts,
//! and kills first the one an agent killed with SIGKILL left behind, named by
//! `tensorboard.pid` in the replica's directory).
//!
//! The Pod's `status.tensorBoard` says where it listens (`port`, `logDir`), which the task
//! proxy `/rlark/v1/namespaces/{ns}/tasks/{name}/proxy/{port}/` reaches, or why none
//! runs (`message`): no `tensorboard` installed, the replica in a Domain (whose ports the
//! proxy does not reach), or the start failed; that reason is also a Warning Event
//! (`TensorBoardNotStarted`) on the Task, once per replica worker.

use rlark_process::CleanSignals as _;
use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::sys::signal::Signal;
use rlark_api::types::PodTensorBoard;

/// Reason of the Warning Event on the Task when a replica's TensorBoard was not started.
pub(super) const REASON_NOT_STARTED: &str = "TensorBoardNotStarted";
/// The program looked for in `PATH`.
pub(super) const PROGRAM: &str = "tensorboard";
/// The file its output is appended to, in the replica's directory.
pub(super) const LOG_FILE: &str = "tensorboard.log";
/// The file naming the running one (`PID START_TICKS`), in the replica's directory: a
/// TensorBoard an agent killed with SIGKILL left behind is killed by the next start there.
pub(crate) const PID_FILE: &str = "tensorboard.pid";

/// A running TensorBoard; killed (its process group) on [`TensorBoard::stop`] or drop.
#[derive(Debug)]
pub(super) struct TensorBoard {
    child: Option<tokio::process::Child>,
    pgid: i32,
    /// Its [`PID_FILE`].
    pid_file: PathBuf,
}

impl TensorBoard {
    /// Kill it and its process group (SIGKILL: it holds nothing to save). Its exit is
    /// reaped by tokio in the background.
    pub(super) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Unreaped until here, so the group id cannot have been reused.
            if let Err(error) = crate::runtime::process::signal_group(self.pgid, Signal::SIGKILL) {
                tracing::warn!(pgid = self.pgid, %error, "kill TensorBoard");
            }
            let _ = child.start_kill();
            let _ = std::fs::remove_file(&self.pid_file);
        }
    }
}

/// Kill the TensorBoard that [`PID_FILE`] in `replica_dir` names, if it still runs (an
/// agent that was killed could not).
fn kill_leftover(replica_dir: &Path) {
    let path = replica_dir.join(PID_FILE);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return;
    };
    let mut fields = text.split_whitespace().map(str::parse::<u64>);
    if let (Some(Ok(pid)), Some(Ok(ticks))) = (fields.next(), fields.next())
        && let (Ok(pid32), Ok(pgid)) = (u32::try_from(pid), i32::try_from(pid))
        && crate::runtime::process::process_running(pid32, Some(ticks))
    {
        tracing::info!(pid, "killing a TensorBoard an earlier agent left running");
        if let Err(error) = crate::runtime::process::signal_group(pgid, Signal::SIGKILL) {
            tracing::warn!(pid, %error, "kill a leftover TensorBoard");
        }
    }
    let _ = std::fs::remove_file(&path);
}

impl Drop for TensorBoard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What [`start`] needs of the replica.
pub(super) struct Beside<'a> {
    /// The Task's `tensorBoardDir`.
    pub tensor_board_dir: &'a str,
    /// The replica's working directory.
    pub work_dir: &'a Path,
    /// The replica's directory (where the log goes).
    pub replica_dir: &'a Path,
    /// The replica's environment (on top of the agent's).
    pub env: &'a [(String, String)],
}

/// Start TensorBoard beside a replica: the process and the status to report, or the
/// status saying why it does not run.
pub(super) fn start(beside: &Beside<'_>) -> (Option<TensorBoard>, PodTensorBoard) {
    kill_leftover(beside.replica_dir);
    let log_dir = log_dir(beside.work_dir, beside.tensor_board_dir);
    let not_started = |message: String| PodTensorBoard {
        port: None,
        log_dir: Some(log_dir.display().to_string()),
        message: Some(format!("TensorBoard was not started: {message}")),
    };
    let path_var = beside
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| std::ffi::OsString::from(v))
        .or_else(|| std::env::var_os("PATH"));
    let program = match find_program(PROGRAM, beside.work_dir, path_var.as_deref()) {
        Ok(program) => program,
        Err(message) => return (None, not_started(message)),
    };
    let port = match free_port() {
        Ok(port) => port,
        Err(error) => {
            return (
                None,
                not_started(format!("no free port on 127.0.0.1: {error}")),
            );
        }
    };
    let log_path = beside.replica_dir.join(LOG_FILE);
    let log = match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
    {
        Ok(log) => log,
        Err(error) => {
            return (
                None,
                not_started(format!("open {}: {error}", log_path.display())),
            );
        }
    };
    let stderr = match log.try_clone() {
        Ok(stderr) => stderr,
        Err(error) => {
            return (
                None,
                not_started(format!("open {}: {error}", log_path.display())),
            );
        }
    };
    let mut command = tokio::process::Command::new(&program);
    command
        .arg("--logdir")
        .arg(&log_dir)
        .arg("--host")
        .arg("127.0.0.1")
        .arg("--port")
        .arg(port.to_string())
        .current_dir(beside.work_dir)
        .envs(beside.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(stderr))
        .process_group(0)
        .kill_on_drop(true)
        .clean_signals();
    let child = match command.spawn() {
        Ok(child) => child,
        Err(error) => {
            return (
                None,
                not_started(format!("start {}: {error}", program.display())),
            );
        }
    };
    let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) else {
        // Exited and reaped already: nothing runs.
        return (
            None,
            not_started(format!(
                "{} exited at once (its output is in {})",
                program.display(),
                log_path.display()
            )),
        );
    };
    tracing::info!(program = %program.display(), port, log_dir = %log_dir.display(), pid, "TensorBoard started beside the replica");
    let pid_file = beside.replica_dir.join(PID_FILE);
    if let Some(stat) = u32::try_from(pid)
        .ok()
        .and_then(crate::runtime::process::proc_stat)
        && let Err(error) = std::fs::write(&pid_file, format!("{pid} {}\n", stat.start_ticks))
    {
        tracing::warn!(file = %pid_file.display(), %error, "record the TensorBoard's pid");
    }
    let status = PodTensorBoard {
        port: Some(i32::from(port)),
        log_dir: Some(log_dir.display().to_string()),
        message: None,
    };
    (
        Some(TensorBoard {
            child: Some(child),
            pgid: pid,
            pid_file,
        }),
        status,
    )
}

/// The status of a replica that gets no TensorBoard for `why`.
pub(super) fn not_started(why: String) -> PodTensorBoard {
    PodTensorBoard {
        port: None,
        log_dir: None,
        message: Some(format!("TensorBoard was not started: {why}")),
    }
}

/// Where on the host the logs of a Docker replica's `tensorBoardDir` are: the directory
/// must be absolute (a path in the main container) and under a bind mount of the main
/// container whose source is a host path; the longest such mount wins. Otherwise why the
/// agent cannot read them.
pub(super) fn docker_log_dir(
    main: &rlark_api::types::DockerContainerSpec,
    tensor_board_dir: &str,
) -> Result<PathBuf, String> {
    if !tensor_board_dir.starts_with('/') {
        return Err(format!(
            "tensorBoardDir {tensor_board_dir:?} must be an absolute path in the container \
             for a Docker task"
        ));
    }
    let dir = Path::new(tensor_board_dir);
    main.volumes
        .iter()
        .filter(|v| v.source.starts_with('/'))
        .filter_map(|v| {
            let rest = dir.strip_prefix(&v.target).ok()?;
            Some((v.target.len(), Path::new(&v.source).join(rest)))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, host)| host)
        .ok_or_else(|| {
            format!(
                "tensorBoardDir {tensor_board_dir} is not under a host-path volume of container \
                 {:?} (docker.containers[0].volumes), so the agent cannot read the logs on \
                 the node",
                main.name
            )
        })
}

/// `tensorBoardDir` against the working directory (an absolute one stays as it is).
pub(super) fn log_dir(work_dir: &Path, tensor_board_dir: &str) -> PathBuf {
    work_dir.join(tensor_board_dir)
}

/// The first executable file `program` in `path_var` (its relative entries against
/// `work_dir`), or why there is none.
fn find_program(
    program: &str,
    work_dir: &Path,
    path_var: Option<&OsStr>,
) -> Result<PathBuf, String> {
    let Some(path_var) = path_var.filter(|p| !p.is_empty()) else {
        return Err(format!("no executable {program:?}: PATH is empty"));
    };
    for dir in std::env::split_paths(path_var) {
        let candidate = work_dir.join(dir).join(program);
        if let Ok(meta) = std::fs::metadata(&candidate)
            && meta.is_file()
            && meta.permissions().mode() & 0o111 != 0
        {
            return Ok(candidate);
        }
    }
    Err(format!(
        "no executable {program:?} in PATH ({}); install it on the node (pip install \
         tensorboard) or set the Task's PATH to include it",
        path_var.to_string_lossy()
    ))
}

/// A port of 127.0.0.1 free now (the kernel's pick; TensorBoard binds it right after).
fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_docker_replicas_logs_are_read_through_its_host_path_volume() {
        let volume = |source: &str, target: &str| rlark_api::types::DockerVolumeRef {
            source: source.into(),
            target: target.into(),
        };
        let main = rlark_api::types::DockerContainerSpec {
            name: "trainer".into(),
            volumes: vec![
                volume("/srv/data", "/data"),
                volume("/srv/runs", "/data/runs"),
                volume("named-volume", "/cache"),
            ],
            ..Default::default()
        };
        assert_eq!(
            docker_log_dir(&main, "/data/runs/ppo"),
            Ok(PathBuf::from("/srv/runs/ppo")),
            "the longest covering mount"
        );
        assert_eq!(
            docker_log_dir(&main, "/data"),
            Ok(PathBuf::from("/srv/data"))
        );
        let named = docker_log_dir(&main, "/cache/tb").expect_err("a named volume");
        assert!(named.contains("not under a host-path volume"), "{named}");
        assert!(named.contains("\"trainer\""), "{named}");
        let outside = docker_log_dir(&main, "/database").expect_err("outside");
        assert!(outside.contains("/database"), "{outside}");
        let relative = docker_log_dir(&main, "runs").expect_err("relative");
        assert!(relative.contains("absolute path"), "{relative}");
    }

    #[test]
    fn the_log_dir_is_relative_to_the_working_directory() {
        let work = Path::new("/data/t/0/work");
        assert_eq!(log_dir(work, "runs"), PathBuf::from("/data/t/0/work/runs"));
        assert_eq!(log_dir(work, "/logs/tb"), PathBuf::from("/logs/tb"));
    }

    #[test]
    fn the_program_is_the_first_executable_in_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(&a).expect("a");
        std::fs::create_dir_all(&b).expect("b");
        // Not executable in a: skipped.
        std::fs::write(a.join(PROGRAM), b"").expect("write");
        std::fs::write(b.join(PROGRAM), b"").expect("write");
        std::fs::set_permissions(b.join(PROGRAM), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let path = std::env::join_paths([&a, &b]).expect("join");
        assert_eq!(
            find_program(PROGRAM, dir.path(), Some(&path)),
            Ok(b.join(PROGRAM))
        );
        // Relative PATH entries are relative to the working directory.
        assert_eq!(
            find_program(PROGRAM, dir.path(), Some(OsStr::new("b"))),
            Ok(b.join(PROGRAM))
        );
        let missing =
            find_program(PROGRAM, dir.path(), Some(OsStr::new("a"))).expect_err("not executable");
        assert!(
            missing.contains("no executable \"tensorboard\" in PATH (a)"),
            "{missing}"
        );
        assert!(
            find_program(PROGRAM, dir.path(), None)
                .expect_err("no PATH")
                .contains("PATH is empty")
        );
    }

    #[tokio::test]
    async fn a_tensorboard_left_by_a_killed_agent_is_killed_by_the_next_start() {
        use std::os::unix::process::CommandExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let mut left = std::process::Command::new("/bin/sleep")
            .arg("600")
            .process_group(0)
            .spawn()
            .expect("sleep");
        let pid = left.id();
        let ticks = crate::runtime::process::proc_stat(pid)
            .expect("stat")
            .start_ticks;
        // Another process's record (wrong start time) is left alone.
        std::fs::write(dir.path().join(PID_FILE), format!("{pid} {}\n", ticks + 1)).expect("write");
        kill_leftover(dir.path());
        assert!(crate::runtime::process::process_running(pid, Some(ticks)));
        assert!(!dir.path().join(PID_FILE).exists());
        std::fs::write(dir.path().join(PID_FILE), format!("{pid} {ticks}\n")).expect("write");
        kill_leftover(dir.path());
        let status = left.wait().expect("wait");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        assert!(!dir.path().join(PID_FILE).exists());
    }

    #[tokio::test]
    async fn a_missing_tensorboard_is_reported_not_started() {
        let dir = tempfile::tempdir().expect("tempdir");
        let env = vec![("PATH".to_string(), dir.path().display().to_string())];
        let (running, status) = start(&Beside {
            tensor_board_dir: "runs",
            work_dir: dir.path(),
            replica_dir: dir.path(),
            env: &env,
        });
        assert!(running.is_none());
        assert_eq!(status.port, None);
        assert_eq!(
            status.log_dir,
            Some(dir.path().join("runs").display().to_string())
        );
        let message = status.message.expect("message");
        assert!(
            message.starts_with("TensorBoard was not started: no executable \"tensorboard\""),
            "{message}"
        );
    }
}
