//! The raw runtime with its real supervisor process (`rlark-agent-supervise`): starting,
//! stopping, deadlines, start errors, and what an agent restart relies on — the exit
//! recorded in `exit.json` with no agent watching, adoption of a running replica by a new
//! handle, and a replica whose supervisor was killed.
//!
//! Every wait is bounded; no test asserts how long anything took.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rlark_agent::runtime::record::{self, ExitRecord, PidRecord};
use rlark_agent::runtime::{
    Adoption, EXIT_FILE, ExitCause, ExitStatus, PID_FILE, REASON_START_ERROR, ReplicaSpec,
    RuntimeError, adopt_replica, process, spawn_replica,
};
use tokio::time::Instant;

/// Upper bound of every wait.
const DEADLINE: Duration = Duration::from_secs(20);

fn supervisor() -> Vec<OsString> {
    vec![env!("CARGO_BIN_EXE_rlark-agent-supervise").into()]
}

/// Poll `check` until it is true, at most [`DEADLINE`].
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn signal(pid: u32, signal: Signal) {
    kill(Pid::from_raw(i32::try_from(pid).expect("pid")), signal).expect("kill");
}

/// A script that waits for the file `go` in its working directory, then exits `code`.
fn gated(code: i32) -> String {
    format!("while [ ! -e go ]; do sleep 0.05; done; echo going; exit {code}")
}

fn sh(script: &str, dir: &Path) -> ReplicaSpec {
    let mut spec = ReplicaSpec::new(
        vec!["sh".into(), "-c".into(), script.into()],
        dir.join("replica"),
    );
    spec.supervisor = supervisor();
    spec
}

/// `ReplicaSpec::new` with the test supervisor.
fn spec_of(entrypoint: Vec<String>, dir: PathBuf) -> ReplicaSpec {
    let mut spec = ReplicaSpec::new(entrypoint, dir);
    spec.supervisor = supervisor();
    spec
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
    let spec = spec_of(vec!["/nonexistent/bin".into()], dir.path().join("r"));
    let err = spawn_replica(spec).await.expect_err("missing binary");
    assert!(err.to_string().contains("/nonexistent/bin"), "{err}");
    assert_eq!(err.reason(), REASON_START_ERROR);

    let spec = spec_of(vec!["no-such-program-xyz".into()], dir.path().join("r"));
    let err = spawn_replica(spec).await.expect_err("not in PATH");
    assert!(err.to_string().contains("no-such-program-xyz"), "{err}");

    let mut spec = sh("true", dir.path());
    spec.working_dir = Some("/nonexistent/dir".into());
    let err = spawn_replica(spec).await.expect_err("missing working dir");
    assert!(err.to_string().contains("/nonexistent/dir"), "{err}");

    let spec = spec_of(Vec::new(), dir.path().join("r"));
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
    let mut spec = spec_of(vec!["./run.sh".into()], dir.path().join("r"));
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

#[tokio::test]
async fn the_exit_is_recorded_in_exit_json_even_when_the_agent_side_is_gone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = sh(&gated(7), dir.path());
    let replica = spec.replica_dir.clone();
    let handle = spawn_replica(spec).await.expect("spawn");
    let (pid, supervisor_pid, work) = (
        handle.pid(),
        handle.supervisor_pid(),
        handle.work_dir().to_path_buf(),
    );
    let started: PidRecord = record::read(&replica.join(PID_FILE))
        .expect("read pid.json")
        .expect("pid.json");
    assert_eq!(
        (started.pid, started.pgid),
        (pid, i32::try_from(pid).expect("pid"))
    );
    assert_eq!(started.supervisor_pid, supervisor_pid);
    assert_ne!(supervisor_pid, pid);
    let stat = process::proc_stat(pid).expect("task runs");
    assert_eq!(started.proc_start_ticks, Some(stat.start_ticks));
    assert_eq!(stat.pgrp, started.pgid, "the task leads its own group");
    let supervisor_stat = process::proc_stat(supervisor_pid).expect("supervisor runs");
    assert_ne!(
        supervisor_stat.pgrp, started.pgid,
        "the supervisor is outside that group"
    );
    assert_ne!(
        supervisor_stat.pgrp,
        process::proc_stat(std::process::id())
            .expect("own stat")
            .pgrp,
        "and outside the agent's group"
    );

    // The agent side goes away (as when the agent dies); the task ends later.
    drop(handle);
    std::fs::write(work.join("go"), "").expect("go");
    let exit_path = replica.join(EXIT_FILE);
    until("exit.json", || exit_path.exists()).await;
    let exit: ExitRecord = record::read(&exit_path).expect("read").expect("exit.json");
    assert_eq!(exit.status(), Some(ExitStatus::Code(7)));
    assert!(!exit.killed);
    until("the supervisor ends", || {
        !process::process_running(supervisor_pid, None)
    })
    .await;
}

