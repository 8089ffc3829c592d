//! Domain controller: addresses for the replicas of a Domain's Tasks, and one DomainPeer
//! per agent namespace that holds a member.
//!
//! # What it owns
//!
//! - `Domain.status.ipAllocations` (merge patch preconditioned on the Domain's
//!   `resourceVersion`), computed by the pure [`ipam::allocate`], and `status.allocated`
//!   (addresses held by live replicas) and `status.capacity` (usable addresses);
//! - every `DomainPeer` named after a Domain: created, replaced (preconditioned on its
//!   `resourceVersion`) and deleted by this controller, owned (ownerReference) by the
//!   Domain so the garbage collector removes them with it. Its `status` is the agent's;
//! - the `status.message` of a Pending Task with replicas left without an address
//!   (starting [`NO_DOMAIN_IP`]), cleared once they have one;
//! - a Warning Event `NoDomainIP` on the Job of such a Task, once per distinct message.
//!
//! # Members
//!
//! Every replica `0..replicas` of every Task (not being deleted) whose `spec.domain` names
//! the Domain and that a live Job controls and declares in that Domain (the Task is the
//! Job's `<job>-<template>` and the Job's or the template's `domain` is the Domain; see
//! [`members`]) is a member. A Task anyone else wrote joins nothing. Its agent namespace is the Task's namespace (`rlark-<cluster>`),
//! its cluster the Task's `spec.placement.clusterID` (else the namespace without
//! `rlark-`), its Pod `<task>-<i>`, its node the Pod's `status.node` (else the placement's
//! node of that index), its `agentAddress` that Node's `status.network.directAddress`.
//!
//! A namespace gets a DomainPeer while it holds at least one member (with an address, or
//! pending without one). The DomainPeer lists every member of the Domain that has an
//! address (members of one Domain may reach each other; nothing of other Domains, no
//! secrets) and, in `pending`, that namespace's replicas without one.

pub mod ipam;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use futures::stream::BoxStream;
use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Resource as _, ResourceExt as _};
use rlark_api::types::{
    Domain, DomainIpAllocation, DomainPeer, DomainPeerSpec, DomainPendingPod, DomainPodInfo, Job,
    Node, Pod, Task, TaskPhase,
};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::error::Error;
use crate::events::{EventType, Recorder};
use crate::runner::{self, Reconciler};
use ipam::{Replica, ReplicaKey};

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "domain";

/// Reason of a replica without an address (DomainPeer `pending[].reason`, the Job's
/// Warning Event, the start of the Task's `status.message`).
pub const NO_DOMAIN_IP: &str = "NoDomainIP";

/// Longest wait before a Domain is looked at again without a change (released
/// reservations expire on the clock, not on an event).
const MAX_REQUEUE: Duration = Duration::from_secs(600);

/// Most (domain, job) pairs whose last `NoDomainIP` message is remembered.
const MAX_WARNED: usize = 4096;

/// A watch-fed cache, its readiness and the objects its watch touched.
struct Cache<K: kube::Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    ready: watch::Receiver<bool>,
}

fn cache<K>(api: Api<K>) -> (Cache<K>, BoxStream<'static, Result<K, watcher::Error>>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store::<K>();
    // Readiness as a watch channel: kube-runtime's `Store::wait_until_ready` keeps only
    // the last waiter's waker (see task.rs).
    let (ready_tx, ready) = watch::channel(false);
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
        .default_backoff()
        .filter_map(move |event| {
            let object = match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => Some(Ok(o)),
                Ok(watcher::Event::Delete(o)) => Some(Ok(o)),
                Ok(watcher::Event::InitDone) => {
                    ready_tx.send_replace(true);
                    None
                }
                Ok(watcher::Event::Init) => None,
                Err(error) => Some(Err(error)),
            };
            futures::future::ready(object)
        })
        .boxed();
    (Cache { store, ready }, stream)
}

