//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and, for the built-in
//! kinds that have it in Kubernetes (Namespace, Lease; extra kinds that say so), the subset
//! of strategic merge patch that `kubectl apply`/`kubectl patch` send.
//!
//! Strategic merge patch here: maps merge as in a merge patch (`null` deletes); lists are
//! replaced, except `metadata.finalizers` (a set: union) and `metadata.ownerReferences`
//! (merged by `uid`), as `ObjectMeta`'s patch strategies say, and a PodSpec's containers,
//! volumes, image pull secrets and the containers' env, ports, volume mounts and devices
//! (merged by their keys, in a PodSpec at `spec` or `spec.template.spec`: Kubernetes Pods
//! and workloads served as extra kinds). The directives `$patch` (`replace`, `delete`,
//! `merge`), `$retainKeys`, `$setElementOrder/<field>` and `$deleteFromPrimitiveList/<field>`
//! are honoured; `$setElementOrder` only orders and is dropped. No directive is ever stored.
//!
//! A JSON patch whose `test` operation fails (or that addresses a missing path) is 422
//! `Invalid`, as kube-apiserver answers any JSON patch that cannot be applied.

use serde_json::{Map, Value};

use crate::body::decode_json;
use crate::error::ApiError;
use crate::fieldvalidation::join;
use crate::registry::ResourceType;

pub(crate) const MERGE_PATCH: &str = "application/merge-patch+json";
pub(crate) const JSON_PATCH: &str = "application/json-patch+json";
pub(crate) const STRATEGIC_MERGE_PATCH: &str = "application/strategic-merge-patch+json";

/// A decoded patch body.
#[derive(Debug)]
pub(crate) enum Patch {
    Merge(Value),
    Json(json_patch::Patch),
    Strategic(Value),
}

/// A decoded patch and the duplicate keys its JSON had (for `fieldValidation=Strict`).
#[derive(Debug)]
pub(crate) struct DecodedPatch {
    pub patch: Patch,
    pub duplicates: Vec<String>,
}

/// The patch types `rt` accepts, in the order kube-apiserver lists them.
fn supported(rt: &ResourceType) -> Vec<&'static str> {
    let mut types = vec![JSON_PATCH, MERGE_PATCH];
    if rt.strategic_merge_patch {
        types.push(STRATEGIC_MERGE_PATCH);
    }
    types
}

/// Decode a PATCH body of media type `media_type` for `rt`. Unsupported types (server-side
/// apply included) are 415 naming the supported ones; malformed bodies are 400.
pub(crate) fn decode(
    rt: &ResourceType,
    media_type: &str,
    bytes: &[u8],
) -> Result<DecodedPatch, ApiError> {
    let types = supported(rt);
    if !types.contains(&media_type) {
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {} (got {media_type:?})",
                types.join(", ")
            ),
        ));
    }
    let decoded = decode_json(bytes)?;
    let patch = match media_type {
        JSON_PATCH => Patch::Json(
            serde_json::from_value(decoded.value)
                .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?,
        ),
        _ if !decoded.value.is_object() => {
            return Err(ApiError::bad_request("a merge patch must be a JSON object"));
        }
        MERGE_PATCH => Patch::Merge(decoded.value),
        _ => Patch::Strategic(decoded.value),
    };
    Ok(DecodedPatch {
        patch,
        duplicates: decoded.duplicates,
    })
}

impl Patch {
    /// Whether the patch itself sets `metadata.resourceVersion`: then that value is a
    /// precondition and a conflict is reported instead of retried.
    pub(crate) fn sets_resource_version(&self) -> bool {
        match self {
            Patch::Merge(p) | Patch::Strategic(p) => p
                .pointer("/metadata/resourceVersion")
                .is_some_and(|v| !v.is_null()),
            Patch::Json(ops) => ops
                .0
                .iter()
                .any(|op| op.path().as_str() == "/metadata/resourceVersion"),
        }
    }

    /// Apply to `target` (the stored object). A result that is not an object is 422.
    pub(crate) fn apply(
        &self,
        rt: &ResourceType,
        name: &str,
        target: &mut Value,
    ) -> Result<(), ApiError> {
        match self {
            Patch::Merge(p) => json_patch::merge(target, p),
            Patch::Json(ops) => json_patch::patch(target, &ops.0).map_err(|e| {
                let mut error = ApiError::new(
                    422,
                    "Invalid",
                    format!("the patch could not be applied: {e}"),
                );
                error.name = Some(name.to_string());
                error.group = Some(rt.group.clone());
                error.kind = Some(rt.kind.clone());
                error
            })?,
            Patch::Strategic(p) => {
                if let (Value::Object(t), Value::Object(p)) = (&mut *target, p) {
                    merge_map(t, p, "");
                }
            }
        }
        if !target.is_object() {
            return Err(ApiError::new(
                422,
                "Invalid",
                "the patched object is not a JSON object",
            ));
        }
        Ok(())
    }
}

