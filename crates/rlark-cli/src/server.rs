//! `rlark server`, `rlark up` and `rlark kubeconfig`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use clap::Args;
use rlark_api::types::NodeCategory;
use rlark_server::{ServerConfig, ServerConfigFile, ServerOverrides};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use super::demo::{DemoNetwork, DemoOptions};
use super::security::{self, SecurityClient, UserRole, parse_seconds};
use super::{ClientArgs, DEFAULT_DATA_DIR};

#[derive(Debug, Args)]
pub(crate) struct ServerArgs {
    /// Data directory (CA, database, admin kubeconfig). Required unless the config file sets dataDir.
    #[arg(long, value_name = "DIR", env = "RLARK_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// HTTPS listen address [default: 127.0.0.1:8443]. Port 0 picks a free port.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Extra DNS name or IP address for the serving certificate. Repeatable; replaces the
    /// config file's tlsSans.
    #[arg(long = "tls-san", value_name = "NAME")]
    tls_sans: Vec<String>,
    /// The https:// URL the other server replicas reach this one at, when agents reach all
    /// replicas through one load-balanced URL (tunnel.advertiseURL) [default: the advertise
    /// URL]. Replaces the config file's tunnel.peerURL.
    #[arg(long, value_name = "URL", env = "RLARK_PEER_URL")]
    peer_url: Option<String>,
    /// YAML config file (fields: dataDir, listen, sshListen, proxyListen, proxyURL, tlsSans, shutdownGraceSeconds, api,
    /// controllers, security, tunnel, connections, auditLog, reinitializeStore, store). Flags override
    /// its values.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Run the Job, Workflow, Task and Node controllers in this process (default true,
    /// under leader election). `--controllers=false` when `rlark controller-manager` runs
    /// them instead.
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    pub(crate) controllers: Option<bool>,
    /// Open client connections, all sources together, beyond which only the reserve is
    /// left [default: from the file-descriptor limit].
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
    /// Open client connections from one source IP address beyond which only the reserve
    /// is left [default: 512].
    #[arg(long = "max-connections-per-ip", value_name = "N")]
    max_connections_per_ip: Option<usize>,
    /// Connections kept beyond the caps for admin (system:masters) clients and health
    /// probes [default: 32].
    #[arg(long, value_name = "N")]
    reserved_connections: Option<usize>,
    /// A connection's first request, and every HTTP/1.1 request head, must arrive within
    /// this time (`30`, `1m`, plain seconds) [default: 30].
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds)]
    header_read_timeout: Option<u64>,
    /// A connection without a request in flight for this long is closed [default: 90].
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds)]
    idle_timeout: Option<u64>,
    /// Most Nodes an agent may register in its namespace [default: 64]; overrides the
    /// config file's api.maxNodesPerAgent.
    #[arg(long, value_name = "N")]
    max_nodes_per_agent: Option<usize>,
    /// Delete core Events this long after their last write (`1h`, `30m`, plain seconds)
    /// [default: 1h, as kube-apiserver's --event-ttl]. Overrides api.limits.eventTTLSeconds.
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds)]
    event_ttl: Option<u64>,
    /// Serve SSH on this address (`ssh TASK@HOST -p PORT`, docs/ssh.md); off when not given.
    #[arg(long, value_name = "ADDR")]
    ssh_listen: Option<SocketAddr>,
    /// Serve the task HTTP proxy to browsers on this address, an origin of its own so task
    /// apps cannot act as the console's user (docs/ssh.md); off when not given (browsers
    /// then cannot open task apps). Overrides the config file's proxyListen.
    #[arg(long, value_name = "ADDR")]
    proxy_listen: Option<SocketAddr>,
    /// The https:// URL browsers reach --proxy-listen at, best a DNS name of its own
    /// [default: from the listen address]. Overrides the config file's proxyURL.
    #[arg(long, value_name = "URL")]
    proxy_url: Option<String>,
    #[command(flatten)]
    store: StoreArgs,
}

