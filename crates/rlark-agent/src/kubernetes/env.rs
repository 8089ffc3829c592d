//! The environment contract (docs/tasks.md, "Environment contract") as the `env` of a
//! member cluster's containers.
//!
//! The values a raw replica gets as text come here from the Task, or from the Pod itself
//! through the downward API where only the member cluster knows them: `RLARK_NODE_NAME`
//! (`spec.nodeName`), `RLARK_POD_NAME` (`metadata.name`), `RLARK_REPLICA_INDEX` (the
//! StatefulSet Pod index label, or an Indexed Job's completion index). Kubernetes cannot
//! add two values in `env`, so `RLARK_NODE_RANK` is not set: it is
//! `RLARK_NODE_RANK_START + RLARK_REPLICA_INDEX`, as RLark's Ray scripts compute it.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, ObjectFieldSelector, SecretKeySelector,
};
use kube::ResourceExt as _;
use rlark_api::labels;
use rlark_api::types::Task;

use super::{MemberContext, names};

/// Every variable the contract may set on a member cluster. A container's own entry of
/// one of these names is removed (and replaced when rlark sets it): a Task cannot supply
/// them.
pub const CONTRACT_NAMES: &[&str] = &[
    "RLARK_SERVER",
    "RLARK_CLUSTER_ID",
    "RLARK_NODE_NAME",
    "RLARK_NAMESPACE",
    "RLARK_JOB",
    "RLARK_TASK",
    "RLARK_TASK_UID",
    "RLARK_TASK_ROLE",
    "RLARK_POD_NAME",
    "RLARK_REPLICA_INDEX",
    "RLARK_NODE_RANK_START",
    "RLARK_NODE_RANK",
    "RLARK_TOTAL_NODES",
    "RLARK_DOMAIN",
    "RLARK_RAY_ROLE",
    "RLARK_HEAD_ADDRESS",
    "RLARK_RAY_PORT",
    "RLARK_NODE_IP",
    "RLARK_PREPARE_SCRIPT",
    "RLARK_RUN_SCRIPT",
    "RLARK_REPORT_URL",
    "RLARK_TOKEN",
    "RLARK_CA_FILE",
];

/// Key of the task token in the Task's token Secret ([`names::token_secret_name`]).
pub const TOKEN_KEY: &str = "token";
/// Key of the installation's CA bundle in the token Secret.
pub const CA_KEY: &str = "ca.crt";
/// Where every container has the token Secret's CA bundle mounted (read only).
pub const TOKEN_MOUNT_DIR: &str = "/var/run/rlark";
/// The volume of the token Secret in every Pod.
pub const TOKEN_VOLUME: &str = "rlark-task-token";

/// Port of the Ray head (`RLARK_RAY_PORT`; RLark's value).
pub const RAY_PORT: i32 = 6379;

/// Where a Pod finds its replica index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexSource {
    /// A StatefulSet Pod: label `apps.kubernetes.io/pod-index`.
    StatefulSet,
    /// A Pod of an Indexed Job: annotation `batch.kubernetes.io/job-completion-index`.
    IndexedJob,
    /// Deployment, DaemonSet: Pods have no index, `RLARK_REPLICA_INDEX` is not set.
    None,
}

fn literal(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: Some(value.into()),
        value_from: None,
    }
}

fn field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: path.to_string(),
            }),
            ..Default::default()
        }),
    }
}

pub use crate::tasks::task_job;

