//! Files in the workspace: read, write, list, delete, move, make a
//! directory ([`moves`]). Every request is first
//! checked here, lexically ([`WorkspacePath`]), and validated whole (modes,
//! duplicates) before anything reaches the sandbox; then the agent inside
//! the sandbox does the I/O as the sandbox user, walking each path with
//! no-follow opens relative to directory fds. So the kernel enforces the
//! read-only root and the user's rights, and no symlink (in any component,
//! or swapped in mid-operation) carries an operation out of the workspace.
//! The engine's archive API is not used: it writes as root and follows
//! symlinks in intermediate components.
//!
//! What the agent answers is bounded here: a read no larger than
//! `max_file_bytes`, a listing of at most [`MAX_ENTRIES`] entries, names
//! without `/` or NUL, a stat of exactly the paths asked for, search
//! matches within the cap and their paths relative and plain ([`search`]).
//!
//! For editing: every read gives the content's SHA-256 and may ask for a
//! range of lines ([`text`]); a write may carry, per file, the hash it
//! expects (`ifMatch`) or that no file be there (`ifNoneMatch`), checked by
//! the agent in the same step as the write. An edit ([`edit`]) replaces
//! one exact text, writing with the hash of what it read; a tree listing
//! ([`tree`]) lists subdirectories down to a depth with exact counts.
//!
//! A directory can be watched ([`watch`]): its events as they happen, from
//! the agent's inotify watch, until the watcher goes.

mod edit;
mod held_watch;
mod moves;
mod search;
pub mod text;
mod tree;
mod watch;

use std::collections::HashSet;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use sandboxd_proto::{DirEntry, FailureKind, NewFile, Precondition, WRITE_PIECE};

use crate::agent_client::{AgentConn, AgentError, AgentResult, WriteOutcome};
use crate::config::Config;
use crate::field_error::FieldError;
use crate::sandbox::{Sandbox, SandboxError, Sandboxes};
use crate::workspace_path::WorkspacePath;
pub use edit::{Edited, FileEdit};
pub use held_watch::{HELD_BATCH, HELD_IDLE};
pub use search::{
    DEFAULT_SEARCH_RESULTS, MAX_GLOBS, MAX_PATTERN_BYTES, MAX_SEARCH_CONTEXT, MAX_SEARCH_RESULTS,
    SearchMatch, SearchRequest, SearchResult,
};
pub use tree::{TREE_MAX_DEPTH, TREE_MAX_SHOWN, Tree, TreeEntry, WHOLE_TREE_MAX_DEPTH};
pub use watch::{FileChange, FileWatch, WatchEnded, WatchEvent};

/// Most entries a listing may have.
pub const MAX_ENTRIES: usize = 100_000;

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
    /// Something is at a move's destination.
    #[error("{0}")]
    Exists(String),
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
    /// The sandbox runs as many watches as it may.
    #[error("{0}")]
    TooManyWatches(String),
    /// A write's `ifMatch` or `ifNoneMatch` did not hold; nothing was
    /// written.
    #[error("{}", precondition_message(.0))]
    PreconditionFailed(Vec<Mismatch>),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
}

/// A file of a write whose precondition did not hold: the path as the
/// request gave it, and the hash of its content now (`None`: no file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub path: String,
    pub current_sha256: Option<String>,
}

fn precondition_message(failed: &[Mismatch]) -> String {
    let paths: Vec<&str> = failed.iter().map(|m| m.path.as_str()).collect();
    format!(
        "nothing was written: the precondition of {} does not hold (changed, created or deleted since it was read)",
        paths.join(", ")
    )
}

impl From<AgentError> for FileError {
    fn from(e: AgentError) -> Self {
        let AgentError::Refused(f) = e else {
            return FileError::Sandbox(e.into());
        };
        let m = f.message.clone();
        match f.kind {
            FailureKind::NotFound => FileError::NotFound(m),
            FailureKind::SymlinkEscape => FileError::Escape(m),
            FailureKind::IsDirectory => FileError::IsDirectory(m),
            FailureKind::NotDirectory => FileError::NotDirectory(m),
            FailureKind::NeedsRecursive => FileError::NeedsRecursive(m),
            FailureKind::AlreadyExists => FileError::Exists(m),
            FailureKind::NotRegular => FileError::NotRegular(m),
            FailureKind::TooLarge => FileError::TooLarge(m),
            FailureKind::Changed => FileError::Changed(m),
            FailureKind::NoSpace => FileError::NoSpace(m),
            FailureKind::PermissionDenied => FileError::PermissionDenied(m),
            FailureKind::TooMany => FileError::TooManyWatches(m),
            FailureKind::Invalid => FieldError::new("path", m).into(),
            _ => FileError::Sandbox(AgentError::Refused(f).into()),
        }
    }
}