impl<K: kube::Resource<DynamicType = ()> + Clone + 'static> Cache<K> {
    async fn wait_ready(&self, what: &str) -> Result<(), Error> {
        self.ready
            .clone()
            .wait_for(|ready| *ready)
            .await
            .map(|_| ())
            .map_err(|_| Error::CacheUnavailable(format!("the {what} watch ended")))
    }
}

struct DomainState {
    ctx: Arc<Context>,
    tasks: Cache<Task>,
    pods: Cache<Pod>,
    nodes: Cache<Node>,
    peers: Cache<DomainPeer>,
    jobs: Cache<Job>,
    /// Last `NoDomainIP` message recorded per (domain, job): an Event only when it changes.
    warned: Mutex<HashMap<(String, String), String>>,
}

/// The Domain of a Task, if any.
fn domain_of_task(task: &Task) -> Option<String> {
    task.spec.domain.clone().filter(|d| !d.is_empty())
}

/// Run the Domain controller until `shutdown` is cancelled. Watches Domains, and Tasks,
/// Pods, Nodes and DomainPeers (each mapped to the Domains it concerns).
pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    let client = ctx.client.clone();
    let (tasks, task_events) = cache(Api::<Task>::all(client.clone()));
    let (pods, pod_events) = cache(Api::<Pod>::all(client.clone()));
    let (nodes, node_events) = cache(Api::<Node>::all(client.clone()));
    let (peers, peer_events) = cache(Api::<DomainPeer>::all(client.clone()));
    let (jobs, job_events) = cache(Api::<Job>::all(client.clone()));
    let task_store = tasks.store.clone();
    let pod_mapper = {
        let task_store = task_store.clone();
        move |pod: Pod| -> Option<ObjectRef<Domain>> {
            let from_task = crate::task::task_of_pod(&pod)
                .and_then(|r| task_store.get(&r))
                .and_then(|t| domain_of_task(&t));
            from_task
                .or_else(|| pod.spec.domain.clone().filter(|d| !d.is_empty()))
                .map(|d| ObjectRef::new(&d))
        }
    };
    let node_mapper = {
        let task_store = task_store.clone();
        move |node: Node| -> Vec<ObjectRef<Domain>> {
            let namespace = node.namespace();
            let mut domains: Vec<String> = task_store
                .state()
                .iter()
                .filter(|t| t.namespace() == namespace)
                .filter_map(|t| domain_of_task(t))
                .collect();
            domains.sort();
            domains.dedup();
            domains.iter().map(|d| ObjectRef::new(d)).collect()
        }
    };
    let state = Arc::new(DomainState {
        ctx,
        tasks,
        pods,
        nodes,
        peers,
        jobs,
        warned: Mutex::default(),
    });
    let (domain_store, domain_writer) = reflector::store::<Domain>();
    let domain_events = {
        let ctx = Arc::clone(&state.ctx);
        let domain_store = domain_store.clone();
        reflector::reflector(
            domain_writer,
            watcher(Api::<Domain>::all(client), watcher::Config::default()),
        )
        .default_backoff()
        .filter_map(move |event| {
            if let Ok(event) = &event {
                forget_deleted(&ctx.metrics, event, &domain_store);
            }
            futures::future::ready(match event {
                Ok(watcher::Event::Apply(d) | watcher::Event::InitApply(d)) => Some(Ok(d)),
                Ok(watcher::Event::Delete(_) | watcher::Event::Init | watcher::Event::InitDone) => {
                    None
                }
                Err(error) => Some(Err(error)),
            })
        })
    };
    let metrics = Arc::clone(&state.ctx.metrics);
    let controller = Controller::for_stream(domain_events, domain_store)
        .watches_stream(task_events, |task: Task| {
            domain_of_task(&task).map(|d| ObjectRef::new(&d))
        })
        .watches_stream(pod_events, pod_mapper)
        .watches_stream(node_events, node_mapper)
        .watches_stream(job_events, |job: Job| {
            let mut domains: Vec<String> = job
                .spec
                .tasks
                .iter()
                .filter_map(|t| template_domain(&job, t))
                .collect();
            domains.sort();
            domains.dedup();
            domains
                .iter()
                .map(|d| ObjectRef::new(d))
                .collect::<Vec<_>>()
        })
        .watches_stream(peer_events, |peer: DomainPeer| {
            Some(ObjectRef::new(&peer.spec.domain)).filter(|_| !peer.spec.domain.is_empty())
        });
    runner::run(controller, state, metrics, shutdown).await;
}

