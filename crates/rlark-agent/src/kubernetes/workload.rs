//! A Task's `kubernetes.workload` → the objects the runtime creates on the member
//! cluster: the workload (Deployment, StatefulSet, DaemonSet, batch Job or OpenKruise
//! CloneSet), the Ray head's
//! headless Service, and the claims of its `persistentVolumeClaim` volumes.
//!
//! What the Task's Pod template gets (docs/tasks.md, "Kubernetes runtime"):
//! - labels [`MANAGED_BY_LABEL`], [`TASK_NAME_LABEL`], [`TASK_NAMESPACE_LABEL`],
//!   [`TASK_UID_LABEL`], [`RUN_LABEL`] (on every object and Pod; the workload's selector
//!   is managed-by + task UID), annotations `rlark.io/task-uid` and `rlark.io/run-key`;
//! - the environment contract in every container and init container ([`super::env`]);
//! - `spec.nodeSelector` of the Task: single values as `nodeSelector`, comma lists as ONE
//!   required node affinity term with an `In` expression per key (all must hold; RLark
//!   gave each key its own term, which OR'ed them), added to every term the template
//!   already has; the placement's nodes as `kubernetes.io/hostname In` (not for a
//!   DaemonSet, which runs wherever it may);
//! - the agent's image pull secrets;
//! - claim names for `persistentVolumeClaim` volumes that name none
//!   (`pvc-<task>-<volume>`), each claim created ReadWriteOnce 10Gi with the storage class
//!   `pvcStorageMap` gives its claim name (the cluster default when none).
//!
//! Once the workload is created, [`MemberObjects::own_dependents`] makes the Service and
//! the claims its dependents, so deleting the workload cascades to them.
//!
//! Nothing is privileged: rlark adds no `privileged`, no `hostNetwork`, no capability (a
//! template may still ask for them itself). RLark made every non-head Pod privileged with
//! `hostNetwork` for device access; devices come from device plugins (`nvidia.com/gpu`
//! requests) instead. The domain network's sidecar (planned for this runtime) is the one
//! feature that needs a capability: `NET_ADMIN` in its own container.
//!
//! `spec.stopped`: Deployments, StatefulSets and CloneSets get 0 replicas, a Job `suspend: true`, a
//! DaemonSet the node selector [`STOPPED_NODE_LABEL`]`=true`, which no node carries.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, Deployment, DeploymentSpec, StatefulSet, StatefulSetSpec,
};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Container, LocalObjectReference, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, PersistentVolumeClaim, PersistentVolumeClaimSpec, PodSpec, PodTemplateSpec,
    Secret, SecretVolumeSource, Service, ServicePort, ServiceSpec, Volume, VolumeMount,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::ResourceExt as _;
use rlark_api::agent::{RUN_KEY_ANNOTATION, TASK_UID_ANNOTATION, run_key};
use rlark_api::labels;
use rlark_api::types::{KubernetesWorkloadKind, Task};

use super::cloneset::{CloneSet, CloneSetSpec};
use super::env::{self, IndexSource};
use super::{
    MANAGED_BY, MANAGED_BY_LABEL, MemberContext, RUN_LABEL, TASK_NAME_LABEL, TASK_NAMESPACE_LABEL,
    TASK_UID_LABEL, names,
};

/// Node label a stopped DaemonSet's Pods select (no node carries it, so none runs).
pub const STOPPED_NODE_LABEL: &str = "rlark.io/stopped";
/// Size of a claim the runtime creates (RLark's).
pub const CLAIM_SIZE: &str = "10Gi";
/// Ports of the Ray head Service: (name, port).
pub const HEAD_PORTS: &[(&str, i32)] = &[("ray", 6379), ("dashboard", 8265), ("metrics", 8080)];

/// Why a Task gives no member objects. The Task fails with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The Task has no `kubernetes.workload` (or no `kubernetes` block).
    #[error("the Task has no kubernetes.workload")]
    NoWorkload,
    /// The Task has no `kubernetes.jobTemplate` (or no `kubernetes` block).
    #[error("the Task has no kubernetes.jobTemplate")]
    NoJobTemplate,
    /// The Task is not placed on this cluster (or is being deleted): no run to build.
    #[error("the Task is not placed on cluster {cluster_id:?}")]
    NotPlaced {
        /// This agent's cluster.
        cluster_id: String,
    },
    /// The Task's Pod template has no `spec` (admission refuses this).
    #[error("kubernetes.workload.template.spec is missing")]
    NoPodSpec,
    /// The TensorBoard sidecar cannot be added as `tensorBoardDir` asks.
    #[error("{0}")]
    TensorBoardDir(String),
}

/// The workload object of a Task.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    /// apps/v1 Deployment.
    Deployment(Deployment),
    /// apps/v1 StatefulSet.
    StatefulSet(StatefulSet),
    /// apps/v1 DaemonSet.
    DaemonSet(DaemonSet),
    /// batch/v1 Job.
    Job(Job),
    /// OpenKruise `apps.kruise.io/v1alpha1` CloneSet.
    CloneSet(CloneSet),
}

impl Workload {
    /// The workload's kind.
    pub fn kind(&self) -> KubernetesWorkloadKind {
        match self {
            Workload::Deployment(_) => KubernetesWorkloadKind::Deployment,
            Workload::StatefulSet(_) => KubernetesWorkloadKind::StatefulSet,
            Workload::DaemonSet(_) => KubernetesWorkloadKind::DaemonSet,
            Workload::Job(_) => KubernetesWorkloadKind::Job,
            Workload::CloneSet(_) => KubernetesWorkloadKind::CloneSet,
        }
    }

