//! The bodies of the file routes: a file read, its paths' stat, a search's
//! matches, a directory's entries, whether a directory was made and a
//! watch's lines.

use serde::Serialize;
use utoipa::ToSchema;

use crate::files::{
    Edited, Entry, EntryKind, FileChange, FileContent, LinesRead, PathInfo, SearchResult,
    WatchEvent,
};

/// `POST …/files:mkdir`: whether the directory was made.
#[derive(Debug, Serialize, ToSchema)]
pub(in crate::api) struct DirMade {
    /// `false`: a directory was there already.
    created: bool,
}

impl From<bool> for DirMade {
    fn from(created: bool) -> Self {
        DirMade { created }
    }
}

/// `GET …/files:read`: the content as standard base64 (or, with
/// `startLine`/`endLine`, a range of lines as text), or not found.
#[derive(Debug, Default, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(in crate::api) struct FileRead {
    found: bool,
    /// Standard base64 with padding; present when `found` and no lines
    /// were asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    content_base64: Option<String>,
    /// Lowercase hex SHA-256 of the whole file; present when `found`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    sha256: Option<String>,
    /// The file's size in bytes; present when lines were asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    size: Option<u64>,
    /// Lines were asked for and the file is not text (a NUL byte, or not
    /// UTF-8): no content is sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    binary: Option<bool>,
    /// The lines asked for, exactly as in the file (line endings kept).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    content: Option<String>,
    /// The range returned: `endLine` is lowered to the last line; past the
    /// end, `content` is empty and `endLine` is `startLine - 1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    start_line: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    end_line: Option<u64>,
    /// Lines in the whole file (text after the last `\n` counts as one).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    total_lines: Option<u64>,
}

impl From<Option<FileContent>> for FileRead {
    fn from(content: Option<FileContent>) -> Self {
        match content {
            None => FileRead::default(),
            Some(c) => FileRead {
                found: true,
                content_base64: Some(c.content_base64),
                sha256: Some(c.sha256),
                ..FileRead::default()
            },
        }
    }
}

/// The answer to a whole-file `files:read`: the JSON of [`FileRead`],
/// written directly when the file was found. Its base64 and hex need no
/// escaping, and serde_json would look at each of the millions of
/// characters of a large file to see that.
pub(in crate::api) fn file_read_response(content: Option<FileContent>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let Some(c) = content else {
        return axum::Json(FileRead::default()).into_response();
    };
    let mut body = String::with_capacity(c.content_base64.len() + c.sha256.len() + 64);
    body.push_str(r#"{"found":true,"contentBase64":""#);
    body.push_str(&c.content_base64);
    body.push_str(r#"","sha256":""#);
    body.push_str(&c.sha256);
    body.push_str(r#""}"#);
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

impl From<Option<LinesRead>> for FileRead {
    fn from(lines: Option<LinesRead>) -> Self {
        match lines {
            None => FileRead::default(),
            Some(LinesRead::Binary { size, sha256 }) => FileRead {
                found: true,
                sha256: Some(sha256),
                size: Some(size),
                binary: Some(true),
                ..FileRead::default()
            },
            Some(LinesRead::Text {
                text,
                start,
                end,
                total_lines,
                size,
                sha256,
            }) => FileRead {
                found: true,
                sha256: Some(sha256),
                size: Some(size),
                binary: Some(false),
                content: Some(text),
                start_line: Some(start),
                end_line: Some(end),
                total_lines: Some(total_lines),
                ..FileRead::default()
            },
        }
    }
}

/// `POST …/files:edit`: the file as the edit left it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(in crate::api) struct FileEdited {
    /// Always `true`.
    ok: bool,
    /// Lowercase hex SHA-256 of the new content (an `ifMatch` for the next
    /// edit).
    sha256: String,
    /// Bytes now.
    size: u64,
}

impl From<Edited> for FileEdited {
    fn from(e: Edited) -> Self {
        FileEdited {
            ok: true,
            sha256: e.sha256,
            size: e.size,
        }
    }
}

/// `POST …/files:stat`.
#[derive(Debug, Serialize, ToSchema)]
pub(in crate::api) struct StatList {
    /// One per path asked for, in the same order.
    entries: Vec<StatEntry>,
}

/// What one path is.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(in crate::api) struct StatEntry {
    /// As the request gave it.
    path: String,
    /// The final symlink is not followed.
    #[serde(rename = "type")]
    kind: StatKind,
    /// Bytes (a symlink: its target's length); 0 when missing.
    size: u64,
    /// Permission bits in octal, e.g. `"0644"`; `"0000"` when missing.
    mode: String,
    /// 0 when missing.
    mtime_ms: i64,
    /// Lowercase hex; present for a regular file when `sha256` was asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    sha256: Option<String>,
}

/// `other`: a FIFO, socket or device; `missing`: nothing is there.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum StatKind {
    File,
    Dir,
    Symlink,
    Other,
    Missing,
}

impl From<Vec<PathInfo>> for StatList {
    fn from(infos: Vec<PathInfo>) -> Self {
        StatList {
            entries: infos
                .into_iter()
                .map(|i| StatEntry {
                    path: i.path,
                    kind: match i.kind {
                        None => StatKind::Missing,
                        Some(EntryKind::File) => StatKind::File,
                        Some(EntryKind::Dir) => StatKind::Dir,
                        Some(EntryKind::Symlink) => StatKind::Symlink,
                        Some(EntryKind::Other) => StatKind::Other,
                    },
                    size: i.size,
                    mode: format!("{:04o}", i.mode),
                    mtime_ms: i.mtime_ms,
                    sha256: i.sha256,
                })
                .collect(),
        }
    }
}

/// `POST …/files:search`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(in crate::api) struct SearchAnswer {
    /// In path order, then line order; at most `maxResults`.
    matches: Vec<SearchMatchDto>,
    /// Every matching line in what was searched, past the cap too.
    total_matches: u64,
    /// `matches.length`.
    returned: u64,
    files_searched: u64,
    /// Files left out as binary or larger than 16 MiB (counted by the
    /// built-in search; `rg` skips them without counting).
    files_skipped: u64,
    /// `returned < totalMatches`.
    truncated: bool,
    /// `rg` did the search; otherwise the agent's own did.
    used_rg: bool,
    /// Why `rg` was not used, when it was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    rg_unavailable: Option<String>,
    /// The search stopped at its deadline (three quarters of
    /// `agent_timeout_ms`): the counts are what it saw by then.
    timed_out: bool,
}

