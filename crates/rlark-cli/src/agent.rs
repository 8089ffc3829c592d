//! `rlark agent`: run the agent of a cluster on this host (see `rlark_agent`) until SIGTERM
//! or SIGINT. The first start joins with `--token` and `--ca-hash`; later starts reuse the
//! credentials in `DATA_DIR/identity`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use clap::{Args, ValueEnum};
use rlark_agent::{AgentConfig, JoinParams, NetMode};
use rlark_api::types::{AgentType, NodeCategory};
use tokio_util::sync::CancellationToken;

use super::server::watch_signals;
use rlark_observe::parse_duration;

#[derive(Debug, Args)]
pub(crate) struct AgentArgs {
    /// URL of the server, https://HOST:PORT. Several replicas: comma-separated or repeated
    /// (the agent keeps a tunnel to each; the first is used to join).
    #[arg(
        long = "server",
        value_name = "URL",
        env = "RLARK_SERVER",
        value_delimiter = ',',
        required = true
    )]
    pub servers: Vec<String>,
    /// Cluster ID this agent runs (its objects live in namespace rlark-ID).
    #[arg(long, value_name = "ID")]
    pub cluster_id: String,
    /// Data directory: credentials in DIR/identity, task state and logs in DIR/tasks.
    #[arg(long, value_name = "DIR", env = "RLARK_DATA_DIR")]
    pub data_dir: PathBuf,
    /// Bootstrap token from `rlark token create`, for the first start (ignored once the
    /// agent has joined).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "RLARK_JOIN_TOKEN",
        hide_env_values = true,
        requires = "ca_hash"
    )]
    pub token: Option<String>,
    /// sha256:<hex> of the CA's public key, from `rlark token create` (with --token): the
    /// join refuses a server whose CA does not match.
    #[arg(long, value_name = "sha256:HEX", requires = "token")]
    pub ca_hash: Option<String>,
    /// Name of this host's Node [default: the host name].
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    /// Where the node sits (label rlark.io/node-category).
    #[arg(long, value_enum, default_value_t = Category::Cloud)]
    pub node_category: Category,
    /// Extra label of the Node. Repeatable.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Stop the tasks running on this host when the agent exits (default: leave them
    /// running under their supervisors; the next agent start adopts them, and reports
    /// those that ended meanwhile with their exit codes).
    #[arg(long)]
    pub stop_tasks_on_exit: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics (a loopback address; port 0 picks
    /// one).
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// Accept direct pod-network connections from other agents here (mutual TLS with the
    /// agent certificates), e.g. 0.0.0.0:15002 [default: off: members on this host are
    /// reached through the hub only].
    #[arg(long, value_name = "ADDR")]
    pub domain_listen: Option<SocketAddr>,
    /// HOST:PORT other agents dial to reach --domain-listen (announced in the Node's
    /// status) [default: the --domain-listen address when it names one IP].
    #[arg(long, value_name = "HOST:PORT", requires = "domain_listen")]
    pub domain_advertise: Option<String>,
    /// How the pod network terminates the TCP connections of domain replicas: kernel
    /// (nftables REDIRECT to the agent), tun (a userspace TCP stack behind each replica's
    /// TUN device, for hosts without netfilter), or auto (kernel where netfilter works,
    /// else tun). A forced mode this host cannot run stops the agent at start.
    #[arg(long, value_enum, default_value_t = NetModeArg::Auto)]
    pub net_mode: NetModeArg,
    /// How this agent runs Tasks: Raw (processes), Docker (containers of the node's
    /// Docker engine) or Kubernetes (workloads of a member Kubernetes cluster, see
    /// --member-kubeconfig); the Node reports it, so only Tasks of that agent type land
    /// here.
    #[arg(long, value_enum, default_value_t = AgentKind::Raw)]
    pub agent_type: AgentKind,
    /// The Docker engine of a Docker agent, unix:///PATH [default: $DOCKER_HOST, else
    /// unix:///var/run/docker.sock].
    #[arg(long, value_name = "URL")]
    pub docker_host: Option<String>,
    /// Kubeconfig of the member cluster of a Kubernetes agent [default: in-cluster config,
    /// when the agent runs in a Pod of that cluster; neither is an error at start].
    #[arg(long, value_name = "FILE")]
    pub member_kubeconfig: Option<PathBuf>,
    /// Namespace of the member cluster the workloads of a Kubernetes agent go to (created
    /// when missing).
    #[arg(long, value_name = "NS", default_value = rlark_agent::kubernetes::member::DEFAULT_MEMBER_NAMESPACE)]
    pub member_namespace: String,
    /// Most workload creations a Kubernetes agent makes in any 60 s window; more Tasks
    /// wait (they never fail for it). Must be at least 1.
    #[arg(long, value_name = "N", default_value_t = rlark_agent::kubernetes::ratelimit::DEFAULT_MAX_CREATES_PER_MINUTE)]
    pub max_creates_per_minute: u32,
    /// Image of the TensorBoard sidecar a Kubernetes agent adds to the Pods of Tasks with
    /// tensorBoardDir (it must have the `tensorboard` command) [default:
    /// tensorflow/tensorflow:2.15.0].
    #[arg(long, value_name = "IMAGE")]
    pub tensorboard_image: Option<String>,
    /// How often the Node's heartbeat (Lease and status) is renewed (e.g. 10s, 500ms).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub heartbeat_interval: Duration,
    /// Socket directory of this host's `rlark embodied` runtime: its robots and cameras
    /// become Node resources (rlinf.io/device, rlinf.io/robot-TYPE, rlinf.io/camera-DRIVER)
    /// that tasks can request [default: none; the runtime's own default is /var/run/rlark].
    #[arg(long, value_name = "DIR")]
    pub embodied_socket_dir: Option<PathBuf>,
    #[command(flatten)]
    pub isolation: IsolationArgs,
}

