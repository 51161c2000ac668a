//! The workspace walked on the host. Where its files are read on the host
//! ([`super::host`]), so is its tree: a checkpoint, a restore and a diff
//! against the workspace list every entry, and on the host that walk runs
//! on several threads outside the sandbox's CPU limit, with no stream of
//! entries through the agent (profiled: the agent's walk was two thirds
//! of a checkpoint of 10 changed files among 20,000).
//!
//! The tree is the sandbox's, so hostile input: every directory opens
//! beneath the volume's directory, crossing no symlink, magic link or
//! mount (`openat2`), and nothing else is opened. The walk answers what
//! the agent's would, or nothing: a directory the sandbox user might not
//! read and search ([`sandbox_user_may`]), a name or link target that is
//! not UTF-8 or too long, a tree too deep or too large (special files
//! count against its bound too, as the agent's walk is within the
//! sandbox's CPU limit and this one is not), a panic, or any error (a
//! directory removed meanwhile) leaves the walk to the agent, which
//! gives the answer and the refusal every runtime gives.

use std::ffi::CStr;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;
use sandboxd_proto::{MAX_LINK_TARGET, MAX_SNAPSHOT_DEPTH};

use super::host::{HostTree, sandbox_user_may};
use super::manifest::{Entry, EntryKind};
use crate::workspace_path::WorkspacePath;

/// Threads of one walk, at most: the walk is the kernel's path lookups
/// and `stat`s, which scale with cores.
const MAX_THREADS: usize = 4;

/// What bounds a walk, as the agent's is bounded.
pub(super) struct WalkLimits<'a> {
    pub(super) max_entries: usize,
    /// The workspace's spellings (a path must parse as the agent's do).
    pub(super) dirs: &'a [&'a str],
}

/// Names a walk reads past `max_entries` (special files and names gone
/// before their `stat` are no entries) before it leaves the walk to the
/// agent, which walks within the sandbox's CPU limit.
const MAX_SKIPPED: usize = 10_000;

/// What a walk's threads have read so far.
#[derive(Default)]
struct Counts {
    /// Entries listed.
    listed: AtomicUsize,
    /// Names read, entries or not.
    names: AtomicUsize,
}

/// The directories still to read, shared by a walk's threads.
struct Queue {
    state: Mutex<QueueState>,
    changed: Condvar,
}

struct QueueState {
    /// Paths of directories found and not yet taken ("" is the workspace).
    dirs: Vec<String>,
    /// Directories taken and not yet read.
    busy: usize,
    /// Set once any thread gives up: the others stop.
    gave_up: bool,
}

#[allow(
    clippy::unnecessary_cast,
    reason = "the stat fields are i64 on 64-bit targets, narrower elsewhere"
)]
fn entry(path: String, kind: EntryKind, st: &Stat, target: Option<String>) -> Entry {
    let ns = |secs: i64, nanos: i64| secs.saturating_mul(1_000_000_000).saturating_add(nanos);
    Entry {
        path,
        kind,
        mode: st.st_mode & 0o7777,
        size: if kind == EntryKind::File {
            u64::try_from(st.st_size).unwrap_or(0)
        } else {
            0
        },
        sha256: None,
        target,
        mtime_ns: ns(st.st_mtime as i64, st.st_mtime_nsec as i64),
        ctime_ns: ns(st.st_ctime as i64, st.st_ctime_nsec as i64),
        ino: st.st_ino as u64,
    }
}

impl HostTree {
    /// Opens directory `path` ("" for the workspace) beneath the volume.
    fn open_dir(&self, path: &str) -> Option<OwnedFd> {
        rustix::fs::openat2(
            self.root(),
            if path.is_empty() { "." } else { path },
            OFlags::RDONLY
                | OFlags::DIRECTORY
                | OFlags::NOFOLLOW
                | OFlags::NONBLOCK
                | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH
                | ResolveFlags::NO_SYMLINKS
                | ResolveFlags::NO_MAGICLINKS
                | ResolveFlags::NO_XDEV,
        )
        .ok()
    }

    /// Every entry of the workspace, sorted by path, without hashes, as
    /// the agent's snapshot gives them; `None` leaves the walk to the
    /// agent (see the module's documentation).
    pub(super) fn walk(&self, limits: &WalkLimits<'_>) -> Option<Vec<Entry>> {
        let queue = Queue {
            state: Mutex::new(QueueState {
                dirs: vec![String::new()],
                busy: 0,
                gave_up: false,
            }),
            changed: Condvar::new(),
        };
        let counts = Counts::default();
        let threads = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(MAX_THREADS);
        let parts: Vec<Option<Vec<Entry>>> = std::thread::scope(|s| {
            let others: Vec<_> = (1..threads)
                .map(|_| s.spawn(|| self.walk_part(&queue, &counts, limits)))
                .collect();
            let mut parts = vec![self.walk_part(&queue, &counts, limits)];
            // A thread that panicked gave up its part: the walk did too.
            parts.extend(others.into_iter().map(|t| t.join().ok().flatten()));
            parts
        });
        let mut entries = Vec::with_capacity(counts.listed.load(Ordering::Relaxed));
        for part in parts {
            entries.extend(part?);
        }
        entries.sort_unstable_by(|a, b| a.path.cmp(&b.path));
        Some(entries)
    }