#[derive(Debug, Args)]
struct StoreArgs {
    /// Start although the data directory has a CA (a server ran here before) and rlark.db is
    /// missing or empty; without it such a start is refused, since it would silently begin
    /// with no objects and tokens. The store starts empty; revocations are restored from
    /// pki/revocations.json. For a database lost for good, or the first start of a new
    /// replica given a copy of pki/. No effect on a store that holds data.
    #[arg(long)]
    reinitialize_store: bool,
    /// Store: a postgres://user:password@host:port/database URL to keep the objects in
    /// PostgreSQL (several replicas may share one database). Default: SQLite in the data directory
    /// (DATA_DIR/rlark.db). Overrides the config file's store.url.
    #[arg(long = "store", value_name = "URL", env = "RLARK_STORE")]
    store_url: Option<String>,
    /// A file holding a secret (at least 32 bytes) that seals the CA keys kept in the store.
    /// With it, the installation's CA and SSH CA are stored (keys sealed) and replicas sharing
    /// the store take them from there; give every replica the same file. Overrides the config
    /// file's store.caSecretFile. The secret itself may come in RLARK_CA_SECRET instead.
    #[arg(
        long = "ca-secret-file",
        value_name = "FILE",
        env = "RLARK_CA_SECRET_FILE"
    )]
    ca_secret_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct UpArgs {
    /// Data directory: store, CA, admin.kubeconfig, and examples/ (the built-in example
    /// manifests, rewritten at every start; the banner prints their absolute path).
    #[arg(long, value_name = "DIR", env = "RLARK_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// HTTPS listen address; must be a loopback address (use `rlark server` otherwise).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8443")]
    listen: SocketAddr,
    /// SSH listen address (docs/ssh.md); must be a loopback address. Port 0 (the default)
    /// picks a free port, printed in the banner and by `rlark ssh-config`.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    ssh_listen: SocketAddr,
    /// Task proxy listen address, the origin browsers open task apps on (docs/ssh.md); must
    /// be a loopback address. Port 0 (the default) picks a free port; the banner prints its
    /// URL, on `localhost` (the console is at 127.0.0.1: two sites).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    proxy_listen: SocketAddr,
    /// Once up, run the demo (`examples/demo/`, built in): an embodied RL loop, a learner on
    /// `cloud` and two rollout replicas on `edge` driving simulated arms; follow it and print
    /// a summary and the reward curve. The tasks need Python 3.10+ with numpy, grpcio and
    /// protobuf: `python3` when it has them, else an environment of the demo's own that
    /// `up` makes under the data directory with pip, once (see --demo-python).
    #[arg(long)]
    demo: bool,
    /// With --demo: how the rollouts reach the learner: `domain` (the Domain network, needs
    /// root), `host` (the host's loopback), or `auto` (the Domain where both clusters have a
    /// pod network).
    #[arg(
        long,
        value_enum,
        value_name = "MODE",
        default_value = "auto",
        requires = "demo"
    )]
    demo_network: DemoNetwork,
    /// With --demo: the Python interpreter of the demo's tasks (a path, or a name on PATH),
    /// which must have numpy, grpcio and protobuf. Default: `python3` when it has them,
    /// else DATA_DIR/demo/venv, made and filled with pip on first use.
    #[arg(long, value_name = "PYTHON", requires = "demo")]
    demo_python: Option<PathBuf>,
    /// With --demo: the name of the demo's Workflow (its Job is NAME-train, the learner
    /// NAME-train-learner). A run replaces the earlier run of its name only: runs of
    /// different names stay, to compare (`rlark reports --compare job/demo-train
    /// job/NAME-train`).
    #[arg(long, value_name = "NAME", default_value = super::demo::WORKFLOW,
          value_parser = parse_demo_name, requires = "demo")]
    demo_name: String,
    /// With --demo: stop once the demo Workflow ended; exit 0 when it succeeded.
    #[arg(long, requires = "demo")]
    once: bool,
    /// With --demo: how long the demo Workflow may take (`90`, `5m`, plain seconds).
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, default_value = "120",
          requires = "demo")]
    demo_timeout: u64,
    /// Leave the tasks running when `rlark up` exits, for the next `rlark up` on this data
    /// directory to adopt. Without it `up` is a session: its tasks stop when it does.
    #[arg(long)]
    keep_tasks: bool,
    #[command(flatten)]
    store: StoreArgs,
}

