//! `rlark token`, `rlark cert`, `rlark ca` and `rlark kubeconfig --user` as real processes
//! against an in-process server.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use rlark_pki::CertInfo;
use rlark_testkit::TestServer;

/// How long a test waits at most for a change to take effect.
const DEADLINE: Duration = Duration::from_secs(10);

fn rlark() -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_rlark"));
    // Keep client commands from picking up the developer's kubeconfig.
    cmd.env_remove("KUBECONFIG").env_remove("RUST_LOG");
    cmd.kill_on_drop(true);
    cmd
}

/// Run `rlark ARGS...` (at most [`DEADLINE`]).
async fn run(args: &[&str]) -> anyhow::Result<Output> {
    let output = rlark().args(args).output();
    tokio::time::timeout(DEADLINE, output)
        .await
        .with_context(|| format!("rlark {args:?} did not finish within {DEADLINE:?}"))?
        .with_context(|| format!("run rlark {args:?}"))
}

/// Run `rlark ARGS... --kubeconfig KUBECONFIG`.
async fn run_as(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<Output> {
    let mut all: Vec<&str> = args.to_vec();
    let path = kubeconfig
        .to_str()
        .context("kubeconfig path is not UTF-8")?;
    all.extend(["--kubeconfig", path]);
    run(&all).await
}

/// `run_as` that must succeed; returns stdout.
async fn ok_as(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = run_as(kubeconfig, args).await?;
    if !out.status.success() {
        bail!(
            "rlark {args:?} failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    Ok(text(&out.stdout))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("UTF-8 path")
}

fn example_job() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/job.yaml")
}

/// The client certificate embedded in a kubeconfig file.
fn kubeconfig_cert(path: &Path) -> anyhow::Result<CertInfo> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
    let data = kubeconfig
        .auth_infos
        .first()
        .and_then(|a| a.auth_info.as_ref())
        .and_then(|a| a.client_certificate_data.clone())
        .context("kubeconfig has no client-certificate-data")?;
    // ByteString decodes base64 when deserialized.
    let pem: k8s_openapi::ByteString = serde_json::from_value(serde_json::Value::String(data))?;
    Ok(CertInfo::from_pem(std::str::from_utf8(&pem.0)?)?)
}

/// The `sha256:` pins in `text`, in order.
fn pins(text: &str) -> Vec<String> {
    text.split_whitespace()
        .filter(|w| w.starts_with("sha256:"))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn token_create_prints_the_join_command() -> anyhow::Result<()> {
    let server = TestServer::start().await?;
    let admin = server.kubeconfig_path().to_path_buf();

    // A join token is bound to one cluster: no token without --cluster-id.
    let out = run_as(&admin, &["token", "create", "--ttl", "10m"]).await?;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("--cluster-id"),
        "{}",
        text(&out.stderr)
    );

    let stdout = ok_as(
        &admin,
        &["token", "create", "--ttl", "10m", "--cluster-id", "gpu-a"],
    )
    .await?;
    let join = stdout
        .lines()
        .find(|l| l.starts_with("rlark join "))
        .with_context(|| format!("no join command in:\n{stdout}"))?;
    assert!(
        join.starts_with(&format!("rlark join --server {} --token ", server.url())),
        "{join}"
    );
    assert!(
        join.contains(&format!(" --ca-hash {} ", server.ca_cert_hash())),
        "{join}"
    );
    assert!(join.ends_with(" --cluster-id gpu-a"), "{join}");
    let token = join
        .split_whitespace()
        .skip_while(|w| *w != "--token")
        .nth(1)
        .context("no token")?;
    assert!(
        stdout.lines().any(|l| l == token),
        "token not on its own line:\n{stdout}"
    );

    let stdout = ok_as(&admin, &["token", "create", "--cluster-id", "edge-1"]).await?;
    let join = stdout
        .lines()
        .find(|l| l.starts_with("rlark join "))
        .with_context(|| format!("no join command in:\n{stdout}"))?;
    assert!(join.ends_with(" --cluster-id edge-1"), "{join}");

    let stdout = ok_as(
        &admin,
        &[
            "token",
            "create",
            "--ttl",
            "2d",
            "--cluster-id",
            "c2",
            "-o",
            "json",
        ],
    )
    .await?;
    let json: serde_json::Value = serde_json::from_str(&stdout)?;
    assert_eq!(json["kind"], "bootstrap", "{json}");
    assert_eq!(json["clusterID"], "c2", "{json}");
    assert_eq!(json["rejoin"], false, "{json}");
    assert_eq!(json["caHash"], server.ca_cert_hash(), "{json}");

    // A user bearer token: only the token on stdout, its id on stderr.
    let out = run_as(
        &admin,
        &["token", "create", "--user", "bob", "--role", "viewer"],
    )
    .await?;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(!stdout.trim().is_empty());
    assert!(text(&out.stderr).contains("bob"), "{}", text(&out.stderr));

    // Bad TTLs are usage errors naming the flag; so is --role without --user.
    for bad in ["0s", "abc", "5w"] {
        let out = run_as(&admin, &["token", "create", "--ttl", bad]).await?;
        assert_eq!(out.status.code(), Some(2), "--ttl {bad}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains("--ttl"), "--ttl {bad}: {stderr}");
    }
    let out = run_as(&admin, &["token", "create", "--role", "admin"]).await?;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));

    // A viewer may not create tokens: the server's Status is printed like kubectl does.
    let dir = tempfile::tempdir()?;
    let viewer = dir.path().join("bob.kubeconfig");
    ok_as(
        &admin,
        &[
            "kubeconfig",
            "--user",
            "bob",
            "--role",
            "viewer",
            "-o",
            path_str(&viewer),
        ],
    )
    .await?;
    let out = run_as(&viewer, &["token", "create", "--cluster-id", "x"]).await?;
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("Error from server (Forbidden): "),
        "{stderr}"
    );
    assert!(stderr.contains("bob"), "{stderr}");

    server.stop().await
}

