//! One command's watch of the workspace ([`Watch`]): the listing at the
//! start (the walk that also puts a watch on every directory, within the
//! sandbox's budget), the paths inotify names while the command runs, and
//! the report made at the end from both, or from a second walk when
//! inotify could not be used or events were lost. The paths kept are
//! bounded by [`MAX_PATHS`] and [`MAX_PATH_BYTES`].

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use sandboxd_proto::{ChangeKind, ChangeMethod, ChangesSpec};

use super::budget::WatchBudget;
use super::inotify::{Inotify, at_limit, close_aside};
use super::report::{Collected, Rel, Report};

/// Most paths kept, the start listing and the paths events named together.
pub(super) const MAX_PATHS: usize = 250_000;
/// Most bytes of those paths.
pub(super) const MAX_PATH_BYTES: usize = 32 << 20;
/// How far file times may lag the clock read at the start (the kernel
/// stamps files from a clock that ticks every few milliseconds).
pub(super) const CLOCK_MARGIN: Duration = Duration::from_millis(20);
/// Bytes read from the inotify descriptor at once.
const EVENT_BUFFER: usize = 64 * 1024;

/// A file time in nanoseconds since the epoch.
type Nanos = i128;

fn nanos(t: SystemTime) -> Nanos {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as Nanos,
        Err(e) => -(e.duration().as_nanos() as Nanos),
    }
}

