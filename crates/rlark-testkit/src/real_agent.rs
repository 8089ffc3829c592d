//! A server with its controllers and real agents (`rlark_agent::start`), for end-to-end
//! tests of what runs on an agent: Jobs of raw tasks, their pods, their working
//! directories.
//!
//! Every wait is bounded by [`DEADLINE`].
//!
//! The agents run each replica under a supervisor process (`rlark_agent::supervisor`), a
//! binary: a test passes it with [`start_agent_with`] / [`Harness::start_with`]
//! (`env!("CARGO_BIN_EXE_rlark-agent-supervise")` in rlark-agent's tests, `[rlark, supervise]`
//! with `env!("CARGO_BIN_EXE_rlark")` in rlark's); [`start_agent`] and [`Harness::start`]
//! look for it next to the test binary ([`supervisor_near_test_binary`]).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use anyhow::{Context as _, bail};
use kube::ResourceExt as _;
use kube::api::{Api, PostParams};
use rlark_agent::{AgentConfig, JoinParams, RunningAgent};
use rlark_api::types::{Job, Pod, PodPhase, Task};
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::TestServer;
use crate::tunnel_agent::bootstrap_token;

// Upper bound of every wait, and the bounded poll (the one in `crate::wait`).
pub use crate::wait::{DEADLINE, eventually};
/// The cluster of [`Harness`]'s agent.
pub const CLUSTER: &str = "a";
/// The namespace of [`CLUSTER`].
pub const NAMESPACE: &str = "rlark-a";

/// A server on a fresh temporary directory (returned: keep it until the server stops) with
/// its controllers enabled, without leader election.
pub async fn start_server_with_controllers() -> anyhow::Result<(TestServer, TempDir)> {
    start_server_configured(|_| {}).await
}

/// [`start_server_with_controllers`] with the configuration changed by `edit` first.
pub async fn start_server_configured(
    edit: impl FnOnce(&mut rlark_server::ServerConfig),
) -> anyhow::Result<(TestServer, TempDir)> {
    let server_dir = tempfile::tempdir()?;
    let mut config = TestServer::config_for(server_dir.path());
    config.controllers.enabled = true;
    config.controllers.leader_election = false;
    edit(&mut config);
    let server = TestServer::start_with(config).await?;
    Ok((server, server_dir))
}

/// The replica supervisor built with the running test: `target/<profile>/rlark-supervise`
/// (or rlark-agent's `rlark-agent-supervise`), or `target/<profile>/rlark supervise`,
/// whichever was built last (cargo builds the one a
/// test's package provides before running its tests; the other may be stale). Prefer
/// passing it explicitly ([`start_agent_with`]).
pub fn supervisor_near_test_binary() -> anyhow::Result<Vec<OsString>> {
    let exe = std::env::current_exe().context("the test binary's path")?;
    // target/<profile>/deps/<test>-<hash>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .with_context(|| format!("no target directory above {}", exe.display()))?;
    let built = |name: &str| {
        let path = dir.join(name);
        let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok()?;
        Some((modified, path))
    };
    let supervise = built("rlark-supervise")
        .or_else(|| built("rlark-agent-supervise"))
        .map(|(t, p)| (t, vec![p.into_os_string()]));
    let rlark = built("rlark").map(|(t, p)| (t, vec![p.into_os_string(), "supervise".into()]));
    match (supervise, rlark) {
        (Some(a), Some(b)) => Ok(if a.0 >= b.0 { a.1 } else { b.1 }),
        (Some((_, command)), None) | (None, Some((_, command))) => Ok(command),
        (None, None) => bail!(
            "no replica supervisor (rlark-supervise or rlark) in {}: build one, or pass it \
             with start_agent_with",
            dir.display()
        ),
    }
}

/// Start the agent of `cluster` as node `node_name` in `dir`, joined with a fresh token, and
/// wait until its tunnel is up. Its supervisor is [`supervisor_near_test_binary`].
pub async fn start_agent(
    server: &TestServer,
    cluster: &str,
    node_name: &str,
    dir: &Path,
) -> anyhow::Result<RunningAgent> {
    start_agent_with(
        server,
        cluster,
        node_name,
        dir,
        supervisor_near_test_binary()?,
    )
    .await
}

