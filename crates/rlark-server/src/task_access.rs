//! Who may reach a task's replicas — an SSH session, an `ssh -L` forward, the task HTTP
//! proxy — and how a task is named there.
//!
//! **Rule**: admins (`system:masters`) reach every task. Anyone else reaches the tasks of a
//! Job whose `spec.access` names their user or one of their groups. Only admins create Jobs
//! (the built-in policy), so "the Jobs a user created" are an admin's and covered by the
//! first rule. A Task without an owning Job (created directly) is reachable by admins only.
//!
//! **Names**: a task is `NAME` (unique across namespaces), or `NAME.NAMESPACE` when the name
//! is in several; a replica other than 0 is chosen by a separate index. Lookups read the
//! store's memory.

use std::sync::Arc;

use rlark_api::labels;
use rlark_apiserver::auth::{Identity, Role};
use rlark_store::{ListOptions, ObjectKey, Store};
use serde_json::Value;

/// Store resource of Tasks.
pub(crate) const TASKS: &str = "tasks.rlinf.io";
/// Store resource of Jobs.
pub(crate) const JOBS: &str = "jobs.rlinf.io";
/// Store resource of replica Pods.
pub(crate) const PODS: &str = "pods.rlinf.io";

/// Why a task cannot be reached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AccessError {
    /// No such task (or replica).
    #[error("{0}")]
    NotFound(String),
    /// The name is in several namespaces.
    #[error("{0}")]
    Ambiguous(String),
    /// The caller may not reach it.
    #[error("{0}")]
    Denied(String),
    /// The replica exists but does not run.
    #[error("{0}")]
    NotRunning(String),
    /// The store failed.
    #[error("read the store: {0}")]
    Store(String),
}

impl AccessError {
    /// The HTTP answer (a `Status`) of the routes that reach task `task` (the task proxy,
    /// its tickets): 404, 400, 403 or 500.
    pub(crate) fn into_api_error(self, task: &str) -> rlark_apiserver::error::ApiError {
        use rlark_apiserver::error::ApiError;
        match self {
            AccessError::NotFound(m) => ApiError::new(404, "NotFound", m),
            AccessError::Ambiguous(m) | AccessError::NotRunning(m) => ApiError::bad_request(m),
            AccessError::Denied(m) => {
                ApiError::forbidden_resource("rlinf.io", "tasks", Some(task), &m)
            }
            AccessError::Store(m) => ApiError::new(500, "InternalError", m),
        }
    }
}

/// The store, as a request extension (set on every route in `lib.rs`), for handlers whose
/// state has none (replica logs).
#[derive(Clone)]
pub(crate) struct AccessStore(pub Arc<dyn Store>);

/// Whether the Job of replica Pod `namespace/pod` grants `identity` (`spec.access`; not the
/// admin rule, which callers apply through the built-in policy).
pub(crate) async fn pod_granted(
    store: &dyn Store,
    identity: &Identity,
    namespace: &str,
    pod: &str,
) -> bool {
    let Ok(Some(object)) = store.get(&ObjectKey::new(PODS, namespace, pod)).await else {
        return false;
    };
    let (Some(task_namespace), Some(task_name)) = (
        object["spec"]["taskNamespace"].as_str(),
        object["spec"]["taskName"].as_str(),
    ) else {
        return false;
    };
    match find_task(store, task_name, Some(task_namespace)).await {
        Ok(task) => authorize(store, identity, &task).await.is_ok(),
        Err(_) => false,
    }
}

/// A replica a caller may reach.
#[derive(Debug, Clone)]
pub(crate) struct Replica {
    /// The Task's namespace (`rlark-<clusterID>`).
    pub namespace: String,
    /// The Task's name.
    pub task_name: String,
    /// The replica index.
    pub index: u32,
    /// The replica Pod's name (`<task>-<index>`).
    pub pod_name: String,
    /// The Task.
    pub task: Arc<Value>,
    /// The replica Pod (`Running`).
    pub pod: Arc<Value>,
}

impl Replica {
    /// The cluster whose agent runs the replica.
    pub fn cluster(&self) -> &str {
        self.namespace
            .strip_prefix("rlark-")
            .unwrap_or(&self.namespace)
    }

    /// The node the replica runs on, when reported.
    pub fn node(&self) -> Option<&str> {
        self.pod["status"]["node"]
            .as_str()
            .filter(|n| !n.is_empty())
    }
}

/// The Job owning `task` (by its `rlinf.io/job` label), if it still exists.
pub(crate) async fn job_of(
    store: &dyn Store,
    task: &Value,
) -> Result<Option<Arc<Value>>, AccessError> {
    let Some(job) = task["metadata"]["labels"][labels::JOB].as_str() else {
        return Ok(None);
    };
    store
        .get(&ObjectKey::new(JOBS, "", job))
        .await
        .map_err(|e| AccessError::Store(e.to_string()))
}

/// Whether `job`'s `spec.access` grants `identity` (by user or one of its groups).
pub(crate) fn job_grants(job: &Value, identity: &Identity) -> bool {
    job["spec"]["access"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|entry| {
            entry["user"].as_str() == Some(identity.user.as_str())
                || entry["group"]
                    .as_str()
                    .is_some_and(|g| identity.groups.iter().any(|mine| mine == g))
        })
}

