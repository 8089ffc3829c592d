//! Kubernetes object metadata rules, in one place for every backend: the shape an object must
//! have, what `create` fills in (`uid`, `creationTimestamp`, `generation`), what `update` keeps
//! and bumps (`uid` and `creationTimestamp` kept, `generation` +1 on a spec change, no write at
//! all for a no-op), the optimistic-concurrency precondition, and `resourceVersion`.
//!
//! [`evaluate`] decides what one write does to the current state of its key; it is pure (no IO,
//! no locks), so the engine can run it for a whole batch against memory plus the earlier writes
//! of the same batch. The API server uses [`fill_create_metadata`] for dry-run creates, so a
//! dry run shows exactly what a real create stores.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::{EventType, ObjectKey, Revision, StoreError};

/// Top-level fields whose changes do not bump `metadata.generation`.
const NON_SPEC_FIELDS: [&str; 4] = ["apiVersion", "kind", "metadata", "status"];

/// One write as the engine receives it, already through [`validate`] / [`prepare_create`].
#[derive(Clone)]
pub(crate) enum Op {
    /// The object carries uid, creationTimestamp and generation ([`prepare_create`]).
    Create(Value),
    Update {
        object: Value,
        expected: Option<Revision>,
    },
    Delete {
        expected: Option<Revision>,
    },
}

/// The state a write is evaluated against.
#[derive(Clone)]
pub(crate) struct Current {
    pub(crate) revision: Revision,
    pub(crate) object: Arc<Value>,
}

/// What a write does.
pub(crate) enum Outcome {
    /// Store `object` (for deletions: the last state) with the revision given to [`evaluate`].
    Write {
        event_type: EventType,
        object: Value,
    },
    /// No-op update: the stored object, unchanged, same revision, no event.
    Unchanged(Arc<Value>),
}

/// Decide what `op` does to `current` (the key's state, `None` = absent), giving the written
/// object `revision` as its `resourceVersion`.
pub(crate) fn evaluate(
    key: &ObjectKey,
    op: Op,
    current: Option<Current>,
    revision: Revision,
) -> Result<Outcome, StoreError> {
    let check =
        |stored: Option<Current>, expected: Option<Revision>| -> Result<Current, StoreError> {
            let stored = stored.ok_or_else(|| StoreError::NotFound(key.clone()))?;
            match expected {
                Some(expected) if expected != stored.revision => Err(StoreError::Conflict {
                    key: key.clone(),
                    expected,
                    actual: stored.revision,
                }),
                _ => Ok(stored),
            }
        };
    match op {
        Op::Create(mut object) => {
            if current.is_some() {
                return Err(StoreError::AlreadyExists(key.clone()));
            }
            set_resource_version(&mut object, revision);
            Ok(Outcome::Write {
                event_type: EventType::Added,
                object,
            })
        }
        Op::Update {
            mut object,
            expected,
        } => {
            let stored = check(current, expected)?;
            let old = &*stored.object;
            let generation = generation_of(old);
            let generation = if same_spec(old, &object) {
                generation
            } else {
                generation + 1
            };
            let old_meta = old.get("metadata").and_then(Value::as_object);
            if let Some(meta) = metadata_mut(&mut object) {
                for field in ["uid", "creationTimestamp"] {
                    match old_meta.and_then(|m| m.get(field)) {
                        Some(value) => {
                            meta.insert(field.to_owned(), value.clone());
                        }
                        None => {
                            meta.remove(field);
                        }
                    }
                }
                meta.insert("generation".to_owned(), Value::from(generation));
            }
            // Compare with the stored resourceVersion in place: equal means a no-op.
            set_resource_version(&mut object, stored.revision);
            if object == *old {
                return Ok(Outcome::Unchanged(stored.object));
            }
            set_resource_version(&mut object, revision);
            Ok(Outcome::Write {
                event_type: EventType::Modified,
                object,
            })
        }
        Op::Delete { expected } => {
            let stored = check(current, expected)?;
            let mut object = (*stored.object).clone();
            set_resource_version(&mut object, revision);
            Ok(Outcome::Write {
                event_type: EventType::Deleted,
                object,
            })
        }
    }
}

/// `metadata` of an object, created if absent; `None` only for a non-object, which never reaches
/// the engine (validated on the way in, checked at load).
fn metadata_mut(object: &mut Value) -> Option<&mut Map<String, Value>> {
    let meta = object
        .as_object_mut()?
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    meta.as_object_mut()
}