#[tokio::test]
async fn an_adopted_replica_reports_its_later_exit_with_the_real_code() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = sh(&gated(5), dir.path());
    let handle = spawn_replica(spec.clone()).await.expect("spawn");
    let (pid, work) = (handle.pid(), handle.work_dir().to_path_buf());
    let started_at = handle.started_at();
    handle.detach();

    let Adoption::Running(mut adopted) = adopt_replica(&spec).await else {
        panic!("the replica runs: it should be adopted");
    };
    assert_eq!(adopted.pid(), pid);
    assert_eq!(adopted.started_at(), started_at);
    assert_eq!(adopted.try_exit(), None);
    std::fs::write(work.join("go"), "").expect("go");
    let exit = tokio::time::timeout(DEADLINE, adopted.wait())
        .await
        .expect("the exit is seen");
    assert_eq!(exit.status, ExitStatus::Code(5));
    assert_eq!(exit.cause, ExitCause::Exited);
    let log = std::fs::read_to_string(adopted.log_path()).expect("log");
    assert!(log.contains("going"), "{log}");

    // Adopted again once it ended: the recorded exit.
    match adopt_replica(&spec).await {
        Adoption::Exited(exit) => assert_eq!(exit.status, ExitStatus::Code(5)),
        other => panic!("expected the recorded exit, got {other:?}"),
    }
}

#[tokio::test]
async fn terminate_through_an_adopted_handle_kills_the_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = sh("trap '' TERM; sleep 30 & sleep 30", dir.path());
    let handle = spawn_replica(spec.clone()).await.expect("spawn");
    let pgid = handle.pgid();
    handle.detach();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let Adoption::Running(mut adopted) = adopt_replica(&spec).await else {
        panic!("the replica runs: it should be adopted");
    };
    let exit = adopted.terminate(Duration::from_millis(300)).await;
    assert_eq!(exit.cause, ExitCause::Terminated);
    assert!(exit.killed, "TERM is ignored, so KILL was needed");
    assert_eq!(exit.status, ExitStatus::Signal(9));
    assert!(process::wait_group_gone(pgid, DEADLINE).await);
}

#[tokio::test]
async fn a_replica_whose_supervisor_was_killed_is_lost_and_its_group_killed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spec = sh("sleep 30", dir.path());
    spec.grace = Duration::from_millis(500);
    let handle = spawn_replica(spec.clone()).await.expect("spawn");
    let (pid, pgid, supervisor_pid) = (handle.pid(), handle.pgid(), handle.supervisor_pid());
    handle.detach();
    signal(supervisor_pid, Signal::SIGKILL);
    until("the supervisor is dead", || {
        !process::process_running(supervisor_pid, None)
    })
    .await;
    assert!(
        process::process_running(pid, None),
        "the task outlives its supervisor"
    );
    match adopt_replica(&spec).await {
        Adoption::Lost(message) => {
            assert!(message.contains("still running"), "{message}");
            assert!(message.contains("unknown"), "{message}");
        }
        other => panic!("expected a lost replica, got {other:?}"),
    }
    assert!(process::wait_group_gone(pgid, DEADLINE).await);
    assert!(matches!(
        adopt_replica(&sh("true", &dir.path().join("never"))).await,
        Adoption::NoRecord
    ));
}

#[tokio::test]
async fn a_supervisor_killed_under_a_watching_agent_gives_an_unknown_exit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut handle = spawn_replica(sh("sleep 30", dir.path()))
        .await
        .expect("spawn");
    let pgid = handle.pgid();
    signal(handle.supervisor_pid(), Signal::SIGKILL);
    let exit = tokio::time::timeout(DEADLINE, handle.wait())
        .await
        .expect("the end is seen");
    assert_eq!(exit.status, ExitStatus::Unknown);
    assert!(
        process::wait_group_gone(pgid, DEADLINE).await,
        "nothing unsupervised is left"
    );
}

#[tokio::test]
async fn sigterm_to_the_supervisor_stops_the_task() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut handle = spawn_replica(sh("sleep 30", dir.path()))
        .await
        .expect("spawn");
    signal(handle.supervisor_pid(), Signal::SIGTERM);
    let exit = tokio::time::timeout(DEADLINE, handle.wait())
        .await
        .expect("the end is seen");
    assert_eq!(exit.status, ExitStatus::Signal(15), "forwarded to the task");
    assert_eq!(exit.cause, ExitCause::Exited, "the agent did not stop it");
}

#[tokio::test]
async fn exec_errors_come_back_through_the_supervisor_and_a_bad_supervisor_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Executable, but neither a binary nor a script with `#!`: exec fails (ENOEXEC) in
    // the supervisor, after the agent's own checks passed.
    let work = dir.path().join("bin");
    std::fs::create_dir_all(&work).expect("mkdir");
    let junk = work.join("junk");
    std::fs::write(&junk, [0u8, 1, 2, 3]).expect("write");
    std::fs::set_permissions(&junk, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let spec = spec_of(vec![junk.display().to_string()], dir.path().join("r"));
    let err = spawn_replica(spec).await.expect_err("exec format error");
    assert!(matches!(err, RuntimeError::Spawn { .. }), "{err:?}");
    assert_eq!(err.reason(), REASON_START_ERROR);
    assert!(err.to_string().contains("junk"), "{err}");
    assert!(err.to_string().contains("os error 8"), "ENOEXEC: {err}");

    let mut spec = sh("true", dir.path());
    spec.supervisor = vec!["/nonexistent/rlark-supervise".into()];
    let err = spawn_replica(spec).await.expect_err("no supervisor");
    assert!(
        err.to_string().contains("/nonexistent/rlark-supervise"),
        "{err}"
    );
    assert_eq!(err.reason(), REASON_START_ERROR);
    let mut spec = sh("true", dir.path());
    spec.supervisor = Vec::new();
    let err = spawn_replica(spec).await.expect_err("no supervisor");
    assert!(err.to_string().contains("no supervisor command"), "{err}");
}

