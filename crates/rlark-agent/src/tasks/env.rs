//! The environment of a replica's process (docs/tasks.md, "Environment contract").

use kube::ResourceExt as _;
use rlark_api::labels;
use rlark_api::types::Task;

use super::{TaskContext, pod_name};

/// Variables of the environment contract that are set only in some cases: the Task's
/// `raw.environment` (or anything else) cannot provide them when rlark does not.
const OPTIONAL_CONTRACT: &[&str] = &["RLARK_DOMAIN", "RLARK_RAY_ROLE", "RLARK_HEAD_ADDRESS"];

/// The environment of replica `index` of `task`, in order (a later entry wins):
///
/// 1. `envFrom.input`: each variable gets the value its JSONPath selects in `spec.input`
///    (a string as is, anything else as compact JSON). A path that parses to nothing is
///    refused at admission; for a Task stored before that check (or written straight into
///    the store) the variable is left unset and a warning logged;
/// 2. the Task's `raw.environment` (it wins over `envFrom`, as `env` does in Kubernetes);
/// 3. rlark's contract, which cannot be overridden: `RLARK_SERVER`, `RLARK_CLUSTER_ID`,
///    `RLARK_NODE_NAME`, `RLARK_NAMESPACE`, `RLARK_JOB` (the Task's `rlinf.io/job` label,
///    else its Job owner; empty for a bare Task), `RLARK_TASK`, `RLARK_TASK_UID`,
///    `RLARK_TASK_ROLE` (`Actor`, `Rollout`, `Env`), `RLARK_POD_NAME`,
///    `RLARK_REPLICA_INDEX`, `RLARK_NODE_RANK_START` (annotation
///    `rlark.io/ray-node-rank-start`: the replicas of the Job's earlier tasks; 0 when absent
///    or not a number), `RLARK_NODE_RANK` (= start + replica index: unique across the
///    Job), `RLARK_TOTAL_NODES` (annotation `rlark.io/ray-total-nodes`, the Job's replicas
///    over all its tasks as RLark counts them; the Task's own replicas when absent or not a
///    number, so a bare Task keeps its earlier meaning); and only when known:
///    `RLARK_DOMAIN` (`spec.domain`), `RLARK_RAY_ROLE` (`head` | `worker`, annotation
///    `rlark.io/ray-role`), `RLARK_HEAD_ADDRESS` (`<head task>-0.<domain>`: replica 0 of
///    the task named by `rlark.io/ray-head-task-name`, under the name the domain network
///    gives it; the head task gets it too). The optional ones are removed from the Task's
///    own variables when rlark does not set them.
///
/// When the replica starts, `RLARK_REPORT_URL`, `RLARK_TOKEN` and `RLARK_CA_FILE` follow
/// (see [`crate::task_reports`]; absent when no task token could be minted).
/// The process also inherits the agent's own environment underneath.
pub fn replica_env(task: &Task, index: usize, ctx: &TaskContext) -> Vec<(String, String)> {
    let name = task.name_any();
    let (mut env, missing) = task.spec.input_env();
    for error in &missing {
        tracing::warn!(
            namespace = task.namespace().unwrap_or_default(),
            task = %name,
            %error,
            "an envFrom.input variable is left unset"
        );
    }
    env.extend(
        task.spec
            .raw
            .iter()
            .flat_map(|raw| raw.environment.iter())
            .map(|v| (v.name.clone(), v.value.clone())),
    );
    let job = task_job(task);
    let annotations = task.annotations();
    let number = |key: &str| annotations.get(key).and_then(|v| v.parse::<u64>().ok());
    let rank_start = number(labels::RAY_NODE_RANK_START).unwrap_or(0);
    let total_nodes = number(labels::RAY_TOTAL_NODES)
        .unwrap_or_else(|| u64::try_from(task.spec.replicas()).unwrap_or(0));
    let index_u64 = u64::try_from(index).unwrap_or(u64::MAX);
    let mut contract: Vec<(&str, String)> = vec![
        ("RLARK_SERVER", ctx.server_url.clone()),
        ("RLARK_CLUSTER_ID", ctx.cluster_id.clone()),
        ("RLARK_NODE_NAME", ctx.node_name.clone()),
        ("RLARK_NAMESPACE", task.namespace().unwrap_or_default()),
        ("RLARK_JOB", job),
        ("RLARK_TASK", name.clone()),
        ("RLARK_TASK_UID", task.uid().unwrap_or_default()),
        ("RLARK_TASK_ROLE", task.spec.role.as_str().to_string()),
        ("RLARK_POD_NAME", pod_name(&name, index)),
        ("RLARK_REPLICA_INDEX", index.to_string()),
        ("RLARK_NODE_RANK_START", rank_start.to_string()),
        (
            "RLARK_NODE_RANK",
            rank_start.saturating_add(index_u64).to_string(),
        ),
        ("RLARK_TOTAL_NODES", total_nodes.to_string()),
    ];
    let domain = task.spec.domain.as_deref().filter(|d| !d.is_empty());
    if let Some(domain) = domain {
        contract.push(("RLARK_DOMAIN", domain.to_string()));
    }
    if let Some(role) = annotations.get(labels::RAY_ROLE).filter(|r| !r.is_empty()) {
        contract.push(("RLARK_RAY_ROLE", role.clone()));
    }
    let head = annotations
        .get(labels::RAY_HEAD_TASK_NAME)
        .filter(|h| !h.is_empty());
    if let (Some(head), Some(domain)) = (head, domain) {
        contract.push((
            "RLARK_HEAD_ADDRESS",
            format!("{}.{domain}", pod_name(head, 0)),
        ));
    }
    env.retain(|(key, _)| !OPTIONAL_CONTRACT.contains(&key.as_str()));
    env.extend(contract.into_iter().map(|(k, v)| (k.to_string(), v)));
    env
}

