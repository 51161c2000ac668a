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
//! The store stays the truth: a kept checkpoint is used only when the
//! store names it, by its id (the newest, for the next checkpoint, under
//! the sandbox's lock), and its trees only while their files are there.
//! A store has one set of pack indexes at a time, which every change of
//! its packs goes through: sandboxd drops a sandbox's only while no
//! operation holds them, a change cut short drops them, and `verify`
//! loads them again. What is kept is bounded, in entries and indexed
//! objects together and in sandboxes, beyond what operations under way
//! hold: the least recently used goes first, checked when an operation
//! starts and when a checkpoint is kept.

use std::sync::{Arc, Mutex};

use lru::LruCache;

use super::manifest::Entry;
use super::pack::LoadedPacks;

/// Entries and indexed objects kept, over all sandboxes (each about 200
/// bytes).
const MAX_KEPT: usize = 150_000;
/// Sandboxes kept.
const MAX_SANDBOXES: usize = 16;

/// A checkpoint's entries and trees.
#[derive(Debug, Default)]
pub(super) struct Newest {
    /// The checkpoint's id ("" for no checkpoint).
    pub(super) id: String,
    /// Sorted by path.
    pub(super) entries: Vec<Entry>,
    /// The trees `entries` are in, in order, each with how many of them
    /// it holds.
    pub(super) trees: Vec<(String, usize)>,
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
    /// Whether an operation holds its pack indexes.
    fn in_use(&self) -> bool {
        Arc::strong_count(&self.packs) > 1
    }

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
            kept: Mutex::new(LruCache::unbounded()),
        }
    }
}

impl Recent {
    /// `sandbox`'s pack indexes, kept from now on if they were not.
    pub(super) fn packs(&self, sandbox: &str) -> LoadedPacks {
        let Ok(mut kept) = self.kept.lock() else {
            return LoadedPacks::default();
        };
        let packs = Arc::clone(
            &kept
                .get_or_insert_mut(sandbox.to_string(), Kept::default)
                .packs,
        );
        trim(&mut kept);
        packs
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
    /// the bound: the others go first, then this checkpoint too if it is
    /// still over.
    pub(super) fn put(&self, sandbox: &str, newest: Newest) {
        let Ok(mut kept) = self.kept.lock() else {
            return;
        };
        kept.get_or_insert_mut(sandbox.to_string(), Kept::default)
            .newest = Some(Arc::new(newest));
        if !trim(&mut kept) {
            if let Some(k) = kept.get_mut(sandbox) {
                k.newest = None;
            }
        }
    }
}

/// Drops what no operation holds, least recently used first, until what
/// is kept is within the bounds; the most recently used stays. Whether it
/// is within them.
fn trim(kept: &mut LruCache<String, Kept>) -> bool {
    loop {
        let total: usize = kept.iter().map(|(_, k)| k.weight()).sum();
        if kept.len() <= MAX_SANDBOXES && total <= MAX_KEPT {
            return true;
        }
        // `iter` runs from the most recently used, which stays.
        let oldest_unused = kept
            .iter()
            .rev()
            .take(kept.len().saturating_sub(1))
            .find(|(_, k)| !k.in_use())
            .map(|(key, _)| key.clone());
        match oldest_unused {
            Some(key) => {
                kept.pop(&key);
            }
            None => return total <= MAX_KEPT,
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
        assert!(r.newest("u", "c").is_none(), "the others went before it");
        assert!(
            r.newest("s", "a").is_some(),
            "but not one whose indexes an operation holds"
        );
        assert!(Arc::ptr_eq(&packs, &r.packs("s")), "one set of indexes");
        drop(packs);
        r.put("w", newest("e", MAX_KEPT / 2 + 1));
        assert!(r.newest("s", "a").is_none(), "dropped once no longer held");
    }

    #[test]
    fn sandboxes_are_bounded_and_those_in_use_are_kept_past_it() {
        let r = Recent::default();
        let held = r.packs("held");
        for i in 0..MAX_SANDBOXES + 4 {
            r.put(&format!("s{i}"), newest("x", 1));
        }
        let kept = r.kept.lock().unwrap();
        assert_eq!(kept.len(), MAX_SANDBOXES);
        assert!(kept.contains("held"), "an operation holds its indexes");
        assert!(!kept.contains("s0") && kept.contains(&format!("s{}", MAX_SANDBOXES + 3)));
        drop(kept);
        assert!(Arc::ptr_eq(&held, &r.packs("held")));
    }
}
