//! Node names are unique across the installation, as in Kubernetes, although rlark's Nodes
//! live in their cluster's namespace `rlark-<clusterID>`: placement by `nodeName` or by the
//! `kubernetes.io/hostname` label names a Node by its name alone, so a second Node of the
//! same name in another cluster's namespace would capture Jobs meant for the first (issue
//! 38, "Placement by name can be captured").
//!
//! A Node created in an agent namespace first takes a **claim** on its name: a
//! cluster-scoped record `nodenames.internal.rlark.io/<name>` (a resource the API registry
//! does not serve) holding the cluster ID. The store's create is atomic per key, and with
//! several server replicas on one PostgreSQL it is evaluated under the database's write
//! lock against the latest state, so of two registrations of one name at the same moment,
//! on any replicas, exactly one gets the claim; the other is refused with 409 naming the
//! owner. Before the claim, every stored Node is checked too, so a Node written before
//! claims existed (an upgrade) also holds its name.
//!
//! A claim is released when its Node is deleted through the API ([`release`]); a claim
//! whose Node is gone otherwise (a create that failed after the claim, a deletion that
//! bypassed the API) is taken over by the next registration once it is older than
//! [`STALE_AFTER`] (a Node's create follows its claim within one request).
//!
//! The scheduler does not depend on this module: it resolves a name only to the cluster
//! whose Node of that name was created first (`rlark_controllers::scheduler`), which is the
//! claim holder whenever the claim was taken.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use rlark_store::{ListOptions, ObjectKey, Store, StoreError};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::registry::ResourceType;

/// Store resource of the claims (name = the Node name).
pub const CLAIMS: &str = "nodenames.internal.rlark.io";
/// A claim whose cluster has no Node of that name is taken over after this long.
pub const STALE_AFTER: Duration = Duration::from_secs(60);
/// Attempts of the read-modify-write of a claim that lost a race.
const ATTEMPTS: usize = 5;

/// What [`claim`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Claimed {
    /// The Node is outside agent namespaces (never placed on): nothing to claim.
    NotNeeded,
    /// The cluster held the claim already.
    Held,
    /// The claim was taken now: release it if the Node is not created after all.
    Taken,
}

/// The cluster ID of agent namespace `rlark-<id>`.
fn cluster_of(namespace: &str) -> Option<&str> {
    namespace.strip_prefix("rlark-").filter(|id| !id.is_empty())
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new(CLAIMS, "", name)
}

fn store_error<'a>(rt: &'a ResourceType, name: &'a str) -> impl Fn(StoreError) -> ApiError + 'a {
    move |e| ApiError::from_store(e, rt, name)
}

/// 409: the name is another cluster's.
fn held_by(rt: &ResourceType, name: &str, owner: &str, why: &str) -> ApiError {
    let mut error = ApiError::already_exists(rt, name);
    error.message = format!(
        "{} \"{name}\" already exists: the Node name {name:?} is held by cluster {owner:?} \
         ({why}); Node names are unique across the installation, because placement by \
         nodeName or kubernetes.io/hostname names a Node by its name alone. Register this \
         Node under another name (rlark agent --node-name)",
        rt.qualified_name()
    );
    error
}

/// The claim's holder: (cluster ID, when claimed).
fn holder(claim: &Value) -> (String, Option<DateTime<Utc>>) {
    let cluster = claim
        .pointer("/spec/clusterID")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let at = claim
        .pointer("/spec/claimedAt")
        .and_then(Value::as_str)
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc));
    (cluster, at)
}

fn claim_object(name: &str, cluster: &str) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "clusterID": cluster,
            "claimedAt": Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true),
        },
    })
}

