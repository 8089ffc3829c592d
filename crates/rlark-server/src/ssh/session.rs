//! One SSH session channel: a shell, a command or the `sftp` subsystem in a replica, run
//! by the replica's agent ([`super::exec`]), with the terminal, its size changes, input,
//! output, the end of input and the exit status carried both ways; or, for the login
//! `menu`, the list of reachable tasks to pick one from.
//!
//! - `shell`: `exec "${SHELL:-/bin/sh}" -l` in the replica, on a terminal when the client
//!   asked for one (`pty-req`; a size of 0 is taken as 80×24).
//! - `exec CMD`: `/bin/sh -c CMD` (as sshd runs it through the user's shell), on a terminal
//!   only with `ssh -t`.
//! - subsystem `sftp`: the replica host's `sftp-server` (OpenSSH's; looked for where
//!   Debian, Fedora and Arch put it), in the replica's working directory — what `sftp` and
//!   the default (SFTP) mode of `scp` use. Other subsystems are refused.
//!
//! Every session is audited when it ends (`action: ssh`): who, with which credential, the
//! task and replica, what ran, bytes in and out, and the exit status (or why it was cut).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use rlark_api::agent::local::{ExecOptions, ExecOutcome, TerminalSize};
use rlark_apiserver::audit::AuditEntry;
use russh::server::Msg;
use russh::{ChannelMsg, ChannelWriteHalf};

use super::SshState;
use super::auth::{Login, Target};
use super::exec::{AgentExec, Output};
use crate::task_access::{self, Replica};

/// The shell a `shell` request runs.
const SHELL: &str = "exec \"${SHELL:-/bin/sh}\" -l";
/// What the `sftp` subsystem runs.
const SFTP: &str = "for p in /usr/lib/openssh/sftp-server /usr/libexec/openssh/sftp-server \
     /usr/lib/ssh/sftp-server /usr/libexec/sftp-server; do [ -x \"$p\" ] && exec \"$p\"; done; \
     echo 'rlark: no sftp-server in this replica (install openssh-sftp-server)' >&2; exit 127";
/// Most input bytes kept while the client has not said what to run yet.
const MAX_EARLY_INPUT: usize = 64 * 1024;
/// How long a client may take to say what to run.
const REQUEST_WAIT: std::time::Duration = std::time::Duration::from_secs(60);
/// The exit status of a session that failed before or instead of a command.
const EXIT_FAILED: u32 = 1;

/// Why a session was cut from outside (revocation, shutdown).
#[derive(Clone)]
pub(crate) struct Closing {
    pub token: tokio_util::sync::CancellationToken,
    pub reason: Arc<std::sync::OnceLock<String>>,
}

impl Closing {
    pub(crate) fn new() -> Closing {
        Closing {
            token: tokio_util::sync::CancellationToken::new(),
            reason: Arc::new(std::sync::OnceLock::new()),
        }
    }

    /// Cut every session of the connection, for `reason`.
    pub(crate) fn close(&self, reason: String) {
        let _ = self.reason.set(reason);
        self.token.cancel();
    }
}

/// What the client asked to run.
enum Request {
    Shell,
    Exec(String),
    Subsystem(String),
}

/// What the session did, for the audit record.
#[derive(Default)]
struct Tally {
    bytes_in: u64,
    bytes_out: u64,
}