/// Drops the gauges of Domains that are gone, as the Domain watch says: reconciles never run
/// for a deleted Domain. `store` is the reflector's, already updated with `event`: after a
/// relist (`InitDone`) every Domain it does not hold is forgotten (a deletion the watch missed).
fn forget_deleted(
    metrics: &crate::context::Metrics,
    event: &watcher::Event<Domain>,
    store: &Store<Domain>,
) {
    match event {
        watcher::Event::Delete(domain) => metrics.forget_domain(&domain.name_any()),
        watcher::Event::InitDone => {
            metrics.retain_domains(|name| store.get(&ObjectRef::new(name)).is_some())
        }
        watcher::Event::Apply(_) | watcher::Event::InitApply(_) | watcher::Event::Init => {}
    }
}

impl Reconciler for DomainState {
    type Object = Domain;
    const CONTROLLER: &'static str = CONTROLLER;

    fn span(domain: &Domain) -> tracing::Span {
        tracing::info_span!("reconcile", controller = CONTROLLER, domain = %domain.name_any())
    }

    async fn reconcile(self: Arc<Self>, domain: Arc<Domain>) -> Result<Action, Error> {
        reconcile_domain(&domain, &self).await
    }

    runner::policy_log!(domain);
}

/// A member's Task, namespace and replica index, by allocation key.
struct Member<'a> {
    task: &'a Task,
    namespace: String,
    index: i32,
}

/// The Domain a Job's template `template` joins: the Job's `spec.domain`, else the
/// template's own (as the Job controller copies it into the Task).
pub fn template_domain(job: &Job, template: &rlark_api::types::JobTaskTemplate) -> Option<String> {
    job.spec
        .domain
        .clone()
        .or_else(|| template.spec.domain.clone())
        .filter(|d| !d.is_empty())
}

/// The Job that controls `task` and declares its membership in `domain`: a live Job (by
/// name and uid of the Task's controller ownerReference) with a template whose Task name
/// is the Task's and whose Domain is `domain`. Only such Tasks are members: a Task written
/// by anyone else (an agent may write Tasks in its namespace) does not join a Domain.
fn declaring_job<'a>(
    domain: &str,
    task: &Task,
    jobs: &'a HashMap<String, Arc<Job>>,
) -> Option<&'a Job> {
    let owner = task.owner_references().iter().find(|o| {
        o.controller == Some(true) && o.kind == "Job" && o.api_version == rlark_api::API_VERSION
    })?;
    let job = jobs.get(&owner.name)?;
    if job.metadata.uid.as_deref() != Some(owner.uid.as_str())
        || job.metadata.deletion_timestamp.is_some()
    {
        return None;
    }
    let task_name = task.name_any();
    job.spec
        .tasks
        .iter()
        .find(|t| rlark_api::names::task_name(&owner.name, &t.name) == task_name)
        .filter(|t| template_domain(job, t).as_deref() == Some(domain))
        .map(|_| job.as_ref())
}

