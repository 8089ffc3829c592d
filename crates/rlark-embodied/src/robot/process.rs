//! Launch processes: each in its own process group (so stopping it reaches everything it
//! started, as roslaunch starts many nodes), its stdout and stderr kept line by line in the
//! robot's bounded log.

use rlark_process::CleanSignals as _;
use std::collections::{BTreeMap, VecDeque};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::sync::watch;

/// Longest line kept; longer lines are cut (and marked).
const MAX_LINE: usize = 4096;

/// The last lines of a robot's output, oldest first, at most `capacity` of them.
#[derive(Debug)]
pub struct LogRing {
    lines: Mutex<VecDeque<String>>,
    capacity: usize,
}

impl LogRing {
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            lines: Mutex::new(VecDeque::with_capacity(capacity.min(1024))),
            capacity: capacity.max(1),
        })
    }

    /// Append one line `[source] text`, dropping the oldest when full.
    pub fn push(&self, source: &str, text: &str) {
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        if lines.len() == self.capacity {
            lines.pop_front();
        }
        lines.push_back(format!("[{source}] {text}"));
    }

    /// The last `tail` lines (all kept lines when `tail` is 0).
    pub fn tail(&self, tail: usize) -> Vec<String> {
        let lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        let skip = if tail == 0 {
            0
        } else {
            lines.len().saturating_sub(tail)
        };
        lines.iter().skip(skip).cloned().collect()
    }
}

/// How a process ended.
pub fn describe_exit(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => match Signal::try_from(signal) {
            Ok(s) => format!("killed by {s}"),
            Err(_) => format!("killed by signal {signal}"),
        },
        _ => "ended".to_string(),
    }
}

/// A running launch process (the leader of its own process group).
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    pgid: Option<Pid>,
    exit: watch::Receiver<Option<ExitStatus>>,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Spawn<'a> {
    /// Short name used as the log prefix (`roscore`, `roslaunch`, `ros2`).
    pub name: &'a str,
    pub program: &'a str,
    pub args: Vec<String>,
    /// Set on top of the inherited environment. A `PATH` here is also where `program` is
    /// looked up.
    pub env: BTreeMap<String, String>,
}

impl ManagedProcess {
    /// Start the process in a new process group, its output going to `logs`. `on_exit`
    /// runs once, with the exit status, when the process ends (however it ends).
    pub fn spawn(
        spec: Spawn<'_>,
        logs: Arc<LogRing>,
        on_exit: impl FnOnce(ExitStatus) + Send + 'static,
    ) -> std::io::Result<Self> {
        let mut command = Command::new(spec.program);
        command
            .args(&spec.args)
            .envs(&spec.env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            // Stopping is explicit (signals to the group); never kill on a stray drop.
            .kill_on_drop(false)
            // The graceful stop is SIGINT: it must not be ignored because whoever started
            // the runtime ignored it (a shell's `&`).
            .clean_signals();
        let mut child = command.spawn()?;
        let pgid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw);
        let name = spec.name.to_string();
        let mut readers = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            readers.push(tokio::spawn(copy_lines(stdout, name.clone(), logs.clone())));
        }
        if let Some(stderr) = child.stderr.take() {
            readers.push(tokio::spawn(copy_lines(stderr, name.clone(), logs.clone())));
        }
        let (exit_tx, exit) = watch::channel(None);
        let monitor_name = name.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            // Let the readers drain what the process wrote before it ended, so its last
            // lines come before the exit note. Bounded: a grandchild holding the pipes
            // open must not hold this up.
            for reader in readers {
                let _ = tokio::time::timeout(Duration::from_secs(1), reader).await;
            }
            match status {
                Ok(status) => {
                    logs.push(&monitor_name, &describe_exit(&status));
                    let _ = exit_tx.send(Some(status));
                    on_exit(status);
                }
                Err(e) => {
                    // wait() fails only if the child was already reaped elsewhere.
                    logs.push(
                        &monitor_name,
                        &format!("could not wait for the process: {e}"),
                    );
                    use std::os::unix::process::ExitStatusExt as _;
                    let status = ExitStatus::from_raw(0x7f00);
                    let _ = exit_tx.send(Some(status));
                    on_exit(status);
                }
            }
        });
        Ok(Self { name, pgid, exit })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the process has ended, and how.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        *self.exit.borrow()
    }

    /// Wait until the process ends, at most `timeout`. Returns its status if it did.
    pub async fn wait(&self, timeout: Duration) -> Option<ExitStatus> {
        let mut exit = self.exit.clone();
        let ended = tokio::time::timeout(timeout, exit.wait_for(Option::is_some)).await;
        match ended {
            Ok(Ok(status)) => *status,
            _ => None,
        }
    }

    /// Stop the process group: SIGINT (what roslaunch and ros2 launch shut down cleanly
    /// on), then SIGKILL to the whole group after `grace`. Afterwards the group gets a
    /// SIGKILL anyway, for stragglers that outlived the leader.
    pub async fn stop(self, grace: Duration) {
        // The group ID is the leader's PID. After the leader is reaped the ID could in
        // theory be reused by a new group, but Linux does not hand out a PID still in use
        // as a group ID, and a freed one is only reused after the PID space wraps.
        let Some(pgid) = self.pgid else {
            return;
        };
        if self.exit_status().is_none() {
            signal_group(pgid, Signal::SIGINT);
            if self.wait(grace).await.is_none() {
                tracing::warn!(process = %self.name, ?grace, "did not stop on SIGINT; killing its process group");
                signal_group(pgid, Signal::SIGKILL);
                self.wait(grace).await;
            }
        }
        signal_group(pgid, Signal::SIGKILL);
    }
}

