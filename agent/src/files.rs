//! File operations on the workspace (read, write, list, delete): what
//! sandboxd's `files:*` routes do inside the sandbox. A port of sandboxd's
//! former in-sandbox helper (`src/files/helper.py`), with the same
//! guarantees, its error codes mapped to [`FailureKind`] and its messages
//! kept.
//!
//! The agent runs as the sandbox user, so the kernel enforces the read-only
//! root filesystem and the user's own rights on every call here: this
//! module has no privilege to guard. What it guards is the workspace's
//! edge. Every path is walked from the workspace one component at a time,
//! each component opened relative to the directory before it with
//! `O_NOFOLLOW`. A symlink met on the way is followed by hand and only while
//! it stays inside: an absolute target under any spelling of the workspace
//! (the same volume mounted again), a relative one that never climbs above
//! the workspace root, at most [`MAX_HOPS`] per path. A directory swapped
//! for a symlink between our check and our open makes the no-follow open
//! fail, and the answer is `Changed`. So nothing the sandbox puts in the
//! workspace can lead an operation out of it.
//!
//! The caller must keep SIGXFSZ from killing the agent (install a handler;
//! not SIG_IGN, which commands would inherit across exec): a write past
//! RLIMIT_FSIZE then fails with EFBIG and is answered `TooLarge`.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use bytes::Bytes;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;
use sandboxd_proto::{
    DirEntry, EntryKind, Failure, FailureKind, Mismatch, NewFile, PathStat, Precondition,
};
use sha2::{Digest, Sha256};

/// Most symlinks followed while resolving one path (the kernel's own
/// limit, MAXSYMLINKS); more is a loop, or as good as one.
const MAX_HOPS: u32 = 40;
/// How every directory on a walk is opened: a symlink put in its place
/// makes the open fail (ELOOP or ENOTDIR) instead of being followed.
const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);
/// Temporary files of a write are named this plus 16 random hex digits.
const TEMP_PREFIX: &str = ".sandboxd-";
/// Largest mode a written file may get: no setuid, setgid or sticky bits.
const MAX_MODE: u32 = 0o777;
/// How long a write waits for the next piece of its content. sandboxd
/// sends them all at once, so a longer gap means it is gone or stuck, and
/// the file thread must not wait for it.
const PIECE_WAIT: Duration = Duration::from_secs(30);

/// Where the content of a write comes from, piece by piece, while earlier
/// pieces are being written.
pub(crate) trait Content {
    /// The next piece, or why none comes.
    fn next_piece(&mut self) -> Result<Bytes, Failure>;
}

/// The pieces sandboxd sends, as the connection hands them over.
impl Content for Receiver<Bytes> {
    fn next_piece(&mut self) -> Result<Bytes, Failure> {
        self.recv_timeout(PIECE_WAIT).map_err(|e| {
            let why = match e {
                RecvTimeoutError::Timeout => "stopped coming",
                RecvTimeoutError::Disconnected => "ended before every file was whole",
            };
            // sandboxd's failing, not the request's: not `Invalid`, which
            // sandboxd answers as a bad path.
            Failure::new(
                FailureKind::Other,
                format!("the content of the write {why}"),
            )
        })
    }
}

/// One path component, as the kernel sees it: bytes (a symlink's target
/// need not be UTF-8).
type Name = Vec<u8>;

/// The workspace: its canonical directory and every spelling it is mounted
/// at (the same volume mounted again; an absolute symlink target under any
/// of them stays inside).
pub(crate) struct Workspace {
    /// The canonical directory: every walk starts by opening it. It is
    /// configuration, not sandbox input, so it is opened following symlinks.
    root: String,
    /// The components of every spelling, canonical first.
    spellings: Vec<Vec<Name>>,
    /// Tests interleave changes with a walk here, to race it on purpose.
    #[cfg(test)]
    hook: Option<Hook>,
}

