//! A Task's `kubernetes.jobTemplate` → one batch/v1 Job, with the fields rlark forces.
//!
//! The template is Jinja text rendered with MiniJinja. Variables: `input` (the Task's
//! `spec.input`; none when unset), `task` (`name`, `namespace`, `uid`, `job`) and
//! `job_name` (the name the Job gets); filter `yaml_escape` (the value's text as a quoted,
//! escaped YAML string). An undefined variable or attribute is an error, not an empty
//! string (agent-lightning renders it empty and submits a broken Job). Rendering runs on
//! a fuel budget ([`RENDER_FUEL`]) and its output is capped at [`MAX_RENDERED_BYTES`], so
//! a template cannot loop the agent.
//!
//! The text must be exactly ONE YAML document, a `batch/v1` `Job`; anything else fails
//! the Task with what was found. Then rlark forces, whatever the template says, and
//! reports each field it had to change (for a Warning event):
//! `metadata.name` ([`names::workload_name`]), `metadata.namespace` (the member
//! namespace), no `metadata.generateName`, rlark's labels and annotations on the Job and
//! its Pod template, `spec.backoffLimit: 0`, `spec.template.spec.restartPolicy: Never`,
//! `spec.activeDeadlineSeconds` (when the Task sets `kubernetes.activeDeadlineSeconds`),
//! `spec.suspend` (= `spec.stopped`), no `spec.manualSelector`/`spec.selector`, no
//! `spec.managedBy` (another controller would never run it), and the environment
//! contract in every container (`RLARK_REPLICA_INDEX` from the completion index when the
//! Job is `Indexed`).

use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt as _;
use minijinja::value::Serde;
use minijinja::{Environment, UndefinedBehavior, Value};
use rlark_api::agent::run_key;
use rlark_api::types::{KubernetesWorkloadKind, Task};
use serde_json::json;

use super::env::{IndexSource, task_job};
use super::workload::{
    BuildError, force_entries, identity_annotations, identity_labels, prepare_pod,
};
use super::{MemberContext, names};

/// Fuel for one rendering (MiniJinja's instruction budget): far more than a Job needs.
pub const RENDER_FUEL: u64 = 1_000_000;
/// Largest rendered text, in bytes.
pub const MAX_RENDERED_BYTES: usize = 1024 * 1024;

/// Why a `jobTemplate` gives no Job. The Task fails with this message (a template does
/// not get better by retrying).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// MiniJinja refused the template: syntax, an undefined variable, a filter error, the
    /// fuel ran out.
    #[error("kubernetes.jobTemplate does not render: {0}")]
    Render(String),
    /// The rendered text is larger than [`MAX_RENDERED_BYTES`].
    #[error(
        "kubernetes.jobTemplate renders {bytes} bytes, more than the {MAX_RENDERED_BYTES} allowed"
    )]
    TooLarge {
        /// Size of the rendered text.
        bytes: usize,
    },
    /// The rendered text is not YAML.
    #[error("kubernetes.jobTemplate does not render valid YAML: {0}")]
    Yaml(String),
    /// The rendered text holds no document or more than one.
    #[error(
        "kubernetes.jobTemplate renders {found} YAML documents; exactly one batch/v1 Job is required"
    )]
    DocumentCount {
        /// Non-empty documents found.
        found: usize,
    },
    /// The document is not a mapping.
    #[error(
        "kubernetes.jobTemplate renders a YAML {found}, not an object; a batch/v1 Job is required"
    )]
    NotAnObject {
        /// What it is (`list`, `string`, ...).
        found: &'static str,
    },
    /// The object is not a batch/v1 Job.
    #[error(
        "kubernetes.jobTemplate renders apiVersion {api_version:?} kind {kind:?}; a batch/v1 Job is required"
    )]
    NotAJob {
        /// `apiVersion` found (empty when missing).
        api_version: String,
        /// `kind` found (empty when missing).
        kind: String,
    },
    /// The object does not have the shape of a Job.
    #[error("kubernetes.jobTemplate renders a Job that is not valid: {0}")]
    Invalid(String),
    /// The Task gives no run to build.
    #[error(transparent)]
    Build(#[from] BuildError),
}

