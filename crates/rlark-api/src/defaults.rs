//! Defaulting: fields the API server fills in before admission, so what is stored (and what
//! `kubectl get -o yaml` shows) is complete.
//!
//! Today one field: a task spec without `agentType` (a Task's `spec`, a Job's
//! `spec.tasks[i]`, a Workflow's `spec.jobTemplates[i].spec.tasks[j]`) takes it from its one
//! runtime block (`raw` → `Raw`, `docker` → `Docker`, `kubernetes` → `Kubernetes`), as
//! RLark manifests leave it out. A spec with no runtime block or several is left as it is;
//! [`undefaulted`] lists those, and admission refuses them naming the blocks.

use serde_json::Value;

use crate::types::AgentType;

/// The runtime blocks and the agent type each selects, in the order errors name them.
const BLOCKS: [(&str, AgentType); 3] = [
    ("kubernetes", AgentType::Kubernetes),
    ("docker", AgentType::Docker),
    ("raw", AgentType::Raw),
];

/// Every task spec in an object of `kind` (`Task`, `Job`, `Workflow`; none for other kinds),
/// with its JSON path for error messages.
fn task_specs<'a>(kind: &str, object: &'a mut Value) -> Vec<(String, &'a mut Value)> {
    let mut specs = Vec::new();
    let Some(spec) = object.get_mut("spec") else {
        return specs;
    };
    match kind {
        "Task" => specs.push(("spec".to_string(), spec)),
        "Job" => job_task_specs("spec", spec, &mut specs),
        "Workflow" => {
            if let Some(Value::Array(templates)) = spec.get_mut("jobTemplates") {
                for (i, template) in templates.iter_mut().enumerate() {
                    if let Some(job) = template.get_mut("spec") {
                        job_task_specs(&format!("spec.jobTemplates[{i}].spec"), job, &mut specs);
                    }
                }
            }
        }
        _ => {}
    }
    specs
}

fn job_task_specs<'a>(path: &str, job: &'a mut Value, out: &mut Vec<(String, &'a mut Value)>) {
    if let Some(Value::Array(tasks)) = job.get_mut("tasks") {
        for (i, task) in tasks.iter_mut().enumerate() {
            out.push((format!("{path}.tasks[{i}]"), task));
        }
    }
}

/// Whether `spec` sets `agentType` (a JSON `null` counts as unset, as for any optional
/// field in a Kubernetes manifest).
fn has_agent_type(spec: &Value) -> bool {
    spec.get("agentType").is_some_and(|v| !v.is_null())
}

/// The runtime blocks `spec` sets (non-null), in [`BLOCKS`] order.
fn blocks(spec: &Value) -> Vec<(&'static str, AgentType)> {
    BLOCKS
        .iter()
        .filter(|(name, _)| spec.get(*name).is_some_and(|v| !v.is_null()))
        .copied()
        .collect()
}

/// Fills in `agentType` in every task spec of `object` (of kind `kind`) that has none and
/// exactly one runtime block. Returns the JSON paths of the specs it defaulted. Other
/// kinds, and specs that are not JSON objects, are left alone.
pub fn default_agent_types(kind: &str, object: &mut Value) -> Vec<String> {
    let mut defaulted = Vec::new();
    for (path, spec) in task_specs(kind, object) {
        if has_agent_type(spec) {
            continue;
        }
        if let ([(_, agent_type)], Some(map)) = (blocks(spec).as_slice(), spec.as_object_mut()) {
            map.insert("agentType".into(), Value::String(agent_type.to_string()));
            defaulted.push(path);
        }
    }
    defaulted
}

/// A task spec without `agentType` that [`default_agent_types`] cannot fill in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Undefaulted {
    /// JSON path of the spec (`spec`, `spec.tasks[1]`, ...).
    pub path: String,
    /// The runtime blocks it sets: none, or several (in `kubernetes`, `docker`, `raw`
    /// order).
    pub blocks: Vec<&'static str>,
}

