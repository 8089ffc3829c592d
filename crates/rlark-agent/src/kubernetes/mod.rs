//! The Kubernetes runtime (`rlark agent --agent-type Kubernetes`, docs/tasks.md
//! "Kubernetes runtime"), in one module tree: a pure core (the modules below but
//! [`member`]) that says how a Task becomes objects on a member cluster and how their
//! status becomes the Task's, and [`member`], the IO around it (the member client, the
//! reconciler, Pod and Node mirroring, logs and exec through the member API).
//!
//! The core has no IO, no clock reads and no client: functions over `k8s-openapi` types
//! and JSON. Only [`member`] talks to the member cluster; the core must not use it, and
//! the raw and docker runtimes use neither.
//!
//! - [`names`]: derived object names and label values (DNS-1123, shortened with a hash);
//! - [`env`]: the environment contract as container `env` entries;
//! - [`workload`]: a Task's `kubernetes.workload` → Deployment / StatefulSet / DaemonSet /
//!   Job / CloneSet, Ray head Service, claims;
//! - [`cloneset`]: OpenKruise's CloneSet, the fields the runtime writes and reads;
//! - [`template`]: a Task's `kubernetes.jobTemplate` → one batch/v1 Job, forced fields;
//! - [`tensorboard`]: the TensorBoard sidecar of a Task with `tensorBoardDir`, and its status;
//! - [`status`]: member workload and Pod status → Task phase and rlark Pod status;
//! - [`pulls`]: a member Pod's image pulls, completed by the kubelet's `Pulling`/`Pulled`
//!   Events (image size, pull speed);
//! - [`errors`]: a member API failure → fail, adopt or retry (with backoff);
//! - [`ratelimit`]: the creation rate limit (defer, never fail).

pub mod cloneset;
pub mod env;
pub mod errors;
pub mod member;
pub mod names;
pub mod pulls;
pub mod ratelimit;
pub mod status;
pub mod template;
pub mod tensorboard;
pub mod workload;

/// Label every object the runtime creates carries: `app.kubernetes.io/managed-by=rlark`.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "rlark";
/// Label: the Task's name ([`names::label_value`] of it).
pub const TASK_NAME_LABEL: &str = rlark_api::labels::TASK_NAME;
/// Label: the Task's namespace (the agent namespace `rlark-<clusterID>`).
pub const TASK_NAMESPACE_LABEL: &str = "rlark.io/task-namespace";
/// Label: the Task's UID; with [`MANAGED_BY_LABEL`] it is the workload's selector.
pub const TASK_UID_LABEL: &str = "rlark.io/task-uid";
/// Label: [`names::run_label`] of the run key; the run key itself is the annotation
/// [`rlark_api::agent::RUN_KEY_ANNOTATION`] (it holds `/` and `,`, which a label cannot).
pub const RUN_LABEL: &str = "rlark.io/run";

/// What the runtime knows that the Task does not say: the member cluster and the
/// control plane.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemberContext {
    /// The control plane's URL, given to containers as `RLARK_SERVER`.
    pub server_url: String,
    /// The cluster ID of this agent (`RLARK_CLUSTER_ID`).
    pub cluster_id: String,
    /// Member namespace the workloads are created in.
    pub namespace: String,
    /// Secrets (in [`MemberContext::namespace`]) to add to every Pod's `imagePullSecrets`.
    /// The member reconciler passes none today (`rlark agent` has no option naming them);
    /// a template's own `imagePullSecrets` are kept.
    pub image_pull_secrets: Vec<String>,
    /// Variables added to every container after the contract, winning over same-named
    /// entries (the runtime's `RLARK_REPORT_URL`, `RLARK_TOKEN` from a Secret, ...).
    pub extra_env: Vec<k8s_openapi::api::core::v1::EnvVar>,
    /// Image of the TensorBoard sidecar (`--tensorboard-image`; `None`:
    /// [`tensorboard::DEFAULT_IMAGE`]).
    pub tensorboard_image: Option<String>,
}
