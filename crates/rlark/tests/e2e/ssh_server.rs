//! The SSH endpoint end to end, with the real OpenSSH client (`ssh`, `scp`; Debian
//! `openssh-client`): an in-process server with `ssh_listen`, a real agent, a Job whose raw
//! task serves HTTP on its loopback, and
//! - a registered key: a command with its exit code, a shell on a terminal that follows a
//!   resize (`stty size`), an `-L` forward to the task's HTTP server, `scp` in and out;
//! - a user the Job does not grant, a key nobody registered: refused;
//! - an SSH certificate: its open session closed within 1 s of its revocation, the next
//!   connection refused;
//! - the audit record of each.
//!
//! Every wait is bounded by [`DEADLINE`]. Without `ssh` (or under `CI=true` /
//! `RLARK_REQUIRE_TOOLS=1`, fails) the test is skipped with a message.

use crate::missing_tool;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use kube::api::{Api, PostParams};
use rlark_api::types::{Job, PodPhase};
use rlark_testkit::real_agent::{DEADLINE, Harness, eventually, text, viewer_client};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The task with access granted to `vera` (registered key) and `carol` (certificate).
const TASK: &str = "web-main";
/// A task of a Job that grants nobody.
const OTHER: &str = "private-main";

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn run(program: &str, args: &[&str]) -> anyhow::Result<Output> {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("run {program}"))?;
    Ok(out)
}

/// The client side: keys, known_hosts, the options every `ssh` gets.
struct Client {
    dir: tempfile::TempDir,
    port: u16,
}

impl Client {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn keygen(&self, name: &str) -> anyhow::Result<String> {
        let key = self.path(name);
        let out = run(
            "ssh-keygen",
            &[
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                name,
                "-f",
                key.to_str().context("path")?,
            ],
        )?;
        ensure!(out.status.success(), "ssh-keygen: {}", text(&out.stderr));
        Ok(std::fs::read_to_string(self.path(&format!("{name}.pub")))?)
    }

    /// The options of every connection with identity `key` (and its `-cert.pub` when
    /// `cert`): this server only, its host key pinned, no agent, no config.
    fn options(&self, key: &str, cert: bool) -> Vec<String> {
        let mut options = vec![
            "-F".to_string(),
            "/dev/null".into(),
            "-o".into(),
            "BatchMode=yes".into(),
            "-o".into(),
            "IdentitiesOnly=yes".into(),
            "-o".into(),
            "StrictHostKeyChecking=yes".into(),
            "-o".into(),
            format!("UserKnownHostsFile={}", self.path("known_hosts").display()),
            "-o".into(),
            "ConnectTimeout=20".into(),
            "-i".into(),
            self.path(key).display().to_string(),
        ];
        if cert {
            options.extend([
                "-o".into(),
                format!(
                    "CertificateFile={}",
                    self.path(&format!("{key}-cert.pub")).display()
                ),
            ]);
        }
        options
    }

    fn ssh(&self, key: &str, cert: bool, login: &str, extra: &[&str]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new("ssh");
        command
            .args(self.options(key, cert))
            .args(["-p", &self.port.to_string()])
            .args(extra)
            .arg(format!("{login}@127.0.0.1"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    async fn output(
        &self,
        key: &str,
        cert: bool,
        login: &str,
        args: &[&str],
    ) -> anyhow::Result<Output> {
        let mut command = self.ssh(key, cert, login, &[]);
        command.args(args);
        tokio::time::timeout(DEADLINE, command.output())
            .await
            .context("ssh timed out")?
            .context("run ssh")
    }
}

fn audit_lines(data_dir: &Path) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(data_dir.join("audit.log"))?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// Wait until the audit log has a record for which `matches` holds.
async fn audited(
    data_dir: &Path,
    what: &str,
    matches: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    eventually(what, || async {
        Ok(audit_lines(data_dir)?.into_iter().find(|e| matches(e)))
    })
    .await
}

async fn post(client: &kube::Client, path: &str, body: Value) -> anyhow::Result<Value> {
    let request = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body.to_string().into_bytes())?;
    Ok(client.request::<Value>(request).await?)
}

async fn create_job(
    admin: &kube::Client,
    name: &str,
    script: &str,
    access: Value,
    ssh_public_key: Option<&str>,
) -> anyhow::Result<()> {
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "access": access,
            "sshPublicKey": ssh_public_key,
            "tasks": [{
                "name": "main",
                "agentType": "Raw",
                "role": "Actor",
                "raw": {"entrypoint": ["sh", "-c", script]},
            }],
        },
    }))?;
    Api::<Job>::all(admin.clone())
        .create(&PostParams::default(), &job)
        .await?;
    Ok(())
}