/// How raw replicas are isolated (docs/security.md, "Replica isolation").
#[derive(Args, Debug, Clone)]
pub struct IsolationArgs {
    /// Isolate raw replicas: each runs as a user of its own, in a mount namespace without
    /// the agent's files, seeing only its own processes, in a control group of its own.
    /// `false` only where the agent itself is unprivileged.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub replica_isolation: bool,
    /// The users (and groups) replicas run as, one each.
    #[arg(long, value_name = "FIRST-LAST", value_parser = parse_id_range,
          default_value = "2000000000-2000065535")]
    pub replica_uid_range: std::ops::RangeInclusive<u32>,
    /// Users a Task may ask for with raw.runAsUser (repeatable) [default: none].
    #[arg(long = "replica-allowed-users", value_name = "FIRST-LAST", value_parser = parse_id_range)]
    pub replica_allowed_users: Vec<std::ops::RangeInclusive<u32>>,
    /// A Job whose Tasks may run as root with raw.runAsUser: 0 (repeatable; `*` for every
    /// Job) [default: none].
    #[arg(long = "replica-root-job", value_name = "JOB")]
    pub replica_root_jobs: Vec<String>,
    /// Another host path replicas must not see (repeatable), e.g. the server's data
    /// directory on the same host. The agent's data directory and the embodied socket
    /// directory are always hidden.
    #[arg(long = "replica-hide", value_name = "PATH")]
    pub replica_hide: Vec<PathBuf>,
    /// A path inside a hidden one that replicas see anyway, read-only (repeatable).
    #[arg(long = "replica-expose", value_name = "PATH")]
    pub replica_expose: Vec<PathBuf>,
    /// Most processes and threads one replica may have at once.
    #[arg(long, value_name = "N", default_value_t = rlark_agent::config::DEFAULT_REPLICA_PIDS_LIMIT)]
    pub replica_pids_limit: u64,
    /// Where replicas' control groups are made, in each hierarchy.
    #[arg(long, value_name = "PATH", default_value = "/rlark.slice")]
    pub replica_cgroup_parent: PathBuf,
}

impl IsolationArgs {
    /// The agent's isolation settings.
    pub(crate) fn config(&self) -> rlark_agent::IsolationConfig {
        rlark_agent::IsolationConfig {
            enabled: self.replica_isolation,
            uid_range: self.replica_uid_range.clone(),
            allowed_users: self.replica_allowed_users.clone(),
            root_jobs: self.replica_root_jobs.clone(),
            hide: self.replica_hide.clone(),
            expose: self.replica_expose.clone(),
            pids_limit: self.replica_pids_limit,
            cgroup_parent: self.replica_cgroup_parent.clone(),
        }
    }
}

/// `FIRST-LAST` (or one number) of user or group ids.
fn parse_id_range(text: &str) -> Result<std::ops::RangeInclusive<u32>, String> {
    let number = |t: &str| {
        t.trim()
            .parse::<u32>()
            .map_err(|_| format!("{t:?} in {text:?} is not a user id (0 to 4294967295)"))
    };
    let (first, last) = match text.split_once('-') {
        Some((first, last)) => (number(first)?, number(last)?),
        None => {
            let one = number(text)?;
            (one, one)
        }
    };
    if first > last {
        return Err(format!("{text:?}: the first id is above the last"));
    }
    Ok(first..=last)
}

/// `--agent-type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum AgentKind {
    #[value(name = "Raw", alias = "raw")]
    Raw,
    #[value(name = "Docker", alias = "docker")]
    Docker,
    #[value(name = "Kubernetes", alias = "kubernetes")]
    Kubernetes,
}

