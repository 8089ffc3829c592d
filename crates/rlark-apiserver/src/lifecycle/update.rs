//! Update and patch: what an update of an object stores (status subresource, system
//! metadata), and the retried read-modify-write the server's own writes use.

use std::sync::Arc;

use rlark_store::{ObjectKey, Revision, StoreError};
use serde_json::{Value, json};

use super::checks::{
    check_namespace, check_type_meta, field_check, immutable, is_node, namespace_defaults, released,
};
use super::{
    MAX_ATTEMPTS, WriteOptions, Written, finalizers, is_deleting, is_namespace, metadata_mut,
};
use crate::Inner;
use crate::admission;
use crate::body::Decoded;
use crate::error::{ApiError, Cause};
use crate::fieldvalidation::FieldValidation;
use crate::object::{key, meta_str, parse_resource_version, revision_of};
use crate::patch::DecodedPatch;
use crate::registry::ResourceType;

impl Inner {
    /// The object an update of `old` to `new` stores, or why it may not. `status_only` is the
    /// `/status` subresource: only `status` is taken from `new`. Otherwise, with a status
    /// subresource, `status` is kept from `old`; system metadata is kept or checked as
    /// Kubernetes does (`uid` immutable, timestamps kept, no new finalizers while deleting).
    fn prepare_update(
        rt: &ResourceType,
        old: &Value,
        mut new: Value,
        status_only: bool,
    ) -> Result<Value, ApiError> {
        let name = meta_str(old, "name").unwrap_or("").to_string();
        if status_only {
            let mut result = old.clone();
            if let Some(map) = result.as_object_mut() {
                match new.get_mut("status").map(Value::take) {
                    Some(status) if !status.is_null() => {
                        map.insert("status".into(), status);
                    }
                    _ => {
                        map.shift_remove("status");
                    }
                }
            }
            return Ok(result);
        }
        if let Some(map) = new.as_object_mut() {
            if rt.status_subresource {
                match old.get("status") {
                    Some(status) => map.insert("status".into(), status.clone()),
                    None => map.shift_remove("status"),
                };
            }
            // A Namespace's spec.finalizers change only through its controller (here: GC).
            if is_namespace(rt) {
                let old_finalizers = old.pointer("/spec/finalizers").cloned();
                if !map.get("spec").is_some_and(Value::is_object) {
                    map.insert("spec".into(), json!({}));
                }
                if let Some(Value::Object(spec)) = map.get_mut("spec") {
                    match old_finalizers {
                        Some(f) => spec.insert("finalizers".into(), f),
                        None => spec.shift_remove("finalizers"),
                    };
                }
            }
        }
        let old_meta = old.get("metadata").cloned().unwrap_or_else(|| json!({}));
        let deleting = is_deleting(old);
        let meta = metadata_mut(&mut new);
        match meta.get("uid").and_then(Value::as_str) {
            None | Some("") => {
                if let Some(uid) = old_meta.get("uid") {
                    meta.insert("uid".into(), uid.clone());
                }
            }
            Some(uid) if Some(uid) == old_meta.get("uid").and_then(Value::as_str) => {}
            Some(uid) => return Err(immutable(rt, &name, "metadata.uid", &json!(uid))),
        }
        let new_deletion = meta
            .get("deletionTimestamp")
            .filter(|v| !v.is_null())
            .cloned();
        if let (Some(value), false) = (&new_deletion, deleting) {
            return Err(immutable(rt, &name, "metadata.deletionTimestamp", value));
        }
        for field in [
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            match old_meta.get(field) {
                Some(value) => meta.insert(field.into(), value.clone()),
                None => meta.shift_remove(field),
            };
        }
        meta.shift_remove("managedFields");
        meta.shift_remove("selfLink");
        if deleting {
            let old_finalizers = finalizers(old);
            let added: Vec<String> = finalizers(&new)
                .into_iter()
                .filter(|f| !old_finalizers.contains(f))
                .collect();
            if !added.is_empty() {
                return Err(ApiError::invalid(
                    rt,
                    &name,
                    vec![Cause {
                        reason: "FieldValueForbidden".into(),
                        message: format!(
                            "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                        ),
                        field: "metadata.finalizers".into(),
                    }],
                ));
            }
        }
        if is_namespace(rt) {
            namespace_defaults(&mut new, false);
        }
        Ok(new)
    }

    /// Store an update of an object read at revision `expected`; when the object is being
    /// deleted and no finalizer is left, the update is the deletion.
    pub(crate) async fn write_update(
        &self,
        rt: &ResourceType,
        key: &ObjectKey,
        object: Value,
        expected: Revision,
    ) -> Result<Arc<Value>, StoreError> {
        if released(rt, &object) {
            let deleted = self.store.delete(key, Some(expected)).await?;
            if is_node(rt) {
                crate::node_names::release(self.store.as_ref(), &key.namespace, &key.name).await;
            }
            Ok(deleted)
        } else {
            self.store.update(key, object, Some(expected)).await
        }
    }

    /// Replace an object (PUT), the whole of it or (`status_only`) its status.
    pub(crate) async fn update(
        &self,
        rt: &ResourceType,
        url_namespace: Option<&str>,
        name: &str,
        status_only: bool,
        body: Decoded,
        options: WriteOptions,
    ) -> Result<Written, ApiError> {
        let mut new = body.value;
        check_type_meta(rt, &mut new)?;
        let namespace = check_namespace(rt, &mut new, url_namespace)?;
        match meta_str(&new, "name") {
            None | Some("") => {
                metadata_mut(&mut new).insert("name".into(), json!(name));
            }
            Some(n) if n == name => {}
            Some(n) => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
        }
        let dropped = crate::domain_admission::strip_domain_peer_secrets(rt, &mut new);
        rt.prepare_for_write(&mut new);
        if !status_only {
            admission::apply_defaults(rt, &mut new);
        }
        let (mut warnings, _) =
            field_check(rt, &mut new, &body.duplicates, options.field_validation)?;
        warnings.extend(dropped);
        if !status_only {
            warnings.extend(admission::inert_field_warnings(rt, &new));
        }
        let precondition = match meta_str(&new, "resourceVersion") {
            Some(rv) if !rv.is_empty() => Some(parse_resource_version(rv)?),
            _ => None,
        };
        let key = key(rt, &namespace, name);
        for _ in 0..MAX_ATTEMPTS {
            let old = self.get_object(rt, &key).await?;
            let expected = precondition.unwrap_or_else(|| revision_of(&old));
            let mut candidate = Self::prepare_update(rt, &old, new.clone(), status_only)?;
            self.admit_caller(
                &options,
                rt,
                "update",
                &namespace,
                status_only,
                &mut candidate,
                Some(&old),
            )?;
            let (_, causes) = field_check(rt, &mut candidate, &[], FieldValidation::Ignore)?;
            admission::admit(rt, &candidate, causes)?;
            let size = crate::limits::admit_object_size(&self.options.limits, rt, &candidate)?;
            self.check_byte_quotas(options.caller.as_ref(), rt, &namespace, size, Some(&old))
                .await?;
            let _network = self
                .admit_network(rt, &candidate, Some(&old), status_only)
                .await?;
            if options.dry_run {
                return Ok(Written {
                    object: Arc::new(candidate),
                    warnings,
                });
            }
            match self.write_update(rt, &key, candidate, expected).await {
                Ok(object) => return Ok(Written { object, warnings }),
                Err(StoreError::Conflict { .. }) if precondition.is_none() => continue,
                Err(error) => return Err(ApiError::from_store(error, rt, name)),
            }
        }
        Err(ApiError::conflict(
            rt,
            name,
            "the object is being modified too often; please try again",
        ))
    }

    /// Apply a patch (PATCH) to the object or (`status_only`) its status.
    pub(crate) async fn patch(
        &self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        status_only: bool,
        patch: DecodedPatch,
        options: WriteOptions,
    ) -> Result<Written, ApiError> {
        let key = key(rt, namespace, name);
        let pinned = patch.patch.sets_resource_version();
        for _ in 0..MAX_ATTEMPTS {
            let old = self.get_object(rt, &key).await?;
            let mut patched = Value::clone(&old);
            patch.patch.apply(rt, name, &mut patched)?;
            check_type_meta(rt, &mut patched)?;
            check_namespace(rt, &mut patched, Some(namespace))?;
            if meta_str(&patched, "name") != Some(name) {
                return Err(immutable(
                    rt,
                    name,
                    "metadata.name",
                    patched.pointer("/metadata/name").unwrap_or(&Value::Null),
                ));
            }
            let dropped = crate::domain_admission::strip_domain_peer_secrets(rt, &mut patched);
            rt.prepare_for_write(&mut patched);
            if !status_only {
                admission::apply_defaults(rt, &mut patched);
            }
            let (mut warnings, _) = field_check(
                rt,
                &mut patched,
                &patch.duplicates,
                options.field_validation,
            )?;
            warnings.extend(dropped);
            if !status_only {
                warnings.extend(admission::inert_field_warnings(rt, &patched));
            }
            let expected = if pinned {
                parse_resource_version(meta_str(&patched, "resourceVersion").unwrap_or(""))?
            } else {
                revision_of(&old)
            };
            let mut candidate = Self::prepare_update(rt, &old, patched, status_only)?;
            self.admit_caller(
                &options,
                rt,
                "patch",
                namespace,
                status_only,
                &mut candidate,
                Some(&old),
            )?;
            let (_, causes) = field_check(rt, &mut candidate, &[], FieldValidation::Ignore)?;
            admission::admit(rt, &candidate, causes)?;
            let size = crate::limits::admit_object_size(&self.options.limits, rt, &candidate)?;
            self.check_byte_quotas(options.caller.as_ref(), rt, namespace, size, Some(&old))
                .await?;
            let _network = self
                .admit_network(rt, &candidate, Some(&old), status_only)
                .await?;
            if options.dry_run {
                return Ok(Written {
                    object: Arc::new(candidate),
                    warnings,
                });
            }
            match self.write_update(rt, &key, candidate, expected).await {
                Ok(object) => return Ok(Written { object, warnings }),
                Err(StoreError::Conflict { .. }) if !pinned => continue,
                Err(error) => return Err(ApiError::from_store(error, rt, name)),
            }
        }
        Err(ApiError::conflict(
            rt,
            name,
            "the object is being modified too often; please try again",
        ))
    }

    /// Read-modify-write without admission (server-side bookkeeping: finalizers, owner
    /// references). `change` returns whether it changed anything. `Ok(None)` when the object
    /// does not exist (any more).
    pub(crate) async fn modify(
        &self,
        rt: &ResourceType,
        key: &ObjectKey,
        mut change: impl FnMut(&mut Value) -> bool,
    ) -> Result<Option<Arc<Value>>, ApiError> {
        for _ in 0..MAX_ATTEMPTS {
            let Some(old) = self
                .store
                .get(key)
                .await
                .map_err(|e| ApiError::from_store(e, rt, &key.name))?
            else {
                return Ok(None);
            };
            let mut new = Value::clone(&old);
            if !change(&mut new) {
                return Ok(Some(old));
            }
            match self.write_update(rt, key, new, revision_of(&old)).await {
                Ok(object) => return Ok(Some(object)),
                Err(StoreError::Conflict { .. }) => continue,
                Err(StoreError::NotFound(_)) => return Ok(None),
                Err(error) => return Err(ApiError::from_store(error, rt, &key.name)),
            }
        }
        Err(ApiError::conflict(
            rt,
            &key.name,
            "the object is being modified too often; please try again",
        ))
    }
}