#[tokio::test(flavor = "multi_thread")]
async fn user_kubeconfigs_are_signed_listed_and_revoked() -> anyhow::Result<()> {
    let server = TestServer::start().await?;
    let admin = server.kubeconfig_path().to_path_buf();
    let dir = tempfile::tempdir()?;
    let alice = dir.path().join("alice.kubeconfig");

    let out = run_as(
        &admin,
        &[
            "kubeconfig",
            "--user",
            "alice",
            "--role",
            "viewer",
            "--validity",
            "30d",
            "-o",
            path_str(&alice),
        ],
    )
    .await?;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    let mode = std::fs::metadata(&alice)?.permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{mode:o}");
    let cert = kubeconfig_cert(&alice)?;
    assert_eq!(cert.common_name, "alice");
    assert!(
        cert.groups.iter().any(|g| g == "rlark:viewers"),
        "{:?}",
        cert.groups
    );
    let kubeconfig = std::fs::read_to_string(&alice)?;
    assert!(kubeconfig.contains(&server.url()), "{kubeconfig}");

    // A viewer reads but cannot write.
    ok_as(&alice, &["get", "jobs"]).await?;
    let out = run_as(&alice, &["apply", "-f", path_str(&example_job())]).await?;
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("forbidden"), "{stderr}");
    assert!(stderr.contains("alice"), "{stderr}");

    // The admin sees the certificate.
    let listing = ok_as(&admin, &["cert", "list"]).await?;
    assert!(listing.starts_with("SERIAL "), "{listing}");
    let row = listing
        .lines()
        .find(|l| l.split_whitespace().next() == Some(cert.serial.as_str()))
        .with_context(|| format!("no row of serial {} in:\n{listing}", cert.serial))?;
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[1..4], ["alice", "viewer", "<none>"], "{row}");
    assert_eq!(cells[5], "no", "{row}");
    let json: serde_json::Value =
        serde_json::from_str(&ok_as(&admin, &["cert", "list", "-o", "json"]).await?)?;
    assert!(
        json["items"]
            .as_array()
            .context("items")?
            .iter()
            .any(|c| c["serial"] == cert.serial.as_str())
    );

    // Exactly one selector.
    let out = run_as(&admin, &["cert", "revoke"]).await?;
    assert_eq!(out.status.code(), Some(2));
    let out = run_as(&admin, &["cert", "revoke", "ab", "--user", "alice"]).await?;
    assert_eq!(out.status.code(), Some(2));
    let out = run_as(&admin, &["cert", "revoke", "xyz"]).await?;
    assert_eq!(out.status.code(), Some(2));

    // A viewer cannot revoke.
    let out = run_as(&alice, &["cert", "revoke", "--user", "alice"]).await?;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("forbidden"));

    let stdout = ok_as(
        &admin,
        &["cert", "revoke", "--user", "alice", "--reason", "left"],
    )
    .await?;
    assert_eq!(stdout, format!("revoked {}\n", cert.serial));
    let stdout = ok_as(&admin, &["cert", "revoke", "--user", "alice"]).await?;
    assert_eq!(stdout, "no certificates of alice\n");

    let deadline = Instant::now() + DEADLINE;
    loop {
        let out = run_as(&alice, &["get", "jobs"]).await?;
        if !out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the revoked certificate still works"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let listing = ok_as(&admin, &["cert", "list"]).await?;
    let row = listing
        .lines()
        .find(|l| l.starts_with(&cert.serial))
        .context("row gone")?;
    assert_ne!(row.split_whitespace().nth(5), Some("no"), "{row}");
    let revocations = ok_as(&admin, &["cert", "revocations"]).await?;
    assert!(revocations.starts_with("SERIAL "), "{revocations}");
    let row = revocations
        .lines()
        .find(|l| l.starts_with(&cert.serial))
        .with_context(|| format!("no revocation row:\n{revocations}"))?;
    assert!(row.contains("alice") && row.contains("left"), "{row}");

    server.stop().await
}

