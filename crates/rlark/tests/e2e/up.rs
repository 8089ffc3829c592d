//! A running `rlark up` of the built binary, for the tests that drive it as a user does
//! (`up_session`, `up_demo`): started on a data directory and a free port, its stdout
//! collected, stopped with Ctrl-C (or killed when dropped). Every wait is bounded.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_rlark");
/// Bound of every wait.
pub(crate) const WAIT: Duration = Duration::from_secs(60);

/// A running `rlark up` with its stdout collected line by line.
pub(crate) struct Up {
    pub(crate) child: Child,
    data_dir: PathBuf,
    stdout: Arc<Mutex<String>>,
}

impl Up {
    pub(crate) fn start(data_dir: &Path, extra: &[&str]) -> Up {
        let mut child = Command::new(BIN)
            .arg("up")
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start rlark up");
        let stdout = Arc::new(Mutex::new(String::new()));
        let pipe = child.stdout.take().expect("stdout");
        let sink = Arc::clone(&stdout);
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                let mut text = sink.lock().expect("lock");
                text.push_str(&line);
                text.push('\n');
            }
        });
        let up = Up {
            child,
            data_dir: data_dir.to_path_buf(),
            stdout,
        };
        wait_for("rlark up to be ready", || {
            up.output().contains("Press Ctrl-C to stop.")
        });
        up
    }

    pub(crate) fn output(&self) -> String {
        self.stdout.lock().expect("lock").clone()
    }

    pub(crate) fn rlark(&self, args: &[&str]) -> std::process::Output {
        Command::new(BIN)
            .args(args)
            .arg("--kubeconfig")
            .arg(self.data_dir.join("admin.kubeconfig"))
            .output()
            .expect("run rlark")
    }

    /// SIGINT (Ctrl-C), then wait for the exit.
    pub(crate) fn interrupt(mut self) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT");
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "rlark up did not exit on SIGINT");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
