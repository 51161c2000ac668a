//! The sandbox's own cgroup, read from inside (the container has a cgroup
//! namespace of its own): how close it is to its pids and memory limits,
//! and how many processes the kernel's OOM killer has ended. Both cgroup
//! v2 and v1 layouts are read. Under gVisor these files do not show the
//! real limits, and every reading here is `None`; there the processes
//! are counted instead, against the limit sandboxd said
//! ([`counted_pids`]).

use std::path::Path;

/// Where the sandbox stands against one limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Level {
    pub(crate) used: u64,
    pub(crate) max: u64,
}

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A `name value` line's value in a flat keyed file.
fn keyed(path: &str, name: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == name).then(|| v.trim().parse().ok()).flatten()
    })
}

/// A limit worth watching: set, and not the "unlimited" marker.
fn level(used: Option<u64>, max: Option<u64>) -> Option<Level> {
    let (used, max) = (used?, max?);
    (max > 0 && max < i64::MAX as u64 / 2).then_some(Level { used, max })
}

fn v2() -> bool {
    Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// Processes against the pids limit.
pub(crate) fn pids() -> Option<Level> {
    if v2() {
        level(
            read_u64("/sys/fs/cgroup/pids.current"),
            read_u64("/sys/fs/cgroup/pids.max"),
        )
    } else {
        level(
            read_u64("/sys/fs/cgroup/pids/pids.current"),
            read_u64("/sys/fs/cgroup/pids/pids.max"),
        )
    }
}

/// The processes in the sandbox (as `/proc` lists them; threads are not
/// counted) against `limit`, when it is known (not 0).
pub(crate) fn counted_pids(limit: u64) -> Option<Level> {
    if limit == 0 {
        return None;
    }
    let used = std::fs::read_dir("/proc")
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .count();
    level(Some(used as u64), Some(limit))
}

/// Memory that cannot simply be reclaimed (not page cache) against the
/// memory limit.
pub(crate) fn memory() -> Option<Level> {
    if v2() {
        level(
            keyed("/sys/fs/cgroup/memory.stat", "anon"),
            read_u64("/sys/fs/cgroup/memory.max"),
        )
    } else {
        level(
            keyed("/sys/fs/cgroup/memory/memory.stat", "total_rss"),
            read_u64("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
        )
    }
}

/// How many processes the OOM killer has ended in this sandbox so far.
pub(crate) fn oom_kills() -> Option<u64> {
    if v2() {
        keyed("/sys/fs/cgroup/memory.events", "oom_kill")
    } else {
        keyed("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlimited_is_not_a_level() {
        assert_eq!(level(Some(1), Some(u64::MAX)), None);
        assert_eq!(level(Some(1), Some(i64::MAX as u64)), None);
        assert_eq!(level(Some(1), None), None);
        assert_eq!(level(Some(3), Some(10)), Some(Level { used: 3, max: 10 }));
    }

    #[test]
    fn counted_pids_count_this_process_and_need_a_limit() {
        assert_eq!(counted_pids(0), None, "no limit known, no level");
        let l = counted_pids(1_000_000).expect("a level");
        assert_eq!(l.max, 1_000_000);
        // This test's own process is one of them; its threads are not.
        let me = std::process::id().to_string();
        assert!(std::path::Path::new("/proc").join(me).exists());
        assert!(l.used >= 1, "{l:?}");
    }
}
