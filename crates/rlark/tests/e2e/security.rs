//! Security end-to-end (DESIGN §5): agents join with a bootstrap token and a CA pin, renew
//! their certificates, are confined to their namespace; viewers read; task tokens read their
//! Task and post Events; revocation cuts open connections and survives a restart; bad input
//! gets a 400 that names the problem. Everything over real TLS against an in-process server.

use crate::missing_tool;
use crate::raw_api;
use std::future::Future;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, bail, ensure};
use futures::StreamExt as _;
use http_body_util::BodyExt as _;
use kube::api::{Api, DynamicObject, ListParams, PostParams, WatchEvent, WatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use raw_api::{Resp, call, call_ok, call_raw};
use rlark_agent::join::{
    AGENT_CA, AGENT_KUBECONFIG, AGENT_PEM, AGENT_STATE, AgentCredentials, JoinError, JoinOptions,
    Renewer,
};
use rlark_testkit::{TestServer, client_from_kubeconfig};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Hang guard of every test.
const TEST_TIMEOUT: Duration = Duration::from_secs(180);

/// Run `test` with the hang guard.
async fn bounded(test: impl Future<Output = Result<()>>) -> Result<()> {
    tokio::time::timeout(TEST_TIMEOUT, test)
        .await
        .with_context(|| format!("test did not finish within {TEST_TIMEOUT:?}"))?
}

// ---------------------------------------------------------------------------------------
// Security API helpers
// ---------------------------------------------------------------------------------------

/// Mint a bootstrap token (admin); the answer has `token`, `caHash`, `expiresAt`, ...
async fn bootstrap_token(admin: &kube::Client, cluster: Option<&str>, ttl: u64) -> Result<Value> {
    let mut body = json!({"kind": "bootstrap", "ttlSeconds": ttl});
    if let Some(cluster) = cluster {
        body["clusterID"] = json!(cluster);
    }
    let value = call_ok(admin, "POST", "/rlark/v1/tokens", Some(&body)).await?;
    ensure!(value["token"].is_string(), "no token in {value}");
    Ok(value)
}

fn str_of<'a>(value: &'a Value, field: &str) -> Result<&'a str> {
    value[field]
        .as_str()
        .with_context(|| format!("no string {field:?} in {value}"))
}

fn join_options(
    server: &str,
    token: &str,
    ca_hash: &str,
    cluster: Option<&str>,
    dir: &Path,
) -> JoinOptions {
    JoinOptions {
        server: server.to_string(),
        token: token.to_string(),
        ca_hash: ca_hash.to_string(),
        cluster_id: cluster.map(str::to_string),
        dir: dir.to_path_buf(),
    }
}

/// Mint a token bound to `cluster` and join with it into `dir`.
async fn join_cluster(
    server: &TestServer,
    admin: &kube::Client,
    cluster: &str,
    dir: &Path,
) -> Result<AgentCredentials> {
    let token = bootstrap_token(admin, Some(cluster), 600).await?;
    let options = join_options(
        &server.url(),
        str_of(&token, "token")?,
        str_of(&token, "caHash")?,
        None,
        dir,
    );
    rlark_agent::join::join(&options)
        .await
        .with_context(|| format!("join cluster {cluster}"))
}

/// The certificate records (GET /rlark/v1/certificates) of the agent of `cluster`.
async fn agent_certificates(admin: &kube::Client, cluster: &str) -> Result<Vec<Value>> {
    let list = call_ok(admin, "GET", "/rlark/v1/certificates", None).await?;
    let user = format!("system:rlark:agent:{cluster}");
    Ok(list["items"]
        .as_array()
        .context("certificate list has no items")?
        .iter()
        .filter(|c| c["user"] == user.as_str())
        .cloned()
        .collect())
}

/// The CA bundle of the installation (GET /rlark/v1/ca).
async fn ca_bundle(admin: &kube::Client) -> Result<String> {
    let ca = call_ok(admin, "GET", "/rlark/v1/ca", None).await?;
    Ok(str_of(&ca, "caBundle")?.to_string())
}

/// `data` as base64 (no line breaks), via k8s-openapi's `ByteString` serialization.
fn base64(data: &[u8]) -> String {
    serde_json::to_value(k8s_openapi::ByteString(data.to_vec()))
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// A kubeconfig whose user is `user_yaml` (a flow mapping), trusting `ca_pem`.
fn kubeconfig_with_user(server: &str, ca_pem: &str, user_yaml: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: rlark\n  cluster:\n    server: \"{server}\"\n    \
         certificate-authority-data: {ca}\ncontexts:\n- name: rlark\n  context:\n    cluster: rlark\n    \
         user: t\ncurrent-context: rlark\nusers:\n- name: t\n  user: {user_yaml}\n",
        ca = base64(ca_pem.as_bytes()),
    )
}

/// Write `yaml` to `dir/name` and build a client from it.
async fn client_from_yaml(dir: &Path, name: &str, yaml: &str) -> Result<(kube::Client, PathBuf)> {
    let path = dir.join(name);
    std::fs::write(&path, yaml).with_context(|| format!("write {}", path.display()))?;
    Ok((client_from_kubeconfig(&path).await?, path))
}

/// A kubeconfig with a client certificate signed by the admin for role `viewer`, user
/// `name`.
async fn viewer_kubeconfig(
    server: &TestServer,
    admin: &kube::Client,
    name: &str,
) -> Result<String> {
    let key_and_csr = rlark_pki::generate_key_and_csr(name)?;
    let signed = call_ok(
        admin,
        "POST",
        "/rlark/v1/certificates",
        Some(&json!({"role": "viewer", "name": name, "csr": key_and_csr.csr_pem})),
    )
    .await?;
    Ok(rlark_pki::kubeconfig_yaml(
        &server.url(),
        str_of(&signed, "caBundle")?,
        str_of(&signed, "certificate")?,
        &key_and_csr.key_pem,
        name,
    ))
}

/// A kubeconfig for `creds` (certificate and key from `agent.pem`) against `url`.
fn agent_kubeconfig(url: &str, creds: &AgentCredentials) -> String {
    rlark_pki::kubeconfig_yaml(
        url,
        &creds.ca_pem,
        &creds.cert_pem,
        &creds.key_pem,
        &creds.info.common_name,
    )
}

// ---------------------------------------------------------------------------------------
// Objects
// ---------------------------------------------------------------------------------------

fn task_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("rlinf.io", "v1alpha1", "Task"),
        "tasks",
    )
}

fn tasks(client: &kube::Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &task_resource())
}

fn task_json(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Task",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"role": "Actor", "agentType": "Raw", "raw": {"entrypoint": ["true"]}},
    })
}

fn task_object(namespace: &str, name: &str) -> Result<DynamicObject> {
    Ok(serde_json::from_value(task_json(namespace, name))?)
}

fn job_json(name: &str) -> Value {
    json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"tasks": [{
            "name": "actor", "head": true, "agentType": "Raw", "role": "Actor",
            "raw": {"entrypoint": ["true"], "replicas": 1},
        }]},
    })
}

fn event_json(namespace: &str, name: &str, about: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": {
            "apiVersion": "rlinf.io/v1alpha1", "kind": "Task",
            "name": about, "namespace": namespace,
        },
        "reason": "Progress",
        "message": "step 1",
        "type": "Normal",
    })
}

/// Set `status.phase` of Task `namespace/name` through the status subresource (admin).
async fn set_task_phase(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
    phase: &str,
) -> Result<()> {
    call_ok(
        admin,
        "PATCH",
        &format!("/apis/rlinf.io/v1alpha1/namespaces/{namespace}/tasks/{name}/status"),
        Some(&json!({"status": {"phase": phase}})),
    )
    .await?;
    Ok(())
}

fn mode_of(path: &Path) -> Result<u32> {
    Ok(std::fs::metadata(path)
        .with_context(|| format!("stat {}", path.display()))?
        .permissions()
        .mode()
        & 0o777)
}

