//! One watch of a directory ([`DirWatch`]): its inotify instance, which
//! directory each inotify watch is on, and the kernel's events turned into
//! [`WatchEvent`](sandboxd_proto::WatchEvent)s in its [`EventQueue`].
//!
//! Every directory is reached through descriptors, each opened relative
//! to its parent with `O_NOFOLLOW` (a new one from `/`, along the watched
//! directory's real path), and watched through `/proc/self/fd/N` (that
//! descriptor's own directory, never a path walked again): no symlink is
//! ever followed, one swapped in on the way included. No descriptor is
//! kept once a directory is watched: an open one would hold back the
//! kernel's word that the directory was removed (`IN_DELETE_SELF` comes
//! when its last reference goes). A recursive watch watches each subdirectory as it is found,
//! at the start and whenever one is created or moved in, and reports what
//! the new one already holds as created (things made in it before its
//! watch was in place would be missed otherwise); a directory moved away
//! drops its watches, one removed loses them by itself (`IN_IGNORED`).
//! Past `max_dirs`, or when the kernel refuses a watch (its per-user
//! limit), the directory goes unwatched and an overflow event says so.
//! The temporary files the agent's own writes make are not reported.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;
use sandboxd_proto::{Failure, FailureKind, WatchKind};

use super::queue::EventQueue;
use crate::changes::{at_limit, close_aside, join};

/// A path relative to the watched directory, as bytes (empty: itself).
type Rel = Vec<u8>;

/// How the root is opened, to walk from (each directory below it is opened
/// by [`crate::nofollow::open_dir`], which follows no symlink).
const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// What every directory's watch reports. `EXCL_UNLINK`: nothing about a
/// file after it was removed (a process still writing to it).
const MASK: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::DELETE)
    .union(WatchFlags::MODIFY)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::MOVE_SELF)
    .union(WatchFlags::ONLYDIR)
    .union(WatchFlags::EXCL_UNLINK);

/// Bytes read from the inotify descriptor at once.
const EVENT_BUFFER: usize = 64 * 1024;

/// A subdirectory found and not yet watched: its name in `parent`.
struct Found {
    parent: Rc<OwnedFd>,
    name: Vec<u8>,
    rel: Rel,
}

/// See [the module docs](self).
#[derive(Debug)]
pub(crate) struct DirWatch {
    /// The inotify instance (taken when the watch is dropped, to be closed
    /// aside).
    inotify: Option<OwnedFd>,
    /// The watched directory's real path, from `/`.
    root_path: Vec<u8>,
    root_wd: i32,
    recursive: bool,
    max_dirs: usize,
    /// Which directory each inotify watch is on.
    dirs: HashMap<i32, Rel>,
    pub(crate) queue: EventQueue,
    /// The watched directory was removed or moved away.
    gone: bool,
}

