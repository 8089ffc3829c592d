//! Exec into a running replica: `GET /exec/{namespace}/{pod}?command=...&stdin=..&stdout=..
//! &stderr=..&tty=..` on the agent's local API (`api.rs`), a WebSocket speaking
//! Kubernetes' remotecommand protocol (`v5.channel.k8s.io`, else `v4.channel.k8s.io`; the
//! vocabulary is `rlark_api::agent::local`). Like the rest of the local API it is reached
//! only through the tunnel; the hub authorizes the caller (admins only) before it opens the
//! stream.
//!
//! # What runs
//!
//! In an isolated replica (`REPLICA_DIR/sandbox.json`, docs/security.md, "Replica
//! isolation") the command runs through the supervisor's `--enter`: in the replica's
//! network and mount namespaces and control groups, as its user; otherwise it runs as the
//! agent's user. Either way it starts in the replica's **current** working
//! directory with the replica's **environment** (the Task's `environment` and the `RLARK_*`
//! contract): both are read from `/proc/<pid>/cwd` and `/proc/<pid>/environ` of the process
//! the replica's `state.json` names, which must be live (else `409`). When `/proc` cannot
//! be read (another user, a vanished process), the fallback is the replica's `work/`
//! directory and the agent's own environment plus the `RLARK_*` variables `state.json`
//! knows (`RLARK_NAMESPACE`, `RLARK_TASK`, `RLARK_TASK_UID`, `RLARK_POD_NAME`,
//! `RLARK_REPLICA_INDEX`).
//!
//! - `tty=true`: the process gets a new PTY as controlling terminal, is the leader of a new
//!   session, and has `TERM=xterm` unless the environment sets `TERM`. Its initial size is
//!   the first resize message when one arrives within [`INITIAL_SIZE_WAIT`] of the upgrade
//!   (clients send it first), else 80×24; later resize messages resize the PTY (`SIGWINCH`).
//!   Stdin bytes go to the PTY; everything the PTY prints goes out on channel 1 (stderr is
//!   merged, as in Kubernetes). A terminal has no end of input: closing channel 0 is
//!   ignored (send `exit` or `^D`).
//! - `tty=false`: pipes, the process leads a new process group. Stdout goes out on
//!   channel 1, stderr on channel 2 (each only if asked for, else `/dev/null`); with
//!   `stdin=true` channel 0 feeds its stdin, and a v5 close of channel 0 closes it (`cat`
//!   sees its end of input). Without `stdin=true` its stdin is `/dev/null`.
//!
//! # Lifecycle
//!
//! - When the process exits, whatever is left of its process group (and, with a PTY, its
//!   session) is killed (SIGKILL) — an exec leaves nothing behind, as a replica does not —,
//!   the output is sent to its end (at most [`DRAIN_TIMEOUT`] more), then the status on
//!   channel 3 (`Success`, or `NonZeroExitCode` with the code; `128+n` for a signal `n`), then
//!   a normal WebSocket close; the connection ends once the client answered it (at most
//!   [`CLOSE_TIMEOUT`]).
//! - A program that cannot be started gets a `Failure` status (reason `InternalError`)
//!   naming the problem, then the close.
//! - When the client goes away (close message, error, the tunnel stream ends) or the agent
//!   stops, the process group (and session) gets SIGHUP, then SIGKILL after [`HANGUP_GRACE`]:
//!   no orphan is left.
//! - Messages are at most [`MAX_EXEC_MESSAGE`] bytes; output is sent in pieces of at most
//!   [`CHUNK`] bytes through a bounded queue, so a slow client slows the process down
//!   instead of growing a buffer.
//!
//! # Errors before the upgrade
//!
//! `400` for a bad name, query or upgrade request (each named), `404` when the replica never
//! ran on this agent, `409` when it is not running (no live process), `405` for a method other
//! than `GET`.

use rlark_process::CleanSignals as _;
use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStringExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use rlark_api::agent::local::{
    Channel, ExecOptions, ExecOutcome, MAX_EXEC_MESSAGE, TerminalSize, decode_frame, encode_frame,
};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_util::sync::CancellationToken;

