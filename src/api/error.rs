//! `ApiError`: the one error type at the HTTP edge, and the one place where
//! HTTP statuses are chosen. Clients get a sentence and a stable `code`;
//! internal details are logged, not sent.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::command::CommandError;
use crate::files::FileError;
use crate::ports::PortError;
use crate::sandbox::SandboxError;

/// An error answer: `{"error": message, "code": code}` with `status`.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(json!({ "error": self.message, "code": self.code }));
        (self.status, body).into_response()
    }
}

impl From<SandboxError> for ApiError {
    fn from(e: SandboxError) -> Self {
        let message = e.to_string();
        match e {
            SandboxError::Invalid(_) => ApiError::bad_request(message),
            SandboxError::NotFound(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "sandbox_not_found", message)
            }
            SandboxError::AtCapacity { .. } => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "at_capacity", message)
            }
            SandboxError::ImageMissing { .. } => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "image_missing", message)
            }
            SandboxError::WorkspaceQuotaUnsupported(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "workspace_quota_unsupported",
                message,
            ),
            SandboxError::EngineUnavailable(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "engine_unavailable",
                message,
            ),
            SandboxError::Engine(inner) => {
                tracing::error!(error = %inner, "engine call failed");
                ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "engine_error",
                    "the container engine refused the operation; sandboxd's log has the details",
                )
            }
        }
    }
}

impl From<CommandError> for ApiError {
    fn from(e: CommandError) -> Self {
        let message = e.to_string();
        match e {
            CommandError::Invalid(_) => ApiError::bad_request(message),
            CommandError::Sandbox(inner) => inner.into(),
            CommandError::NotFound(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "command_not_found", message)
            }
            CommandError::Lost(_) => ApiError::new(StatusCode::GONE, "command_lost", message),
            CommandError::TooMany { .. } => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "too_many_commands", message)
            }
            CommandError::ShuttingDown => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", message)
            }
        }
    }
}

impl From<FileError> for ApiError {
    fn from(e: FileError) -> Self {
        let message = e.to_string();
        let (status, code) = match e {
            FileError::Sandbox(inner) => return inner.into(),
            FileError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            FileError::Escape(_) => (StatusCode::BAD_REQUEST, "symlink_escape"),
            FileError::NotFound(_) => (StatusCode::NOT_FOUND, "file_not_found"),
            FileError::IsDirectory(_) => (StatusCode::BAD_REQUEST, "is_a_directory"),
            FileError::NotDirectory(_) => (StatusCode::BAD_REQUEST, "not_a_directory"),
            FileError::NeedsRecursive(_) => (StatusCode::CONFLICT, "needs_recursive"),
            FileError::NotRegular(_) => (StatusCode::BAD_REQUEST, "not_a_regular_file"),
            FileError::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "file_too_large"),
            FileError::Changed(_) => (StatusCode::CONFLICT, "path_changed"),
            FileError::NoSpace(_) => (StatusCode::INSUFFICIENT_STORAGE, "insufficient_storage"),
            FileError::PermissionDenied(_) => (StatusCode::FORBIDDEN, "permission_denied"),
            FileError::Helper(ref m) => {
                tracing::error!(error = %m, "file helper failed");
                (StatusCode::BAD_GATEWAY, "file_helper_failed")
            }
        };
        ApiError::new(status, code, message)
    }
}

impl From<PortError> for ApiError {
    fn from(e: PortError) -> Self {
        let message = e.to_string();
        match e {
            PortError::Sandbox(inner) => inner.into(),
            PortError::Invalid(_) => ApiError::bad_request(message),
            PortError::NoNetwork => ApiError::new(StatusCode::CONFLICT, "no_network", message),
            PortError::Failed(_) => {
                tracing::error!(error = %message, "publishing a port failed");
                ApiError::new(StatusCode::BAD_GATEWAY, "port_publish_failed", message)
            }
        }
    }
}