/// A rendered Job and the fields rlark changed in it.
#[derive(Clone, Debug, PartialEq)]
pub struct RenderedJob {
    /// The Job to create.
    pub job: Job,
    /// Paths of the fields rlark forced that the template had set otherwise, in order
    /// (e.g. `spec.backoffLimit`, `spec.template.spec.containers[main].env[RLARK_TASK]`).
    pub corrected: Vec<String>,
}

/// The variables of `task`'s template: `input`, `task`, `job_name`.
pub fn variables(task: &Task) -> serde_json::Value {
    json!({
        "input": task.spec.input.clone().unwrap_or(serde_json::Value::Null),
        "task": {
            "name": task.name_any(),
            "namespace": task.namespace().unwrap_or_default(),
            "uid": task.uid().unwrap_or_default(),
            "job": task_job(task),
        },
        "job_name": names::workload_name(&task.name_any(), KubernetesWorkloadKind::Job),
    })
}

/// `yaml_escape`: the value's text as a double-quoted YAML (JSON) string.
fn yaml_escape(value: Value) -> String {
    let text = value
        .as_str()
        .map_or_else(|| value.to_string(), str::to_string);
    serde_json::Value::String(text).to_string()
}

/// Renders `template` with `vars` (strict undefined, fuel, size cap).
pub fn render_text(template: &str, vars: &serde_json::Value) -> Result<String, TemplateError> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_fuel(Some(RENDER_FUEL));
    env.add_filter("yaml_escape", yaml_escape);
    let text = env
        .render_str(template, Value::from(Serde(vars)))
        .map_err(|e| TemplateError::Render(render_error(&e)))?;
    if text.len() > MAX_RENDERED_BYTES {
        return Err(TemplateError::TooLarge { bytes: text.len() });
    }
    Ok(text)
}

/// A MiniJinja error as one line: what, and the template line.
fn render_error(error: &minijinja::Error) -> String {
    match error.line() {
        Some(line) => format!("{error} (line {line})"),
        None => error.to_string(),
    }
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "list",
        serde_json::Value::Object(_) => "object",
    }
}

/// Parses rendered text as exactly one batch/v1 Job.
pub fn parse_job(text: &str) -> Result<Job, TemplateError> {
    let documents: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(text).map_err(|e| TemplateError::Yaml(e.to_string()))?;
    let mut documents: Vec<serde_json::Value> =
        documents.into_iter().filter(|d| !d.is_null()).collect();
    if documents.len() != 1 {
        return Err(TemplateError::DocumentCount {
            found: documents.len(),
        });
    }
    let document = documents.remove(0);
    let Some(object) = document.as_object() else {
        return Err(TemplateError::NotAnObject {
            found: json_kind(&document),
        });
    };
    let text_of = |key: &str| {
        object
            .get(key)
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
            .unwrap_or_default()
    };
    let (api_version, kind) = (text_of("apiVersion"), text_of("kind"));
    if api_version != "batch/v1" || kind != "Job" {
        return Err(TemplateError::NotAJob { api_version, kind });
    }
    let job: Job =
        serde_json::from_value(document).map_err(|e| TemplateError::Invalid(e.to_string()))?;
    let has_containers = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .is_some_and(|p| !p.containers.is_empty());
    if !has_containers {
        return Err(TemplateError::Invalid(
            "spec.template.spec.containers: at least one container is required".into(),
        ));
    }
    Ok(job)
}

/// Sets `*field` to `value`, recording `path` when it held something else.
fn force<T: PartialEq>(
    field: &mut Option<T>,
    value: Option<T>,
    path: &str,
    corrected: &mut Vec<String>,
) {
    if field.is_some() && *field != value {
        corrected.push(path.to_string());
    }
    *field = value;
}