use rlark_api::agent::parse_pod_name;

use crate::api_body::{ApiBody, text_response};
use crate::runs::{container_param, find_runs};
use crate::runtime::docker::logs::Demux;
use crate::runtime::docker::{DockerClient, container_index};
use crate::runtime::sandbox::{SANDBOX_FILE, Sandbox};
use crate::tasks::{ReplicaState, STATE_FILE};

/// Path prefix of the exec route on the local API.
pub const EXEC_PREFIX: &str = "/exec/";
/// How long a terminal session waits for the client's first resize before it starts the
/// process at 80×24.
pub const INITIAL_SIZE_WAIT: Duration = Duration::from_millis(250);
/// SIGHUP → SIGKILL grace when the client goes away.
pub const HANGUP_GRACE: Duration = Duration::from_secs(2);
/// How long output is still read once the process (and its group) has exited.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest piece of output sent in one message.
pub const CHUNK: usize = 32 * 1024;
/// Output messages queued towards the client.
const OUT_QUEUE: usize = 8;
/// How long the final status and close may take to leave, and the client's close to
/// answer.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a dying process group is checked.
const GONE_POLL: Duration = Duration::from_millis(50);
/// Most of `/proc/<pid>/environ` read.
const MAX_ENVIRON: u64 = 4 * 1024 * 1024;

/// WebSocket limits of an exec session: [`MAX_EXEC_MESSAGE`] per message and frame.
pub fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_EXEC_MESSAGE))
        .max_frame_size(Some(MAX_EXEC_MESSAGE))
}

