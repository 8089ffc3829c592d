//! The Kubernetes runtime's reconciler: Tasks placed on this cluster → member workloads,
//! member Pods → rlark Pods.
//!
//! Level-triggered: watches (the Tasks and rlark Pods of `rlark-<clusterID>`; the
//! member Deployments, StatefulSets, DaemonSets, Jobs, CloneSets (when the member serves
//! OpenKruise's CRD) and Pods labelled
//! `app.kubernetes.io/managed-by=rlark` and `rlark.io/task-namespace=rlark-<clusterID>`;
//! the member namespace's `Pulling` and `Pulled` Events) feed caches, and every change (and every [`RESYNC_INTERVAL`]) runs one pass over all
//! of them that makes the member cluster and the rlark Pods match the Tasks:
//!
//! - a Task placed here (`spec.placement.clusterID`, not being deleted) with
//!   `agentType: Kubernetes` has one workload, built by [`workload::build`] or
//!   [`template::render`]. Missing → created (through the creation rate limit: over it the
//!   Task waits, it never fails), then its Ray head Service, claims and token Secret as
//!   dependents of it; a Warning event lists the fields of the Task's own template rlark
//!   replaced. The dependents of a workload this agent did not create (adopted after a
//!   restart) are checked once by their token Secret, and created when it is missing (a
//!   create that failed before the restart is not lost).
//!   Present with the Task's run key → adopted (after an agent restart nothing is created
//!   twice: the caches are listed before the first pass); its spec is replaced when the
//!   desired spec changed (annotation [`SPEC_HASH_ANNOTATION`]: `spec.stopped` scales to
//!   0 / suspends, resuming undoes); a Job only has `suspend` and `parallelism` changed
//!   (its template is immutable);
//! - a workload of another run (new Task UID, restart, new placement), of another kind,
//!   or of a Task that is gone or no longer placed here → deleted with background
//!   propagation (its Pods, ReplicaSets, Service and claims follow);
//! - a member API error is classified by [`errors::classify`]: refused (422, 400, 413) →
//!   the Task fails with the API's message (a failure Pod, [`mirror::failure_pod`]);
//!   `AlreadyExists` → adopted; anything else → retried with capped backoff;
//! - every member Pod of a current run → an rlark Pod of the same name
//!   ([`mirror::mirrored_pod`], image pulls completed by the Pod's pull Events), its
//!   status kept up to date; rlark Pods whose member Pod
//!   is gone (or whose Task is) are deleted;
//! - a Task whose template renders no valid Job, that asks for a CloneSet the member does
//!   not serve (placement avoids this; a Task placed by hand can still ask), whose
//!   workload reports `Failed` with no
//!   failed Pod to show it, or whose `agentType` is not `Kubernetes`
//!   ([`REASON_UNSUPPORTED_AGENT_TYPE`]) gets a failure Pod.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Pod as MemberPod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rlark_api::agent::{REASON_UNSUPPORTED_AGENT_TYPE, RUN_KEY_ANNOTATION, run_key};
use rlark_api::labels;
use rlark_api::types::{AgentType, KubernetesWorkloadKind, Pod, PodPhase, Task, TaskPhase};
use serde::de::DeserializeOwned;
use sha2::{Digest as _, Sha256};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::client::MemberClient;
use super::mirror::{self, MEMBER_FAILURE_ANNOTATION, MEMBER_POD_ANNOTATION};
use super::{MemberError, RESYNC_INTERVAL, events};
use crate::kubernetes::cloneset::CloneSet;
use crate::kubernetes::errors::{self, Backoff, Disposition, MemberFailure};
use crate::kubernetes::ratelimit::{Admission, CreateLimiter};
use crate::kubernetes::workload::{self, MemberObjects, Workload};
use crate::kubernetes::{
    MANAGED_BY, MANAGED_BY_LABEL, MemberContext, RUN_LABEL, TASK_NAMESPACE_LABEL, TASK_UID_LABEL,
    names, pulls, status, template,
};
use crate::task_reports::TaskTokens;