/// Whether `dir` is missing or empty.
fn dir_is_empty(dir: &Path) -> bool {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => entries.next().is_none(),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// The `JoinError::Refused` parts of `result`, or a failure describing what came instead.
fn refused<T>(result: Result<T, JoinError>) -> Result<(u16, String)> {
    match result {
        Err(JoinError::Refused { code, message }) => Ok((code, message)),
        Err(other) => bail!("expected a refusal, got {other:?} ({other})"),
        Ok(_) => bail!("expected a refusal, but the join succeeded"),
    }
}

// ---------------------------------------------------------------------------------------
// 1. Join
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_works_once_per_cluster() -> Result<()> {
    bounded(async {
        let server = TestServer::start().await?;
        let admin = server.client().await?;
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("agent-a");

        let token = bootstrap_token(&admin, Some("a"), 600).await?;
        let options = join_options(
            &server.url(),
            str_of(&token, "token")?,
            str_of(&token, "caHash")?,
            None,
            &dir,
        );
        let creds = rlark_agent::join::join(&options)
            .await
            .context("first join")?;
        assert_eq!(creds.state.cluster_id, "a");
        assert_eq!(creds.info.common_name, "system:rlark:agent:a");
        assert_eq!(creds.info.groups, ["rlark:agents"]);

        // Private files in a private directory; the CA bundle is public (isolated
        // replicas read it as users of their own).
        assert_eq!(mode_of(&dir)?, 0o700, "agent directory mode");
        for file in [AGENT_PEM, AGENT_STATE, AGENT_KUBECONFIG] {
            assert_eq!(mode_of(&dir.join(file))?, 0o600, "mode of {file}");
        }
        assert_eq!(mode_of(&dir.join(AGENT_CA))?, 0o644, "mode of {AGENT_CA}");

        // The agent works in its own namespace (created by the join) and nowhere else.
        let agent = client_from_kubeconfig(&dir.join(AGENT_KUBECONFIG)).await?;
        let own = tasks(&agent, "rlark-a");
        own.create(&PostParams::default(), &task_object("rlark-a", "t-agent")?)
            .await
            .context("agent creates a Task in rlark-a")?;
        let listed = own.list(&ListParams::default()).await?;
        assert_eq!(
            listed
                .items
                .iter()
                .filter_map(|t| t.metadata.name.as_deref())
                .collect::<Vec<_>>(),
            ["t-agent"]
        );
        let denied = call(
            &agent,
            "POST",
            "/apis/rlinf.io/v1alpha1/namespaces/default/tasks",
            Some(&task_json("default", "t-agent")),
        )
        .await?;
        assert_eq!(denied.code, 403, "create in default: {}", denied.text);
        assert!(
            denied.message().contains("User \"system:rlark:agent:a\""),
            "{}",
            denied.text
        );
        let denied = call(
            &agent,
            "GET",
            "/apis/rlinf.io/v1alpha1/namespaces/default/tasks",
            None,
        )
        .await?;
        assert_eq!(denied.code, 403, "list in default: {}", denied.text);

        // The same token for the same cluster again: refused, nothing written.
        let again_dir = tmp.path().join("agent-a-again");
        let (code, message) = refused(
            rlark_agent::join::join(&JoinOptions {
                dir: again_dir.clone(),
                ..options.clone()
            })
            .await,
        )?;
        assert_eq!(code, 401, "{message}");
        assert!(message.contains("already used"), "{message}");
        assert!(
            dir_is_empty(&again_dir),
            "a refused join wrote files to {}",
            again_dir.display()
        );
        // Also with the cluster ID given explicitly.
        let (code, message) = refused(
            rlark_agent::join::join(&JoinOptions {
                dir: again_dir.clone(),
                cluster_id: Some("a".into()),
                ..options.clone()
            })
            .await,
        )?;
        assert_eq!(
            (code, message.contains("already used")),
            (401, true),
            "{message}"
        );
        assert!(dir_is_empty(&again_dir));
        assert_eq!(agent_certificates(&admin, "a").await?.len(), 1);

        // A join token is bound to one cluster: none is made without a cluster ID.
        let unbound = call(
            &admin,
            "POST",
            "/rlark/v1/tokens",
            Some(&json!({"kind": "bootstrap", "ttlSeconds": 600})),
        )
        .await?;
        assert_eq!(unbound.code, 400, "{}", unbound.brief());
        assert!(
            unbound.message().contains("clusterID is required"),
            "{}",
            unbound.brief()
        );
        // A second token for cluster a does not make a second identity of it.
        let second = bootstrap_token(&admin, Some("a"), 600).await?;
        let (code, message) = refused(
            rlark_agent::join::join(&join_options(
                &server.url(),
                str_of(&second, "token")?,
                str_of(&second, "caHash")?,
                None,
                &tmp.path().join("agent-a-second"),
            ))
            .await,
        )?;
        assert_eq!(code, 403, "{message}");
        assert!(message.contains("has joined before"), "{message}");
        assert!(dir_is_empty(&tmp.path().join("agent-a-second")));

        // The join tokens as the console's admin page lists them: who used each, never the
        // secret or its hash; another kind is refused.
        let joins = call_ok(&admin, "GET", "/rlark/v1/tokens?kind=bootstrap", None).await?;
        let items = joins["items"].as_array().context("items")?;
        let used = items
            .iter()
            .find(|t| t["id"] == token["id"])
            .with_context(|| format!("the first token in {joins}"))?;
        assert_eq!(used["clusterID"], "a");
        assert_eq!(used["usedBy"], json!(["a"]));
        assert!(
            items
                .iter()
                .any(|t| t["id"] == second["id"] && t["clusterID"] == "a" && t["rejoin"] == false)
        );
        let listed = joins.to_string();
        assert!(!listed.contains("secretHash"), "{listed}");
        assert!(!listed.contains(str_of(&token, "token")?), "{listed}");
        let bad = call(&admin, "GET", "/rlark/v1/tokens?kind=nope", None).await?;
        assert_eq!(bad.code, 400, "{}", bad.brief());

        server.stop().await
    })
    .await
}

// ---------------------------------------------------------------------------------------
// 2. Expired, malformed and unknown tokens
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_and_wrong_tokens_fail() -> Result<()> {
    bounded(async {
        let server = TestServer::start().await?;
        let admin = server.client().await?;
        let tmp = tempfile::tempdir()?;
        let ca_hash = server.ca_cert_hash().to_string();

        // A 1 s token, used only once its expiry has passed (joining earlier would consume it).
        let token = bootstrap_token(&admin, Some("exp"), 1).await?;
        let expires_at: SystemTime =
            chrono::DateTime::parse_from_rfc3339(str_of(&token, "expiresAt")?)
                .context("expiresAt is RFC 3339")?
                .with_timezone(&chrono::Utc)
                .into();
        let deadline = Instant::now() + Duration::from_secs(3);
        while SystemTime::now() <= expires_at + Duration::from_millis(100) {
            ensure!(Instant::now() < deadline, "token did not expire within 3 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let dir = tmp.path().join("exp");
        let (code, message) = refused(
            rlark_agent::join::join(&join_options(
                &server.url(),
                str_of(&token, "token")?,
                &ca_hash,
                None,
                &dir,
            ))
            .await,
        )?;
        assert_eq!(code, 401, "{message}");
        assert!(message.contains("expired"), "{message}");
        assert!(dir_is_empty(&dir));

        // Garbage: 400 naming the expected format.
        let dir = tmp.path().join("garbage");
        let (code, message) = refused(
            rlark_agent::join::join(&join_options(
                &server.url(),
                "not-a-token!",
                &ca_hash,
                Some("garbage"),
                &dir,
            ))
            .await,
        )?;
        assert_eq!(code, 400, "{message}");
        assert!(message.contains("[a-z0-9]{6}.[a-z0-9]{16}"), "{message}");
        assert!(dir_is_empty(&dir));

        // Well-formed but unknown: 401.
        let dir = tmp.path().join("unknown");
        let (code, message) = refused(
            rlark_agent::join::join(&join_options(
                &server.url(),
                "abcdef.0123456789abcdef",
                &ca_hash,
                Some("unknown"),
                &dir,
            ))
            .await,
        )?;
        assert_eq!(code, 401, "{message}");
        assert!(message.contains("unknown"), "{message}");
        assert!(dir_is_empty(&dir));

        // A real token with a wrong secret: 401 too.
        let real = str_of(&token, "token")?;
        let (id, _) = real.split_once('.').context("token has an id")?;
        let (code, message) = refused(
            rlark_agent::join::join(&join_options(
                &server.url(),
                &format!("{id}.zzzzzzzzzzzzzzzz"),
                &ca_hash,
                None,
                &tmp.path().join("wrong-secret"),
            ))
            .await,
        )?;
        assert_eq!(code, 401, "{message}");
        assert!(message.contains("invalid"), "{message}");

        for cluster in ["exp", "garbage", "unknown"] {
            let certs = agent_certificates(&admin, cluster).await?;
            assert!(
                certs.is_empty(),
                "certificates issued for {cluster}: {certs:?}"
            );
        }
        let all = call_ok(&admin, "GET", "/rlark/v1/certificates", None).await?;
        let agents: Vec<&Value> = all["items"]
            .as_array()
            .context("items")?
            .iter()
            .filter(|c| c["role"] == "agent")
            .collect();
        assert!(
            agents.is_empty(),
            "agent certificates were issued: {agents:?}"
        );

        server.stop().await
    })
    .await
}

// ---------------------------------------------------------------------------------------
// 3. Pinned CA (man in the middle)
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_ca_hash_is_refused_before_anything_is_sent() -> Result<()> {
    bounded(async {
        let server_a = TestServer::start().await?;
        let server_b = TestServer::start().await?;
        assert_ne!(
            server_a.ca_cert_hash(),
            server_b.ca_cert_hash(),
            "two installations, two CAs"
        );
        let admin_a = server_a.client().await?;
        let admin_b = server_b.client().await?;
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("agent");

        // The agent was told server A's pin, but is talking to server B.
        let token = bootstrap_token(&admin_a, Some("mitm"), 600).await?;
        let result = rlark_agent::join::join(&join_options(
            &server_b.url(),
            str_of(&token, "token")?,
            str_of(&token, "caHash")?,
            None,
            &dir,
        ))
        .await;
        match &result {
            Err(error @ JoinError::Tls { .. }) => {
                let text = error.to_string();
                assert!(text.contains("does not match"), "{text}");
                assert!(
                    text.contains(server_a.ca_cert_hash()),
                    "names the pin: {text}"
                );
            }
            Err(other) => bail!("expected a TLS error about the pin, got {other:?}"),
            Ok(_) => bail!("join with a wrong CA pin succeeded"),
        }
        assert!(
            dir_is_empty(&dir),
            "files written after a refused handshake"
        );
        // Server B saw no join at all (the handshake failed before the request was sent).
        let audit_b =
            std::fs::read_to_string(server_b.data_dir().join(rlark_server::AUDIT_LOG_FILE))?;
        assert!(
            !audit_b.lines().any(|l| l.contains("\"join\"")),
            "server B recorded a join:\n{audit_b}"
        );
        assert!(agent_certificates(&admin_b, "mitm").await?.is_empty());
        let all_b = call_ok(&admin_b, "GET", "/rlark/v1/certificates", None).await?;
        assert!(
            all_b["items"]
                .as_array()
                .context("items")?
                .iter()
                .all(|c| c["role"] != "agent"),
            "server B issued an agent certificate: {all_b}"
        );
        // Nothing reached server A either, and its token is still unused.
        assert!(agent_certificates(&admin_a, "mitm").await?.is_empty());
        let creds = rlark_agent::join::join(&join_options(
            &server_a.url(),
            str_of(&token, "token")?,
            str_of(&token, "caHash")?,
            None,
            &dir,
        ))
        .await
        .context("the token still works against the right server")?;
        assert_eq!(creds.state.cluster_id, "mitm");

        // A malformed pin is refused before connecting.
        let bare_hex = str_of(&token, "caHash")?.replace("sha256:", "");
        for pin in ["sha256:xyz", "md5:abcd", "", bare_hex.as_str()] {
            let result = rlark_agent::join::join(&join_options(
                &server_a.url(),
                str_of(&token, "token")?,
                pin,
                None,
                &tmp.path().join("bad-pin"),
            ))
            .await;
            assert!(
                matches!(result, Err(JoinError::BadPin(_))),
                "pin {pin:?}: {result:?}"
            );
        }
        assert!(dir_is_empty(&tmp.path().join("bad-pin")));

        server_a.stop().await?;
        server_b.stop().await
    })
    .await
}

// ---------------------------------------------------------------------------------------
// 4. The agent's private key stays on the agent
// ---------------------------------------------------------------------------------------

/// Every regular file under `dir`, recursively.
fn files_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("read {}", d.display()))? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                pending.push(entry.path());
            } else if kind.is_file() {
                out.push(entry.path());
            }
        }
    }
    out.sort();
    Ok(out)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// The secrets of a PEM private key as byte strings to look for: the whole base64 body,
