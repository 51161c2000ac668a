//! Process trees read from /proc: who descends from whom, and how much
//! memory a tree holds. Used to end a command's tree (its keeper is the
//! root: as a subreaper it inherits every orphan of the tree, so nothing
//! of the tree lives outside it) and to pick which leftover tree to end
//! when the sandbox runs out of room.

use std::collections::HashMap;

use rustix::process::{Pid, Signal};

/// One process as /proc shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Proc {
    pub(crate) pid: i32,
    pub(crate) ppid: i32,
    pub(crate) rss_kb: u64,
}

/// Parses `/proc/PID/stat`. The name is in parentheses and may hold
/// spaces and parentheses itself, so fields are counted after the last
/// `)`: state, ppid, … rss (the 22nd after it, in pages).
fn parse_stat(text: &str, page_kb: u64) -> Option<Proc> {
    let (head, tail) = text.rsplit_once(')')?;
    let pid = head.split_whitespace().next()?.parse().ok()?;
    let fields: Vec<&str> = tail.split_whitespace().collect();
    Some(Proc {
        pid,
        ppid: fields.get(1)?.parse().ok()?,
        rss_kb: fields.get(21)?.parse::<u64>().ok()?.saturating_mul(page_kb),
    })
}

/// Every process visible now.
pub(crate) fn snapshot() -> Vec<Proc> {
    let page_kb = (rustix::param::page_size() / 1024) as u64;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let name = e.ok()?.file_name();
        let name = name.to_str()?;
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        // A process may end between listing and reading: skip it.
        let text = std::fs::read_to_string(format!("/proc/{name}/stat")).ok()?;
        parse_stat(&text, page_kb)
    })
    .collect()
}

/// The processes below `root` (not `root` itself).
pub(crate) fn descendants(root: i32, procs: &[Proc]) -> Vec<Proc> {
    let mut children: HashMap<i32, Vec<Proc>> = HashMap::new();
    for p in procs {
        children.entry(p.ppid).or_default().push(*p);
    }
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(pid) = todo.pop() {
        for c in children.get(&pid).into_iter().flatten() {
            // /proc can race a pid reuse into a cycle; never loop.
            if c.pid != root && !out.iter().any(|o: &Proc| o.pid == c.pid) {
                out.push(*c);
                todo.push(c.pid);
            }
        }
    }
    out
}

/// Sends `sig` to each of `pids`; ones already gone are fine.
pub(crate) fn signal_all(pids: impl IntoIterator<Item = i32>, sig: Signal) {
    for pid in pids {
        if let Some(pid) = Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(pid, sig);
        }
    }
}

/// Sends `sig` to every process in the process group `pgid` at once: one
/// call, however many processes (under gVisor, reading `/proc` for each
/// of a fork bomb's hundreds of processes takes seconds).
pub(crate) fn signal_group(pgid: i32, sig: Signal) {
    if let Some(pgid) = Pid::from_raw(pgid) {
        let _ = rustix::process::kill_process_group(pgid, sig);
    }
}

/// Whether the process group `pgid` has any member (zombies included).
pub(crate) fn group_has_members(pgid: i32) -> bool {
    Pid::from_raw(pgid).is_some_and(|pgid| {
        rustix::process::test_kill_process_group(pgid) != Err(rustix::io::Errno::SRCH)
    })
}

/// One round against a tree that must end: stop every process (a stopped
/// process cannot fork, so a fork bomb cannot outrun the round), then
/// kill them all. Returns how many there were.
pub(crate) fn stop_and_kill_round(root: i32) -> usize {
    let procs: Vec<i32> = descendants(root, &snapshot())
        .into_iter()
        .map(|p| p.pid)
        .collect();
    signal_all(procs.iter().copied(), Signal::STOP);
    signal_all(procs.iter().copied(), Signal::KILL);
    procs.len()
}

/// Reaps every child of this process that has ended (without waiting).
pub(crate) fn reap() {
    while let Ok(Some(_)) = rustix::process::wait(rustix::process::WaitOptions::NOHANG) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_names_parse() {
        let line = "4242 (a) b (c)) S 17 4242 4242 0 -1 4194560 150 0 0 0 1 2 0 0 20 0 1 0 123 10936320 689 18446744073709551615";
        assert_eq!(
            parse_stat(line, 4),
            Some(Proc {
                pid: 4242,
                ppid: 17,
                rss_kb: 2756
            })
        );
        assert_eq!(parse_stat("garbage", 4), None);
    }

    #[test]
    fn descendants_follow_the_tree_only() {
        let p = |pid, ppid| Proc {
            pid,
            ppid,
            rss_kb: 0,
        };
        let procs = [p(1, 0), p(10, 1), p(11, 10), p(12, 11), p(20, 1), p(13, 10)];
        let mut d: Vec<i32> = descendants(10, &procs).iter().map(|p| p.pid).collect();
        d.sort();
        assert_eq!(d, [11, 12, 13]);
        assert!(descendants(12, &procs).is_empty());
        let cycle = [p(5, 6), p(6, 5)];
        assert_eq!(descendants(5, &cycle).len(), 1, "a cycle ends");
    }

    #[test]
    fn this_process_is_in_the_snapshot() {
        let me = std::process::id() as i32;
        let all = snapshot();
        assert!(all.iter().any(|p| p.pid == me && p.rss_kb > 0));
    }
}
