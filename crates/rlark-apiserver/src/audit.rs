//! The audit trail: security-relevant decisions (certificate signing, revocation, token
//! use, denied requests) as structured records. The API server and the process's security
//! routes write to one [`AuditSink`]; the process decides where records go (a JSON-lines
//! file in the data directory, see `rlark-server`).

use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::Inner;
use crate::auth::Identity;
use crate::authz::Attributes;
use crate::error::ApiError;

/// One audit record. Serialized as one JSON line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    /// RFC 3339 time the decision was made.
    pub time: String,
    /// What happened: `denied`, `sign`, `revoke`, `join`, `renew`, `token-create`, ...
    pub action: String,
    /// The acting user (`""` for anonymous).
    pub user: String,
    /// The acting user's groups.
    pub groups: Vec<String>,
    /// Kubernetes verb or the security operation.
    pub verb: String,
    /// What was acted on (`jobs.rlinf.io`, `certificates`, ...).
    pub resource: String,
    /// Namespace, `""` when none.
    pub namespace: String,
    /// Object name, serial or subject, `""` when none.
    pub name: String,
    /// `allowed` or `denied`.
    pub decision: String,
    /// Human-readable reason or detail.
    pub reason: String,
}

impl AuditEntry {
    /// A record stamped with the current time.
    pub fn now(action: &str, decision: &str) -> Self {
        Self {
            time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            action: action.to_string(),
            user: String::new(),
            groups: Vec::new(),
            verb: String::new(),
            resource: String::new(),
            namespace: String::new(),
            name: String::new(),
            decision: decision.to_string(),
            reason: String::new(),
        }
    }

    /// Set the acting identity.
    pub fn by(mut self, identity: Option<&Identity>) -> Self {
        if let Some(identity) = identity {
            self.user = identity.user.clone();
            self.groups = identity.groups.clone();
        }
        self
    }
}

/// Where audit records go. Implementations must not block (they are called on request
/// paths) and must not drop records silently: a sink that cannot write logs an error.
pub trait AuditSink: Send + Sync + 'static {
    fn record(&self, entry: AuditEntry);
}

/// The default sink: every record becomes a `tracing` event with target `rlark::audit`.
#[derive(Clone, Copy, Debug, Default)]
pub struct TracingAudit;

impl AuditSink for TracingAudit {
    fn record(&self, entry: AuditEntry) {
        log_entry(&entry);
    }
}

/// Emit `entry` as a structured `tracing` event (target `rlark::audit`): `warn` for denials,
/// `info` otherwise.
pub fn log_entry(entry: &AuditEntry) {
    if entry.decision == "denied" {
        tracing::warn!(
            target: "rlark::audit",
            action = %entry.action, user = %entry.user, verb = %entry.verb,
            resource = %entry.resource, namespace = %entry.namespace, name = %entry.name,
            reason = %entry.reason, "denied"
        );
    } else {
        tracing::info!(
            target: "rlark::audit",
            action = %entry.action, user = %entry.user, verb = %entry.verb,
            resource = %entry.resource, namespace = %entry.namespace, name = %entry.name,
            reason = %entry.reason, "{}", entry.decision
        );
    }
}

/// A sink that keeps records in memory (tests, and the `rlark bench` harness).
#[derive(Clone, Debug, Default)]
pub struct MemoryAudit {
    entries: Arc<Mutex<Vec<AuditEntry>>>,
}

impl MemoryAudit {
    /// All records so far, oldest first.
    pub fn entries(&self) -> Vec<AuditEntry> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl AuditSink for MemoryAudit {
    fn record(&self, entry: AuditEntry) {
        log_entry(&entry);
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(entry);
    }
}

/// Record a denial to the audit sink and build its 403: `<resource>[ "<name>"] is
/// forbidden: <reason>`.
pub(crate) fn deny(
    inner: &Inner,
    identity: &Identity,
    attrs: &Attributes,
    name: Option<&str>,
    reason: String,
) -> ApiError {
    let error = ApiError::forbidden_resource(&attrs.group, &attrs.resource, name, &reason);
    inner.audit.record(AuditEntry {
        verb: attrs.verb.clone(),
        resource: attrs.qualified_resource(),
        namespace: attrs.namespace.clone().unwrap_or_default(),
        name: name.unwrap_or_default().to_string(),
        reason,
        ..AuditEntry::now("denied", "denied").by(Some(identity))
    });
    error
}
