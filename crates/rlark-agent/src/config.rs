//! What an agent is told: servers, cluster ID, data directory, the Node it reports, and
//! (once) how to join. [`AgentConfig::validate`] checks all of it before anything touches
//! the network, and names the offending field in its error.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rlark_api::labels;
use rlark_api::types::{AgentType, NodeCategory};

/// Heartbeat interval when none is given (the Lease and `status.heartbeatTime`).
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(10);
/// Shortest heartbeat interval accepted.
pub const MIN_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(10);
/// Longest heartbeat interval accepted (the controllers' default grace period is 40 s).
pub const MAX_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(300);
pub use rlark_net::membership::MAX_CLUSTER_ID_LEN;
/// Subdirectory of the data directory holding the agent's credentials.
pub const IDENTITY_DIR: &str = "identity";
/// Subdirectory of the data directory holding the task reconciler's state and logs.
pub const TASKS_DIR: &str = "tasks";
/// Labels the agent sets itself; `labels` may not set them.
pub const RESERVED_LABELS: &[&str] = &[
    labels::CLUSTER_ID,
    labels::NODE_CATEGORY,
    labels::AGENT_TYPE,
    labels::HOSTNAME,
];

/// How to join the installation the first time (a bootstrap token and the CA pin, as printed
/// by `rlark token create`). Ignored once the agent holds credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinParams {
    /// Bootstrap token (`abcdef.0123456789abcdef`). Secret.
    pub token: String,
    /// `sha256:<hex>` of the CA's public key.
    pub ca_hash: String,
}

impl fmt::Debug for JoinParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinParams")
            .field("token", &"<redacted>")
            .field("ca_hash", &self.ca_hash)
            .finish()
    }
}

/// Configuration of one agent (one cluster, one host).
#[derive(Clone, Debug, PartialEq)]
pub struct AgentConfig {
    /// `https://HOST:PORT` of every server replica (1 or more). The first is used to join
    /// and is the server URL given to tasks; the tunnel connects to all of them.
    pub servers: Vec<String>,
    /// The cluster this agent runs (namespace `rlark-<cluster_id>`).
    pub cluster_id: String,
    /// Where the agent keeps its credentials (`identity/`) and task state (`tasks/`).
    pub data_dir: PathBuf,
    /// Name of the Node; default: the host name (lowercased).
    pub node_name: Option<String>,
    /// `rlark.io/node-category` of the Node.
    pub node_category: NodeCategory,
    /// Extra labels of the Node.
    pub labels: BTreeMap<String, String>,
    /// How often the Lease and `status.heartbeatTime` are renewed.
    pub heartbeat_interval: Duration,
    /// Stop the running tasks when the agent exits (default: leave them running, to be
    /// adopted by the next agent).
    pub stop_tasks_on_exit: bool,
    /// The replica supervisor command: program and leading arguments, e.g.
    /// `[/usr/bin/rlark, supervise]` (see [`crate::supervisor`]). Default:
    /// [`crate::runtime::default_supervisor`] (`rlark-supervise` beside this executable when
    /// it is of this build, else this executable + `supervise`: right when the agent runs
    /// inside the `rlark` binary); tests set it (e.g. to `rlark-agent-supervise`).
    pub supervisor: Vec<OsString>,
    /// Bootstrap token and CA pin, for the first start only.
    pub join: Option<JoinParams>,
    /// Plain-HTTP `/metrics` listener (a loopback address; port 0 picks one).
    pub metrics_listen: Option<SocketAddr>,
    /// `--domain-listen`: where other agents reach this one directly (mutual TLS with the
    /// agent certificates, [`rlark_net::direct`]), e.g. `0.0.0.0:15002`; `None` (the
    /// default): members here are reached through the hub only.
    pub domain_listen: Option<SocketAddr>,
    /// `--domain-advertise HOST:PORT`: the direct address announced in the Node's
    /// `status.network.directAddress`; default: `domain_listen` when it names one IP.
    pub domain_advertise: Option<String>,
    /// `--net-mode`: how the pod network terminates a replica's TCP ([`NetMode`]).
    pub net_mode: NetMode,
    /// `--agent-type`: how Tasks run here: `Raw` (processes, the default) or `Docker`
    /// (containers of the node's Docker engine, [`crate::runtime::docker`]). The Node
    /// reports it, so only Tasks of that agent type are placed here.
    pub agent_type: AgentType,
    /// `--docker-host`: the engine of a `Docker` agent (`unix:///path`); `None`:
    /// `DOCKER_HOST`, else [`crate::runtime::docker::DEFAULT_DOCKER_HOST`].
    pub docker_host: Option<String>,
    /// The member cluster of a `Kubernetes` agent (`--member-kubeconfig`,
    /// `--member-namespace`, `--max-creates-per-minute`; [`crate::kubernetes::member`]).
    pub member: MemberOptions,
    /// `--embodied-socket-dir`: the sockets of the host's `rlark embodied` runtime, whose
    /// robots and cameras the Node offers as resources ([`crate::devices`]); `None`: none.
    pub embodied_socket_dir: Option<PathBuf>,
    /// How raw replicas are isolated from the host and from each other
    /// (docs/security.md, "Replica isolation").
    pub isolation: IsolationConfig,
}