/// each full line of it, and the DER bytes.
fn key_needles(key_pem: &str) -> Result<Vec<Vec<u8>>> {
    use rustls::pki_types::PrivateKeyDer;
    use rustls::pki_types::pem::PemObject as _;
    let lines: Vec<&str> = key_pem
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("-----"))
        .collect();
    ensure!(!lines.is_empty(), "empty key PEM");
    let der = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).context("parse private key")?;
    let mut needles = vec![lines.concat().into_bytes(), der.secret_der().to_vec()];
    needles.extend(
        lines
            .iter()
            .filter(|l| l.len() >= 32)
            .map(|l| l.as_bytes().to_vec()),
    );
    Ok(needles)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_private_key_never_reaches_the_server() -> Result<()> {
    bounded(async {
        let server = TestServer::start().await?;
        let admin = server.client().await?;
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("agent");
        let joined = join_cluster(&server, &admin, "a", &dir).await?;
        // Renewal makes and sends a second key's CSR: check that key too.
        let renewed = rlark_agent::join::renew(&dir).await.context("renew")?;
        assert_ne!(joined.info.serial, renewed.info.serial);
        assert_ne!(joined.key_pem, renewed.key_pem);
        // The key in agent.pem is the one the credentials carry.
        let pem = std::fs::read_to_string(dir.join(AGENT_PEM))?;
        let start = pem
            .find("-----BEGIN PRIVATE KEY-----")
            .context("key block in agent.pem")?;
        assert_eq!(pem[start..].trim(), renewed.key_pem.trim());

        let mut needles = key_needles(&joined.key_pem)?;
        needles.extend(key_needles(&renewed.key_pem)?);

        let files = files_under(server.data_dir())?;
        let names: Vec<String> = files
            .iter()
            .filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        assert!(names.iter().any(|n| n == "rlark.db"), "scanned {names:?}");
        let mut saw_serial = false;
        for file in &files {
            let bytes = std::fs::read(file).with_context(|| format!("read {}", file.display()))?;
            for needle in &needles {
                assert!(
                    !contains(&bytes, needle),
                    "{} contains the agent's private key (or part of it)",
                    file.display()
                );
            }
            saw_serial |= contains(&bytes, renewed.info.serial.as_bytes());
        }
        // Positive control: the server did record the certificate it issued.
        assert!(
            saw_serial,
            "no file of the data dir mentions serial {}",
            renewed.info.serial
        );
        eprintln!("scanned {} files: {names:?}", files.len());

        server.stop().await
    })
    .await
}

// ---------------------------------------------------------------------------------------
// 5. Renewal
// ---------------------------------------------------------------------------------------

