//! A checkpoint's manifest: every entry of the workspace at that moment
//! (path, kind, mode, size, content hash or link target, and the identity
//! that tells a file unchanged without reading it), and the comparison of
//! two such trees that both a diff and a restore's plan are made of.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The manifest format's version: entries in trees (see [`split`]).
pub(super) const VERSION: u32 = 2;
/// The first format, every entry inline, still read: checkpoints made
/// before trees are kept across an upgrade.
pub(super) const INLINE_VERSION: u32 = 1;

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
}

impl EntryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::File => "file",
            EntryKind::Dir => "dir",
            EntryKind::Symlink => "symlink",
        }
    }
}

/// One entry of a tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct Entry {
    /// Relative to the workspace, '/'-separated, checked.
    pub(super) path: String,
    pub(super) kind: EntryKind,
    /// Permission bits, at most 0o7777.
    pub(super) mode: u32,
    pub(super) size: u64,
    /// A file's content's SHA-256, lowercase hex.
    pub(super) sha256: Option<String>,
    /// A symlink's target.
    pub(super) target: Option<String>,
    pub(super) mtime_ns: i64,
    pub(super) ctime_ns: i64,
    pub(super) ino: u64,
}

impl Entry {
    /// The same thing at the same path: kind, mode, content or target.
    pub(super) fn same_as(&self, other: &Entry) -> bool {
        self.kind == other.kind
            && self.mode == other.mode
            && self.sha256 == other.sha256
            && self.target == other.target
    }
}

impl Manifest {
    /// When the walk that found its entries began, or at the latest: in a
    /// checkpoint made before that was kept, its time less its duration,
    /// which is before its start.
    pub(super) fn walk_began_ns(&self) -> i64 {
        if self.walked_at_ns != 0 {
            return self.walked_at_ns;
        }
        let ms = i64::try_from(self.created_at.saturating_sub(self.duration_ms)).unwrap_or(0);
        ms.saturating_mul(1_000_000)
    }
}

/// How long before a walk a file's change time must be for the next
/// checkpoint to take the file as unchanged by its identity alone. File
/// times come from the kernel's coarse clock, a tick behind at most (10
/// ms at the slowest tick Linux has): a file rewritten with its size
/// within the tick in which the walk saw it keeps its times. Twice that,
/// for a sandbox clock a little off sandboxd's (gVisor keeps its own).
/// A file system that keeps whole seconds only (a change time with no
/// nanoseconds) adds a second.
pub(super) const RACY_MARGIN_NS: i64 = 20_000_000;

/// Whether file `now` is file `before` of the checkpoint whose walk began
/// at `walked_at_ns`, unchanged, without reading it: the same inode, size
/// and times, and changed last well before that walk (any change since
/// has a later change time, which the sandbox cannot set back).
pub(super) fn unchanged_since(before: &Entry, walked_at_ns: i64, now: &Entry) -> bool {
    before.kind == EntryKind::File
        && now.kind == EntryKind::File
        && before.sha256.is_some()
        && (before.size, before.mtime_ns, before.ctime_ns, before.ino)
            == (now.size, now.mtime_ns, now.ctime_ns, now.ino)
        && before.ctime_ns < walked_at_ns.saturating_sub(racy_margin(before.ctime_ns))
}

/// [`RACY_MARGIN_NS`], plus a second for a time in whole seconds.
fn racy_margin(ctime_ns: i64) -> i64 {
    if ctime_ns % 1_000_000_000 == 0 {
        RACY_MARGIN_NS + 1_000_000_000
    } else {
        RACY_MARGIN_NS
    }
}

/// A checkpoint as stored: what the API shows of it, and the trees that
/// hold its entries (a few kilobytes, however large the workspace).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct Manifest {
    pub(super) version: u32,
    pub(super) id: String,
    pub(super) label: Option<String>,
    pub(super) created_at: u64,
    /// Orders checkpoints made in the same millisecond.
    pub(super) seq: u64,
    pub(super) bytes: u64,
    pub(super) new_bytes: u64,
    pub(super) duration_ms: u64,
    /// Regular files in it.
    #[serde(default)]
    pub(super) files: u64,
    /// When the walk that found its entries began, in nanoseconds since
    /// the epoch (see [`unchanged_since`]); 0 in checkpoints made before
    /// it was kept (see [`Manifest::walk_began_ns`]).
    #[serde(default)]
    pub(super) walked_at_ns: i64,
    /// The trees its entries are in, in path order, by SHA-256.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) trees: Vec<String>,
    /// [`INLINE_VERSION`]'s entries, sorted by path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) entries: Option<Vec<Entry>>,
}

