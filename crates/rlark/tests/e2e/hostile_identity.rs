//! Issue 38, point 3 ("Identity"): what an agent, a join token or a copied store could
//! pass itself off as, tried against real servers with the real `rlark` binary where the
//! CLI is the user's path. Each test is one finding of the issue and failed before its fix:
//!
//! - `a_forged_node_name_cannot_capture_a_job`, `two_agents_racing_for_one_node_name`:
//!   "Placement by name can be captured" (agent `a` registers Node `node-b`; a Job pinned
//!   to `node-b` by `nodeName` or `kubernetes.io/hostname` went to cluster a);
//! - `an_unbound_token_cannot_join_as_an_existing_cluster`: "A token without
//!   `--cluster-id` joins as any cluster, including an existing one, even after `cert
//!   revoke --cluster-id`";
//! - `a_restored_store_does_not_revive_a_revoked_token`: "Revoked bearer tokens come back
//!   after restoring an older copy of the store";
//! - `a_store_from_another_installation_is_refused`: "a store copied from another
//!   installation starts and its admin token works".
//!
//! Every wait is bounded (`rlark_testkit::real_agent::DEADLINE`, [`COMMAND_DEADLINE`]).

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use rlark_api::labels;
use rlark_api::types::{Job, Node, Task};
use rlark_testkit::TestServer;
use rlark_testkit::real_agent::{agent_client, eventually, start_server_with_controllers};
use serde_json::{Value, json};

/// Longest any one `rlark` command may take.
const COMMAND_DEADLINE: Duration = Duration::from_secs(60);

/// `rlark ARGS...` as a process (no inherited kubeconfig or store).
async fn rlark(args: &[&str]) -> Result<Output> {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_rlark"));
    command
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("RUST_LOG")
        .env_remove("RLARK_STORE")
        .env_remove("RLARK_JOIN_TOKEN")
        .kill_on_drop(true);
    tokio::time::timeout(COMMAND_DEADLINE, command.output())
        .await
        .with_context(|| format!("rlark {args:?} did not finish within {COMMAND_DEADLINE:?}"))?
        .with_context(|| format!("run rlark {args:?}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `rlark ARGS...` that must succeed; its stdout.
async fn ok(args: &[&str]) -> Result<String> {
    let output = rlark(args).await?;
    ensure!(
        output.status.success(),
        "rlark {args:?} failed ({}):\nstdout: {}\nstderr: {}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
    Ok(text(&output.stdout))
}

/// `rlark ARGS...` that must fail; its stderr.
async fn fails(args: &[&str]) -> Result<String> {
    let output = rlark(args).await?;
    ensure!(
        !output.status.success(),
        "rlark {args:?} should have failed; it printed:\n{}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    Ok(text(&output.stderr))
}

fn path(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// A client of the server at `kubeconfig`'s address that authenticates with `token`.
async fn token_client(kubeconfig: &Path, token: &str) -> Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.to_string().into()),
        ..Default::default()
    };
    config.default_retry = false;
    Ok(kube::Client::try_from(config)?)
}

/// The HTTP status of `GET /api/v1/namespaces` with `token`, and the message of a refusal.
async fn namespaces_with(kubeconfig: &Path, token: &str) -> Result<(u16, String)> {
    let client = token_client(kubeconfig, token).await?;
    match Api::<Namespace>::all(client)
        .list(&ListParams::default())
        .await
    {
        Ok(_) => Ok((200, String::new())),
        Err(kube::Error::Api(status)) => Ok((status.code, status.message)),
        Err(other) => Err(other.into()),
    }
}

/// `rlark token create --user USER --role admin -o json`: (id, token).
async fn admin_token(kubeconfig: &Path, user: &str) -> Result<(String, String)> {
    let out = ok(&[
        "token",
        "create",
        "--user",
        user,
        "--role",
        "admin",
        "-o",
        "json",
        "--kubeconfig",
        path(kubeconfig),
    ])
    .await?;
    let json: Value = serde_json::from_str(&out).with_context(|| out.clone())?;
    Ok((
        json["id"].as_str().context("id")?.to_string(),
        json["token"].as_str().context("token")?.to_string(),
    ))
}

/// Copy `from`'s `pki/` into `to` (what docs/operations.md says to do with a restored store).
fn copy_pki(from: &Path, to: &Path) -> Result<()> {
    let (from, to) = (from.join("pki"), to.join("pki"));
    std::fs::create_dir_all(&to)?;
    for entry in std::fs::read_dir(&from)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name()))?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Placement by name

fn node(name: &str, labels: Value) -> Result<Node> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"agentType": "Raw"}
    }))?)
}

