//! What goes wrong talking to the engine, in the domain's words: bollard's
//! errors are sorted into [`EngineError`] here (and counted), so no caller
//! sees them.

use bollard::errors::Error as BollardError;

/// What went wrong talking to the engine.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    /// No engine is connected, or it did not answer.
    #[error("the container engine is not available: {0}")]
    Unavailable(String),
    /// The object does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The object is in a state that refuses the call (e.g. not running).
    #[error("{0}")]
    Conflict(String),
    /// The engine cannot limit a volume's size on this host (its volume
    /// root has no project quotas).
    #[error("{0}")]
    VolumeSizeUnsupported(String),
    /// Anything else the engine refused.
    #[error("the container engine failed: {0}")]
    Failed(String),
}

impl From<BollardError> for EngineError {
    fn from(e: BollardError) -> Self {
        let err = Self::classify(e);
        crate::telemetry::engine_error(match &err {
            EngineError::Unavailable(_) => "unavailable",
            EngineError::NotFound(_) => "not_found",
            EngineError::Conflict(_) => "conflict",
            EngineError::VolumeSizeUnsupported(_) => "unsupported",
            EngineError::Failed(_) => "failed",
        });
        err
    }
}

impl EngineError {
    fn classify(e: BollardError) -> Self {
        match e {
            BollardError::DockerResponseServerError {
                status_code,
                message,
            } => match status_code {
                404 => EngineError::NotFound(message),
                409 => EngineError::Conflict(message),
                _ => EngineError::Failed(format!("{status_code}: {message}")),
            },
            BollardError::RequestTimeoutError
            | BollardError::IOError { .. }
            | BollardError::HyperResponseError { .. }
            | BollardError::HyperLegacyError { .. }
            | BollardError::SocketNotFoundError(_) => EngineError::Unavailable(e.to_string()),
            other => EngineError::Failed(other.to_string()),
        }
    }
}

/// Result of engine calls.
pub type EngineResult<T> = Result<T, EngineError>;
