//! Every `rlark bench` subcommand runs once, at a small size, through the built
//! `rlark-bench` binary (what `rlark bench` runs): a benchmark that breaks at run time fails
//! here instead of going unnoticed until someone measures. Figures are printed (`--json`), never asserted: this machine's speed is not a
//! test result (docs/benchmarks.md holds measured figures and how to reproduce them).
//!
//! `rlark bench port-forward` starts `rlark server`, `rlark agent` and `rlark port-forward`
//! as processes, and an OpenSSH relay when sshd and ssh are installed. Without sshd its
//! report says the relay was not measured; under `scripts/test.sh` (which installs
//! openssh-server) or `CI=true` that fails the test (`tests/support/missing_tool.rs`).
//!
//! The benches that start processes (`agent`, `port-forward`, `ssh`) run the `rlark` binary
//! beside `rlark-bench` in cargo's target directory. Cargo builds only this package's
//! binaries for these tests: `cargo test --workspace` (as scripts/test.sh runs) builds
//! both; alone, build `rlark` first (`cargo build -p rlark`), else those tests fail saying
//! so (a stale `rlark` there would be measured as it is).

#[path = "../../../tests/support/missing_tool.rs"]
mod missing_tool;

use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

/// One smoke run must end within this (they take seconds; the guard catches hangs).
const HANG_GUARD: Duration = Duration::from_secs(300);

/// The committed ratios of the regression guard (docs/benchmarks.md, "The regression guard").
const RATIOS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/bench-ratios.json");

/// Runs `rlark-bench ARGS --json`, fails the test on a non-zero exit or a hang, and returns
/// the report it printed.
fn bench(args: &[&str]) -> Value {
    run_bench(args, false)
}

/// [`bench`] with `--compare docs/bench-ratios.json`: the report must carry the guard's
/// ratios and their comparison, which is printed. A flagged ratio (exit 1, "more than 25%
/// worse") does not fail the test: this is a debug build on a shared machine, and tests
/// never judge timings; the comparison is there to be read.
fn bench_guarded(args: &[&str]) -> Value {
    let report = run_bench(args, true);
    // At smoke sizes a phase can be too short to read CPU time: then it has no ratio, and
    // the comparison lists its committed entry as not run.
    let guard = report["guard"].as_array().expect("the guard's ratios");
    for ratio in guard {
        assert!(ratio["ratio"].as_f64().is_some_and(|r| r > 0.0), "{ratio}");
    }
    let rows = report["comparison"]["rows"]
        .as_array()
        .expect("the comparison");
    println!("comparison with {RATIOS}:");
    for row in rows {
        println!(
            "  {:<34} committed {:>8} now {:>8} {}",
            row["name"].as_str().unwrap_or_default(),
            row["committed"],
            row["now"],
            if row["regressed"] == true {
                "REGRESSION (informational)"
            } else {
                ""
            }
        );
    }
    report
}

/// Benches that start the `rlark` binary (server, agent, CLI) as processes.
const NEED_RLARK: [&str; 4] = ["agent", "port-forward", "ssh", "net"];

