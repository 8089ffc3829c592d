//! `rlark exec` end to end: an in-process server with its controllers, a real agent
//! (`rlark_agent::start`: join, Node, tunnel with the local API, task reconciler), a Job
//! whose raw task sleeps, and
//! - the real `rlark` binary running commands in it (output, exit codes, stdin, refusals);
//! - a WebSocket client speaking the remotecommand protocol itself over TLS to
//!   `GET /rlark/v1/namespaces/{ns}/pods/{pod}/exec` (a terminal session with resize and
//!   exit code; errors before the upgrade; a client that vanishes).
//!
//! Every wait is bounded by [`DEADLINE`].

use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use futures::{SinkExt as _, StreamExt as _};
use rlark_api::agent::local::{
    Channel, EXEC_PROTOCOL_V5, ExecOptions, ExecOutcome, TerminalSize, decode_frame, encode_frame,
};
use rlark_api::types::PodPhase;
use rlark_testkit::real_agent::{DEADLINE, Harness, NAMESPACE, text, viewer_client};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

const JOB: &str = "shell";
const POD: &str = "shell-main-0";

/// `rlark [--kubeconfig K] ARGS` (the flag before `--`, where `exec` reads flags), with
/// `stdin` piped in when given; bounded by [`DEADLINE`].
async fn rlark(kubeconfig: &Path, args: &[&str], stdin: Option<&[u8]>) -> anyhow::Result<Output> {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_rlark"));
    let split = args.iter().position(|a| *a == "--").unwrap_or(args.len());
    command
        .args(&args[..split])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(&args[split..])
        .env_remove("KUBECONFIG")
        .env_remove("RUST_LOG")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().context("start rlark")?;
    if let Some(bytes) = stdin {
        let mut pipe = child.stdin.take().context("stdin")?;
        pipe.write_all(bytes).await?;
        drop(pipe);
    }
    tokio::time::timeout(DEADLINE, child.wait_with_output())
        .await
        .with_context(|| format!("rlark {args:?} timed out"))?
        .with_context(|| format!("run rlark {args:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlark_exec_runs_commands_in_a_running_replica() -> anyhow::Result<()> {
    let h = Harness::start().await?;
    h.create_job(JOB, "sleep 600").await?;
    h.wait_pod(POD, PodPhase::Running).await?;
    let kubeconfig = h.server.kubeconfig_path().to_path_buf();

    let out = rlark(
        &kubeconfig,
        &["exec", "task/shell-main", "--", "echo", "hello"],
        None,
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hello\n");

    // The replica's environment and directory; the command's own exit code.
    let script = "echo $RLARK_POD_NAME $RLARK_TASK; basename $(pwd); echo oops >&2; exit 3";
    let out = rlark(
        &kubeconfig,
        &[
            "exec",
            "pod/shell-main-0",
            "-n",
            NAMESPACE,
            "--",
            "sh",
            "-c",
            script,
        ],
        None,
    )
    .await?;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "shell-main-0 shell-main\nwork\n");
    assert_eq!(text(&out.stderr), "oops\n");

    // -i: stdin goes in, its end ends `cat`.
    let out = rlark(
        &kubeconfig,
        &["exec", "-i", "shell-main-0", "--", "cat"],
        Some(b"through the tunnel\nand back\n"),
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "through the tunnel\nand back\n");
    // Without -i nothing is sent: `cat` reads the end at once.
    let out = rlark(&kubeconfig, &["exec", POD, "--", "cat"], Some(b"dropped")).await?;
    assert_eq!(
        (out.status.code(), text(&out.stdout)),
        (Some(0), String::new())
    );

    // -t without a local terminal: kubectl's warning, and the command runs without one
    // (issue 18, item 9; it used to get a terminal anyway).
    let out = rlark(
        &kubeconfig,
        &[
            "exec",
            "-t",
            "task/shell-main",
            "--",
            "sh",
            "-c",
            "[ -t 1 ] && echo TTY || echo NO-TTY",
        ],
        None,
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "NO-TTY\n");
    assert_eq!(
        text(&out.stderr),
        "Unable to use a TTY - input is not a terminal or the right kind of file\n"
    );

    // Refusals: exit 1 with the server's message.
    let out = rlark(
        &kubeconfig,
        &["exec", "task/shell-main", "--replica", "1", "--", "true"],
        None,
    )
    .await?;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("1 replica(s)"),
        "{}",
        text(&out.stderr)
    );
    let out = rlark(&kubeconfig, &["exec", "task/nope", "--", "true"], None).await?;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not found"),
        "{}",
        text(&out.stderr)
    );
    // A program that does not exist: 127 and a message saying so, as docker and kubectl
    // (issue 18, item 9; it used to be 1).
    let out = rlark(&kubeconfig, &["exec", POD, "--", "no-such-program-x"], None).await?;
    assert_eq!(out.status.code(), Some(127), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("error: exec: \"no-such-program-x\": executable file not found (start \"no-such-program-x\" in "),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(out.stdout.is_empty());

    // A viewer may read logs but not exec: 403 worded as every denial.
    let dir = tempfile::tempdir()?;
    viewer_client(&h.server, &h.admin, dir.path()).await?;
    let out = rlark(
        &dir.path().join("viewer.kubeconfig"),
        &["exec", "task/shell-main", "--", "echo", "hi"],
        None,
    )
    .await?;
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("Error from server (Forbidden): pods.rlinf.io \"shell-main-0\" is forbidden: User \"vera\" cannot create resource \"pods/exec\""),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());

    // The exec and the denial are audited.
    let audit = std::fs::read_to_string(h.server.data_dir().join(rlark_server::AUDIT_LOG_FILE))?;
    assert!(
        audit
            .lines()
            .any(|l| l.contains("\"action\":\"exec\"") && l.contains("hello")),
        "{audit}"
    );
    assert!(
        audit
            .lines()
            .any(|l| l.contains("\"action\":\"denied\"") && l.contains("pods.rlinf.io/exec")),
        "{audit}"
    );
    h.stop().await
}

