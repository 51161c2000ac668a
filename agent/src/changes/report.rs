//! What a command's watch reports ([`Report`]), and how its changes are
//! gathered into one: the first `max` by path kept, the rest counted, a
//! path too long for the protocol counted only ([`Collected`]).

use std::collections::BinaryHeap;

use sandboxd_proto::{Change, ChangeKind, ChangeMethod, MAX_CHANGE_PATH};

/// What a command changed, as the agent reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Report {
    /// Sorted by path, at most the `max` asked for.
    pub(crate) changes: Vec<Change>,
    /// Changes beyond those.
    pub(crate) more: u64,
    pub(crate) method: ChangeMethod,
    pub(crate) complete: bool,
}

/// A path relative to the workspace, as bytes ('/'-separated).
pub(super) type Rel = Vec<u8>;

/// The first `max` changes by path, and a count of the rest.
pub(super) struct Collected {
    max: usize,
    /// A max-heap: the largest path kept is the first to go.
    kept: BinaryHeap<(Rel, KindOrd, Option<u64>)>,
    more: u64,
    /// A change may not be one (see
    /// [`CLOCK_MARGIN`](super::watch::CLOCK_MARGIN)).
    pub(super) unsure: bool,
}

/// [`ChangeKind`] in a heap (paths are unique, so its order never decides).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct KindOrd(u8);

impl Collected {
    pub(super) fn new(max: usize) -> Collected {
        Collected {
            max,
            kept: BinaryHeap::new(),
            more: 0,
            unsure: false,
        }
    }

    pub(super) fn push(&mut self, path: Rel, kind: ChangeKind, size: Option<u64>) {
        // A path too long for the protocol is counted, not listed.
        if path.len() > MAX_CHANGE_PATH {
            self.more += 1;
            return;
        }
        let kind = KindOrd(match kind {
            ChangeKind::Created => 0,
            ChangeKind::Modified => 1,
            ChangeKind::Deleted => 2,
        });
        self.kept.push((path, kind, size));
        if self.kept.len() > self.max {
            self.kept.pop();
            self.more += 1;
        }
    }

    pub(super) fn finish(self) -> (Vec<Change>, u64) {
        let changes = self
            .kept
            .into_sorted_vec()
            .into_iter()
            .map(|(path, kind, size)| Change {
                path: String::from_utf8_lossy(&path).into_owned(),
                kind: match kind.0 {
                    0 => ChangeKind::Created,
                    1 => ChangeKind::Modified,
                    _ => ChangeKind::Deleted,
                },
                size,
            })
            .collect();
        (changes, self.more)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_too_long_for_the_protocol_are_counted_only() {
        let mut c = Collected::new(10);
        c.push(
            vec![b'a'; MAX_CHANGE_PATH + 1],
            ChangeKind::Created,
            Some(0),
        );
        c.push(b"b".to_vec(), ChangeKind::Deleted, None);
        let (changes, more) = c.finish();
        assert_eq!(changes.len(), 1);
        assert_eq!(more, 1);
    }
}
