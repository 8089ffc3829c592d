//! The Kubernetes runtime (`rlark agent --agent-type Kubernetes`, docs/tasks.md
//! "Kubernetes runtime"): the IO around the pure core, its parent [`crate::kubernetes`]. The agent
//! runs the Tasks placed on its cluster as workloads of a member Kubernetes cluster and
//! mirrors their Pods as rlark Pods, so the control plane's controllers compute the Task
//! and Job phases as they do for raw replicas.
//!
//! - `client`: the member cluster's client ([`connect`]: `--member-kubeconfig` or
//!   in-cluster config, the start-up check, the workload namespace) and the workload calls;
//! - `mirror`: pure: a member Pod → its rlark Pod, the failure Pod of a Task that cannot
//!   run, status patches;
//! - `reconciler`: the loop ([`run`]): watches of the Tasks, the rlark Pods, the member
//!   workloads and Pods, a pass over all of them on every change and every
//!   [`RESYNC_INTERVAL`];
//! - `events`: Warning events on Tasks (fields a template tried to set that rlark forces).
//!
//! - [`nodes`]: the member's Nodes mirrored as rlark Nodes, and cordons pushed down;
//! - [`logs`]: `rlark logs` of a mirrored Pod from the member API;
//! - [`exec`]: `rlark exec` into a mirrored Pod through the member API's `pods/exec`.

mod client;
mod events;
pub mod exec;
pub mod logs;
mod mirror;
pub mod nodes;
mod reconciler;

use std::path::PathBuf;
use std::time::Duration;

pub use crate::config::{DEFAULT_MEMBER_NAMESPACE, MemberOptions};
pub use client::{MemberClient, connect};
pub use mirror::{MEMBER_FAILURE_ANNOTATION, MEMBER_POD_ANNOTATION};
pub use reconciler::{MemberMetrics, MemberRun, run};

/// Period of the full pass (besides the one every watched change triggers).
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(10);

/// Why the Kubernetes runtime cannot run.
#[derive(Debug, thiserror::Error)]
pub enum MemberError {
    /// Neither `--member-kubeconfig` nor in-cluster config.
    #[error(
        "no member cluster: give --member-kubeconfig FILE, or run the agent in a Pod of the member cluster (in-cluster config: {0})"
    )]
    NoConfig(String),
    /// The kubeconfig could not be read or used.
    #[error("member kubeconfig {}: {reason}", path.display())]
    Kubeconfig { path: PathBuf, reason: String },
    /// The member API did not answer the start-up check.
    #[error("the member cluster's API at {server} does not answer: {reason}")]
    Unreachable { server: String, reason: String },
    /// The workload namespace is not there and cannot be created.
    #[error("member namespace {namespace:?}: {reason}")]
    Namespace { namespace: String, reason: String },
    /// A watch of the control plane or the member ended for good.
    #[error("watch of {0} ended")]
    WatchEnded(&'static str),
}
