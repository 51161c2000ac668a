//! Relief: when the sandbox nears its pids or memory limit, the agent
//! ends the largest tree of leftovers of a finished command (one per
//! call) and says so in that command's log. Running commands and the
//! agent are never chosen.

use std::rc::Rc;

use super::{Commands, Control};
use crate::{cgroup, tree};

/// Headroom under the pids limit below which leftovers are ended.
const PIDS_HEADROOM: u64 = 16;
/// Share of the memory limit above which leftovers are ended.
const MEMORY_HIGH: f64 = 0.9;

impl Commands {
    /// When the sandbox is near its pids or memory limit, ends the largest
    /// tree of leftovers of a finished command (one per call) and says so
    /// in that command's log. Running commands are never chosen.
    pub(crate) fn relieve_if_pressed(&self) {
        // Only leftovers are ever ended. Without any, nothing is read: at
        // the pids limit (a running fork bomb) even listing `/proc` is
        // slow under gVisor, and would stall the agent every round.
        if !self.has_leftovers() {
            return;
        }
        let pids = cgroup::pids()
            .or_else(|| cgroup::counted_pids(self.settings.borrow().pids_limit))
            .filter(|l| l.used + PIDS_HEADROOM >= l.max);
        let memory = cgroup::memory().filter(|l| l.used as f64 >= l.max as f64 * MEMORY_HIGH);
        if let Some(l) = pids {
            self.relieve(&format!(
                "the sandbox reached its pids limit ({} of {})",
                l.used, l.max
            ));
        } else if let Some(l) = memory {
            self.relieve(&format!(
                "the sandbox neared its memory limit ({} of {} MiB)",
                l.used >> 20,
                l.max >> 20
            ));
        }
    }

    /// Whether a finished command's keeper still watches processes.
    fn has_leftovers(&self) -> bool {
        self.table
            .borrow()
            .values()
            .any(|c| c.ended().is_some() && c.keeper.get().is_some())
    }

    /// Ends the largest leftover tree, if there is one; see
    /// [`Commands::relieve_if_pressed`].
    pub(crate) fn relieve(&self, why: &str) {
        if !self.has_leftovers() {
            return;
        }
        let procs = tree::snapshot();
        let by_memory = why.contains("memory");
        let victim = self
            .table
            .borrow()
            .values()
            .filter(|c| c.ended().is_some())
            .filter_map(|c| {
                let k = c.keeper.get()?;
                let tree = tree::descendants(k, &procs);
                let size = if by_memory {
                    tree.iter().map(|p| p.rss_kb).sum::<u64>()
                } else {
                    tree.len() as u64
                };
                (!tree.is_empty()).then(|| (size, Rc::clone(c)))
            })
            .max_by_key(|(size, c)| (*size, c.meta.started_at_ms));
        if let Some((_, c)) = victim {
            let _ = c.control.try_send(Control::Relieve(why.to_string()));
        }
    }
}