/// The contract's entries for the Pods of `task` (in this order; see the module docs):
/// `RLARK_SERVER`, `RLARK_CLUSTER_ID`, `RLARK_NODE_NAME`, `RLARK_NAMESPACE`, `RLARK_JOB`,
/// `RLARK_TASK`, `RLARK_TASK_UID`, `RLARK_TASK_ROLE`, `RLARK_POD_NAME`,
/// `RLARK_REPLICA_INDEX` (unless [`IndexSource::None`]), `RLARK_NODE_RANK_START`,
/// `RLARK_TOTAL_NODES`; when the Task has them: `RLARK_DOMAIN`, `RLARK_RAY_ROLE` (with
/// `RLARK_RAY_PORT`, and `RLARK_NODE_IP` = the Pod IP on the head), `RLARK_HEAD_ADDRESS`
/// (the head task's Ray head Service, [`names::head_service_name`]),
/// `RLARK_PREPARE_SCRIPT` (`spec.prepareScript`) and `RLARK_RUN_SCRIPT`
/// (`spec.runScript`, on the head or a task without a Ray role); `RLARK_REPORT_URL`,
/// `RLARK_TOKEN` (from the Task's token Secret, [`names::token_secret_name`], key
/// [`TOKEN_KEY`], optional) and `RLARK_CA_FILE` (under [`TOKEN_MOUNT_DIR`]); then
/// [`MemberContext::extra_env`].
pub fn contract_env(task: &Task, ctx: &MemberContext, index: IndexSource) -> Vec<EnvVar> {
    let annotations = task.annotations();
    let number = |key: &str| annotations.get(key).and_then(|v| v.parse::<u64>().ok());
    let rank_start = number(labels::RAY_NODE_RANK_START).unwrap_or(0);
    let total_nodes = number(labels::RAY_TOTAL_NODES)
        .unwrap_or_else(|| u64::try_from(task.spec.replicas()).unwrap_or(0));
    let mut env = vec![
        literal("RLARK_SERVER", ctx.server_url.clone()),
        literal("RLARK_CLUSTER_ID", ctx.cluster_id.clone()),
        field("RLARK_NODE_NAME", "spec.nodeName"),
        literal("RLARK_NAMESPACE", task.namespace().unwrap_or_default()),
        literal("RLARK_JOB", task_job(task)),
        literal("RLARK_TASK", task.name_any()),
        literal("RLARK_TASK_UID", task.uid().unwrap_or_default()),
        literal("RLARK_TASK_ROLE", task.spec.role.as_str()),
        field("RLARK_POD_NAME", "metadata.name"),
    ];
    match index {
        IndexSource::StatefulSet => env.push(field(
            "RLARK_REPLICA_INDEX",
            "metadata.labels['apps.kubernetes.io/pod-index']",
        )),
        IndexSource::IndexedJob => env.push(field(
            "RLARK_REPLICA_INDEX",
            "metadata.annotations['batch.kubernetes.io/job-completion-index']",
        )),
        IndexSource::None => {}
    }
    env.push(literal("RLARK_NODE_RANK_START", rank_start.to_string()));
    env.push(literal("RLARK_TOTAL_NODES", total_nodes.to_string()));
    if let Some(domain) = task.spec.domain.as_deref().filter(|d| !d.is_empty()) {
        env.push(literal("RLARK_DOMAIN", domain));
    }
    let role = annotations.get(labels::RAY_ROLE).filter(|r| !r.is_empty());
    if let Some(role) = role {
        env.push(literal("RLARK_RAY_ROLE", role.clone()));
        env.push(literal("RLARK_RAY_PORT", RAY_PORT.to_string()));
        if role == labels::RAY_ROLE_HEAD {
            env.push(field("RLARK_NODE_IP", "status.podIP"));
        }
    }
    if let Some(head) = annotations
        .get(labels::RAY_HEAD_TASK_NAME)
        .filter(|h| !h.is_empty())
    {
        env.push(literal(
            "RLARK_HEAD_ADDRESS",
            names::head_service_name(head),
        ));
    }
    if let Some(script) = task
        .spec
        .prepare_script
        .as_deref()
        .filter(|s| !s.is_empty())
    {
        env.push(literal("RLARK_PREPARE_SCRIPT", script));
    }
    let runs_script = role.is_none_or(|r| r == labels::RAY_ROLE_HEAD);
    if let Some(script) = task.spec.run_script.as_deref().filter(|s| !s.is_empty())
        && runs_script
    {
        env.push(literal("RLARK_RUN_SCRIPT", script));
    }
    // The task token (task reports): the Secret the agent creates for the run; optional,
    // so a Pod starts even when no token could be minted (reports never block a task).
    env.push(literal(
        "RLARK_REPORT_URL",
        crate::task_reports::report_url(
            &ctx.server_url,
            &task.namespace().unwrap_or_default(),
            &task.name_any(),
        ),
    ));
    env.push(EnvVar {
        name: "RLARK_TOKEN".to_string(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: names::token_secret_name(&task.name_any()),
                key: TOKEN_KEY.to_string(),
                optional: Some(true),
            }),
            ..Default::default()
        }),
    });
    env.push(literal(
        "RLARK_CA_FILE",
        format!("{TOKEN_MOUNT_DIR}/{CA_KEY}"),
    ));
    env.extend(ctx.extra_env.iter().cloned());
    env
}

/// The `envFrom.input` variables of `task` as literal entries (those whose path selects
/// nothing are left out; admission refuses such paths).
pub fn input_env(task: &Task) -> Vec<EnvVar> {
    let (values, _missing) = task.spec.input_env();
    values
        .into_iter()
        .map(|(name, value)| literal(&name, value))
        .collect()
}