/// The next watch event on `stream` that is an ADDED of `name`, within `within`.
async fn await_added(
    stream: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<DynamicObject>>> + Unpin),
    name: &str,
    within: Duration,
) -> Result<()> {
    tokio::time::timeout(within, async {
        loop {
            match stream.next().await {
                Some(Ok(WatchEvent::Added(object)))
                    if object.metadata.name.as_deref() == Some(name) =>
                {
                    return Ok(());
                }
                Some(Ok(WatchEvent::Error(status))) => bail!("watch error event: {status:?}"),
                Some(Ok(_)) => {}
                Some(Err(error)) => bail!("watch failed: {error}"),
                None => bail!("watch ended"),
            }
        }
    })
    .await
    .with_context(|| format!("no ADDED event for {name} within {within:?}"))?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_renews_before_expiry() -> Result<()> {
    bounded(async {
        let data = tempfile::tempdir()?;
        let mut config = TestServer::config_for(data.path());
        config.security.agent_cert_validity = Duration::from_secs(6);
        let server = TestServer::start_with(config).await?;
        let admin = server.client().await?;
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("agent");
        let old = join_cluster(&server, &admin, "a", &dir).await?;
        let lifetime = old.info.not_after.duration_since(old.info.not_before)?;
        ensure!(
            lifetime <= Duration::from_secs(8),
            "validity not applied: {lifetime:?}"
        );

        // A watch with the old certificate, opened before the renewal.
        let old_client = client_from_kubeconfig(&dir.join(AGENT_KUBECONFIG)).await?;
        let old_tasks = tasks(&old_client, "rlark-a");
        let rv = old_tasks
            .list(&ListParams::default())
            .await?
            .metadata
            .resource_version
            .context("list has a resourceVersion")?;
        let mut watch = old_tasks
            .watch(&WatchParams::default().timeout(290), &rv)
            .await
            .context("open watch with the old certificate")?
            .boxed();

        let renewer = Renewer::new(&dir)?;
        let mut updates = renewer.subscribe();
        assert_eq!(updates.borrow().info.serial, old.info.serial);
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(renewer.run(shutdown.clone()));
        let renewal = tokio::time::timeout(Duration::from_secs(15), updates.changed()).await;
        let renewed_at = SystemTime::now();
        shutdown.cancel();
        running.await.context("renewer task")?;
        renewal
            .context("no renewal within 15 s")?
            .context("renewer dropped its channel")?;
        let new = updates.borrow().clone();
        assert_ne!(
            new.info.serial, old.info.serial,
            "renewal issued a new serial"
        );
        assert_eq!(new.info.common_name, old.info.common_name);
        assert_eq!(new.info.groups, old.info.groups);
        assert!(
            renewed_at < old.info.not_after,
            "renewed at {renewed_at:?}, after the old certificate expired at {:?}",
            old.info.not_after
        );
        assert_ne!(new.key_pem, old.key_pem, "renewal makes a new key");
        let on_disk = AgentCredentials::load(&dir)?;
        assert_eq!(on_disk.info.serial, new.info.serial);

        // The new credentials work.
        let new_client = client_from_kubeconfig(&dir.join(AGENT_KUBECONFIG)).await?;
        tasks(&new_client, "rlark-a")
            .list(&ListParams::default())
            .await
            .context("list with the renewed certificate")?;

        // The watch opened with the old certificate keeps delivering.
        tasks(&admin, "rlark-a")
            .create(
                &PostParams::default(),
                &task_object("rlark-a", "after-renewal")?,
            )
            .await?;
        await_added(&mut watch, "after-renewal", Duration::from_secs(10))
            .await
            .context("the old certificate's watch after the renewal")?;

        let certs = agent_certificates(&admin, "a").await?;
        assert_eq!(certs.len(), 2, "agent certificates of a: {certs:?}");
        let serials: Vec<&str> = certs.iter().filter_map(|c| c["serial"].as_str()).collect();
        assert!(
            serials.contains(&old.info.serial.as_str())
                && serials.contains(&new.info.serial.as_str()),
            "{serials:?}"
        );

        drop(watch);
        server.stop().await
    })
    .await
}

// ---------------------------------------------------------------------------------------
// 6. Authorization matrix
// ---------------------------------------------------------------------------------------

/// A certificate is checked for expiry on every request, not only at the handshake (as
/// Kubernetes' x509 authenticator does), and an expired agent cannot renew itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_certificate_is_refused_on_an_open_connection() -> Result<()> {
    bounded(async {
        let data = tempfile::tempdir()?;
        let mut config = TestServer::config_for(data.path());
        config.security.agent_cert_validity = Duration::from_secs(2);
        let server = TestServer::start_with(config).await?;
        let admin = server.client().await?;
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("agent");
        let creds = join_cluster(&server, &admin, "a", &dir).await?;
        let client = client_from_kubeconfig(&dir.join(AGENT_KUBECONFIG)).await?;
        tasks(&client, "rlark-a")
            .list(&ListParams::default())
            .await
            .context("list before expiry")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while SystemTime::now() <= creds.info.not_after + Duration::from_millis(200) {
            ensure!(Instant::now() < deadline, "certificate never expired");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The same client (its pooled connection predates expiry) is now refused.
        match tasks(&client, "rlark-a").list(&ListParams::default()).await {
            Err(kube::Error::Api(status)) => {
                ensure!(status.code == 401, "{status:?}");
                ensure!(status.message.contains("expired"), "{}", status.message);
            }
            Err(other) => bail!("expected a 401 Status, got {other}"),
            Ok(_) => bail!("an expired certificate was accepted"),
        }
        match rlark_agent::join::renew(&dir).await {
            Err(JoinError::Expired { serial, .. }) => ensure!(serial == creds.info.serial),
            other => bail!("renewing an expired certificate: {other:?}"),
        }
        server.stop().await?;
        Ok(())
    })
    .await
}

const WHO: [&str; 6] = ["admin", "agentA", "agentB", "viewer", "task", "anonymous"];

/// One request of the matrix; `{who}` in paths and bodies makes names unique per identity.
struct Row {
    what: &'static str,
    method: &'static str,
    path: &'static str,
    body: fn(&str) -> Option<Value>,
    expect: [u16; 6],
}

#[rustfmt::skip]
fn matrix() -> Vec<Row> {
    const TASKS_A: &str = "/apis/rlinf.io/v1alpha1/namespaces/rlark-a/tasks";
    vec![
        // expect: [admin, agentA, agentB, viewer, task, anonymous]
        Row { what: "list jobs", method: "GET", path: "/apis/rlinf.io/v1alpha1/jobs", body: |_| None,
              expect: [200, 403, 403, 200, 403, 401] },
        Row { what: "create job", method: "POST", path: "/apis/rlinf.io/v1alpha1/jobs",
              body: |who| Some(job_json(&format!("job-{}", who.to_lowercase()))),
              expect: [201, 403, 403, 403, 403, 401] },
        Row { what: "get task rlark-a/t1", method: "GET", path: "/apis/rlinf.io/v1alpha1/namespaces/rlark-a/tasks/t1", body: |_| None,
              expect: [200, 200, 403, 200, 200, 401] },
        Row { what: "list tasks in rlark-b", method: "GET", path: "/apis/rlinf.io/v1alpha1/namespaces/rlark-b/tasks", body: |_| None,
              expect: [200, 403, 200, 200, 403, 401] },
        Row { what: "create task in rlark-a", method: "POST", path: TASKS_A,
              body: |who| Some(task_json("rlark-a", &format!("t-{}", who.to_lowercase()))),
              expect: [201, 201, 403, 403, 403, 401] },
        Row { what: "patch tasks/status in rlark-a", method: "PATCH", path: "/apis/rlinf.io/v1alpha1/namespaces/rlark-a/tasks/t1/status",
              body: |_| Some(json!({"status": {"phase": "Running"}})),
              expect: [200, 200, 403, 403, 403, 401] },
        Row { what: "create event about t1 in rlark-a", method: "POST", path: "/api/v1/namespaces/rlark-a/events",
              body: |who| Some(event_json("rlark-a", &format!("t1.{}", who.to_lowercase()), "t1")),
              expect: [201, 201, 403, 403, 201, 401] },
        Row { what: "GET /rlark/v1/certificates", method: "GET", path: "/rlark/v1/certificates", body: |_| None,
              expect: [200, 403, 403, 403, 403, 401] },
        Row { what: "POST /rlark/v1/tokens", method: "POST", path: "/rlark/v1/tokens",
              body: |_| Some(json!({"kind": "bootstrap", "ttlSeconds": 60, "clusterID": "m1"})),
              expect: [200, 403, 403, 403, 403, 401] },
    ]
}

/// A 403 must be a `Status` whose message names `user`; a 401 must be a `Status` too.
fn check_refusal(resp: &Resp, user: &str) -> Option<String> {
    match resp.code {
        403 => {
            let named = format!("User \"{user}\"");
            (resp.json["kind"] != "Status"
                || resp.json["code"] != 403
                || !resp.message().contains(&named))
            .then(|| format!("403 body is not a Status naming {named}: {}", resp.text))
        }
        401 => (resp.json["kind"] != "Status" || resp.json["code"] != 401)
            .then(|| format!("401 body is not a Status: {}", resp.text)),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_matrix_over_tls() -> Result<()> {
    bounded(async {
        let server = TestServer::start().await?;
        let admin = server.client().await?;
        let tmp = tempfile::tempdir()?;
        let url = server.url();
        let ca = ca_bundle(&admin).await?;

        let a_dir = tmp.path().join("agent-a");
        let b_dir = tmp.path().join("agent-b");
        join_cluster(&server, &admin, "a", &a_dir).await?;
        join_cluster(&server, &admin, "b", &b_dir).await?;
        let agent_a = client_from_kubeconfig(&a_dir.join(AGENT_KUBECONFIG)).await?;
        let agent_b = client_from_kubeconfig(&b_dir.join(AGENT_KUBECONFIG)).await?;
        let (viewer, _) = client_from_yaml(
            tmp.path(),
            "viewer.kubeconfig",
            &viewer_kubeconfig(&server, &admin, "alice").await?,
        )
        .await?;

        // Task rlark-a/t1, running, and its token.
        tasks(&admin, "rlark-a")
            .create(&PostParams::default(), &task_object("rlark-a", "t1")?)
            .await?;
        set_task_phase(&admin, "rlark-a", "t1", "Running").await?;
        let minted = call_ok(
            &admin,
            "POST",
            "/rlark/v1/namespaces/rlark-a/tasks/t1/token",
            None,
        )
        .await?;
        let task_token = str_of(&minted, "token")?.to_string();
        let (task, _) = client_from_yaml(
            tmp.path(),
            "task.kubeconfig",
            &kubeconfig_with_user(&url, &ca, &format!("{{token: \"{task_token}\"}}")),
        )
        .await?;
        // TLS that trusts the CA, but no credentials at all.
        let (anonymous, _) = client_from_yaml(
            tmp.path(),
            "anonymous.kubeconfig",
            &kubeconfig_with_user(&url, &ca, "{}"),
        )
        .await?;

        let users = [
            "admin",
            "system:rlark:agent:a",
            "system:rlark:agent:b",
            "alice",
            "system:rlark:task:rlark-a:t1",
            "",
        ];
        let clients = [&admin, &agent_a, &agent_b, &viewer, &task, &anonymous];

        let mut table = String::new();
        let mut failures = Vec::new();
        for row in matrix() {
            let mut got = Vec::new();
            for (i, client) in clients.iter().enumerate() {
                let body = (row.body)(WHO[i]);
                let resp = call(client, row.method, row.path, body.as_ref()).await?;
                if resp.code != row.expect[i] {
                    failures.push(format!(
                        "{} as {}: got {}, want {}: {}",
                        row.what, WHO[i], resp.code, row.expect[i], resp.text
                    ));
                }
                if let Some(problem) = check_refusal(&resp, users[i]) {
                    failures.push(format!("{} as {}: {problem}", row.what, WHO[i]));
                }
                got.push(resp.code);
            }
            table.push_str(&format!(
                "{:<34} {}\n",
                row.what,
                got.iter().map(|c| format!("{c:>6}")).collect::<String>()
            ));
        }
        eprintln!(
            "{:<34} {}\n{table}",
            "",
            WHO.iter()
                .map(|w| format!("{:>6}", &w[..w.len().min(6)]))
                .collect::<String>()
        );

        // Agent A gets nothing in rlark-b.
        let b_requests: &[(&str, &str, Option<Value>)] = &[
            (
                "GET",
                "/apis/rlinf.io/v1alpha1/namespaces/rlark-b/tasks",
                None,
            ),
            (
                "GET",
                "/apis/rlinf.io/v1alpha1/namespaces/rlark-b/tasks?watch=true&timeoutSeconds=1",
                None,
            ),
            (
                "GET",
                "/apis/rlinf.io/v1alpha1/namespaces/rlark-b/tasks/t1",
                None,
            ),
            (
                "POST",
                "/apis/rlinf.io/v1alpha1/namespaces/rlark-b/tasks",
                Some(task_json("rlark-b", "x")),
            ),
            (
                "PATCH",
                "/apis/rlinf.io/v1alpha1/namespaces/rlark-b/tasks/t1",
                Some(json!({"metadata": {"labels": {"x": "y"}}})),
            ),
            (
                "PATCH",
                "/apis/rlinf.io/v1alpha1/namespaces/rlark-b/tasks/t1/status",
                Some(json!({"status": {"phase": "Failed"}})),
            ),
            (
                "DELETE",
                "/apis/rlinf.io/v1alpha1/namespaces/rlark-b/tasks/t1",
                None,
            ),
            (
                "GET",
                "/apis/rlinf.io/v1alpha1/namespaces/rlark-b/nodes",
                None,
            ),
            (
                "POST",
                "/apis/rlinf.io/v1alpha1/namespaces/rlark-b/nodes",
                Some(json!({"metadata": {"name": "n"}})),
            ),
            (
                "GET",
                "/apis/rlinf.io/v1alpha1/namespaces/rlark-b/pods",
                None,
            ),
            (
                "GET",
                "/apis/rlinf.io/v1alpha1/namespaces/rlark-b/domainpeers",
                None,
            ),
            (
                "GET",
                "/apis/coordination.k8s.io/v1/namespaces/rlark-b/leases",
                None,
            ),
            (
                "POST",
                "/apis/coordination.k8s.io/v1/namespaces/rlark-b/leases",
                Some(json!({"metadata": {"name": "hb"}})),
            ),
            ("GET", "/api/v1/namespaces/rlark-b/events", None),
            (
                "POST",
                "/api/v1/namespaces/rlark-b/events",
                Some(event_json("rlark-b", "e", "t1")),
            ),
            ("GET", "/api/v1/namespaces/rlark-b", None),
            ("POST", "/rlark/v1/namespaces/rlark-b/tasks/t1/token", None),
        ];
        for (method, path, body) in b_requests {
            let resp = call(&agent_a, method, path, body.as_ref()).await?;
            if resp.code != 403 {
                failures.push(format!(
                    "agentA {method} {path}: got {}, want 403: {}",
                    resp.code, resp.text
                ));
            } else if let Some(problem) = check_refusal(&resp, users[1]) {
                failures.push(format!("agentA {method} {path}: {problem}"));
            }
        }

        // Once the Task has finished, its token is worthless.
        set_task_phase(&admin, "rlark-a", "t1", "Succeeded").await?;
        let resp = call(
            &task,
            "GET",
            "/apis/rlinf.io/v1alpha1/namespaces/rlark-a/tasks/t1",
            None,
        )
        .await?;
        if resp.code != 401 {
            failures.push(format!(
                "task token after Succeeded: got {}, want 401: {}",
                resp.code, resp.text
            ));
        } else if !resp.message().contains("no longer running") {
            failures.push(format!(
                "task token after Succeeded: 401 without the reason: {}",
                resp.text
            ));
        }

        assert!(
            failures.is_empty(),
            "{} failures:\n{}",
            failures.len(),
            failures.join("\n")
        );
        server.stop().await
    })
    .await
}

// ---------------------------------------------------------------------------------------
// 7. Revocation
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_cuts_an_open_watch_and_survives_restart() -> Result<()> {
    bounded(async {
        let server = TestServer::start().await?;
        let admin = server.client().await?;
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("agent");
        let creds = join_cluster(&server, &admin, "a", &dir).await?;
        let agent = client_from_kubeconfig(&dir.join(AGENT_KUBECONFIG)).await?;
        // Another cluster's agent, which the revocation must not touch.
        let b_dir = tmp.path().join("agent-b");
        let creds_b = join_cluster(&server, &admin, "b", &b_dir).await?;

        // A forbidden request first, for the audit trail.
        let denied = call(
            &agent,
            "GET",
            "/apis/rlinf.io/v1alpha1/namespaces/rlark-b/tasks",
            None,
        )
        .await?;
        assert_eq!(denied.code, 403, "{}", denied.text);

        let agent_tasks = tasks(&agent, "rlark-a");
        let rv = agent_tasks
            .list(&ListParams::default())
            .await?
            .metadata
            .resource_version
            .context("resourceVersion")?;
        let mut watch = agent_tasks
            .watch(&WatchParams::default().timeout(290), &rv)
            .await
            .context("open watch")?
            .boxed();
        // The watch is live: it sees a Task the admin creates.
        tasks(&admin, "rlark-a")
            .create(&PostParams::default(), &task_object("rlark-a", "before")?)
            .await?;
        await_added(&mut watch, "before", Duration::from_secs(10)).await?;

        let started = Instant::now();
        let revoked = call_ok(
            &admin,
            "POST",
            "/rlark/v1/revocations",
            Some(&json!({"clusterID": "a"})),
        )
        .await?;
        let serials: Vec<&str> = revoked["revoked"]
            .as_array()
            .context("revoked serials")?
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(serials, [creds.info.serial.as_str()], "{revoked}");

        // The watch must end (hang guard only; the latency is reported, not asserted).
        let ending = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match watch.next().await {
                    None => return "end of stream".to_string(),
                    Some(Err(error)) => return format!("error: {error}"),
                    Some(Ok(WatchEvent::Error(status))) => {
                        return format!("error event: {status:?}");
                    }
                    Some(Ok(_)) => {}
                }
            }
        })
        .await
        .context("the revoked agent's watch did not end within 10 s")?;
        eprintln!(
            "watch ended {:?} after the revocation ({ending})",
            started.elapsed()
        );

        // New requests with the revoked certificate fail (handshake or 401).
        let expect_refused = |result: kube::Result<kube::core::ObjectList<DynamicObject>>,
                              when: &str|
         -> Result<()> {
            match result {
                Ok(_) => bail!("{when}: the revoked certificate still works"),
                Err(kube::Error::Api(status)) => {
                    ensure!(
                        status.code == 401,
                        "{when}: refused with {status:?}, want 401"
                    );
                    Ok(())
                }
                Err(other) => {
                    eprintln!("{when}: refused: {other}");
                    Ok(())
                }
            }
        };
        expect_refused(
            agent_tasks.list(&ListParams::default()).await,
            "same client",
        )?;
        let fresh = client_from_kubeconfig(&dir.join(AGENT_KUBECONFIG)).await?;
        expect_refused(
            tasks(&fresh, "rlark-a").list(&ListParams::default()).await,
            "new connection",
        )?;
        // The refusal is about that certificate: agent B still gets in on a new connection.
        let agent_b = client_from_kubeconfig(&b_dir.join(AGENT_KUBECONFIG)).await?;
        tasks(&agent_b, "rlark-b")
            .list(&ListParams::default())
            .await
            .context("agent B after the revocation of cluster a")?;

        // Still refused after a restart.
        let server = server.restart().await?;
        let admin = server.client().await?;
        let (after_restart, _) = client_from_yaml(
            tmp.path(),
            "revoked.kubeconfig",
            &agent_kubeconfig(&server.url(), &creds),
        )
        .await?;
        expect_refused(
            tasks(&after_restart, "rlark-a")
                .list(&ListParams::default())
                .await,
            "after restart",
        )?;
        let (b_after_restart, _) = client_from_yaml(
            tmp.path(),
            "b.kubeconfig",
            &agent_kubeconfig(&server.url(), &creds_b),
        )
        .await?;
        tasks(&b_after_restart, "rlark-b")
            .list(&ListParams::default())
            .await
            .context("agent B after the restart")?;
        // The admin still gets in, and the revocation is listed.
        let revocations = call_ok(&admin, "GET", "/rlark/v1/revocations", None).await?;
        let listed = revocations["items"]
            .as_array()
            .context("revocation items")?
            .iter()
            .any(|r| {
                r["serial"] == creds.info.serial.as_str() && r["user"] == "system:rlark:agent:a"
            });
        assert!(
            listed,
            "revocation of {} not listed: {revocations}",
            creds.info.serial
        );
        let certs = agent_certificates(&admin, "a").await?;
        assert!(
            certs.iter().all(|c| c["revokedAt"].is_string()),
            "certificate listing does not mark the revocation: {certs:?}"
        );

        // The audit trail.
        let audit = std::fs::read_to_string(server.data_dir().join(rlark_server::AUDIT_LOG_FILE))?;
        let records: Vec<Value> = audit
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()
            .context("audit.log is JSON lines")?;
        assert!(
            records
                .iter()
                .any(|r| r["action"] == "revoke" && r["name"] == creds.info.serial.as_str()),
            "no revoke record for {} in:\n{audit}",
            creds.info.serial
        );
        assert!(
            records
                .iter()
                .any(|r| r["decision"] == "denied" && r["user"] == "system:rlark:agent:a"),
            "no denied record of the agent in:\n{audit}"
        );

        server.stop().await
    })
    .await
}