impl DirWatch {
    /// Watches the open directory `root` (and with `recursive` every
    /// directory below it, at most `max_dirs` in all); events wait in a
    /// queue of `max_queued`.
    pub(crate) fn start(
        root: OwnedFd,
        recursive: bool,
        max_dirs: usize,
        max_queued: usize,
    ) -> Result<DirWatch, Failure> {
        let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK).map_err(|e| {
            if at_limit(e) {
                Failure::new(
                    FailureKind::TooMany,
                    "no inotify instance is left for the sandbox's user",
                )
            } else {
                Failure::new(FailureKind::Other, format!("inotify: {e}"))
            }
        })?;
        let root_wd = watch_fd(&fd, &root).map_err(|e| {
            let kind = match e {
                _ if at_limit(e) => FailureKind::TooMany,
                Errno::ACCESS => FailureKind::PermissionDenied,
                _ => FailureKind::Other,
            };
            Failure::new(kind, format!("cannot watch the directory: {e}"))
        })?;
        let root_path =
            rustix::fs::readlink(format!("/proc/self/fd/{}", root.as_raw_fd()), Vec::new())
                .map_err(|e| {
                    Failure::new(FailureKind::Other, format!("the directory's path: {e}"))
                })?
                .into_bytes();
        let mut w = DirWatch {
            inotify: Some(fd),
            root_path,
            root_wd,
            recursive,
            max_dirs: max_dirs.max(1),
            dirs: HashMap::from([(root_wd, Rel::new())]),
            queue: EventQueue::new(max_queued),
            gone: false,
        };
        if recursive {
            let mut found = Vec::new();
            w.list(&Rc::new(root), Rel::new(), false, &mut found);
            w.grow(found, false);
        }
        Ok(w)
    }

    /// The inotify descriptor, to wait for events on.
    pub(crate) fn fd(&self) -> Option<&OwnedFd> {
        self.inotify.as_ref()
    }

    /// The watched directory was removed or moved away: nothing more will
    /// come.
    pub(crate) fn gone(&self) -> bool {
        self.gone
    }

    /// Directories watched now.
    #[cfg(test)]
    pub(crate) fn watched(&self) -> usize {
        self.dirs.len()
    }

    /// Queues `dir`'s entries as created when `report`, and adds its
    /// subdirectories to `found` when the watch is recursive.
    fn list(&mut self, dir: &Rc<OwnedFd>, rel: Rel, report: bool, found: &mut Vec<Found>) {
        if !report && !self.recursive {
            return;
        }
        let Ok(entries) = Dir::read_from(&**dir) else {
            // Not readable: nothing in it can be watched or known.
            return;
        };
        for entry in entries {
            let Ok(entry) = entry else { break };
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let is_dir = match entry.file_type() {
                FileType::Directory => true,
                FileType::Unknown => rustix::fs::statat(&**dir, name, AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory),
                _ => false,
            };
            let path = join(&rel, name);
            if report {
                self.queue.push(WatchKind::Create, &path, is_dir);
            }
            if is_dir && self.recursive {
                found.push(Found {
                    parent: Rc::clone(dir),
                    name: name.to_vec(),
                    rel: path,
                });
            }
        }
    }

    /// Watches the directories in `found` and every one below them, depth
    /// first (the descriptors held are those of one branch); with
    /// `report`, what each holds is queued as created.
    fn grow(&mut self, mut found: Vec<Found>, report: bool) {
        while let Some(f) = found.pop() {
            if self.dirs.len() >= self.max_dirs {
                return self.queue.overflow();
            }
            let Some(ino) = &self.inotify else { return };
            // Gone again, or swapped for a symlink or a file: what happened
            // to it is an event of its own.
            let Ok(fd) = crate::nofollow::open_dir(&*f.parent, f.name.as_slice()) else {
                continue;
            };
            match watch_fd(ino, &fd) {
                Ok(wd) => {
                    self.dirs.insert(wd, f.rel.clone());
                }
                Err(_) => {
                    // Its events would be missed.
                    self.queue.overflow();
                    continue;
                }
            }
            self.list(&Rc::new(fd), f.rel, report, &mut found);
        }
    }

    /// Watches the new directory `rel` and everything below it, reporting
    /// what it holds already.
    fn add_new(&mut self, rel: &[u8]) {
        let path = join(&self.root_path, rel);
        let mut parts: Vec<&[u8]> = path
            .split(|b| *b == b'/')
            .filter(|p| !p.is_empty())
            .collect();
        let Some(name) = parts.pop() else { return };
        let Ok(mut parent) = rustix::fs::open("/", DIR_FLAGS, Mode::empty()) else {
            return self.queue.overflow();
        };
        for part in parts {
            match crate::nofollow::open_dir(&parent, part) {
                Ok(fd) => parent = fd,
                // Its parent went (or was swapped): that is an event too.
                Err(_) => return,
            }
        }
        let found = vec![Found {
            parent: Rc::new(parent),
            name: name.to_vec(),
            rel: rel.to_vec(),
        }];
        self.grow(found, true);
    }

    /// Drops the watches of directory `rel` and those below it (it moved
    /// away; if it moved to somewhere watched, it is watched anew there).
    fn drop_below(&mut self, rel: &[u8]) {
        let mut prefix = rel.to_vec();
        prefix.push(b'/');
        let gone: Vec<i32> = self
            .dirs
            .iter()
            .filter(|(_, d)| d.as_slice() == rel || d.starts_with(&prefix))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in gone {
            self.dirs.remove(&wd);
            if let Some(ino) = &self.inotify {
                let _ = inotify::remove_watch(ino, wd);
            }
        }
    }

    /// Reads every event queued now into the queue.
    pub(crate) fn read_events(&mut self) {
        let mut buf = vec![MaybeUninit::<u8>::uninit(); EVENT_BUFFER];
        let mut events: Vec<(i32, ReadFlags, Option<Vec<u8>>)> = Vec::new();
        loop {
            let (more, failed) = {
                let Some(ino) = &self.inotify else { return };
                let mut reader = inotify::Reader::new(ino, &mut buf);
                loop {
                    match reader.next() {
                        Ok(ev) => events.push((
                            ev.wd(),
                            ev.events(),
                            ev.file_name().map(|n| n.to_bytes().to_vec()),
                        )),
                        Err(Errno::AGAIN) => break (false, false),
                        Err(Errno::INTR) => break (true, false),
                        Err(_) => break (false, true),
                    }
                    if reader.is_buffer_empty() {
                        break (true, false);
                    }
                }
            };
            if failed {
                self.queue.overflow();
            }
            for (wd, mask, name) in events.drain(..) {
                self.on_event(wd, mask, name);
            }
            if !more {
                return;
            }
        }
    }

    fn on_event(&mut self, wd: i32, mask: ReadFlags, name: Option<Vec<u8>>) {
        if self.gone {
            return;
        }
        if mask.contains(ReadFlags::QUEUE_OVERFLOW) {
            return self.queue.overflow();
        }
        if mask.contains(ReadFlags::IGNORED) {
            // The kernel dropped the watch: its directory was removed.
            self.dirs.remove(&wd);
            self.gone |= wd == self.root_wd;
            return;
        }
        if wd == self.root_wd && mask.intersects(ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF) {
            self.gone = true;
            return;
        }
        // An event about a watched subdirectory itself carries no name:
        // its parent's event said it. One of a watch dropped (moved away)
        // has no directory any more.
        let (Some(name), Some(dir)) = (name, self.dirs.get(&wd)) else {
            return;
        };
        // A write's temporary file is the agent's own, not the user's: a
        // written file shows as its final name, created (it is renamed in).
        if crate::temp_name::is_temp_name(&name) {
            return;
        }
        let path = join(dir, &name);
        let is_dir = mask.contains(ReadFlags::ISDIR);
        if mask.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
            self.queue.push(WatchKind::Create, &path, is_dir);
            if is_dir && self.recursive {
                self.add_new(&path);
            }
        } else if mask.contains(ReadFlags::MODIFY) {
            self.queue.push(WatchKind::Write, &path, is_dir);
        } else if mask.contains(ReadFlags::ATTRIB) {
            self.queue.push(WatchKind::Chmod, &path, is_dir);
        } else if mask.contains(ReadFlags::DELETE) {
            self.queue.push(WatchKind::Remove, &path, is_dir);
        } else if mask.contains(ReadFlags::MOVED_FROM) {
            self.queue.push(WatchKind::Rename, &path, is_dir);
            if is_dir && self.recursive {
                self.drop_below(&path);
            }
        }
    }
}