#[cfg(test)]
type Hook = Box<dyn Fn(Step<'_>) + Send + Sync>;

/// A point in an operation where a test may change the workspace under it.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step<'a> {
    /// A walk checked that this directory (its resolved path) is one, and
    /// is about to open it.
    OpenDir(&'a str),
    /// A read or list is about to open its target (the request's path).
    OpenTarget(&'a str),
    /// A write is about to create this file's temporary (the request's path).
    Stage(&'a str),
}

/// Where an operation's target lies: an open directory, and the target's
/// name in it (`None`: the directory itself is the target, because the
/// path is the workspace or a symlink on it ends in `..`).
struct Located {
    dir: OwnedFd,
    leaf: Option<Name>,
}

/// One request path being resolved: how it was sent (for messages) and how
/// many symlinks were followed for it so far, in directory components and
/// as the final one alike (helper.py counted them apart, per walk).
struct Resolve<'a> {
    path: &'a str,
    hops: u32,
}

impl Resolve<'_> {
    /// Counts a symlink followed; refuses one more than [`MAX_HOPS`].
    fn hop(&mut self) -> Result<(), Failure> {
        self.hops += 1;
        if self.hops > MAX_HOPS {
            return Err(Failure::new(
                FailureKind::SymlinkEscape,
                format!("{} has too many levels of symlinks", shown(self.path)),
            ));
        }
        Ok(())
    }
}

/// A directory a write created, with the directory it is in: removed again
/// if the write fails.
struct Created {
    parent: OwnedFd,
    name: Name,
}

/// What a write has done so far, so that a failure can undo it.
#[derive(Default)]
struct Staging {
    /// Directories it created, in the order it created them.
    created: Vec<Created>,
    /// Each file's directory and name, in request order.
    targets: Vec<(OwnedFd, Name)>,
    /// The temporary of each target staged so far, in the same order.
    temps: Vec<Name>,
    /// How many temporaries have been renamed over their targets.
    renamed: usize,
}

impl Staging {
    /// Removes the temporaries not renamed yet, then the directories the
    /// write created (newest first, so children go before their parents).
    /// Best effort: a directory the sandbox filled meanwhile stays.
    fn undo(self) {
        for ((dir, _), temp) in self.targets.iter().zip(&self.temps).skip(self.renamed) {
            let _ = rustix::fs::unlinkat(dir, temp.as_slice(), AtFlags::empty());
        }
        for c in self.created.iter().rev() {
            let _ = rustix::fs::unlinkat(&c.parent, c.name.as_slice(), AtFlags::REMOVEDIR);
        }
    }
}

/// A directory being removed by [`remove_tree`]: its fd, its
/// name in its parent, and the entries still to remove.
struct Level {
    fd: OwnedFd,
    name: Name,
    todo: Vec<Name>,
}

impl Workspace {
    /// `dirs`: absolute, normalised paths, canonical first (e.g.
    /// `["/workspace", "/vercel/sandbox/workspace"]`).
    pub(crate) fn new(dirs: Vec<String>) -> Workspace {
        let spellings = dirs
            .iter()
            .map(|d| {
                d.split('/')
                    .filter(|c| !c.is_empty() && *c != ".")
                    .map(|c| c.as_bytes().to_vec())
                    .collect()
            })
            .collect();
        Workspace {
            root: dirs.into_iter().next().unwrap_or_default(),
            spellings,
            #[cfg(test)]
            hook: None,
        }
    }

    /// A file's content, at most `max_bytes` (else TooLarge with a message
    /// giving the size and the limit). NotFound when the file or a
    /// directory on its path does not exist. A final symlink is followed
    /// (inside the workspace only).
    pub(crate) fn read_file(&self, path: &str, max_bytes: u64) -> Result<Vec<u8>, Failure> {
        let parts = parse(path)?;
        let mut r = Resolve { path, hops: 0 };
        let Located { dir, leaf } = self.locate(&mut r, parts, true, None)?;
        let Some(leaf) = leaf else {
            return Err(is_directory(path));
        };
        #[cfg(test)]
        self.checkpoint(Step::OpenTarget(path));
        // Non-blocking, so a FIFO without a writer cannot hang the read (it
        // is refused below as not regular); no controlling terminal, so a
        // terminal device cannot become the agent's.
        let flags =
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
        let fd = rustix::fs::openat(&dir, leaf.as_slice(), flags, Mode::empty()).map_err(|e| {
            match e {
                Errno::NOENT => not_found(path),
                // The walk saw no symlink here: one was put in its place.
                Errno::LOOP => changed(path),
                // A socket, or a device without a driver.
                Errno::NXIO | Errno::NODEV | Errno::OPNOTSUPP => not_regular(path),
                e => os(e),
            }
        })?;
        drop(dir);
        let st = rustix::fs::fstat(&fd).map_err(os)?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => {}
            FileType::Directory => return Err(is_directory(path)),
            _ => return Err(not_regular(path)),
        }
        let size = u64::try_from(st.st_size).unwrap_or(0);
        if size > max_bytes {
            return Err(Failure::new(
                FailureKind::TooLarge,
                format!(
                    "{} is {size} bytes, more than the {max_bytes} allowed",
                    shown(path)
                ),
            ));
        }
        // The file may grow while we read it: read one byte past the limit
        // at most, enough to tell.
        let mut content = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        File::from(fd)
            .take(max_bytes.saturating_add(1))
            .read_to_end(&mut content)
            .map_err(io_failure)?;
        if u64::try_from(content.len()).unwrap_or(u64::MAX) > max_bytes {
            return Err(Failure::new(
                FailureKind::TooLarge,
                format!("{} grew past the {max_bytes} bytes allowed", shown(path)),
            ));
        }
        Ok(content)
    }

    /// Every file or none: each path is resolved first (missing parent
    /// directories are created, 0755), then each content is written to a
    /// temporary file next to its target, piece by piece as `content`
    /// gives them (each file's `size` bytes, in order, no piece spanning
    /// two files), and the temporaries are renamed
    /// over their targets only once all are written. On a failure before
    /// the renames, the temporaries and the directories it created are
    /// removed. A final symlink is followed (inside the workspace only).
    ///
    /// Each file's [`Precondition`] is checked once every target is
    /// resolved and before anything is staged: when any does not hold,
    /// nothing is written and the answer is the files that failed, with
    /// their present hashes (an empty list: written). Check and write run
    /// on the agent's one file thread, so no other file request comes
    /// between them.
    pub(crate) fn write_files(
        &self,
        files: Vec<NewFile>,
        content: &mut dyn Content,
    ) -> Result<Vec<Mismatch>, Failure> {
        // Everything that can be checked without the filesystem is, before
        // anything is touched.
        let mut parsed = Vec::with_capacity(files.len());
        for f in &files {
            let parts = parse(&f.path)?;
            if parts.is_empty() {
                return Err(Failure::new(
                    FailureKind::Invalid,
                    "the workspace directory itself is not a file",
                ));
            }
            if f.mode > MAX_MODE {
                return Err(Failure::new(
                    FailureKind::Invalid,
                    format!(
                        "{}: the mode must be 0 to 511 (0o777), got {}",
                        f.path, f.mode
                    ),
                ));
            }
            parsed.push(parts);
        }
        let mut staging = Staging::default();
        match self.stage_and_commit(&files, parsed, content, &mut staging) {
            Ok(failed) if failed.is_empty() => Ok(failed),
            Ok(failed) => {
                staging.undo();
                Ok(failed)
            }
            Err(e) => {
                staging.undo();
                Err(e)
            }
        }
    }

    /// What each path is, the final symlink not followed (symlinks on the
    /// way are, inside the workspace only); `kind: None` when nothing is
    /// there. With `sha256`, a regular file's content hash.
    pub(crate) fn stat(&self, paths: &[String], sha256: bool) -> Result<Vec<PathStat>, Failure> {
        let mut parsed = Vec::with_capacity(paths.len());
        for path in paths {
            parsed.push((path.as_str(), parse(path)?));
        }
        let missing = PathStat {
            kind: None,
            size: 0,
            mode: 0,
            mtime_ms: 0,
            sha256: None,
        };
        let mut out = Vec::with_capacity(parsed.len());
        for (path, parts) in parsed {
            let mut r = Resolve { path, hops: 0 };
            let Located { dir, leaf } = match self.locate(&mut r, parts, false, None) {
                Ok(located) => located,
                Err(e) if e.kind == FailureKind::NotFound => {
                    out.push(missing.clone());
                    continue;
                }
                Err(e) => return Err(e),
            };
            let st = match &leaf {
                None => rustix::fs::fstat(&dir).map_err(os)?,
                Some(leaf) => {
                    match rustix::fs::statat(&dir, leaf.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
                        Ok(st) => st,
                        Err(Errno::NOENT) => {
                            out.push(missing.clone());
                            continue;
                        }
                        Err(e) => return Err(os(e)),
                    }
                }
            };
            let entry = dir_entry(b"", &st);
            let hash = match (&leaf, sha256, entry.kind) {
                (Some(leaf), true, EntryKind::File) => hash_at(&dir, leaf, path)?,
                _ => None,
            };
            out.push(PathStat {
                kind: Some(entry.kind),
                size: entry.size,
                mode: entry.mode,
                mtime_ms: entry.mtime_ms,
                sha256: hash,
            });
        }
        Ok(out)
    }

    /// Opens the directory `path` names (a final symlink followed, inside
    /// the workspace only): NotFound, or NotDirectory when it is not one.
    pub(crate) fn open_dir(&self, path: &str) -> Result<OwnedFd, Failure> {
        let parts = parse(path)?;
        let mut r = Resolve { path, hops: 0 };
        let Located { dir, leaf } = self.locate(&mut r, parts, true, None)?;
        let Some(leaf) = leaf else {
            return Ok(dir);
        };
        let st =
            rustix::fs::statat(&dir, leaf.as_slice(), AtFlags::SYMLINK_NOFOLLOW).map_err(|e| {
                match e {
                    Errno::NOENT => not_found(path),
                    e => os(e),
                }
            })?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            return Err(Failure::new(
                FailureKind::NotDirectory,
                format!("{} is not a directory", shown(path)),
            ));
        }
        rustix::fs::openat(&dir, leaf.as_slice(), DIR_FLAGS, Mode::empty()).map_err(|e| match e {
            Errno::LOOP | Errno::NOTDIR => changed(path),
            e => os(e),
        })
    }

    /// Entries sorted by name (byte order); symlinks are not followed, `.`
    /// and `..` are left out. A final symlink to a directory is followed
    /// (inside the workspace only).
    pub(crate) fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>, Failure> {
        let parts = parse(path)?;
        let mut r = Resolve { path, hops: 0 };
        let Located { dir, leaf } = self.locate(&mut r, parts, true, None)?;
        let dir = match leaf {
            None => dir,
            Some(leaf) => {
                let st = rustix::fs::statat(&dir, leaf.as_slice(), AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| match e {
                        Errno::NOENT => not_found(path),
                        e => os(e),
                    })?;
                if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
                    return Err(Failure::new(
                        FailureKind::NotDirectory,
                        format!("{} is not a directory", shown(path)),
                    ));
                }
                #[cfg(test)]
                self.checkpoint(Step::OpenTarget(path));
                // Only a swap is `Changed`; helper.py answered every failure
                // here so, an unreadable directory included.
                rustix::fs::openat(&dir, leaf.as_slice(), DIR_FLAGS, Mode::empty()).map_err(
                    |e| match e {
                        Errno::LOOP | Errno::NOTDIR => changed(path),
                        e => os(e),
                    },
                )?
            }
        };
        let mut names = read_names(&dir)?;
        names.sort();
        let mut entries = Vec::with_capacity(names.len());
        for name in names {
            match rustix::fs::statat(&dir, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => entries.push(dir_entry(&name, &st)),
                // Removed since we read the directory: not an entry any more.
                Err(Errno::NOENT) => {}
                Err(e) => return Err(os(e)),
            }
        }
        Ok(entries)
    }

    /// Deletes in order; missing paths (or paths whose parent is missing)
    /// are skipped; a directory needs `recursive` (NeedsRecursive); a
    /// recursive delete does not follow symlinks inside the tree; a final
    /// symlink is removed itself. A failure stops there: the paths before
    /// it stay deleted.
    pub(crate) fn delete(&self, paths: &[String], recursive: bool) -> Result<(), Failure> {
        let mut parsed = Vec::with_capacity(paths.len());
        for path in paths {
            let parts = parse(path)?;
            if parts.is_empty() {
                return Err(Failure::new(
                    FailureKind::Invalid,
                    "the workspace directory itself cannot be deleted",
                ));
            }
            parsed.push((path.as_str(), parts));
        }
        for (path, parts) in parsed {
            let mut r = Resolve { path, hops: 0 };
            let Located { dir, leaf } = match self.locate(&mut r, parts, false, None) {
                Ok(located) => located,
                Err(e) if e.kind == FailureKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let Some(leaf) = leaf else {
                return Err(Failure::new(
                    FailureKind::Invalid,
                    format!("{path} names a directory through '..' or '.'; name it directly"),
                ));
            };
            let st = match rustix::fs::statat(&dir, leaf.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(os(e)),
            };
            if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                if !recursive {
                    return Err(Failure::new(
                        FailureKind::NeedsRecursive,
                        format!("{path} is a directory; delete it with recursive: true"),
                    ));
                }
                remove_tree(&dir, leaf)?;
            } else {
                rustix::fs::unlinkat(&dir, leaf.as_slice(), AtFlags::empty()).map_err(os)?;
            }
        }
        Ok(())
    }

    /// The body of [`Workspace::write_files`]; whatever it did is in
    /// `staging`, for the caller to undo on failure.
    fn stage_and_commit(
        &self,
        files: &[NewFile],
        parsed: Vec<Vec<Name>>,
        content: &mut dyn Content,
        staging: &mut Staging,
    ) -> Result<Vec<Mismatch>, Failure> {
        for (f, parts) in files.iter().zip(parsed) {
            let mut r = Resolve {
                path: &f.path,
                hops: 0,
            };
            let Located { dir, leaf } =
                self.locate(&mut r, parts, true, Some(&mut staging.created))?;
            let Some(leaf) = leaf else {
                return Err(is_directory(&f.path));
            };
            match rustix::fs::statat(&dir, leaf.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                    return Err(is_directory(&f.path));
                }
                Ok(_) | Err(Errno::NOENT) => {}
                Err(e) => return Err(os(e)),
            }
            staging.targets.push((dir, leaf));
        }
        let mut failed = Vec::new();
        for (f, (dir, leaf)) in files.iter().zip(&staging.targets) {
            if f.precondition == Precondition::None {
                continue;
            }
            let current = hash_at(dir, leaf, &f.path)?;
            let holds = match f.precondition {
                Precondition::None => true,
                Precondition::IfMatch(want) => current == Some(want),
                Precondition::IfNoneMatch => current.is_none() && !exists_at(dir, leaf)?,
            };
            if !holds {
                failed.push(Mismatch {
                    path: f.path.clone(),
                    current,
                });
            }
        }
        if !failed.is_empty() {
            return Ok(failed);
        }
        let mut random = File::open("/dev/urandom").map_err(io_failure)?;
        for (f, (dir, _)) in files.iter().zip(&staging.targets) {
            #[cfg(test)]
            self.checkpoint(Step::Stage(&f.path));
            let temp = temp_name(&mut random)?;
            // A new file (O_EXCL), so nothing the sandbox prepared under
            // that name is written through.
            let fd = rustix::fs::openat(
                dir,
                temp.as_slice(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .map_err(os)?;
            staging.temps.push(temp);
            // Exactly `mode`, whatever the umask.
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(f.mode)).map_err(os)?;
            let mut file = File::from(fd);
            let mut left = f.size;
            while left > 0 {
                let piece = content.next_piece()?;
                let n = u64::try_from(piece.len()).unwrap_or(u64::MAX);
                if n == 0 || n > left {
                    return Err(Failure::new(
                        FailureKind::Other,
                        format!("{}: a piece of content past its size", f.path),
                    ));
                }
                file.write_all(&piece).map_err(io_failure)?;
                left -= n;
            }
        }
        for ((dir, leaf), temp) in staging.targets.iter().zip(&staging.temps) {
            rustix::fs::renameat(dir, temp.as_slice(), dir, leaf.as_slice()).map_err(os)?;
            staging.renamed += 1;
        }
        Ok(Vec::new())
    }

    /// Opens the directory holding the target of `parts`, and gives the
    /// target's name in it (`None` when `parts` is empty or ends in `..`:
    /// the directory is the target). With `follow_last`, a final symlink is
    /// followed (inside the workspace only); without, it is the target.
    /// With `created`, missing directories are made (see [`Self::walk_dirs`]).
    fn locate(
        &self,
        r: &mut Resolve<'_>,
        mut parts: Vec<Name>,
        follow_last: bool,
        mut created: Option<&mut Vec<Created>>,
    ) -> Result<Located, Failure> {
        loop {
            let leaf = match parts.last() {
                Some(last) if last.as_slice() != b".." => parts.pop(),
                _ => None,
            };
            let Some(leaf) = leaf else {
                let (dir, _) = self.walk_dirs(r, parts, created.as_deref_mut())?;
                return Ok(Located { dir, leaf: None });
            };
            let (dir, stack) = self.walk_dirs(r, parts, created.as_deref_mut())?;
            if !follow_last {
                return Ok(Located {
                    dir,
                    leaf: Some(leaf),
                });
            }
            match rustix::fs::statat(&dir, leaf.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {}
                Ok(_) | Err(Errno::NOENT) => {
                    return Ok(Located {
                        dir,
                        leaf: Some(leaf),
                    });
                }
                Err(e) => return Err(os(e)),
            }
            r.hop()?;
            let target = rustix::fs::readlinkat(&dir, leaf.as_slice(), Vec::new())
                .map_err(|e| link_gone(e, r.path))?
                .into_bytes();
            parts = if target.starts_with(b"/") {
                self.under_workspace(&target)
                    .ok_or_else(|| escape(r.path))?
            } else {
                // Relative to the link's directory: its resolved components
                // and the target's, from the workspace root again, so that
                // `..` is resolved against the real directories walked and
                // cannot climb above the root. Empty components go too, so
                // `dir/` names `dir` (helper.py made it a name "" and failed).
                let mut resolved = stack;
                resolved.extend(
                    target
                        .split(|b| *b == b'/')
                        .filter(|c| !c.is_empty() && *c != b".")
                        .map(<[u8]>::to_vec),
                );
                resolved
            };
        }
    }

    /// Opens the directory `parts` names, one component at a time from the
    /// workspace root, following symlinks by hand and only inside the
    /// workspace. Returns it and its resolved components (no symlinks,
    /// relative to the root). With `created`, a missing directory is made
    /// (0755) and recorded there; without, it is NotFound.
    fn walk_dirs(
        &self,
        r: &mut Resolve<'_>,
        parts: Vec<Name>,
        mut created: Option<&mut Vec<Created>>,
    ) -> Result<(OwnedFd, Vec<Name>), Failure> {
        let root = self.open_root()?;
        // `fds[i]` is the directory `stack[..=i]` names; `..` goes back one,
        // to the directory we came from, never above the root.
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut stack: Vec<Name> = Vec::new();
        // Components still to walk, the next one last.
        let mut todo = parts;
        todo.reverse();
        while let Some(name) = todo.pop() {
            match name.as_slice() {
                b"" | b"." => continue,
                b".." => {
                    if stack.pop().is_none() {
                        return Err(escape(r.path));
                    }
                    fds.pop();
                    continue;
                }
                _ => {}
            }
            let cur = fds.last().unwrap_or(&root);
            let st = match rustix::fs::statat(cur, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::NOENT) => {
                    let Some(created) = created.as_deref_mut() else {
                        return Err(not_found(r.path));
                    };
                    // The parent's fd first: once the directory exists it
                    // must be recorded, to be removed if the write fails.
                    let parent = cur.try_clone().map_err(io_failure)?;
                    // 0755 as helper.py made them (the umask applies).
                    rustix::fs::mkdirat(cur, name.as_slice(), Mode::from_raw_mode(0o755))
                        .map_err(os)?;
                    created.push(Created {
                        parent,
                        name: name.clone(),
                    });
                    rustix::fs::statat(cur, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW)
                        .map_err(os)?
                }
                Err(e) => return Err(os(e)),
            };
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Symlink => {
                    r.hop()?;
                    let target = rustix::fs::readlinkat(cur, name.as_slice(), Vec::new())
                        .map_err(|e| link_gone(e, r.path))?
                        .into_bytes();
                    if target.starts_with(b"/") {
                        let rest = self
                            .under_workspace(&target)
                            .ok_or_else(|| escape(r.path))?;
                        fds.clear();
                        stack.clear();
                        todo.extend(rest.into_iter().rev());
                    } else {
                        // Walked from here: `..` in it pops what we walked.
                        todo.extend(target.split(|b| *b == b'/').rev().map(<[u8]>::to_vec));
                    }
                }
                FileType::Directory => {
                    #[cfg(test)]
                    self.checkpoint(Step::OpenDir(&join(&stack, &name)));
                    let fd = rustix::fs::openat(cur, name.as_slice(), DIR_FLAGS, Mode::empty())
                        .map_err(|e| match e {
                            // Swapped for a symlink (or a file) since the stat.
                            Errno::LOOP | Errno::NOTDIR => changed(r.path),
                            e => os(e),
                        })?;
                    fds.push(fd);
                    stack.push(name);
                }
                _ => {
                    return Err(Failure::new(
                        FailureKind::NotDirectory,
                        format!("{}: {} is not a directory", r.path, join(&stack, &name)),
                    ));
                }
            }
        }
        Ok((fds.pop().unwrap_or(root), stack))
    }

    fn open_root(&self) -> Result<OwnedFd, Failure> {
        if self.root.is_empty() {
            return Err(Failure::new(
                FailureKind::Other,
                "no workspace directory is configured",
            ));
        }
        rustix::fs::open(
            self.root.as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(os)
    }

    /// The components of absolute `target` below the workspace, or `None`
    /// when it lies under no spelling of it. What follows the spelling may
    /// hold `..`, which the walk refuses to climb above the root.
    fn under_workspace(&self, target: &[u8]) -> Option<Vec<Name>> {
        let clean: Vec<&[u8]> = target
            .split(|b| *b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
            .collect();
        self.spellings.iter().find_map(|ws| {
            let matches =
                clean.len() >= ws.len() && clean.iter().zip(ws).all(|(c, w)| *c == w.as_slice());
            matches.then(|| clean[ws.len()..].iter().map(|c| c.to_vec()).collect())
        })
    }

    #[cfg(test)]
    fn checkpoint(&self, step: Step<'_>) {
        if let Some(hook) = &self.hook {
            hook(step);
        }
    }
}

/// The SHA-256 of regular file `leaf` in `dir` (not followed if a
/// symlink), or `None` when there is no such file or it is not a regular
/// one. Opened non-blocking, so a FIFO cannot hang the agent.
pub(crate) fn hash_at(dir: &OwnedFd, leaf: &[u8], path: &str) -> Result<Option<[u8; 32]>, Failure> {
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
    let fd = match rustix::fs::openat(dir, leaf, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        // A symlink (a final one was resolved before: one swapped in) or
        // something that cannot be opened for reading as a file.
        Err(Errno::LOOP) => return Err(changed(path)),
        Err(Errno::NXIO | Errno::NODEV | Errno::OPNOTSUPP) => return Ok(None),
        Err(e) => return Err(os(e)),
    };
    let st = rustix::fs::fstat(&fd).map_err(os)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Ok(None);
    }
    let mut file = File::from(fd);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_failure(e)),
        }
    }
    Ok(Some(hasher.finalize().into()))
}