#[derive(Debug, Args)]
pub(crate) struct KubeconfigArgs {
    /// Data directory of the server.
    #[arg(long, value_name = "DIR", env = "RLARK_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// Print the admin kubeconfig's path instead of its content.
    #[arg(long, conflicts_with_all = ["user", "output"])]
    path: bool,
    /// Make a kubeconfig for this user instead: a key is generated here and the server signs
    /// a certificate for it (needs admin credentials, see --kubeconfig).
    #[arg(long, value_name = "NAME")]
    user: Option<String>,
    /// Role of the user's certificate (with --user) [default: viewer].
    #[arg(long, value_enum, requires = "user")]
    role: Option<UserRole>,
    /// Validity of the user's certificate: `1h`, `30d`, `365d` or plain seconds (with
    /// --user) [default: the server's].
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, requires = "user")]
    validity: Option<u64>,
    /// Write the kubeconfig to FILE (mode 0600) instead of stdout.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
}

pub(crate) async fn server(args: ServerArgs) -> anyhow::Result<()> {
    let file = args
        .config
        .as_deref()
        .map(ServerConfigFile::load)
        .transpose()?;
    let config = ServerConfig::resolve(
        file,
        ServerOverrides {
            data_dir: args.data_dir,
            listen: args.listen,
            tls_sans: args.tls_sans,
            controllers: args.controllers,
            reinitialize_store: args.store.reinitialize_store,
            store_url: args.store.store_url,
            ca_secret_file: args.store.ca_secret_file,
            ca_secret: std::env::var("RLARK_CA_SECRET").ok(),
            max_connections: args.max_connections,
            max_connections_per_ip: args.max_connections_per_ip,
            reserved_connections: args.reserved_connections,
            header_read_timeout: args.header_read_timeout.map(std::time::Duration::from_secs),
            idle_timeout: args.idle_timeout.map(std::time::Duration::from_secs),
            peer_url: args.peer_url,
            max_nodes_per_agent: args.max_nodes_per_agent,
            event_ttl: args.event_ttl.map(std::time::Duration::from_secs),
            ssh_listen: args.ssh_listen,
            proxy_listen: args.proxy_listen,
            proxy_url: args.proxy_url,
        },
    )?;
    let shutdown = CancellationToken::new();
    watch_signals(shutdown.clone())?;
    rlark_server::run(config, shutdown).await?;
    Ok(())
}

