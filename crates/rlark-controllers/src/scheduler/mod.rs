//! Gang placement of a Job's Tasks onto Nodes: either every template is placed or none is.
//! The rules (candidates, capacity, choice, `Unschedulable` messages) are specified in
//! `docs/concepts.md#placement`.
//!
//! Pure: no IO, no clock, no randomness, no hash-map iteration order in results. The same
//! inputs always give the same decisions (Nodes are considered in `(namespace, name)`
//! order, clusters in cluster-ID order), so placement is reproducible and unit-testable.
//! A Node must be the cluster it claims ([`node_identity_problem`]); what one replica
//! requests is [`replica_requests`]; each template's replicas go to one cluster, spread
//! over its Nodes, and earlier choices are revisited when a later template does not fit
//! (depth-first, at most [`SEARCH_BUDGET`] attempts). Why a template fits nowhere is put
//! into words by [`explain`].

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use rlark_api::labels;
use rlark_api::names::agent_namespace;
use rlark_api::quantity::{QuantityValue, parse_quantity};
use rlark_api::types::{
    AgentType, Job, JobTaskTemplate, KubernetesWorkloadKind, Node, NodePhase, Task, TaskPhase,
    TaskPlacement, TaskSpec,
};

/// The group/version of OpenKruise's CloneSet, named in placement messages.
const CLONESET_API: &str = "apps.kruise.io/v1alpha1";

mod explain;

pub use explain::{format_quantity, format_resources};

/// Resource name → exact amount.
pub type Resources = BTreeMap<String, QuantityValue>;

/// Most cluster choices the search tries before giving up on a Job (each attempt places
/// one template in one cluster). Bounds the work for Jobs with many templates and many
/// clusters; a Job that exhausts it is reported unschedulable with the first failure met.
pub const SEARCH_BUDGET: usize = 10_000;

/// Where [`place`] puts one task template of a Job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskPlacementDecision {
    /// Name of the Job's task template (the Task is `<job>-<template>`).
    pub template: String,
    /// Namespace of the chosen cluster's agent, `rlark-<clusterID>`: where the Task goes.
    pub namespace: String,
    /// Cluster and one Node per replica, to write into the Task's `spec.placement`.
    pub placement: TaskPlacement,
}

/// Why a Job cannot be placed now. `message` names the task and what it lacks, for the
/// Job's `Unschedulable` condition and the `FailedScheduling` Event.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Unschedulable {
    /// Template name of the task that does not fit.
    pub task: String,
    /// Human-readable explanation.
    pub message: String,
}

/// Places every task template of `job` (gang: all or nothing).
///
/// `nodes`: every Node of every cluster (any phase; ineligible ones are filtered and
/// counted in the explanation). `placed_tasks`: every existing Task of every Job (terminal
/// ones are ignored), so their replicas' requests are subtracted from the Nodes they use.
/// Tasks of `job` itself may be among them; they are capacity like any other.
///
/// Returns one decision per template, in template order, or why the Job does not fit.
pub fn place<N, T>(
    job: &Job,
    nodes: &[N],
    placed_tasks: &[T],
) -> Result<Vec<TaskPlacementDecision>, Unschedulable>
where
    N: Borrow<Node>,
    T: Borrow<Task>,
{
    let templates: Vec<&JobTaskTemplate> = job.spec.tasks.iter().collect();
    place_templates(&templates, nodes, placed_tasks)
}

/// [`place`] for a subset of a Job's templates (e.g. the ones whose Task is missing while
/// the others exist and are passed in `placed_tasks`). Same contract.
pub fn place_templates<N, T>(
    templates: &[&JobTaskTemplate],
    nodes: &[N],
    placed_tasks: &[T],
) -> Result<Vec<TaskPlacementDecision>, Unschedulable>
where
    N: Borrow<Node>,
    T: Borrow<Task>,
{
    place_with_usage(templates, nodes, &ClusterUsage::from_tasks(placed_tasks))
}

/// [`place_templates`] with the placed Tasks already summed up in `usage` (a caller that
/// keeps a [`ClusterUsage`] up to date incrementally avoids re-reading every Task for
/// every Job). Same contract.
pub fn place_with_usage<N>(
    templates: &[&JobTaskTemplate],
    nodes: &[N],
    usage: &ClusterUsage,
) -> Result<Vec<TaskPlacementDecision>, Unschedulable>
where
    N: Borrow<Node>,
{
    let world = World::new(nodes, usage);
    let mut wants = Vec::with_capacity(templates.len());
    for template in templates {
        wants.push(Want::new(template, &world)?);
    }
    let mut search = Search {
        world: &world,
        wants: &wants,
        budget: SEARCH_BUDGET,
        first_failure: None,
        chosen: Vec::with_capacity(wants.len()),
    };
    if search.run(0, world.initial.clone()) {
        return Ok(search.chosen);
    }
    let mut failure = search.first_failure.unwrap_or_else(|| Unschedulable {
        task: templates
            .first()
            .map(|t| t.name.clone())
            .unwrap_or_default(),
        message: format!("placement search gave up after {SEARCH_BUDGET} attempts"),
    });
    // The Job's other tasks that could not be placed even alone: named too, so that one
    // look at the condition tells everything that stands in the way.
    for want in &wants {
        if want.template.name == failure.task || want.fits_alone(&world) {
            continue;
        }
        let also = want.explain(&world, &world.initial, &world.initial);
        failure.message.push_str("; also ");
        failure.message.push_str(&also.message);
    }
    Err(failure)
}

/// What one placed, non-terminal Task holds: one Node per replica (in the Task's
/// namespace) and the requests of each replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskUsage {
    /// The Task's namespace (its cluster's agent namespace).
    pub namespace: String,
    /// Node of each replica (`spec.placement.nodes`, or `nodeName` once per replica).
    pub nodes: Vec<String>,
    /// Requests of one replica.
    pub requests: Resources,
}

impl TaskUsage {
    /// What `task` holds; `None` when it holds nothing: terminal (phase `Succeeded`,
    /// `Failed`, `Stopped`), or neither placed nor pinned. Invalid requests are skipped.
    pub fn of(task: &Task) -> Option<TaskUsage> {
        if is_terminal(task.status.as_ref().and_then(|s| s.phase)) {
            return None;
        }
        let nodes = match (&task.spec.placement, &task.spec.node_name) {
            (Some(p), _) => p.nodes.clone(),
            (None, Some(n)) => {
                let count = usize::try_from(task.spec.replicas().max(0)).unwrap_or(0);
                vec![n.clone(); count]
            }
            (None, None) => return None,
        };
        Some(TaskUsage {
            namespace: task.namespace().unwrap_or_default(),
            nodes,
            requests: replica_requests_lenient(&task.spec),
        })
    }
}

/// Requests held on each Node (by namespace and name) by placed, non-terminal Tasks, and
/// how many replicas run there. Sums are exact, so [`ClusterUsage::remove`] undoes
/// [`ClusterUsage::add`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterUsage {
    nodes: BTreeMap<(String, String), NodeUse>,
}

impl ClusterUsage {
    /// The usage of every Task in `tasks` (see [`TaskUsage::of`]).
    pub fn from_tasks<T: Borrow<Task>>(tasks: &[T]) -> Self {
        let mut usage = ClusterUsage::default();
        for task in tasks {
            if let Some(u) = TaskUsage::of(task.borrow()) {
                usage.add(&u);
            }
        }
        usage
    }

    /// Adds one Task's usage.
    pub fn add(&mut self, task: &TaskUsage) {
        for node in &task.nodes {
            let entry = self
                .nodes
                .entry((task.namespace.clone(), node.clone()))
                .or_default();
            commit(entry, &task.requests);
        }
    }