    /// The workload's metadata.
    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Workload::Deployment(o) => &o.metadata,
            Workload::StatefulSet(o) => &o.metadata,
            Workload::DaemonSet(o) => &o.metadata,
            Workload::Job(o) => &o.metadata,
            Workload::CloneSet(o) => &o.metadata,
        }
    }

    /// The reference that makes an object a dependent of this workload (the Service, the
    /// claims), so deleting the workload cascades to them. `None` until the workload has
    /// a UID (the member API gives it one on create).
    pub fn owner_reference(&self) -> Option<OwnerReference> {
        let meta = self.metadata();
        let (api_version, kind) = match self.kind() {
            KubernetesWorkloadKind::Job => ("batch/v1", "Job"),
            KubernetesWorkloadKind::Deployment => ("apps/v1", "Deployment"),
            KubernetesWorkloadKind::StatefulSet => ("apps/v1", "StatefulSet"),
            KubernetesWorkloadKind::DaemonSet => ("apps/v1", "DaemonSet"),
            KubernetesWorkloadKind::CloneSet => (super::cloneset::API_VERSION, "CloneSet"),
        };
        Some(OwnerReference {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            name: meta.name.clone()?,
            uid: meta.uid.clone().filter(|u| !u.is_empty())?,
            controller: Some(false),
            block_owner_deletion: Some(true),
        })
    }

    /// The workload's Pod template (`None` only for an object without `spec`).
    pub fn pod_template(&self) -> Option<&PodTemplateSpec> {
        match self {
            Workload::Deployment(o) => o.spec.as_ref().map(|s| &s.template),
            Workload::StatefulSet(o) => o.spec.as_ref().map(|s| &s.template),
            Workload::DaemonSet(o) => o.spec.as_ref().map(|s| &s.template),
            Workload::Job(o) => o.spec.as_ref().map(|s| &s.template),
            Workload::CloneSet(o) => Some(&o.spec.template),
        }
    }
}

/// Everything the runtime creates for one Task.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberObjects {
    /// The workload.
    pub workload: Workload,
    /// The Ray head's headless Service (a Task with annotation `rlark.io/ray-role=head`).
    pub head_service: Option<Service>,
    /// Claims to create unless they exist.
    pub claims: Vec<PersistentVolumeClaim>,
    /// The run's token Secret ([`token_secret`]), without its data: the runtime fills it
    /// in ([`fill_token_secret`]) once it has minted the token.
    pub token_secret: Option<Secret>,
    /// Fields of the Task's own template rlark replaced (a contract variable, one of its
    /// labels), as paths, for a Warning event.
    pub corrected: Vec<String>,
}

impl MemberObjects {
    /// Makes the Service, the claims and the token Secret dependents of `created` (the workload as the member
    /// API returned it, with its UID): returns false, changing nothing, when it has no UID.
    pub fn own_dependents(&mut self, created: &Workload) -> bool {
        let Some(owner) = created.owner_reference() else {
            return false;
        };
        let metas = self
            .head_service
            .iter_mut()
            .map(|s| &mut s.metadata)
            .chain(self.claims.iter_mut().map(|c| &mut c.metadata))
            .chain(self.token_secret.iter_mut().map(|s| &mut s.metadata));
        for meta in metas {
            let refs = meta.owner_references.get_or_insert_with(Vec::new);
            if !refs.iter().any(|r| r.uid == owner.uid) {
                refs.push(owner.clone());
            }
        }
        true
    }
}

/// The labels of every object of `task`'s run `run_key`.
pub fn identity_labels(task: &Task, run_key: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
        (
            TASK_NAME_LABEL.to_string(),
            names::label_value(&task.name_any()),
        ),
        (
            TASK_NAMESPACE_LABEL.to_string(),
            names::label_value(&task.namespace().unwrap_or_default()),
        ),
        (
            TASK_UID_LABEL.to_string(),
            names::label_value(&task.uid().unwrap_or_default()),
        ),
        (RUN_LABEL.to_string(), names::run_label(run_key)),
    ])
}

/// The selector of `task`'s workload and Service: managed-by and the task UID (stable
/// across runs, as a workload's selector must be).
pub fn selector_labels(task: &Task) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
        (
            TASK_UID_LABEL.to_string(),
            names::label_value(&task.uid().unwrap_or_default()),
        ),
    ])
}

/// The annotations of every object of the run: the task UID and the run key.
pub fn identity_annotations(task: &Task, run_key: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            TASK_UID_ANNOTATION.to_string(),
            task.uid().unwrap_or_default(),
        ),
        (RUN_KEY_ANNOTATION.to_string(), run_key.to_string()),
    ])
}

/// Metadata named `name` in the member namespace with the identity labels and
/// annotations.
pub fn object_meta(task: &Task, ctx: &MemberContext, run_key: &str, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(ctx.namespace.clone()),
        labels: Some(identity_labels(task, run_key)),
        annotations: Some(identity_annotations(task, run_key)),
        ..Default::default()
    }
}

/// Puts `forced` into `map`, returning `<path>[<key>]` for each key the map held with
/// another value.
pub(crate) fn force_entries(
    map: &mut Option<BTreeMap<String, String>>,
    forced: &BTreeMap<String, String>,
    path: &str,
) -> Vec<String> {
    let map = map.get_or_insert_with(BTreeMap::new);
    let mut corrected = Vec::new();
    for (key, value) in forced {
        if let Some(old) = map.insert(key.clone(), value.clone())
            && old != *value
        {
            corrected.push(format!("{path}[{key}]"));
        }
    }
    corrected
}

