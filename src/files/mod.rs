//! Files in the workspace: read, write, list, delete. Every request is first
//! checked lexically ([`path::WorkspacePath`]); then the work runs inside the
//! sandbox as the sandbox user, through a small helper (`helper.py`) that
//! walks each path with no-follow opens relative to directory fds. So the
//! kernel enforces the read-only root and the user's rights, and no symlink
//! (in any component, or swapped in mid-operation) carries an operation out
//! of the workspace. The engine's archive API is not used: it writes as root
//! and follows symlinks in intermediate components.

pub mod path;

use std::collections::HashSet;
use std::sync::Arc;

use base64::Engine as _;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use crate::config::Config;
use crate::engine::{Engine, EngineError, ExecRequest, OutputStream};
use crate::sandbox::{Sandbox, SandboxError, Sandboxes};
use path::WorkspacePath;

const HELPER: &str = include_str!("helper.py");

/// What can go wrong with a file operation.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The request itself is invalid (path form, base64, mode, duplicates).
    #[error("{0}")]
    Invalid(String),
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

/// One file of a write request, as the client sends it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WriteFile {
    pub path: String,
    pub content_base64: String,
    #[serde(default)]
    pub mode: Option<i64>,
}

/// A directory entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
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
}

#[derive(Deserialize)]
struct Listing {
    entries: Vec<Entry>,
}

#[derive(Serialize)]
struct WriteHeader<'a> {
    files: Vec<WriteHeaderFile<'a>>,
}

#[derive(Serialize)]
struct WriteHeaderFile<'a> {
    path: &'a str,
    mode: u32,
    size: usize,
}

/// See the module docs.
#[derive(Debug)]
pub struct Files {
    config: Arc<Config>,
    engine: Engine,
    sandboxes: Arc<Sandboxes>,
}

impl Files {
    pub fn new(config: Arc<Config>, engine: Engine, sandboxes: Arc<Sandboxes>) -> Self {
        Files {
            config,
            engine,
            sandboxes,
        }
    }

