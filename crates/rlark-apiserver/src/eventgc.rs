//! Event expiry, run by [`crate::ApiServer::run_background`] next to the garbage collector:
//! every [`event_sweep_interval`] all core Events are listed and
//!
//! - an Event not written for [`crate::limits::Limits::event_ttl`] is deleted (as
//!   kube-apiserver's `--event-ttl`, default 1 h). The time of the last write is when a sweep
//!   first saw the Event's current `resourceVersion`; for an Event first seen by this process
//!   (created since the last sweep, or stored before a restart) it is the later of its
//!   `creationTimestamp` and its own `lastTimestamp`/`eventTime`/`series.lastObservedTime`,
//!   the latter capped at now, so a timestamp in the future buys at most one TTL after a
//!   restart.
//! - an Event whose `involvedObject` is gone (no object of that kind, namespace and name, or
//!   one with another `uid` when the Event names a uid) in two sweeps in a row is deleted, so
//!   a Task's or Job's Events do not outlive it. Events about kinds this server does not
//!   serve are kept (their absence cannot be proven) until they expire.
//!
//! Deletions carry the swept `uid` and `resourceVersion` as preconditions: an Event
//! written meanwhile is kept and judged again by the next sweep.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rlark_store::ListOptions;
use serde_json::Value;
// The TTL is measured on tokio's clock, the one the sweep's sleep runs on.
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::Inner;
use crate::error::ApiError;
use crate::lifecycle::DeleteOptions;
use crate::limits::event_sweep_interval;
use crate::object::{key, meta_str};
use crate::registry::ResourceType;

/// What a sweep remembers of one Event (by uid).
#[derive(Debug)]
struct Seen {
    resource_version: String,
    /// When it was last written, as far as the sweeps can tell.
    written: Instant,
    /// Its involvedObject was missing in the previous sweep.
    orphan: bool,
}

/// Sweep until `shutdown`.
pub(crate) async fn run(inner: Arc<Inner>, shutdown: CancellationToken) {
    let interval = event_sweep_interval(inner.options.limits.event_ttl);
    let mut seen: HashMap<String, Seen> = HashMap::new();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        if let Err(error) = sweep(&inner, &mut seen).await {
            tracing::warn!(%error, "event sweep failed; retrying at the next one");
        }
    }
}

/// The latest of the Event's own timestamps, parsed.
fn client_time(event: &Value) -> Option<DateTime<Utc>> {
    ["/lastTimestamp", "/eventTime", "/series/lastObservedTime"]
        .iter()
        .filter_map(|pointer| event.pointer(pointer).and_then(Value::as_str))
        .filter_map(|text| DateTime::parse_from_rfc3339(text).ok())
        .map(|t| t.with_timezone(&Utc))
        .max()
}

/// When an Event first seen now was last written (see the module documentation).
fn first_seen_written(event: &Value, now: Instant, wall: DateTime<Utc>) -> Instant {
    let created = meta_str(event, "creationTimestamp")
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc));
    let latest = [created, client_time(event).map(|t| t.min(wall))]
        .into_iter()
        .flatten()
        .max();
    let age = latest
        .and_then(|t| (wall - t).to_std().ok())
        .unwrap_or(Duration::ZERO);
    now.checked_sub(age).unwrap_or(now)
}

impl Inner {
    /// The kind an Event's `involvedObject` names, when this server serves it.
    fn involved_kind(&self, involved: &Value) -> Option<Arc<ResourceType>> {
        let kind = involved.get("kind").and_then(Value::as_str)?;
        match involved.get("apiVersion").and_then(Value::as_str) {
            Some(api_version) if !api_version.is_empty() => {
                let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
                self.registry.by_kind(group, kind)
            }
            // No apiVersion (allowed for task tokens' Events about their Task): by kind alone.
            _ => self
                .registry
                .all()
                .iter()
                .find(|rt| rt.kind == kind)
                .cloned(),
        }
    }

