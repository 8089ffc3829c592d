//! Admission: the checks every object passes before it is written. Object metadata is
//! validated as Kubernetes validates `ObjectMeta`; the body by the schema walk
//! ([`crate::fieldvalidation`]) and by the kind's validator from `rlark-api`. Some
//! identities are further restricted in what they may write ([`identity_admission`]).

use serde_json::Value;

use crate::auth::{Identity, Role};
use crate::error::{ApiError, Cause};
use crate::registry::ResourceType;

/// Kubernetes' limit on the total size of annotations.
const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

fn invalid(field: &str, value: &str, message: &str) -> Cause {
    Cause {
        reason: "FieldValueInvalid".into(),
        message: format!("Invalid value: {value:?}: {message}"),
        field: field.into(),
    }
}

/// Every problem with `object`'s metadata.
pub(crate) fn metadata_causes(rt: &ResourceType, object: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let meta = object.get("metadata");
    let str_at = |key: &str| {
        meta.and_then(|m| m.get(key))
            .and_then(Value::as_str)
            .unwrap_or("")
    };

    let name = str_at("name");
    if name.is_empty() {
        causes.push(Cause {
            reason: "FieldValueRequired".into(),
            message: "Required value: name or generateName is required".into(),
            field: "metadata.name".into(),
        });
    } else {
        // Namespaces become DNS labels (and label values), everything else a subdomain.
        let errors = if rt.group.is_empty() && rt.kind == "Namespace" {
            rlark_api::names::dns1123_label_errors(name)
        } else {
            rlark_api::names::dns1123_subdomain_errors(name)
        };
        causes.extend(errors.iter().map(|e| invalid("metadata.name", name, e)));
    }

    if let Some(labels) = meta
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object)
    {
        for (key, value) in labels {
            for error in rlark_api::names::qualified_name_errors(key) {
                causes.push(invalid("metadata.labels", key, &error));
            }
            if let Some(value) = value.as_str() {
                for error in rlark_api::names::label_value_errors(value) {
                    causes.push(invalid("metadata.labels", value, &error));
                }
            }
        }
    }

    if let Some(annotations) = meta
        .and_then(|m| m.get("annotations"))
        .and_then(Value::as_object)
    {
        let mut total = 0;
        for (key, value) in annotations {
            total += key.len() + value.as_str().map_or(0, str::len);
            for error in rlark_api::names::qualified_name_errors(&key.to_ascii_lowercase()) {
                causes.push(invalid("metadata.annotations", key, &error));
            }
        }
        if total > TOTAL_ANNOTATION_SIZE_LIMIT {
            causes.push(Cause {
                reason: "FieldValueTooLong".into(),
                message: format!(
                    "Too long: may not be more than {TOTAL_ANNOTATION_SIZE_LIMIT} bytes"
                ),
                field: "metadata.annotations".into(),
            });
        }
    }

    for (i, finalizer) in meta
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        if let Some(finalizer) = finalizer.as_str() {
            for error in rlark_api::names::qualified_name_errors(finalizer) {
                causes.push(invalid(
                    &format!("metadata.finalizers[{i}]"),
                    finalizer,
                    &error,
                ));
            }
        }
    }

    let owners = meta
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array);
    let mut controllers = 0;
    for (i, owner) in owners.into_iter().flatten().enumerate() {
        for key in ["apiVersion", "kind", "name", "uid"] {
            if owner.get(key).and_then(Value::as_str) == Some("") {
                causes.push(invalid(
                    &format!("metadata.ownerReferences[{i}].{key}"),
                    "",
                    &format!("{key} must not be empty"),
                ));
            }
        }
        if owner.get("controller").and_then(Value::as_bool) == Some(true) {
            controllers += 1;
        }
    }
    if controllers > 1 {
        causes.push(Cause {
            reason: "FieldValueInvalid".into(),
            message: "Invalid value: \"\": Only one reference can have Controller set to true"
                .into(),
            field: "metadata.ownerReferences".into(),
        });
    }
    causes
}