// ---------------------------------------------------------------------------------------
// The protocol itself, over TLS with the admin certificate
// ---------------------------------------------------------------------------------------

type Ws = tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<TcpStream>>;

/// A TLS client config with the server's CA and the admin certificate (`DATA_DIR/pki`).
fn admin_tls(data_dir: &Path) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let pki = data_dir.join("pki");
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(pki.join("ca.crt")).context("read ca.crt")? {
        roots.add(cert.context("ca.crt")?)?;
    }
    let certs = CertificateDer::pem_file_iter(pki.join("admin.crt"))
        .context("read admin.crt")?
        .collect::<Result<Vec<_>, _>>()
        .context("admin.crt")?;
    let key = PrivateKeyDer::from_pem_file(pki.join("admin.key")).context("read admin.key")?;
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_client_auth_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

async fn tls(h: &Harness) -> anyhow::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let addr = h.server.addr();
    let tcp = tokio::time::timeout(DEADLINE, TcpStream::connect(addr))
        .await
        .context("connect timed out")??;
    let config = admin_tls(h.server.data_dir())?;
    let name = ServerName::IpAddress(addr.ip().into());
    Ok(tokio::time::timeout(
        DEADLINE,
        tokio_rustls::TlsConnector::from(config).connect(name, tcp),
    )
    .await
    .context("TLS handshake timed out")??)
}

/// What a refused exec answered.
#[derive(Debug)]
struct Refused {
    code: u16,
    message: String,
}

/// Open an exec WebSocket as the admin; `Err(Refused)` when the server answers without
/// upgrading.
async fn open(
    h: &Harness,
    namespace: &str,
    pod: &str,
    options: &ExecOptions,
) -> anyhow::Result<Result<Ws, Refused>> {
    let url = format!(
        "wss://{}/rlark/v1/namespaces/{namespace}/pods/{pod}/exec?{}",
        h.server.addr(),
        options.to_query()
    );
    let mut request = url.as_str().into_client_request()?;
    request
        .headers_mut()
        .insert("sec-websocket-protocol", EXEC_PROTOCOL_V5.parse()?);
    let stream = tls(h).await?;
    match tokio::time::timeout(DEADLINE, tokio_tungstenite::client_async(request, stream))
        .await
        .context("exec handshake timed out")?
    {
        Ok((ws, response)) => {
            ensure!(
                response
                    .headers()
                    .get("sec-websocket-protocol")
                    .map(|v| v.as_bytes())
                    == Some(EXEC_PROTOCOL_V5.as_bytes()),
                "protocol {:?}",
                response.headers()
            );
            Ok(Ok(ws))
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            let body = response.body().clone().unwrap_or_default();
            let status: serde_json::Value = serde_json::from_slice(&body)
                .with_context(|| format!("status body {:?}", text(&body)))?;
            Ok(Err(Refused {
                code: response.status().as_u16(),
                message: status["message"].as_str().unwrap_or_default().to_string(),
            }))
        }
        Err(error) => Err(error.into()),
    }
}

async fn send(ws: &mut Ws, channel: Channel, payload: &[u8]) -> anyhow::Result<()> {
    ws.send(Message::Binary(encode_frame(channel, payload).into()))
        .await?;
    Ok(())
}