/// Take the installation-wide claim on Node name `name` for the cluster of `namespace`
/// (see the module documentation), or refuse with 409 naming the holder. `dry_run` checks
/// without writing.
pub(crate) async fn claim(
    store: &dyn Store,
    rt: &ResourceType,
    namespace: &str,
    name: &str,
    dry_run: bool,
) -> Result<Claimed, ApiError> {
    let Some(cluster) = cluster_of(namespace) else {
        return Ok(Claimed::NotNeeded);
    };
    let to_api = store_error(rt, name);
    // A Node of this name in another agent namespace holds it, claim or not.
    let nodes = store
        .list(&rt.store_resource(), &ListOptions::default())
        .await
        .map_err(&to_api)?;
    for node in &nodes.items {
        let node_namespace = node
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let node_name = node.pointer("/metadata/name").and_then(Value::as_str);
        if node_name == Some(name)
            && node_namespace != namespace
            && let Some(owner) = cluster_of(node_namespace)
        {
            return Err(held_by(
                rt,
                name,
                owner,
                &format!("its Node {node_namespace}/{name} exists"),
            ));
        }
    }
    for _ in 0..ATTEMPTS {
        let stored = store.get(&key(name)).await.map_err(&to_api)?;
        let Some(stored) = stored else {
            if dry_run {
                return Ok(Claimed::Taken);
            }
            match store.create(&key(name), claim_object(name, cluster)).await {
                Ok(_) => return Ok(Claimed::Taken),
                // Another registration won the create: look again.
                Err(StoreError::AlreadyExists(_)) => continue,
                Err(e) => return Err(to_api(e)),
            }
        };
        let (owner, claimed_at) = holder(&stored);
        if owner == cluster {
            return Ok(Claimed::Held);
        }
        // The holder's Node is gone (the check above saw none): stale once old enough.
        let fresh = claimed_at.is_none_or(|at| {
            Utc::now()
                .signed_duration_since(at)
                .to_std()
                .map_or(true, |age| age < STALE_AFTER)
        });
        if fresh {
            return Err(held_by(
                rt,
                name,
                &owner,
                "it is registering a Node of that name now",
            ));
        }
        if dry_run {
            return Ok(Claimed::Taken);
        }
        let revision = stored
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .and_then(|rv| rv.parse().ok());
        match store
            .update(&key(name), claim_object(name, cluster), revision)
            .await
        {
            Ok(_) => {
                tracing::info!(node = %name, from = %owner, to = %cluster, "stale Node name claim taken over");
                return Ok(Claimed::Taken);
            }
            Err(StoreError::Conflict { .. } | StoreError::NotFound(_)) => continue,
            Err(e) => return Err(to_api(e)),
        }
    }
    Err(ApiError::conflict(
        rt,
        name,
        "the Node name is being claimed concurrently; please try again",
    ))
}

/// Release the claim on Node name `name` if the cluster of `namespace` holds it (after its
/// Node was deleted, or not created after all). Best effort: a claim left behind is taken
/// over once stale.
pub(crate) async fn release(store: &dyn Store, namespace: &str, name: &str) {
    let Some(cluster) = cluster_of(namespace) else {
        return;
    };
    let stored = match store.get(&key(name)).await {
        Ok(Some(stored)) => stored,
        Ok(None) => return,
        Err(error) => {
            tracing::warn!(%error, node = %name, "reading a Node name claim to release it failed");
            return;
        }
    };
    if holder(&stored).0 != cluster {
        return;
    }
    let revision = stored
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|rv| rv.parse().ok());
    match store.delete(&key(name), revision).await {
        Ok(_) | Err(StoreError::NotFound(_) | StoreError::Conflict { .. }) => {}
        Err(error) => {
            tracing::warn!(%error, node = %name, "releasing a Node name claim failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_namespaces_only() {
        assert_eq!(cluster_of("rlark-a"), Some("a"));
        assert_eq!(cluster_of("rlark-"), None);
        assert_eq!(cluster_of("default"), None);
    }

    #[test]
    fn the_holder_is_read_back() {
        let claim = claim_object("n1", "b");
        let (owner, at) = holder(&claim);
        assert_eq!(owner, "b");
        assert!(at.is_some());
        assert_eq!(holder(&json!({})), (String::new(), None));
    }
}