/// Result of file operations.
pub type FileResult<T> = Result<T, FileError>;

/// One file of a write request: where, what, and its permission bits
/// (`None`: 0o644); optionally the SHA-256 (hex) the file must have now,
/// or `"*"`: no file may be there.
#[derive(Debug, Clone, Default)]
pub struct FileToWrite {
    pub path: String,
    pub content: Vec<u8>,
    pub mode: Option<i64>,
    pub if_match: Option<String>,
    pub if_none_match: Option<String>,
}

/// What `call_streamed` hands its consumer.
enum Piece<P> {
    /// Start over: the parts so far came on a connection that closed.
    Restart,
    /// A part of the answer.
    Part(P),
    /// The last answer came; no more parts.
    End,
}

/// The receiving end of one call's parts, across its attempts (see
/// `call_streamed`): each part weighed against the call's budget, then
/// handed to the consumer.
struct Intake<P, F> {
    /// Most bytes of parts one attempt may bring.
    budget: usize,
    /// Bytes of parts taken in this attempt, and the consumer.
    state: Mutex<(usize, F)>,
    part: PhantomData<fn(P)>,
}

impl<P: Weigh, F: FnMut(Piece<P>) -> Result<(), String>> Intake<P, F> {
    fn new(budget: usize, on: F) -> Self {
        Intake {
            budget,
            state: Mutex::new((0, on)),
            part: PhantomData,
        }
    }

    /// Hands `piece` to the consumer; a part only within the budget.
    fn take(&self, piece: Piece<P>) -> Result<(), String> {
        let Ok(mut state) = self.state.lock() else {
            return Err("a poisoned part handler".into());
        };
        let (held, on) = &mut *state;
        match &piece {
            Piece::Restart => *held = 0,
            Piece::Part(p) => {
                *held = held.saturating_add(p.weight());
                if *held > self.budget {
                    return Err(OVER_BUDGET.into());
                }
            }
            Piece::End => {}
        }
        on(piece)
    }

    /// The part handler of one attempt's call.
    fn part(&self, p: P) -> Result<(), String> {
        self.take(Piece::Part(p))
    }
}

/// A consumer of parts that takes them only once the answer is complete
/// (so it sees the parts of one connection), each handed to `part`.
fn buffered<P>(
    mut part: impl FnMut(P) -> Result<(), String>,
) -> impl FnMut(Piece<P>) -> Result<(), String> {
    let mut parts = Vec::new();
    move |piece| {
        match piece {
            Piece::Restart => parts.clear(),
            Piece::Part(p) => parts.push(p),
            Piece::End => {
                for p in parts.drain(..) {
                    part(p)?;
                }
            }
        }
        Ok(())
    }
}

/// A whole file: its content in standard base64 with padding (encoded,
/// and hashed, piece by piece as the pieces arrive, so little is left to
/// do once the last one is in) and its SHA-256 (lowercase hex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileContent {
    pub content_base64: String,
    pub sha256: String,
}

/// A read of a range of lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinesRead {
    /// The lines `start..=end` exactly as in the file; past the end,
    /// `end` is `start - 1` and `text` is empty.
    Text {
        text: String,
        start: u64,
        end: u64,
        total_lines: u64,
        size: u64,
        sha256: String,
    },
    /// Not text (a NUL byte, or not UTF-8): not sent.
    Binary { size: u64, sha256: String },
}

/// What a path is, for `files:stat`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathInfo {
    /// As the request gave it.
    pub path: String,
    /// `None`: nothing is there.
    pub kind: Option<EntryKind>,
    pub size: u64,
    pub mode: u32,
    pub mtime_ms: i64,
    pub sha256: Option<String>,
}

/// Most paths in one `files:stat`.
pub const MAX_STAT_PATHS: usize = 1000;
/// What a directory entry is; symlinks are not followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    /// FIFO, socket, device.
    Other,
}

