//! A checkpoint diff's text: a unified diff (as `diff -u` writes it, 3
//! lines of context, `--- a/PATH` / `+++ b/PATH`, `/dev/null` for a side
//! that is not a file) of the text files among the paths the diff shows,
//! shaped to a character budget by the same [`Shaper`] that shapes a
//! command's output, so the cut, its marker and its counts follow one set
//! of rules.
//!
//! A side is text when it is valid UTF-8 without a NUL byte; a binary one
//! gives git's one line `Binary files a/P and b/P differ`. Reading is
//! bounded: a file over [`FILE_MAX_BYTES`] is not read (a one-line "too
//! large" marker), and once [`READ_MAX_BYTES`] were read for one diff the
//! files left get a one-line "not read" marker. Content comes from the
//! store, or for the workspace now from the agent, only while the file is
//! the one its snapshot saw. Lines are compared with `similar`'s Myers
//! within [`COMPARE_TIME`] for the whole diff; past it a file's hunks are
//! still right but may be longer than the shortest ones.

use std::time::{Duration, Instant};

use sandboxd_proto::ShapeSpec;
use sandboxd_proto::shape::Shaper;
use similar::{Algorithm, TextDiff};

use super::manifest::{Entry, EntryKind};
use super::store::Store;
use super::tree::Agent;
use super::{CheckpointError, CheckpointResult};

/// `maxChars` of a text diff that names none.
pub const DEFAULT_CHARS: u32 = 20_000;
/// Most bytes of one side of one file that are read and compared.
pub(super) const FILE_MAX_BYTES: u64 = 1024 * 1024;
/// Most bytes read for one diff's text, both sides of every file.
pub(super) const READ_MAX_BYTES: u64 = 32 * 1024 * 1024;
/// Unchanged lines around each change, as `diff -u`.
const CONTEXT_LINES: usize = 3;
/// Time the line comparisons of one diff may take before they settle for
/// longer hunks.
const COMPARE_TIME: Duration = Duration::from_secs(2);

/// A diff's text, shaped (see docs/API.md, Checkpoints): the counts are
/// of the whole unified diff, before it was cut.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiffText {
    pub diff: String,
    pub total_chars: u64,
    pub total_lines: u64,
    pub omitted_chars: u64,
    pub omitted_lines: u64,
    pub head_chars: u64,
    pub tail_chars: u64,
    /// Files with a section (hunks or a one-line marker).
    pub files: u64,
}

/// One side of a changed path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Side {
    /// Not a regular file there (none, a directory, a symlink).
    Absent,
    Text(String),
    Binary,
    TooLarge,
    /// Not read: the diff's read budget was spent.
    Unread,
}

impl Side {
    /// Content as the diff sees it.
    pub(super) fn of(bytes: Vec<u8>) -> Side {
        if bytes.contains(&0) {
            return Side::Binary;
        }
        String::from_utf8(bytes).map_or(Side::Binary, Side::Text)
    }
}

/// The section of one path: its hunks, a one-line marker, or nothing (the
/// same text on both sides, or an empty file made or removed).
pub(super) fn section(path: &str, before: &Side, after: &Side, deadline: Instant) -> String {
    let a = match before {
        Side::Absent => "/dev/null".to_string(),
        _ => format!("a/{path}"),
    };
    let b = match after {
        Side::Absent => "/dev/null".to_string(),
        _ => format!("b/{path}"),
    };
    let sides = [before, after];
    if sides.contains(&&Side::Binary) {
        return format!("Binary files {a} and {b} differ\n");
    }
    if sides.contains(&&Side::TooLarge) {
        return format!("Files {a} and {b} differ (over {FILE_MAX_BYTES} bytes: not compared)\n");
    }
    if sides.contains(&&Side::Unread) {
        return format!(
            "Files {a} and {b} differ (past the {READ_MAX_BYTES} bytes a text diff reads: not compared)\n"
        );
    }
    let text = |s: &Side| match s {
        Side::Text(t) => t.clone(),
        _ => String::new(),
    };
    let (old, new) = (text(before), text(after));
    TextDiff::configure()
        .algorithm(Algorithm::Myers)
        .deadline(deadline)
        .diff_lines(old.as_str(), new.as_str())
        .unified_diff()
        .context_radius(CONTEXT_LINES)
        .missing_newline_hint(true)
        .header(&a, &b)
        .to_string()
}

