//! The rlark agent (DESIGN §7): one per cluster. It joins the installation (bootstrap token
//! and CA pin, `crate::join`), keeps its certificate renewed, reports its host as a
//! `Node` with heartbeats, runs the Tasks placed on it as processes (`raw` runtime), reports
//! one `Pod` per replica, and keeps its tunnel to every server address.
//!
//! [`run`] is the whole agent until a shutdown token is cancelled (`rlark agent`);
//! [`start`] returns a [`RunningAgent`] handle instead (tests, `rlark up`).
//!
//! What runs, once started:
//! - **identity**: the credentials in `DATA_DIR/identity/` (written by the first join) and
//!   a [`Renewer`] that renews the certificate at 2/3 of its life; each renewal rebuilds the
//!   API client and the tunnel's TLS config, so new requests and connections use it;
//! - **node**: the [`NodeReporter`] (registration, Lease and status heartbeats);
//! - **tunnel**: [`rlark_tunnel::client`] to every server, as node `<node name>`, serving
//!   the local API ([`api`]: replica logs) on the hub's `agent-api` streams;
//! - **tasks**: the Task reconciler ([`tasks::run_tasks`]); each replica runs under its own
//!   supervisor process ([`supervisor`], `rlark supervise`), so replicas outlive an agent
//!   that exits or dies and the next agent adopts them. A `Kubernetes` agent runs
//!   [`kubernetes::member::run`] instead: the Tasks placed on its cluster become workloads of a member
//!   Kubernetes cluster, their Pods mirrored as rlark Pods;
//! - **metrics** (optional): `GET /metrics` on a loopback address
//!   ([`rlark_observe::metrics_endpoint`]).
//!
//! The simulated agent for benchmarks and tests (the same protocol towards the control
//! plane, scripted replicas instead of processes) is the `rlark-sim` crate, which the
//! product does not link.
// The zero-unwrap discipline as a rule: product code turns a failure into an error that
// names what failed, never a panic (tests, built with cfg(test), may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod api;
mod api_body;
pub mod camera_stream;
pub mod config;
pub mod devices;
pub mod discovery;
pub mod exec;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod join;
// `::kube` is the kube-rs crate; `kube` (this module) the Kubernetes runtime's core.
pub mod kubernetes;
pub mod node;
pub mod ports;
pub mod robot_actions;
mod runs;
pub mod runtime;
pub mod supervisor;
mod task_events;
mod task_reports;
pub mod tasks;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use crate::join::{AgentCredentials, JoinError, JoinOptions, Renewer};
use futures::future::BoxFuture;
use kube::config::{KubeConfigOptions, Kubeconfig};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rlark_observe::metrics_endpoint::MetricsListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

pub use config::{AgentConfig, ConfigError, IsolationConfig, JoinParams, NetMode};
pub use node::{NodeDescription, NodeError, NodeReporter};