#[tokio::test(flavor = "multi_thread")]
async fn cert_sign_signs_a_csr_for_a_role() -> anyhow::Result<()> {
    let server = TestServer::start().await?;
    let admin = server.kubeconfig_path().to_path_buf();
    let dir = tempfile::tempdir()?;
    let csr = dir.path().join("peer.csr");
    let key = rlark_pki::generate_key_and_csr("whatever")?;
    std::fs::write(&csr, &key.csr_pem)?;

    let pem = ok_as(
        &admin,
        &[
            "cert",
            "sign",
            "--role",
            "viewer",
            "--name",
            "carol",
            "--csr",
            path_str(&csr),
        ],
    )
    .await?;
    let info = CertInfo::from_pem(&pem)?;
    assert_eq!(info.common_name, "carol");

    let out_file = dir.path().join("agent.crt");
    ok_as(
        &admin,
        &[
            "cert",
            "sign",
            "--role",
            "agent",
            "--cluster-id",
            "edge-2",
            "--csr",
            path_str(&csr),
            "--validity",
            "1d",
            "-o",
            path_str(&out_file),
        ],
    )
    .await?;
    let info = CertInfo::from_pem(&std::fs::read_to_string(&out_file)?)?;
    let lifetime = info.not_after.duration_since(info.not_before)?;
    assert!(
        lifetime <= Duration::from_secs(24 * 3600 + 600),
        "{lifetime:?}"
    );
    let listing = ok_as(&admin, &["cert", "list"]).await?;
    let row = listing
        .lines()
        .find(|l| l.starts_with(&info.serial))
        .with_context(|| format!("no row of {}:\n{listing}", info.serial))?;
    assert_eq!(row.split_whitespace().nth(3), Some("edge-2"), "{row}");

    // The subject flags: exactly one, and the one the role needs.
    let out = run_as(
        &admin,
        &["cert", "sign", "--role", "admin", "--csr", path_str(&csr)],
    )
    .await?;
    assert_eq!(out.status.code(), Some(2));
    let out = run_as(
        &admin,
        &[
            "cert",
            "sign",
            "--role",
            "admin",
            "--cluster-id",
            "x",
            "--csr",
            path_str(&csr),
        ],
    )
    .await?;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("--name"),
        "{}",
        text(&out.stderr)
    );

    server.stop().await
}

#[tokio::test(flavor = "multi_thread")]
async fn cert_sign_ssh_signs_openssh_keys_for_both_roles() -> anyhow::Result<()> {
    let server = TestServer::start().await?;
    let admin = server.kubeconfig_path();
    let dir = tempfile::tempdir()?;
    let key = dir.path().join("id_ed25519");
    let keygen = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f", path_str(&key)])
        .output()?;
    anyhow::ensure!(
        keygen.status.success(),
        "ssh-keygen: {}",
        text(&keygen.stderr)
    );
    let public = format!("{}.pub", path_str(&key));

    // ssh-guest to stdout: one certificate line for the key.
    let line = ok_as(
        admin,
        &[
            "cert",
            "sign-ssh",
            "--role",
            "ssh-guest",
            "--user",
            "alice",
            "--public-key",
            &public,
        ],
    )
    .await?;
    assert!(
        line.starts_with("ssh-ed25519-cert-v01@openssh.com ") && line.ends_with('\n'),
        "{line}"
    );
    // domain to a file, then listed with its cluster.
    let cert = dir.path().join("id_ed25519-cert.pub");
    let out = run_as(
        admin,
        &[
            "cert",
            "sign-ssh",
            "--role",
            "domain",
            "--domain",
            "net1",
            "--cluster-id",
            "edge-1",
            "--public-key",
            &public,
            "--validity",
            "1h",
            "-o",
            path_str(&cert),
        ],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("rlark:domain:net1@edge-1"),
        "{}",
        text(&out.stderr)
    );
    let shown = std::process::Command::new("ssh-keygen")
        .args(["-L", "-f", path_str(&cert)])
        .output()?;
    assert!(
        text(&shown.stdout).contains("domain:net1@edge-1"),
        "{}",
        text(&shown.stdout)
    );
    let listing = ok_as(admin, &["cert", "list"]).await?;
    assert!(
        listing.contains("domain:net1@edge-1") && listing.contains("edge-1"),
        "{listing}"
    );

    // The subject flags the role needs, named; an unknown key is the server's 400.
    for (args, needle) in [
        (vec!["--role", "domain", "--domain", "net1"], "--cluster-id"),
        (vec!["--role", "ssh-guest", "--domain", "net1"], "--user"),
        (
            vec![
                "--role",
                "domain",
                "--user",
                "a",
                "--domain",
                "d",
                "--cluster-id",
                "c",
            ],
            "not --user",
        ),
    ] {
        let mut full = vec!["cert", "sign-ssh", "--public-key", &public];
        full.extend(args);
        let out = run_as(admin, &full).await?;
        assert_eq!(out.status.code(), Some(1), "{full:?}");
        assert!(
            text(&out.stderr).contains(needle),
            "{full:?}: {}",
            text(&out.stderr)
        );
    }
    let garbage = dir.path().join("garbage.pub");
    std::fs::write(&garbage, "not a key\n")?;
    let out = run_as(
        admin,
        &[
            "cert",
            "sign-ssh",
            "--role",
            "ssh-guest",
            "--user",
            "alice",
            "--public-key",
            path_str(&garbage),
        ],
    )
    .await?;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("key"), "{}", text(&out.stderr));
    server.stop().await
}