/// Answer `GET /exec/{namespace}/{pod}?...` (see the module documentation): a `101` whose
/// upgraded connection then carries the session, or an error response.
pub(crate) async fn handle<B>(
    tasks_dir: &Path,
    node: &str,
    docker: Option<&DockerClient>,
    supervisor: Option<&[OsString]>,
    shutdown: &CancellationToken,
    mut request: http::Request<B>,
) -> http::Response<ApiBody> {
    let path = request.uri().path().to_string();
    if request.method() != http::Method::GET {
        return text_response(
            http::StatusCode::METHOD_NOT_ALLOWED,
            format!(
                "{} is not allowed: exec is GET with a WebSocket upgrade",
                request.method()
            ),
        );
    }
    let Some((namespace, pod)) = path
        .strip_prefix(EXEC_PREFIX)
        .and_then(|rest| rest.split_once('/'))
        .filter(|(_, pod)| !pod.contains('/'))
    else {
        return text_response(
            http::StatusCode::NOT_FOUND,
            format!("not found: {path}; use GET /exec/{{namespace}}/{{pod}}"),
        );
    };
    if let Err(e) = rlark_api::names::dns1123_label(namespace) {
        return text_response(
            http::StatusCode::BAD_REQUEST,
            format!("invalid namespace {namespace:?}: {e}"),
        );
    }
    if let Err(e) = rlark_api::names::dns1123_subdomain(pod) {
        return text_response(
            http::StatusCode::BAD_REQUEST,
            format!("invalid pod name {pod:?}: {e}"),
        );
    }
    let options = match ExecOptions::parse(request.uri().query()) {
        Ok(options) => options,
        Err(message) => return text_response(http::StatusCode::BAD_REQUEST, message),
    };
    let container = match container_param(request.uri().query()) {
        Ok(container) => container,
        Err(message) => return text_response(http::StatusCode::BAD_REQUEST, message),
    };
    let upgrade = match rlark_api::agent::local::exec_upgrade(request.headers()) {
        Ok(upgrade) => upgrade,
        Err(message) => return text_response(http::StatusCode::BAD_REQUEST, message),
    };
    let Some((task, index)) = parse_pod_name(pod) else {
        return text_response(
            http::StatusCode::NOT_FOUND,
            format!(
                "pod {namespace}/{pod} is not a replica of a task (replica pods are named \
                 <task>-<index>)"
            ),
        );
    };
    let (dir, ns, task_name) = (
        tasks_dir.to_path_buf(),
        namespace.to_string(),
        task.to_string(),
    );
    let runs = tokio::task::spawn_blocking(move || find_runs(&dir, &ns, &task_name, index))
        .await
        .unwrap_or_default();
    let Some(run) = runs.first() else {
        return text_response(
            http::StatusCode::NOT_FOUND,
            format!(
                "pod {namespace}/{pod}: replica {index} of task {task:?} has not run on node \
                 {node:?}"
            ),
        );
    };
    if !run.running {
        return text_response(
            http::StatusCode::CONFLICT,
            format!(
                "pod {namespace}/{pod}: replica {index} of task {task:?} is not running on node \
                 {node:?} (no live process to exec into)"
            ),
        );
    }
    let run_dir = run.dir.clone();
    let mut target = match tokio::task::spawn_blocking(move || ProcessTarget::of(&run_dir)).await {
        Ok(Ok(target)) => target,
        Ok(Err(message)) => return text_response(http::StatusCode::CONFLICT, message),
        Err(e) => return text_response(http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    if let Some(enter) = target.enter.as_mut() {
        match supervisor {
            Some(command) if !command.is_empty() => enter.supervisor = command.to_vec(),
            _ => {
                return text_response(
                    http::StatusCode::INTERNAL_SERVER_ERROR,
                    format!(
                        "pod {namespace}/{pod}: replica {index} of task {task:?} is isolated \
                         and this agent has no supervisor command to enter it with"
                    ),
                );
            }
        }
    }
    // `-c NAME`: that container of a docker replica (a sidecar), else the main one.
    match container_index(&target.container_names, container.as_deref()) {
        Ok(i) => target.container = target.containers.get(i).cloned(),
        Err(message) => {
            return text_response(
                http::StatusCode::BAD_REQUEST,
                format!("pod {namespace}/{pod}: {message}"),
            );
        }
    }
    let engine = match (&target.container, docker) {
        (None, _) => None,
        (Some(_), Some(client)) => Some(client.clone()),
        (Some(container), None) => {
            return text_response(
                http::StatusCode::CONFLICT,
                format!(
                    "pod {namespace}/{pod}: replica {index} of task {task:?} runs in container \
                     {container}, and this agent has no Docker engine to exec through"
                ),
            );
        }
    };
    tracing::info!(
        namespace,
        pod,
        command = ?options.command,
        tty = options.tty,
        stdin = options.stdin,
        "exec"
    );

    let on_upgrade = hyper::upgrade::on(&mut request);
    let shutdown = shutdown.clone();
    let what = format!("{namespace}/{pod}");
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let ws = WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    Role::Server,
                    Some(ws_config()),
                )
                .await;
                let outcome = match (engine, target.container.clone()) {
                    (Some(client), Some(container)) => {
                        let session = DockerSession { client, container };
                        run_docker_session(ws, upgrade.protocol, options, session, shutdown).await
                    }
                    _ => run_session(ws, upgrade.protocol, options, target, shutdown).await,
                };
                tracing::info!(pod = %what, outcome = ?outcome, "exec ended");
            }
            Err(error) => tracing::debug!(%error, pod = %what, "exec upgrade failed"),
        }
    });
    switching_protocols(&upgrade)
}