/// Annotation of a workload: a hash of the spec rlark built for it, so a changed Task
/// (stop, resume) is told from the member cluster's own defaults.
pub const SPEC_HASH_ANNOTATION: &str = "rlark.io/spec-hash";
/// A created workload not yet in the cache is not created again for this long (the
/// watch brings it long before).
const CREATED_GRACE: Duration = Duration::from_secs(30);
/// Changes arriving together are handled in one pass: the pass waits this long after the
/// first.
const DEBOUNCE: Duration = Duration::from_millis(50);

/// Prometheus metrics of the Kubernetes runtime.
#[derive(Clone, Debug, Default)]
pub struct MemberMetrics {
    creates: Counter,
    deferred: Counter,
    api_errors: Counter,
    mirrored: Gauge,
}

impl MemberMetrics {
    /// The metrics, registered in `registry` (prefix `rlark_agent_member_`).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        let sub = registry.sub_registry_with_prefix("rlark_agent_member");
        sub.register(
            "workload_creates",
            "Workloads created on the member cluster",
            metrics.creates.clone(),
        );
        sub.register(
            "creates_deferred",
            "Workload creations deferred by --max-creates-per-minute",
            metrics.deferred.clone(),
        );
        sub.register(
            "api_errors",
            "Failed member API calls (retried or failing their Task)",
            metrics.api_errors.clone(),
        );
        sub.register(
            "mirrored_pods",
            "Member Pods mirrored as rlark Pods",
            metrics.mirrored.clone(),
        );
        metrics
    }
}

/// What [`run`] needs.
#[derive(Clone)]
pub struct MemberRun {
    /// Client of the control plane (the agent's identity).
    pub control: kube::Client,
    /// The member cluster.
    pub member: MemberClient,
    /// This agent's cluster.
    pub cluster_id: String,
    /// The control plane's URL (`RLARK_SERVER`).
    pub server_url: String,
    /// The installation's CA bundle, put into every run's token Secret.
    pub ca_file: std::path::PathBuf,
    /// `--max-creates-per-minute`.
    pub max_creates_per_minute: NonZeroU32,
    /// `--tensorboard-image`.
    pub tensorboard_image: Option<String>,
    /// Metrics.
    pub metrics: MemberMetrics,
}

impl std::fmt::Debug for MemberRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberRun")
            .field("member", &self.member)
            .field("cluster_id", &self.cluster_id)
            .field("max_creates_per_minute", &self.max_creates_per_minute)
            .finish_non_exhaustive()
    }
}

