//! A simulated member Kubernetes cluster, for testing the Kubernetes runtime without a
//! kube-apiserver: an rlark server in member simulation (the Kubernetes built-in kinds of
//! [`kinds`] served as stored objects, through the API server's extra-kinds hook, with Pod
//! logs and exec from [`SimLogs`] and [`SimExec`]) plus [`KubeSim`], which plays the parts
//! of the cluster that act on those objects.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use rlark_testkit::kubesim::{MemberCluster, MemberNode, Phase};
//! let cluster = MemberCluster::start().await?;
//! cluster.sim().add_node(MemberNode::new("gpu-0").gpus(8, "NVIDIA-A100-SXM4-80GB")).await?;
//! // ... the code under test creates a StatefulSet `actor` in namespace `w` ...
//! cluster.sim().write_log("w", "actor-0", "main", "step 1\n");
//! cluster.sim().set_pod_phase("w", "actor-0", Phase::Failed { exit_code: 3 }).await?;
//! cluster.stop().await?;
//! # Ok(()) }
//! ```
//!
//! What it plays: the StatefulSet, Deployment (through ReplicaSets), DaemonSet and Job
//! controllers, and with [`Extras::openkruise`] OpenKruise's CloneSet (its CRD served,
//! Pods created directly) (Pods named and labelled as Kubernetes names them, controller
//! ownerReferences, replicas, Job `suspend`, `backoffLimit`, `activeDeadlineSeconds`,
//! workload status and conditions), a scheduler (node selectors, taints, GPUs, readiness,
//! `unschedulable`), and a kubelet per Node (Pod phase, container statuses with restart
//! counts, exit codes and waiting reasons, Pod IPs, logs). Pods start on their own
//! ([`Policy::AutoRun`], the default) or wait until the test says ([`Policy::Hold`]); they
//! stop, fail or restart when the test says ([`KubeSim::set_pod_phase`]).
//!
//! Exec (`pods/exec`) runs the command as a local process of the test in a directory per
//! Pod and container ([`SimExec`]): a simulation, not a container.
//!
//! Images are not pulled: a Pod that waits ([`Policy::Hold`]) waits on its images (no
//! image ID, a `Pulling` Event per container) until the test says an image is pulled
//! ([`KubeSim::pull_image`]: a `Pulled` Event with its size) or the Pod runs; a pull
//! failure is a waiting reason the test sets.
//!
//! What it does not: attach and port-forward; run images; Services, ConfigMaps, Secrets and PVCs
//! are stored but nothing acts on them (no endpoints, no volume binding); rolling updates
//! (a changed Deployment template replaces every Pod at once), Indexed Jobs, Pod
//! disruption, preemption, resource accounting beyond `nvidia.com/gpu`.

mod exec;
pub mod kinds;
mod kubelet;
mod logs;
mod plan;

pub use exec::SimExec;
pub use kubelet::Phase;
pub use logs::SimLogs;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail};
use futures::StreamExt;
use kube::Api;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use rlark_apiserver::pod_sources::PodSources;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::TestServer;
use kubelet::{ContainerState, PodRecord};
use plan::{Action, Kind, name_of, uid_of};

/// At most this many passes in one [`KubeSim::settle`].
const MAX_PASSES: usize = 200;

/// How new Pods start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Policy {
    /// Scheduled Pods run at once (containers running and ready).
    #[default]
    AutoRun,
    /// Scheduled Pods wait (`ContainerCreating`) until [`KubeSim::set_pod_phase`].
    Hold,
}

/// A member Node to create ([`KubeSim::add_node`]).
#[derive(Clone, Debug)]
pub struct MemberNode {
    pub name: String,
    /// CPU capacity (a Kubernetes quantity).
    pub cpu: String,
    pub memory: String,
    pub gpus: u32,
    /// `nvidia.com/gpu.product` label, as NVIDIA's GPU feature discovery writes it.
    pub gpu_model: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// `spec.taints`, as Kubernetes writes them (`{"key", "value", "effect"}`).
    pub taints: Vec<Value>,
}