    /// One thread's share of a walk: the entries of the directories it
    /// took, or `None` once any thread gave up.
    fn walk_part(
        &self,
        queue: &Queue,
        counts: &Counts,
        limits: &WalkLimits<'_>,
    ) -> Option<Vec<Entry>> {
        let mut entries = Vec::new();
        let mut state = queue.state.lock().ok()?;
        loop {
            if state.gave_up {
                return None;
            }
            let Some(dir) = state.dirs.pop() else {
                if state.busy == 0 {
                    return Some(entries);
                }
                state = queue.changed.wait(state).ok()?;
                continue;
            };
            state.busy += 1;
            drop(state);
            let mut subdirs = Vec::new();
            // A panic gives up the walk: the others must not wait for
            // this directory's subdirectories.
            let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.read_dir(&dir, limits, counts, &mut entries, &mut subdirs)
            }))
            .ok()
            .flatten();
            state = queue.state.lock().ok()?;
            state.busy -= 1;
            if read.is_none() {
                state.gave_up = true;
            }
            state.dirs.extend(subdirs);
            queue.changed.notify_all();
        }
    }

    /// Adds the entries of directory `dir` to `entries`, and its
    /// directories to `subdirs`.
    fn read_dir(
        &self,
        dir: &str,
        limits: &WalkLimits<'_>,
        counts: &Counts,
        entries: &mut Vec<Entry>,
        subdirs: &mut Vec<String>,
    ) -> Option<()> {
        // The workspace is level 1, as in the agent's walk.
        let depth = if dir.is_empty() {
            1
        } else {
            dir.matches('/').count() + 2
        };
        if depth > MAX_SNAPSHOT_DEPTH {
            return None;
        }
        let mut names = Dir::new(self.open_dir(dir)?).ok()?;
        let st = names.stat().ok()?;
        if !sandbox_user_may(names.fd().ok()?, &st, self.uid(), 0o5) {
            return None;
        }
        // A directory's entry is made from the directory opened: its
        // parent listed it without a `stat`.
        if !dir.is_empty() {
            entries.push(entry(dir.to_string(), EntryKind::Dir, &st, None));
        }
        while let Some(found) = names.read() {
            let found = found.ok()?;
            let name = found.file_name();
            if matches!(name.to_bytes(), b"." | b"..") {
                continue;
            }
            if counts.names.fetch_add(1, Ordering::Relaxed) >= limits.max_entries + MAX_SKIPPED {
                return None;
            }
            let fd = names.fd().ok()?;
            let st = if found.file_type() == FileType::Directory {
                None
            } else {
                match rustix::fs::statat(fd, name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => Some(st),
                    // Removed since the directory was read.
                    Err(Errno::NOENT) => continue,
                    Err(_) => return None,
                }
            };
            let kind = match st.map(|st| FileType::from_raw_mode(st.st_mode)) {
                None | Some(FileType::Directory) => EntryKind::Dir,
                Some(FileType::RegularFile) => EntryKind::File,
                Some(FileType::Symlink) => EntryKind::Symlink,
                // FIFOs, sockets and devices hold no content to keep.
                _ => continue,
            };
            let text = name.to_str().ok()?;
            let path = if dir.is_empty() {
                text.to_string()
            } else {
                format!("{dir}/{text}")
            };
            let plain = WorkspacePath::parse(&path, limits.dirs)
                .is_ok_and(|p| !p.is_root() && p.relative() == path);
            if !plain || counts.listed.fetch_add(1, Ordering::Relaxed) >= limits.max_entries {
                return None;
            }
            let target = match kind {
                EntryKind::Symlink => Some(link_target(fd, name)?),
                EntryKind::Dir => {
                    subdirs.push(path);
                    continue;
                }
                EntryKind::File => None,
            };
            let st = st?;
            entries.push(entry(path, kind, &st, target));
        }
        Some(())
    }
}