    /// Removes one Task's usage (as added before).
    pub fn remove(&mut self, task: &TaskUsage) {
        for node in &task.nodes {
            let key = (task.namespace.clone(), node.clone());
            let Some(entry) = self.nodes.get_mut(&key) else {
                continue;
            };
            entry.load = entry.load.saturating_sub(1);
            if entry.load == 0 {
                // Nothing left: drop the entry (and any rounding it could have kept).
                self.nodes.remove(&key);
                continue;
            }
            for (name, value) in &task.requests {
                if let Some(slot) = entry.used.get_mut(name) {
                    *slot = slot
                        .checked_sub(*value)
                        .filter(|v| !v.is_negative())
                        .unwrap_or(QuantityValue::ZERO);
                }
            }
            entry.used.retain(|_, v| !v.is_zero());
        }
    }

    /// Requests held on Node `name` of `namespace`, and the replicas there.
    pub fn on_node(&self, namespace: &str, name: &str) -> (Resources, usize) {
        self.nodes
            .get(&(namespace.to_string(), name.to_string()))
            .map(|u| (u.used.clone(), u.load))
            .unwrap_or_default()
    }
}

/// Requests of ONE replica of a task (see the module docs for where they come from).
///
/// `Err` names the first request that is not a valid, non-negative quantity.
pub fn replica_requests(spec: &TaskSpec) -> Result<Resources, String> {
    let (resources, errors) = collect_requests(spec);
    match errors.into_iter().next() {
        Some(error) => Err(error),
        None => Ok(resources),
    }
}

/// Like [`replica_requests`] but skips invalid entries (for Tasks already placed, whose
/// usage must still be counted as well as it can).
fn replica_requests_lenient(spec: &TaskSpec) -> Resources {
    collect_requests(spec).0
}

fn collect_requests(spec: &TaskSpec) -> (Resources, Vec<String>) {
    let mut errors = Vec::new();
    let mut total = Resources::new();
    match spec.agent_type {
        AgentType::Raw => {
            if let Some(resources) = spec.raw.as_ref().and_then(|r| r.resources.as_ref()) {
                add_list(&mut total, &resources.requests, &mut errors);
            }
        }
        AgentType::Docker => {
            for container in spec.docker.iter().flat_map(|d| &d.containers) {
                if let Some(resources) = &container.resources {
                    add_list(&mut total, &resources.requests, &mut errors);
                }
            }
        }
        AgentType::Kubernetes => {
            let pod = spec
                .kubernetes
                .as_ref()
                .and_then(|k| k.workload.as_ref())
                .and_then(|w| w.template.spec.as_ref());
            if let Some(pod) = pod {
                for container in &pod.containers {
                    if let Some(requests) = container
                        .resources
                        .as_ref()
                        .and_then(|r| r.requests.as_ref())
                    {
                        add_list(&mut total, requests, &mut errors);
                    }
                }
                for init in pod.init_containers.iter().flatten() {
                    if let Some(requests) =
                        init.resources.as_ref().and_then(|r| r.requests.as_ref())
                    {
                        let mut one = Resources::new();
                        add_list(&mut one, requests, &mut errors);
                        for (name, value) in one {
                            let slot = total.entry(name).or_insert(QuantityValue::ZERO);
                            if value > *slot {
                                *slot = value;
                            }
                        }
                    }
                }
                if let Some(overhead) = &pod.overhead {
                    add_list(&mut total, overhead, &mut errors);
                }
            }
        }
    }
    (total, errors)
}

fn add_list(total: &mut Resources, list: &BTreeMap<String, Quantity>, errors: &mut Vec<String>) {
    for (name, quantity) in list {
        match parse_quantity(&quantity.0) {
            Ok(value) if value.is_negative() => {
                errors.push(format!("request {name}={} is negative", quantity.0));
            }
            Ok(value) => {
                let slot = total.entry(name.clone()).or_insert(QuantityValue::ZERO);
                match slot.checked_add(value) {
                    Some(sum) => *slot = sum,
                    None => errors.push(format!("request {name} overflows")),
                }
            }
            Err(error) => errors.push(format!("request {name}={:?}: {error}", quantity.0)),
        }
    }
}

/// True for the phases whose Task no longer holds resources.
pub fn is_terminal(phase: Option<TaskPhase>) -> bool {
    matches!(
        phase,
        Some(TaskPhase::Succeeded | TaskPhase::Failed | TaskPhase::Stopped)
    )
}

/// Why Node `node` cannot be trusted to be the cluster it claims, if it cannot: a Node
/// belongs to the agent of cluster `<id>` only when it lives in that agent's namespace
/// `rlark-<id>` and its `rlark.io/cluster-id` label, when present, says `<id>`. The API
/// server keeps agents from writing anything else ([`labels::CLUSTER_ID`]), but a Node
/// written by an admin or straight into the store may still say so; placing on it would
/// send a Job meant for one cluster (and its secrets) to another cluster's agent.
pub fn node_identity_problem(node: &Node) -> Option<String> {
    let namespace = node.namespace().unwrap_or_default();
    let Some(id) = namespace.strip_prefix("rlark-").filter(|id| !id.is_empty()) else {
        return Some(format!(
            "namespace {namespace:?} is not an agent namespace (rlark-<clusterID>)"
        ));
    };
    match node.labels().get(labels::CLUSTER_ID) {
        Some(label) if label != id => Some(format!(
            "label {}={label:?} does not match its namespace {namespace:?}",
            labels::CLUSTER_ID
        )),
        _ => None,
    }
}

/// Cluster ID of a Node: its namespace without `rlark-`, else its `rlark.io/cluster-id`
/// label, else its namespace. (Only Nodes without a [`node_identity_problem`] are placed
/// on, and for those it is the namespace's ID.)
pub fn node_cluster_id(node: &Node) -> String {
    let namespace = node.namespace().unwrap_or_default();
    if let Some(id) = namespace.strip_prefix("rlark-").filter(|id| !id.is_empty()) {
        return id.to_string();
    }
    node.labels()
        .get(labels::CLUSTER_ID)
        .cloned()
        .unwrap_or(namespace)
}

/// Whether `selector` (values may be comma lists) matches the labels of a Node of cluster
/// `cluster_id`.
pub fn selector_matches(
    selector: &BTreeMap<String, String>,
    node_labels: &BTreeMap<String, String>,
    cluster_id: &str,
) -> bool {
    selector.iter().all(|(key, wanted)| {
        let actual = node_labels.get(key);
        wanted
            .split(',')
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .any(|want| {
                actual.is_some_and(|a| a == want)
                    || (key == labels::CLUSTER_ID
                        && (want == agent_namespace(cluster_id)
                            || actual.is_some_and(|a| want == agent_namespace(a))))
            })
    })
}

// ---------------------------------------------------------------------------------------
// Model of the cluster state.

/// Mutable per-Node accounting during a search.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct NodeUse {
    used: Resources,
    /// Non-terminal replicas on the node.
    load: usize,
}

/// Static facts of a Node.
struct NodeFacts<'a> {
    node: &'a Node,
    name: String,
    namespace: String,
    cluster: String,
    total: Resources,
    /// It has a [`node_identity_problem`]: never placed on.
    untrusted: bool,
}

struct World<'a> {
    /// Sorted by (namespace, name), deduplicated.
    nodes: Vec<NodeFacts<'a>>,
    initial: Vec<NodeUse>,
    /// [`name_owners`] of `nodes`.
    owners: BTreeMap<String, Option<String>>,
}

impl World<'_> {
    /// Whether Node name `name` resolves to cluster `cluster` ([`name_owners`]).
    fn owns(&self, name: &str, cluster: &str) -> bool {
        self.owners
            .get(name)
            .is_some_and(|owner| owner.as_deref() == Some(cluster))
    }
}

