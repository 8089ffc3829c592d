//! OpenSSH certificates through the signing API, checked with the real `ssh-keygen`.

use std::path::Path;
use std::process::Command;

use anyhow::Context as _;
use rlark_testkit::TestServer;
use serde_json::{Value, json};

async fn post(client: &kube::Client, path: &str, body: Value) -> Result<Value, kube::Error> {
    let request = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body.to_string().into_bytes())
        .expect("request");
    client.request::<Value>(request).await
}

fn ssh_keygen(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("ssh-keygen")
        .args(args)
        .output()
        .context("run ssh-keygen (Debian package openssh-client; scripts/test.sh installs it)")?;
    anyhow::ensure!(
        out.status.success(),
        "ssh-keygen {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn status_of(error: kube::Error) -> kube::core::Status {
    match error {
        kube::Error::Api(status) => *status,
        other => panic!("expected a Status error, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssh_certificates_are_signed_by_the_installation() -> anyhow::Result<()> {
    let server = TestServer::start().await?;
    let admin = server.client().await?;
    let keys = tempfile::tempdir()?;
    let key = keys.path().join("id_ed25519");
    let key_str = key.to_str().context("utf-8 path")?;
    ssh_keygen(&[
        "-q", "-t", "ed25519", "-N", "", "-C", "alice", "-f", key_str,
    ])?;
    let public_key = std::fs::read_to_string(keys.path().join("id_ed25519.pub"))?;
    let ca_fingerprint = ssh_keygen(&[
        "-l",
        "-f",
        server
            .data_dir()
            .join("pki/ssh_ca.pub")
            .to_str()
            .context("utf-8 path")?,
    ])?;
    let ca_fingerprint = ca_fingerprint
        .split_whitespace()
        .nth(1)
        .context("fingerprint field")?
        .to_string();

    // ssh-guest: the user's access to tasks.
    let signed = post(
        &admin,
        "/rlark/v1/sshcertificates",
        json!({"role": "ssh-guest", "user": "alice", "publicKey": public_key}),
    )
    .await?;
    let cert_path = keys.path().join("id_ed25519-cert.pub");
    std::fs::write(
        &cert_path,
        format!(
            "{}\n",
            signed["certificate"].as_str().context("certificate")?
        ),
    )?;
    let shown = ssh_keygen(&["-L", "-f", cert_path.to_str().context("utf-8 path")?])?;
    assert!(shown.contains("user certificate"), "{shown}");
    assert!(
        shown.contains(&format!("Signing CA: ED25519 {ca_fingerprint}")),
        "{shown}"
    );
    assert!(shown.contains("rlark:ssh-guest:alice"), "{shown}");
    assert!(shown.contains("permit-pty"), "{shown}");
    let principals = shown
        .split("Principals:")
        .nth(1)
        .and_then(|rest| rest.lines().nth(1))
        .map(str::trim);
    assert_eq!(principals, Some("alice"), "{shown}");
    assert_eq!(
        signed["caPublicKey"].as_str().map(str::trim),
        Some(std::fs::read_to_string(server.data_dir().join("pki/ssh_ca.pub"))?.trim())
    );

    // domain: principal and extensions name the domain and the cluster.
    let signed = post(
        &admin,
        "/rlark/v1/sshcertificates",
        json!({"role": "domain", "domain": "d1", "clusterID": "edge-1", "publicKey": public_key}),
    )
    .await?;
    assert_eq!(signed["principals"], json!(["domain:d1@edge-1"]));
    std::fs::write(
        &cert_path,
        format!(
            "{}\n",
            signed["certificate"].as_str().context("certificate")?
        ),
    )?;
    let shown = ssh_keygen(&["-L", "-f", cert_path.to_str().context("utf-8 path")?])?;
    assert!(shown.contains("domain:d1@edge-1"), "{shown}");
    assert!(shown.contains("permit-port-forwarding"), "{shown}");
    assert!(!shown.contains("permit-pty"), "{shown}");

    // Bad input: 400 naming the problem.
    for (body, needle) in [
        (
            json!({"role": "domain", "domain": "d1", "publicKey": public_key}),
            "clusterID",
        ),
        (
            json!({"role": "ssh-guest", "user": "alice", "publicKey": "ssh-dss AAAA"}),
            "ssh-dss",
        ),
        (
            json!({"role": "ssh-guest", "user": "alice", "publicKey": "garbage"}),
            "key",
        ),
        (
            json!({"role": "root", "publicKey": public_key}),
            "unknown SSH role",
        ),
        (
            json!({"role": "ssh-guest", "user": "alice", "publicKey": public_key, "extra": 1}),
            "extra",
        ),
    ] {
        let status = status_of(
            post(&admin, "/rlark/v1/sshcertificates", body.clone())
                .await
                .expect_err("refused"),
        );
        assert_eq!(status.code, 400, "{body}: {}", status.message);
        assert!(
            status.message.contains(needle),
            "{body}: {}",
            status.message
        );
    }

    // The audit log has the two signings.
    let audit = std::fs::read_to_string(server.data_dir().join("audit.log"))?;
    assert_eq!(
        audit
            .lines()
            .filter(|l| l.contains("\"resource\":\"sshcertificates\""))
            .count(),
        2,
        "{audit}"
    );

    // Revoking the cluster revokes its domain certificates too (they speak for it).
    let revoked = post(
        &admin,
        "/rlark/v1/revocations",
        json!({"clusterID": "edge-1", "reason": "cluster retired"}),
    )
    .await?;
    let domain_serial = signed["serialHex"].as_str().context("serialHex")?;
    assert!(
        revoked["revoked"]
            .as_array()
            .is_some_and(|serials| serials.iter().any(|s| s == domain_serial)),
        "{revoked}"
    );
    server.stop().await?;
    assert!(Path::new(&key).exists());
    Ok(())
}
