//! The events of one watch waiting to be sent ([`EventQueue`]): in order,
//! repeats folded, bounded. A create, write or chmod of a path whose last
//! queued event is the same is dropped, so a large write (the kernel says
//! "modified" per `write(2)`) is one event per send, and a file found by
//! the scan of a new directory and also named by the kernel is created
//! once. Past the bound the rest are dropped until the queue is taken, and
//! one overflow event says so.

use std::collections::HashMap;

use sandboxd_proto::{MAX_WATCH_PATH, WatchEvent, WatchKind};

/// See [the module docs](self).
#[derive(Debug)]
pub(crate) struct EventQueue {
    events: Vec<WatchEvent>,
    /// Each path's last event in `events`.
    last: HashMap<String, usize>,
    max: usize,
    /// Events were dropped since the last take (the overflow event is
    /// queued).
    overflowed: bool,
}

impl EventQueue {
    /// A queue of at most `max` events (and the overflow event after them).
    pub(crate) fn new(max: usize) -> EventQueue {
        EventQueue {
            events: Vec::new(),
            last: HashMap::new(),
            max: max.max(1),
            overflowed: false,
        }
    }

    /// Queues what happened to `path` (relative to the watched directory;
    /// bytes, shown lossily when not UTF-8).
    pub(crate) fn push(&mut self, kind: WatchKind, path: &[u8], is_dir: bool) {
        if self.overflowed {
            return;
        }
        if path.len() > MAX_WATCH_PATH {
            // Too long to report: that something happened is all there is.
            return self.overflow();
        }
        let path = String::from_utf8_lossy(path).into_owned();
        let folds = matches!(
            kind,
            WatchKind::Create | WatchKind::Write | WatchKind::Chmod
        );
        if folds
            && let Some(&i) = self.last.get(&path)
            && self.events[i].kind == kind
        {
            return;
        }
        if self.events.len() >= self.max {
            return self.overflow();
        }
        self.last.insert(path.clone(), self.events.len());
        self.events.push(WatchEvent { kind, path, is_dir });
    }

    /// Events were lost: one overflow event says so, and nothing more is
    /// queued until the queue is taken.
    pub(crate) fn overflow(&mut self) {
        if self.overflowed {
            return;
        }
        self.overflowed = true;
        self.events.push(WatchEvent {
            kind: WatchKind::Overflow,
            path: String::new(),
            is_dir: false,
        });
    }

    /// Everything queued, oldest first; the queue starts over empty.
    pub(crate) fn take(&mut self) -> Vec<WatchEvent> {
        self.last.clear();
        self.overflowed = false;
        std::mem::take(&mut self.events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(events: &[WatchEvent]) -> Vec<(WatchKind, &str)> {
        events.iter().map(|e| (e.kind, e.path.as_str())).collect()
    }

    #[test]
    fn repeats_of_a_path_fold_until_something_else_happens_to_it() {
        use WatchKind::*;
        let mut q = EventQueue::new(100);
        q.push(Create, b"a", false);
        // A 1 MiB write: 256 "modified" of 4 KiB each.
        for _ in 0..256 {
            q.push(Write, b"a", false);
        }
        q.push(Write, b"b", false);
        q.push(Create, b"a", false);
        q.push(Chmod, b"a", false);
        q.push(Chmod, b"a", false);
        q.push(Write, b"a", false);
        q.push(Remove, b"a", false);
        q.push(Create, b"a", false);
        assert_eq!(
            kinds(&q.take()),
            [
                (Create, "a"),
                (Write, "a"),
                (Write, "b"),
                (Create, "a"),
                (Chmod, "a"),
                (Write, "a"),
                (Remove, "a"),
                (Create, "a"),
            ]
        );
        // A take starts a new window: the same write is news again.
        q.push(Write, b"a", false);
        assert_eq!(kinds(&q.take()), [(Write, "a")]);
    }

    #[test]
    fn past_its_bound_the_queue_says_overflow_once_and_drops_the_rest() {
        use WatchKind::*;
        let mut q = EventQueue::new(3);
        for name in ["a", "b", "c", "d", "e"] {
            q.push(Create, name.as_bytes(), false);
        }
        q.overflow();
        assert_eq!(
            kinds(&q.take()),
            [(Create, "a"), (Create, "b"), (Create, "c"), (Overflow, "")]
        );
        q.push(Remove, b"a", false);
        assert_eq!(kinds(&q.take()), [(Remove, "a")], "a take clears it");
    }

    #[test]
    fn a_path_too_long_to_report_is_an_overflow_and_names_are_shown_lossily() {
        use WatchKind::*;
        let mut q = EventQueue::new(10);
        q.push(Create, b"ok\xff", false);
        q.push(Write, &[b'x'; MAX_WATCH_PATH + 1], false);
        assert_eq!(kinds(&q.take()), [(Create, "ok\u{fffd}"), (Overflow, "")]);
    }
}