/// The replicas of `tasks` in `domain` (pure): what [`ipam::allocate`] is asked to place,
/// and, by key, where each one comes from. Tasks are taken oldest first, so of two Tasks
/// claiming one key the older one is the member.
fn members<'a>(
    domain: &str,
    tasks: &'a [Arc<Task>],
    jobs: &HashMap<String, Arc<Job>>,
) -> (Vec<Replica>, HashMap<ReplicaKey, Member<'a>>) {
    let mut replicas = Vec::new();
    let mut by_key = HashMap::new();
    let mut ordered: Vec<&'a Arc<Task>> = tasks
        .iter()
        .filter(|t| {
            domain_of_task(t).as_deref() == Some(domain) && t.metadata.deletion_timestamp.is_none()
        })
        .collect();
    ordered.sort_by_key(|t| {
        (
            t.metadata.creation_timestamp.as_ref().map(|c| c.0),
            t.namespace(),
            t.name_any(),
        )
    });
    for task in ordered {
        let Some(namespace) = task.namespace() else {
            continue;
        };
        let Some(job) = declaring_job(domain, task, jobs) else {
            continue;
        };
        let cluster = task
            .spec
            .placement
            .as_ref()
            .map(|p| p.cluster_id.clone())
            .filter(|c| !c.is_empty())
            .or_else(|| namespace.strip_prefix("rlark-").map(str::to_string))
            .unwrap_or_default();
        let task_name = task.name_any();
        for index in 0..task.spec.replicas().max(0) {
            let key = ReplicaKey {
                job: job.name_any(),
                task: task_name.clone(),
                index,
            };
            if by_key.contains_key(&key) {
                continue;
            }
            let pod = rlark_api::agent::pod_name(&task_name, index as usize);
            replicas.push(Replica {
                key: key.clone(),
                cluster: cluster.clone(),
                pod: format!("{namespace}/{pod}"),
            });
            by_key.insert(
                key,
                Member {
                    task: task.as_ref(),
                    namespace: namespace.clone(),
                    index,
                },
            );
        }
    }
    (replicas, by_key)
}

/// Where a member runs, for its DomainPeer entry.
struct Placement {
    uid: String,
    pod_namespace: String,
    node: Option<String>,
    agent_address: Option<String>,
}

