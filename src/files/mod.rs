//! Files in the workspace: read, write, list, delete. Every request is first
//! checked lexically ([`path::WorkspacePath`]); then the work runs inside the
//! sandbox as the sandbox user, through a small helper (`helper.py`) that
//! walks each path with no-follow opens relative to directory fds. One
//! helper process per sandbox is kept running and serves framed requests
//! over its stdin and stdout, so an operation costs one round trip, not a
//! process start; it is started again if it dies. So the
//! kernel enforces the read-only root and the user's rights, and no symlink
//! (in any component, or swapped in mid-operation) carries an operation out
//! of the workspace. The engine's archive API is not used: it writes as root
//! and follows symlinks in intermediate components.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use dashmap::DashMap;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use crate::config::Config;
use crate::engine::{EngineError, ExecOutput, ExecRequest, OutputStream};
use crate::field_error::FieldError;
use crate::sandbox::{Sandbox, SandboxError, Sandboxes};
use crate::workspace_path::WorkspacePath;

const HELPER: &str = include_str!("helper.py");
/// The helper travels in this variable, so `ps` in the sandbox stays short.
const HELPER_VAR: &str = "SANDBOXD_FILE_HELPER";
/// Longest a single file operation may take before the helper is presumed
/// stuck and replaced.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// What can go wrong with a file operation.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The request itself is invalid (path form, mode, duplicates).
    #[error(transparent)]
    Invalid(#[from] FieldError),
    /// A symlink would lead outside the workspace.
    #[error("{0}")]
    Escape(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    IsDirectory(String),
    #[error("{0}")]
    NotDirectory(String),
    /// Deleting a directory needs `recursive: true`.
    #[error("{0}")]
    NeedsRecursive(String),
    #[error("{0}")]
    NotRegular(String),
    #[error("{0}")]
    TooLarge(String),
    /// The path changed under us (a directory swapped for a symlink).
    #[error("{0}")]
    Changed(String),
    #[error("{0}")]
    NoSpace(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// The helper failed in a way it could not explain.
    #[error("the file helper failed: {0}")]
    Helper(String),
}

impl From<EngineError> for FileError {
    fn from(e: EngineError) -> Self {
        FileError::Sandbox(e.into())
    }
}

/// Result of file operations.
pub type FileResult<T> = Result<T, FileError>;

/// One file of a write request: where, what, and its permission bits
/// (`None`: 0o644).
#[derive(Debug, Clone)]
pub struct FileToWrite {
    pub path: String,
    pub content: Vec<u8>,
    pub mode: Option<i64>,
}

/// What a directory entry is; symlinks are not followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    /// FIFO, socket, device.
    Other,
}

/// A directory entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: EntryKind,
    pub size: u64,
    pub mtime_ms: i64,
    pub mode: u32,
}

#[derive(Deserialize)]
struct Status {
    ok: bool,
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    size: usize,
}

/// A running helper: its stdin, and its output with what was read ahead.
struct HelperSession {
    stdin: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    output: ExecOutput,
    buf: BytesMut,
}

impl HelperSession {
    /// One request, one answer. An Err means the session is unusable.
    async fn call(
        &mut self,
        header: &serde_json::Value,
        payload: &[u8],
    ) -> Result<(Status, Vec<u8>), String> {
        let mut header = header.clone();
        header["size"] = serde_json::json!(payload.len());
        let mut line = serde_json::to_vec(&header).map_err(|e| e.to_string())?;
        line.push(b'\n');
        self.stdin
            .write_all(&line)
            .await
            .map_err(|e| e.to_string())?;
        if !payload.is_empty() {
            self.stdin
                .write_all(payload)
                .await
                .map_err(|e| e.to_string())?;
        }
        self.stdin.flush().await.map_err(|e| e.to_string())?;
        let status_line = loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line = self.buf.split_to(i + 1);
                break line;
            }
            self.fill().await?;
        };
        let status: Status =
            serde_json::from_slice(&status_line).map_err(|e| format!("bad status line: {e}"))?;
        while self.buf.len() < status.size {
            self.fill().await?;
        }
        let body = self.buf.split_to(status.size).to_vec();
        Ok((status, body))
    }

    async fn fill(&mut self) -> Result<(), String> {
        loop {
            match self.output.next().await {
                Some(Ok((OutputStream::Stdout, b))) => {
                    self.buf.extend_from_slice(&b);
                    return Ok(());
                }
                Some(Ok((OutputStream::Stderr, b))) => {
                    tracing::debug!(stderr = %String::from_utf8_lossy(&b), "file helper");
                }
                Some(Err(e)) => return Err(e.to_string()),
                None => return Err("the file helper exited".into()),
            }
        }
    }
}