pub(crate) async fn up(args: UpArgs) -> anyhow::Result<()> {
    if !args.listen.ip().is_loopback() {
        bail!(
            "rlark up listens on loopback only, not {}: use `rlark server --listen {}`",
            args.listen,
            args.listen
        );
    }
    // The demo's tasks need a Python with its packages: refuse before anything starts.
    let demo = if args.demo {
        Some(DemoOptions {
            timeout: std::time::Duration::from_secs(args.demo_timeout),
            network: args.demo_network,
            python: super::demo_python::resolve(args.demo_python.as_deref(), &args.data_dir)?,
            name: args.demo_name.clone(),
        })
    } else {
        None
    };
    if !args.ssh_listen.ip().is_loopback() {
        bail!(
            "rlark up serves SSH on loopback only, not {}: use `rlark server --ssh-listen {}`",
            args.ssh_listen,
            args.ssh_listen
        );
    }
    if !args.proxy_listen.ip().is_loopback() {
        bail!(
            "rlark up serves the task proxy on loopback only, not {}: use `rlark server --proxy-listen {}`",
            args.proxy_listen,
            args.proxy_listen
        );
    }
    let mut config = ServerConfig::new(&args.data_dir);
    config.listen = args.listen;
    config.ssh_listen = Some(args.ssh_listen);
    config.proxy_listen = Some(args.proxy_listen);
    config.controllers.enabled = true;
    config.reinitialize_store = args.store.reinitialize_store;
    config.store_url = args.store.store_url;
    config.ca_secret_file = args.store.ca_secret_file;
    config.ca_secret = std::env::var("RLARK_CA_SECRET")
        .ok()
        .map(rlark_server::SecretText);
    let shutdown = CancellationToken::new();
    watch_signals(shutdown.clone())?;
    // A start that fails leaves no data directory behind that it created itself.
    let created = !args.data_dir.exists();
    let remove_created = || {
        if created && let Err(e) = std::fs::remove_dir_all(&args.data_dir) {
            tracing::warn!(dir = %args.data_dir.display(), error = %e, "remove the data directory of a failed start");
        }
    };
    let server = match rlark_server::start(config).await {
        Ok(server) => server,
        Err(error) => {
            // A refusal because another rlark holds the directory leaves it to that one.
            if !matches!(error, rlark_server::ServerError::DataDir(_)) {
                remove_created();
            }
            return Err(up_start_error(error, args.listen));
        }
    };
    // What runs beside the server; on a failure, whatever of it started is stopped, then
    // the server, once.
    let started = async {
        let examples = super::example_files::write(&args.data_dir)?;
        let embodied = UpEmbodied::start(&args.data_dir).await?;
        match start_up_agents(
            &server,
            &args.data_dir,
            args.keep_tasks,
            &embodied.socket_dir,
        )
        .await
        {
            Ok(agents) => Ok((examples, embodied, agents)),
            Err(error) => {
                embodied.stop().await;
                Err(error)
            }
        }
    }
    .await;
    let (examples, embodied, agents) = match started {
        Ok(started) => started,
        Err(error) => {
            if let Err(e) = server.shutdown().await {
                tracing::warn!(error = %e, "server shutdown after a failed start");
            }
            remove_created();
            return Err(error);
        }
    };
    let kubeconfig = std::path::absolute(&server.kubeconfig_path)
        .unwrap_or_else(|_| server.kubeconfig_path.clone());
    let agent_list = agents
        .iter()
        .map(|a| format!("{} (node {})", a.cluster_id(), a.node_name()))
        .collect::<Vec<_>>()
        .join(", ");
    // Printed as the banner's "log in once with ..." line.
    let login_link = match server.console_login_link().await {
        Ok(link) => link,
        Err(error) => {
            tracing::warn!(%error, "no console login link");
            format!("a token (rlark token create --user NAME --role admin): no link ({error})")
        }
    };
    println!(
        "rlark is running at {url} (data in {data})\n\n\
         Web console:        {url}/\n\
         \x20                   log in once with {login_link}\n\
         \x20                   (valid 15 minutes; the server's certificate is signed by the installation CA)\n\
         Task apps:          {proxy}/ (their own origin; opened from a task's page in the console)\n\n\
         Use it with kubectl or rlark:\n\n\
         \x20 export KUBECONFIG={kubeconfig}\n\
         \x20 kubectl get jobs -A\n\
         \x20 rlark apply -f {examples}{sep}\n\
         \x20 rlark get jobs,tasks\n\
         \x20 rlark get tasks -w\n\n\
         Examples:           {examples}{sep} (a Domain, Jobs, a Workflow; Job counter runs until stopped)\n\
         Local agents:       {agent_list}   (rlark get nodes -A)\n\
         Devices on {devices_cluster}:    {devices}   (rlark robot --socket-dir {socket_dir} list)\n\
         Read-only user:     rlark kubeconfig --user NAME --role viewer -o NAME.kubeconfig\n\
         SSH into tasks:     {ssh}\n\
         Tasks:              {tasks}\n",
        ssh = server
            .ssh
            .as_ref()
            .map(|s| format!(
                "ssh -p {} TASK@127.0.0.1 (host key {}; rlark ssh-config)",
                s.addr.port(),
                s.host_key_fingerprint
            ))
            .unwrap_or_else(|| "off".to_string()),
        url = server.url(),
        proxy = server.proxy_url().unwrap_or_else(|| "off".to_string()),
        login_link = login_link,
        data = args.data_dir.display(),
        kubeconfig = kubeconfig.display(),
        examples = examples.display(),
        sep = std::path::MAIN_SEPARATOR,
        devices_cluster = UP_DEVICES_CLUSTER,
        devices = embodied.describe(),
        socket_dir = embodied.socket_dir.display(),
        tasks = if args.keep_tasks {
            "keep running when rlark up exits (--keep-tasks); the next rlark up adopts them"
        } else {
            "stop when rlark up exits (--keep-tasks leaves them running)"
        },
    );
    if let Some(demo) = &demo {
        println!("Running the demo workflow (examples/demo/):\n");
        let result =
            super::demo::run(&server.kubeconfig_path, &args.data_dir, demo, &shutdown).await;
        if args.once {
            stop_agents(agents).await;
            embodied.stop().await;
            server.shutdown().await?;
            return result;
        }
        if let Err(error) = result {
            eprintln!("demo: {}", super::client::error_chain(&error));
        }
        println!();
    }
    println!("Press Ctrl-C to stop.");
    shutdown.cancelled().await;
    stop_agents(agents).await;
    embodied.stop().await;
    server.shutdown().await?;
    Ok(())
}

