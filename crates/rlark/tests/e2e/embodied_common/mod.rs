//! Shared by the `rlark embodied` CLI suites (`embodied_cli.rs`, `camera_cli.rs`): the
//! runtime as a real process serving `examples/embodied/sim.yaml` in a temporary socket
//! directory, and the CLI run against it. Every wait is bounded by [`DEADLINE`].

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tempfile::TempDir;

pub const RLARK: &str = env!("CARGO_BIN_EXE_rlark");
pub const DEADLINE: Duration = Duration::from_secs(30);

/// `rlark embodied` on the sim config; dropped, it is killed.
pub struct Embodied {
    pub process: tokio::process::Child,
    pub socket_dir: PathBuf,
    _dir: TempDir,
}

impl Embodied {
    pub fn start() -> anyhow::Result<Embodied> {
        let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/embodied/sim.yaml");
        Self::start_config(&config)
    }

    /// `rlark embodied` on the configuration at `config`.
    pub fn start_config(config: &Path) -> anyhow::Result<Embodied> {
        // Shared: replicas running as users of their own reach the sockets below it.
        let dir = rlark_testkit::shared_tempdir()?;
        let socket_dir = dir.path().join("run");
        let process = tokio::process::Command::new(RLARK)
            .arg("embodied")
            .arg("--config")
            .arg(config)
            .arg("--socket-dir")
            .arg(&socket_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        Ok(Embodied {
            process,
            socket_dir,
            _dir: dir,
        })
    }

    /// `rlark <command> --socket-dir DIR ARGS...` (bounded).
    pub async fn cli(&self, command: &str, args: &[&str]) -> anyhow::Result<Output> {
        let run = tokio::process::Command::new(RLARK)
            .arg(command)
            .arg("--socket-dir")
            .arg(&self.socket_dir)
            .args(args)
            .stdin(Stdio::null())
            .output();
        tokio::time::timeout(DEADLINE, run)
            .await
            .with_context(|| format!("rlark {command} {args:?} timed out"))?
            .with_context(|| format!("run rlark {command}"))
    }

    /// The output of `rlark <command> list` once the runtime's socket is up.
    pub async fn first_list(&mut self, command: &str) -> anyhow::Result<String> {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let output = self.cli(command, &["list"]).await?;
            if output.status.success() {
                return Ok(stdout(&output));
            }
            if let Some(status) = self.process.try_wait()? {
                bail!("rlark embodied exited: {status}");
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "rlark {command} list never succeeded: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Its stdout, or an error with both streams when it failed.
pub fn ok(output: Output, what: &str) -> anyhow::Result<String> {
    if !output.status.success() {
        bail!(
            "{what} failed ({}): {}{}",
            output.status,
            stdout(&output),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(stdout(&output))
}