// ---------------------------------------------------------------------------------------
// 8. Bad CSRs and bodies
// ---------------------------------------------------------------------------------------

/// `csr_pem` with one bit of its signature flipped: still well-formed, no longer valid.
fn tampered_csr(csr_pem: &str) -> Result<String> {
    use rustls::pki_types::CertificateSigningRequestDer;
    use rustls::pki_types::pem::PemObject as _;
    let der = CertificateSigningRequestDer::from_pem_slice(csr_pem.as_bytes())
        .context("parse CSR PEM")?;
    let mut der = der.as_ref().to_vec();
    let last = der.last_mut().context("empty CSR")?;
    *last ^= 0x01;
    let body = base64(&der);
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap_or_default())
        .collect();
    Ok(format!(
        "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
        lines.join("\n")
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_csrs_and_bodies_get_400_with_a_reason() -> Result<()> {
    bounded(async {
        let server = TestServer::start().await?;
        let admin = server.client().await?;
        let tmp = tempfile::tempdir()?;
        let ca = ca_bundle(&admin).await?;
        let (anonymous, _) = client_from_yaml(
            tmp.path(),
            "anonymous.kubeconfig",
            &kubeconfig_with_user(&server.url(), &ca, "{}"),
        )
        .await?;
        let token_value = bootstrap_token(&admin, Some("c8"), 600).await?;
        let token = str_of(&token_value, "token")?;
        let good = rlark_pki::generate_key_and_csr("c8")?;

        let rsa = include_str!("../../../rlark-pki/src/testdata/rsa.csr");
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            (
                "not a CSR",
                json!({"token": token, "csr": "hello, I am not a CSR"})
                    .to_string()
                    .into_bytes(),
                "not a PEM",
            ),
            (
                "an RSA CSR",
                json!({"token": token, "csr": rsa}).to_string().into_bytes(),
                "RSA",
            ),
            (
                "a tampered CSR",
                json!({"token": token, "csr": tampered_csr(&good.csr_pem)?})
                    .to_string()
                    .into_bytes(),
                "signature does not verify",
            ),
            (
                "a 100 KiB body",
                json!({"token": token, "csr": "A".repeat(100 * 1024)})
                    .to_string()
                    .into_bytes(),
                "larger than 65536 bytes",
            ),
            ("an empty body", Vec::new(), "request body is empty"),
            (
                "an unknown field",
                json!({"token": token, "csr": good.csr_pem, "clusterId": "c8"})
                    .to_string()
                    .into_bytes(),
                "unknown field `clusterId`",
            ),
            ("not JSON", b"{token: nope".to_vec(), "invalid request body"),
            (
                "a CSR that is a number",
                json!({"token": token, "csr": 42}).to_string().into_bytes(),
                "csr",
            ),
        ];
        let mut failures = Vec::new();
        for (what, body, reason) in cases {
            let resp = call_raw(
                &anonymous,
                "POST",
                "/rlark/v1/join",
                "application/json",
                body,
            )
            .await?;
            let ok = resp.code == 400
                && resp.json["kind"] == "Status"
                && resp.json["reason"] == "BadRequest"
                && resp.message().contains(reason);
            if !ok {
                failures.push(format!(
                    "{what}: want 400 naming {reason:?}, got {} {}",
                    resp.code, resp.text
                ));
            }
            eprintln!("{what}: {} {}", resp.code, resp.message());
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        assert!(agent_certificates(&admin, "c8").await?.is_empty());

        // None of that used up the token.
        let creds = rlark_agent::join::join(&join_options(
            &server.url(),
            token,
            str_of(&token_value, "caHash")?,
            None,
            &tmp.path().join("agent"),
        ))
        .await
        .context("join after the bad requests")?;
        assert_eq!(creds.state.cluster_id, "c8");
        assert_eq!(agent_certificates(&admin, "c8").await?.len(), 1);

        server.stop().await
    })
    .await
}

// ---------------------------------------------------------------------------------------
// 9. kubectl as a viewer
// ---------------------------------------------------------------------------------------

const KUBECTL: &str = "/usr/bin/kubectl";

async fn kubectl(kubeconfig: &Path, cache: &Path, args: &[&str]) -> Result<std::process::Output> {
    let mut command = tokio::process::Command::new(KUBECTL);
    command
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(cache)
        .args(args)
        .env("HOME", cache)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .with_context(|| format!("kubectl {args:?} did not finish within 60 s"))?
        .with_context(|| format!("run kubectl {args:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_viewer_can_get_but_not_apply() -> Result<()> {
    if !Path::new(KUBECTL).exists() {
        missing_tool::skip_or_fail(&format!("{KUBECTL} is not installed"));
        return Ok(());
    }
    bounded(async {
        let server = TestServer::start().await?;
        let admin = server.client().await?;
        let tmp = tempfile::tempdir()?;
        let cache = tmp.path().join("cache");
        std::fs::create_dir_all(&cache)?;
        let kubeconfig = tmp.path().join("alice.kubeconfig");
        std::fs::write(
            &kubeconfig,
            viewer_kubeconfig(&server, &admin, "alice").await?,
        )?;

        let out = kubectl(&kubeconfig, &cache, &["get", "jobs"]).await?;
        assert!(
            out.status.success(),
            "kubectl get jobs as a viewer failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );

        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/job.yaml");
        let manifest = manifest.to_str().context("manifest path")?;
        let out = kubectl(&kubeconfig, &cache, &["apply", "-f", manifest]).await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "kubectl apply as a viewer succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(stderr.contains("forbidden"), "{stderr}");
        assert!(stderr.contains("User \"alice\""), "{stderr}");
        eprintln!("kubectl apply as alice: {}", stderr.trim());

        // Nothing was created.
        let jobs = call_ok(&admin, "GET", "/apis/rlinf.io/v1alpha1/jobs", None).await?;
        assert_eq!(jobs["items"].as_array().map(Vec::len), Some(0), "{jobs}");

        server.stop().await
    })
    .await
}

// ---------------------------------------------------------------------------------------
// 9. Forgetting: a lost store, join guessing, renewal chains (issue 14, finding 5)
// ---------------------------------------------------------------------------------------

/// Whether `result` (a request with a revoked certificate) was refused: a 401 `Status`, or
/// a failed TLS handshake.
fn refused_revoked<T: std::fmt::Debug>(result: kube::Result<T>, when: &str) -> Result<()> {
    match result {
        Ok(value) => bail!("{when}: the revoked certificate still works: {value:?}"),
        Err(kube::Error::Api(status)) => {
            ensure!(
                status.code == 401,
                "{when}: refused with {status:?}, want 401"
            );
            Ok(())
        }
        Err(other) => {
            eprintln!("{when}: refused: {other}");
            Ok(())
        }
    }
}

/// The error of starting a server on `dir` (which must fail).
async fn start_error(config: rlark_server::ServerConfig) -> Result<String> {
    match TestServer::start_with(config).await {
        Ok(server) => {
            server.stop().await?;
            bail!("the server started")
        }
        Err(error) => Ok(format!("{error:#}")),
    }
}

/// A server whose `rlark.db` is deleted, or emptied, while its CA stays refuses to start,
/// saying what is wrong and how to go on; with `reinitialize_store` it starts on an empty
/// store and a certificate revoked before is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_store_is_refused_and_reinitializing_keeps_revocations() -> Result<()> {
    bounded(async {
        let data = tempfile::tempdir()?;
        let server = TestServer::start_in(data.path()).await?;
        let admin = server.client().await?;
        let tmp = tempfile::tempdir()?;
        let revoked = join_cluster(&server, &admin, "gone", &tmp.path().join("gone")).await?;
        let kept = join_cluster(&server, &admin, "kept", &tmp.path().join("kept")).await?;
        let answer = call_ok(
            &admin,
            "POST",
            "/rlark/v1/revocations",
            Some(&json!({"serial": revoked.info.serial})),
        )
        .await?;
        assert_eq!(answer["revoked"], json!([revoked.info.serial]), "{answer}");
        server.stop().await?;
        let revocation_file = data
            .path()
            .join(rlark_server::PKI_DIR)
            .join(rlark_server::REVOCATIONS_FILE);
        assert_eq!(mode_of(&revocation_file)?, 0o600, "revocations.json mode");

        // The store is deleted: refused, and no empty store is left behind.
        let db = data.path().join(rlark_server::DATABASE_FILE);
        for suffix in ["", "-wal", "-shm"] {
            let mut path = db.clone().into_os_string();
            path.push(suffix);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).context("remove the store"),
            }
        }
        let error = start_error(TestServer::config_for(data.path())).await?;
        for needle in [
            "refusing to start",
            "is missing",
            db.to_str().context("db path")?,
            "restore",
            "--reinitialize-store",
        ] {
            assert!(error.contains(needle), "{needle:?} not in: {error}");
        }
        assert!(!db.exists(), "the refused start created {}", db.display());

        // An empty file (truncated): refused too.
        std::fs::write(&db, b"")?;
        let error = start_error(TestServer::config_for(data.path())).await?;
        assert!(error.contains("is empty"), "{error}");
        assert!(error.contains("--reinitialize-store"), "{error}");

        // On purpose: starts empty, the revocation is still in force.
        let mut config = TestServer::config_for(data.path());
        config.reinitialize_store = true;
        let server = TestServer::start_with(config).await?;
        let admin = server.client().await?;
        let (revoked_client, _) = client_from_yaml(
            tmp.path(),
            "gone.kubeconfig",
            &agent_kubeconfig(&server.url(), &revoked),
        )
        .await?;
        refused_revoked(
            tasks(&revoked_client, "rlark-gone")
                .list(&ListParams::default())
                .await,
            "after reinitializing",
        )?;
        // A certificate that was not revoked still authenticates.
        let (kept_client, _) = client_from_yaml(
            tmp.path(),
            "kept.kubeconfig",
            &agent_kubeconfig(&server.url(), &kept),
        )
        .await?;
        tasks(&kept_client, "rlark-kept")
            .list(&ListParams::default())
            .await
            .context("the agent that was not revoked")?;
        // The revocation is back in the store's list.
        let listed = call_ok(&admin, "GET", "/rlark/v1/revocations", None).await?;
        assert!(
            listed["items"]
                .as_array()
                .context("items")?
                .iter()
                .any(|r| r["serial"] == revoked.info.serial.as_str()),
            "{listed}"
        );

        // The reinitialized store is the installation's store now: plain restarts work.
        let server = server.restart().await?;
        let (revoked_client, _) = client_from_yaml(
            tmp.path(),
            "gone-2.kubeconfig",
            &agent_kubeconfig(&server.url(), &revoked),
        )
        .await?;
        refused_revoked(
            tasks(&revoked_client, "rlark-gone")
                .list(&ListParams::default())
                .await,
            "after a restart of the reinitialized store",
        )?;
        server.stop().await
    })
    .await
}

/// One anonymous `POST /rlark/v1/join` from `source` (a loopback address) over a new TLS
/// connection: status, `Retry-After`, body.
async fn join_from(
    server: &TestServer,
    ca_pem: &str,
    source: std::net::IpAddr,
    body: &Value,
) -> Result<(u16, Option<u64>, Value)> {
    use http_body_util::Full;
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, ServerName};

    let socket = tokio::net::TcpSocket::new_v4()?;
    socket
        .bind(std::net::SocketAddr::new(source, 0))
        .with_context(|| format!("bind {source}"))?;
    let tcp = socket.connect(server.addr()).await?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.context("CA bundle")?)?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls))
        .connect(ServerName::try_from("127.0.0.1")?.to_owned(), tcp)
        .await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    let conn = tokio::spawn(conn);
    let request = http::Request::post("/rlark/v1/join")
        .header(http::header::HOST, server.addr().to_string())
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(bytes::Bytes::from(body.to_string())))?;
    let response = sender.send_request(request).await?;
    let code = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(http::header::RETRY_AFTER)
        .map(|v| -> Result<u64> { Ok(v.to_str()?.parse()?) })
        .transpose()?;
    let bytes = response.into_body().collect().await?.to_bytes();
    drop(sender);
    conn.abort();
    Ok((
        code,
        retry_after,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    ))
}

