//! The `scale` subresource of the kinds that have it
//! ([`ResourceType::scale_subresource`]: none of rlark's own; workloads among the extra kinds
//! a program serves): an `autoscaling/v1` `Scale` view of `spec.replicas`, `status.replicas`
//! and `spec.selector`. Writing it writes `spec.replicas` of the object; nothing else of a
//! `Scale` is writable.

use std::sync::Arc;

use axum::response::Response;
use http::StatusCode;
use serde_json::{Value, json};

use crate::Inner;
use crate::error::{ApiError, Cause};
use crate::lifecycle::WriteOptions;
use crate::object::key;
use crate::output::json_response;
use crate::patch::{self, DecodedPatch, Patch};
use crate::registry::ResourceType;
use crate::request::{Target, Verb};

/// A label selector (`spec.selector`) in its string form (`a=b,c in (d,e)`).
fn selector_string(selector: Option<&Value>) -> String {
    let Some(selector) = selector else {
        return String::new();
    };
    let mut parts: Vec<String> = selector
        .get("matchLabels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
        .collect();
    for expression in selector
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = expression.get("key").and_then(Value::as_str).unwrap_or("");
        let values: Vec<&str> = expression
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        match expression.get("operator").and_then(Value::as_str) {
            Some("In") => parts.push(format!("{key} in ({})", values.join(","))),
            Some("NotIn") => parts.push(format!("{key} notin ({})", values.join(","))),
            Some("Exists") => parts.push(key.to_string()),
            Some("DoesNotExist") => parts.push(format!("!{key}")),
            _ => {}
        }
    }
    parts.join(",")
}

/// The `Scale` of a stored workload.
fn scale_of(object: &Value) -> Value {
    let meta = object.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let field = |name: &str| meta.get(name).cloned().unwrap_or(Value::Null);
    json!({
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {
            "name": field("name"),
            "namespace": field("namespace"),
            "uid": field("uid"),
            "resourceVersion": field("resourceVersion"),
            "creationTimestamp": field("creationTimestamp"),
        },
        "spec": {"replicas": object.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1)},
        "status": {
            "replicas": object.pointer("/status/replicas").and_then(Value::as_i64).unwrap_or(0),
            "selector": selector_string(object.pointer("/spec/selector")),
        },
    })
}

/// `spec.replicas` of a written `Scale`: a non-negative integer, else 422.
fn replicas_of(rt: &ResourceType, name: &str, scale: &Value) -> Result<i64, ApiError> {
    match scale.pointer("/spec/replicas").and_then(Value::as_i64) {
        Some(n) if (0..=i64::from(i32::MAX)).contains(&n) => Ok(n),
        _ => Err(ApiError::invalid(
            rt,
            name,
            vec![Cause {
                reason: "FieldValueInvalid".into(),
                message: format!(
                    "Invalid value: {}: must be a non-negative 32-bit integer",
                    scale.pointer("/spec/replicas").unwrap_or(&Value::Null)
                ),
                field: "spec.replicas".into(),
            }],
        )),
    }
}

/// Serve `get`, `update` or `patch` of `target`'s scale.
pub(crate) async fn serve(
    inner: &Arc<Inner>,
    target: &Target,
    verb: Verb,
    body: Option<(String, bytes::Bytes)>,
    options: WriteOptions,
) -> Result<Response, ApiError> {
    let rt = &target.rt;
    let namespace = target.namespace.clone().unwrap_or_default();
    let name = target.name.clone().unwrap_or_default();
    let current = inner
        .store
        .get(&key(rt, &namespace, &name))
        .await
        .map_err(|e| ApiError::from_store(e, rt, &name))?
        .ok_or_else(|| ApiError::not_found(rt, &name))?;
    let current_scale = scale_of(&current);
    let written = match (verb, body) {
        (Verb::Get, _) => return Ok(respond(&current_scale)),
        (Verb::Update, Some((_, bytes))) => {
            let scale: Value = serde_json::from_slice(&bytes).map_err(|e| {
                ApiError::bad_request(format!("couldn't decode Scale: json parse error: {e}"))
            })?;
            let replicas = replicas_of(rt, &name, &scale)?;
            let mut patch = json!({"spec": {"replicas": replicas}});
            // A resourceVersion in the Scale is a precondition on the object.
            if let Some(rv) = scale
                .pointer("/metadata/resourceVersion")
                .filter(|v| v.as_str().is_some_and(|s| !s.is_empty()))
            {
                patch["metadata"] = json!({"resourceVersion": rv});
            }
            write(inner, rt, &namespace, &name, patch, options).await?
        }
        (Verb::Patch, Some((media_type, bytes))) => {
            let decoded = patch::decode(rt, &media_type, &bytes)?;
            let mut scale = current_scale;
            decoded.patch.apply(rt, &name, &mut scale)?;
            let replicas = replicas_of(rt, &name, &scale)?;
            let mut patch = json!({"spec": {"replicas": replicas}});
            if decoded.patch.sets_resource_version() {
                patch["metadata"] = json!({"resourceVersion": scale.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null)});
            }
            write(inner, rt, &namespace, &name, patch, options).await?
        }
        _ => {
            return Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({}/scale)",
                rt.qualified_name()
            )));
        }
    };
    Ok(respond(&scale_of(&written)))
}

async fn write(
    inner: &Arc<Inner>,
    rt: &ResourceType,
    namespace: &str,
    name: &str,
    patch: Value,
    options: WriteOptions,
) -> Result<Value, ApiError> {
    let decoded = DecodedPatch {
        patch: Patch::Merge(patch),
        duplicates: vec![],
    };
    let written = inner
        .patch(rt, namespace, name, false, decoded, options)
        .await?;
    Ok(Value::clone(&written.object))
}

fn respond(scale: &Value) -> Response {
    json_response(
        StatusCode::OK,
        serde_json::to_vec(scale).unwrap_or_default(),
        &[],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_view_of_a_workload() {
        let sts = json!({
            "metadata": {"name": "s", "namespace": "w", "uid": "u", "resourceVersion": "7"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "a"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["x", "y"]},
                                     {"key": "gone", "operator": "DoesNotExist"}]}},
            "status": {"replicas": 2}
        });
        let scale = scale_of(&sts);
        assert_eq!(scale["spec"]["replicas"], 3);
        assert_eq!(scale["status"]["replicas"], 2);
        assert_eq!(scale["status"]["selector"], "app=a,tier in (x,y),!gone");
        assert_eq!(scale["metadata"]["resourceVersion"], "7");
    }

    #[test]
    fn replicas_must_be_a_non_negative_integer() {
        let mut rt =
            ResourceType::new("apps", "v1", "StatefulSet", "statefulsets", true, json!({}));
        rt.scale_subresource = true;
        assert_eq!(
            replicas_of(&rt, "s", &json!({"spec": {"replicas": 0}})).unwrap(),
            0
        );
        for bad in [
            json!({"spec": {"replicas": -1}}),
            json!({"spec": {}}),
            json!({"spec": {"replicas": "2"}}),
        ] {
            assert_eq!(replicas_of(&rt, "s", &bad).unwrap_err().code, 422, "{bad}");
        }
    }
}
