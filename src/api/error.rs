//! `ApiError`: the one error type at the HTTP edge, the body it answers
//! with, and the one place where HTTP statuses are chosen. Clients get a
//! sentence and a stable [`ErrorCode`]; internal details are logged, not
//! sent.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::app::TurnError;
use crate::checkpoints::CheckpointError;
use crate::command::CommandError;
use crate::files::{FileError, Mismatch};
use crate::origin_policy::Refusal;
use crate::ports::PortError;
use crate::pty::PtyError;
use crate::sandbox::SandboxError;
use crate::session_tokens::TokenError;

macro_rules! error_codes {
    ($($variant:ident = $code:literal, $status:ident;)*) => {
        /// Every stable `code` the API answers with, and its status. The
        /// table in docs/API.md lists exactly these (a test checks).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
        pub enum ErrorCode { $(#[serde(rename = $code)] $variant,)* }

        impl ErrorCode {
            /// Every code, in the order docs/API.md lists them.
            pub const ALL: &[ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The `code` field.
            pub fn as_str(self) -> &'static str {
                match self { $(ErrorCode::$variant => $code,)* }
            }

            /// The HTTP status it is answered with.
            pub fn status(self) -> StatusCode {
                match self { $(ErrorCode::$variant => StatusCode::$status,)* }
            }
        }
    };
}

error_codes! {
    InvalidRequest = "invalid_request", BAD_REQUEST;
    SymlinkEscape = "symlink_escape", BAD_REQUEST;
    IsADirectory = "is_a_directory", BAD_REQUEST;
    NotADirectory = "not_a_directory", BAD_REQUEST;
    NotARegularFile = "not_a_regular_file", BAD_REQUEST;
    Unauthorized = "unauthorized", UNAUTHORIZED;
    PermissionDenied = "permission_denied", FORBIDDEN;
    OriginNotAllowed = "origin_not_allowed", FORBIDDEN;
    NotFound = "not_found", NOT_FOUND;
    SandboxNotFound = "sandbox_not_found", NOT_FOUND;
    CommandNotFound = "command_not_found", NOT_FOUND;
    PtyNotFound = "pty_not_found", NOT_FOUND;
    FileNotFound = "file_not_found", NOT_FOUND;
    TokenNotFound = "token_not_found", NOT_FOUND;
    CheckpointNotFound = "checkpoint_not_found", NOT_FOUND;
    MethodNotAllowed = "method_not_allowed", METHOD_NOT_ALLOWED;
    HostNotAllowed = "host_not_allowed", MISDIRECTED_REQUEST;
    NeedsRecursive = "needs_recursive", CONFLICT;
    PathChanged = "path_changed", CONFLICT;
    PreconditionFailed = "precondition_failed", CONFLICT;
    FileExists = "file_exists", CONFLICT;
    NoNetwork = "no_network", CONFLICT;
    SandboxPaused = "sandbox_paused", CONFLICT;
    SandboxNotPaused = "sandbox_not_paused", CONFLICT;
    CommandFinished = "command_finished", CONFLICT;
    StdinClosed = "stdin_closed", CONFLICT;
    StdinNotRead = "stdin_not_read", CONFLICT;
    CheckpointLabelTaken = "checkpoint_label_taken", CONFLICT;
    WorkspaceChanging = "workspace_changing", CONFLICT;
    WorkspaceUnsupported = "workspace_unsupported", CONFLICT;
    CommandsRunning = "commands_running", CONFLICT;
    BodyTooLarge = "body_too_large", PAYLOAD_TOO_LARGE;
    FileTooLarge = "file_too_large", PAYLOAD_TOO_LARGE;
    UnsupportedMediaType = "unsupported_media_type", UNSUPPORTED_MEDIA_TYPE;
    AtCapacity = "at_capacity", TOO_MANY_REQUESTS;
    TooManyCommands = "too_many_commands", TOO_MANY_REQUESTS;
    TooManyProcesses = "too_many_processes", TOO_MANY_REQUESTS;
    TooManyPtys = "too_many_ptys", TOO_MANY_REQUESTS;
    TooManyTokens = "too_many_tokens", TOO_MANY_REQUESTS;
    TooManyWatches = "too_many_watches", TOO_MANY_REQUESTS;
    TooManyCheckpoints = "too_many_checkpoints", TOO_MANY_REQUESTS;
    EngineError = "engine_error", BAD_GATEWAY;
    AgentFailed = "agent_failed", BAD_GATEWAY;
    PortPublishFailed = "port_publish_failed", BAD_GATEWAY;
    EngineUnavailable = "engine_unavailable", SERVICE_UNAVAILABLE;
    RandomUnavailable = "random_unavailable", SERVICE_UNAVAILABLE;
    ImageMissing = "image_missing", SERVICE_UNAVAILABLE;
    WorkspaceQuotaUnsupported = "workspace_quota_unsupported", SERVICE_UNAVAILABLE;
    ShuttingDown = "shutting_down", SERVICE_UNAVAILABLE;
    StateWriteFailed = "state_write_failed", SERVICE_UNAVAILABLE;
    InsufficientStorage = "insufficient_storage", INSUFFICIENT_STORAGE;
    CheckpointStoreFull = "checkpoint_store_full", INSUFFICIENT_STORAGE;
}

/// A file of a refused write (`precondition_failed`).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailedFile {
    /// As the request gave it.
    path: String,
    /// Lowercase hex SHA-256 of the file now; `null`: no file is there.
    current_sha256: Option<String>,
}

impl From<Mismatch> for FailedFile {
    fn from(m: Mismatch) -> Self {
        FailedFile {
            path: m.path,
            current_sha256: m.current_sha256,
        }
    }
}

/// Every error answer: a sentence and a stable code.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ErrorBody<'a> {
    /// A human sentence; not stable.
    pub(super) error: &'a str,
    pub(super) code: ErrorCode,
    /// `precondition_failed` only: each file whose `ifMatch` or
    /// `ifNoneMatch` did not hold, with its hash now.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub(super) failed: Option<&'a [FailedFile]>,
}