/// Run the reconciler until `shutdown` is cancelled.
pub async fn run(config: MemberRun, shutdown: CancellationToken) -> Result<(), MemberError> {
    let namespace = rlark_api::names::agent_namespace(&config.cluster_id);
    let notify = Arc::new(Notify::new());
    let selector = format!(
        "{MANAGED_BY_LABEL}={MANAGED_BY},{TASK_NAMESPACE_LABEL}={}",
        names::label_value(&namespace)
    );
    let member_cfg = watcher::Config::default().labels(&selector);
    let mk = &config.member.client;
    let mns = &config.member.namespace;
    let mut watches = Vec::new();
    let tasks = reflect::<Task>(
        Api::namespaced(config.control.clone(), &namespace),
        watcher::Config::default(),
        &notify,
        &shutdown,
        &mut watches,
    );
    let pods = reflect::<Pod>(
        Api::namespaced(config.control.clone(), &namespace),
        watcher::Config::default().labels(labels::TASK_NAME),
        &notify,
        &shutdown,
        &mut watches,
    );
    let member_pods = reflect::<MemberPod>(
        Api::namespaced(mk.clone(), mns),
        member_cfg.clone(),
        &notify,
        &shutdown,
        &mut watches,
    );
    let deployments = reflect::<Deployment>(
        Api::namespaced(mk.clone(), mns),
        member_cfg.clone(),
        &notify,
        &shutdown,
        &mut watches,
    );
    let statefulsets = reflect::<StatefulSet>(
        Api::namespaced(mk.clone(), mns),
        member_cfg.clone(),
        &notify,
        &shutdown,
        &mut watches,
    );
    let daemonsets = reflect::<DaemonSet>(
        Api::namespaced(mk.clone(), mns),
        member_cfg.clone(),
        &notify,
        &shutdown,
        &mut watches,
    );
    let clonesets = config.member.serves_cloneset.then(|| {
        reflect::<CloneSet>(
            Api::namespaced(mk.clone(), mns),
            member_cfg.clone(),
            &notify,
            &shutdown,
            &mut watches,
        )
    });
    let jobs = reflect::<Job>(
        Api::namespaced(mk.clone(), mns),
        member_cfg,
        &notify,
        &shutdown,
        &mut watches,
    );
    // The kubelet's pull Events (image size, pull time): one watch per reason, as a
    // field selector takes no alternatives.
    let pull_events = [pulls::REASON_PULLING, pulls::REASON_PULLED].map(|reason| {
        reflect::<Event>(
            Api::namespaced(mk.clone(), mns),
            watcher::Config::default().fields(&format!("reason={reason},involvedObject.kind=Pod")),
            &notify,
            &shutdown,
            &mut watches,
        )
    });
    let ready = async {
        tasks.wait_until_ready().await?;
        pods.wait_until_ready().await?;
        member_pods.wait_until_ready().await?;
        deployments.wait_until_ready().await?;
        statefulsets.wait_until_ready().await?;
        daemonsets.wait_until_ready().await?;
        jobs.wait_until_ready().await?;
        if let Some(clonesets) = &clonesets {
            clonesets.wait_until_ready().await?;
        }
        for events in &pull_events {
            events.wait_until_ready().await?;
        }
        Ok::<(), reflector::store::WriterDropped>(())
    };
    tokio::select! {
        () = shutdown.cancelled() => return Ok(()),
        result = ready => result.map_err(|_| MemberError::WatchEnded("the caches"))?,
    }
    tracing::info!(member_namespace = %config.member.namespace, "member caches listed; reconciling");
    let mut reconciler = Reconciler {
        ctx: MemberContext {
            server_url: config.server_url.clone(),
            cluster_id: config.cluster_id.clone(),
            namespace: config.member.namespace.clone(),
            image_pull_secrets: Vec::new(),
            extra_env: Vec::new(),
            tensorboard_image: config.tensorboard_image.clone(),
        },
        namespace,
        limiter: CreateLimiter::new(config.max_creates_per_minute),
        config,
        tasks,
        pods,
        member_pods,
        deployments,
        statefulsets,
        daemonsets,
        jobs,
        clonesets,
        pull_events,
        retries: HashMap::new(),
        failures: HashMap::new(),
        created: HashMap::new(),
        unowned: HashSet::new(),
        complete: HashSet::new(),
        tokens: TaskTokens::default(),
    };
    loop {
        let wake = reconciler.pass().await;
        let resync = Instant::now() + RESYNC_INTERVAL;
        let until = wake.map_or(resync, |w| w.min(resync));
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = notify.notified() => {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(DEBOUNCE) => {}
                }
            }
            () = tokio::time::sleep_until(until) => {}
        }
    }
    for watch in watches {
        watch.abort();
    }
    Ok(())
}

/// A cache of `api` kept by a background watch that wakes `notify` on every change.
fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    notify: &Arc<Notify>,
    shutdown: &CancellationToken,
    handles: &mut Vec<tokio::task::JoinHandle<()>>,
) -> Store<K>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    let mut stream = watcher(api, config)
        .default_backoff()
        .reflect(writer)
        .boxed();
    let notify = notify.clone();
    let shutdown = shutdown.clone();
    let kind = K::kind(&K::DynamicType::default()).to_string();
    handles.push(tokio::spawn(async move {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                event = stream.next() => match event {
                    None => break,
                    Some(Ok(_)) => notify.notify_one(),
                    Some(Err(error)) => tracing::warn!(%error, kind, "watch failed (retrying)"),
                },
            }
        }
    }));
    reader
}

/// A Task that cannot run on the member cluster, for its run.
#[derive(Clone, Debug)]
struct Failure {
    run_key: String,
    reason: String,
    message: String,
}

/// A failed create, waiting to be retried.
struct RetryState {
    backoff: Backoff,
    not_before: Instant,
}