impl Drop for ManagedProcess {
    /// A process dropped without [`ManagedProcess::stop`] (a controller torn down in a
    /// hurry) must not be left running: kill its group.
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid
            && self.exit_status().is_none()
        {
            signal_group(pgid, Signal::SIGKILL);
        }
    }
}

fn signal_group(pgid: Pid, signal: Signal) {
    // ESRCH: the group is gone already, which is the goal.
    if let Err(e) = killpg(pgid, signal)
        && e != nix::errno::Errno::ESRCH
    {
        tracing::warn!(pgid = pgid.as_raw(), %signal, error = %e, "signal process group");
    }
}

/// Copy `reader` to the log line by line (lossy UTF-8, long lines cut).
async fn copy_lines(reader: impl AsyncRead + Unpin, source: String, logs: Arc<LogRing>) {
    let mut reader = BufReader::new(reader);
    let mut line: Vec<u8> = Vec::new();
    let mut cut = false;
    // A read error ends the copy like end of file: the process's pipe is gone.
    while let Ok(chunk) = reader.fill_buf().await {
        if chunk.is_empty() {
            break;
        }
        let (take, end_of_line) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        let room = MAX_LINE.saturating_sub(line.len());
        line.extend_from_slice(&chunk[..take.min(room)]);
        cut |= take > room;
        reader.consume(if end_of_line { take + 1 } else { take });
        if end_of_line {
            emit(&logs, &source, &mut line, &mut cut);
        }
    }
    if !line.is_empty() {
        emit(&logs, &source, &mut line, &mut cut);
    }
}

fn emit(logs: &LogRing, source: &str, line: &mut Vec<u8>, cut: &mut bool) {
    let mut text = String::from_utf8_lossy(line)
        .trim_end_matches('\r')
        .to_string();
    if *cut {
        text.push_str(" [line cut]");
    }
    logs.push(source, &text);
    line.clear();
    *cut = false;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_the_last_lines() {
        let ring = LogRing::new(3);
        for i in 0..5 {
            ring.push("p", &i.to_string());
        }
        assert_eq!(ring.tail(0), ["[p] 2", "[p] 3", "[p] 4"]);
        assert_eq!(ring.tail(2), ["[p] 3", "[p] 4"]);
        assert_eq!(ring.tail(10).len(), 3);
    }

    #[tokio::test]
    async fn captures_output_and_exit_and_stops_the_group() {
        let logs = LogRing::new(100);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let process = ManagedProcess::spawn(
            Spawn {
                name: "sh",
                program: "sh",
                args: vec![
                    "-c".into(),
                    // A long line, a CR-LF line, then a child that keeps the group alive.
                    "printf 'x%.0s' $(seq 5000); echo; printf 'two\\r\\n' >&2; echo \"$GREETING\"; sleep 60 & wait".into(),
                ],
                env: [("GREETING".to_string(), "hello".to_string())].into(),
            },
            logs.clone(),
            move |status| {
                let _ = tx.send(status);
            },
        )
        .expect("spawn sh");
        // Wait (bounded) for the output to arrive.
        for _ in 0..200 {
            if logs.tail(0).iter().any(|l| l == "[sh] hello") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let lines = logs.tail(0);
        assert!(lines.contains(&"[sh] hello".to_string()), "{lines:?}");
        assert!(lines.contains(&"[sh] two".to_string()), "{lines:?}");
        let long = lines
            .iter()
            .find(|l| l.starts_with("[sh] xxx"))
            .expect("long line");
        assert!(long.ends_with(" [line cut]"));
        assert_eq!(long.len(), "[sh] ".len() + MAX_LINE + " [line cut]".len());
        assert!(process.exit_status().is_none());

        process.stop(Duration::from_secs(5)).await;
        let status = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("exit reported")
            .expect("status");
        assert!(!status.success());
        assert!(
            logs.tail(1)[0].starts_with("[sh] killed by SIGINT"),
            "{:?}",
            logs.tail(1)
        );
    }
}
