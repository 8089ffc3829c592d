//! Garbage collection, run by [`crate::ApiServer::run_background`]:
//!
//! - ownerReferences: when an object is gone, every object naming it (by uid) as owner is
//!   deleted like a normal delete (finalizers respected), recursively through the events
//!   those deletions cause. A dependent goes only when none of its owners exists (checked
//!   against the store, not just the index); references to vanished owners are dropped
//!   from dependents that keep another owner. On start (and every [`RESYNC`]) a sweep
//!   catches dependents whose owners vanished while nobody watched.
//! - Foreground deletion: an owner with the `foregroundDeletion` finalizer has its
//!   dependents deleted; once none is left, the finalizer is removed (and the owner with
//!   it, when that was the last finalizer).
//! - Namespaces: a Terminating namespace has all its content deleted; once empty, its
//!   `kubernetes` spec finalizer is removed and the namespace goes away.
//! - Events: when an object is deleted, the core Events about it (`involvedObject` of its
//!   kind, namespace and name, with its uid or none) are deleted, so a Task's Events do not
//!   outlive it. Events about objects deleted while nobody watched are caught by the event
//!   sweep (`eventgc.rs`), which also expires Events after their TTL.
//!
//! Every action is per object and idempotent, so a failed one is simply retried by the
//! next event or sweep. An index of every object's uid and owners, built from a list and
//! kept current by watches, finds dependents without scanning the store.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use rlark_store::{EventType, ListOptions, ObjectKey, StoreError, WatchEvent};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::Inner;
use crate::error::ApiError;
use crate::lifecycle::{
    DeleteOptions, FOREGROUND_FINALIZER, NAMESPACE_FINALIZER, Propagation, is_deleting,
    is_namespace, names_uid, remove_from,
};
use crate::object::{key, key_of, meta_str};
use crate::registry::ResourceType;

/// How often the whole index is swept for work that events did not finish.
const RESYNC: Duration = Duration::from_secs(15);
/// Pause before rebuilding after the store failed us (e.g. a watch expired).
const RESTART_DELAY: Duration = Duration::from_secs(1);

/// Why a collector pass stopped (it is restarted from a fresh list).
#[derive(Debug, thiserror::Error)]
enum GcError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("api: {0}")]
    Api(#[from] ApiError),
    #[error("store watch ended")]
    WatchEnded,
}

/// An owner reference, as far as the collector needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct OwnerRef {
    api_version: String,
    kind: String,
    name: String,
    uid: String,
}

fn owner_refs(object: &Value) -> Vec<OwnerRef> {
    let refs = object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array);
    refs.into_iter()
        .flatten()
        .filter_map(|r| {
            let field = |name: &str| r.get(name).and_then(Value::as_str).map(str::to_string);
            Some(OwnerRef {
                api_version: field("apiVersion")?,
                kind: field("kind")?,
                name: field("name")?,
                uid: field("uid")?,
            })
        })
        .collect()
}

/// One indexed object.
#[derive(Clone, Debug)]
struct Entry {
    uid: String,
    rt: Arc<ResourceType>,
    key: ObjectKey,
    owners: Vec<String>,
}

/// Every object's uid, owners and deletion state.
#[derive(Debug, Default)]
struct Index {
    by_uid: HashMap<String, Entry>,
    /// Owner uid → uids of objects naming it.
    dependents: HashMap<String, HashSet<String>>,
    /// Names of namespaces being deleted.
    terminating: HashSet<String>,
    /// Uids of objects deleting in the foreground.
    foreground: HashSet<String>,
    /// (kind, namespace, name) of an involvedObject → uids of the Events about it.
    events_about: HashMap<Involved, HashSet<String>>,
    /// Event uid → what it is about (to unlink it).
    event_subject: HashMap<String, Involved>,
}

/// What a core Event is about: `involvedObject` kind, namespace (the Event's own when the
/// reference has none; empty for cluster-scoped kinds is resolved when matching) and name.
type Involved = (String, String, String);

fn is_event(rt: &ResourceType) -> bool {
    rt.group.is_empty() && rt.plural == "events"
}