/// For each Node name, the cluster a `nodeName` pin or a `kubernetes.io/hostname` selector
/// naming it resolves to: the cluster whose (trusted) Node of that name was created first —
/// the one that holds the installation-wide claim on the name (the API server refuses a
/// second Node of a name held by another cluster; `rlark_apiserver::node_names`). Two
/// clusters' Nodes of one name created in the same second (or both without a creation
/// time) leave the name unresolved (`None`): neither is placed on by name. Nodes of one
/// name in another cluster's namespace were written before names were claimed, by an
/// admin, or into the store directly; without this rule a Job pinned to `node-b` could go
/// to any cluster that registered a `node-b` (issue 38).
fn name_owners(nodes: &[NodeFacts<'_>]) -> BTreeMap<String, Option<String>> {
    let mut by_name: BTreeMap<&str, Vec<(Option<k8s_openapi::jiff::Timestamp>, &str)>> =
        BTreeMap::new();
    for facts in nodes.iter().filter(|f| !f.untrusted) {
        let created = facts.node.metadata.creation_timestamp.as_ref().map(|t| t.0);
        by_name
            .entry(facts.name.as_str())
            .or_default()
            .push((created, facts.cluster.as_str()));
    }
    by_name
        .into_iter()
        .map(|(name, mut holders)| {
            // Oldest first; a Node without a creation time after every dated one.
            holders.sort_by_key(|(created, _)| (created.is_none(), *created));
            let first = holders[0];
            let tied = holders
                .iter()
                .skip(1)
                .any(|(created, cluster)| *created == first.0 && *cluster != first.1);
            (name.to_string(), (!tied).then(|| first.1.to_string()))
        })
        .collect()
}

impl<'a> World<'a> {
    fn new<N: Borrow<Node>>(nodes: &'a [N], usage: &ClusterUsage) -> Self {
        let mut by_key: BTreeMap<(String, String), &'a Node> = BTreeMap::new();
        for node in nodes {
            let node = node.borrow();
            let key = (node.namespace().unwrap_or_default(), node.name_any());
            by_key.entry(key).or_insert(node);
        }
        let mut initial = Vec::with_capacity(by_key.len());
        let facts: Vec<NodeFacts<'a>> = by_key
            .into_iter()
            .map(|(key, node)| {
                initial.push(usage.nodes.get(&key).cloned().unwrap_or_default());
                let (namespace, name) = key;
                NodeFacts {
                    node,
                    cluster: node_cluster_id(node),
                    total: node_total(node),
                    untrusted: node_identity_problem(node).is_some(),
                    name,
                    namespace,
                }
            })
            .collect();
        let owners = name_owners(&facts);
        World {
            nodes: facts,
            initial,
            owners,
        }
    }
}

/// Per resource: allocatable, else capacity.
fn node_total(node: &Node) -> Resources {
    let mut total = Resources::new();
    let Some(status) = &node.status else {
        return total;
    };
    for list in [&status.capacity, &status.allocatable] {
        for (name, quantity) in list {
            // Unparsable or negative amounts count as none of that resource.
            let value = parse_quantity(&quantity.0)
                .ok()
                .filter(|v| !v.is_negative())
                .unwrap_or(QuantityValue::ZERO);
            total.insert(name.clone(), value);
        }
    }
    total
}

fn commit(node: &mut NodeUse, requests: &Resources) {
    for (name, value) in requests.iter().filter(|(_, v)| !v.is_zero()) {
        let slot = node.used.entry(name.clone()).or_insert(QuantityValue::ZERO);
        // On overflow keep the larger operand: usage is then under-counted by a quantity
        // 10^38 times smaller than it, which cannot change any fit decision that matters.
        *slot = slot.checked_add(*value).unwrap_or((*slot).max(*value));
    }
    node.load += 1;
}

/// Whether one more replica with `requests` fits on a node with `total` and `usage`.
fn fits(total: &Resources, usage: &NodeUse, requests: &Resources) -> bool {
    requests.iter().all(|(name, want)| {
        if want.is_zero() {
            return true;
        }
        let used = usage.used.get(name).copied().unwrap_or(QuantityValue::ZERO);
        let have = total.get(name).copied().unwrap_or(QuantityValue::ZERO);
        used.checked_add(*want).is_some_and(|sum| sum <= have)
    })
}

/// How many replicas with `requests` fit on one node, at most `cap`.
fn slots(total: &Resources, usage: &NodeUse, requests: &Resources, cap: usize) -> usize {
    let mut usage = usage.clone();
    let mut n = 0;
    while n < cap && fits(total, &usage, requests) {
        commit(&mut usage, requests);
        n += 1;
    }
    n
}

fn free(total: &Resources, usage: &NodeUse, name: &str) -> QuantityValue {
    let have = total.get(name).copied().unwrap_or(QuantityValue::ZERO);
    let used = usage.used.get(name).copied().unwrap_or(QuantityValue::ZERO);
    have.checked_sub(used)
        .filter(|v| !v.is_negative())
        .unwrap_or(QuantityValue::ZERO)
}

// ---------------------------------------------------------------------------------------
// One template's needs.

/// Why a Node is not eligible for a template, in order of diagnosis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Exclusion {
    /// Its cluster identity is inconsistent ([`node_identity_problem`]).
    Identity,
    NotPinned,
    AgentType,
    /// Its cluster does not serve the workload kind the template asks for (a CloneSet on
    /// a member without OpenKruise's CRD).
    WorkloadKind,
    Selector,
    /// Pinned by name (`nodeName`, `kubernetes.io/hostname`) to a name another cluster's
    /// Node holds ([`name_owners`]).
    NameOwner,
    Offline,
    Cordoned,
}

struct Want<'a> {
    template: &'a JobTaskTemplate,
    replicas: usize,
    requests: Resources,
    /// Cluster ID → indices of eligible nodes (in node order).
    eligible: BTreeMap<String, Vec<usize>>,
    excluded: BTreeMap<Exclusion, usize>,
}

impl<'a> Want<'a> {
    fn new(template: &'a JobTaskTemplate, world: &World<'_>) -> Result<Self, Unschedulable> {
        let spec = &template.spec;
        let requests = replica_requests(spec).map_err(|why| Unschedulable {
            task: template.name.clone(),
            message: format!("task {:?} cannot be placed: {why}", template.name),
        })?;
        let mut eligible: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        let mut excluded: BTreeMap<Exclusion, usize> = BTreeMap::new();
        for (i, facts) in world.nodes.iter().enumerate() {
            match exclusion(spec, facts, world) {
                Some(why) => *excluded.entry(why).or_default() += 1,
                None => eligible.entry(facts.cluster.clone()).or_default().push(i),
            }
        }
        Ok(Want {
            template,
            replicas: usize::try_from(spec.replicas().max(0)).unwrap_or(0),
            requests,
            eligible,
            excluded,
        })
    }

    /// Assigns every replica within `cluster`, updating `state`; `None` if they do not all
    /// fit (then `state` is partially updated and must be discarded).
    fn assign(
        &self,
        world: &World<'_>,
        cluster: &str,
        state: &mut [NodeUse],
    ) -> Option<Vec<String>> {
        let nodes = self.eligible.get(cluster)?;
        let mut mine = vec![0usize; nodes.len()];
        let mut chosen = Vec::with_capacity(self.replicas);
        for _ in 0..self.replicas {
            let mut best: Option<(usize, usize, usize, &str)> = None;
            for (pos, &i) in nodes.iter().enumerate() {
                if !fits(&world.nodes[i].total, &state[i], &self.requests) {
                    continue;
                }
                let key = (mine[pos], state[i].load, pos, world.nodes[i].name.as_str());
                // `pos` follows name order within a cluster (one namespace), so comparing
                // (count, load, pos) is the documented (count, load, name) order.
                if best.is_none_or(|b| (key.0, key.1, key.2) < (b.0, b.1, b.2)) {
                    best = Some(key);
                }
            }
            let (_, _, pos, name) = best?;
            let i = nodes[pos];
            commit(&mut state[i], &self.requests);
            mine[pos] += 1;
            chosen.push(name.to_string());
        }
        Some(chosen)
    }

    /// Whether the template alone fits in some cluster, before this Job takes anything.
    fn fits_alone(&self, world: &World<'_>) -> bool {
        self.eligible.keys().any(|cluster| {
            let mut state = world.initial.clone();
            self.assign(world, cluster, &mut state).is_some()
        })
    }
}

/// Whether `spec` asks for an OpenKruise CloneSet, which only the clusters labelled
/// [`labels::SERVES_CLONESET`] create.
fn wants_cloneset(spec: &TaskSpec) -> bool {
    spec.kubernetes
        .as_ref()
        .and_then(|k| k.workload.as_ref())
        .is_some_and(|w| w.kind == KubernetesWorkloadKind::CloneSet)
}

