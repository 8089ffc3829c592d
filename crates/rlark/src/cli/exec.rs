//! `rlark exec (task/NAME | pod/NAME | NAME) [-n NS] [--replica N] [-c CONTAINER] [-i] [-t]
//! -- CMD ARGS...`:
//! run a command in a running replica, through the server and the replica's agent
//! (`GET /rlark/v1/namespaces/{ns}/pods/{pod}/exec`, admins only; docs/tunnel.md, "Exec").
//!
//! - `task/NAME` picks replica 0 (`<task>-0`, or `--replica N`); `pod/NAME` or `NAME` one
//!   Pod. Without `-n` the Task or Pod is looked up across namespaces, as `rlark logs` does.
//! - The connection is a WebSocket (Kubernetes' remotecommand protocol, `v5.channel.k8s.io`
//!   or `v4.channel.k8s.io`) over TLS with the kubeconfig's credentials (embedded client
//!   certificate or bearer token, as `rlark port-forward` reads them).
//! - `-c NAME` (kubectl's flag) runs the command in that container of a `docker` replica
//!   (a sidecar); without it, in the main (first) container.
//! - `-i` sends this process's stdin; its end closes the command's stdin (v5). Without
//!   `-i`, nothing is sent.
//! - `-t` gives the command a terminal (stderr merged into stdout). When this process's
//!   stdin is a terminal too and `-i` is given, it is put in raw mode for the session (and
//!   restored on every way out); the terminal's size is sent first and again on every
//!   `SIGWINCH`.
//! - The exit code is the command's: 0 on success, its code otherwise (a signal `n` is
//!   `128+n`); 1 with a message when the exec itself failed (not found, forbidden, the
//!   program could not start, the connection broke).

use std::io::Read as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use futures::{SinkExt as _, StreamExt as _};
use kube::ResourceExt as _;
use rlark_tunnel::agent_api::{
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
/// Largest piece of stdin sent at once.
const STDIN_CHUNK: usize = 32 * 1024;

#[derive(Debug, Args)]
pub(crate) struct ExecArgs {
    /// Where: `task/NAME` (replica 0, or --replica), `pod/NAME`, or `NAME` (a Pod).
    pub target: String,
    /// Namespace of the Task or Pod (`rlark-<clusterID>`). Default: looked up across
    /// namespaces.
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// With task/NAME: the replica to exec into.
    #[arg(long, value_name = "N")]
    pub replica: Option<usize>,
    /// The container of a docker replica to run in (default: the main, first one).
    #[arg(short = 'c', long, value_name = "NAME")]
    pub container: Option<String>,
    /// Send stdin to the command.
    #[arg(short = 'i', long)]
    pub stdin: bool,
    /// Give the command a terminal.
    #[arg(short = 't', long)]
    pub tty: bool,
    /// The command and its arguments (after `--`; no shell: use `sh -c '...'` for one).
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
    #[command(flatten)]
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
    let (kind, name) = parse_target(&args.target)?;
    if kind == Kind::Job {
        bail!("exec runs in one replica: use task/NAME or pod/NAME, not a job");
    }
    if kind == Kind::Pod && args.replica.is_some() {
        bail!("--replica only applies to task/NAME (a Pod is one replica already)");
    }
    let session = Session::connect(&args.client, args.namespace.as_deref()).await?;
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
    let options = ExecOptions {
        command: args.command.clone(),
        stdin: args.stdin,
        stdout: true,
        stderr: !args.tty,
        tty: args.tty,
    };
    let endpoint = super::port_forward::endpoint(args.client.kubeconfig.as_deref())?;
    let (ws, protocol) = connect(
        &endpoint,
        &namespace,
        &pod,
        &options,
        args.container.as_deref(),
    )
    .await?;

    let terminal = Terminal::detect();
    // Raw mode only when our own keystrokes go to the remote terminal.
    let _raw = if args.tty && args.stdin && terminal.stdin {
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
        Some(ExecOutcome::Failed { reason, message }) => bail!("exec failed ({reason}): {message}"),
        None => bail!("the exec connection closed before the command's exit status arrived"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
