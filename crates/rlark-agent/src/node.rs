//! The agent's host as a `Node` of its cluster: what the machine has ([`NodeDescription`],
//! found by [`detect`]) and the [`NodeReporter`] that registers the Node and renews its
//! heartbeats.
//!
//! The protocol is the one of `docs/concepts.md` ("Agent protocol"), field for field what
//! the simulated agent (the `rlark-sim` crate) writes:
//! - the Node `<name>` in `rlark-<clusterID>`: labels `rlark.io/cluster-id`,
//!   `kubernetes.io/hostname`, `rlark.io/node-category`, `rlark.io/agent-type` (plus the
//!   configured ones), `spec.agentType` (`Raw`, or `Docker` with `--agent-type Docker`);
//! - its status, by a merge patch on the `status` subresource: `phase: Online`,
//!   `reason: AgentReady`, `nodeInfo`, `addresses`, `capacity`, `allocatable`,
//!   `heartbeatTime`;
//! - every heartbeat interval: the Lease `node-<name>` (`holderIdentity`,
//!   `leaseDurationSeconds`, `renewTime`) and `status.phase: Online` + `heartbeatTime`.
//!
//! `Offline` is the Node controller's business: the agent never writes it.
//!
//! Resources: `cpu` (available parallelism), `memory` (`/proc/meminfo`: capacity
//! `MemTotal`, allocatable `MemAvailable`), `ephemeral-storage` (the data directory's file
//! system: size, and space available to unprivileged users) and `nvidia.com/gpu` (lines of
//! `nvidia-smi -L`, when that binary is on `PATH`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::NodeAddress;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use prometheus_client::metrics::counter::Counter;
use rlark_api::types::{Node, NodeInfo, NodePhase, ResourceList};
use serde_json::json;
use tokio_util::sync::CancellationToken;

pub use rlark_api::agent::{LEASE_PREFIX, MIN_LEASE_DURATION, NodeDescription};

use crate::config::AgentConfig;

/// Resource name of CPUs.
pub const CPU: &str = "cpu";
/// Resource name of memory (bytes).
pub const MEMORY: &str = "memory";
/// Resource name of the data directory's disk space (bytes).
pub const EPHEMERAL_STORAGE: &str = "ephemeral-storage";
/// Resource name of NVIDIA GPUs.
pub const NVIDIA_GPU: &str = "nvidia.com/gpu";
/// How long `nvidia-smi -L` may take.
const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(10);

/// Failures of the Node reporter, named by the failed step.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("register node {node} in {namespace}: {source}")]
    Register {
        node: String,
        namespace: String,
        source: kube::Error,
    },
    #[error("report status of node {node}: {source}")]
    Status { node: String, source: kube::Error },
    #[error("renew heartbeat lease {LEASE_PREFIX}{node}: {source}")]
    Lease { node: String, source: kube::Error },
}

impl NodeError {
    fn source_error(&self) -> &kube::Error {
        match self {
            NodeError::Register { source, .. }
            | NodeError::Status { source, .. }
            | NodeError::Lease { source, .. } => source,
        }
    }

    /// The HTTP status the server answered, if it answered with one.
    pub fn status_code(&self) -> Option<u16> {
        match self.source_error() {
            kube::Error::Api(status) => Some(status.code),
            _ => None,
        }
    }

    /// Whether retrying cannot help: the server refused the request itself (401, 403,
    /// 422, ...), as opposed to being unreachable, overloaded or in conflict.
    pub fn is_permanent(&self) -> bool {
        self.status_code()
            .is_some_and(|code| (400..500).contains(&code) && ![404, 409, 429].contains(&code))
    }
}

/// Describe this machine as Node `name` of the agent configured by `config`: resources,
/// facts and addresses. Never fails: what cannot be found is left out (and logged).
pub async fn detect(config: &AgentConfig, name: &str) -> NodeDescription {
    let (capacity, allocatable) = detect_resources(&config.data_dir).await;
    let mut addresses = vec![NodeAddress {
        type_: "Hostname".into(),
        address: name.to_string(),
    }];
    if let Some(server) = config.servers.first()
        && let Some(ip) = local_ip_towards(server).await
    {
        addresses.push(NodeAddress {
            type_: "InternalIP".into(),
            address: ip.to_string(),
        });
    }
    NodeDescription {
        name: name.to_string(),
        category: config.node_category,
        labels: config.labels.clone(),
        capacity,
        allocatable,
        node_info: node_info(),
        addresses,
        network: None,
        agent_type: config.agent_type,
    }
}

