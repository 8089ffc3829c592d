//! Hostile SSH clients (issue 38, "SSH can be locked out and starved"), end to end with
//! the real OpenSSH client against an in-process server and a real agent:
//!
//! - **lock-out**: 64 silent TCP connections from each of 17 loopback addresses (what the
//!   finding used) do not keep a granted user's `ssh` out: it gets a reserve slot;
//! - **starvation**: one granted user's flood of `-L` channels into their task takes at
//!   most their share of the agent's tunnel streams, so the admin's task proxy request to
//!   another task on the same agent still succeeds; the refusal names the limit.
//!
//! Every wait is bounded by [`DEADLINE`]. Without `ssh` (or under `CI=true` /
//! `RLARK_REQUIRE_TOOLS=1`, fails) the tests are skipped with a message.

use crate::missing_tool;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Output, Stdio};

use anyhow::{Context as _, ensure};
use kube::api::{Api, PostParams};
use rlark_api::types::{Job, PodPhase};
use rlark_testkit::real_agent::{DEADLINE, Harness, NAMESPACE, eventually, text, viewer_client};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// A TCP echo server (one thread per connection, connections held until the peer closes),
/// run by a replica: `python3 -c ECHO PORT`.
const ECHO: &str = "import socket, sys, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', int(sys.argv[1])))
s.listen(512)
def serve(c):
    while True:
        d = c.recv(4096)
        if not d:
            break
        c.sendall(d)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
";

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|path| path.is_file())
    })
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The client side: a key, known_hosts, the options every `ssh` gets.
struct Client {
    dir: tempfile::TempDir,
    port: u16,
}

impl Client {
    async fn new(h: &Harness) -> anyhow::Result<(Client, kube::Client)> {
        let endpoint = h.server.ssh().context("the SSH endpoint is on")?.clone();
        let client = Client {
            dir: tempfile::tempdir()?,
            port: endpoint.addr.port(),
        };
        std::fs::write(
            client.dir.path().join("known_hosts"),
            format!("[127.0.0.1]:{} {}\n", client.port, endpoint.host_key),
        )?;
        let key = client.dir.path().join("vera");
        let out = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "vera", "-f"])
            .arg(&key)
            .output()?;
        ensure!(out.status.success(), "ssh-keygen: {}", text(&out.stderr));
        let public = std::fs::read_to_string(key.with_extension("pub"))?;
        // vera registers her key with her own (viewer) certificate.
        let vera = viewer_client(&h.server, &h.admin, client.dir.path()).await?;
        let request = http::Request::post("/rlark/v1/sshkeys")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(json!({"publicKey": public}).to_string().into_bytes())?;
        vera.request::<Value>(request).await?;
        Ok((client, vera))
    }

    fn ssh(&self, login: &str, extra: &[&str]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new("ssh");
        command
            .args([
                "-F",
                "/dev/null",
                "-o",
                "BatchMode=yes",
                "-o",
                "IdentitiesOnly=yes",
            ])
            .args(["-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=20"])
            .arg("-o")
            .arg(format!(
                "UserKnownHostsFile={}",
                self.dir.path().join("known_hosts").display()
            ))
            .arg("-i")
            .arg(self.dir.path().join("vera"))
            .args(["-p", &self.port.to_string()])
            .args(extra)
            .arg(format!("{login}@127.0.0.1"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    async fn output(&self, login: &str, args: &[&str]) -> anyhow::Result<Output> {
        let mut command = self.ssh(login, &[]);
        command.args(args);
        tokio::time::timeout(DEADLINE, command.output())
            .await
            .context("ssh timed out")?
            .context("run ssh")
    }
}

/// Create Job `name` whose raw task `main` runs `entrypoint`, granted to `access`.
async fn create_job(
    admin: &kube::Client,
    name: &str,
    entrypoint: Value,
    access: Value,
) -> anyhow::Result<()> {
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"access": access, "tasks": [{
            "name": "main", "agentType": "Raw", "role": "Actor",
            "raw": {"entrypoint": entrypoint},
        }]},
    }))?;
    Api::<Job>::all(admin.clone())
        .create(&PostParams::default(), &job)
        .await?;
    Ok(())
}

/// GET `path` as `client`: status and body.
async fn get(client: &kube::Client, path: &str) -> anyhow::Result<(u16, String)> {
    let request = http::Request::get(path).body(Vec::new())?;
    match client.send(request.map(kube::client::Body::from)).await {
        Ok(response) => {
            let status = response.status().as_u16();
            let body = http_body_util::BodyExt::collect(response.into_body())
                .await?
                .to_bytes();
            Ok((status, String::from_utf8_lossy(&body).into_owned()))
        }
        Err(kube::Error::Api(status)) => Ok((status.code, status.message)),
        Err(other) => Err(other.into()),
    }
}

