use ipnet::IpNet;
use serde_json::{Value, json};

use super::*;
use crate::types::{Job, JobSpec};

fn raw_task(entrypoint: &[&str]) -> Value {
    json!({"agentType": "Raw", "role": "Actor", "raw": {"entrypoint": entrypoint}})
}

fn task(spec: Value) -> Value {
    json!({"apiVersion": "rlinf.io/v1alpha1", "kind": "Task",
           "metadata": {"name": "ppo-train-actor", "namespace": "rlark-c1"}, "spec": spec})
}

fn job_named(name: &str, tasks: Value) -> Value {
    json!({"apiVersion": "rlinf.io/v1alpha1", "kind": "Job",
           "metadata": {"name": name}, "spec": {"domain": "demo-net", "tasks": tasks}})
}

fn job(tasks: Value) -> Value {
    job_named("ppo-train", tasks)
}

fn template(name: &str) -> Value {
    let mut t = raw_task(&["python3", "-c", "pass"]);
    t["name"] = json!(name);
    t
}

fn workflow_named(name: &str, templates: Value) -> Value {
    json!({"apiVersion": "rlinf.io/v1alpha1", "kind": "Workflow",
           "metadata": {"name": name}, "spec": {"jobTemplates": templates}})
}

fn wf_template(name: &str, deps: &[&str]) -> Value {
    json!({"name": name, "dependencies": deps, "spec": {"tasks": [template("main")]}})
}

fn domain(cidr: &str) -> Value {
    json!({"kind": "Domain", "metadata": {"name": "demo-net"}, "spec": {"cidr": cidr}})
}

/// `(field, kind, message)` of every error, or empty when valid.
fn errors(kind: &str, object: &Value) -> Vec<(String, FieldErrorKind, String)> {
    match validate(kind, object) {
        Ok(()) => Vec::new(),
        Err(errs) => errs
            .into_iter()
            .map(|e| (e.field, e.kind, e.message))
            .collect(),
    }
}

fn e(field: &str, kind: FieldErrorKind, message: &str) -> (String, FieldErrorKind, String) {
    (field.to_string(), kind, message.to_string())
}

/// The single error of an invalid object, rendered.
fn one_error(kind: &str, object: &Value) -> String {
    let errs = validate(kind, object).expect_err("object should be invalid");
    assert_eq!(errs.len(), 1, "{errs:?}");
    errs[0].to_string()
}

use FieldErrorKind::*;

const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

// --- FieldError -----------------------------------------------------------------------

#[test]
fn cause_types_are_kubernetes_strings() {
    let cases = [
        (Invalid, "FieldValueInvalid", "Invalid value"),
        (Required, "FieldValueRequired", "Required value"),
        (NotSupported, "FieldValueNotSupported", "Unsupported value"),
        (Duplicate, "FieldValueDuplicate", "Duplicate value"),
        (Forbidden, "FieldValueForbidden", "Forbidden"),
        (TooLong, "FieldValueTooLong", "Too long"),
        (NotFound, "FieldValueNotFound", "Not found"),
    ];
    for (kind, cause, label) in cases {
        assert_eq!(kind.cause_type(), cause);
        assert_eq!(FieldError::new("x", kind, "").cause_type(), cause);
        assert_eq!(kind.label(), label);
    }
}

#[test]
fn rendering_matches_kubernetes() {
    let err = FieldError::not_supported("spec.role", "Foo", &["Actor", "Rollout", "Env", "Head"]);
    assert_eq!(
        err.to_string(),
        r#"spec.role: Unsupported value: "Foo": supported values: "Actor", "Rollout", "Env", "Head""#
    );
    assert_eq!(
        FieldError::required("spec.cidr", "").to_string(),
        "spec.cidr: Required value"
    );
    assert_eq!(
        FieldError::duplicate("spec.tasks[1].name", "actor").body(),
        r#"Duplicate value: "actor""#
    );
    let one = [FieldError::required("spec.cidr", "")];
    assert_eq!(
        invalid_message("Domain", "d", &one),
        r#"Domain.rlinf.io "d" is invalid: spec.cidr: Required value"#
    );
    let two = [
        FieldError::required("a", ""),
        FieldError::forbidden("b", "not here"),
    ];
    assert_eq!(
        invalid_message("Job", "j", &two),
        r#"Job.rlinf.io "j" is invalid: [a: Required value, b: Forbidden: not here]"#
    );
}

#[test]
fn unknown_kind_is_named() {
    let errs = errors("Deployment", &json!({}));
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].0, "kind");
    assert_eq!(errs[0].1, NotSupported);
    assert!(
        errs[0]
            .2
            .starts_with(r#""Deployment": supported values: "Domain", "DomainPeer""#)
    );
}

// --- decoding -------------------------------------------------------------------------

#[test]
fn on_device_unhealthy_is_keep_or_stop() {
    let mut spec = raw_task(&["x"]);
    spec["onDeviceUnhealthy"] = json!("Stop");
    assert!(errors("Task", &task(spec.clone())).is_empty());
    spec["onDeviceUnhealthy"] = json!("Restart");
    assert_eq!(
        one_error("Task", &task(spec)),
        r#"spec.onDeviceUnhealthy: Unsupported value: "Restart": supported values: "Keep", "Stop""#
    );
    let mut t = template("rollout");
    t["onDeviceUnhealthy"] = json!("stop");
    assert_eq!(
        errors("Job", &job(json!([t]))),
        [e(
            "spec.tasks[0].onDeviceUnhealthy",
            NotSupported,
            r#""stop": supported values: "Keep", "Stop""#
        )]
    );
}

#[test]
fn bad_enum_value_is_not_supported_with_the_choices() {
    let mut spec = raw_task(&["x"]);
    spec["role"] = json!("Foo");
    assert_eq!(
        one_error("Task", &task(spec)),
        r#"spec.role: Unsupported value: "Foo": supported values: "Actor", "Rollout", "Env", "Head""#
    );
    let mut t = template("actor");
    t["role"] = json!("Foo");
    assert_eq!(
        errors("Job", &job(json!([template("a"), t]))),
        [e(
            "spec.tasks[1].role",
            NotSupported,
            r#""Foo": supported values: "Actor", "Rollout", "Env", "Head""#
        )]
    );
    let node = json!({"metadata": {"name": "n"}, "spec": {"agentType": "Raw"},
                      "status": {"phase": "Up"}});
    assert_eq!(
        errors("Node", &node),
        [e(
            "status.phase",
            NotSupported,
            r#""Up": supported values: "Online", "Offline""#
        )]
    );
    let mut k = template("a");
    k["agentType"] = json!("Kubernetes");
    k["raw"] = Value::Null;
    k["kubernetes"] = json!({"workload": {"kind": "ReplicaSet", "template": {}}});
    assert_eq!(
        errors("Job", &job(json!([k]))),
        [e(
            "spec.tasks[0].kubernetes.workload.kind",
            NotSupported,
            r#""ReplicaSet": supported values: "Deployment", "StatefulSet", "DaemonSet", "Job", "CloneSet""#
        )]
    );
}