/// Allow `identity` to reach `task` (admin, or granted by its Job's `spec.access`), else
/// [`AccessError::Denied`] naming the rule.
pub(crate) async fn authorize(
    store: &dyn Store,
    identity: &Identity,
    task: &Value,
) -> Result<(), AccessError> {
    if identity.role() == Role::Admin {
        return Ok(());
    }
    let name = task["metadata"]["name"].as_str().unwrap_or_default();
    let namespace = task["metadata"]["namespace"].as_str().unwrap_or_default();
    match job_of(store, task).await? {
        Some(job) if job_grants(&job, identity) => Ok(()),
        Some(job) => Err(AccessError::Denied(format!(
            "user {:?} may not reach task {namespace}/{name}: Job {:?} does not grant it \
             (spec.access lists neither the user nor one of its groups)",
            identity.user,
            job["metadata"]["name"].as_str().unwrap_or_default()
        ))),
        None => Err(AccessError::Denied(format!(
            "user {:?} may not reach task {namespace}/{name}: it belongs to no Job, so only \
             admins may",
            identity.user
        ))),
    }
}

/// The Task named `name` in `namespace`, or in whichever namespace has it when `namespace`
/// is `None` ([`AccessError::Ambiguous`] when several do).
pub(crate) async fn find_task(
    store: &dyn Store,
    name: &str,
    namespace: Option<&str>,
) -> Result<Arc<Value>, AccessError> {
    let store_error = |e: rlark_store::StoreError| AccessError::Store(e.to_string());
    if let Some(namespace) = namespace {
        return store
            .get(&ObjectKey::new(TASKS, namespace, name))
            .await
            .map_err(store_error)?
            .ok_or_else(|| AccessError::NotFound(format!("task {namespace}/{name} not found")));
    }
    let all = store
        .list(TASKS, &ListOptions::default())
        .await
        .map_err(store_error)?;
    let mut found: Vec<Arc<Value>> = all
        .items
        .into_iter()
        .filter(|t| t["metadata"]["name"].as_str() == Some(name))
        .collect();
    match found.len() {
        0 => Err(AccessError::NotFound(format!("task {name:?} not found"))),
        1 => Ok(found.remove(0)),
        _ => Err(AccessError::Ambiguous(format!(
            "task {name:?} is in several namespaces ({}): name it NAME.NAMESPACE",
            found
                .iter()
                .filter_map(|t| t["metadata"]["namespace"].as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// How many replicas `task` runs (as `TaskSpec::replicas` counts them; 1 when unreadable).
pub(crate) fn replicas_of(task: &Value) -> u64 {
    serde_json::from_value::<rlark_api::types::TaskSpec>(task["spec"].clone())
        .map(|spec| u64::try_from(spec.replicas()).unwrap_or(0))
        .unwrap_or(1)
}

/// The `(namespace, name)` of a stored object (`""` for what it lacks).
pub(crate) fn namespace_and_name(object: &Value) -> (String, String) {
    let field = |name: &str| {
        object["metadata"][name]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    (field("namespace"), field("name"))
}

/// Replica `index` of `task`, when its Pod runs.
pub(crate) async fn running_replica(
    store: &dyn Store,
    task: Arc<Value>,
    index: u32,
) -> Result<Replica, AccessError> {
    let (namespace, task_name) = namespace_and_name(&task);
    let replicas = replicas_of(&task);
    if u64::from(index) >= replicas {
        return Err(AccessError::NotFound(format!(
            "task {namespace}/{task_name} has {replicas} replica(s): replica {index} does not \
             exist"
        )));
    }
    let pod_name = format!("{task_name}-{index}");
    let pod = store
        .get(&ObjectKey::new(PODS, &namespace, &pod_name))
        .await
        .map_err(|e| AccessError::Store(e.to_string()))?
        .ok_or_else(|| {
            AccessError::NotRunning(format!(
                "replica {namespace}/{pod_name} has not been started yet"
            ))
        })?;
    let phase = pod["status"]["phase"].as_str().unwrap_or("none yet");
    if phase != "Running" {
        return Err(AccessError::NotRunning(format!(
            "replica {namespace}/{pod_name} is not running (phase {phase})"
        )));
    }
    Ok(Replica {
        namespace,
        task_name,
        index,
        pod_name,
        task,
        pod,
    })
}

/// Every Task `identity` may reach, `(namespace, name, replicas)`, sorted.
pub(crate) async fn reachable_tasks(
    store: &dyn Store,
    identity: &Identity,
) -> Result<Vec<(String, String, u64)>, AccessError> {
    let all = store
        .list(TASKS, &ListOptions::default())
        .await
        .map_err(|e| AccessError::Store(e.to_string()))?;
    let mut out = Vec::new();
    for task in all.items {
        if authorize(store, identity, &task).await.is_ok() {
            let (namespace, name) = namespace_and_name(&task);
            out.push((namespace, name, replicas_of(&task)));
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn who(user: &str, groups: &[&str]) -> Identity {
        Identity {
            user: user.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    #[test]
    fn access_lists_grant_by_user_or_group() {
        let job = json!({"spec": {"access": [{"user": "alice"}, {"group": "ml"}]}});
        assert!(job_grants(&job, &who("alice", &[])));
        assert!(job_grants(&job, &who("bob", &["ml"])));
        assert!(!job_grants(&job, &who("bob", &["rlark:viewers"])));
        // A group name is not a user name, nor the reverse.
        assert!(!job_grants(&job, &who("ml", &[])));
        assert!(!job_grants(&json!({"spec": {}}), &who("alice", &[])));
    }
}