/// Admit `object` for writing: 422 (`Invalid`, one cause per problem) unless its metadata,
/// the schema walk (`schema_causes`) and the kind's validator all accept it. The validator
/// only sees well-typed objects: when the schema walk found type errors those are reported
/// instead, so one mistake does not come back twice in two wordings.
pub(crate) fn admit(
    rt: &ResourceType,
    object: &Value,
    schema_causes: Vec<Cause>,
) -> Result<(), ApiError> {
    let mut causes = metadata_causes(rt, object);
    if schema_causes.is_empty() {
        if let Some(validator) = &rt.validator
            && let Err(errors) = validator(object)
        {
            // A kind's own naming rule (e.g. Job names must be DNS labels, stricter than the
            // generic subdomain rule) is the one to report: one problem, one message.
            if errors.iter().any(|e| e.field == "metadata.name") {
                causes.retain(|c| c.field != "metadata.name");
            }
            causes.extend(errors.iter().map(Cause::from));
        }
    } else {
        causes.extend(schema_causes);
    }
    if causes.is_empty() {
        return Ok(());
    }
    // The same field reported twice (metadata check and validator) is one problem.
    let mut seen = std::collections::HashSet::new();
    causes.retain(|c| seen.insert((c.field.clone(), c.message.clone())));
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    Err(ApiError::invalid(rt, name, causes))
}

/// Defaulting of rlark's kinds before the schema walk and admission: a task spec without
/// `agentType` takes it from its one runtime block ([`rlark_api::defaults`]). The defaulted
/// value is stored, so reads show it. Other kinds are left alone.
pub(crate) fn apply_defaults(rt: &ResourceType, object: &mut Value) {
    if rt.group == rlark_api::GROUP {
        rlark_api::defaults::default_agent_types(&rt.kind, object);
    }
}

