//! `rlark exec (task/NAME | pod/NAME | NAME) [-n NS] [--replica N] [-c CONTAINER] [-i] [-t]
//! -- CMD ARGS...`:
//! run a command in a running replica, through the server and the replica's agent
//! (`GET /rlark/v1/namespaces/{ns}/pods/{pod}/exec`, admins and the users the Job's
//! `spec.access` grants; docs/tunnel.md, "Exec").
//!
//! - `task/NAME` picks replica 0 (`<task>-0`, or `--replica N`); `pod/NAME` or `NAME` one
//!   Pod. Without `-n` the Task or Pod is looked up across namespaces, as `rlark logs` does.
//! - The connection is a WebSocket (Kubernetes' remotecommand protocol, `v5.channel.k8s.io`
//!   or `v4.channel.k8s.io`) over TLS with the kubeconfig's credentials (embedded client
//!   certificate or bearer token, as `rlark port-forward` reads them).
//! - `-c NAME` (kubectl's flag) runs the command in that container of a `docker` replica
//!   (a sidecar) or of a member Pod of a Kubernetes agent; without it, in the main (first)
//!   container (for a member Pod: the `kubectl.kubernetes.io/default-container` one, else
//!   the first).
//! - `-i` sends this process's stdin; its end closes the command's stdin (v5). Without
//!   `-i`, nothing is sent.
//! - `-t` gives the command a terminal (stderr merged into stdout) when this process's
//!   stdin is a terminal; otherwise it prints kubectl's warning ("Unable to use a TTY -
//!   input is not a terminal or the right kind of file") and runs the command without one.
//!   With `-i` too, the local terminal is put in raw mode for the session (and restored on
//!   every way out); the terminal's size is sent first and again on every `SIGWINCH`.
//! - The exit code is the command's: 0 on success, its code otherwise (a signal `n` is
//!   `128+n`); 127 when the program does not exist in the replica and 126 when it may not
//!   be run (as a shell, docker and kubectl report them), with a message; 1 with a message
//!   when the exec itself failed (not found, forbidden, the connection broke).

use std::io::Read as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use futures::{SinkExt as _, StreamExt as _};
use kube::ResourceExt as _;
use rlark_api::agent::local::{
    Channel, EXEC_PROTOCOL_V4, EXEC_PROTOCOL_V5, ExecOptions, ExecOutcome, MAX_EXEC_MESSAGE,
    TerminalSize, decode_frame, encode_frame, percent_encode,
};
use rustls::pki_types::ServerName;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Bytes, Message};

use super::ClientArgs;
use super::client::Session;
use super::logs::{Kind, find_pod, find_task, parse_target};

/// How often an idle session pings the agent (the tunnel resets streams idle for 10 min).
const PING_EVERY: Duration = Duration::from_secs(30);
/// kubectl's words when `-t` is given but stdin is not a terminal (the command then runs
/// without one).
const NO_TTY_WARNING: &str =
    "Unable to use a TTY - input is not a terminal or the right kind of file";
/// Exit code when the command does not exist in the replica (as a shell, docker and
/// kubectl report it).
const EXIT_NOT_FOUND: i32 = 127;
/// Exit code when the command exists but cannot be run (permission denied).
const EXIT_NOT_EXECUTABLE: i32 = 126;
/// Largest piece of stdin sent at once.
const STDIN_CHUNK: usize = 32 * 1024;

#[derive(Debug, Args)]
pub(crate) struct ExecArgs {
    /// Where: `task/NAME` (replica 0, or --replica), `pod/NAME`, or `NAME` (a Pod); or the
    /// kind alone, followed by NAME.
    pub target: String,
    /// The name, when TARGET is only the kind (`rlark exec task NAME -- CMD`).
    pub name: Option<String>,
    /// With task/NAME: the replica to exec into.
    #[arg(long, value_name = "N")]
    pub replica: Option<usize>,
    /// The container of a docker replica or member Pod to run in (default: the main, first
    /// one).
    #[arg(short = 'c', long, value_name = "NAME")]
    pub container: Option<String>,
    /// Send stdin to the command.
    #[arg(short = 'i', long)]
    pub stdin: bool,
    /// Give the command a terminal (only when stdin is one; otherwise warn and run without).
    #[arg(short = 't', long)]
    pub tty: bool,
    /// The command and its arguments (after `--`; no shell: use `sh -c '...'` for one).
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
    #[arg(skip)]
    pub client: ClientArgs,
}

