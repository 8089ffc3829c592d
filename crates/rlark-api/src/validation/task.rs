//! Checks of a Task's spec: the `raw` and `kubernetes` blocks, `envFrom`, run limits and Pod
//! templates; also the task templates of Jobs.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::PodSpec;
use serde_json::Value;

use super::checks::{
    NameRule, check_env, check_metadata, check_name, check_range, check_ref, check_resources,
};
use super::{
    FieldError, MAX_ACTIVE_DEADLINE_SECONDS, MAX_PORT, MAX_REPLICAS,
    MAX_TERMINATION_GRACE_PERIOD_SECONDS, RLARK_ENV_PREFIX,
};
use crate::names;
use crate::types::task::{InputPath, TaskEnvFrom};
use crate::types::{KubernetesTaskSpec, RawTaskSpec, Task, TaskSpec};

/// Largest `kubernetes.jobTemplate`, in bytes: far more than any Job needs, small enough
/// that rendering it cannot load the agent.
pub const MAX_JOB_TEMPLATE_BYTES: usize = 256 * 1024;

/// Checks a `kubernetes` block found at `path`: exactly one of `workload` and
/// `jobTemplate`, and each of them.
fn kubernetes_errors(errs: &mut Vec<FieldError>, path: &str, k: &KubernetesTaskSpec) {
    match (&k.workload, &k.job_template) {
        (Some(_), Some(_)) => errs.push(FieldError::invalid(
            format!("{path}.jobTemplate"),
            "must not be set together with workload: set exactly one of workload and jobTemplate",
        )),
        (None, None) => errs.push(FieldError::required(
            format!("{path}.workload"),
            "exactly one of workload and jobTemplate is required",
        )),
        _ => {}
    }
    if let Some(template) = &k.job_template {
        let field = format!("{path}.jobTemplate");
        if template.trim().is_empty() {
            errs.push(FieldError::required(field, "must not be empty when set"));
        } else if template.len() > MAX_JOB_TEMPLATE_BYTES {
            errs.push(FieldError::invalid(
                field,
                format!(
                    "{} bytes: must be at most {MAX_JOB_TEMPLATE_BYTES} bytes",
                    template.len()
                ),
            ));
        }
    }
    if let Some(seconds) = k.active_deadline_seconds {
        check_range(
            errs,
            &format!("{path}.activeDeadlineSeconds"),
            seconds,
            1,
            i64::MAX,
        );
    }
    let Some(workload) = &k.workload else {
        return;
    };
    let wl = format!("{path}.workload");
    if let Some(replicas) = workload.replicas {
        check_range(
            errs,
            &format!("{wl}.replicas"),
            replicas.into(),
            0,
            MAX_REPLICAS,
        );
    }
    if let Some(pod) = &workload.template.spec {
        pod_template_errors(errs, &format!("{wl}.template.spec"), pod);
    }
    let has_containers = workload
        .template
        .spec
        .as_ref()
        .is_some_and(|s| !s.containers.is_empty());
    if !has_containers {
        errs.push(FieldError::required(
            format!("{wl}.template.spec.containers"),
            "at least one container is required",
        ));
    }
    for claim in workload.pvc_storage_map.keys() {
        check_name(
            errs,
            &format!("{wl}.pvcStorageMap"),
            claim,
            NameRule::Subdomain,
        );
    }
}