type SessionSlot = Arc<tokio::sync::Mutex<Option<HelperSession>>>;

#[derive(Deserialize)]
struct Listing {
    entries: Vec<Entry>,
}

#[derive(Serialize)]
struct WriteHeaderFile<'a> {
    path: &'a str,
    mode: u32,
    size: usize,
}

/// See the module docs.
pub struct Files {
    config: Arc<Config>,
    sandboxes: Arc<Sandboxes>,
    /// One helper per sandbox; its mutex makes a sandbox's file operations
    /// take turns on it.
    sessions: DashMap<String, SessionSlot>,
}

impl std::fmt::Debug for Files {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Files")
            .field("sessions", &self.sessions.len())
            .finish()
    }
}

impl Files {
    pub fn new(config: Arc<Config>, sandboxes: Arc<Sandboxes>) -> Self {
        Files {
            config,
            sandboxes,
            sessions: DashMap::new(),
        }
    }

    fn parse(&self, p: &str) -> FileResult<WorkspacePath> {
        let dirs: Vec<&str> = self.config.workspace_dirs().collect();
        WorkspacePath::parse(p, &dirs)
            .map_err(|e| FieldError::new("path", format!("{p:?}: {e}")).into())
    }

    /// The content of a file, or `None` when there is no such file.
    pub async fn read(&self, sandbox_id: &str, p: &str) -> FileResult<Option<Vec<u8>>> {
        let path = self.parse(p)?;
        if path.is_root() {
            return Err(FileError::IsDirectory(format!(
                "{p} is the workspace directory"
            )));
        }
        let sandbox = self.sandboxes.lookup(sandbox_id).await?;
        let header = serde_json::json!({
            "op": "read",
            "path": path.relative(),
            "max": self.config.max_file_bytes,
        });
        match self.helper(&sandbox, header, &[]).await {
            Ok(content) => Ok(Some(content)),
            Err(FileError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes every file or none. Everything is validated (paths, base64,
    /// modes) before anything is sent to the sandbox.
    pub async fn write(&self, sandbox_id: &str, files: Vec<FileToWrite>) -> FileResult<()> {
        if files.is_empty() {
            return Err(FieldError::new("files", "at least one file is required").into());
        }
        let mut seen = HashSet::new();
        let mut decoded = Vec::with_capacity(files.len());
        for (i, f) in files.iter().enumerate() {
            let path = self.parse(&f.path)?;
            if path.is_root() {
                return Err(FieldError::new(
                    format!("files[{i}].path"),
                    "the workspace directory itself is not a file",
                )
                .into());
            }
            if !seen.insert(path.relative()) {
                return Err(FieldError::new(
                    format!("files[{i}].path"),
                    format!("{} appears twice", f.path),
                )
                .into());
            }
            let mode = match f.mode {
                None => 0o644,
                Some(m) => u32::try_from(m)
                    .ok()
                    .filter(|m| *m <= 0o777)
                    .ok_or_else(|| {
                        FieldError::new(
                            format!("files[{i}].mode"),
                            format!("must be 0 to 511 (0o777), got {m}"),
                        )
                    })?,
            };
            decoded.push((path.relative(), mode, &f.content));
        }
        let total: usize = decoded.iter().map(|(_, _, c)| c.len()).sum();
        let files: Vec<WriteHeaderFile> = decoded
            .iter()
            .map(|(p, mode, c)| WriteHeaderFile {
                path: p,
                mode: *mode,
                size: c.len(),
            })
            .collect();
        let header = serde_json::json!({"op": "write", "files": files});
        let mut payload = Vec::with_capacity(total);
        for (_, _, c) in &decoded {
            payload.extend_from_slice(c);
        }
        let sandbox = self.sandboxes.lookup(sandbox_id).await?;
        self.helper(&sandbox, header, &payload).await?;
        Ok(())
    }

    /// The entries of a directory, sorted by name; symlinks are not followed.
    pub async fn list(&self, sandbox_id: &str, p: &str) -> FileResult<Vec<Entry>> {
        let path = self.parse(p)?;
        let sandbox = self.sandboxes.lookup(sandbox_id).await?;
        let header = serde_json::json!({"op": "list", "path": path.relative()});
        let out = self.helper(&sandbox, header, &[]).await?;
        let listing: Listing = serde_json::from_slice(&out)
            .map_err(|e| FileError::Helper(format!("unreadable listing: {e}")))?;
        Ok(listing.entries)
    }

    /// Deletes paths; a missing one is fine, a directory needs `recursive`.
    pub async fn delete(
        &self,
        sandbox_id: &str,
        paths: Vec<String>,
        recursive: bool,
    ) -> FileResult<()> {
        if paths.is_empty() {
            return Err(FieldError::new("paths", "at least one path is required").into());
        }
        let mut rel = Vec::with_capacity(paths.len());
        for (i, p) in paths.iter().enumerate() {
            let path = self.parse(p)?;
            if path.is_root() {
                return Err(FieldError::new(
                    format!("paths[{i}]"),
                    "the workspace directory itself cannot be deleted",
                )
                .into());
            }
            rel.push(path.relative());
        }
        let header = serde_json::json!({"op": "delete", "paths": rel, "recursive": recursive});
        let sandbox = self.sandboxes.lookup(sandbox_id).await?;
        self.helper(&sandbox, header, &[]).await?;
        Ok(())
    }

    /// Starts the sandbox's helper process.
    async fn start_session(&self, sandbox: &Arc<Sandbox>) -> FileResult<HelperSession> {
        let req = ExecRequest {
            argv: vec![
                "python3".to_string(),
                "-I".to_string(),
                "-S".to_string(),
                "-c".to_string(),
                format!("import os; exec(os.environ[\"{HELPER_VAR}\"])"),
            ]
            .into_iter()
            .chain(self.config.workspace_dirs().map(str::to_string))
            .collect(),
            env: vec![format!("{HELPER_VAR}={HELPER}")],
            working_dir: "/".into(),
        };
        let session = self.sandboxes.exec(sandbox, &req).await?;
        // Helpers of sandboxes that are gone are not needed any more.
        let registry = self.sandboxes.registry();
        self.sessions.retain(|id, _| registry.get(id).is_some());
        Ok(HelperSession {
            stdin: session.stdin,
            output: session.output,
            buf: BytesMut::new(),
        })
    }

    /// Sends one request to the sandbox's helper (starting it if needed, and
    /// once more if it had died) and returns the answer's body.
    async fn helper(
        &self,
        sandbox: &Arc<Sandbox>,
        header: serde_json::Value,
        payload: &[u8],
    ) -> FileResult<Vec<u8>> {
        let _busy = sandbox.open_request();
        let slot = self.sessions.entry(sandbox.id.clone()).or_default().clone();
        let mut guard = slot.lock().await;
        let mut last_error = String::new();
        let mut answer = None;
        for _attempt in 0..2 {
            let session = match guard.as_mut() {
                Some(s) => s,
                None => guard.insert(self.start_session(sandbox).await?),
            };
            match tokio::time::timeout(CALL_TIMEOUT, session.call(&header, payload)).await {
                Ok(Ok(a)) => {
                    answer = Some(a);
                    break;
                }
                Ok(Err(e)) => last_error = e,
                Err(_) => last_error = "the file helper did not answer in time".into(),
            }
            *guard = None;
        }
        drop(guard);
        let Some((status, body)) = answer else {
            // Stopped while we were at it (the engine then answers an exec
            // with its own error text): the sandbox is gone, nothing broke.
            return Err(self.sandboxes.gone_or(
                sandbox,
                FileError::Helper(format!("{last_error} (is python3 in the sandbox image?)")),
            ));
        };
        if status.ok {
            return Ok(body);
        }
        let m = status.message;
        Err(match status.code.as_str() {
            "not_found" => FileError::NotFound(m),
            "symlink_escape" | "symlink_loop" => FileError::Escape(m),
            "is_directory" => FileError::IsDirectory(m),
            "not_a_directory" => FileError::NotDirectory(m),
            "needs_recursive" => FileError::NeedsRecursive(m),
            "not_regular" => FileError::NotRegular(m),
            "too_large" => FileError::TooLarge(m),
            "changed" => FileError::Changed(m),
            "no_space" => FileError::NoSpace(m),
            "permission_denied" => FileError::PermissionDenied(m),
            "invalid" => FieldError::new("path", m).into(),
            _ => FileError::Helper(m),
        })
    }
}