/// Whether anything (of any type) is at `leaf` in `dir`.
fn exists_at(dir: &OwnedFd, leaf: &[u8]) -> Result<bool, Failure> {
    match rustix::fs::statat(dir, leaf, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(_) => Ok(true),
        Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(os(e)),
    }
}

/// Removes directory `name` in `parent` and everything in it, without
/// following symlinks (each is removed itself). Iterative, so a deep tree
/// cannot overflow the stack; each level holds its directory open so that
/// nothing is reached through a path that could change.
fn remove_tree(parent: &OwnedFd, name: Name) -> Result<(), Failure> {
    fn open(dir: &OwnedFd, name: Name) -> Result<Level, Failure> {
        let fd = rustix::fs::openat(dir, name.as_slice(), DIR_FLAGS, Mode::empty()).map_err(os)?;
        let todo = read_names(&fd)?;
        Ok(Level { fd, name, todo })
    }
    let mut levels = vec![open(parent, name)?];
    while let Some(top) = levels.last_mut() {
        if let Some(entry) = top.todo.pop() {
            let st = rustix::fs::statat(&top.fd, entry.as_slice(), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(os)?;
            if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                let next = open(&top.fd, entry)?;
                levels.push(next);
            } else {
                rustix::fs::unlinkat(&top.fd, entry.as_slice(), AtFlags::empty()).map_err(os)?;
            }
        } else if let Some(done) = levels.pop() {
            let dir = levels.last().map_or(parent, |l| &l.fd);
            rustix::fs::unlinkat(dir, done.name.as_slice(), AtFlags::REMOVEDIR).map_err(os)?;
        }
    }
    Ok(())
}