/// Report Node `name` Online with `capacity` and a heartbeat in 2099 (what a hostile agent
/// writes so that its Node never looks stale).
async fn report_online(api: &Api<Node>, name: &str, capacity: Value) -> kube::Result<Node> {
    let status = json!({"status": {
        "phase": "Online", "reason": "AgentReady",
        "capacity": capacity, "allocatable": capacity,
        "heartbeatTime": "2099-01-01T00:00:00Z",
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
}

/// The API error of `result`: (code, message); an error when the write succeeded.
fn refusal<T: std::fmt::Debug>(result: kube::Result<T>, what: &str) -> Result<(u16, String)> {
    match result {
        Ok(written) => bail!("{what} was accepted: {written:?}"),
        Err(kube::Error::Api(status)) => Ok((status.code, status.message)),
        Err(other) => Err(other).with_context(|| what.to_string()),
    }
}

/// A Job of one raw replica carrying a secret, placed by `placement` (task spec fields).
fn secret_job(name: &str, placement: Value) -> Result<Job> {
    let mut task = json!({
        "name": "train", "head": true, "agentType": "Raw", "role": "Actor",
        "raw": {"entrypoint": ["true"], "replicas": 1,
                "environment": [{"name": "SECRET", "value": "only-for-b"}],
                "resources": {"requests": {"cpu": "1"}}}
    });
    for (key, value) in placement.as_object().into_iter().flatten() {
        task[key] = value.clone();
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "Job",
        "metadata": {"name": name},
        "spec": {"tasks": [task]}
    }))?)
}

/// The namespace and placement of Job `job`'s Task, once it is placed.
async fn placed(admin: &kube::Client, job: &str) -> Result<(String, String, Vec<String>)> {
    let admin = admin.clone();
    let job = job.to_string();
    let task: Task = eventually(&format!("the Task of Job {job}"), || {
        let (admin, job) = (admin.clone(), job.clone());
        async move {
            Ok(Api::<Task>::all(admin)
                .list(&ListParams::default().labels(&format!("{}={job}", labels::JOB)))
                .await?
                .items
                .into_iter()
                .next())
        }
    })
    .await?;
    let placement = task.spec.placement.clone().context("no placement")?;
    Ok((
        task.namespace().unwrap_or_default(),
        placement.cluster_id,
        placement.nodes,
    ))
}