/// `--replica-*` flags: the isolation of raw replicas (docs/security.md, "Replica
/// isolation"). By default every replica runs as a user of its own from
/// [`IsolationConfig::uid_range`], with the agent's data directory, the embodied runtime's
/// socket directory and [`IsolationConfig::hide`] out of its sight, other users' processes
/// invisible, and a control group per replica.
#[derive(Clone, Debug, PartialEq)]
pub struct IsolationConfig {
    /// `--replica-isolation=false`: replicas run as the agent's user in the host's
    /// namespaces, as before isolation existed. Meant for hosts where the agent itself is
    /// unprivileged (it cannot switch users then); a root agent logs a warning.
    pub enabled: bool,
    /// `--replica-uid-range FIRST-LAST`: the users (and groups, same numbers) replicas run
    /// as; default [`crate::runtime::uids::DEFAULT_RANGE`]. Must not overlap real users.
    pub uid_range: std::ops::RangeInclusive<u32>,
    /// `--replica-allowed-users FIRST-LAST` (repeatable): users a Task may ask for in
    /// `raw.runAsUser` (never 0: see `root_jobs`). Default: none.
    pub allowed_users: Vec<std::ops::RangeInclusive<u32>>,
    /// `--replica-root-jobs NAMESPACE/JOB` (repeatable; `*` for every Job): the Jobs whose
    /// Tasks may run as root with `raw.runAsUser: 0`. Default: none.
    pub root_jobs: Vec<String>,
    /// `--replica-hide PATH` (repeatable): more host paths replicas must not see (the
    /// server's data directory when it runs on the same host; `rlark up` adds its own).
    pub hide: Vec<PathBuf>,
    /// `--replica-expose PATH` (repeatable): paths inside hidden ones that replicas see
    /// anyway, read-only (`rlark up` exposes its demo's programs and examples this way).
    pub expose: Vec<PathBuf>,
    /// `--replica-pids-limit N`: most processes and threads of one replica (default 4096).
    pub pids_limit: u64,
    /// `--replica-cgroup-parent PATH`: where replicas' control groups are made in each
    /// hierarchy (default `/rlark.slice`).
    pub cgroup_parent: PathBuf,
}

/// Default of [`IsolationConfig::pids_limit`].
pub const DEFAULT_REPLICA_PIDS_LIMIT: u64 = 4096;

impl Default for IsolationConfig {
    fn default() -> Self {
        IsolationConfig {
            enabled: true,
            uid_range: crate::runtime::uids::DEFAULT_RANGE,
            allowed_users: Vec::new(),
            root_jobs: Vec::new(),
            hide: Vec::new(),
            expose: Vec::new(),
            pids_limit: DEFAULT_REPLICA_PIDS_LIMIT,
            cgroup_parent: PathBuf::from("/rlark.slice"),
        }
    }
}

/// Whether the agent runs in a Pod of a Kubernetes cluster (what kube's in-cluster
/// config needs: `KUBERNETES_SERVICE_HOST`).
fn in_cluster() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some_and(|v| !v.is_empty())
}

/// `--net-mode` (defined with the pod network).
pub use rlark_net::start::NetMode;