/// The embodied runtime `rlark up` runs for its edge agent: simulated arms and cameras
/// (`examples/demo/embodied.yaml`, built in), served in this process.
const UP_EMBODIED_CONFIG: &str = include_str!("../../../examples/demo/embodied.yaml");
/// The local cluster whose agent offers those devices.
const UP_DEVICES_CLUSTER: &str = "edge";

/// Longest socket path a `sockaddr_un` holds, less its terminating NUL.
const MAX_SOCKET_PATH: usize = 107;
/// The longest socket name of the runtime.
const LONGEST_SOCKET: &str = "camera-ctrl.sock";

/// Longest `--demo-name`: its Tasks are `NAME-train-learner` and `NAME-train-rollout`, and
/// a replica's Pod `...-N` must stay a DNS-1123 label (63 characters).
const MAX_DEMO_NAME: usize = 40;

/// `--demo-name`: a DNS-1123 label of at most [`MAX_DEMO_NAME`] characters.
fn parse_demo_name(value: &str) -> Result<String, String> {
    rlark_api::names::dns1123_label(value)?;
    if value.len() > MAX_DEMO_NAME {
        return Err(format!(
            "at most {MAX_DEMO_NAME} characters (the demo's tasks are NAME-train-learner and \
             NAME-train-rollout)"
        ));
    }
    Ok(value.to_string())
}

/// `DATA_DIR/embodied`, absolute; when its socket paths would not fit a unix socket
/// address (a deep data directory), `TMPDIR/rlark-embodied-<hash of that path>` instead,
/// created 0700 (an existing one must be ours and private).
fn up_socket_dir(data_dir: &Path) -> anyhow::Result<PathBuf> {
    use std::hash::{Hash as _, Hasher as _};
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
    let dir =
        std::path::absolute(data_dir.join("embodied")).context("resolve the data directory")?;
    if dir.join(LONGEST_SOCKET).as_os_str().len() <= MAX_SOCKET_PATH {
        return Ok(dir);
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    dir.hash(&mut hasher);
    let short = std::env::temp_dir().join(format!("rlark-embodied-{:016x}", hasher.finish()));
    match std::fs::DirBuilder::new().mode(0o700).create(&short) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("create {}", short.display())),
    }
    let owner = std::fs::metadata(data_dir)
        .with_context(|| format!("read {}", data_dir.display()))?
        .uid();
    let meta =
        std::fs::symlink_metadata(&short).with_context(|| format!("read {}", short.display()))?;
    if !meta.is_dir() || meta.uid() != owner || meta.mode() & 0o077 != 0 {
        bail!(
            "{} (the embodied sockets' directory: {} is too long for a unix socket path) \
             exists but is not a private directory of this user; remove it",
            short.display(),
            dir.display()
        );
    }
    Ok(short)
}

/// The running embodied runtime of `rlark up`.
struct UpEmbodied {
    running: rlark_embodied::Running,
    /// `DATA_DIR/embodied`, absolute: the sockets the edge agent and its replicas use.
    socket_dir: PathBuf,
    stop: CancellationToken,
}

impl UpEmbodied {
    async fn start(data_dir: &Path) -> anyhow::Result<Self> {
        let config = rlark_embodied::EmbodiedConfig::from_yaml(UP_EMBODIED_CONFIG)
            .context("the built-in embodied configuration (examples/demo/embodied.yaml)")?;
        let socket_dir = up_socket_dir(data_dir)?;
        let stop = CancellationToken::new();
        let running = rlark_embodied::serve(config, &socket_dir, stop.clone())
            .await
            .with_context(|| {
                format!(
                    "start the local embodied runtime in {}",
                    socket_dir.display()
                )
            })?;
        Ok(Self {
            running,
            socket_dir,
            stop,
        })
    }