/// The subject of an Event object, `None` when it names none.
fn involved_of(event: &Value) -> Option<Involved> {
    let involved = event.get("involvedObject")?;
    let field = |key: &str| involved.get(key).and_then(Value::as_str).unwrap_or("");
    if field("kind").is_empty() || field("name").is_empty() {
        return None;
    }
    let namespace = match field("namespace") {
        "" => meta_str(event, "namespace").unwrap_or(""),
        namespace => namespace,
    };
    Some((
        field("kind").to_string(),
        namespace.to_string(),
        field("name").to_string(),
    ))
}

impl Index {
    fn upsert(&mut self, rt: &Arc<ResourceType>, object: &Value) {
        let Some(uid) = meta_str(object, "uid").map(str::to_string) else {
            return;
        };
        self.unlink(&uid);
        let owners: Vec<String> = owner_refs(object).into_iter().map(|r| r.uid).collect();
        for owner in &owners {
            self.dependents
                .entry(owner.clone())
                .or_default()
                .insert(uid.clone());
        }
        let key = key_of(rt, object);
        if is_event(rt)
            && let Some(subject) = involved_of(object)
        {
            self.events_about
                .entry(subject.clone())
                .or_default()
                .insert(uid.clone());
            self.event_subject.insert(uid.clone(), subject);
        }
        if is_deleting(object) {
            if is_namespace(rt) {
                self.terminating.insert(key.name.clone());
            }
            if crate::lifecycle::finalizers(object)
                .iter()
                .any(|f| f == FOREGROUND_FINALIZER)
            {
                self.foreground.insert(uid.clone());
            }
        }
        self.by_uid.insert(
            uid.clone(),
            Entry {
                uid,
                rt: Arc::clone(rt),
                key,
                owners,
            },
        );
    }

    /// Forget `uid`'s own links (not the links of its dependents to it).
    fn unlink(&mut self, uid: &str) -> Option<Entry> {
        let entry = self.by_uid.remove(uid)?;
        for owner in &entry.owners {
            if let Some(set) = self.dependents.get_mut(owner) {
                set.remove(uid);
                if set.is_empty() {
                    self.dependents.remove(owner);
                }
            }
        }
        self.foreground.remove(uid);
        if let Some(subject) = self.event_subject.remove(uid)
            && let Some(set) = self.events_about.get_mut(&subject)
        {
            set.remove(uid);
            if set.is_empty() {
                self.events_about.remove(&subject);
            }
        }
        if is_namespace(&entry.rt) {
            self.terminating.remove(&entry.key.name);
        }
        Some(entry)
    }

    fn dependents_of(&self, uid: &str) -> Vec<Entry> {
        let uids = self.dependents.get(uid).into_iter().flatten();
        uids.filter_map(|d| self.by_uid.get(d).cloned()).collect()
    }
}

struct Collector {
    inner: Arc<Inner>,
    index: Index,
}

