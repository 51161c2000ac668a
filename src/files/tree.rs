//! `Files::list_tree`: a directory and its subdirectories down to a depth,
//! breadth first, each directory listed by [`Files::list`]. At most
//! [`TREE_MAX_SHOWN`] entries are returned; every entry within the depth
//! is counted, so the answer says exactly how many were left out.
//! `Files::list_whole_tree` leaves none out (E2B's `ListDir` with a
//! depth): it is refused instead when a listing could not hold them.

use crate::field_error::FieldError;

use super::{Entry, EntryKind, FileError, FileResult, Files, MAX_ENTRIES};

/// Deepest a tree listing goes (1: the directory's own entries).
pub const TREE_MAX_DEPTH: u32 = 5;
/// Most entries a tree listing returns.
pub const TREE_MAX_SHOWN: usize = 1000;
/// Deepest a whole-tree listing goes.
pub const WHOLE_TREE_MAX_DEPTH: u32 = 64;

/// An entry of a tree listing: its path relative to the listed directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeEntry {
    pub path: String,
    pub entry: Entry,
}

/// A tree listing: the first entries (breadth first, each directory's
/// sorted by name) and how many there are within the depth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    pub entries: Vec<TreeEntry>,
    pub total: u64,
}

impl Files {
    /// The entries under `p` down to `depth` levels (symlinks are not
    /// followed). Refused when more than `MAX_ENTRIES` are within it.
    pub async fn list_tree(&self, sandbox_id: &str, p: &str, depth: u32) -> FileResult<Tree> {
        check_depth(depth, TREE_MAX_DEPTH)?;
        self.walk(sandbox_id, p, depth, TREE_MAX_SHOWN).await
    }

    /// Every entry under `p` down to `depth` levels (at most
    /// [`WHOLE_TREE_MAX_DEPTH`]), none left out: refused like
    /// [`Files::list_tree`] when more than `MAX_ENTRIES` are within it.
    pub async fn list_whole_tree(
        &self,
        sandbox_id: &str,
        p: &str,
        depth: u32,
    ) -> FileResult<Vec<TreeEntry>> {
        check_depth(depth, WHOLE_TREE_MAX_DEPTH)?;
        let tree = self.walk(sandbox_id, p, depth, MAX_ENTRIES).await?;
        Ok(tree.entries)
    }

    /// Breadth first down to `depth`, keeping the first `keep` entries.
    async fn walk(&self, sandbox_id: &str, p: &str, depth: u32, keep: usize) -> FileResult<Tree> {
        let base = p.trim_end_matches('/');
        let mut level = vec![String::new()];
        let mut entries = Vec::new();
        let mut total = 0u64;
        for d in 1..=depth {
            let mut next = Vec::new();
            for rel in level {
                let dir = if rel.is_empty() {
                    p.to_string()
                } else {
                    format!("{base}/{rel}")
                };
                for entry in self.list(sandbox_id, &dir).await? {
                    total += 1;
                    if total > MAX_ENTRIES as u64 {
                        return Err(FileError::TooLarge(format!(
                            "{p} has more than {MAX_ENTRIES} entries within depth {depth}; list a subdirectory or less deep"
                        )));
                    }
                    let path = if rel.is_empty() {
                        entry.name.clone()
                    } else {
                        format!("{rel}/{}", entry.name)
                    };
                    if d < depth && entry.kind == EntryKind::Dir {
                        next.push(path.clone());
                    }
                    if entries.len() < keep {
                        entries.push(TreeEntry { path, entry });
                    }
                }
            }
            level = next;
        }
        Ok(Tree { entries, total })
    }
}

/// Refuses a depth outside 1 to `max`.
fn check_depth(depth: u32, max: u32) -> FileResult<()> {
    if (1..=max).contains(&depth) {
        Ok(())
    } else {
        Err(FieldError::new("depth", format!("must be 1 to {max} (got {depth})")).into())
    }
}