/// Connect to `server` from `source` and read the server's first bytes: `Some(line)` for
/// a connection it keeps (its SSH version line, or a refusal line before it closes),
/// `None` when it closed without a word.
async fn silent_connection(
    source: Ipv4Addr,
    server: SocketAddr,
) -> anyhow::Result<(tokio::net::TcpStream, Option<String>)> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source.into(), 0))?;
    let mut tcp = socket.connect(server).await?;
    let mut first = [0u8; 256];
    let n = tokio::time::timeout(DEADLINE, tcp.read(&mut first))
        .await
        .context("the server said nothing")??;
    let line = (n > 0).then(|| String::from_utf8_lossy(&first[..n]).into_owned());
    Ok((tcp, line))
}

/// Issue 38, "SSH can be locked out": 64 silent connections from each of 17 loopback
/// addresses filled the SSH endpoint's 1,024 connections, and a granted user's `ssh` was
/// refused until they timed out. Now the silent crowd fills the general budget, a few of
/// them are refused with a line naming the limit, and the user's `ssh` from another
/// address gets one of the reserved slots and runs its command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_do_not_lock_out_a_granted_login() -> anyhow::Result<()> {
    if which("ssh").is_none() {
        missing_tool::skip_or_fail("ssh is not installed (Debian openssh-client)");
        return Ok(());
    }
    let supervisor = vec![env!("CARGO_BIN_EXE_rlark").into(), "supervise".into()];
    let h = Harness::start_configured(supervisor, |config| {
        config.ssh_listen = Some("127.0.0.1:0".parse().expect("address"));
    })
    .await?;
    let (client, _vera) = Client::new(&h).await?;
    create_job(
        &h.admin,
        "web",
        json!(["sleep", "600"]),
        json!([{"user": "vera"}]),
    )
    .await?;
    h.wait_pod("web-main-0", PodPhase::Running).await?;
    let server = h.server.ssh().context("ssh")?.addr;

    // The crowd: 64 silent connections from each of 127.0.0.2 ..= 127.0.0.18.
    let mut crowd = Vec::new();
    let mut refused = Vec::new();
    for source in 2..=18u8 {
        for _ in 0..64 {
            let (tcp, first) = silent_connection(Ipv4Addr::new(127, 0, 0, source), server).await?;
            match first {
                Some(line) if line.starts_with("SSH-") => crowd.push(tcp),
                other => refused.push(other),
            }
        }
    }
    ensure!(
        !refused.is_empty(),
        "17 × 64 connections did not reach any limit"
    );
    // The granted user, from 127.0.0.1, while the crowd holds its connections.
    let out = client
        .output("web-main", &["echo in-$RLARK_POD_NAME"])
        .await?;
    assert_eq!(
        (out.status.code(), text(&out.stdout).trim()),
        (Some(0), "in-web-main-0"),
        "{}",
        text(&out.stderr)
    );

    // A refusal says why.
    assert!(
        refused.iter().any(|r| r
            .as_deref()
            .is_some_and(|l| l.contains("ssh.maxConnections"))),
        "{:?}",
        refused.first()
    );

    // The crowd never logged in: the login deadline disconnects it.
    let mut last = crowd.pop().context("a crowd")?;
    let mut rest = Vec::new();
    let end = tokio::time::timeout(DEADLINE, last.read_to_end(&mut rest)).await;
    assert!(
        end.is_ok(),
        "a connection that never authenticated was still open after {DEADLINE:?}"
    );
    drop(crowd);
    h.stop().await
}

/// Open one connection to the local end of an `ssh -L` forward and find out whether its
/// channel was opened: an echo comes back (`true`), or ssh closes it (`false`).
async fn forwarded_echo(local: u16) -> anyhow::Result<(tokio::net::TcpStream, bool)> {
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", local)).await?;
    tcp.write_all(b"ping\n").await?;
    let mut answer = [0u8; 5];
    let read = tokio::time::timeout(DEADLINE, tcp.read_exact(&mut answer)).await;
    let held = match read {
        Ok(Ok(_)) => {
            ensure!(&answer == b"ping\n", "the echo said {answer:?}");
            true
        }
        Ok(Err(_)) => false,
        Err(_) => anyhow::bail!("a forwarded connection neither echoed nor closed"),
    };
    Ok((tcp, held))
}