#[tokio::test(flavor = "multi_thread")]
async fn ca_rotation_keeps_the_server_usable() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let data_dir = dir.path().join("data");
    let data = path_str(&data_dir).to_string();

    // No CA yet: refused, and nothing created.
    let out = run(&["ca", "rotate", "--data-dir", &data]).await?;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no CA at"),
        "{}",
        text(&out.stderr)
    );
    assert!(!data_dir.join("pki").exists());

    let server = TestServer::start_in(&data_dir).await?;
    let first_pin = server.ca_cert_hash().to_string();
    let mut url = server.url();
    let alice = dir.path().join("alice.kubeconfig");
    ok_as(
        server.kubeconfig_path(),
        &["kubeconfig", "--user", "alice", "-o", path_str(&alice)],
    )
    .await?;
    server.stop().await?;

    let stdout = ok_as_offline(&["ca", "rotate", "--data-dir", &data]).await?;
    let rotated = pins(&stdout);
    assert_eq!(rotated.len(), 2, "{stdout}");
    assert_eq!(rotated[0], first_pin, "{stdout}");
    assert_ne!(rotated[0], rotated[1], "{stdout}");
    assert!(stdout.contains("rlark ca retire"), "{stdout}");
    let out = run(&["ca", "rotate", "--data-dir", &data]).await?;
    assert_eq!(out.status.code(), Some(1), "a second rotation must wait");

    // During the rotation the server signs with the new CA and old credentials still work.
    let server = TestServer::start_in(&data_dir).await?;
    assert_eq!(server.ca_cert_hash(), rotated[1]);
    follow_port(&alice, &mut url, &server.url())?;
    ok_as(server.kubeconfig_path(), &["get", "jobs"]).await?;
    ok_as(&alice, &["get", "jobs"]).await?;
    server.stop().await?;

    let stdout = ok_as_offline(&["ca", "retire", "--data-dir", &data]).await?;
    let retired = pins(&stdout);
    assert_eq!(
        retired,
        [rotated[0].clone(), rotated[1].clone()],
        "{stdout}"
    );

    // After the retirement the server starts, rewrites the admin kubeconfig, and it works;
    // certificates of the retired CA do not.
    let server = TestServer::start_in(&data_dir).await?;
    assert_eq!(server.ca_cert_hash(), rotated[1]);
    ok_as(server.kubeconfig_path(), &["get", "jobs"]).await?;
    follow_port(&alice, &mut url, &server.url())?;
    let out = run_as(&alice, &["get", "jobs"]).await?;
    assert!(
        !out.status.success(),
        "a certificate of the retired CA works"
    );
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("Connection refused"), "{stderr}");
    let stdout = ok_as_offline(&["ca", "retire", "--data-dir", &data]).await?;
    assert!(stdout.contains("No CA rotation in progress"), "{stdout}");
    server.stop().await
}

/// Point a kubeconfig at a restarted server (it listens on a new port).
fn follow_port(kubeconfig: &Path, old_url: &mut String, new_url: &str) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(kubeconfig)?;
    assert!(text.contains(old_url.as_str()), "{text}");
    std::fs::write(kubeconfig, text.replace(old_url.as_str(), new_url))?;
    *old_url = new_url.to_string();
    Ok(())
}

/// Run an offline command that must succeed; returns stdout.
async fn ok_as_offline(args: &[&str]) -> anyhow::Result<String> {
    let out = run(args).await?;
    if !out.status.success() {
        bail!(
            "rlark {args:?} failed ({}): {}",
            out.status,
            text(&out.stderr)
        );
    }
    Ok(text(&out.stdout))
}
