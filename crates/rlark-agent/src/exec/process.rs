//! An exec's process on the host: started with a PTY or pipes, its output pumped onto the
//! channels, its initial terminal size, and hanging up its process group or session.

use rlark_process::CleanSignals as _;
use std::ffi::OsString;
use std::io;
use std::path::Path;
use std::process::Stdio;

use futures::StreamExt as _;
use hyper_util::rt::TokioIo;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use rlark_api::agent::local::{
    Channel, ExecOptions, ExecOutcome, TerminalSize, decode_frame, encode_frame,
};
use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;

use crate::runtime::docker::DockerClient;

use super::target::ProcessTarget;
use super::{CHUNK, GONE_POLL, HANGUP_GRACE, INITIAL_SIZE_WAIT};

/// The write side of the process's input.
pub(super) enum Input {
    /// Stdin was not asked for (or was closed).
    None,
    Pipe(tokio::process::ChildStdin),
    Pty(pty_process::OwnedWritePty),
    /// The engine's exec stream of a container replica (`None` once stdin was closed) and
    /// what resizes its terminal.
    Docker {
        write: Option<tokio::io::WriteHalf<TokioIo<hyper::upgrade::Upgraded>>>,
        exec: String,
        client: DockerClient,
        tty: bool,
    },
}

/// A started process.
pub(super) struct Started {
    pub(super) child: tokio::process::Child,
    /// Its process group (and, with a PTY, session) id.
    pub(super) leader: i32,
    /// Whether it leads a session (PTY) rather than only a process group.
    pub(super) session: bool,
    pub(super) input: Input,
    /// Readers of its output; each ends at end of file.
    pub(super) readers: Vec<JoinHandle<()>>,
}

/// Start the command; output goes to `out` as encoded messages.
pub(super) fn start(
    options: &ExecOptions,
    target: &ProcessTarget,
    size: TerminalSize,
    out: &mpsc::Sender<Vec<u8>>,
) -> Result<Started, String> {
    let spawn_error = |e: &dyn std::fmt::Display| {
        format!(
            "start {:?} in {}: {e}",
            options.command[0],
            target.cwd.display()
        )
    };
    // An isolated replica, or one in a Domain's namespaces, is entered through its
    // supervisor (see `ProcessTarget::enter`).
    let (argv, cwd): (Vec<OsString>, &Path) = match &target.enter {
        None => (
            options.command.iter().map(OsString::from).collect(),
            &target.cwd,
        ),
        Some(enter) => (
            crate::runtime::sandbox::enter_argv(
                &enter.supervisor,
                enter.pid,
                enter.sandbox_file.as_deref(),
                &target.cwd,
                &options.command,
            ),
            Path::new("/"),
        ),
    };
    let Some((program, args)) = argv.split_first() else {
        return Err("no command to start".to_string());
    };
    if target.enter.is_some() {
        // The helper that enters the sandbox starts whatever the command is; a command that
        // does not exist must still read as a start failure (127), as it does unisolated.
        let path = target
            .env
            .iter()
            .rev()
            .find(|(name, _)| name == "PATH")
            .map(|(_, value)| value.as_os_str());
        if crate::runtime::resolve_program(&options.command[0], &target.cwd, path).is_err() {
            return Err(spawn_error(&io::Error::from(nix::errno::Errno::ENOENT)));
        }
    }
    if options.tty {
        let (pty, pts) = pty_process::open().map_err(|e| format!("allocate a terminal: {e}"))?;
        pty.resize(pty_process::Size::new(size.height, size.width))
            .map_err(|e| format!("size the terminal: {e}"))?;
        let mut env = target.env.clone();
        if !env.iter().any(|(name, _)| name == "TERM") {
            env.push(("TERM".into(), "xterm".into()));
        }
        let command = pty_process::Command::new(program)
            .args(args)
            .current_dir(cwd)
            .env_clear()
            .envs(env);
        let child = rlark_process::clean_pty(command)
            .spawn(pts)
            .map_err(|e| spawn_error(&e))?;
        let leader = leader_of(&child)?;
        let (read, write) = pty.into_split();
        let readers = vec![tokio::spawn(pump(read, Channel::Stdout, out.clone()))];
        // Kept for resizes even without stdin (`read_in` then writes nothing to it).
        return Ok(Started {
            child,
            leader,
            session: true,
            input: Input::Pty(write),
            readers,
        });
    }
    let piped = |on: bool| if on { Stdio::piped() } else { Stdio::null() };
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .current_dir(cwd)
        .env_clear()
        .envs(target.env.iter().map(|(k, v)| (k, v)))
        .process_group(0)
        .stdin(piped(options.stdin))
        .stdout(piped(options.stdout))
        .stderr(piped(options.stderr))
        .clean_signals()
        .spawn()
        .map_err(|e| spawn_error(&e))?;
    let leader = leader_of(&child)?;
    let mut readers = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        readers.push(tokio::spawn(pump(stdout, Channel::Stdout, out.clone())));
    }
    if let Some(stderr) = child.stderr.take() {
        readers.push(tokio::spawn(pump(stderr, Channel::Stderr, out.clone())));
    }
    let input = match child.stdin.take() {
        Some(stdin) => Input::Pipe(stdin),
        None => Input::None,
    };
    Ok(Started {
        child,
        leader,
        session: false,
        input,
        readers,
    })
}

