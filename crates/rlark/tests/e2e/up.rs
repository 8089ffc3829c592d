//! A running `rlark up` of the built binary, for the tests that drive it as a user does
//! (`up_session`, `up_demo`, `cli_quickstart`, `rlark_samples`): started on a data
//! directory (or the default one) and a free port, its stdout collected, stopped with
//! Ctrl-C (SIGKILL when it does not stop). Every wait is bounded.

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
    /// `rlark up --data-dir DATA_DIR --listen 127.0.0.1:0 EXTRA...`, once it is ready.
    pub(crate) fn start(data_dir: &Path, extra: &[&str]) -> Up {
        let mut command = Command::new(BIN);
        command
            .arg("up")
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra);
        Self::launch(command, data_dir)
    }

    /// `rlark up --listen 127.0.0.1:0` run in `cwd` with its default data directory
    /// (`./.rlark`), as the README's first command runs it.
    pub(crate) fn start_in(cwd: &Path) -> Up {
        let mut command = Command::new(BIN);
        command
            .args(["up", "--listen", "127.0.0.1:0"])
            .current_dir(cwd)
            .env_remove("RLARK_DATA_DIR");
        Self::launch(command, &cwd.join(".rlark"))
    }

    fn launch(mut command: Command, data_dir: &Path) -> Up {
        let mut child = command
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

    /// The admin kubeconfig `up` wrote.
    pub(crate) fn kubeconfig(&self) -> PathBuf {
        self.data_dir.join("admin.kubeconfig")
    }

    pub(crate) fn output(&self) -> String {
        self.stdout.lock().expect("lock").clone()
    }

    pub(crate) fn rlark(&self, args: &[&str]) -> std::process::Output {
        Command::new(BIN)
            .args(args)
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
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
    /// SIGINT first, as a user's Ctrl-C (`up` stops its tasks on the way out), then SIGKILL
    /// if it has not exited within [`WAIT`].
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
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