    fn parse(&self, p: &str) -> FileResult<WorkspacePath> {
        WorkspacePath::parse(p, &self.config.workspace_dir)
            .map_err(|e| FileError::Invalid(format!("path {p:?}: {e}")))
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
        let args = vec![
            "read".into(),
            self.config.max_file_bytes.to_string(),
            path.relative(),
        ];
        match self.helper(&sandbox, args, Vec::new()).await {
            Ok(content) => Ok(Some(content)),
            Err(FileError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes every file or none. Everything is validated (paths, base64,
    /// modes) before anything is sent to the sandbox.
    pub async fn write(&self, sandbox_id: &str, files: Vec<WriteFile>) -> FileResult<()> {
        if files.is_empty() {
            return Err(FileError::Invalid(
                "files: at least one file is required".into(),
            ));
        }
        let mut seen = HashSet::new();
        let mut decoded = Vec::with_capacity(files.len());
        for (i, f) in files.iter().enumerate() {
            let path = self.parse(&f.path)?;
            if path.is_root() {
                return Err(FileError::Invalid(format!(
                    "files[{i}].path: the workspace directory itself is not a file"
                )));
            }
            if !seen.insert(path.relative()) {
                return Err(FileError::Invalid(format!(
                    "files[{i}].path: {} appears twice",
                    f.path
                )));
            }
            let mode = match f.mode {
                None => 0o644,
                Some(m) => u32::try_from(m)
                    .ok()
                    .filter(|m| *m <= 0o777)
                    .ok_or_else(|| {
                        FileError::Invalid(format!(
                            "files[{i}].mode: must be 0 to 511 (0o777), got {m}"
                        ))
                    })?,
            };
            let content = base64::engine::general_purpose::STANDARD
                .decode(f.content_base64.as_bytes())
                .map_err(|e| {
                    FileError::Invalid(format!("files[{i}].contentBase64: not valid base64 ({e})"))
                })?;
            decoded.push((path.relative(), mode, content));
        }
        let total: usize = decoded.iter().map(|(_, _, c)| c.len()).sum();
        let header = WriteHeader {
            files: decoded
                .iter()
                .map(|(p, mode, c)| WriteHeaderFile {
                    path: p,
                    mode: *mode,
                    size: c.len(),
                })
                .collect(),
        };
        let mut input =
            serde_json::to_vec(&header).map_err(|e| FileError::Helper(e.to_string()))?;
        input.push(b'\n');
        input.reserve(total);
        for (_, _, c) in &decoded {
            input.extend_from_slice(c);
        }
        drop(decoded);
        let sandbox = self.sandboxes.lookup(sandbox_id).await?;
        self.helper(&sandbox, vec!["write".into()], input).await?;
        Ok(())
    }

    /// The entries of a directory, sorted by name; symlinks are not followed.
    pub async fn list(&self, sandbox_id: &str, p: &str) -> FileResult<Vec<Entry>> {
        let path = self.parse(p)?;
        let sandbox = self.sandboxes.lookup(sandbox_id).await?;
        let out = self
            .helper(&sandbox, vec!["list".into(), path.relative()], Vec::new())
            .await?;
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
            return Err(FileError::Invalid(
                "paths: at least one path is required".into(),
            ));
        }
        let mut rel = Vec::with_capacity(paths.len());
        for (i, p) in paths.iter().enumerate() {
            let path = self.parse(p)?;
            if path.is_root() {
                return Err(FileError::Invalid(format!(
                    "paths[{i}]: the workspace directory itself cannot be deleted"
                )));
            }
            rel.push(path.relative());
        }
        let header = serde_json::json!({"paths": rel, "recursive": recursive});
        let mut input =
            serde_json::to_vec(&header).map_err(|e| FileError::Helper(e.to_string()))?;
        input.push(b'\n');
        let sandbox = self.sandboxes.lookup(sandbox_id).await?;
        self.helper(&sandbox, vec!["delete".into()], input).await?;
        Ok(())
    }

    /// Runs the helper with `args`, feeding `input`; returns its stdout.
    async fn helper(
        &self,
        sandbox: &Arc<Sandbox>,
        args: Vec<String>,
        input: Vec<u8>,
    ) -> FileResult<Vec<u8>> {
        let mut argv = vec![
            "python3".to_string(),
            "-I".to_string(),
            "-S".to_string(),
            "-c".to_string(),
            HELPER.to_string(),
            self.config.workspace_dir.clone(),
        ];
        argv.extend(args);
        let req = ExecRequest {
            argv,
            env: vec![],
            working_dir: "/".into(),
        };
        let session = match self.engine.exec(&sandbox.container, &req).await {
            Ok(s) => s,
            Err(EngineError::NotFound(_)) => {
                self.sandboxes.forget_gone(sandbox).await;
                return Err(SandboxError::NotFound(sandbox.id.clone()).into());
            }
            Err(EngineError::Conflict(_)) => {
                self.sandboxes.revive(sandbox).await?;
                self.engine.exec(&sandbox.container, &req).await?
            }
            Err(e) => return Err(e.into()),
        };
        let mut stdin = session.stdin;
        let mut output = session.output;
        let feed = async move {
            if !input.is_empty() {
                stdin.write_all(&input).await?;
                stdin.flush().await?;
            }
            Ok::<_, std::io::Error>(stdin)
        };
        let collect = async move {
            let (mut out, mut err) = (Vec::new(), Vec::new());
            while let Some(item) = output.next().await {
                match item? {
                    (OutputStream::Stdout, b) => out.extend_from_slice(&b),
                    (OutputStream::Stderr, b) => err.extend_from_slice(&b),
                }
            }
            Ok::<_, EngineError>((out, err))
        };
        let (fed, collected) = tokio::join!(feed, collect);
        let (out, err) = collected?;
        drop(fed);
        let err = String::from_utf8_lossy(&err);
        let status: Status = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .and_then(|l| serde_json::from_str(l).ok())
            .ok_or_else(|| {
                let tail: String = err
                    .chars()
                    .rev()
                    .take(300)
                    .collect::<String>()
                    .chars()
                    .rev()
                    .collect();
                FileError::Helper(format!(
                    "no status from the helper (is python3 in the sandbox image?): {}",
                    tail.trim()
                ))
            })?;
        if status.ok {
            return Ok(out);
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
            "invalid" => FileError::Invalid(m),
            _ => FileError::Helper(m),
        })
    }
}