/// Entries of a tree on average (a path ends one when its hash modulo
/// this is the highest value), and at most.
const TREE_SPLIT: u64 = 64;
const TREE_MAX: usize = 512;

/// FNV-1a: a fixed, fast hash, so a path's boundary never moves.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `entries` (sorted by path) cut into trees. Where a tree ends depends on
/// the path that ends it alone (and on [`TREE_MAX`] in a run of paths
/// none of which ends one), so a change rewrites the trees that hold it
/// and the next checkpoint shares every other tree of the one before.
pub(super) fn split(entries: &[Entry]) -> Vec<&[Entry]> {
    let mut trees = Vec::new();
    let mut start = 0;
    for (i, e) in entries.iter().enumerate() {
        if fnv1a(e.path.as_bytes()) % TREE_SPLIT == TREE_SPLIT - 1 || i + 1 - start == TREE_MAX {
            trees.push(&entries[start..=i]);
            start = i + 1;
        }
    }
    if start < entries.len() {
        trees.push(&entries[start..]);
    }
    trees
}

/// How two trees differ: entries only in the new one, in both but not
/// the same, only in the old one; each list sorted by path.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct TreeDiff<'a> {
    pub(super) created: Vec<&'a Entry>,
    /// (old, new)
    pub(super) modified: Vec<(&'a Entry, &'a Entry)>,
    pub(super) deleted: Vec<&'a Entry>,
}