#[test]
fn paths_inside_flattened_templates_are_exact() {
    let mut t = template("actor");
    t["raw"]["replicas"] = json!("two");
    let errs = errors("Job", &job(json!([t])));
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].0, "spec.tasks[0].raw.replicas");
    assert_eq!(errs[0].1, Invalid);
    assert!(errs[0].2.contains("invalid type"), "{}", errs[0].2);

    let mut t = template("actor");
    t.as_object_mut().unwrap().remove("role");
    assert_eq!(
        errors("Job", &job(json!([t]))),
        [e("spec.tasks[0].role", Required, "")]
    );

    let mut t = template("actor");
    t["raw"]["resources"] = json!({"requests": {"cpu": true}});
    let errs = errors("Job", &job(json!([t])));
    assert_eq!(errs[0].0, "spec.tasks[0].raw.resources.requests.cpu");

    let mut t = template("main");
    t["agentType"] = json!("Bash");
    let wf = workflow_named("wf", json!([{"name": "a", "spec": {"tasks": [t]}}]));
    assert_eq!(
        errors("Workflow", &wf),
        [e(
            "spec.jobTemplates[0].spec.tasks[0].agentType",
            NotSupported,
            r#""Bash": supported values: "Kubernetes", "Docker", "Raw""#
        )]
    );
}

#[test]
fn missing_fields_are_required() {
    let no_spec = json!({"metadata": {"name": "x"}});
    assert_eq!(errors("Task", &no_spec), [e("spec", Required, "")]);
    let no_meta = json!({"spec": {"cidr": "10.0.0.0/8"}});
    assert_eq!(errors("Domain", &no_meta), [e("metadata", Required, "")]);
    assert_eq!(
        errors(
            "Task",
            &task(json!({"agentType": "Raw", "role": "Actor", "raw": {}}))
        ),
        [e("spec.raw.entrypoint", Required, "")]
    );
    let mut t = template("x");
    t.as_object_mut().unwrap().remove("name");
    assert_eq!(
        errors("Job", &job(json!([t]))),
        [e("spec.tasks[0].name", Required, "")]
    );
}

#[test]
fn wrong_types_are_invalid() {
    let errs = errors("Domain", &json!("not an object"));
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].0, "");
    assert_eq!(errs[0].1, Invalid);
    let errs = errors(
        "Domain",
        &json!({"metadata": {"name": "d", "labels": {"a": 1}}, "spec": {"cidr": "10.0.0.0/8"}}),
    );
    assert_eq!(errs[0].0, "metadata.labels.a");
    assert_eq!(errs[0].1, Invalid);
}

#[test]
fn unknown_fields_are_ignored() {
    let mut spec = raw_task(&["x"]);
    spec["somethingNew"] = json!(1);
    assert_eq!(errors("Task", &task(spec)), []);
}

// --- metadata -------------------------------------------------------------------------

#[test]
fn name_is_required() {
    let mut t = task(raw_task(&["x"]));
    t["metadata"] = json!({});
    assert_eq!(
        errors("Task", &t),
        [e(
            "metadata.name",
            Required,
            "name or generateName is required"
        )]
    );
    t["metadata"] = json!({"name": ""});
    assert_eq!(errors("Task", &t)[0].0, "metadata.name");
}

