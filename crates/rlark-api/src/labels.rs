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
/// Node label, `"true"` on the Nodes of a Kubernetes agent whose member cluster serves
/// OpenKruise's `apps.kruise.io/v1alpha1` CloneSet (found when the agent starts): the only
/// Nodes a `CloneSet` task is placed on.
pub const SERVES_CLONESET: &str = "rlark.io/serves-cloneset";
/// Node label: `cloud`, `edge` or `robot` (see [`crate::types::NodeCategory`]).
pub const NODE_CATEGORY: &str = "rlark.io/node-category";
/// Task label: name of the Job that owns the Task.
pub const JOB: &str = "rlinf.io/job";
/// Job label: name of the Workflow that owns the Job.
pub const WORKFLOW: &str = "rlinf.io/workflow";

/// The labels of a Job that Workflow `workflow` creates: exactly [`WORKFLOW`] = its name
/// (the Job carries none of the Workflow's own labels). Admission evaluates a Domain's
/// `jobSelector` against these when the Workflow is applied, so they are fixed here.
pub fn workflow_job_labels(workflow: &str) -> std::collections::BTreeMap<String, String> {
    std::collections::BTreeMap::from([(WORKFLOW.to_string(), workflow.to_string())])
}
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

/// The operators of a label selector's `matchExpressions`.
pub const SELECTOR_OPERATORS: &[&str] = &["In", "NotIn", "Exists", "DoesNotExist"];

/// Whether `selector` matches `labels`, with Kubernetes' semantics: every `matchLabels`
/// pair and every `matchExpressions` requirement holds; an empty selector matches
/// everything. A requirement with an unknown operator matches nothing (validation refuses
/// it before it is stored: [`crate::validation`]).
pub fn selector_matches(
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    let pairs = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(key, value)| labels.get(key) == Some(value));
    let expressions = selector.match_expressions.iter().flatten().all(|req| {
        let value = labels.get(&req.key);
        let values = req.values.as_deref().unwrap_or_default();
        match req.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    pairs && expressions
}

#[cfg(test)]
mod selector_tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

    use super::selector_matches;

    fn req(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    #[test]
    fn selectors_match_as_in_kubernetes() {
        let labels: BTreeMap<String, String> = [("team", "rl"), ("tier", "gpu")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into();
        let pairs = |p: &[(&str, &str)]| {
            Some(
                p.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        // (selector, matches)
        let cases = [
            (LabelSelector::default(), true),
            (
                LabelSelector {
                    match_labels: pairs(&[("team", "rl")]),
                    ..Default::default()
                },
                true,
            ),
            (
                LabelSelector {
                    match_labels: pairs(&[("team", "cv")]),
                    ..Default::default()
                },
                false,
            ),
            (
                LabelSelector {
                    match_labels: pairs(&[("team", "rl"), ("x", "y")]),
                    ..Default::default()
                },
                false,
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![req("team", "In", &["cv", "rl"])]),
                    ..Default::default()
                },
                true,
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![req("team", "NotIn", &["rl"])]),
                    ..Default::default()
                },
                false,
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![req("absent", "NotIn", &["rl"])]),
                    ..Default::default()
                },
                true,
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![req("tier", "Exists", &[])]),
                    ..Default::default()
                },
                true,
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![req("tier", "DoesNotExist", &[])]),
                    ..Default::default()
                },
                false,
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![req("tier", "Bogus", &[])]),
                    ..Default::default()
                },
                false,
            ),
            (
                LabelSelector {
                    match_labels: pairs(&[("team", "rl")]),
                    match_expressions: Some(vec![req("tier", "In", &["cpu"])]),
                },
                false,
            ),
        ];
        for (selector, want) in cases {
            assert_eq!(selector_matches(&selector, &labels), want, "{selector:?}");
        }
    }
}
