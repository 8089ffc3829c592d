//! `Task` (namespaced): one role of a Job, run by the agent of one cluster.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    AgentType, EnvVar, NodeEvent, PullProgress, ResourceRequirements, string_enum,
};

mod input_path;
pub use input_path::{InputPath, InputPathError, InputPathStep, input_env_value};

/// Lifecycle phase of a Task (and of a Job, see [`super::JobPhase`]).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum TaskPhase {
    /// Accepted, not running yet (scheduling, pulling, starting).
    Pending,
    /// All replicas started.
    Running,
    /// Finished: every replica exited 0 / the workload completed.
    Succeeded,
    /// Finished with an error.
    Failed,
    /// Stopped on request.
    Stopped,
}
string_enum!(TaskPhase {
    Pending => "Pending",
    Running => "Running",
    Succeeded => "Succeeded",
    Failed => "Failed",
    Stopped => "Stopped",
});

/// What a task does in the RL loop.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum TaskRole {
    /// Policy training.
    Actor,
    /// Experience generation.
    Rollout,
    /// Environment (simulator, robot).
    Env,
    /// The task the others gather around, as RLark's own examples name it
    /// (`cross-cluster-ping.yaml`); a label only: which task is the Ray head is
    /// `head: true` in the Job's template, not the role.
    Head,
}
string_enum!(TaskRole { Actor => "Actor", Rollout => "Rollout", Env => "Env", Head => "Head" });

/// Kind of Kubernetes workload a `kubernetes` task creates.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum KubernetesWorkloadKind {
    /// apps/v1 Deployment.
    Deployment,
    /// apps/v1 StatefulSet.
    StatefulSet,
    /// apps/v1 DaemonSet (ignores `replicas`).
    DaemonSet,
    /// batch/v1 Job (`replicas` = parallelism = completions).
    Job,
    /// OpenKruise's `apps.kruise.io/v1alpha1` CloneSet, on member clusters that serve its
    /// CRD (placement skips the others and says so).
    CloneSet,
}
string_enum!(KubernetesWorkloadKind {
    Deployment => "Deployment",
    StatefulSet => "StatefulSet",
    DaemonSet => "DaemonSet",
    Job => "Job",
    CloneSet => "CloneSet",
});

/// When the agent restarts an exited `raw` replica.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum RestartPolicy {
    /// Never: the exit code decides the replica's outcome.
    #[default]
    Never,
    /// Restart after a non-zero exit.
    OnFailure,
    /// Restart after any exit.
    Always,
}
string_enum!(RestartPolicy { Never => "Never", OnFailure => "OnFailure", Always => "Always" });

/// What happens to a Task whose Node stops heartbeating.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum NodeLostPolicy {
    /// The Task fails (its Job fails); the default, because a lost robot run is not
    /// silently repeated.
    #[default]
    Fail,
    /// The Task is placed again on another Node that fits.
    Reschedule,
}
string_enum!(NodeLostPolicy { Fail => "Fail", Reschedule => "Reschedule" });

/// What the agent does with a running replica when a robot or camera it holds becomes
/// unhealthy (`spec.onDeviceUnhealthy`, docs/embodied.md). Either way the replica's Pod lists
/// the device in `status.unhealthyDevices` and the Task gets the condition
/// `DeviceUnhealthy`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum DeviceUnhealthyPolicy {
    /// The replica keeps running (it may wait for the device to recover); the default.
    #[default]
    Keep,
    /// The agent stops the replica (SIGTERM, SIGKILL after the grace period); its Pod ends
    /// `Failed` with reason `DeviceUnhealthy` and a message naming the device, without an
    /// in-place restart, and the Task fails as for any failed replica.
    Stop,
}
string_enum!(DeviceUnhealthyPolicy { Keep => "Keep", Stop => "Stop" });

/// Where the scheduler placed a Task: the cluster (its agent namespace is
/// `rlark-<clusterID>`) and one Node per replica, by replica index.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskPlacement {
    /// Cluster ID of the chosen Nodes.
    #[serde(rename = "clusterID")]
    pub cluster_id: String,
    /// Node name for each replica (index = replica index).
    #[serde(default)]
    pub nodes: Vec<String>,
}