/// Reads the sides of a diff's files within the read budget.
pub(super) struct Reader<'a> {
    pub(super) store: &'a Store,
    /// The after side is the workspace now, read through its agent;
    /// `None`: a checkpoint, in the store.
    pub(super) workspace: Option<&'a Agent<'a>>,
    read: u64,
}

impl<'a> Reader<'a> {
    pub(super) fn new(store: &'a Store, workspace: Option<&'a Agent<'a>>) -> Self {
        Reader {
            store,
            workspace,
            read: 0,
        }
    }

    /// What a side of `size` bytes is when it is not to be read; else
    /// `None`, and its bytes are counted as read.
    fn unread(&mut self, size: u64) -> Option<Side> {
        if size > FILE_MAX_BYTES {
            return Some(Side::TooLarge);
        }
        if self.read + size > READ_MAX_BYTES {
            return Some(Side::Unread);
        }
        self.read += size;
        None
    }

    /// Side `e` (the after side when `after`), read when it fits.
    async fn side(&mut self, e: Option<&Entry>, after: bool) -> CheckpointResult<Side> {
        let Some(e) = e.filter(|e| e.kind == EntryKind::File) else {
            return Ok(Side::Absent);
        };
        if let Some(marker) = self.unread(e.size) {
            return Ok(marker);
        }
        let bytes = match self.workspace.filter(|_| after) {
            Some(agent) => agent.read_file(e).await?,
            None => {
                let (sha256, size) = (e.sha256.clone().unwrap_or_default(), e.size);
                self.store
                    .blocking(move |s| s.read_object(&sha256, size))
                    .await
                    .map_err(CheckpointError::Store)?
            }
        };
        Ok(Side::of(bytes))
    }