/// The desired DomainPeer specs, by agent namespace (pure; see the module documentation).
/// `locate` says where the member with that key runs.
fn peer_specs(
    domain: &str,
    net: &IpNet,
    allocations: &[DomainIpAllocation],
    unallocated: &[Replica],
    by_key: &HashMap<ReplicaKey, Member<'_>>,
    locate: impl Fn(&Member<'_>, &str) -> Placement,
) -> BTreeMap<String, DomainPeerSpec> {
    let mut pods = Vec::new();
    let mut namespaces: BTreeMap<String, DomainPeerSpec> = BTreeMap::new();
    let empty = || DomainPeerSpec {
        domain: domain.to_string(),
        cidr: net.to_string(),
        prefix_len: i32::from(net.prefix_len()),
        ..Default::default()
    };
    for entry in allocations.iter().filter(|e| e.released_at.is_none()) {
        let Some(member) = entry.task.as_ref().and_then(|task| {
            by_key.get(&ReplicaKey {
                job: entry.job.clone().unwrap_or_default(),
                task: task.clone(),
                index: entry.index?,
            })
        }) else {
            continue;
        };
        let name = rlark_api::agent::pod_name(&member.task.name_any(), member.index as usize);
        let placement = locate(member, &name);
        pods.push(DomainPodInfo {
            global_namespace: member.namespace.clone(),
            namespace: placement.pod_namespace,
            name,
            uid: placement.uid,
            node: placement.node,
            ip: entry.ip.clone(),
            local_ip: None,
            cluster: entry.cluster.clone().unwrap_or_default(),
            task: Some(member.task.name_any()),
            agent_address: placement.agent_address,
        });
        namespaces
            .entry(member.namespace.clone())
            .or_insert_with(empty);
    }
    for replica in unallocated {
        let Some(member) = by_key.get(&replica.key) else {
            continue;
        };
        namespaces
            .entry(member.namespace.clone())
            .or_insert_with(empty)
            .pending
            .push(DomainPendingPod {
                name: rlark_api::agent::pod_name(&replica.key.task, replica.key.index as usize),
                reason: NO_DOMAIN_IP.into(),
                message: no_ip_message(domain, net),
            });
    }
    for spec in namespaces.values_mut() {
        spec.pods = pods.clone();
    }
    namespaces
}

/// Why a replica has no address.
fn no_ip_message(domain: &str, net: &IpNet) -> String {
    format!(
        "Domain {domain:?} has no free address: all {} usable addresses of {net} are held",
        rlark_api::validation::usable_addresses(net)
    )
}

/// The Task `status.message` for replicas `indexes` without an address.
fn task_message(domain: &str, net: &IpNet, indexes: &[i32]) -> String {
    let list: Vec<String> = indexes.iter().map(i32::to_string).collect();
    format!(
        "{NO_DOMAIN_IP}: replica{} {} without an address: {}",
        if indexes.len() == 1 { "" } else { "s" },
        list.join(", "),
        no_ip_message(domain, net)
    )
}

/// When the next released reservation expires (to requeue then).
fn next_expiry(allocations: &[DomainIpAllocation], now: Timestamp) -> Option<Duration> {
    let ttl = ipam::RELEASE_TTL.as_secs() as i64;
    allocations
        .iter()
        .filter_map(|e| e.released_at.as_ref())
        .map(|t| {
            let left = t.0.as_second().saturating_add(ttl) - now.as_second();
            Duration::from_secs(left.max(1) as u64)
        })
        .min()
}

async fn reconcile_domain(domain: &Domain, state: &DomainState) -> Result<Action, Error> {
    let name = domain
        .metadata
        .name
        .clone()
        .ok_or_else(|| Error::MissingName("Domain".into()))?;
    if domain.metadata.deletion_timestamp.is_some() {
        // Its DomainPeers go with it (ownerReferences).
        state.ctx.metrics.forget_domain(&name);
        return Ok(Action::await_change());
    }
    let net: IpNet = match domain.spec.cidr.parse() {
        Ok(net) => net,
        Err(_) => {
            // Admission refuses such a Domain; one stored before that is left alone.
            tracing::warn!(domain = %name, cidr = %domain.spec.cidr, "domain has an invalid CIDR; not allocating");
            return Ok(Action::await_change());
        }
    };
    state.tasks.wait_ready("task").await?;
    state.pods.wait_ready("pod").await?;
    state.nodes.wait_ready("node").await?;
    state.peers.wait_ready("domainpeer").await?;
    state.jobs.wait_ready("job").await?;
    let now = Timestamp::now();
    let tasks = state.tasks.store.state();
    let jobs: HashMap<String, Arc<Job>> = state
        .jobs
        .store
        .state()
        .into_iter()
        .map(|j| (j.name_any(), j))
        .collect();
    let (desired, by_key) = members(&name, &tasks, &jobs);
    let current = domain
        .status
        .as_ref()
        .map(|s| s.ip_allocations.clone())
        .unwrap_or_default();
    let outcome = ipam::allocate(&net, &current, &desired, now);
    let capacity = rlark_api::validation::usable_addresses(&net);
    let status = domain.status.clone().unwrap_or_default();
    let allocated = i64::try_from(outcome.live()).unwrap_or(i64::MAX);
    if outcome.allocations != current
        || status.allocated != Some(allocated)
        || status.capacity != Some(capacity.to_string())
    {
        let body = json!({
            "metadata": {"resourceVersion": domain.resource_version()},
            "status": {
                "ipAllocations": outcome.allocations,
                "allocated": allocated,
                "capacity": capacity.to_string(),
            },
        });
        let api: Api<Domain> = Api::all(state.ctx.client.clone());
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
            .await?;
        tracing::info!(
            domain = %name,
            live = outcome.live(),
            held = outcome.allocations.len(),
            unallocated = outcome.unallocated.len(),
            "domain allocations updated"
        );
    }
    state
        .ctx
        .metrics
        .set_domain(&name, outcome.live(), capacity);

    let pods = state.pods.store.clone();
    let nodes = state.nodes.store.clone();
    let locate = |member: &Member<'_>, pod_name: &str| {
        let pod = pods.get(&ObjectRef::new(pod_name).within(&member.namespace));
        let node = pod
            .as_ref()
            .and_then(|p| p.status.as_ref()?.node.clone())
            .filter(|n| !n.is_empty())
            .or_else(|| {
                let placement = member.task.spec.placement.as_ref()?;
                placement.nodes.get(member.index as usize).cloned()
            });
        let agent_address = node.as_ref().and_then(|n| {
            nodes
                .get(&ObjectRef::new(n).within(&member.namespace))?
                .status
                .as_ref()?
                .network
                .as_ref()?
                .direct_address
                .clone()
        });
        Placement {
            uid: pod
                .as_ref()
                .and_then(|p| p.metadata.uid.clone())
                .unwrap_or_default(),
            pod_namespace: pod
                .as_ref()
                .and_then(|p| p.spec.pod_namespace.clone())
                .unwrap_or_else(|| member.namespace.clone()),
            node,
            agent_address,
        }
    };
    let specs = peer_specs(
        &name,
        &net,
        &outcome.allocations,
        &outcome.unallocated,
        &by_key,
        locate,
    );
    sync_peers(domain, &name, specs, state).await?;
    report_unallocated(&name, &net, &tasks, &outcome.unallocated, state).await?;
    let requeue = next_expiry(&outcome.allocations, now)
        .unwrap_or(MAX_REQUEUE)
        .min(MAX_REQUEUE);
    Ok(Action::requeue(requeue))
}