/// A directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub kind: EntryKind,
    pub size: u64,
    pub mtime_ms: i64,
    pub mode: u32,
}

impl Entry {
    /// An entry from the agent, if it is one a directory can hold.
    fn from_agent(e: DirEntry) -> Option<Entry> {
        let valid = !e.name.is_empty()
            && e.name.len() <= crate::workspace_path::MAX_COMPONENT_BYTES
            && e.name != "."
            && e.name != ".."
            && !e.name.contains(['/', '\0']);
        valid.then_some(Entry {
            name: e.name,
            kind: entry_kind(e.kind),
            size: e.size,
            mtime_ms: e.mtime_ms,
            mode: e.mode & 0o7777,
        })
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct Files {
    config: Arc<Config>,
    sandboxes: Arc<Sandboxes>,
    held: held_watch::HeldWatches,
}

impl Files {
    pub fn new(config: Arc<Config>, sandboxes: Arc<Sandboxes>) -> Self {
        Files {
            config,
            sandboxes,
            held: held_watch::HeldWatches::default(),
        }
    }

    fn parse(&self, p: &str) -> FileResult<WorkspacePath> {
        self.parse_field("path", p)
    }

    /// As [`Self::parse`], for a path given in `field`.
    fn parse_field(&self, field: &str, p: &str) -> FileResult<WorkspacePath> {
        let dirs: Vec<&str> = self.config.workspace_dirs().collect();
        WorkspacePath::parse(p, &dirs)
            .map_err(|e| FieldError::new(field, format!("{p:?}: {e}")).into())
    }

    /// Runs `call` on the sandbox's agent (once more on a new connection
    /// when the first closed under it), as a request that keeps the
    /// sandbox busy.
    async fn on_agent<T, Call, Fut>(&self, sandbox_id: &str, call: Call) -> FileResult<T>
    where
        Call: Fn(Arc<AgentConn>) -> Fut,
        Fut: Future<Output = AgentResult<T>>,
    {
        let sandbox = self.sandboxes.lookup(sandbox_id).await?;
        let _busy = sandbox.open_request();
        self.sandboxes
            .with_agent(&sandbox, call)
            .await
            .map_err(|e| self.failure(&sandbox, e))
    }

    /// As `on_agent`, for a call whose answer comes in parts, each handed
    /// to `intake.part`: when the connection closes under the call and it
    /// is made again on a new one, the consumer first gets `Restart` (what
    /// it took so far is void); once the last answer came, `End`.
    async fn call_streamed<P, F, T, Call, Fut>(
        &self,
        sandbox_id: &str,
        intake: &Intake<P, F>,
        call: Call,
    ) -> FileResult<T>
    where
        P: Weigh,
        F: FnMut(Piece<P>) -> Result<(), String>,
        Call: Fn(Arc<AgentConn>) -> Fut,
        Fut: Future<Output = AgentResult<T>>,
    {
        self.on_agent(sandbox_id, |conn| {
            let attempt = call(conn);
            async move {
                intake.take(Piece::Restart).map_err(AgentError::Protocol)?;
                let last = attempt.await?;
                intake.take(Piece::End).map_err(AgentError::Protocol)?;
                Ok(last)
            }
        })
        .await
        .map_err(|e| match e {
            FileError::Sandbox(SandboxError::Agent(AgentError::Protocol(m)))
                if m == OVER_BUDGET =>
            {
                FileError::TooLarge(format!("the answer is larger than {} bytes", intake.budget))
            }
            e => e,
        })
    }

    /// What a failed agent call means for the caller: the agent's refusal,
    /// or that the sandbox is gone or unreachable.
    fn failure(&self, sandbox: &Sandbox, e: SandboxError) -> FileError {
        match e {
            SandboxError::Agent(a @ AgentError::Refused(_)) => FileError::from(a),
            other => self.sandboxes.gone_or(sandbox, FileError::from(other)),
        }
    }

    /// The content of a file and its hash, or `None` when there is no such
    /// file.
    pub async fn read(&self, sandbox_id: &str, p: &str) -> FileResult<Option<FileContent>> {
        let mut encoded = text::Base64Writer::default();
        let mut hash = text::Sha256Hex::default();
        let found = self
            .read_pieces(sandbox_id, p, |piece| match piece {
                Some(piece) => {
                    encoded.push(piece);
                    hash.update(piece);
                }
                None => {
                    encoded = text::Base64Writer::default();
                    hash = text::Sha256Hex::default();
                }
            })
            .await?;
        Ok(found.then(|| FileContent {
            content_base64: encoded.finish(),
            sha256: hash.finish(),
        }))
    }

    /// Lines `start..=end` (1-based, both optional: the first and the last
    /// line) of a text file, or that it is binary; `None` when there is no
    /// such file.
    pub async fn read_lines(
        &self,
        sandbox_id: &str,
        p: &str,
        start: Option<u64>,
        end: Option<u64>,
    ) -> FileResult<Option<LinesRead>> {
        let first = start.unwrap_or(1);
        if first == 0 {
            return Err(FieldError::new("startLine", "lines are numbered from 1").into());
        }
        if let Some(end) = end {
            if end == 0 {
                return Err(FieldError::new("endLine", "lines are numbered from 1").into());
            }
            if end < first {
                return Err(FieldError::new(
                    "endLine",
                    format!("must not be before startLine ({end} < {first})"),
                )
                .into());
            }
        }
        let Some(content) = self.read_bytes(sandbox_id, p).await? else {
            return Ok(None);
        };
        let sha256 = text::sha256_hex(&content);
        let size = content.len() as u64;
        if !text::is_text(&content) {
            return Ok(Some(LinesRead::Binary { size, sha256 }));
        }
        let (slice, start, end) = text::line_range(&content, first, end.unwrap_or(u64::MAX));
        Ok(Some(LinesRead::Text {
            // Valid UTF-8 whole, and cut only after a `\n`: valid too.
            text: String::from_utf8_lossy(slice).into_owned(),
            start,
            end,
            total_lines: text::count_lines(&content),
            size,
            sha256,
        }))
    }

    /// The bytes of a file, or `None` when there is no such file.
    async fn read_bytes(&self, sandbox_id: &str, p: &str) -> FileResult<Option<Vec<u8>>> {
        let mut content = Vec::new();
        let found = self
            .read_pieces(sandbox_id, p, |piece| match piece {
                Some(piece) => content.extend_from_slice(piece),
                None => content.clear(),
            })
            .await?;
        Ok(found.then_some(content))
    }

    /// Hands a file's bytes to `take` in pieces as they arrive (`None`:
    /// start over, the pieces so far are void; see `call_streamed`); false
    /// when there is no such file.
    async fn read_pieces(
        &self,
        sandbox_id: &str,
        p: &str,
        mut take: impl FnMut(Option<&[u8]>) + Send,
    ) -> FileResult<bool> {
        let path = self.parse(p)?;
        if path.is_root() {
            return Err(FileError::IsDirectory(format!(
                "{p} is the workspace directory"
            )));
        }
        let max = self.config.max_file_bytes;
        let mut size = 0u64;
        let intake = Intake::new(
            usize::try_from(max).unwrap_or(usize::MAX),
            |piece: Piece<Vec<u8>>| match piece {
                Piece::Restart => {
                    size = 0;
                    take(None);
                    Ok(())
                }
                Piece::Part(d) if size + d.len() as u64 <= max => {
                    size += d.len() as u64;
                    take(Some(&d));
                    Ok(())
                }
                Piece::Part(_) => Err(format!("a file past max_file_bytes ({max})")),
                Piece::End => Ok(()),
            },
        );
        let (rel, limit) = (path.relative(), self.config.agent_timeout);
        let answer = self
            .call_streamed(sandbox_id, &intake, |conn| {
                let (rel, intake) = (rel.clone(), &intake);
                async move { conn.read_file(rel, max, limit, |d| intake.part(d)).await }
            })
            .await;
        match answer {
            Ok(_) => Ok(true),
            Err(FileError::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Writes every file or none. Everything is validated (paths, modes,
    /// duplicates) before anything is sent to the sandbox.
    pub async fn write(&self, sandbox_id: &str, files: Vec<FileToWrite>) -> FileResult<()> {
        if files.is_empty() {
            return Err(FieldError::new("files", "at least one file is required").into());
        }
        let mut seen = HashSet::new();
        let mut checked = Vec::with_capacity(files.len());
        // Every file's content, in the pieces the agent gets.
        let mut content = Vec::new();
        // Each file's path as the request gave it, for the answer.
        let mut shown = Vec::with_capacity(files.len());
        for (i, f) in files.into_iter().enumerate() {
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
            let precondition = match (&f.if_match, &f.if_none_match) {
                (Some(_), Some(_)) => {
                    return Err(FieldError::new(
                        format!("files[{i}].ifMatch"),
                        "ifMatch and ifNoneMatch exclude each other",
                    )
                    .into());
                }
                (Some(h), None) => Precondition::IfMatch(text::parse_hex(h).ok_or_else(|| {
                    FieldError::new(
                        format!("files[{i}].ifMatch"),
                        format!("must be a SHA-256 as 64 hex digits, got {h:?}"),
                    )
                })?),
                (None, Some(star)) if star == "*" => Precondition::IfNoneMatch,
                (None, Some(other)) => {
                    return Err(FieldError::new(
                        format!("files[{i}].ifNoneMatch"),
                        format!("must be \"*\", got {other:?}"),
                    )
                    .into());
                }
                (None, None) => Precondition::None,
            };
            shown.push(f.path);
            checked.push(NewFile {
                path: path.relative(),
                mode,
                size: u64::try_from(f.content.len()).unwrap_or(u64::MAX),
                precondition,
            });
            let whole = Bytes::from(f.content);
            for start in (0..whole.len()).step_by(WRITE_PIECE) {
                content.push(whole.slice(start..whole.len().min(start + WRITE_PIECE)));
            }
        }
        let sent: Vec<String> = checked.iter().map(|f| f.path.clone()).collect();
        let limit = self.config.agent_timeout;
        let answer = self
            .on_agent(sandbox_id, |conn| {
                let (files, content) = (checked.clone(), content.clone());
                async move { conn.write_files(files, content, limit).await }
            })
            .await?;
        match answer {
            WriteOutcome::Written => Ok(()),
            WriteOutcome::PreconditionFailed(failed) => {
                // Only paths of this write, each once, name a failure.
                let mut named = HashSet::new();
                let mut out = Vec::new();
                for m in failed {
                    let Some(i) = sent.iter().position(|p| *p == m.path) else {
                        return Err(agent_broke("a precondition failure of a path not written"));
                    };
                    if named.insert(i) {
                        out.push(Mismatch {
                            path: shown[i].clone(),
                            current_sha256: m.current.as_ref().map(text::hex),
                        });
                    }
                }
                if out.is_empty() {
                    return Err(agent_broke("a precondition failure naming no file"));
                }
                Err(FileError::PreconditionFailed(out))
            }
        }
    }

    /// What each path is (the final symlink not followed), with the hash of
    /// regular files when `sha256`.
    pub async fn stat(
        &self,
        sandbox_id: &str,
        paths: Vec<String>,
        sha256: bool,
    ) -> FileResult<Vec<PathInfo>> {
        if paths.is_empty() || paths.len() > MAX_STAT_PATHS {
            return Err(FieldError::new(
                "paths",
                format!("1 to {MAX_STAT_PATHS} paths, got {}", paths.len()),
            )
            .into());
        }
        let dirs: Vec<&str> = self.config.workspace_dirs().collect();
        let mut rel = Vec::with_capacity(paths.len());
        for (i, p) in paths.iter().enumerate() {
            let path = WorkspacePath::parse(p, &dirs)
                .map_err(|e| FieldError::new(format!("paths[{i}]"), format!("{p:?}: {e}")))?;
            rel.push(path.relative());
        }
        let limit = self.config.agent_timeout;
        let stats = self
            .on_agent(sandbox_id, |conn| {
                let rel = rel.clone();
                async move { conn.stat(rel, sha256, limit).await }
            })
            .await?;
        if stats.len() != paths.len() {
            return Err(agent_broke("a stat of other paths than asked for"));
        }
        Ok(paths
            .into_iter()
            .zip(stats)
            .map(|(path, st)| {
                let kind = st.kind.map(entry_kind);
                PathInfo {
                    path,
                    kind,
                    size: st.size,
                    mode: st.mode & 0o7777,
                    mtime_ms: st.mtime_ms,
                    // Only a regular file has a hash, and only when asked.
                    sha256: st
                        .sha256
                        .filter(|_| sha256 && kind == Some(EntryKind::File))
                        .as_ref()
                        .map(text::hex),
                }
            })
            .collect())
    }

    /// The entries of a directory, sorted by name; symlinks are not followed.
    pub async fn list(&self, sandbox_id: &str, p: &str) -> FileResult<Vec<Entry>> {
        let path = self.parse(p)?;
        let mut entries = Vec::new();
        let intake = Intake::new(
            MAX_ENTRIES * (ENTRY_BYTES + NAME_MAX),
            buffered(|list: Vec<DirEntry>| {
                if entries.len() + list.len() > MAX_ENTRIES {
                    return Err(TOO_MANY_ENTRIES.into());
                }
                entries.extend(list.into_iter().filter_map(Entry::from_agent));
                Ok(())
            }),
        );
        let (rel, limit) = (path.relative(), self.config.agent_timeout);
        self.call_streamed(sandbox_id, &intake, |conn| {
            let (rel, intake) = (rel.clone(), &intake);
            async move { conn.list_dir(rel, limit, |list| intake.part(list)).await }
        })
        .await
        .map_err(|e| match e {
            FileError::Sandbox(SandboxError::Agent(AgentError::Protocol(m)))
                if m == TOO_MANY_ENTRIES =>
            {
                FileError::TooLarge(format!(
                    "{p} has more than {MAX_ENTRIES} entries, more than a listing holds"
                ))
            }
            e => e,
        })?;
        drop(intake);
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
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
        let limit = self.config.agent_timeout;
        self.on_agent(sandbox_id, |conn| {
            let rel = rel.clone();
            async move { conn.delete(rel, recursive, limit).await }
        })
        .await
    }
}

fn entry_kind(k: sandboxd_proto::EntryKind) -> EntryKind {
    match k {
        sandboxd_proto::EntryKind::File => EntryKind::File,
        sandboxd_proto::EntryKind::Dir => EntryKind::Dir,
        sandboxd_proto::EntryKind::Symlink => EntryKind::Symlink,
        sandboxd_proto::EntryKind::Other => EntryKind::Other,
    }
}

/// An agent that answered what it cannot have meant.
fn agent_broke(what: &str) -> FileError {
    FileError::Sandbox(SandboxError::Agent(AgentError::Protocol(what.to_string())))
}

/// What a part is taken to weigh against a call's budget: its bytes, and
/// for entries and matches a fixed share each, so many empty names weigh
/// too.
trait Weigh {
    fn weight(&self) -> usize;
}

impl Weigh for Vec<u8> {
    fn weight(&self) -> usize {
        self.len()
    }
}

impl Weigh for Vec<DirEntry> {
    fn weight(&self) -> usize {
        self.iter().map(|e| ENTRY_BYTES + e.name.len()).sum()
    }
}

/// What a listing entry weighs besides its name, and the longest name a
/// Linux directory holds.
const ENTRY_BYTES: usize = 64;
const NAME_MAX: usize = 255;
/// The part handler's refusals that become `TooLarge` rather than a
/// broken agent.
const OVER_BUDGET: &str = "parts past the call's budget";
const TOO_MANY_ENTRIES: &str = "a directory of more than MAX_ENTRIES entries";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names_come_back_from_a_listing() {
        let e = |name: &str| DirEntry {
            name: name.into(),
            kind: sandboxd_proto::EntryKind::File,
            size: 1,
            mtime_ms: 0,
            mode: 0o100644,
        };
        assert_eq!(
            Entry::from_agent(e("a.txt")).map(|e| (e.name, e.mode)),
            Some(("a.txt".into(), 0o644))
        );
        for bad in ["", ".", "..", "a/b", "a\0b", &"x".repeat(256)] {
            assert!(Entry::from_agent(e(bad)).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn parts_weigh_their_bytes_and_empty_names_weigh_too() {
        let e = |name: &str| DirEntry {
            name: name.into(),
            kind: sandboxd_proto::EntryKind::File,
            size: 0,
            mtime_ms: 0,
            mode: 0,
        };
        assert_eq!(vec![0u8; 1000].weight(), 1000);
        assert_eq!(vec![e(""), e("abc")].weight(), 2 * ENTRY_BYTES + 3);
        // A listing's budget holds the limit's worth of the longest names.
        let full: Vec<DirEntry> = (0..MAX_ENTRIES).map(|_| e(&"x".repeat(NAME_MAX))).collect();
        assert!(full.weight() <= MAX_ENTRIES * (ENTRY_BYTES + NAME_MAX));
    }
}
