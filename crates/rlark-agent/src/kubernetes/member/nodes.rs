//! Node mirroring of the Kubernetes runtime (docs/tasks.md, "Member nodes"): every Node
//! of the member cluster is an rlark Node of the same name in `rlark-<clusterID>`, so
//! placement sees the real cluster, and `rlark cordon` of such a Node cordons the member
//! node.
//!
//! - [`mirror`] (pure): a member Node (plus the requests of the member Pods on it) → the
//!   rlark Node's labels, spec and status;
//! - [`cordon_action`] (pure): what the member node needs so that it is cordoned exactly
//!   when the rlark Node is;
//! - [`NodeMirror::run`]: watches the member's Nodes and Pods and the rlark Nodes, and on
//!   every change and every heartbeat interval writes the rlark Nodes, renews their
//!   Leases (so the Node controller keeps them `Online`), deletes the rlark Nodes whose
//!   member node is gone and pushes cordons down.
//!
//! Phase: `Online` (reason [`REASON_MEMBER_NODE_READY`]) while the member node's `Ready`
//! condition is `True` and nobody but rlark cordoned it; otherwise `Offline` with
//! [`REASON_MEMBER_NODE_NOT_READY`] or [`REASON_MEMBER_NODE_UNSCHEDULABLE`], so placement
//! skips it. The Lease is renewed either way: the agent is alive, and the Node controller
//! leaves an `Offline` with the agent's own reason to the agent.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node as MemberNode, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use rlark_api::labels;
use rlark_api::quantity::{QuantityValue, parse_quantity};
use rlark_api::types::{
    AgentType, Node, NodeCategory, NodeInfo, NodePhase, NodeSpec, NodeStatus, ResourceList,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::node::renew_node_lease;

/// Annotation rlark puts on a member node it cordoned (value `"true"`): rlark uncordons
/// only member nodes that carry it, never one a member admin cordoned.
pub const CORDONED_BY_RLARK_ANNOTATION: &str = "rlark.io/cordoned";
/// `status.reason` of a mirrored Node whose member node is Ready.
pub const REASON_MEMBER_NODE_READY: &str = "MemberNodeReady";
/// `status.reason` of a mirrored Node whose member node is not Ready (`Offline`).
pub const REASON_MEMBER_NODE_NOT_READY: &str = "MemberNodeNotReady";
/// `status.reason` of a mirrored Node whose member node was cordoned on the member
/// cluster (`spec.unschedulable` not set by rlark): `Offline`.
pub const REASON_MEMBER_NODE_UNSCHEDULABLE: &str = "MemberNodeUnschedulable";
/// How long a burst of watch events is collected before one sync.
const DEBOUNCE: Duration = Duration::from_millis(50);

/// What the mirrored Nodes say about the agent, beyond what the member nodes say.
#[derive(Clone, Debug, PartialEq)]
pub struct MirrorConfig {
    /// This agent's cluster ID: the Nodes go to `rlark-<clusterID>`.
    pub cluster_id: String,
    /// `rlark.io/node-category` of every mirrored Node.
    pub category: NodeCategory,
    /// Labels added to every mirrored Node (the agent's `--label`s); the member node's own
    /// labels win over them, and the protocol labels win over both.
    pub labels: BTreeMap<String, String>,
    /// How often the Nodes' Leases and statuses are renewed (the Lease lasts 4 intervals,
    /// at least [`crate::node::MIN_LEASE_DURATION`]).
    pub heartbeat_interval: Duration,
    /// The agent's own Node (`--node-name`), which the agent registers and cordons itself:
    /// the mirror never writes nor deletes it, and a member node of the same name is not
    /// mirrored (a warning says so) — its cordon would otherwise be pushed down.
    pub agent_node: Option<String>,
    /// Whether the member serves OpenKruise's CloneSet: the Nodes then carry
    /// [`labels::SERVES_CLONESET`]`=true`, the only ones a CloneSet task is placed on.
    pub serves_cloneset: bool,
}

/// An rlark Node as mirrored from a member node: what [`NodeMirror`] writes.
#[derive(Clone, Debug, PartialEq)]
pub struct Mirrored {
    /// Node name (the member node's).
    pub name: String,
    /// Every label of the rlark Node.
    pub labels: BTreeMap<String, String>,
    /// The status, without `heartbeatTime` (the writer stamps it).
    pub status: NodeStatus,
}

impl Mirrored {
    /// The rlark Node object to create (metadata and spec).
    pub fn to_node(&self, cluster_id: &str) -> Node {
        let mut node = Node::new(
            &self.name,
            NodeSpec {
                agent_type: AgentType::Kubernetes,
                unschedulable: false,
            },
        );
        node.metadata.namespace = Some(rlark_api::names::agent_namespace(cluster_id));
        node.metadata.labels = Some(self.labels.clone());
        node
    }
}

/// Whether the member node's condition `kind` has status `True`.
fn condition_true(member: &MemberNode, kind: &str) -> Option<bool> {
    member
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| c.status == "True")
}

/// Whether rlark cordoned `member` (it carries [`CORDONED_BY_RLARK_ANNOTATION`]).
pub fn cordoned_by_rlark(member: &MemberNode) -> bool {
    member
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CORDONED_BY_RLARK_ANNOTATION))
        .is_some_and(|v| v == "true")
}