/// The `101` accepting the exec WebSocket `upgrade` asks for.
pub(crate) fn switching_protocols(
    upgrade: &rlark_api::agent::local::ExecUpgrade,
) -> http::Response<ApiBody> {
    let accept =
        tokio_tungstenite::tungstenite::handshake::derive_accept_key(upgrade.key.as_bytes());
    let mut response = http::Response::new(ApiBody::default());
    *response.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("Upgrade"),
    );
    headers.insert(
        http::header::UPGRADE,
        http::HeaderValue::from_static("websocket"),
    );
    headers.insert(
        http::header::SEC_WEBSOCKET_PROTOCOL,
        http::HeaderValue::from_static(upgrade.protocol),
    );
    match http::HeaderValue::from_str(&accept) {
        Ok(value) => {
            headers.insert(http::header::SEC_WEBSOCKET_ACCEPT, value);
        }
        Err(e) => return text_response(http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
    response
}

/// Where and how the exec'd process runs: the replica's working directory and environment.
#[derive(Clone, Debug)]
struct ProcessTarget {
    cwd: PathBuf,
    env: Vec<(OsString, OsString)>,
    /// The container of a container replica the command runs in (the main one unless
    /// the request names another), through the engine's exec API (its working directory
    /// and environment are the container's).
    container: Option<String>,
    /// Engine ids of the replica's containers, main first (empty for processes).
    containers: Vec<String>,
    /// Their names in the Task, in the same order.
    container_names: Vec<String>,
    /// An isolated replica ([`crate::runtime::sandbox`]): its process and sandbox file,
    /// and the supervisor command that enters it. The command then runs through
    /// [`crate::runtime::sandbox::enter_argv`], never as the agent's user.
    enter: Option<Enter>,
}

/// How a command gets into an isolated replica.
#[derive(Clone, Debug)]
struct Enter {
    pid: u32,
    sandbox_file: PathBuf,
    supervisor: Vec<OsString>,
}

impl ProcessTarget {
    /// Read the live replica process of `run_dir` (see the module documentation); an error
    /// when its state file is gone meanwhile.
    fn of(run_dir: &Path) -> Result<ProcessTarget, String> {
        let state = ReplicaState::read(&run_dir.join(STATE_FILE)).map_err(|e| {
            format!(
                "the replica in {} is not running any more ({STATE_FILE}: {e})",
                run_dir.display()
            )
        })?;
        let proc_dir = PathBuf::from(format!("/proc/{}", state.pid));
        let cwd = std::fs::read_link(proc_dir.join("cwd"))
            .ok()
            .filter(|cwd| cwd.is_dir())
            .unwrap_or_else(|| run_dir.join("work"));
        let env = read_environ(&proc_dir.join("environ"))
            .ok()
            .filter(|env| !env.is_empty())
            .unwrap_or_else(|| fallback_env(&state));
        let enter = Sandbox::read(run_dir)
            .map_err(|e| e.to_string())?
            .map(|_| Enter {
                pid: state.pid,
                sandbox_file: run_dir.join(SANDBOX_FILE),
                supervisor: Vec::new(),
            });
        Ok(ProcessTarget {
            cwd,
            env,
            container: state.containers.first().cloned(),
            containers: state.containers.clone(),
            container_names: state.container_names.clone(),
            enter,
        })
    }
}

/// `NAME=VALUE\0...` of a process.
fn read_environ(path: &Path) -> io::Result<Vec<(OsString, OsString)>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_ENVIRON)
        .read_to_end(&mut bytes)?;
    Ok(bytes
        .split(|b| *b == 0)
        .filter_map(|entry| {
            let at = entry.iter().position(|b| *b == b'=').filter(|at| *at > 0)?;
            Some((
                OsString::from_vec(entry[..at].to_vec()),
                OsString::from_vec(entry[at + 1..].to_vec()),
            ))
        })
        .collect())
}

/// The agent's environment plus the `RLARK_*` variables the state file knows.
fn fallback_env(state: &ReplicaState) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    for (name, value) in [
        ("RLARK_NAMESPACE", state.namespace.clone()),
        ("RLARK_TASK", state.task.clone()),
        ("RLARK_TASK_UID", state.uid.clone()),
        (
            "RLARK_POD_NAME",
            crate::tasks::pod_name(&state.task, state.index),
        ),
        ("RLARK_REPLICA_INDEX", state.index.to_string()),
    ] {
        env.push((name.into(), value.into()));
    }
    env
}