/// Checks a [`TaskSpec`] found at `path` (`spec` of a Task, `spec.tasks[i]` of a Job).
pub(super) fn task_spec_errors(errs: &mut Vec<FieldError>, path: &str, spec: &TaskSpec) {
    let block = spec.agent_type.block_name();
    if spec.runtime_blocks() != [block] {
        errs.push(FieldError::invalid(
            path,
            format!(
                "agentType {} requires the {block:?} block and no other",
                spec.agent_type
            ),
        ));
    }
    check_ref(errs, &format!("{path}.domain"), spec.domain.as_deref());
    if let Some(node) = spec.node_name.as_deref() {
        let field = format!("{path}.nodeName");
        if node.is_empty() {
            errs.push(FieldError::invalid(
                field,
                "\"\": must not be empty when set",
            ));
        } else {
            check_name(errs, &field, node, NameRule::Subdomain);
        }
    }
    let selector_path = format!("{path}.nodeSelector");
    for (key, value) in &spec.node_selector {
        for msg in names::qualified_name_errors(key) {
            errs.push(FieldError::invalid(
                &selector_path,
                format!("{key:?}: {msg}"),
            ));
        }
        for alternative in value.split(',') {
            for msg in names::label_value_errors(alternative) {
                errs.push(FieldError::invalid(
                    format!("{selector_path}[{key}]"),
                    format!("{alternative:?}: {msg}"),
                ));
            }
        }
    }

    // In a container the log directory is a path of the container's file system: relative to
    // nothing the agent knows (raw replicas resolve it against their working directory).
    if let Some(dir) = spec.tensor_board_dir.as_deref().filter(|d| !d.is_empty())
        && spec.agent_type != crate::types::AgentType::Raw
        && !dir.starts_with('/')
    {
        errs.push(FieldError::invalid(
            format!("{path}.tensorBoardDir"),
            format!(
                "{dir:?}: must be an absolute path in the container for agentType {}",
                spec.agent_type
            ),
        ));
    }
    if let Some(k) = &spec.kubernetes {
        kubernetes_errors(errs, &format!("{path}.kubernetes"), k);
    }

    if let Some(docker) = &spec.docker {
        run_limits_errors(
            errs,
            &format!("{path}.docker"),
            docker.active_deadline_seconds,
            docker.termination_grace_period_seconds,
        );
        let dp = format!("{path}.docker.containers");
        if docker.containers.is_empty() {
            errs.push(FieldError::required(
                &dp,
                "at least one container is required",
            ));
        }
        let mut seen = HashSet::new();
        for (i, c) in docker.containers.iter().enumerate() {
            let cp = format!("{dp}[{i}]");
            if c.name.is_empty() {
                errs.push(FieldError::required(format!("{cp}.name"), ""));
            } else {
                check_name(errs, &format!("{cp}.name"), &c.name, NameRule::Label);
                if !seen.insert(c.name.as_str()) {
                    errs.push(FieldError::duplicate(format!("{cp}.name"), &c.name));
                }
            }
            if c.image.trim().is_empty() {
                errs.push(FieldError::required(format!("{cp}.image"), ""));
            }
            check_env(errs, &format!("{cp}.environment"), &c.environment);
            for (j, v) in c.volumes.iter().enumerate() {
                let vp = format!("{cp}.volumes[{j}]");
                if v.source.is_empty() {
                    errs.push(FieldError::required(format!("{vp}.source"), ""));
                }
                if v.target.is_empty() {
                    errs.push(FieldError::required(format!("{vp}.target"), ""));
                } else if !v.target.starts_with('/') {
                    errs.push(FieldError::invalid(
                        format!("{vp}.target"),
                        format!("{:?}: must be an absolute path", v.target),
                    ));
                }
            }
            if let Some(res) = &c.resources {
                check_resources(errs, &format!("{cp}.resources"), res);
            }
        }
    }

    if let Some(raw) = &spec.raw {
        raw_errors(errs, &format!("{path}.raw"), raw);
    }
    if let Some(env_from) = &spec.env_from {
        env_from_errors(errs, path, env_from, spec.input.as_ref());
    }
}

/// A POSIX-portable environment variable name: `[A-Za-z_][A-Za-z0-9_]*`.
fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// `envFrom.input` of the TaskSpec at `path`: names are portable environment names outside
/// rlark's `RLARK_` prefix and unique; paths parse and select a value of `input`.
fn env_from_errors(
    errs: &mut Vec<FieldError>,
    path: &str,
    env_from: &TaskEnvFrom,
    input: Option<&Value>,
) {
    let mut seen = HashSet::new();
    for (i, var) in env_from.input.iter().enumerate() {
        let ep = format!("{path}.envFrom.input[{i}]");
        let name_field = format!("{ep}.name");
        let name = var.name.as_str();
        if name.is_empty() {
            errs.push(FieldError::required(name_field, ""));
        } else if !is_env_name(name) {
            errs.push(FieldError::invalid(
                name_field,
                format!(
                    "{name:?}: a valid environment variable name must consist of letters, digits \
                     and '_', and must not start with a digit (regex used for validation is \
                     '[A-Za-z_][A-Za-z0-9_]*')"
                ),
            ));
        } else if name.starts_with(RLARK_ENV_PREFIX) {
            errs.push(FieldError::invalid(
                name_field,
                format!(
                    "{name:?}: names starting with {RLARK_ENV_PREFIX} are reserved for the \
                     variables rlark sets"
                ),
            ));
        } else if !seen.insert(name) {
            errs.push(FieldError::duplicate(name_field, name));
        }
        let path_field = format!("{ep}.path");
        let text = var.path.as_str();
        if text.is_empty() {
            errs.push(FieldError::required(
                path_field,
                "a JSONPath such as '$.key'",
            ));
            continue;
        }
        match InputPath::parse(text) {
            Err(error) => errs.push(FieldError::invalid(
                path_field,
                format!("{text:?}: {error}"),
            )),
            Ok(parsed) => match input {
                None => errs.push(FieldError::invalid(
                    path_field,
                    format!("{text:?}: {path}.input is not set"),
                )),
                Some(input) if parsed.lookup(input).is_none() => {
                    errs.push(FieldError::invalid(
                        path_field,
                        format!("{text:?}: matches nothing in {path}.input"),
                    ));
                }
                Some(_) => {}
            },
        }
    }
}

fn is_absolute_url(s: &str) -> bool {
    match s.split_once("://") {
        Some((scheme, rest)) => {
            let mut chars = scheme.chars();
            chars.next().is_some_and(|c| c.is_ascii_alphabetic())
                && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
                && !rest.is_empty()
                && !s.chars().any(char::is_whitespace)
        }
        None => false,
    }
}