#[test]
fn names_follow_dns1123() {
    let mut t = task(raw_task(&["x"]));
    t["metadata"]["name"] = json!("a.b-c");
    assert_eq!(errors("Task", &t), []);
    t["metadata"]["name"] = json!("Bad_Name");
    let errs = errors("Task", &t);
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].0, "metadata.name");
    assert!(
        errs[0]
            .2
            .starts_with(r#""Bad_Name": a lowercase RFC 1123 subdomain"#)
    );
    t["metadata"]["name"] = json!("ok");
    t["metadata"]["namespace"] = json!("Bad.NS");
    assert_eq!(errors("Task", &t)[0].0, "metadata.namespace");

    // Jobs and Workflows prefix their children's names: a label, not a subdomain.
    let j = job_named("a.b", json!([template("x")]));
    assert_eq!(
        errors("Job", &j),
        [e(
            "metadata.name",
            Invalid,
            r#""a.b": must not contain dots"#
        )]
    );
    let j = job_named("Job", json!([template("x")]));
    assert_eq!(
        errors("Job", &j),
        [e(
            "metadata.name",
            Invalid,
            &format!(r#""Job": {LABEL_MSG}"#)
        )]
    );
    let wf = workflow_named("a.b", json!([wf_template("t", &[])]));
    assert_eq!(errors("Workflow", &wf)[0].0, "metadata.name");
    let long = "a".repeat(64);
    let j = job_named(&long, json!([]));
    let errs = errors("Job", &j);
    assert_eq!(
        errs[0],
        e(
            "metadata.name",
            Invalid,
            &format!("{long:?}: must be no more than 63 characters")
        )
    );
}

// --- Job ------------------------------------------------------------------------------

#[test]
fn a_good_job_is_accepted() {
    let mut head = template("actor");
    head["head"] = json!(true);
    let mut rollout = template("rollout");
    rollout["nodeSelector"] = json!({"rlark.io/node-category": "edge,robot"});
    rollout["raw"]["replicas"] = json!(2);
    assert_eq!(errors("Job", &job(json!([head, rollout]))), []);
}

#[test]
fn a_job_needs_tasks() {
    assert_eq!(
        errors("Job", &job(json!([]))),
        [e("spec.tasks", Required, "at least one task is required")]
    );
    let no_tasks = json!({"metadata": {"name": "j"}, "spec": {}});
    assert_eq!(errors("Job", &no_tasks)[0].0, "spec.tasks");
}

#[test]
fn task_template_names() {
    let errs = errors("Job", &job(json!([template("Actor"), template("")])));
    assert_eq!(
        errs,
        [
            e(
                "spec.tasks[0].name",
                Invalid,
                &format!(r#""Actor": {LABEL_MSG}"#)
            ),
            e("spec.tasks[1].name", Required, ""),
        ]
    );
    let errs = errors(
        "Job",
        &job(json!([
            template("actor"),
            template("rollout"),
            template("actor")
        ])),
    );
    assert_eq!(errs, [e("spec.tasks[2].name", Duplicate, r#""actor""#)]);
}

#[test]
fn child_task_names_fit_a_label() {
    // "ppo-train" + "-" + 53 characters = 63: fits.
    let fits = "t".repeat(53);
    assert_eq!(errors("Job", &job(json!([template(&fits)]))), []);
    let too_long = "t".repeat(54);
    let errs = errors("Job", &job(json!([template(&too_long)])));
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].0, "spec.tasks[0].name");
    assert_eq!(errs[0].1, TooLong);
    assert_eq!(
        errs[0].2,
        format!(
            "the Task name \"ppo-train-{too_long}\" (<job>-<task>) may not be more than 63 characters"
        )
    );
}

#[test]
fn at_most_one_head() {
    let mut a = template("a");
    a["head"] = json!(true);
    let mut b = template("b");
    b["head"] = json!(true);
    let mut c = template("c");
    c["head"] = json!(true);
    let errs = errors("Job", &job(json!([a, b, c])));
    assert_eq!(
        errs,
        [
            e(
                "spec.tasks[1].head",
                Invalid,
                r#"true: at most one task may be the head, and "a" already is"#
            ),
            e(
                "spec.tasks[2].head",
                Invalid,
                r#"true: at most one task may be the head, and "a" already is"#
            ),
        ]
    );
}

#[test]
fn runtime_block_must_match_agent_type() {
    let msg = r#"agentType Raw requires the "raw" block and no other"#;
    let mut none = template("a");
    none.as_object_mut().unwrap().remove("raw");
    assert_eq!(
        errors("Job", &job(json!([none]))),
        [e("spec.tasks[0]", Invalid, msg)]
    );
    assert_eq!(
        one_error(
            "Job",
            &job(json!([{
                "name": "a", "agentType": "Raw", "role": "Actor"
            }]))
        ),
        format!("spec.tasks[0]: Invalid value: {msg}")
    );

    let mut both = template("a");
    both["docker"] = json!({"containers": [{"name": "c", "image": "busybox"}]});
    assert_eq!(
        errors("Job", &job(json!([both]))),
        [e("spec.tasks[0]", Invalid, msg)]
    );

    let mut wrong = template("a");
    wrong["agentType"] = json!("Docker");
    assert_eq!(
        errors("Job", &job(json!([wrong]))),
        [e(
            "spec.tasks[0]",
            Invalid,
            r#"agentType Docker requires the "docker" block and no other"#
        )]
    );

    let spec = json!({"agentType": "Kubernetes", "role": "Env"});
    assert_eq!(
        errors("Task", &task(spec)),
        [e(
            "spec",
            Invalid,
            r#"agentType Kubernetes requires the "kubernetes" block and no other"#
        )]
    );
}

#[test]
fn all_errors_are_collected() {
    let mut bad_raw = template("x");
    bad_raw["raw"] = json!({"entrypoint": [], "replicas": -1});
    let errs = errors(
        "Job",
        &job_named(
            "ppo-train",
            json!([template("Bad"), bad_raw, template("x")]),
        ),
    );
    let fields: Vec<&str> = errs.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.tasks[0].name",
            "spec.tasks[1].raw.entrypoint",
            "spec.tasks[1].raw.replicas",
            "spec.tasks[2].name",
        ]
    );
}

// --- Task runtimes --------------------------------------------------------------------

fn raw_errors_of(raw: Value) -> Vec<(String, FieldErrorKind, String)> {
    errors(
        "Task",
        &task(json!({"agentType": "Raw", "role": "Actor", "raw": raw})),
    )
}

#[test]
fn container_tensor_board_dirs_are_absolute() {
    let docker = |dir: &str| {
        json!({"agentType": "Docker", "role": "Actor", "tensorBoardDir": dir,
               "docker": {"containers": [{"name": "main", "image": "busybox"}]}})
    };
    assert_eq!(
        errors("Task", &task(docker("runs"))),
        [e(
            "spec.tensorBoardDir",
            Invalid,
            "\"runs\": must be an absolute path in the container for agentType Docker"
        )]
    );
    assert_eq!(errors("Task", &task(docker("/logs/runs"))), []);
    // A raw task's is relative to its working directory.
    let mut raw = raw_task(&["python3"]);
    raw["tensorBoardDir"] = json!("runs");
    assert_eq!(errors("Task", &task(raw)), []);
}

#[test]
fn raw_entrypoint() {
    assert_eq!(
        raw_errors_of(json!({"entrypoint": []})),
        [e(
            "spec.raw.entrypoint",
            Required,
            "at least one element (the program) is required"
        )]
    );
    assert_eq!(
        raw_errors_of(json!({"entrypoint": ["", "x"]})),
        [e(
            "spec.raw.entrypoint[0]",
            Invalid,
            r#""": the program must not be empty"#
        )]
    );
    // Empty arguments are legitimate.
    assert_eq!(
        raw_errors_of(json!({"entrypoint": ["python3", "-c", ""]})),
        []
    );
}

#[test]
fn raw_numbers() {
    assert_eq!(
        raw_errors_of(json!({"entrypoint": ["x"], "replicas": -1})),
        [e(
            "spec.raw.replicas",
            Invalid,
            "-1: must be greater than or equal to 0"
        )]
    );
    assert_eq!(
        raw_errors_of(json!({"entrypoint": ["x"], "replicas": 0})),
        []
    );
    assert_eq!(
        raw_errors_of(json!({"entrypoint": ["x"], "activeDeadlineSeconds": 0})),
        [e(
            "spec.raw.activeDeadlineSeconds",
            Invalid,
            "0: must be greater than or equal to 1"
        )]
    );
    assert_eq!(
        raw_errors_of(json!({"entrypoint": ["x"], "terminationGracePeriodSeconds": -5})),
        [e(
            "spec.raw.terminationGracePeriodSeconds",
            Invalid,
            "-5: must be greater than or equal to 0"
        )]
    );
    assert_eq!(
        raw_errors_of(json!({"entrypoint": ["x"], "activeDeadlineSeconds": 60,
                             "terminationGracePeriodSeconds": 0, "restartPolicy": "OnFailure"})),
        []
    );
    assert_eq!(
        raw_errors_of(json!({"entrypoint": ["x"], "restartPolicy": "Sometimes"})),
        [e(
            "spec.raw.restartPolicy",
            NotSupported,
            r#""Sometimes": supported values: "Never", "OnFailure", "Always""#
        )]
    );
}

#[test]
fn raw_artifact() {
    let sha = "a".repeat(64);
    assert_eq!(
        raw_errors_of(json!({"entrypoint": ["x"], "artifact": "https://h/a.tgz",
                             "artifactSha256": sha})),
        []
    );
    assert_eq!(
        raw_errors_of(json!({"entrypoint": ["x"], "artifact": "file:///srv/a.tgz"})),
        []
    );
    let errs = raw_errors_of(json!({"entrypoint": ["x"], "artifact": "a.tgz"}));
    assert_eq!(errs.len(), 1);
    assert_eq!(
        (errs[0].0.as_str(), errs[0].1),
        ("spec.raw.artifact", Invalid)
    );
    assert!(errs[0].2.starts_with(r#""a.tgz": must be an absolute URL"#));
    assert_eq!(
        raw_errors_of(json!({"entrypoint": ["x"], "artifact": "https://h/a",
                             "artifactSha256": "xyz"})),
        [e(
            "spec.raw.artifactSha256",
            Invalid,
            r#""xyz": must be 64 hexadecimal digits (a SHA-256 digest)"#
        )]
    );
    assert_eq!(
        raw_errors_of(json!({"entrypoint": ["x"], "artifactSha256": sha})),
        [e(
            "spec.raw.artifactSha256",
            Forbidden,
            "may only be set together with artifact"
        )]
    );
}

#[test]
fn raw_environment_and_working_dir() {
    assert_eq!(
        raw_errors_of(json!({"entrypoint": ["x"], "workingDir": "",
                             "environment": [{"name": "OK", "value": "1"}, {"name": ""},
                                             {"name": "A=B"}]})),
        [
            e("spec.raw.environment[1].name", Required, ""),
            e(
                "spec.raw.environment[2].name",
                Invalid,
                r#""A=B": a valid environment variable name must consist only of printable ASCII characters other than '='"#
            ),
            e(
                "spec.raw.workingDir",
                Invalid,
                r#""": must not be empty when set"#
            ),
        ]
    );
}

#[test]
fn resources() {
    let ok = json!({"entrypoint": ["x"], "resources": {
        "requests": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": 1},
        "limits": {"cpu": 2, "memory": "1Gi"}}});
    assert_eq!(raw_errors_of(ok), []);
    let bad = json!({"entrypoint": ["x"], "resources": {
        "requests": {"cpu": "abc", "memory": "-1Gi", "ephemeral": "2", "bad key!": "1"},
        "limits": {"ephemeral": "1"}}});
    assert_eq!(
        raw_errors_of(bad),
        [
            e(
                "spec.raw.resources.requests",
                Invalid,
                r#""bad key!": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"#
            ),
            e(
                "spec.raw.resources.requests[cpu]",
                Invalid,
                r#""abc": quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"#
            ),
            e(
                "spec.raw.resources.requests[memory]",
                Invalid,
                r#""-1Gi": must be greater than or equal to 0"#
            ),
            e(
                "spec.raw.resources.requests[ephemeral]",
                Invalid,
                r#""2": must be less than or equal to ephemeral limit of 1"#
            ),
        ]
    );
    // Docker containers are checked the same way.
    let docker = json!({"agentType": "Docker", "role": "Env", "docker": {"containers": [
        {"name": "c", "image": "busybox", "resources": {"limits": {"memory": "1Q"}}}]}});
    assert_eq!(
        errors("Task", &task(docker))[0].0,
        "spec.docker.containers[0].resources.limits[memory]"
    );
}

#[test]
fn node_selector_and_node_name() {
    let mut spec = raw_task(&["x"]);
    spec["nodeSelector"] =
        json!({"rlark.io/node-category": "edge,cloud", "kubernetes.io/hostname": "n1"});
    spec["nodeName"] = json!("node-1.example");
    assert_eq!(errors("Task", &task(spec.clone())), []);

    spec["nodeSelector"] = json!({"bad key": "x", "k": "edge, cloud"});
    spec["nodeName"] = json!("Node_1");
    let errs = errors("Task", &task(spec));
    let fields: Vec<(&str, &str)> = errs
        .iter()
        .map(|e| (e.0.as_str(), e.2.split(':').next().unwrap_or("")))
        .collect();
    assert_eq!(
        fields,
        [
            ("spec.nodeName", r#""Node_1""#),
            ("spec.nodeSelector", r#""bad key""#),
            ("spec.nodeSelector[k]", r#"" cloud""#),
        ]
    );
}

#[test]
fn docker_block() {
    let docker = |containers: Value| {
        errors(
            "Task",
            &task(
                json!({"agentType": "Docker", "role": "Env", "docker": {"containers": containers}}),
            ),
        )
    };
    assert_eq!(
        docker(
            json!([{"name": "main", "image": "busybox", "command": ["sh"],
                       "volumes": [{"source": "/data", "target": "/data"}],
                       "environment": [{"name": "A", "value": "b"}]}])
        ),
        []
    );
    assert_eq!(
        docker(json!([])),
        [e(
            "spec.docker.containers",
            Required,
            "at least one container is required"
        )]
    );
    assert_eq!(
        docker(json!([
            {"name": "main", "image": "busybox"},
            {"name": "main", "image": " ", "volumes": [{"source": "", "target": "data"}]}
        ])),
        [
            e("spec.docker.containers[1].name", Duplicate, r#""main""#),
            e("spec.docker.containers[1].image", Required, ""),
            e("spec.docker.containers[1].volumes[0].source", Required, ""),
            e(
                "spec.docker.containers[1].volumes[0].target",
                Invalid,
                r#""data": must be an absolute path"#
            ),
        ]
    );
}

#[test]
fn kubernetes_block() {
    let k8s = |workload: Value| {
        errors(
            "Task",
            &task(json!({"agentType": "Kubernetes", "role": "Actor",
                         "kubernetes": {"workload": workload}})),
        )
    };
    let template = json!({"metadata": {"labels": {"app": "x"}},
                          "spec": {"containers": [{"name": "main", "image": "busybox"}]}});
    assert_eq!(
        k8s(
            json!({"kind": "StatefulSet", "replicas": 3, "template": template,
                   "pvcStorageMap": {"data": "standard"}})
        ),
        []
    );
    assert_eq!(
        k8s(json!({"kind": "Deployment", "replicas": -1, "template": template})),
        [e(
            "spec.kubernetes.workload.replicas",
            Invalid,
            "-1: must be greater than or equal to 0"
        )]
    );
    assert_eq!(
        k8s(json!({"kind": "Job", "template": {"spec": {"containers": []}}})),
        [e(
            "spec.kubernetes.workload.template.spec.containers",
            Required,
            "at least one container is required"
        )]
    );
}

#[test]
fn kubernetes_job_template_and_workload_are_exclusive() {
    let k8s = |block: Value| {
        errors(
            "Task",
            &task(json!({"agentType": "Kubernetes", "role": "Actor", "kubernetes": block})),
        )
    };
    let template = "apiVersion: batch/v1\nkind: Job\nspec: {}\n";
    let workload = json!({"kind": "Job",
        "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}});
    assert_eq!(k8s(json!({"jobTemplate": template})), []);
    assert_eq!(
        k8s(json!({"jobTemplate": template, "activeDeadlineSeconds": 600})),
        []
    );
    assert_eq!(
        k8s(json!({"jobTemplate": template, "workload": workload})),
        [e(
            "spec.kubernetes.jobTemplate",
            Invalid,
            "must not be set together with workload: set exactly one of workload and jobTemplate"
        )]
    );
    assert_eq!(
        k8s(json!({})),
        [e(
            "spec.kubernetes.workload",
            Required,
            "exactly one of workload and jobTemplate is required"
        )]
    );
    assert_eq!(
        k8s(json!({"jobTemplate": "  \n"})),
        [e(
            "spec.kubernetes.jobTemplate",
            Required,
            "must not be empty when set"
        )]
    );
    let huge = "x".repeat(crate::validation::MAX_JOB_TEMPLATE_BYTES + 1);
    assert_eq!(
        k8s(json!({"jobTemplate": huge})),
        [e(
            "spec.kubernetes.jobTemplate",
            Invalid,
            &format!(
                "{} bytes: must be at most {} bytes",
                crate::validation::MAX_JOB_TEMPLATE_BYTES + 1,
                crate::validation::MAX_JOB_TEMPLATE_BYTES
            )
        )]
    );
    assert_eq!(
        k8s(json!({"workload": workload, "activeDeadlineSeconds": 0})),
        [e(
            "spec.kubernetes.activeDeadlineSeconds",
            Invalid,
            "0: must be greater than or equal to 1"
        )]
    );
}

// --- Workflow -------------------------------------------------------------------------

#[test]
fn a_workflow_may_list_templates_in_any_order() {
    let wf = workflow_named(
        "train-eval",
        json!([
            wf_template("report", &["eval-a", "eval-b"]),
            wf_template("eval-a", &["train"]),
            wf_template("eval-b", &["train"]),
            wf_template("train", &[]),
        ]),
    );
    assert_eq!(errors("Workflow", &wf), []);
}

#[test]
fn workflow_needs_templates() {
    assert_eq!(
        errors("Workflow", &workflow_named("w", json!([]))),
        [e(
            "spec.jobTemplates",
            Required,
            "at least one job template is required"
        )]
    );
}

#[test]
fn workflow_template_names() {
    let wf = workflow_named(
        "wf",
        json!([wf_template("a", &[]), wf_template("A", &[]), wf_template("a", &[]),
               {"name": "", "spec": {"tasks": [template("main")]}}]),
    );
    assert_eq!(
        errors("Workflow", &wf),
        [
            e(
                "spec.jobTemplates[1].name",
                Invalid,
                &format!(r#""A": {LABEL_MSG}"#)
            ),
            e("spec.jobTemplates[2].name", Duplicate, r#""a""#),
            e("spec.jobTemplates[3].name", Required, ""),
        ]
    );
}

#[test]
fn workflow_child_names_fit_a_label() {
    // "wf-" + 60 = 63 fits as a Job name, but its Task "wf-<60>-main" does not.
    let name = "t".repeat(60);
    let wf = workflow_named("wf", json!([wf_template(&name, &[])]));
    let errs = errors("Workflow", &wf);
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].0, "spec.jobTemplates[0].spec.tasks[0].name");
    assert_eq!(errs[0].1, TooLong);

    let name = "t".repeat(61);
    let wf = workflow_named("wf", json!([wf_template(&name, &[])]));
    let errs = errors("Workflow", &wf);
    assert_eq!(
        errs[0],
        e(
            "spec.jobTemplates[0].name",
            TooLong,
            &format!(
                "the Job name \"wf-{name}\" (<workflow>-<template>) may not be more than 63 characters"
            )
        )
    );
}

#[test]
fn workflow_dependencies_must_exist_and_not_be_self() {
    let wf = workflow_named(
        "wf",
        json!([
            wf_template("a", &["a", "missing", "b", "b"]),
            wf_template("b", &[])
        ]),
    );
    assert_eq!(
        errors("Workflow", &wf),
        [
            e(
                "spec.jobTemplates[0].dependencies[0]",
                Invalid,
                r#""a": a job template may not depend on itself"#
            ),
            e(
                "spec.jobTemplates[0].dependencies[1]",
                Invalid,
                r#""missing": no job template of this workflow has this name"#
            ),
            e("spec.jobTemplates[0].dependencies[3]", Duplicate, r#""b""#),
        ]
    );
}

#[test]
fn workflow_cycles_are_named_in_order() {
    let wf = workflow_named(
        "wf",
        json!([
            wf_template("a", &["b"]),
            wf_template("b", &["c"]),
            wf_template("c", &["a"]),
            wf_template("d", &[]),
        ]),
    );
    assert_eq!(
        one_error("Workflow", &wf),
        "spec.jobTemplates: Invalid value: dependency cycle: a -> b -> c -> a"
    );
    // The cycle is reported from where the search enters it.
    let wf = workflow_named(
        "wf",
        json!([
            wf_template("start", &["x"]),
            wf_template("x", &["y"]),
            wf_template("y", &["x"]),
        ]),
    );
    assert_eq!(
        errors("Workflow", &wf),
        [e(
            "spec.jobTemplates",
            Invalid,
            "dependency cycle: x -> y -> x"
        )]
    );
    // A diamond is not a cycle.
    let wf = workflow_named(
        "wf",
        json!([
            wf_template("d", &["b", "c"]),
            wf_template("b", &["a"]),
            wf_template("c", &["a"]),
            wf_template("a", &[]),
        ]),
    );
    assert_eq!(errors("Workflow", &wf), []);
}

#[test]
fn workflow_job_specs_are_validated() {
    let mut bad = template("main");
    bad["raw"]["entrypoint"] = json!([]);
    let wf = workflow_named(
        "wf",
        json!([{"name": "a", "spec": {"tasks": [bad]}}, {"name": "b", "spec": {}}]),
    );
    assert_eq!(
        errors("Workflow", &wf),
        [
            e(
                "spec.jobTemplates[0].spec.tasks[0].raw.entrypoint",
                Required,
                "at least one element (the program) is required"
            ),
            e(
                "spec.jobTemplates[1].spec.tasks",
                Required,
                "at least one task is required"
            ),
        ]
    );
}

// --- Domain, DomainPeer, Node, Pod ----------------------------------------------------

#[test]
fn domain_cidrs() {
    for ok in [
        "10.88.0.0/16",
        "192.168.0.0/30",
        "10.0.0.0/31",
        "fd00:88::/64",
        "fd00::/127",
    ] {
        assert_eq!(errors("Domain", &domain(ok)), [], "{ok}");
    }
    assert_eq!(
        errors("Domain", &domain("")),
        [e("spec.cidr", Required, "")]
    );
    assert_eq!(
        errors("Domain", &json!({"metadata": {"name": "d"}, "spec": {}})),
        [e("spec.cidr", Required, "")]
    );
    assert_eq!(
        errors("Domain", &domain("10.88.0.0")),
        [e(
            "spec.cidr",
            Invalid,
            r#""10.88.0.0": must be a valid IPv4 or IPv6 CIDR (e.g. '10.88.0.0/16' or 'fd00:88::/64')"#
        )]
    );
    assert_eq!(errors("Domain", &domain("10.88.0.0/33"))[0].0, "spec.cidr");
    assert_eq!(
        errors("Domain", &domain("10.88.1.5/16")),
        [e(
            "spec.cidr",
            Invalid,
            r#""10.88.1.5/16": host bits must be zero; did you mean "10.88.0.0/16"?"#
        )]
    );
    assert_eq!(
        errors("Domain", &domain("fd00::1/64"))[0].2,
        r#""fd00::1/64": host bits must be zero; did you mean "fd00::/64"?"#
    );
    assert_eq!(
        errors("Domain", &domain("10.1.2.3/32")),
        [e(
            "spec.cidr",
            Invalid,
            r#""10.1.2.3/32": a /32 network has 1 usable address; at least 2 are needed"#
        )]
    );
    assert_eq!(errors("Domain", &domain("fd00::1/128")).len(), 1);
}

#[test]
fn domain_job_selectors() {
    let with = |selector: Value| {
        json!({"kind": "Domain", "metadata": {"name": "d"},
               "spec": {"cidr": "10.88.0.0/16", "jobSelector": selector}})
    };
    assert_eq!(
        errors(
            "Domain",
            &with(json!({"matchLabels": {"team": "rl"},
                         "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]},
                                              {"key": "x", "operator": "Exists"}]}))
        ),
        []
    );
    let errs = errors(
        "Domain",
        &with(json!({"matchExpressions": [
            {"key": "tier", "operator": "In"},
            {"key": "x", "operator": "Exists", "values": ["a"]},
            {"key": "y", "operator": "Near", "values": ["a"]},
            {"key": "bad key", "operator": "Exists"}]})),
    );
    assert_eq!(
        errs[..3],
        [
            e(
                "spec.jobSelector.matchExpressions[0].values",
                Required,
                "must be specified when `operator` is 'In' or 'NotIn'"
            ),
            e(
                "spec.jobSelector.matchExpressions[1].values",
                Forbidden,
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
            ),
            e(
                "spec.jobSelector.matchExpressions[2].operator",
                NotSupported,
                r#""Near": supported values: "In", "NotIn", "Exists", "DoesNotExist""#
            ),
        ]
    );
    assert_eq!(errs.len(), 4);
    assert_eq!(
        (errs[3].0.as_str(), errs[3].1),
        ("spec.jobSelector.matchExpressions[3].key", Invalid)
    );
    assert!(errs[3].2.starts_with(r#""bad key": "#), "{}", errs[3].2);
    let bad_value = errors("Domain", &with(json!({"matchLabels": {"team": "not ok!"}})));
    assert_eq!(bad_value.len(), 1);
    assert_eq!(bad_value[0].0, "spec.jobSelector.matchLabels[team]");
}

#[test]
fn usable_address_counts() {
    let n = |s: &str| s.parse::<IpNet>().unwrap();
    assert_eq!(usable_addresses(&n("10.0.0.0/24")), 254);
    assert_eq!(usable_addresses(&n("10.0.0.0/30")), 2);
    assert_eq!(usable_addresses(&n("10.0.0.0/31")), 2);
    assert_eq!(usable_addresses(&n("10.0.0.0/32")), 1);
    assert_eq!(usable_addresses(&n("0.0.0.0/0")), (1u128 << 32) - 2);
    assert_eq!(usable_addresses(&n("fd00::/64")), (1u128 << 64) - 1);
    assert_eq!(usable_addresses(&n("fd00::/127")), 2);
    assert_eq!(usable_addresses(&n("fd00::/128")), 1);
    assert_eq!(usable_addresses(&n("::/0")), u128::MAX - 1);
}

fn peer(spec: Value) -> Value {
    json!({"metadata": {"name": "demo-net", "namespace": "rlark-c1"}, "spec": spec})
}

#[test]
fn domain_peers() {
    let good = peer(json!({"domain": "demo-net", "prefixLen": 16, "pods": [
        {"globalNamespace": "rlark-c1", "namespace": "default", "name": "p", "uid": "u",
         "node": "n1", "ip": "10.88.0.2", "localIP": "172.17.0.5"}]}));
    assert_eq!(errors("DomainPeer", &good), []);
    for (len, ok) in [(0, true), (128, true), (129, false), (-1, false)] {
        let errs = errors(
            "DomainPeer",
            &peer(json!({"domain": "d", "prefixLen": len})),
        );
        assert_eq!(errs.is_empty(), ok, "{len}");
        if !ok {
            assert_eq!(
                errs,
                [e(
                    "spec.prefixLen",
                    Invalid,
                    &format!("{len}: must be between 0 and 128, inclusive")
                )]
            );
        }
    }
    let bad = peer(json!({"domain": "", "prefixLen": 16, "pods": [
        {"ip": "10.88.0.300", "localIP": "x"}, {"ip": ""}]}));
    assert_eq!(
        errors("DomainPeer", &bad),
        [
            e("spec.domain", Required, ""),
            e(
                "spec.pods[0].ip",
                Invalid,
                r#""10.88.0.300": must be a valid IP address"#
            ),
            e(
                "spec.pods[0].localIP",
                Invalid,
                r#""x": must be a valid IP address"#
            ),
            e("spec.pods[1].ip", Required, ""),
        ]
    );
    assert_eq!(
        errors("DomainPeer", &peer(json!({"prefixLen": 16})))[0],
        e("spec.domain", Required, "")
    );
}

#[test]
fn nodes() {
    let node = |status: Value| {
        json!({"metadata": {"name": "worker-1", "namespace": "rlark-c1",
                            "labels": {"rlark.io/node-category": "edge"}},
               "spec": {"agentType": "Raw"}, "status": status})
    };
    let good = node(
        json!({"phase": "Online", "capacity": {"cpu": "8", "memory": "32Gi"},
                           "allocatable": {"cpu": "7500m"}, "used": {"cpu": 1},
                           "nodeInfo": {"architecture": "amd64"},
                           "addresses": [{"type": "InternalIP", "address": "10.0.0.5"}],
                           "heartbeatTime": "2026-01-01T00:00:00Z",
                           "events": [{"type": "Normal", "reason": "Started", "count": 1}],
                           "pullProgress": [{"image": "i", "downloaded": 1, "total": 2,
                                             "speed": 0.5, "status": "Pulling"}]}),
    );
    assert_eq!(errors("Node", &good), []);
    assert_eq!(
        errors("Node", &node(json!({"capacity": {"cpu": "lots"}}))),
        [e(
            "status.capacity[cpu]",
            Invalid,
            r#""lots": quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"#
        )]
    );
    // Reported resources are bounded: the largest amounts pass, one more does not.
    let biggest = node(json!({"capacity": {
        "cpu": "65536", "memory": "1Pi", "ephemeral-storage": "1Ei",
        "hugepages-2Mi": "1Pi", "nvidia.com/gpu": "65536", "rlinf.io/device-arm": "65536"}}));
    assert_eq!(errors("Node", &biggest), []);
    assert_eq!(
        errors(
            "Node",
            &node(json!({"capacity": {"cpu": "65537", "memory": "2Pi"},
                         "allocatable": {"nvidia.com/gpu": "1e9", "ephemeral-storage": "2Ei"},
                         "used": {"rlinf.io/device": "65536001m", "hugepages-1Gi": "1025Ti"}}))
        ),
        [
            e(
                "status.capacity[cpu]",
                Invalid,
                r#""65537": must be at most 65536 (the largest amount of cpu a Node may report)"#
            ),
            e(
                "status.capacity[memory]",
                Invalid,
                r#""2Pi": must be at most 1Pi (the largest amount of memory a Node may report)"#
            ),
            e(
                "status.allocatable[ephemeral-storage]",
                Invalid,
                r#""2Ei": must be at most 1Ei (the largest amount of ephemeral-storage a Node may report)"#
            ),
            e(
                "status.allocatable[nvidia.com/gpu]",
                Invalid,
                r#""1e9": must be at most 65536 (the largest amount of nvidia.com/gpu a Node may report)"#
            ),
            e(
                "status.used[hugepages-1Gi]",
                Invalid,
                r#""1025Ti": must be at most 1Pi (the largest amount of hugepages-1Gi a Node may report)"#
            ),
            e(
                "status.used[rlinf.io/device]",
                Invalid,
                r#""65536001m": must be at most 65536 (the largest amount of rlinf.io/device a Node may report)"#
            ),
        ]
    );
    let many: serde_json::Map<String, Value> = (0..=MAX_NODE_RESOURCE_NAMES)
        .map(|i| (format!("example.com/r{i}"), json!("1")))
        .collect();
    assert_eq!(
        errors("Node", &node(json!({"capacity": many}))),
        [e(
            "status.capacity",
            TooLong,
            &format!(
                "may not have more than {MAX_NODE_RESOURCE_NAMES} resources, has {}",
                MAX_NODE_RESOURCE_NAMES + 1
            )
        )]
    );
    let mut bad = node(json!({}));
    bad["spec"]["agentType"] = json!("Podman");
    assert_eq!(
        errors("Node", &bad),
        [e(
            "spec.agentType",
            NotSupported,
            r#""Podman": supported values: "Kubernetes", "Docker", "Raw""#
        )]
    );
}

#[test]
fn pods() {
    let pod = |spec: Value, status: Value| {
        json!({"metadata": {"name": "0b8f7c1e-4a5d-4d7e-9a53-6c2f1b0e9d11", "namespace": "rlark-c1"},
               "spec": spec, "status": status})
    };
    let good = pod(
        json!({"domain": "demo-net", "taskNamespace": "rlark-c1", "taskName": "ppo-train-actor",
               "podNamespace": "default", "podName": "ppo-train-actor-0", "replicaIndex": 0}),
        json!({"phase": "Succeeded", "node": "n1", "ip": "10.0.0.7", "exitCode": 0,
               "restartCount": 0, "startTime": "2026-01-01T00:00:00Z"}),
    );
    assert_eq!(errors("Pod", &good), []);
    let bad = pod(
        json!({"replicaIndex": -1, "taskName": "Bad_Task"}),
        json!({"ip": "nope", "restartCount": -2, "phase": "Stopped"}),
    );
    assert_eq!(
        errors("Pod", &bad),
        [e(
            "status.phase",
            NotSupported,
            r#""Stopped": supported values: "Pending", "Running", "Succeeded", "Failed""#
        )]
    );
    let bad = pod(
        json!({"replicaIndex": -1, "taskName": "Bad_Task"}),
        json!({"ip": "nope", "restartCount": -2}),
    );
    let fields: Vec<String> = errors("Pod", &bad).into_iter().map(|e| e.0).collect();
    assert_eq!(
        fields,
        [
            "spec.taskName",
            "spec.replicaIndex",
            "status.ip",
            "status.restartCount"
        ]
    );
}

// --- typed entry points ---------------------------------------------------------------

#[test]
fn typed_validators_agree() {
    let j: Job = decode(&job(json!([template("Bad")]))).unwrap();
    let errs = validate_job(&j).unwrap_err();
    assert_eq!(errs[0].field, "spec.tasks[0].name");

    let empty = Job::new("j", JobSpec::default());
    assert_eq!(validate_job(&empty).unwrap_err()[0].field, "spec.tasks");

    let d: Domain = decode(&domain("10.88.0.0/16")).unwrap();
    assert_eq!(validate_domain(&d), Ok(()));
}

#[test]
fn typed_objects_serialize_back_to_what_validates() {
    let original = job(json!([template("actor")]));
    let typed: Job = decode(&original).unwrap();
    let back = serde_json::to_value(&typed).unwrap();
    assert_eq!(back["apiVersion"], "rlinf.io/v1alpha1");
    assert_eq!(back["kind"], "Job");
    assert_eq!(back["spec"]["tasks"][0]["raw"]["replicas"], 1);
    assert_eq!(back["spec"]["tasks"][0]["raw"]["restartPolicy"], "Never");
    assert!(back["spec"]["tasks"][0].get("head").is_none());
    assert_eq!(validate("Job", &back), Ok(()));
}

// --- envFrom.input ------------------------------------------------------------------

fn env_from_errors_of(input: Value, vars: Value) -> Vec<(String, FieldErrorKind, String)> {
    let mut spec = raw_task(&["x"]);
    if !input.is_null() {
        spec["input"] = input;
    }
    spec["envFrom"] = json!({"input": vars});
    errors("Task", &task(spec))
}

#[test]
fn env_from_input_is_accepted_when_every_path_finds_a_value() {
    let input = json!({"question": "2+2", "n": 4, "meta": {"tags": ["a", "b"]}, "odd key": null});
    let vars = json!([
        {"name": "QUESTION", "path": "$.question"},
        {"name": "_n", "path": "$['n']"},
        {"name": "TAG0", "path": "$.meta.tags[0]"},
        {"name": "WHOLE", "path": "$"},
        {"name": "NULLED", "path": "$['odd key']"},
    ]);
    assert_eq!(env_from_errors_of(input, vars), []);
}

#[test]
fn env_from_input_names() {
    let input = json!({"a": 1});
    let vars = json!([
        {"name": "", "path": "$.a"},
        {"name": "1ST", "path": "$.a"},
        {"name": "A-B", "path": "$.a"},
        {"name": "RLARK_RANK", "path": "$.a"},
        {"name": "OK", "path": "$.a"},
        {"name": "OK", "path": "$.a"},
        {"name": "rlark_lower", "path": "$.a"},
    ]);
    let regex_msg = "a valid environment variable name must consist of letters, digits and '_', \
                     and must not start with a digit (regex used for validation is \
                     '[A-Za-z_][A-Za-z0-9_]*')";
    assert_eq!(
        env_from_errors_of(input, vars),
        [
            e("spec.envFrom.input[0].name", Required, ""),
            e(
                "spec.envFrom.input[1].name",
                Invalid,
                &format!("\"1ST\": {regex_msg}")
            ),
            e(
                "spec.envFrom.input[2].name",
                Invalid,
                &format!("\"A-B\": {regex_msg}")
            ),
            e(
                "spec.envFrom.input[3].name",
                Invalid,
                r#""RLARK_RANK": names starting with RLARK_ are reserved for the variables rlark sets"#
            ),
            e("spec.envFrom.input[5].name", Duplicate, r#""OK""#),
        ]
    );
}

#[test]
fn env_from_input_paths() {
    let input = json!({"a": {"b": [1]}});
    let vars = json!([
        {"name": "EMPTY", "path": ""},
        {"name": "NO_DOLLAR", "path": "a.b"},
        {"name": "OPEN", "path": "$.a[0"},
        {"name": "MISSING", "path": "$.a.c"},
        {"name": "PAST_END", "path": "$.a.b[1]"},
        {"name": "FOUND", "path": "$.a.b[0]"},
    ]);
    assert_eq!(
        env_from_errors_of(input, vars),
        [
            e(
                "spec.envFrom.input[0].path",
                Required,
                "a JSONPath such as '$.key'"
            ),
            e(
                "spec.envFrom.input[1].path",
                Invalid,
                r#""a.b": a path must start with '$' at character 0"#
            ),
            e(
                "spec.envFrom.input[2].path",
                Invalid,
                r#""$.a[0": expected ']' at character 5"#
            ),
            e(
                "spec.envFrom.input[3].path",
                Invalid,
                r#""$.a.c": matches nothing in spec.input"#
            ),
            e(
                "spec.envFrom.input[4].path",
                Invalid,
                r#""$.a.b[1]": matches nothing in spec.input"#
            ),
        ]
    );
    assert_eq!(
        env_from_errors_of(Value::Null, json!([{"name": "X", "path": "$.a"}])),
        [e(
            "spec.envFrom.input[0].path",
            Invalid,
            r#""$.a": spec.input is not set"#
        )]
    );
}

#[test]
fn env_from_input_in_job_templates_names_the_template() {
    let mut t = template("rollout");
    t["input"] = json!({"q": "x"});
    t["envFrom"] = json!({"input": [{"name": "Q", "path": "$.q"}, {"name": "R", "path": "$.r"}]});
    assert_eq!(
        errors("Job", &job(json!([t.clone()]))),
        [e(
            "spec.tasks[0].envFrom.input[1].path",
            Invalid,
            r#""$.r": matches nothing in spec.tasks[0].input"#
        )]
    );
    // A missing field inside a flattened template is still found at its exact path.
    t["envFrom"] = json!({"input": [{"name": "Q"}]});
    assert_eq!(
        errors("Job", &job(json!([t]))),
        [e("spec.tasks[0].envFrom.input[0].path", Required, "")]
    );
}

#[test]
fn agent_type_left_out_is_inferred_or_refused_naming_the_blocks() {
    // Defaulted (as the API server does before validating): valid.
    let mut job_value = job(json!([{"name": "a", "role": "Actor", "raw": {"entrypoint": ["x"]}}]));
    crate::defaults::default_agent_types("Job", &mut job_value);
    assert_eq!(errors("Job", &job_value), []);

    let refused = job(json!([
        {"name": "a", "role": "Actor"},
        {"name": "b", "role": "Actor", "raw": {"entrypoint": ["x"]},
         "docker": {"containers": [{"name": "c", "image": "busybox"}]}},
    ]));
    assert_eq!(
        errors("Job", &refused),
        [
            e(
                "spec.tasks[0].agentType",
                Required,
                "agentType is not set and cannot be inferred: the spec has none of the runtime \
                 blocks kubernetes, docker, raw; set one of them"
            ),
            e(
                "spec.tasks[1].agentType",
                Required,
                "agentType is not set and cannot be inferred: the spec has several runtime \
                 blocks (docker, raw); keep one, or set agentType and keep only its block"
            ),
        ]
    );
}

#[test]
fn docker_run_limits_have_the_raw_ranges() {
    let spec = json!({"agentType": "Docker", "role": "Env", "docker": {
        "containers": [{"name": "c", "image": "busybox"}],
        "restartPolicy": "OnFailure",
        "activeDeadlineSeconds": 0,
        "terminationGracePeriodSeconds": -1,
    }});
    let found = errors("Task", &task(spec));
    let fields: Vec<&str> = found.iter().map(|(f, _, _)| f.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.docker.activeDeadlineSeconds",
            "spec.docker.terminationGracePeriodSeconds"
        ]
    );
    let good = json!({"agentType": "Docker", "role": "Env", "docker": {
        "containers": [{"name": "c", "image": "busybox"}],
        "activeDeadlineSeconds": 5,
        "terminationGracePeriodSeconds": 0,
    }});
    assert_eq!(errors("Task", &task(good)), []);
}

#[test]
fn job_access_entries_name_one_user_or_group() {
    let mut ok = job(json!([template("x")]));
    ok["spec"]["access"] = json!([{"user": "alice"}, {"group": "ml-team"}]);
    assert!(errors("Job", &ok).is_empty(), "{:?}", errors("Job", &ok));

    let mut bad = job(json!([template("x")]));
    bad["spec"]["access"] = json!([
        {"user": "alice", "group": "ml"},
        {},
        {"user": ""},
        {"group": "two words"},
    ]);
    let found: Vec<String> = errors("Job", &bad).into_iter().map(|e| e.0).collect();
    assert_eq!(
        found,
        [
            "spec.access[0]",
            "spec.access[1]",
            "spec.access[2].user",
            "spec.access[3].group"
        ]
    );

    let mut many = job(json!([template("x")]));
    many["spec"]["access"] = Value::Array(
        (0..=crate::types::MAX_JOB_ACCESS_ENTRIES)
            .map(|i| json!({"user": format!("u{i}")}))
            .collect(),
    );
    assert!(one_error("Job", &many).contains("at most 256"));
}