pub(crate) async fn exec(args: ExecArgs) -> anyhow::Result<()> {
    let code = run(args).await?;
    if code != 0 {
        // The remote command's code is ours; nothing is left to clean up (the terminal was
        // restored when `run` returned).
        let _ = tokio::io::stdout().flush().await;
        std::process::exit(if (1..=255).contains(&code) { code } else { 1 });
    }
    Ok(())
}

/// Run the session; the command's exit code.
async fn run(args: ExecArgs) -> anyhow::Result<i32> {
    let (kind, name) = parse_target(&super::names::join_target(
        &args.target,
        args.name.as_deref(),
    )?)?;
    if kind == Kind::Job {
        bail!("exec runs in one replica: use task/NAME or pod/NAME, not a job");
    }
    if kind == Kind::Pod && args.replica.is_some() {
        bail!("--replica only applies to task/NAME (a Pod is one replica already)");
    }
    let session = Session::connect(&args.client).await?;
    let namespace = session
        .namespace_explicit
        .then(|| session.namespace.clone());
    let (namespace, pod) = match kind {
        Kind::Task => {
            let task = find_task(&session.client, &name, namespace.as_deref()).await?;
            let replicas = usize::try_from(task.spec.replicas()).unwrap_or(0);
            let index = args.replica.unwrap_or(0);
            if index >= replicas {
                bail!(
                    "task {}/{name} has {replicas} replica(s): --replica {index} does not exist",
                    task.namespace().unwrap_or_default()
                );
            }
            (
                task.namespace().unwrap_or_default(),
                format!("{name}-{index}"),
            )
        }
        _ => {
            let pod = find_pod(&session.client, &name, namespace.as_deref()).await?;
            (pod.namespace, pod.name)
        }
    };
    let terminal = Terminal::detect();
    // As kubectl: a terminal is only asked for when our input is one.
    let tty = args.tty && terminal.stdin;
    if args.tty && !tty {
        eprintln!("{NO_TTY_WARNING}");
    }
    let options = ExecOptions {
        command: args.command.clone(),
        stdin: args.stdin,
        stdout: true,
        stderr: !tty,
        tty,
    };
    let endpoint = super::port_forward::endpoint(&args.client)?;
    let (ws, protocol) = connect(
        &endpoint,
        &namespace,
        &pod,
        &options,
        args.container.as_deref(),
    )
    .await?;

    // Raw mode only when our own keystrokes go to the remote terminal.
    let _raw = if tty && args.stdin {
        Some(RawMode::enable().context("put the terminal in raw mode")?)
    } else {
        None
    };
    session_loop(ws, protocol, &options, terminal).await
}

/// TLS to the server, then the WebSocket handshake on the exec route.
async fn connect(
    endpoint: &super::port_forward::Endpoint,
    namespace: &str,
    pod: &str,
    options: &ExecOptions,
    container: Option<&str>,
) -> anyhow::Result<(Ws, &'static str)> {
    let host = if endpoint.host.contains(':') {
        format!("[{}]", endpoint.host)
    } else {
        endpoint.host.clone()
    };
    let container = container
        .map(|c| format!("&container={}", percent_encode(c)))
        .unwrap_or_default();
    let url = format!(
        "wss://{host}:{}/rlark/v1/namespaces/{}/pods/{}/exec?{}{container}",
        endpoint.port,
        percent_encode(namespace),
        percent_encode(pod),
        options.to_query()
    );
    let mut request = url
        .as_str()
        .into_client_request()
        .with_context(|| format!("exec URL {url}"))?;
    let headers = request.headers_mut();
    headers.insert(
        http::header::SEC_WEBSOCKET_PROTOCOL,
        http::HeaderValue::from_str(&format!("{EXEC_PROTOCOL_V5}, {EXEC_PROTOCOL_V4}"))?,
    );
    if let Some(token) = &endpoint.bearer {
        headers.insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_str(&format!("Bearer {token}"))
                .context("the kubeconfig's token is not a valid header value")?,
        );
    }
    let tcp = TcpStream::connect((endpoint.host.as_str(), endpoint.port))
        .await
        .with_context(|| format!("connect to {}:{}", endpoint.host, endpoint.port))?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from(endpoint.host.clone()).context("server name")?;
    let tls = tokio_rustls::TlsConnector::from(Arc::clone(&endpoint.tls))
        .connect(name, tcp)
        .await
        .context("TLS handshake with the server")?;
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_EXEC_MESSAGE))
        .max_frame_size(Some(MAX_EXEC_MESSAGE));
    let (ws, response) =
        match tokio_tungstenite::client_async_with_config(request, tls, Some(config)).await {
            Ok(pair) => pair,
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                return Err(refusal(
                    response.status(),
                    response.body().as_deref().unwrap_or_default(),
                ));
            }
            Err(error) => {
                return Err(anyhow::Error::new(error).context(format!(
                    "exec in pod {namespace}/{pod}: WebSocket handshake"
                )));
            }
        };
    let protocol = match response
        .headers()
        .get(http::header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
    {
        Some(EXEC_PROTOCOL_V5) => EXEC_PROTOCOL_V5,
        Some(EXEC_PROTOCOL_V4) => EXEC_PROTOCOL_V4,
        other => bail!("the server chose no exec subprotocol we speak ({other:?})"),
    };
    Ok((ws, protocol))
}