    /// The text of `changes` (each path's entry before and after, sorted
    /// by path) shaped within `spec`.
    pub(super) async fn text(
        mut self,
        changes: &[(Option<&Entry>, Option<&Entry>)],
        spec: ShapeSpec,
    ) -> CheckpointResult<DiffText> {
        let deadline = Instant::now() + COMPARE_TIME;
        let mut shaper = Shaper::new(ShapeSpec { raw: true, ..spec });
        let mut files = 0u64;
        for (before, after) in changes {
            let same_content = matches!((before, after), (Some(o), Some(n))
                if o.kind == EntryKind::File && n.kind == EntryKind::File && o.sha256 == n.sha256);
            if same_content {
                continue;
            }
            let Some(path) = after.or(*before).map(|e| e.path.as_str()) else {
                continue;
            };
            let old = self.side(*before, false).await?;
            let new = self.side(*after, true).await?;
            let text = section(path, &old, &new, deadline);
            if !text.is_empty() {
                files += 1;
                shaper.feed(files, &text, text.len() as u64);
            }
        }
        // One record per file; the pointer into a log that finish makes
        // means nothing here.
        let (diff, info) = shaper.finish(0, None);
        Ok(DiffText {
            diff,
            total_chars: info.total_chars,
            total_lines: info.total_lines,
            omitted_chars: info.omitted_chars,
            omitted_lines: info.omitted_lines,
            head_chars: info.head_chars,
            tail_chars: info.tail_chars,
            files,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Side {
        Side::Text(s.to_string())
    }

    fn diff(before: &Side, after: &Side) -> String {
        section("f.txt", before, after, Instant::now() + COMPARE_TIME)
    }

    #[test]
    fn a_change_gives_the_hunks_diff_u_gives() {
        // `diff -u` of these two files, headers aside.
        let old = "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n";
        let new = "1\n2\n3\n4\nfive\n6\n7\n8\n9\n10\n11\n";
        assert_eq!(
            diff(&text(old), &text(new)),
            "--- a/f.txt\n+++ b/f.txt\n@@ -2,9 +2,10 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n 9\n 10\n+11\n"
        );
        let far = "1\n2\n3\n4\n5\n6\n7\n8\n9\nten\n";
        assert_eq!(
            diff(&text("one\n2\n3\n4\n5\n6\n7\n8\n9\n10\n"), &text(far)),
            "--- a/f.txt\n+++ b/f.txt\n@@ -1,4 +1,4 @@\n-one\n+1\n 2\n 3\n 4\n@@ -7,4 +7,4 @@\n 7\n 8\n 9\n-10\n+ten\n",
            "changes more than 6 lines apart are two hunks"
        );
    }

    #[test]
    fn identical_or_empty_files_give_no_section() {
        assert_eq!(diff(&text("a\nb\n"), &text("a\nb\n")), "");
        assert_eq!(diff(&Side::Absent, &text("")), "");
        assert_eq!(diff(&text(""), &Side::Absent), "");
        assert_eq!(diff(&text(""), &text("")), "");
    }

    #[test]
    fn a_file_made_or_removed_is_diffed_against_dev_null() {
        assert_eq!(
            diff(&Side::Absent, &text("x\ny\n")),
            "--- /dev/null\n+++ b/f.txt\n@@ -0,0 +1,2 @@\n+x\n+y\n"
        );
        assert_eq!(
            diff(&text("x\n"), &Side::Absent),
            "--- a/f.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n"
        );
        assert_eq!(
            diff(&text(""), &text("x\n")),
            "--- a/f.txt\n+++ b/f.txt\n@@ -0,0 +1 @@\n+x\n"
        );
    }

    #[test]
    fn a_last_line_without_a_newline_is_marked_as_diff_u_marks_it() {
        assert_eq!(
            diff(&text("a\nb"), &text("a\nc")),
            "--- a/f.txt\n+++ b/f.txt\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n"
        );
        assert_eq!(
            diff(&text("a"), &text("a\n")),
            "--- a/f.txt\n+++ b/f.txt\n@@ -1 +1 @@\n-a\n\\ No newline at end of file\n+a\n"
        );
    }

    #[test]
    fn crlf_lines_keep_their_carriage_returns_and_differ_from_lf_ones() {
        assert_eq!(
            diff(&text("a\r\nb\r\n"), &text("a\r\nc\r\n")),
            "--- a/f.txt\n+++ b/f.txt\n@@ -1,2 +1,2 @@\n a\r\n-b\r\n+c\r\n"
        );
        assert_eq!(
            diff(&text("a\r\n"), &text("a\n")),
            "--- a/f.txt\n+++ b/f.txt\n@@ -1 +1 @@\n-a\r\n+a\n"
        );
    }

    #[test]
    fn binary_and_unread_sides_give_one_line() {
        assert_eq!(Side::of(b"PK\0\x03".to_vec()), Side::Binary);
        assert_eq!(Side::of(vec![0xff, 0xfe, b'a']), Side::Binary);
        assert_eq!(Side::of("é\n".as_bytes().to_vec()), text("é\n"));
        assert_eq!(
            diff(&Side::Absent, &Side::Binary),
            "Binary files /dev/null and b/f.txt differ\n"
        );
        assert_eq!(
            diff(&text("a"), &Side::TooLarge),
            format!(
                "Files a/f.txt and b/f.txt differ (over {FILE_MAX_BYTES} bytes: not compared)\n"
            )
        );
        assert!(
            diff(&Side::Unread, &Side::Absent)
                .starts_with("Files a/f.txt and /dev/null differ (past the ")
        );
    }

    #[test]
    fn a_side_over_the_file_cap_or_past_the_read_budget_is_not_read() {
        let store = Store::at(std::path::PathBuf::from("/nonexistent"), Default::default());
        let mut r = Reader::new(&store, None);
        assert_eq!(r.unread(FILE_MAX_BYTES + 1), Some(Side::TooLarge));
        assert_eq!(r.read, 0, "a file not read costs nothing");
        let files = READ_MAX_BYTES / FILE_MAX_BYTES;
        for _ in 0..files {
            assert_eq!(r.unread(FILE_MAX_BYTES), None);
        }
        assert_eq!(r.read, READ_MAX_BYTES);
        assert_eq!(r.unread(1), Some(Side::Unread));
        assert_eq!(r.unread(0), None, "an empty file still fits");
    }

    #[test]
    fn a_long_rewrite_past_the_time_limit_still_gives_a_diff_that_applies() {
        let old: String = (0..2000).map(|i| format!("{i}\n")).collect();
        // Every line is within the context of a change: the hunks cover
        // both files whole.
        let new: String = (0..2000)
            .map(|i| {
                if i % 10 == 0 {
                    format!("{i}\n")
                } else {
                    format!("x{i}\n")
                }
            })
            .collect();
        let late = section("f", &text(&old), &text(&new), Instant::now());
        let kept = |sign: char| -> String {
            late.lines()
                .skip(2)
                .filter(|l| !l.starts_with("@@") && !l.starts_with(sign))
                .map(|l| format!("{}\n", &l[1..]))
                .collect()
        };
        assert_eq!(kept('+'), old, "the old side of every hunk is the old file");
        assert_eq!(kept('-'), new, "the new side of every hunk is the new file");
    }
}