impl AgentConfig {
    /// A configuration with the defaults: node named after the host, category `cloud`, no
    /// extra labels, heartbeat every 10 s, tasks left running on exit, no join parameters,
    /// no metrics listener, `<this executable> supervise` as the replica supervisor, net mode
    /// `auto`.
    pub fn new(
        servers: Vec<String>,
        cluster_id: impl Into<String>,
        data_dir: impl Into<PathBuf>,
    ) -> Self {
        AgentConfig {
            servers,
            cluster_id: cluster_id.into(),
            data_dir: data_dir.into(),
            node_name: None,
            node_category: NodeCategory::Cloud,
            labels: BTreeMap::new(),
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            stop_tasks_on_exit: false,
            supervisor: crate::runtime::default_supervisor(),
            join: None,
            metrics_listen: None,
            domain_listen: None,
            domain_advertise: None,
            net_mode: NetMode::Auto,
            agent_type: AgentType::Raw,
            docker_host: None,
            member: MemberOptions::default(),
            embodied_socket_dir: None,
            isolation: IsolationConfig::default(),
        }
    }

    /// The direct address to announce, if the direct listener is on: `domain_advertise`,
    /// else `domain_listen` when it names one IP.
    pub fn domain_direct_address(&self) -> Option<String> {
        let listen = self.domain_listen?;
        rlark_net::direct::advertised_address(listen, self.domain_advertise.as_deref())
    }

    /// `DATA_DIR/identity`: the credentials written by the join.
    pub fn identity_dir(&self) -> PathBuf {
        self.data_dir.join(IDENTITY_DIR)
    }

    /// `DATA_DIR/tasks`: the task reconciler's directory.
    pub fn tasks_dir(&self) -> PathBuf {
        self.data_dir.join(TASKS_DIR)
    }

    /// The agent namespace `rlark-<cluster_id>`.
    pub fn namespace(&self) -> String {
        rlark_api::names::agent_namespace(&self.cluster_id)
    }

    /// The Node name: `node_name`, else the host name (lowercased). Checked like
    /// [`AgentConfig::validate`] checks `node_name`.
    pub fn resolved_node_name(&self) -> Result<String, ConfigError> {
        let (name, field) = match &self.node_name {
            Some(name) => (name.clone(), "node name"),
            None => (
                host_name().map_err(|e| ConfigError::one("node name", "", e))?,
                "node name (the host name; set one)",
            ),
        };
        match node_name_problem(&name) {
            None => Ok(name),
            Some(reason) => Err(ConfigError::one(field, &name, reason)),
        }
    }