/// Forces rlark's fields on `job` (module docs) for `task`'s run `run_key`.
pub fn force_fields(
    job: &mut Job,
    task: &Task,
    ctx: &MemberContext,
    run_key: &str,
) -> Result<Vec<String>, TemplateError> {
    let mut corrected = Vec::new();
    let meta = &mut job.metadata;
    let name = names::workload_name(&task.name_any(), KubernetesWorkloadKind::Job);
    force(&mut meta.name, Some(name), "metadata.name", &mut corrected);
    force(
        &mut meta.namespace,
        Some(ctx.namespace.clone()),
        "metadata.namespace",
        &mut corrected,
    );
    force(
        &mut meta.generate_name,
        None,
        "metadata.generateName",
        &mut corrected,
    );
    corrected.extend(force_entries(
        &mut meta.labels,
        &identity_labels(task, run_key),
        "metadata.labels",
    ));
    corrected.extend(force_entries(
        &mut meta.annotations,
        &identity_annotations(task, run_key),
        "metadata.annotations",
    ));
    let Some(spec) = job.spec.as_mut() else {
        return Err(TemplateError::Invalid("spec is required".into()));
    };
    force(
        &mut spec.backoff_limit,
        Some(0),
        "spec.backoffLimit",
        &mut corrected,
    );
    if let Some(deadline) = task
        .spec
        .kubernetes
        .as_ref()
        .and_then(|k| k.active_deadline_seconds)
    {
        force(
            &mut spec.active_deadline_seconds,
            Some(deadline),
            "spec.activeDeadlineSeconds",
            &mut corrected,
        );
    }
    // A stopped Task suspends its Job; a running one may not be suspended by its template.
    let suspend = task.spec.stopped;
    if !suspend && spec.suspend == Some(true) {
        corrected.push("spec.suspend".to_string());
    }
    spec.suspend = Some(suspend);
    force(
        &mut spec.manual_selector,
        None,
        "spec.manualSelector",
        &mut corrected,
    );
    force(&mut spec.selector, None, "spec.selector", &mut corrected);
    force(&mut spec.managed_by, None, "spec.managedBy", &mut corrected);
    let index = if spec.completion_mode.as_deref() == Some("Indexed") {
        IndexSource::IndexedJob
    } else {
        IndexSource::None
    };
    corrected.extend(prepare_pod(
        &mut spec.template,
        task,
        ctx,
        run_key,
        index,
        "spec.template",
    )?);
    if let Some(pod) = spec.template.spec.as_mut() {
        force(
            &mut pod.restart_policy,
            Some("Never".to_string()),
            "spec.template.spec.restartPolicy",
            &mut corrected,
        );
    }
    Ok(corrected)
}

