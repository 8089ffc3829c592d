//! Control-plane reconcilers for `rlinf.io/v1alpha1`, written with kube-runtime against
//! rlark's own API server (in-process in `rlark server`, or apart in
//! `rlark controller-manager` with leader election).
//!
//! - [`scheduler`]: pure gang placement of a Job's Tasks onto Nodes.
//! - [`job`]: Job state machine, Task creation/placement, stop/resume/restart.
//! - [`workflow`]: the DAG of Jobs.
//! - [`task`]: Task status aggregated from the Pods agents report.
//! - [`node`]: heartbeat timeout → `Offline`, `NodeLost` on its Tasks.
//! - [`domain`]: addresses of a Domain's replicas (pure [`domain::ipam`]) and the
//!   DomainPeer of each agent namespace holding a member.
//! - [`events`]: Kubernetes-style Events recorded for every transition and decision.
//! - [`leader`]: leader election on a `coordination.k8s.io/v1` Lease.
//! - [`runner`]: the reconcile loop, metrics and error policy the kube-runtime controllers
//!   share.
//! - [`manager`]: runs all of them until shutdown.
// The zero-unwrap discipline as a rule: product code turns a failure into an error that
// names what failed, never a panic (tests, built with cfg(test), may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod context;
pub mod domain;
pub mod error;
pub mod events;
pub mod job;
pub mod leader;
pub mod manager;
pub mod node;
pub mod runner;
pub mod scheduler;
pub mod task;
pub mod workflow;

pub use context::{Context, ControllerConfig};
pub use error::Error;
