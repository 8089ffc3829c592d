//! Errors of robot operations, each mapped to the gRPC status a client sees.

/// Why a robot operation was refused or failed. The text is what the client reads.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RobotError {
    /// Unknown robot, package or launch file (`NotFound`).
    #[error("{0}")]
    NotFound(String),
    /// A malformed request: unknown mode, bad arguments (`InvalidArgument`).
    #[error("{0}")]
    InvalidArgument(String),
    /// A custom launch from a package that is not allowed (`PermissionDenied`).
    #[error("{0}")]
    PermissionDenied(String),
    /// The robot is not in a state that allows the operation (`FailedPrecondition`).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The launch (or reset) failed; the robot is in ERROR (`Internal`).
    #[error("{0}")]
    LaunchFailed(String),
}

impl RobotError {
    pub fn message(&self) -> &str {
        match self {
            RobotError::NotFound(m)
            | RobotError::InvalidArgument(m)
            | RobotError::PermissionDenied(m)
            | RobotError::FailedPrecondition(m)
            | RobotError::LaunchFailed(m) => m,
        }
    }

    pub fn code(&self) -> tonic::Code {
        match self {
            RobotError::NotFound(_) => tonic::Code::NotFound,
            RobotError::InvalidArgument(_) => tonic::Code::InvalidArgument,
            RobotError::PermissionDenied(_) => tonic::Code::PermissionDenied,
            RobotError::FailedPrecondition(_) => tonic::Code::FailedPrecondition,
            RobotError::LaunchFailed(_) => tonic::Code::Internal,
        }
    }
}

impl From<RobotError> for tonic::Status {
    fn from(error: RobotError) -> Self {
        tonic::Status::new(error.code(), error.message())
    }
}