/// The Job of `task`'s `kubernetes.jobTemplate` for its run on `ctx.cluster_id`:
/// rendered, parsed, forced.
pub fn render(task: &Task, ctx: &MemberContext) -> Result<RenderedJob, TemplateError> {
    let template = task
        .spec
        .kubernetes
        .as_ref()
        .and_then(|k| k.job_template.as_deref())
        .ok_or(BuildError::NoJobTemplate)?;
    let run_key = run_key(task, &ctx.cluster_id).ok_or_else(|| BuildError::NotPlaced {
        cluster_id: ctx.cluster_id.clone(),
    })?;
    let text = render_text(template, &variables(task))?;
    let mut job = parse_job(&text)?;
    let corrected = force_fields(&mut job, task, ctx, &run_key)?;
    Ok(RenderedJob { job, corrected })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes::workload::testing::{ctx, task};
    use crate::kubernetes::{MANAGED_BY_LABEL, TASK_UID_LABEL};

    const CALC_X: &str = r#"apiVersion: batch/v1
kind: Job
metadata:
  name: auto
spec:
  template:
    spec:
      containers:
        - name: agent
          image: calc-x-agent:dev
          env:
            - name: QUESTION
              value: {{ input.question | yaml_escape }}
            - name: JOB
              value: {{ job_name }}-{{ task.job }}
"#;

    fn with_template(template: &str) -> Task {
        let mut t = task("ppo-rollout", 1);
        t.spec.input = Some(json!({"question": "what is \"2\"+2?\nsay: 4", "n": 3}));
        t.spec.kubernetes = Some(rlark_api::types::KubernetesTaskSpec {
            job_template: Some(template.to_string()),
            ..Default::default()
        });
        t
    }

    fn container_env(job: &Job, name: &str) -> Option<String> {
        job.spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|p| p.containers[0].env.as_ref())
            .and_then(|env| env.iter().find(|e| e.name == name))
            .and_then(|e| e.value.clone())
    }

    #[test]
    fn a_template_renders_one_job_with_the_forced_fields() {
        let rendered = render(&with_template(CALC_X), &ctx()).expect("render");
        let job = &rendered.job;
        assert_eq!(job.metadata.name.as_deref(), Some("ppo-rollout"));
        assert_eq!(job.metadata.namespace.as_deref(), Some("rlark-system"));
        let labels = job.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels[MANAGED_BY_LABEL], "rlark");
        assert_eq!(labels[TASK_UID_LABEL], "uid-1");
        assert_eq!(
            container_env(job, "QUESTION").as_deref(),
            Some("what is \"2\"+2?\nsay: 4"),
            "yaml_escape keeps quotes, newlines and colons"
        );
        assert_eq!(
            container_env(job, "JOB").as_deref(),
            Some("ppo-rollout-ppo")
        );
        assert_eq!(
            container_env(job, "RLARK_TASK").as_deref(),
            Some("ppo-rollout")
        );
        let spec = job.spec.as_ref().expect("spec");
        assert_eq!(spec.backoff_limit, Some(0));
        assert_eq!(spec.suspend, Some(false));
        let pod = spec.template.spec.as_ref().expect("pod");
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        let pod_labels = spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone());
        assert_eq!(pod_labels.unwrap_or_default()[TASK_UID_LABEL], "uid-1");
        // The template's `name: auto` was overwritten, and that is reported.
        assert_eq!(rendered.corrected, ["metadata.name"]);
    }

    #[test]
    fn override_attempts_are_corrected_and_reported() {
        let template = r#"apiVersion: batch/v1
kind: Job
metadata:
  name: {{ job_name }}
  namespace: kube-system
  labels:
    app.kubernetes.io/managed-by: someone-else
    team: rl
spec:
  backoffLimit: 6
  activeDeadlineSeconds: 99999
  suspend: true
  managedBy: example.com/other
  template:
    spec:
      restartPolicy: OnFailure
      containers:
        - name: agent
          image: x
          env:
            - name: RLARK_TASK
              value: not-me
            - name: RLARK_TOTAL_NODES
              value: "1"
"#;
        let mut t = with_template(template);
        if let Some(k) = t.spec.kubernetes.as_mut() {
            k.active_deadline_seconds = Some(300);
        }
        let rendered = render(&t, &ctx()).expect("render");
        assert_eq!(
            rendered.corrected,
            [
                "metadata.namespace",
                "metadata.labels[app.kubernetes.io/managed-by]",
                "spec.backoffLimit",
                "spec.activeDeadlineSeconds",
                "spec.suspend",
                "spec.managedBy",
                "spec.template.spec.containers[agent].env[RLARK_TASK]",
                "spec.template.spec.restartPolicy",
            ],
            "RLARK_TOTAL_NODES had rlark's own value: no correction"
        );
        let job = &rendered.job;
        assert_eq!(job.metadata.namespace.as_deref(), Some("rlark-system"));
        let labels = job.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels[MANAGED_BY_LABEL], "rlark");
        assert_eq!(labels["team"], "rl", "the template's other labels stay");
        let spec = job.spec.as_ref().expect("spec");
        assert_eq!(spec.backoff_limit, Some(0));
        assert_eq!(spec.active_deadline_seconds, Some(300));
        assert_eq!(spec.suspend, Some(false));
        assert_eq!(spec.managed_by, None);
        assert_eq!(
            container_env(job, "RLARK_TASK").as_deref(),
            Some("ppo-rollout")
        );

        // A stopped Task suspends its Job; that is no correction.
        let mut stopped = t.clone();
        stopped.spec.stopped = true;
        let rendered = render(&stopped, &ctx()).expect("render");
        assert_eq!(rendered.job.spec.and_then(|s| s.suspend), Some(true));
        assert!(!rendered.corrected.contains(&"spec.suspend".to_string()));
    }

    #[test]
    fn templates_that_are_not_one_job_are_refused() {
        let deployment = "apiVersion: apps/v1\nkind: Deployment\nspec: {}\n";
        let two = format!("{CALC_X}---\n{CALC_X}");
        let cases: Vec<(&str, TemplateError)> = vec![
            (
                deployment,
                TemplateError::NotAJob {
                    api_version: "apps/v1".into(),
                    kind: "Deployment".into(),
                },
            ),
            (&two, TemplateError::DocumentCount { found: 2 }),
            ("", TemplateError::DocumentCount { found: 0 }),
            ("---\n---\n", TemplateError::DocumentCount { found: 0 }),
            ("- a\n- b\n", TemplateError::NotAnObject { found: "list" }),
            ("just text", TemplateError::NotAnObject { found: "string" }),
            (
                "kind: Job\n",
                TemplateError::NotAJob {
                    api_version: String::new(),
                    kind: "Job".into(),
                },
            ),
            (
                "apiVersion: batch/v1\nkind: Job\nspec:\n  template:\n    spec:\n      containers: []\n",
                TemplateError::Invalid(
                    "spec.template.spec.containers: at least one container is required".into(),
                ),
            ),
        ];
        for (template, want) in cases {
            assert_eq!(
                render(&with_template(template), &ctx()),
                Err(want),
                "{template:?}"
            );
        }
        // Not YAML at all, and a Job of the wrong shape: the parser's own words.
        let bad_yaml = render(&with_template("kind: Job\n  bad: [unclosed\n"), &ctx());
        assert!(
            matches!(bad_yaml, Err(TemplateError::Yaml(_))),
            "{bad_yaml:?}"
        );
        let wrong_shape = render(
            &with_template("apiVersion: batch/v1\nkind: Job\nspec:\n  parallelism: many\n"),
            &ctx(),
        );
        assert!(
            matches!(&wrong_shape, Err(TemplateError::Invalid(m)) if m.contains("many")),
            "{wrong_shape:?}"
        );
    }

    #[test]
    fn undefined_variables_and_bad_syntax_are_errors() {
        for (template, needle) in [
            ("value: {{ inpt.question }}", "undefined"),
            ("value: {{ input.missing.deeper }}", "undefined"),
            ("value: {{ task.name | no_such_filter }}", "no_such_filter"),
            ("value: {% if %}", "syntax"),
        ] {
            let result = render(&with_template(template), &ctx());
            let Err(TemplateError::Render(message)) = &result else {
                panic!("{template:?}: {result:?}")
            };
            assert!(message.contains(needle), "{template:?}: {message}");
        }
        // A loop that would render forever runs out of fuel.
        let endless =
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}";
        let result = render(&with_template(endless), &ctx());
        assert!(
            matches!(result, Err(TemplateError::Render(_))),
            "{result:?}"
        );
    }

    #[test]
    fn mutated_templates_never_panic() {
        let (accepted, refused) = crate::fuzzing::mutate_job_templates(3_000);
        assert!(accepted > 0 && refused > 0, "{accepted} {refused}");
    }

    #[test]
    fn a_task_without_a_template_or_placement_is_refused() {
        assert_eq!(
            render(&task("ppo-actor", 1), &ctx()),
            Err(TemplateError::Build(BuildError::NoJobTemplate))
        );
        let mut unplaced = with_template(CALC_X);
        unplaced.spec.placement = None;
        assert!(matches!(
            render(&unplaced, &ctx()),
            Err(TemplateError::Build(BuildError::NotPlaced { .. }))
        ));
    }
}
