//! Exec on the agent's local API, without a server: a replica directory whose `state.json`
//! names a live process started by the test (its working directory and environment are
//! what the exec must get), [`LocalApi::serve_connection`] on an in-memory pipe, and a
//! WebSocket client speaking Kubernetes' remotecommand protocol over it.
//!
//! Every wait is bounded by [`DEADLINE`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use futures::{SinkExt as _, StreamExt as _};
use rlark_agent::api::LocalApi;
use rlark_agent::tasks::{ReplicaState, STATE_FILE};
use rlark_api::agent::local::{
    Channel, EXEC_PROTOCOL_V4, EXEC_PROTOCOL_V5, ExecOptions, ExecOutcome, TerminalSize,
    decode_frame, encode_frame, exec_path,
};
use tokio::io::DuplexStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(30);
const NAMESPACE: &str = "rlark-a";
const POD: &str = "job-main-0";

type Ws = WebSocketStream<DuplexStream>;

/// A replica that runs (`sleep` in `work/` with `MARK` and `RLARK_TASK` set) and the API
/// serving it.
struct Replica {
    _dir: tempfile::TempDir,
    work: PathBuf,
    replica_dir: PathBuf,
    api: LocalApi,
    process: tokio::process::Child,
}

impl Replica {
    async fn start() -> anyhow::Result<Replica> {
        let dir = tempfile::tempdir()?;
        let tasks = dir.path().join("tasks");
        let replica_dir = tasks
            .join(NAMESPACE)
            .join("job-main")
            .join("uid-1")
            .join("0");
        let work = replica_dir.join("work");
        std::fs::create_dir_all(&work)?;
        let process = tokio::process::Command::new("sleep")
            .arg("300")
            .current_dir(&work)
            .env("MARK", "from-the-replica")
            .env("RLARK_TASK", "job-main")
            .kill_on_drop(true)
            .spawn()?;
        let state = ReplicaState {
            namespace: NAMESPACE.into(),
            task: "job-main".into(),
            uid: "uid-1".into(),
            index: 0,
            run_key: "k".into(),
            pid: process.id().context("pid")?,
            pgid: 0,
            proc_start_ticks: None,
            containers: Vec::new(),
            container_names: Vec::new(),
            start_time: String::new(),
            grace_seconds: 1,
            final_status: None,
        };
        state.write(&replica_dir.join(STATE_FILE))?;
        let api = LocalApi::new(&tasks, "n1", CancellationToken::new());
        Ok(Replica {
            _dir: dir,
            work,
            replica_dir,
            api,
            process,
        })
    }

    /// Serve one connection on an in-memory pipe; the client end.
    fn connect(&self) -> DuplexStream {
        let (client, server) = tokio::io::duplex(256 * 1024);
        let api = self.api.clone();
        tokio::spawn(async move { api.serve_connection(server).await });
        client
    }

    /// Open an exec WebSocket with `options`, offering `protocols`.
    async fn exec(&self, options: &ExecOptions, protocols: &str) -> anyhow::Result<Ws> {
        let url = format!(
            "ws://agent{}?{}",
            exec_path(NAMESPACE, POD),
            options.to_query()
        );
        let mut request = url.into_client_request()?;
        request
            .headers_mut()
            .insert("sec-websocket-protocol", protocols.parse()?);
        let (ws, response) = tokio::time::timeout(
            DEADLINE,
            tokio_tungstenite::client_async(request, self.connect()),
        )
        .await
        .context("exec handshake timed out")??;
        let protocol = response
            .headers()
            .get("sec-websocket-protocol")
            .and_then(|v| v.to_str().ok());
        ensure!(
            protocol == Some(EXEC_PROTOCOL_V5) || protocol == Some(EXEC_PROTOCOL_V4),
            "protocol {protocol:?}"
        );
        Ok(ws)
    }