fn leader_of(child: &tokio::process::Child) -> Result<i32, String> {
    child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .filter(|pid| *pid > 1)
        .ok_or_else(|| "the started process has no pid".to_string())
}

/// Copy `source` to `out` as `channel` messages until end of file (a PTY whose other side
/// is closed reads EIO: also the end) or until `out` is closed.
pub(super) async fn pump<R: AsyncRead + Unpin>(
    mut source: R,
    channel: Channel,
    out: mpsc::Sender<Vec<u8>>,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match source.read(&mut buf).await {
            Ok(0) => return,
            Ok(n) => {
                if out.send(encode_frame(channel, &buf[..n])).await.is_err() {
                    return;
                }
            }
            Err(e) if e.raw_os_error() == Some(nix::errno::Errno::EIO as i32) => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => {
                tracing::debug!(%error, ?channel, "exec output ended");
                return;
            }
        }
    }
}

/// Why a session ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ended {
    /// The process ended (or could not start); the outcome was sent.
    Finished(ExecOutcome),
    /// The client went away; the process was killed.
    ClientGone,
    /// The agent is stopping; the process was killed.
    Shutdown,
}

/// With a terminal, the client's first message is normally its size: wait for it up to
/// [`INITIAL_SIZE_WAIT`]. Returns the size (the default when none came) and the first
/// message when it was something else, to be handled as input; `None` when the client
/// went away meanwhile.
pub(super) async fn initial_size<T>(
    options: &ExecOptions,
    source: &mut T,
) -> Option<(TerminalSize, Option<Message>)>
where
    T: futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    if !options.tty {
        return Some((TerminalSize::default(), None));
    }
    match tokio::time::timeout(INITIAL_SIZE_WAIT, source.next()).await {
        Err(_) => Some((TerminalSize::default(), None)),
        Ok(None | Some(Err(_))) => None,
        Ok(Some(Ok(message))) => {
            let resize = match &message {
                Message::Binary(bytes) => match decode_frame(bytes) {
                    Ok((Channel::Resize, payload)) => TerminalSize::parse(payload).ok(),
                    _ => None,
                },
                _ => None,
            };
            Some(match resize {
                Some(initial) => (initial, None),
                None => (TerminalSize::default(), Some(message)),
            })
        }
    }
}

/// Live (not zombie) members of process group `leader` and, when `session`, of the
/// session `leader` leads.
pub(super) fn members(leader: i32, session: bool) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(stat) = rlark_process::read_stat(*pid) else {
                return false;
            };
            let live = !matches!(stat.state, 'Z' | 'X');
            live && (stat.pgrp == leader || (session && stat.session == leader))
        })
        .map(Pid::from_raw)
        .collect()
}

/// Send `signal` to the group `leader` and every member of its session (when `session`).
pub(super) fn signal_members(leader: i32, session: bool, signal: Signal) {
    if let Err(error) = crate::runtime::process::signal_group(leader, signal) {
        tracing::debug!(%error, pgid = leader, ?signal, "signal exec process group");
    }
    if session {
        for pid in members(leader, true) {
            let _ = nix::sys::signal::kill(pid, signal);
        }
    }
}

/// SIGHUP, then SIGKILL after [`HANGUP_GRACE`] unless everything is gone by then.
pub(super) async fn hang_up(leader: i32, session: bool) {
    signal_members(leader, session, Signal::SIGHUP);
    let until = tokio::time::Instant::now() + HANGUP_GRACE;
    while tokio::time::Instant::now() < until {
        let gone = tokio::task::spawn_blocking(move || members(leader, session).is_empty());
        if gone.await.unwrap_or(false) {
            return;
        }
        tokio::time::sleep(GONE_POLL).await;
    }
    signal_members(leader, session, Signal::SIGKILL);
}