/// The names in a directory, `.` and `..` left out, sorted by bytes.
pub(crate) fn sorted_names(dir: &OwnedFd) -> Result<Vec<Name>, Failure> {
    let mut names = read_names(dir)?;
    names.sort();
    Ok(names)
}

/// The names in a directory, `.` and `..` left out, in no order.
fn read_names(dir: &OwnedFd) -> Result<Vec<Name>, Failure> {
    let mut names = Vec::new();
    for entry in Dir::read_from(dir).map_err(os)? {
        let entry = entry.map_err(os)?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(name.to_vec());
        }
    }
    Ok(names)
}

/// A request path's components, by helper.py's rules (empty and `.`
/// components dropped; `""` is the workspace itself), checked again
/// although sandboxd already did: `..` or a NUL byte is Invalid.
fn parse(path: &str) -> Result<Vec<Name>, Failure> {
    let mut parts = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                return Err(Failure::new(
                    FailureKind::Invalid,
                    format!("{path}: '..' is not allowed in paths"),
                ));
            }
            c if c.contains('\0') => {
                return Err(Failure::new(
                    FailureKind::Invalid,
                    format!("{path:?}: the path contains a NUL byte"),
                ));
            }
            c => parts.push(c.as_bytes().to_vec()),
        }
    }
    Ok(parts)
}

fn dir_entry(name: &[u8], st: &Stat) -> DirEntry {
    DirEntry {
        // Names are bytes; ones that are not UTF-8 are shown lossily.
        name: String::from_utf8_lossy(name).into_owned(),
        kind: match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => EntryKind::File,
            FileType::Directory => EntryKind::Dir,
            FileType::Symlink => EntryKind::Symlink,
            _ => EntryKind::Other,
        },
        size: u64::try_from(st.st_size).unwrap_or(0),
        mtime_ms: mtime_ms(st),
        mode: st.st_mode & 0o7777,
    }
}

/// Modification time in whole milliseconds since the epoch, rounded down
/// (also before 1970: the nanoseconds are always a positive offset).
#[allow(
    clippy::unnecessary_cast,
    reason = "st_mtime is an i64 on 64-bit targets, narrower elsewhere"
)]
fn mtime_ms(st: &Stat) -> i64 {
    let secs = st.st_mtime as i64;
    let nanos = st.st_mtime_nsec as i64;
    secs.saturating_mul(1000).saturating_add(nanos / 1_000_000)
}

/// `.sandboxd-` and 16 random hex digits.
fn temp_name(random: &mut File) -> Result<Name, Failure> {
    let mut bytes = [0u8; 8];
    random.read_exact(&mut bytes).map_err(io_failure)?;
    Ok(format!("{TEMP_PREFIX}{:016x}", u64::from_ne_bytes(bytes)).into_bytes())
}

/// Resolved components joined for a message.
fn join(stack: &[Name], name: &[u8]) -> String {
    let mut joined = Vec::new();
    for c in stack {
        joined.extend_from_slice(c);
        joined.push(b'/');
    }
    joined.extend_from_slice(name);
    String::from_utf8_lossy(&joined).into_owned()
}

/// A request path as messages show it.
fn shown(path: &str) -> &str {
    if path.is_empty() {
        "the workspace directory"
    } else {
        path
    }
}

fn escape(path: &str) -> Failure {
    Failure::new(
        FailureKind::SymlinkEscape,
        format!(
            "{} leads outside the workspace through a symlink",
            shown(path)
        ),
    )
}

fn not_found(path: &str) -> Failure {
    Failure::new(
        FailureKind::NotFound,
        format!("{} does not exist", shown(path)),
    )
}

/// `readlinkat` of what was a symlink a moment ago: EINVAL (it is not one
/// any more) or ENOENT (it is gone) mean the sandbox changed the path.
fn link_gone(e: Errno, path: &str) -> Failure {
    match e {
        Errno::INVAL | Errno::NOENT => changed(path),
        other => os(other),
    }
}

fn changed(path: &str) -> Failure {
    Failure::new(
        FailureKind::Changed,
        format!("{} changed while it was being opened", shown(path)),
    )
}

fn is_directory(path: &str) -> Failure {
    Failure::new(
        FailureKind::IsDirectory,
        format!("{} is a directory", shown(path)),
    )
}

fn not_regular(path: &str) -> Failure {
    Failure::new(
        FailureKind::NotRegular,
        format!("{} is not a regular file", shown(path)),
    )
}

/// An OS error no step above explained, as helper.py answered it: a kind
/// sandboxd tells apart, and the OS's text.
fn os(e: Errno) -> Failure {
    let kind = match e {
        Errno::FBIG => return file_size_limit(),
        Errno::NOSPC | Errno::DQUOT => FailureKind::NoSpace,
        Errno::ACCESS | Errno::PERM | Errno::ROFS => FailureKind::PermissionDenied,
        Errno::NAMETOOLONG => FailureKind::Invalid,
        Errno::ISDIR => FailureKind::IsDirectory,
        Errno::NXIO => FailureKind::NotRegular,
        // Met only when the sandbox changes a path while we work on it.
        Errno::LOOP | Errno::NOTDIR | Errno::NOENT | Errno::EXIST | Errno::NOTEMPTY => {
            return Failure::new(
                FailureKind::Changed,
                format!(
                    "the path changed while it was being worked on ({})",
                    strerror(e)
                ),
            );
        }
        _ => FailureKind::Other,
    };
    Failure::new(kind, strerror(e))
}

fn io_failure(e: std::io::Error) -> Failure {
    match Errno::from_io_error(&e) {
        Some(errno) => os(errno),
        None => Failure::new(FailureKind::Other, e.to_string()),
    }
}

