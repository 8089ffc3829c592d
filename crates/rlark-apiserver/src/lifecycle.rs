//! Object lifecycle over the store, with Kubernetes' rules: create, update (status
//! subresource, immutable metadata, finalizers), delete (finalizers, `deletionTimestamp`,
//! propagation policies). The HTTP handlers and the garbage collector both go through here,
//! so an object is deleted the same way whoever deletes it.
//!
//! Every write is validated completely before it is attempted, and every read-modify-write
//! uses the read revision as precondition (retrying a few times on conflict when the client
//! gave no `resourceVersion` of its own), so nothing is ever half-written or lost.

use std::sync::Arc;

use chrono::{SecondsFormat, Utc};
use rlark_store::{ListOptions, ObjectKey, Revision, StoreError};
use serde_json::{Map, Value, json};

use crate::Inner;
use crate::admission;
use crate::auth::{Identity, Role};
use crate::authz::Attributes;
use crate::body::Decoded;
use crate::error::{ApiError, Cause};
use crate::fieldvalidation::{self, FieldValidation};
use crate::object::{key, key_of, meta_str, parse_resource_version, revision_of};
use crate::patch::DecodedPatch;
use crate::registry::ResourceType;
use crate::selectors::Selectors;

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

fn immutable(rt: &ResourceType, name: &str, field: &str, value: &Value) -> ApiError {
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
fn namespace_defaults(object: &mut Value, creating: bool) {
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
fn is_node(rt: &ResourceType) -> bool {
    rt.group == "rlinf.io" && rt.plural == "nodes"
}

/// Whether an update of an object being deleted has released it (no finalizers left), so
/// the write becomes the deletion.
fn released(rt: &ResourceType, object: &Value) -> bool {
    is_deleting(object)
        && finalizers(object).is_empty()
        && (!is_namespace(rt)
            || object
                .pointer("/spec/finalizers")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty))
}

impl Inner {
    async fn get_object(&self, rt: &ResourceType, key: &ObjectKey) -> Result<Arc<Value>, ApiError> {
        self.store
            .get(key)
            .await
            .map_err(|e| ApiError::from_store(e, rt, &key.name))?
            .ok_or_else(|| ApiError::not_found(rt, &key.name))
    }

    /// 404 unless namespace `namespace` exists; 403 while it is terminating.
    async fn check_namespace_open(
        &self,
        rt: &ResourceType,
        name: &str,
        namespace: &str,
    ) -> Result<(), ApiError> {
        let ns_rt = ResourceType::namespace();
        let ns = self
            .store
            .get(&key(&ns_rt, "", namespace))
            .await
            .map_err(|e| ApiError::from_store(e, &ns_rt, namespace))?
            .ok_or_else(|| ApiError::not_found(&ns_rt, namespace))?;
        if is_deleting(&ns) {
            let mut error = ApiError::forbidden(format!(
                "{} \"{name}\" is forbidden: unable to create new content in namespace {namespace} because it is being terminated",
                rt.qualified_name()
            ));
            error.name = Some(name.to_string());
            error.group = Some(rt.group.clone());
            error.kind = Some(rt.plural.clone());
            error.causes.push(Cause {
                reason: "NamespaceTerminating".into(),
                message: format!("namespace {namespace} is being terminated"),
                field: "metadata.namespace".into(),
            });
            return Err(error);
        }
        Ok(())
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

    /// 403 when the agent creating Node `name` in `namespace` already has
    /// [`crate::ApiServerOptions::max_nodes_per_agent`] Nodes there. The caller holds
    /// `agent_nodes` from the count to the write.
    async fn check_agent_node_quota(
        &self,
        options: &WriteOptions,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
    ) -> Result<(), ApiError> {
        let Some(identity) = &options.caller else {
            return Ok(());
        };
        let limit = self.options.max_nodes_per_agent;
        let listed = self
            .store
            .list(
                &rt.store_resource(),
                &ListOptions {
                    namespace: Some(namespace.to_string()),
                    start_after: None,
                    limit: Some(limit.saturating_add(1)),
                },
            )
            .await
            .map_err(|e| ApiError::from_store(e, rt, name))?;
        if listed.items.len() < limit {
            return Ok(());
        }
        tracing::warn!(user = %identity.user, %namespace, node = %name, limit, "agent node quota reached: node registration refused");
        let attrs = Attributes {
            verb: "create".to_string(),
            group: rt.group.clone(),
            resource: rt.plural.clone(),
            subresource: None,
            namespace: Some(namespace.to_string()),
            name: Some(name.to_string()),
        };
        let has = if listed.items.len() > limit {
            format!("more than {limit}")
        } else {
            limit.to_string()
        };
        let reason = format!(
            "User {:?} may register at most {limit} Nodes in namespace {namespace:?} (api.maxNodesPerAgent) and it has {has} already",
            identity.user,
        );
        Err(crate::audit::deny(
            self,
            identity,
            &attrs,
            Some(name),
            reason,
        ))
    }

    /// [`crate::node_names::claim`] for a Node an agent is about to create; a refusal is
    /// audited. (Admins, like the server's own writes, may write any Node, as agent
    /// admission lets them; the scheduler resolves names to the cluster that registered
    /// them first whoever wrote the Nodes.)
    async fn claim_node_name(
        &self,
        options: &WriteOptions,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
    ) -> Result<crate::node_names::Claimed, ApiError> {
        let refused = match crate::node_names::claim(
            self.store.as_ref(),
            rt,
            namespace,
            name,
            options.dry_run,
        )
        .await
        {
            Ok(claimed) => return Ok(claimed),
            Err(refused) => refused,
        };
        if refused.code == 409
            && let Some(identity) = &options.caller
        {
            tracing::warn!(user = %identity.user, %namespace, node = %name, reason = %refused.message, "Node name held by another cluster: registration refused");
            let mut entry = crate::audit::AuditEntry::now("denied", "denied").by(Some(identity));
            entry.verb = "create".into();
            entry.resource = rt.qualified_name();
            entry.namespace = namespace.to_string();
            entry.name = name.to_string();
            entry.reason = refused.message.clone();
            self.audit.record(entry);
        }
        Err(refused)
    }

    /// Create an object from a request body. 201-worthy on success.
    pub(crate) async fn create(
        &self,
        rt: &ResourceType,
        url_namespace: Option<&str>,
        body: Decoded,
        options: WriteOptions,
    ) -> Result<Written, ApiError> {
        let mut object = body.value;
        self.admit_caller(
            &options,
            rt,
            "create",
            url_namespace.unwrap_or(""),
            false,
            &mut object,
            None,
        )?;
        check_type_meta(rt, &mut object)?;
        let namespace = check_namespace(rt, &mut object, url_namespace)?;
        let dropped = crate::domain_admission::strip_domain_peer_secrets(rt, &mut object);
        crate::member::fold_string_data(rt, &mut object);
        admission::apply_defaults(rt, &mut object);
        let (mut warnings, schema_causes) =
            field_check(rt, &mut object, &body.duplicates, options.field_validation)?;
        warnings.extend(dropped);
        warnings.extend(admission::inert_field_warnings(rt, &object));
        // Agents register a bounded number of Nodes: count and create under one lock, so
        // concurrent registrations cannot overshoot.
        let node_quota = match options.caller.as_ref().map(Identity::role) {
            Some(Role::Agent { .. }) if is_node(rt) => Some(self.agent_nodes.lock().await),
            _ => None,
        };
        if meta_str(&object, "resourceVersion").is_some_and(|rv| !rv.is_empty()) {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        // System fields are the server's to set.
        let meta = metadata_mut(&mut object);
        for field in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "managedFields",
            "selfLink",
        ] {
            meta.shift_remove(field);
        }
        let generate_name = match (
            meta.get("name").and_then(Value::as_str),
            meta.get("generateName"),
        ) {
            (None | Some(""), Some(Value::String(prefix))) if !prefix.is_empty() => Some(
                prefix
                    .chars()
                    .take(MAX_GENERATE_NAME_PREFIX)
                    .collect::<String>(),
            ),
            _ => None,
        };
        if rt.status_subresource
            && let Some(map) = object.as_object_mut()
        {
            map.shift_remove("status");
        }
        let mut attempts = 0;
        loop {
            attempts += 1;
            if let Some(prefix) = &generate_name {
                metadata_mut(&mut object)
                    .insert("name".into(), json!(format!("{prefix}{}", random_suffix())));
            }
            if is_namespace(rt) {
                namespace_defaults(&mut object, true);
            }
            admission::admit(rt, &object, schema_causes.clone())?;
            let size = crate::limits::admit_object_size(&self.options.limits, rt, &object)?;
            self.check_byte_quotas(options.caller.as_ref(), rt, &namespace, size, None)
                .await?;
            let name = meta_str(&object, "name").unwrap_or("").to_string();
            if rt.namespaced {
                self.check_namespace_open(rt, &name, &namespace).await?;
            }
            if node_quota.is_some() {
                self.check_agent_node_quota(&options, rt, &namespace, &name)
                    .await?;
            }
            let claimed = if is_node(rt)
                && matches!(
                    options.caller.as_ref().map(Identity::role),
                    Some(Role::Agent { .. })
                ) {
                self.claim_node_name(&options, rt, &namespace, &name)
                    .await?
            } else {
                crate::node_names::Claimed::NotNeeded
            };
            let _network = self.admit_network(rt, &object, None, false).await?;
            if options.dry_run {
                // What the store fills on a real create (system fields were stripped above).
                rlark_store::metadata::fill_create_metadata(metadata_mut(&mut object))
                    .map_err(|error| ApiError::from_store(error, rt, &name))?;
                return Ok(Written {
                    object: Arc::new(object),
                    warnings,
                });
            }
            match self
                .store
                .create(&key(rt, &namespace, &name), object.clone())
                .await
            {
                Ok(created) => {
                    return Ok(Written {
                        object: created,
                        warnings,
                    });
                }
                Err(error) => {
                    if claimed == crate::node_names::Claimed::Taken {
                        crate::node_names::release(self.store.as_ref(), &namespace, &name).await;
                    }
                    match error {
                        // A generated name that collided: draw another suffix.
                        StoreError::AlreadyExists(_)
                            if generate_name.is_some() && attempts < MAX_ATTEMPTS => {}
                        error => return Err(ApiError::from_store(error, rt, &name)),
                    }
                }
            }
        }
    }

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
        crate::member::fold_string_data(rt, &mut new);
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
            crate::member::fold_string_data(rt, &mut patched);
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

    /// Create the `default` namespace unless it exists.
    pub(crate) async fn ensure_default_namespace(&self) -> Result<(), ApiError> {
        self.ensure_namespace("default").await
    }

    /// Create namespace `name` unless it exists.
    pub(crate) async fn ensure_namespace(&self, name: &str) -> Result<(), ApiError> {
        let rt = ResourceType::namespace();
        let body = Decoded {
            value: json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
            duplicates: Vec::new(),
        };
        match self.create(&rt, None, body, WriteOptions::default()).await {
            Ok(_) => Ok(()),
            Err(error) if error.code == 409 => Ok(()),
            Err(error) => Err(error),
        }
    }
}