impl From<AgentKind> for AgentType {
    fn from(kind: AgentKind) -> Self {
        match kind {
            AgentKind::Raw => AgentType::Raw,
            AgentKind::Docker => AgentType::Docker,
            AgentKind::Kubernetes => AgentType::Kubernetes,
        }
    }
}

/// `--node-category`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Category {
    Cloud,
    Edge,
    Robot,
}

impl From<Category> for NodeCategory {
    fn from(category: Category) -> Self {
        match category {
            Category::Cloud => NodeCategory::Cloud,
            Category::Edge => NodeCategory::Edge,
            Category::Robot => NodeCategory::Robot,
        }
    }
}

/// `--net-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum NetModeArg {
    Auto,
    Kernel,
    Tun,
}

impl From<NetModeArg> for NetMode {
    fn from(mode: NetModeArg) -> Self {
        match mode {
            NetModeArg::Auto => NetMode::Auto,
            NetModeArg::Kernel => NetMode::Kernel,
            NetModeArg::Tun => NetMode::Tun,
        }
    }
}

/// `KEY=VALUE` (the value may be empty).
fn parse_label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("label {text:?} must be KEY=VALUE")),
    }
}

impl AgentArgs {
    /// The agent configuration (validated later, by the agent, before any network use).
    pub(crate) fn into_config(self) -> anyhow::Result<AgentConfig> {
        let mut labels = BTreeMap::new();
        for (key, value) in self.labels {
            if let Some(previous) = labels.insert(key.clone(), value.clone())
                && previous != value
            {
                bail!("label {key} given twice ({previous:?} and {value:?})");
            }
        }
        let join = match (self.token, self.ca_hash) {
            (Some(token), Some(ca_hash)) => Some(JoinParams { token, ca_hash }),
            _ => None,
        };
        let mut config = AgentConfig::new(self.servers, self.cluster_id, self.data_dir);
        config.node_name = self.node_name;
        config.node_category = self.node_category.into();
        config.labels = labels;
        config.heartbeat_interval = self.heartbeat_interval;
        config.stop_tasks_on_exit = self.stop_tasks_on_exit;
        config.join = join;
        config.metrics_listen = self.metrics_listen;
        config.domain_listen = self.domain_listen;
        config.domain_advertise = self.domain_advertise;
        config.net_mode = self.net_mode.into();
        config.agent_type = self.agent_type.into();
        if self.docker_host.is_some() && self.agent_type != AgentKind::Docker {
            bail!("--docker-host is for --agent-type Docker");
        }
        config.docker_host = self.docker_host;
        let is_kubernetes = self.agent_type == AgentKind::Kubernetes;
        if is_kubernetes && self.embodied_socket_dir.is_some() {
            bail!(
                "--embodied-socket-dir is for Raw and Docker agents: on a Kubernetes cluster the embodied runtime's device plugin offers the devices to the member's kubelet"
            );
        }
        config.embodied_socket_dir = self.embodied_socket_dir;
        config.isolation = self.isolation.config();
        if !is_kubernetes
            && self.member_namespace != rlark_agent::kubernetes::member::DEFAULT_MEMBER_NAMESPACE
        {
            bail!("--member-namespace is for --agent-type Kubernetes");
        }
        if !is_kubernetes
            && self.max_creates_per_minute
                != rlark_agent::kubernetes::ratelimit::DEFAULT_MAX_CREATES_PER_MINUTE
        {
            bail!("--max-creates-per-minute is for --agent-type Kubernetes");
        }
        if !is_kubernetes && self.tensorboard_image.is_some() {
            bail!(
                "--tensorboard-image is for --agent-type Kubernetes (raw agents run the tensorboard in the replica's PATH)"
            );
        }
        if self
            .tensorboard_image
            .as_deref()
            .is_some_and(|i| i.trim().is_empty())
        {
            bail!("--tensorboard-image must not be empty");
        }
        config.member.tensorboard_image = self.tensorboard_image;
        config.member.kubeconfig = self.member_kubeconfig;
        config.member.namespace = self.member_namespace;
        config.member.max_creates_per_minute =
            std::num::NonZeroU32::new(self.max_creates_per_minute).ok_or_else(|| {
                anyhow::anyhow!(
                    "--max-creates-per-minute must be at least 1 (0 would never create a workload)"
                )
            })?;
        Ok(config)
    }
}