    /// Check every field; the error lists each problem with the field it is about. Does
    /// no IO beyond reading the host name when `node_name` is not set.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        let mut add = |field: &'static str, value: &str, reason: String| {
            problems.push(FieldError {
                field,
                value: value.to_string(),
                reason,
            });
        };

        if self.servers.is_empty() {
            add("server URL", "", "at least one server is required".into());
        }
        for (i, url) in self.servers.iter().enumerate() {
            if let Err(reason) = check_server_url(url) {
                add("server URL", url, reason);
            } else if self.servers[..i].contains(url) {
                add("server URL", url, "listed twice".into());
            }
        }

        let isolation = &self.isolation;
        let range_text = |r: &std::ops::RangeInclusive<u32>| format!("{}-{}", r.start(), r.end());
        if isolation.uid_range.is_empty() || *isolation.uid_range.start() == 0 {
            add(
                "replica uid range",
                &range_text(&isolation.uid_range),
                "must be a non-empty range of users above 0".into(),
            );
        }
        for range in &isolation.allowed_users {
            if range.is_empty() || *range.start() == 0 {
                add(
                    "replica allowed users",
                    &range_text(range),
                    "must be a non-empty range above 0 (root is allowed per Job with \
                     --replica-root-jobs)"
                        .into(),
                );
            }
        }
        if isolation.pids_limit == 0 {
            add("replica pids limit", "0", "must be at least 1".into());
        }
        if !isolation.cgroup_parent.is_absolute() {
            add(
                "replica cgroup parent",
                &isolation.cgroup_parent.display().to_string(),
                "must be an absolute path within the hierarchies".into(),
            );
        }
        for path in isolation.hide.iter().chain(&isolation.expose) {
            if !path.is_absolute() {
                add(
                    "replica hidden or exposed path",
                    &path.display().to_string(),
                    "must be absolute".into(),
                );
            }
        }

        if let Some(reason) = cluster_id_problem(&self.cluster_id) {
            add("cluster ID", &self.cluster_id, reason);
        }

        if self.data_dir.as_os_str().is_empty() {
            add("data directory", "", "must not be empty".into());
        }

        if let Err(e) = self.resolved_node_name() {
            for problem in e.problems {
                add(problem.field, &problem.value, problem.reason);
            }
        }

        for (key, value) in &self.labels {
            if RESERVED_LABELS.contains(&key.as_str()) {
                add(
                    "label key",
                    key,
                    "is set by the agent itself and cannot be given".into(),
                );
            } else if let Err(reason) = rlark_api::names::qualified_name(key) {
                add("label key", key, reason);
            }
            if let Err(reason) = rlark_api::names::label_value(value) {
                add("label value", &format!("{key}={value}"), reason);
            }
        }

        let interval = self.heartbeat_interval;
        if !(MIN_HEARTBEAT_INTERVAL..=MAX_HEARTBEAT_INTERVAL).contains(&interval) {
            add(
                "heartbeat interval",
                &format!("{interval:?}"),
                format!(
                    "must be between {MIN_HEARTBEAT_INTERVAL:?} and {MAX_HEARTBEAT_INTERVAL:?}"
                ),
            );
        }

        if let Some(join) = &self.join {
            if join.token.trim().is_empty() {
                add("join token", "", "must not be empty".into());
            }
            if rlark_pki::ServerVerifier::pinned_ca(&join.ca_hash).is_err() {
                add(
                    "CA hash",
                    &join.ca_hash,
                    "must be sha256: followed by 64 hex digits (printed by `rlark token create`)"
                        .into(),
                );
            }
        }

        match self.supervisor.first() {
            None => add(
                "supervisor command",
                "",
                "must not be empty (the agent's own executable could not be found: set one)".into(),
            ),
            Some(program) if program.is_empty() => {
                add(
                    "supervisor command",
                    "",
                    "the program must not be empty".into(),
                );
            }
            Some(_) => {}
        }

        if self.agent_type == AgentType::Kubernetes {
            if self.member.kubeconfig.is_none() && !in_cluster() {
                add(
                    "member kubeconfig",
                    "",
                    "a Kubernetes agent needs --member-kubeconfig FILE, or to run in a Pod of \
                     the member cluster (in-cluster config: KUBERNETES_SERVICE_HOST is not set)"
                        .into(),
                );
            }
            if let Err(reason) = rlark_api::names::dns1123_label(&self.member.namespace) {
                add("member namespace", &self.member.namespace, reason);
            }
        } else if let Some(path) = &self.member.kubeconfig {
            add(
                "member kubeconfig",
                &path.display().to_string(),
                format!(
                    "only a Kubernetes agent has a member cluster (this one is {})",
                    self.agent_type.as_str()
                ),
            );
        }

        if let Some(addr) = self.metrics_listen
            && !addr.ip().is_loopback()
        {
            add(
                "metrics listen address",
                &addr.to_string(),
                "must be a loopback address (the metrics endpoint is plain HTTP; reach it \
                 through the tunnel)"
                    .into(),
            );
        }

        match (self.domain_listen, &self.domain_advertise) {
            (None, Some(advertise)) => add(
                "domain advertise address",
                advertise,
                "needs a direct listener (--domain-listen)".into(),
            ),
            (Some(listen), None) if listen.ip().is_unspecified() => add(
                "domain listen address",
                &listen.to_string(),
                "names no single IP to announce: pass --domain-advertise HOST:PORT".into(),
            ),
            (Some(listen), None) if listen.port() == 0 => add(
                "domain listen address",
                &listen.to_string(),
                "port 0 cannot be announced: give a port, or --domain-advertise HOST:PORT".into(),
            ),
            (_, Some(advertise)) => {
                if let Err(reason) = check_host_port(advertise) {
                    add("domain advertise address", advertise, reason);
                }
            }
            _ => {}
        }

        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { problems })
        }
    }
}

