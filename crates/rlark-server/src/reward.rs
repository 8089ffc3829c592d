//! A Task's `status.reward` ([`RewardSummary`]), folded from its `reward` reports as each
//! is stored: the numbers `get -o wide` and `describe` show without reading the reports.
//!
//! The fold is a compare-and-swap on the stored Task (read, fold, update at the revision
//! read; a conflict reads again), so two reports stored at once both count. Within one
//! server process the folds of one Task take turns (a lock per hash stripe of the Task's
//! key), so only replicas of a shared store ever race. It touches
//! only `status.reward`: every other writer of a Task's status (the agent, the controllers)
//! merge-patches its own fields. A failure is logged and leaves the summary behind by
//! that report; the report itself is stored either way (reports never fail on their
//! summary).

use std::hash::{Hash as _, Hasher as _};
use std::sync::LazyLock;

use rlark_api::types::{REWARD_REPORT_TYPE, RewardSummary};
use rlark_store::{ObjectKey, Revision, Store, StoreError};
use serde_json::Value;

/// Store resource of Tasks.
const TASKS: &str = "tasks.rlinf.io";
/// Compare-and-swap attempts before the fold gives up (each conflict means another writer
/// changed the Task in between: the agent, a controller, another server replica).
const MAX_ATTEMPTS: u32 = 64;
/// Lock stripes of [`record`]: the folds of Tasks whose keys hash to one stripe take turns.
const STRIPES: usize = 64;

static LOCKS: LazyLock<Vec<tokio::sync::Mutex<()>>> =
    LazyLock::new(|| (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect());

fn stripe(namespace: &str, name: &str) -> usize {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (namespace, name).hash(&mut hasher);
    (hasher.finish() % STRIPES as u64) as usize
}

/// The reward of a posted report: its `value` when `type` is `reward` and the value a
/// finite number; with its integer `step`, when it has one.
pub(crate) fn reward_of(report: &Value) -> Option<(f64, Option<i64>)> {
    if report.get("type").and_then(Value::as_str) != Some(REWARD_REPORT_TYPE) {
        return None;
    }
    let value = report.get("value").and_then(Value::as_f64)?;
    if !value.is_finite() {
        return None;
    }
    let step = report.get("step").and_then(|s| {
        s.as_i64()
            .or_else(|| s.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64))
    });
    Some((value, step))
}

/// Fold `report` (when it is a reward) into the `status.reward` of Task
/// `namespace/name` as long as the Task is still the run `uid`.
pub(crate) async fn record(
    store: &dyn Store,
    namespace: &str,
    name: &str,
    uid: &str,
    report: &Value,
) {
    let Some((value, step)) = reward_of(report) else {
        return;
    };
    let _turn = match LOCKS.get(stripe(namespace, name)) {
        Some(lock) => Some(lock.lock().await),
        None => None,
    };
    if let Err(error) = fold_into_task(store, namespace, name, uid, value, step).await {
        tracing::warn!(%error, namespace, task = name, "the task's reward summary was not updated");
    }
}

async fn fold_into_task(
    store: &dyn Store,
    namespace: &str,
    name: &str,
    uid: &str,
    value: f64,
    step: Option<i64>,
) -> Result<(), StoreError> {
    let key = ObjectKey::new(TASKS, namespace, name);
    for _ in 0..MAX_ATTEMPTS {
        let Some(task) = store.get(&key).await? else {
            return Ok(());
        };
        if task.pointer("/metadata/uid").and_then(Value::as_str) != Some(uid) {
            return Ok(());
        }
        let revision = task
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .and_then(|v| v.parse::<Revision>().ok());
        let previous: Option<RewardSummary> = task
            .pointer("/status/reward")
            .and_then(|r| serde_json::from_value(r.clone()).ok());
        let next = RewardSummary::fold(previous.as_ref(), value, step);
        let mut updated = task.as_ref().clone();
        let Some(object) = updated.as_object_mut() else {
            return Ok(());
        };
        let status = object
            .entry("status")
            .or_insert_with(|| Value::Object(Default::default()));
        if !status.is_object() {
            *status = Value::Object(Default::default());
        }
        if let Some(status) = status.as_object_mut() {
            status.insert(
                "reward".into(),
                serde_json::to_value(&next)
                    .map_err(|e| StoreError::InvalidObject(e.to_string()))?,
            );
        }
        match store.update(&key, updated, revision).await {
            Ok(_) => return Ok(()),
            Err(StoreError::Conflict { .. }) => continue,
            Err(StoreError::NotFound(_)) => return Ok(()),
            Err(other) => return Err(other),
        }
    }
    Err(StoreError::Unavailable(format!(
        "{MAX_ATTEMPTS} conflicting writes to the task in a row"
    )))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    #[test]
    fn only_finite_reward_values_count() {
        assert_eq!(
            reward_of(&json!({"type": "reward", "value": 1.5, "step": 3})),
            Some((1.5, Some(3)))
        );
        assert_eq!(
            reward_of(&json!({"type": "reward", "value": 2, "step": 4.0})),
            Some((2.0, Some(4)))
        );
        assert_eq!(
            reward_of(&json!({"type": "reward", "value": 2, "step": 4.5})),
            Some((2.0, None))
        );
        assert_eq!(reward_of(&json!({"type": "metrics", "value": 1.0})), None);
        assert_eq!(reward_of(&json!({"type": "reward", "value": "high"})), None);
        assert_eq!(reward_of(&json!({"type": "reward"})), None);
    }

    fn task(uid: &str) -> Value {
        json!({"apiVersion": "rlinf.io/v1alpha1", "kind": "Task",
               "metadata": {"name": "t", "namespace": "ns", "uid": uid},
               "spec": {}, "status": {"phase": "Running"}})
    }

    #[tokio::test]
    async fn concurrent_rewards_all_count_and_other_status_stays() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let config = rlark_store::SqliteStoreConfig::new(dir.path().join("db"));
        let store: Arc<dyn Store> = Arc::new(rlark_store::SqliteStore::open(config).await?);
        let key = ObjectKey::new(TASKS, "ns", "t");
        store.create(&key, task("u1")).await?;
        let posts = (1..=20).map(|i| {
            let store = store.clone();
            async move {
                record(
                    store.as_ref(),
                    "ns",
                    "t",
                    "u1",
                    &json!({"type": "reward", "value": f64::from(i), "step": i}),
                )
                .await;
            }
        });
        futures::future::join_all(posts).await;
        let stored = store.get(&key).await?.expect("task");
        let reward: RewardSummary =
            serde_json::from_value(stored.pointer("/status/reward").cloned().expect("reward"))?;
        assert_eq!(reward.count, 20);
        assert!((reward.mean - 10.5).abs() < 1e-9, "{reward:?}");
        assert_eq!(reward.max, 20.0);
        assert_eq!(
            stored.pointer("/status/phase"),
            Some(&json!("Running")),
            "the rest of the status is kept"
        );
        // Another run of the same name (a new uid) is not written to.
        record(
            store.as_ref(),
            "ns",
            "t",
            "u0",
            &json!({"type": "reward", "value": 99.0}),
        )
        .await;
        let again = store.get(&key).await?.expect("task");
        assert_eq!(again.pointer("/status/reward/count"), Some(&json!(20)));
        Ok(())
    }
}
