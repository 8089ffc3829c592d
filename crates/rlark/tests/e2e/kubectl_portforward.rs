//! The real `kubectl port-forward` to a replica (issue 18, item 4): an in-process server,
//! a real raw agent, a Job whose replica runs a TCP echo server on the node's loopback,
//! and kubectl forwarding a local port to it — over its default transport (SPDY inside a
//! WebSocket) and over the SPDY upgrade it falls back to (forced with
//! `KUBECTL_PORT_FORWARD_WEBSOCKETS=false`). Bytes round-trip on connections one after
//! another and at once (more than SPDY's 64 KiB initial window each, which spdystream
//! never opens further), and a port nobody listens on gives kubectl's error. `rlark
//! port-forward task/NAME` and `pod/NAME` (kubectl's form) reach the same replica.
//!
//! Every wait is bounded by [`DEADLINE`].

use crate::missing_tool;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use rlark_api::types::PodPhase;
use rlark_testkit::real_agent::{DEADLINE, Harness, NAMESPACE, eventually};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// A TCP echo server on 127.0.0.1:PORT (argv[1]): echoes each connection until its EOF,
/// then closes it. No single quotes: it is passed inside them.
const ECHO_SERVER: &str = r#"
import socket, sys, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
def serve(c):
    while True:
        d = c.recv(65536)
        if not d:
            break
        c.sendall(d)
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