#[tokio::test]
async fn the_task_starts_with_no_blocked_signals_and_sigpipe_at_its_default() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The task's pid becomes `sleep`'s (a shell blocks signals itself while it waits).
    let mut handle = spawn_replica(sh("exec sleep 30", dir.path()))
        .await
        .expect("spawn");
    until("sleep runs", || {
        std::fs::read_to_string(format!("/proc/{}/comm", handle.pid()))
            .is_ok_and(|comm| comm.trim() == "sleep")
    })
    .await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", handle.pid())).expect("status");
    let mask = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or_else(|| panic!("no {name} in {status}"))
    };
    assert_eq!(mask("SigBlk:"), 0, "{status}");
    let sigpipe_bit = 1u64 << (Signal::SIGPIPE as i32 - 1);
    assert_eq!(mask("SigIgn:") & sigpipe_bit, 0, "{status}");
    let exit = handle.terminate(Duration::from_secs(5)).await;
    assert_eq!(exit.status, ExitStatus::Signal(15));
}

const DIRTY_HELPER: &str = "RLARK_TEST_DIRTY_AGENT";

/// Issue 38, point 5 ("clean children"): an agent started from a shell's `&` inherits
/// SIGINT and SIGQUIT ignored (and SIGUSR2 here); before the fix its replicas did too (the
/// supervisor reset only the signals it blocks), so a task's SIGINT handler-less stop did
/// nothing. The agent side runs in a child that `sh` started with those signals ignored.
#[tokio::test]
async fn a_replica_starts_with_default_signals_whatever_the_agent_inherited() {
    let output = tokio::process::Command::new("sh")
        .arg("-c")
        .arg("trap '' INT QUIT USR2; exec \"$0\" --exact runtime::agent_with_inherited_signals --ignored --nocapture --test-threads=1")
        .arg(std::env::current_exe().expect("exe"))
        .env(DIRTY_HELPER, "1")
        .output()
        .await
        .expect("run the helper");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let value = |key: &str| -> u64 {
        stdout
            .lines()
            .find_map(|l| l.split_once(&format!("{key}=")).map(|(_, v)| v.trim()))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {stdout}"))
    };
    let bit = |signal: i32| 1u64 << (signal - 1);
    let int = bit(Signal::SIGINT as i32);
    assert_eq!(
        value("agent_ign") & int,
        int,
        "the agent side ignores SIGINT"
    );
    // glibc keeps signals 32 and 33 for itself (no program can use them through it) and
    // its posix_spawn leaves them ignored; the supervisor, a Rust program, ignores SIGPIPE
    // itself. Everything else starts at its default.
    let glibc = bit(32) | bit(33);
    let sigpipe = bit(Signal::SIGPIPE as i32);
    assert_eq!(value("supervisor_ign") & !(glibc | sigpipe), 0, "{stdout}");
    assert_eq!(value("task_ign") & !glibc, 0, "{stdout}");
    assert_eq!(value("task_blk"), 0, "{stdout}");
    assert_eq!(
        value("task_exit_signal"),
        2,
        "SIGINT ended the task: {stdout}"
    );
}

#[tokio::test]
#[ignore = "helper run as a child process by the clean-children test"]
async fn agent_with_inherited_signals() {
    if std::env::var_os(DIRTY_HELPER).is_none() {
        return;
    }
    let (agent_ign, _) = rlark_process::signal_masks(std::process::id()).expect("own masks");
    println!("agent_ign={agent_ign}");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut handle = spawn_replica(sh("exec sleep 30", dir.path()))
        .await
        .expect("spawn");
    until("sleep runs", || {
        std::fs::read_to_string(format!("/proc/{}/comm", handle.pid()))
            .is_ok_and(|comm| comm.trim() == "sleep")
    })
    .await;
    let (supervisor_ign, _) =
        rlark_process::signal_masks(handle.supervisor_pid()).expect("supervisor masks");
    let (task_ign, task_blk) = rlark_process::signal_masks(handle.pid()).expect("task masks");
    println!("supervisor_ign={supervisor_ign}\ntask_ign={task_ign}\ntask_blk={task_blk}");
    signal(handle.pid(), Signal::SIGINT);
    let exit = tokio::time::timeout(DEADLINE, handle.wait())
        .await
        .expect("the task ends");
    let code = match exit.status {
        ExitStatus::Signal(signal) => signal,
        _ => -1,
    };
    println!("task_exit_signal={code}");
}