/// What changed from `old` to `new`.
pub(super) fn compare<'a>(old: &'a [Entry], new: &'a [Entry]) -> TreeDiff<'a> {
    let old_by: BTreeMap<&str, &Entry> = old.iter().map(|e| (e.path.as_str(), e)).collect();
    let new_by: BTreeMap<&str, &Entry> = new.iter().map(|e| (e.path.as_str(), e)).collect();
    let mut diff = TreeDiff::default();
    for (path, n) in &new_by {
        match old_by.get(path) {
            None => diff.created.push(n),
            Some(o) if !o.same_as(n) => diff.modified.push((o, n)),
            Some(_) => {}
        }
    }
    diff.deleted = old_by
        .iter()
        .filter(|(path, _)| !new_by.contains_key(*path))
        .map(|(_, e)| *e)
        .collect();
    diff
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::checkpoints) fn file(path: &str, content: &str, mode: u32) -> Entry {
        Entry {
            path: path.into(),
            kind: EntryKind::File,
            mode,
            size: content.len() as u64,
            sha256: Some(crate::files::text::sha256_hex(content.as_bytes())),
            target: None,
            mtime_ns: 1,
            ctime_ns: 1,
            ino: 1,
        }
    }

    #[test]
    fn a_file_is_unchanged_by_identity_only_when_changed_well_before_the_walk() {
        let walked_at = 100_500_000_000;
        let before = Entry {
            ctime_ns: walked_at - RACY_MARGIN_NS - 1,
            ..file("f", "content", 0o644)
        };
        // Control: the same file, changed well before the walk.
        assert!(unchanged_since(&before, walked_at, &before.clone()));
        // Changed within the margin: its times may not show a rewrite in
        // the same tick of the file clock, so it is read again.
        let recent = Entry {
            ctime_ns: walked_at - 1,
            ..before.clone()
        };
        assert!(!unchanged_since(&recent, walked_at, &recent.clone()));
        // No time for the walk: read again.
        assert!(!unchanged_since(&before, 0, &before.clone()));
        // Any part of the identity that differs.
        for now in [
            Entry {
                size: 8,
                ..before.clone()
            },
            Entry {
                mtime_ns: 2,
                ..before.clone()
            },
            Entry {
                ctime_ns: before.ctime_ns + 1,
                ..before.clone()
            },
            Entry {
                ino: 2,
                ..before.clone()
            },
            Entry {
                kind: EntryKind::Dir,
                ..before.clone()
            },
        ] {
            assert!(!unchanged_since(&before, walked_at, &now), "{now:?}");
        }
        // A time in whole seconds (a file system that keeps no more) may
        // be up to a second behind the change.
        let whole = Entry {
            ctime_ns: (walked_at - RACY_MARGIN_NS - 1) / 1_000_000_000 * 1_000_000_000,
            ..before.clone()
        };
        assert!(!unchanged_since(&whole, walked_at, &whole.clone()));
        let whole_earlier = Entry {
            ctime_ns: whole.ctime_ns - 1_000_000_000,
            ..before.clone()
        };
        assert!(unchanged_since(
            &whole_earlier,
            walked_at,
            &whole_earlier.clone()
        ));
        let unhashed = Entry {
            sha256: None,
            ..before.clone()
        };
        assert!(!unchanged_since(&unhashed, walked_at, &before));
    }

    #[test]
    fn a_checkpoint_from_before_walk_times_were_kept_takes_its_start() {
        let mut m: Manifest = serde_json::from_value(serde_json::json!({
            "version": VERSION, "id": "a1", "label": null, "createdAt": 10_000,
            "seq": 1, "bytes": 0, "newBytes": 0, "durationMs": 300,
        }))
        .expect("a manifest without walkedAtNs");
        assert_eq!(m.walked_at_ns, 0);
        assert_eq!(
            m.walk_began_ns(),
            9_700_000_000,
            "created less its duration"
        );
        m.walked_at_ns = 9_900_000_000;
        assert_eq!(m.walk_began_ns(), 9_900_000_000);
    }

    pub(in crate::checkpoints) fn dir(path: &str) -> Entry {
        Entry {
            kind: EntryKind::Dir,
            size: 0,
            sha256: None,
            ..file(path, "", 0o755)
        }
    }

    pub(in crate::checkpoints) fn link(path: &str, target: &str) -> Entry {
        Entry {
            kind: EntryKind::Symlink,
            target: Some(target.into()),
            sha256: None,
            ..file(path, "", 0o777)
        }
    }

    #[test]
    fn trees_end_where_their_paths_say_so_an_insertion_changes_one_tree() {
        let entries: Vec<Entry> = (0..5000)
            .map(|i| file(&format!("n/{i:05}"), "x", 0o644))
            .collect();
        let trees = split(&entries);
        assert_eq!(
            trees.concat(),
            entries,
            "the trees hold every entry, in order"
        );
        assert!(
            (40..160).contains(&trees.len()),
            "about 64 a tree: {}",
            trees.len()
        );
        assert!(trees.iter().all(|t| t.len() <= TREE_MAX));
        let mut inserted = entries.clone();
        inserted.insert(2500, file("n/02499a", "y", 0o644));
        let after = split(&inserted);
        let differ = after.iter().filter(|t| !trees.contains(t)).count();
        assert_eq!(differ, 1, "only the tree the new entry joined is new");
        // Paths none of which ends a tree still give bounded trees.
        let none_end: Vec<Entry> = (0..100_000)
            .map(|i| file(&format!("p{i}"), "", 0o644))
            .filter(|e| fnv1a(e.path.as_bytes()) % TREE_SPLIT != TREE_SPLIT - 1)
            .take(1200)
            .collect();
        let lens: Vec<usize> = split(&none_end).iter().map(|t| t.len()).collect();
        assert_eq!(lens, [TREE_MAX, TREE_MAX, 1200 - 2 * TREE_MAX]);
    }

    #[test]
    fn a_diff_names_created_modified_and_deleted_entries_by_what_they_hold() {
        let old = vec![
            dir("d"),
            file("d/a", "one", 0o644),
            file("b", "same", 0o644),
            file("m", "x", 0o644),
            link("l", "b"),
        ];
        let mut touched = file("b", "same", 0o644);
        touched.mtime_ns = 99;
        let new = vec![
            touched,
            file("m", "x", 0o755),
            link("l", "d"),
            file("n", "new", 0o600),
            dir("e"),
        ];
        let d = compare(&old, &new);
        let paths = |v: &[&Entry]| v.iter().map(|e| e.path.clone()).collect::<Vec<_>>();
        assert_eq!(paths(&d.created), ["e", "n"]);
        assert_eq!(paths(&d.deleted), ["d", "d/a"]);
        let modified: Vec<&str> = d.modified.iter().map(|(o, _)| o.path.as_str()).collect();
        assert_eq!(modified, ["l", "m"], "a new mtime alone is no change");
        assert_eq!(compare(&new, &new), TreeDiff::default());
    }
}