fn exclusion(spec: &TaskSpec, facts: &NodeFacts<'_>, world: &World<'_>) -> Option<Exclusion> {
    let node = facts.node;
    if facts.untrusted {
        return Some(Exclusion::Identity);
    }
    if spec
        .node_name
        .as_ref()
        .is_some_and(|pin| *pin != facts.name)
    {
        return Some(Exclusion::NotPinned);
    }
    if node.spec.agent_type != spec.agent_type {
        return Some(Exclusion::AgentType);
    }
    if wants_cloneset(spec)
        && node
            .labels()
            .get(labels::SERVES_CLONESET)
            .map(String::as_str)
            != Some("true")
    {
        return Some(Exclusion::WorkloadKind);
    }
    if !selector_matches(&spec.node_selector, node.labels(), &facts.cluster) {
        return Some(Exclusion::Selector);
    }
    // A name resolves only to the cluster that holds it.
    if spec.node_name.is_some() && !world.owns(&facts.name, &facts.cluster) {
        return Some(Exclusion::NameOwner);
    }
    if spec.node_selector.contains_key(labels::HOSTNAME)
        && !node
            .labels()
            .get(labels::HOSTNAME)
            .is_some_and(|hostname| world.owns(hostname, &facts.cluster))
    {
        return Some(Exclusion::NameOwner);
    }
    if node.status.as_ref().and_then(|s| s.phase) != Some(NodePhase::Online) {
        return Some(Exclusion::Offline);
    }
    if node.spec.unschedulable {
        return Some(Exclusion::Cordoned);
    }
    None
}

// ---------------------------------------------------------------------------------------
// Search.

struct Search<'w, 'a> {
    world: &'w World<'a>,
    wants: &'w [Want<'w>],
    budget: usize,
    first_failure: Option<Unschedulable>,
    chosen: Vec<TaskPlacementDecision>,
}

impl Search<'_, '_> {
    fn run(&mut self, index: usize, state: Vec<NodeUse>) -> bool {
        let Some(want) = self.wants.get(index) else {
            return true;
        };
        let used_by_job: BTreeSet<&str> = self
            .chosen
            .iter()
            .map(|d| d.placement.cluster_id.as_str())
            .collect();
        let mut order: Vec<&String> = want.eligible.keys().collect();
        // Stable sort: clusters this Job already uses first, each group in ID order.
        order.sort_by_key(|c| !used_by_job.contains(c.as_str()));
        for cluster in order {
            if self.budget == 0 {
                return false;
            }
            self.budget -= 1;
            let mut next = state.clone();
            let Some(nodes) = want.assign(self.world, cluster, &mut next) else {
                continue;
            };
            self.chosen.push(TaskPlacementDecision {
                template: want.template.name.clone(),
                namespace: self.world.nodes[want.eligible[cluster][0]]
                    .namespace
                    .clone(),
                placement: TaskPlacement {
                    cluster_id: cluster.clone(),
                    nodes,
                },
            });
            if self.run(index + 1, next) {
                return true;
            }
            self.chosen.pop();
        }
        if self.first_failure.is_none() {
            self.first_failure = Some(want.explain(self.world, &state, &self.world.initial));
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use rlark_api::types::{JobSpec, NodeSpec, NodeStatus, TaskStatus};
    use serde_json::json;

    fn q(s: &str) -> QuantityValue {
        parse_quantity(s).unwrap()
    }

    /// A Node in cluster `cluster` (namespace `rlark-<cluster>`), Online, Raw agent.
    fn node(cluster: &str, name: &str, allocatable: &[(&str, &str)]) -> Node {
        let mut labels = BTreeMap::from([(labels::CLUSTER_ID.to_string(), cluster.to_string())]);
        labels.insert("kubernetes.io/hostname".into(), name.into());
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(agent_namespace(cluster)),
                labels: Some(labels),
                ..Default::default()
            },
            spec: NodeSpec {
                agent_type: AgentType::Raw,
                unschedulable: false,
            },
            status: Some(NodeStatus {
                phase: Some(NodePhase::Online),
                allocatable: allocatable
                    .iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect(),
                ..Default::default()
            }),
        }
    }

    fn with_label(mut n: Node, k: &str, v: &str) -> Node {
        n.metadata
            .labels
            .get_or_insert_default()
            .insert(k.into(), v.into());
        n
    }

    fn template(name: &str, extra: serde_json::Value) -> JobTaskTemplate {
        let mut base = json!({
            "name": name,
            "agentType": "Raw",
            "role": "Rollout",
            "raw": {"entrypoint": ["run"]},
        });
        merge(&mut base, extra);
        serde_json::from_value(base).unwrap()
    }

    fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
        match (base, extra) {
            (serde_json::Value::Object(b), serde_json::Value::Object(e)) => {
                for (k, v) in e {
                    merge(b.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (b, e) => *b = e,
        }
    }

    /// A raw template with `replicas` replicas each requesting `requests`.
    fn raw(name: &str, replicas: i32, requests: serde_json::Value) -> JobTaskTemplate {
        template(
            name,
            json!({"raw": {"replicas": replicas, "resources": {"requests": requests}}}),
        )
    }

    fn job(templates: Vec<JobTaskTemplate>) -> Job {
        let mut job = Job::new(
            "j",
            JobSpec {
                tasks: templates,
                ..Default::default()
            },
        );
        job.metadata.uid = Some("uid-j".into());
        job
    }

    /// A placed Task using `nodes` in cluster `cluster`.
    fn placed(
        name: &str,
        cluster: &str,
        nodes: &[&str],
        requests: serde_json::Value,
        phase: Option<TaskPhase>,
    ) -> Task {
        let t = raw(name, nodes.len() as i32, requests);
        let mut spec = t.spec;
        spec.placement = Some(TaskPlacement {
            cluster_id: cluster.into(),
            nodes: nodes.iter().map(|s| s.to_string()).collect(),
        });
        let mut task = Task::new(name, spec);
        task.metadata.namespace = Some(agent_namespace(cluster));
        task.status = Some(TaskStatus {
            phase,
            ..Default::default()
        });
        task
    }

    fn nodes_of(d: &[TaskPlacementDecision], template: &str) -> (String, Vec<String>) {
        let d = d.iter().find(|d| d.template == template).unwrap();
        (d.placement.cluster_id.clone(), d.placement.nodes.clone())
    }

    const NO_TASKS: &[Task] = &[];

    #[test]
    fn requests_per_runtime() {
        let r = raw("a", 2, json!({"cpu": "500m", "memory": "1Gi"}));
        let req = replica_requests(&r.spec).unwrap();
        assert_eq!(req["cpu"], q("0.5"));
        assert_eq!(req["memory"], q("1073741824"));

        let d = template(
            "d",
            json!({"agentType": "Docker", "raw": null, "docker": {"containers": [
                {"name": "a", "image": "x", "resources": {"requests": {"cpu": "250m", "nvidia.com/gpu": "1"}}},
                {"name": "b", "image": "y", "resources": {"requests": {"cpu": "1"}}},
                {"name": "c", "image": "z"},
            ]}}),
        );
        let req = replica_requests(&d.spec).unwrap();
        assert_eq!(req["cpu"], q("1250m"));
        assert_eq!(req["nvidia.com/gpu"], q("1"));

        let k = template(
            "k",
            json!({"agentType": "Kubernetes", "raw": null, "kubernetes": {"workload": {
                "kind": "Deployment", "replicas": 2,
                "template": {"spec": {
                    "containers": [
                        {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
                        {"name": "b", "resources": {"requests": {"cpu": "500m", "rlinf.io/device-arm": "1"}}},
                    ],
                    "initContainers": [
                        {"name": "i", "resources": {"requests": {"cpu": "2", "memory": "512Mi"}}},
                    ],
                    "overhead": {"memory": "100Mi"},
                }},
            }}}),
        );
        let req = replica_requests(&k.spec).unwrap();
        assert_eq!(req["cpu"], q("2"), "init container dominates cpu");
        assert_eq!(
            req["memory"],
            q("1124Mi"),
            "containers dominate memory, plus overhead"
        );
        assert_eq!(req["rlinf.io/device-arm"], q("1"));
        assert_eq!(k.spec.replicas(), 2);

        let bad = raw("b", 1, json!({"cpu": "lots"}));
        assert!(replica_requests(&bad.spec).unwrap_err().contains("cpu"));
        let neg = raw("n", 1, json!({"cpu": "-1"}));
        assert!(
            replica_requests(&neg.spec)
                .unwrap_err()
                .contains("negative")
        );
    }

    #[test]
    fn selector_comma_lists_and_cluster_id_spelling() {
        let labels = BTreeMap::from([
            ("gpu".to_string(), "a100".to_string()),
            (labels::CLUSTER_ID.to_string(), "a".to_string()),
        ]);
        let sel = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(selector_matches(&sel(&[]), &labels, "a"));
        assert!(selector_matches(&sel(&[("gpu", "a100")]), &labels, "a"));
        assert!(selector_matches(
            &sel(&[("gpu", "h100, a100")]),
            &labels,
            "a"
        ));
        assert!(!selector_matches(
            &sel(&[("gpu", "h100,v100")]),
            &labels,
            "a"
        ));
        assert!(!selector_matches(&sel(&[("gpu", "")]), &labels, "a"));
        assert!(!selector_matches(&sel(&[("zone", "x")]), &labels, "a"));
        assert!(!selector_matches(
            &sel(&[("gpu", "a100"), ("zone", "x")]),
            &labels,
            "a"
        ));
        assert!(selector_matches(
            &sel(&[(labels::CLUSTER_ID, "a")]),
            &labels,
            "a"
        ));
        // RLark's selectors name the agent namespace.
        assert!(selector_matches(
            &sel(&[(labels::CLUSTER_ID, "rlark-a")]),
            &labels,
            "a"
        ));
        assert!(!selector_matches(
            &sel(&[(labels::CLUSTER_ID, "rlark-b,b")]),
            &labels,
            "a"
        ));
    }

    #[test]
    fn places_by_selector_and_capacity_across_clusters() {
        let nodes = vec![
            with_label(
                node("a", "a1", &[("cpu", "4"), ("nvidia.com/gpu", "2")]),
                "gpu",
                "a100",
            ),
            with_label(
                node("a", "a2", &[("cpu", "4"), ("nvidia.com/gpu", "2")]),
                "gpu",
                "a100",
            ),
            with_label(node("b", "b1", &[("cpu", "8")]), "site", "lab"),
            with_label(node("b", "b2", &[("cpu", "8")]), "site", "lab"),
        ];
        let job = job(vec![
            template(
                "actor",
                json!({"nodeSelector": {"gpu": "a100,h100"}, "raw": {"replicas": 2, "resources": {"requests": {"nvidia.com/gpu": "2"}}}}),
            ),
            template(
                "rollout",
                json!({"nodeSelector": {"site": "lab"}, "raw": {"replicas": 3, "resources": {"requests": {"cpu": "2"}}}}),
            ),
            template(
                "env",
                json!({"raw": {"resources": {"requests": {"cpu": "6"}}}}),
            ),
        ]);
        let d = place(&job, &nodes, NO_TASKS).unwrap();
        assert_eq!(d.len(), 3);
        assert_eq!(d[0].namespace, "rlark-a");
        assert_eq!(
            nodes_of(&d, "actor"),
            ("a".into(), vec!["a1".into(), "a2".into()])
        );
        assert_eq!(d[1].namespace, "rlark-b");
        assert_eq!(
            nodes_of(&d, "rollout"),
            ("b".into(), vec!["b1".into(), "b2".into(), "b1".into()])
        );
        // 6 cpu on one node: a1/a2 have 4, b1 has 8-4, only b2 (8-2) fits.
        assert_eq!(nodes_of(&d, "env"), ("b".into(), vec!["b2".into()]));
    }

    #[test]
    fn gang_all_or_nothing_with_message() {
        let nodes = vec![
            node("a", "a1", &[("cpu", "4")]),
            node("a", "a2", &[("cpu", "4")]),
            node("b", "b1", &[("cpu", "8")]),
        ];
        let job = job(vec![
            raw("first", 2, json!({"cpu": "3"})),
            raw("second", 1, json!({"cpu": "7"})),
            raw("third", 1, json!({"cpu": "2"})),
        ]);
        // first → a (a1,a2), second → b1 (7 of 8), third → nothing left (1+1+1 free).
        let err = place(&job, &nodes, NO_TASKS).unwrap_err();
        assert_eq!(err.task, "third");
        assert!(
            err.message
                .starts_with("task \"third\" (1 replica) does not fit: needs cpu=2 per replica"),
            "{}",
            err.message
        );
        assert!(
            err.message
                .contains("cluster \"a\" fits 0 (cpu: 2 free on 2 eligible nodes)"),
            "{}",
            err.message
        );
        assert!(
            err.message
                .contains("cluster \"b\" fits 0 (cpu: 1 free on 1 eligible node)"),
            "{}",
            err.message
        );
        assert!(
            err.message.contains("the Job's other tasks take the rest"),
            "{}",
            err.message
        );
    }

    #[test]
    fn backtracks_over_cluster_choices() {
        // "any" would go to a first (ID order) and take the only room "only-a" has.
        let nodes = vec![
            node("a", "a1", &[("cpu", "2")]),
            node("b", "b1", &[("cpu", "2")]),
        ];
        let job = job(vec![
            raw("any", 1, json!({"cpu": "2"})),
            template(
                "only-a",
                json!({"nodeSelector": {labels::CLUSTER_ID: "a"}, "raw": {"resources": {"requests": {"cpu": "2"}}}}),
            ),
        ]);
        let d = place(&job, &nodes, NO_TASKS).unwrap();
        assert_eq!(nodes_of(&d, "any"), ("b".into(), vec!["b1".into()]));
        assert_eq!(nodes_of(&d, "only-a"), ("a".into(), vec!["a1".into()]));
    }

    #[test]
    fn gpu_shortage_message_names_cluster_and_exclusions() {
        let nodes = vec![
            with_label(
                node("gpu-a", "g1", &[("nvidia.com/gpu", "1")]),
                "pool",
                "gpu",
            ),
            with_label(
                node("gpu-a", "g2", &[("nvidia.com/gpu", "1")]),
                "pool",
                "gpu",
            ),
            with_label(node("gpu-a", "c1", &[("cpu", "64")]), "pool", "cpu"),
        ];
        let job = job(vec![template(
            "rollout",
            json!({"nodeSelector": {"pool": "gpu"}, "raw": {"replicas": 3, "resources": {"requests": {"nvidia.com/gpu": "1"}}}}),
        )]);
        let err = place(&job, &nodes, NO_TASKS).unwrap_err();
        assert_eq!(
            err.message,
            "task \"rollout\" (3 replicas) does not fit: needs nvidia.com/gpu=1 per replica; \
             cluster \"gpu-a\" fits 2 (nvidia.com/gpu: 2 free on 2 eligible nodes); \
             1 node excluded by nodeSelector pool=gpu"
        );
        // A third GPU node appears: now it fits, one replica per node.
        let mut more = nodes.clone();
        more.push(with_label(
            node("gpu-a", "g3", &[("nvidia.com/gpu", "1")]),
            "pool",
            "gpu",
        ));
        let d = place(&job, &more, NO_TASKS).unwrap();
        assert_eq!(
            nodes_of(&d, "rollout"),
            ("gpu-a".into(), vec!["g1".into(), "g2".into(), "g3".into()])
        );
    }

    #[test]
    fn every_task_that_cannot_be_placed_is_named_with_what_would_place_it() {
        let nodes = vec![node("a", "n1", &[("cpu", "8")])];
        let gang = job(vec![
            template("learner", json!({"agentType": "Kubernetes"})),
            template("ok", json!({})),
            template(
                "edge",
                json!({"nodeSelector": {"rlark.io/cluster-id": "robots"}}),
            ),
            template("picky", json!({"nodeSelector": {"pool": "gpu"}})),
        ]);
        let err = place(&gang, &nodes, NO_TASKS).unwrap_err();
        assert_eq!(err.task, "learner");
        let message = &err.message;
        for expected in [
            "task \"learner\" (1 replica) does not fit: no eligible Node; \
             1 node excluded by agent type (needs Kubernetes); no agent runs Kubernetes tasks: \
             join one with `rlark agent --agent-type Kubernetes ...`",
            "; also task \"edge\" (1 replica) does not fit: no eligible Node; \
             1 node excluded by nodeSelector rlark.io/cluster-id=robots; \
             no Node has rlark.io/cluster-id=robots: no agent joined as cluster \"robots\"",
            "; also task \"picky\" (1 replica) does not fit: no eligible Node; \
             1 node excluded by nodeSelector pool=gpu; no Node has pool=gpu",
        ] {
            assert!(message.contains(expected), "{expected}\nnot in\n{message}");
        }
        // A task that fits alone is not named.
        assert!(!message.contains("\"ok\""), "{message}");
        // The agent type exists somewhere: no remedy, only the exclusion.
        let mut k8s = node("b", "k1", &[("cpu", "8")]);
        k8s.spec.agent_type = AgentType::Kubernetes;
        let err = place(
            &job(vec![template(
                "learner",
                json!({"agentType": "Kubernetes", "nodeSelector": {"pool": "x"}}),
            )]),
            &[nodes[0].clone(), k8s],
            NO_TASKS,
        )
        .unwrap_err();
        assert!(!err.message.contains("no agent runs"), "{}", err.message);
        assert!(
            err.message.contains("no Node has pool=x"),
            "{}",
            err.message
        );
    }

    #[test]
    fn a_cloneset_goes_only_where_the_member_serves_it() {
        let kube_node = |cluster: &str, name: &str, serves: bool| {
            let mut n = node(cluster, name, &[("cpu", "8")]);
            n.spec.agent_type = AgentType::Kubernetes;
            if serves {
                n.metadata
                    .labels
                    .get_or_insert_with(BTreeMap::new)
                    .insert(labels::SERVES_CLONESET.into(), "true".into());
            }
            n
        };
        let clones = job(vec![template(
            "rollout",
            json!({"agentType": "Kubernetes",
                   "kubernetes": {"workload": {"kind": "CloneSet", "replicas": 2, "template": {}}}}),
        )]);
        // Only a cluster without OpenKruise: refused, saying what to install.
        let err = place(&clones, &[kube_node("plain", "p1", false)], NO_TASKS).unwrap_err();
        assert!(
            err.message.contains(
                "1 node excluded because their member cluster does not serve \
                 apps.kruise.io/v1alpha1 CloneSet; no member cluster serves OpenKruise's \
                 CloneSet (apps.kruise.io/v1alpha1): install OpenKruise"
            ),
            "{}",
            err.message
        );
        // With one that serves it: placed there, never on the other.
        let nodes = [
            kube_node("plain", "p1", false),
            kube_node("kruise", "k1", true),
        ];
        let placed = place(&clones, &nodes, NO_TASKS).unwrap();
        assert_eq!(placed[0].placement.cluster_id, "kruise");
        // A Deployment goes anywhere Kubernetes runs.
        let deploy = job(vec![template(
            "rollout",
            json!({"agentType": "Kubernetes",
                   "kubernetes": {"workload": {"kind": "Deployment", "template": {}}}}),
        )]);
        let placed = place(&deploy, &nodes[..1], NO_TASKS).unwrap();
        assert_eq!(placed[0].placement.cluster_id, "plain");
    }

    #[test]
    fn offline_cordoned_agent_type_and_pin() {
        let mut off = node("a", "off", &[("cpu", "8")]);
        off.status.as_mut().unwrap().phase = Some(NodePhase::Offline);
        let mut no_status = node("a", "nostatus", &[("cpu", "8")]);
        no_status.status = None;
        let mut cordoned = node("a", "cordoned", &[("cpu", "8")]);
        cordoned.spec.unschedulable = true;
        let mut docker = node("a", "docker", &[("cpu", "8")]);
        docker.spec.agent_type = AgentType::Docker;
        let ok = node("a", "ok", &[("cpu", "8")]);
        let ok2 = node("a", "ok2", &[("cpu", "8")]);
        let nodes = vec![off, no_status, cordoned, docker, ok, ok2];

        let d = place(
            &job(vec![raw("t", 2, json!({"cpu": "1"}))]),
            &nodes,
            NO_TASKS,
        )
        .unwrap();
        assert_eq!(nodes_of(&d, "t").1, vec!["ok", "ok2"]);

        // Pin to ok2.
        let pinned = template("t", json!({"nodeName": "ok2", "raw": {"replicas": 2}}));
        let d = place(&job(vec![pinned]), &nodes, NO_TASKS).unwrap();
        assert_eq!(nodes_of(&d, "t").1, vec!["ok2", "ok2"]);

        // Pin to a cordoned node: not eligible.
        let pinned = template("t", json!({"nodeName": "cordoned"}));
        let err = place(&job(vec![pinned]), &nodes, NO_TASKS).unwrap_err();
        assert_eq!(
            err.message,
            "task \"t\" (1 replica) does not fit: no eligible Node; \
             5 nodes excluded by nodeName \"cordoned\", 1 node cordoned"
        );
        // Pin to nothing.
        let pinned = template("t", json!({"nodeName": "ghost"}));
        let err = place(&job(vec![pinned]), &nodes, NO_TASKS).unwrap_err();
        assert!(
            err.message
                .contains("nodeName \"ghost\" is not a registered Node"),
            "{}",
            err.message
        );

        // Only the unusable nodes.
        let err = place(&job(vec![raw("t", 1, json!({}))]), &nodes[..4], NO_TASKS).unwrap_err();
        assert_eq!(
            err.message,
            "task \"t\" (1 replica) does not fit: no eligible Node; \
             1 node excluded by agent type (needs Raw), 2 nodes offline, 1 node cordoned"
        );
        let err = place(&job(vec![raw("t", 1, json!({}))]), &[] as &[Node], NO_TASKS).unwrap_err();
        assert_eq!(
            err.message,
            "task \"t\" (1 replica) does not fit: no Nodes are registered"
        );
    }

    #[test]
    fn capacity_math_with_quantities() {
        let nodes = vec![node("a", "n", &[("cpu", "2"), ("memory", "4Gi")])];
        // 3 × (500m, 1Gi) + 1 × (500m, 1Gi) = exactly (2, 4Gi): fits exactly.
        let existing = placed(
            "other",
            "a",
            &["n", "n", "n"],
            json!({"cpu": "500m", "memory": "1Gi"}),
            Some(TaskPhase::Running),
        );
        let d = place(
            &job(vec![raw("t", 1, json!({"cpu": "0.5", "memory": "1024Mi"}))]),
            &nodes,
            std::slice::from_ref(&existing),
        )
        .unwrap();
        assert_eq!(nodes_of(&d, "t").1, vec!["n"]);
        // One milli-CPU more does not.
        let err = place(
            &job(vec![raw("t", 1, json!({"cpu": "501m", "memory": "1Gi"}))]),
            &nodes,
            std::slice::from_ref(&existing),
        )
        .unwrap_err();
        assert!(
            err.message
                .contains("needs cpu=501m, memory=1Gi per replica"),
            "{}",
            err.message
        );
        assert!(
            err.message.contains("(cpu: 500m free on 1 eligible node)"),
            "{}",
            err.message
        );
        // A resource the node does not have.
        let err = place(
            &job(vec![raw("t", 1, json!({"rlinf.io/device-robot": "1"}))]),
            &nodes,
            NO_TASKS,
        )
        .unwrap_err();
        assert!(
            err.message.contains("rlinf.io/device-robot: 0 free"),
            "{}",
            err.message
        );
        // Capacity is used when allocatable does not list the resource.
        let mut n = node("a", "n", &[("cpu", "1")]);
        n.status.as_mut().unwrap().capacity = [
            ("nvidia.com/gpu".to_string(), Quantity("1".into())),
            ("cpu".to_string(), Quantity("64".into())),
        ]
        .into();
        let d = place(
            &job(vec![raw(
                "t",
                1,
                json!({"nvidia.com/gpu": "1", "cpu": "1"}),
            )]),
            &[n.clone()],
            NO_TASKS,
        )
        .unwrap();
        assert_eq!(nodes_of(&d, "t").1, vec!["n"]);
        // ...but allocatable wins over capacity for the resources it lists.
        assert!(place(&job(vec![raw("t", 1, json!({"cpu": "2"}))]), &[n], NO_TASKS).is_err());
    }

    #[test]
    fn terminal_tasks_free_capacity() {
        let nodes = vec![node("a", "n", &[("nvidia.com/gpu", "1")])];
        let want = job(vec![raw("t", 1, json!({"nvidia.com/gpu": "1"}))]);
        for phase in [None, Some(TaskPhase::Pending), Some(TaskPhase::Running)] {
            let t = placed("old", "a", &["n"], json!({"nvidia.com/gpu": "1"}), phase);
            assert!(
                place(&want, &nodes, &[t]).is_err(),
                "{phase:?} holds the GPU"
            );
        }
        for phase in [TaskPhase::Succeeded, TaskPhase::Failed, TaskPhase::Stopped] {
            let t = placed(
                "old",
                "a",
                &["n"],
                json!({"nvidia.com/gpu": "1"}),
                Some(phase),
            );
            assert!(
                place(&want, &nodes, &[t]).is_ok(),
                "{phase:?} frees the GPU"
            );
        }
        // A Task in another cluster with a node of the same name does not count here.
        let elsewhere = placed("old", "b", &["n"], json!({"nvidia.com/gpu": "1"}), None);
        assert!(place(&want, &nodes, &[elsewhere]).is_ok());
        // A Task pinned by nodeName without placement counts on its node.
        let mut pinned = placed("old", "a", &["n"], json!({"nvidia.com/gpu": "1"}), None);
        pinned.spec.placement = None;
        pinned.spec.node_name = Some("n".into());
        assert!(place(&want, &nodes, &[pinned]).is_err());
    }

    #[test]
    fn usage_adds_and_removes_exactly() {
        let t1 = placed(
            "t1",
            "a",
            &["n", "m"],
            json!({"cpu": "100m", "memory": "1Gi"}),
            Some(TaskPhase::Running),
        );
        let t2 = placed(
            "t2",
            "a",
            &["n"],
            json!({"cpu": "250m", "nvidia.com/gpu": "0"}),
            None,
        );
        let (u1, u2) = (TaskUsage::of(&t1).unwrap(), TaskUsage::of(&t2).unwrap());
        assert_eq!(u1.namespace, "rlark-a");
        assert_eq!(u1.nodes, vec!["n", "m"]);
        let mut usage = ClusterUsage::default();
        usage.add(&u1);
        usage.add(&u2);
        let (used, load) = usage.on_node("rlark-a", "n");
        assert_eq!(load, 2);
        assert_eq!(
            used,
            Resources::from([("cpu".into(), q("350m")), ("memory".into(), q("1Gi"))])
        );
        assert_eq!(usage, ClusterUsage::from_tasks(&[t1.clone(), t2.clone()]));
        usage.remove(&u1);
        assert_eq!(usage, ClusterUsage::from_tasks(std::slice::from_ref(&t2)));
        usage.remove(&u2);
        assert_eq!(usage, ClusterUsage::default());
        usage.remove(&u2);
        assert_eq!(
            usage,
            ClusterUsage::default(),
            "removing what is not there is harmless"
        );
        // Terminal and unplaced Tasks hold nothing.
        assert!(
            TaskUsage::of(&placed(
                "x",
                "a",
                &["n"],
                json!({}),
                Some(TaskPhase::Succeeded)
            ))
            .is_none()
        );
        let mut unplaced = t2.clone();
        unplaced.spec.placement = None;
        assert!(TaskUsage::of(&unplaced).is_none());
        unplaced.spec.node_name = Some("n".into());
        assert_eq!(TaskUsage::of(&unplaced).unwrap().nodes, vec!["n"]);
        // The same decisions from usage as from Tasks.
        let nodes = vec![
            node("a", "n", &[("cpu", "1")]),
            node("a", "m", &[("cpu", "1")]),
        ];
        let j = job(vec![raw("t", 2, json!({"cpu": "700m"}))]);
        let templates: Vec<&JobTaskTemplate> = j.spec.tasks.iter().collect();
        let from_tasks = place(&j, &nodes, &[t1.clone(), t2.clone()]);
        let mut usage = ClusterUsage::default();
        usage.add(&u1);
        usage.add(&u2);
        assert_eq!(place_with_usage(&templates, &nodes, &usage), from_tasks);
        assert!(
            from_tasks.is_err(),
            "n has 650m free, m 900m: one 700m replica fits, not two"
        );
    }

    #[test]
    fn spreads_least_loaded_first_with_name_tiebreak() {
        let nodes = vec![
            node("a", "n3", &[("cpu", "10")]),
            node("a", "n1", &[("cpu", "10")]),
            node("a", "n2", &[("cpu", "10")]),
        ];
        // n1 already runs two replicas of something, n2 one.
        let busy = placed(
            "busy",
            "a",
            &["n1", "n1", "n2"],
            json!({"cpu": "1"}),
            Some(TaskPhase::Running),
        );
        let d = place(
            &job(vec![raw("t", 5, json!({"cpu": "1"}))]),
            &nodes,
            &[busy],
        )
        .unwrap();
        // Round 1: n3 (load 0), n2 (load 1), n1 (load 2); round 2: n3, n2.
        assert_eq!(nodes_of(&d, "t").1, vec!["n3", "n2", "n1", "n3", "n2"]);
        // Without other load: name order.
        let d = place(
            &job(vec![raw("t", 4, json!({"cpu": "1"}))]),
            &nodes,
            NO_TASKS,
        )
        .unwrap();
        assert_eq!(nodes_of(&d, "t").1, vec!["n1", "n2", "n3", "n1"]);
        // A node too small is skipped; the others take more.
        let uneven = vec![
            node("a", "n1", &[("cpu", "10")]),
            node("a", "n2", &[("cpu", "10")]),
            node("a", "n3", &[("cpu", "3")]),
        ];
        let d = place(
            &job(vec![raw("t", 4, json!({"cpu": "4"}))]),
            &uneven,
            NO_TASKS,
        )
        .unwrap();
        assert_eq!(nodes_of(&d, "t").1, vec!["n1", "n2", "n1", "n2"]);
    }

    #[test]
    fn one_task_one_cluster_and_locality() {
        // Each cluster has room for 2 replicas only: a 3-replica task does not split.
        let nodes = vec![
            node("a", "a1", &[("cpu", "2")]),
            node("b", "b1", &[("cpu", "2")]),
        ];
        let err = place(
            &job(vec![raw("t", 3, json!({"cpu": "1"}))]),
            &nodes,
            NO_TASKS,
        )
        .unwrap_err();
        assert!(
            err.message.contains("cluster \"a\" fits 2"),
            "{}",
            err.message
        );
        assert!(
            err.message.contains("cluster \"b\" fits 2"),
            "{}",
            err.message
        );
        // Later templates prefer the cluster the Job already uses.
        let nodes = vec![
            node("a", "a1", &[("cpu", "4")]),
            with_label(node("b", "b1", &[("cpu", "4")]), "x", "y"),
        ];
        let j = job(vec![
            template("pinned", json!({"nodeSelector": {"x": "y"}})),
            raw("free", 1, json!({"cpu": "1"})),
        ]);
        let d = place(&j, &nodes, NO_TASKS).unwrap();
        assert_eq!(nodes_of(&d, "free").0, "b");
    }

    #[test]
    fn deterministic_whatever_the_input_order() {
        let mut nodes = vec![
            node("b", "b2", &[("cpu", "4")]),
            node("a", "a2", &[("cpu", "4")]),
            node("b", "b1", &[("cpu", "4")]),
            node("a", "a1", &[("cpu", "4")]),
        ];
        let j = job(vec![
            raw("x", 3, json!({"cpu": "2"})),
            raw("y", 2, json!({"cpu": "3"})),
        ]);
        let first = place(&j, &nodes, NO_TASKS).unwrap();
        for _ in 0..5 {
            nodes.rotate_left(1);
            assert_eq!(place(&j, &nodes, NO_TASKS).unwrap(), first);
        }
        // x: a1,a2,a1 (a: 0 + 2 free), y needs 3+3: b1,b2.
        assert_eq!(
            nodes_of(&first, "x"),
            ("a".into(), vec!["a1".into(), "a2".into(), "a1".into()])
        );
        assert_eq!(
            nodes_of(&first, "y"),
            ("b".into(), vec!["b1".into(), "b2".into()])
        );
    }

    #[test]
    fn zero_replicas_and_no_requests() {
        let nodes = vec![node("a", "a1", &[])];
        let d = place(&job(vec![raw("t", 0, json!({}))]), &nodes, NO_TASKS).unwrap();
        assert_eq!(d[0].placement.nodes, Vec::<String>::new());
        assert_eq!(d[0].namespace, "rlark-a");
        let d = place(&job(vec![raw("t", 3, json!({}))]), &nodes, NO_TASKS).unwrap();
        assert_eq!(d[0].placement.nodes, vec!["a1", "a1", "a1"]);
        assert_eq!(place(&job(vec![]), &nodes, NO_TASKS).unwrap(), vec![]);
    }

    #[test]
    fn invalid_template_request_is_unschedulable() {
        let nodes = vec![node("a", "a1", &[("cpu", "4")])];
        let err = place(
            &job(vec![raw("t", 1, json!({"cpu": "x"}))]),
            &nodes,
            NO_TASKS,
        )
        .unwrap_err();
        assert!(
            err.message
                .starts_with("task \"t\" cannot be placed: request cpu=\"x\""),
            "{}",
            err.message
        );
    }

    /// A Node in agent namespace `rlark-a` claiming to be cluster `other` (the capture of
    /// issue 14) is never placed on, with or without a cluster selector; neither is a Node
    /// outside the agent namespaces. A genuine Node of `other` is used.
    #[test]
    fn nodes_claiming_another_cluster_are_never_placed_on() {
        let forged = with_label(
            node("a", "forged", &[("cpu", "64"), ("nvidia.com/gpu", "8")]),
            labels::CLUSTER_ID,
            "other",
        );
        let mut stray = node("other", "stray", &[("cpu", "64"), ("nvidia.com/gpu", "8")]);
        stray.metadata.namespace = Some("default".into());
        assert_eq!(
            node_identity_problem(&forged).as_deref(),
            Some(r#"label rlark.io/cluster-id="other" does not match its namespace "rlark-a""#)
        );
        assert_eq!(
            node_identity_problem(&stray).as_deref(),
            Some(r#"namespace "default" is not an agent namespace (rlark-<clusterID>)"#)
        );
        assert_eq!(node_identity_problem(&node("a", "a1", &[])), None);
        let mut unlabelled = node("a", "a2", &[]);
        unlabelled.metadata.labels = None;
        assert_eq!(node_identity_problem(&unlabelled), None);

        let for_other = |selector: &str| {
            job(vec![template(
                "t",
                json!({"nodeSelector": {labels::CLUSTER_ID: selector},
                       "raw": {"resources": {"requests": {"nvidia.com/gpu": "1"}}}}),
            )])
        };
        let for_anyone = job(vec![raw("t", 1, json!({"nvidia.com/gpu": "1"}))]);
        let nodes = vec![forged.clone(), stray.clone()];
        for job in [
            for_other("other"),
            for_other("rlark-other"),
            for_anyone.clone(),
        ] {
            let err = place(&job, &nodes, NO_TASKS).unwrap_err();
            assert!(
                err.message.contains(
                    "2 nodes excluded because rlark.io/cluster-id does not match the agent namespace"
                ),
                "{}",
                err.message
            );
        }
        // With a genuine Node of `other` beside them, that is where the Job goes.
        let mut nodes = nodes;
        nodes.push(node("other", "o1", &[("nvidia.com/gpu", "1")]));
        for job in [for_other("other"), for_anyone] {
            let decisions = place(&job, &nodes, NO_TASKS).unwrap();
            assert_eq!(decisions[0].namespace, "rlark-other");
            assert_eq!(
                nodes_of(&decisions, "t"),
                ("other".into(), vec!["o1".into()])
            );
        }
    }

    #[test]
    fn cluster_id_from_namespace_or_label() {
        let n = node("a", "a1", &[]);
        assert_eq!(node_cluster_id(&n), "a");
        let mut other = n.clone();
        other.metadata.namespace = Some("elsewhere".into());
        assert_eq!(node_cluster_id(&other), "a");
        other.metadata.labels = None;
        assert_eq!(node_cluster_id(&other), "elsewhere");
    }

    #[test]
    fn format_quantities() {
        assert_eq!(format_quantity("cpu", q("500m")), "500m");
        assert_eq!(format_quantity("cpu", q("2")), "2");
        assert_eq!(format_quantity("memory", q("2Gi")), "2Gi");
        assert_eq!(format_quantity("memory", q("1536Mi")), "1536Mi");
        assert_eq!(format_quantity("memory", q("1G")), "1000000000");
        assert_eq!(format_quantity("cpu", q("1024")), "1024");
        assert_eq!(format_quantity("cpu", q("5n")), "0.000000005");
        assert_eq!(format_quantity("memory", q("0")), "0");
    }

    /// Issue 38, "Placement by name can be captured": Nodes of one name in two clusters
    /// (written before names were claimed, or by an admin): `nodeName` and the hostname
    /// selector resolve to the cluster that registered the name first, whatever the other
    /// offers; registered in the same second, the name resolves to neither.
    #[test]
    fn a_name_resolves_to_the_cluster_that_registered_it_first() {
        let at = |n: Node, second: i64| {
            let mut n = n;
            n.metadata.creation_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::from_second(second).unwrap(),
                ));
            n
        };
        let genuine = at(node("b", "node-b", &[("cpu", "1")]), 100);
        let forged = at(node("a", "node-b", &[("cpu", "64")]), 200);
        let nodes = vec![forged.clone(), genuine.clone()];
        for pin in [
            json!({"nodeName": "node-b"}),
            json!({"nodeSelector": {"kubernetes.io/hostname": "node-b"}}),
        ] {
            let d = place(&job(vec![template("t", pin.clone())]), &nodes, NO_TASKS).unwrap();
            assert_eq!(
                nodes_of(&d, "t"),
                ("b".to_string(), vec!["node-b".to_string()]),
                "{pin}"
            );
            // Alone, a Node holds its name.
            let lone = place(
                &job(vec![template("t", pin.clone())]),
                std::slice::from_ref(&forged),
                NO_TASKS,
            );
            assert!(lone.is_ok(), "a lone Node holds its name: {pin}");
            // Only the forged Node fits: the Job waits, saying why.
            let mut big = pin.clone();
            merge(
                &mut big,
                json!({"raw": {"resources": {"requests": {"cpu": "2"}}}}),
            );
            let err = place(&job(vec![template("t", big)]), &nodes, NO_TASKS).unwrap_err();
            assert!(
                err.message
                    .contains("another cluster's Node holds the name"),
                "{pin}: {}",
                err.message
            );
        }
        // Registered in the same second: neither is resolved by name.
        let tied = vec![at(forged, 100), genuine];
        let err = place(
            &job(vec![template("t", json!({"nodeName": "node-b"}))]),
            &tied,
            NO_TASKS,
        )
        .unwrap_err();
        assert!(
            err.message
                .contains("another cluster's Node holds the name"),
            "{}",
            err.message
        );
    }
}
