//! Errors of camera operations, each mapped to the gRPC status a client sees.

/// Why a camera operation was refused or failed. The text is what the client reads.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CameraError {
    /// Unknown camera (`NotFound`).
    #[error("{0}")]
    NotFound(String),
    /// A malformed request: bad size, fps, encoding or timeout (`InvalidArgument`).
    #[error("{0}")]
    InvalidArgument(String),
    /// The camera is not in a state that allows the operation, e.g. not open
    /// (`FailedPrecondition`).
    #[error("{0}")]
    FailedPrecondition(String),
    /// No frame to give: none arrived yet, the capture failed, or a tool it needs (ffmpeg)
    /// is missing (`Unavailable`).
    #[error("{0}")]
    Unavailable(String),
    /// Encoding a frame failed, or a capture task died (`Internal`).
    #[error("{0}")]
    Internal(String),
    /// The caller does not hold the camera (`PermissionDenied`, [`crate::access`]).
    #[error("{0}")]
    PermissionDenied(String),
}

impl CameraError {
    pub fn message(&self) -> &str {
        match self {
            CameraError::NotFound(m)
            | CameraError::InvalidArgument(m)
            | CameraError::FailedPrecondition(m)
            | CameraError::Unavailable(m)
            | CameraError::Internal(m)
            | CameraError::PermissionDenied(m) => m,
        }
    }

    pub fn code(&self) -> tonic::Code {
        match self {
            CameraError::NotFound(_) => tonic::Code::NotFound,
            CameraError::InvalidArgument(_) => tonic::Code::InvalidArgument,
            CameraError::FailedPrecondition(_) => tonic::Code::FailedPrecondition,
            CameraError::Unavailable(_) => tonic::Code::Unavailable,
            CameraError::Internal(_) => tonic::Code::Internal,
            CameraError::PermissionDenied(_) => tonic::Code::PermissionDenied,
        }
    }
}

impl From<CameraError> for tonic::Status {
    fn from(error: CameraError) -> Self {
        tonic::Status::new(error.code(), error.message())
    }
}