fn tool_available(program: &str, args: &[&str]) -> bool {
    std::process::Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A port free on 127.0.0.1 right now.
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A running `kubectl port-forward`, its local port, and its stderr so far.
struct Forward {
    child: Child,
    local: u16,
    stderr: Arc<Mutex<String>>,
}

impl Forward {
    /// `kubectl port-forward -n NAMESPACE pod/POD 0:REMOTE`, once it listens.
    async fn start(
        kubeconfig: &Path,
        home: &Path,
        pod: &str,
        remote: u16,
        websockets: bool,
    ) -> anyhow::Result<Forward> {
        let mut command = Command::new("kubectl");
        command
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--cache-dir")
            .arg(home.join("cache"))
            .args(["port-forward", "-n", NAMESPACE, "--address", "127.0.0.1"])
            // Level 4 logs the WebSocket dialer's negotiation.
            .arg("-v=4")
            .arg(format!("pod/{pod}"))
            .arg(format!("0:{remote}"))
            .env("HOME", home)
            .env_remove("KUBECONFIG")
            .env(
                "KUBECTL_PORT_FORWARD_WEBSOCKETS",
                if websockets { "true" } else { "false" },
            );
        Self::spawn(command).await
    }

    /// `rlark port-forward TARGET 0:REMOTE` (kubectl's form, through CONNECT), once it
    /// listens.
    async fn rlark(kubeconfig: &Path, target: &str, remote: u16) -> anyhow::Result<Forward> {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rlark"));
        command
            .args(["port-forward", target, &format!("0:{remote}")])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env_remove("KUBECONFIG");
        Self::spawn(command).await
    }

    /// Run `command` (a port-forward) until it prints "Forwarding from 127.0.0.1:LOCAL".
    async fn spawn(mut command: Command) -> anyhow::Result<Forward> {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().context("run the port-forward")?;
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err_lines = BufReader::new(child.stderr.take().context("stderr")?).lines();
        let collected = Arc::clone(&stderr);
        tokio::spawn(async move {
            while let Ok(Some(line)) = err_lines.next_line().await {
                let mut all = collected.lock().unwrap();
                all.push_str(&line);
                all.push('\n');
            }
        });
        let mut out_lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
        // "Forwarding from 127.0.0.1:LOCAL -> REMOTE"
        let local = tokio::time::timeout(DEADLINE, async {
            while let Some(line) = out_lines.next_line().await? {
                if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:")
                    && let Some((port, _)) = rest.split_once(' ')
                {
                    return Ok(port.parse::<u16>()?);
                }
            }
            anyhow::bail!("the port-forward ended before listening")
        })
        .await
        .with_context(|| {
            format!(
                "the port-forward did not listen in time; stderr: {}",
                stderr.lock().unwrap()
            )
        })?
        .with_context(|| format!("stderr: {}", stderr.lock().unwrap()))?;
        // Keep draining stdout ("Handling connection for ...").
        tokio::spawn(async move { while let Ok(Some(_)) = out_lines.next_line().await {} });
        Ok(Forward {
            child,
            local,
            stderr,
        })
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Send `payload` on a new connection to the local port, half-close, and read until the
    /// echo server closes: the bytes that came back.
    async fn round_trip(&self, payload: Vec<u8>) -> anyhow::Result<Vec<u8>> {
        tokio::time::timeout(DEADLINE, async {
            let stream = TcpStream::connect(("127.0.0.1", self.local)).await?;
            let (mut read, mut write) = stream.into_split();
            // Written while reading, so a large payload cannot fill every buffer on the way.
            let writer = tokio::spawn(async move {
                write.write_all(&payload).await?;
                write.shutdown().await?;
                anyhow::Ok(write)
            });
            let mut back = Vec::new();
            read.read_to_end(&mut back).await?;
            let _write = writer.await??;
            anyhow::Ok(back)
        })
        .await
        .with_context(|| format!("round trip timed out; kubectl stderr: {}", self.stderr()))?
    }
}

fn payload(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_port_forwards_to_a_replica() -> anyhow::Result<()> {
    if !tool_available("kubectl", &["version", "--client"]) {
        missing_tool::skip_or_fail("kubectl is not on PATH");
        return Ok(());
    }
    if !tool_available("python3", &["--version"]) {
        missing_tool::skip_or_fail("python3 is not on PATH");
        return Ok(());
    }
    let h = Harness::start().await?;
    let home = tempfile::tempdir()?;
    let kubeconfig = h.server.kubeconfig_path().to_path_buf();
    // The replica is a raw process on the agent's host, this machine: it listens on the
    // node's loopback, where the agent dials.
    let port = free_port()?;
    h.create_job("echo", &format!("exec python3 -c '{ECHO_SERVER}' {port}"))
        .await?;
    h.wait_pod("echo-main-0", PodPhase::Running).await?;
    eventually("the echo server listens", || async {
        Ok(TcpStream::connect(("127.0.0.1", port)).await.ok().map(drop))
    })
    .await?;

    for websockets in [true, false] {
        let forward =
            Forward::start(&kubeconfig, home.path(), "echo-main-0", port, websockets).await?;
        let transport = if websockets { "websocket" } else { "spdy" };
        // One connection after another.
        for seed in 0..2u8 {
            let sent = payload(seed, 1000);
            let back = forward.round_trip(sent.clone()).await?;
            assert!(
                back == sent,
                "{transport}: connection {seed} got {} bytes back, sent {}; stderr: {}",
                back.len(),
                sent.len(),
                forward.stderr()
            );
        }
        // Two at once, each beyond SPDY's initial 64 KiB window.
        let (a, b) = (payload(7, 300_000), payload(9, 200_000));
        let (back_a, back_b) =
            tokio::try_join!(forward.round_trip(a.clone()), forward.round_trip(b.clone()))?;
        assert!(
            back_a == a && back_b == b,
            "{transport}: concurrent connections got {} and {} bytes back; stderr: {}",
            back_a.len(),
            back_b.len(),
            forward.stderr()
        );
        // The transport asked for is the one used: kubectl's WebSocket dialer logs its
        // negotiation (at -v=4), and the SPDY upgrade never goes through it.
        let stderr = forward.stderr();
        assert_eq!(
            stderr.contains("tunneling_dialer.go")
                && stderr.contains("negotiated protocol: portforward.k8s.io"),
            websockets,
            "{transport}: {stderr}"
        );
        let mut child = forward.child;
        child.kill().await?;
    }

    // `rlark port-forward` in kubectl's form, by task (its replica 0) and by pod: the
    // same replica, reached through the server's CONNECT.
    for target in ["task/echo-main", "pod/echo-main-0"] {
        let forward = Forward::rlark(&kubeconfig, target, port).await?;
        let sent = payload(3, 100_000);
        let back = forward.round_trip(sent.clone()).await?;
        assert!(
            back == sent,
            "rlark port-forward {target}: {} bytes back of {}; stderr: {}",
            back.len(),
            sent.len(),
            forward.stderr()
        );
        let mut child = forward.child;
        child.kill().await?;
    }

    // A port nobody listens on: the connection is closed, kubectl reports the agent's
    // dial error on its error stream and gives up the forward.
    let nobody = free_port()?;
    let mut forward = Forward::start(&kubeconfig, home.path(), "echo-main-0", nobody, true).await?;
    let back = forward.round_trip(b"anyone?".to_vec()).await?;
    assert!(back.is_empty(), "{back:?}");
    let status = tokio::time::timeout(DEADLINE, forward.child.wait())
        .await
        .with_context(|| format!("kubectl kept running; stderr: {}", forward.stderr()))??;
    assert!(!status.success());
    let stderr = eventually("kubectl's error is printed", || async {
        let stderr = forward.stderr();
        Ok(stderr.contains("lost connection to pod").then_some(stderr))
    })
    .await?;
    let expected = format!("an error occurred forwarding {} -> {nobody}", forward.local);
    assert!(stderr.contains(&expected), "{stderr}");
    assert!(
        stderr.contains(&format!("dial 127.0.0.1:{nobody} on node host-0")),
        "{stderr}"
    );

    h.stop().await
}