impl MemberNode {
    /// A Ready Node with 8 CPUs, 32Gi of memory and no GPU.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            cpu: "8".into(),
            memory: "32Gi".into(),
            gpus: 0,
            gpu_model: None,
            labels: BTreeMap::new(),
            taints: Vec::new(),
        }
    }

    pub fn cpu(mut self, cpu: &str) -> Self {
        self.cpu = cpu.to_string();
        self
    }

    pub fn memory(mut self, memory: &str) -> Self {
        self.memory = memory.to_string();
        self
    }

    /// `count` GPUs of `model`.
    pub fn gpus(mut self, count: u32, model: &str) -> Self {
        self.gpus = count;
        self.gpu_model = Some(model.to_string());
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_string(), value.to_string());
        self
    }

    pub fn taint(mut self, key: &str, value: &str, effect: &str) -> Self {
        self.taints
            .push(json!({"key": key, "value": value, "effect": effect}));
        self
    }
}

/// `(namespace, name)`.
type PodKey = (String, String);

struct SimState {
    policy: Policy,
    records: HashMap<PodKey, PodRecord>,
    next_ip: u32,
    /// Sequence for generated Pod names.
    seq: u64,
    /// Some unfinished Job has a deadline: passes must run on a timer too.
    deadlines: bool,
}

/// What the simulated cluster serves beyond the built-in kinds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extras {
    /// OpenKruise's CloneSet (`apps.kruise.io/v1alpha1`), CRD and controller.
    pub openkruise: bool,
}

struct Inner {
    client: kube::Client,
    extras: Extras,
    logs: SimLogs,
    state: Mutex<SimState>,
    /// One pass at a time.
    pass: tokio::sync::Mutex<()>,
    wake: tokio::sync::Notify,
}

fn resource(kind: Kind) -> ApiResource {
    let (group, version, plural) = match kind {
        Kind::Pod => ("", "v1", "pods"),
        Kind::ReplicaSet => ("apps", "v1", "replicasets"),
        Kind::Deployment => ("apps", "v1", "deployments"),
        Kind::StatefulSet => ("apps", "v1", "statefulsets"),
        Kind::DaemonSet => ("apps", "v1", "daemonsets"),
        Kind::Job => ("batch", "v1", "jobs"),
        Kind::CloneSet => ("apps.kruise.io", "v1alpha1", "clonesets"),
    };
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind.name()), plural)
}

fn node_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Node"), "nodes")
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A merge patch turning `old` status into `new` (top-level keys `new` lacks are removed).
fn status_patch(old: Option<&Value>, new: &Value) -> Value {
    let mut patch = new.clone();
    if let (Some(Value::Object(old)), Value::Object(map)) = (old, &mut patch) {
        for key in old.keys() {
            if !map.contains_key(key) {
                map.insert(key.clone(), Value::Null);
            }
        }
    }
    json!({"status": patch})
}

fn is_gone(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404 || status.code == 409)
}

fn containers_of(pod: &Value) -> Vec<String> {
    kubelet::images(pod)
        .into_iter()
        .map(|(c, _)| c)
        .filter(|c| !c.is_empty())
        .collect()
}