/// The machine's resources: (capacity, allocatable). `data_dir` is where tasks write
/// (`ephemeral-storage` is its file system).
pub async fn detect_resources(data_dir: &Path) -> (ResourceList, ResourceList) {
    let mut capacity = ResourceList::new();
    let mut allocatable = ResourceList::new();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    capacity.insert(CPU.into(), Quantity(cpus.to_string()));
    allocatable.insert(CPU.into(), Quantity(cpus.to_string()));
    match std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| parse_meminfo(&text))
    {
        Some((total, available)) => {
            capacity.insert(MEMORY.into(), bytes_quantity(total));
            allocatable.insert(MEMORY.into(), bytes_quantity(available));
        }
        None => tracing::warn!("cannot read MemTotal/MemAvailable from /proc/meminfo"),
    }
    match disk_space(data_dir) {
        Ok((total, available)) => {
            capacity.insert(EPHEMERAL_STORAGE.into(), bytes_quantity(total));
            allocatable.insert(EPHEMERAL_STORAGE.into(), bytes_quantity(available));
        }
        Err(error) => {
            tracing::warn!(%error, dir = %data_dir.display(), "cannot stat the data directory's file system")
        }
    }
    if let Some(gpus) = nvidia_gpus().await {
        capacity.insert(NVIDIA_GPU.into(), Quantity(gpus.to_string()));
        allocatable.insert(NVIDIA_GPU.into(), Quantity(gpus.to_string()));
    }
    (capacity, allocatable)
}

/// `MemTotal` and `MemAvailable` of `/proc/meminfo`, in bytes.
pub fn parse_meminfo(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let rest = line[name.len()..].trim_start_matches(':').trim();
        let (number, unit) = rest.split_once(' ').unwrap_or((rest, ""));
        let value: u64 = number.trim().parse().ok()?;
        match unit.trim() {
            "kB" | "KiB" => value.checked_mul(1024),
            "" | "B" => Some(value),
            _ => None,
        }
    };
    Some((field("MemTotal")?, field("MemAvailable")?))
}

/// A byte count as a Kubernetes quantity, in the largest binary unit that divides it
/// exactly (`16Gi`, `16384Mi`, `1536Ki`, `100`).
pub fn bytes_quantity(bytes: u64) -> Quantity {
    const UNITS: [(&str, u64); 4] = [
        ("Ti", 1 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ];
    for (suffix, size) in UNITS {
        if bytes >= size && bytes.is_multiple_of(size) {
            return Quantity(format!("{}{suffix}", bytes / size));
        }
    }
    Quantity(bytes.to_string())
}

/// (size, space available to unprivileged users) of the file system holding `dir` (or its
/// nearest existing ancestor), in bytes.
fn disk_space(dir: &Path) -> Result<(u64, u64), nix::Error> {
    let mut path: PathBuf = dir.to_path_buf();
    while !path.exists() {
        match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => path = parent.to_path_buf(),
            _ => {
                path = PathBuf::from(".");
                break;
            }
        }
    }
    let stat = nix::sys::statvfs::statvfs(&path)?;
    // `c_ulong` and `fsblkcnt_t` are 32 bits wide on some targets.
    #[allow(clippy::useless_conversion)]
    let (unit, blocks, available) = (
        u64::from(stat.fragment_size()),
        u64::from(stat.blocks()),
        u64::from(stat.blocks_available()),
    );
    Ok((blocks.saturating_mul(unit), available.saturating_mul(unit)))
}

/// Number of NVIDIA GPUs (`nvidia-smi -L`), or `None` without `nvidia-smi` or when it
/// fails.
async fn nvidia_gpus() -> Option<usize> {
    let binary = find_in_path("nvidia-smi")?;
    let run = tokio::process::Command::new(&binary)
        .arg("-L")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(NVIDIA_SMI_TIMEOUT, run).await {
        Ok(Ok(output)) if output.status.success() => {
            Some(count_gpus(&String::from_utf8_lossy(&output.stdout)))
        }
        Ok(Ok(output)) => {
            tracing::warn!(status = %output.status, stderr = %String::from_utf8_lossy(&output.stderr).trim(), "nvidia-smi -L failed: no GPUs reported");
            None
        }
        Ok(Err(error)) => {
            tracing::warn!(%error, binary = %binary.display(), "cannot run nvidia-smi: no GPUs reported");
            None
        }
        Err(_) => {
            tracing::warn!(timeout = ?NVIDIA_SMI_TIMEOUT, "nvidia-smi -L hung: no GPUs reported");
            None
        }
    }
}

