//! Reading stored objects: their store keys, metadata strings and revisions. Shared by the
//! object lifecycle, lists, watches and the collectors (a leaf module: it uses none of them).

use rlark_store::{ObjectKey, Revision};
use serde_json::Value;

use crate::error::ApiError;
use crate::registry::ResourceType;

/// The store key of object `name` of `rt` in `namespace` (`""` for cluster-scoped kinds).
pub(crate) fn key(rt: &ResourceType, namespace: &str, name: &str) -> ObjectKey {
    ObjectKey::new(rt.store_resource(), namespace, name)
}

/// The key of a stored object of `rt`, from its metadata.
pub(crate) fn key_of(rt: &ResourceType, object: &Value) -> ObjectKey {
    key(
        rt,
        meta_str(object, "namespace").unwrap_or(""),
        meta_str(object, "name").unwrap_or(""),
    )
}

/// `metadata.<field>` of an object, when it is a string.
pub(crate) fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    object
        .get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
}

/// `metadata.resourceVersion` of a stored object (always a decimal revision).
pub(crate) fn revision_of(object: &Value) -> Revision {
    meta_str(object, "resourceVersion")
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}

/// Parse a client-supplied resourceVersion; 400 when it is not a revision.
pub(crate) fn parse_resource_version(value: &str) -> Result<Revision, ApiError> {
    value
        .parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {value:?}")))
}