/// Serve one session channel until it ends.
pub(crate) async fn run(
    state: Arc<SshState>,
    login: Arc<Login>,
    channel: russh::Channel<Msg>,
    closing: Closing,
) {
    let (mut read, write) = channel.split();
    let started = Instant::now();
    let mut tally = Tally::default();
    let mut pty: Option<TerminalSize> = None;
    let mut early: Vec<u8> = Vec::new();
    let mut early_eof = false;

    // What to run: wait for shell, exec or subsystem (a terminal first, maybe).
    let request = loop {
        let message = tokio::select! {
            message = tokio::time::timeout(REQUEST_WAIT, read.wait()) => message,
            () = closing.token.cancelled() => return,
        };
        match message {
            Ok(Some(ChannelMsg::RequestPty {
                col_width,
                row_height,
                ..
            })) => pty = Some(size(col_width, row_height)),
            Ok(Some(ChannelMsg::RequestShell { .. })) => break Request::Shell,
            Ok(Some(ChannelMsg::Exec { command, .. })) => {
                break Request::Exec(String::from_utf8_lossy(&command).into_owned());
            }
            Ok(Some(ChannelMsg::RequestSubsystem { name, .. })) => break Request::Subsystem(name),
            Ok(Some(ChannelMsg::WindowChange {
                col_width,
                row_height,
                ..
            })) => {
                if pty.is_some() {
                    pty = Some(size(col_width, row_height));
                }
            }
            Ok(Some(ChannelMsg::Data { data })) => {
                if early.len() + data.len() <= MAX_EARLY_INPUT {
                    early.extend_from_slice(&data);
                }
            }
            Ok(Some(ChannelMsg::Eof)) => early_eof = true,
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return,
        }
    };

    let (replica, request) = match (&login.target, &login.task) {
        (Target::Task { index, .. }, Some(task)) => {
            match task_access::running_replica(&*state.store, Arc::clone(task), *index).await {
                Ok(replica) => (replica, request),
                Err(error) => {
                    fail(&write, &error.to_string()).await;
                    audit(
                        &state,
                        &login,
                        None,
                        "none",
                        &tally,
                        &format!("refused: {error}"),
                    );
                    return;
                }
            }
        }
        _ => {
            // The menu: the reachable tasks; with a terminal, pick one for a shell.
            match super::menu::choose(&state, &login, &mut read, &write, pty.is_some()).await {
                Ok(Some((replica, typed))) => {
                    early.extend_from_slice(&typed);
                    (replica, Request::Shell)
                }
                Ok(None) => return,
                Err(error) => {
                    fail(&write, &error).await;
                    return;
                }
            }
        }
    };

    let (what, options) = match &request {
        Request::Shell => ("shell".to_string(), options(SHELL, pty.is_some())),
        Request::Exec(command) => (format!("exec {command:?}"), options(command, pty.is_some())),
        Request::Subsystem(name) if name == "sftp" => ("sftp".to_string(), options(SFTP, false)),
        Request::Subsystem(name) => {
            fail(
                &write,
                &format!("subsystem {name:?} is not served (only sftp)"),
            )
            .await;
            audit(
                &state,
                &login,
                Some(&replica),
                &format!("subsystem {name:?}"),
                &tally,
                "refused",
            );
            return;
        }
    };
    let share = match state
        .hub
        .user_share(replica.cluster(), &login.identity.user)
    {
        Ok(share) => share,
        Err(error) => {
            state.metrics.refused("agent-streams-per-user");
            fail(&write, &error.message).await;
            audit(
                &state,
                &login,
                Some(&replica),
                &what,
                &tally,
                &format!("refused: {}", error.message),
            );
            return;
        }
    };
    let exec = match AgentExec::start(&state.hub, &replica, &options, share).await {
        Ok(exec) => exec,
        Err(error) => {
            fail(&write, &error).await;
            audit(
                &state,
                &login,
                Some(&replica),
                &what,
                &tally,
                &format!("failed: {error}"),
            );
            return;
        }
    };
    tracing::info!(
        user = %login.identity.user,
        namespace = %replica.namespace,
        pod = %replica.pod_name,
        what = %what,
        "ssh session"
    );
    let (mut input, mut output) = exec.split();
    let mut sent_ok = true;
    if let Some(size) = pty.filter(|_| options.tty) {
        sent_ok &= input.resize(size).await.is_ok();
    }
    if !early.is_empty() {
        sent_ok &= input.stdin(&early).await.is_ok();
    }
    if early_eof {
        sent_ok &= input.close_stdin().await.is_ok();
    }
    if !sent_ok {
        tracing::debug!("the agent stopped reading before the session began");
    }
    let bytes_in = std::sync::atomic::AtomicU64::new(early.len() as u64);
    let bytes_out = std::sync::atomic::AtomicU64::new(0);
    let tty = options.tty;

    // The two directions run side by side, so that output waiting for the client's window
    // never stops the client's messages (window adjustments among them) from being read.
    let client_to_agent = async {
        loop {
            match read.wait().await {
                Some(ChannelMsg::Data { data }) => {
                    bytes_in.fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    // An agent that stopped reading has ended the command: the output side
                    // reports how.
                    let _ = input.stdin(&data).await;
                }
                Some(ChannelMsg::Eof) => {
                    let _ = input.close_stdin().await;
                }
                Some(ChannelMsg::WindowChange {
                    col_width,
                    row_height,
                    ..
                }) if tty => {
                    let _ = input.resize(size(col_width, row_height)).await;
                }
                Some(_) => {}
                // The client closed the channel: hang the command up.
                None => return,
            }
        }
    };
    let agent_to_client = async {
        loop {
            match output.next().await {
                Output::Stdout(bytes) => {
                    bytes_out.fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    if write.data_bytes(Bytes::from(bytes.to_vec())).await.is_err() {
                        return None;
                    }
                }
                Output::Stderr(bytes) => {
                    bytes_out.fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    if write
                        .extended_data_bytes(1, Bytes::from(bytes.to_vec()))
                        .await
                        .is_err()
                    {
                        return None;
                    }
                }
                Output::Exited(outcome) => return Some(outcome),
            }
        }
    };
    let outcome = tokio::select! {
        outcome = agent_to_client => outcome,
        () = client_to_agent => None,
        () = closing.token.cancelled() => None,
    };
    tally.bytes_in = bytes_in.into_inner();
    tally.bytes_out = bytes_out.into_inner();
    input.close().await;
    let result = match &outcome {
        Some(ExecOutcome::Exited(code)) => {
            let code = u32::try_from(*code).unwrap_or(EXIT_FAILED);
            let _ = write.exit_status(code).await;
            format!("exit {code}")
        }
        Some(ExecOutcome::Failed { message, .. }) => {
            let _ = write
                .extended_data_bytes(1, Bytes::from(format!("rlark: {message}\r\n")))
                .await;
            let _ = write.exit_status(EXIT_FAILED).await;
            format!("failed: {message}")
        }
        None => match closing.reason.get() {
            Some(reason) if closing.token.is_cancelled() => format!("closed: {reason}"),
            _ => "closed by the client".to_string(),
        },
    };
    let _ = write.eof().await;
    let _ = write.close().await;
    let detail = format!("{result}; {:.1}s", started.elapsed().as_secs_f64());
    audit(&state, &login, Some(&replica), &what, &tally, &detail);
}