/// [`start_agent`] with `supervisor` as the replica supervisor command.
pub async fn start_agent_with(
    server: &TestServer,
    cluster: &str,
    node_name: &str,
    dir: &Path,
    supervisor: Vec<OsString>,
) -> anyhow::Result<RunningAgent> {
    start_agent_configured(server, cluster, node_name, dir, |config| {
        config.supervisor = supervisor;
    })
    .await
}

/// [`start_agent`] with its configuration changed by `edit` before it starts.
pub async fn start_agent_configured(
    server: &TestServer,
    cluster: &str,
    node_name: &str,
    dir: &Path,
    edit: impl FnOnce(&mut AgentConfig),
) -> anyhow::Result<RunningAgent> {
    let near = supervisor_near_test_binary();
    let token = bootstrap_token(server, cluster).await?;
    let mut config = AgentConfig::new(vec![server.url()], cluster, dir);
    config.node_name = Some(node_name.to_string());
    config.heartbeat_interval = Duration::from_millis(500);
    config.stop_tasks_on_exit = true;
    config.supervisor = near.as_ref().cloned().unwrap_or_default();
    config.join = Some(JoinParams {
        token: token["token"].as_str().unwrap_or_default().to_string(),
        ca_hash: token["caHash"].as_str().unwrap_or_default().to_string(),
    });
    edit(&mut config);
    if config.supervisor.is_empty() {
        // No supervisor given and none built: say why.
        near?;
    }
    let agent = tokio::time::timeout(DEADLINE, rlark_agent::start(config))
        .await
        .context("agent start timed out")??;
    eventually("the agent's tunnel is up", || async {
        Ok((!agent.tunnel_connected().is_empty()).then_some(()))
    })
    .await?;
    Ok(agent)
}

/// Wait until pod `namespace/name` has succeeded.
pub async fn wait_succeeded(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), namespace);
    eventually(&format!("pod {namespace}/{name} Succeeded"), || async {
        Ok(pods
            .get_opt(name)
            .await?
            .filter(|p| p.status.as_ref().and_then(|s| s.phase) == Some(PodPhase::Succeeded))
            .map(|_| ()))
    })
    .await
}

/// A viewer's client: a certificate for role `viewer` (user `vera`), signed through the
/// admin; its kubeconfig is written to `dir`.
pub async fn viewer_client(
    server: &TestServer,
    admin: &kube::Client,
    dir: &Path,
) -> anyhow::Result<kube::Client> {
    let body = json!({"role": "viewer", "name": "vera"});
    signed_client(server, admin, "vera", body, &dir.join("viewer.kubeconfig"))
        .await
        .context("sign a viewer certificate")
}

/// A client with the identity of the agent of `cluster` (user `system:rlark:agent:<cluster>`,
/// group `rlark:agents`), as a hostile agent would use its own certificate: a certificate
/// for role `agent` signed through the admin, no join (so its namespace is not created).
/// Its kubeconfig is written to `dir`.
pub async fn agent_client(
    server: &TestServer,
    admin: &kube::Client,
    cluster: &str,
    dir: &Path,
) -> anyhow::Result<kube::Client> {
    let user = format!("system:rlark:agent:{cluster}");
    let body = json!({"role": "agent", "clusterID": cluster});
    let path = dir.join(format!("agent-{cluster}.kubeconfig"));
    signed_client(server, admin, &user, body, &path)
        .await
        .with_context(|| format!("sign an agent certificate for cluster {cluster}"))
}

/// Make a key for `user`, have the admin sign it through `POST /rlark/v1/certificates` with
/// `request` (role and name; the CSR is added), write the kubeconfig to `path` and return a
/// client from it.
async fn signed_client(
    server: &TestServer,
    admin: &kube::Client,
    user: &str,
    mut request: Value,
    path: &Path,
) -> anyhow::Result<kube::Client> {
    let key_and_csr = rlark_pki::generate_key_and_csr(user)?;
    request["csr"] = Value::String(key_and_csr.csr_pem);
    let post = http::Request::post("/rlark/v1/certificates")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(request.to_string().into_bytes())?;
    let signed: Value = admin.request(post).await?;
    let yaml = rlark_pki::kubeconfig_yaml(
        &server.url(),
        signed["caBundle"].as_str().context("caBundle")?,
        signed["certificate"].as_str().context("certificate")?,
        &key_and_csr.key_pem,
        user,
    );
    std::fs::write(path, yaml)?;
    crate::client_from_kubeconfig(path).await
}