fn set_resource_version(object: &mut Value, revision: Revision) {
    if let Some(meta) = metadata_mut(object) {
        meta.insert(
            "resourceVersion".to_owned(),
            Value::String(revision.to_string()),
        );
    }
}

fn generation_of(object: &Value) -> i64 {
    object
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

/// Whether two objects agree on every top-level field outside [`NON_SPEC_FIELDS`].
fn same_spec(a: &Value, b: &Value) -> bool {
    fn spec(v: &Value) -> impl Iterator<Item = (&String, &Value)> {
        v.as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| !NON_SPEC_FIELDS.contains(&k.as_str()))
    }
    spec(a).count() == spec(b).count() && spec(a).all(|(k, v)| b.get(k) == Some(v))
}

/// Check the shape of an incoming object and that it names `key`; returns its metadata.
pub(crate) fn validate<'a>(
    key: &ObjectKey,
    object: &'a mut Value,
) -> Result<&'a mut Map<String, Value>, StoreError> {
    let invalid = |msg: String| Err(StoreError::InvalidObject(msg));
    if key.resource.is_empty() {
        return invalid("empty resource name".into());
    }
    if key.name.is_empty() {
        return invalid("empty object name".into());
    }
    let Some(fields) = object.as_object_mut() else {
        return invalid("not a JSON object".into());
    };
    let Some(Value::Object(meta)) = fields.get_mut("metadata") else {
        return invalid("metadata must be an object".into());
    };
    match meta.get("name") {
        Some(Value::String(name)) if *name == key.name => {}
        other => {
            return invalid(format!(
                "metadata.name is {}, expected {:?}",
                show(other),
                key.name
            ));
        }
    }
    let namespace_ok = match meta.get("namespace") {
        Some(Value::String(ns)) => *ns == key.namespace,
        None | Some(Value::Null) => key.namespace.is_empty(),
        Some(_) => false,
    };
    if !namespace_ok {
        let got = show(meta.get("namespace"));
        return if key.namespace.is_empty() {
            invalid(format!(
                "metadata.namespace is {got} on a cluster-scoped object"
            ))
        } else {
            invalid(format!(
                "metadata.namespace is {got}, expected {:?}",
                key.namespace
            ))
        };
    }
    Ok(meta)
}

fn show(value: Option<&Value>) -> String {
    value.map_or_else(|| "missing".to_owned(), Value::to_string)
}

/// The create-time metadata every stored object gets: `uid` (a random UUID v4 unless one is
/// set), `creationTimestamp` (now, RFC 3339, seconds, UTC), `generation` 1, and no
/// `resourceVersion` (the revision is assigned when the write commits). `InvalidObject` when
/// `uid` is set but not a string.
pub fn fill_create_metadata(meta: &mut Map<String, Value>) -> Result<(), StoreError> {
    let has_uid = match meta.get("uid") {
        None | Some(Value::Null) => false,
        Some(Value::String(uid)) => !uid.is_empty(),
        Some(other) => {
            return Err(StoreError::InvalidObject(format!(
                "metadata.uid is {other}, expected a string"
            )));
        }
    };
    if !has_uid {
        meta.insert(
            "uid".to_owned(),
            Value::String(uuid::Uuid::new_v4().to_string()),
        );
    }
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    meta.insert("creationTimestamp".to_owned(), Value::String(now));
    meta.insert("generation".to_owned(), Value::from(1));
    meta.remove("resourceVersion");
    Ok(())
}

/// Validate and fill the create-time metadata. Done on the caller's task to keep the writer's
/// critical path short.
pub(crate) fn prepare_create(key: &ObjectKey, mut object: Value) -> Result<Value, StoreError> {
    fill_create_metadata(validate(key, &mut object)?)?;
    Ok(object)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn create_metadata_keeps_a_given_uid_and_rejects_a_bad_one() {
        let mut meta = json!({"uid": "u-1", "resourceVersion": "7", "generation": 9});
        let map = meta.as_object_mut().expect("object");
        fill_create_metadata(map).expect("fill");
        assert_eq!(map["uid"], json!("u-1"));
        assert_eq!(map["generation"], json!(1));
        assert!(!map.contains_key("resourceVersion"));
        assert!(
            map["creationTimestamp"]
                .as_str()
                .is_some_and(|t| t.ends_with('Z'))
        );

        let mut meta = json!({"uid": 5});
        match fill_create_metadata(meta.as_object_mut().expect("object")) {
            Err(StoreError::InvalidObject(msg)) => assert!(msg.contains("metadata.uid"), "{msg}"),
            other => panic!("expected InvalidObject, got {other:?}"),
        }
    }
}