/// Sets the environment of `container`: `input` entries the container does not name
/// itself come first (its own `env` wins over `envFrom`, as in raw replicas), then its own
/// entries without the contract's names, then `contract` (which wins over everything).
///
/// Returns the names of the container's own entries that were removed or replaced with a
/// different value (an attempt to set a contract variable), in the container's order.
pub fn inject(container: &mut Container, contract: &[EnvVar], input: &[EnvVar]) -> Vec<String> {
    let own = container.env.take().unwrap_or_default();
    let reserved: BTreeSet<&str> = CONTRACT_NAMES
        .iter()
        .copied()
        .chain(contract.iter().map(|e| e.name.as_str()))
        .collect();
    let mut overridden = Vec::new();
    let mut env: Vec<EnvVar> = input
        .iter()
        .filter(|i| !own.iter().any(|o| o.name == i.name) && !reserved.contains(i.name.as_str()))
        .cloned()
        .collect();
    for entry in own {
        if reserved.contains(entry.name.as_str()) {
            let same = contract.contains(&entry);
            if !same {
                overridden.push(entry.name);
            }
        } else {
            env.push(entry);
        }
    }
    env.extend(contract.iter().cloned());
    container.env = Some(env);
    overridden
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::kubernetes::workload::testing::{ctx, task};

    fn by_name(env: &[EnvVar]) -> BTreeMap<String, EnvVar> {
        env.iter().map(|e| (e.name.clone(), e.clone())).collect()
    }

    fn value(env: &BTreeMap<String, EnvVar>, name: &str) -> Option<String> {
        env.get(name).and_then(|e| e.value.clone())
    }

    fn field_path(env: &BTreeMap<String, EnvVar>, name: &str) -> Option<String> {
        env.get(name)
            .and_then(|e| e.value_from.as_ref())
            .and_then(|f| f.field_ref.as_ref())
            .map(|f| f.field_path.clone())
    }

    #[test]
    fn the_contract_of_a_statefulset_pod() {
        let t = task("ppo-actor", 2);
        let env = by_name(&contract_env(&t, &ctx(), IndexSource::StatefulSet));
        assert_eq!(
            value(&env, "RLARK_SERVER").as_deref(),
            Some("https://cp:6443")
        );
        assert_eq!(value(&env, "RLARK_CLUSTER_ID").as_deref(), Some("c1"));
        assert_eq!(value(&env, "RLARK_NAMESPACE").as_deref(), Some("rlark-c1"));
        assert_eq!(value(&env, "RLARK_JOB").as_deref(), Some("ppo"));
        assert_eq!(value(&env, "RLARK_TASK").as_deref(), Some("ppo-actor"));
        assert_eq!(value(&env, "RLARK_TASK_UID").as_deref(), Some("uid-1"));
        assert_eq!(value(&env, "RLARK_TASK_ROLE").as_deref(), Some("Actor"));
        assert_eq!(value(&env, "RLARK_TOTAL_NODES").as_deref(), Some("2"));
        assert_eq!(value(&env, "RLARK_NODE_RANK_START").as_deref(), Some("0"));
        assert_eq!(
            field_path(&env, "RLARK_NODE_NAME").as_deref(),
            Some("spec.nodeName")
        );
        assert_eq!(
            field_path(&env, "RLARK_POD_NAME").as_deref(),
            Some("metadata.name")
        );
        assert_eq!(
            field_path(&env, "RLARK_REPLICA_INDEX").as_deref(),
            Some("metadata.labels['apps.kubernetes.io/pod-index']")
        );
        for absent in [
            "RLARK_NODE_RANK",
            "RLARK_DOMAIN",
            "RLARK_RAY_ROLE",
            "RLARK_HEAD_ADDRESS",
            "RLARK_NODE_IP",
        ] {
            assert!(!env.contains_key(absent), "{absent}: {env:?}");
        }
        let deployment = by_name(&contract_env(&t, &ctx(), IndexSource::None));
        assert!(!deployment.contains_key("RLARK_REPLICA_INDEX"));
        let job = by_name(&contract_env(&t, &ctx(), IndexSource::IndexedJob));
        assert_eq!(
            field_path(&job, "RLARK_REPLICA_INDEX").as_deref(),
            Some("metadata.annotations['batch.kubernetes.io/job-completion-index']")
        );
    }

    #[test]
    fn ray_head_and_worker_variables() {
        let mut head = task("ppo-actor", 2);
        head.spec.prepare_script = Some("pip install x".into());
        head.spec.run_script = Some("python train.py".into());
        head.annotations_mut().extend([
            (
                labels::RAY_ROLE.to_string(),
                labels::RAY_ROLE_HEAD.to_string(),
            ),
            (
                labels::RAY_HEAD_TASK_NAME.to_string(),
                "ppo-actor".to_string(),
            ),
            (labels::RAY_NODE_RANK_START.to_string(), "0".to_string()),
            (labels::RAY_TOTAL_NODES.to_string(), "5".to_string()),
        ]);
        let env = by_name(&contract_env(&head, &ctx(), IndexSource::StatefulSet));
        assert_eq!(value(&env, "RLARK_RAY_ROLE").as_deref(), Some("head"));
        assert_eq!(value(&env, "RLARK_RAY_PORT").as_deref(), Some("6379"));
        assert_eq!(
            field_path(&env, "RLARK_NODE_IP").as_deref(),
            Some("status.podIP")
        );
        assert_eq!(
            value(&env, "RLARK_HEAD_ADDRESS").as_deref(),
            Some("ppo-actor-ray-head")
        );
        assert_eq!(value(&env, "RLARK_TOTAL_NODES").as_deref(), Some("5"));
        assert_eq!(
            value(&env, "RLARK_PREPARE_SCRIPT").as_deref(),
            Some("pip install x")
        );
        assert_eq!(
            value(&env, "RLARK_RUN_SCRIPT").as_deref(),
            Some("python train.py")
        );

        let mut worker = head.clone();
        worker.metadata.name = Some("ppo-rollout".into());
        worker.annotations_mut().extend([
            (
                labels::RAY_ROLE.to_string(),
                labels::RAY_ROLE_WORKER.to_string(),
            ),
            (labels::RAY_NODE_RANK_START.to_string(), "2".to_string()),
        ]);
        let env = by_name(&contract_env(&worker, &ctx(), IndexSource::None));
        assert_eq!(value(&env, "RLARK_RAY_ROLE").as_deref(), Some("worker"));
        assert_eq!(
            value(&env, "RLARK_HEAD_ADDRESS").as_deref(),
            Some("ppo-actor-ray-head")
        );
        assert_eq!(value(&env, "RLARK_NODE_RANK_START").as_deref(), Some("2"));
        assert!(!env.contains_key("RLARK_NODE_IP"), "the head only");
        assert!(!env.contains_key("RLARK_RUN_SCRIPT"), "the head only");
        assert!(env.contains_key("RLARK_PREPARE_SCRIPT"));
    }

    #[test]
    fn inject_replaces_same_named_entries_and_reports_them() {
        let mut t = task("ppo-actor", 1);
        t.spec.input = Some(serde_json::json!({"q": "2+2", "mine": "input"}));
        t.spec.env_from = Some(
            serde_json::from_value(serde_json::json!({"input": [
                {"name": "QUESTION", "path": "$.q"},
                {"name": "MINE", "path": "$.mine"},
            ]}))
            .expect("envFrom"),
        );
        let contract = contract_env(&t, &ctx(), IndexSource::StatefulSet);
        let input = input_env(&t);
        let mut container = Container {
            name: "main".into(),
            env: Some(vec![
                literal("MINE", "container"),
                literal("RLARK_TASK", "spoofed"),
                literal("RLARK_SERVER", "https://cp:6443"),
                literal("RLARK_HEAD_ADDRESS", "elsewhere"),
                literal("KEEP", "1"),
            ]),
            ..Default::default()
        };
        let overridden = inject(&mut container, &contract, &input);
        assert_eq!(
            overridden,
            ["RLARK_TASK", "RLARK_HEAD_ADDRESS"],
            "an equal value is no correction"
        );
        let env = container.env.clone().unwrap_or_default();
        let names: Vec<&str> = env.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names.iter().filter(|n| **n == "RLARK_TASK").count(), 1);
        let env = by_name(&env);
        assert_eq!(value(&env, "QUESTION").as_deref(), Some("2+2"));
        assert_eq!(
            value(&env, "MINE").as_deref(),
            Some("container"),
            "env wins over envFrom"
        );
        assert_eq!(value(&env, "KEEP").as_deref(), Some("1"));
        assert_eq!(value(&env, "RLARK_TASK").as_deref(), Some("ppo-actor"));
        assert!(
            !env.contains_key("RLARK_HEAD_ADDRESS"),
            "rlark sets none here"
        );
        // Injecting again changes nothing and reports nothing.
        let before = container.env.clone();
        assert!(inject(&mut container, &contract, &input).is_empty());
        assert_eq!(container.env, before);
    }
}
