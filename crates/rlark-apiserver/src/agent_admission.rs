//! What the server, not the agent, decides in the objects an agent writes. An agent of
//! cluster `C` may only write in its namespace `rlark-C` ([`crate::authz`]); this module
//! makes sure that what it writes there cannot pass for another cluster or another
//! component (the scheduler trusts a Node's labels, `kubectl describe` trusts an Event's
//! reporter):
//!
//! | object | field | rule |
//! |---|---|---|
//! | every kind | label `rlark.io/cluster-id` | `C`; set on Nodes when missing |
//! | Node | label `kubernetes.io/hostname` | the Node's name; set when missing |
//! | Node | annotation `rlark.io/reported-by` | always set to the agent's user |
//! | Task | `spec.placement.clusterID` | `C` |
//! | core Event | `reportingComponent`, `source.component` | [`AGENT_EVENT_COMPONENT`]; set when missing |
//! | core Event | `reportingInstance`, `source.host` | `C`; set when missing |
//! | core Event | `involvedObject.namespace`, `related.namespace` | `rlark-C`; set when missing |
//!
//! A label or placement with another value is refused (403) unless the write leaves it as
//! it was stored (an admin may have set it; the scheduler does not trust such a Node, see
//! `rlark_controllers::scheduler`). The Event rules hold for every write, so an agent can
//! neither write an Event in another component's name nor edit one another component wrote.
//! How many Nodes an agent may register is bounded by the caller
//! ([`crate::ApiServerOptions::max_nodes_per_agent`]).

use rlark_api::labels;
use serde_json::{Map, Value, json};

use crate::auth::agent_namespace;
use crate::registry::ResourceType;

/// `reportingComponent` and `source.component` of every Event an agent writes.
pub const AGENT_EVENT_COMPONENT: &str = "rlark-agent";

/// Admit `object`, about to be written by `user`, the agent of `cluster_id`: fill in what
/// the server owns and refuse what contradicts it (see the module documentation). `old` is
/// the stored object for an update or patch, `None` for a create. `Err` is the reason for
/// a 403 (`... is forbidden: <reason>`).
pub(crate) fn admit(
    user: &str,
    cluster_id: &str,
    rt: &ResourceType,
    object: &mut Value,
    old: Option<&Value>,
) -> Result<(), String> {
    let Some(map) = object.as_object_mut() else {
        // Not an object: validation refuses it with a better message.
        return Ok(());
    };
    let is_node = rt.group == "rlinf.io" && rt.plural == "nodes";
    let name = map
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let old_label = |key: &str| {
        old.and_then(|o| o.pointer(&format!("/metadata/labels/{}", key.replace('/', "~1"))))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let meta = object_at(map, "metadata");
    let has_labels = meta.get("labels").is_some_and(Value::is_object);
    if is_node || has_labels {
        let labels_map = object_at(meta, "labels");
        let mut owned = vec![(
            labels::CLUSTER_ID,
            cluster_id.to_string(),
            "the agent's cluster ID",
        )];
        if is_node {
            owned.push((labels::HOSTNAME, name.clone(), "the Node's name"));
        }
        for (key, want, what) in owned {
            match labels_map.get(key).and_then(Value::as_str) {
                None | Some("") if is_node => {
                    labels_map.insert(key.to_string(), json!(want));
                }
                None | Some("") => {}
                Some(value) if value == want => {}
                Some(value) if old_label(key).as_deref() == Some(value) => {}
                Some(value) => {
                    return Err(format!(
                        "User {user:?} may not set label {key:?} to {value:?}: it is {what} ({want:?}), set by the server"
                    ));
                }
            }
        }
    }
    if is_node {
        object_at(meta, "annotations").insert(labels::REPORTED_BY.to_string(), json!(user));
    }
    if rt.group == "rlinf.io" && rt.plural == "tasks" {
        let placed = map
            .get("spec")
            .and_then(|s| s.get("placement"))
            .and_then(|p| p.get("clusterID"))
            .and_then(Value::as_str);
        let old_placed = old
            .and_then(|o| o.pointer("/spec/placement/clusterID"))
            .and_then(Value::as_str);
        if let Some(placed) = placed
            && placed != cluster_id
            && old_placed != Some(placed)
        {
            return Err(format!(
                "User {user:?} may not place a task on cluster {placed:?}: spec.placement.clusterID must be the agent's cluster ID {cluster_id:?}"
            ));
        }
    }
    if rt.group.is_empty() && rt.plural == "events" {
        admit_event(user, cluster_id, map)?;
    }
    Ok(())
}

/// The Event rules: reporter fields are the agent's, the objects it is about are in the
/// agent's namespace.
fn admit_event(user: &str, cluster_id: &str, event: &mut Map<String, Value>) -> Result<(), String> {
    let namespace = agent_namespace(cluster_id);
    let refuse = |field: &str, value: &str, want: &str| {
        format!(
            "User {user:?} may only write events reported by the agent of cluster {cluster_id:?}: {field} must be {want:?}, not {value:?}"
        )
    };
    // Fill a missing (or empty) string field in, or check it.
    let own = |map: &mut Map<String, Value>, key: &str, field: &str, want: &str| {
        match map.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(value)) if value.is_empty() => {}
            Some(Value::String(value)) if value == want => return Ok(()),
            Some(Value::String(value)) => return Err(refuse(field, value, want)),
            Some(other) => return Err(refuse(field, &other.to_string(), want)),
        }
        map.insert(key.to_string(), json!(want));
        Ok(())
    };
    own(
        event,
        "reportingComponent",
        "reportingComponent",
        AGENT_EVENT_COMPONENT,
    )?;
    own(event, "reportingInstance", "reportingInstance", cluster_id)?;
    if !event.get("source").is_some_and(Value::is_object) {
        event.insert("source".into(), json!({}));
    }
    let source = object_at(event, "source");
    own(
        source,
        "component",
        "source.component",
        AGENT_EVENT_COMPONENT,
    )?;
    own(source, "host", "source.host", cluster_id)?;
    for reference in ["involvedObject", "related"] {
        if let Some(Value::Object(object)) = event.get_mut(reference) {
            own(
                object,
                "namespace",
                &format!("{reference}.namespace"),
                &namespace,
            )?;
        }
    }
    Ok(())
}

/// The object at `key` of `map`, made an (empty) object when missing or not an object.
fn object_at<'a>(map: &'a mut Map<String, Value>, key: &str) -> &'a mut Map<String, Value> {
    if !map.get(key).is_some_and(Value::is_object) {
        map.insert(key.to_string(), json!({}));
    }
    match map.get_mut(key) {
        Some(Value::Object(object)) => object,
        // Just made an object.
        _ => unreachable!("{key} is an object"),
    }
}