/// Guessing bootstrap tokens from one address gets 429 with `Retry-After` after a few
/// failures, even with a right token then; another address and successful joins are not
/// affected, and the refused guesses add no audit records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_guesses_from_one_source_are_rate_limited() -> Result<()> {
    bounded(async {
        let data = tempfile::tempdir()?;
        let mut config = TestServer::config_for(data.path());
        config.security.join_limit.burst = 3;
        let server = TestServer::start_with(config).await?;
        let admin = server.client().await?;
        let ca = ca_bundle(&admin).await?;
        let csr = rlark_pki::generate_key_and_csr("agent")?.csr_pem;
        let guesser: std::net::IpAddr = "127.0.0.1".parse()?;
        let other: std::net::IpAddr = "127.0.0.2".parse()?;
        let guess =
            |i: usize| json!({"token": format!("abcdef.{i:016}"), "csr": csr, "clusterID": "x"});

        let mut codes = Vec::new();
        let mut first_429 = None;
        for i in 0..6 {
            let (code, retry_after, body) = join_from(&server, &ca, guesser, &guess(i)).await?;
            codes.push(code);
            if code == 429 && first_429.is_none() {
                first_429 = Some((retry_after, body));
            }
        }
        assert_eq!(
            codes,
            [401, 401, 401, 429, 429, 429],
            "guesses from one source"
        );
        let (retry_after, body) = first_429.context("no 429")?;
        let retry_after = retry_after.context("429 without Retry-After")?;
        assert!(retry_after >= 1, "Retry-After {retry_after}");
        assert_eq!(body["reason"], "TooManyRequests", "{body}");
        assert_eq!(body["details"]["retryAfterSeconds"], retry_after, "{body}");

        // While blocked, even a right token is refused from there (not even looked at)...
        let token = bootstrap_token(&admin, Some("good"), 600).await?;
        let good = json!({"token": str_of(&token, "token")?, "csr": csr});
        let (code, _, body) = join_from(&server, &ca, guesser, &good).await?;
        assert_eq!(code, 429, "{body}");
        // ... while another address is judged on its own: a wrong token is a 401, the right
        // one joins (the token was not used up by the refused attempt).
        let (code, _, body) = join_from(&server, &ca, other, &guess(100)).await?;
        assert_eq!(code, 401, "{body}");
        let (code, _, body) = join_from(&server, &ca, other, &good).await?;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["clusterID"], "good", "{body}");
        // Successful joins cost nothing: more of them than the burst, from one address.
        for i in 0..5 {
            let cluster = format!("many-{i}");
            let token = bootstrap_token(&admin, Some(&cluster), 600).await?;
            let body = json!({"token": str_of(&token, "token")?, "csr": csr});
            let (code, _, answer) = join_from(&server, &ca, other, &body).await?;
            assert_eq!(code, 200, "join {i} from {other}: {answer}");
        }

        // The audit log has the three guesses that were looked at, the one of the other
        // address, and one record of the block: not the refused attempts.
        let audit = std::fs::read_to_string(data.path().join(rlark_server::AUDIT_LOG_FILE))?;
        let records: Vec<Value> = audit
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()?;
        let denied_joins = records
            .iter()
            .filter(|r| r["action"] == "join" && r["decision"] == "denied")
            .count();
        let blocks: Vec<&Value> = records
            .iter()
            .filter(|r| {
                r["action"] == "join"
                    && r["reason"]
                        .as_str()
                        .is_some_and(|s| s.contains("too many failed joins"))
            })
            .collect();
        assert_eq!(blocks.len(), 1, "{blocks:?}");
        assert!(
            blocks[0]["reason"]
                .as_str()
                .is_some_and(|s| s.contains("127.0.0.1")),
            "{blocks:?}"
        );
        assert_eq!(denied_joins, 3 + 1 + 1, "join records:\n{audit}");
        // Refusals name their source.
        let from = |ip: &str| {
            records
                .iter()
                .filter(|r| {
                    r["reason"]
                        .as_str()
                        .is_some_and(|s| s.contains(&format!("unknown (source {ip})")))
                })
                .count()
        };
        assert_eq!((from("127.0.0.1"), from("127.0.0.2")), (3, 1), "{audit}");
        server.stop().await
    })
    .await
}

