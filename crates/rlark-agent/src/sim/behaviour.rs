//! What the simulated replicas of a Task do: run for a while, then succeed or fail, or run
//! until stopped; chosen by Task name.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

/// How the replicas of a Task end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Every replica runs for `after`, then exits 0 (`Succeeded`).
    Succeed { after: Duration },
    /// Every replica runs for `after`, then exits with `exit_code` (`Failed`).
    Fail { after: Duration, exit_code: i32 },
    /// Replicas run until stopped or deleted.
    RunForever,
}

impl Behaviour {
    /// Succeed after `after`.
    pub fn succeed_after(after: Duration) -> Self {
        Behaviour::Succeed { after }
    }

    /// Fail with `exit_code` after `after`.
    pub fn fail_after(after: Duration, exit_code: i32) -> Self {
        Behaviour::Fail { after, exit_code }
    }

    /// Never end on their own.
    pub fn run_forever() -> Self {
        Behaviour::RunForever
    }

    /// How long a replica runs before it ends on its own (`None`: never).
    pub fn runs_for(&self) -> Option<Duration> {
        match self {
            Behaviour::Succeed { after } | Behaviour::Fail { after, .. } => Some(*after),
            Behaviour::RunForever => None,
        }
    }

    /// The status patch (its `status` value) that ends a replica, or `None` for
    /// [`Behaviour::RunForever`].
    pub fn final_status(&self, now: Timestamp) -> Option<serde_json::Value> {
        match self {
            Behaviour::Succeed { .. } => Some(json!({
                "phase": "Succeeded",
                "exitCode": 0,
                "reason": "Completed",
                "message": "process exited with code 0",
                "finishTime": Time(now),
            })),
            Behaviour::Fail { exit_code, .. } => Some(json!({
                "phase": "Failed",
                "exitCode": exit_code,
                "reason": "Error",
                "message": format!("process exited with code {exit_code}"),
                "finishTime": Time(now),
            })),
            Behaviour::RunForever => None,
        }
    }
}

/// Behaviours by Task name: exact names, and patterns ending in `*` (a prefix). An exact
/// name wins over patterns, a longer pattern over a shorter one; otherwise the default.
#[derive(Clone, Debug)]
pub struct Behaviours {
    exact: HashMap<String, Behaviour>,
    prefixes: Vec<(String, Behaviour)>,
    default: Behaviour,
}

impl Default for Behaviours {
    fn default() -> Self {
        Self {
            exact: HashMap::new(),
            prefixes: Vec::new(),
            default: Behaviour::succeed_after(Duration::ZERO),
        }
    }
}

impl Behaviours {
    /// Set the behaviour of Tasks named `pattern` (or starting with it, when it ends in `*`).
    pub fn set(&mut self, pattern: &str, behaviour: Behaviour) {
        match pattern.strip_suffix('*') {
            Some(prefix) => {
                self.prefixes.retain(|(p, _)| p != prefix);
                self.prefixes.push((prefix.to_string(), behaviour));
                // Longest prefix first, so the most specific pattern matches first.
                self.prefixes
                    .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
            }
            None => {
                self.exact.insert(pattern.to_string(), behaviour);
            }
        }
    }

    /// Set the behaviour of Tasks nothing else matches (default: succeed at once).
    pub fn set_default(&mut self, behaviour: Behaviour) {
        self.default = behaviour;
    }

    /// The behaviour of the Task named `task_name`.
    pub fn lookup(&self, task_name: &str) -> &Behaviour {
        if let Some(b) = self.exact.get(task_name) {
            return b;
        }
        self.prefixes
            .iter()
            .find(|(prefix, _)| task_name.starts_with(prefix.as_str()))
            .map_or(&self.default, |(_, b)| b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaviour_lookup_prefers_exact_then_longest_prefix() {
        let mut b = Behaviours::default();
        b.set("wf-*", Behaviour::run_forever());
        b.set("wf-train-*", Behaviour::fail_after(Duration::ZERO, 2));
        b.set(
            "wf-train-actor",
            Behaviour::succeed_after(Duration::from_secs(1)),
        );
        assert_eq!(
            b.lookup("wf-train-actor"),
            &Behaviour::succeed_after(Duration::from_secs(1))
        );
        assert_eq!(
            b.lookup("wf-train-rollout"),
            &Behaviour::fail_after(Duration::ZERO, 2)
        );
        assert_eq!(b.lookup("wf-eval-x"), &Behaviour::run_forever());
        assert_eq!(b.lookup("other"), &Behaviour::succeed_after(Duration::ZERO));
        b.set_default(Behaviour::run_forever());
        assert_eq!(b.lookup("other"), &Behaviour::run_forever());
        // Replacing a pattern keeps one entry.
        b.set("wf-*", Behaviour::succeed_after(Duration::ZERO));
        assert_eq!(b.prefixes.len(), 2);
    }

    #[test]
    fn final_status_says_how_the_replica_ended() {
        let now = Timestamp::UNIX_EPOCH;
        let ok = Behaviour::succeed_after(Duration::ZERO)
            .final_status(now)
            .expect("ends");
        assert_eq!(ok["phase"], "Succeeded");
        assert_eq!(ok["exitCode"], 0);
        let failed = Behaviour::fail_after(Duration::ZERO, 7)
            .final_status(now)
            .expect("ends");
        assert_eq!(failed["phase"], "Failed");
        assert_eq!(failed["exitCode"], 7);
        assert!(failed["message"].as_str().is_some_and(|m| m.contains('7')));
        assert!(Behaviour::run_forever().final_status(now).is_none());
        assert_eq!(Behaviour::run_forever().runs_for(), None);
    }
}