/// Issue 38, "SSH can be ... starved": one granted user's `direct-tcpip` channels took all
/// of the agent's tunnel streams, and the admin's task proxy request to another task on
/// that agent got 503. The hub here allows 40 streams per agent session (a user's share is
/// a quarter, 10); vera opens 45 forwarded connections into her task and holds them: 10
/// are carried, the others refused; the admin still reaches the other task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_flood_leaves_another_tasks_proxy_working() -> anyhow::Result<()> {
    if which("ssh").is_none() || which("python3").is_none() {
        missing_tool::skip_or_fail("ssh or python3 is not installed");
        return Ok(());
    }
    let supervisor = vec![env!("CARGO_BIN_EXE_rlark").into(), "supervise".into()];
    let h = Harness::start_configured(supervisor, |config| {
        config.ssh_listen = Some("127.0.0.1:0".parse().expect("address"));
        config.tunnel.mux.max_streams = 40;
    })
    .await?;
    let (client, _vera) = Client::new(&h).await?;
    let echo_port = free_port()?;
    create_job(
        &h.admin,
        "flood",
        json!(["python3", "-c", ECHO, echo_port.to_string()]),
        json!([{"user": "vera"}]),
    )
    .await?;
    let web_port = free_port()?;
    create_job(
        &h.admin,
        "other",
        json!(["sh", "-c", format!("echo other-page > page.txt; exec python3 -m http.server {web_port} --bind 127.0.0.1")]),
        json!([]),
    )
    .await?;
    h.wait_pod("flood-main-0", PodPhase::Running).await?;
    h.wait_pod("other-main-0", PodPhase::Running).await?;
    let page =
        format!("/rlark/v1/namespaces/{NAMESPACE}/tasks/other-main/proxy/{web_port}/page.txt");
    eventually("the other task's page", || async {
        let (status, body) = get(&h.admin, &page).await?;
        Ok((status == 200).then_some(body))
    })
    .await?;

    // vera's forward, and the echo through it once (the replica listens).
    let local = free_port()?;
    let mut forward = client.ssh(
        "flood-main",
        &["-N", "-L", &format!("{local}:localhost:{echo_port}")],
    );
    let mut forward = forward.spawn()?;
    let first = eventually("the forward echoes", || async {
        Ok(forwarded_echo(local)
            .await
            .ok()
            .filter(|(_, held)| *held)
            .map(|(tcp, _)| tcp))
    })
    .await?;

    // The flood: 44 more held connections, each its own channel and agent stream.
    let mut held = vec![first];
    let mut refused = 0;
    for _ in 0..44 {
        let (tcp, ok) = forwarded_echo(local).await?;
        if ok {
            held.push(tcp);
        } else {
            refused += 1;
        }
    }
    // The admin's proxy request to the other task on the same agent.
    let (status, body) = get(&h.admin, &page).await?;
    assert_eq!((status, body.trim()), (200, "other-page"));
    assert!(
        held.len() <= 10,
        "vera holds {} streams of the agent, more than her share of 10",
        held.len()
    );
    assert!(refused > 0);

    // The refusal is counted.
    let (_, metrics) = get(&h.admin, "/metrics").await?;
    let refusals = metrics
        .lines()
        .find(|l| l.starts_with("rlark_ssh_refused_total{limit=\"agent-streams-per-user\"}"))
        .with_context(|| format!("no agent-streams-per-user refusals counted:\n{metrics}"))?;
    assert!(!refusals.ends_with(" 0"), "{refusals}");

    drop(held);
    forward.kill().await?;
    h.stop().await
}

/// The per-connection channel cap, as the real client sees it: with
/// `ssh.maxChannelsPerConnection` at 3, a fourth forwarded connection on one `ssh -L` is
/// refused and the client prints the reason, naming the setting; closing one makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_over_the_connections_cap_is_refused_naming_the_limit() -> anyhow::Result<()> {
    if which("ssh").is_none() || which("python3").is_none() {
        missing_tool::skip_or_fail("ssh or python3 is not installed");
        return Ok(());
    }
    let supervisor = vec![env!("CARGO_BIN_EXE_rlark").into(), "supervise".into()];
    let h = Harness::start_configured(supervisor, |config| {
        config.ssh_listen = Some("127.0.0.1:0".parse().expect("address"));
        config.ssh.max_channels_per_connection = 3;
    })
    .await?;
    let (client, _vera) = Client::new(&h).await?;
    let echo_port = free_port()?;
    create_job(
        &h.admin,
        "echo",
        json!(["python3", "-c", ECHO, echo_port.to_string()]),
        json!([{"user": "vera"}]),
    )
    .await?;
    h.wait_pod("echo-main-0", PodPhase::Running).await?;
    let local = free_port()?;
    let mut forward = client.ssh(
        "echo-main",
        &["-N", "-L", &format!("{local}:localhost:{echo_port}")],
    );
    let mut forward = forward.spawn()?;
    let first = eventually("the forward echoes", || async {
        Ok(forwarded_echo(local)
            .await
            .ok()
            .filter(|(_, held)| *held)
            .map(|(tcp, _)| tcp))
    })
    .await?;
    let (second, ok) = forwarded_echo(local).await?;
    assert!(ok, "the second channel");
    let (third, ok) = forwarded_echo(local).await?;
    assert!(ok, "the third channel");
    let (_, ok) = forwarded_echo(local).await?;
    assert!(!ok, "a fourth channel on the connection was opened");
    drop(first);
    let again = eventually("a closed channel makes room", || async {
        Ok(forwarded_echo(local)
            .await
            .ok()
            .filter(|(_, held)| *held)
            .map(|(tcp, _)| tcp))
    })
    .await?;
    drop((second, third, again));
    forward.kill().await?;
    let out = forward.wait_with_output().await?;
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("ssh.maxChannelsPerConnection"),
        "the client was not told why: {stderr}"
    );
    h.stop().await
}