/// Create, replace or delete the DomainPeers of `name` so they are `specs`.
async fn sync_peers(
    domain: &Domain,
    name: &str,
    specs: BTreeMap<String, DomainPeerSpec>,
    state: &DomainState,
) -> Result<(), Error> {
    let owner = domain
        .controller_owner_ref(&())
        .ok_or_else(|| Error::Invalid(format!("domain {name} has no uid")))?;
    let existing: HashMap<String, Arc<DomainPeer>> = state
        .peers
        .store
        .state()
        .into_iter()
        .filter(|p| p.name_any() == name)
        .filter_map(|p| Some((p.namespace()?, p)))
        .collect();
    for (namespace, peer) in &existing {
        if !specs.contains_key(namespace) && peer.metadata.deletion_timestamp.is_none() {
            let api: Api<DomainPeer> = Api::namespaced(state.ctx.client.clone(), namespace);
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {
                    tracing::info!(domain = %name, %namespace, "domainpeer deleted: no member left")
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => return Err(error.into()),
            }
        }
    }
    for (namespace, spec) in specs {
        let api: Api<DomainPeer> = Api::namespaced(state.ctx.client.clone(), &namespace);
        match existing.get(&namespace) {
            Some(peer) => {
                let owned = peer.owner_references().iter().any(|o| o.uid == owner.uid);
                if peer.spec == spec && owned {
                    continue;
                }
                let mut replacement = DomainPeer::clone(peer);
                replacement.spec = spec;
                if !owned {
                    replacement
                        .metadata
                        .owner_references
                        .get_or_insert_with(Vec::new)
                        .push(owner.clone());
                }
                // resourceVersion of the cached copy: a stale cache is a conflict, retried.
                api.replace(name, &PostParams::default(), &replacement)
                    .await?;
                tracing::debug!(domain = %name, %namespace, "domainpeer updated");
            }
            None => {
                let peer = DomainPeer {
                    metadata: ObjectMeta {
                        name: Some(name.to_string()),
                        namespace: Some(namespace.clone()),
                        owner_references: Some(vec![owner.clone()]),
                        ..Default::default()
                    },
                    spec,
                    status: None,
                };
                match api.create(&PostParams::default(), &peer).await {
                    Ok(_) => tracing::info!(domain = %name, %namespace, "domainpeer created"),
                    // The cache has not seen it yet: the watch event reconciles again.
                    Err(kube::Error::Api(status)) if status.code == 409 => {}
                    Err(error) => return Err(error.into()),
                }
            }
        }
    }
    Ok(())
}