/// The Job a Task belongs to: its `rlinf.io/job` label, else its Job owner, else empty.
pub fn task_job(task: &Task) -> String {
    task.labels()
        .get(labels::JOB)
        .cloned()
        .or_else(|| {
            task.owner_references()
                .iter()
                .find(|o| o.kind == "Job")
                .map(|o| o.name.clone())
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::testing::{ctx, task};
    use super::*;
    use serde_json::json;

    #[test]
    fn the_environment_contract_wins_over_the_task_environment() {
        let t = task("u1", &["n1", "n2"]);
        let env: BTreeMap<String, String> = replica_env(&t, 1, &ctx()).into_iter().collect();
        assert_eq!(env["A"], "1");
        assert_eq!(env["RLARK_TASK"], "j-a");
        assert_eq!(env["RLARK_JOB"], "j");
        assert_eq!(env["RLARK_TASK_ROLE"], "Rollout");
        assert_eq!(env["RLARK_REPLICA_INDEX"], "1");
        assert_eq!(env["RLARK_TOTAL_NODES"], "2");
        assert_eq!(env["RLARK_SERVER"], "https://cp:6443");
        assert_eq!(env["RLARK_CLUSTER_ID"], "c");
        assert_eq!(env["RLARK_NODE_NAME"], "n1");
        assert_eq!(env["RLARK_POD_NAME"], "j-a-1");
        // A bare Task (no Ray annotations): ranks are the replica indexes, no domain.
        assert_eq!(env["RLARK_NODE_RANK_START"], "0");
        assert_eq!(env["RLARK_NODE_RANK"], "1");
        for absent in ["RLARK_DOMAIN", "RLARK_RAY_ROLE", "RLARK_HEAD_ADDRESS"] {
            assert!(!env.contains_key(absent), "{absent} set: {env:?}");
        }
    }

    #[test]
    fn ranks_roles_and_the_head_address_follow_the_job() {
        let mut t = task("u1", &["n1", "n2"]);
        t.spec.domain = Some("net1".into());
        t.annotations_mut().extend([
            (labels::RAY_NODE_RANK_START.to_string(), "3".to_string()),
            (labels::RAY_TOTAL_NODES.to_string(), "7".to_string()),
            (
                labels::RAY_ROLE.to_string(),
                labels::RAY_ROLE_WORKER.to_string(),
            ),
            (
                labels::RAY_HEAD_TASK_NAME.to_string(),
                "j-actor".to_string(),
            ),
        ]);
        let env: BTreeMap<String, String> = replica_env(&t, 1, &ctx()).into_iter().collect();
        assert_eq!(env["RLARK_NODE_RANK_START"], "3");
        assert_eq!(env["RLARK_NODE_RANK"], "4");
        assert_eq!(
            env["RLARK_TOTAL_NODES"], "7",
            "the Job's nodes, not the Task's 2"
        );
        assert_eq!(env["RLARK_DOMAIN"], "net1");
        assert_eq!(env["RLARK_RAY_ROLE"], "worker");
        assert_eq!(env["RLARK_HEAD_ADDRESS"], "j-actor-0.net1");

        // Without a domain there is no name to give: no head address (and no domain).
        let mut no_domain = t.clone();
        no_domain.spec.domain = None;
        let env: BTreeMap<String, String> =
            replica_env(&no_domain, 0, &ctx()).into_iter().collect();
        assert!(!env.contains_key("RLARK_HEAD_ADDRESS"), "{env:?}");
        assert!(!env.contains_key("RLARK_DOMAIN"), "{env:?}");
        assert_eq!(env["RLARK_NODE_RANK"], "3");

        // Unreadable annotations fall back: rank start 0, the Task's replicas.
        let mut garbled = t.clone();
        garbled.annotations_mut().extend([
            (labels::RAY_NODE_RANK_START.to_string(), "-1".to_string()),
            (labels::RAY_TOTAL_NODES.to_string(), "many".to_string()),
        ]);
        let env: BTreeMap<String, String> = replica_env(&garbled, 1, &ctx()).into_iter().collect();
        assert_eq!(env["RLARK_NODE_RANK"], "1");
        assert_eq!(env["RLARK_TOTAL_NODES"], "2");

        // The optional contract variables cannot be supplied by the Task when rlark sets
        // none, and are rlark's when it does.
        let mut spoofing = no_domain.clone();
        spoofing.annotations_mut().remove(labels::RAY_ROLE);
        if let Some(raw) = spoofing.spec.raw.as_mut() {
            for name in ["RLARK_DOMAIN", "RLARK_HEAD_ADDRESS", "RLARK_RAY_ROLE"] {
                raw.environment.push(rlark_api::types::EnvVar {
                    name: name.into(),
                    value: "spoofed".into(),
                });
            }
        }
        let env: BTreeMap<String, String> = replica_env(&spoofing, 0, &ctx()).into_iter().collect();
        assert!(env.values().all(|v| v != "spoofed"), "{env:?}");
    }

    #[test]
    fn env_from_input_sets_variables_from_the_task_input() {
        let mut t = task("u1", &["n1"]);
        t.spec.input = Some(json!({
            "question": "2+2", "answer": 4, "exact": true, "none": null,
            "sample": {"prompt": "hi", "ids": [1, 2]},
        }));
        t.spec.env_from = Some(
            serde_json::from_value(json!({"input": [
                {"name": "QUESTION", "path": "$.question"},
                {"name": "ANSWER", "path": "$.answer"},
                {"name": "EXACT", "path": "$['exact']"},
                {"name": "NONE", "path": "$.none"},
                {"name": "SAMPLE", "path": "$.sample"},
                {"name": "IDS", "path": "$.sample.ids"},
                {"name": "FIRST_ID", "path": "$.sample.ids[0]"},
                {"name": "MISSING", "path": "$.sample.nothing"},
                {"name": "A", "path": "$.question"},
            ]}))
            .expect("envFrom"),
        );
        let env: BTreeMap<String, String> = replica_env(&t, 0, &ctx()).into_iter().collect();
        assert_eq!(env["QUESTION"], "2+2", "a string as is");
        assert_eq!(env["ANSWER"], "4", "a number as JSON");
        assert_eq!(env["EXACT"], "true");
        assert_eq!(env["NONE"], "null");
        assert_eq!(
            env["SAMPLE"], r#"{"prompt":"hi","ids":[1,2]}"#,
            "compact JSON"
        );
        assert_eq!(env["IDS"], "[1,2]");
        assert_eq!(env["FIRST_ID"], "1");
        assert!(
            !env.contains_key("MISSING"),
            "a path matching nothing: unset"
        );
        assert_eq!(env["A"], "1", "raw.environment wins over envFrom");
        assert_eq!(env["RLARK_TASK"], "j-a", "the contract wins over both");
    }
}
