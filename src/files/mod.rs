//! Files in the workspace: read, write, list, delete. Every request is first
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
//! without `/` or NUL.

use std::collections::HashSet;
use std::sync::Arc;

use sandboxd_proto::{DirEntry, FailureKind, NewFile, Op, Reply};

use crate::agent::{AgentError, reply_name};
use crate::config::Config;
use crate::field_error::FieldError;
use crate::sandbox::{SandboxError, Sandboxes};
use crate::workspace_path::WorkspacePath;

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
            FailureKind::NotRegular => FileError::NotRegular(m),
            FailureKind::TooLarge => FileError::TooLarge(m),
            FailureKind::Changed => FileError::Changed(m),
            FailureKind::NoSpace => FileError::NoSpace(m),
            FailureKind::PermissionDenied => FileError::PermissionDenied(m),
            FailureKind::Invalid => FieldError::new("path", m).into(),
            _ => FileError::Sandbox(AgentError::Refused(f).into()),
        }
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
            kind: match e.kind {
                sandboxd_proto::EntryKind::File => EntryKind::File,
                sandboxd_proto::EntryKind::Dir => EntryKind::Dir,
                sandboxd_proto::EntryKind::Symlink => EntryKind::Symlink,
                sandboxd_proto::EntryKind::Other => EntryKind::Other,
            },
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
}

impl Files {
    pub fn new(config: Arc<Config>, sandboxes: Arc<Sandboxes>) -> Self {
        Files { config, sandboxes }
    }

    fn parse(&self, p: &str) -> FileResult<WorkspacePath> {
        let dirs: Vec<&str> = self.config.workspace_dirs().collect();
        WorkspacePath::parse(p, &dirs)
            .map_err(|e| FieldError::new("path", format!("{p:?}: {e}")).into())
    }

    /// Runs one file operation in the sandbox's agent; answers in parts go
    /// to `part`.
    ///
    /// Parts are held until the answer is complete, at most `budget` bytes
    /// of them (see [`part_bytes`]): past that the answer is `TooLarge`,
    /// whatever the agent goes on sending. A budget of 0 is an operation
    /// that answers in one part.
    async fn call(
        &self,
        sandbox_id: &str,
        op: Op,
        budget: usize,
        part: impl FnMut(Reply) -> Result<(), String>,
    ) -> FileResult<Reply> {
        let sandbox = self.sandboxes.lookup(sandbox_id).await?;
        let _busy = sandbox.open_request();
        // Parts a closed connection delivered are not undone: a read or a
        // listing collects parts only once its answer is complete, so
        // `part` sees the parts of one connection (see `collect`).
        let part = std::sync::Mutex::new(part);
        let limit = self.config.agent_timeout;
        let answer = self
            .sandboxes
            .with_agent(&sandbox, |conn| {
                let op = op.clone();
                let part = &part;
                async move {
                    let mut parts = Vec::new();
                    let mut held = 0usize;
                    let last = conn
                        .call_parts_within(op, limit, |p| {
                            held = held.saturating_add(part_bytes(&p));
                            if budget == 0 {
                                return Err(format!("{} where one answer was due", reply_name(&p)));
                            }
                            if held > budget {
                                return Err(OVER_BUDGET.into());
                            }
                            parts.push(p);
                            Ok(())
                        })
                        .await?;
                    let mut f = part
                        .lock()
                        .map_err(|_| AgentError::Protocol("a poisoned part handler".into()))?;
                    for p in parts {
                        f(p).map_err(AgentError::Protocol)?;
                    }
                    Ok(last)
                }
            })
            .await;
        answer.map_err(|e| match e {
            SandboxError::Agent(a @ AgentError::Refused(_)) => FileError::from(a),
            SandboxError::Agent(AgentError::Protocol(m)) if m == OVER_BUDGET => {
                FileError::TooLarge(format!("the answer is larger than {budget} bytes"))
            }
            other => self.sandboxes.gone_or(&sandbox, FileError::from(other)),
        })
    }

    /// The content of a file, or `None` when there is no such file.
    pub async fn read(&self, sandbox_id: &str, p: &str) -> FileResult<Option<Vec<u8>>> {
        let path = self.parse(p)?;
        if path.is_root() {
            return Err(FileError::IsDirectory(format!(
                "{p} is the workspace directory"
            )));
        }
        let max = self.config.max_file_bytes;
        let mut content = Vec::new();
        let answer = self
            .call(
                sandbox_id,
                Op::ReadFile {
                    path: path.relative(),
                    max_bytes: max,
                },
                usize::try_from(max).unwrap_or(usize::MAX),
                |part| match part {
                    Reply::Data(d) if (content.len() + d.len()) as u64 <= max => {
                        content.extend_from_slice(&d);
                        Ok(())
                    }
                    Reply::Data(_) => Err(format!("a file past max_file_bytes ({max})")),
                    other => Err(format!("{} in a file", reply_name(&other))),
                },
            )
            .await;
        match answer {
            Ok(_) => Ok(Some(content)),
            Err(FileError::NotFound(_)) => Ok(None),
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
            checked.push(NewFile {
                path: path.relative(),
                mode,
                content: f.content,
            });
        }
        self.call(sandbox_id, Op::WriteFiles { files: checked }, 0, |_| Ok(()))
            .await?;
        Ok(())
    }

    /// The entries of a directory, sorted by name; symlinks are not followed.
    pub async fn list(&self, sandbox_id: &str, p: &str) -> FileResult<Vec<Entry>> {
        let path = self.parse(p)?;
        let mut entries = Vec::new();
        self.call(
            sandbox_id,
            Op::ListDir {
                path: path.relative(),
            },
            MAX_ENTRIES * (ENTRY_BYTES + NAME_MAX),
            |part| match part {
                Reply::Entries(list) if entries.len() + list.len() <= MAX_ENTRIES => {
                    entries.extend(list.into_iter().filter_map(Entry::from_agent));
                    Ok(())
                }
                Reply::Entries(_) => Err(TOO_MANY_ENTRIES.into()),
                other => Err(format!("{} in a listing", reply_name(&other))),
            },
        )
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
        self.call(
            sandbox_id,
            Op::Delete {
                paths: rel,
                recursive,
            },
            0,
            |_| Ok(()),
        )
        .await?;
        Ok(())
    }
}

/// What a part is taken to weigh against a call's budget: its bytes, and
/// for entries a fixed share each, so many empty names weigh too.
fn part_bytes(part: &Reply) -> usize {
    match part {
        Reply::Data(d) => d.len(),
        Reply::Entries(list) => list.iter().map(|e| ENTRY_BYTES + e.name.len()).sum(),
        _ => ENTRY_BYTES,
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
        assert_eq!(part_bytes(&Reply::Data(vec![0; 1000])), 1000);
        assert_eq!(
            part_bytes(&Reply::Entries(vec![e(""), e("abc")])),
            2 * ENTRY_BYTES + 3
        );
        // A listing's budget holds the limit's worth of the longest names.
        let full: Vec<DirEntry> = (0..MAX_ENTRIES).map(|_| e(&"x".repeat(NAME_MAX))).collect();
        assert!(part_bytes(&Reply::Entries(full)) <= MAX_ENTRIES * (ENTRY_BYTES + NAME_MAX));
    }
}