/// An error answer: `{"error": message, "code": code}` with the code's status.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    /// `precondition_failed`: the files whose precondition did not hold.
    pub failed: Option<Vec<FailedFile>>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            failed: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::MethodNotAllowed, message)
    }

    pub fn status(&self) -> StatusCode {
        self.code.status()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: &self.message,
            code: self.code,
            failed: self.failed.as_deref(),
        };
        (self.code.status(), Json(body)).into_response()
    }
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> Self {
        let code = match r {
            Refusal::NoHost | Refusal::Host(_) => ErrorCode::HostNotAllowed,
            Refusal::Origin(_) => ErrorCode::OriginNotAllowed,
        };
        ApiError::new(code, r.to_string())
    }
}

impl From<SandboxError> for ApiError {
    fn from(e: SandboxError) -> Self {
        let message = e.to_string();
        let code = match e {
            SandboxError::Invalid(_) => ErrorCode::InvalidRequest,
            SandboxError::NotFound(_) => ErrorCode::SandboxNotFound,
            SandboxError::AtCapacity { .. } | SandboxError::NoLinkBlock { .. } => {
                ErrorCode::AtCapacity
            }
            SandboxError::ImageMissing { .. } => ErrorCode::ImageMissing,
            SandboxError::WorkspaceQuotaUnsupported(_) => ErrorCode::WorkspaceQuotaUnsupported,
            SandboxError::EngineUnavailable(_) => ErrorCode::EngineUnavailable,
            SandboxError::Random(_) => ErrorCode::RandomUnavailable,
            SandboxError::Paused(_) => ErrorCode::SandboxPaused,
            SandboxError::NotPaused(_) => ErrorCode::SandboxNotPaused,
            SandboxError::StateWrite(why) => {
                tracing::error!(error = %why, "saving a sandbox's lifetime failed");
                return ApiError::new(
                    ErrorCode::StateWriteFailed,
                    "the sandbox's lifetime could not be saved in state_dir; nothing changed; \
                     sandboxd's log has the details",
                );
            }
            SandboxError::Agent(inner) => {
                tracing::warn!(error = %inner, "the sandbox's agent failed");
                ErrorCode::AgentFailed
            }
            SandboxError::Engine(inner) => {
                tracing::error!(error = %inner, "engine call failed");
                return ApiError::new(
                    ErrorCode::EngineError,
                    "the container engine refused the operation; sandboxd's log has the details",
                );
            }
        };
        ApiError::new(code, message)
    }
}

impl From<CommandError> for ApiError {
    fn from(e: CommandError) -> Self {
        let message = e.to_string();
        let code = match e {
            CommandError::Invalid(_) => ErrorCode::InvalidRequest,
            CommandError::Sandbox(inner) => return inner.into(),
            CommandError::NotFound(_) => ErrorCode::CommandNotFound,
            CommandError::NoProcesses(_) => ErrorCode::TooManyProcesses,
            CommandError::TooMany { .. } => ErrorCode::TooManyCommands,
            CommandError::ShuttingDown => ErrorCode::ShuttingDown,
            CommandError::Finished(_) => ErrorCode::CommandFinished,
            CommandError::StdinClosed(_) => ErrorCode::StdinClosed,
            CommandError::StdinNotRead(_) => ErrorCode::StdinNotRead,
        };
        ApiError::new(code, message)
    }
}

impl From<PtyError> for ApiError {
    fn from(e: PtyError) -> Self {
        let message = e.to_string();
        let code = match e {
            PtyError::Invalid(_) => ErrorCode::InvalidRequest,
            PtyError::Sandbox(inner) => return inner.into(),
            PtyError::NotFound(_) => ErrorCode::PtyNotFound,
            PtyError::TooMany { .. } | PtyError::TooManyTickets => ErrorCode::TooManyPtys,
            PtyError::NoProcesses(_) => ErrorCode::TooManyProcesses,
        };
        ApiError::new(code, message)
    }
}

