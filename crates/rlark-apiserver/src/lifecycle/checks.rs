//! What a write's body must satisfy before it is attempted: type meta, namespace, immutable
//! fields, namespace defaults, field validation; and when a deleting object is released.

use serde_json::{Value, json};

use super::{
    NAMESPACE_FINALIZER, NAMESPACE_NAME_LABEL, finalizers, is_deleting, is_namespace, metadata_mut,
    set_field,
};
use crate::error::{ApiError, Cause};
use crate::fieldvalidation::{self, FieldValidation};
use crate::object::meta_str;
use crate::registry::ResourceType;

/// Check `kind`/`apiVersion` of a body against the endpoint, filling them when absent.
pub(crate) fn check_type_meta(rt: &ResourceType, object: &mut Value) -> Result<(), ApiError> {
    let expected_version = rt.api_version();
    match object.get("apiVersion").and_then(Value::as_str) {
        None | Some("") => object["apiVersion"] = json!(expected_version),
        Some(v) if v == expected_version => {}
        Some(v) => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({expected_version})"
            )));
        }
    }
    match object.get("kind").and_then(Value::as_str) {
        None | Some("") => object["kind"] = json!(rt.kind),
        Some(k) if k == rt.kind => {}
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({}) of {}",
                rt.kind,
                rt.qualified_name()
            )));
        }
    }
    Ok(())
}

/// Reconcile `metadata.namespace` of a body with the URL's namespace: 400 on mismatch,
/// filled when absent; removed for cluster-scoped kinds (as Kubernetes does).
pub(crate) fn check_namespace(
    rt: &ResourceType,
    object: &mut Value,
    url_namespace: Option<&str>,
) -> Result<String, ApiError> {
    let meta = metadata_mut(object);
    if !rt.namespaced {
        meta.shift_remove("namespace");
        return Ok(String::new());
    }
    let url_namespace = url_namespace.unwrap_or("");
    match meta.get("namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() && ns != url_namespace => Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        _ => {
            meta.insert("namespace".into(), json!(url_namespace));
            Ok(url_namespace.to_string())
        }
    }
}

pub(super) fn immutable(rt: &ResourceType, name: &str, field: &str, value: &Value) -> ApiError {
    let shown = value
        .as_str()
        .map_or_else(|| value.to_string(), str::to_string);
    ApiError::invalid(
        rt,
        name,
        vec![Cause {
            reason: "FieldValueInvalid".into(),
            message: format!("Invalid value: {shown:?}: field is immutable"),
            field: field.into(),
        }],
    )
}

/// Namespace defaults: the `kubernetes.io/metadata.name` label, and on create the
/// `kubernetes` spec finalizer and phase `Active`.
pub(super) fn namespace_defaults(object: &mut Value, creating: bool) {
    let name = meta_str(object, "name").unwrap_or("").to_string();
    let meta = metadata_mut(object);
    if !meta.get("labels").is_some_and(Value::is_object) {
        meta.insert("labels".into(), json!({}));
    }
    if let Some(Value::Object(labels)) = meta.get_mut("labels") {
        labels.insert(NAMESPACE_NAME_LABEL.into(), json!(name));
    }
    if creating {
        if object.pointer("/spec/finalizers").is_none() {
            set_field(object, "spec", "finalizers", json!([NAMESPACE_FINALIZER]));
        }
        object["status"] = json!({"phase": "Active"});
    }
}

/// Walk the schema, judge unknown/duplicate fields per the directive and return the
/// warnings plus the schema's type/enum/required causes.
pub(crate) fn field_check(
    rt: &ResourceType,
    object: &mut Value,
    duplicates: &[String],
    directive: FieldValidation,
) -> Result<(Vec<String>, Vec<Cause>), ApiError> {
    let report = fieldvalidation::check(&rt.schema, object);
    let warnings = directive.judge(&report.unknown, duplicates)?;
    Ok((warnings, report.causes))
}

/// Whether `rt` is rlark's Node kind.
pub(super) fn is_node(rt: &ResourceType) -> bool {
    rt.group == "rlinf.io" && rt.plural == "nodes"
}

/// Whether an update of an object being deleted has released it (no finalizers left), so
/// the write becomes the deletion.
pub(super) fn released(rt: &ResourceType, object: &Value) -> bool {
    is_deleting(object)
        && finalizers(object).is_empty()
        && (!is_namespace(rt)
            || object
                .pointer("/spec/finalizers")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty))
}