/// GPUs listed by `nvidia-smi -L` (one `GPU <n>: ...` line each; MIG lines are indented).
pub fn count_gpus(listing: &str) -> usize {
    listing.lines().filter(|l| l.starts_with("GPU ")).count()
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Kernel, OS, architecture (Kubernetes' spelling: `amd64`, `arm64`) and agent version.
pub fn node_info() -> NodeInfo {
    let kernel = nix::sys::utsname::uname()
        .ok()
        .map(|u| u.release().to_string_lossy().into_owned());
    NodeInfo {
        architecture: Some(kube_arch(std::env::consts::ARCH).into()),
        kernel_version: kernel,
        agent_version: Some(env!("CARGO_PKG_VERSION").into()),
        operating_system: Some(std::env::consts::OS.into()),
    }
}

/// Rust's architecture name in Go's spelling, as Kubernetes reports it.
fn kube_arch(arch: &str) -> &str {
    match arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// The local address this host uses to reach `server` (`https://HOST:PORT`): a UDP socket
/// is "connected" to it, which sends nothing.
async fn local_ip_towards(server: &str) -> Option<IpAddr> {
    let (host, port) = crate::config::parse_server_url(server).ok()?;
    let remote = tokio::net::lookup_host((host.as_str(), port))
        .await
        .ok()?
        .next()?;
    let bind: std::net::SocketAddr = if remote.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = tokio::net::UdpSocket::bind(bind).await.ok()?;
    socket.connect(remote).await.ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then_some(ip)
}

/// Counters of the heartbeat loop (shared with the metrics registry).
#[derive(Clone, Debug, Default)]
pub struct HeartbeatCounters {
    /// Heartbeats written (Lease and status).
    pub beats: Counter,
    /// Heartbeats (or registrations) that failed.
    pub failures: Counter,
}

/// Registers the Node and keeps its heartbeats.
#[derive(Clone)]
pub struct NodeReporter {
    client: kube::Client,
    cluster_id: String,
    namespace: String,
    node: NodeDescription,
    lease_duration_seconds: i32,
    counters: HeartbeatCounters,
}

impl std::fmt::Debug for NodeReporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeReporter")
            .field("namespace", &self.namespace)
            .field("node", &self.node.name)
            .finish_non_exhaustive()
    }
}

impl NodeReporter {
    /// A reporter of `node` for cluster `cluster_id`, renewing every `heartbeat_interval`
    /// (the Lease lasts 4 intervals, at least [`MIN_LEASE_DURATION`]).
    pub fn new(
        client: kube::Client,
        cluster_id: &str,
        node: NodeDescription,
        heartbeat_interval: Duration,
    ) -> Self {
        let lease = (heartbeat_interval * 4).max(MIN_LEASE_DURATION);
        NodeReporter {
            client,
            cluster_id: cluster_id.to_string(),
            namespace: rlark_api::names::agent_namespace(cluster_id),
            node,
            lease_duration_seconds: i32::try_from(lease.as_secs_f64().ceil() as u64)
                .unwrap_or(i32::MAX),
            counters: HeartbeatCounters::default(),
        }
    }

    /// Count heartbeats in `counters`.
    pub fn with_counters(mut self, counters: HeartbeatCounters) -> Self {
        self.counters = counters;
        self
    }

    /// What the Node reports.
    pub fn node(&self) -> &NodeDescription {
        &self.node
    }

    /// The Node's name.
    pub fn node_name(&self) -> &str {
        &self.node.name
    }

    fn nodes(&self) -> Api<Node> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Create the Node (or update its labels and agent type), report its status (resources
    /// it no longer has are removed) and renew its Lease.
    pub async fn register(&self) -> Result<(), NodeError> {
        let api = self.nodes();
        let name = &self.node.name;
        let object = self.node.to_node(&self.cluster_id);
        let register_err = |source| NodeError::Register {
            node: name.clone(),
            namespace: self.namespace.clone(),
            source,
        };
        let current = match api.create(&PostParams::default(), &object).await {
            Ok(node) => node,
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let patch = json!({
                    "metadata": {"labels": object.metadata.labels},
                    "spec": {"agentType": self.node.agent_type.as_str()},
                });
                match api
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(node) => node,
                    // Not ours: the name is another cluster's Node (Node names are unique
                    // across the installation). Report the server's refusal, which names
                    // the holder, not the 404.
                    Err(kube::Error::Api(missing)) if missing.code == 404 => {
                        return Err(register_err(kube::Error::Api(s)));
                    }
                    Err(e) => return Err(register_err(e)),
                }
            }
            Err(e) => return Err(register_err(e)),
        };
        let status = self.node.status(Timestamp::now());
        let mut value = json!({ "status": status });
        // A merge patch keeps map keys it does not mention: drop resources that are gone.
        if let Some(old) = current.status.as_ref() {
            for (field, old_list, new_list) in [
                ("capacity", &old.capacity, &status.capacity),
                ("allocatable", &old.allocatable, &status.allocatable),
            ] {
                // Device resources are the device reporter's (`crate::devices`).
                for gone in old_list.keys().filter(|k| {
                    !new_list.contains_key(*k) && !crate::devices::inventory::is_device_key(k)
                }) {
                    value["status"][field][gone] = serde_json::Value::Null;
                }
            }
        }
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&value))
            .await
            .map_err(register_err)?;
        self.renew_lease().await?;
        tracing::info!(node = %name, namespace = %self.namespace, capacity = ?self.node.capacity, "node registered");
        Ok(())
    }

    /// Renew the Lease `node-<name>` (created when missing).
    pub async fn renew_lease(&self) -> Result<(), NodeError> {
        renew_node_lease(&self.leases(), &self.node.name, self.lease_duration_seconds)
            .await
            .map_err(|source| NodeError::Lease {
                node: self.node.name.clone(),
                source,
            })
    }

    /// One heartbeat: the Lease, then `status.phase: Online` and `heartbeatTime`.
    pub async fn beat(&self) -> Result<(), NodeError> {
        self.renew_lease().await?;
        let patch = json!({"status": {
            "phase": NodePhase::Online.as_str(),
            "heartbeatTime": Time(Timestamp::now()),
        }});
        self.nodes()
            .patch_status(
                &self.node.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|source| NodeError::Status {
                node: self.node.name.clone(),
                source,
            })?;
        Ok(())
    }

    /// Heartbeat every `interval` until `shutdown`, the first one an interval from now (the
    /// caller has just tried [`NodeReporter::register`]). `registered`: whether that
    /// succeeded; if not (or when the Node disappears), the loop registers it first.
    /// Failures are logged and retried at the next tick.
    pub async fn run(self, interval: Duration, registered: bool, shutdown: CancellationToken) {
        let mut registered = registered;
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The caller's registration (successful or not) was the first beat.
        ticker.tick().await;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let step = async {
                if !registered {
                    return self.register().await.map(|()| true);
                }
                match self.beat().await {
                    Err(error @ NodeError::Status { .. }) if error.status_code() == Some(404) => {
                        tracing::warn!(node = %self.node.name, "node deleted: registering it again");
                        self.register().await.map(|()| true)
                    }
                    other => other.map(|()| true),
                }
            };
            let result = tokio::select! {
                () = shutdown.cancelled() => return,
                result = step => result,
            };
            match result {
                Ok(_) => {
                    registered = true;
                    self.counters.beats.inc();
                }
                Err(error) => {
                    self.counters.failures.inc();
                    if matches!(error, NodeError::Register { .. }) {
                        registered = false;
                    }
                    tracing::warn!(%error, node = %self.node.name, "heartbeat failed; retrying at the next interval");
                }
            }
        }
    }
}

