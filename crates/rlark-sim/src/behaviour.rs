//! What the simulated replicas of a Task do: run for a while, then succeed or fail, or run
//! until stopped; chosen by Task name.

use std::collections::HashMap;
use std::time::Duration;

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

    /// The exit code a replica ends with on its own (`None`: it never ends on its own).
    /// What happens then (`Succeeded`, `Failed`, a restart) is the agent protocol's
    /// (`rlark_api::agent::replica`), as for a real process.
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            Behaviour::Succeed { .. } => Some(0),
            Behaviour::Fail { exit_code, .. } => Some(*exit_code),
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
    fn behaviours_say_when_and_how_replicas_end() {
        let ok = Behaviour::succeed_after(Duration::from_secs(2));
        assert_eq!(ok.runs_for(), Some(Duration::from_secs(2)));
        assert_eq!(ok.exit_code(), Some(0));
        let failed = Behaviour::fail_after(Duration::ZERO, 7);
        assert_eq!(failed.runs_for(), Some(Duration::ZERO));
        assert_eq!(failed.exit_code(), Some(7));
        assert_eq!(Behaviour::run_forever().exit_code(), None);
        assert_eq!(Behaviour::run_forever().runs_for(), None);
    }
}