/// How long [`RunningAgent::stop`] waits for each part other than the task reconciler.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Failures of the agent, named by the failed step.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(
        "not joined: pass --token and --ca-hash once (no agent credentials in {})",
        dir.display()
    )]
    NotJoined { dir: PathBuf },
    #[error("join as cluster {cluster_id} through {server}: {source}")]
    Join {
        cluster_id: String,
        server: String,
        #[source]
        source: JoinError,
    },
    #[error("load the agent credentials: {0}")]
    LoadIdentity(#[source] JoinError),
    #[error(
        "the credentials in {} belong to cluster {found:?}, not {expected:?}: use another \
         data directory, or remove that one to join again",
        dir.display()
    )]
    ClusterMismatch {
        dir: PathBuf,
        found: String,
        expected: String,
    },
    #[error(
        "the agent certificate {serial} expired at {not_after}: join again (pass --token and \
         --ca-hash)"
    )]
    Expired { serial: String, not_after: String },
    #[error("create the data directory {}: {reason}", dir.display())]
    DataDir { dir: PathBuf, reason: String },
    #[error("API client from {}: {reason}", path.display())]
    Client { path: PathBuf, reason: String },
    #[error("TLS config for the tunnel: {0}")]
    Tls(#[source] JoinError),
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error("metrics listener on {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("task reconciler: {0}")]
    Tasks(#[source] tasks::TaskError),
    #[error("pod network: {0}")]
    PodNetwork(String),
    #[error("the Docker engine of this Docker agent: {0}")]
    Docker(String),
    #[error("agent type {0} is not run by this agent (use Raw, Docker or Kubernetes)")]
    UnsupportedAgentType(String),
    #[error("the member cluster of this Kubernetes agent: {0}")]
    Member(#[from] kubernetes::member::MemberError),
    #[error("agent part {part} failed: {reason}")]
    Crashed { part: &'static str, reason: String },
}

/// Run the agent until `shutdown` is cancelled (or a part of it fails for good).
/// Configuration errors are reported before anything touches the network.
pub async fn run(config: AgentConfig, shutdown: CancellationToken) -> Result<(), AgentError> {
    let started = tokio::select! {
        () = shutdown.cancelled() => return Ok(()),
        started = start_with(config, shutdown.child_token()) => started?,
    };
    tracing::info!(
        cluster = %started.cluster_id(),
        node = %started.node_name(),
        "agent running"
    );
    started.wait().await
}

/// Start the agent: validate, join or load the identity, register the Node, then run
/// heartbeats, renewal, tunnel and tasks in the background until [`RunningAgent::stop`].
pub async fn start(config: AgentConfig) -> Result<RunningAgent, AgentError> {
    start_with(config, CancellationToken::new()).await
}

/// A running agent. Dropping it stops it too, without waiting.
pub struct RunningAgent {
    cluster_id: String,
    node: NodeDescription,
    client: kube::Client,
    metrics_addr: Option<SocketAddr>,
    tunnel: watch::Receiver<Vec<String>>,
    shutdown: CancellationToken,
    supervisor: JoinHandle<Result<(), AgentError>>,
    _stop_on_drop: DropGuard,
}

impl std::fmt::Debug for RunningAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningAgent")
            .field("cluster_id", &self.cluster_id)
            .field("node", &self.node.name)
            .field("tunnel_connected", &*self.tunnel.borrow())
            .finish_non_exhaustive()
    }
}

impl RunningAgent {
    /// The cluster ID.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// The name of the Node this agent reports.
    pub fn node_name(&self) -> &str {
        &self.node.name
    }

    /// The Node as reported at start (resources, facts).
    pub fn node(&self) -> &NodeDescription {
        &self.node
    }

    /// The agent's API client (its own identity; follows certificate renewals).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The address of the `/metrics` listener, when one was configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The servers the tunnel is connected to right now.
    pub fn tunnel_connected(&self) -> Vec<String> {
        self.tunnel.borrow().clone()
    }

    /// A receiver of the connected-servers list, to wait for a condition.
    pub fn tunnel_watch(&self) -> watch::Receiver<Vec<String>> {
        self.tunnel.clone()
    }

    /// Stop everything and wait for it (the task reconciler as long as it takes, the other
    /// parts at most [`STOP_TIMEOUT`] each). The error of a part that failed, if any.
    pub async fn stop(self) -> Result<(), AgentError> {
        self.shutdown.cancel();
        self.wait().await
    }

    /// Wait until the agent stops by itself: a part failed for good, or (in [`run`]) the
    /// shutdown token was cancelled.
    pub async fn wait(self) -> Result<(), AgentError> {
        let RunningAgent {
            supervisor,
            _stop_on_drop,
            ..
        } = self;
        match supervisor.await {
            Ok(result) => result,
            Err(e) => Err(AgentError::Crashed {
                part: "supervisor",
                reason: e.to_string(),
            }),
        }
    }
}

async fn start_with(
    mut config: AgentConfig,
    shutdown: CancellationToken,
) -> Result<RunningAgent, AgentError> {
    config.validate()?;
    // Replicas run in their own working directories and their supervisors are given paths
    // under the data directory: a relative one (`rlark up`'s default `.rlark`) would be
    // resolved against the wrong directory.
    config.data_dir = std::path::absolute(&config.data_dir).map_err(|e| AgentError::DataDir {
        dir: config.data_dir.clone(),
        reason: format!("cannot make the path absolute: {e}"),
    })?;
    // kube's client builds its TLS config with the process-wide provider. Err only means
    // one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let node_name = config.resolved_node_name()?;
    rlark_pki::create_private_dir(&config.data_dir).map_err(|e| AgentError::DataDir {
        dir: config.data_dir.clone(),
        reason: e.to_string(),
    })?;

    // A Kubernetes agent checks its member cluster before anything else touches the
    // network (a member API that does not answer stops it here, naming it).
    let member_client = match config.agent_type {
        rlark_api::types::AgentType::Kubernetes => {
            Some(kubernetes::member::connect(&config.member).await?)
        }
        _ => None,
    };

    // Identity.
    let identity_dir = config.identity_dir();
    let credentials = identity(&config).await?;
    tracing::info!(
        cluster = %config.cluster_id,
        serial = %credentials.info.serial,
        "agent identity loaded"
    );
    let renewer = Renewer::new(&identity_dir).map_err(AgentError::LoadIdentity)?;
    let renewals = renewer.subscribe();
    let base_client = kube_client(&identity_dir, &config.servers).await?;
    let (client_tx, client_rx) = watch::channel(base_client);
    let client = kube::Client::new(CurrentClient(client_rx), config.namespace());
    let tls = credentials.client_config().map_err(AgentError::Tls)?;
    let (tls_tx, tls_rx) = watch::channel(tls);

    // Metrics.
    let mut metrics = Metrics::new();
    let member_metrics = kubernetes::member::MemberMetrics::register(&mut metrics.registry);
    let metrics_listener = match config.metrics_listen {
        Some(addr) => Some(
            MetricsListener::bind(addr)
                .await
                .map_err(|source| AgentError::Metrics { addr, source })?,
        ),
        None => None,
    };
    let metrics_addr = metrics_listener.as_ref().map(MetricsListener::local_addr);

    // The runtime: a Docker agent checks its engine before it registers its Node.
    let docker = docker_runtime(&config, &node_name).await?;

    // Pod network (docs/network.md): the router is built before the tunnel, which serves its
    // destination side (relay streams) and carries its relay streams to the hub.
    let pod_net = rlark_net::start::PodNet::start(
        rlark_net::start::PodNetConfig {
            cluster_id: &config.cluster_id,
            net_mode: config.net_mode,
            domain_listen: config.domain_listen,
            domain_advertise: config.domain_advertise.as_deref(),
            servers: &config.servers,
            state_dir: config.data_dir.join("net"),
            cert_pem: &credentials.cert_pem,
            key_pem: &credentials.key_pem,
            ca_pem: &credentials.ca_pem,
        },
        &node_name,
        &mut metrics.registry,
        shutdown.clone(),
    )
    .await
    .map_err(|source| AgentError::PodNetwork(source.to_string()))?;

    // Node.
    let mut description = node::detect(&config, &node_name).await;
    description.network = Some(pod_net.node_network());
    let reporter = NodeReporter::new(
        client.clone(),
        &config.cluster_id,
        description.clone(),
        config.heartbeat_interval,
    )
    .with_counters(metrics.heartbeats.clone());
    let registered = match reporter.register().await {
        Ok(()) => true,
        Err(error) if error.is_permanent() => return Err(error.into()),
        Err(error) => {
            tracing::warn!(%error, "cannot register the node yet; retrying in the background");
            false
        }
    };
    if member_client.is_some() {
        cordon_own_node(&client, &config.namespace(), &node_name).await;
    }

    // Everything else runs in the background from here on.
    let mut parts: Vec<(&'static str, JoinHandle<()>)> = Vec::new();
    parts.push(("renewer", tokio::spawn(renewer.run(shutdown.clone()))));
    parts.push((
        "renewal follower",
        tokio::spawn(follow_renewals(
            renewals,
            identity_dir.clone(),
            config.servers.clone(),
            client_tx,
            tls_tx,
            pod_net.direct_endpoint(),
            shutdown.clone(),
        )),
    ));
    parts.push((
        "node reporter",
        tokio::spawn(reporter.run(config.heartbeat_interval, registered, shutdown.clone())),
    ));
    let device_access = config
        .embodied_socket_dir
        .clone()
        .map(devices::DeviceAccess::new);
    if let Some(access) = &device_access {
        // The robots and cameras of the host's embodied runtime become Node resources,
        // and replicas that request them get them (`devices::allocator`).
        let reporter = devices::DeviceReporter::new(
            kube::Api::namespaced(client.clone(), &config.namespace()),
            &node_name,
            access.clone(),
        );
        parts.push((
            "device reporter",
            tokio::spawn(reporter.run(shutdown.clone())),
        ));
    }
    let mut tunnel_config = rlark_tunnel::client::ClientConfig::new(config.servers.clone(), tls_rx);
    tunnel_config.node = Some(node_name.clone());
    let local_api = api::LocalApi::new(config.tasks_dir(), &node_name, shutdown.clone());
    local_api.set_router(pod_net.router.clone());
    local_api.set_supervisor(config.supervisor.clone());
    if let Some(dir) = &config.embodied_socket_dir {
        // The cameras' live view (`camera_stream`).
        local_api.set_embodied_socket_dir(dir.clone());
    }
    if let Some(docker) = &docker {
        local_api.set_docker(docker.client().clone());
    }
    if let Some(member_client) = &member_client {
        // Logs of the Pods the runtime mirrors come from the member cluster.
        local_api.set_member(kubernetes::member::logs::MemberPods::new(
            client.clone(),
            member_client.client.clone(),
        ));
        // The member's Nodes become this cluster's rlark Nodes: placement sees them.
        let mirror = kubernetes::member::nodes::NodeMirror::new(
            member_client.client.clone(),
            client.clone(),
            kubernetes::member::nodes::MirrorConfig {
                cluster_id: config.cluster_id.clone(),
                category: config.node_category,
                labels: config.labels.clone(),
                heartbeat_interval: config.heartbeat_interval,
                agent_node: Some(node_name.clone()),
                serves_cloneset: member_client.serves_cloneset,
            },
        )
        .with_counters(kubernetes::member::nodes::MirrorCounters::register(
            &mut metrics.registry,
        ));
        parts.push(("node mirror", tokio::spawn(mirror.run(shutdown.clone()))));
    }
    tunnel_config.agent.agent_api = Some(Arc::new(local_api));
    tunnel_config.agent.relay = Some(Arc::new(pod_net.router.inbound()));
    tunnel_config.hub = pod_net.hub.clone();
    let (replicas_tx, replicas_rx) = watch::channel(Vec::new());
    tunnel_config.discovered = Some(replicas_rx);
    parts.push((
        "replica discovery",
        tokio::spawn(discovery::follow_replicas(
            client.clone(),
            replicas_tx,
            discovery::DISCOVERY_INTERVAL,
            shutdown.clone(),
        )),
    ));
    let tunnel = rlark_tunnel::client::spawn(tunnel_config, shutdown.clone());
    let pod_network = pod_net.network.clone();
    for (part, handle) in pod_net.spawn_parts(client.clone(), shutdown.clone()) {
        parts.push((part, handle));
    }
    let tunnel_watch = tunnel.watch();
    parts.push((
        "tunnel",
        tokio::spawn(async move {
            tunnel.join().await;
        }),
    ));
    parts.push((
        "tunnel gauge",
        tokio::spawn(track_tunnel(
            tunnel_watch.clone(),
            metrics.tunnel_connected.clone(),
            shutdown.clone(),
        )),
    ));
    if let Some(listener) = metrics_listener {
        let addr = listener.local_addr();
        tracing::info!(%addr, "agent metrics at http://{addr}/metrics");
        parts.push((
            "metrics",
            tokio::spawn(listener.serve(Arc::new(metrics.registry), shutdown.clone())),
        ));
    }
    // The CA bundle is public (isolated replicas read it as users of their own); agents
    // joined before it was written 0644 have it 0600.
    open_ca_bundle(&identity_dir.join(crate::join::AGENT_CA));
    let context = tasks::TaskContext {
        cluster_id: config.cluster_id.clone(),
        node_name: node_name.clone(),
        data_dir: config.tasks_dir(),
        server_url: config.servers[0].clone(),
        ca_file: identity_dir.join(crate::join::AGENT_CA),
        stop_tasks_on_exit: config.stop_tasks_on_exit,
        supervisor: config.supervisor.clone(),
        network: pod_network,
        docker,
        devices: device_access,
        isolation: tasks::isolation::Isolation::prepare(
            &config.isolation,
            &config.data_dir,
            config.embodied_socket_dir.as_deref(),
        ),
    };
    let tasks = match member_client {
        Some(member_client) => {
            let run = kubernetes::member::MemberRun {
                control: client.clone(),
                member: member_client,
                cluster_id: config.cluster_id.clone(),
                server_url: config.servers[0].clone(),
                ca_file: identity_dir.join(crate::join::AGENT_CA),
                max_creates_per_minute: config.member.max_creates_per_minute,
                tensorboard_image: config.member.tensorboard_image.clone(),
                metrics: member_metrics,
            };
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                kubernetes::member::run(run, shutdown)
                    .await
                    .map_err(AgentError::Member)
            })
        }
        None => {
            let shutdown = shutdown.clone();
            let client_for_tasks = client.clone();
            tokio::spawn(async move {
                tasks::run_tasks(client_for_tasks, context, shutdown)
                    .await
                    .map_err(AgentError::Tasks)
            })
        }
    };
    let supervisor = tokio::spawn(supervise(tasks, parts, shutdown.clone()));

    Ok(RunningAgent {
        cluster_id: config.cluster_id.clone(),
        node: description,
        client,
        metrics_addr,
        tunnel: tunnel_watch,
        _stop_on_drop: shutdown.clone().drop_guard(),
        shutdown,
        supervisor,
    })
}

/// The docker runtime of a `Docker` agent (its engine answered), `None` for a `Raw` one.
async fn docker_runtime(
    config: &AgentConfig,
    node_name: &str,
) -> Result<Option<runtime::docker::DockerRuntime>, AgentError> {
    use rlark_api::types::AgentType;
    match config.agent_type {
        AgentType::Raw | AgentType::Kubernetes => Ok(None),
        AgentType::Docker => {
            let host = config
                .docker_host
                .clone()
                .or_else(|| std::env::var("DOCKER_HOST").ok().filter(|h| !h.is_empty()))
                .unwrap_or_else(|| runtime::docker::DEFAULT_DOCKER_HOST.to_string());
            let client = runtime::docker::DockerClient::new(&host)
                .map_err(|e| AgentError::Docker(e.to_string()))?;
            let version = client
                .version()
                .await
                .map_err(|e| AgentError::Docker(e.to_string()))?;
            tracing::info!(%host, %version, "Docker engine");
            Ok(Some(runtime::docker::DockerRuntime::new(client, node_name)))
        }
    }
}

/// Register the agent's own Node of a Kubernetes agent cordoned (`spec.unschedulable`):
/// it stands for the agent's host, not a member node, so the scheduler places Tasks on the
/// mirrored member Nodes only. One attempt; logged on failure.
async fn cordon_own_node(client: &kube::Client, namespace: &str, node: &str) {
    let api: kube::Api<rlark_api::types::Node> = kube::Api::namespaced(client.clone(), namespace);
    let patch = serde_json::json!({"spec": {"unschedulable": true}});
    if let Err(error) = api
        .patch(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
    {
        tracing::warn!(%error, node, "could not cordon the Kubernetes agent's own node");
    }
}

/// Wait for shutdown (or a failed task reconciler), then for every part.
async fn supervise(
    mut tasks: JoinHandle<Result<(), AgentError>>,
    parts: Vec<(&'static str, JoinHandle<()>)>,
    shutdown: CancellationToken,
) -> Result<(), AgentError> {
    let early = tokio::select! {
        () = shutdown.cancelled() => None,
        result = &mut tasks => Some(result),
    };
    let tasks_result = match early {
        Some(Ok(Ok(()))) if !shutdown.is_cancelled() => {
            tracing::warn!(
                "task reconciler returned before shutdown; the agent keeps reporting its node"
            );
            shutdown.cancelled().await;
            Ok(Ok(()))
        }
        Some(result) => result,
        None => tasks.await,
    };
    // A failed reconciler stops the whole agent.
    shutdown.cancel();
    let result = match tasks_result {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(error),
        Err(e) => Err(AgentError::Crashed {
            part: "task reconciler",
            reason: e.to_string(),
        }),
    };
    for (part, handle) in parts {
        let abort = handle.abort_handle();
        match tokio::time::timeout(STOP_TIMEOUT, handle).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) if e.is_cancelled() => {}
            Ok(Err(e)) => tracing::error!(part, error = %e, "agent part failed"),
            Err(_) => {
                tracing::warn!(part, timeout = ?STOP_TIMEOUT, "agent part did not stop in time; aborted");
                abort.abort();
            }
        }
    }
    tracing::info!("agent stopped");
    result
}

/// The agent's credentials: loaded from `DATA_DIR/identity`, or made by joining with
/// `config.join` (also when the loaded certificate has expired).
async fn identity(config: &AgentConfig) -> Result<AgentCredentials, AgentError> {
    let dir = config.identity_dir();
    if config::is_joined(&config.data_dir) {
        let credentials = AgentCredentials::load(&dir).map_err(AgentError::LoadIdentity)?;
        if credentials.state.cluster_id != config.cluster_id {
            return Err(AgentError::ClusterMismatch {
                dir,
                found: credentials.state.cluster_id,
                expected: config.cluster_id.clone(),
            });
        }
        if credentials.info.not_after > SystemTime::now() {
            if config.join.is_some() {
                tracing::info!(dir = %dir.display(), "already joined; the join token is not used");
            }
            return follow_server(&dir, credentials, &config.servers[0]);
        }
        let Some(join) = &config.join else {
            return Err(AgentError::Expired {
                serial: credentials.info.serial.clone(),
                not_after: chrono::DateTime::<chrono::Utc>::from(credentials.info.not_after)
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            });
        };
        tracing::warn!(serial = %credentials.info.serial, "the agent certificate expired; joining again");
        return join_now(config, join, &dir).await;
    }
    let Some(join) = &config.join else {
        return Err(AgentError::NotJoined { dir });
    };
    join_now(config, join, &dir).await
}

/// Point the saved identity (`agent.json`, `agent.kubeconfig`) at `server` when the agent
/// was joined through another address (the server moved, or `rlark up` got another port):
/// the configured servers are the truth, and renewals go where the API client goes.
fn follow_server(
    dir: &Path,
    mut credentials: AgentCredentials,
    server: &str,
) -> Result<AgentCredentials, AgentError> {
    let server = server.trim_end_matches('/');
    if credentials.state.server == server {
        return Ok(credentials);
    }
    let write_err = |e: rlark_pki::PkiError| AgentError::DataDir {
        dir: dir.to_path_buf(),
        reason: e.to_string(),
    };
    let state = crate::join::AgentState {
        server: server.to_string(),
        cluster_id: credentials.state.cluster_id.clone(),
    };
    let state_json = serde_json::to_string_pretty(&state).map_err(|e| AgentError::DataDir {
        dir: dir.to_path_buf(),
        reason: e.to_string(),
    })?;
    let kubeconfig = rlark_pki::kubeconfig_yaml(
        server,
        &credentials.ca_pem,
        &credentials.cert_pem,
        &credentials.key_pem,
        &credentials.info.common_name,
    );
    rlark_pki::write_private_file(
        &dir.join(crate::join::AGENT_KUBECONFIG),
        kubeconfig.as_bytes(),
    )
    .map_err(write_err)?;
    rlark_pki::write_private_file(&dir.join(crate::join::AGENT_STATE), state_json.as_bytes())
        .map_err(write_err)?;
    tracing::info!(from = %credentials.state.server, to = %server, "the agent identity now points at the configured server");
    credentials.state = state;
    Ok(credentials)
}

async fn join_now(
    config: &AgentConfig,
    join: &JoinParams,
    dir: &Path,
) -> Result<AgentCredentials, AgentError> {
    let server = config.servers[0].clone();
    let options = JoinOptions {
        server: server.clone(),
        token: join.token.clone(),
        ca_hash: join.ca_hash.clone(),
        cluster_id: Some(config.cluster_id.clone()),
        dir: dir.to_path_buf(),
    };
    let credentials = crate::join::join(&options)
        .await
        .map_err(|source| AgentError::Join {
            cluster_id: config.cluster_id.clone(),
            server,
            source,
        })?;
    if credentials.state.cluster_id != config.cluster_id {
        return Err(AgentError::ClusterMismatch {
            dir: dir.to_path_buf(),
            found: credentials.state.cluster_id,
            expected: config.cluster_id.clone(),
        });
    }
    tracing::info!(cluster = %config.cluster_id, serial = %credentials.info.serial, "joined the installation");
    Ok(credentials)
}

/// The agent's API clients: one per configured server, from `DIR/agent.kubeconfig` (the
/// agent identity) with the server's URL.
async fn kube_client(identity_dir: &Path, servers: &[String]) -> Result<Arc<Clients>, AgentError> {
    let path = identity_dir.join(crate::join::AGENT_KUBECONFIG);
    let err = |reason: String| AgentError::Client {
        path: path.clone(),
        reason,
    };
    let kubeconfig = Kubeconfig::read_from(&path).map_err(|e| err(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| err(e.to_string()))?;
    let mut list = vec![kube::Client::try_from(config.clone()).map_err(|e| err(e.to_string()))?];
    let mut urls = vec![config.cluster_url.to_string()];
    for server in servers {
        let Ok(url) = server.parse::<http::Uri>() else {
            continue;
        };
        if urls
            .iter()
            .any(|u| u.trim_end_matches('/') == server.trim_end_matches('/'))
        {
            continue;
        }
        let mut other = config.clone();
        other.cluster_url = url;
        list.push(kube::Client::try_from(other).map_err(|e| err(e.to_string()))?);
        urls.push(server.clone());
    }
    Ok(Arc::new(Clients {
        list,
        urls,
        current: AtomicUsize::new(0),
    }))
}

/// The API clients of the configured servers, and the one in use.
struct Clients {
    list: Vec<kube::Client>,
    urls: Vec<String>,
    current: AtomicUsize,
}

/// A `kube::Client` service that sends each request through the latest clients (rebuilt
/// after each certificate renewal), so one `kube::Client` handed out at start never goes
/// stale, and through the server in use: when a request fails before any answer (the server
/// is down or unreachable), the next configured server is used from the next request on.
/// The failed request is not sent again here (its body is gone); every caller retries.
#[derive(Clone)]
struct CurrentClient(watch::Receiver<Arc<Clients>>);

impl tower::Service<http::Request<kube::client::Body>> for CurrentClient {
    type Response = http::Response<kube::client::Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let clients = Arc::clone(&self.0.borrow());
        let index = clients.current.load(AtomicOrdering::Acquire) % clients.list.len();
        let client = clients.list[index].clone();
        Box::pin(async move {
            let result = client.send(request).await;
            if let Err(error) = &result
                && clients.list.len() > 1
            {
                let next = (index + 1) % clients.list.len();
                if clients
                    .current
                    .compare_exchange(index, next, AtomicOrdering::AcqRel, AtomicOrdering::Acquire)
                    .is_ok()
                {
                    tracing::warn!(
                        from = %clients.urls[index],
                        to = %clients.urls[next],
                        %error,
                        "API request failed; using the next server"
                    );
                }
            }
            result
        })
    }
}

/// After each renewal: a new API client and a new TLS config for the tunnel.
async fn follow_renewals(
    mut renewals: watch::Receiver<Arc<AgentCredentials>>,
    identity_dir: PathBuf,
    servers: Vec<String>,
    client: watch::Sender<Arc<Clients>>,
    tls: watch::Sender<Arc<rustls::ClientConfig>>,
    direct: Option<rlark_net::direct::DirectEndpoint>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = renewals.changed() => if changed.is_err() { return },
        }
        let credentials = renewals.borrow_and_update().clone();
        match credentials.client_config() {
            Ok(config) => {
                tls.send_replace(config);
            }
            Err(error) => tracing::error!(%error, "renewed credentials: TLS config"),
        }
        if let Some(direct) = &direct {
            match rlark_net::direct::DirectTls::new(
                &credentials.cert_pem,
                &credentials.key_pem,
                &credentials.ca_pem,
            ) {
                Ok(config) => direct.update(config),
                Err(error) => tracing::error!(%error, "renewed credentials: direct path TLS"),
            }
        }
        match kube_client(&identity_dir, &servers).await {
            Ok(new) => {
                client.send_replace(new);
            }
            Err(error) => tracing::error!(%error, "renewed credentials: API client"),
        }
        tracing::info!(serial = %credentials.info.serial, "using the renewed certificate");
    }
}