fn member_unschedulable(member: &MemberNode) -> bool {
    member
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// The rlark Node mirroring `member` (pure). `used`: the requests of the member Pods
/// bound to it ([`used_by_node`]). `None` for a member node without a name.
///
/// Labels: `config.labels`, then the member node's labels (`nvidia.com/gpu.product`,
/// zones, instance types, ... — whatever a Task's `nodeSelector` may name, since the
/// runtime hands the same selector to the member scheduler), then the protocol labels
/// (`rlark.io/cluster-id`, `kubernetes.io/hostname` = the name, `rlark.io/node-category`,
/// `rlark.io/agent-type=Kubernetes`, and `rlark.io/serves-cloneset=true` where the member
/// serves OpenKruise's CloneSet, never otherwise). Status: phase and reason (module documentation),
/// `capacity` and `allocatable` as the member reports them, `used`, `addresses`,
/// `nodeInfo` (architecture, kernel, OS; `agentVersion` is this agent's) and
/// `diskPressure` from the `DiskPressure` condition.
pub fn mirror(member: &MemberNode, used: &ResourceList, config: &MirrorConfig) -> Option<Mirrored> {
    let name = member.metadata.name.clone().filter(|n| !n.is_empty())?;
    let mut all = config.labels.clone();
    if let Some(own) = &member.metadata.labels {
        all.extend(own.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    all.insert(labels::CLUSTER_ID.into(), config.cluster_id.clone());
    all.insert(labels::HOSTNAME.into(), name.clone());
    all.insert(
        labels::NODE_CATEGORY.into(),
        config.category.as_str().into(),
    );
    all.insert(
        labels::AGENT_TYPE.into(),
        AgentType::Kubernetes.as_str().into(),
    );
    if config.serves_cloneset {
        all.insert(labels::SERVES_CLONESET.into(), "true".into());
    } else {
        all.remove(labels::SERVES_CLONESET);
    }
    let (phase, reason) = if condition_true(member, "Ready") != Some(true) {
        (NodePhase::Offline, REASON_MEMBER_NODE_NOT_READY)
    } else if member_unschedulable(member) && !cordoned_by_rlark(member) {
        (NodePhase::Offline, REASON_MEMBER_NODE_UNSCHEDULABLE)
    } else {
        (NodePhase::Online, REASON_MEMBER_NODE_READY)
    };
    let member_status = member.status.clone().unwrap_or_default();
    let info = member_status.node_info.as_ref();
    let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
    let status = NodeStatus {
        phase: Some(phase),
        reason: Some(reason.into()),
        node_info: Some(NodeInfo {
            architecture: info.and_then(|i| non_empty(&i.architecture)),
            kernel_version: info.and_then(|i| non_empty(&i.kernel_version)),
            agent_version: Some(env!("CARGO_PKG_VERSION").into()),
            operating_system: info.and_then(|i| non_empty(&i.operating_system)),
        }),
        addresses: member_status.addresses.unwrap_or_default(),
        disk_pressure: condition_true(member, "DiskPressure"),
        capacity: member_status.capacity.unwrap_or_default(),
        allocatable: member_status.allocatable.unwrap_or_default(),
        used: used.clone(),
        ..Default::default()
    };
    Some(Mirrored {
        name,
        labels: all,
        status,
    })
}

/// What a Pod requests of its node (pure), as the member scheduler counts it: per
/// resource, the larger of the sum over its containers and the largest init container,
/// plus `spec.overhead`. Unparsable quantities are skipped.
pub fn pod_requests(pod: &Pod) -> BTreeMap<String, QuantityValue> {
    let Some(spec) = &pod.spec else {
        return BTreeMap::new();
    };
    let requests = |c: &k8s_openapi::api::core::v1::Container| -> BTreeMap<String, QuantityValue> {
        c.resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .map(|r| {
                r.iter()
                    .filter_map(|(k, q)| Some((k.clone(), parse_quantity(&q.0).ok()?)))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut total: BTreeMap<String, QuantityValue> = BTreeMap::new();
    for container in &spec.containers {
        add_into(&mut total, &requests(container));
    }
    for init in spec.init_containers.iter().flatten() {
        for (name, value) in requests(init) {
            let slot = total.entry(name).or_insert(QuantityValue::ZERO);
            if value > *slot {
                *slot = value;
            }
        }
    }
    if let Some(overhead) = &spec.overhead {
        let overhead: BTreeMap<String, QuantityValue> = overhead
            .iter()
            .filter_map(|(k, q)| Some((k.clone(), parse_quantity(&q.0).ok()?)))
            .collect();
        add_into(&mut total, &overhead);
    }
    total
}

fn add_into(total: &mut BTreeMap<String, QuantityValue>, more: &BTreeMap<String, QuantityValue>) {
    for (name, value) in more {
        let slot = total.entry(name.clone()).or_insert(QuantityValue::ZERO);
        if let Some(sum) = slot.checked_add(*value) {
            *slot = sum;
        }
    }
}

/// The requests of the Pods bound to each node (pure): Pods with a `spec.nodeName` that
/// are not `Succeeded` or `Failed` (the kubelet released what those held).
pub fn used_by_node<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> BTreeMap<String, ResourceList> {
    let mut sums: BTreeMap<String, BTreeMap<String, QuantityValue>> = BTreeMap::new();
    for pod in pods {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        add_into(sums.entry(node).or_default(), &pod_requests(pod));
    }
    sums.into_iter()
        .map(|(node, sum)| {
            let list = sum.into_iter().map(|(k, v)| (k, quantity(v))).collect();
            (node, list)
        })
        .collect()
}

/// The image pulls of the Pods bound to each node while they are Pending (pure): per Pod,
/// [`crate::kubernetes::status::pull_progress`] without the images already there
/// (`Done`), so a node lists what it is pulling and what failed to pull (`Failed`,
/// `BackOff` with the kubelet's message). Kubernetes reports no byte counts: `downloaded`,
/// `total` and `speed` are 0.
pub fn pulls_by_node<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
) -> BTreeMap<String, Vec<rlark_api::types::PullProgress>> {
    let mut pulls: BTreeMap<String, Vec<rlark_api::types::PullProgress>> = BTreeMap::new();
    for pod in pods {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        let pending = crate::kubernetes::status::pull_progress(pod)
            .into_iter()
            .filter(|p| p.status != "Done");
        let list = pulls.entry(node).or_default();
        for pull in pending {
            if !list.contains(&pull) {
                list.push(pull);
            }
        }
    }
    pulls.retain(|_, list| !list.is_empty());
    pulls
}

/// `value` as Kubernetes writes it: whole numbers of bytes in binary units (`4Gi`),
/// other whole numbers plain (`2`), fractions in thousandths (`1500m`), else a decimal.
pub fn quantity(value: QuantityValue) -> Quantity {
    let whole = value
        .value()
        .filter(|v| value.milli_value() == v.checked_mul(1000) && !value.is_negative());
    if let Some(v) = whole.and_then(|v| u64::try_from(v).ok()) {
        return crate::node::bytes_quantity(v);
    }
    match value.milli_value() {
        Some(m) if QuantityValue::new(m, -3).is_some_and(|n| n.cmp(&value).is_eq()) => {
            Quantity(format!("{m}m"))
        }
        _ => Quantity(value.to_string()),
    }
}

/// A change to the member node that makes its cordon follow the rlark Node's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CordonAction {
    /// Set `spec.unschedulable` and [`CORDONED_BY_RLARK_ANNOTATION`].
    Cordon,
    /// Clear both (only on a member node rlark cordoned).
    Uncordon,
}

impl CordonAction {
    /// The merge patch of the member node.
    pub fn patch(self) -> Value {
        match self {
            CordonAction::Cordon => json!({
                "metadata": {"annotations": {CORDONED_BY_RLARK_ANNOTATION: "true"}},
                "spec": {"unschedulable": true},
            }),
            CordonAction::Uncordon => json!({
                "metadata": {"annotations": {CORDONED_BY_RLARK_ANNOTATION: null}},
                "spec": {"unschedulable": null},
            }),
        }
    }
}

/// What `member` needs when its rlark Node's `spec.unschedulable` is `rlark_cordoned`
/// (pure). A member node already unschedulable is not cordoned again (its admin's cordon
/// stays theirs); only rlark's own cordon is undone.
pub fn cordon_action(rlark_cordoned: bool, member: &MemberNode) -> Option<CordonAction> {
    let unschedulable = member_unschedulable(member);
    let ours = cordoned_by_rlark(member);
    match (rlark_cordoned, unschedulable, ours) {
        (true, false, _) => Some(CordonAction::Cordon),
        (false, true, true) => Some(CordonAction::Uncordon),
        // Uncordoned by its admin while rlark's annotation stayed: drop the annotation.
        (false, false, true) => Some(CordonAction::Uncordon),
        _ => None,
    }
}

/// Failures of one mirroring pass, named by the failed step.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error("list rlark nodes in {namespace}: {source}")]
    List {
        namespace: String,
        source: kube::Error,
    },
    #[error("write rlark node {namespace}/{node}: {source}")]
    Write {
        namespace: String,
        node: String,
        source: kube::Error,
    },
    #[error("renew heartbeat lease of mirrored node {node}: {source}")]
    Lease { node: String, source: kube::Error },
    #[error("delete rlark node {namespace}/{node} (member node gone): {source}")]
    Delete {
        namespace: String,
        node: String,
        source: kube::Error,
    },
    #[error("cordon member node {node}: {source}")]
    Cordon { node: String, source: kube::Error },
    #[error("the member cluster's watches stopped before listing")]
    WatchStopped,
}

/// Counters of the mirror (shared with the metrics registry).
#[derive(Clone, Debug, Default)]
pub struct MirrorCounters {
    /// Passes that wrote every mirrored Node.
    pub syncs: Counter,
    /// Steps that failed (each is retried at the next pass).
    pub failures: Counter,
    /// Cordons and uncordons pushed to member nodes.
    pub cordons: Counter,
    /// Member nodes mirrored at the last pass.
    pub nodes: Gauge,
}

impl MirrorCounters {
    /// The counters, registered in `registry` (prefix `rlark_agent_member_node_mirror_`).
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> Self {
        let counters = Self::default();
        let sub = registry.sub_registry_with_prefix("rlark_agent_member_node_mirror");
        sub.register(
            "syncs",
            "Node mirror passes that wrote every mirrored Node",
            counters.syncs.clone(),
        );
        sub.register(
            "failures",
            "Node mirror steps that failed (retried at the next pass)",
            counters.failures.clone(),
        );
        sub.register(
            "cordons",
            "Cordons and uncordons pushed down to member nodes",
            counters.cordons.clone(),
        );
        sub.register(
            "nodes",
            "Member nodes mirrored at the last pass",
            counters.nodes.clone(),
        );
        counters
    }
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// rlark Nodes written (created or updated).
    pub written: Vec<String>,
    /// rlark Nodes deleted (their member node is gone).
    pub deleted: Vec<String>,
    /// Member nodes cordoned or uncordoned.
    pub cordoned: Vec<(String, CordonAction)>,
}

/// Mirrors the member cluster's Nodes as rlark Nodes (module documentation).
#[derive(Clone)]
pub struct NodeMirror {
    member: kube::Client,
    control: kube::Client,
    config: MirrorConfig,
    namespace: String,
    lease_duration_seconds: i32,
    counters: MirrorCounters,
}

impl std::fmt::Debug for NodeMirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeMirror")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl NodeMirror {
    /// A mirror reading the member cluster through `member` and writing rlark Nodes and
    /// Leases through `control` (the agent's client of the control plane).
    pub fn new(member: kube::Client, control: kube::Client, config: MirrorConfig) -> Self {
        let lease = (config.heartbeat_interval * 4).max(crate::node::MIN_LEASE_DURATION);
        NodeMirror {
            member,
            control,
            namespace: rlark_api::names::agent_namespace(&config.cluster_id),
            lease_duration_seconds: i32::try_from(lease.as_secs_f64().ceil() as u64)
                .unwrap_or(i32::MAX),
            config,
            counters: MirrorCounters::default(),
        }
    }

    /// Count passes in `counters`.
    pub fn with_counters(mut self, counters: MirrorCounters) -> Self {
        self.counters = counters;
        self
    }

    /// One pass over `members` (every member node) and `pods` (every member Pod): write
    /// the rlark Nodes, renew their Leases, push cordons down, delete the rlark Nodes of
    /// this agent type whose member node is gone. Every step is attempted; the first
    /// failure is returned after the others ran.
    pub async fn sync(
        &self,
        members: &[MemberNode],
        pods: &[Pod],
    ) -> Result<SyncReport, MirrorError> {
        let nodes: Api<Node> = Api::namespaced(self.control.clone(), &self.namespace);
        let leases: Api<Lease> = Api::namespaced(self.control.clone(), &self.namespace);
        let member_api: Api<MemberNode> = Api::all(self.member.clone());
        let selector = format!("{}={}", labels::AGENT_TYPE, AgentType::Kubernetes.as_str());
        let current: BTreeMap<String, Node> = nodes
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|source| MirrorError::List {
                namespace: self.namespace.clone(),
                source,
            })?
            .items
            .into_iter()
            .filter_map(|n| Some((n.metadata.name.clone()?, n)))
            .collect();
        let used = used_by_node(pods);
        let pulls = pulls_by_node(pods);
        let empty = ResourceList::new();
        let mut report = SyncReport::default();
        let mut first_error: Option<MirrorError> = None;
        let mut keep = |result: Result<(), MirrorError>, counters: &MirrorCounters| {
            if let Err(error) = result {
                counters.failures.inc();
                tracing::warn!(%error, "node mirroring step failed; retrying at the next pass");
                if first_error.is_none() {
                    first_error = Some(error);
                }
            }
        };
        let mut mirrored = BTreeSet::new();
        for member in members {
            let name = member.metadata.name.as_deref().unwrap_or_default();
            if self.config.agent_node.as_deref() == Some(name) {
                tracing::warn!(
                    node = name,
                    "a member node has the agent's own --node-name: not mirrored (give the agent another --node-name)"
                );
                continue;
            }
            let Some(mut desired) = mirror(
                member,
                used.get(member.metadata.name.as_deref().unwrap_or_default())
                    .unwrap_or(&empty),
                &self.config,
            ) else {
                continue;
            };
            desired.status.pull_progress = pulls.get(&desired.name).cloned().unwrap_or_default();
            mirrored.insert(desired.name.clone());
            let existing = current.get(&desired.name);
            let written = self.write(&nodes, &desired, existing).await;
            let ok = written.is_ok();
            keep(written, &self.counters);
            if !ok {
                continue;
            }
            report.written.push(desired.name.clone());
            let lease = renew_node_lease(&leases, &desired.name, self.lease_duration_seconds)
                .await
                .map_err(|source| MirrorError::Lease {
                    node: desired.name.clone(),
                    source,
                });
            keep(lease, &self.counters);
            let rlark_cordoned = existing.is_some_and(|n| n.spec.unschedulable);
            if let Some(action) = cordon_action(rlark_cordoned, member) {
                let pushed = member_api
                    .patch(
                        &desired.name,
                        &PatchParams::default(),
                        &Patch::Merge(&action.patch()),
                    )
                    .await
                    .map(|_| ())
                    .map_err(|source| MirrorError::Cordon {
                        node: desired.name.clone(),
                        source,
                    });
                if pushed.is_ok() {
                    self.counters.cordons.inc();
                    tracing::info!(node = %desired.name, ?action, "member node cordon follows the rlark node");
                    report.cordoned.push((desired.name.clone(), action));
                }
                keep(pushed, &self.counters);
            }
        }
        let agent_node = self.config.agent_node.as_deref();
        for gone in current
            .keys()
            .filter(|n| !mirrored.contains(*n) && Some(n.as_str()) != agent_node)
        {
            let deleted = match nodes.delete(gone, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(source) => Err(MirrorError::Delete {
                    namespace: self.namespace.clone(),
                    node: gone.clone(),
                    source,
                }),
            };
            if deleted.is_ok() {
                // The Lease goes with it; a failure here only leaves a stale Lease.
                let lease = rlark_api::agent::lease_name(gone);
                if let Err(error) = leases.delete(&lease, &DeleteParams::default()).await
                    && !matches!(&error, kube::Error::Api(s) if s.code == 404)
                {
                    tracing::warn!(%error, node = %gone, "cannot delete the lease of a deleted mirrored node");
                }
                tracing::info!(node = %gone, namespace = %self.namespace, "member node gone: rlark node deleted");
                report.deleted.push(gone.clone());
            }
            keep(deleted, &self.counters);
        }
        self.counters
            .nodes
            .set(i64::try_from(mirrored.len()).unwrap_or(i64::MAX));
        match first_error {
            Some(error) => Err(error),
            None => {
                self.counters.syncs.inc();
                Ok(report)
            }
        }
    }

    /// Create or update one rlark Node (labels, agent type, status stamped now).
    async fn write(
        &self,
        nodes: &Api<Node>,
        desired: &Mirrored,
        existing: Option<&Node>,
    ) -> Result<(), MirrorError> {
        let write_err = |source| MirrorError::Write {
            namespace: self.namespace.clone(),
            node: desired.name.clone(),
            source,
        };
        let current = match existing {
            Some(node) => {
                let mut labels_patch = serde_json::Map::new();
                for (k, v) in &desired.labels {
                    labels_patch.insert(k.clone(), json!(v));
                }
                // Labels the member node no longer has go (a merge patch keeps the others).
                for gone in node.metadata.labels.iter().flatten().map(|(k, _)| k) {
                    if !desired.labels.contains_key(gone) {
                        labels_patch.insert(gone.clone(), Value::Null);
                    }
                }
                let changed = node.metadata.labels.as_ref() != Some(&desired.labels)
                    || node.spec.agent_type != AgentType::Kubernetes;
                if changed {
                    let patch = json!({
                        "metadata": {"labels": labels_patch},
                        "spec": {"agentType": AgentType::Kubernetes.as_str()},
                    });
                    nodes
                        .patch(
                            &desired.name,
                            &PatchParams::default(),
                            &Patch::Merge(&patch),
                        )
                        .await
                        .map_err(write_err)?
                } else {
                    node.clone()
                }
            }
            None => match nodes
                .create(
                    &PostParams::default(),
                    &desired.to_node(&self.config.cluster_id),
                )
                .await
            {
                Ok(node) => node,
                // Created by a pass that raced this one: update it at the next pass.
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    nodes.get(&desired.name).await.map_err(write_err)?
                }
                Err(e) => return Err(write_err(e)),
            },
        };
        let mut status = desired.status.clone();
        status.heartbeat_time = Some(Time(Timestamp::now()));
        let mut value = json!({ "status": status });
        // Resources the member node (or its Pods) no longer has or uses: dropped, since a
        // merge patch keeps map keys it does not mention. An empty `used` is omitted by
        // serde, so every old key of it is dropped.
        if let Some(old) = current.status.as_ref() {
            for (field, old_list, new_list) in [
                ("capacity", &old.capacity, &status.capacity),
                ("allocatable", &old.allocatable, &status.allocatable),
                ("used", &old.used, &status.used),
            ] {
                for gone in old_list.keys().filter(|k| !new_list.contains_key(*k)) {
                    value["status"][field][gone] = Value::Null;
                }
            }
            if old.disk_pressure.is_some() && status.disk_pressure.is_none() {
                value["status"]["diskPressure"] = Value::Null;
            }
            // An empty list is omitted by serde: the pulls that ended are cleared.
            if !old.pull_progress.is_empty() && status.pull_progress.is_empty() {
                value["status"]["pullProgress"] = Value::Null;
            }
        }
        nodes
            .patch_status(
                &desired.name,
                &PatchParams::default(),
                &Patch::Merge(&value),
            )
            .await
            .map_err(write_err)?;
        Ok(())
    }

    /// Mirror until `shutdown`: watch the member's Nodes and Pods and this agent's rlark
    /// Nodes (a cordon is pushed down at once), and pass over them on every change and
    /// every heartbeat interval. The first pass waits for the member watches' first list,
    /// so an agent that starts does not delete Nodes it has not seen yet. Failures are
    /// logged, counted and retried at the next pass.
    pub async fn run(self, shutdown: CancellationToken) {
        let wake = Arc::new(tokio::sync::Notify::new());
        let (member_nodes, node_writer) = reflector::store::<MemberNode>();
        let (member_pods, pod_writer) = reflector::store::<Pod>();
        let mut watches = tokio::task::JoinSet::new();
        {
            let wake = Arc::clone(&wake);
            let api: Api<MemberNode> = Api::all(self.member.clone());
            let stream =
                reflector(node_writer, watcher(api, watcher::Config::default())).default_backoff();
            watches.spawn(drive(stream, Some(wake), "member nodes"));
        }
        {
            // Pods only feed `used`: renewed at the next pass, no wake-up per Pod event.
            let api: Api<Pod> = Api::all(self.member.clone());
            let stream =
                reflector(pod_writer, watcher(api, watcher::Config::default())).default_backoff();
            watches.spawn(drive(stream, None, "member pods"));
        }
        {
            let wake = Arc::clone(&wake);
            let api: Api<Node> = Api::namespaced(self.control.clone(), &self.namespace);
            let config = watcher::Config::default().labels(&format!(
                "{}={}",
                labels::AGENT_TYPE,
                AgentType::Kubernetes.as_str()
            ));
            let stream = watcher(api, config).default_backoff();
            watches.spawn(drive(stream, Some(wake), "rlark nodes"));
        }
        let ready = async {
            member_nodes.wait_until_ready().await?;
            member_pods.wait_until_ready().await
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            result = ready => if result.is_err() {
                tracing::error!(error = %MirrorError::WatchStopped, "node mirroring stopped");
                return;
            },
        }
        let mut ticker = tokio::time::interval(self.config.heartbeat_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let members: Vec<MemberNode> =
                member_nodes.state().iter().map(|n| (**n).clone()).collect();
            let pods: Vec<Pod> = member_pods.state().iter().map(|p| (**p).clone()).collect();
            let pass = tokio::select! {
                () = shutdown.cancelled() => return,
                result = self.sync(&members, &pods) => result,
            };
            match pass {
                Ok(report) if !report.deleted.is_empty() || !report.cordoned.is_empty() => {
                    tracing::debug!(?report, "node mirroring pass");
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "node mirroring pass incomplete"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
                () = wake.notified() => tokio::time::sleep(DEBOUNCE).await,
            }
        }
    }
}

/// Poll a watch stream until it ends, waking `wake` (if any) on every event.
async fn drive<S, T>(stream: S, wake: Option<Arc<tokio::sync::Notify>>, what: &'static str)
where
    S: futures::Stream<Item = Result<T, watcher::Error>> + Send,
{
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        if let Err(error) = event {
            tracing::debug!(%error, watch = what, "watch error; retrying with backoff");
        }
        if let Some(wake) = &wake {
            wake.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        Container, NodeCondition, NodeSpec as MemberNodeSpec, NodeStatus as MemberNodeStatus,
        NodeSystemInfo, PodSpec, PodStatus, ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn config() -> MirrorConfig {
        MirrorConfig {
            agent_node: None,
            cluster_id: "k1".into(),
            category: NodeCategory::Cloud,
            labels: BTreeMap::from([
                ("site".to_string(), "lab".to_string()),
                ("zone".to_string(), "agent-default".to_string()),
            ]),
            heartbeat_interval: Duration::from_secs(5),
            serves_cloneset: false,
        }
    }

    fn q(s: &str) -> Quantity {
        Quantity(s.into())
    }

    struct M {
        ready: Option<&'static str>,
        disk_pressure: Option<&'static str>,
        unschedulable: Option<bool>,
        ours: bool,
    }

    impl M {
        fn ready() -> Self {
            M {
                ready: Some("True"),
                disk_pressure: Some("False"),
                unschedulable: None,
                ours: false,
            }
        }
    }

    fn member(name: &str, m: &M) -> MemberNode {
        let mut conditions = Vec::new();
        for (kind, status) in [("Ready", m.ready), ("DiskPressure", m.disk_pressure)] {
            if let Some(status) = status {
                conditions.push(NodeCondition {
                    type_: kind.into(),
                    status: status.into(),
                    ..Default::default()
                });
            }
        }
        let resources = BTreeMap::from([
            ("cpu".to_string(), q("32")),
            ("memory".to_string(), q("256Gi")),
            ("nvidia.com/gpu".to_string(), q("8")),
        ]);
        MemberNode {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([
                    ("kubernetes.io/hostname".to_string(), "spoofed".to_string()),
                    (
                        "nvidia.com/gpu.product".to_string(),
                        "NVIDIA-A100-SXM4-80GB".to_string(),
                    ),
                    ("zone".to_string(), "z1".to_string()),
                    (labels::CLUSTER_ID.to_string(), "other".to_string()),
                ])),
                annotations: m.ours.then(|| {
                    BTreeMap::from([(CORDONED_BY_RLARK_ANNOTATION.to_string(), "true".to_string())])
                }),
                ..Default::default()
            },
            spec: Some(MemberNodeSpec {
                unschedulable: m.unschedulable,
                ..Default::default()
            }),
            status: Some(MemberNodeStatus {
                capacity: Some(resources.clone()),
                allocatable: Some(resources),
                conditions: Some(conditions),
                node_info: Some(NodeSystemInfo {
                    architecture: "amd64".into(),
                    kernel_version: "6.1.0".into(),
                    operating_system: "linux".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn member_nodes_become_rlark_nodes() {
        let used = ResourceList::from([("cpu".to_string(), q("3"))]);
        let m = mirror(&member("gpu-0", &M::ready()), &used, &config()).expect("mirrored");
        assert_eq!(m.name, "gpu-0");
        let l = &m.labels;
        assert_eq!(l[labels::CLUSTER_ID], "k1", "protocol labels win");
        assert_eq!(l[labels::HOSTNAME], "gpu-0", "hostname is the node name");
        assert_eq!(l[labels::AGENT_TYPE], "Kubernetes");
        assert_eq!(l[labels::NODE_CATEGORY], "cloud");
        assert_eq!(l["nvidia.com/gpu.product"], "NVIDIA-A100-SXM4-80GB");
        assert_eq!(l["zone"], "z1", "the member's label wins over the agent's");
        assert_eq!(l["site"], "lab");
        assert!(
            !l.contains_key(labels::SERVES_CLONESET),
            "no OpenKruise here"
        );
        // Where the member serves CloneSets the label says so; an agent's own --label
        // cannot claim it where it does not.
        let mut kruise = config();
        kruise.serves_cloneset = true;
        let with = mirror(&member("gpu-0", &M::ready()), &used, &kruise).expect("mirrored");
        assert_eq!(with.labels[labels::SERVES_CLONESET], "true");
        let mut claimed = config();
        claimed
            .labels
            .insert(labels::SERVES_CLONESET.into(), "true".into());
        let without = mirror(&member("gpu-0", &M::ready()), &used, &claimed).expect("mirrored");
        assert!(!without.labels.contains_key(labels::SERVES_CLONESET));
        let s = &m.status;
        assert_eq!(s.phase, Some(NodePhase::Online));
        assert_eq!(s.reason.as_deref(), Some(REASON_MEMBER_NODE_READY));
        assert_eq!(s.capacity["nvidia.com/gpu"], q("8"));
        assert_eq!(s.allocatable["memory"], q("256Gi"));
        assert_eq!(s.used, used);
        assert_eq!(s.disk_pressure, Some(false));
        assert_eq!(s.heartbeat_time, None, "the writer stamps it");
        let info = s.node_info.as_ref().expect("node info");
        assert_eq!(info.architecture.as_deref(), Some("amd64"));
        assert_eq!(info.kernel_version.as_deref(), Some("6.1.0"));
        let node = m.to_node("k1");
        assert_eq!(node.metadata.namespace.as_deref(), Some("rlark-k1"));
        assert_eq!(node.spec.agent_type, AgentType::Kubernetes);
        assert!(!node.spec.unschedulable);
    }

    #[test]
    fn conditions_and_member_cordons_give_the_phase() {
        let table: [(&str, M, NodePhase, &str); 6] = [
            (
                "ready",
                M::ready(),
                NodePhase::Online,
                REASON_MEMBER_NODE_READY,
            ),
            (
                "not ready",
                M {
                    ready: Some("False"),
                    ..M::ready()
                },
                NodePhase::Offline,
                REASON_MEMBER_NODE_NOT_READY,
            ),
            (
                "unknown",
                M {
                    ready: Some("Unknown"),
                    ..M::ready()
                },
                NodePhase::Offline,
                REASON_MEMBER_NODE_NOT_READY,
            ),
            (
                "no Ready condition",
                M {
                    ready: None,
                    ..M::ready()
                },
                NodePhase::Offline,
                REASON_MEMBER_NODE_NOT_READY,
            ),
            (
                "cordoned by its admin",
                M {
                    unschedulable: Some(true),
                    ..M::ready()
                },
                NodePhase::Offline,
                REASON_MEMBER_NODE_UNSCHEDULABLE,
            ),
            (
                "cordoned by rlark",
                M {
                    unschedulable: Some(true),
                    ours: true,
                    ..M::ready()
                },
                NodePhase::Online,
                REASON_MEMBER_NODE_READY,
            ),
        ];
        for (case, m, phase, reason) in table {
            let mirrored = mirror(&member("n", &m), &ResourceList::new(), &config()).expect(case);
            assert_eq!(mirrored.status.phase, Some(phase), "{case}");
            assert_eq!(mirrored.status.reason.as_deref(), Some(reason), "{case}");
        }
        let mut nameless = member("n", &M::ready());
        nameless.metadata.name = None;
        assert_eq!(mirror(&nameless, &ResourceList::new(), &config()), None);
    }

    #[test]
    fn cordons_follow_the_rlark_node_but_never_undo_an_admins() {
        use CordonAction::{Cordon, Uncordon};
        let cases: [(bool, Option<bool>, bool, Option<CordonAction>); 8] = [
            (true, None, false, Some(Cordon)),
            (true, Some(false), false, Some(Cordon)),
            (true, Some(true), true, None),
            (true, Some(true), false, None),
            (false, Some(true), true, Some(Uncordon)),
            (false, Some(true), false, None),
            (false, None, true, Some(Uncordon)),
            (false, None, false, None),
        ];
        for (rlark, unschedulable, ours, want) in cases {
            let m = member(
                "n",
                &M {
                    unschedulable,
                    ours,
                    ..M::ready()
                },
            );
            assert_eq!(
                cordon_action(rlark, &m),
                want,
                "rlark cordoned {rlark}, member unschedulable {unschedulable:?}, ours {ours}"
            );
        }
        assert_eq!(Cordon.patch()["spec"]["unschedulable"], json!(true));
        assert_eq!(
            Cordon.patch()["metadata"]["annotations"][CORDONED_BY_RLARK_ANNOTATION],
            json!("true")
        );
        assert_eq!(Uncordon.patch()["spec"]["unschedulable"], Value::Null);
    }

    fn pod(
        node: Option<&str>,
        phase: &str,
        containers: &[&[(&str, &str)]],
        init: &[(&str, &str)],
    ) -> Pod {
        let container = |name: String, requests: &[(&str, &str)]| Container {
            name,
            resources: Some(ResourceRequirements {
                requests: Some(
                    requests
                        .iter()
                        .map(|(k, v)| (k.to_string(), q(v)))
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        Pod {
            spec: Some(PodSpec {
                node_name: node.map(str::to_string),
                containers: containers
                    .iter()
                    .enumerate()
                    .map(|(i, r)| container(format!("c{i}"), r))
                    .collect(),
                init_containers: (!init.is_empty()).then(|| vec![container("init".into(), init)]),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn pending_pods_give_their_nodes_pull_progress() {
        let pulling = |name: &str, node: &str, image: &str, waiting: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "spec": {"nodeName": node, "containers": [{"name": "main", "image": image}]},
                "status": {"phase": "Pending", "containerStatuses": [{
                    "name": "main", "image": image, "imageID": "", "ready": false,
                    "restartCount": 0,
                    "state": {"waiting": {"reason": waiting, "message": "pull access denied"}},
                }]},
            }))
            .expect("pod")
        };
        let mut done = pulling("d", "a", "have:1", "ContainerCreating");
        if let Some(status) = done.status.as_mut() {
            status.container_statuses.as_mut().expect("statuses")[0].image_id = "sha256:x".into();
        }
        let pods = [
            pulling("p", "a", "big:1", "ContainerCreating"),
            pulling("q", "a", "big:1", "ContainerCreating"),
            pulling("f", "b", "nope:1", "ErrImagePull"),
            done,
            pod(Some("c"), "Running", &[&[]], &[]),
        ];
        let pulls = pulls_by_node(&pods);
        assert_eq!(pulls.keys().collect::<Vec<_>>(), ["a", "b"], "{pulls:?}");
        let a: Vec<(&str, &str)> = pulls["a"]
            .iter()
            .map(|p| (p.image.as_str(), p.status.as_str()))
            .collect();
        assert_eq!(
            a,
            [("big:1", "Pulling")],
            "one entry per pull, none for an image there"
        );
        assert_eq!(pulls["b"][0].status, "Failed");
        assert_eq!(pulls["b"][0].message.as_deref(), Some("pull access denied"));
    }

    #[test]
    fn used_sums_the_requests_of_live_pods_per_node() {
        let pods = [
            pod(
                Some("a"),
                "Running",
                &[&[("cpu", "500m"), ("nvidia.com/gpu", "2")], &[("cpu", "1")]],
                &[],
            ),
            // An init container asking more than the containers' sum sets the request.
            pod(
                Some("a"),
                "Pending",
                &[&[("memory", "1Gi")]],
                &[("memory", "4Gi"), ("cpu", "100m")],
            ),
            pod(Some("a"), "Succeeded", &[&[("cpu", "8")]], &[]),
            pod(Some("a"), "Failed", &[&[("cpu", "8")]], &[]),
            pod(None, "Pending", &[&[("cpu", "8")]], &[]),
            pod(
                Some("b"),
                "Running",
                &[&[("cpu", "bogus"), ("memory", "512Mi")]],
                &[],
            ),
        ];
        let used = used_by_node(&pods);
        assert_eq!(used.len(), 2, "{used:?}");
        let value = |node: &str, name: &str| parse_quantity(&used[node][name].0).expect("quantity");
        assert!(
            value("a", "cpu")
                .cmp(&parse_quantity("1.6").unwrap())
                .is_eq()
        );
        assert!(
            !used["b"].contains_key("cpu"),
            "unparsable requests are skipped"
        );
        assert_eq!(used["a"]["cpu"], q("1600m"));
        assert_eq!(used["a"]["memory"], q("4Gi"));
        assert_eq!(used["a"]["nvidia.com/gpu"], q("2"));
        assert_eq!(used["b"]["memory"], q("512Mi"));
    }

    #[test]
    fn quantities_are_written_as_kubernetes_writes_them() {
        for (input, want) in [
            ("1.5", "1500m"),
            ("2", "2"),
            ("1Gi", "1Gi"),
            ("1000", "1000"),
            ("0.0005", "0.0005"),
            ("1536Mi", "1536Mi"),
        ] {
            let value = parse_quantity(input).expect(input);
            assert_eq!(quantity(value), q(want), "{input}");
            let back = parse_quantity(&quantity(value).0).expect(want);
            assert!(back.cmp(&value).is_eq(), "{input} round trip: {back}");
        }
    }
}