type Ws = tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<TcpStream>>;

/// The error of a refused upgrade: the server's `Status` (printed as kubectl prints it),
/// else the status line and body.
fn refusal(status: http::StatusCode, body: &[u8]) -> anyhow::Error {
    match serde_json::from_slice::<kube::core::Status>(body) {
        Ok(mut parsed) if !parsed.message.is_empty() => {
            if parsed.code == 0 {
                parsed.code = status.as_u16();
            }
            anyhow::Error::new(kube::Error::Api(parsed.boxed()))
        }
        _ => anyhow::anyhow!(
            "the server refused the exec: {status}: {}",
            String::from_utf8_lossy(body).trim()
        ),
    }
}

/// Which of our standard streams are terminals.
#[derive(Clone, Copy, Debug)]
struct Terminal {
    stdin: bool,
    stdout: bool,
}

impl Terminal {
    fn detect() -> Terminal {
        Terminal {
            stdin: rustix::termios::isatty(std::io::stdin()),
            stdout: rustix::termios::isatty(std::io::stdout()),
        }
    }

    /// The local terminal's size (stdin's, else stdout's), if there is a terminal.
    fn size(self) -> Option<TerminalSize> {
        let size = if self.stdin {
            rustix::termios::tcgetwinsize(std::io::stdin()).ok()
        } else if self.stdout {
            rustix::termios::tcgetwinsize(std::io::stdout()).ok()
        } else {
            None
        }?;
        (size.ws_col > 0 && size.ws_row > 0).then_some(TerminalSize {
            width: size.ws_col,
            height: size.ws_row,
        })
    }
}

/// The terminal in raw mode; the previous mode is restored when dropped.
struct RawMode {
    saved: rustix::termios::Termios,
}

impl RawMode {
    fn enable() -> std::io::Result<RawMode> {
        let stdin = std::io::stdin();
        let saved = rustix::termios::tcgetattr(&stdin)?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw)?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin(),
            rustix::termios::OptionalActions::Now,
            &self.saved,
        );
    }
}

