//! `rlark up --demo --once`: the built binary starts the platform on a fresh data directory
//! and a free port, with its embedded embodied runtime (simulated arms and cameras on
//! `edge`), runs the embedded demo (a learner on `cloud`, two rollout replicas on `edge`
//! each driving a simulated arm through the embodied SDK), prints the summary and the reward
//! curve, and exits 0 only if the policy learned. The first test uses `python3` on PATH,
//! which has numpy, grpcio and protobuf (`scripts/test.sh` installs them:
//! tests/python/requirements.txt); another puts a Python with nothing but its standard
//! library first on PATH, and `up` makes the demo's own environment with pip (from the
//! package index, or pip's cache of the installs `scripts/test.sh` made: it needs one of
//! them).

use std::io::Read as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::up::Up;

/// The whole run, startup and shutdown included, must end within this.
const HANG_GUARD: Duration = Duration::from_secs(180);

/// Runs `rlark up --demo --once` in `dir` with the default data directory, `./.rlark` —
/// a relative path, as in the README's first command.
fn run_demo(dir: &std::path::Path, extra: &[&str]) -> (std::process::ExitStatus, String, String) {
    run_demo_with(dir, extra, &[])
}

/// [`run_demo`] with `env` set for `rlark up`.
fn run_demo_with(
    dir: &std::path::Path,
    extra: &[&str],
    env: &[(&str, String)],
) -> (std::process::ExitStatus, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rlark"))
        .args(["up", "--demo", "--once"])
        .args(extra)
        .args(["--listen", "127.0.0.1:0"])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
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

/// The rows of the reward curve: (iteration, mean return).
fn curve(stdout: &str) -> Vec<(u32, f64)> {
    let header = stdout
        .lines()
        .position(|l| l.starts_with("ITERATION") && l.contains("MEAN RETURN"))
        .unwrap_or_else(|| panic!("no reward curve:\n{stdout}"));
    stdout
        .lines()
        .skip(header + 1)
        .take_while(|l| !l.trim().is_empty())
        .map(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            (
                cells[0]
                    .parse()
                    .unwrap_or_else(|_| panic!("iteration in {l:?}")),
                cells[1]
                    .parse()
                    .unwrap_or_else(|_| panic!("return in {l:?}")),
            )
        })
        .collect()
}

/// What docs/embodied.md states as the margin the demo's `--once` checks.
const MARGIN: f64 = 0.3;

/// Whether this process may build network namespaces (the Domain network needs root).
fn root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// The checks every run shares; `workflow` is the demo's Workflow (`--demo-name`).
fn check_run(stdout: &str, workflow: &str) {
    // TASK ROLE CLUSTER NODE PHASE REPLICAS REPORTS LAST-REWARD
    let learner = summary_row(stdout, &format!("{workflow}-train-learner"));
    assert_eq!(learner[1..3], ["Actor", "cloud"], "{stdout}");
    assert!(learner[3].ends_with("-cloud"), "{stdout}");
    assert_eq!(learner[4..7], ["Succeeded", "1/1", "8"], "{stdout}");
    let rollout = summary_row(stdout, &format!("{workflow}-train-rollout"));
    assert_eq!(rollout[1..3], ["Rollout", "edge"], "{stdout}");
    assert!(rollout[3].ends_with("-edge"), "{stdout}");
    assert_eq!(rollout[4..6], ["Succeeded", "2/2"], "{stdout}");
    // One report per episode: 8 iterations of 10 candidates (a candidate handed out again
    // after a lost result would add one).
    let episodes: usize = rollout[6].parse().expect("reports");
    assert!(episodes >= 80, "{stdout}");
    // The curve: one row per iteration, and the policy learned by the stated margin.
    let curve = curve(stdout);
    let iterations: Vec<u32> = curve.iter().map(|(i, _)| *i).collect();
    assert_eq!(iterations, (1..=8).collect::<Vec<_>>(), "{stdout}");
    let gain = curve[7].1 - curve[0].1;
    assert!(gain >= MARGIN, "gain {gain}:\n{stdout}");
    assert!(
        curve.iter().all(|(_, r)| *r <= 0.0 && *r > -5.0),
        "returns are minus a distance in radians:\n{stdout}"
    );
    assert!(
        stdout.contains("Learned: the mean return rose from"),
        "{stdout}"
    );
    assert!(
        stdout.contains("Devices on edge:    simulated arms arm-0, arm-1, cameras cam-0, cam-1"),
        "{stdout}"
    );
    // Progress lines show reports arriving while the Tasks run.
    assert!(
        stdout
            .lines()
            .any(|l| l.contains(&format!("task {workflow}-train-rollout"))
                && l.contains("Running")
                && l.contains("last reward")),
        "{stdout}"
    );
}

