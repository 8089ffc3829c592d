//! What the controller keeps between passes, without IO: the placement ledger of Tasks being
//! created, the usage index summed from the Task watch, and the expectations that decide
//! whether a pass may read the caches instead of the API server.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use kube::runtime::watcher;
use rlark_api::types::Task;
// Expectation and assumption TTLs follow tokio's clock, which tests may pause and advance.
use tokio::time::Instant;

use crate::scheduler::{ClusterUsage, TaskUsage};

use super::ASSUME_TTL;

/// Tasks this process is creating or has created but not yet seen in the Task watch.
#[derive(Default)]
pub(super) struct Ledger {
    pub(super) assumed: BTreeMap<(String, String), Assumed>,
}

pub(super) struct Assumed {
    pub(super) usage: Option<TaskUsage>,
    pub(super) uid: Option<String>,
    pub(super) since: Instant,
}

impl Ledger {
    /// Forget entries the index has seen (same uid) or that are too old to trust.
    pub(super) fn prune(&mut self, index: &UsageIndex, now: Instant) {
        self.assumed.retain(|_, a| match &a.uid {
            None => true,
            Some(uid) => {
                !index.by_uid.contains_key(uid) && now.duration_since(a.since) < ASSUME_TTL
            }
        });
    }

    /// `base` plus the assumed Tasks whose uid is not in `seen`.
    pub(super) fn overlay(
        &self,
        mut base: ClusterUsage,
        seen: impl Fn(&str) -> bool,
    ) -> ClusterUsage {
        for a in self.assumed.values() {
            if a.uid.as_deref().is_none_or(|u| !seen(u))
                && let Some(usage) = &a.usage
            {
                base.add(usage);
            }
        }
        base
    }
}

/// What every placed Task holds, kept up to date incrementally from the Task watch, so a
/// placement costs O(Nodes) rather than O(Tasks).
#[derive(Default)]
pub(super) struct UsageIndex {
    /// Every Task seen, by uid, and what it holds.
    pub(super) by_uid: HashMap<String, Option<TaskUsage>>,
    pub(super) total: ClusterUsage,
    /// Filled during a (re)list, swapped in when it is complete.
    pub(super) relist: Option<HashMap<String, Option<TaskUsage>>>,
}

impl UsageIndex {
    /// Applies one watch event; returns true when a (re)list completed.
    pub(super) fn apply(&mut self, event: &watcher::Event<Task>) -> bool {
        match event {
            watcher::Event::Apply(task) => {
                let Some(uid) = task.metadata.uid.clone() else {
                    return false;
                };
                if let Some(Some(old)) = self.by_uid.get(&uid) {
                    self.total.remove(old);
                }
                let usage = TaskUsage::of(task);
                if let Some(u) = &usage {
                    self.total.add(u);
                }
                self.by_uid.insert(uid, usage);
                false
            }
            watcher::Event::Delete(task) => {
                if let Some(Some(old)) = task
                    .metadata
                    .uid
                    .as_ref()
                    .and_then(|u| self.by_uid.remove(u))
                {
                    self.total.remove(&old);
                }
                false
            }
            watcher::Event::Init => {
                self.relist = Some(HashMap::new());
                false
            }
            watcher::Event::InitApply(task) => {
                if let (Some(relist), Some(uid)) = (self.relist.as_mut(), task.metadata.uid.clone())
                {
                    relist.insert(uid, TaskUsage::of(task));
                }
                false
            }
            watcher::Event::InitDone => {
                let by_uid = self.relist.take().unwrap_or_default();
                let mut total = ClusterUsage::default();
                for usage in by_uid.values().flatten() {
                    total.add(usage);
                }
                self.by_uid = by_uid;
                self.total = total;
                true
            }
        }
    }
}

/// How long unmet expectations make a Job's passes read the API server instead of the
/// caches (a Task created and deleted by someone else before the cache saw it would
/// otherwise keep them unmet forever).
pub(super) const EXPECTATION_TTL: Duration = Duration::from_secs(30);

/// What this controller wrote for one Job that its caches must reflect before a pass may
/// read them instead of the API server — kube-controller-manager's "expectations". Until
/// then a pass reads fresh (a GET of the Job, a list of its Tasks), so a trailing cache
/// never makes it place, delete or restart twice.
#[derive(Debug, Default)]
pub(super) struct Expectations {
    /// The Job's resourceVersion after the last status write.
    pub(super) job: Option<u64>,
    /// Tasks created (UIDs), to appear in the Task cache.
    pub(super) created: HashSet<String>,
    /// Tasks deleted (UIDs), to disappear from it (or show their deletion).
    pub(super) deleted: HashSet<String>,
    /// Tasks updated: UID → the resourceVersion the cache must reach.
    pub(super) updated: HashMap<String, u64>,
    /// The last write recorded.
    pub(super) since: Option<Instant>,
}

impl Expectations {
    pub(super) fn expired(&self) -> bool {
        self.since.is_some_and(|t| t.elapsed() >= EXPECTATION_TTL)
    }

    pub(super) fn tasks_pending(&self) -> bool {
        !(self.created.is_empty() && self.deleted.is_empty() && self.updated.is_empty())
    }

    /// Whether `cached` (the Job's Tasks in the cache) shows every Task write.
    pub(super) fn tasks_met_by(&self, cached: &[Arc<Task>]) -> bool {
        let by_uid: HashMap<&str, &Task> = cached
            .iter()
            .filter_map(|t| Some((t.metadata.uid.as_deref()?, t.as_ref())))
            .collect();
        self.created
            .iter()
            .all(|uid| by_uid.contains_key(uid.as_str()))
            && self.deleted.iter().all(|uid| {
                by_uid
                    .get(uid.as_str())
                    .is_none_or(|t| t.metadata.deletion_timestamp.is_some())
            })
            && self.updated.iter().all(|(uid, rv)| {
                by_uid
                    .get(uid.as_str())
                    .and_then(|t| revision_of(&t.metadata))
                    .is_some_and(|seen| seen >= *rv)
            })
    }
}

/// An object's resourceVersion as a number (rlark's are store revisions); `None` when
/// absent or not numeric (then caches are never trusted for it).
pub(super) fn revision_of(meta: &ObjectMeta) -> Option<u64> {
    meta.resource_version.as_deref()?.parse().ok()
}