/// A write past RLIMIT_FSIZE (EFBIG): the message names the limit.
fn file_size_limit() -> Failure {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Fsize).current;
    let message = match limit {
        Some(bytes) => {
            format!("the file would exceed the sandbox's file size limit of {bytes} bytes")
        }
        None => "the file is too large for its filesystem".to_string(),
    };
    Failure::new(FailureKind::TooLarge, message)
}

/// The OS's text for `e`, without std's " (os error N)".
fn strerror(e: Errno) -> String {
    let text = std::io::Error::from(e).to_string();
    let suffix = format!(" (os error {})", e.raw_os_error());
    match text.strip_suffix(&suffix) {
        Some(bare) => bare.to_string(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, SystemTime};

    use super::*;

    /// A workspace in a temporary directory, its alias spelling (a symlink
    /// to it, as a second mount would be), and a directory outside it.
    struct Fixture {
        _tmp: tempfile::TempDir,
        ws: PathBuf,
        alias: PathBuf,
        outside: PathBuf,
        w: Workspace,
    }

    fn fixture() -> Fixture {
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = tmp.path().canonicalize().expect("canonical tempdir");
        let ws = base.join("ws");
        let alias = base.join("alias");
        let outside = base.join("outside");
        fs::create_dir(&ws).expect("mkdir ws");
        symlink(&ws, &alias).expect("alias");
        fs::create_dir_all(outside.join("sub")).expect("mkdir outside");
        fs::write(outside.join("secret"), "secret").expect("write secret");
        fs::write(outside.join("sub/f"), "outside f").expect("write outside f");
        let w = Workspace::new(vec![text(&ws), text(&alias)]);
        Fixture {
            _tmp: tmp,
            ws,
            alias,
            outside,
            w,
        }
    }

    fn text(p: &Path) -> String {
        p.to_str().expect("utf-8 temp path").to_string()
    }

    /// A file of a write with its content.
    struct Whole(NewFile, Vec<u8>);

    fn nf(path: &str, mode: u32, content: impl Into<Vec<u8>>) -> Whole {
        let content = content.into();
        let file = NewFile {
            path: path.to_string(),
            mode,
            size: content.len() as u64,
            precondition: Precondition::None,
        };
        Whole(file, content)
    }

    /// Pieces handed over one by one, as the connection would.
    impl Content for std::collections::VecDeque<Bytes> {
        fn next_piece(&mut self) -> Result<Bytes, Failure> {
            self.pop_front()
                .ok_or_else(|| Failure::new(FailureKind::Invalid, "no more pieces"))
        }
    }

    impl Workspace {
        /// Writes `files`, their content in pieces of 3 bytes.
        fn write_whole(&self, files: Vec<Whole>) -> Result<Vec<Mismatch>, Failure> {
            let mut pieces = std::collections::VecDeque::new();
            for Whole(_, content) in &files {
                for piece in content.chunks(3) {
                    pieces.push_back(Bytes::copy_from_slice(piece));
                }
            }
            let files = files.into_iter().map(|Whole(f, _)| f).collect();
            self.write_files(files, &mut pieces)
        }
    }

    fn write(w: &Workspace, path: &str, content: &str) -> Result<(), Failure> {
        let failed = w.write_whole(vec![nf(path, 0o644, content)])?;
        assert!(failed.is_empty(), "no preconditions, none fail");
        Ok(())
    }

    fn kind<T: std::fmt::Debug>(r: Result<T, Failure>) -> FailureKind {
        r.expect_err("should fail").kind
    }

    fn read_text(w: &Workspace, path: &str) -> String {
        String::from_utf8(w.read_file(path, 1 << 20).expect("read")).expect("utf-8")
    }

    /// Temporaries of writes left anywhere under `dir` (symlinks not followed).
    fn temps_under(dir: &Path) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let mut todo = vec![dir.to_path_buf()];
        while let Some(d) = todo.pop() {
            for e in fs::read_dir(&d).expect("read_dir") {
                let e = e.expect("entry");
                if e.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
                    found.push(e.path());
                }
                if e.file_type().expect("type").is_dir() {
                    todo.push(e.path());
                }
            }
        }
        found
    }

    fn is_symlink(p: &Path) -> bool {
        fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink())
    }

    #[test]
    fn binary_content_round_trips() {
        let f = fixture();
        let every_byte: Vec<u8> = (0..=255u8).cycle().take(3 * 256 + 7).collect();
        // Larger than a protocol chunk, and than the first read's guess.
        let big: Vec<u8> = (0..3_000_000u32)
            .map(|i| (i.wrapping_mul(7) >> 3) as u8)
            .collect();
        f.w.write_whole(vec![
            nf("a/b/bytes", 0o644, every_byte.clone()),
            nf("empty", 0o644, Vec::new()),
            nf("big", 0o600, big.clone()),
        ])
        .expect("write");
        assert_eq!(
            f.w.read_file("a/b/bytes", 1 << 20).expect("read"),
            every_byte
        );
        assert_eq!(
            f.w.read_file("./a//b/bytes", 1 << 20).expect("read"),
            every_byte
        );
        assert_eq!(f.w.read_file("empty", 0).expect("read"), Vec::<u8>::new());
        assert_eq!(f.w.read_file("big", 3_000_000).expect("read"), big);
        assert!(f.ws.join("a/b").is_dir(), "missing parents are created");
        assert!(temps_under(&f.ws).is_empty());
    }

    #[test]
    fn written_files_get_exactly_their_mode_and_our_user() {
        let f = fixture();
        for (i, mode) in [0o000, 0o400, 0o640, 0o751, 0o777].into_iter().enumerate() {
            let path = format!("m{i}");
            f.w.write_whole(vec![nf(&path, mode, "x")]).expect("write");
            let meta = fs::symlink_metadata(f.ws.join(&path)).expect("stat");
            assert_eq!(meta.permissions().mode() & 0o7777, mode, "{path}: no umask");
            assert_eq!(meta.uid(), rustix::process::geteuid().as_raw());
        }
    }

    #[test]
    fn a_rewrite_is_a_new_file_not_the_old_one_changed() {
        let f = fixture();
        write(&f.w, "f", "old").expect("write");
        fs::hard_link(f.ws.join("f"), f.ws.join("keep")).expect("link");
        let before = fs::metadata(f.ws.join("f")).expect("stat").ino();
        write(&f.w, "f", "new").expect("rewrite");
        assert_eq!(read_text(&f.w, "f"), "new");
        assert_eq!(read_text(&f.w, "keep"), "old", "the old inode is untouched");
        assert_ne!(fs::metadata(f.ws.join("f")).expect("stat").ino(), before);
    }

    #[test]
    fn paths_with_dotdot_or_nul_are_invalid_before_anything_happens() {
        let f = fixture();
        write(&f.w, "ok", "x").expect("write");
        for bad in ["..", "../x", "a/../b", "a/..", "a\0b"] {
            assert_eq!(
                kind(f.w.read_file(bad, 10)),
                FailureKind::Invalid,
                "{bad:?}"
            );
            assert_eq!(kind(f.w.list_dir(bad)), FailureKind::Invalid, "{bad:?}");
            assert_eq!(
                kind(f.w.delete(&["ok".to_string(), bad.to_string()], true)),
                FailureKind::Invalid,
                "{bad:?}"
            );
            assert!(f.ws.join("ok").exists(), "{bad:?}: checked before deleting");
            assert_eq!(
                kind(f.w.write_whole(vec![nf("new", 0o644, "x"), nf(bad, 0o644, "x")])),
                FailureKind::Invalid,
                "{bad:?}"
            );
            assert!(
                !f.ws.join("new").exists(),
                "{bad:?}: checked before writing"
            );
        }
    }

    #[test]
    fn the_root_cannot_be_written_or_deleted_and_modes_stop_at_0o777() {
        let f = fixture();
        for root in ["", ".", "/", "./"] {
            let w = f.w.write_whole(vec![nf(root, 0o644, "x")]);
            assert_eq!(kind(w), FailureKind::Invalid, "{root:?}");
            let d = f.w.delete(&[root.to_string()], true);
            assert_eq!(kind(d), FailureKind::Invalid, "{root:?}");
            assert_eq!(kind(f.w.read_file(root, 10)), FailureKind::IsDirectory);
        }
        for mode in [0o1000, 0o4755, 0o2755, u32::MAX] {
            let w = f.w.write_whole(vec![nf("m", mode, "x")]);
            assert_eq!(kind(w), FailureKind::Invalid, "{mode:o}");
        }
        assert!(!f.ws.join("m").exists());
        assert!(f.ws.is_dir());
    }

    #[test]
    fn reads_are_limited_and_say_by_how_much() {
        let f = fixture();
        write(&f.w, "f", &"x".repeat(100)).expect("write");
        assert_eq!(f.w.read_file("f", 100).expect("at the limit").len(), 100);
        let e = f.w.read_file("f", 99).expect_err("over the limit");
        assert_eq!(e.kind, FailureKind::TooLarge);
        assert_eq!(e.message, "f is 100 bytes, more than the 99 allowed");
    }

    #[test]
    fn read_failures() {
        let f = fixture();
        write(&f.w, "dir/file", "x").expect("write");
        symlink("nowhere", f.ws.join("dangling")).expect("symlink");
        assert_eq!(kind(f.w.read_file("missing", 10)), FailureKind::NotFound);
        assert_eq!(kind(f.w.read_file("nodir/x", 10)), FailureKind::NotFound);
        assert_eq!(kind(f.w.read_file("dangling", 10)), FailureKind::NotFound);
        assert_eq!(kind(f.w.read_file("dir", 10)), FailureKind::IsDirectory);
        let e = f.w.read_file("dir/file/x", 10).expect_err("through a file");
        assert_eq!(e.kind, FailureKind::NotDirectory);
        assert_eq!(e.message, "dir/file/x: dir/file is not a directory");
        let e = f.w.read_file("missing", 10).expect_err("missing");
        assert_eq!(e.message, "missing does not exist");
    }

    #[test]
    fn a_fifo_without_a_writer_is_not_regular_and_does_not_hang() {
        let f = fixture();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            f.ws.join("fifo").as_path(),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .expect("mkfifo");
        let (tx, rx) = std::sync::mpsc::channel();
        let w = f.w;
        std::thread::spawn(move || {
            let _ = tx.send(w.read_file("fifo", 10));
        });
        let r = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the read hung");
        assert_eq!(kind(r), FailureKind::NotRegular);
    }

    #[test]
    fn absolute_symlinks_outside_are_refused_everywhere() {
        let f = fixture();
        symlink(&f.outside, f.ws.join("out")).expect("symlink");
        symlink(f.outside.join("secret"), f.ws.join("secret")).expect("symlink");
        let escape = FailureKind::SymlinkEscape;
        // Through a directory component, and as the final component.
        assert_eq!(kind(f.w.read_file("out/secret", 100)), escape);
        assert_eq!(kind(f.w.read_file("secret", 100)), escape);
        assert_eq!(kind(write(&f.w, "out/new", "x")), escape);
        assert_eq!(kind(write(&f.w, "secret", "x")), escape);
        assert_eq!(kind(write(&f.w, "out/sub/new/deeper", "x")), escape);
        assert_eq!(kind(f.w.list_dir("out")), escape);
        assert_eq!(kind(f.w.list_dir("out/sub")), escape);
        assert_eq!(kind(f.w.delete(&["out/secret".to_string()], false)), escape);
        assert_eq!(kind(f.w.delete(&["out/sub".to_string()], true)), escape);
        let e = f.w.read_file("out/secret", 100).expect_err("escape");
        assert_eq!(
            e.message,
            "out/secret leads outside the workspace through a symlink"
        );
        assert_eq!(
            fs::read_to_string(f.outside.join("secret")).expect("read"),
            "secret"
        );
        assert!(f.outside.join("sub/f").exists());
        assert!(!f.outside.join("new").exists() && !f.outside.join("sub/new").exists());
        assert!(temps_under(&f.outside).is_empty());
    }

    #[test]
    fn relative_symlinks_climbing_out_are_refused() {
        let f = fixture();
        fs::create_dir(f.ws.join("d")).expect("mkdir");
        fs::write(f.ws.join("inside"), "inside").expect("write");
        symlink("../outside", f.ws.join("up")).expect("symlink");
        symlink("../../outside/secret", f.ws.join("d/up2")).expect("symlink");
        // Climbs above the root and back down by the workspace's own name:
        // still out (resolved against directories walked, not by spelling).
        symlink("../d/../../ws/inside", f.ws.join("d/back")).expect("symlink");
        symlink("..", f.ws.join("parent")).expect("symlink");
        let escape = FailureKind::SymlinkEscape;
        assert_eq!(kind(f.w.read_file("up/secret", 100)), escape);
        assert_eq!(kind(f.w.read_file("d/up2", 100)), escape);
        assert_eq!(kind(f.w.read_file("d/back", 100)), escape);
        assert_eq!(kind(f.w.list_dir("parent")), escape);
        assert_eq!(kind(f.w.read_file("parent/outside/secret", 100)), escape);
        assert_eq!(kind(write(&f.w, "up/new", "x")), escape);
        assert_eq!(kind(write(&f.w, "d/up2", "x")), escape);
        assert_eq!(
            fs::read_to_string(f.outside.join("secret")).expect("read"),
            "secret"
        );
        assert!(!f.outside.join("new").exists());
    }

    #[test]
    fn symlinks_inside_are_followed() {
        let f = fixture();
        write(&f.w, "real/f", "real").expect("write");
        symlink("real", f.ws.join("rel")).expect("symlink");
        symlink(f.ws.join("real/f"), f.ws.join("abs")).expect("symlink");
        symlink("real/f", f.ws.join("lf")).expect("symlink");
        symlink("new/dir/file", f.ws.join("dangling")).expect("symlink");
        symlink("./../real/.", f.ws.join("real/self")).expect("symlink");
        symlink("..", f.ws.join("real/up")).expect("symlink");
        symlink("real/", f.ws.join("slash")).expect("symlink");
        assert_eq!(read_text(&f.w, "rel/f"), "real");
        assert_eq!(read_text(&f.w, "abs"), "real");
        assert_eq!(read_text(&f.w, "real/self/self/f"), "real");
        assert_eq!(read_text(&f.w, "real/up/real/f"), "real");
        let names = |path| -> Vec<String> {
            let entries = f.w.list_dir(path).expect("list");
            entries.into_iter().map(|e| e.name).collect()
        };
        assert_eq!(names("rel"), ["f", "self", "up"]);
        assert_eq!(names("slash"), ["f", "self", "up"]);
        assert!(names("real/up").contains(&"real".to_string()));
        assert_eq!(kind(f.w.read_file("real/up", 10)), FailureKind::IsDirectory);
        // A write through a final symlink writes its target; the link stays.
        write(&f.w, "lf", "through").expect("write");
        assert_eq!(
            fs::read_to_string(f.ws.join("real/f")).expect("read"),
            "through"
        );
        assert!(is_symlink(&f.ws.join("lf")));
        // ...and creates what the target needs.
        write(&f.w, "dangling", "made").expect("write");
        assert_eq!(
            fs::read_to_string(f.ws.join("new/dir/file")).expect("read"),
            "made"
        );
        assert_eq!(kind(write(&f.w, "real/up", "x")), FailureKind::IsDirectory);
    }

    #[test]
    fn an_absolute_target_under_the_alias_spelling_stays_inside() {
        let f = fixture();
        write(&f.w, "real/f", "real").expect("write");
        symlink(f.alias.join("real/f"), f.ws.join("via_alias")).expect("symlink");
        symlink(f.alias.join("real"), f.ws.join("alias_dir")).expect("symlink");
        symlink(f.alias.join("../outside/secret"), f.ws.join("alias_out")).expect("symlink");
        let aliasx = format!("{}x/real/f", text(&f.alias));
        symlink(&aliasx, f.ws.join("aliasx")).expect("symlink");
        assert_eq!(read_text(&f.w, "via_alias"), "real");
        assert_eq!(read_text(&f.w, "alias_dir/f"), "real");
        write(&f.w, "alias_dir/g", "g").expect("write");
        assert_eq!(fs::read_to_string(f.ws.join("real/g")).expect("read"), "g");
        let escape = FailureKind::SymlinkEscape;
        assert_eq!(kind(f.w.read_file("alias_out", 100)), escape);
        assert_eq!(
            kind(f.w.read_file("aliasx", 100)),
            escape,
            "whole components only"
        );
    }

    #[test]
    fn symlink_loops_and_long_chains_are_refused() {
        let f = fixture();
        symlink("b", f.ws.join("a")).expect("symlink");
        symlink("a", f.ws.join("b")).expect("symlink");
        symlink("d", f.ws.join("d")).expect("symlink");
        symlink("e/x", f.ws.join("e")).expect("symlink");
        let e = f.w.read_file("a", 10).expect_err("loop");
        assert_eq!(e.kind, FailureKind::SymlinkEscape);
        assert_eq!(e.message, "a has too many levels of symlinks");
        assert_eq!(kind(f.w.read_file("d/x", 10)), FailureKind::SymlinkEscape);
        assert_eq!(kind(f.w.read_file("e", 10)), FailureKind::SymlinkEscape);
        assert_eq!(kind(write(&f.w, "a", "x")), FailureKind::SymlinkEscape);
        assert_eq!(kind(f.w.list_dir("d")), FailureKind::SymlinkEscape);
        // 40 symlinks on one path are fine, 41 are not (the kernel's limit),
        // counted over directory components and the final one together.
        write(&f.w, "target/f", "end").expect("write");
        symlink("target", f.ws.join("c0")).expect("symlink");
        for i in 1..=40 {
            symlink(format!("c{}", i - 1), f.ws.join(format!("c{i}"))).expect("symlink");
        }
        symlink("c38/f", f.ws.join("last")).expect("symlink");
        symlink("c39/f", f.ws.join("past")).expect("symlink");
        assert_eq!(read_text(&f.w, "c39/f"), "end", "c39 to c0: 40");
        assert_eq!(read_text(&f.w, "last"), "end", "last, then c38 to c0: 40");
        assert_eq!(kind(f.w.read_file("past", 10)), FailureKind::SymlinkEscape);
        assert_eq!(kind(f.w.read_file("c40/f", 10)), FailureKind::SymlinkEscape);
        symlink("c39", f.ws.join("one_more")).expect("symlink");
        assert_eq!(
            kind(f.w.read_file("one_more/f", 10)),
            FailureKind::SymlinkEscape
        );
    }

    #[test]
    fn a_final_symlink_is_deleted_itself() {
        let f = fixture();
        write(&f.w, "real/f", "x").expect("write");
        symlink(&f.outside, f.ws.join("out")).expect("symlink");
        symlink("real", f.ws.join("to_dir")).expect("symlink");
        symlink("real/f", f.ws.join("to_file")).expect("symlink");
        let paths = ["out", "to_dir", "to_file"].map(String::from);
        f.w.delete(&paths, false).expect("not directories");
        for p in &paths {
            assert!(fs::symlink_metadata(f.ws.join(p)).is_err(), "{p}");
        }
        assert!(f.outside.join("secret").exists());
        assert_eq!(read_text(&f.w, "real/f"), "x");
    }

    #[test]
    fn delete_rules() {
        let f = fixture();
        for p in ["f1", "f2", "dir/a", "file"] {
            write(&f.w, p, "x").expect("write");
        }
        let paths = |ps: &[&str]| ps.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        f.w.delete(&paths(&["missing", "nodir/missing"]), false)
            .expect("missing paths are skipped");
        // In order; a failure stops there, what came before stays deleted.
        let e = f.w.delete(&paths(&["f1", "dir", "f2"]), false);
        assert_eq!(
            e.expect_err("a directory").message,
            "dir is a directory; delete it with recursive: true"
        );
        assert!(!f.ws.join("f1").exists());
        assert!(f.ws.join("dir/a").exists() && f.ws.join("f2").exists());
        assert_eq!(
            kind(f.w.delete(&paths(&["file/x"]), false)),
            FailureKind::NotDirectory
        );
        // A tree, with symlinks in it that lead out: removed, not followed.
        write(&f.w, "tree/a/b/c", "x").expect("write");
        write(&f.w, "tree/.hidden", "x").expect("write");
        fs::create_dir(f.ws.join("tree/empty")).expect("mkdir");
        symlink(&f.outside, f.ws.join("tree/a/out")).expect("symlink");
        symlink(f.outside.join("secret"), f.ws.join("tree/secret")).expect("symlink");
        f.w.delete(&paths(&["tree", "dir", "f2"]), true)
            .expect("recursive");
        assert!(!f.ws.join("tree").exists() && !f.ws.join("dir").exists());
        assert!(f.outside.join("secret").exists() && f.outside.join("sub/f").exists());
        // Deep trees are no problem for the stack.
        let deep = vec!["d"; 300].join("/");
        write(&f.w, &format!("{deep}/f"), "x").expect("write");
        f.w.delete(&paths(&["d"]), true).expect("deep");
        assert!(!f.ws.join("d").exists());
        assert_eq!(
            f.w.list_dir("").expect("list").len(),
            1,
            "only `file` is left"
        );
    }

    fn hash(content: &[u8]) -> [u8; 32] {
        Sha256::digest(content).into()
    }

    #[test]
    fn a_failed_precondition_writes_nothing_and_names_the_hash_now() {
        let f = fixture();
        write(&f.w, "a", "one").expect("write");
        write(&f.w, "real/b", "bee").expect("write");
        symlink("real/b", f.ws.join("to_b")).expect("symlink");
        let with = |path: &str, content: &str, p: Precondition| {
            let mut whole = nf(path, 0o644, content);
            whole.0.precondition = p;
            whole
        };
        let stale = hash(b"old");
        let failed =
            f.w.write_whole(vec![
                with("new/dir/c", "c", Precondition::None),
                with("to_b", "B", Precondition::IfMatch(hash(b"bee"))),
                with("a", "A", Precondition::IfMatch(stale)),
                with("real/b", "B", Precondition::IfNoneMatch),
                with("gone", "g", Precondition::IfMatch(stale)),
            ])
            .expect("answered");
        assert_eq!(
            failed,
            [
                Mismatch {
                    path: "a".into(),
                    current: Some(hash(b"one"))
                },
                Mismatch {
                    path: "real/b".into(),
                    current: Some(hash(b"bee"))
                },
                Mismatch {
                    path: "gone".into(),
                    current: None
                },
            ]
        );
        assert_eq!(read_text(&f.w, "a"), "one");
        assert_eq!(read_text(&f.w, "real/b"), "bee");
        assert!(!f.ws.join("new").exists() && !f.ws.join("gone").exists());
        assert!(temps_under(&f.ws).is_empty());
        // Through the symlink, with the hash it has: written.
        let failed =
            f.w.write_whole(vec![
                with("to_b", "B", Precondition::IfMatch(hash(b"bee"))),
                with("fresh", "f", Precondition::IfNoneMatch),
            ])
            .expect("written");
        assert!(failed.is_empty());
        assert_eq!(read_text(&f.w, "real/b"), "B");
        assert_eq!(read_text(&f.w, "fresh"), "f");
    }

    #[test]
    fn stat_tells_kinds_without_following_the_last_symlink() {
        let f = fixture();
        f.w.write_whole(vec![nf("d/f", 0o640, "hello")])
            .expect("write");
        symlink("d/f", f.ws.join("link")).expect("symlink");
        symlink(&f.outside, f.ws.join("out")).expect("symlink");
        let paths: Vec<String> = ["d/f", "d", "link", "missing", "nodir/x", "out", ""]
            .map(String::from)
            .to_vec();
        let st = f.w.stat(&paths, true).expect("stat");
        let kinds: Vec<Option<EntryKind>> = st.iter().map(|s| s.kind).collect();
        assert_eq!(
            kinds,
            [
                Some(EntryKind::File),
                Some(EntryKind::Dir),
                Some(EntryKind::Symlink),
                None,
                None,
                Some(EntryKind::Symlink),
                Some(EntryKind::Dir),
            ]
        );
        assert_eq!((st[0].size, st[0].mode), (5, 0o640));
        assert_eq!(st[0].sha256, Some(hash(b"hello")));
        assert!(st[1..].iter().all(|s| s.sha256.is_none()));
        assert_eq!(
            kind(f.w.stat(&["out/secret".into()], false)),
            FailureKind::SymlinkEscape
        );
    }

    #[test]
    fn a_write_refused_at_a_later_target_changes_nothing() {
        let f = fixture();
        write(&f.w, "keep", "old").expect("write");
        fs::create_dir(f.ws.join("adir")).expect("mkdir");
        let files = vec![
            nf("new/dir/a", 0o644, "a"),
            nf("keep", 0o644, "new"),
            nf("adir", 0o644, "x"),
        ];
        let e = f.w.write_whole(files).expect_err("a directory");
        assert_eq!(e.kind, FailureKind::IsDirectory);
        assert_eq!(e.message, "adir is a directory");
        let files = vec![nf("x/y/z", 0o644, "z"), nf("keep/sub", 0o644, "x")];
        assert_eq!(kind(f.w.write_whole(files)), FailureKind::NotDirectory);
        assert!(
            !f.ws.join("new").exists(),
            "created directories are removed"
        );
        assert!(!f.ws.join("x").exists(), "created directories are removed");
        assert_eq!(read_text(&f.w, "keep"), "old");
        assert!(temps_under(&f.ws).is_empty());
    }

    #[test]
    fn a_write_failing_after_staging_leaves_no_temporaries() {
        let mut f = fixture();
        write(&f.w, "keep", "old").expect("write");
        fs::create_dir(f.ws.join("gone")).expect("mkdir");
        // The third file's directory disappears once the first two are
        // staged: creating its temporary fails.
        let gone = f.ws.join("gone");
        f.w.hook = Some(Box::new(move |step| {
            if step == Step::Stage("gone/f") {
                fs::remove_dir(&gone).expect("rmdir");
            }
        }));
        let files = vec![
            nf("n1/n2/first", 0o644, "first"),
            nf("keep", 0o644, "new"),
            nf("gone/f", 0o644, "x"),
        ];
        assert_eq!(kind(f.w.write_whole(files)), FailureKind::Changed);
        assert!(temps_under(&f.ws).is_empty(), "{:?}", temps_under(&f.ws));
        assert!(!f.ws.join("n1").exists(), "created directories are removed");
        assert_eq!(read_text(&f.w, "keep"), "old");
    }

    #[test]
    fn a_write_whose_content_ends_early_or_overruns_a_file_leaves_nothing() {
        let f = fixture();
        write(&f.w, "keep", "old").expect("write");
        let files = || {
            vec![
                NewFile {
                    path: "n/first".into(),
                    mode: 0o644,
                    size: 4,
                    precondition: Precondition::None,
                },
                NewFile {
                    path: "keep".into(),
                    mode: 0o644,
                    size: 3,
                    precondition: Precondition::None,
                },
            ]
        };
        // The connection goes away after the first file's content.
        let (tx, mut rx) = std::sync::mpsc::channel();
        tx.send(Bytes::from_static(b"abcd")).expect("send");
        drop(tx);
        let e = f.w.write_files(files(), &mut rx).expect_err("ended early");
        assert_eq!(e.kind, FailureKind::Other);
        assert_eq!(
            e.message,
            "the content of the write ended before every file was whole"
        );
        // A piece holding bytes of the first and the second file.
        let mut pieces: std::collections::VecDeque<Bytes> =
            [&b"ab"[..], b"cdnew"].map(Bytes::copy_from_slice).into();
        let e = f.w.write_files(files(), &mut pieces).expect_err("overrun");
        assert_eq!(e.kind, FailureKind::Other);
        assert_eq!(e.message, "n/first: a piece of content past its size");
        assert_eq!(read_text(&f.w, "keep"), "old");
        assert!(!f.ws.join("n").exists(), "created directories are removed");
        assert!(temps_under(&f.ws).is_empty());
    }

    #[test]
    fn entries_are_sorted_with_their_kinds() {
        let f = fixture();
        f.w.write_whole(vec![
            nf("b", 0o640, "bbb"),
            nf(".hidden", 0o644, ""),
            nf("Z", 0o644, "z"),
            nf("a/inner", 0o644, "x"),
        ])
        .expect("write");
        symlink("b", f.ws.join("c")).expect("symlink");
        symlink(&f.outside, f.ws.join("out")).expect("symlink");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            f.ws.join("fifo").as_path(),
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .expect("mkfifo");
        let when = SystemTime::UNIX_EPOCH + Duration::from_millis(1_234_567_891);
        let file = fs::File::options()
            .write(true)
            .open(f.ws.join("b"))
            .expect("open");
        file.set_modified(when).expect("set mtime");
        let entries = f.w.list_dir("").expect("list");
        let got: Vec<(&str, EntryKind)> =
            entries.iter().map(|e| (e.name.as_str(), e.kind)).collect();
        assert_eq!(
            got,
            [
                (".hidden", EntryKind::File),
                ("Z", EntryKind::File),
                ("a", EntryKind::Dir),
                ("b", EntryKind::File),
                ("c", EntryKind::Symlink),
                ("fifo", EntryKind::Other),
                ("out", EntryKind::Symlink),
            ]
        );
        let b = &entries[3];
        assert_eq!((b.size, b.mode, b.mtime_ms), (3, 0o640, 1_234_567_891));
        assert_eq!(
            entries[4].size, 1,
            "a symlink's size is its target's length"
        );
        assert_eq!(entries[5].mode, 0o600);
        assert_eq!(f.w.list_dir("a").expect("list")[0].name, "inner");
        assert_eq!(kind(f.w.list_dir("missing")), FailureKind::NotFound);
        assert_eq!(kind(f.w.list_dir("nodir/missing")), FailureKind::NotFound);
        let e = f.w.list_dir("b").expect_err("a file");
        assert_eq!(
            (e.kind, e.message.as_str()),
            (FailureKind::NotDirectory, "b is not a directory")
        );
    }

    /// Swaps `dir` for a symlink to `to` the first time `at` is reached.
    fn swap_at(f: &mut Fixture, at: Step<'static>, dir: &str, to: PathBuf) {
        let from = f.ws.join(dir);
        let done = AtomicBool::new(false);
        f.w.hook = Some(Box::new(move |step| {
            if step == at && !done.swap(true, Ordering::SeqCst) {
                let moved = from.with_extension("moved");
                fs::rename(&from, moved).expect("move away");
                symlink(&to, &from).expect("swap in a symlink");
            }
        }));
    }

    #[test]
    fn a_directory_swapped_for_a_symlink_mid_walk_is_changed() {
        let mut f = fixture();
        write(&f.w, "a/sub/f", "inside").expect("write");
        let outside = f.outside.clone();
        swap_at(&mut f, Step::OpenDir("a"), "a", outside);
        let e = f.w.read_file("a/sub/f", 100).expect_err("swapped");
        assert_eq!(
            (e.kind, e.message.as_str()),
            (
                FailureKind::Changed,
                "a/sub/f changed while it was being opened"
            )
        );
        // Walked again, the symlink is seen and refused.
        assert_eq!(
            kind(f.w.read_file("a/sub/f", 100)),
            FailureKind::SymlinkEscape
        );
        assert_eq!(kind(f.w.list_dir("a/sub")), FailureKind::SymlinkEscape);
    }

    #[test]
    fn a_target_swapped_for_a_symlink_before_its_open_is_changed() {
        let mut f = fixture();
        write(&f.w, "t", "inside").expect("write");
        let secret = f.outside.join("secret");
        swap_at(&mut f, Step::OpenTarget("t"), "t", secret);
        assert_eq!(kind(f.w.read_file("t", 100)), FailureKind::Changed);

        let mut f = fixture();
        write(&f.w, "d/f", "inside").expect("write");
        let outside = f.outside.clone();
        swap_at(&mut f, Step::OpenTarget("d"), "d", outside);
        assert_eq!(kind(f.w.list_dir("d")), FailureKind::Changed);
    }

    #[test]
    fn permission_denied_unless_root() {
        if rustix::process::geteuid().is_root() {
            eprintln!("permission_denied_unless_root: skipped, root bypasses permission checks");
            return;
        }
        let f = fixture();
        write(&f.w, "locked/f", "x").expect("write");
        let locked = f.ws.join("locked");
        fs::set_permissions(&locked, fs::Permissions::from_mode(0o000)).expect("chmod");
        let r = f.w.read_file("locked/f", 10);
        fs::set_permissions(&locked, fs::Permissions::from_mode(0o755)).expect("chmod back");
        assert_eq!(kind(r), FailureKind::PermissionDenied);
    }

    /// RLIMIT_FSIZE and SIGXFSZ belong to the whole process, so this test
    /// runs itself again, alone, in a child process that sets them.
    #[test]
    fn a_write_past_the_file_size_limit_is_too_large() {
        const CHILD: &str = "SANDBOXD_AGENT_TEST_FSIZE_CHILD";
        const NAME: &str = "files::tests::a_write_past_the_file_size_limit_is_too_large";
        if std::env::var_os(CHILD).is_none() {
            let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
                .args(["--exact", NAME, "--test-threads=1", "--nocapture"])
                .env(CHILD, "1")
                .output()
                .expect("run the child");
            let said = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(out.status.success(), "child failed: {said}");
            assert!(said.contains("1 passed"), "child ran no test: {said}");
            return;
        }
        // As the agent must: a handler for SIGXFSZ, so that a write past the
        // limit fails with EFBIG instead of killing the process.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .expect("runtime");
        let xfsz =
            tokio::signal::unix::SignalKind::from_raw(rustix::process::Signal::XFSZ.as_raw());
        let _handler = rt
            .block_on(async { tokio::signal::unix::signal(xfsz) })
            .expect("SIGXFSZ handler");
        let f = fixture();
        let fsize = rustix::process::Resource::Fsize;
        let old = rustix::process::getrlimit(fsize);
        rustix::process::setrlimit(
            fsize,
            rustix::process::Rlimit {
                current: Some(4096),
                maximum: old.maximum,
            },
        )
        .expect("setrlimit");
        let files = vec![
            nf("small", 0o644, vec![1; 100]),
            nf("d/big", 0o644, vec![2; 10_000]),
        ];
        let e = f.w.write_whole(files).expect_err("too big");
        assert_eq!(e.kind, FailureKind::TooLarge);
        assert_eq!(
            e.message,
            "the file would exceed the sandbox's file size limit of 4096 bytes"
        );
        assert!(!f.ws.join("small").exists() && !f.ws.join("d").exists());
        assert!(temps_under(&f.ws).is_empty());
    }
}