/// The target of symlink `name` in `dir`, when the agent's walk would
/// give it.
fn link_target(dir: BorrowedFd<'_>, name: &CStr) -> Option<String> {
    let target = rustix::fs::readlinkat(dir, name, Vec::new()).ok()?;
    let target = target.into_string().ok()?;
    (target.len() <= MAX_LINK_TARGET).then_some(target)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{PermissionsExt, symlink};
    use std::path::Path;

    use super::*;
    use crate::checkpoints::store_files::Scratch;

    const DIRS: &[&str] = &["/workspace"];

    fn walk(dir: &Path, uid: u32, max_entries: usize) -> Option<Vec<Entry>> {
        let tree = HostTree::open(dir, uid).unwrap();
        tree.walk(&WalkLimits {
            max_entries,
            dirs: DIRS,
        })
    }

    /// The uid that owns what this test makes.
    fn me(dir: &Path) -> u32 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(dir).unwrap().uid()
    }

    #[test]
    fn every_entry_is_listed_sorted_with_links_as_links_and_special_files_left_out() {
        let s = Scratch::new("walk");
        let d = s.0.as_path();
        std::fs::create_dir_all(d.join("a/b/c")).unwrap();
        std::fs::create_dir(d.join("empty")).unwrap();
        std::fs::write(d.join("a/b/c/deep.txt"), "deep").unwrap();
        std::fs::write(d.join("top"), "0123456789").unwrap();
        std::fs::set_permissions(d.join("top"), std::fs::Permissions::from_mode(0o750)).unwrap();
        symlink("/etc/passwd", d.join("a/out")).unwrap();
        symlink("b", d.join("a/in")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            d.join("a/fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let got = walk(d, me(d), 100).expect("a walk");
        let listed: Vec<(&str, EntryKind, Option<&str>)> = got
            .iter()
            .map(|e| (e.path.as_str(), e.kind, e.target.as_deref()))
            .collect();
        assert_eq!(
            listed,
            [
                ("a", EntryKind::Dir, None),
                ("a/b", EntryKind::Dir, None),
                ("a/b/c", EntryKind::Dir, None),
                ("a/b/c/deep.txt", EntryKind::File, None),
                ("a/in", EntryKind::Symlink, Some("b")),
                ("a/out", EntryKind::Symlink, Some("/etc/passwd")),
                ("empty", EntryKind::Dir, None),
                ("top", EntryKind::File, None),
            ]
        );
        let top = got.iter().find(|e| e.path == "top").unwrap();
        assert_eq!((top.size, top.mode), (10, 0o750));
        let m = std::fs::symlink_metadata(d.join("top")).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(top.ino, m.ino());
        assert_eq!(top.mtime_ns, m.mtime() * 1_000_000_000 + m.mtime_nsec());
        assert_eq!(got.iter().find(|e| e.path == "a/b").unwrap().size, 0);
    }

    #[test]
    fn a_tree_the_agent_must_judge_is_left_to_it() {
        let s = Scratch::new("walk-refusals");
        let d = s.0.as_path();
        std::fs::create_dir_all(d.join("x/y")).unwrap();
        std::fs::write(d.join("x/y/f"), "f").unwrap();
        // Whatever the umask: another user may list these.
        for dir in [d.to_path_buf(), d.join("x")] {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        // Control: the same tree is walked.
        assert_eq!(walk(d, me(d), 100).map(|e| e.len()), Some(3));
        // More entries than allowed.
        assert!(walk(d, me(d), 2).is_none());
        // A directory its owner may not list, or another user may not.
        std::fs::set_permissions(d.join("x/y"), std::fs::Permissions::from_mode(0o300)).unwrap();
        assert!(walk(d, me(d), 100).is_none(), "owner without read");
        std::fs::set_permissions(d.join("x/y"), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(walk(d, me(d) + 1, 100).is_some(), "others may read 0o755");
        std::fs::set_permissions(d.join("x/y"), std::fs::Permissions::from_mode(0o751)).unwrap();
        assert!(
            walk(d, me(d) + 1, 100).is_none(),
            "others may not list 0o751"
        );
        std::fs::set_permissions(d.join("x/y"), std::fs::Permissions::from_mode(0o705)).unwrap();
        assert!(
            walk(d, me(d) + 1, 100).is_none(),
            "the group may not list 0o705, and the user may be in it"
        );
        std::fs::set_permissions(d.join("x/y"), std::fs::Permissions::from_mode(0o755)).unwrap();
        // A name that is not UTF-8.
        use std::os::unix::ffi::OsStrExt;
        let odd = d.join("x").join(std::ffi::OsStr::from_bytes(b"n\xff"));
        std::fs::write(&odd, "").unwrap();
        assert!(walk(d, me(d), 100).is_none(), "a name that is not UTF-8");
        std::fs::remove_file(&odd).unwrap();
        // A link target that is not UTF-8.
        symlink(std::ffi::OsStr::from_bytes(b"t\xff"), d.join("x/l")).unwrap();
        assert!(walk(d, me(d), 100).is_none(), "a target that is not UTF-8");
        std::fs::remove_file(d.join("x/l")).unwrap();
        assert_eq!(walk(d, me(d), 100).map(|e| e.len()), Some(3));
    }

    #[test]
    fn a_tree_deeper_than_the_agent_walks_is_left_to_it() {
        let s = Scratch::new("walk-deep");
        let mut path = s.0.as_path().to_path_buf();
        for _ in 0..MAX_SNAPSHOT_DEPTH - 1 {
            path.push("d");
        }
        std::fs::create_dir_all(&path).unwrap();
        let uid = me(s.0.as_path());
        assert!(
            walk(s.0.as_path(), uid, 100_000).is_some(),
            "as deep as it walks"
        );
        std::fs::create_dir(path.join("d")).unwrap();
        assert!(
            walk(s.0.as_path(), uid, 100_000).is_none(),
            "one level deeper"
        );
    }
}
