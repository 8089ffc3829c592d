//! Create: namespace and Node-quota checks, name generation and claims, and the
//! namespaces the server ensures at start.

use std::sync::Arc;

use rlark_store::{ListOptions, StoreError};
use serde_json::{Value, json};

use super::checks::{check_namespace, check_type_meta, field_check, is_node, namespace_defaults};
use super::{
    MAX_ATTEMPTS, MAX_GENERATE_NAME_PREFIX, WriteOptions, Written, is_deleting, is_namespace,
    metadata_mut, random_suffix,
};
use crate::Inner;
use crate::admission;
use crate::auth::{Identity, Role};
use crate::authz::Attributes;
use crate::body::Decoded;
use crate::error::{ApiError, Cause};
use crate::object::{key, meta_str};
use crate::registry::ResourceType;

impl Inner {
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
        rt.prepare_for_write(&mut object);
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
            if let Some(status) = &rt.initial_status {
                map.insert("status".into(), status.clone());
            }
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
