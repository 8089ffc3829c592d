//! `rlark up --demo --once`: the built binary starts the platform on a fresh data directory
//! and a free port, runs the embedded demo Workflow (an actor on `cloud`, two rollout
//! replicas on `edge`, each posting reward reports) and exits 0 after printing the summary.
//! Needs `python3` on PATH (`scripts/test.sh` installs it).

use std::io::Read as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The whole run, startup and shutdown included, must end within this.
const HANG_GUARD: Duration = Duration::from_secs(120);

/// Runs `rlark up --demo --once` in `dir` with the default data directory, `./.rlark` —
/// a relative path, as in the README's first command.
fn run_demo(dir: &std::path::Path) -> (std::process::ExitStatus, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rlark"))
        .args(["up", "--demo", "--once"])
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "warn")
        .env_remove("KUBECONFIG")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rlark up --demo --once");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        stdout.read_to_string(&mut text).expect("read stdout");
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        stderr.read_to_string(&mut text).expect("read stderr");
        text
    });
    let deadline = Instant::now() + HANG_GUARD;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for rlark") {
            break status;
        }
        if Instant::now() >= deadline {
            child.kill().expect("kill a hung rlark");
            let _ = child.wait();
            let out = out.join().unwrap_or_default();
            let err = err.join().unwrap_or_default();
            panic!(
                "rlark up --demo --once still running after {HANG_GUARD:?}\n\
                 stdout:\n{out}\nstderr:\n{err}"
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    (
        status,
        out.join().expect("stdout reader"),
        err.join().expect("stderr reader"),
    )
}

/// The summary row of `task`, split into cells.
fn summary_row<'a>(stdout: &'a str, task: &str) -> Vec<&'a str> {
    let header = stdout
        .lines()
        .position(|l| l.starts_with("TASK ") && l.contains("LAST REWARD"))
        .unwrap_or_else(|| panic!("no summary table:\n{stdout}"));
    stdout
        .lines()
        .skip(header + 1)
        .find(|l| l.split_whitespace().next() == Some(task))
        .unwrap_or_else(|| panic!("no summary row for {task}:\n{stdout}"))
        .split_whitespace()
        .collect()
}

#[test]
fn up_demo_once_runs_the_demo_workflow_to_success() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (status, stdout, stderr) = run_demo(dir.path());
    assert!(
        status.success(),
        "exit {status}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(dir.path().join(".rlark").is_dir(), "state in ./.rlark");
    assert!(
        stdout.contains("workflow.rlinf.io/demo created"),
        "{stdout}"
    );
    assert!(
        stdout.contains("3/3 replicas Succeeded, 15 reports"),
        "{stdout}"
    );
    // TASK ROLE CLUSTER NODE PHASE REPLICAS REPORTS LAST-REWARD
    let actor = summary_row(&stdout, "demo-train-actor");
    assert_eq!(actor[1..3], ["Actor", "cloud"], "{stdout}");
    assert!(actor[3].ends_with("-cloud"), "{stdout}");
    assert_eq!(actor[4..7], ["Succeeded", "1/1", "5"], "{stdout}");
    assert!(actor[7].parse::<f64>().is_ok(), "{stdout}");
    let rollout = summary_row(&stdout, "demo-train-rollout");
    assert_eq!(rollout[1..3], ["Rollout", "edge"], "{stdout}");
    assert!(rollout[3].ends_with("-edge"), "{stdout}");
    assert_eq!(rollout[4..7], ["Succeeded", "2/2", "10"], "{stdout}");
    assert!(rollout[7].parse::<f64>().is_ok(), "{stdout}");
    // Progress lines show reports arriving while the Tasks run.
    assert!(
        stdout.lines().any(|l| l.contains("task demo-train-rollout")
            && l.contains("Running")
            && l.contains("last reward")),
        "{stdout}"
    );

    // A second run on the same data directory replaces the first Workflow and counts only
    // its own reports.
    let (status, stdout, stderr) = run_demo(dir.path());
    assert!(
        status.success(),
        "second run: exit {status}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        stdout.contains("Removing workflow demo of an earlier run"),
        "{stdout}"
    );
    assert!(
        stdout.contains("3/3 replicas Succeeded, 15 reports"),
        "{stdout}"
    );
}