/// Renew the heartbeat Lease `node-<node>` in `leases`' namespace, creating it when missing:
/// a merge patch of `holderIdentity`, `leaseDurationSeconds` and `renewTime`, or a create
/// with `acquireTime` too. A create that loses a race (409) counts as done: the next beat
/// renews it. This is the agent protocol's heartbeat (the simulated agent, `rlark_sim`,
/// uses it as well).
pub async fn renew_node_lease(
    leases: &Api<Lease>,
    node: &str,
    lease_duration_seconds: i32,
) -> Result<(), kube::Error> {
    let name = rlark_api::agent::lease_name(node);
    let spec = rlark_api::agent::lease_spec(node, lease_duration_seconds, Timestamp::now());
    let patch = json!({ "spec": spec });
    match leases
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    acquire_time: spec.renew_time.clone(),
                    ..spec
                }),
            };
            match leases.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rlark_api::labels;
    use rlark_api::types::{AgentType, NodeCategory};

    use super::*;

    #[test]
    fn meminfo_is_parsed_in_bytes() {
        let text = "MemTotal:       16384000 kB\nMemFree:  1 kB\nMemAvailable:    8192000 kB\n";
        assert_eq!(
            parse_meminfo(text),
            Some((16_384_000 * 1024, 8_192_000 * 1024))
        );
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
        assert_eq!(parse_meminfo(""), None);
    }

    #[test]
    fn bytes_are_kubernetes_quantities() {
        assert_eq!(bytes_quantity(16 << 30), Quantity("16Gi".into()));
        assert_eq!(bytes_quantity(16384 << 20), Quantity("16Gi".into()));
        assert_eq!(bytes_quantity(1536 << 20), Quantity("1536Mi".into()));
        assert_eq!(bytes_quantity(1536 << 10), Quantity("1536Ki".into()));
        assert_eq!(bytes_quantity(100), Quantity("100".into()));
        assert_eq!(bytes_quantity(0), Quantity("0".into()));
        for q in [16u64 << 30, 1536 << 20, 12345] {
            let parsed = rlark_api::quantity::parse_quantity(&bytes_quantity(q).0)
                .expect("valid quantity")
                .value();
            assert_eq!(parsed, Some(i128::from(q)));
        }
    }

    #[test]
    fn gpus_are_counted_from_nvidia_smi() {
        let listing = "GPU 0: NVIDIA A100 (UUID: GPU-1)\n  MIG 1g.5gb Device 0: (UUID: MIG-1)\nGPU 1: NVIDIA A100 (UUID: GPU-2)\n";
        assert_eq!(count_gpus(listing), 2);
        assert_eq!(count_gpus(""), 0);
    }

    #[test]
    fn nodes_carry_the_protocol_labels() {
        let node = NodeDescription {
            name: "host-1".into(),
            category: NodeCategory::Edge,
            labels: BTreeMap::from([("zone".to_string(), "lab".to_string())]),
            capacity: ResourceList::from([(CPU.to_string(), Quantity("4".into()))]),
            allocatable: ResourceList::from([(CPU.to_string(), Quantity("4".into()))]),
            node_info: node_info(),
            addresses: vec![],
            network: None,
            agent_type: AgentType::Raw,
        };
        let object = node.to_node("c1");
        assert_eq!(object.metadata.namespace.as_deref(), Some("rlark-c1"));
        let l = object.metadata.labels.clone().unwrap_or_default();
        assert_eq!(l[labels::CLUSTER_ID], "c1");
        assert_eq!(l[labels::HOSTNAME], "host-1");
        assert_eq!(l[labels::NODE_CATEGORY], "edge");
        assert_eq!(l[labels::AGENT_TYPE], "Raw");
        assert_eq!(l["zone"], "lab");
        assert_eq!(object.spec.agent_type, AgentType::Raw);
        let status = node.status(Timestamp::UNIX_EPOCH);
        assert_eq!(status.phase, Some(NodePhase::Online));
        assert_eq!(
            status.reason.as_deref(),
            Some(rlark_api::agent::REASON_AGENT_READY)
        );
        assert!(status.heartbeat_time.is_some());
        let info = status.node_info.expect("node info");
        assert_eq!(info.operating_system.as_deref(), Some(std::env::consts::OS));
        assert!(info.agent_version.is_some());
    }

    #[tokio::test]
    async fn this_machine_has_cpus_memory_and_disk() {
        let dir = std::env::temp_dir().join("rlark-agent-missing-dir/sub");
        let (capacity, allocatable) = detect_resources(&dir).await;
        for list in [&capacity, &allocatable] {
            for name in [CPU, MEMORY, EPHEMERAL_STORAGE] {
                let q = list
                    .get(name)
                    .unwrap_or_else(|| panic!("{name} in {list:?}"));
                let v = rlark_api::quantity::parse_quantity(&q.0).expect("quantity");
                assert!(v.value().is_some_and(|v| v > 0), "{name} = {q:?}");
            }
        }
    }

    #[test]
    fn permanent_errors_are_client_errors() {
        let api = |code| NodeError::Lease {
            node: "n".into(),
            source: kube::Error::Api(
                kube::core::Status::failure("x", "Forbidden")
                    .with_code(code)
                    .boxed(),
            ),
        };
        assert!(api(403).is_permanent());
        assert!(api(422).is_permanent());
        assert!(!api(404).is_permanent());
        assert!(!api(409).is_permanent());
        assert!(!api(503).is_permanent());
    }
}