/// `name` in directory `dir` (both relative; `dir` empty: the top).
pub(crate) fn join(dir: &[u8], name: &[u8]) -> Rel {
    let mut p = Vec::with_capacity(dir.len() + 1 + name.len());
    if !dir.is_empty() {
        p.extend_from_slice(dir);
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

/// See [the module docs](super).
#[derive(Debug)]
pub(crate) struct Watch {
    root: PathBuf,
    ignore: HashSet<Vec<u8>>,
    max: usize,
    /// The clock when the walk began.
    start: Nanos,
    /// Files (every entry but directories) at the start, sorted.
    before: Vec<Rel>,
    /// Paths an event named.
    touched: HashSet<Rel>,
    /// Path bytes and entries kept so far, and the most entries.
    kept_bytes: usize,
    kept: usize,
    max_paths: usize,
    /// `None`: scanning (inotify could not be used).
    pub(super) inotify: Option<Inotify>,
    budget: Rc<WatchBudget>,
    /// Events were lost: the end is a walk.
    pub(super) lost: bool,
    /// Something could not be known (a directory not readable, the start
    /// listing cut at the cap).
    incomplete: bool,
    /// The start walk is on.
    starting: bool,
}

impl Watch {
    /// Lists and watches the workspace, within `budget`; call before the
    /// command starts.
    pub(crate) fn start(workspace: &str, spec: &ChangesSpec, budget: &Rc<WatchBudget>) -> Watch {
        Watch::start_keeping(workspace, spec, MAX_PATHS, budget)
    }

    /// [`Watch::start`], keeping at most `max_paths` paths.
    fn start_keeping(
        workspace: &str,
        spec: &ChangesSpec,
        max_paths: usize,
        budget: &Rc<WatchBudget>,
    ) -> Watch {
        let inotify = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)
            .ok()
            .map(|fd| Inotify {
                fd,
                dirs: HashMap::new(),
                live: HashSet::new(),
            });
        let mut w = Watch {
            root: PathBuf::from(workspace),
            ignore: spec.ignore.iter().map(|n| n.as_bytes().to_vec()).collect(),
            max: spec.max as usize,
            start: nanos(SystemTime::now()),
            before: Vec::new(),
            touched: HashSet::new(),
            kept_bytes: 0,
            kept: 0,
            max_paths,
            inotify,
            budget: Rc::clone(budget),
            lost: false,
            incomplete: false,
            starting: true,
        };
        let mut before = Vec::new();
        w.walk(Vec::new(), &mut |w, file, _| {
            if w.keep(&file) {
                before.push(file);
            } else {
                w.incomplete = true;
            }
        });
        before.sort_unstable();
        w.before = before;
        w.starting = false;
        w
    }

    /// Counts a path against the caps; false when it does not fit.
    fn keep(&mut self, path: &[u8]) -> bool {
        if self.kept >= self.max_paths || self.kept_bytes + path.len() > MAX_PATH_BYTES {
            return false;
        }
        self.kept += 1;
        self.kept_bytes += path.len();
        true
    }

    /// Walks the tree at `top` (relative; empty: the workspace), skipping
    /// ignored directories and not following symlinks, watching each
    /// directory while inotify is in use, and calls `file` with every
    /// entry that is not a directory (and its metadata when `file` needs
    /// it: see [`Watch::rescan`]).
    fn walk(&mut self, top: Rel, file: &mut dyn FnMut(&mut Watch, Rel, Option<std::fs::Metadata>)) {
        self.walk_with(top, false, file);
    }

    fn walk_with(
        &mut self,
        top: Rel,
        with_metadata: bool,
        file: &mut dyn FnMut(&mut Watch, Rel, Option<std::fs::Metadata>),
    ) {
        let mut dirs = vec![top];
        while let Some(dir) = dirs.pop() {
            let abs = self.abs(&dir);
            self.watch_dir(&abs, &dir);
            let Ok(entries) = std::fs::read_dir(&abs) else {
                self.incomplete = true;
                continue;
            };
            for entry in entries {
                let Ok(entry) = entry else {
                    self.incomplete = true;
                    continue;
                };
                let name = entry.file_name();
                let path = join(&dir, name.as_bytes());
                let Ok(kind) = entry.file_type() else {
                    self.incomplete = true;
                    continue;
                };
                if kind.is_dir() {
                    if !self.ignore.contains(name.as_bytes()) {
                        dirs.push(path);
                    }
                } else {
                    let meta = with_metadata
                        .then(|| std::fs::symlink_metadata(entry.path()).ok())
                        .flatten();
                    file(self, path, meta);
                }
            }
        }
    }

    fn abs(&self, rel: &[u8]) -> PathBuf {
        if rel.is_empty() {
            self.root.clone()
        } else {
            self.root.join(OsStr::from_bytes(rel))
        }
    }

    /// Puts a watch on a directory (the same one again if it has one:
    /// then it now goes by `rel`). At a per-user limit or past the
    /// budget: at the start, inotify is given up for a scan; later, events
    /// are lost.
    fn watch_dir(&mut self, abs: &Path, rel: &[u8]) {
        let Some(ino) = &mut self.inotify else {
            return;
        };
        // Taken before the kernel is asked, given back if it is not a new
        // watch: the budget is never exceeded, even for a moment.
        if !self.budget.take() {
            if self.starting {
                self.stop_inotify();
            } else {
                self.lost = true;
            }
            return;
        }
        let mask = WatchFlags::CREATE
            | WatchFlags::DELETE
            | WatchFlags::MODIFY
            | WatchFlags::ATTRIB
            | WatchFlags::MOVED_FROM
            | WatchFlags::MOVED_TO
            | WatchFlags::ONLYDIR
            | WatchFlags::DONT_FOLLOW;
        let added = inotify::add_watch(&ino.fd, abs, mask);
        match added {
            Ok(wd) => {
                ino.dirs.insert(wd, rel.to_vec());
                if !ino.live.insert(wd) {
                    self.budget.give_back(1);
                }
                return;
            }
            // Closing the instance removes the watches made so far.
            Err(e) if at_limit(e) && self.starting => self.stop_inotify(),
            // Not readable (its listing fails too): what is in it is not
            // known either way.
            Err(_) if self.starting => self.incomplete = true,
            Err(_) => self.lost = true,
        }
        self.budget.give_back(1);
    }

    /// Gives inotify up (closing the instance here, which removes its
    /// watches) and its watches back to the budget: the report will be a
    /// scan.
    fn stop_inotify(&mut self) {
        if let Some(fd) = self.release() {
            drop(fd);
        }
    }

    /// Takes the instance out, its watches given back to the budget; the
    /// caller closes it.
    fn release(&mut self) -> Option<OwnedFd> {
        let ino = self.inotify.take()?;
        self.budget.give_back(ino.live.len());
        Some(ino.fd)
    }

    /// Records that an event named `path`.
    fn touch(&mut self, path: Rel) {
        if self.lost || self.touched.contains(&path) {
            return;
        }
        if self.keep(&path) {
            self.touched.insert(path);
        } else {
            // The end walks the workspace instead.
            self.lost = true;
        }
    }

    /// Reads every event queued now.
    pub(crate) fn read_events(&mut self) {
        let mut buf = vec![MaybeUninit::<u8>::uninit(); EVENT_BUFFER];
        let mut events: Vec<(i32, ReadFlags, Option<Rel>)> = Vec::new();
        loop {
            let (more, failed) = {
                let Some(ino) = &self.inotify else { return };
                let mut reader = inotify::Reader::new(&ino.fd, &mut buf);
                loop {
                    match reader.next() {
                        Ok(ev) => events.push((
                            ev.wd(),
                            ev.events(),
                            ev.file_name().map(|n| n.to_bytes().to_vec()),
                        )),
                        Err(rustix::io::Errno::AGAIN) => break (false, false),
                        Err(rustix::io::Errno::INTR) => break (true, false),
                        Err(_) => break (false, true),
                    }
                    if reader.is_buffer_empty() {
                        break (true, false);
                    }
                }
            };
            self.lost |= failed;
            for (wd, mask, name) in events.drain(..) {
                self.on_event(wd, mask, name);
            }
            if !more {
                return;
            }
        }
    }

    fn on_event(&mut self, wd: i32, mask: ReadFlags, name: Option<Rel>) {
        if mask.contains(ReadFlags::QUEUE_OVERFLOW) {
            self.lost = true;
            return;
        }
        let Some(ino) = &mut self.inotify else { return };
        if mask.contains(ReadFlags::IGNORED) {
            // The kernel removed the watch (its directory went): one more
            // is free for this sandbox.
            ino.dirs.remove(&wd);
            if ino.live.remove(&wd) {
                self.budget.give_back(1);
            }
            return;
        }
        if self.lost {
            // The end walks the workspace: events add nothing.
            return;
        }
        // Events about a watched directory itself carry no name.
        let (Some(dir), Some(name)) = (ino.dirs.get(&wd), name) else {
            return;
        };
        let path = join(dir, &name);
        if !mask.contains(ReadFlags::ISDIR) {
            return self.touch(path);
        }
        if self.ignore.contains(&name) {
            return;
        }
        if mask.intersects(ReadFlags::MOVED_FROM) {
            // Its watches go by another path now (or none in the
            // workspace); each is named again if it shows up here. The
            // files it held at the start are gone from here.
            let mut prefix = path.clone();
            prefix.push(b'/');
            ino.dirs
                .retain(|_, d| *d != path && !d.starts_with(&prefix));
            let from = self.before.partition_point(|p| p < &prefix);
            let gone: Vec<Rel> = self.before[from..]
                .iter()
                .take_while(|p| p.starts_with(&prefix))
                .cloned()
                .collect();
            for p in gone {
                self.touch(p);
            }
        } else if mask.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
            // Files may be in it before its watch is: all it holds counts.
            self.walk(path, &mut |w, file, _| w.touch(file));
        }
    }

    /// Ends the watch and says what changed.
    pub(crate) fn conclude(mut self) -> Report {
        self.read_events();
        let method = if self.inotify.is_some() {
            ChangeMethod::Inotify
        } else {
            ChangeMethod::Scan
        };
        // The watches go now, not when the report is read; the close itself
        // waits on the kernel, so it happens aside.
        if let Some(fd) = self.release() {
            close_aside(fd);
        }
        let mut out = Collected::new(self.max);
        if method == ChangeMethod::Scan || self.lost {
            self.rescan(&mut out);
        } else {
            for path in std::mem::take(&mut self.touched) {
                let existed = self.before.binary_search(&path).is_ok();
                let now = std::fs::symlink_metadata(self.abs(&path))
                    .ok()
                    .filter(|m| !m.is_dir());
                match (existed, now) {
                    (false, Some(m)) => out.push(path, ChangeKind::Created, Some(m.len())),
                    (true, Some(m)) => out.push(path, ChangeKind::Modified, Some(m.len())),
                    (true, None) => out.push(path, ChangeKind::Deleted, None),
                    (false, None) => {}
                }
            }
        }
        let complete = !self.incomplete && !out.unsure;
        let (changes, more) = out.finish();
        Report {
            changes,
            more,
            method,
            complete,
        }
    }

    /// The end as a walk: files not in the start listing are created,
    /// files in it not found now deleted, and files in both modified when
    /// their ctime is after the start or an event named them.
    fn rescan(&mut self, out: &mut Collected) {
        let mut seen = vec![false; self.before.len()];
        let start = self.start;
        let margin = CLOCK_MARGIN.as_nanos() as Nanos;
        self.walk_with(Vec::new(), true, &mut |w, path, meta| {
            let Some(meta) = meta else {
                // Gone since it was listed: as if not there.
                return;
            };
            let size = Some(meta.len());
            match w.before.binary_search(&path) {
                Err(_) => out.push(path, ChangeKind::Created, size),
                Ok(i) => {
                    seen[i] = true;
                    let ctime =
                        Nanos::from(meta.ctime()) * 1_000_000_000 + Nanos::from(meta.ctime_nsec());
                    if ctime > start || w.touched.contains(&path) {
                        out.push(path, ChangeKind::Modified, size);
                    } else if ctime >= start - margin {
                        out.unsure = true;
                        out.push(path, ChangeKind::Modified, size);
                    }
                }
            }
        });
        for (path, seen) in self.before.iter().zip(seen) {
            if !seen {
                out.push(path.clone(), ChangeKind::Deleted, None);
            }
        }
    }
}