/// Desired state of a Task. Also the body of a Job's task template (flattened into
/// [`super::JobTaskTemplate`]).
///
/// Exactly one of `kubernetes`, `docker`, `raw` is set, the one that `agentType` names.
// Repeated `type_ = "string"` in the printcolumn(...) lists is not a mistake.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[schemars(transform = agent_type_not_required)]
#[kube(
    crates(kube_core = ::kube_core),
    group = "rlinf.io",
    version = "v1alpha1",
    kind = "Task",
    namespaced,
    status = "TaskStatus",
    derive = "PartialEq",
    shortname = "task",
    shortname = "rltask",
    category = "rlark",
    doc = "Task: one role of a Job (actor, rollout or env), run by the agent of one cluster.",
    printcolumn(name = "Role", type_ = "string", json_path = ".spec.role"),
    printcolumn(
        name = "Agent",
        type_ = "string",
        description = "Cluster whose agent runs the task (empty until placed).",
        json_path = ".spec.placement.clusterID"
    ),
    printcolumn(name = "Type", type_ = "string", json_path = ".spec.agentType"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Reward",
        type_ = "string",
        description = "The newest and the mean reward the task reported (last/mean).",
        json_path = ".status.reward.summary",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TaskSpec {
    /// Runtime that executes the task; selects the `kubernetes`, `docker` or `raw` block.
    /// Optional in a manifest: the API server fills it in from the one runtime block that
    /// is set, so a stored spec always has it.
    pub agent_type: AgentType,
    /// Role in the RL loop.
    pub role: TaskRole,
    /// Domain (virtual network) the task's pods join; copied from the Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Unused; kept so RLark manifests apply unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downstream_name: Option<String>,
    /// Node labels the task's node must carry; a value may be a comma-separated list,
    /// meaning any of them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Pins the task to this Node (by name) instead of letting the scheduler choose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Set by the scheduler (Job controller) on created Tasks: the chosen cluster and
    /// nodes. Not meant for Job templates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<TaskPlacement>,
    /// Set when the owning Job is stopped: runtimes stop the work (replicas 0 for
    /// Kubernetes workloads) and the Task ends `Stopped`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
    /// What to do when the Task's Node is lost (`Fail` by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_lost_policy: Option<NodeLostPolicy>,
    /// What to do with a running replica when a robot or camera it holds becomes unhealthy
    /// (`Keep` by default; `Stop` ends it `Failed` with reason `DeviceUnhealthy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_device_unhealthy: Option<DeviceUnhealthyPolicy>,
    /// Workload for `agentType: Kubernetes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesTaskSpec>,
    /// Containers for `agentType: Docker`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub docker: Option<DockerTaskSpec>,
    /// Processes for `agentType: Raw`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<RawTaskSpec>,
    /// Directory of TensorBoard logs to proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_board_dir: Option<String>,
    /// Shell script run before Ray starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prepare_script: Option<String>,
    /// Shell script run on the head once Ray is ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_script: Option<String>,
    /// SSH public key authorized in the task's pods; copied from the Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_public_key: Option<String>,
    /// Input of the task: any JSON value (an RL rollout's input, a job's parameters). rlark
    /// does not interpret it; `envFrom.input` turns parts of it into environment variables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_json_schema")]
    pub input: Option<serde_json::Value>,
    /// Environment variables taken from elsewhere in the Task (today: from `input`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_from: Option<TaskEnvFrom>,
}

/// `envFrom`: environment variables whose values come from the Task itself.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskEnvFrom {
    /// Variables set from values of `spec.input`, in order. A variable named here and in
    /// `raw.environment` takes the `raw.environment` value (as `env` wins over `envFrom` in
    /// a Kubernetes container); rlark's `RLARK_*` variables win over both.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub input: Vec<InputEnvVar>,
}

