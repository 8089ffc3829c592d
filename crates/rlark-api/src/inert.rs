//! Fields rlark accepts (so RLark manifests apply unchanged) but does not act on for a
//! task's `agentType`. The API server sends one `Warning` per such field at create and
//! update, so a user is told at apply time instead of finding out at run time.
//!
//! This is the one table of them: when a runtime starts acting on a field, its row loses
//! that agent type (and docs/compat.md changes with it).

use crate::types::{AgentType, JobSpec, TaskSpec, WorkflowSpec};

/// One field of [`TaskSpec`] that some runtimes ignore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InertField {
    /// JSON name of the field in a TaskSpec (and a Job's task template).
    pub field: &'static str,
    /// Agent types whose runtime does nothing with it.
    pub inert_for: &'static [AgentType],
    /// What rlark does instead, for the warning.
    pub message: &'static str,
}

const ALL: &[AgentType] = &[AgentType::Kubernetes, AgentType::Docker, AgentType::Raw];
/// Only the Kubernetes runtime passes the scripts on (as `RLARK_PREPARE_SCRIPT` /
/// `RLARK_RUN_SCRIPT`, crates/rlark-agent/src/kubernetes/env.rs); raw processes and Docker
/// containers do not get them.
const NOT_KUBERNETES: &[AgentType] = &[AgentType::Docker, AgentType::Raw];

/// The table: (field, agent types it is inert for, what rlark does instead).
pub const INERT_FIELDS: &[InertField] = &[
    InertField {
        field: "downstreamName",
        inert_for: ALL,
        message: "unused, kept so RLark manifests apply",
    },
    InertField {
        field: "prepareScript",
        inert_for: NOT_KUBERNETES,
        message: "only Kubernetes tasks get it (as RLARK_PREPARE_SCRIPT); raw and Docker replicas do not",
    },
    InertField {
        field: "runScript",
        inert_for: NOT_KUBERNETES,
        message: "only Kubernetes tasks get it (as RLARK_RUN_SCRIPT); raw and Docker replicas do not",
    },
];

/// A non-empty value of `field` in `spec`, if the field is one of [`INERT_FIELDS`].
fn value_of<'a>(spec: &'a TaskSpec, field: &str) -> Option<&'a str> {
    let value = match field {
        "downstreamName" => spec.downstream_name.as_deref(),
        "prepareScript" => spec.prepare_script.as_deref(),
        "runScript" => spec.run_script.as_deref(),
        _ => None,
    };
    value.filter(|v| !v.is_empty())
}

fn warning(path: &str, agent_type: Option<AgentType>, message: &str) -> String {
    let context = match agent_type {
        Some(agent_type) => format!(" for agentType {agent_type}"),
        None => String::new(),
    };
    format!("{path}: accepted but not acted on{context} ({message}); see docs/compat.md")
}

/// The fields set (non-empty) in `spec` that its `agentType`'s runtime does not act on:
/// `(path relative to the spec, what rlark does instead)`, in [`INERT_FIELDS`] order.
pub fn inert_fields(spec: &TaskSpec) -> Vec<(&'static str, &'static str)> {
    INERT_FIELDS
        .iter()
        .filter(|row| row.inert_for.contains(&spec.agent_type))
        .filter(|row| value_of(spec, row.field).is_some())
        .map(|row| (row.field, row.message))
        .collect()
}

/// One warning text per inert field set in a Task's spec (paths `spec.<field>`).
pub fn task_warnings(spec: &TaskSpec) -> Vec<String> {
    task_warnings_at("spec", spec)
}

fn task_warnings_at(prefix: &str, spec: &TaskSpec) -> Vec<String> {
    inert_fields(spec)
        .into_iter()
        .map(|(field, message)| {
            warning(&format!("{prefix}.{field}"), Some(spec.agent_type), message)
        })
        .collect()
}

fn job_warnings_at(prefix: &str, spec: &JobSpec) -> Vec<String> {
    // `sshPublicKey` (the Job's, copied into every Task) is live: its holder may `ssh` into
    // the Job's tasks through the server's SSH endpoint (docs/ssh.md).
    let mut warnings = Vec::new();
    for (i, template) in spec.tasks.iter().enumerate() {
        warnings.extend(task_warnings_at(
            &format!("{prefix}.tasks[{i}]"),
            &template.spec,
        ));
    }
    warnings
}

/// One warning text per inert field set in a Job's spec (`spec.tasks[i].<field>`).
pub fn job_warnings(spec: &JobSpec) -> Vec<String> {
    job_warnings_at("spec", spec)
}