/// How a list field merges in a strategic merge patch.
enum ListStrategy {
    Replace,
    /// A set of scalars: union.
    Set,
    /// Objects identified by this key.
    MergeByKey(&'static str),
}

fn list_strategy(path: &str) -> ListStrategy {
    match path {
        "metadata.finalizers" => ListStrategy::Set,
        "metadata.ownerReferences" => ListStrategy::MergeByKey("uid"),
        _ => pod_spec_list(path).unwrap_or(ListStrategy::Replace),
    }
}

/// The merge keys of PodSpec's lists (a core Pod's `spec`, a workload's
/// `spec.template.spec`: extra kinds), from the Kubernetes types' `patchMergeKey`
/// tags. Other lists of a PodSpec (tolerations, args, ...) are replaced, as there.
fn pod_spec_list(path: &str) -> Option<ListStrategy> {
    let rest = path
        .strip_prefix("spec.template.spec.")
        .or_else(|| path.strip_prefix("spec."))?;
    let by = |key| Some(ListStrategy::MergeByKey(key));
    let containers = |list: &str| {
        matches!(
            list,
            "containers" | "initContainers" | "ephemeralContainers"
        )
    };
    match rest.split_once('.') {
        None if containers(rest) || matches!(rest, "volumes" | "imagePullSecrets") => by("name"),
        None => None,
        Some((list, field)) if containers(list) => match field {
            "env" => by("name"),
            "ports" => by("containerPort"),
            "volumeMounts" => by("mountPath"),
            "volumeDevices" => by("devicePath"),
            _ => None,
        },
        Some(_) => None,
    }
}

fn is_directive(key: &str) -> bool {
    key == "$patch"
        || key == "$retainKeys"
        || key.starts_with("$setElementOrder/")
        || key.starts_with("$deleteFromPrimitiveList/")
}

/// A copy of `value` without any directive, and without list elements that are only a
/// directive (`{"$patch": "delete", ...}` makes no sense in a replaced list).
fn strip(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !is_directive(k))
                .map(|(k, v)| (k.clone(), strip(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .filter(|item| item.get("$patch").is_none())
                .map(strip)
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Strategic merge of patch map `patch` into `target`, at field path `path`.
fn merge_map(target: &mut Map<String, Value>, patch: &Map<String, Value>, path: &str) {
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
        if let Value::Object(replacement) = strip(&Value::Object(patch.clone())) {
            *target = replacement;
        }
        return;
    }
    for (key, value) in patch {
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(items)), Value::Array(remove)) =
                (target.get_mut(field), value)
            {
                items.retain(|item| !remove.contains(item));
            }
            continue;
        }
        if is_directive(key) {
            continue;
        }
        let child_path = join(path, key);
        match value {
            Value::Null => {
                target.shift_remove(key);
            }
            Value::Object(child) => match child.get("$patch").and_then(Value::as_str) {
                Some("delete") => {
                    target.shift_remove(key);
                }
                _ => match target.get_mut(key) {
                    Some(Value::Object(existing)) => merge_map(existing, child, &child_path),
                    _ => {
                        let mut fresh = Map::new();
                        merge_map(&mut fresh, child, &child_path);
                        target.insert(key.clone(), Value::Object(fresh));
                    }
                },
            },
            Value::Array(items) => {
                let merged = match (list_strategy(&child_path), target.get(key)) {
                    (ListStrategy::Set, Some(Value::Array(existing))) => {
                        let mut merged = existing.clone();
                        for item in items {
                            if !merged.contains(item) {
                                merged.push(item.clone());
                            }
                        }
                        Value::Array(merged)
                    }
                    (ListStrategy::MergeByKey(merge_key), Some(Value::Array(existing)))
                        if !items.iter().any(|i| {
                            i.get("$patch").and_then(Value::as_str) == Some("replace")
                        }) =>
                    {
                        Value::Array(merge_keyed(existing, items, merge_key, &child_path))
                    }
                    _ => strip(value),
                };
                target.insert(key.clone(), merged);
            }
            scalar => {
                target.insert(key.clone(), scalar.clone());
            }
        }
    }
    if let Some(Value::Array(retain)) = patch.get("$retainKeys") {
        target.retain(|k, _| retain.iter().any(|r| r.as_str() == Some(k)));
    }
}