impl From<FileError> for ApiError {
    fn from(e: FileError) -> Self {
        let message = e.to_string();
        let code = match e {
            FileError::Sandbox(inner) => return inner.into(),
            FileError::PreconditionFailed(failed) => {
                let mut err = ApiError::new(ErrorCode::PreconditionFailed, message);
                err.failed = Some(failed.into_iter().map(Into::into).collect());
                return err;
            }
            FileError::Invalid(_) => ErrorCode::InvalidRequest,
            FileError::Escape(_) => ErrorCode::SymlinkEscape,
            FileError::NotFound(_) => ErrorCode::FileNotFound,
            FileError::IsDirectory(_) => ErrorCode::IsADirectory,
            FileError::NotDirectory(_) => ErrorCode::NotADirectory,
            FileError::NeedsRecursive(_) => ErrorCode::NeedsRecursive,
            FileError::Exists(_) => ErrorCode::FileExists,
            FileError::NotRegular(_) => ErrorCode::NotARegularFile,
            FileError::TooLarge(_) => ErrorCode::FileTooLarge,
            FileError::Changed(_) => ErrorCode::PathChanged,
            FileError::NoSpace(_) => ErrorCode::InsufficientStorage,
            FileError::PermissionDenied(_) => ErrorCode::PermissionDenied,
            FileError::TooManyWatches(_) => ErrorCode::TooManyWatches,
        };
        ApiError::new(code, message)
    }
}

impl From<PortError> for ApiError {
    fn from(e: PortError) -> Self {
        let message = e.to_string();
        let code = match e {
            PortError::Sandbox(inner) => return inner.into(),
            PortError::NoNetwork => ErrorCode::NoNetwork,
            PortError::Failed(_) => {
                tracing::error!(error = %message, "publishing a port failed");
                ErrorCode::PortPublishFailed
            }
        };
        ApiError::new(code, message)
    }
}

impl From<CheckpointError> for ApiError {
    fn from(e: CheckpointError) -> Self {
        let message = e.to_string();
        let code = match e {
            CheckpointError::Sandbox(inner) => return inner.into(),
            CheckpointError::Invalid(_) => ErrorCode::InvalidRequest,
            CheckpointError::NotFound(_) => ErrorCode::CheckpointNotFound,
            CheckpointError::LabelTaken(_) => ErrorCode::CheckpointLabelTaken,
            CheckpointError::TooMany { .. } => ErrorCode::TooManyCheckpoints,
            CheckpointError::StoreFull(_) => ErrorCode::CheckpointStoreFull,
            CheckpointError::WorkspaceChanging(_) => ErrorCode::WorkspaceChanging,
            CheckpointError::Unsupported(_) => ErrorCode::WorkspaceUnsupported,
            CheckpointError::Unreadable(_) => ErrorCode::PermissionDenied,
            CheckpointError::CommandsRunning(_) => ErrorCode::CommandsRunning,
            CheckpointError::Store(_) => {
                tracing::error!(error = %message, "the checkpoint store failed");
                return ApiError::new(
                    ErrorCode::StateWriteFailed,
                    "the checkpoint store in state_dir failed; nothing was stored; \
                     sandboxd's log has the details",
                );
            }
        };
        ApiError::new(code, message)
    }
}

impl From<TurnError> for ApiError {
    fn from(e: TurnError) -> Self {
        match e {
            TurnError::Checkpoint(inner) => inner.into(),
            TurnError::Command(inner) => inner.into(),
        }
    }
}

impl From<TokenError> for ApiError {
    fn from(e: TokenError) -> Self {
        let message = e.to_string();
        let code = match e {
            TokenError::Invalid(_) => ErrorCode::InvalidRequest,
            TokenError::NotFound(_) => ErrorCode::TokenNotFound,
            TokenError::TooMany | TokenError::TooManyForSession => ErrorCode::TooManyTokens,
            TokenError::Random(_) => ErrorCode::RandomUnavailable,
            TokenError::Save(_) | TokenError::Load(_) => {
                tracing::error!(error = %message, "saving the session tokens failed");
                return ApiError::new(
                    ErrorCode::StateWriteFailed,
                    "the session tokens could not be saved in state_dir; nothing changed; \
                     sandboxd's log has the details",
                );
            }
        };
        ApiError::new(code, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `code` field is what `as_str` says.
    #[test]
    fn codes_serialise_as_their_strings() {
        ErrorCode::ALL.iter().for_each(|c| {
            assert_eq!(
                serde_json::to_value(c).ok(),
                Some(serde_json::Value::from(c.as_str()))
            );
        });
    }

    /// docs/API.md's error table lists every code with its status, and
    /// only codes the API can answer with.
    #[test]
    fn the_docs_table_lists_exactly_these_codes() {
        let docs = include_str!("../../docs/API.md");
        let table: Vec<(u16, String)> = docs
            .lines()
            .filter_map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let status = cells.get(1)?.parse::<u16>().ok()?;
                let code = cells.get(2)?.strip_prefix('`')?.strip_suffix('`')?;
                Some((status, code.to_string()))
            })
            .collect();
        let ours: Vec<(u16, String)> = ErrorCode::ALL
            .iter()
            .map(|c| (c.status().as_u16(), c.as_str().to_string()))
            .collect();
        assert_eq!(
            table, ours,
            "docs/API.md's error table and ErrorCode differ"
        );
    }
}
