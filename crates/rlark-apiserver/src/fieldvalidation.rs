//! Checking an object against its structural schema, as kube-apiserver does for custom
//! resources: unknown fields are found (and pruned), `null`s of non-nullable fields are
//! dropped, and values of the wrong type, outside an `enum` or missing while `required`
//! become 422 causes.
//!
//! The top-level `metadata` (and that of `x-kubernetes-embedded-resource` objects whose
//! schema does not describe it) is checked against `ObjectMeta`.

use std::sync::LazyLock;

use serde_json::{Value, json};

use crate::error::{ApiError, Cause};

/// The `fieldValidation` directive of a write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum FieldValidation {
    /// Unknown or duplicate fields fail the request with 400.
    Strict,
    /// Unknown fields are pruned and reported as `Warning` headers (the default).
    #[default]
    Warn,
    /// Unknown fields are pruned silently.
    Ignore,
}

impl FieldValidation {
    /// Parse the query parameter; absent means [`FieldValidation::Warn`], anything unknown is 400.
    pub(crate) fn parse(value: Option<&str>) -> Result<Self, ApiError> {
        match value {
            None => Ok(Self::Warn),
            Some(v) if v.eq_ignore_ascii_case("strict") => Ok(Self::Strict),
            Some(v) if v.eq_ignore_ascii_case("warn") => Ok(Self::Warn),
            Some(v) if v.eq_ignore_ascii_case("ignore") => Ok(Self::Ignore),
            Some(v) => Err(ApiError::bad_request(format!(
                "fieldValidation: Unsupported value: {v:?}: supported values: \"Ignore\", \"Strict\", \"Warn\""
            ))),
        }
    }

    /// Apply the directive to what decoding and the schema walk found: `Err` (400) in strict
    /// mode when anything was found, else the `Warning` header values to send (none when
    /// ignoring). `unknown` and `duplicates` are field paths.
    pub(crate) fn judge(
        self,
        unknown: &[String],
        duplicates: &[String],
    ) -> Result<Vec<String>, ApiError> {
        let problems: Vec<String> = unknown
            .iter()
            .map(|f| format!("unknown field \"{f}\""))
            .chain(
                duplicates
                    .iter()
                    .map(|f| format!("duplicate field \"{f}\"")),
            )
            .collect();
        match self {
            _ if problems.is_empty() => Ok(Vec::new()),
            Self::Strict => {
                // Named one by one up to the warning cap, then counted: the message stays
                // small whatever the body holds.
                let shown = crate::output::MAX_WARNINGS.min(problems.len());
                let mut message = problems[..shown].join(", ");
                if problems.len() > shown {
                    message.push_str(&format!(", and {} more", problems.len() - shown));
                }
                Err(ApiError::bad_request(format!(
                    "strict decoding error: {message}"
                )))
            }
            Self::Warn => Ok(problems),
            Self::Ignore => Ok(Vec::new()),
        }
    }
}

/// What [`check`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct SchemaReport {
    /// Paths of fields the schema does not know (already removed from the object).
    pub unknown: Vec<String>,
    /// Type, enum and required-field violations.
    pub causes: Vec<Cause>,
}

/// `metav1.ObjectMeta`, as a structural schema.
static OBJECT_META: LazyLock<Value> = LazyLock::new(|| {
    let string = json!({"type": "string"});
    let string_map = json!({"type": "object", "additionalProperties": {"type": "string"}});
    json!({
        "type": "object",
        "properties": {
            "name": string, "generateName": string, "namespace": string, "uid": string,
            "resourceVersion": string, "selfLink": string, "creationTimestamp": string,
            "deletionTimestamp": string,
            "generation": {"type": "integer"},
            "deletionGracePeriodSeconds": {"type": "integer"},
            "labels": string_map, "annotations": string_map,
            "finalizers": {"type": "array", "items": {"type": "string"}},
            "ownerReferences": {"type": "array", "items": {
                "type": "object",
                "required": ["apiVersion", "kind", "name", "uid"],
                "properties": {
                    "apiVersion": string, "kind": string, "name": string, "uid": string,
                    "controller": {"type": "boolean"}, "blockOwnerDeletion": {"type": "boolean"}
                }
            }},
            "managedFields": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
        }
    })
});