/// One `envFrom.input` entry: variable `name` gets the value at `path` of `spec.input`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InputEnvVar {
    /// Environment variable name: `[A-Za-z_][A-Za-z0-9_]*`, not starting with `RLARK_`.
    pub name: String,
    /// JSONPath of the value in `spec.input`: `$`, then `.key`, `['key']` or `[index]`
    /// steps (e.g. `$.question`, `$.samples[0]['prompt text']`). A string value is used as
    /// it is; numbers, booleans, null, objects and arrays as compact JSON text.
    pub path: String,
}

/// Why an `envFrom.input` entry gives no value (see [`TaskSpec::input_env`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InputEnvError {
    /// The path does not parse.
    #[error("envFrom.input {name}: path {path:?} is not valid: {error}")]
    BadPath {
        /// The variable.
        name: String,
        /// The path as written.
        path: String,
        /// What is wrong with it.
        error: InputPathError,
    },
    /// The path selects nothing in `spec.input` (or there is no `spec.input`).
    #[error("envFrom.input {name}: path {path:?} matches nothing in spec.input")]
    NotFound {
        /// The variable.
        name: String,
        /// The path as written.
        path: String,
    },
}

/// `agentType` may be left out of a manifest (the API server defaults it from the runtime
/// block, [`crate::defaults`]), so the schema must not require it; the Rust type does,
/// because every stored spec has it.
fn agent_type_not_required(schema: &mut schemars::Schema) {
    if let Some(serde_json::Value::Array(required)) = schema.get_mut("required") {
        required.retain(|field| field != "agentType");
    }
}

/// Schema of a field that holds any JSON value: structural schemas express "anything" as
/// `x-kubernetes-preserve-unknown-fields: true` without a `type`.
fn any_json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "Any JSON value.",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

impl TaskSpec {
    /// Names of the runtime blocks that are set, in `kubernetes`, `docker`, `raw` order.
    pub fn runtime_blocks(&self) -> Vec<&'static str> {
        let mut blocks = Vec::new();
        if self.kubernetes.is_some() {
            blocks.push("kubernetes");
        }
        if self.docker.is_some() {
            blocks.push("docker");
        }
        if self.raw.is_some() {
            blocks.push("raw");
        }
        blocks
    }

    /// The `envFrom.input` variables resolved against `input`, in order, as `(name, value)`
    /// pairs (values rendered by [`input_env_value`]), and the entries that gave no value.
    /// Names are not checked here (admission validation does that).
    pub fn input_env(&self) -> (Vec<(String, String)>, Vec<InputEnvError>) {
        let mut values = Vec::new();
        let mut errors = Vec::new();
        let entries = self.env_from.iter().flat_map(|e| e.input.iter());
        for entry in entries {
            let path = match InputPath::parse(&entry.path) {
                Ok(path) => path,
                Err(error) => {
                    errors.push(InputEnvError::BadPath {
                        name: entry.name.clone(),
                        path: entry.path.clone(),
                        error,
                    });
                    continue;
                }
            };
            match self.input.as_ref().and_then(|input| path.lookup(input)) {
                Some(value) => values.push((entry.name.clone(), input_env_value(value))),
                None => errors.push(InputEnvError::NotFound {
                    name: entry.name.clone(),
                    path: entry.path.clone(),
                }),
            }
        }
        (values, errors)
    }

    /// When an exited replica is restarted: the `raw` or `docker` block's
    /// `restartPolicy` (`Never` for other tasks).
    pub fn restart_policy(&self) -> RestartPolicy {
        match (&self.raw, &self.docker) {
            (Some(raw), _) => raw.restart_policy,
            (None, Some(docker)) => docker.restart_policy,
            (None, None) => RestartPolicy::Never,
        }
    }

    /// `activeDeadlineSeconds` of the `raw` or `docker` block.
    pub fn active_deadline_seconds(&self) -> Option<i64> {
        match (&self.raw, &self.docker) {
            (Some(raw), _) => raw.active_deadline_seconds,
            (None, Some(docker)) => docker.active_deadline_seconds,
            (None, None) => None,
        }
    }

    /// `terminationGracePeriodSeconds` of the `raw` or `docker` block.
    pub fn termination_grace_period_seconds(&self) -> Option<i64> {
        match (&self.raw, &self.docker) {
            (Some(raw), _) => raw.termination_grace_period_seconds,
            (None, Some(docker)) => docker.termination_grace_period_seconds,
            (None, None) => None,
        }
    }

    /// Number of replicas (Ray nodes) the task runs: `raw.replicas`,
    /// `kubernetes.workload.replicas` (1 when unset), 1 for a `kubernetes.jobTemplate`
    /// (its parallelism is only known once rendered on the member cluster) and for `docker`.
    pub fn replicas(&self) -> i32 {
        if let Some(raw) = &self.raw {
            raw.replicas
        } else if let Some(workload) = self.kubernetes.as_ref().and_then(|k| k.workload.as_ref()) {
            workload.replicas.unwrap_or(1)
        } else {
            1
        }
    }
}

