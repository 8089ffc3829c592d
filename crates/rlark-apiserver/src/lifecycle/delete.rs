//! Delete: finalizers, `deletionTimestamp` and propagation policies, orphaning dependents,
//! and deleting a collection.

use std::sync::Arc;

use rlark_store::{ListOptions, Revision, StoreError};
use serde_json::{Value, json};

use super::checks::is_node;
use super::{
    DeleteOptions, FOREGROUND_FINALIZER, MAX_ATTEMPTS, NAMESPACE_FINALIZER, Propagation,
    finalizers, is_deleting, is_namespace, metadata_mut, names_uid, now, remove_from, set_field,
};
use crate::Inner;
use crate::error::ApiError;
use crate::object::{key, key_of, meta_str, revision_of};
use crate::registry::ResourceType;
use crate::selectors::Selectors;

impl Inner {
    /// Delete an object. With finalizers (or for a Namespace, or with `Foreground`) it gets
    /// `deletionTimestamp` and stays until released; otherwise it is removed at once. Returns
    /// the object as it now is (or was, when removed).
    pub(crate) async fn delete(
        &self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        options: &DeleteOptions,
    ) -> Result<Arc<Value>, ApiError> {
        let key = key(rt, namespace, name);
        if is_namespace(rt) && name == "default" {
            return Err(ApiError::forbidden(format!(
                "namespaces \"{name}\" is forbidden: this namespace may not be deleted"
            )));
        }
        for _ in 0..MAX_ATTEMPTS {
            let old = self.get_object(rt, &key).await?;
            let uid = meta_str(&old, "uid").unwrap_or("").to_string();
            let rv = revision_of(&old);
            if let Some(want) = &options.precondition_uid
                && *want != uid
            {
                return Err(ApiError::conflict(
                    rt,
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"
                    ),
                ));
            }
            if let Some(want) = &options.precondition_resource_version
                && *want != rv.to_string()
            {
                return Err(ApiError::conflict(
                    rt,
                    name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {rv}"
                    ),
                ));
            }
            if is_deleting(&old) {
                // Deletion is already under way; repeating it changes nothing.
                return Ok(old);
            }
            let _network = self.admit_network_delete(rt, name).await?;
            if options.propagation == Propagation::Orphan && !options.dry_run {
                self.orphan_dependents(&uid).await?;
            }
            let mut finalizers = finalizers(&old);
            if options.propagation == Propagation::Foreground
                && !finalizers.iter().any(|f| f == FOREGROUND_FINALIZER)
            {
                finalizers.push(FOREGROUND_FINALIZER.to_string());
            }
            let result = if finalizers.is_empty() && !is_namespace(rt) {
                if options.dry_run {
                    return Ok(old);
                }
                self.store.delete(&key, Some(rv)).await
            } else {
                let mut marked = Value::clone(&old);
                let meta = metadata_mut(&mut marked);
                meta.insert("deletionTimestamp".into(), json!(now()));
                meta.insert("deletionGracePeriodSeconds".into(), json!(0));
                if !finalizers.is_empty() {
                    meta.insert("finalizers".into(), json!(finalizers));
                }
                if is_namespace(rt) {
                    // The namespace's content goes first (see gc.rs), held by this finalizer.
                    set_field(
                        &mut marked,
                        "spec",
                        "finalizers",
                        json!([NAMESPACE_FINALIZER]),
                    );
                    set_field(&mut marked, "status", "phase", json!("Terminating"));
                }
                if options.dry_run {
                    return Ok(Arc::new(marked));
                }
                self.store.update(&key, marked, Some(rv)).await
            };
            match result {
                Ok(object) => {
                    if is_node(rt) && !is_deleting(&object) {
                        // Removed, not marked: its name is free again.
                        crate::node_names::release(self.store.as_ref(), namespace, name).await;
                    }
                    return Ok(object);
                }
                Err(StoreError::Conflict { .. }) => continue,
                Err(error) => return Err(ApiError::from_store(error, rt, name)),
            }
        }
        Err(ApiError::conflict(
            rt,
            name,
            "the object is being modified too often; please try again",
        ))
    }

    /// Remove ownerReferences naming `owner_uid` from every object that has one.
    pub(crate) async fn orphan_dependents(&self, owner_uid: &str) -> Result<(), ApiError> {
        if owner_uid.is_empty() {
            return Ok(());
        }
        let names_owner = |object: &Value| {
            object
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .is_some_and(|refs| refs.iter().any(|r| names_uid(r, owner_uid)))
        };
        for rt in self.registry.stored() {
            let all = self
                .store
                .list(&rt.store_resource(), &ListOptions::default())
                .await
                .map_err(|e| ApiError::from_store(e, rt, ""))?;
            for dependent in all.items.iter().filter(|o| names_owner(o)) {
                self.modify(rt, &key_of(rt, dependent), |object| {
                    remove_from(object, "/metadata/ownerReferences", |r| {
                        names_uid(r, owner_uid)
                    })
                })
                .await?;
            }
        }
        Ok(())
    }

    /// Delete every object of `rt` (in `namespace`, or everywhere) that `selectors` match,
    /// one by one. Objects that vanish meanwhile are skipped. Returns what was deleted or
    /// marked for deletion.
    pub(crate) async fn delete_collection(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        selectors: &Selectors,
        options: &DeleteOptions,
    ) -> Result<(Vec<Arc<Value>>, Revision), ApiError> {
        let listed = self
            .store
            .list(
                &rt.store_resource(),
                &ListOptions {
                    namespace: namespace.map(str::to_string),
                    ..ListOptions::default()
                },
            )
            .await
            .map_err(|e| ApiError::from_store(e, rt, ""))?;
        let mut deleted = Vec::new();
        for object in listed.items.iter().filter(|o| selectors.matches(o)) {
            let key = key_of(rt, object);
            match self.delete(rt, &key.namespace, &key.name, options).await {
                Ok(object) => deleted.push(object),
                Err(error) if error.code == 404 => {}
                Err(error) => return Err(error),
            }
        }
        Ok((deleted, self.store.revision()))
    }
}
