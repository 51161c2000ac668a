//! The bodies of the checkpoint routes: a checkpoint, the list, a diff
//! (also what a restore changed).

use serde::Serialize;
use utoipa::ToSchema;

use crate::checkpoints::{CheckpointInfo, Diff, DiffEntry, DiffText, EntryKind};

/// A checkpoint of a sandbox's workspace.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(in crate::api) struct Checkpoint {
    checkpoint_id: String,
    /// The caller's name for it (unique in the sandbox); `null`: none.
    label: Option<String>,
    /// Unix epoch milliseconds.
    created_at: u64,
    /// Regular files in it.
    files: u64,
    /// Their bytes.
    bytes: u64,
    /// Bytes of content this checkpoint added to the sandbox's store
    /// (content it shares with earlier checkpoints is stored once).
    new_bytes: u64,
    duration_ms: u64,
}

impl From<CheckpointInfo> for Checkpoint {
    fn from(c: CheckpointInfo) -> Self {
        Checkpoint {
            checkpoint_id: c.checkpoint_id,
            label: c.label,
            created_at: c.created_at,
            files: c.files,
            bytes: c.bytes,
            new_bytes: c.new_bytes,
            duration_ms: c.duration_ms,
        }
    }
}

/// A sandbox's checkpoints, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub(in crate::api) struct CheckpointList {
    checkpoints: Vec<Checkpoint>,
}

impl From<Vec<CheckpointInfo>> for CheckpointList {
    fn from(all: Vec<CheckpointInfo>) -> Self {
        CheckpointList {
            checkpoints: all.into_iter().map(Into::into).collect(),
        }
    }
}

/// What a path is.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(in crate::api) enum PathKind {
    File,
    Dir,
    Symlink,
}

impl From<EntryKind> for PathKind {
    fn from(k: EntryKind) -> Self {
        match k {
            EntryKind::File => PathKind::File,
            EntryKind::Dir => PathKind::Dir,
            EntryKind::Symlink => PathKind::Symlink,
        }
    }
}

/// One changed path.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(in crate::api) struct ChangedPath {
    /// Relative to the workspace.
    path: String,
    /// What it is after (what it was, when deleted).
    kind: PathKind,
    /// Its size before, when it was a file.
    size_before: Option<u64>,
    /// Its size after, when it is a file.
    size_after: Option<u64>,
}

impl From<DiffEntry> for ChangedPath {
    fn from(e: DiffEntry) -> Self {
        ChangedPath {
            path: e.path,
            kind: e.kind.into(),
            size_before: e.size_before,
            size_after: e.size_after,
        }
    }
}

/// Exact counts of a diff.
#[derive(Debug, Serialize, ToSchema)]
pub(in crate::api) struct DiffCounts {
    created: u64,
    modified: u64,
    deleted: u64,
}

/// Paths created, modified (content, mode, kind or link target) and
/// deleted, each list sorted by path and at most 1000 long; `counts` are
/// exact.
#[derive(Debug, Serialize, ToSchema)]
pub(in crate::api) struct CheckpointDiff {
    created: Vec<ChangedPath>,
    modified: Vec<ChangedPath>,
    deleted: Vec<ChangedPath>,
    counts: DiffCounts,
    /// Some list was cut at 1000.
    truncated: bool,
    /// With `text=true` only: the unified diff of the text files among
    /// the paths shown.
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<TextDiff>,
}

/// The unified diff (`diff -u`, 3 lines of context) of the text files
/// among a diff's paths, in path order, shaped to `maxChars` as a
/// command's output is: when it does not fit, its first `headChars` and
/// last `tailChars` characters around one line `[… L lines, C characters
/// omitted …]`. A binary file is one line `Binary files a/P and b/P
/// differ`, a file over 1 MiB (or past the 32 MiB a diff reads) one line
/// `Files a/P and b/P differ (…: not compared)`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(in crate::api) struct TextDiff {
    diff: String,
    /// Characters of the whole unified diff, before it was cut.
    total_chars: u64,
    /// Its lines.
    total_lines: u64,
    /// Characters left out (0: it is whole).
    omitted_chars: u64,
    /// Lines left out (newlines in the part left out).
    omitted_lines: u64,
    /// Characters of `diff` before the omission line, and after it.
    head_chars: u64,
    tail_chars: u64,
    /// Files with a section (hunks or a one-line marker).
    files: u64,
}

impl From<DiffText> for TextDiff {
    fn from(t: DiffText) -> Self {
        TextDiff {
            diff: t.diff,
            total_chars: t.total_chars,
            total_lines: t.total_lines,
            omitted_chars: t.omitted_chars,
            omitted_lines: t.omitted_lines,
            head_chars: t.head_chars,
            tail_chars: t.tail_chars,
            files: t.files,
        }
    }
}

impl From<Diff> for CheckpointDiff {
    fn from(d: Diff) -> Self {
        let truncated = d.created_count > d.created.len() as u64
            || d.modified_count > d.modified.len() as u64
            || d.deleted_count > d.deleted.len() as u64;
        CheckpointDiff {
            counts: DiffCounts {
                created: d.created_count,
                modified: d.modified_count,
                deleted: d.deleted_count,
            },
            created: d.created.into_iter().map(Into::into).collect(),
            modified: d.modified.into_iter().map(Into::into).collect(),
            deleted: d.deleted.into_iter().map(Into::into).collect(),
            truncated,
            text: d.text.map(Into::into),
        }
    }
}