/// Say why replicas have no address: on each Pending Task (its `status.message`), and on
/// each Job (one Warning Event per distinct message); clear the Task message once every
/// replica has one.
async fn report_unallocated(
    domain: &str,
    net: &IpNet,
    tasks: &[Arc<Task>],
    unallocated: &[Replica],
    state: &DomainState,
) -> Result<(), Error> {
    let mut per_task: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    let mut job_of_task: HashMap<&str, &str> = HashMap::new();
    for replica in unallocated {
        per_task
            .entry(replica.key.task.as_str())
            .or_default()
            .push(replica.key.index);
        job_of_task.insert(replica.key.task.as_str(), replica.key.job.as_str());
    }
    let mut per_job: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (task, indexes) in &per_task {
        if let Some(job) = job_of_task.get(task).filter(|j| !j.is_empty()) {
            per_job
                .entry(job.to_string())
                .or_default()
                .push(format!("{task}: {}", task_message(domain, net, indexes)));
        }
    }
    for task in tasks
        .iter()
        .filter(|t| domain_of_task(t).as_deref() == Some(domain))
    {
        let task_name = task.name_any();
        let status = task.status.clone().unwrap_or_default();
        let pending = matches!(status.phase, None | Some(TaskPhase::Pending));
        let ours = status
            .message
            .as_deref()
            .is_some_and(|m| m.starts_with(NO_DOMAIN_IP));
        let desired = per_task
            .get(task_name.as_str())
            .map(|indexes| task_message(domain, net, indexes));
        let write = match &desired {
            Some(message) if pending && status.message.as_ref() != Some(message) => {
                Some(json!(message))
            }
            None if pending && ours => Some(serde_json::Value::Null),
            _ => None,
        };
        if let (Some(message), Some(namespace)) = (write, task.namespace()) {
            let body = json!({
                "metadata": {"resourceVersion": task.resource_version()},
                "status": {"message": message},
            });
            let api: Api<Task> = Api::namespaced(state.ctx.client.clone(), &namespace);
            api.patch_status(&task_name, &PatchParams::default(), &Patch::Merge(&body))
                .await?;
        }
    }
    let stale: Vec<(String, String)> = {
        let warned = state.warned.lock().unwrap_or_else(|e| e.into_inner());
        warned
            .keys()
            .filter(|(d, j)| d == domain && !per_job.contains_key(j))
            .cloned()
            .collect()
    };
    for key in stale {
        state
            .warned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
    }
    for (job, messages) in per_job {
        let message = messages.join("; ");
        let key = (domain.to_string(), job.clone());
        let seen = state
            .warned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .is_some_and(|m| *m == message);
        if seen {
            continue;
        }
        let api: Api<Job> = Api::all(state.ctx.client.clone());
        let Some(job_object) = api.get_opt(&job).await? else {
            continue;
        };
        state
            .ctx
            .recorder
            .record(
                &Recorder::reference(&job_object),
                EventType::Warning,
                NO_DOMAIN_IP,
                &message,
            )
            .await;
        tracing::warn!(%domain, %job, %message, "replicas have no domain address");
        let mut warned = state.warned.lock().unwrap_or_else(|e| e.into_inner());
        if warned.len() >= MAX_WARNED {
            // Forgetting only costs a repeated Event.
            warned.clear();
        }
        warned.insert(key, message);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