/// Merge patch list `items` into `existing`, matching elements by `merge_key`.
fn merge_keyed(existing: &[Value], items: &[Value], merge_key: &str, path: &str) -> Vec<Value> {
    let mut merged = existing.to_vec();
    for item in items {
        let Value::Object(patch) = item else { continue };
        let key = patch.get(merge_key);
        let position = merged
            .iter()
            .position(|e| key.is_some() && e.get(merge_key) == key);
        match (patch.get("$patch").and_then(Value::as_str), position) {
            (Some("delete"), Some(i)) => {
                merged.remove(i);
            }
            (Some("delete"), None) => {}
            (_, Some(i)) => {
                if let Value::Object(element) = &mut merged[i] {
                    merge_map(element, patch, path);
                }
            }
            (_, None) => merged.push(strip(item)),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn smp(target: Value, patch: Value) -> Value {
        let mut target = target;
        Patch::Strategic(patch)
            .apply(&ResourceType::namespace(), "x", &mut target)
            .unwrap();
        target
    }

    #[test]
    fn content_types() {
        let ns = ResourceType::namespace();
        let lease = ResourceType::lease();
        assert!(matches!(
            decode(&ns, MERGE_PATCH, b"{}").unwrap().patch,
            Patch::Merge(_)
        ));
        assert!(matches!(
            decode(&lease, STRATEGIC_MERGE_PATCH, b"{}").unwrap().patch,
            Patch::Strategic(_)
        ));
        assert!(matches!(
            decode(&ns, JSON_PATCH, b"[]").unwrap().patch,
            Patch::Json(_)
        ));
        let error = decode(&ns, "application/apply-patch+yaml", b"{}").unwrap_err();
        assert_eq!(error.code, 415);
        assert!(
            error
                .message
                .contains("application/strategic-merge-patch+json"),
            "{}",
            error.message
        );
        assert!(error.message.contains("application/merge-patch+json"));
        assert_eq!(decode(&ns, JSON_PATCH, b"{}").unwrap_err().code, 400);
        assert_eq!(decode(&ns, MERGE_PATCH, b"[]").unwrap_err().code, 400);
        assert_eq!(decode(&ns, MERGE_PATCH, b"{").unwrap_err().code, 400);
        assert_eq!(
            decode(&ns, MERGE_PATCH, br#"{"a":1,"a":2}"#)
                .unwrap()
                .duplicates,
            vec!["a"]
        );
    }

    #[test]
    fn pod_spec_lists_merge_by_their_keys() {
        // Any kind with strategic merge patch: the keys are the PodSpec's, not the kind's.
        let mut sts =
            ResourceType::new("apps", "v1", "StatefulSet", "statefulsets", true, json!({}));
        sts.strategic_merge_patch = true;
        let mut target = json!({"spec": {"template": {"spec": {
            "containers": [
                {"name": "main", "image": "a:1", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}],
                 "ports": [{"containerPort": 80, "name": "http"}]},
                {"name": "sidecar", "image": "s:1"}
            ],
            "tolerations": [{"key": "a"}]
        }}}});
        let patch = json!({"spec": {"template": {"spec": {
            "containers": [{"name": "main", "image": "a:2", "env": [{"name": "Y", "value": "3"}],
                            "ports": [{"containerPort": 80, "protocol": "TCP"}]}],
            "tolerations": [{"key": "b"}]
        }}}});
        Patch::Strategic(patch)
            .apply(&sts, "s", &mut target)
            .unwrap();
        assert_eq!(
            target,
            json!({"spec": {"template": {"spec": {
                "containers": [
                    {"name": "main", "image": "a:2", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "3"}],
                     "ports": [{"containerPort": 80, "name": "http", "protocol": "TCP"}]},
                    {"name": "sidecar", "image": "s:1"}
                ],
                "tolerations": [{"key": "b"}]
            }}}})
        );
        // A Pod's own spec, and deleting one container by its key.
        let mut pod = ResourceType::new("", "v1", "Pod", "pods", true, json!({}));
        pod.strategic_merge_patch = true;
        let mut target = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let patch = json!({"spec": {"containers": [{"name": "a", "$patch": "delete"}]}});
        Patch::Strategic(patch)
            .apply(&pod, "p", &mut target)
            .unwrap();
        assert_eq!(target, json!({"spec": {"containers": [{"name": "b"}]}}));
    }

    #[test]
    fn merge_and_json_patch() {
        let rt = ResourceType::lease();
        let mut object = json!({"metadata": {"name": "l", "labels": {"a": "1", "b": "2"}}, "spec": {"holderIdentity": "x"}});
        Patch::Merge(json!({"metadata": {"labels": {"a": null, "c": "3"}}, "spec": {"leaseDurationSeconds": 5}}))
            .apply(&rt, "l", &mut object)
            .unwrap();
        assert_eq!(object["metadata"]["labels"], json!({"b": "2", "c": "3"}));
        assert_eq!(
            object["spec"],
            json!({"holderIdentity": "x", "leaseDurationSeconds": 5})
        );

        let ops: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": "/spec/holderIdentity", "value": "x"},
            {"op": "replace", "path": "/spec/holderIdentity", "value": "y"}
        ]))
        .unwrap();
        Patch::Json(ops).apply(&rt, "l", &mut object).unwrap();
        assert_eq!(object["spec"]["holderIdentity"], "y");

        let failing: json_patch::Patch = serde_json::from_value(
            json!([{"op": "test", "path": "/spec/holderIdentity", "value": "x"}]),
        )
        .unwrap();
        let error = Patch::Json(failing)
            .apply(&rt, "l", &mut object)
            .unwrap_err();
        assert_eq!((error.code, error.reason), (422, "Invalid"));
    }

    #[test]
    fn resource_version_in_patches() {
        assert!(
            Patch::Merge(json!({"metadata": {"resourceVersion": "5"}})).sets_resource_version()
        );
        assert!(!Patch::Merge(json!({"metadata": {"labels": {}}})).sets_resource_version());
        let ops: json_patch::Patch = serde_json::from_value(
            json!([{"op": "replace", "path": "/metadata/resourceVersion", "value": "5"}]),
        )
        .unwrap();
        assert!(Patch::Json(ops).sets_resource_version());
    }

    #[test]
    fn strategic_maps_lists_and_directives() {
        let target = json!({
            "metadata": {"name": "x", "labels": {"a": "1", "b": "2"}, "finalizers": ["f1"],
                         "ownerReferences": [{"uid": "u1", "name": "o1"}, {"uid": "u2", "name": "o2"}]},
            "spec": {"finalizers": ["kubernetes"], "keep": 1, "drop": 2}
        });
        let patched = smp(
            target.clone(),
            json!({
                "metadata": {
                    "labels": {"a": null, "c": "3"},
                    "finalizers": ["f2"],
                    "$setElementOrder/finalizers": ["f1", "f2"],
                    "ownerReferences": [{"uid": "u2", "name": "renamed"}, {"uid": "u1", "$patch": "delete"}, {"uid": "u3", "name": "o3"}]
                },
                "spec": {"finalizers": ["other"]}
            }),
        );
        assert_eq!(patched["metadata"]["labels"], json!({"b": "2", "c": "3"}));
        assert_eq!(patched["metadata"]["finalizers"], json!(["f1", "f2"]));
        assert_eq!(
            patched["metadata"]["ownerReferences"],
            json!([{"uid": "u2", "name": "renamed"}, {"uid": "u3", "name": "o3"}])
        );
        assert_eq!(
            patched["spec"]["finalizers"],
            json!(["other"]),
            "lists replace"
        );

        let patched = smp(
            target.clone(),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["f1"]}}),
        );
        assert_eq!(patched["metadata"]["finalizers"], json!([]));

        let patched = smp(
            target.clone(),
            json!({"spec": {"$patch": "replace", "only": true}}),
        );
        assert_eq!(patched["spec"], json!({"only": true}));

        let patched = smp(target.clone(), json!({"spec": {"$patch": "delete"}}));
        assert!(patched.get("spec").is_none());

        let patched = smp(
            target.clone(),
            json!({"spec": {"$retainKeys": ["keep", "new"], "new": 3}}),
        );
        assert_eq!(patched["spec"], json!({"keep": 1, "new": 3}));

        let patched = smp(
            target,
            json!({"status": {"phase": "Active", "$retainKeys": ["phase", "nested"], "nested": {"$patch": "merge", "x": [{"$patch": "delete"}, 1]}}}),
        );
        assert_eq!(
            patched["status"],
            json!({"phase": "Active", "nested": {"x": [1]}})
        );
        assert!(
            !patched.to_string().contains('$'),
            "no directive is stored: {patched}"
        );
    }
}
