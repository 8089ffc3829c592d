//! Admission validation of `rlinf.io/v1alpha1` objects, with Kubernetes-style field errors.
//!
//! Entry point: [`validate`]. It decodes the JSON object into its typed struct (a decoding
//! failure is reported as one [`FieldError`] at the path where it failed) and then runs every
//! semantic check, collecting all errors rather than stopping at the first.
//!
//! Field paths are Kubernetes-style JSON paths: `spec.tasks[1].name`; map entries are
//! written `requests[cpu]` by the semantic checks (decoding errors write `requests.cpu`).
//!
//! Not checked here (the API server's job): `apiVersion`/`kind`, unknown fields (pruned by
//! the schema), label/annotation syntax, immutability on update, and whether a namespaced
//! object's namespace matches the request.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::names;
use crate::types::task::{InputPath, TaskEnvFrom};
use crate::types::{
    Domain, DomainPeer, EnvVar, Job, JobSpec, KINDS, KubernetesTaskSpec, Node, Pod, RawTaskSpec,
    ResourceList, ResourceRequirements, Task, TaskSpec, Workflow,
};

/// Prefix of the environment variables rlark sets for a task's processes; `envFrom.input`
/// may not name one.
pub const RLARK_ENV_PREFIX: &str = "RLARK_";

pub use crate::quantity::{QuantityError, QuantityValue, parse_quantity};

/// Largest `activeDeadlineSeconds` admitted (365 days), in the `raw` block and in a
/// Kubernetes workload's Pod template. A deadline is added to a clock reading: the bound
/// keeps that sum far from any overflow and refuses values that can only be mistakes.
pub const MAX_ACTIVE_DEADLINE_SECONDS: i64 = 365 * 24 * 3600;

/// Largest `terminationGracePeriodSeconds` admitted (one day): how long a stop may wait
/// between SIGTERM and SIGKILL.
pub const MAX_TERMINATION_GRACE_PERIOD_SECONDS: i64 = 24 * 3600;

/// Largest replica count of one Task (`raw.replicas`, `kubernetes.workload.replicas`); the
/// scheduler, the agents and the controllers hold per-replica state.
pub const MAX_REPLICAS: i64 = 10_000;

/// Largest TCP/UDP port number (container and host ports of a Pod template start at 1).
pub const MAX_PORT: i64 = 65_535;

/// What is wrong with a field; each maps to a Kubernetes `metav1.CauseType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldErrorKind {
    /// The value is malformed or breaks a rule (`FieldValueInvalid`).
    Invalid,
    /// A needed value is missing or empty (`FieldValueRequired`).
    Required,
    /// The value is not one of an enumerated set (`FieldValueNotSupported`).
    NotSupported,
    /// The value repeats one that must be unique (`FieldValueDuplicate`).
    Duplicate,
    /// The field may not be set (here, or together with another) (`FieldValueForbidden`).
    Forbidden,
    /// The value is longer than allowed (`FieldValueTooLong`).
    TooLong,
    /// The value names an object that does not exist (`FieldValueNotFound`).
    NotFound,
}

impl FieldErrorKind {
    /// Kubernetes `CauseType` string, for `Status.details.causes[].reason`.
    pub fn cause_type(&self) -> &'static str {
        match self {
            FieldErrorKind::Invalid => "FieldValueInvalid",
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::NotSupported => "FieldValueNotSupported",
            FieldErrorKind::Duplicate => "FieldValueDuplicate",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::TooLong => "FieldValueTooLong",
            FieldErrorKind::NotFound => "FieldValueNotFound",
        }
    }

    /// Kubernetes' wording that starts an error body (`Invalid value`, `Required value`, ...).
    pub fn label(&self) -> &'static str {
        match self {
            FieldErrorKind::Invalid => "Invalid value",
            FieldErrorKind::Required => "Required value",
            FieldErrorKind::NotSupported => "Unsupported value",
            FieldErrorKind::Duplicate => "Duplicate value",
            FieldErrorKind::Forbidden => "Forbidden",
            FieldErrorKind::TooLong => "Too long",
            FieldErrorKind::NotFound => "Not found",
        }
    }
}

/// One problem with one field of an object.
///
/// `message` is what follows the kind's label in Kubernetes' error body; it starts with the
/// quoted bad value where Kubernetes shows one (`"Foo": supported values: "Actor", ...`).
/// [`FieldError::body`] is the `Status` cause message and `Display` is `field: body`, e.g.
/// `spec.role: Unsupported value: "Foo": supported values: "Actor", "Rollout", "Env"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path of the field, e.g. `spec.tasks[1].name` (empty for the whole object).
    pub field: String,
    /// What is wrong.
    pub kind: FieldErrorKind,
    /// Detail (may be empty, e.g. for a plain `Required value`).
    pub message: String,
}