#[test]
fn up_demo_once_runs_an_embodied_rl_loop_that_learns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (status, stdout, stderr) = run_demo(dir.path(), &[]);
    assert!(
        status.success(),
        "exit {status}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(dir.path().join(".rlark").is_dir(), "state in ./.rlark");
    assert!(
        stdout.contains("workflow.rlinf.io/demo created"),
        "{stdout}"
    );
    // As root (the test script) the hosts have a pod network: the rollouts reach the
    // learner over the Domain; elsewhere over the host's loopback.
    if root() {
        assert!(
            stdout.contains("Network: the Domain demo (both clusters have a pod network"),
            "{stdout}\nstderr:\n{stderr}"
        );
        assert!(stdout.contains("domain.rlinf.io/demo created"), "{stdout}");
    } else {
        assert!(stdout.contains("Network: the host's loopback"), "{stdout}");
    }
    check_run(&stdout, "demo");

    // A second run on the same data directory under another name (`--demo-name`) leaves
    // the first in place; this one without the Domain.
    let (status, stdout, stderr) = run_demo(
        dir.path(),
        &["--demo-network", "host", "--demo-name", "demo-b"],
    );
    assert!(
        status.success(),
        "second run: exit {status}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(!stdout.contains("Removing workflow"), "{stdout}");
    assert!(
        stdout.contains("workflow.rlinf.io/demo-b created"),
        "{stdout}"
    );
    assert!(
        stdout.contains("Network: the host's loopback (--demo-network host)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("Reward curve (task demo-b-train-learner:"),
        "{stdout}"
    );
    check_run(&stdout, "demo-b");
    let second_curve = curve(&stdout);

    // The two runs' learners side by side, from a later `rlark up` on the same data
    // directory. (The learners: the demo's Jobs also hold the rollouts, whose rewards are
    // per episode, by episode count.)
    let up = Up::start(&dir.path().join(".rlark"), &[]);
    let out = up.rlark(&[
        "reports",
        "--compare",
        "task/demo-train-learner",
        "task/demo-b-train-learner",
    ]);
    let compared = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{compared}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Vec<&str>> = compared
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        [
            "STEP",
            "task/demo-train-learner",
            "task/demo-b-train-learner"
        ],
        "{compared}"
    );
    // Every iteration of the second run, with the value its own summary printed (three
    // decimals there, six significant digits here).
    for (iteration, reward) in &second_curve {
        let row = rows
            .iter()
            .find(|r| r.first() == Some(&iteration.to_string().as_str()))
            .unwrap_or_else(|| panic!("no step {iteration} in\n{compared}"));
        let value: f64 = row[2].parse().unwrap_or_else(|_| panic!("{row:?}"));
        assert!(
            (value - reward).abs() < 0.0006,
            "step {iteration}: {value} vs {reward}"
        );
        assert_ne!(row[1], "-", "both runs report every iteration: {compared}");
    }
    assert!(
        rows.iter()
            .any(|r| r.first() == Some(&"task/demo-b-train-learner")),
        "{compared}"
    );
    // And the REWARD column of the learner, from the summary the server folded.
    let out = up.rlark(&["get", "tasks", "-A", "-o", "wide"]);
    let wide = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        wide.lines().next().unwrap_or_default().contains("REWARD"),
        "{wide}"
    );
    let learner_row = wide
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("demo-b-train-learner"))
        .unwrap_or_else(|| panic!("{wide}"));
    assert!(learner_row.contains('/'), "a last/mean cell: {learner_row}");
    assert!(up.interrupt().success());
}

#[test]
fn up_demo_refuses_a_python_without_the_demo_packages_before_starting() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = dir.path().join("python");
    std::fs::write(&fake, "#!/bin/sh\necho numpy\n").expect("write");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let python = fake.to_str().expect("utf-8").to_string();
    let (status, stdout, stderr) = run_demo(dir.path(), &["--demo-python", &python]);
    assert_eq!(
        status.code(),
        Some(1),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stderr.contains("lacks numpy"), "{stderr}");
    assert!(!dir.path().join(".rlark").exists(), "nothing started");
}

/// A machine whose `python3` has nothing but the standard library: `up --demo --once` makes
/// the demo's own environment under the data directory (pip, its progress shown) and the
/// demo learns, in one command.
#[test]
fn a_python_with_only_its_standard_library_is_enough_for_one_step() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A bare virtual environment is such a Python: no site packages, no pip.
    let bare = dir.path().join("bare");
    let made = Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&bare)
        .status()
        .expect("python3 -m venv");
    assert!(made.success(), "python3 -m venv --without-pip: {made}");
    let check = Command::new(bare.join("bin/python3"))
        .args(["-c", "import numpy"])
        .output()
        .expect("bare python");
    assert!(!check.status.success(), "the bare Python has numpy");
    let path = format!(
        "{}:{}",
        bare.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let work = dir.path().join("work");
    std::fs::create_dir(&work).expect("mkdir");
    let (status, stdout, stderr) = run_demo_with(&work, &[], &[("PATH", path)]);
    assert!(
        status.success(),
        "exit {status}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        stdout.contains("Demo Python: python3 lacks numpy, grpcio>=1.85.1, protobuf>=7.35.1,<8"),
        "{stdout}"
    );
    let venv = work.join(".rlark/demo/venv/bin/python");
    assert!(stdout.contains("ready"), "{stdout}");
    assert!(venv.exists(), "no {}", venv.display());
    check_run(&stdout, "demo");
}