struct Reconciler {
    config: MemberRun,
    ctx: MemberContext,
    /// `rlark-<clusterID>`.
    namespace: String,
    limiter: CreateLimiter,
    tasks: Store<Task>,
    pods: Store<Pod>,
    member_pods: Store<MemberPod>,
    deployments: Store<Deployment>,
    statefulsets: Store<StatefulSet>,
    daemonsets: Store<DaemonSet>,
    jobs: Store<Job>,
    /// The member's CloneSets, when it serves OpenKruise's CRD.
    clonesets: Option<Store<CloneSet>>,
    /// The member's `Pulling` and `Pulled` Events of Pods.
    pull_events: [Store<Event>; 2],
    /// Task UID label → retry state of its failed create.
    retries: HashMap<String, RetryState>,
    /// Task UID label → why it cannot run.
    failures: HashMap<String, Failure>,
    /// Task UID label → (run key, when) of a workload created but not yet seen cached.
    created: HashMap<String, (String, Instant)>,
    /// Task UID labels whose Service, claims or token Secret are still to be created.
    unowned: HashSet<String>,
    /// Task UID labels whose dependents are known to exist (created by this agent, or
    /// their token Secret found); the others are checked once ([`Self::check_dependents`]).
    complete: HashSet<String>,
    /// Task tokens by run.
    tokens: TaskTokens,
}

/// The workload kind a Task asks for (a template renders a Job).
fn wanted_kind(task: &Task) -> Option<KubernetesWorkloadKind> {
    let k = task.spec.kubernetes.as_ref()?;
    match (&k.workload, &k.job_template) {
        (Some(w), _) => Some(w.kind),
        (None, Some(_)) => Some(KubernetesWorkloadKind::Job),
        (None, None) => None,
    }
}

/// Hash of the spec rlark built (before the member cluster defaults anything).
fn spec_hash(workload: &Workload) -> String {
    let spec = match workload {
        Workload::Deployment(o) => serde_json::to_vec(&o.spec),
        Workload::StatefulSet(o) => serde_json::to_vec(&o.spec),
        Workload::DaemonSet(o) => serde_json::to_vec(&o.spec),
        Workload::Job(o) => serde_json::to_vec(&o.spec),
        Workload::CloneSet(o) => serde_json::to_vec(&o.spec),
    }
    .unwrap_or_default();
    hex::encode(&Sha256::digest(&spec)[..8])
}

fn set_annotation(workload: &mut Workload, key: &str, value: String) {
    let meta = match workload {
        Workload::Deployment(o) => &mut o.metadata,
        Workload::StatefulSet(o) => &mut o.metadata,
        Workload::DaemonSet(o) => &mut o.metadata,
        Workload::Job(o) => &mut o.metadata,
        Workload::CloneSet(o) => &mut o.metadata,
    };
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(key.to_string(), value);
}

fn annotation(workload: &Workload, key: &str) -> Option<String> {
    workload
        .metadata()
        .annotations
        .as_ref()
        .and_then(|a| a.get(key).cloned())
}

fn uid_label_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(TASK_UID_LABEL).cloned())
        .unwrap_or_default()
}

impl Reconciler {
    fn member_workloads(&self) -> Vec<Workload> {
        let mut all: Vec<Workload> = Vec::new();
        all.extend(
            self.deployments
                .state()
                .iter()
                .map(|o| Workload::Deployment((**o).clone())),
        );
        all.extend(
            self.statefulsets
                .state()
                .iter()
                .map(|o| Workload::StatefulSet((**o).clone())),
        );
        all.extend(
            self.daemonsets
                .state()
                .iter()
                .map(|o| Workload::DaemonSet((**o).clone())),
        );
        all.extend(
            self.jobs
                .state()
                .iter()
                .map(|o| Workload::Job((**o).clone())),
        );
        if let Some(clonesets) = &self.clonesets {
            all.extend(
                clonesets
                    .state()
                    .iter()
                    .map(|o| Workload::CloneSet((**o).clone())),
            );
        }
        all
    }

    /// Creates the Service, the claims and the token Secret of `task`'s run (with the
    /// task token minted now and the installation's CA bundle) as dependents of `owner`;
    /// false when one of them is still to be created (the next pass retries).
    async fn create_dependents(
        &self,
        task: &Task,
        objects: &mut MemberObjects,
        owner: &Workload,
    ) -> bool {
        if !objects.own_dependents(owner) {
            return false;
        }
        let mut complete = true;
        if let Some(secret) = objects.token_secret.as_mut() {
            match self.token_data(task).await {
                Ok((token, ca)) => workload::fill_token_secret(secret, &token, &ca),
                Err(error) => {
                    tracing::warn!(%error, task = %task.name_any(), "no task token for the member Pods yet (retried next pass)");
                    objects.token_secret = None;
                    complete = false;
                }
            }
        }
        if let Err(error) = self.config.member.create_dependents(objects).await {
            self.config.metrics.api_errors.inc();
            tracing::warn!(%error, task = %task.name_any(), "create service/claims/token secret (retried next pass)");
            return false;
        }
        complete
    }