impl Inner {
    /// Pod `namespace/name` as JSON; an error when it is not there.
    async fn get_pod(&self, namespace: &str, name: &str) -> anyhow::Result<Value> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &resource(Kind::Pod));
        let pod = api
            .get_opt(name)
            .await
            .with_context(|| format!("get pod {namespace}/{name}"))?
            .with_context(|| format!("pod {namespace}/{name} does not exist"))?;
        Ok(serde_json::to_value(pod)?)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SimState> {
        // A panic while holding this lock is a test bug; the state stays usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn list(&self, ar: &ApiResource) -> anyhow::Result<Vec<Value>> {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), ar);
        let list = api
            .list(&ListParams::default())
            .await
            .with_context(|| format!("list {}", ar.plural))?;
        list.items
            .into_iter()
            .map(|item| serde_json::to_value(item).context("encode object"))
            .collect()
    }

    fn api(&self, kind: Kind, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, &resource(kind))
    }

    /// Carry out one action in `namespace`. Returns whether it wrote; an object that went
    /// away (or already exists) meanwhile is not an error: the next pass sees the change.
    async fn act(&self, namespace: &str, action: Action) -> anyhow::Result<bool> {
        let result = match action {
            Action::Create { kind, object } => {
                let object: DynamicObject =
                    serde_json::from_value(object).context("decode object to create")?;
                tracing::debug!(namespace, kind = kind.name(), name = ?object.metadata.name, "kubesim create");
                self.api(kind, namespace)
                    .create(&PostParams::default(), &object)
                    .await
                    .map(drop)
            }
            Action::Delete { kind, name } => {
                tracing::debug!(namespace, kind = kind.name(), name, "kubesim delete");
                self.api(kind, namespace)
                    .delete(&name, &DeleteParams::default())
                    .await
                    .map(drop)
            }
            Action::Patch { kind, name, patch } => self
                .api(kind, namespace)
                .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .map(drop),
            Action::Status { kind, name, status } => {
                let api = self.api(kind, namespace);
                let old = match api.get_opt(&name).await? {
                    Some(object) => serde_json::to_value(object)?.get("status").cloned(),
                    None => return Ok(false),
                };
                api.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(status_patch(old.as_ref(), &status)),
                )
                .await
                .map(drop)
            }
        };
        match result {
            Ok(()) => Ok(true),
            Err(error) if is_gone(&error) => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    /// A new record for a Pod the simulator has not seen.
    fn record(&self, state: &mut SimState, pod: &Value) -> PodRecord {
        state.next_ip += 1;
        let n = state.next_ip;
        let now = now();
        PodRecord {
            uid: uid_of(pod).to_string(),
            state: match state.policy {
                Policy::AutoRun => ContainerState::Running,
                Policy::Hold => ContainerState::Waiting("ContainerCreating".into()),
            },
            restarts: 0,
            last_terminated: None,
            started_at: now,
            finished_at: None,
            pod_ip: format!("10.244.{}.{}", n / 250, n % 250 + 2),
            pulled: Default::default(),
        }
    }

    /// Write the Event the kubelet on `node` writes about `container` of `pod`.
    async fn kubelet_event(
        &self,
        pod: &Value,
        node: &str,
        container: &str,
        reason: &str,
        message: &str,
    ) -> anyhow::Result<()> {
        let namespace = pod
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("");
        let name = name_of(pod);
        let now = now();
        let event: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": format!("{name}."), "namespace": namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name,
                "namespace": namespace, "uid": uid_of(pod),
                "fieldPath": format!("spec.containers{{{container}}}")},
            "reason": reason, "message": message, "type": "Normal",
            "source": {"component": "kubelet", "host": node},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }))?;
        let events =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Event"), "events");
        Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, &events)
            .create(&PostParams::default(), &event)
            .await
            .with_context(|| format!("create the {reason} event of pod {namespace}/{name}"))?;
        Ok(())
    }

    /// One pass over the whole cluster. Returns the number of writes.
    async fn pass(&self) -> anyhow::Result<usize> {
        let _one = self.pass.lock().await;
        let nodes = self.list(&node_resource()).await?;
        let mut pods = self.list(&resource(Kind::Pod)).await?;
        let mut writes = 0;

        // Scheduler.
        let unbound: Vec<usize> = (0..pods.len())
            .filter(|&i| {
                pods[i]
                    .pointer("/spec/nodeName")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                    && !plan::is_deleting(&pods[i])
            })
            .collect();
        for i in unbound {
            let namespace = pods[i]
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let name = name_of(&pods[i]).to_string();
            match kubelet::schedule(&pods[i], &nodes, &pods) {
                Ok(node) => {
                    let wrote = self
                        .act(
                            &namespace,
                            Action::Patch {
                                kind: Kind::Pod,
                                name,
                                patch: json!({"spec": {"nodeName": node}}),
                            },
                        )
                        .await?;
                    if wrote {
                        pods[i]["spec"]["nodeName"] = json!(node);
                        writes += 1;
                    }
                }
                Err(message) => {
                    let at = pods[i]
                        .pointer("/status/conditions/0/lastTransitionTime")
                        .and_then(Value::as_str)
                        .map_or_else(now, str::to_string);
                    let status = kubelet::unschedulable_status(&message, &at);
                    if pods[i].get("status") != Some(&status) {
                        writes += usize::from(
                            self.act(
                                &namespace,
                                Action::Status {
                                    kind: Kind::Pod,
                                    name,
                                    status,
                                },
                            )
                            .await?,
                        );
                    }
                }
            }
        }

        // Kubelets.
        let host_ips: HashMap<&str, String> = nodes
            .iter()
            .map(|n| {
                let ip = n
                    .pointer("/status/addresses")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .find(|a| a["type"] == "InternalIP")
                    .and_then(|a| a["address"].as_str())
                    .unwrap_or("")
                    .to_string();
                (name_of(n), ip)
            })
            .collect();
        let mut statuses = Vec::new();
        // Pods whose containers start waiting on their images now: (pod, node).
        let mut pulling: Vec<(Value, String)> = Vec::new();
        {
            let mut state = self.lock();
            let live: Vec<PodKey> = pods
                .iter()
                .map(|p| {
                    (
                        p.pointer("/metadata/namespace")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                        name_of(p).to_string(),
                    )
                })
                .collect();
            let gone: Vec<PodKey> = state
                .records
                .iter()
                .filter(|(key, record)| {
                    !pods
                        .iter()
                        .zip(&live)
                        .any(|(p, k)| k == *key && uid_of(p) == record.uid)
                })
                .map(|(key, _)| key.clone())
                .collect();
            for key in gone {
                state.records.remove(&key);
                self.logs.forget_pod(&key.0, &key.1);
            }
            for (pod, key) in pods.iter().zip(&live) {
                let node = pod
                    .pointer("/spec/nodeName")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let Some(host_ip) = host_ips.get(node) else {
                    continue;
                };
                if plan::is_deleting(pod) {
                    continue;
                }
                if !state.records.contains_key(key) {
                    let record = self.record(&mut state, pod);
                    if matches!(record.state, ContainerState::Waiting(_)) {
                        pulling.push((pod.clone(), node.to_string()));
                    }
                    state.records.insert(key.clone(), record);
                }
                let record = &state.records[key];
                let status = kubelet::pod_status(pod, record, host_ip);
                if pod.get("status") != Some(&status) {
                    statuses.push((key.clone(), status));
                }
            }
        }
        for (pod, node) in &pulling {
            for (container, image) in kubelet::images(pod) {
                let message = format!("Pulling image \"{image}\"");
                self.kubelet_event(pod, node, &container, "Pulling", &message)
                    .await?;
            }
        }
        for ((namespace, name), status) in statuses {
            if let Some(pod) = pods.iter_mut().find(|p| {
                name_of(p) == name
                    && p.pointer("/metadata/namespace").and_then(Value::as_str) == Some(&namespace)
            }) {
                pod["status"] = status.clone();
            }
            writes += usize::from(
                self.act(
                    &namespace,
                    Action::Status {
                        kind: Kind::Pod,
                        name,
                        status,
                    },
                )
                .await?,
            );
        }

        // Workload controllers, namespace by namespace.
        let replica_sets = self.list(&resource(Kind::ReplicaSet)).await?;
        let deployments = self.list(&resource(Kind::Deployment)).await?;
        let stateful_sets = self.list(&resource(Kind::StatefulSet)).await?;
        let daemon_sets = self.list(&resource(Kind::DaemonSet)).await?;
        let jobs = self.list(&resource(Kind::Job)).await?;
        let clone_sets = if self.extras.openkruise {
            self.list(&resource(Kind::CloneSet)).await?
        } else {
            Vec::new()
        };
        let namespace_of = |o: &Value| {
            o.pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let in_namespace = |objects: &[Value], namespace: &str| -> Vec<Value> {
            objects
                .iter()
                .filter(|o| namespace_of(o) == namespace)
                .cloned()
                .collect()
        };
        let now_text = now();
        let now_seconds = chrono::Utc::now().timestamp();
        let mut planned: Vec<(String, Action)> = Vec::new();
        let mut deadlines = false;
        {
            let mut state = self.lock();
            let live = |objects: &[Value]| -> Vec<Value> {
                objects
                    .iter()
                    .filter(|o| !plan::is_deleting(o))
                    .cloned()
                    .collect()
            };
            for sts in live(&stateful_sets) {
                let ns = namespace_of(&sts);
                planned.extend(
                    plan::stateful_set(&sts, &in_namespace(&pods, &ns))
                        .into_iter()
                        .map(|a| (ns.clone(), a)),
                );
            }
            for deploy in live(&deployments) {
                let ns = namespace_of(&deploy);
                planned.extend(
                    plan::deployment(&deploy, &in_namespace(&replica_sets, &ns), &now_text)
                        .into_iter()
                        .map(|a| (ns.clone(), a)),
                );
            }
            for cs in live(&clone_sets) {
                let ns = namespace_of(&cs);
                planned.extend(
                    plan::clone_set(&cs, &in_namespace(&pods, &ns), &mut state.seq)
                        .into_iter()
                        .map(|a| (ns.clone(), a)),
                );
            }
            for rs in live(&replica_sets) {
                let ns = namespace_of(&rs);
                planned.extend(
                    plan::replica_set(&rs, &in_namespace(&pods, &ns), &mut state.seq)
                        .into_iter()
                        .map(|a| (ns.clone(), a)),
                );
            }
            for ds in live(&daemon_sets) {
                let ns = namespace_of(&ds);
                planned.extend(
                    plan::daemon_set(&ds, &in_namespace(&pods, &ns), &nodes, &mut state.seq)
                        .into_iter()
                        .map(|a| (ns.clone(), a)),
                );
            }
            for job in live(&jobs) {
                let ns = namespace_of(&job);
                let unfinished = !job
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .any(|c| {
                        matches!(c["type"].as_str(), Some("Complete" | "Failed"))
                            && c["status"] == "True"
                    });
                deadlines |= unfinished && job.pointer("/spec/activeDeadlineSeconds").is_some();
                planned.extend(
                    plan::job(
                        &job,
                        &in_namespace(&pods, &ns),
                        &now_text,
                        now_seconds,
                        &mut state.seq,
                    )
                    .into_iter()
                    .map(|a| (ns.clone(), a)),
                );
            }
            state.deadlines = deadlines;
        }
        for (namespace, action) in planned {
            writes += usize::from(self.act(&namespace, action).await?);
        }
        Ok(writes)
    }

    async fn settle(&self) -> anyhow::Result<()> {
        for _ in 0..MAX_PASSES {
            if self.pass().await? == 0 {
                return Ok(());
            }
        }
        bail!("the simulated cluster still changed after {MAX_PASSES} passes")
    }
}