/// The ranges of `activeDeadlineSeconds` and `terminationGracePeriodSeconds` of the
/// `raw` or `docker` block at `path`.
fn run_limits_errors(
    errs: &mut Vec<FieldError>,
    path: &str,
    active_deadline_seconds: Option<i64>,
    termination_grace_period_seconds: Option<i64>,
) {
    if let Some(deadline) = active_deadline_seconds {
        check_range(
            errs,
            &format!("{path}.activeDeadlineSeconds"),
            deadline,
            1,
            MAX_ACTIVE_DEADLINE_SECONDS,
        );
    }
    if let Some(grace) = termination_grace_period_seconds {
        check_range(
            errs,
            &format!("{path}.terminationGracePeriodSeconds"),
            grace,
            0,
            MAX_TERMINATION_GRACE_PERIOD_SECONDS,
        );
    }
}

fn raw_errors(errs: &mut Vec<FieldError>, rp: &str, raw: &RawTaskSpec) {
    match raw.entrypoint.first() {
        None => errs.push(FieldError::required(
            format!("{rp}.entrypoint"),
            "at least one element (the program) is required",
        )),
        Some(program) if program.is_empty() => errs.push(FieldError::invalid(
            format!("{rp}.entrypoint[0]"),
            "\"\": the program must not be empty",
        )),
        Some(_) => {}
    }
    if let Some(artifact) = raw.artifact.as_deref()
        && !is_absolute_url(artifact)
    {
        errs.push(FieldError::invalid(
            format!("{rp}.artifact"),
            format!(
                "{artifact:?}: must be an absolute URL (e.g. 'https://host/path/app.tar.gz' or 'file:///srv/app.tar.gz')"
            ),
        ));
    }
    if let Some(sha) = raw.artifact_sha256.as_deref() {
        let field = format!("{rp}.artifactSha256");
        if raw.artifact.is_none() {
            errs.push(FieldError::forbidden(
                &field,
                "may only be set together with artifact",
            ));
        }
        if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
            errs.push(FieldError::invalid(
                field,
                format!("{sha:?}: must be 64 hexadecimal digits (a SHA-256 digest)"),
            ));
        }
    }
    check_env(errs, &format!("{rp}.environment"), &raw.environment);
    if raw.working_dir.as_deref() == Some("") {
        errs.push(FieldError::invalid(
            format!("{rp}.workingDir"),
            "\"\": must not be empty when set",
        ));
    }
    check_range(
        errs,
        &format!("{rp}.replicas"),
        raw.replicas.into(),
        0,
        MAX_REPLICAS,
    );
    run_limits_errors(
        errs,
        rp,
        raw.active_deadline_seconds,
        raw.termination_grace_period_seconds,
    );
    if let Some(res) = &raw.resources {
        check_resources(errs, &format!("{rp}.resources"), res);
    }
    // 2^32 - 1 is `(uid_t) -1`, "no change" to setuid(2): never a user.
    for (field, id) in [
        ("runAsUser", raw.run_as_user),
        ("runAsGroup", raw.run_as_group),
    ] {
        if let Some(id) = id {
            check_range(errs, &format!("{rp}.{field}"), id, 0, 4_294_967_294);
        }
    }
    if raw.run_as_group.is_some() && raw.run_as_user.is_none() {
        errs.push(FieldError::invalid(
            format!("{rp}.runAsGroup"),
            "set without runAsUser: a group is chosen with the user",
        ));
    }
}

/// The durations and ports of a Kubernetes workload's Pod template (what a member cluster
/// would refuse anyway, refused here with the same bounds before anything is placed).
fn pod_template_errors(errs: &mut Vec<FieldError>, path: &str, pod: &PodSpec) {
    if let Some(deadline) = pod.active_deadline_seconds {
        check_range(
            errs,
            &format!("{path}.activeDeadlineSeconds"),
            deadline,
            1,
            MAX_ACTIVE_DEADLINE_SECONDS,
        );
    }
    if let Some(grace) = pod.termination_grace_period_seconds {
        check_range(
            errs,
            &format!("{path}.terminationGracePeriodSeconds"),
            grace,
            0,
            MAX_TERMINATION_GRACE_PERIOD_SECONDS,
        );
    }
    let containers = [
        ("containers", pod.containers.as_slice()),
        (
            "initContainers",
            pod.init_containers.as_deref().unwrap_or_default(),
        ),
    ];
    for (list, containers) in containers {
        for (i, container) in containers.iter().enumerate() {
            for (j, port) in container.ports.iter().flatten().enumerate() {
                let pp = format!("{path}.{list}[{i}].ports[{j}]");
                check_range(
                    errs,
                    &format!("{pp}.containerPort"),
                    port.container_port.into(),
                    1,
                    MAX_PORT,
                );
                if let Some(host) = port.host_port {
                    check_range(errs, &format!("{pp}.hostPort"), host.into(), 1, MAX_PORT);
                }
            }
        }
    }
}

pub(super) fn task_errors(task: &Task) -> Vec<FieldError> {
    let mut errs = Vec::new();
    check_metadata(&mut errs, &task.metadata, NameRule::Subdomain);
    task_spec_errors(&mut errs, "spec", &task.spec);
    errs
}
