//! Label, annotation and finalizer names rlark puts on resources (RLark's names, kept).

/// Node label: the cluster (agent) a Node belongs to. On a write by an agent the API server
/// owns it: it is the agent's cluster ID (set when missing, any other value refused), so an
/// agent cannot claim to be another cluster.
pub const CLUSTER_ID: &str = "rlark.io/cluster-id";
/// Node label: the machine name (Kubernetes' `kubernetes.io/hostname`). On a write by an
/// agent the API server owns it: it is the Node's name.
pub const HOSTNAME: &str = "kubernetes.io/hostname";
/// Node annotation, set by the API server on every write of the Node by an agent: the user
/// of that agent (`system:rlark:agent:<clusterID>`), so the Node's capacity is known to be
/// agent-reported (and by whom).
pub const REPORTED_BY: &str = "rlark.io/reported-by";
/// Node label: the runtime of the node's agent (`Kubernetes`, `Docker`, `Raw`).
pub const AGENT_TYPE: &str = "rlark.io/agent-type";
/// Node label: `cloud`, `edge` or `robot` (see [`crate::types::NodeCategory`]).
pub const NODE_CATEGORY: &str = "rlark.io/node-category";
/// Task label: name of the Job that owns the Task.
pub const JOB: &str = "rlinf.io/job";
/// Job label: name of the Workflow that owns the Job.
pub const WORKFLOW: &str = "rlinf.io/workflow";
/// Pod label: name of the Task the Pod runs.
pub const TASK_NAME: &str = "rlark.io/task-name";
/// Pod label: name of the pod (or process group) in its own cluster.
pub const LOCAL_POD_NAME: &str = "rlark.io/local-pod-name";
/// Pod label: namespace of the pod in its own cluster.
pub const LOCAL_POD_NAMESPACE: &str = "rlark.io/local-pod-namespace";

/// Task annotation: `head` or `worker` (see [`RAY_ROLE_HEAD`], [`RAY_ROLE_WORKER`]).
pub const RAY_ROLE: &str = "rlark.io/ray-role";
/// Task annotation: the Task name (`<job>-<task>`) of the Job's head task.
pub const RAY_HEAD_TASK_NAME: &str = "rlark.io/ray-head-task-name";
/// Task annotation: total replicas over all the Job's tasks (decimal).
pub const RAY_TOTAL_NODES: &str = "rlark.io/ray-total-nodes";
/// Task annotation: replicas of the tasks listed before this one (decimal).
pub const RAY_NODE_RANK_START: &str = "rlark.io/ray-node-rank-start";
/// Value of [`RAY_ROLE`] on the head task.
pub const RAY_ROLE_HEAD: &str = "head";
/// Value of [`RAY_ROLE`] on every other task.
pub const RAY_ROLE_WORKER: &str = "worker";

/// Annotation (on a Job, Task or Workflow): RFC 3339 time of the last user-requested
/// restart; changing it asks the controllers to restart.
pub const RESTARTED_AT: &str = "rlark.io/restarted-at";

/// Task annotation: fingerprint of the spec the Job controller last wrote from its
/// template (placement and `stopped` excluded); a different fingerprint means the
/// template changed and the Task's spec is updated.
pub const TEMPLATE_HASH: &str = "rlark.io/template-hash";
