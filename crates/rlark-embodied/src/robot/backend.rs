//! What runs a robot: the [`Backend`] trait and the events backends report.

use tokio::sync::mpsc;

use super::plan::LaunchPlan;

/// A launch that could not be brought up (or a reset that failed).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LaunchError(pub String);

impl LaunchError {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// Something that happened to a running launch on its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The launch ended cleanly (exit status 0): the robot becomes STOPPED.
    Ended(String),
    /// The launch failed (non-zero exit, lost master, injected fault): the robot becomes
    /// ERROR.
    Failed(String),
}

/// An event of one launch of one robot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendEvent {
    pub robot: String,
    /// The launch it belongs to; events of earlier launches are ignored.
    pub generation: u64,
    pub kind: EventKind,
}

/// Where a launch reports what happens to it after [`Backend::launch`] returned.
#[derive(Clone, Debug)]
pub struct LaunchContext {
    pub robot: String,
    pub generation: u64,
    pub events: mpsc::UnboundedSender<BackendEvent>,
}

impl LaunchContext {
    pub fn report(&self, kind: EventKind) {
        // The receiver lives as long as the controller; after it is gone nobody cares.
        let _ = self.events.send(BackendEvent {
            robot: self.robot.clone(),
            generation: self.generation,
            kind,
        });
    }
}

/// The launch machinery of one robot. The controller calls it with the robot's operation
/// lock held, so calls never overlap.
#[async_trait::async_trait]
pub trait Backend: Send {
    /// Bring up `plan` (starting the robot's ROS master first if it needs one) and return
    /// once it runs. Later failures go to `ctx`.
    async fn launch(&mut self, plan: &LaunchPlan, ctx: LaunchContext) -> Result<(), LaunchError>;
    /// Stop the current launch, keeping the ROS master (mode switch).
    async fn stop_launch(&mut self);
    /// Stop the launch and the ROS master.
    async fn shutdown(&mut self);
    /// Stop everything and come back fresh: a new ROS master (ROS 1), zeroed joints (sim).
    async fn reset(&mut self) -> Result<(), LaunchError>;
}