    /// The devices, as the banner lists them.
    fn describe(&self) -> String {
        let robots = self.running.robots().robot_ids();
        let cameras: Vec<String> = self
            .running
            .cameras()
            .list()
            .into_iter()
            .map(|c| c.camera_id)
            .collect();
        format!(
            "simulated arms {}, cameras {}",
            robots.join(", "),
            cameras.join(", ")
        )
    }

    /// Stop every robot, close every camera, remove the sockets.
    async fn stop(self) {
        self.stop.cancel();
        if let Err(error) = self.running.wait().await {
            tracing::warn!(%error, "the local embodied runtime stopped with an error");
        }
    }
}

/// The agents `rlark up` runs in-process: cluster ID (also the node-name suffix) and node
/// category.
const UP_AGENTS: [(&str, NodeCategory); 2] =
    [("cloud", NodeCategory::Cloud), ("edge", NodeCategory::Edge)];

/// Start the [`UP_AGENTS`], each with its data directory `DATA_DIR/agents/<id>` and node
/// `<host>-<id>` (they share this host). An agent that has not joined yet gets a bootstrap
/// token minted as the admin; a restarted `rlark up` reuses their identities.
async fn start_up_agents(
    server: &rlark_server::RunningServer,
    data_dir: &Path,
    keep_tasks: bool,
    embodied_socket_dir: &Path,
) -> anyhow::Result<Vec<rlark_agent::RunningAgent>> {
    let host = up_node_prefix();
    let mut admin: Option<SecurityClient> = None;
    let mut agents = Vec::new();
    for (id, category) in UP_AGENTS {
        let dir = data_dir.join("agents").join(id);
        let mut config = rlark_agent::AgentConfig::new(vec![server.url()], id, &dir);
        config.node_name = Some(format!("{host}-{id}"));
        config.node_category = category;
        config.stop_tasks_on_exit = !keep_tasks;
        if id == UP_DEVICES_CLUSTER {
            config.embodied_socket_dir = Some(embodied_socket_dir.to_path_buf());
        }
        // Replicas see nothing of the platform's data directory (the server's PKI and
        // store, every agent's identity and replicas) but their own directory, and the
        // examples, the demo's programs and the demo's Python environment, read-only.
        let data = std::path::absolute(data_dir).context("resolve the data directory")?;
        config.isolation.hide.push(data.clone());
        config.isolation.expose.extend([
            data.join(super::example_files::DIR),
            data.join(super::demo::PYTHON_DIR),
            data.join(super::demo_python::VENV_DIR),
        ]);
        let started = async {
            if !rlark_agent::config::is_joined(&dir) {
                let api = match &mut admin {
                    Some(api) => api,
                    slot @ None => slot.insert(
                        SecurityClient::connect(
                            &ClientArgs {
                                kubeconfig: Some(server.kubeconfig_path.clone()),
                                ..ClientArgs::default()
                            },
                            &server.kubeconfig_path,
                        )
                        .await?,
                    ),
                };
                // `up` owns its local clusters: an agent directory lost while the server's
                // store kept the cluster joins it again (`--rejoin`).
                let body = serde_json::json!({
                    "kind": "bootstrap",
                    "clusterID": id,
                    "ttlSeconds": 600,
                    "rejoin": true,
                });
                let response = api.post("/rlark/v1/tokens", &body).await?;
                let text = |name: &str| {
                    response[name]
                        .as_str()
                        .map(str::to_string)
                        .with_context(|| {
                            format!("the server's token response has no {name}: {response}")
                        })
                };
                config.join = Some(rlark_agent::JoinParams {
                    token: text("token")?,
                    ca_hash: text("caHash")?,
                });
            }
            rlark_agent::start(config)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))
        }
        .await;
        match started {
            Ok(agent) => agents.push(agent),
            Err(error) => {
                stop_agents(agents).await;
                return Err(error.context(format!("start the local agent {id}")));
            }
        }
    }
    Ok(agents)
}