/// The write side of the process's input.
enum Input {
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
struct Started {
    child: tokio::process::Child,
    /// Its process group (and, with a PTY, session) id.
    leader: i32,
    /// Whether it leads a session (PTY) rather than only a process group.
    session: bool,
    input: Input,
    /// Readers of its output; each ends at end of file.
    readers: Vec<JoinHandle<()>>,
}

/// Start the command; output goes to `out` as encoded messages.
fn start(
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
    // An isolated replica is entered through its supervisor (see `ProcessTarget::enter`).
    let (argv, cwd): (Vec<OsString>, &Path) = match &target.enter {
        None => (
            options.command.iter().map(OsString::from).collect(),
            &target.cwd,
        ),
        Some(enter) => (
            crate::runtime::sandbox::enter_argv(
                &enter.supervisor,
                enter.pid,
                &enter.sandbox_file,
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
async fn pump<R: AsyncRead + Unpin>(mut source: R, channel: Channel, out: mpsc::Sender<Vec<u8>>) {
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
enum Ended {
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
async fn initial_size<T>(
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

/// Run one exec session on an upgraded connection (see the module documentation).
async fn run_session<S>(
    ws: WebSocketStream<S>,
    protocol: &'static str,
    options: ExecOptions,
    target: ProcessTarget,
    shutdown: CancellationToken,
) -> Ended
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sink, mut source) = ws.split();
    let Some((size, first)) = initial_size(&options, &mut source).await else {
        return Ended::ClientGone;
    };

    let gone = CancellationToken::new();
    let (out_tx, out_rx) = mpsc::channel::<Vec<u8>>(OUT_QUEUE);
    let writer = AbortOnDrop(tokio::spawn(write_out(sink, out_rx, gone.clone())));
    let started = match start(&options, &target, size, &out_tx) {
        Ok(started) => started,
        Err(message) => {
            let outcome = ExecOutcome::Failed {
                reason: "InternalError".into(),
                message,
            };
            let _ = out_tx
                .send(encode_frame(Channel::Error, &outcome.to_status()))
                .await;
            drop(out_tx);
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, writer.join()).await;
            // The client's close answers ours (`read_in` is not running yet: read it here).
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
                while let Some(Ok(message)) = source.next().await {
                    if message.is_close() {
                        return;
                    }
                }
            })
            .await;
            return Ended::Finished(outcome);
        }
    };
    let Started {
        mut child,
        leader,
        session,
        input,
        readers,
    } = started;
    let readers: Vec<AbortOnDrop> = readers.into_iter().map(AbortOnDrop).collect();
    let _input = AbortOnDrop(tokio::spawn(read_in(
        source,
        first,
        input,
        options.stdin,
        protocol,
        gone.clone(),
    )));

    let status = tokio::select! {
        status = child.wait() => Some(status),
        () = gone.cancelled() => None,
        () = shutdown.cancelled() => None,
    };
    let Some(status) = status else {
        // The client went away or the agent stops: hang up on everything the exec started.
        hang_up(leader, session).await;
        if tokio::time::timeout(HANGUP_GRACE, child.wait())
            .await
            .is_err()
        {
            tracing::warn!(pid = leader, "exec process not reaped after SIGKILL");
        }
        return if shutdown.is_cancelled() {
            Ended::Shutdown
        } else {
            Ended::ClientGone
        };
    };
    // Leftovers of the group (and session) would keep the output open: gone with the
    // process, as a replica's are.
    signal_members(leader, session, Signal::SIGKILL);
    let outcome = match status {
        Ok(status) => {
            use std::os::unix::process::ExitStatusExt as _;
            ExecOutcome::Exited(
                status
                    .code()
                    .or_else(|| status.signal().map(|s| 128 + s))
                    .unwrap_or(1),
            )
        }
        Err(e) => ExecOutcome::Failed {
            reason: "InternalError".into(),
            message: format!("wait for the process: {e}"),
        },
    };
    let drained = tokio::time::timeout(
        DRAIN_TIMEOUT,
        futures::future::join_all(readers.into_iter().map(AbortOnDrop::join)),
    )
    .await;
    if drained.is_err() {
        tracing::debug!(pid = leader, "exec output still open after the exit; cut");
    }
    if out_tx
        .send(encode_frame(Channel::Error, &outcome.to_status()))
        .await
        .is_ok()
    {
        drop(out_tx);
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, writer.join()).await;
        // Keep the connection until the client answers the close (`read_in` sees it).
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, gone.cancelled()).await;
    }
    Ended::Finished(outcome)
}

/// The container a session execs into.
struct DockerSession {
    client: DockerClient,
    container: String,
}

/// Run one exec session in a container replica through the engine's exec API: the same
/// protocol, statuses and lifecycle as [`run_session`], the process being the engine's
/// (`POST /containers/{id}/exec`, then `/exec/{id}/start` with the connection hijacked; a
/// terminal is sized through `/exec/{id}/resize`). When the client goes away the process
/// gets SIGHUP, then SIGKILL after [`HANGUP_GRACE`] (by its host pid, which the engine
/// reports).
async fn run_docker_session<S>(
    ws: WebSocketStream<S>,
    protocol: &'static str,
    options: ExecOptions,
    session: DockerSession,
    shutdown: CancellationToken,
) -> Ended
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sink, mut source) = ws.split();
    let Some((size, first)) = initial_size(&options, &mut source).await else {
        return Ended::ClientGone;
    };
    let gone = CancellationToken::new();
    let (out_tx, out_rx) = mpsc::channel::<Vec<u8>>(OUT_QUEUE);
    let writer = AbortOnDrop(tokio::spawn(write_out(sink, out_rx, gone.clone())));
    let DockerSession { client, container } = session;
    let started = async {
        let exec = client
            .exec_create(
                &container,
                &options.command,
                options.stdin,
                options.stdout,
                options.stderr,
                options.tty,
            )
            .await?;
        let stream = client.exec_start(&exec, options.tty).await?;
        Ok::<_, crate::runtime::docker::DockerError>((exec, stream))
    }
    .await;
    let (exec, stream) = match started {
        Ok(started) => started,
        Err(error) => {
            let outcome = ExecOutcome::Failed {
                reason: "InternalError".into(),
                message: format!(
                    "exec {:?} in container {container}: {error}",
                    options.command
                ),
            };
            let _ = out_tx
                .send(encode_frame(Channel::Error, &outcome.to_status()))
                .await;
            drop(out_tx);
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, writer.join()).await;
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
                while let Some(Ok(message)) = source.next().await {
                    if message.is_close() {
                        return;
                    }
                }
            })
            .await;
            return Ended::Finished(outcome);
        }
    };
    if options.tty
        && let Err(error) = client.exec_resize(&exec, size.height, size.width).await
    {
        tracing::debug!(%error, "exec initial size");
    }
    let (read, write) = tokio::io::split(stream);
    let mut reader = AbortOnDrop(tokio::spawn(pump_engine(read, options.tty, out_tx.clone())));
    let input = Input::Docker {
        write: options.stdin.then_some(write),
        exec: exec.clone(),
        client: client.clone(),
        tty: options.tty,
    };
    let _input = AbortOnDrop(tokio::spawn(read_in(
        source,
        first,
        input,
        options.stdin,
        protocol,
        gone.clone(),
    )));
    let ended = tokio::select! {
        _ = &mut reader.0 => true,
        () = gone.cancelled() => false,
        () = shutdown.cancelled() => false,
    };
    if !ended {
        hang_up_exec(&client, &exec).await;
        return if shutdown.is_cancelled() {
            Ended::Shutdown
        } else {
            Ended::ClientGone
        };
    }
    // The output ended: the process exited (the engine may take a moment to say so).
    let until = tokio::time::Instant::now() + DRAIN_TIMEOUT;
    let outcome = loop {
        match client.exec_inspect(&exec).await {
            Ok(state) if !state.running => {
                let code = state
                    .exit_code
                    .and_then(|c| i32::try_from(c).ok())
                    .unwrap_or(1);
                break ExecOutcome::Exited(code);
            }
            Ok(_) if tokio::time::Instant::now() < until => {
                tokio::time::sleep(GONE_POLL).await;
            }
            Ok(_) => {
                break ExecOutcome::Failed {
                    reason: "InternalError".into(),
                    message: "the exec's output ended but the engine says it still runs"
                        .to_string(),
                };
            }
            Err(error) => {
                break ExecOutcome::Failed {
                    reason: "InternalError".into(),
                    message: format!("read the exec's exit code: {error}"),
                };
            }
        }
    };
    if out_tx
        .send(encode_frame(Channel::Error, &outcome.to_status()))
        .await
        .is_ok()
    {
        drop(out_tx);
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, writer.join()).await;
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, gone.cancelled()).await;
    }
    Ended::Finished(outcome)
}