    /// Decides whether the dependents of a workload this agent did not create in this
    /// life (adopted after a restart) are complete: the token Secret is created last, so
    /// its presence says the Service and claims are there too. Missing → `unowned` (the
    /// pass creates them); unknown (the member API failed) → asked again next pass.
    async fn check_dependents(&mut self, uid: &str, objects: &MemberObjects) {
        let Some(secret) = objects.token_secret.as_ref() else {
            self.complete.insert(uid.to_string());
            return;
        };
        let name = secret.metadata.name.clone().unwrap_or_default();
        match self.config.member.token_secret_filled(&name).await {
            Ok(true) => {
                self.complete.insert(uid.to_string());
            }
            Ok(false) => {
                tracing::info!(secret = %name, "an adopted workload's token Secret is missing; creating it");
                self.unowned.insert(uid.to_string());
            }
            Err(error) => {
                self.config.metrics.api_errors.inc();
                tracing::warn!(%error, secret = %name, "check the token secret (retried next pass)");
            }
        }
    }

    /// The task token of `task`'s run (minted once per run, [`TaskTokens`]) and the CA
    /// bundle the member Pods trust the control plane with.
    async fn token_data(&self, task: &Task) -> Result<(String, Vec<u8>), String> {
        let ca = tokio::fs::read(&self.config.ca_file)
            .await
            .map_err(|e| format!("read the CA bundle {}: {e}", self.config.ca_file.display()))?;
        let env = self
            .tokens
            .env(
                &self.config.control,
                &self.config.server_url,
                &self.config.ca_file,
                task,
            )
            .await;
        let token = env
            .into_iter()
            .find(|(name, _)| name == "RLARK_TOKEN")
            .map(|(_, token)| token)
            .ok_or_else(|| "the control plane minted no task token".to_string())?;
        Ok((token, ca))
    }

    /// The member objects of `task`'s run.
    fn desired_objects(&self, task: &Task) -> Result<MemberObjects, String> {
        let k = task.spec.kubernetes.as_ref();
        if wanted_kind(task) == Some(KubernetesWorkloadKind::CloneSet)
            && !self.config.member.serves_cloneset
        {
            return Err(format!(
                "the member cluster does not serve OpenKruise's CloneSet ({}; looked up when \
                 the agent started): install OpenKruise and restart the agent, or use kind \
                 Deployment",
                crate::kubernetes::cloneset::API_VERSION
            ));
        }
        if k.is_some_and(|k| k.workload.is_some()) {
            workload::build(task, &self.ctx).map_err(|e| e.to_string())
        } else {
            let rendered = template::render(task, &self.ctx).map_err(|e| e.to_string())?;
            let run_key = rlark_api::agent::run_key(task, &self.ctx.cluster_id).unwrap_or_default();
            Ok(MemberObjects {
                workload: Workload::Job(rendered.job),
                head_service: None,
                claims: Vec::new(),
                token_secret: Some(workload::token_secret(task, &self.ctx, &run_key)),
                corrected: rendered.corrected,
            })
        }
    }