fn run_bench(args: &[&str], compare: bool) -> Value {
    let bench_exe = std::path::Path::new(env!("CARGO_BIN_EXE_rlark-bench"));
    if args.first().is_some_and(|a| NEED_RLARK.contains(a)) {
        let rlark = bench_exe.with_file_name("rlark");
        assert!(
            rlark.is_file(),
            "rlark-bench {args:?} runs the rlark binary beside it, and {} does not exist: \
             build it first (`cargo build -p rlark`; `cargo test --workspace` builds both)",
            rlark.display()
        );
    }
    let mut command = Command::new(bench_exe);
    command.args(args).arg("--json");
    if compare {
        command.args(["--compare", RATIOS]);
    }
    let child = command
        .env("RUST_LOG", "warn")
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rlark-bench");
    let pid = child.id();
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    let output = match finished.recv_timeout(HANG_GUARD) {
        Ok(output) => output.expect("wait for rlark-bench"),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("rlark-bench {args:?} still running after {HANG_GUARD:?}");
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let flagged =
        compare && output.status.code() == Some(1) && stderr.contains("more than 25% worse than");
    assert!(
        output.status.success() || flagged,
        "rlark-bench {args:?} exited with {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    println!("rlark-bench {}:\n{stdout}", args.join(" "));
    let report: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("rlark-bench {args:?} printed no JSON report ({e}):\n{stdout}"));
    assert!(
        report.as_object().is_some_and(|o| !o.is_empty()),
        "rlark-bench {args:?}: empty report {report}"
    );
    report
}

#[test]
fn bench_api_runs() {
    bench_guarded(&[
        "api",
        "--creates",
        "40",
        "--concurrency",
        "1,4",
        "--list-objects",
        "50",
        "--lists",
        "2",
        "--watchers",
        "4",
        "--watch-events",
        "20",
        "--watch-rate",
        "100",
        "--tcp-round-trips",
        "200",
        "--healthz-requests",
        "50",
        "--store-creates",
        "50",
        "--timeout",
        "240",
    ]);
}

#[test]
fn bench_controllers_runs() {
    bench_guarded(&[
        "controllers",
        "--jobs",
        "8",
        "--tasks-per-job",
        "2",
        "--chain",
        "3",
        "--nodes",
        "2",
        "--timeout",
        "240",
    ]);
}

#[test]
fn bench_tunnel_runs() {
    bench_guarded(&["tunnel", "--mib", "4", "--setups", "20"]);
}

#[test]
fn bench_agent_runs() {
    let report = bench_guarded(&["agent", "--tasks", "6", "--running", "4", "--batch", "3"]);
    // The guard's baseline: the same supervisor and program, started once per short task.
    assert_eq!(report["direct_start"]["starts"], 6, "{report}");
    let command = report["direct_start"]["command"]
        .as_str()
        .unwrap_or_default();
    assert!(command.ends_with("true"), "{report}");
}

/// The docker runtime's variant, on this machine's engine with the test kit's image; skips
/// without an engine (fails under `CI=true`, scripts/test.sh starts one).
#[test]
fn bench_agent_docker_runs() {
    if let Some(why) = rlark_testkit::docker::engine_missing() {
        missing_tool::skip_or_fail(&why);
        return;
    }
    rlark_testkit::docker::ensure_test_image().expect("build the test image");
    let report = bench(&[
        "agent",
        "--agent-type",
        "docker",
        "--image",
        rlark_testkit::docker::TEST_IMAGE,
        "--tasks",
        "4",
        "--running",
        "2",
        "--batch",
        "2",
        "--docker-runs",
        "3",
    ]);
    assert_eq!(report["agent_type"], "docker", "{report}");
    assert_eq!(report["docker_run"]["count"], 3, "{report}");
    // The burst baseline: `--batch` `docker run -d` at once, all cleaned up.
    assert_eq!(report["docker_burst"]["count"], 2, "{report}");
    let left = rlark_testkit::docker::containers_with(&["rlark.io/bench=docker-run"])
        .expect("list the bench's containers");
    assert!(left.is_empty(), "docker run containers left: {left:?}");
}

#[test]
fn bench_camera_runs() {
    bench_guarded(&[
        "camera",
        "--seconds",
        "1",
        "--fps",
        "30",
        "--width",
        "64",
        "--height",
        "48",
    ]);
}

#[test]
fn bench_port_forward_runs() {
    let report = bench(&[
        "port-forward",
        "--mib",
        "2",
        "--runs",
        "1",
        "--round-trips",
        "50",
        "--setups",
        "20",
        "--timeout",
        "240",
    ]);
    if let Some(why) = report["paths"][2]["not_measured"].as_str() {
        missing_tool::skip_or_fail(&format!("the OpenSSH relay was not measured: {why}"));
    }
}

#[test]
fn bench_ssh_runs() {
    // The bench needs OpenSSH (its baseline is sshd): skipped with a message without it,
    // failed under CI=true.
    let found = |name: &str| {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .chain(["/usr/sbin".into(), "/sbin".into()])
            .any(|dir| dir.join(name).is_file())
    };
    if !(found("ssh") && found("sshd")) {
        missing_tool::skip_or_fail(
            "ssh or sshd is not installed (Debian openssh-client, openssh-server)",
        );
        return;
    }
    let report = bench(&["ssh", "--sessions", "3", "--mib", "2", "--timeout", "240"]);
    for path in ["rlark", "sshd"] {
        assert!(
            report[path]["session"]["count"] == 3,
            "{path}: {}",
            report[path]
        );
        assert!(report[path]["upload_mib_s"].as_f64().is_some(), "{report}");
    }
}