/// Check `HOST:PORT` (an IPv6 host in brackets; port 1..=65535).
pub fn check_host_port(text: &str) -> Result<(), String> {
    if text.parse::<SocketAddr>().is_ok() {
        return Ok(());
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err("must be HOST:PORT".into());
    };
    if host.is_empty() {
        return Err("has no host".into());
    }
    if host.contains([':', '[', ']']) {
        return Err("an IPv6 host must be in brackets: [ADDR]:PORT".into());
    }
    if let Err(reasons) = rlark_api::names::dns1123_subdomain(&host.to_ascii_lowercase()) {
        return Err(format!(
            "host {host:?} is not an IP address or DNS name: {reasons}"
        ));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!("port {port:?} is not a number from 1 to 65535")),
    }
}

/// One invalid field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// What it is (`cluster ID`, `server URL`, `label key`, ...).
    pub field: &'static str,
    /// The value given.
    pub value: String,
    /// Why it is refused.
    pub reason: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}: {}", self.field, self.reason)
        } else {
            write!(
                f,
                "invalid {} {:?}: {}",
                self.field, self.value, self.reason
            )
        }
    }
}

/// An invalid configuration: every problem found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    pub problems: Vec<FieldError>,
}

impl ConfigError {
    fn one(field: &'static str, value: &str, reason: impl Into<String>) -> Self {
        ConfigError {
            problems: vec![FieldError {
                field,
                value: value.to_string(),
                reason: reason.into(),
            }],
        }
    }

    /// The fields found invalid, in the order checked.
    pub fn fields(&self) -> Vec<&'static str> {
        self.problems.iter().map(|p| p.field).collect()
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid agent configuration: ")?;
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

/// Why `id` cannot be a cluster ID (defined with the pod network, whose namespaces and
/// agent certificates name it).
pub use rlark_net::membership::cluster_id_problem;

/// Why `name` cannot be a Node name, if it cannot: it names the Node and its Lease
/// `node-<name>` (DNS-1123 subdomains) and is the value of `kubernetes.io/hostname` (a label
/// value, at most 63 characters).
pub fn node_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("must not be empty".into());
    }
    let mut reasons = rlark_api::names::dns1123_subdomain_errors(name);
    if name.len() > rlark_api::names::LABEL_VALUE_MAX_LENGTH {
        reasons.push(format!(
            "must be no more than {} characters (it is the {} label)",
            rlark_api::names::LABEL_VALUE_MAX_LENGTH,
            labels::HOSTNAME
        ));
    }
    (!reasons.is_empty()).then(|| reasons.join("; "))
}

/// Check `https://HOST:PORT` (a trailing `/` is fine; no path, no user info).
pub fn check_server_url(url: &str) -> Result<(), String> {
    parse_server_url(url).map(|_| ())
}

/// Split `https://HOST:PORT[/]` into host (without IPv6 brackets) and port; `Err` says
/// what is wrong.
pub fn parse_server_url(url: &str) -> Result<(String, u16), String> {
    let Some(rest) = url.strip_prefix("https://") else {
        return Err("must start with https:// (https://HOST:PORT)".into());
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains(['/', '@', '?', '#']) {
        return Err("must be https://HOST:PORT, without a path or user".into());
    }
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let Some((host, port)) = v6.split_once("]:") else {
            return Err("must be https://[IPv6]:PORT".into());
        };
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("{host:?} is not an IPv6 address"));
        }
        (host, port)
    } else {
        let Some((host, port)) = rest.rsplit_once(':') else {
            return Err("has no port: use https://HOST:PORT".into());
        };
        (host, port)
    };
    if host.is_empty() {
        return Err("has no host".into());
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok((host.to_string(), p)),
        _ => Err(format!("port {port:?} is not a number from 1 to 65535")),
    }
}

/// This machine's host name, lowercased (Node names are lowercase).
pub fn host_name() -> Result<String, String> {
    let name = nix::unistd::gethostname()
        .map_err(|e| format!("read the host name: {e}"))?
        .into_string()
        .map_err(|_| "the host name is not UTF-8".to_string())?;
    let name = name.trim().to_ascii_lowercase();
    if name.is_empty() {
        return Err("the host name is empty".into());
    }
    Ok(name)
}

/// Whether `data_dir` holds credentials of a joined agent (`identity/agent.pem`).
pub fn is_joined(data_dir: &Path) -> bool {
    data_dir
        .join(IDENTITY_DIR)
        .join(crate::join::AGENT_PEM)
        .is_file()
}