/// Revoking a certificate by serial revokes the certificates renewed from it (the renewal
/// chain), and only those: the certificate a revoked one was renewed from stays valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_a_serial_revokes_its_renewals() -> Result<()> {
    bounded(async {
        let server = TestServer::start().await?;
        let admin = server.client().await?;
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("a");
        let first = join_cluster(&server, &admin, "a", &dir).await?;
        let second = rlark_agent::join::renew(&dir).await.context("renew")?;
        let third = rlark_agent::join::renew(&dir)
            .await
            .context("renew again")?;
        let certs = agent_certificates(&admin, "a").await?;
        let renewed_from = |serial: &str| {
            certs
                .iter()
                .find(|c| c["serial"] == serial)
                .map(|c| c["renewedFrom"].clone())
        };
        assert_eq!(
            renewed_from(&third.info.serial),
            Some(json!(second.info.serial))
        );
        assert_eq!(
            renewed_from(&second.info.serial),
            Some(json!(first.info.serial))
        );

        let answer = call_ok(
            &admin,
            "POST",
            "/rlark/v1/revocations",
            Some(&json!({"serial": first.info.serial})),
        )
        .await?;
        let mut revoked: Vec<&str> = answer["revoked"]
            .as_array()
            .context("revoked")?
            .iter()
            .filter_map(Value::as_str)
            .collect();
        revoked.sort_unstable();
        let mut want = vec![
            first.info.serial.as_str(),
            second.info.serial.as_str(),
            third.info.serial.as_str(),
        ];
        want.sort_unstable();
        assert_eq!(revoked, want, "{answer}");
        // The newest certificate, in the agent's directory, is refused.
        let newest = client_from_kubeconfig(&dir.join(AGENT_KUBECONFIG)).await?;
        refused_revoked(
            tasks(&newest, "rlark-a").list(&ListParams::default()).await,
            "the renewed certificate",
        )?;

        // Revoking a renewal leaves the certificate it was renewed from alone.
        let b_dir = tmp.path().join("b");
        let b_first = join_cluster(&server, &admin, "b", &b_dir).await?;
        let b_second = rlark_agent::join::renew(&b_dir).await?;
        let answer = call_ok(
            &admin,
            "POST",
            "/rlark/v1/revocations",
            Some(&json!({"serial": b_second.info.serial})),
        )
        .await?;
        assert_eq!(answer["revoked"], json!([b_second.info.serial]), "{answer}");
        let (b_old, _) = client_from_yaml(
            tmp.path(),
            "b-first.kubeconfig",
            &agent_kubeconfig(&server.url(), &b_first),
        )
        .await?;
        tasks(&b_old, "rlark-b")
            .list(&ListParams::default())
            .await
            .context("the certificate the revoked one was renewed from")?;
        server.stop().await
    })
    .await
}