/// `kubernetes` runtime block: exactly one of `workload` and `jobTemplate`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesTaskSpec {
    /// The workload the agent creates in its cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<KubernetesWorkloadSpec>,
    /// Jinja-compatible text (rendered with MiniJinja on the agent) that renders ONE
    /// `batch/v1` Job. Variables: `input` (`spec.input`, none when unset), `task`
    /// (`name`, `namespace`, `uid`, `job`) and `job_name` (the name the Job gets); filter
    /// `yaml_escape` (a value as a quoted YAML string). An undefined variable is an error.
    /// The agent forces `backoffLimit: 0`, `restartPolicy: Never`, the name, namespace,
    /// rlark's labels and the environment contract, and reports what it corrected.
    /// The scheduler counts no resources for such a Task (docs/tasks.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_template: Option<String>,
    /// Seconds a `Job` (a `workload` of kind Job, or a `jobTemplate`) may run before the
    /// member cluster ends it (`DeadlineExceeded`); forced onto the rendered Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<i64>,
}

/// A Kubernetes workload.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesWorkloadSpec {
    /// Workload kind.
    pub kind: KubernetesWorkloadKind,
    /// Desired replicas (default 1; ignored by DaemonSet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Pod template of the workload (Kubernetes `core/v1` PodTemplateSpec; see
    /// `kubectl explain deployment.spec.template`).
    #[schemars(schema_with = "pod_template_schema")]
    pub template: PodTemplateSpec,
    /// Persistent volume claim name → storage class, for claims the agent creates.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pvc_storage_map: BTreeMap<String, String>,
}

/// `docker` runtime block.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DockerTaskSpec {
    /// Containers started together on the node; the first is the main one (its exit is
    /// the replica's).
    #[serde(default)]
    pub containers: Vec<DockerContainerSpec>,
    /// When an exited replica is restarted (default `Never`), as for `raw`: the agent
    /// starts the containers again; the engine's own restart policy stays `no`.
    #[serde(default)]
    pub restart_policy: RestartPolicy,
    /// Seconds after the first start when every container is stopped and the task fails
    /// (`DeadlineExceeded`), as for `raw`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<i64>,
    /// Seconds between SIGTERM and SIGKILL to the containers on stop (default 30), as for
    /// `raw`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
}

/// One Docker container.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DockerContainerSpec {
    /// Container name, unique within the task (DNS-1123 label).
    pub name: String,
    /// Image reference.
    pub image: String,
    /// Replaces the image's entrypoint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Replaces the image's command.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variables.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub environment: Vec<EnvVar>,
    /// Bind mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<DockerVolumeRef>,
    /// CPU/memory/device requests and limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// A bind mount of a Docker container.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DockerVolumeRef {
    /// Host path or volume name.
    pub source: String,
    /// Absolute path in the container.
    pub target: String,
}