/// The task specs in `object` (of kind `kind`) that have no `agentType` and no single
/// runtime block to take it from; admission refuses them
/// (`rlark_api::validation::validate` names the blocks).
pub fn undefaulted(kind: &str, object: &Value) -> Vec<Undefaulted> {
    // `task_specs` walks mutably (for defaulting); a copy keeps this a pure read.
    let mut copy = object.clone();
    task_specs(kind, &mut copy)
        .into_iter()
        .filter(|(_, spec)| spec.is_object() && !has_agent_type(spec))
        .map(|(path, spec)| Undefaulted {
            path,
            blocks: blocks(spec).iter().map(|(name, _)| *name).collect(),
        })
        .filter(|u| u.blocks.len() != 1)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn task_takes_agent_type_from_its_one_block() {
        for (block, expected) in [
            ("raw", "Raw"),
            ("docker", "Docker"),
            ("kubernetes", "Kubernetes"),
        ] {
            let mut task = json!({"metadata": {"name": "t"}, "spec": {"role": "Actor", block: {}}});
            assert_eq!(default_agent_types("Task", &mut task), ["spec"]);
            assert_eq!(task["spec"]["agentType"], expected, "{block}");
            assert!(undefaulted("Task", &task).is_empty());
        }
    }

    #[test]
    fn explicit_agent_type_is_kept_even_when_it_disagrees() {
        // Disagreement is admission's to report (validation), never silently rewritten.
        let mut task = json!({"spec": {"agentType": "Docker", "raw": {}}});
        assert!(default_agent_types("Task", &mut task).is_empty());
        assert_eq!(task["spec"]["agentType"], "Docker");
    }

    #[test]
    fn job_and_workflow_task_templates_are_defaulted() {
        let mut job = json!({"spec": {"tasks": [
            {"name": "a", "raw": {}},
            {"name": "b", "agentType": "Raw", "raw": {}},
            {"name": "c", "docker": {}},
        ]}});
        assert_eq!(
            default_agent_types("Job", &mut job),
            ["spec.tasks[0]", "spec.tasks[2]"]
        );
        assert_eq!(job["spec"]["tasks"][0]["agentType"], "Raw");
        assert_eq!(job["spec"]["tasks"][2]["agentType"], "Docker");

        let mut workflow = json!({"spec": {"jobTemplates": [
            {"name": "x", "spec": {"tasks": [{"name": "a", "kubernetes": {}}]}},
        ]}});
        assert_eq!(
            default_agent_types("Workflow", &mut workflow),
            ["spec.jobTemplates[0].spec.tasks[0]"]
        );
        assert_eq!(
            workflow["spec"]["jobTemplates"][0]["spec"]["tasks"][0]["agentType"],
            "Kubernetes"
        );
    }

    #[test]
    fn no_block_or_several_blocks_are_left_undefaulted() {
        let mut job = json!({"spec": {"tasks": [
            {"name": "a", "role": "Actor"},
            {"name": "b", "docker": {}, "raw": {}},
            {"name": "c", "raw": {}, "kubernetes": null},
        ]}});
        assert_eq!(default_agent_types("Job", &mut job), ["spec.tasks[2]"]);
        assert_eq!(
            undefaulted("Job", &job),
            [
                Undefaulted {
                    path: "spec.tasks[0]".into(),
                    blocks: vec![],
                },
                Undefaulted {
                    path: "spec.tasks[1]".into(),
                    blocks: vec!["docker", "raw"],
                },
            ]
        );
    }

    #[test]
    fn other_kinds_and_odd_shapes_are_left_alone() {
        let mut node = json!({"spec": {"raw": {}}});
        assert!(default_agent_types("Node", &mut node).is_empty());
        assert_eq!(node, json!({"spec": {"raw": {}}}));
        for mut odd in [
            json!({}),
            json!({"spec": 3}),
            json!({"spec": {"tasks": "x"}}),
            json!({"spec": {"tasks": [1, null]}}),
        ] {
            assert!(default_agent_types("Job", &mut odd).is_empty());
            assert!(undefaulted("Job", &odd).is_empty());
        }
    }
}