impl FieldError {
    /// A new error.
    pub fn new(field: impl Into<String>, kind: FieldErrorKind, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind,
            message: message.into(),
        }
    }

    /// `Invalid value: <message>`.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(field, FieldErrorKind::Invalid, message)
    }

    /// `Required value[: <message>]`.
    pub fn required(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(field, FieldErrorKind::Required, message)
    }

    /// `Unsupported value: "<value>": supported values: "a", "b"`.
    pub fn not_supported(field: impl Into<String>, value: &str, supported: &[&str]) -> Self {
        let message = if supported.is_empty() {
            format!("{value:?}")
        } else {
            format!(
                "{value:?}: supported values: {}",
                crate::types::quoted_list(supported)
            )
        };
        Self::new(field, FieldErrorKind::NotSupported, message)
    }

    /// `Duplicate value: "<value>"`.
    pub fn duplicate(field: impl Into<String>, value: &str) -> Self {
        Self::new(field, FieldErrorKind::Duplicate, format!("{value:?}"))
    }

    /// `Forbidden: <message>`.
    pub fn forbidden(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(field, FieldErrorKind::Forbidden, message)
    }

    /// `Too long: <message>`.
    pub fn too_long(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(field, FieldErrorKind::TooLong, message)
    }

    /// Kubernetes `CauseType` string of [`FieldError::kind`].
    pub fn cause_type(&self) -> &'static str {
        self.kind.cause_type()
    }

    /// Kubernetes' error body: `<label>` or `<label>: <message>`.
    pub fn body(&self) -> String {
        if self.message.is_empty() {
            self.kind.label().to_string()
        } else {
            format!("{}: {}", self.kind.label(), self.message)
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

impl std::error::Error for FieldError {}

/// Kubernetes' `Status.message` for a rejected object:
/// `Job.rlinf.io "x" is invalid: <error>` for one error, `... is invalid: [<e1>, <e2>]` for
/// several.
pub fn invalid_message(kind: &str, name: &str, errors: &[FieldError]) -> String {
    let list = match errors {
        [one] => one.to_string(),
        many => format!(
            "[{}]",
            many.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    format!("{kind}.{} {name:?} is invalid: {list}", crate::GROUP)
}

/// Validates `object` (a full object: `metadata`, `spec`, optional `status`) as a `kind`
/// of `rlinf.io/v1alpha1`.
///
/// Contract: `kind` is one of [`KINDS`] (else one `kind` NotSupported error). The object is
/// first decoded into its typed struct; if that fails, the result is exactly one error at
/// the failing path (enum values → NotSupported, missing fields → Required, others →
/// Invalid); a task spec without `agentType` that [`crate::defaults::default_agent_types`]
/// could not fill in gives one Required error per such spec instead, naming its runtime
/// blocks. Otherwise every semantic rule of the kind is checked and all violations are
/// returned, in a deterministic order. `Ok(())` means the object may be stored.
pub fn validate(kind: &str, object: &Value) -> Result<(), Vec<FieldError>> {
    // A task spec still without `agentType` after defaulting would otherwise fail to decode
    // with serde's bare "missing field"; say why it could not be inferred instead.
    let missing = missing_agent_type_errors(kind, object);
    if !missing.is_empty() {
        return Err(missing);
    }
    let errors = match kind {
        "Domain" => decode_then(object, domain_errors),
        "DomainPeer" => decode_then(object, domain_peer_errors),
        "Node" => decode_then(object, node_errors),
        "Job" => decode_then(object, job_errors),
        "Task" => decode_then(object, task_errors),
        "Workflow" => decode_then(object, workflow_errors),
        "Pod" => decode_then(object, pod_errors),
        other => vec![FieldError::not_supported("kind", other, KINDS)],
    };
    into_result(errors)
}

/// One Required error per task spec of `object` that has no `agentType` and none or
/// several runtime blocks ([`crate::defaults::undefaulted`]), at its `agentType`, naming
/// the blocks.
fn missing_agent_type_errors(kind: &str, object: &Value) -> Vec<FieldError> {
    crate::defaults::undefaulted(kind, object)
        .into_iter()
        .map(|spec| {
            let message = if spec.blocks.is_empty() {
                "agentType is not set and cannot be inferred: the spec has none of the \
                 runtime blocks kubernetes, docker, raw; set one of them"
                    .to_string()
            } else {
                format!(
                    "agentType is not set and cannot be inferred: the spec has several \
                     runtime blocks ({}); keep one, or set agentType and keep only its block",
                    spec.blocks.join(", ")
                )
            };
            FieldError::required(format!("{}.agentType", spec.path), message)
        })
        .collect()
}

/// Semantic checks of a decoded Domain (what [`validate`] runs after decoding).
pub fn validate_domain(domain: &Domain) -> Result<(), Vec<FieldError>> {
    into_result(domain_errors(domain))
}

/// Semantic checks of a decoded DomainPeer.
pub fn validate_domain_peer(peer: &DomainPeer) -> Result<(), Vec<FieldError>> {
    into_result(domain_peer_errors(peer))
}

/// Semantic checks of a decoded Node.
pub fn validate_node(node: &Node) -> Result<(), Vec<FieldError>> {
    into_result(node_errors(node))
}

/// Semantic checks of a decoded Job.
pub fn validate_job(job: &Job) -> Result<(), Vec<FieldError>> {
    into_result(job_errors(job))
}

/// Semantic checks of a decoded Task.
pub fn validate_task(task: &Task) -> Result<(), Vec<FieldError>> {
    into_result(task_errors(task))
}

/// Semantic checks of a decoded Workflow.
pub fn validate_workflow(workflow: &Workflow) -> Result<(), Vec<FieldError>> {
    into_result(workflow_errors(workflow))
}

/// Semantic checks of a decoded Pod.
pub fn validate_pod(pod: &Pod) -> Result<(), Vec<FieldError>> {
    into_result(pod_errors(pod))
}

fn into_result(errors: Vec<FieldError>) -> Result<(), Vec<FieldError>> {
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

// ---------------------------------------------------------------------------------------
// Decoding

fn decode_then<T: DeserializeOwned>(
    object: &Value,
    check: fn(&T) -> Vec<FieldError>,
) -> Vec<FieldError> {
    match decode::<T>(object) {
        Ok(typed) => check(&typed),
        Err(error) => vec![error],
    }
}

/// Decodes `object`, turning a serde failure into one [`FieldError`] at its path.
pub fn decode<T: DeserializeOwned>(object: &Value) -> Result<T, FieldError> {
    serde_path_to_error::deserialize::<_, T>(object).map_err(|err| {
        let mut segments = path_segments(err.path());
        let mut message = err.into_inner().to_string();
        // A Job task template flattens a TaskSpec, and serde loses the path inside a
        // flattened struct: decode that element as a TaskSpec again to find it.
        if let Some(element) = flattened_task_template(object, &segments)
            && let Err(inner) = serde_path_to_error::deserialize::<_, TaskSpec>(element)
        {
            segments.extend(path_segments(inner.path()));
            message = inner.into_inner().to_string();
        }
        serde_error(&segments, &message)
    })
}

enum Segment {
    Key(String),
    Index(usize),
}

fn path_segments(path: &serde_path_to_error::Path) -> Vec<Segment> {
    path.iter()
        .map(|s| match s {
            serde_path_to_error::Segment::Seq { index } => Segment::Index(*index),
            serde_path_to_error::Segment::Map { key } => Segment::Key(key.clone()),
            serde_path_to_error::Segment::Enum { variant } => Segment::Key(variant.clone()),
            serde_path_to_error::Segment::Unknown => Segment::Key("?".to_string()),
        })
        .collect()
}

fn render_path(segments: &[Segment]) -> String {
    let mut out = String::new();
    for segment in segments {
        match segment {
            Segment::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// The element at `spec...tasks[i]` when the path ends there (a Job task template).
fn flattened_task_template<'a>(object: &'a Value, segments: &[Segment]) -> Option<&'a Value> {
    match segments {
        [
            Segment::Key(first),
            ..,
            Segment::Key(tasks),
            Segment::Index(_),
        ] if first == "spec" && tasks == "tasks" => {}
        _ => return None,
    }
    let mut value = object;
    for segment in segments {
        value = match segment {
            Segment::Key(key) => value.get(key.as_str())?,
            Segment::Index(i) => value.get(*i)?,
        };
    }
    Some(value)
}

/// Backtick-quoted words of a serde message, in order.
fn backticked(s: &str) -> Vec<&str> {
    s.split('`').skip(1).step_by(2).collect()
}

fn serde_error(segments: &[Segment], message: &str) -> FieldError {
    let path = render_path(segments);
    if let Some(rest) = message.strip_prefix("missing field `")
        && let Some(name) = rest.strip_suffix('`')
    {
        let field = if path.is_empty() {
            name.to_string()
        } else {
            format!("{path}.{name}")
        };
        return FieldError::required(field, "");
    }
    if let Some(rest) = message.strip_prefix("unknown variant `")
        && let Some((value, expected)) = rest.rsplit_once("`, expected ")
    {
        return FieldError::not_supported(path, value, &backticked(expected));
    }
    FieldError::invalid(path, message)
}

// ---------------------------------------------------------------------------------------
// Helpers

/// Which DNS-1123 rule a name follows.
#[derive(Clone, Copy)]
enum NameRule {
    Label,
    Subdomain,
}

fn name_errors(value: &str, rule: NameRule) -> Vec<String> {
    match rule {
        NameRule::Label => names::dns1123_label_errors(value),
        NameRule::Subdomain => names::dns1123_subdomain_errors(value),
    }
}

fn check_name(errs: &mut Vec<FieldError>, field: &str, value: &str, rule: NameRule) {
    for msg in name_errors(value, rule) {
        errs.push(FieldError::invalid(field, format!("{value:?}: {msg}")));
    }
}

/// `metadata.name` (required; `rule`), `metadata.namespace` (a label when set).
fn check_metadata(errs: &mut Vec<FieldError>, meta: &ObjectMeta, rule: NameRule) {
    match meta.name.as_deref() {
        None | Some("") => errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        )),
        Some(name) => check_name(errs, "metadata.name", name, rule),
    }
    if let Some(ns) = meta.namespace.as_deref().filter(|ns| !ns.is_empty()) {
        check_name(errs, "metadata.namespace", ns, NameRule::Label);
    }
}

/// `value` must lie in `min..=max`; the error names both ends, as Kubernetes' `InclusiveRange`
/// does, or only the broken one when the other is the type's natural bound.
fn check_range(errs: &mut Vec<FieldError>, field: &str, value: i64, min: i64, max: i64) {
    if value < min {
        errs.push(FieldError::invalid(
            field,
            format!("{value}: must be greater than or equal to {min}"),
        ));
    } else if value > max {
        errs.push(FieldError::invalid(
            field,
            format!("{value}: must be less than or equal to {max}"),
        ));
    }
}

fn check_non_negative(errs: &mut Vec<FieldError>, field: &str, value: i64) {
    if value < 0 {
        errs.push(FieldError::invalid(
            field,
            format!("{value}: must be greater than or equal to 0"),
        ));
    }
}

/// An optional reference to another object by name: when set and non-empty, a subdomain.
fn check_ref(errs: &mut Vec<FieldError>, field: &str, value: Option<&str>) {
    if let Some(v) = value.filter(|v| !v.is_empty()) {
        check_name(errs, field, v, NameRule::Subdomain);
    }
}

fn check_env(errs: &mut Vec<FieldError>, path: &str, env: &[EnvVar]) {
    for (i, var) in env.iter().enumerate() {
        let field = format!("{path}[{i}].name");
        if var.name.is_empty() {
            errs.push(FieldError::required(field, ""));
        } else if !var
            .name
            .bytes()
            .all(|b| (0x20..0x7f).contains(&b) && b != b'=')
        {
            errs.push(FieldError::invalid(
                field,
                format!(
                    "{:?}: a valid environment variable name must consist only of printable ASCII characters other than '='",
                    var.name
                ),
            ));
        }
    }
}

/// Every quantity parses and is non-negative. Returns the parsed values by name.
fn check_resource_list(
    errs: &mut Vec<FieldError>,
    path: &str,
    list: &ResourceList,
) -> BTreeMap<String, QuantityValue> {
    let mut parsed = BTreeMap::new();
    for (name, quantity) in list {
        for msg in names::qualified_name_errors(name) {
            errs.push(FieldError::invalid(path, format!("{name:?}: {msg}")));
        }
        let field = format!("{path}[{name}]");
        match parse_quantity(&quantity.0) {
            Err(e) => errs.push(FieldError::invalid(field, format!("{:?}: {e}", quantity.0))),
            Ok(v) if v.is_negative() => errs.push(FieldError::invalid(
                field,
                format!("{:?}: must be greater than or equal to 0", quantity.0),
            )),
            Ok(v) => {
                parsed.insert(name.clone(), v);
            }
        }
    }
    parsed
}

/// Requests and limits are valid quantities, and no request exceeds its limit.
fn check_resources(errs: &mut Vec<FieldError>, path: &str, res: &ResourceRequirements) {
    let requests = check_resource_list(errs, &format!("{path}.requests"), &res.requests);
    let limits = check_resource_list(errs, &format!("{path}.limits"), &res.limits);
    for (name, request) in &requests {
        if let Some(limit) = limits.get(name)
            && request > limit
        {
            errs.push(FieldError::invalid(
                format!("{path}.requests[{name}]"),
                format!(
                    "{:?}: must be less than or equal to {name} limit of {}",
                    res.requests[name].0, res.limits[name].0
                ),
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Task

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
fn task_spec_errors(errs: &mut Vec<FieldError>, path: &str, spec: &TaskSpec) {
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

fn task_errors(task: &Task) -> Vec<FieldError> {
    let mut errs = Vec::new();
    check_metadata(&mut errs, &task.metadata, NameRule::Subdomain);
    task_spec_errors(&mut errs, "spec", &task.spec);
    errs
}

// ---------------------------------------------------------------------------------------
// Job

/// Checks a [`JobSpec`] at `path` for a Job named `job_name` (empty when unknown).
fn job_spec_errors(errs: &mut Vec<FieldError>, path: &str, job_name: &str, spec: &JobSpec) {
    check_ref(errs, &format!("{path}.domain"), spec.domain.as_deref());
    if spec.tasks.is_empty() {
        errs.push(FieldError::required(
            format!("{path}.tasks"),
            "at least one task is required",
        ));
    }
    let mut seen = HashSet::new();
    let mut head: Option<&str> = None;
    for (i, template) in spec.tasks.iter().enumerate() {
        let tp = format!("{path}.tasks[{i}]");
        let name_field = format!("{tp}.name");
        if template.name.is_empty() {
            errs.push(FieldError::required(&name_field, ""));
        } else {
            check_name(errs, &name_field, &template.name, NameRule::Label);
            if !seen.insert(template.name.as_str()) {
                errs.push(FieldError::duplicate(&name_field, &template.name));
            }
            if !job_name.is_empty() {
                let child = names::task_name(job_name, &template.name);
                if child.len() > names::DNS1123_LABEL_MAX_LENGTH {
                    errs.push(FieldError::too_long(
                        &name_field,
                        format!(
                            "the Task name {child:?} (<job>-<task>) may not be more than {} characters",
                            names::DNS1123_LABEL_MAX_LENGTH
                        ),
                    ));
                }
            }
        }
        if template.head {
            match head {
                Some(first) => errs.push(FieldError::invalid(
                    format!("{tp}.head"),
                    format!("true: at most one task may be the head, and {first:?} already is"),
                )),
                None => head = Some(template.name.as_str()),
            }
        }
        task_spec_errors(errs, &tp, &template.spec);
    }
    job_access_errors(errs, &format!("{path}.access"), &spec.access);
}

/// Longest user or group name of a [`JobSpec::access`] entry (a certificate subject's).
const MAX_ACCESS_NAME: usize = 253;

/// Checks `spec.access`: at most [`crate::types::MAX_JOB_ACCESS_ENTRIES`] entries, each with
/// exactly one of `user` and `group`, a name of 1..=253 characters without whitespace or
/// control characters.
fn job_access_errors(errs: &mut Vec<FieldError>, path: &str, access: &[crate::types::JobAccess]) {
    if access.len() > crate::types::MAX_JOB_ACCESS_ENTRIES {
        errs.push(FieldError::too_long(
            path,
            format!(
                "{} entries: at most {} are allowed",
                access.len(),
                crate::types::MAX_JOB_ACCESS_ENTRIES
            ),
        ));
        return;
    }
    for (i, entry) in access.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let (field, name) = match (entry.user.as_deref(), entry.group.as_deref()) {
            (Some(user), None) => ("user", user),
            (None, Some(group)) => ("group", group),
            (Some(_), Some(_)) => {
                errs.push(FieldError::invalid(
                    &at,
                    "names both a user and a group: give exactly one of user and group per entry",
                ));
                continue;
            }
            (None, None) => {
                errs.push(FieldError::required(
                    &at,
                    "give exactly one of user and group",
                ));
                continue;
            }
        };
        let field_path = format!("{at}.{field}");
        if name.is_empty() || name.len() > MAX_ACCESS_NAME {
            errs.push(FieldError::invalid(
                &field_path,
                format!("{name:?}: must be 1 to {MAX_ACCESS_NAME} characters"),
            ));
        } else if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
            errs.push(FieldError::invalid(
                &field_path,
                format!("{name:?}: may not contain whitespace or control characters"),
            ));
        }
    }
}

fn job_errors(job: &Job) -> Vec<FieldError> {
    let mut errs = Vec::new();
    check_metadata(&mut errs, &job.metadata, NameRule::Label);
    let name = job.metadata.name.as_deref().unwrap_or_default();
    job_spec_errors(&mut errs, "spec", name, &job.spec);
    errs
}

// ---------------------------------------------------------------------------------------
// Workflow

/// The first dependency cycle found (depth-first, in template and dependency order), as
/// template names with the first repeated at the end; `None` for a DAG. `deps[i]` lists the
/// indices template `i` depends on.
fn find_cycle(deps: &[Vec<usize>]) -> Option<Vec<usize>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnStack,
        Done,
    }
    fn visit(
        node: usize,
        deps: &[Vec<usize>],
        marks: &mut [Mark],
        stack: &mut Vec<usize>,
    ) -> Option<Vec<usize>> {
        marks[node] = Mark::OnStack;
        stack.push(node);
        for &next in &deps[node] {
            match marks[next] {
                Mark::OnStack => {
                    let start = stack.iter().position(|&n| n == next).unwrap_or(0);
                    let mut cycle = stack[start..].to_vec();
                    cycle.push(next);
                    return Some(cycle);
                }
                Mark::New => {
                    if let Some(cycle) = visit(next, deps, marks, stack) {
                        return Some(cycle);
                    }
                }
                Mark::Done => {}
            }
        }
        stack.pop();
        marks[node] = Mark::Done;
        None
    }
    let mut marks = vec![Mark::New; deps.len()];
    let mut stack = Vec::new();
    (0..deps.len()).find_map(|start| {
        if marks[start] == Mark::New {
            visit(start, deps, &mut marks, &mut stack)
        } else {
            None
        }
    })
}

fn workflow_errors(workflow: &Workflow) -> Vec<FieldError> {
    let mut errs = Vec::new();
    check_metadata(&mut errs, &workflow.metadata, NameRule::Label);
    let wf_name = workflow.metadata.name.as_deref().unwrap_or_default();
    let templates = &workflow.spec.job_templates;
    if templates.is_empty() {
        errs.push(FieldError::required(
            "spec.jobTemplates",
            "at least one job template is required",
        ));
    }

    // Index of the first template of each name.
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, t) in templates.iter().enumerate() {
        let field = format!("spec.jobTemplates[{i}].name");
        if t.name.is_empty() {
            errs.push(FieldError::required(field, ""));
            continue;
        }
        check_name(&mut errs, &field, &t.name, NameRule::Label);
        if index.contains_key(t.name.as_str()) {
            errs.push(FieldError::duplicate(&field, &t.name));
        } else {
            index.insert(&t.name, i);
        }
        if !wf_name.is_empty() {
            let child = names::workflow_job_name(wf_name, &t.name);
            if child.len() > names::DNS1123_LABEL_MAX_LENGTH {
                errs.push(FieldError::too_long(
                    &field,
                    format!(
                        "the Job name {child:?} (<workflow>-<template>) may not be more than {} characters",
                        names::DNS1123_LABEL_MAX_LENGTH
                    ),
                ));
            }
        }
    }

    let mut deps: Vec<Vec<usize>> = vec![Vec::new(); templates.len()];
    for (i, t) in templates.iter().enumerate() {
        let mut seen = HashSet::new();
        for (j, dep) in t.dependencies.iter().enumerate() {
            let field = format!("spec.jobTemplates[{i}].dependencies[{j}]");
            if !seen.insert(dep.as_str()) {
                errs.push(FieldError::duplicate(field, dep));
                continue;
            }
            if dep == &t.name {
                errs.push(FieldError::invalid(
                    field,
                    format!("{dep:?}: a job template may not depend on itself"),
                ));
                continue;
            }
            match index.get(dep.as_str()) {
                Some(&target) => deps[i].push(target),
                None => errs.push(FieldError::invalid(
                    field,
                    format!("{dep:?}: no job template of this workflow has this name"),
                )),
            }
        }
    }
    if let Some(cycle) = find_cycle(&deps) {
        let names: Vec<&str> = cycle.iter().map(|&i| templates[i].name.as_str()).collect();
        errs.push(FieldError::invalid(
            "spec.jobTemplates",
            format!("dependency cycle: {}", names.join(" -> ")),
        ));
    }

    for (i, t) in templates.iter().enumerate() {
        let job_name = if wf_name.is_empty() || t.name.is_empty() {
            String::new()
        } else {
            names::workflow_job_name(wf_name, &t.name)
        };
        job_spec_errors(
            &mut errs,
            &format!("spec.jobTemplates[{i}].spec"),
            &job_name,
            &t.spec,
        );
    }
    errs
}

// ---------------------------------------------------------------------------------------
// Domain, DomainPeer, Node, Pod

/// Number of addresses of `net` that rlark's IPAM hands out: IPv4 excludes the network and
/// broadcast addresses (except in /31 and /32), IPv6 excludes the subnet-router anycast
/// address (except in /127 and /128). Saturates at `u128::MAX` for `::/0`.
pub fn usable_addresses(net: &IpNet) -> u128 {
    let (bits, prefix) = match net {
        IpNet::V4(n) => (32u32, u32::from(n.prefix_len())),
        IpNet::V6(n) => (128u32, u32::from(n.prefix_len())),
    };
    let host_bits = bits - prefix;
    let total = if host_bits >= 128 {
        u128::MAX
    } else {
        1u128 << host_bits
    };
    match (net, host_bits) {
        (_, 0 | 1) => total,
        (IpNet::V4(_), _) => total - 2,
        (IpNet::V6(_), _) => total - 1,
    }
}

fn domain_errors(domain: &Domain) -> Vec<FieldError> {
    let mut errs = Vec::new();
    check_metadata(&mut errs, &domain.metadata, NameRule::Subdomain);
    let cidr = domain.spec.cidr.as_str();
    if cidr.is_empty() {
        errs.push(FieldError::required("spec.cidr", ""));
        return errs;
    }
    let net = match IpNet::from_str(cidr) {
        Ok(net) => net,
        Err(_) => {
            errs.push(FieldError::invalid(
                "spec.cidr",
                format!(
                    "{cidr:?}: must be a valid IPv4 or IPv6 CIDR (e.g. '10.88.0.0/16' or 'fd00:88::/64')"
                ),
            ));
            return errs;
        }
    };
    if net.addr() != net.network() {
        errs.push(FieldError::invalid(
            "spec.cidr",
            format!(
                "{cidr:?}: host bits must be zero; did you mean {:?}?",
                net.trunc().to_string()
            ),
        ));
    }
    if let Some(selector) = &domain.spec.job_selector {
        check_label_selector(&mut errs, "spec.jobSelector", selector);
    }
    let usable = usable_addresses(&net);
    if usable < 2 {
        errs.push(FieldError::invalid(
            "spec.cidr",
            format!(
                "{cidr:?}: a /{} network has {usable} usable address; at least 2 are needed",
                net.prefix_len()
            ),
        ));
    }
    errs
}

/// A label selector: label keys and values well-formed, operators known, `values` given
/// exactly for `In`/`NotIn`.
fn check_label_selector(
    errs: &mut Vec<FieldError>,
    path: &str,
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) {
    for (key, value) in selector.match_labels.iter().flatten() {
        for problem in names::qualified_name_errors(key) {
            errs.push(FieldError::invalid(
                format!("{path}.matchLabels"),
                format!("{key:?}: {problem}"),
            ));
        }
        for problem in names::label_value_errors(value) {
            errs.push(FieldError::invalid(
                format!("{path}.matchLabels[{key}]"),
                format!("{value:?}: {problem}"),
            ));
        }
    }
    for (i, req) in selector.match_expressions.iter().flatten().enumerate() {
        let at = format!("{path}.matchExpressions[{i}]");
        for problem in names::qualified_name_errors(&req.key) {
            errs.push(FieldError::invalid(
                format!("{at}.key"),
                format!("{:?}: {problem}", req.key),
            ));
        }
        let values = req.values.as_deref().unwrap_or_default();
        match req.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => errs.push(FieldError::required(
                format!("{at}.values"),
                "must be specified when `operator` is 'In' or 'NotIn'",
            )),
            "Exists" | "DoesNotExist" if !values.is_empty() => errs.push(FieldError::forbidden(
                format!("{at}.values"),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => errs.push(FieldError::not_supported(
                format!("{at}.operator"),
                other,
                crate::labels::SELECTOR_OPERATORS,
            )),
        }
    }
}

fn check_ip(errs: &mut Vec<FieldError>, field: &str, value: Option<&str>) {
    if let Some(ip) = value.filter(|v| !v.is_empty())
        && IpAddr::from_str(ip).is_err()
    {
        errs.push(FieldError::invalid(
            field,
            format!("{ip:?}: must be a valid IP address"),
        ));
    }
}

fn domain_peer_errors(peer: &DomainPeer) -> Vec<FieldError> {
    let mut errs = Vec::new();
    check_metadata(&mut errs, &peer.metadata, NameRule::Subdomain);
    if peer.spec.domain.is_empty() {
        errs.push(FieldError::required("spec.domain", ""));
    } else {
        check_name(
            &mut errs,
            "spec.domain",
            &peer.spec.domain,
            NameRule::Subdomain,
        );
    }
    if !(0..=128).contains(&peer.spec.prefix_len) {
        errs.push(FieldError::invalid(
            "spec.prefixLen",
            format!(
                "{}: must be between 0 and 128, inclusive",
                peer.spec.prefix_len
            ),
        ));
    }
    for (i, pod) in peer.spec.pods.iter().enumerate() {
        let pp = format!("spec.pods[{i}]");
        if pod.ip.is_empty() {
            errs.push(FieldError::required(format!("{pp}.ip"), ""));
        } else {
            check_ip(&mut errs, &format!("{pp}.ip"), Some(&pod.ip));
        }
        check_ip(&mut errs, &format!("{pp}.localIP"), pod.local_ip.as_deref());
    }
    errs
}

/// Most resource names one of a Node's resource lists (`capacity`, `allocatable`, `used`)
/// may hold.
pub const MAX_NODE_RESOURCE_NAMES: usize = 64;
/// Largest `cpu` a Node may report (cores).
pub const MAX_NODE_CPU: &str = "65536";
/// Largest `memory` (and `hugepages-*`) a Node may report: 1 PiB.
pub const MAX_NODE_MEMORY: &str = "1Pi";
/// Largest `ephemeral-storage` a Node may report: 1 EiB.
pub const MAX_NODE_STORAGE: &str = "1Ei";
/// Largest amount of any other resource a Node may report (GPUs, devices, extended
/// resources are counts).
pub const MAX_NODE_DEVICES: &str = "65536";

/// The largest amount of resource `name` a Node may report (see [`MAX_NODE_CPU`] and the
/// constants after it). Reported resources are what the scheduler trusts, so an agent
/// cannot attract every Job with an absurd capacity.
pub fn max_node_resource(name: &str) -> &'static str {
    match name {
        "cpu" => MAX_NODE_CPU,
        "memory" => MAX_NODE_MEMORY,
        "ephemeral-storage" => MAX_NODE_STORAGE,
        _ if name.starts_with("hugepages-") => MAX_NODE_MEMORY,
        _ => MAX_NODE_DEVICES,
    }
}

/// A Node's resource list: valid quantities, at most [`MAX_NODE_RESOURCE_NAMES`] names, each
/// amount at most [`max_node_resource`].
fn check_node_resources(errs: &mut Vec<FieldError>, path: &str, list: &ResourceList) {
    if list.len() > MAX_NODE_RESOURCE_NAMES {
        errs.push(FieldError::new(
            path,
            FieldErrorKind::TooLong,
            format!(
                "may not have more than {MAX_NODE_RESOURCE_NAMES} resources, has {}",
                list.len()
            ),
        ));
    }
    for (name, value) in check_resource_list(errs, path, list) {
        let max = max_node_resource(&name);
        if parse_quantity(max).is_ok_and(|max| value > max) {
            errs.push(FieldError::invalid(
                format!("{path}[{name}]"),
                format!(
                    "{:?}: must be at most {max} (the largest amount of {name} a Node may report)",
                    list.get(&name).map(|q| q.0.as_str()).unwrap_or_default()
                ),
            ));
        }
    }
}

fn node_errors(node: &Node) -> Vec<FieldError> {
    let mut errs = Vec::new();
    check_metadata(&mut errs, &node.metadata, NameRule::Subdomain);
    if let Some(status) = &node.status {
        check_node_resources(&mut errs, "status.capacity", &status.capacity);
        check_node_resources(&mut errs, "status.allocatable", &status.allocatable);
        check_node_resources(&mut errs, "status.used", &status.used);
    }
    errs
}

fn pod_errors(pod: &Pod) -> Vec<FieldError> {
    let mut errs = Vec::new();
    check_metadata(&mut errs, &pod.metadata, NameRule::Subdomain);
    check_ref(&mut errs, "spec.domain", pod.spec.domain.as_deref());
    check_ref(&mut errs, "spec.taskName", pod.spec.task_name.as_deref());
    if let Some(ns) = pod.spec.task_namespace.as_deref().filter(|v| !v.is_empty()) {
        check_name(&mut errs, "spec.taskNamespace", ns, NameRule::Label);
    }
    if let Some(index) = pod.spec.replica_index {
        check_range(
            &mut errs,
            "spec.replicaIndex",
            index.into(),
            0,
            MAX_REPLICAS - 1,
        );
    }
    if let Some(status) = &pod.status {
        check_ip(&mut errs, "status.ip", status.ip.as_deref());
        if let Some(restarts) = status.restart_count {
            check_non_negative(&mut errs, "status.restartCount", restarts.into());
        }
    }
    errs
}

pub mod network;

#[cfg(test)]
mod tests;