pub(crate) async fn agent(args: AgentArgs) -> anyhow::Result<()> {
    let config = args.into_config()?;
    // Refuse a bad configuration before installing handlers or touching anything.
    config.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    let shutdown = CancellationToken::new();
    watch_signals(shutdown.clone())?;
    // The agent's errors already carry their causes in their text.
    rlark_agent::run(config, shutdown)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::super::{Cli, Command};
    use super::*;
    use clap::Parser as _;

    fn parse(args: &[&str]) -> Result<AgentArgs, clap::Error> {
        let cli = Cli::try_parse_from(["rlark", "agent"].iter().chain(args))?;
        match cli.command {
            Command::Agent(args) => Ok(args),
            other => panic!("not agent: {other:?}"),
        }
    }

    #[test]
    fn flags_make_the_config() {
        let args = parse(&[
            "--server",
            "https://a:1,https://b:2",
            "--server",
            "https://c:3",
            "--cluster-id",
            "edge",
            "--data-dir",
            "d",
            "--token",
            "abcdef.0123456789abcdef",
            "--ca-hash",
            "sha256:00",
            "--node-name",
            "n1",
            "--node-category",
            "robot",
            "--label",
            "zone=lab",
            "--label",
            "empty=",
            "--stop-tasks-on-exit",
            "--metrics-listen",
            "127.0.0.1:0",
            "--heartbeat-interval",
            "500ms",
            "--domain-listen",
            "0.0.0.0:15002",
            "--domain-advertise",
            "edge-1.example:15002",
        ])
        .expect("parse");
        let config = args.into_config().expect("config");
        assert_eq!(
            config.servers,
            ["https://a:1", "https://b:2", "https://c:3"]
        );
        assert_eq!(config.cluster_id, "edge");
        assert_eq!(config.data_dir, PathBuf::from("d"));
        assert_eq!(config.node_name.as_deref(), Some("n1"));
        assert_eq!(config.node_category, NodeCategory::Robot);
        assert_eq!(config.labels["zone"], "lab");
        assert_eq!(config.labels["empty"], "");
        assert!(config.stop_tasks_on_exit);
        assert_eq!(config.heartbeat_interval, Duration::from_millis(500));
        assert_eq!(config.metrics_listen, Some("127.0.0.1:0".parse().unwrap()));
        assert_eq!(config.domain_listen, Some("0.0.0.0:15002".parse().unwrap()));
        assert_eq!(
            config.domain_advertise.as_deref(),
            Some("edge-1.example:15002")
        );
        let join = config.join.expect("join");
        assert_eq!(join.ca_hash, "sha256:00");

        let args = parse(&[
            "--server",
            "https://a:1",
            "--cluster-id",
            "c",
            "--data-dir",
            "d",
        ])
        .expect("parse");
        let config = args.into_config().expect("config");
        assert_eq!(config.node_category, NodeCategory::Cloud);
        assert_eq!(config.heartbeat_interval, Duration::from_secs(10));
        assert!(config.join.is_none() && !config.stop_tasks_on_exit);
        assert_eq!(
            (config.domain_listen, config.domain_advertise),
            (None, None)
        );
    }

    #[test]
    fn bad_flags_are_usage_errors() {
        let base = [
            "--server",
            "https://a:1",
            "--cluster-id",
            "c",
            "--data-dir",
            "d",
        ];
        let with = |extra: &[&str]| {
            let mut all: Vec<&str> = base.to_vec();
            all.extend_from_slice(extra);
            parse(&all)
        };
        assert!(
            parse(&["--cluster-id", "c", "--data-dir", "d"]).is_err(),
            "no server"
        );
        assert!(with(&["--token", "t"]).is_err(), "token without CA hash");
        assert!(
            with(&["--ca-hash", "sha256:00"]).is_err(),
            "CA hash without token"
        );
        assert!(with(&["--label", "novalue"]).is_err());
        assert!(with(&["--node-category", "moon"]).is_err());
        assert!(with(&["--heartbeat-interval", "soon"]).is_err());
        let twice = with(&["--label", "a=1", "--label", "a=2"]).expect("parse");
        assert!(twice.into_config().is_err(), "a label given twice");
    }

    #[test]
    fn net_mode_flag() {
        let base = [
            "--server",
            "https://a:1",
            "--cluster-id",
            "c",
            "--data-dir",
            "d",
        ];
        let mode = |extra: &[&str]| {
            let mut all: Vec<&str> = base.to_vec();
            all.extend_from_slice(extra);
            parse(&all).map(|args| args.into_config().expect("config").net_mode)
        };
        assert_eq!(mode(&[]).expect("default"), NetMode::Auto);
        assert_eq!(mode(&["--net-mode", "auto"]).expect("auto"), NetMode::Auto);
        assert_eq!(
            mode(&["--net-mode", "kernel"]).expect("kernel"),
            NetMode::Kernel
        );
        assert_eq!(mode(&["--net-mode", "tun"]).expect("tun"), NetMode::Tun);
        assert!(mode(&["--net-mode", "iptables"]).is_err());
    }
}