/// Schema of the embedded PodTemplateSpec: Kubernetes' own, with its descriptions removed.
///
/// With descriptions it is ~470 KB of YAML per occurrence, which makes the Job, Task and
/// Workflow CRDs larger than the 256 KiB `kubectl apply` can record in its
/// last-applied-configuration annotation. The structure (and so validation and pruning) is
/// kept whole.
fn pod_template_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut value = generator.subschema_for::<PodTemplateSpec>().to_value();
    strip_descriptions(&mut value);
    // Removing keys keeps an object schema an object, so the conversion cannot fail; the
    // fallback (the accept-anything schema) is never taken.
    schemars::Schema::try_from(value).unwrap_or_default()
}

/// Removes `description` from a schema and every schema nested in it (properties, items,
/// additionalProperties, allOf/anyOf/oneOf, not), but never a property that happens to be
/// named `description`.
fn strip_descriptions(schema: &mut serde_json::Value) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    obj.remove("description");
    if let Some(props) = obj.get_mut("properties").and_then(|p| p.as_object_mut()) {
        props.values_mut().for_each(strip_descriptions);
    }
    for key in ["items", "additionalProperties", "not"] {
        if let Some(sub) = obj.get_mut(key) {
            if sub.is_array() {
                sub.as_array_mut()
                    .into_iter()
                    .flatten()
                    .for_each(strip_descriptions);
            } else {
                strip_descriptions(sub);
            }
        }
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(list) = obj.get_mut(key).and_then(|l| l.as_array_mut()) {
            list.iter_mut().for_each(strip_descriptions);
        }
    }
}

fn default_replicas() -> i32 {
    1
}

/// `raw` runtime block: processes on the node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RawTaskSpec {
    /// URL of an archive or file fetched into the working directory before start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact: Option<String>,
    /// Expected SHA-256 of the artifact (64 hex digits); the fetch fails on mismatch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_sha256: Option<String>,
    /// Program and arguments (no shell); at least one element.
    pub entrypoint: Vec<String>,
    /// Environment variables, added to rlark's `RLARK_*` ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub environment: Vec<EnvVar>,
    /// Working directory (default: the task's own directory on the node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// Number of process replicas (default 1).
    #[serde(default = "default_replicas")]
    pub replicas: i32,
    /// When an exited replica is restarted (default `Never`).
    #[serde(default)]
    pub restart_policy: RestartPolicy,
    /// Seconds after start when the whole process group is killed and the task fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<i64>,
    /// Seconds between SIGTERM and SIGKILL on stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    /// CPU/memory/device requests (used for placement) and limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// The user the processes run as. Default: a user of the replica's own, chosen by the
    /// agent. Another user only where the agent allows it (`--replica-allowed-users`); 0
    /// (root) only for the Jobs the agent lists in `--replica-root-jobs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_user: Option<i64>,
    /// The group the processes run as (default: the user's number).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_group: Option<i64>,
}

impl Default for RawTaskSpec {
    fn default() -> Self {
        Self {
            artifact: None,
            artifact_sha256: None,
            entrypoint: Vec::new(),
            environment: Vec::new(),
            working_dir: None,
            replicas: default_replicas(),
            restart_policy: RestartPolicy::Never,
            active_deadline_seconds: None,
            termination_grace_period_seconds: None,
            resources: None,
            run_as_user: None,
            run_as_group: None,
        }
    }
}

/// Observed state of a Task, written by the agent and the Task controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatus {
    /// Lifecycle phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<TaskPhase>,
    /// Nodes the task's replicas run on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub observed_nodes: Vec<String>,
    /// Standard conditions (`Scheduled`, `Ready`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// When the task started running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the task finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// Human-readable detail of the phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Times the task was restarted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_count: Option<i32>,
    /// Desired replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Replicas running and ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Replicas that exited successfully.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub succeeded_replicas: Option<i32>,
    /// Replicas that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_replicas: Option<i32>,
    /// URL path of the TensorBoard proxy (filled in on read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_board_proxy: Option<String>,
    /// Image pulls for this task on its nodes (while Pending).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pull_progress: Vec<PullProgress>,
    /// Events of the task's nodes and pods (while Pending), newest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<NodeEvent>,
    /// Last, mean and best of the rewards the task reported (`type: reward` reports),
    /// written by the server as each report is stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<super::RewardSummary>,
}
