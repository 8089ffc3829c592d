//! `rlark bench port-forward` runs once, at a small size, through the built binary (it
//! starts `rlark server`, `rlark agent` and `rlark port-forward` as processes, and an
//! OpenSSH relay when sshd and ssh are installed): a benchmark that breaks at run time fails
//! here. Figures are printed (`--json`), never asserted. Beside `tests/bench_smoke.rs`,
//! which runs the other `rlark bench` subcommands the same way. Without sshd the report
//! says the relay was not measured; under `scripts/test.sh` (which installs openssh-server)
//! or `CI=true` that fails the test (`tests/support/missing_tool.rs`).

#[path = "../../../tests/support/missing_tool.rs"]
mod missing_tool;

use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

/// The smoke run must end within this (it takes seconds; the guard catches hangs).
const HANG_GUARD: Duration = Duration::from_secs(300);

#[test]
fn bench_port_forward_runs() {
    let args = [
        "bench",
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
        "--json",
    ];
    let child = Command::new(env!("CARGO_BIN_EXE_rlark"))
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rlark bench port-forward");
    let pid = child.id();
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    let output = match finished.recv_timeout(HANG_GUARD) {
        Ok(output) => output.expect("wait for rlark bench port-forward"),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("rlark bench port-forward still running after {HANG_GUARD:?}");
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "rlark bench port-forward exited with {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    println!("rlark bench port-forward:\n{stdout}");
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!("rlark bench port-forward printed no JSON report ({e}):\n{stdout}")
    });
    assert!(
        report.as_object().is_some_and(|o| !o.is_empty()),
        "empty report {report}"
    );
    if let Some(why) = report["paths"][2]["not_measured"].as_str() {
        missing_tool::skip_or_fail(&format!("the OpenSSH relay was not measured: {why}"));
    }
}