/// Default of `--member-namespace`: where the workloads are created on the member cluster.
pub const DEFAULT_MEMBER_NAMESPACE: &str = "rlark-workloads";

/// Workload creations a Kubernetes agent makes per minute at most, when
/// `--max-creates-per-minute` is not given ([`crate::kubernetes::ratelimit`]).
pub const DEFAULT_MAX_CREATES_PER_MINUTE: u32 = 100;
/// How the agent reaches its member cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberOptions {
    /// `--member-kubeconfig`: a kubeconfig of the member cluster; `None`: in-cluster
    /// config (the agent runs in a Pod of the member cluster).
    pub kubeconfig: Option<PathBuf>,
    /// `--member-namespace`: where the workloads go ([`DEFAULT_MEMBER_NAMESPACE`]).
    pub namespace: String,
    /// `--max-creates-per-minute` (default [`DEFAULT_MAX_CREATES_PER_MINUTE`]).
    pub max_creates_per_minute: NonZeroU32,
    /// `--tensorboard-image`: the TensorBoard sidecar's image (`None`:
    /// [`crate::kubernetes::tensorboard::DEFAULT_IMAGE`]).
    pub tensorboard_image: Option<String>,
}

impl Default for MemberOptions {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            namespace: DEFAULT_MEMBER_NAMESPACE.to_string(),
            max_creates_per_minute: NonZeroU32::new(DEFAULT_MAX_CREATES_PER_MINUTE)
                .unwrap_or(NonZeroU32::MIN),
            tensorboard_image: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_modes_parse_print_and_default_to_auto() {
        for mode in [NetMode::Auto, NetMode::Kernel, NetMode::Tun] {
            assert_eq!(mode.to_string().parse::<NetMode>(), Ok(mode));
        }
        let error = "iptables".parse::<NetMode>().expect_err("unknown mode");
        assert!(
            error.contains("\"iptables\"") && error.contains("\"tun\""),
            "{error}"
        );
        assert_eq!(AgentConfig::new(vec![], "c", "/d").net_mode, NetMode::Auto);
    }

    fn valid() -> AgentConfig {
        let mut config = AgentConfig::new(
            vec!["https://127.0.0.1:8443".into(), "https://[::1]:9/".into()],
            "gpu-1",
            "/tmp/agent",
        );
        config.node_name = Some("host-1.lab".into());
        config.labels.insert("zone".into(), "a".into());
        config
            .labels
            .insert("example.com/rack".into(), "r_1".into());
        config.join = Some(JoinParams {
            token: "abcdef.0123456789abcdef".into(),
            ca_hash: format!("sha256:{}", "a".repeat(64)),
        });
        config.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        config
    }

    #[test]
    fn a_valid_config_passes() {
        assert_eq!(valid().validate(), Ok(()));
        assert_eq!(valid().resolved_node_name().unwrap(), "host-1.lab");
        assert_eq!(valid().namespace(), "rlark-gpu-1");
        assert_eq!(valid().identity_dir(), Path::new("/tmp/agent/identity"));
    }