/// Walk `object` (a whole resource) against `schema` (its structural OpenAPI v3 schema),
/// removing unknown fields and `null`s of non-nullable fields.
pub(crate) fn check(schema: &Value, object: &mut Value) -> SchemaReport {
    let mut report = SchemaReport::default();
    walk_object(schema, object, "", Embedding::Root, &mut report);
    report
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Embedding {
    /// The resource itself: `apiVersion`, `kind` and `metadata` (as ObjectMeta) are known.
    Root,
    /// An `x-kubernetes-embedded-resource` object: the same, unless its schema says more.
    Embedded,
    Plain,
}

/// `path.key` (`key` at the top level), as Kubernetes names fields.
pub(crate) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn flag(schema: &Value, name: &str) -> bool {
    schema.get(name).and_then(Value::as_bool).unwrap_or(false)
}

/// The schema of property `key`, also looking inside `allOf`/`anyOf`/`oneOf` branches
/// (leniency for generated schemas; structural schemas keep properties at the top).
fn property<'a>(schema: &'a Value, key: &str) -> Option<&'a Value> {
    schema
        .get("properties")
        .and_then(|p| p.get(key))
        .or_else(|| {
            ["allOf", "anyOf", "oneOf"].iter().find_map(|combinator| {
                schema
                    .get(*combinator)
                    .and_then(Value::as_array)
                    .and_then(|branches| {
                        branches
                            .iter()
                            .find_map(|b| b.get("properties").and_then(|p| p.get(key)))
                    })
            })
        })
}

static ANY: LazyLock<Value> = LazyLock::new(|| json!({}));
static PRESERVE: LazyLock<Value> =
    LazyLock::new(|| json!({"x-kubernetes-preserve-unknown-fields": true}));
static STRING: LazyLock<Value> = LazyLock::new(|| json!({"type": "string"}));

/// Check one value against its schema node.
fn walk(schema: &Value, value: &mut Value, path: &str, report: &mut SchemaReport) {
    if flag(schema, "x-kubernetes-int-or-string") {
        if !(value.is_string() || value.is_i64() || value.is_u64()) {
            type_error(value, path, "integer or string", report);
        }
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !value.is_null()
        && !allowed.contains(value)
    {
        let supported: Vec<String> = allowed.iter().map(Value::to_string).collect();
        report.causes.push(Cause {
            reason: "FieldValueNotSupported".into(),
            message: format!(
                "Unsupported value: {value}: supported values: {}",
                supported.join(", ")
            ),
            field: path.to_string(),
        });
        return;
    }
    let expected = schema.get("type").and_then(Value::as_str);
    let ok = match (expected, &*value) {
        (None, _) => true,
        (Some("integer"), Value::Number(n)) => !n.is_f64(),
        (Some("number"), Value::Number(_)) => true,
        (Some("string"), Value::String(_))
        | (Some("boolean"), Value::Bool(_))
        | (Some("array"), Value::Array(_))
        | (Some("object"), Value::Object(_)) => true,
        (Some(_), Value::Null) => flag(schema, "nullable"),
        _ => false,
    };
    if !ok {
        type_error(value, path, expected.unwrap_or("unknown"), report);
        return;
    }
    match value {
        Value::Object(_) => {
            let embedding = if flag(schema, "x-kubernetes-embedded-resource") {
                Embedding::Embedded
            } else {
                Embedding::Plain
            };
            walk_object(schema, value, path, embedding, report);
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(item_schema, item, &format!("{path}[{i}]"), report);
                }
            }
        }
        _ => {}
    }
}