/// Run the collector until `shutdown`, rebuilding from scratch whenever the store fails.
pub(crate) async fn run(inner: Arc<Inner>, shutdown: CancellationToken) {
    loop {
        let mut collector = Collector {
            inner: Arc::clone(&inner),
            index: Index::default(),
        };
        match collector.run_once(&shutdown).await {
            Ok(()) => return,
            Err(error) => tracing::warn!(%error, "garbage collector restarting"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(RESTART_DELAY) => {}
        }
    }
}

impl Collector {
    async fn run_once(&mut self, shutdown: &CancellationToken) -> Result<(), GcError> {
        self.inner.ensure_default_namespace().await?;
        let mut streams = Vec::new();
        for rt in self.inner.registry.stored() {
            let resource = rt.store_resource();
            let listed = self
                .inner
                .store
                .list(&resource, &ListOptions::default())
                .await?;
            for object in &listed.items {
                self.index.upsert(rt, object);
            }
            let rt = Arc::clone(rt);
            let events = self
                .inner
                .store
                .watch(&resource, None, listed.revision)
                .await?;
            streams.push(events.map(move |event| (Arc::clone(&rt), event)).boxed());
        }
        let mut events = futures::stream::select_all(streams);
        self.sweep().await;
        let mut resync = tokio::time::interval_at(tokio::time::Instant::now() + RESYNC, RESYNC);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                event = events.next() => match event {
                    Some((rt, Ok(event))) => self.handle(&rt, event).await,
                    Some((_, Err(error))) => return Err(error.into()),
                    None => return Err(GcError::WatchEnded),
                },
                _ = resync.tick() => self.sweep().await,
            }
        }
    }

    /// Log a failed action; the next event or sweep retries it. A vanished object (404) or
    /// one replaced under the same name (409 on the uid precondition) is not a failure.
    fn report(result: Result<(), ApiError>, what: &str, key: &ObjectKey) {
        match result {
            Ok(()) => {}
            Err(error) if error.code == 404 || error.code == 409 => {
                tracing::debug!(%error, resource = %key.resource, namespace = %key.namespace, name = %key.name, what, "garbage collection step skipped");
            }
            Err(error) => {
                tracing::warn!(%error, resource = %key.resource, namespace = %key.namespace, name = %key.name, what, "garbage collection step failed");
            }
        }
    }

    async fn handle(&mut self, rt: &Arc<ResourceType>, event: WatchEvent) {
        let uid = meta_str(&event.object, "uid").unwrap_or("").to_string();
        match event.event_type {
            EventType::Added | EventType::Modified => {
                self.index.upsert(rt, &event.object);
                if is_deleting(&event.object) {
                    if is_namespace(rt) {
                        let result = self.finish_namespace(&event.key.name).await;
                        Self::report(result, "namespace", &event.key);
                    }
                    if self.index.foreground.contains(&uid) {
                        let result = self.finish_foreground(&uid).await;
                        Self::report(result, "foreground", &event.key);
                    }
                }
                let owners = self
                    .index
                    .by_uid
                    .get(&uid)
                    .map(|e| e.owners.clone())
                    .unwrap_or_default();
                // A dependent whose owner is unknown, or deleting in the foreground, may have
                // to go (e.g. created by a controller that raced its owner's deletion).
                if owners.iter().any(|o| {
                    !self.index.by_uid.contains_key(o) || self.index.foreground.contains(o)
                }) {
                    let result = self.collect(rt, &event.key, &uid).await;
                    Self::report(result, "dependent", &event.key);
                }
            }
            EventType::Deleted => {
                let entry = self.index.unlink(&uid);
                let result = self.delete_events_about(rt, &event.object, &uid).await;
                Self::report(result, "events", &event.key);
                for dependent in self.index.dependents_of(&uid) {
                    let result = self
                        .collect(&dependent.rt, &dependent.key, &dependent.uid)
                        .await;
                    Self::report(result, "dependent", &dependent.key);
                }
                if !event.key.namespace.is_empty()
                    && self.index.terminating.contains(&event.key.namespace)
                {
                    let result = self.finish_namespace(&event.key.namespace).await;
                    Self::report(result, "namespace", &event.key);
                }
                for owner in entry.map(|e| e.owners).unwrap_or_default() {
                    if self.index.foreground.contains(&owner) {
                        let result = self.finish_foreground(&owner).await;
                        Self::report(result, "foreground", &event.key);
                    }
                }
            }
        }
    }

    /// Everything events may have left undone: orphans, terminating namespaces, foreground
    /// owners.
    async fn sweep(&mut self) {
        let orphans: Vec<Entry> = self
            .index
            .by_uid
            .values()
            .filter(|e| {
                e.owners.iter().any(|o| {
                    !self.index.by_uid.contains_key(o) || self.index.foreground.contains(o)
                })
            })
            .cloned()
            .collect();
        for entry in orphans {
            let result = self.collect(&entry.rt, &entry.key, &entry.uid).await;
            Self::report(result, "dependent", &entry.key);
        }
        let namespaces: Vec<String> = self.index.terminating.iter().cloned().collect();
        for namespace in namespaces {
            let result = self.finish_namespace(&namespace).await;
            Self::report(
                result,
                "namespace",
                &key(&ResourceType::namespace(), "", &namespace),
            );
        }
        let owners: Vec<String> = self.index.foreground.iter().cloned().collect();
        for owner in owners {
            let key = self.index.by_uid.get(&owner).map(|e| e.key.clone());
            let result = self.finish_foreground(&owner).await;
            if let Some(key) = key {
                Self::report(result, "foreground", &key);
            }
        }
    }

    /// Whether the owner named by `owner` (from a dependent in `namespace`) exists, and
    /// whether it is deleting in the foreground. Owners of kinds this server does not serve
    /// count as existing: their absence cannot be proven.
    async fn owner_state(
        &self,
        owner: &OwnerRef,
        namespace: &str,
    ) -> Result<(bool, bool), ApiError> {
        let group = owner
            .api_version
            .rsplit_once('/')
            .map_or("", |(group, _)| group);
        let Some(rt) = self.inner.registry.by_kind(group, &owner.kind) else {
            return Ok((true, false));
        };
        let namespace = if rt.namespaced { namespace } else { "" };
        let found = self
            .inner
            .store
            .get(&key(&rt, namespace, &owner.name))
            .await
            .map_err(|e| ApiError::from_store(e, &rt, &owner.name))?;
        Ok(match found {
            Some(object) if meta_str(&object, "uid") == Some(owner.uid.as_str()) => {
                let foreground = is_deleting(&object)
                    && crate::lifecycle::finalizers(&object)
                        .iter()
                        .any(|f| f == FOREGROUND_FINALIZER);
                (true, foreground)
            }
            _ => (false, false),
        })
    }

    /// Delete the dependent at `key` (uid `uid`) if none of its owners exists any more or
    /// one is deleting in the foreground; otherwise drop its references to vanished owners.
    async fn collect(&self, rt: &ResourceType, key: &ObjectKey, uid: &str) -> Result<(), ApiError> {
        let Some(object) = self
            .inner
            .store
            .get(key)
            .await
            .map_err(|e| ApiError::from_store(e, rt, &key.name))?
        else {
            return Ok(());
        };
        if meta_str(&object, "uid") != Some(uid) || is_deleting(&object) {
            return Ok(());
        }
        let owners = owner_refs(&object);
        if owners.is_empty() {
            return Ok(());
        }
        let mut vanished = Vec::new();
        let mut any_foreground = false;
        for owner in &owners {
            let (exists, foreground) = self.owner_state(owner, &key.namespace).await?;
            if !exists {
                vanished.push(owner.uid.clone());
            }
            any_foreground |= foreground;
        }
        if vanished.len() == owners.len() || any_foreground {
            tracing::info!(resource = %key.resource, namespace = %key.namespace, name = %key.name, "deleting dependent");
            // An owner waiting in the foreground waits for the whole subtree, as in
            // Kubernetes: its dependents are deleted in the foreground too.
            let propagation = if any_foreground {
                Propagation::Foreground
            } else {
                Propagation::Background
            };
            let options = DeleteOptions {
                propagation,
                precondition_uid: Some(uid.to_string()),
                ..DeleteOptions::default()
            };
            self.inner
                .delete(rt, &key.namespace, &key.name, &options)
                .await?;
        } else if !vanished.is_empty() {
            self.inner
                .modify(rt, key, |object| {
                    remove_from(object, "/metadata/ownerReferences", |r| {
                        vanished.iter().any(|v| names_uid(r, v))
                    })
                })
                .await?;
        }
        Ok(())
    }

    /// Delete the Events about the deleted `object` (uid `uid`) of `rt`: those naming its
    /// kind, namespace and name, and its uid or none. (Namespaced subjects are matched in
    /// the Event's namespace when the reference names none; cluster-scoped ones by any.)
    async fn delete_events_about(
        &self,
        rt: &ResourceType,
        object: &Value,
        uid: &str,
    ) -> Result<(), ApiError> {
        let name = meta_str(object, "name").unwrap_or("");
        let namespace = meta_str(object, "namespace").unwrap_or("");
        let candidates: Vec<String> = if rt.namespaced {
            let subject = (rt.kind.clone(), namespace.to_string(), name.to_string());
            self.index
                .events_about
                .get(&subject)
                .into_iter()
                .flatten()
                .cloned()
                .collect()
        } else {
            self.index
                .events_about
                .iter()
                .filter(|((kind, _, n), _)| *kind == rt.kind && n == name)
                .flat_map(|(_, uids)| uids.iter().cloned())
                .collect()
        };
        for event_uid in candidates {
            let Some(entry) = self.index.by_uid.get(&event_uid) else {
                continue;
            };
            let Some(event) = self
                .inner
                .store
                .get(&entry.key)
                .await
                .map_err(|e| ApiError::from_store(e, &entry.rt, &entry.key.name))?
            else {
                continue;
            };
            let involved = event.get("involvedObject");
            let field = |key: &str| {
                involved
                    .and_then(|o| o.get(key))
                    .and_then(Value::as_str)
                    .unwrap_or("")
            };
            // Another object of the same kind and name (by apiVersion or uid) keeps its Events.
            let group = field("apiVersion")
                .rsplit_once('/')
                .map_or("", |(group, _)| group);
            let same_group = field("apiVersion").is_empty() || group == rt.group;
            let same_uid = field("uid").is_empty() || field("uid") == uid;
            if meta_str(&event, "uid") != Some(event_uid.as_str()) || !same_group || !same_uid {
                continue;
            }
            tracing::info!(namespace = %entry.key.namespace, name = %entry.key.name, subject = name, "deleting event of a deleted object");
            let options = DeleteOptions {
                precondition_uid: Some(event_uid.clone()),
                ..DeleteOptions::default()
            };
            match self
                .inner
                .delete(&entry.rt, &entry.key.namespace, &entry.key.name, &options)
                .await
            {
                Ok(_) => {}
                Err(error) if error.code == 404 || error.code == 409 => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Foreground deletion of `uid`: delete its dependents; once none is left, remove the
    /// `foregroundDeletion` finalizer.
    async fn finish_foreground(&self, uid: &str) -> Result<(), ApiError> {
        let Some(owner) = self.index.by_uid.get(uid).cloned() else {
            return Ok(());
        };
        let dependents = self.index.dependents_of(uid);
        for dependent in &dependents {
            self.collect(&dependent.rt, &dependent.key, &dependent.uid)
                .await?;
        }
        if !dependents.is_empty() {
            return Ok(());
        }
        self.inner
            .modify(&owner.rt, &owner.key, |object| {
                if meta_str(object, "uid") != Some(uid) {
                    return false;
                }
                remove_from(object, "/metadata/finalizers", |f| {
                    f.as_str() == Some(FOREGROUND_FINALIZER)
                })
            })
            .await?;
        Ok(())
    }

    /// Delete the content of Terminating namespace `namespace`; once it is empty, release
    /// the namespace.
    async fn finish_namespace(&self, namespace: &str) -> Result<(), ApiError> {
        let mut remaining = 0;
        for rt in self.inner.registry.stored().filter(|rt| rt.namespaced) {
            let options = ListOptions {
                namespace: Some(namespace.to_string()),
                ..ListOptions::default()
            };
            let listed = self
                .inner
                .store
                .list(&rt.store_resource(), &options)
                .await
                .map_err(|e| ApiError::from_store(e, rt, ""))?;
            remaining += listed.items.len();
            for object in listed.items.iter().filter(|o| !is_deleting(o)) {
                let key = key_of(rt, object);
                let uid = meta_str(object, "uid").map(str::to_string);
                let options = DeleteOptions {
                    precondition_uid: uid,
                    ..DeleteOptions::default()
                };
                match self.inner.delete(rt, namespace, &key.name, &options).await {
                    Ok(_) => {}
                    Err(error) if error.code == 404 || error.code == 409 => {}
                    Err(error) => return Err(error),
                }
            }
        }
        if remaining > 0 {
            return Ok(());
        }
        let ns_rt = ResourceType::namespace();
        tracing::info!(namespace, "namespace is empty; removing it");
        self.inner
            .modify(&ns_rt, &key(&ns_rt, "", namespace), |object| {
                if !is_deleting(object) {
                    return false;
                }
                remove_from(object, "/spec/finalizers", |f| {
                    f.as_str() == Some(NAMESPACE_FINALIZER)
                })
            })
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn index_tracks_owners_and_deletions() {
        let jobs = Arc::new(ResourceType::namespace());
        let mut index = Index::default();
        let owner = json!({"metadata": {"name": "o", "uid": "u-o"}});
        let dependent = json!({"metadata": {"name": "d", "uid": "u-d", "ownerReferences": [
            {"apiVersion": "v1", "kind": "Namespace", "name": "o", "uid": "u-o"}
        ]}});
        index.upsert(&jobs, &owner);
        index.upsert(&jobs, &dependent);
        assert_eq!(index.dependents_of("u-o").len(), 1);
        // Re-indexing without the reference drops the link.
        index.upsert(&jobs, &json!({"metadata": {"name": "d", "uid": "u-d"}}));
        assert!(index.dependents_of("u-o").is_empty());
        index.upsert(&jobs, &json!({"metadata": {"name": "o", "uid": "u-o", "deletionTimestamp": "t", "finalizers": [FOREGROUND_FINALIZER]}}));
        assert!(index.foreground.contains("u-o"));
        assert!(index.terminating.contains("o"));
        index.unlink("u-o");
        assert!(index.foreground.is_empty() && index.terminating.is_empty());
    }
}