/// Copy an engine exec stream to `out`: raw bytes (a terminal) to channel 1, or the
/// multiplexed frames (stream 1 stdout, 2 stderr) to channels 1 and 2.
async fn pump_engine<R: AsyncRead + Unpin>(mut source: R, tty: bool, out: mpsc::Sender<Vec<u8>>) {
    if tty {
        return pump(source, Channel::Stdout, out).await;
    }
    let mut demux = Demux::default();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match source.read(&mut buf).await {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => {
                tracing::debug!(%error, "exec output ended");
                return;
            }
        };
        demux.push(&buf[..n]);
        loop {
            let (stream, payload) = match demux.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(error) => {
                    tracing::warn!(%error, "exec output is corrupt");
                    return;
                }
            };
            let channel = if stream == 2 {
                Channel::Stderr
            } else {
                Channel::Stdout
            };
            for piece in payload.chunks(CHUNK) {
                if out.send(encode_frame(channel, piece)).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// SIGHUP to an exec's process, SIGKILL after [`HANGUP_GRACE`] unless it ended.
async fn hang_up_exec(client: &DockerClient, exec: &str) {
    let pid = match client.exec_inspect(exec).await {
        Ok(state) if state.running && state.pid > 1 => state.pid,
        Ok(_) => return,
        Err(error) => {
            tracing::warn!(%error, exec, "cannot find the exec's process to end it");
            return;
        }
    };
    let Ok(pid) = i32::try_from(pid) else {
        return;
    };
    let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGHUP);
    let until = tokio::time::Instant::now() + HANGUP_GRACE;
    while tokio::time::Instant::now() < until {
        if matches!(client.exec_inspect(exec).await, Ok(state) if !state.running) {
            return;
        }
        tokio::time::sleep(GONE_POLL).await;
    }
    let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
}

/// Send queued messages to the client; once the queue is closed, a normal close. Cancels
/// `gone` when the client cannot be written to.
async fn write_out<S>(
    mut sink: futures::stream::SplitSink<WebSocketStream<S>, Message>,
    mut queue: mpsc::Receiver<Vec<u8>>,
    gone: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    while let Some(message) = queue.recv().await {
        if let Err(error) = sink.send(Message::Binary(Bytes::from(message))).await {
            tracing::debug!(%error, "exec client went away (write)");
            gone.cancel();
            return;
        }
    }
    let close = CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    };
    if let Err(error) = sink.send(Message::Close(Some(close))).await {
        tracing::debug!(%error, "exec close");
    }
    let _ = sink.close().await;
}