// ---------------------------------------------------------------------------------------
// The revoked agent serials agents check direct-path peers against
// ---------------------------------------------------------------------------------------

const AGENT_REVOCATIONS: &str = "/rlark/v1/agentrevocations";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_read_the_revoked_agent_serials() -> Result<()> {
    use rlark_net::revocations::{Fetched, Refusal, Revocations, fetch};
    bounded(async {
        let server = TestServer::start().await?;
        let admin = server.client().await?;
        let tmp = tempfile::tempdir()?;
        let ca = ca_bundle(&admin).await?;
        let a_dir = tmp.path().join("a");
        join_cluster(&server, &admin, "a", &a_dir).await?;
        let agent_a = client_from_kubeconfig(&a_dir.join(AGENT_KUBECONFIG)).await?;
        let b = join_cluster(&server, &admin, "b", &tmp.path().join("b")).await?;
        let c = join_cluster(&server, &admin, "c", &tmp.path().join("c")).await?;
        let (viewer, _) = client_from_yaml(
            tmp.path(),
            "viewer.kubeconfig",
            &viewer_kubeconfig(&server, &admin, "alice").await?,
        )
        .await?;
        let (anonymous, _) = client_from_yaml(
            tmp.path(),
            "anonymous.kubeconfig",
            &kubeconfig_with_user(&server.url(), &ca, "{}"),
        )
        .await?;

        // Who may read it.
        let first = call(&agent_a, "GET", AGENT_REVOCATIONS, None).await?;
        assert_eq!(first.code, 200, "{}", first.brief());
        assert_eq!(first.json["serials"], json!([]), "{}", first.text);
        let etag = first
            .headers
            .get(http::header::ETAG)
            .and_then(|v| v.to_str().ok())
            .context("no ETag")?
            .to_string();
        assert_eq!(
            call(&admin, "GET", AGENT_REVOCATIONS, None).await?.code,
            200
        );
        let refused = call(&anonymous, "GET", AGENT_REVOCATIONS, None).await?;
        assert_eq!(refused.code, 401, "{}", refused.brief());
        let refused = call(&viewer, "GET", AGENT_REVOCATIONS, None).await?;
        assert_eq!(refused.code, 403, "{}", refused.brief());
        for bad in ["?waitSeconds=61", "?waitSeconds=x", "?watch=1"] {
            let resp = call(&agent_a, "GET", &format!("{AGENT_REVOCATIONS}{bad}"), None).await?;
            assert_eq!(resp.code, 400, "{bad}: {}", resp.brief());
        }
        // Unchanged: 304.
        assert_eq!(
            fetch(&agent_a, Some(&etag), Duration::ZERO).await?,
            Fetched::Unchanged
        );

        // A poll held open learns of the revocation of cluster b.
        let poll = {
            let (agent_a, etag) = (agent_a.clone(), etag.clone());
            tokio::spawn(async move { fetch(&agent_a, Some(&etag), Duration::from_secs(30)).await })
        };
        call_ok(
            &admin,
            "POST",
            "/rlark/v1/revocations",
            Some(&json!({"clusterID": "b"})),
        )
        .await?;
        let Fetched::Changed {
            etag: after_b,
            serials,
        } = poll.await??
        else {
            bail!("the held poll did not see the revocation");
        };
        assert_eq!(serials, vec![b.info.serial.clone()]);
        assert_ne!(after_b, etag);

        // A user's revocation is not published to agents: the list stays as it was.
        call_ok(
            &admin,
            "POST",
            "/rlark/v1/revocations",
            Some(&json!({"user": "alice"})),
        )
        .await?;
        assert_eq!(
            fetch(&agent_a, Some(&after_b), Duration::ZERO).await?,
            Fetched::Unchanged
        );

        // The agent's follower: the set it reads at start, then a change while it polls.
        let revocations = Revocations::unknown();
        let stop = CancellationToken::new();
        let follower = tokio::spawn(revocations.clone().follow(agent_a.clone(), stop.clone()));
        tokio::time::timeout(Duration::from_secs(30), revocations.wait_known())
            .await
            .context("the follower did not read the set")?;
        assert_eq!(
            revocations.check(&b.info.serial),
            Err(Refusal::Revoked {
                serial: b.info.serial.clone()
            })
        );
        assert_eq!(revocations.check(&c.info.serial), Ok(()));
        call_ok(
            &admin,
            "POST",
            "/rlark/v1/revocations",
            Some(&json!({"serial": c.info.serial})),
        )
        .await?;
        tokio::time::timeout(Duration::from_secs(30), async {
            while revocations.check(&c.info.serial).is_ok() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .context("the follower did not learn of the revocation of c")?;
        stop.cancel();
        follower.await?;
        server.stop().await
    })
    .await
}