/// The `Warning`s for RLark fields set in a Job, Workflow or Task that its tasks'
/// `agentType` does not act on (the table is [`rlark_api::inert`]); none for other kinds,
/// for status writes, or for a spec that does not decode (admission refuses it anyway).
pub(crate) fn inert_field_warnings(rt: &ResourceType, object: &Value) -> Vec<String> {
    if rt.group != rlark_api::GROUP {
        return Vec::new();
    }
    let Some(spec) = object.get("spec") else {
        return Vec::new();
    };
    fn decode<T: serde::de::DeserializeOwned>(spec: &Value) -> Option<T> {
        serde_json::from_value(spec.clone()).ok()
    }
    match rt.plural.as_str() {
        "jobs" => decode(spec)
            .map(|s| rlark_api::inert::job_warnings(&s))
            .unwrap_or_default(),
        "workflows" => decode(spec)
            .map(|s| rlark_api::inert::workflow_warnings(&s))
            .unwrap_or_default(),
        "tasks" => decode(spec)
            .map(|s| rlark_api::inert::task_warnings(&s))
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// Identity-specific admission of an object about to be written by `identity`, beyond what
/// [`crate::authz`] can decide from the URL (`old`: the stored object for an update or
/// patch, `None` for a create). It may fill in fields the server owns:
/// - an agent: see [`crate::agent_admission`] (identity labels, Node reporter, Event
///   reporter);
/// - a task token may only create core Events whose `involvedObject` is its own Task (kind
///   `Task`, its name, its namespace when given, group `rlinf.io` when an `apiVersion` is
///   given).
///
/// `Err` carries the reason for a 403 (`... is forbidden: <reason>`).
pub(crate) fn identity_admission(
    identity: &Identity,
    rt: &ResourceType,
    object: &mut Value,
    old: Option<&Value>,
) -> Result<(), String> {
    let (namespace, name) = match identity.role() {
        Role::Agent { cluster_id } => {
            return crate::agent_admission::admit(&identity.user, &cluster_id, rt, object, old);
        }
        Role::Task { namespace, name } => (namespace, name),
        _ => return Ok(()),
    };
    if !(rt.group.is_empty() && rt.plural == "events") {
        return Ok(());
    }
    let involved = object.get("involvedObject");
    let field = |key: &str| {
        involved
            .and_then(|o| o.get(key))
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    let group_ok = match field("apiVersion") {
        "" => true,
        api_version => api_version.split_once('/').map(|(group, _)| group) == Some("rlinf.io"),
    };
    let namespace_ok = field("namespace").is_empty() || field("namespace") == namespace;
    if field("kind") == "Task" && field("name") == name && namespace_ok && group_ok {
        return Ok(());
    }
    Err(format!(
        "User {:?} may only create events whose involvedObject is its own Task (kind \"Task\", name {name:?}, namespace {namespace:?})",
        identity.user
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn task_tokens_post_events_about_themselves_only() {
        let events = ResourceType::event();
        let token = Identity::task("rlark-a", "t1");
        let about =
            |involved: Value| json!({"metadata": {"name": "e"}, "involvedObject": involved});
        for good in [
            json!({"kind": "Task", "name": "t1", "namespace": "rlark-a", "apiVersion": "rlinf.io/v1alpha1"}),
            json!({"kind": "Task", "name": "t1"}),
        ] {
            assert_eq!(
                identity_admission(&token, &events, &mut about(good.clone()), None),
                Ok(()),
                "{good}"
            );
        }
        for bad in [
            json!({"kind": "Task", "name": "t2", "namespace": "rlark-a"}),
            json!({"kind": "Task", "name": "t1", "namespace": "rlark-b"}),
            json!({"kind": "Pod", "name": "t1"}),
            json!({"kind": "Task", "name": "t1", "apiVersion": "v1"}),
            json!({}),
            Value::Null,
        ] {
            let reason = identity_admission(&token, &events, &mut about(bad.clone()), None)
                .expect_err("refused");
            assert_eq!(
                reason,
                r#"User "system:rlark:task:rlark-a:t1" may only create events whose involvedObject is its own Task (kind "Task", name "t1", namespace "rlark-a")"#,
                "{bad}"
            );
        }
        // Other identities and other kinds are not this check's business.
        assert!(
            identity_admission(&Identity::agent("a"), &events, &mut about(json!({})), None).is_ok()
        );
        assert!(identity_admission(&token, &ResourceType::lease(), &mut json!({}), None).is_ok());
    }

    #[test]
    fn names_follow_the_kind() {
        let ns = ResourceType::namespace();
        let lease = ResourceType::lease();
        assert!(metadata_causes(&ns, &json!({"metadata": {"name": "dev"}})).is_empty());
        let causes = metadata_causes(&ns, &json!({"metadata": {"name": "a.b"}}));
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].field, "metadata.name");
        assert!(metadata_causes(&lease, &json!({"metadata": {"name": "a.b"}})).is_empty());
        let causes = metadata_causes(&lease, &json!({"metadata": {"name": "Bad_Name"}}));
        assert_eq!(causes[0].reason, "FieldValueInvalid");
        assert!(
            causes[0]
                .message
                .starts_with("Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain"),
            "{}",
            causes[0].message
        );
        let causes = metadata_causes(&lease, &json!({"metadata": {}}));
        assert_eq!(
            (causes[0].field.as_str(), causes[0].reason.as_str()),
            ("metadata.name", "FieldValueRequired")
        );
    }

    #[test]
    fn labels_annotations_finalizers_owners() {
        let lease = ResourceType::lease();
        let object = json!({"metadata": {
            "name": "ok",
            "labels": {"good": "v", "bad key": "v", "k": "-bad-"},
            "annotations": {"rlark.io/x": "anything at all", "/bad": ""},
            "finalizers": ["rlinf.io/cleanup", "not valid!"],
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "X", "name": "a", "uid": "", "controller": true},
                {"apiVersion": "v1", "kind": "X", "name": "b", "uid": "u", "controller": true}
            ]
        }});
        let fields: Vec<String> = metadata_causes(&lease, &object)
            .into_iter()
            .map(|c| c.field)
            .collect();
        assert_eq!(
            fields,
            vec![
                "metadata.labels",
                "metadata.labels",
                "metadata.annotations",
                "metadata.finalizers[1]",
                "metadata.ownerReferences[0].uid",
                "metadata.ownerReferences"
            ]
        );
    }

    #[test]
    fn a_bad_name_is_reported_once_by_the_kinds_own_rule() {
        let registry = crate::registry::Registry::builtin();
        let workflows = registry
            .get("rlinf.io", "v1alpha1", "workflows")
            .expect("workflows");
        let object = json!({
            "apiVersion": "rlinf.io/v1alpha1", "kind": "Workflow", "metadata": {"name": "Bad_Name"},
            "spec": {"jobTemplates": [{"name": "a", "spec": {"tasks": [
                {"name": "t", "role": "Actor", "agentType": "Raw", "raw": {"entrypoint": ["true"]}}]}}]}
        });
        let error = admit(&workflows, &object, Vec::new()).expect_err("invalid name");
        let name_causes: Vec<&Cause> = error
            .causes
            .iter()
            .filter(|c| c.field == "metadata.name")
            .collect();
        assert_eq!(name_causes.len(), 1, "{:?}", error.causes);
        assert!(
            name_causes[0].message.contains("RFC 1123 label"),
            "{}",
            name_causes[0].message
        );
    }

    #[test]
    fn admit_reports_schema_causes_instead_of_validator() {
        let lease = ResourceType::lease();
        assert!(admit(&lease, &json!({"metadata": {"name": "l"}}), vec![]).is_ok());
        let cause = Cause {
            reason: "FieldValueTypeInvalid".into(),
            message: "bad".into(),
            field: "spec.x".into(),
        };
        let error = admit(&lease, &json!({"metadata": {"name": "BAD"}}), vec![cause]).unwrap_err();
        assert_eq!(error.code, 422);
        assert_eq!(error.causes.len(), 2);
        assert_eq!(error.causes[1].field, "spec.x");
    }
}