/// Watches the directory `dir` is open on: through its descriptor's
/// `/proc/self/fd` link, which names that directory and no path.
fn watch_fd(inotify: &OwnedFd, dir: &OwnedFd) -> rustix::io::Result<i32> {
    inotify::add_watch(inotify, format!("/proc/self/fd/{}", dir.as_raw_fd()), MASK)
}

impl Drop for DirWatch {
    /// Closing an inotify instance waits for the kernel's grace period:
    /// aside, not on the agent's thread.
    fn drop(&mut self) {
        if let Some(fd) = self.inotify.take() {
            close_aside(fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::{Duration, Instant};

    use sandboxd_proto::WatchEvent;

    use super::*;

    fn open(dir: &Path) -> OwnedFd {
        rustix::fs::open(dir, DIR_FLAGS, Mode::empty()).expect("open")
    }

    /// Reads events until `done` holds of everything read so far, or 5 s.
    fn read_until(w: &mut DirWatch, done: impl Fn(&[WatchEvent]) -> bool) -> Vec<WatchEvent> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut all = Vec::new();
        loop {
            w.read_events();
            all.extend(w.queue.take());
            if done(&all) || Instant::now() > deadline {
                return all;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn has(events: &[WatchEvent], kind: WatchKind, path: &str) -> bool {
        events.iter().any(|e| e.kind == kind && e.path == path)
    }

    #[test]
    fn a_recursive_watch_follows_new_directories_and_drops_moved_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::create_dir(root.join("old")).expect("mkdir");
        let mut w = DirWatch::start(open(root), true, 100, 1000).expect("start");
        assert_eq!(w.watched(), 2);
        // Made at once, before the watch of `new` can be in place: the
        // scan of `new` reports what it holds.
        std::fs::create_dir_all(root.join("new/deep")).expect("mkdir");
        std::fs::write(root.join("new/deep/f"), b"1").expect("write");
        let got = read_until(&mut w, |e| has(e, WatchKind::Create, "new/deep/f"));
        assert!(has(&got, WatchKind::Create, "new"), "{got:?}");
        assert!(has(&got, WatchKind::Create, "new/deep"), "{got:?}");
        assert_eq!(
            got.iter()
                .filter(|e| e.kind == WatchKind::Create && e.path == "new/deep/f")
                .count(),
            1,
            "created once: {got:?}"
        );
        assert_eq!(w.watched(), 4);
        std::fs::write(root.join("old/g"), b"2").expect("write");
        let got = read_until(&mut w, |e| has(e, WatchKind::Write, "old/g"));
        assert!(has(&got, WatchKind::Create, "old/g"), "{got:?}");
        // Moved: the old name is a rename, the new one a create, and the
        // moved directory's events go by its new name.
        std::fs::rename(root.join("old"), root.join("moved")).expect("mv");
        let got = read_until(&mut w, |e| has(e, WatchKind::Create, "moved/g"));
        assert!(has(&got, WatchKind::Rename, "old"), "{got:?}");
        assert!(has(&got, WatchKind::Create, "moved"), "{got:?}");
        std::fs::remove_file(root.join("moved/g")).expect("rm");
        let got = read_until(&mut w, |e| has(e, WatchKind::Remove, "moved/g"));
        assert!(has(&got, WatchKind::Remove, "moved/g"), "{got:?}");
        assert_eq!(w.watched(), 4);
        // Removed: its watch goes with it.
        std::fs::remove_dir_all(root.join("new")).expect("rm");
        let deadline = Instant::now() + Duration::from_secs(5);
        while w.watched() != 2 && Instant::now() < deadline {
            w.read_events();
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(w.watched(), 2, "root and moved");
    }

    #[test]
    fn a_writes_temporary_file_is_not_reported() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let mut w = DirWatch::start(open(root), false, 100, 1000).expect("start");
        let temp = root.join(".sandboxd-0123456789abcdef");
        std::fs::write(&temp, b"1").expect("write");
        std::fs::rename(&temp, root.join("x.txt")).expect("mv");
        // A name that only looks alike is the user's: the control.
        std::fs::write(root.join(".sandboxd-notatemp"), b"1").expect("write");
        let got = read_until(&mut w, |e| has(e, WatchKind::Create, ".sandboxd-notatemp"));
        assert!(has(&got, WatchKind::Create, "x.txt"), "{got:?}");
        assert!(
            got.iter().all(|e| e.path != ".sandboxd-0123456789abcdef"),
            "{got:?}"
        );
    }

    #[test]
    fn a_flat_watch_ignores_what_happens_in_subdirectories() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::create_dir(root.join("sub")).expect("mkdir");
        let mut w = DirWatch::start(open(root), false, 100, 1000).expect("start");
        assert_eq!(w.watched(), 1);
        std::fs::write(root.join("sub/inner"), b"1").expect("write");
        std::fs::write(root.join("top"), b"1").expect("write");
        let got = read_until(&mut w, |e| has(e, WatchKind::Create, "top"));
        assert!(has(&got, WatchKind::Create, "top"), "{got:?}");
        assert!(got.iter().all(|e| !e.path.starts_with("sub/")), "{got:?}");
    }

    #[test]
    fn symlinks_are_never_followed() {
        let outside = tempfile::tempdir().expect("tempdir");
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::os::unix::fs::symlink(outside.path(), root.join("link")).expect("symlink");
        let mut w = DirWatch::start(open(root), true, 100, 1000).expect("start");
        assert_eq!(w.watched(), 1, "the link is not a directory to watch");
        std::fs::write(outside.path().join("secret"), b"1").expect("write");
        std::fs::write(root.join("marker"), b"1").expect("write");
        let got = read_until(&mut w, |e| has(e, WatchKind::Create, "marker"));
        assert!(got.iter().all(|e| !e.path.contains("secret")), "{got:?}");
    }

    #[test]
    fn past_max_dirs_a_directory_is_an_overflow() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        for d in ["a", "b", "c"] {
            std::fs::create_dir(root.join(d)).expect("mkdir");
        }
        let mut w = DirWatch::start(open(root), true, 2, 1000).expect("start");
        assert_eq!(w.watched(), 2);
        let got = w.queue.take();
        assert_eq!(
            got.iter().map(|e| e.kind).collect::<Vec<_>>(),
            [WatchKind::Overflow]
        );
    }

    #[test]
    fn the_watched_directory_going_ends_the_watch() {
        let parent = tempfile::tempdir().expect("tempdir");
        let root = parent.path().join("w");
        std::fs::create_dir(&root).expect("mkdir");
        let mut w = DirWatch::start(open(&root), true, 100, 1000).expect("start");
        std::fs::remove_dir(&root).expect("rmdir");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !w.gone() && Instant::now() < deadline {
            w.read_events();
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(w.gone());
    }
}