    #[test]
    fn every_bad_field_is_named() {
        let mut config = valid();
        config.cluster_id = "Bad_ID".into();
        config.servers = vec!["http://x".into()];
        let err = config.validate().unwrap_err();
        assert_eq!(err.fields(), ["server URL", "cluster ID"]);
        let text = err.to_string();
        assert!(text.contains("invalid server URL \"http://x\""), "{text}");
        assert!(text.contains("invalid cluster ID \"Bad_ID\""), "{text}");

        type Change = Box<dyn Fn(&mut AgentConfig)>;
        let cases: Vec<(&str, Change)> = vec![
            ("server URL", Box::new(|c| c.servers.clear())),
            (
                "server URL",
                Box::new(|c| c.servers = vec!["https://h:1".into(), "https://h:1".into()]),
            ),
            (
                "server URL",
                Box::new(|c| c.servers = vec!["https://h:1/api".into()]),
            ),
            (
                "server URL",
                Box::new(|c| c.servers = vec!["https://h".into()]),
            ),
            (
                "server URL",
                Box::new(|c| c.servers = vec!["https://h:70000".into()]),
            ),
            ("cluster ID", Box::new(|c| c.cluster_id = "a".repeat(58))),
            ("cluster ID", Box::new(|c| c.cluster_id = String::new())),
            ("cluster ID", Box::new(|c| c.cluster_id = "a.b".into())),
            ("supervisor command", Box::new(|c| c.supervisor.clear())),
            (
                "supervisor command",
                Box::new(|c| c.supervisor = vec![OsString::new()]),
            ),
            (
                "node name",
                Box::new(|c| c.node_name = Some("Host_1".into())),
            ),
            (
                "node name",
                Box::new(|c| c.node_name = Some("a".repeat(64))),
            ),
            (
                "label key",
                Box::new(|c| {
                    c.labels.insert("bad key".into(), "v".into());
                }),
            ),
            (
                "label key",
                Box::new(|c| {
                    c.labels.insert(labels::CLUSTER_ID.into(), "x".into());
                }),
            ),
            (
                "label value",
                Box::new(|c| {
                    c.labels.insert("k".into(), "-v".into());
                }),
            ),
            (
                "heartbeat interval",
                Box::new(|c| c.heartbeat_interval = Duration::ZERO),
            ),
            (
                "CA hash",
                Box::new(|c| {
                    if let Some(j) = c.join.as_mut() {
                        j.ca_hash = "sha1:00".into();
                    }
                }),
            ),
            (
                "join token",
                Box::new(|c| {
                    if let Some(j) = c.join.as_mut() {
                        j.token = " ".into();
                    }
                }),
            ),
            (
                "metrics listen address",
                Box::new(|c| c.metrics_listen = Some("0.0.0.0:9100".parse().unwrap())),
            ),
            (
                "domain advertise address",
                Box::new(|c| c.domain_advertise = Some("h:1".into())),
            ),
            (
                "domain listen address",
                Box::new(|c| c.domain_listen = Some("0.0.0.0:15002".parse().unwrap())),
            ),
            (
                "domain listen address",
                Box::new(|c| c.domain_listen = Some("127.0.0.1:0".parse().unwrap())),
            ),
            (
                "domain advertise address",
                Box::new(|c| {
                    c.domain_listen = Some("0.0.0.0:15002".parse().unwrap());
                    c.domain_advertise = Some("fd00::1:15002".into());
                }),
            ),
            (
                "domain advertise address",
                Box::new(|c| {
                    c.domain_listen = Some("0.0.0.0:15002".parse().unwrap());
                    c.domain_advertise = Some("agent_b:0".into());
                }),
            ),
        ];
        for (field, change) in cases {
            let mut config = valid();
            change(&mut config);
            let err = config.validate().unwrap_err();
            assert_eq!(err.fields(), [field], "{err}");
        }
        assert_eq!(valid().cluster_id.len(), 5);
        let mut longest = valid();
        longest.cluster_id = "a".repeat(57);
        assert_eq!(longest.validate(), Ok(()));
    }

    #[test]
    fn the_direct_address_to_announce() {
        let mut config = valid();
        assert_eq!(config.domain_direct_address(), None);
        config.domain_listen = Some("192.0.2.7:15002".parse().unwrap());
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(
            config.domain_direct_address().as_deref(),
            Some("192.0.2.7:15002")
        );
        config.domain_listen = Some("0.0.0.0:15002".parse().unwrap());
        for advertise in [
            "agent-b.example:15002",
            "[fd00::1]:15002",
            "198.51.100.1:443",
        ] {
            config.domain_advertise = Some(advertise.into());
            assert_eq!(config.validate(), Ok(()), "{advertise}");
            assert_eq!(config.domain_direct_address().as_deref(), Some(advertise));
        }
    }

    #[test]
    fn the_token_is_not_printed() {
        let text = format!("{:?}", valid());
        assert!(!text.contains("0123456789abcdef"), "{text}");
    }

    #[test]
    fn the_host_name_is_a_fallback() {
        let mut config = valid();
        config.node_name = None;
        // The test machine's host name is a valid node name (or the error says so).
        match config.resolved_node_name() {
            Ok(name) => assert_eq!(name, name.to_ascii_lowercase()),
            Err(e) => assert!(e.to_string().contains("host name"), "{e}"),
        }
    }
}