/// Apply the client's messages: stdin, resizes, the close of stdin. Cancels `gone` when the
/// client goes away (close message, error, end of stream).
async fn read_in<S>(
    mut source: futures::stream::SplitStream<WebSocketStream<S>>,
    first: Option<Message>,
    mut input: Input,
    stdin: bool,
    protocol: &'static str,
    gone: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut next = first;
    loop {
        let message = match next.take() {
            Some(message) => message,
            None => match source.next().await {
                Some(Ok(message)) => message,
                Some(Err(error)) => {
                    tracing::debug!(%error, "exec client went away (read)");
                    gone.cancel();
                    return;
                }
                None => {
                    gone.cancel();
                    return;
                }
            },
        };
        let bytes = match message {
            Message::Binary(bytes) => bytes,
            Message::Close(_) => {
                gone.cancel();
                return;
            }
            // Pings are answered by tungstenite; text (the base64 protocols) is not served.
            _ => continue,
        };
        let (channel, payload) = match decode_frame(&bytes) {
            Ok(frame) => frame,
            Err(error) => {
                tracing::debug!(%error, "exec message ignored");
                continue;
            }
        };
        match channel {
            Channel::Stdin if stdin => {
                let written = match &mut input {
                    Input::Pipe(pipe) => pipe.write_all(payload).await,
                    Input::Pty(pty) => pty.write_all(payload).await,
                    Input::Docker {
                        write: Some(write), ..
                    } => write.write_all(payload).await,
                    Input::Docker { write: None, .. } | Input::None => Ok(()),
                };
                if let Err(error) = written {
                    // The process closed its input (or exited): later stdin goes nowhere.
                    tracing::debug!(%error, "exec stdin closed by the process");
                    if matches!(input, Input::Pipe(_)) {
                        input = Input::None;
                    }
                }
            }
            Channel::Resize => {
                if let Input::Docker {
                    exec,
                    client,
                    tty: true,
                    ..
                } = &input
                {
                    match TerminalSize::parse(payload) {
                        Ok(size) => {
                            if let Err(error) =
                                client.exec_resize(exec, size.height, size.width).await
                            {
                                tracing::debug!(%error, "exec resize");
                            }
                        }
                        Err(error) => tracing::debug!(%error, "exec resize ignored"),
                    }
                }
                if let Input::Pty(pty) = &input {
                    match TerminalSize::parse(payload) {
                        Ok(size) => {
                            if let Err(error) =
                                pty.resize(pty_process::Size::new(size.height, size.width))
                            {
                                tracing::debug!(%error, "exec resize");
                            }
                        }
                        Err(error) => tracing::debug!(%error, "exec resize ignored"),
                    }
                }
            }
            Channel::Close
                if protocol == rlark_api::agent::local::EXEC_PROTOCOL_V5
                    && payload == [Channel::Stdin.byte()] =>
            {
                // A pipe ends (the process reads its end of input); a terminal has none.
                if matches!(input, Input::Pipe(_)) {
                    input = Input::None;
                }
                if let Input::Docker {
                    write, tty: false, ..
                } = &mut input
                    && let Some(mut half) = write.take()
                {
                    // Half-closes the engine stream: the engine closes the process's stdin.
                    let _ = half.shutdown().await;
                }
            }
            _ => {}
        }
    }
}