fn type_error(value: &Value, path: &str, expected: &str, report: &mut SchemaReport) {
    let actual = type_name(value);
    report.causes.push(Cause {
        reason: "FieldValueTypeInvalid".into(),
        message: format!(
            "Invalid value: \"{actual}\": {path} in body must be of type {expected}: \"{actual}\""
        ),
        field: path.to_string(),
    });
}

fn walk_object(
    schema: &Value,
    value: &mut Value,
    path: &str,
    embedding: Embedding,
    report: &mut SchemaReport,
) {
    let Value::Object(map) = value else { return };
    let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
    let additional = schema.get("additionalProperties");
    let resource_like = embedding != Embedding::Plain;

    for required in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(name) = required.as_str()
            && map.get(name).is_none_or(Value::is_null)
        {
            report.causes.push(Cause {
                reason: "FieldValueRequired".into(),
                message: "Required value".into(),
                field: join(path, name),
            });
        }
    }

    let keys: Vec<String> = map.keys().cloned().collect();
    // Keys to prune, removed in one pass at the end: one `shift_remove` per key would be
    // quadratic in the object's size (50,000 unknown keys took minutes).
    let mut pruned = std::collections::HashSet::new();
    for key in keys {
        // (schema, whether the key is a named field rather than a map entry)
        let child_schema: Option<(&Value, bool)> = match key.as_str() {
            "metadata" if embedding == Embedding::Root => Some((&*OBJECT_META, true)),
            "metadata" if embedding == Embedding::Embedded => Some((
                property(schema, "metadata")
                    .filter(|s| s.get("properties").is_some())
                    .unwrap_or(&*OBJECT_META),
                true,
            )),
            "apiVersion" | "kind" if resource_like => {
                Some((property(schema, &key).unwrap_or(&*STRING), true))
            }
            _ => match property(schema, &key) {
                Some(s) => Some((s, true)),
                None => match additional {
                    Some(s @ Value::Object(_)) => Some((s, false)),
                    Some(Value::Bool(true)) => Some((&*ANY, false)),
                    _ if preserve => Some((&*PRESERVE, true)),
                    _ => None,
                },
            },
        };
        let Some((child_schema, named)) = child_schema else {
            report.unknown.push(join(path, &key));
            pruned.insert(key);
            continue;
        };
        // Map entries are named as Kubernetes' field paths name them: `labels[key]`.
        let child_path = if named {
            join(path, &key)
        } else {
            format!("{path}[{key}]")
        };
        let Some(child) = map.get_mut(&key) else {
            continue;
        };
        if child.is_null() && !flag(child_schema, "nullable") {
            // Kubernetes drops nulls of non-nullable fields before validating.
            pruned.insert(key);
            continue;
        }
        walk(child_schema, child, &child_path, report);
    }
    if !pruned.is_empty() {
        map.retain(|key, _| !pruned.contains(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "spec": {"type": "object", "required": ["cidr"], "properties": {
                    "cidr": {"type": "string"},
                    "count": {"type": "integer"},
                    "ratio": {"type": "number", "nullable": true},
                    "role": {"type": "string", "enum": ["Actor", "Rollout", "Env"]},
                    "tasks": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
                    "selector": {"type": "object", "additionalProperties": {"type": "string"}},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {"known": {"type": "integer"}}},
                    "quantity": {"x-kubernetes-int-or-string": true},
                    "template": {"type": "object", "x-kubernetes-embedded-resource": true, "properties": {"spec": {"type": "object", "properties": {}}}}
                }},
                "status": {"type": "object", "properties": {"phase": {"type": "string"}}}
            }
        })
    }

    #[test]
    fn unknown_fields_are_found_and_pruned() {
        let mut object = json!({
            "apiVersion": "rlinf.io/v1alpha1", "kind": "Domain",
            "metadata": {"name": "d", "labels": {"a": "b"}, "bogus": 1, "creationTimestamp": null},
            "spec": {"cidr": "10.0.0.0/8", "foo": 1, "tasks": [{"name": "a", "extra": true}],
                     "selector": {"any": "thing"}, "free": {"whatever": [1], "known": 2},
                     "quantity": "1Gi",
                     "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "nope": 1}, "spec": {"x": 1}}},
            "bar": {}
        });
        let report = check(&schema(), &mut object);
        assert_eq!(
            report.unknown,
            vec![
                "metadata.bogus",
                "spec.foo",
                "spec.tasks[0].extra",
                "spec.template.metadata.nope",
                "spec.template.spec.x",
                "bar"
            ]
        );
        assert!(report.causes.is_empty(), "{:?}", report.causes);
        assert_eq!(
            object,
            json!({
                "apiVersion": "rlinf.io/v1alpha1", "kind": "Domain",
                "metadata": {"name": "d", "labels": {"a": "b"}},
                "spec": {"cidr": "10.0.0.0/8", "tasks": [{"name": "a"}], "selector": {"any": "thing"},
                         "free": {"whatever": [1], "known": 2}, "quantity": "1Gi",
                         "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}}}
            })
        );
    }

    #[test]
    fn types_enums_and_required_fields() {
        let mut object = json!({
            "metadata": {"name": "d", "labels": {"a": 1}, "generation": "x"},
            "spec": {"count": 1.5, "ratio": null, "role": "Boss", "tasks": {}, "selector": {"k": 2}, "free": {"known": "2"}, "quantity": true}
        });
        let report = check(&schema(), &mut object);
        let fields: Vec<(&str, &str)> = report
            .causes
            .iter()
            .map(|c| (c.field.as_str(), c.reason.as_str()))
            .collect();
        assert_eq!(
            fields,
            vec![
                ("metadata.labels[a]", "FieldValueTypeInvalid"),
                ("metadata.generation", "FieldValueTypeInvalid"),
                ("spec.cidr", "FieldValueRequired"),
                ("spec.count", "FieldValueTypeInvalid"),
                ("spec.role", "FieldValueNotSupported"),
                ("spec.tasks", "FieldValueTypeInvalid"),
                ("spec.selector[k]", "FieldValueTypeInvalid"),
                ("spec.free.known", "FieldValueTypeInvalid"),
                ("spec.quantity", "FieldValueTypeInvalid"),
            ]
        );
        assert_eq!(
            report.causes[3].message,
            "Invalid value: \"number\": spec.count in body must be of type integer: \"number\""
        );
        assert_eq!(
            report.causes[4].message,
            "Unsupported value: \"Boss\": supported values: \"Actor\", \"Rollout\", \"Env\""
        );
        assert!(object["spec"].get("ratio").is_some(), "nullable nulls stay");
    }

    #[test]
    fn directives() {
        assert_eq!(FieldValidation::parse(None).unwrap(), FieldValidation::Warn);
        assert_eq!(
            FieldValidation::parse(Some("Strict")).unwrap(),
            FieldValidation::Strict
        );
        assert_eq!(
            FieldValidation::parse(Some("Ignore")).unwrap(),
            FieldValidation::Ignore
        );
        assert_eq!(FieldValidation::parse(Some("Loose")).unwrap_err().code, 400);
        let unknown = vec!["spec.foo".to_string(), "spec.bar".to_string()];
        let error = FieldValidation::Strict.judge(&unknown, &[]).unwrap_err();
        assert_eq!(
            error.message,
            "strict decoding error: unknown field \"spec.foo\", unknown field \"spec.bar\""
        );
        assert_eq!(
            FieldValidation::Warn
                .judge(&unknown[..1], &["a".to_string()])
                .unwrap(),
            vec!["unknown field \"spec.foo\"", "duplicate field \"a\""]
        );
        assert!(
            FieldValidation::Ignore
                .judge(&unknown, &[])
                .unwrap()
                .is_empty()
        );
        assert!(FieldValidation::Strict.judge(&[], &[]).unwrap().is_empty());
    }
}