/// The environment contract in every container and init container of `pod`, and the
/// identity labels and annotations and the image pull secrets on `template`. Returns the
/// corrected fields (paths under `path`).
pub(crate) fn prepare_pod(
    template: &mut PodTemplateSpec,
    task: &Task,
    ctx: &MemberContext,
    run_key: &str,
    index: IndexSource,
    path: &str,
) -> Result<Vec<String>, BuildError> {
    let meta = template.metadata.get_or_insert_with(ObjectMeta::default);
    let mut corrected = force_entries(
        &mut meta.labels,
        &identity_labels(task, run_key),
        &format!("{path}.metadata.labels"),
    );
    corrected.extend(force_entries(
        &mut meta.annotations,
        &identity_annotations(task, run_key),
        &format!("{path}.metadata.annotations"),
    ));
    let pod = template.spec.as_mut().ok_or(BuildError::NoPodSpec)?;
    let contract = env::contract_env(task, ctx, index);
    let input = env::input_env(task);
    let mut each = |list: &mut Vec<Container>, field: &str| {
        for container in list.iter_mut() {
            for name in env::inject(container, &contract, &input) {
                corrected.push(format!(
                    "{path}.spec.{field}[{}].env[{name}]",
                    container.name
                ));
            }
        }
    };
    each(&mut pod.containers, "containers");
    if let Some(init) = pod.init_containers.as_mut() {
        each(init, "initContainers");
    }
    corrected.extend(add_token_volume(pod, task, path));
    add_pull_secrets(pod, &ctx.image_pull_secrets);
    if let Some(dir) = task.spec.tensor_board_dir.as_deref() {
        let image = ctx
            .tensorboard_image
            .as_deref()
            .unwrap_or(super::tensorboard::DEFAULT_IMAGE);
        if super::tensorboard::add_sidecar(pod, dir, image).map_err(BuildError::TensorBoardDir)? {
            template
                .metadata
                .get_or_insert_with(ObjectMeta::default)
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(
                    super::tensorboard::DIR_ANNOTATION.to_string(),
                    dir.to_string(),
                );
        }
    }
    Ok(corrected)
}

fn add_pull_secrets(pod: &mut PodSpec, secrets: &[String]) {
    if secrets.is_empty() {
        return;
    }
    let list = pod.image_pull_secrets.get_or_insert_with(Vec::new);
    for secret in secrets {
        if !list.iter().any(|s| s.name == *secret) {
            list.push(LocalObjectReference {
                name: secret.clone(),
            });
        }
    }
}

/// Adds the Task's node selector and `hostnames` (when not empty) to `pod` (see the
/// module docs).
fn add_node_constraints(
    pod: &mut PodSpec,
    selector: &BTreeMap<String, String>,
    hostnames: &[String],
) {
    let mut expressions = Vec::new();
    for (key, value) in selector {
        if value.contains(',') {
            let mut values: Vec<String> = value
                .split(',')
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_string)
                .collect();
            values.dedup();
            expressions.push(NodeSelectorRequirement {
                key: key.clone(),
                operator: "In".to_string(),
                values: Some(values),
            });
        } else {
            pod.node_selector
                .get_or_insert_with(BTreeMap::new)
                .insert(key.clone(), value.clone());
        }
    }
    if !hostnames.is_empty() {
        let mut values = hostnames.to_vec();
        values.sort();
        values.dedup();
        expressions.push(NodeSelectorRequirement {
            key: labels::HOSTNAME.to_string(),
            operator: "In".to_string(),
            values: Some(values),
        });
    }
    if expressions.is_empty() {
        return;
    }
    let required = pod
        .affinity
        .get_or_insert_with(Affinity::default)
        .node_affinity
        .get_or_insert_with(NodeAffinity::default)
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(|| NodeSelector {
            node_selector_terms: Vec::new(),
        });
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    // Terms are OR'ed, so every term must carry the Task's constraints.
    for term in &mut required.node_selector_terms {
        term.match_expressions
            .get_or_insert_with(Vec::new)
            .extend(expressions.iter().cloned());
    }
}

/// Names the claims of `pod`'s claim volumes that name none, and gives the claims to
/// create.
fn claims(
    pod: &mut PodSpec,
    task: &Task,
    ctx: &MemberContext,
    run_key: &str,
    storage: &BTreeMap<String, String>,
) -> Vec<PersistentVolumeClaim> {
    let mut claims: Vec<PersistentVolumeClaim> = Vec::new();
    for volume in pod.volumes.iter_mut().flatten() {
        let Some(source) = volume.persistent_volume_claim.as_mut() else {
            continue;
        };
        if source.claim_name.is_empty() {
            source.claim_name = names::claim_name(&task.name_any(), &volume.name);
        }
        let name = source.claim_name.clone();
        if claims
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some(&name))
        {
            continue;
        }
        claims.push(PersistentVolumeClaim {
            metadata: object_meta(task, ctx, run_key, name.clone()),
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".to_string()]),
                storage_class_name: storage.get(&name).cloned(),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([(
                        "storage".to_string(),
                        Quantity(CLAIM_SIZE.to_string()),
                    )])),
                    limits: None,
                }),
                ..Default::default()
            }),
            status: None,
        });
    }
    claims
}

