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
//!
//! Files: this one holds the field errors, the entry points and the limits shared by several
//! kinds; `decode` (JSON to typed struct, decoding errors as field errors), `checks` (field
//! checks every kind uses: names, ranges, references, env, resources), one file per kind
//! (`task`, `job`, `workflow`, `domain` for Domain and DomainPeer, `node` for Node and Pod),
//! and `network` (checks of the pod network that need other objects).

mod checks;
mod decode;
mod domain;
mod job;
pub mod network;
mod node;
mod task;
mod workflow;

pub use decode::decode;
pub use domain::usable_addresses;
pub use node::{
    MAX_NODE_CPU, MAX_NODE_DEVICES, MAX_NODE_MEMORY, MAX_NODE_RESOURCE_NAMES, MAX_NODE_STORAGE,
    max_node_resource,
};
pub use task::MAX_JOB_TEMPLATE_BYTES;

use std::fmt;

use serde_json::Value;

use crate::types::{Domain, DomainPeer, Job, KINDS, Node, Pod, Task, Workflow};
use decode::decode_then;
use domain::{domain_errors, domain_peer_errors};
use job::job_errors;
use node::{node_errors, pod_errors};
use task::task_errors;
use workflow::workflow_errors;

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
/// `spec.role: Unsupported value: "Foo": supported values: "Actor", "Rollout", "Env", "Head"`.
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

#[cfg(test)]
mod tests;