/// Read from a PTY master until `needle` appeared (bounded by [`DEADLINE`]); what was read.
async fn read_until(
    pty: &mut pty_process::Pty,
    seen: &mut String,
    needle: &str,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut buffer = [0u8; 4096];
    while !seen.contains(needle) {
        let n = tokio::time::timeout_at(deadline, pty.read(&mut buffer))
            .await
            .with_context(|| format!("waiting for {needle:?}; the terminal showed {seen:?}"))??;
        if n == 0 {
            bail!("the terminal closed before {needle:?}; it showed {seen:?}");
        }
        seen.push_str(&String::from_utf8_lossy(&buffer[..n]));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openssh_reaches_granted_tasks_only() -> anyhow::Result<()> {
    if which("ssh").is_none() || which("scp").is_none() {
        missing_tool::skip_or_fail("ssh or scp is not installed (Debian openssh-client)");
        return Ok(());
    }
    let supervisor = vec![env!("CARGO_BIN_EXE_rlark").into(), "supervise".into()];
    let h = Harness::start_configured(supervisor, |config| {
        config.ssh_listen = Some("127.0.0.1:0".parse().expect("address"));
    })
    .await?;
    let endpoint = h.server.ssh().context("the SSH endpoint is on")?.clone();
    let data_dir = h.server.data_dir().to_path_buf();
    let client = Client {
        dir: tempfile::tempdir()?,
        port: endpoint.addr.port(),
    };
    std::fs::write(
        client.path("known_hosts"),
        format!("[127.0.0.1]:{} {}\n", client.port, endpoint.host_key),
    )?;

    // vera registers a key through the API, with her own (viewer) certificate.
    let vera = viewer_client(&h.server, &h.admin, client.dir.path()).await?;
    let vera_key = client.keygen("vera")?;
    let record = post(&vera, "/rlark/v1/sshkeys", json!({"publicKey": vera_key})).await?;
    assert_eq!(record["user"], "vera");
    // carol gets an ssh-guest certificate from the admin.
    let carol_key = client.keygen("carol")?;
    let signed = post(
        &h.admin,
        "/rlark/v1/sshcertificates",
        json!({"role": "ssh-guest", "user": "carol", "publicKey": carol_key}),
    )
    .await?;
    std::fs::write(
        client.path("carol-cert.pub"),
        signed["certificate"].as_str().context("certificate")?,
    )?;
    // bob's key is registered nowhere; dave's is the private Job's sshPublicKey.
    client.keygen("bob")?;
    let dave_key = client.keygen("dave")?;

    let http_port = free_port()?;
    create_job(
        &h.admin,
        "web",
        &format!(
            "echo served > page.txt; exec python3 -m http.server {http_port} --bind 127.0.0.1"
        ),
        json!([{"user": "vera"}, {"user": "carol"}]),
        None,
    )
    .await?;
    create_job(
        &h.admin,
        "private",
        "sleep 600",
        json!([]),
        Some(dave_key.trim()),
    )
    .await?;
    h.wait_pod(&format!("{TASK}-0"), PodPhase::Running).await?;
    h.wait_pod(&format!("{OTHER}-0"), PodPhase::Running).await?;

    // A command: its output, stderr and exit code, in the replica's directory.
    let out = client
        .output(
            "vera",
            false,
            TASK,
            &["echo $RLARK_POD_NAME; basename $(pwd); echo oops >&2; exit 3"],
        )
        .await?;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "web-main-0\nwork\n");
    assert!(text(&out.stderr).contains("oops"), "{}", text(&out.stderr));
    let entry = audited(&data_dir, "the command's audit record", |e| {
        e["action"] == "ssh"
            && e["user"] == "vera"
            && e["reason"].as_str().is_some_and(|r| r.contains("exit 3"))
    })
    .await?;
    assert_eq!(entry["name"], "web-main-0");
    assert!(
        entry["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("bytes in"),
        "{entry}"
    );

    // Both directions at once, in bulk: 8 MiB through `cat` and back.
    let mut cat = client.ssh("vera", false, TASK, &[]);
    cat.arg("cat").stdin(Stdio::piped());
    let mut cat = cat.spawn()?;
    let mut stdin = cat.stdin.take().context("stdin")?;
    let sent: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
    let writer = {
        let sent = sent.clone();
        tokio::spawn(async move {
            stdin.write_all(&sent).await?;
            stdin.shutdown().await
        })
    };
    let out = tokio::time::timeout(DEADLINE, cat.wait_with_output())
        .await
        .context("8 MiB through cat timed out")??;
    writer.await??;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(out.stdout == sent, "{} bytes came back", out.stdout.len());

    // A shell on a terminal: the size follows the client's terminal, the exit status comes back.
    let (mut pty, pts) = pty_process::open()?;
    pty.resize(pty_process::Size::new(30, 100))?;
    let mut shell = pty_process::Command::new("ssh")
        .args(client.options("vera", false))
        .args([
            "-tt",
            "-p",
            &client.port.to_string(),
            &format!("{TASK}@127.0.0.1"),
        ])
        .kill_on_drop(true)
        .spawn(pts)?;
    let mut seen = String::new();
    pty.write_all(b"stty size\n").await?;
    read_until(&mut pty, &mut seen, "30 100").await?;
    pty.resize(pty_process::Size::new(40, 120))?;
    // The resize reaches the replica's terminal asynchronously: ask until it shows.
    let started = Instant::now();
    loop {
        pty.write_all(b"stty size\n").await?;
        let mut buffer = [0u8; 4096];
        if let Ok(Ok(n)) =
            tokio::time::timeout(Duration::from_millis(500), pty.read(&mut buffer)).await
        {
            seen.push_str(&String::from_utf8_lossy(&buffer[..n]));
        }
        if seen.contains("40 120") {
            break;
        }
        ensure!(
            started.elapsed() < DEADLINE,
            "the resize never showed: {seen:?}"
        );
    }
    pty.write_all(b"exit 7\n").await?;
    let status = tokio::time::timeout(DEADLINE, shell.wait()).await??;
    assert_eq!(status.code(), Some(7), "{seen}");
    audited(&data_dir, "the shell's audit record", |e| {
        e["action"] == "ssh"
            && e["reason"]
                .as_str()
                .is_some_and(|r| r.starts_with("shell") && r.contains("exit 7"))
    })
    .await?;

    // The menu on a terminal: pick a replica by number, get a shell there.
    let (mut pty, pts) = pty_process::open()?;
    pty.resize(pty_process::Size::new(24, 80))?;
    let mut menu = pty_process::Command::new("ssh")
        .args(client.options("vera", false))
        .args(["-tt", "-p", &client.port.to_string(), "menu@127.0.0.1"])
        .kill_on_drop(true)
        .spawn(pts)?;
    let mut seen = String::new();
    read_until(&mut pty, &mut seen, "Number (q to quit): ").await?;
    assert!(seen.contains("rlark-a/web-main-0"), "{seen}");
    assert!(!seen.contains(OTHER), "{seen}");
    pty.write_all(b"1\r").await?;
    pty.write_all(b"echo in-$RLARK_POD_NAME\n").await?;
    read_until(&mut pty, &mut seen, "in-web-main-0").await?;
    pty.write_all(b"exit 0\n").await?;
    let status = tokio::time::timeout(DEADLINE, menu.wait()).await??;
    assert_eq!(status.code(), Some(0), "{seen}");

    // -L: the task's HTTP server through the tunnel.
    let local = free_port()?;
    let mut forward = client.ssh(
        "vera",
        false,
        TASK,
        &["-N", "-L", &format!("{local}:localhost:{http_port}")],
    );
    let _forward = forward.spawn()?;
    let body = eventually("the forwarded HTTP server answers", || async move {
        let Ok(mut tcp) = tokio::net::TcpStream::connect(("127.0.0.1", local)).await else {
            return Ok(None);
        };
        tcp.write_all(b"GET /page.txt HTTP/1.0\r\nHost: x\r\n\r\n")
            .await?;
        let mut response = Vec::new();
        let _ = tcp.read_to_end(&mut response).await;
        let response = String::from_utf8_lossy(&response).into_owned();
        Ok(response.contains("200").then_some(response))
    })
    .await?;
    assert!(body.ends_with("served\n"), "{body}");
    audited(&data_dir, "the forward's audit record", |e| {
        e["action"] == "ssh-forward" && e["decision"] == "allowed"
    })
    .await?;
    drop(_forward);
    // A forward anywhere but the replica is refused.
    let out = client
        .output(
            "vera",
            false,
            TASK,
            &["-o", "ExitOnForwardFailure=yes", "-W", "10.255.255.1:80"],
        )
        .await?;
    assert_ne!(out.status.code(), Some(0));
    audited(&data_dir, "the refused forward's audit record", |e| {
        e["action"] == "ssh-forward" && e["decision"] == "denied"
    })
    .await?;

    // scp in and out of the replica's working directory (SFTP, scp's default).
    let local_file = client.path("upload.txt");
    std::fs::write(&local_file, "uploaded through rlark\n")?;
    let scp = |args: Vec<String>| async move {
        let mut command = tokio::process::Command::new("scp");
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        tokio::time::timeout(DEADLINE, command.output())
            .await?
            .context("run scp")
    };
    let mut args = client.options("vera", false);
    args.extend(["-P".into(), client.port.to_string()]);
    let mut up = args.clone();
    up.extend([
        local_file.display().to_string(),
        format!("{TASK}@127.0.0.1:copied.txt"),
    ]);
    let out = scp(up).await?;
    assert!(out.status.success(), "scp in: {}", text(&out.stderr));
    let work = h.work_dir(TASK).await?;
    assert_eq!(
        std::fs::read_to_string(work.join("copied.txt"))?,
        "uploaded through rlark\n"
    );
    let mut down = args.clone();
    down.extend([
        format!("{TASK}@127.0.0.1:page.txt"),
        client.path("page.txt").display().to_string(),
    ]);
    let out = scp(down).await?;
    assert!(out.status.success(), "scp out: {}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(client.path("page.txt"))?,
        "served\n"
    );
    audited(&data_dir, "the sftp session's audit record", |e| {
        e["action"] == "ssh" && e["reason"].as_str().is_some_and(|r| r.starts_with("sftp"))
    })
    .await?;

    // The menu lists what vera may reach, and only that.
    let out = client.output("vera", false, "menu", &["list"]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("rlark-a/web-main-0"),
        "{}",
        text(&out.stdout)
    );
    assert!(!text(&out.stdout).contains(OTHER), "{}", text(&out.stdout));

    // A task vera was not granted: refused at authentication, audited with the reason.
    let out = client.output("vera", false, OTHER, &["true"]).await?;
    assert_eq!(out.status.code(), Some(255), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("Permission denied"),
        "{}",
        text(&out.stderr)
    );
    audited(&data_dir, "the denial's audit record", |e| {
        e["decision"] == "denied"
            && e["user"] == "vera"
            && e["name"] == OTHER
            && e["reason"]
                .as_str()
                .is_some_and(|r| r.contains("does not grant it"))
    })
    .await?;

    // The Job's sshPublicKey reaches that Job's task, and no other.
    let out = client
        .output("dave", false, OTHER, &["echo $RLARK_TASK"])
        .await?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "private-main\n");
    let out = client.output("dave", false, TASK, &["true"]).await?;
    assert_eq!(out.status.code(), Some(255), "{}", text(&out.stderr));

    // Editing the key away from the Task closes dave's open session.
    let mut session = client.ssh("dave", false, OTHER, &[]);
    session.arg("echo started; exec sleep 600");
    let mut session = session.spawn()?;
    let mut stdout = session.stdout.take().context("stdout")?;
    let mut first = [0u8; 8];
    tokio::time::timeout(DEADLINE, stdout.read_exact(&mut first)).await??;
    assert_eq!(&first, b"started\n");
    let tasks: Api<rlark_api::types::Task> =
        Api::namespaced(h.admin.clone(), rlark_testkit::real_agent::NAMESPACE);
    tasks
        .patch(
            OTHER,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"sshPublicKey": null}})),
        )
        .await?;
    let status = tokio::time::timeout(DEADLINE, session.wait())
        .await
        .context("the session of a key edited away from its Task is still open")??;
    assert_ne!(status.code(), Some(0));
    audited(&data_dir, "the task-key close's audit record", |e| {
        e["action"] == "ssh-close"
            && e["reason"]
                .as_str()
                .is_some_and(|r| r.contains("sshPublicKey of task"))
    })
    .await?;

    // A key nobody registered.
    let out = client.output("bob", false, TASK, &["true"]).await?;
    assert_eq!(out.status.code(), Some(255), "{}", text(&out.stderr));
    audited(&data_dir, "the unknown key's audit record", |e| {
        e["decision"] == "denied"
            && e["reason"]
                .as_str()
                .is_some_and(|r| r.contains("is not registered"))
    })
    .await?;

    // carol's certificate works; revoking it closes her open session within 1 s, and the
    // next connection is refused.
    let mut session = client.ssh("carol", true, TASK, &[]);
    session.arg("echo started; exec sleep 600");
    let mut session = session.spawn()?;
    let mut stdout = session.stdout.take().context("stdout")?;
    let mut first = [0u8; 8];
    tokio::time::timeout(DEADLINE, stdout.read_exact(&mut first)).await??;
    assert_eq!(&first, b"started\n");
    let serial = signed["serialHex"].as_str().context("serialHex")?;
    let revoked_at = Instant::now();
    post(
        &h.admin,
        "/rlark/v1/revocations",
        json!({"serial": serial, "reason": "test"}),
    )
    .await?;
    let status = tokio::time::timeout(Duration::from_secs(1), session.wait())
        .await
        .context("the session of a revoked certificate is still open 1 s after the revocation was asked for")??;
    assert_ne!(status.code(), Some(0));
    let closed_after = revoked_at.elapsed();
    eprintln!("closed {closed_after:?} after the revocation");
    audited(&data_dir, "the close's audit record", |e| {
        e["action"] == "ssh-close" && e["user"] == "carol"
    })
    .await?;
    let out = client.output("carol", true, TASK, &["true"]).await?;
    assert_eq!(out.status.code(), Some(255), "{}", text(&out.stderr));
    audited(&data_dir, "the revoked certificate's audit record", |e| {
        e["decision"] == "denied"
            && e["user"] == "carol"
            && e["reason"]
                .as_str()
                .is_some_and(|r| r.contains("is revoked"))
    })
    .await?;

    // The CLI, as vera with her kubeconfig: `rlark ssh` needs no key setup and leaves no
    // key behind; `rlark ssh-config` makes plain `ssh TASK@alias` work with the host key
    // pinned; `rlark ssh-key` lists and removes keys.
    let kubeconfig = client.path("viewer.kubeconfig");
    let out = rlark(
        &kubeconfig,
        &["ssh", "task/web-main", "--", "echo", "via-rlark"],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "via-rlark\n");
    let out = rlark(&kubeconfig, &["ssh-key", "list"]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let listed = text(&out.stdout);
    assert!(
        listed.contains(record["fingerprint"].as_str().unwrap_or("?")),
        "{listed}"
    );
    assert!(
        !listed.contains("rlark-ssh"),
        "the one-time key stayed: {listed}"
    );
    let known = client.path("pinned_known_hosts");
    let vera_identity = client.path("vera");
    let out = rlark(
        &kubeconfig,
        &[
            "ssh-config",
            "--alias",
            "rlk",
            "--known-hosts",
            known.to_str().context("path")?,
            "-i",
            vera_identity.to_str().context("path")?,
        ],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    std::fs::write(client.path("ssh_config"), &out.stdout)?;
    let mut configured = tokio::process::Command::new("ssh");
    configured
        .args(["-F", client.path("ssh_config").to_str().context("path")?])
        .args([
            "-o",
            "BatchMode=yes",
            &format!("{TASK}@rlk"),
            "echo configured",
        ])
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(DEADLINE, configured.output()).await??;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "configured\n");
    // The same rule for `rlark exec`: the granted task, not the other.
    let out = rlark(
        &kubeconfig,
        &["exec", "task/web-main", "--", "echo", "exec-ok"],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "exec-ok\n");
    let out = rlark(&kubeconfig, &["exec", "task/private-main", "--", "true"]).await?;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("forbidden"),
        "{}",
        text(&out.stderr)
    );

    // Removing a key closes its open sessions too.
    let mut session = client.ssh("vera", false, TASK, &[]);
    session.arg("echo started; exec sleep 600");
    let mut session = session.spawn()?;
    let mut stdout = session.stdout.take().context("stdout")?;
    let mut first = [0u8; 8];
    tokio::time::timeout(DEADLINE, stdout.read_exact(&mut first)).await??;
    let id = record["id"].as_str().context("id")?;
    let out = rlark(&kubeconfig, &["ssh-key", "remove", id]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    tokio::time::timeout(Duration::from_secs(1), session.wait())
        .await
        .context("the session of a removed key is still open 1 s after the removal")??;
    let out = client.output("vera", false, TASK, &["true"]).await?;
    assert_eq!(out.status.code(), Some(255), "a removed key still works");

    h.stop().await
}

/// `rlark --kubeconfig K ARGS` (the flag before any `--`), bounded by [`DEADLINE`].
async fn rlark(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<Output> {
    let split = args.iter().position(|a| *a == "--").unwrap_or(args.len());
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_rlark"));
    command
        .args(&args[..split])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(&args[split..])
        .env_remove("KUBECONFIG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    tokio::time::timeout(DEADLINE, command.output())
        .await
        .context("rlark timed out")?
        .context("run rlark")
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|path| path.is_file())
    })
}
