//! Object lifecycle over the store, with Kubernetes' rules: create, update (status
//! subresource, immutable metadata, finalizers), delete (finalizers, `deletionTimestamp`,
//! propagation policies). The HTTP handlers and the garbage collector both go through here,
//! so an object is deleted the same way whoever deletes it.
//!
//! Every write is validated completely before it is attempted, and every read-modify-write
//! uses the read revision as precondition (retrying a few times on conflict when the client
//! gave no `resourceVersion` of its own), so nothing is ever half-written or lost.
//!
//! Files: this one holds the options, the object helpers and the reads every write makes;
//! `checks` (what a body must satisfy: type meta, namespace, immutable fields, field
//! validation), `create`, `update` (update, patch, read-modify-write) and `delete` (with
//! finalizers, propagation, collections).

mod checks;
mod create;
mod delete;
mod update;

#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use checks::{check_namespace, check_type_meta, field_check};

use std::sync::Arc;

use chrono::{SecondsFormat, Utc};
use rlark_store::ObjectKey;
use serde_json::{Map, Value, json};

use crate::Inner;
use crate::admission;
use crate::auth::Identity;
use crate::authz::Attributes;
use crate::error::{ApiError, Cause};
use crate::fieldvalidation::FieldValidation;
use crate::object::meta_str;
use crate::registry::ResourceType;

/// Finalizer that holds an owner until its dependents are gone (foreground deletion).
pub(crate) const FOREGROUND_FINALIZER: &str = "foregroundDeletion";
/// `spec.finalizers` entry that holds a Namespace until its content is deleted.
pub(crate) const NAMESPACE_FINALIZER: &str = "kubernetes";
/// Label every Namespace carries, as in Kubernetes.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// How often a read-modify-write is retried after losing a race.
const MAX_ATTEMPTS: usize = 5;
/// Kubernetes truncates `generateName` so the result stays a valid name.
const MAX_GENERATE_NAME_PREFIX: usize = 58;

/// Options shared by create, update and patch.
#[derive(Clone, Debug, Default)]
pub(crate) struct WriteOptions {
    pub dry_run: bool,
    pub field_validation: FieldValidation,
    /// Who writes, for [`admission::identity_admission`]; `None` for the server's own
    /// writes.
    pub caller: Option<Identity>,
}

/// A written (or, for dry runs, would-be-written) object and the warnings for the client.
#[derive(Debug)]
pub(crate) struct Written {
    pub object: Arc<Value>,
    pub warnings: Vec<String>,
}

/// `DeleteOptions.propagationPolicy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Propagation {
    /// Delete the object now; the garbage collector deletes dependents afterwards.
    #[default]
    Background,
    /// Keep the object (with the `foregroundDeletion` finalizer) until its dependents are gone.
    Foreground,
    /// Remove the object's ownerReferences from its dependents, then delete it.
    Orphan,
}

impl Propagation {
    /// Parse `propagationPolicy`; unknown values are 422 as in Kubernetes.
    pub(crate) fn parse(value: &str) -> Result<Self, ApiError> {
        match value {
            "Background" => Ok(Self::Background),
            "Foreground" => Ok(Self::Foreground),
            "Orphan" => Ok(Self::Orphan),
            other => {
                let mut error = ApiError::new(
                    422,
                    "Invalid",
                    format!(
                        "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: {other:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
                    ),
                );
                error.causes.push(Cause {
                    reason: "FieldValueNotSupported".into(),
                    message: format!("Unsupported value: {other:?}"),
                    field: "propagationPolicy".into(),
                });
                Err(error)
            }
        }
    }
}

/// `DeleteOptions` as this server honours them.
#[derive(Clone, Debug, Default)]
pub(crate) struct DeleteOptions {
    pub propagation: Propagation,
    pub precondition_uid: Option<String>,
    pub precondition_resource_version: Option<String>,
    pub dry_run: bool,
}

pub(crate) fn finalizers(object: &Value) -> Vec<String> {
    object
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

pub(crate) fn is_deleting(object: &Value) -> bool {
    object
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

pub(crate) fn is_namespace(rt: &ResourceType) -> bool {
    rt.group.is_empty() && rt.kind == "Namespace"
}

/// `metadata` as a mutable map, created when absent or not an object.
pub(crate) fn metadata_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object.get("metadata").is_some_and(Value::is_object) {
        object["metadata"] = json!({});
    }
    match object.get_mut("metadata") {
        Some(Value::Object(map)) => map,
        // Just made sure `metadata` is an object.
        _ => unreachable!("metadata was set to an object above"),
    }
}

/// Remove the elements of the array at JSON pointer `pointer` that `drop` selects; whether
/// anything was removed (for [`Inner::modify`]).
pub(crate) fn remove_from(
    object: &mut Value,
    pointer: &str,
    drop: impl Fn(&Value) -> bool,
) -> bool {
    let Some(Value::Array(items)) = object.pointer_mut(pointer) else {
        return false;
    };
    let before = items.len();
    items.retain(|item| !drop(item));
    items.len() != before
}

/// Whether owner reference `reference` names an owner with uid `uid`.
pub(crate) fn names_uid(reference: &Value, uid: &str) -> bool {
    reference.get("uid").and_then(Value::as_str) == Some(uid)
}

/// Set `object[section][field]`, making `section` an object if it is not one.
pub(crate) fn set_field(object: &mut Value, section: &str, field: &str, value: Value) {
    let Some(map) = object.as_object_mut() else {
        return;
    };
    let entry = map.entry(section).or_insert_with(|| json!({}));
    if !entry.is_object() {
        *entry = json!({});
    }
    if let Some(section) = entry.as_object_mut() {
        section.insert(field.into(), value);
    }
}

fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Five characters from Kubernetes' `generateName` alphabet (no vowels, no look-alikes).
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4().as_bytes()[..5]
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

impl Inner {
    async fn get_object(&self, rt: &ResourceType, key: &ObjectKey) -> Result<Arc<Value>, ApiError> {
        self.store
            .get(key)
            .await
            .map_err(|e| ApiError::from_store(e, rt, &key.name))?
            .ok_or_else(|| ApiError::not_found(rt, &key.name))
    }

    /// [`admission::identity_admission`] of a write by `options.caller` (nothing for the
    /// server's own writes): a 403 and a `denied` audit record when it is refused.
    #[allow(clippy::too_many_arguments)]
    fn admit_caller(
        &self,
        options: &WriteOptions,
        rt: &ResourceType,
        verb: &str,
        namespace: &str,
        status_only: bool,
        object: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        let Some(identity) = &options.caller else {
            return Ok(());
        };
        let Err(reason) = admission::identity_admission(identity, rt, object, old) else {
            return Ok(());
        };
        let name = meta_str(object, "name").filter(|n| !n.is_empty());
        let attrs = Attributes {
            verb: verb.to_string(),
            group: rt.group.clone(),
            resource: rt.plural.clone(),
            subresource: status_only.then(|| "status".to_string()),
            namespace: (rt.namespaced && !namespace.is_empty()).then(|| namespace.to_string()),
            name: name.map(str::to_string),
        };
        Err(crate::audit::deny(self, identity, &attrs, name, reason))
    }
}