/// The simulated controllers, scheduler and kubelets of a member cluster, acting on the
/// objects of an rlark server in member simulation through its Kubernetes API. Passes run
/// when any watched object changes and when a test method asks; each pass reads the whole
/// cluster and writes only what differs, so the simulator converges and then stays quiet.
pub struct KubeSim {
    inner: Arc<Inner>,
    shutdown: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl KubeSim {
    /// Start acting on the cluster `client` talks to, reading logs from `logs` (the source
    /// the server was given).
    pub fn start(client: kube::Client, logs: SimLogs) -> Self {
        Self::start_with(client, logs, Extras::default())
    }

    /// [`Self::start`], also playing the controllers of `extras`.
    pub fn start_with(client: kube::Client, logs: SimLogs, extras: Extras) -> Self {
        let inner = Arc::new(Inner {
            client: client.clone(),
            extras,
            logs,
            state: Mutex::new(SimState {
                policy: Policy::default(),
                records: HashMap::new(),
                next_ip: 0,
                seq: 0,
                deadlines: false,
            }),
            pass: tokio::sync::Mutex::new(()),
            wake: tokio::sync::Notify::new(),
        });
        let shutdown = CancellationToken::new();
        let mut tasks = Vec::new();
        let mut watched: Vec<ApiResource> = [
            Kind::Pod,
            Kind::ReplicaSet,
            Kind::Deployment,
            Kind::StatefulSet,
            Kind::DaemonSet,
            Kind::Job,
        ]
        .into_iter()
        .map(resource)
        .collect();
        if extras.openkruise {
            watched.push(resource(Kind::CloneSet));
        }
        watched.push(node_resource());
        for ar in watched {
            let inner = Arc::clone(&inner);
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
            let stop = shutdown.clone();
            tasks.push(tokio::spawn(async move {
                let events = watcher(api, watcher::Config::default()).default_backoff();
                let wake = events.for_each(|event| {
                    if let Err(error) = event {
                        tracing::debug!(%error, resource = %ar.plural, "kubesim watch error");
                    }
                    inner.wake.notify_one();
                    futures::future::ready(())
                });
                tokio::select! {
                    () = wake => {}
                    () = stop.cancelled() => {}
                }
            }));
        }
        let driver = Arc::clone(&inner);
        let stop = shutdown.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let deadlines = driver.lock().deadlines;
                let tick = if deadlines {
                    Duration::from_millis(500)
                } else {
                    Duration::from_secs(3600)
                };
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = driver.wake.notified() => {}
                    () = tokio::time::sleep(tick) => {}
                }
                // Let a burst of events arrive before reading the cluster.
                tokio::time::sleep(Duration::from_millis(20)).await;
                if let Err(error) = driver.settle().await {
                    tracing::warn!(error = format!("{error:#}"), "kubesim pass failed");
                }
            }
        }));
        Self {
            inner,
            shutdown,
            tasks,
        }
    }

    /// How Pods scheduled from now on start.
    pub fn set_policy(&self, policy: Policy) {
        self.inner.lock().policy = policy;
    }

    /// Run passes until one changes nothing (at most 200), then return: everything the
    /// cluster would do in reaction to what happened so far has been written.
    pub async fn settle(&self) -> anyhow::Result<()> {
        self.inner.settle().await
    }

    /// Make Pod `namespace/name`'s containers do what `phase` says (see [`Phase`] for
    /// restarts), then [`Self::settle`]: on return the Pod's status and its workload's
    /// status show it. Ending containers end their log (a follow stream ends); a restart
    /// keeps the old log as the previous one.
    pub async fn set_pod_phase(
        &self,
        namespace: &str,
        name: &str,
        phase: Phase,
    ) -> anyhow::Result<()> {
        let pod = self.inner.get_pod(namespace, name).await?;
        let (restarted, ended) = {
            let mut state = self.inner.lock();
            let key = (namespace.to_string(), name.to_string());
            let fresh = state
                .records
                .get(&key)
                .is_none_or(|r| r.uid != uid_of(&pod));
            if fresh {
                let record = self.inner.record(&mut state, &pod);
                state.records.insert(key.clone(), record);
            }
            let record = state.records.get_mut(&key).context("pod record")?;
            kubelet::apply_phase(record, kubelet::restart_policy(&pod), &phase, &now())
        };
        for container in containers_of(&pod) {
            if restarted {
                self.inner.logs.restart(namespace, name, &container);
            } else if ended {
                self.inner.logs.close(namespace, name, &container);
            }
        }
        self.settle().await
    }

    /// The kubelet finished pulling `image` for Pod `namespace/name`, whose containers
    /// wait ([`Policy::Hold`]): the containers with that image report an image ID, and a
    /// `Pulled` Event says its size and how long the pull took, as a 1.28+ kubelet writes
    /// it. Then [`Self::settle`].
    pub async fn pull_image(
        &self,
        namespace: &str,
        name: &str,
        image: &str,
        size_bytes: u64,
        took: Duration,
    ) -> anyhow::Result<()> {
        let pod = self.inner.get_pod(namespace, name).await?;
        let containers: Vec<String> = kubelet::images(&pod)
            .into_iter()
            .filter(|(_, i)| i == image)
            .map(|(c, _)| c)
            .collect();
        if containers.is_empty() {
            bail!("no container of pod {namespace}/{name} has image {image:?}");
        }
        {
            let mut state = self.inner.lock();
            let key = (namespace.to_string(), name.to_string());
            let record = state
                .records
                .get_mut(&key)
                .filter(|r| r.uid == uid_of(&pod))
                .with_context(|| format!("pod {namespace}/{name} is not on a node yet"))?;
            record.pulled.insert(image.to_string());
        }
        let node = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let seconds = format!("{:.3}s", took.as_secs_f64());
        let message = format!(
            "Successfully pulled image \"{image}\" in {seconds} ({seconds} including waiting). Image size: {size_bytes} bytes."
        );
        for container in containers {
            self.inner
                .kubelet_event(&pod, &node, &container, "Pulled", &message)
                .await?;
        }
        self.settle().await
    }

    /// Append `text` to the log of `container` in Pod `namespace/pod` (what
    /// `GET .../pods/{pod}/log` returns; follow streams get it as it is written).
    pub fn write_log(&self, namespace: &str, pod: &str, container: &str, text: &str) {
        self.inner.logs.write(namespace, pod, container, text);
    }

    /// Create a Ready Node (capacity = allocatable; GPU model label; `Ready`,
    /// `MemoryPressure`, `DiskPressure`, `PIDPressure` conditions; an InternalIP).
    pub async fn add_node(&self, node: MemberNode) -> anyhow::Result<()> {
        let api: Api<DynamicObject> = Api::all_with(self.inner.client.clone(), &node_resource());
        let index = api.list(&ListParams::default()).await?.items.len() + 1;
        let mut labels: BTreeMap<String, String> = [
            ("kubernetes.io/hostname", node.name.as_str()),
            ("kubernetes.io/os", "linux"),
            ("kubernetes.io/arch", "amd64"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        if let Some(model) = &node.gpu_model {
            labels.insert("nvidia.com/gpu.product".into(), model.clone());
            labels.insert("nvidia.com/gpu.count".into(), node.gpus.to_string());
        }
        labels.extend(node.labels.clone());
        let object = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node.name, "labels": labels},
            "spec": {"podCIDR": format!("10.244.{index}.0/24"), "taints": node.taints},
        });
        let object: DynamicObject = serde_json::from_value(object)?;
        api.create(&PostParams::default(), &object)
            .await
            .with_context(|| format!("create node {}", node.name))?;
        let mut resources = json!({"cpu": node.cpu, "memory": node.memory, "pods": "110"});
        if node.gpus > 0 {
            resources["nvidia.com/gpu"] = json!(node.gpus.to_string());
        }
        let now = now();
        let condition = |kind: &str, status: &str, reason: &str| {
            json!({"type": kind, "status": status, "reason": reason, "message": reason,
                   "lastHeartbeatTime": now, "lastTransitionTime": now})
        };
        let status = json!({
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                condition("Ready", "True", "KubeletReady"),
            ],
            "addresses": [{"type": "InternalIP", "address": format!("10.0.{}.{}", index / 250, index % 250 + 1)},
                          {"type": "Hostname", "address": node.name}],
            "nodeInfo": {"kubeletVersion": "v1.33.0-rlark-kubesim", "containerRuntimeVersion": "kubesim://1",
                         "operatingSystem": "linux", "architecture": "amd64", "osImage": "kubesim",
                         "kernelVersion": "", "kubeProxyVersion": "", "machineID": "", "systemUUID": "", "bootID": ""},
        });
        api.patch_status(
            &node.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .with_context(|| format!("write status of node {}", node.name))?;
        self.settle().await
    }

    /// Set Node `name`'s `Ready` condition (a NotReady Node gets no new Pods).
    pub async fn set_node_ready(&self, name: &str, ready: bool) -> anyhow::Result<()> {
        let api: Api<DynamicObject> = Api::all_with(self.inner.client.clone(), &node_resource());
        let node = serde_json::to_value(
            api.get(name)
                .await
                .with_context(|| format!("get node {name}"))?,
        )?;
        let (status, reason) = if ready {
            ("True", "KubeletReady")
        } else {
            ("Unknown", "NodeStatusUnknown")
        };
        let mut conditions: Vec<Value> = node
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        conditions.retain(|c| c["type"] != "Ready");
        conditions.push(
            json!({"type": "Ready", "status": status, "reason": reason, "message": reason,
                               "lastHeartbeatTime": now(), "lastTransitionTime": now()}),
        );
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": conditions}})),
        )
        .await
        .with_context(|| format!("write status of node {name}"))?;
        self.settle().await
    }

    /// Stop the simulator's tasks.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
    }
}