    /// A plain `GET` of `path_and_query` with `headers`: status and body.
    async fn get(&self, path: &str, upgrade: bool) -> anyhow::Result<(u16, String)> {
        use http_body_util::BodyExt as _;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(self.connect()))
                .await?;
        tokio::spawn(conn);
        let mut request = http::Request::get(path);
        if upgrade {
            request = request
                .header("connection", "Upgrade")
                .header("upgrade", "websocket")
                .header("sec-websocket-version", "13")
                .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
                .header("sec-websocket-protocol", EXEC_PROTOCOL_V5);
        }
        let request = request.body(http_body_util::Empty::<hyper::body::Bytes>::new())?;
        let response = tokio::time::timeout(DEADLINE, sender.send_request(request))
            .await
            .context("response timed out")??;
        let status = response.status().as_u16();
        let body = tokio::time::timeout(DEADLINE, response.into_body().collect())
            .await
            .context("body timed out")??
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}

fn command(args: &[&str]) -> ExecOptions {
    ExecOptions {
        command: args.iter().map(|a| a.to_string()).collect(),
        ..ExecOptions::default()
    }
}

/// What an exec sent until its close.
#[derive(Default)]
struct Received {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    outcome: Option<ExecOutcome>,
    /// Whether the agent closed with a normal close frame.
    closed_normally: bool,
}

impl std::fmt::Debug for Received {
    /// Lengths and the last bytes only: outputs can be large.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tail = |b: &[u8]| text(&b[b.len().saturating_sub(200)..]);
        f.debug_struct("Received")
            .field("stdout_len", &self.stdout.len())
            .field("stdout_tail", &tail(&self.stdout))
            .field("stderr_len", &self.stderr.len())
            .field("stderr_tail", &tail(&self.stderr))
            .field("outcome", &self.outcome)
            .field("closed_normally", &self.closed_normally)
            .finish()
    }
}

/// Read messages until the agent closes (or `until` holds for stdout), bounded by
/// [`DEADLINE`].
async fn receive(ws: &mut Ws, until: impl Fn(&Received) -> bool) -> anyhow::Result<Received> {
    let mut received = Received::default();
    loop {
        if until(&received) {
            return Ok(received);
        }
        let message = tokio::time::timeout(DEADLINE, ws.next())
            .await
            .with_context(|| format!("nothing more after {received:?}"))?;
        match message {
            None => return Ok(received),
            Some(Err(error)) => bail!("{error} after {received:?}"),
            Some(Ok(Message::Binary(bytes))) => {
                let (channel, payload) = decode_frame(&bytes).map_err(anyhow::Error::msg)?;
                match channel {
                    Channel::Stdout => received.stdout.extend_from_slice(payload),
                    Channel::Stderr => received.stderr.extend_from_slice(payload),
                    Channel::Error => {
                        ensure!(received.outcome.is_none(), "two statuses");
                        received.outcome =
                            Some(ExecOutcome::parse(payload).map_err(anyhow::Error::msg)?);
                    }
                    other => bail!("unexpected channel {other:?} from the agent"),
                }
            }
            Some(Ok(Message::Close(frame))) => {
                received.closed_normally = frame.is_some_and(|f| u16::from(f.code) == 1000);
            }
            Some(Ok(_)) => {}
        }
    }
}

