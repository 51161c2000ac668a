//! What sandboxd keeps in memory of the sandboxes whose checkpoints were
//! used most recently: each one's store's pack indexes, and its newest
//! checkpoint's entries and the trees they are in. The next checkpoint of
//! the sandbox compares the workspace with these entries, shares the
//! unchanged trees without reading or writing them again, and finds the
//! content it holds without reading the indexes again (profiled: reading
//! and writing the trees of 20,000 entries, and the indexes of their
//! contents, were a third of a checkpoint of 10 changed files among
//! them). A restore or a diff of the newest checkpoint reads no tree
//! either.
//!
//! The store stays the truth: a kept checkpoint is used only while the
//! store names it the sandbox's newest (the caller asks by its id, under
//! the sandbox's lock), and its trees only while their files are there;
//! every change of the packs goes through the indexes kept, and a change
//! cut short drops them. What is kept is bounded, in entries and indexed
//! objects together and in sandboxes; the least recently used goes first.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use lru::LruCache;

use super::manifest::Entry;
use super::pack::LoadedPacks;

/// Entries and indexed objects kept, over all sandboxes (each about 200
/// bytes).
const MAX_KEPT: usize = 150_000;
/// Sandboxes kept.
const MAX_SANDBOXES: NonZeroUsize = NonZeroUsize::new(16).expect("not zero");

/// A checkpoint's entries and trees.
#[derive(Debug, Default)]
pub(super) struct Newest {
    /// The checkpoint's id ("" for no checkpoint).
    pub(super) id: String,
    /// Sorted by path.
    pub(super) entries: Vec<Entry>,
    /// The trees `entries` are in, in order (see [`super::manifest::split`]).
    pub(super) trees: Vec<String>,
    /// When the walk that found `entries` began (see
    /// [`super::manifest::unchanged_since`]).
    pub(super) walked_at_ns: i64,
}

/// One sandbox's.
#[derive(Debug, Default)]
struct Kept {
    packs: LoadedPacks,
    newest: Option<Arc<Newest>>,
}

impl Kept {
    /// Entries and indexed objects (indexes in use count as none).
    fn weight(&self) -> usize {
        let packed = self
            .packs
            .try_lock()
            .ok()
            .and_then(|p| p.as_ref().map(|p| p.len()))
            .unwrap_or(0);
        packed + self.newest.as_ref().map_or(0, |n| n.entries.len())
    }
}

/// See the module's documentation.
#[derive(Debug)]
pub(super) struct Recent {
    kept: Mutex<LruCache<String, Kept>>,
}

impl Default for Recent {
    fn default() -> Recent {
        Recent {
            kept: Mutex::new(LruCache::new(MAX_SANDBOXES)),
        }
    }
}

impl Recent {
    /// `sandbox`'s pack indexes, kept from now on if they were not.
    pub(super) fn packs(&self, sandbox: &str) -> LoadedPacks {
        let Ok(mut kept) = self.kept.lock() else {
            return LoadedPacks::default();
        };
        Arc::clone(
            &kept
                .get_or_insert_mut(sandbox.to_string(), Kept::default)
                .packs,
        )
    }

    /// Checkpoint `id` of `sandbox`, when it is the one kept.
    pub(super) fn newest(&self, sandbox: &str, id: &str) -> Option<Arc<Newest>> {
        let mut kept = self.kept.lock().ok()?;
        kept.get(sandbox)?
            .newest
            .as_ref()
            .filter(|n| n.id == id)
            .cloned()
    }

    /// Keeps `newest` as `sandbox`'s newest checkpoint, then keeps within
    /// the bound: the others go, least recently used first, then this
    /// sandbox's too if it alone is over.
    pub(super) fn put(&self, sandbox: &str, newest: Newest) {
        let Ok(mut kept) = self.kept.lock() else {
            return;
        };
        kept.get_or_insert_mut(sandbox.to_string(), Kept::default)
            .newest = Some(Arc::new(newest));
        let mut total: usize = kept.iter().map(|(_, k)| k.weight()).sum();
        while total > MAX_KEPT {
            let Some((_, k)) = kept.pop_lru() else { break };
            total -= k.weight().min(total);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoints::manifest::EntryKind;

    fn newest(id: &str, n: usize) -> Newest {
        let entry = |i: usize| Entry {
            path: format!("f{i}"),
            kind: EntryKind::File,
            mode: 0o644,
            size: 0,
            sha256: None,
            target: None,
            mtime_ns: 0,
            ctime_ns: 0,
            ino: 0,
        };
        Newest {
            id: id.into(),
            entries: (0..n).map(entry).collect(),
            trees: Vec::new(),
            walked_at_ns: 0,
        }
    }

    #[test]
    fn only_the_checkpoint_kept_is_given_and_a_newer_one_replaces_it() {
        let r = Recent::default();
        r.put("s", newest("a", 3));
        assert_eq!(r.newest("s", "a").map(|n| n.entries.len()), Some(3));
        assert!(r.newest("s", "b").is_none(), "another id of the sandbox");
        assert!(r.newest("t", "a").is_none(), "another sandbox");
        r.put("s", newest("b", 2));
        assert!(r.newest("s", "a").is_none(), "replaced");
        assert!(r.newest("s", "b").is_some());
    }

    #[test]
    fn a_sandboxs_pack_indexes_are_one_value_while_kept() {
        let r = Recent::default();
        let (a, b) = (r.packs("s"), r.packs("s"));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &r.packs("t")), "another sandbox's");
    }

    #[test]
    fn what_is_kept_is_bounded_least_recently_used_first() {
        let r = Recent::default();
        r.put("s", newest("a", MAX_KEPT / 2));
        r.put("t", newest("b", MAX_KEPT / 2));
        assert!(r.newest("s", "a").is_some(), "s is now the most recent");
        r.put("u", newest("c", 10));
        assert!(r.newest("t", "b").is_none(), "t went first");
        assert!(r.newest("s", "a").is_some() && r.newest("u", "c").is_some());
        let packs = r.packs("s");
        r.put("v", newest("d", MAX_KEPT + 1));
        assert!(
            r.newest("v", "d").is_none(),
            "over the bound alone: not kept"
        );
        assert!(
            r.newest("s", "a").is_none() && r.newest("u", "c").is_none(),
            "the others went before it"
        );
        assert!(
            !Arc::ptr_eq(&packs, &r.packs("s")),
            "with their pack indexes"
        );
    }
}