/// Read until stdout satisfies `until` (`Ok(None)`), or until the status (`Ok(Some)`);
/// returns the stdout read.
async fn read_until(
    ws: &mut Ws,
    stdout: &mut String,
    until: impl Fn(&str) -> bool,
) -> anyhow::Result<Option<ExecOutcome>> {
    loop {
        if until(stdout) {
            return Ok(None);
        }
        let message = tokio::time::timeout(DEADLINE, ws.next())
            .await
            .with_context(|| format!("nothing more; stdout so far {stdout:?}"))?;
        match message {
            None => bail!("closed without a status; stdout {stdout:?}"),
            Some(Err(error)) => bail!("{error}; stdout {stdout:?}"),
            Some(Ok(Message::Binary(bytes))) => {
                match decode_frame(&bytes).map_err(anyhow::Error::msg)? {
                    (Channel::Stdout, payload) => {
                        stdout.push_str(&String::from_utf8_lossy(payload))
                    }
                    (Channel::Error, payload) => {
                        return Ok(Some(
                            ExecOutcome::parse(payload).map_err(anyhow::Error::msg)?,
                        ));
                    }
                    (other, _) => bail!("unexpected channel {other:?}"),
                }
            }
            Some(Ok(_)) => {}
        }
    }
}

/// Live processes (not zombies) of process group or session `id`, from `/proc` (the agent
/// runs in this process, on this host).
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_protocol_through_the_server_and_the_tunnel() -> anyhow::Result<()> {
    let h = Harness::start().await?;
    h.create_job(JOB, "sleep 600").await?;
    h.wait_pod(POD, PodPhase::Running).await?;

    // An interactive shell on a terminal.
    let options = ExecOptions {
        command: vec!["sh".into()],
        stdin: true,
        stdout: true,
        stderr: false,
        tty: true,
    };
    let mut ws = open(&h, NAMESPACE, POD, &options)
        .await?
        .map_err(|r| anyhow::anyhow!("refused: {r:?}"))?;
    send(&mut ws, Channel::Stdin, b"[ -t 0 ] && echo IS-A-T''TY\n").await?;
    let mut out = String::new();
    // The quotes keep the echoed command line from matching.
    ensure!(
        read_until(&mut ws, &mut out, |o| o.contains("IS-A-TTY"))
            .await?
            .is_none()
    );
    let size = TerminalSize {
        width: 100,
        height: 40,
    };
    send(&mut ws, Channel::Resize, &size.to_json()).await?;
    send(&mut ws, Channel::Stdin, b"stty size\n").await?;
    ensure!(
        read_until(&mut ws, &mut out, |o| o.contains("40 100\r\n"))
            .await?
            .is_none()
    );
    send(&mut ws, Channel::Stdin, b"exit 7\n").await?;
    let outcome = read_until(&mut ws, &mut out, |_| false).await?;
    assert_eq!(outcome, Some(ExecOutcome::Exited(7)));

    // Non-terminal stdin: `cat` echoes, and ends when stdin is closed (v5).
    let options = ExecOptions {
        command: vec!["cat".into()],
        stdin: true,
        ..ExecOptions::default()
    };
    let mut ws = open(&h, NAMESPACE, POD, &options)
        .await?
        .map_err(|r| anyhow::anyhow!("refused: {r:?}"))?;
    send(&mut ws, Channel::Stdin, b"ping\n").await?;
    let mut out = String::new();
    ensure!(
        read_until(&mut ws, &mut out, |o| o == "ping\n")
            .await?
            .is_none()
    );
    send(&mut ws, Channel::Close, &[Channel::Stdin.byte()]).await?;
    assert_eq!(
        read_until(&mut ws, &mut out, |_| false).await?,
        Some(ExecOutcome::Exited(0))
    );
    assert_eq!(out, "ping\n");

    // A client that vanishes: the exec's process group is killed (SIGHUP ignored here, so
    // SIGKILL after the grace), the replica itself runs on.
    let options = ExecOptions {
        command: vec![
            "sh".into(),
            "-c".into(),
            "trap '' HUP; echo $$; sleep 300 & sleep 301".into(),
        ],
        ..ExecOptions::default()
    };
    let mut ws = open(&h, NAMESPACE, POD, &options)
        .await?
        .map_err(|r| anyhow::anyhow!("refused: {r:?}"))?;
    let mut out = String::new();
    ensure!(
        read_until(&mut ws, &mut out, |o| o.ends_with('\n'))
            .await?
            .is_none()
    );
    let group: i32 = out.trim().parse().with_context(|| format!("pid {out:?}"))?;
    let until = tokio::time::Instant::now() + DEADLINE;
    while live_members(group).len() < 3 {
        ensure!(
            tokio::time::Instant::now() < until,
            "group {group} did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Abrupt: the TCP connection goes, no close message.
    let mut stream = ws.into_inner();
    let _ = stream.get_mut().0.shutdown().await;
    drop(stream);
    let until = tokio::time::Instant::now() + DEADLINE;
    loop {
        let members = live_members(group);
        if members.is_empty() {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < until,
            "exec processes {members:?} outlived their client"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.wait_pod(POD, PodPhase::Running).await?;

    // Refused before any upgrade.
    let echo = ExecOptions {
        command: vec!["echo".into()],
        ..ExecOptions::default()
    };
    let refused = open(&h, NAMESPACE, "nope-0", &echo)
        .await?
        .err()
        .context("no such pod")?;
    assert_eq!(refused.code, 404, "{refused:?}");
    assert!(refused.message.contains("nope-0"), "{refused:?}");
    let refused = open(&h, "default", POD, &echo)
        .await?
        .err()
        .context("not an agent namespace")?;
    assert_eq!(refused.code, 400, "{refused:?}");
    let no_command = ExecOptions {
        command: Vec::new(),
        ..ExecOptions::default()
    };
    let refused = open(&h, NAMESPACE, POD, &no_command)
        .await?
        .err()
        .context("no command")?;
    assert_eq!(refused.code, 400, "{refused:?}");
    assert!(refused.message.contains("no command"), "{refused:?}");

    // A plain GET (no upgrade) is a 400 naming the WebSocket.
    let mut plain = tls(&h).await?;
    let request = format!(
        "GET /rlark/v1/namespaces/{NAMESPACE}/pods/{POD}/exec?command=true HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    plain.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    tokio::time::timeout(DEADLINE, plain.read_to_end(&mut answer))
        .await
        .context("plain GET timed out")?
        .ok();
    let answer = text(&answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("WebSocket upgrade"), "{answer}");

    // A replica that is not running any more.
    h.create_job("done", "true").await?;
    h.wait_pod("done-main-0", PodPhase::Succeeded).await?;
    let refused = open(&h, NAMESPACE, "done-main-0", &echo)
        .await?
        .err()
        .context("not running")?;
    assert_eq!(refused.code, 400, "{refused:?}");
    assert_eq!(
        refused.message,
        format!("pod {NAMESPACE}/done-main-0 is not running (phase Succeeded)")
    );
    h.stop().await
}

/// RLark's console terminal through rlark's gateway (`pods/{name}/terminal`,
/// docs/rlark-gateway.md): keystrokes as binary messages, a resize as RLark's JSON, the
/// shell's output back as binary messages, its exit as the close reason RLark's console
/// reads; an unknown pod is refused before any upgrade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlark_console_terminal_runs_a_shell_through_the_gateway() -> anyhow::Result<()> {
    let h = Harness::start().await?;
    h.create_job(JOB, "sleep 600").await?;
    h.wait_pod(POD, PodPhase::Running).await?;
    let url = |pod: &str| {
        format!(
            "wss://{}/api/v1/rlinf.io/v1alpha1/pods/{pod}/terminal",
            h.server.addr()
        )
    };
    let request = url(POD).as_str().into_client_request()?;
    let (mut ws, _) = tokio::time::timeout(
        DEADLINE,
        tokio_tungstenite::client_async(request, tls(&h).await?),
    )
    .await
    .context("terminal handshake timed out")??;
    ws.send(Message::Text(
        r#"{"type":"resize","rows":33,"cols":111}"#.into(),
    ))
    .await?;
    // The quotes keep the echoed command line from matching.
    ws.send(Message::Binary(b"stty size; echo DO''NE\n".to_vec().into()))
        .await?;
    let mut out = String::new();
    let mut closed = None;
    let until = tokio::time::Instant::now() + DEADLINE;
    while closed.is_none() {
        let message = tokio::time::timeout_at(until, ws.next())
            .await
            .with_context(|| format!("terminal output so far: {out:?}"))?;
        match message {
            Some(Ok(Message::Binary(data))) => {
                out.push_str(&String::from_utf8_lossy(&data));
                if out.contains("DONE") && !out.contains("exit 5") {
                    ensure!(out.contains("33 111"), "the resize took: {out:?}");
                    ws.send(Message::Binary(b"exit 5\n".to_vec().into()))
                        .await?;
                    out.push_str("exit 5");
                }
            }
            Some(Ok(Message::Close(frame))) => closed = Some(frame),
            Some(Ok(_)) => {}
            Some(Err(error)) => bail!("terminal: {error}; output {out:?}"),
            None => bail!("the terminal ended without a close frame: {out:?}"),
        }
    }
    let frame = closed.flatten().context("a close frame with a reason")?;
    assert_eq!(u16::from(frame.code), 1000);
    assert_eq!(frame.reason.as_str(), "terminal exited with code 5");

    let request = url("no-such-pod").as_str().into_client_request()?;
    match tokio_tungstenite::client_async(request, tls(&h).await?).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status().as_u16(), 404);
        }
        other => bail!("an unknown pod was not refused: {:?}", other.map(|_| ())),
    }
    h.stop().await
}