    /// One pass (module docs). Returns when the next one is due at the latest (a
    /// deferred or retried create).
    async fn pass(&mut self) -> Option<Instant> {
        let now = Instant::now();
        let mut wake: Option<Instant> = None;
        let mut wake_at = |t: Instant| wake = Some(wake.map_or(t, |w: Instant| w.min(t)));

        // Task UID label → (Task, run key) of the Tasks placed on this cluster.
        let mut wanted: BTreeMap<String, (Arc<Task>, String)> = BTreeMap::new();
        for task in self.tasks.state() {
            if let Some(key) = run_key(&task, &self.config.cluster_id) {
                wanted.insert(
                    names::label_value(&task.uid().unwrap_or_default()),
                    (task, key),
                );
            }
        }
        self.failures
            .retain(|uid, f| wanted.get(uid).is_some_and(|(_, key)| *key == f.run_key));
        self.retries.retain(|uid, _| wanted.contains_key(uid));
        self.unowned.retain(|uid| wanted.contains_key(uid));
        self.complete.retain(|uid| wanted.contains_key(uid));
        self.created.retain(|uid, (key, at)| {
            wanted.get(uid).is_some_and(|(_, k)| k == key)
                && now.duration_since(*at) < CREATED_GRACE
        });

        // Workloads: delete those no Task wants; index the current ones.
        let mut current: HashMap<String, Workload> = HashMap::new();
        let mut leaving: HashSet<String> = HashSet::new();
        for existing in self.member_workloads() {
            let meta = existing.metadata();
            let uid = uid_label_of(meta);
            if meta.deletion_timestamp.is_some() {
                leaving.insert(uid);
                continue;
            }
            let keep = wanted.get(&uid).is_some_and(|(task, key)| {
                annotation(&existing, RUN_KEY_ANNOTATION).as_deref() == Some(key.as_str())
                    && task.spec.agent_type == AgentType::Kubernetes
                    && wanted_kind(task) == Some(existing.kind())
            });
            if keep {
                current.insert(uid, existing);
                continue;
            }
            leaving.insert(uid);
            tracing::info!(workload = ?meta.name, kind = ?existing.kind(), "deleting a workload no Task run wants");
            if let Err(error) = self.config.member.delete_workload(&existing).await {
                self.config.metrics.api_errors.inc();
                tracing::warn!(%error, workload = ?meta.name, "delete workload (retried next pass)");
            }
        }

        // Failure Pods of Tasks that cannot run: found in the rlark Pods (an earlier
        // agent wrote them) or decided in this pass.
        for pod in self.pods.state() {
            let Some(reason) = pod.annotations().get(MEMBER_FAILURE_ANNOTATION) else {
                continue;
            };
            let uid = names::label_value(
                pod.annotations()
                    .get(rlark_api::agent::TASK_UID_ANNOTATION)
                    .map(String::as_str)
                    .unwrap_or_default(),
            );
            let pod_key = pod.annotations().get(RUN_KEY_ANNOTATION);
            if let Some((_, key)) = wanted.get(&uid)
                && pod_key == Some(key)
                && !self.failures.contains_key(&uid)
                && reason != mirror::REASON_WORKLOAD_FAILED
            {
                let status = pod.status.clone().unwrap_or_default();
                self.failures.insert(
                    uid,
                    Failure {
                        run_key: key.clone(),
                        reason: reason.clone(),
                        message: status.message.unwrap_or_default(),
                    },
                );
            }
        }

        for (uid, (task, key)) in &wanted {
            if task.spec.agent_type != AgentType::Kubernetes {
                self.failures.entry(uid.clone()).or_insert_with(|| Failure {
                    run_key: key.clone(),
                    reason: REASON_UNSUPPORTED_AGENT_TYPE.to_string(),
                    message: format!(
                        "this agent runs Kubernetes tasks only; the task's agentType is {}",
                        task.spec.agent_type.as_str()
                    ),
                });
                continue;
            }
            if self.failures.contains_key(uid) {
                continue;
            }
            let mut objects = match self.desired_objects(task) {
                Ok(objects) => objects,
                Err(message) => {
                    tracing::warn!(task = %task.name_any(), %message, "the task gives no valid member objects");
                    self.failures.insert(
                        uid.clone(),
                        Failure {
                            run_key: key.clone(),
                            reason: mirror::REASON_INVALID_WORKLOAD.to_string(),
                            message,
                        },
                    );
                    continue;
                }
            };
            let hash = spec_hash(&objects.workload);
            if let Some(existing) = current.get(uid) {
                self.created.remove(uid);
                if annotation(existing, SPEC_HASH_ANNOTATION).as_deref() != Some(hash.as_str()) {
                    let annotations = serde_json::json!({ SPEC_HASH_ANNOTATION: hash });
                    tracing::info!(task = %task.name_any(), stopped = task.spec.stopped, "updating the workload");
                    if let Err(error) = self
                        .config
                        .member
                        .update_workload(existing, &objects.workload, &annotations)
                        .await
                    {
                        self.config.metrics.api_errors.inc();
                        tracing::warn!(%error, task = %task.name_any(), "update workload (retried next pass)");
                    }
                }
                if !self.unowned.contains(uid) && !self.complete.contains(uid) {
                    self.check_dependents(uid, &objects).await;
                }
                if self.unowned.contains(uid)
                    && self.create_dependents(task, &mut objects, existing).await
                {
                    self.unowned.remove(uid);
                    self.complete.insert(uid.clone());
                }
                continue;
            }
            if leaving.contains(uid) || self.created.contains_key(uid) {
                // The old run's workload goes first (same name); or ours is on its way.
                continue;
            }
            if let Some(retry) = self.retries.get(uid)
                && retry.not_before > now
            {
                wake_at(retry.not_before);
                continue;
            }
            match self.limiter.try_acquire(now.into_std()) {
                Admission::Allowed => {}
                Admission::DeferUntil(until) => {
                    self.config.metrics.deferred.inc();
                    tracing::debug!(task = %task.name_any(), "creation deferred by --max-creates-per-minute");
                    wake_at(Instant::from_std(until));
                    continue;
                }
            }
            set_annotation(&mut objects.workload, SPEC_HASH_ANNOTATION, hash);
            match self.config.member.create_workload(&objects.workload).await {
                Ok(created) => {
                    self.config.metrics.creates.inc();
                    self.retries.remove(uid);
                    self.created.insert(uid.clone(), (key.clone(), now));
                    tracing::info!(task = %task.name_any(), kind = ?created.kind(), workload = ?created.metadata().name, "workload created");
                    if self.create_dependents(task, &mut objects, &created).await {
                        self.complete.insert(uid.clone());
                    } else {
                        self.unowned.insert(uid.clone());
                    }
                    if !objects.corrected.is_empty() {
                        events::warn_task(
                            &self.config.control,
                            task,
                            events::REASON_FIELDS_CORRECTED,
                            events::corrected_message(&objects.corrected),
                        )
                        .await;
                    }
                }
                Err(error) => {
                    self.config.metrics.api_errors.inc();
                    let failure = MemberFailure::from_kube(&error);
                    match errors::classify(&failure) {
                        Disposition::Fail(message) => {
                            tracing::warn!(task = %task.name_any(), %message, "the member cluster refused the workload");
                            self.failures.insert(
                                uid.clone(),
                                Failure {
                                    run_key: key.clone(),
                                    reason: mirror::REASON_FAILED_CREATE.to_string(),
                                    message,
                                },
                            );
                        }
                        Disposition::Adopt => {
                            // It is there: the cache brings it.
                            self.created.insert(uid.clone(), (key.clone(), now));
                        }
                        Disposition::Retry { at_least } => {
                            let retry = self.retries.entry(uid.clone()).or_insert(RetryState {
                                backoff: Backoff::default(),
                                not_before: now,
                            });
                            let delay = retry.backoff.next_delay(at_least);
                            retry.not_before = now + delay;
                            wake_at(retry.not_before);
                            tracing::warn!(%error, task = %task.name_any(), retry_in_ms = delay.as_millis() as u64, "create workload failed; retrying");
                        }
                    }
                }
            }
        }

        // rlark Pods: mirrors of the member Pods of current runs, and failure Pods.
        let mut desired: BTreeMap<String, Pod> = BTreeMap::new();
        let mut failed_mirrors: HashSet<String> = HashSet::new();
        let events: Vec<Arc<Event>> = self.pull_events.iter().flat_map(Store::state).collect();
        let mut events_of: HashMap<&str, Vec<&Event>> = HashMap::new();
        for event in &events {
            if let Some(uid) = event.involved_object.uid.as_deref() {
                events_of.entry(uid).or_default().push(event);
            }
        }
        for member in self.member_pods.state() {
            let uid = uid_label_of(&member.metadata);
            let Some((task, key)) = wanted.get(&uid) else {
                continue;
            };
            if member.labels().get(RUN_LABEL) != Some(&names::run_label(key))
                || !current.contains_key(&uid)
            {
                continue;
            }
            let pull_events = member
                .uid()
                .and_then(|uid| events_of.get(uid.as_str()))
                .map_or(&[][..], Vec::as_slice);
            let pod = mirror::mirrored_pod(&member, task, key, pull_events);
            if pod.status.as_ref().and_then(|s| s.phase) == Some(PodPhase::Failed) {
                failed_mirrors.insert(uid.clone());
            }
            desired.insert(pod.name_any(), pod);
        }
        self.config.metrics.mirrored.set(desired.len() as i64);
        let stamp = Timestamp::now();
        for (uid, (task, key)) in &wanted {
            let failure = self.failures.get(uid).cloned().or_else(|| {
                let state = status::workload_state(current.get(uid)?);
                (state.phase == TaskPhase::Failed && !failed_mirrors.contains(uid)).then(|| {
                    Failure {
                        run_key: key.clone(),
                        reason: mirror::REASON_WORKLOAD_FAILED.to_string(),
                        message: state
                            .message
                            .unwrap_or_else(|| "the workload failed".to_string()),
                    }
                })
            });
            if let Some(f) = failure {
                let pod = mirror::failure_pod(task, key, &f.reason, &f.message, stamp);
                desired.insert(pod.name_any(), pod);
            }
        }
        self.write_pods(desired).await;
        wake
    }