    /// Whether the object an Event is about is gone. `false` when that cannot be told.
    async fn involved_gone(&self, event: &Value, event_namespace: &str) -> Result<bool, ApiError> {
        let Some(involved) = event.get("involvedObject") else {
            return Ok(false);
        };
        let Some(rt) = self.involved_kind(involved) else {
            return Ok(false);
        };
        let field = |key: &str| involved.get(key).and_then(Value::as_str).unwrap_or("");
        let name = field("name");
        if name.is_empty() {
            return Ok(false);
        }
        let namespace = match (rt.namespaced, field("namespace")) {
            (false, _) => "",
            (true, "") => event_namespace,
            (true, namespace) => namespace,
        };
        let found = self
            .store
            .get(&key(&rt, namespace, name))
            .await
            .map_err(|e| ApiError::from_store(e, &rt, name))?;
        Ok(match found {
            None => true,
            Some(object) => {
                let uid = field("uid");
                !uid.is_empty() && meta_str(&object, "uid") != Some(uid)
            }
        })
    }
}

/// One sweep: delete expired Events and Events whose involvedObject is gone.
async fn sweep(inner: &Inner, seen: &mut HashMap<String, Seen>) -> Result<(), ApiError> {
    let rt = ResourceType::event();
    let ttl = inner.options.limits.event_ttl;
    let listed = inner
        .store
        .list(&rt.store_resource(), &ListOptions::default())
        .await
        .map_err(|e| ApiError::from_store(e, &rt, ""))?;
    let now = Instant::now();
    let wall = Utc::now();
    let mut current: HashMap<String, Seen> = HashMap::with_capacity(listed.items.len());
    let (mut expired, mut orphaned) = (0usize, 0usize);
    for event in &listed.items {
        let (Some(uid), Some(namespace), Some(name)) = (
            meta_str(event, "uid"),
            meta_str(event, "namespace"),
            meta_str(event, "name"),
        ) else {
            continue;
        };
        let resource_version = meta_str(event, "resourceVersion").unwrap_or("");
        let previous = seen.remove(uid);
        let (written, was_orphan) = match previous {
            Some(p) if p.resource_version == resource_version => (p.written, p.orphan),
            Some(_) => (now, false),
            None => (first_seen_written(event, now, wall), false),
        };
        let expire = now.duration_since(written) >= ttl;
        let orphan = !expire && inner.involved_gone(event, namespace).await?;
        if expire || (orphan && was_orphan) {
            let options = DeleteOptions {
                precondition_uid: Some(uid.to_string()),
                precondition_resource_version: Some(resource_version.to_string()),
                ..DeleteOptions::default()
            };
            match inner.delete(&rt, namespace, name, &options).await {
                Ok(_) => {
                    if expire {
                        expired += 1;
                    } else {
                        orphaned += 1;
                    }
                    continue;
                }
                // Gone or rewritten meanwhile: the next sweep judges it again.
                Err(error) if error.code == 404 || error.code == 409 => {}
                Err(error) => return Err(error),
            }
        }
        current.insert(
            uid.to_string(),
            Seen {
                resource_version: resource_version.to_string(),
                written,
                orphan,
            },
        );
    }
    *seen = current;
    if expired + orphaned > 0 {
        tracing::info!(expired, orphaned, "events deleted");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn first_sighting_trusts_timestamps_up_to_now() {
        let now = Instant::now();
        let wall: DateTime<Utc> = "2026-12-01T12:00:00Z".parse().expect("time");
        let old = json!({"metadata": {"creationTimestamp": "2026-12-01T10:00:00Z"}});
        let written = first_seen_written(&old, now, wall);
        assert!(now.duration_since(written) >= Duration::from_secs(7200));
        // A recent lastTimestamp counts (an aggregated Event bumped a minute ago) ...
        let bumped = json!({"metadata": {"creationTimestamp": "2026-12-01T10:00:00Z"},
            "lastTimestamp": "2026-12-01T11:59:00Z"});
        let written = first_seen_written(&bumped, now, wall);
        assert!(now.duration_since(written) <= Duration::from_secs(61));
        // ... one in the future is capped at now.
        let future = json!({"metadata": {"creationTimestamp": "2026-12-01T10:00:00Z"},
            "eventTime": "3000-01-01T00:00:00Z"});
        assert_eq!(first_seen_written(&future, now, wall), now);
    }
}