/// A terminal size from a client's (0 → 80×24 defaults, clamped to `u16`).
fn size(cols: u32, rows: u32) -> TerminalSize {
    let default = TerminalSize::default();
    let clamp = |v: u32, d: u16| {
        if v == 0 {
            d
        } else {
            u16::try_from(v).unwrap_or(u16::MAX)
        }
    };
    TerminalSize {
        width: clamp(cols, default.width),
        height: clamp(rows, default.height),
    }
}

fn options(script: &str, tty: bool) -> ExecOptions {
    ExecOptions {
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        stdin: true,
        stdout: true,
        stderr: !tty,
        tty,
    }
}

/// Tell the client why nothing runs, and end the channel with a failure status.
async fn fail(write: &ChannelWriteHalf<Msg>, message: &str) {
    let _ = write
        .extended_data_bytes(1, Bytes::from(format!("rlark: {message}\r\n")))
        .await;
    let _ = write.exit_status(EXIT_FAILED).await;
    let _ = write.eof().await;
    let _ = write.close().await;
}

/// The audit record of a session.
fn audit(
    state: &SshState,
    login: &Login,
    replica: Option<&Replica>,
    what: &str,
    tally: &Tally,
    result: &str,
) {
    let (namespace, name) = match replica {
        Some(r) => (r.namespace.clone(), r.pod_name.clone()),
        None => (String::new(), String::new()),
    };
    state.audit.record(AuditEntry {
        verb: "ssh".into(),
        resource: "pods.rlinf.io/ssh".into(),
        namespace,
        name,
        reason: format!(
            "{what} via {}; bytes in {} out {}; {result}",
            login.credential.describe(),
            tally.bytes_in,
            tally.bytes_out
        ),
        ..AuditEntry::now("ssh", "allowed").by(Some(&login.identity))
    });
}
