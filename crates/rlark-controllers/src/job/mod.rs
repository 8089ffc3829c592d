//! Job controller: the Job state machine, gang placement and creation of its Tasks,
//! stop / resume / restart. The contract is in `docs/concepts.md` (sections Job and
//! Placement); the cache and expectations rules in `docs/architecture.md` (Background work).
//!
//! - [`decide`] is the state machine, pure: `""` → `Pending` → `Running` → `Succeeded` or
//!   `Failed`; `spec.stopped` → `Stopped` and back to `Pending` (resume); a changed
//!   `rlark.io/restarted-at` on a finished Job deletes its Tasks and starts over (restart).
//! - Template `t` of Job `j` becomes Task `j-t` in namespace `rlark-<clusterID>` of the
//!   Nodes [`crate::scheduler`] chose, with RLark's Ray annotations ([`ray_annotations`]).
//! - A pass reads the Job and its Tasks from the watch caches when they show every write
//!   this controller made for the Job (`Expectations`), else fresh from the API server, so a
//!   pass killed at any point is completed by the next one. Placements are serialized by
//!   one mutex of this process, over the usage summed from a Task watch
//!   ([`scheduler::ClusterUsage`]) plus a ledger of Tasks being created.
//!
//! Files: `decide` (observation → decision → status, pure), `build` (the Tasks of a Job,
//! pure), `expectations` (ledger, usage index, expectations), `reconcile` (watches and the
//! pass, IO).

mod build;
mod decide;
mod expectations;
mod reconcile;
#[cfg(test)]
mod tests;

pub use build::*;
pub use decide::*;
pub use reconcile::run;

use std::time::Duration;

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "job";

/// Condition types of a Job.
pub mod condition {
    /// Every Task of the Job exists (placed).
    pub const SCHEDULED: &str = "Scheduled";
    /// The Job waits for capacity; the message says which task lacks what.
    pub const UNSCHEDULABLE: &str = "Unschedulable";
    /// The Job is `Running`.
    pub const RUNNING: &str = "Running";
    /// Every Task succeeded.
    pub const COMPLETE: &str = "Complete";
    /// A Task failed.
    pub const FAILED: &str = "Failed";
}

/// How long an entry of the placement ledger is trusted after its Task was created
/// without the Task watch showing it (the Task was deleted before being seen).
const ASSUME_TTL: Duration = Duration::from_secs(60);
/// Periodic re-check of a Job with nothing else to wait for.
const RESYNC: Duration = Duration::from_secs(300);
/// Re-check while Tasks are being deleted (restart) or stopped; Task events usually come
/// first.
const SHORT_REQUEUE: Duration = Duration::from_secs(2);