/// The agent's Prometheus metrics.
struct Metrics {
    registry: Registry,
    heartbeats: node::HeartbeatCounters,
    tunnel_connected: Gauge,
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("rlark_agent");
        let heartbeats = node::HeartbeatCounters::default();
        let tunnel_connected = Gauge::default();
        registry.register(
            "heartbeats",
            "Node heartbeats written (Lease and status)",
            heartbeats.beats.clone(),
        );
        registry.register(
            "heartbeat_failures",
            "Node heartbeats or registrations that failed",
            heartbeats.failures.clone(),
        );
        registry.register(
            "tunnel_connected",
            "Servers the tunnel is connected to",
            tunnel_connected.clone(),
        );
        Metrics {
            registry,
            heartbeats,
            tunnel_connected,
        }
    }
}

async fn track_tunnel(
    mut connected: watch::Receiver<Vec<String>>,
    gauge: Gauge,
    shutdown: CancellationToken,
) {
    loop {
        let n = connected.borrow_and_update().len();
        gauge.set(i64::try_from(n).unwrap_or(i64::MAX));
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = connected.changed() => if changed.is_err() { return },
        }
    }
}

/// Make the CA bundle at `path` readable by every user (0644) when it is not.
fn open_ca_bundle(path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let Ok(meta) = std::fs::metadata(path) else {
        return;
    };
    if meta.permissions().mode() & 0o044 != 0o044
        && let Err(error) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
    {
        tracing::warn!(path = %path.display(), %error, "cannot make the CA bundle readable for isolated replicas");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlark_observe::metrics_endpoint;

    #[test]
    fn metrics_are_served_in_prometheus_text() {
        let metrics = Metrics::new();
        metrics.heartbeats.beats.inc();
        metrics.tunnel_connected.set(2);
        let response = metrics_endpoint::response("/metrics", &metrics.registry);
        assert_eq!(response.status(), http::StatusCode::OK);
        let body = format!("{:?}", response.body());
        assert!(body.contains("rlark_agent_heartbeats_total 1"), "{body}");
        assert!(
            body.contains("rlark_agent_heartbeat_failures_total 0"),
            "{body}"
        );
        assert!(body.contains("rlark_agent_tunnel_connected 2"), "{body}");
        assert_eq!(
            metrics_endpoint::response("/", &metrics.registry).status(),
            http::StatusCode::NOT_FOUND
        );
    }

    #[tokio::test]
    async fn a_bad_config_is_refused_before_any_network_use() {
        let dir = std::env::temp_dir().join(format!("rlark-agent-bad-{}", std::process::id()));
        let config = AgentConfig::new(vec!["http://x".into()], "Bad_ID", &dir);
        let err = start(config).await.expect_err("refused");
        let AgentError::Config(config_err) = &err else {
            panic!("not a config error: {err}");
        };
        assert_eq!(config_err.fields(), ["server URL", "cluster ID"]);
        assert!(!dir.exists(), "nothing written");
    }

    #[tokio::test]
    async fn an_agent_that_never_joined_says_how_to_join() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = AgentConfig::new(vec!["https://127.0.0.1:1".into()], "c1", dir.path());
        config.node_name = Some("n1".into());
        let err = start(config).await.expect_err("not joined");
        assert!(matches!(err, AgentError::NotJoined { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with("not joined: pass --token and --ca-hash once"),
            "{err}"
        );
    }
}