/// Everything until the close.
async fn finish(ws: &mut Ws) -> anyhow::Result<Received> {
    receive(ws, |_| false).await
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn send(ws: &mut Ws, channel: Channel, payload: &[u8]) -> anyhow::Result<()> {
    ws.send(Message::Binary(encode_frame(channel, payload).into()))
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_run_in_the_replica_with_its_directory_and_environment() -> anyhow::Result<()> {
    let replica = Replica::start().await?;

    let mut ws = replica
        .exec(&command(&["echo", "hello"]), EXEC_PROTOCOL_V5)
        .await?;
    let got = finish(&mut ws).await?;
    assert_eq!(text(&got.stdout), "hello\n");
    assert_eq!(got.outcome, Some(ExecOutcome::Exited(0)));
    assert!(got.closed_normally, "{got:?}");

    let script = "echo out; echo err >&2; exit 3";
    let mut ws = replica
        .exec(&command(&["sh", "-c", script]), EXEC_PROTOCOL_V4)
        .await?;
    let got = finish(&mut ws).await?;
    assert_eq!(
        (text(&got.stdout), text(&got.stderr)),
        ("out\n".into(), "err\n".into())
    );
    assert_eq!(got.outcome, Some(ExecOutcome::Exited(3)));

    // The replica's working directory and environment (read from its live process).
    let script = "pwd; echo $MARK $RLARK_TASK; [ -t 0 ] || echo no-tty";
    let mut ws = replica
        .exec(&command(&["sh", "-c", script]), EXEC_PROTOCOL_V5)
        .await?;
    let got = finish(&mut ws).await?;
    let work = std::fs::canonicalize(&replica.work)?;
    assert_eq!(
        text(&got.stdout),
        format!("{}\nfrom-the-replica job-main\nno-tty\n", work.display())
    );

    // Only what was asked for: no stderr channel without stderr=true.
    let mut options = command(&["sh", "-c", "echo gone >&2; echo kept"]);
    options.stderr = false;
    let mut ws = replica.exec(&options, EXEC_PROTOCOL_V5).await?;
    let got = finish(&mut ws).await?;
    assert_eq!((text(&got.stdout), got.stderr.len()), ("kept\n".into(), 0));

    // A program that does not exist: a Failure status naming it, then the close.
    let mut ws = replica
        .exec(&command(&["no-such-program-x"]), EXEC_PROTOCOL_V5)
        .await?;
    let got = finish(&mut ws).await?;
    match &got.outcome {
        Some(ExecOutcome::Failed { reason, message }) => {
            assert_eq!(reason, "InternalError");
            assert!(message.contains("no-such-program-x"), "{message}");
        }
        other => bail!("unexpected outcome {other:?}"),
    }
    assert!(got.closed_normally);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_feeds_the_process_and_its_close_ends_it() -> anyhow::Result<()> {
    let replica = Replica::start().await?;
    let mut options = command(&["cat"]);
    options.stdin = true;
    let mut ws = replica.exec(&options, EXEC_PROTOCOL_V5).await?;
    send(&mut ws, Channel::Stdin, b"first line\n").await?;
    let got = receive(&mut ws, |r| r.stdout.ends_with(b"first line\n")).await?;
    assert_eq!(text(&got.stdout), "first line\n");
    let big: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    send(&mut ws, Channel::Stdin, &big).await?;
    send(&mut ws, Channel::Close, &[Channel::Stdin.byte()]).await?;
    let got = finish(&mut ws).await?;
    assert_eq!(got.stdout.len(), big.len(), "every byte comes back");
    assert!(got.stdout == big, "in order");
    assert_eq!(
        got.outcome,
        Some(ExecOutcome::Exited(0)),
        "cat ended at EOF"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_session_resizes_and_reports_the_exit_code() -> anyhow::Result<()> {
    let replica = Replica::start().await?;
    let mut options = command(&["sh"]);
    options.stdin = true;
    options.tty = true;
    let mut ws = replica.exec(&options, EXEC_PROTOCOL_V5).await?;
    // The first message is the initial size, as kubectl sends it.
    let initial = TerminalSize {
        width: 120,
        height: 30,
    };
    send(&mut ws, Channel::Resize, &initial.to_json()).await?;
    send(
        &mut ws,
        Channel::Stdin,
        b"stty size; [ -t 0 ] && echo IS-A-TTY; echo $TERM\n",
    )
    .await?;
    let got = receive(&mut ws, |r| {
        let out = text(&r.stdout);
        out.contains("30 120") && out.contains("IS-A-TTY") && out.contains("xterm\r\n")
    })
    .await?;
    assert!(got.stderr.is_empty(), "a terminal merges stderr");

    send(
        &mut ws,
        Channel::Resize,
        &TerminalSize {
            width: 100,
            height: 40,
        }
        .to_json(),
    )
    .await?;
    send(&mut ws, Channel::Stdin, b"stty size\n").await?;
    receive(&mut ws, |r| text(&r.stdout).contains("40 100")).await?;
    send(&mut ws, Channel::Stdin, b"exit 7\n").await?;
    let got = finish(&mut ws).await?;
    assert_eq!(got.outcome, Some(ExecOutcome::Exited(7)));
    assert!(got.closed_normally);

    // No resize at all: 80x24.
    let mut options = command(&["stty", "size"]);
    options.tty = true;
    let mut ws = replica.exec(&options, EXEC_PROTOCOL_V5).await?;
    let got = finish(&mut ws).await?;
    assert_eq!(text(&got.stdout), "24 80\r\n");
    assert_eq!(got.outcome, Some(ExecOutcome::Exited(0)));
    Ok(())
}

/// Live processes (not zombies) of process group or session `id`, from `/proc`.
fn live_members(id: i32) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(rest) = stat.rfind(')').map(|at| stat[at + 1..].to_string()) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let live = fields.first().is_some_and(|s| !matches!(*s, "Z" | "X"));
        let pgrp = fields.get(2).and_then(|s| s.parse::<i32>().ok());
        let session = fields.get(3).and_then(|s| s.parse::<i32>().ok());
        if live && (pgrp == Some(id) || session == Some(id)) {
            found.push(pid);
        }
    }
    found
}

/// Poll until `id` has no live member, at most [`DEADLINE`].
async fn wait_gone(id: i32) -> anyhow::Result<()> {
    let until = tokio::time::Instant::now() + DEADLINE;
    loop {
        let members = live_members(id);
        if members.is_empty() {
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < until,
            "processes {members:?} of group {id} are still alive"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Start `script` (which prints its shell's pid first) and return the pid (the group).
async fn started_group(ws: &mut Ws) -> anyhow::Result<i32> {
    let got = receive(ws, |r| r.stdout.contains(&b'\n')).await?;
    let line = text(&got.stdout);
    let pid: i32 = line
        .lines()
        .next()
        .context("no pid")?
        .trim()
        .parse()
        .with_context(|| format!("pid in {line:?}"))?;
    ensure!(!live_members(pid).is_empty(), "group {pid} is not running");
    Ok(pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_leaves_no_process_behind() -> anyhow::Result<()> {
    let replica = Replica::start().await?;

    // Pipes; a shell that ignores SIGHUP (so SIGKILL is needed) with a background child.
    let script = "trap '' HUP; echo $$; sleep 300 & sleep 301; echo never";
    let mut ws = replica
        .exec(&command(&["sh", "-c", script]), EXEC_PROTOCOL_V5)
        .await?;
    let group = started_group(&mut ws).await?;
    eventually_members(group, 3).await?;
    drop(ws); // abrupt: no close message, the connection just ends
    wait_gone(group).await?;

    // A terminal session: a shell with job control, whose background job runs in another
    // process group of its session.
    let mut options = command(&["sh", "-c", "set -m; echo $$; sleep 302 & sleep 303"]);
    options.tty = true;
    let mut ws = replica.exec(&options, EXEC_PROTOCOL_V5).await?;
    let session = started_group(&mut ws).await?;
    eventually_members(session, 3).await?;
    drop(ws);
    wait_gone(session).await?;

    // The replica itself is untouched.
    assert!(
        rlark_agent::runtime::process::process_running(
            replica.process.id().context("replica pid")?,
            None
        ),
        "the replica's own process survives"
    );
    Ok(())
}

/// Wait until group `id` has `n` live members (the script's children are started).
async fn eventually_members(id: i32, n: usize) -> anyhow::Result<()> {
    let until = tokio::time::Instant::now() + DEADLINE;
    while live_members(id).len() < n {
        ensure!(
            tokio::time::Instant::now() < until,
            "group {id} has {:?}, not {n} members",
            live_members(id)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_before_the_upgrade() -> anyhow::Result<()> {
    let replica = Replica::start().await?;
    let query = command(&["true"]).to_query();
    let path = |pod: &str| format!("{}?{query}", exec_path(NAMESPACE, pod));

    let (code, body) = replica.get(&path(POD), false).await?;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("WebSocket upgrade"), "{body}");
    let (code, body) = replica
        .get(&format!("{}?stdin=true", exec_path(NAMESPACE, POD)), true)
        .await?;
    assert_eq!(code, 400);
    assert!(body.contains("no command"), "{body}");
    let (code, body) = replica.get(&path("other-0"), true).await?;
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("has not run on node \"n1\""), "{body}");
    let (code, _) = replica
        .get(&format!("/exec/{NAMESPACE}/..?{query}"), true)
        .await?;
    assert_eq!(code, 400);

    // Not running any more: its state file names a process that is gone.
    let mut state = ReplicaState::read(&replica.replica_dir.join(STATE_FILE))?;
    let mut exited = std::process::Command::new("true").spawn()?;
    state.pid = exited.id();
    exited.wait()?;
    state.write(&replica.replica_dir.join(STATE_FILE))?;
    let (code, body) = replica.get(&path(POD), true).await?;
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("is not running"), "{body}");
    Ok(())
}
