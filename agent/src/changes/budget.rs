//! The sandbox's share of the kernel's inotify watches ([`WatchBudget`]):
//! taken by each watch before the kernel is asked for it, given back when
//! the kernel drops it or the command's watch ends.

use std::cell::Cell;

/// The inotify watches one sandbox's agent may hold at once, all its
/// commands with `changes` together (`changes_watch_budget`). The
/// kernel's limit on watches is per user, and every sandbox runs as the
/// same user: without a bound of its own, one sandbox with a large
/// workspace (or many commands at once) could take every watch, and
/// every other sandbox's reports would be scans. A watch that does not
/// fit is as one the kernel refused: at the start the command's report
/// becomes a scan; later, events count as lost (the end is a walk).
#[derive(Debug)]
pub(crate) struct WatchBudget {
    limit: Cell<usize>,
    held: Cell<usize>,
}

impl WatchBudget {
    pub(crate) fn new(limit: usize) -> WatchBudget {
        WatchBudget {
            limit: Cell::new(limit),
            held: Cell::new(0),
        }
    }

    /// A new limit (from sandboxd's Hello); watches held stay held.
    pub(crate) fn set_limit(&self, limit: usize) {
        self.limit.set(limit);
    }

    /// Takes one watch; false when none is left.
    pub(super) fn take(&self) -> bool {
        if self.held.get() >= self.limit.get() {
            return false;
        }
        self.held.set(self.held.get() + 1);
        true
    }

    pub(super) fn give_back(&self, n: usize) {
        self.held.set(self.held.get().saturating_sub(n));
    }

    /// Watches held now, for tests to see what was given back.
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.held.get()
    }
}