impl Drop for KubeSim {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// An rlark server in member simulation (controllers off: nothing of rlark's acts on this
/// cluster) with a [`KubeSim`] acting on it.
pub struct MemberCluster {
    server: TestServer,
    sim: KubeSim,
    exec: SimExec,
}

impl MemberCluster {
    /// Start the server (in this process, loopback, temporary data directory) and the
    /// simulator.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(Extras::default()).await
    }

    /// [`Self::start`], serving and playing `extras` too (e.g. OpenKruise's CloneSet).
    pub async fn start_with(extras: Extras) -> anyhow::Result<Self> {
        let logs = SimLogs::default();
        let source = Arc::new(logs.clone());
        let exec = SimExec::new().context("a directory for the simulation's execs")?;
        let pod_exec = Arc::new(exec.clone());
        let server = TestServer::start_configured(|config| {
            config.api.extra_kinds = kinds::kinds();
            if extras.openkruise {
                config.api.extra_kinds.push(kinds::openkruise_clone_set());
            }
            config.api.pod_sources = PodSources {
                logs: Some(source),
                exec: Some(pod_exec),
            };
            config.controllers.enabled = false;
        })
        .await?;
        let client = server.client().await?;
        let sim = KubeSim::start_with(client, logs, extras);
        Ok(Self { server, sim, exec })
    }

    pub fn sim(&self) -> &KubeSim {
        &self.sim
    }

    pub fn server(&self) -> &TestServer {
        &self.server
    }

    /// Where the execs into the member Pods run.
    pub fn exec(&self) -> &SimExec {
        &self.exec
    }

    /// The admin kubeconfig of the member cluster (what `--member-kubeconfig` is given).
    pub fn kubeconfig_path(&self) -> &Path {
        self.server.kubeconfig_path()
    }

    /// A kube client of the member cluster, as its admin.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        self.server.client().await
    }

    /// Stop the simulator, then the server.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.sim.stop().await;
        self.server.stop().await
    }
}