impl Drop for Watch {
    /// A watch dropped without its report (the command did not start)
    /// gives its watches back too.
    fn drop(&mut self) {
        if let Some(fd) = self.release() {
            close_aside(fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(ignore: &[&str], max: u32) -> ChangesSpec {
        ChangesSpec {
            ignore: ignore.iter().map(|s| s.to_string()).collect(),
            max,
        }
    }

    fn listed(r: &Report) -> Vec<(String, ChangeKind, Option<u64>)> {
        r.changes
            .iter()
            .map(|c| (c.path.clone(), c.kind, c.size))
            .collect()
    }

    /// A workspace with `keep`, `edit`, `gone`, `again`, `sub/old` and
    /// files in ignored directories.
    fn workspace() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        for d in ["sub", "node_modules/x", ".git", "deep/node_modules"] {
            std::fs::create_dir_all(root.join(d)).expect("mkdir");
        }
        for f in [
            "keep",
            "edit",
            "gone",
            "again",
            "sub/old",
            "node_modules/x/a",
            ".git/HEAD",
            "deep/node_modules/b",
        ] {
            std::fs::write(root.join(f), b"1").expect("write");
        }
        // Older than the coarse clock's margin when the watch starts, so
        // that a scan has no file in doubt.
        std::thread::sleep(CLOCK_MARGIN * 2);
        dir
    }

    /// What a command does to [`workspace`].
    fn act(root: &Path) {
        std::fs::write(root.join("edit"), b"22").expect("edit");
        std::fs::remove_file(root.join("gone")).expect("rm");
        std::fs::remove_file(root.join("again")).expect("rm");
        std::fs::write(root.join("again"), b"333").expect("again");
        std::fs::write(root.join("new"), b"4444").expect("new");
        std::fs::write(root.join("brief"), b"x").expect("brief");
        std::fs::remove_file(root.join("brief")).expect("rm brief");
        std::fs::create_dir_all(root.join("made/inner")).expect("mkdir");
        std::fs::write(root.join("made/inner/f"), b"55555").expect("made");
        std::fs::create_dir(root.join("empty")).expect("empty dir");
        std::fs::rename(root.join("sub"), root.join("moved")).expect("mv");
        std::fs::write(root.join("node_modules/x/a"), b"ignored").expect("nm");
        std::fs::write(root.join("node_modules/new"), b"ignored").expect("nm");
        std::fs::write(root.join(".git/HEAD"), b"ignored").expect("git");
        std::fs::write(root.join("deep/node_modules/b"), b"ignored").expect("deep");
    }

    fn expected() -> Vec<(String, ChangeKind, Option<u64>)> {
        use ChangeKind::*;
        vec![
            ("again".into(), Modified, Some(3)),
            ("edit".into(), Modified, Some(2)),
            ("gone".into(), Deleted, None),
            ("made/inner/f".into(), Created, Some(5)),
            ("moved/old".into(), Created, Some(1)),
            ("new".into(), Created, Some(4)),
            ("sub/old".into(), Deleted, None),
        ]
    }

    fn budget(n: usize) -> Rc<WatchBudget> {
        Rc::new(WatchBudget::new(n))
    }

    fn start(root: &Path) -> Watch {
        Watch::start(
            root.to_str().expect("utf-8"),
            &spec(&[".git", "node_modules"], 1000),
            &budget(1000),
        )
    }

    #[tokio::test]
    async fn inotify_sees_exactly_what_changed_outside_ignored_directories() {
        let dir = workspace();
        let mut w = start(dir.path());
        assert!(w.inotify.is_some(), "inotify is in use");
        act(dir.path());
        w.read_events();
        let r = w.conclude();
        assert_eq!(listed(&r), expected());
        assert_eq!(
            (r.more, r.method, r.complete),
            (0, ChangeMethod::Inotify, true)
        );
    }

    #[tokio::test]
    async fn a_scan_finds_the_same_without_inotify() {
        let dir = workspace();
        let mut w = start(dir.path());
        // As when the per-user limit was reached at the start.
        w.inotify = None;
        // Past the coarse clock's margin, so no change is in doubt.
        std::thread::sleep(CLOCK_MARGIN * 2);
        act(dir.path());
        let r = w.conclude();
        assert_eq!(listed(&r), expected());
        assert_eq!(
            (r.more, r.method, r.complete),
            (0, ChangeMethod::Scan, true)
        );
    }

    #[tokio::test]
    async fn lost_events_end_in_a_walk_with_the_same_result() {
        let dir = workspace();
        let mut w = start(dir.path());
        std::thread::sleep(CLOCK_MARGIN * 2);
        act(dir.path());
        // As after IN_Q_OVERFLOW.
        w.on_event(-1, ReadFlags::QUEUE_OVERFLOW, None);
        let r = w.conclude();
        assert_eq!(listed(&r), expected());
        assert_eq!(
            (r.more, r.method, r.complete),
            (0, ChangeMethod::Inotify, true)
        );
    }

    #[tokio::test]
    async fn a_file_changed_at_the_start_is_in_doubt_in_a_scan() {
        let dir = workspace();
        let mut w = start(dir.path());
        w.inotify = None;
        // Its ctime is (about) the start: before or after cannot be told.
        std::fs::write(dir.path().join("keep"), b"1").expect("write");
        let meta = std::fs::symlink_metadata(dir.path().join("keep")).expect("stat");
        w.start = Nanos::from(meta.ctime()) * 1_000_000_000 + Nanos::from(meta.ctime_nsec());
        let r = w.conclude();
        assert!(
            r.changes
                .iter()
                .any(|c| c.path == "keep" && c.kind == ChangeKind::Modified),
            "{r:?}"
        );
        assert!(!r.complete);
    }

    #[tokio::test]
    async fn the_list_is_capped_and_the_rest_counted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut w = Watch::start(
            dir.path().to_str().expect("utf-8"),
            &spec(&[], 3),
            &budget(1000),
        );
        for i in 0..10 {
            std::fs::write(dir.path().join(format!("f{i}")), b"").expect("write");
        }
        w.read_events();
        let r = w.conclude();
        let paths: Vec<&str> = r.changes.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(paths, ["f0", "f1", "f2"], "the first by path");
        assert_eq!(r.more, 7);
    }

    #[tokio::test]
    async fn past_the_paths_kept_the_end_is_a_walk_and_a_large_start_is_incomplete() {
        let dir = workspace();
        // 5 files at the start, 12 paths kept: the events of the command
        // overflow what is kept, and the end walks the workspace.
        let mut w = Watch::start_keeping(
            dir.path().to_str().expect("utf-8"),
            &spec(&[".git", "node_modules"], 1000),
            12,
            &budget(1000),
        );
        act(dir.path());
        w.read_events();
        assert!(w.lost, "past the cap");
        let r = w.conclude();
        assert_eq!(listed(&r), expected());
        assert_eq!((r.method, r.complete), (ChangeMethod::Inotify, true));
        // Fewer kept than there are files at the start: not complete.
        let w = Watch::start_keeping(
            dir.path().to_str().expect("utf-8"),
            &spec(&[], 1000),
            3,
            &budget(1000),
        );
        assert!(!w.conclude().complete);
    }

    /// The directories [`start`] watches in [`workspace`]: the top,
    /// `sub` and `deep` (`.git` and `node_modules` are ignored).
    const WORKSPACE_DIRS: usize = 3;

    #[tokio::test]
    async fn past_its_budget_a_watch_scans_and_gives_every_watch_back() {
        let dir = workspace();
        let root = dir.path().to_str().expect("utf-8");
        let spec = spec(&[".git", "node_modules"], 1000);
        // Exactly enough: inotify, and the watches are held until the end.
        let b = budget(WORKSPACE_DIRS);
        let w = Watch::start(root, &spec, &b);
        assert!(w.inotify.is_some(), "the budget fits");
        assert_eq!(b.held(), WORKSPACE_DIRS);
        let r = w.conclude();
        assert_eq!((r.method, b.held()), (ChangeMethod::Inotify, 0));
        // One fewer: a scan from the start, with nothing held, and the
        // same exact list.
        let b = budget(WORKSPACE_DIRS - 1);
        let w = Watch::start(root, &spec, &b);
        assert!(w.inotify.is_none(), "past the budget");
        assert_eq!(b.held(), 0, "what it took is given back");
        std::thread::sleep(CLOCK_MARGIN * 2);
        act(dir.path());
        let r = w.conclude();
        assert_eq!(listed(&r), expected());
        assert_eq!((r.method, r.complete), (ChangeMethod::Scan, true));
    }

    #[tokio::test]
    async fn the_budget_is_shared_by_the_sandboxs_commands() {
        let dir = workspace();
        let root = dir.path().to_str().expect("utf-8");
        let spec = spec(&[".git", "node_modules"], 1000);
        let b = budget(WORKSPACE_DIRS + 1);
        let first = Watch::start(root, &spec, &b);
        let second = Watch::start(root, &spec, &b);
        assert!(first.inotify.is_some() && second.inotify.is_none());
        assert_eq!(b.held(), WORKSPACE_DIRS);
        drop(second);
        // A watch that ends without its report gives its watches back.
        drop(first);
        assert_eq!(b.held(), 0);
        let third = Watch::start(root, &spec, &b);
        assert!(third.inotify.is_some(), "the budget is free again");
    }

    #[tokio::test]
    async fn a_directory_past_the_budget_during_the_command_ends_in_a_walk() {
        let dir = workspace();
        let b = budget(WORKSPACE_DIRS + 1);
        let mut w = Watch::start(
            dir.path().to_str().expect("utf-8"),
            &spec(&[".git", "node_modules"], 1000),
            &b,
        );
        std::thread::sleep(CLOCK_MARGIN * 2);
        // `made` and `made/inner` need two watches, one is left.
        act(dir.path());
        w.read_events();
        assert!(w.lost, "a directory could not be watched");
        assert!(b.held() <= WORKSPACE_DIRS + 1);
        let r = w.conclude();
        assert_eq!(listed(&r), expected());
        assert_eq!((r.method, r.complete), (ChangeMethod::Inotify, true));
        assert_eq!(b.held(), 0);
    }

    #[tokio::test]
    async fn a_removed_directory_gives_its_watch_back() {
        let dir = workspace();
        let b = budget(1000);
        let mut w = Watch::start(
            dir.path().to_str().expect("utf-8"),
            &spec(&[".git", "node_modules"], 1000),
            &b,
        );
        assert_eq!(b.held(), WORKSPACE_DIRS);
        std::fs::remove_dir_all(dir.path().join("deep")).expect("rm");
        // IN_IGNORED comes after the removal; read until it has.
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while b.held() != WORKSPACE_DIRS - 1 && std::time::Instant::now() < until {
            w.read_events();
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(b.held(), WORKSPACE_DIRS - 1);
        drop(w);
        assert_eq!(b.held(), 0);
    }
}