/// The error of a failed `rlark up` start, with the flag that gets around it where there is
/// one.
fn up_start_error(error: rlark_server::ServerError, listen: SocketAddr) -> anyhow::Error {
    match &error {
        rlark_server::ServerError::Bind { source, .. }
            if source.kind() == std::io::ErrorKind::AddrInUse =>
        {
            let mut other = listen;
            other.set_port(listen.port().wrapping_add(1).max(1));
            anyhow::anyhow!(
                "{listen} is already in use (another rlark up, or another program): pick \
                 another address with --listen, e.g. --listen {other}"
            )
        }
        _ => error.into(),
    }
}

async fn stop_agents(agents: Vec<rlark_agent::RunningAgent>) {
    for agent in agents {
        let id = agent.cluster_id().to_string();
        if let Err(error) = agent.stop().await {
            tracing::warn!(agent = %id, %error, "local agent stopped with an error");
        }
    }
}

/// This host's name made fit for a Node name prefix (lowercase letters, digits, '-'),
/// `localhost` when there is none.
fn up_node_prefix() -> String {
    let host = rlark_agent::config::host_name().unwrap_or_default();
    let first = host.split('.').next().unwrap_or_default();
    let mut name: String = first
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(48)
        .collect();
    name = name.trim_matches('-').to_string();
    if name.is_empty() {
        "localhost".to_string()
    } else {
        name
    }
}

/// `rlark kubeconfig`; with `--user`, the admin credentials come from `client`
/// (`--kubeconfig`, `$KUBECONFIG`, else DIR/admin.kubeconfig).
pub(crate) async fn kubeconfig(args: KubeconfigArgs, client: ClientArgs) -> anyhow::Result<()> {
    let path = rlark_server::admin_kubeconfig_path(&args.data_dir);
    if let Some(user) = &args.user {
        let api = SecurityClient::connect(&client, &path).await?;
        return security::user_kubeconfig(
            &api,
            user,
            args.role.unwrap_or(UserRole::Viewer),
            args.validity,
            args.output.as_deref(),
        )
        .await;
    }
    if !path.exists() {
        bail!(
            "no kubeconfig at {}: start the server first (`rlark up` or `rlark server --data-dir {}`)",
            path.display(),
            args.data_dir.display()
        );
    }
    if args.path {
        println!("{}", absolute(&path).display());
        return Ok(());
    }
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    match &args.output {
        Some(output) => rlark_pki::write_private_file(output, text.as_bytes())
            .with_context(|| format!("write {}", output.display()))?,
        None => print!("{text}"),
    }
    Ok(())
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Cancel `shutdown` on the first SIGTERM or SIGINT; exit at once on a second one.
/// Handlers are installed before returning, so no early signal is lost.
pub(crate) fn watch_signals(shutdown: CancellationToken) -> anyhow::Result<()> {
    let mut terminate = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        };
        tracing::info!(
            signal = name,
            "shutting down gracefully (send it again to exit at once)"
        );
        shutdown.cancel();
        tokio::select! {
            _ = terminate.recv() => {},
            _ = interrupt.recv() => {},
        }
        tracing::warn!("second signal: exiting without waiting");
        std::process::exit(1);
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embodied_sockets_live_in_the_data_dir_unless_their_paths_would_be_too_long() {
        let short = tempfile::tempdir().expect("tempdir");
        let dir = up_socket_dir(short.path()).expect("socket dir");
        assert_eq!(dir, short.path().join("embodied"));

        let deep = short.path().join("d".repeat(100));
        std::fs::create_dir_all(&deep).expect("mkdir");
        let dir = up_socket_dir(&deep).expect("socket dir");
        assert!(dir.starts_with(std::env::temp_dir()), "{}", dir.display());
        assert!(dir.join(LONGEST_SOCKET).as_os_str().len() <= MAX_SOCKET_PATH);
        assert_eq!(up_socket_dir(&deep).expect("again"), dir, "stable");
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&dir).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        // A directory others can write is refused, not used.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let error = up_socket_dir(&deep).expect_err("not private");
        assert!(
            error.to_string().contains("not a private directory"),
            "{error}"
        );
        std::fs::remove_dir(&dir).expect("clean up");
    }
}