/// One warning text per inert field set in a Workflow's job templates
/// (`spec.jobTemplates[i].spec...`).
pub fn workflow_warnings(spec: &WorkflowSpec) -> Vec<String> {
    spec.job_templates
        .iter()
        .enumerate()
        .flat_map(|(i, template)| {
            job_warnings_at(&format!("spec.jobTemplates[{i}].spec"), &template.spec)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{JobTaskTemplate, WorkflowJobTemplate};

    fn spec(agent_type: AgentType) -> TaskSpec {
        serde_json::from_value(serde_json::json!({
            "agentType": agent_type.to_string(),
            "role": "Actor",
        }))
        .expect("minimal TaskSpec")
    }

    fn with_field(mut spec: TaskSpec, field: &str, value: &str) -> TaskSpec {
        let slot = match field {
            "downstreamName" => &mut spec.downstream_name,
            "tensorBoardDir" => &mut spec.tensor_board_dir,
            "prepareScript" => &mut spec.prepare_script,
            "runScript" => &mut spec.run_script,
            other => panic!("no such field {other}"),
        };
        *slot = Some(value.into());
        spec
    }

    #[test]
    fn each_field_is_inert_exactly_for_its_agent_types() {
        use AgentType::{Docker, Kubernetes, Raw};
        // (field, agent type, warns)
        let table = [
            ("downstreamName", Kubernetes, true),
            ("downstreamName", Docker, true),
            ("downstreamName", Raw, true),
            ("prepareScript", Kubernetes, false),
            ("prepareScript", Docker, true),
            ("prepareScript", Raw, true),
            ("runScript", Kubernetes, false),
            ("runScript", Docker, true),
            ("runScript", Raw, true),
        ];
        for (field, agent_type, warns) in table {
            let found = inert_fields(&with_field(spec(agent_type), field, "x"));
            let fields: Vec<&str> = found.iter().map(|(f, _)| *f).collect();
            let expected: Vec<&str> = if warns { vec![field] } else { vec![] };
            assert_eq!(fields, expected, "{field} on {agent_type}");
        }
    }

    #[test]
    fn unset_and_empty_fields_do_not_warn() {
        for agent_type in ALL {
            assert!(inert_fields(&spec(*agent_type)).is_empty());
            for row in INERT_FIELDS {
                let empty = with_field(spec(*agent_type), row.field, "");
                assert!(inert_fields(&empty).is_empty(), "{} empty", row.field);
            }
        }
    }

    #[test]
    fn every_row_names_a_task_spec_field() {
        // A typo in the table would make its row silently never warn.
        for row in INERT_FIELDS {
            let set = with_field(spec(AgentType::Raw), row.field, "x");
            assert_eq!(value_of(&set, row.field), Some("x"), "{}", row.field);
            let json = serde_json::to_value(&set).expect("serializes");
            assert_eq!(json[row.field], "x", "{} is the JSON name", row.field);
        }
    }

    #[test]
    fn task_warning_names_path_agent_type_and_docs() {
        let raw = with_field(spec(AgentType::Raw), "runScript", "python train.py");
        assert_eq!(
            task_warnings(&raw),
            vec![
                "spec.runScript: accepted but not acted on for agentType Raw (only Kubernetes \
                 tasks get it (as RLARK_RUN_SCRIPT); raw and Docker replicas do not); see \
                 docs/compat.md"
                    .to_string()
            ]
        );
    }

    fn job() -> JobSpec {
        JobSpec {
            ssh_public_key: Some("ssh-ed25519 AAAA".into()),
            tasks: vec![
                JobTaskTemplate {
                    name: "head".into(),
                    head: true,
                    spec: with_field(spec(AgentType::Kubernetes), "prepareScript", "pip i x"),
                },
                JobTaskTemplate {
                    name: "worker".into(),
                    head: false,
                    spec: with_field(spec(AgentType::Docker), "prepareScript", "pip i x"),
                },
                JobTaskTemplate {
                    name: "raw".into(),
                    head: false,
                    spec: with_field(spec(AgentType::Raw), "tensorBoardDir", "/logs"),
                },
            ],
            ..JobSpec::default()
        }
    }

    #[test]
    fn job_warnings_name_template_paths() {
        let warnings = job_warnings(&job());
        let paths: Vec<&str> = warnings
            .iter()
            .map(|w| w.split(':').next().unwrap_or(""))
            .collect();
        // The Kubernetes head's prepareScript is acted on, and so are the Job's sshPublicKey
        // (the SSH endpoint) and the raw task's tensorBoardDir (TensorBoard beside it): no
        // warning for them.
        assert_eq!(paths, ["spec.tasks[1].prepareScript"]);
        assert!(
            warnings[0].contains("for agentType Docker"),
            "{}",
            warnings[0]
        );
    }

    #[test]
    fn workflow_warnings_name_job_template_paths() {
        let workflow = WorkflowSpec {
            job_templates: vec![
                WorkflowJobTemplate {
                    name: "clean".into(),
                    spec: JobSpec::default(),
                    ..WorkflowJobTemplate::default()
                },
                WorkflowJobTemplate {
                    name: "train".into(),
                    spec: job(),
                    ..WorkflowJobTemplate::default()
                },
            ],
            ..WorkflowSpec::default()
        };
        let paths: Vec<String> = workflow_warnings(&workflow)
            .iter()
            .map(|w| w.split(':').next().unwrap_or("").to_string())
            .collect();
        assert_eq!(paths, ["spec.jobTemplates[1].spec.tasks[1].prepareScript"]);
    }
}