/// Agent `b` has registered Node `node-b`. Agent `a` cannot register a Node of that name
/// (409 naming cluster b), nor label one of its Nodes `kubernetes.io/hostname: node-b`; a
/// Job pinned to `node-b` by `nodeName` or by the hostname selector goes to cluster b.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_node_name_cannot_capture_a_job() -> Result<()> {
    let (server, _server_dir) = start_server_with_controllers().await?;
    let admin = server.client().await?;
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    for name in ["rlark-a", "rlark-b"] {
        let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        namespaces
            .create(&PostParams::default(), &namespace)
            .await?;
    }
    let dir = tempfile::tempdir()?;
    let agent_a = agent_client(&server, &admin, "a", dir.path()).await?;
    let agent_b = agent_client(&server, &admin, "b", dir.path()).await?;
    let nodes_a: Api<Node> = Api::namespaced(agent_a, "rlark-a");
    let nodes_b: Api<Node> = Api::namespaced(agent_b, "rlark-b");

    nodes_b
        .create(&PostParams::default(), &node("node-b", json!({}))?)
        .await?;
    report_online(&nodes_b, "node-b", json!({"cpu": "2"})).await?;

    // The forgery: a Node of the same name, bigger and never stale.
    let (code, message) = refusal(
        nodes_a
            .create(&PostParams::default(), &node("node-b", json!({}))?)
            .await,
        "Node node-b registered by the agent of cluster a",
    )?;
    ensure!(code == 409, "{code}: {message}");
    ensure!(
        message.contains(r#"cluster "b""#) && message.contains("node-b"),
        "the refusal names neither the name nor its owner: {message}"
    );
    ensure!(
        Api::<Node>::namespaced(admin.clone(), "rlark-a")
            .get_opt("node-b")
            .await?
            .is_none(),
        "the forged Node was stored"
    );
    // Nor by its hostname label.
    let (code, message) = refusal(
        nodes_a
            .create(
                &PostParams::default(),
                &node("a-1", json!({labels::HOSTNAME: "node-b"}))?,
            )
            .await,
        "Node a-1 labelled kubernetes.io/hostname=node-b",
    )?;
    ensure!(code == 403, "{code}: {message}");
    // A's genuine Node, far bigger than b's: the scheduler would prefer it if it could.
    nodes_a
        .create(&PostParams::default(), &node("a-1", json!({}))?)
        .await?;
    report_online(&nodes_a, "a-1", json!({"cpu": "64"})).await?;

    let jobs: Api<Job> = Api::all(admin.clone());
    jobs.create(
        &PostParams::default(),
        &secret_job("pinned", json!({"nodeName": "node-b"}))?,
    )
    .await?;
    jobs.create(
        &PostParams::default(),
        &secret_job(
            "by-hostname",
            json!({"nodeSelector": {labels::HOSTNAME: "node-b"}}),
        )?,
    )
    .await?;
    for job in ["pinned", "by-hostname"] {
        let (namespace, cluster, nodes) = placed(&admin, job).await?;
        ensure!(
            namespace == "rlark-b" && cluster == "b" && nodes == ["node-b"],
            "Job {job} was placed in {namespace} on cluster {cluster:?}, nodes {nodes:?}"
        );
    }
    server.stop().await
}

/// Two agents registering one Node name at the same moment: exactly one gets it, the other
/// is refused naming the winner (the claim is one atomic create in the store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_racing_for_one_node_name() -> Result<()> {
    let (server, _server_dir) = start_server_with_controllers().await?;
    let admin = server.client().await?;
    let dir = tempfile::tempdir()?;
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let mut apis = Vec::new();
    for cluster in ["c1", "c2", "c3", "c4"] {
        let namespace: Namespace =
            serde_json::from_value(json!({"metadata": {"name": format!("rlark-{cluster}")}}))?;
        namespaces
            .create(&PostParams::default(), &namespace)
            .await?;
        let client = agent_client(&server, &admin, cluster, dir.path()).await?;
        apis.push((
            cluster,
            Api::<Node>::namespaced(client, &format!("rlark-{cluster}")),
        ));
    }
    for round in 0..5 {
        let name = format!("shared-{round}");
        let node = node(&name, json!({}))?;
        let results = futures::future::join_all(
            apis.iter()
                .map(|(_, api)| async { api.create(&PostParams::default(), &node).await }),
        )
        .await;
        let winners: Vec<&str> = apis
            .iter()
            .zip(&results)
            .filter(|(_, r)| r.is_ok())
            .map(|((cluster, _), _)| *cluster)
            .collect();
        ensure!(
            winners.len() == 1,
            "round {round}: {winners:?} all registered Node {name}"
        );
        for ((cluster, _), result) in apis.iter().zip(results) {
            if let Err(error) = result {
                let (code, message) = refusal::<Node>(Err(error), cluster)?;
                ensure!(
                    code == 409 && message.contains(&format!("cluster {:?}", winners[0])),
                    "{cluster}: {code}: {message}"
                );
            }
        }
        let stored = Api::<Node>::all(admin.clone())
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|n| n.name_any() == name)
            .count();
        ensure!(stored == 1, "round {round}: {stored} Nodes named {name}");
    }
    server.stop().await
}

// ---------------------------------------------------------------------------------------
// Join tokens

/// `rlark join --cluster-id CLUSTER` with the token of `token_json` into `dir`.
fn join_args(server: &TestServer, token_json: &Value, cluster: &str, dir: &Path) -> Vec<String> {
    vec![
        "join".into(),
        "--server".into(),
        server.url(),
        "--token".into(),
        token_json["token"].as_str().unwrap_or_default().into(),
        "--ca-hash".into(),
        token_json["caHash"].as_str().unwrap_or_default().into(),
        "--cluster-id".into(),
        cluster.into(),
        "--dir".into(),
        path(dir).into(),
    ]
}

