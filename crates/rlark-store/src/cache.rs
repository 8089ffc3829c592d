//! The in-memory copy of every object: the read path of `get` and `list`.
//!
//! Objects are kept per resource in key order (namespace, then name), each with the revision
//! that wrote it and its JSON encoding. The encoding is made once per write (the backend
//! stores the same text) and replaced together with the object, so it is never older or
//! newer than the object it comes with.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::Arc;

use serde_json::Value;

use crate::{EventType, ListOptions, ListResult, ObjectKey, Revision, StoreError, Usage};

/// `(namespace, name)`: where an object sits within its resource.
pub(crate) type Slot = (String, String);
/// An object with its encoding.
pub(crate) type Encoded = (Arc<Value>, Arc<str>);
/// The state at some revision of the objects written since (`None` = absent then).
pub(crate) type States = HashMap<Slot, Option<Encoded>>;

#[derive(Clone)]
pub(crate) struct Stored {
    pub(crate) revision: Revision,
    pub(crate) object: Arc<Value>,
    /// `serde_json::to_string(&*object)`, made by the write that stored `object`.
    pub(crate) json: Arc<str>,
}

/// The one JSON encoding of a stored object (what the backend, lists and watches carry).
pub(crate) fn encode(object: &Value) -> Result<Arc<str>, StoreError> {
    serde_json::to_string(object)
        .map(Arc::from)
        .map_err(|e| StoreError::Database(format!("serializing object: {e}")))
}

#[derive(Default)]
pub(crate) struct Cache {
    objects: HashMap<String, BTreeMap<(String, String), Stored>>,
    /// What each namespace holds, per resource (kept with every write, for quotas).
    usage: HashMap<String, HashMap<String, Usage>>,
}

impl Usage {
    fn add(&mut self, bytes: usize) {
        self.objects += 1;
        self.bytes = self.bytes.saturating_add(bytes as u64);
    }

    fn remove(&mut self, bytes: usize) {
        self.objects = self.objects.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(bytes as u64);
    }
}

impl Cache {
    pub(crate) fn len(&self) -> usize {
        self.objects.values().map(BTreeMap::len).sum()
    }

    /// Every object, by resource then key.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &Slot, &Stored)> {
        self.objects.iter().flat_map(|(resource, objects)| {
            objects
                .iter()
                .map(move |(slot, stored)| (resource.as_str(), slot, stored))
        })
    }

    pub(crate) fn lookup(&self, key: &ObjectKey) -> Option<&Stored> {
        self.objects
            .get(&key.resource)?
            .get(&(key.namespace.clone(), key.name.clone()))
    }

    /// Record a committed write of `key`.
    pub(crate) fn apply(&mut self, key: &ObjectKey, event_type: EventType, stored: Stored) {
        let slot = (key.namespace.clone(), key.name.clone());
        let new_bytes = stored.json.len();
        let old = match event_type {
            EventType::Deleted => self
                .objects
                .get_mut(&key.resource)
                .and_then(|objects| objects.remove(&slot)),
            EventType::Added | EventType::Modified => self
                .objects
                .entry(key.resource.clone())
                .or_default()
                .insert(slot, stored),
        };
        let namespace = self.usage.entry(key.namespace.clone()).or_default();
        let usage = namespace.entry(key.resource.clone()).or_default();
        if let Some(old) = old {
            usage.remove(old.json.len());
        }
        if event_type != EventType::Deleted {
            usage.add(new_bytes);
        }
        if usage.objects == 0 {
            namespace.remove(&key.resource);
            if namespace.is_empty() {
                self.usage.remove(&key.namespace);
            }
        }
    }

    /// What `namespace` holds of `resource`, or of every resource.
    pub(crate) fn usage(&self, namespace: &str, resource: Option<&str>) -> Usage {
        let Some(by_resource) = self.usage.get(namespace) else {
            return Usage::default();
        };
        match resource {
            Some(resource) => by_resource.get(resource).copied().unwrap_or_default(),
            None => by_resource
                .values()
                .fold(Usage::default(), |total, u| Usage {
                    objects: total.objects + u.objects,
                    bytes: total.bytes.saturating_add(u.bytes),
                }),
        }
    }

    /// One page of `resource` as `options` ask, at `revision`, each item made by `item`.
    pub(crate) fn page<T>(
        &self,
        resource: &str,
        options: &ListOptions,
        revision: Revision,
        item: impl Fn(&Stored) -> T,
    ) -> ListResult<T> {
        match self.objects.get(resource) {
            Some(objects) => page_of(objects, resource, options, revision, item),
            None => page_of(&BTreeMap::new(), resource, options, revision, item),
        }
    }

    /// Every object of `resource` as it was at an older revision: the current ones with
    /// `changed` applied (the state at that revision of every key written since; `None` =
    /// absent then).
    pub(crate) fn view_with(&self, resource: &str, changed: States) -> BTreeMap<Slot, Encoded> {
        let mut view: BTreeMap<Slot, Encoded> = self
            .objects
            .get(resource)
            .into_iter()
            .flatten()
            .filter(|(slot, _)| !changed.contains_key(*slot))
            .map(|(slot, stored)| {
                (
                    slot.clone(),
                    (Arc::clone(&stored.object), Arc::clone(&stored.json)),
                )
            })
            .collect();
        view.extend(
            changed
                .into_iter()
                .filter_map(|(slot, state)| state.map(|state| (slot, state))),
        );
        view
    }
}

/// One page of `objects` (the objects of `resource`) as `options` ask, at `revision`, each
/// item made by `item`.
pub(crate) fn page_of<V, T>(
    objects: &BTreeMap<(String, String), V>,
    resource: &str,
    options: &ListOptions,
    revision: Revision,
    item: impl Fn(&V) -> T,
) -> ListResult<T> {
    let empty = ListResult {
        items: Vec::new(),
        revision,
        continue_after: None,
        remaining: 0,
    };
    let start = options.start_after.clone();
    let (lower, namespace) = match (&options.namespace, start) {
        (None, None) => (Bound::Unbounded, None),
        (None, Some(after)) => (Bound::Excluded(after), None),
        (Some(ns), Some(after)) if after.0 == *ns => (Bound::Excluded(after), Some(ns.as_str())),
        // Resuming after a later namespace: nothing of `ns` is left.
        (Some(ns), Some(after)) if after.0 > *ns => return empty,
        (Some(ns), _) => (
            Bound::Included((ns.clone(), String::new())),
            Some(ns.as_str()),
        ),
    };
    let mut matching = objects
        .range::<(String, String), _>((lower, Bound::Unbounded))
        .take_while(|((ns, _), _)| namespace.is_none_or(|want| ns == want));
    let limit = options.limit.filter(|&l| l > 0).unwrap_or(usize::MAX);
    let mut items = Vec::new();
    let mut last = None;
    for (slot, stored) in matching.by_ref().take(limit) {
        items.push(item(stored));
        last = Some(slot);
    }
    let remaining = matching.count() as u64;
    let continue_after = match last {
        Some((ns, name)) if remaining > 0 => Some(ObjectKey::new(resource, ns, name)),
        _ => None,
    };
    ListResult {
        items,
        revision,
        continue_after,
        remaining,
    }
}