/// Live (not zombie) members of process group `leader` and, when `session`, of the
/// session `leader` leads.
fn members(leader: i32, session: bool) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // `pid (comm) state ppid pgrp session ...`; comm may contain anything.
            let Some(rest) = stat.rfind(')').map(|at| &stat[at + 1..]) else {
                return false;
            };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let live = fields.first().is_some_and(|s| !matches!(*s, "Z" | "X"));
            let in_group = fields.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(leader);
            let in_session =
                session && fields.get(3).and_then(|s| s.parse::<i32>().ok()) == Some(leader);
            live && (in_group || in_session)
        })
        .map(Pid::from_raw)
        .collect()
}

/// Send `signal` to the group `leader` and every member of its session (when `session`).
fn signal_members(leader: i32, session: bool, signal: Signal) {
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
async fn hang_up(leader: i32, session: bool) {
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

/// Aborts a task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl AbortOnDrop {
    /// Wait for the task (it is aborted if this future is dropped first).
    async fn join(mut self) {
        let _ = (&mut self.0).await;
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environ_is_parsed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("environ");
        std::fs::write(&path, b"A=1\0B=x=y\0EMPTY=\0=bad\0noequals\0\0").unwrap();
        let env = read_environ(&path).unwrap();
        let pairs: Vec<(String, String)> = env
            .into_iter()
            .map(|(k, v)| (k.into_string().unwrap(), v.into_string().unwrap()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("A".to_string(), "1".to_string()),
                ("B".to_string(), "x=y".to_string()),
                ("EMPTY".to_string(), String::new()),
            ]
        );
    }

    #[test]
    fn our_own_process_reads_back() {
        let target = read_environ(Path::new("/proc/self/environ")).unwrap();
        assert!(target.iter().any(|(k, _)| k == "PATH"), "{target:?}");
        let me = i32::try_from(std::process::id()).unwrap();
        let group = nix::unistd::getpgrp().as_raw();
        assert!(members(group, false).contains(&Pid::from_raw(me)));
        assert!(!members(me + 1_000_000, true).contains(&Pid::from_raw(me)));
    }
}