/// The Ray head's headless Service of `task`: [`names::head_service_name`], no cluster
/// IP, not-ready addresses published (workers resolve the head before it is ready),
/// selecting the Task's Pods, ports [`HEAD_PORTS`].
pub fn head_service(task: &Task, ctx: &MemberContext, run_key: &str) -> Service {
    Service {
        metadata: object_meta(
            task,
            ctx,
            run_key,
            names::head_service_name(&task.name_any()),
        ),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_string()),
            publish_not_ready_addresses: Some(true),
            selector: Some(selector_labels(task)),
            ports: Some(
                HEAD_PORTS
                    .iter()
                    .map(|(name, port)| ServicePort {
                        name: Some((*name).to_string()),
                        port: *port,
                        protocol: Some("TCP".to_string()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        status: None,
    }
}

/// The token Secret of `task`'s run ([`names::token_secret_name`], the run's labels), with
/// no data yet: every container reads `RLARK_TOKEN` from its key [`env::TOKEN_KEY`] and
/// has its [`env::CA_KEY`] mounted under [`env::TOKEN_MOUNT_DIR`].
pub fn token_secret(task: &Task, ctx: &MemberContext, run_key: &str) -> Secret {
    Secret {
        metadata: object_meta(
            task,
            ctx,
            run_key,
            names::token_secret_name(&task.name_any()),
        ),
        type_: Some("Opaque".to_string()),
        ..Default::default()
    }
}

/// `secret` with its data: the task `token` and the installation's `ca` bundle.
pub fn fill_token_secret(secret: &mut Secret, token: &str, ca: &[u8]) {
    secret.data = Some(BTreeMap::from([
        (
            env::TOKEN_KEY.to_string(),
            k8s_openapi::ByteString(token.as_bytes().to_vec()),
        ),
        (
            env::CA_KEY.to_string(),
            k8s_openapi::ByteString(ca.to_vec()),
        ),
    ]));
}

/// Adds the token Secret's volume (only the CA bundle, optional: a Pod starts without it)
/// to `pod` and mounts it read only under [`env::TOKEN_MOUNT_DIR`] in every container
/// (replacing a volume or mount of the same name or path the template had). Returns the
/// replaced fields, as paths.
fn add_token_volume(pod: &mut PodSpec, task: &Task, path: &str) -> Vec<String> {
    let mut corrected = Vec::new();
    let volumes = pod.volumes.get_or_insert_with(Vec::new);
    if volumes.iter().any(|v| v.name == env::TOKEN_VOLUME) {
        corrected.push(format!("{path}.spec.volumes[{}]", env::TOKEN_VOLUME));
        volumes.retain(|v| v.name != env::TOKEN_VOLUME);
    }
    volumes.push(Volume {
        name: env::TOKEN_VOLUME.to_string(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(names::token_secret_name(&task.name_any())),
            items: Some(vec![k8s_openapi::api::core::v1::KeyToPath {
                key: env::CA_KEY.to_string(),
                path: env::CA_KEY.to_string(),
                mode: None,
            }]),
            optional: Some(true),
            default_mode: None,
        }),
        ..Default::default()
    });
    let mut each = |list: &mut Vec<Container>, field: &str| {
        for container in list.iter_mut() {
            let mounts = container.volume_mounts.get_or_insert_with(Vec::new);
            let clash = |m: &VolumeMount| {
                m.name == env::TOKEN_VOLUME || m.mount_path == env::TOKEN_MOUNT_DIR
            };
            if mounts.iter().any(clash) {
                corrected.push(format!(
                    "{path}.spec.{field}[{}].volumeMounts[{}]",
                    container.name,
                    env::TOKEN_MOUNT_DIR
                ));
                mounts.retain(|m| !clash(m));
            }
            mounts.push(VolumeMount {
                name: env::TOKEN_VOLUME.to_string(),
                mount_path: env::TOKEN_MOUNT_DIR.to_string(),
                read_only: Some(true),
                ..Default::default()
            });
        }
    };
    each(&mut pod.containers, "containers");
    if let Some(init) = pod.init_containers.as_mut() {
        each(init, "initContainers");
    }
    corrected
}

/// Whether `task` is a Ray head (annotation `rlark.io/ray-role=head`).
fn is_ray_head(task: &Task) -> bool {
    task.annotations()
        .get(labels::RAY_ROLE)
        .is_some_and(|r| r == labels::RAY_ROLE_HEAD)
}

/// The member objects of `task`'s `kubernetes.workload` for its run on `ctx.cluster_id`.
pub fn build(task: &Task, ctx: &MemberContext) -> Result<MemberObjects, BuildError> {
    let spec = task
        .spec
        .kubernetes
        .as_ref()
        .and_then(|k| k.workload.as_ref())
        .ok_or(BuildError::NoWorkload)?;
    let run_key = run_key(task, &ctx.cluster_id).ok_or_else(|| BuildError::NotPlaced {
        cluster_id: ctx.cluster_id.clone(),
    })?;
    let kind = spec.kind;
    let name = names::workload_name(&task.name_any(), kind);
    let index = match kind {
        KubernetesWorkloadKind::StatefulSet => IndexSource::StatefulSet,
        KubernetesWorkloadKind::Job => IndexSource::IndexedJob,
        _ => IndexSource::None,
    };
    let path = "kubernetes.workload.template";
    let mut template = spec.template.clone();
    let mut corrected = prepare_pod(&mut template, task, ctx, &run_key, index, path)?;
    let pod = template.spec.as_mut().ok_or(BuildError::NoPodSpec)?;
    let claims = claims(pod, task, ctx, &run_key, &spec.pvc_storage_map);
    let hostnames = match kind {
        KubernetesWorkloadKind::DaemonSet => Vec::new(),
        _ => task
            .spec
            .placement
            .as_ref()
            .map(|p| p.nodes.clone())
            .unwrap_or_default(),
    };
    add_node_constraints(pod, &task.spec.node_selector, &hostnames);
    let stopped = task.spec.stopped;
    let replicas = if stopped {
        0
    } else {
        spec.replicas.unwrap_or(1)
    };
    let selector = LabelSelector {
        match_labels: Some(selector_labels(task)),
        match_expressions: None,
    };
    let metadata = object_meta(task, ctx, &run_key, name);
    let head = is_ray_head(task);
    let workload = match kind {
        KubernetesWorkloadKind::CloneSet => Workload::CloneSet(CloneSet {
            metadata,
            spec: CloneSetSpec {
                replicas: Some(replicas),
                selector,
                template,
            },
            status: None,
        }),
        KubernetesWorkloadKind::Deployment => Workload::Deployment(Deployment {
            metadata,
            spec: Some(DeploymentSpec {
                replicas: Some(replicas),
                selector,
                template,
                ..Default::default()
            }),
            status: None,
        }),
        KubernetesWorkloadKind::StatefulSet => Workload::StatefulSet(StatefulSet {
            metadata,
            spec: Some(StatefulSetSpec {
                replicas: Some(replicas),
                selector,
                // The head's Pods get stable DNS names under its headless Service.
                service_name: head.then(|| names::head_service_name(&task.name_any())),
                template,
                ..Default::default()
            }),
            status: None,
        }),
        KubernetesWorkloadKind::DaemonSet => {
            if stopped && let Some(pod) = template.spec.as_mut() {
                pod.node_selector
                    .get_or_insert_with(BTreeMap::new)
                    .insert(STOPPED_NODE_LABEL.to_string(), "true".to_string());
            }
            Workload::DaemonSet(DaemonSet {
                metadata,
                spec: Some(DaemonSetSpec {
                    selector,
                    template,
                    ..Default::default()
                }),
                status: None,
            })
        }
        KubernetesWorkloadKind::Job => {
            if let Some(pod) = template.spec.as_mut() {
                // A Job's Pods may not restart Always; a failed container fails the
                // Task with its exit code, as a raw replica with restartPolicy Never.
                if pod.restart_policy.as_deref() != Some("OnFailure") {
                    if pod.restart_policy.as_deref() == Some("Always") {
                        corrected.push(format!("{path}.spec.restartPolicy"));
                    }
                    pod.restart_policy = Some("Never".to_string());
                }
            }
            let replicas = spec.replicas.unwrap_or(1);
            Workload::Job(Job {
                metadata,
                spec: Some(JobSpec {
                    parallelism: Some(replicas),
                    completions: Some(replicas),
                    completion_mode: Some("Indexed".to_string()),
                    backoff_limit: Some(0),
                    suspend: Some(stopped),
                    active_deadline_seconds: task
                        .spec
                        .kubernetes
                        .as_ref()
                        .and_then(|k| k.active_deadline_seconds),
                    template,
                    ..Default::default()
                }),
                status: None,
            })
        }
    };
    Ok(MemberObjects {
        workload,
        head_service: head.then(|| head_service(task, ctx, &run_key)),
        claims,
        token_secret: Some(token_secret(task, ctx, &run_key)),
        corrected,
    })
}

/// A Task and a context for this module's tests and its siblings'.
#[cfg(test)]
pub(crate) mod testing {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use rlark_api::types::{Task, TaskSpec};
    use serde_json::json;

    use super::MemberContext;

    /// The context of cluster `c1` whose member namespace is `rlark-system`.
    pub fn ctx() -> MemberContext {
        MemberContext {
            server_url: "https://cp:6443".into(),
            cluster_id: "c1".into(),
            namespace: "rlark-system".into(),
            image_pull_secrets: vec!["regcred".into()],
            extra_env: Vec::new(),
            tensorboard_image: None,
        }
    }

    /// Task `name` of Job `ppo` in `rlark-c1`, UID `uid-1`: a StatefulSet of `replicas`
    /// with one container `main`, placed on `c1` (nodes n1, n2, ...).
    pub fn task(name: &str, replicas: i32) -> Task {
        let nodes: Vec<String> = (0..replicas.max(1))
            .map(|i| format!("n{}", i % 2 + 1))
            .collect();
        let spec: TaskSpec = serde_json::from_value(json!({
            "agentType": "Kubernetes",
            "role": "Actor",
            "placement": {"clusterID": "c1", "nodes": nodes},
            "kubernetes": {"workload": {
                "kind": "StatefulSet",
                "replicas": replicas,
                "template": {
                    "metadata": {"labels": {"app": "ppo"}},
                    "spec": {"containers": [{
                        "name": "main", "image": "rlinf/rlinf:latest",
                        "env": [{"name": "A", "value": "1"}],
                        "resources": {"requests": {"cpu": "2", "nvidia.com/gpu": "1"}}
                    }]}
                }
            }}
        }))
        .expect("task spec");
        let mut task = Task::new(name, spec);
        task.metadata = ObjectMeta {
            name: Some(name.into()),
            namespace: Some("rlark-c1".into()),
            uid: Some("uid-1".into()),
            labels: Some([("rlinf.io/job".to_string(), "ppo".to_string())].into()),
            ..Default::default()
        };
        task
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{ctx, task};
    use super::*;
    use serde_json::json;

    fn with_workload(name: &str, workload: serde_json::Value) -> Task {
        let mut t = task(name, 1);
        t.spec.kubernetes =
            Some(serde_json::from_value(json!({"workload": workload})).expect("kubernetes block"));
        t
    }

    fn env_value(c: &Container, name: &str) -> Option<String> {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    }

    #[test]
    fn a_statefulset_with_identity_selector_env_and_no_privilege() {
        let t = task("ppo-actor", 2);
        let objects = build(&t, &ctx()).expect("build");
        let Workload::StatefulSet(sts) = &objects.workload else {
            panic!("not a StatefulSet: {:?}", objects.workload)
        };
        assert_eq!(sts.metadata.name.as_deref(), Some("ppo-actor"));
        assert_eq!(sts.metadata.namespace.as_deref(), Some("rlark-system"));
        let labels = sts.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels[MANAGED_BY_LABEL], "rlark");
        assert_eq!(labels[TASK_NAME_LABEL], "ppo-actor");
        assert_eq!(labels[TASK_NAMESPACE_LABEL], "rlark-c1");
        assert_eq!(labels[TASK_UID_LABEL], "uid-1");
        assert_eq!(labels[RUN_LABEL].len(), 16);
        let annotations = sts.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(annotations[RUN_KEY_ANNOTATION], "uid-1//n1,n2");
        let spec = sts.spec.as_ref().expect("spec");
        assert_eq!(spec.replicas, Some(2));
        assert_eq!(spec.service_name, None, "not a Ray head");
        assert_eq!(spec.selector.match_labels, Some(selector_labels(&t)));
        let pod_labels = spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone());
        let pod_labels = pod_labels.unwrap_or_default();
        assert_eq!(pod_labels["app"], "ppo", "the template's own labels stay");
        assert_eq!(pod_labels[TASK_UID_LABEL], "uid-1");
        let pod = spec.template.spec.as_ref().expect("pod");
        let main = &pod.containers[0];
        assert_eq!(env_value(main, "A").as_deref(), Some("1"));
        assert_eq!(env_value(main, "RLARK_TASK").as_deref(), Some("ppo-actor"));
        assert!(main.resources.is_some(), "resources are the template's");
        assert_eq!(pod.host_network, None);
        assert!(
            pod.containers.iter().all(|c| c.security_context.is_none()),
            "nothing privileged"
        );
        assert_eq!(
            pod.image_pull_secrets,
            Some(vec![LocalObjectReference {
                name: "regcred".into()
            }])
        );
        let terms = &pod
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| {
                n.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .expect("placement affinity")
            .node_selector_terms;
        assert_eq!(terms.len(), 1);
        assert_eq!(
            terms[0].match_expressions,
            Some(vec![NodeSelectorRequirement {
                key: "kubernetes.io/hostname".into(),
                operator: "In".into(),
                values: Some(vec!["n1".into(), "n2".into()]),
            }])
        );
        assert!(objects.head_service.is_none());
        assert!(objects.claims.is_empty());
        assert!(objects.corrected.is_empty(), "{:?}", objects.corrected);
    }

    #[test]
    fn a_ray_head_gets_its_headless_service() {
        let mut t = task("ppo-actor", 1);
        t.annotations_mut().insert(
            labels::RAY_ROLE.to_string(),
            labels::RAY_ROLE_HEAD.to_string(),
        );
        let objects = build(&t, &ctx()).expect("build");
        let svc = objects.head_service.expect("head service");
        assert_eq!(svc.metadata.name.as_deref(), Some("ppo-actor-ray-head"));
        let spec = svc.spec.expect("spec");
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
        assert_eq!(spec.selector, Some(selector_labels(&t)));
        let ports: Vec<i32> = spec.ports.iter().flatten().map(|p| p.port).collect();
        assert_eq!(ports, [6379, 8265, 8080]);
        let Workload::StatefulSet(sts) = objects.workload else {
            panic!("not a StatefulSet")
        };
        assert_eq!(
            sts.spec.and_then(|s| s.service_name).as_deref(),
            Some("ppo-actor-ray-head")
        );
    }

    #[test]
    fn the_service_and_claims_are_owned_by_the_created_workload() {
        let mut t = task("ppo-actor", 1);
        t.annotations_mut().insert(
            labels::RAY_ROLE.to_string(),
            labels::RAY_ROLE_HEAD.to_string(),
        );
        if let Some(w) = t.spec.kubernetes.as_mut().and_then(|k| k.workload.as_mut())
            && let Some(pod) = w.template.spec.as_mut()
        {
            pod.volumes = Some(vec![
                serde_json::from_value(
                    json!({"name": "data", "persistentVolumeClaim": {"claimName": ""}}),
                )
                .expect("volume"),
            ]);
        }
        let mut objects = build(&t, &ctx()).expect("build");
        assert!(
            !objects.own_dependents(&objects.workload.clone()),
            "no UID before it is created"
        );
        assert!(objects.claims[0].metadata.owner_references.is_none());
        let mut created = objects.workload.clone();
        if let Workload::StatefulSet(s) = &mut created {
            s.metadata.uid = Some("sts-uid".into());
        }
        assert!(objects.own_dependents(&created));
        assert!(objects.own_dependents(&created), "idempotent");
        let owners = |meta: &ObjectMeta| meta.owner_references.clone().unwrap_or_default();
        let service = objects.head_service.as_ref().expect("service");
        let secret = objects.token_secret.as_ref().expect("token secret");
        for refs in [
            owners(&service.metadata),
            owners(&objects.claims[0].metadata),
            owners(&secret.metadata),
        ] {
            assert_eq!(refs.len(), 1);
            assert_eq!(
                (refs[0].kind.as_str(), refs[0].api_version.as_str()),
                ("StatefulSet", "apps/v1")
            );
            assert_eq!(refs[0].uid, "sts-uid");
            assert_eq!(refs[0].name, "ppo-actor");
        }
    }

    #[test]
    fn every_container_reads_the_token_from_the_run_secret_and_mounts_the_ca() {
        let mut t = task("ppo-actor", 1);
        if let Some(w) = t.spec.kubernetes.as_mut().and_then(|k| k.workload.as_mut())
            && let Some(pod) = w.template.spec.as_mut()
        {
            // A template's own token and mount over the CA's directory are replaced.
            pod.containers[0].env = Some(vec![
                serde_json::from_value(json!({"name": "RLARK_TOKEN", "value": "forged"}))
                    .expect("env"),
            ]);
            pod.containers[0].volume_mounts = Some(vec![
                serde_json::from_value(json!({"name": "mine", "mountPath": "/var/run/rlark"}))
                    .expect("mount"),
            ]);
        }
        let mut objects = build(&t, &ctx()).expect("build");
        let pod = objects
            .workload
            .pod_template()
            .and_then(|t| t.spec.clone())
            .expect("pod spec");
        let env = pod.containers[0].env.clone().unwrap_or_default();
        let token = env.iter().find(|e| e.name == "RLARK_TOKEN").expect("token");
        let secret_ref = token
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.as_ref())
            .expect("secretKeyRef");
        assert_eq!(
            (
                secret_ref.name.as_str(),
                secret_ref.key.as_str(),
                secret_ref.optional
            ),
            ("ppo-actor-rlark-token", "token", Some(true))
        );
        let value = |name: &str| {
            env.iter()
                .find(|e| e.name == name)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(
            value("RLARK_REPORT_URL").as_deref(),
            Some("https://cp:6443/rlark/v1/namespaces/rlark-c1/tasks/ppo-actor/reports")
        );
        assert_eq!(
            value("RLARK_CA_FILE").as_deref(),
            Some("/var/run/rlark/ca.crt")
        );
        let mounts = pod.containers[0].volume_mounts.clone().unwrap_or_default();
        assert_eq!(mounts.len(), 1, "{mounts:?}");
        assert_eq!(
            (
                mounts[0].name.as_str(),
                mounts[0].mount_path.as_str(),
                mounts[0].read_only
            ),
            ("rlark-task-token", "/var/run/rlark", Some(true))
        );
        let volume = pod
            .volumes
            .unwrap_or_default()
            .into_iter()
            .find(|v| v.name == "rlark-task-token")
            .and_then(|v| v.secret)
            .expect("secret volume");
        assert_eq!(volume.secret_name.as_deref(), Some("ppo-actor-rlark-token"));
        assert!(
            objects
                .corrected
                .iter()
                .any(|c| c.ends_with("volumeMounts[/var/run/rlark]")),
            "{:?}",
            objects.corrected
        );
        assert!(
            objects
                .corrected
                .iter()
                .any(|c| c.ends_with("env[RLARK_TOKEN]")),
            "{:?}",
            objects.corrected
        );
        let secret = objects.token_secret.as_mut().expect("secret");
        assert_eq!(
            secret.metadata.name.as_deref(),
            Some("ppo-actor-rlark-token")
        );
        assert!(
            secret.data.is_none(),
            "filled only once the token is minted"
        );
        fill_token_secret(secret, "rlk-a.b", b"PEM");
        let data = secret.data.clone().unwrap_or_default();
        assert_eq!(data["token"].0, b"rlk-a.b");
        assert_eq!(data["ca.crt"].0, b"PEM");
    }

    #[test]
    fn node_selector_lists_become_one_affinity_term() {
        let mut t = task("ppo-actor", 1);
        t.spec.node_selector = BTreeMap::from([
            ("gpu".to_string(), "a100,h100".to_string()),
            ("zone".to_string(), "z1".to_string()),
            ("rack".to_string(), "r1,r2".to_string()),
        ]);
        let objects = build(&t, &ctx()).expect("build");
        let pod = objects
            .workload
            .pod_template()
            .and_then(|t| t.spec.clone())
            .expect("pod");
        assert_eq!(
            pod.node_selector,
            Some(BTreeMap::from([("zone".to_string(), "z1".to_string())]))
        );
        let terms = pod
            .affinity
            .and_then(|a| a.node_affinity)
            .and_then(|n| n.required_during_scheduling_ignored_during_execution)
            .expect("affinity")
            .node_selector_terms;
        assert_eq!(terms.len(), 1, "one term: all keys must hold");
        let keys: Vec<(String, Vec<String>)> = terms[0]
            .match_expressions
            .iter()
            .flatten()
            .map(|e| (e.key.clone(), e.values.clone().unwrap_or_default()))
            .collect();
        assert_eq!(
            keys,
            [
                (
                    "gpu".to_string(),
                    vec!["a100".to_string(), "h100".to_string()]
                ),
                ("rack".to_string(), vec!["r1".to_string(), "r2".to_string()]),
                ("kubernetes.io/hostname".to_string(), vec!["n1".to_string()]),
            ]
        );
    }

    #[test]
    fn claims_from_pvc_volumes() {
        let template = json!({"spec": {
        "containers": [{"name": "main", "image": "x"}],
        "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": ""}},
            {"name": "ckpt", "persistentVolumeClaim": {"claimName": "shared-ckpt"}},
            {"name": "tmp", "emptyDir": {}},
        ]}});
        let t = with_workload(
            "ppo-actor",
            json!({"kind": "Deployment", "template": template,
                   "pvcStorageMap": {"shared-ckpt": "fast", "other": "slow"}}),
        );
        let objects = build(&t, &ctx()).expect("build");
        let claims: Vec<(Option<String>, Option<String>)> = objects
            .claims
            .iter()
            .map(|c| {
                (
                    c.metadata.name.clone(),
                    c.spec.as_ref().and_then(|s| s.storage_class_name.clone()),
                )
            })
            .collect();
        assert_eq!(
            claims,
            [
                (Some("pvc-ppo-actor-data".to_string()), None),
                (Some("shared-ckpt".to_string()), Some("fast".to_string())),
            ]
        );
        let pod = objects
            .workload
            .pod_template()
            .and_then(|t| t.spec.clone())
            .expect("pod");
        let claim = pod.volumes.iter().flatten().find(|v| v.name == "data");
        assert_eq!(
            claim
                .and_then(|v| v.persistent_volume_claim.as_ref())
                .map(|c| c.claim_name.as_str()),
            Some("pvc-ppo-actor-data")
        );
        let spec = objects.claims[0].spec.clone().expect("claim spec");
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_string()]));
    }

    #[test]
    fn every_kind_and_stopped() {
        let template = json!({"spec": {"containers": [{"name": "main", "image": "x"}],
                                       "restartPolicy": "Always"}});
        for (kind, stopped) in [
            ("Deployment", false),
            ("Deployment", true),
            ("StatefulSet", true),
            ("DaemonSet", false),
            ("DaemonSet", true),
            ("Job", false),
            ("Job", true),
            ("CloneSet", false),
            ("CloneSet", true),
        ] {
            let mut t = with_workload(
                "ppo-rollout",
                json!({"kind": kind, "replicas": 3, "template": template}),
            );
            t.spec.stopped = stopped;
            if let Some(k) = t.spec.kubernetes.as_mut() {
                k.active_deadline_seconds = Some(600);
            }
            let objects = build(&t, &ctx()).expect("build");
            assert_eq!(objects.workload.kind().as_str(), kind);
            let pod = objects
                .workload
                .pod_template()
                .and_then(|t| t.spec.clone())
                .expect("pod");
            match &objects.workload {
                Workload::Deployment(d) => {
                    let replicas = d.spec.as_ref().and_then(|s| s.replicas);
                    assert_eq!(replicas, Some(if stopped { 0 } else { 3 }));
                }
                Workload::StatefulSet(s) => {
                    assert_eq!(s.spec.as_ref().and_then(|s| s.replicas), Some(0));
                }
                Workload::DaemonSet(_) => {
                    let marker = pod
                        .node_selector
                        .as_ref()
                        .and_then(|s| s.get(STOPPED_NODE_LABEL))
                        .cloned();
                    assert_eq!(marker, stopped.then(|| "true".to_string()));
                    assert!(pod.affinity.is_none(), "a DaemonSet is not pinned");
                }
                Workload::CloneSet(c) => {
                    assert_eq!(c.spec.replicas, Some(if stopped { 0 } else { 3 }));
                    let owner = objects.workload.owner_reference();
                    assert_eq!(owner.map(|o| o.api_version), None, "no UID yet");
                    let json = serde_json::to_value(c).expect("json");
                    assert_eq!(json["apiVersion"], "apps.kruise.io/v1alpha1");
                    assert_eq!(json["kind"], "CloneSet");
                }
                Workload::Job(j) => {
                    let spec = j.spec.as_ref().expect("job spec");
                    assert_eq!(spec.suspend, Some(stopped));
                    assert_eq!(spec.parallelism, Some(3));
                    assert_eq!(spec.completions, Some(3));
                    assert_eq!(spec.completion_mode.as_deref(), Some("Indexed"));
                    assert_eq!(spec.backoff_limit, Some(0));
                    assert_eq!(spec.active_deadline_seconds, Some(600));
                    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
                    assert_eq!(
                        objects.corrected,
                        ["kubernetes.workload.template.spec.restartPolicy"]
                    );
                }
            }
        }
    }

    #[test]
    fn tensor_board_dir_adds_the_sidecar_and_marks_the_pod_template() {
        let mut t = task("ppo-actor", 1);
        t.spec.tensor_board_dir = Some("/work/runs".into());
        let mut context = ctx();
        context.tensorboard_image = Some("registry.example/tb:2".into());
        let objects = build(&t, &context).expect("build");
        let Workload::StatefulSet(sts) = &objects.workload else {
            panic!("not a StatefulSet")
        };
        let template = &sts.spec.as_ref().expect("spec").template;
        assert_eq!(
            template
                .metadata
                .as_ref()
                .unwrap()
                .annotations
                .as_ref()
                .unwrap()[super::super::tensorboard::DIR_ANNOTATION],
            "/work/runs"
        );
        let pod = template.spec.as_ref().expect("pod");
        let sidecar = &pod.init_containers.as_ref().expect("init")[0];
        assert_eq!(sidecar.name, super::super::tensorboard::SIDECAR);
        assert_eq!(sidecar.image.as_deref(), Some("registry.example/tb:2"));
        // Without the flag, the default image; a relative directory fails the build.
        t.spec.tensor_board_dir = Some("runs".into());
        assert!(matches!(
            build(&t, &ctx()),
            Err(BuildError::TensorBoardDir(_))
        ));
    }

    #[test]
    fn refusals() {
        let mut unplaced = task("ppo-actor", 1);
        unplaced.spec.placement = None;
        assert_eq!(
            build(&unplaced, &ctx()),
            Err(BuildError::NotPlaced {
                cluster_id: "c1".into()
            })
        );
        let mut elsewhere = ctx();
        elsewhere.cluster_id = "c2".into();
        assert!(matches!(
            build(&task("ppo-actor", 1), &elsewhere),
            Err(BuildError::NotPlaced { .. })
        ));
        let mut template_only = task("ppo-actor", 1);
        template_only.spec.kubernetes = Some(rlark_api::types::KubernetesTaskSpec {
            job_template: Some("kind: Job".into()),
            ..Default::default()
        });
        assert_eq!(build(&template_only, &ctx()), Err(BuildError::NoWorkload));
        let no_spec = with_workload("x", json!({"kind": "Deployment", "template": {}}));
        assert_eq!(build(&no_spec, &ctx()), Err(BuildError::NoPodSpec));
    }
}