    /// Make the rlark Pods this runtime writes (annotated [`MEMBER_POD_ANNOTATION`] or
    /// [`MEMBER_FAILURE_ANNOTATION`]) exactly `desired`.
    async fn write_pods(&self, mut desired: BTreeMap<String, Pod>) {
        let api: Api<Pod> = Api::namespaced(self.config.control.clone(), &self.namespace);
        for pod in self.pods.state() {
            let ours = pod.annotations().contains_key(MEMBER_POD_ANNOTATION)
                || pod.annotations().contains_key(MEMBER_FAILURE_ANNOTATION);
            let name = pod.name_any();
            let Some(want) = desired.get(&name) else {
                if ours {
                    delete_pod(&api, &pod).await;
                }
                continue;
            };
            if !ours {
                // Someone else's Pod has the name: leave it, mirror nothing there.
                tracing::warn!(pod = %name, "an rlark Pod of this name exists and is not a mirror; not mirroring");
                desired.remove(&name);
                continue;
            }
            if pod.annotations() != want.annotations() {
                // Another member Pod or run under the same name: replace it.
                delete_pod(&api, &pod).await;
                desired.remove(&name);
                continue;
            }
            let Some(want) = desired.remove(&name) else {
                continue;
            };
            patch_status(&api, &name, pod.status.as_ref(), &want).await;
        }
        for (name, want) in desired {
            let mut object = want.clone();
            object.status = None;
            match api.create(&PostParams::default(), &object).await {
                Ok(created) => patch_status(&api, &name, created.status.as_ref(), &want).await,
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(error) => {
                    tracing::warn!(%error, pod = %name, "create mirrored pod (retried next pass)")
                }
            }
        }
    }
}