/// One matching line.
#[derive(Debug, Serialize, ToSchema)]
pub(in crate::api) struct SearchMatchDto {
    /// Absolute under the workspace.
    path: String,
    /// 1-based.
    line: u64,
    /// 1-based byte offset of the first match in the line.
    column: u64,
    /// The line without its ending, cut to 1024 bytes.
    text: String,
    /// Up to `context` lines before it, nearest last.
    before: Vec<String>,
    /// Up to `context` lines after it.
    after: Vec<String>,
}

impl From<SearchResult> for SearchAnswer {
    fn from(r: SearchResult) -> Self {
        SearchAnswer {
            returned: r.matches.len() as u64,
            matches: r
                .matches
                .into_iter()
                .map(|m| SearchMatchDto {
                    path: m.path,
                    line: m.line,
                    column: m.column,
                    text: m.text,
                    before: m.before,
                    after: m.after,
                })
                .collect(),
            total_matches: r.total_matches,
            files_searched: r.files_searched,
            files_skipped: r.files_skipped,
            truncated: r.truncated,
            used_rg: r.used_rg,
            rg_unavailable: r.rg_unavailable,
            timed_out: r.timed_out,
        }
    }
}

/// One entry of `GET …/files:list`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(in crate::api) struct FileEntry {
    name: String,
    #[serde(rename = "type")]
    kind: FileKind,
    size: u64,
    mtime_ms: i64,
    mode: u32,
}

/// `other`: a FIFO, socket or device. Symlinks are not followed.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// `GET …/files:list`.
#[derive(Debug, Serialize, ToSchema)]
pub(in crate::api) struct FileList {
    entries: Vec<FileEntry>,
}

impl From<Vec<Entry>> for FileList {
    fn from(entries: Vec<Entry>) -> Self {
        FileList {
            entries: entries
                .into_iter()
                .map(|e| FileEntry {
                    name: e.name,
                    kind: match e.kind {
                        EntryKind::File => FileKind::File,
                        EntryKind::Dir => FileKind::Dir,
                        EntryKind::Symlink => FileKind::Symlink,
                        EntryKind::Other => FileKind::Other,
                    },
                    size: e.size,
                    mtime_ms: e.mtime_ms,
                    mode: e.mode,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The answer written directly is the JSON of `FileRead` for the same
    /// content, and a missing file's is too.
    #[tokio::test]
    async fn a_whole_file_read_is_the_json_of_file_read() {
        for content in [
            None,
            Some(FileContent {
                content_base64: "aGVsbG8/+w==".into(),
                sha256: "ab".repeat(32),
            }),
        ] {
            let want = serde_json::to_value(FileRead::from(content.clone())).expect("value");
            let response = file_read_response(content);
            assert_eq!(
                response.headers().get(axum::http::header::CONTENT_TYPE),
                Some(&axum::http::HeaderValue::from_static("application/json"))
            );
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .expect("body");
            let got: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
            assert_eq!(got, want);
        }
    }
}

/// One line of `GET …/files:watch` (`application/x-ndjson`), told apart by
/// `type`; `path` is relative to the workspace.
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
pub(in crate::api) enum WatchLine {
    /// Created, or moved in (the new name of a rename).
    #[serde(rename_all = "camelCase")]
    Create { path: String, is_dir: bool },
    /// Written; writes to one path within 50 ms are one event.
    #[serde(rename_all = "camelCase")]
    Write { path: String, is_dir: bool },
    #[serde(rename_all = "camelCase")]
    Remove { path: String, is_dir: bool },
    /// Moved away: the old name (the new one follows as a `create` when
    /// inside the watch).
    #[serde(rename_all = "camelCase")]
    Rename { path: String, is_dir: bool },
    /// Mode, owner or times changed.
    #[serde(rename_all = "camelCase")]
    Chmod { path: String, is_dir: bool },
    /// Events were lost: look at the directory again.
    Overflow,
    /// Nothing happened for `log_heartbeat_ms`.
    Heartbeat,
    /// The watch ended by itself; the stream ends here.
    End { reason: String },
}

impl WatchLine {
    /// The line as sent: JSON and a newline.
    pub(in crate::api) fn render(&self) -> bytes::Bytes {
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        line.push(b'\n');
        line.into()
    }
}

impl From<WatchEvent> for WatchLine {
    fn from(e: WatchEvent) -> Self {
        match e {
            WatchEvent::Change {
                kind, path, is_dir, ..
            } => match kind {
                FileChange::Create => WatchLine::Create { path, is_dir },
                FileChange::Write => WatchLine::Write { path, is_dir },
                FileChange::Remove => WatchLine::Remove { path, is_dir },
                FileChange::Rename => WatchLine::Rename { path, is_dir },
                FileChange::Chmod => WatchLine::Chmod { path, is_dir },
            },
            WatchEvent::Overflow => WatchLine::Overflow,
            WatchEvent::Ended(why) => WatchLine::End {
                reason: why.reason(),
            },
        }
    }
}