/// Exchange messages until the agent closes; the command's exit code.
async fn session_loop(
    ws: Ws,
    protocol: &'static str,
    options: &ExecOptions,
    terminal: Terminal,
) -> anyhow::Result<i32> {
    let (mut sink, mut stream) = ws.split();
    let (tx, mut rx) = mpsc::channel::<Message>(16);
    let writer = tokio::spawn(async move {
        while let Some(message) = rx.recv().await {
            if sink.send(message).await.is_err() {
                return;
            }
        }
    });
    let frame = |channel: Channel, payload: &[u8]| {
        Message::Binary(Bytes::from(encode_frame(channel, payload)))
    };
    if options.tty
        && let Some(size) = terminal.size()
    {
        tx.send(frame(Channel::Resize, &size.to_json())).await?;
        let resizes = tx.clone();
        let mut winch =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
                .context("watch SIGWINCH")?;
        tokio::spawn(async move {
            while winch.recv().await.is_some() {
                if let Some(size) = terminal.size()
                    && resizes
                        .send(frame(Channel::Resize, &size.to_json()))
                        .await
                        .is_err()
                {
                    return;
                }
            }
        });
    }
    if options.stdin {
        // A plain thread, not the runtime's blocking pool: a read blocked on a terminal
        // must not keep the runtime from shutting down.
        let input = tx.clone();
        let close_stdin = protocol == EXEC_PROTOCOL_V5;
        std::thread::Builder::new()
            .name("exec-stdin".into())
            .spawn(move || {
                let mut stdin = std::io::stdin().lock();
                let mut buf = vec![0u8; STDIN_CHUNK];
                loop {
                    match stdin.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            if input
                                .blocking_send(frame(Channel::Stdin, &buf[..n]))
                                .is_err()
                            {
                                return;
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
                if close_stdin {
                    let _ = input.blocking_send(frame(Channel::Close, &[Channel::Stdin.byte()]));
                }
            })
            .context("start the stdin reader")?;
    }
    let pings = tx.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(PING_EVERY);
        every.tick().await;
        loop {
            every.tick().await;
            if pings.send(Message::Ping(Bytes::new())).await.is_err() {
                return;
            }
        }
    });
    drop(tx);

    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    let mut outcome = None;
    while let Some(message) = stream.next().await {
        let bytes = match message {
            Ok(Message::Binary(bytes)) => bytes,
            Ok(_) => continue,
            // After the status, only the close remains: a broken close does not matter.
            Err(_) if outcome.is_some() => break,
            Err(error) => return Err(anyhow::Error::new(error).context("the exec connection")),
        };
        let (channel, payload) = decode_frame(&bytes).map_err(anyhow::Error::msg)?;
        match channel {
            Channel::Stdout => {
                stdout.write_all(payload).await?;
                stdout.flush().await?;
            }
            Channel::Stderr => {
                stderr.write_all(payload).await?;
                stderr.flush().await?;
            }
            Channel::Error => {
                outcome = Some(ExecOutcome::parse(payload).map_err(anyhow::Error::msg)?);
            }
            _ => {}
        }
    }
    writer.abort();
    match outcome {
        Some(ExecOutcome::Exited(code)) => Ok(code),
        Some(ExecOutcome::Failed { reason, message }) => {
            match start_failure(&options.command[0], &message) {
                Some((code, what)) => {
                    eprintln!("error: {what} ({message})");
                    Ok(code)
                }
                None => bail!("exec failed ({reason}): {message}"),
            }
        }
        None => bail!("the exec connection closed before the command's exit status arrived"),
    }
}

/// The exit code and explanation for an agent's report that `program` could not be
/// started: it does not exist (127) or may not be run (126). The agent's message names the
/// OS error of the start (`... (os error 2)`); `None` for any other failure.
fn start_failure(program: &str, message: &str) -> Option<(i32, String)> {
    if !message.starts_with("start ") {
        return None;
    }
    if message.ends_with("(os error 2)") {
        return Some((
            EXIT_NOT_FOUND,
            format!("exec: {program:?}: executable file not found"),
        ));
    }
    if message.ends_with("(os error 13)") {
        return Some((
            EXIT_NOT_EXECUTABLE,
            format!("exec: {program:?}: permission denied"),
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_failures_map_to_shell_exit_codes() {
        let (code, what) = start_failure(
            "nope",
            "start \"nope\" in /d/work: No such file or directory (os error 2)",
        )
        .expect("not found");
        assert_eq!(code, 127);
        assert_eq!(what, "exec: \"nope\": executable file not found");
        let (code, _) = start_failure("f", "start \"f\" in /d: Permission denied (os error 13)")
            .expect("not executable");
        assert_eq!(code, 126);
        assert_eq!(start_failure("f", "allocate a terminal: out of ptys"), None);
        assert_eq!(
            start_failure("f", "start \"f\" in /d: Resource busy (os error 16)"),
            None
        );
    }

    #[test]
    fn refusals_read_the_server_status() {
        let body = br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods.rlinf.io \"x-0\" is forbidden: User \"vera\" cannot create resource \"pods/exec\"","reason":"Forbidden","code":403}"#;
        let error = refusal(http::StatusCode::FORBIDDEN, body);
        assert_eq!(
            super::super::client::report(&error).as_deref(),
            Some(
                "Error from server (Forbidden): pods.rlinf.io \"x-0\" is forbidden: User \
                 \"vera\" cannot create resource \"pods/exec\""
            )
        );
        let error = refusal(http::StatusCode::BAD_GATEWAY, b"upstream down");
        assert!(error.to_string().contains("502"), "{error}");
        assert!(error.to_string().contains("upstream down"), "{error}");
    }
}