async fn token_json(kubeconfig: &Path, extra: &[&str]) -> Result<Value> {
    let mut args = vec!["token", "create", "-o", "json"];
    args.extend_from_slice(extra);
    args.extend(["--kubeconfig", path(kubeconfig)]);
    let out = ok(&args).await?;
    serde_json::from_str(&out).with_context(|| out.clone())
}

/// A join token is always bound to one cluster ID, and joining never takes over a cluster
/// that joined before (revoked or not) unless the admin made the token with `--rejoin`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unbound_token_cannot_join_as_an_existing_cluster() -> Result<()> {
    let server = TestServer::start().await?;
    let kubeconfig = server.kubeconfig_path().to_path_buf();
    let work = tempfile::tempdir()?;

    // No token without a cluster ID, from the CLI or the API.
    let said = fails(&["token", "create", "--kubeconfig", path(&kubeconfig)]).await?;
    ensure!(said.contains("--cluster-id"), "{said}");
    let admin = server.client().await?;
    let request = http::Request::post("/rlark/v1/tokens")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(
            json!({"kind": "bootstrap", "ttlSeconds": 600})
                .to_string()
                .into_bytes(),
        )?;
    match admin.request::<Value>(request).await {
        Ok(answer) => bail!("an unbound join token was made: {answer}"),
        Err(kube::Error::Api(status)) => ensure!(
            status.code == 400 && status.message.contains("clusterID"),
            "{status:?}"
        ),
        Err(other) => return Err(other.into()),
    }

    // Cluster b joins, then is revoked.
    let for_b = token_json(&kubeconfig, &["--cluster-id", "b"]).await?;
    ok(&join_args(&server, &for_b, "b", &work.path().join("b1"))
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>())
    .await?;
    ok(&[
        "cert",
        "revoke",
        "--cluster-id",
        "b",
        "--kubeconfig",
        path(&kubeconfig),
    ])
    .await?;

    // A new token for b does not bring the revoked identity back...
    let again = token_json(&kubeconfig, &["--cluster-id", "b"]).await?;
    let dir = work.path().join("b2");
    let said = fails(
        &join_args(&server, &again, "b", &dir)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    )
    .await?;
    ensure!(
        said.contains(r#"cluster "b" has joined before"#) && said.contains("--rejoin"),
        "{said}"
    );
    ensure!(
        !dir.join(rlark_agent::join::AGENT_PEM).exists(),
        "credentials were written"
    );

    // ...unless the admin made it for that purpose; the token says so, and the audit log.
    let rejoin = token_json(&kubeconfig, &["--cluster-id", "b", "--rejoin"]).await?;
    ensure!(rejoin["rejoin"] == true, "{rejoin}");
    let joined = ok(&join_args(&server, &rejoin, "b", &dir)
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>())
    .await?;
    ensure!(joined.contains(r#"joined as cluster "b""#), "{joined}");
    let audit = std::fs::read_to_string(server.data_dir().join("audit.log"))?;
    ensure!(
        audit
            .lines()
            .any(|l| l.contains("\"join\"") && l.contains("rejoin") && l.contains("allowed")),
        "no audited rejoin in:\n{audit}"
    );
    // A --rejoin token, too, joins only its own cluster.
    let other = token_json(&kubeconfig, &["--cluster-id", "c", "--rejoin"]).await?;
    let said = fails(
        &join_args(&server, &other, "b", &work.path().join("b3"))
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    )
    .await?;
    ensure!(said.contains(r#"not "b""#), "{said}");
    server.stop().await
}

// ---------------------------------------------------------------------------------------
// Stores

/// A token revoked after a backup stays revoked when that backup is restored (with the
/// installation's `pki/`, as the operations guide says).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_store_does_not_revive_a_revoked_token() -> Result<()> {
    let work = tempfile::tempdir()?;
    let (dir_a, dir_b) = (work.path().join("a"), work.path().join("b"));
    let server = TestServer::start_in(&dir_a).await?;
    let kubeconfig = server.kubeconfig_path().to_path_buf();
    let (id, token) = admin_token(&kubeconfig, "tess").await?;
    ensure!(namespaces_with(&kubeconfig, &token).await?.0 == 200);
    server.stop().await?;
    let old = work.path().join("old.jsonl");
    let sqlite_a = format!("sqlite:{}", path(&dir_a));
    rlark(&["backup", path(&old), "--from", &sqlite_a]).await?;
    ensure!(old.exists(), "no backup written");

    let server = TestServer::start_in(&dir_a).await?;
    let kubeconfig = server.kubeconfig_path().to_path_buf();
    ok(&[
        "cert",
        "revoke",
        "--token-id",
        &id,
        "--kubeconfig",
        path(&kubeconfig),
    ])
    .await?;
    let (code, message) = namespaces_with(&kubeconfig, &token).await?;
    ensure!(code == 401, "{code}: {message}");
    server.stop().await?;

    ok(&[
        "restore",
        path(&old),
        "--to",
        &format!("sqlite:{}", path(&dir_b)),
    ])
    .await?;
    copy_pki(&dir_a, &dir_b)?;
    let restored = TestServer::start_in(&dir_b).await?;
    let (code, message) = namespaces_with(restored.kubeconfig_path(), &token).await?;
    ensure!(
        code == 401 && message.contains("revoked"),
        "the revoked token is valid again on the restored store: {code} {message}"
    );
    restored.stop().await
}

/// A store restored under another installation's CA (its `pki/`), or into a data directory
/// without a CA, is refused at start, naming both CA fingerprints; a CA rotation of the
/// installation's own CA is not a foreign store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_another_installation_is_refused() -> Result<()> {
    let work = tempfile::tempdir()?;
    let (dir_x, dir_y) = (work.path().join("x"), work.path().join("y"));
    let x = TestServer::start_in(&dir_x).await?;
    let x_hash = x.ca_cert_hash().to_string();
    let (_, token) = admin_token(x.kubeconfig_path(), "mallory").await?;
    x.stop().await?;
    let y = TestServer::start_in(&dir_y).await?;
    let y_hash = y.ca_cert_hash().to_string();
    y.stop().await?;
    ensure!(x_hash != y_hash);

    let backup = work.path().join("x.jsonl");
    ok(&[
        "backup",
        path(&backup),
        "--from",
        &format!("sqlite:{}", path(&dir_x)),
    ])
    .await?;
    // X's store under Y's CA.
    let foreign = work.path().join("foreign");
    ok(&[
        "restore",
        path(&backup),
        "--to",
        &format!("sqlite:{}", path(&foreign)),
    ])
    .await?;
    copy_pki(&dir_y, &foreign)?;
    match TestServer::start_in(&foreign).await {
        Ok(started) => {
            let (code, _) = namespaces_with(started.kubeconfig_path(), &token).await?;
            started.stop().await?;
            bail!("a store of another installation was served; its admin token answered {code}");
        }
        Err(error) => {
            let error = format!("{error:#}");
            ensure!(
                error.contains(&x_hash) && error.contains(&y_hash),
                "the refusal does not name both CAs: {error}"
            );
            ensure!(error.contains("another installation"), "{error}");
        }
    }
    // X's store in a data directory without a CA (one would be made now).
    let bare = work.path().join("bare");
    ok(&[
        "restore",
        path(&backup),
        "--to",
        &format!("sqlite:{}", path(&bare)),
    ])
    .await?;
    let error = match TestServer::start_in(&bare).await {
        Ok(started) => {
            started.stop().await?;
            bail!("a restored store was served under a CA made for it");
        }
        Err(error) => format!("{error:#}"),
    };
    ensure!(error.contains(&x_hash), "{error}");
    // With X's pki/ it is X again.
    std::fs::remove_dir_all(bare.join("pki"))?;
    copy_pki(&dir_x, &bare)?;
    let again = TestServer::start_in(&bare).await?;
    ensure!(namespaces_with(again.kubeconfig_path(), &token).await?.0 == 200);
    again.stop().await?;

    // A CA rotation keeps the store X's: the new CA is accepted and recorded.
    ok(&["ca", "rotate", "--data-dir", path(&dir_x)]).await?;
    let rotated = TestServer::start_in(&dir_x).await?;
    ensure!(rotated.ca_cert_hash() != x_hash);
    rotated.stop().await?;
    ok(&["ca", "retire", "--data-dir", path(&dir_x)]).await?;
    TestServer::start_in(&dir_x).await?.stop().await
}