/// `BINARY ARGS --kubeconfig KUBECONFIG` as a child process (without `KUBECONFIG` and
/// `RUST_LOG` from the environment; killed if dropped), bounded by [`DEADLINE`]. For the
/// `rlark` CLI: pass `env!("CARGO_BIN_EXE_rlark")`.
pub async fn run_cli(binary: &str, kubeconfig: &Path, args: &[&str]) -> anyhow::Result<Output> {
    let mut command = tokio::process::Command::new(binary);
    command
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env_remove("KUBECONFIG")
        .env_remove("RUST_LOG")
        .kill_on_drop(true);
    tokio::time::timeout(DEADLINE, command.output())
        .await
        .with_context(|| format!("rlark {args:?} timed out"))?
        .with_context(|| format!("run rlark {args:?}"))
}

/// Output bytes as text (invalid UTF-8 replaced).
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A server with controllers and a real agent of cluster [`CLUSTER`] (node `host-0`).
pub struct Harness {
    /// The server.
    pub server: TestServer,
    _server_dir: TempDir,
    /// An admin client.
    pub admin: kube::Client,
    /// The agent.
    pub agent: RunningAgent,
    /// The agent's data directory.
    pub agent_dir: TempDir,
}

impl Harness {
    /// Start the server, then the agent, and wait until its tunnel is up. The agent's
    /// supervisor is [`supervisor_near_test_binary`].
    pub async fn start() -> anyhow::Result<Harness> {
        Self::start_with(supervisor_near_test_binary()?).await
    }

    /// [`Harness::start`] with `supervisor` as the replica supervisor command.
    pub async fn start_with(supervisor: Vec<OsString>) -> anyhow::Result<Harness> {
        Self::start_configured(supervisor, |_| {}).await
    }

    /// [`Harness::start_with`] with the server's configuration changed by `edit` first.
    pub async fn start_configured(
        supervisor: Vec<OsString>,
        edit: impl FnOnce(&mut rlark_server::ServerConfig),
    ) -> anyhow::Result<Harness> {
        let (server, server_dir) = start_server_configured(edit).await?;
        let admin = server.client().await?;
        let agent_dir = tempfile::tempdir()?;
        let agent =
            start_agent_with(&server, CLUSTER, "host-0", agent_dir.path(), supervisor).await?;
        Ok(Harness {
            server,
            _server_dir: server_dir,
            admin,
            agent,
            agent_dir,
        })
    }

    /// Stop the agent (at most [`DEADLINE`]), then the server.
    pub async fn stop(self) -> anyhow::Result<()> {
        tokio::time::timeout(DEADLINE, self.agent.stop())
            .await
            .context("agent stop timed out")??;
        self.server.stop().await
    }

    /// Create Job `name` with one raw task `main` running `sh -c script`.
    pub async fn create_job(&self, name: &str, script: &str) -> anyhow::Result<()> {
        let job: Job = serde_json::from_value(json!({
            "apiVersion": "rlinf.io/v1alpha1",
            "kind": "Job",
            "metadata": {"name": name},
            "spec": {"tasks": [{
                "name": "main",
                "agentType": "Raw",
                "role": "Actor",
                "raw": {"entrypoint": ["sh", "-c", script]},
            }]},
        }))?;
        Api::<Job>::all(self.admin.clone())
            .create(&PostParams::default(), &job)
            .await?;
        Ok(())
    }

    /// Wait until pod `name` of [`NAMESPACE`] is in `phase`.
    pub async fn wait_pod(&self, name: &str, phase: PodPhase) -> anyhow::Result<Pod> {
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), NAMESPACE);
        eventually(&format!("pod {name} {phase}"), || async {
            Ok(pods
                .get_opt(name)
                .await?
                .filter(|p| p.status.as_ref().and_then(|s| s.phase) == Some(phase)))
        })
        .await
    }

    /// The working directory of replica 0 of `task`.
    pub async fn work_dir(&self, task: &str) -> anyhow::Result<PathBuf> {
        let task = Api::<Task>::namespaced(self.admin.clone(), NAMESPACE)
            .get(task)
            .await?;
        Ok(rlark_agent::tasks::replica_dir(
            &self.agent_dir.path().join("tasks"),
            NAMESPACE,
            &task.name_any(),
            &task.uid().unwrap_or_default(),
            0,
        )
        .join("work"))
    }
}