async fn patch_status(
    api: &Api<Pod>,
    name: &str,
    current: Option<&rlark_api::types::PodStatus>,
    want: &Pod,
) {
    let Some(status) = want.status.as_ref() else {
        return;
    };
    let Some(patch) = mirror::status_patch(current, status) else {
        return;
    };
    let body = serde_json::json!({ "status": patch });
    if let Err(error) = api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&body))
        .await
    {
        tracing::warn!(%error, pod = %name, "write mirrored pod status (retried next pass)");
    }
}

async fn delete_pod(api: &Api<Pod>, pod: &Pod) {
    let params = DeleteParams {
        preconditions: pod.uid().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&pod.name_any(), &params).await {
        Ok(_) => tracing::debug!(pod = %pod.name_any(), "deleted a mirrored pod"),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
        Err(error) => {
            tracing::warn!(%error, pod = %pod.name_any(), "delete mirrored pod (retried next pass)")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes::workload::testing::{ctx, task};

    #[test]
    fn spec_hash_follows_stop_and_resume() {
        let mut t = task("train", 2);
        let running = workload::build(&t, &ctx()).expect("build").workload;
        t.spec.stopped = true;
        let stopped = workload::build(&t, &ctx()).expect("build").workload;
        t.spec.stopped = false;
        let resumed = workload::build(&t, &ctx()).expect("build").workload;
        assert_ne!(spec_hash(&running), spec_hash(&stopped));
        assert_eq!(spec_hash(&running), spec_hash(&resumed));
    }
}
