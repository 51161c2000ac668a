//! What sandboxd's workspace checkpoints need of the workspace: every
//! entry with what tells its content unchanged ([`Workspace::snapshot`]),
//! a file's content only while it is the file the snapshot saw
//! ([`Workspace::read_exact`]), and, for a restore, permission bits set
//! and symlinks made without following one ([`Workspace::set_modes`],
//! [`Workspace::make_symlinks`]). The walk opens every directory with
//! `O_NOFOLLOW` relative to its parent, so a symlink is an entry, never a
//! way out.

use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;
use sandboxd_proto::{
    EntryKind, Failure, FailureKind, FileIdentity, MAX_LINK_TARGET, MAX_SNAPSHOT_DEPTH, NewSymlink,
    PathMode, SnapshotEntry,
};

use super::entries::{Name, sorted_names};
use super::failure::{changed, io_failure, not_found, not_regular, os, shown};
use super::resolve::{Located, Resolve, Workspace, parse};
use crate::nofollow::open_dir;

/// A file's content goes in pieces of this size.
pub(crate) const READ_PIECE: usize = 256 * 1024;

#[allow(
    clippy::unnecessary_cast,
    reason = "the stat fields are i64 on 64-bit targets, narrower elsewhere"
)]
fn identity(st: &Stat) -> FileIdentity {
    let ns = |secs: i64, nanos: i64| secs.saturating_mul(1_000_000_000).saturating_add(nanos);
    FileIdentity {
        size: u64::try_from(st.st_size).unwrap_or(0),
        mtime_ns: ns(st.st_mtime as i64, st.st_mtime_nsec as i64),
        ctime_ns: ns(st.st_ctime as i64, st.st_ctime_nsec as i64),
        ino: st.st_ino as u64,
    }
}

fn utf8(bytes: Vec<u8>, what: &str) -> Result<String, Failure> {
    String::from_utf8(bytes).map_err(|e| {
        Failure::new(
            FailureKind::Invalid,
            format!(
                "{what} {:?} is not UTF-8",
                String::from_utf8_lossy(e.as_bytes())
            ),
        )
    })
}

/// One walk of [`Workspace::snapshot`].
struct Walk {
    max_entries: usize,
    entries: Vec<SnapshotEntry>,
}

impl Walk {
    /// Adds the entries of `dir` (at `prefix`, `depth` levels down), then
    /// those of each directory in it.
    fn dir(&mut self, dir: &OwnedFd, prefix: &str, depth: usize) -> Result<(), Failure> {
        if depth > MAX_SNAPSHOT_DEPTH {
            return Err(Failure::new(
                FailureKind::TooMany,
                format!(
                    "{} is more than {MAX_SNAPSHOT_DEPTH} levels deep",
                    shown(prefix)
                ),
            ));
        }
        let mut subdirs: Vec<(Name, String, FileIdentity)> = Vec::new();
        let names = sorted_names(dir).map_err(|f| unreadable(f, prefix))?;
        for name in names {
            let st = match rustix::fs::statat(dir, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                // Removed since the directory was read.
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(unreadable(os(e), prefix)),
            };
            let text = utf8(name.clone(), "the name")?;
            let path = if prefix.is_empty() {
                text
            } else {
                format!("{prefix}/{text}")
            };
            let (kind, target) = match FileType::from_raw_mode(st.st_mode) {
                FileType::RegularFile => (EntryKind::File, None),
                FileType::Directory => (EntryKind::Dir, None),
                FileType::Symlink => {
                    let target = rustix::fs::readlinkat(dir, name.as_slice(), Vec::new())
                        .map_err(|e| match e {
                            Errno::NOENT | Errno::INVAL => changed(&path),
                            e => os(e),
                        })?
                        .into_bytes();
                    if target.len() > MAX_LINK_TARGET {
                        return Err(Failure::new(
                            FailureKind::TooLarge,
                            format!("the target of {path} is over {MAX_LINK_TARGET} bytes"),
                        ));
                    }
                    (EntryKind::Symlink, Some(utf8(target, "the link target")?))
                }
                // FIFOs, sockets and devices hold no content to keep.
                _ => continue,
            };
            if self.entries.len() >= self.max_entries {
                return Err(Failure::new(
                    FailureKind::TooMany,
                    format!("the workspace holds more than {} entries", self.max_entries),
                ));
            }
            if kind == EntryKind::Dir {
                subdirs.push((name, path.clone(), identity(&st)));
            }
            self.entries.push(SnapshotEntry {
                path,
                kind,
                mode: st.st_mode & 0o7777,
                identity: identity(&st),
                target,
            });
        }
        for (name, path, seen) in subdirs {
            let sub = match open_dir(dir, name.as_slice()) {
                Ok(fd) => fd,
                // Swapped for something else since it was looked at.
                Err(Errno::LOOP | Errno::NOTDIR | Errno::NOENT) => return Err(changed(&path)),
                // A refusal (EACCES) is the directory's own only while
                // the name still holds the directory the walk saw;
                // otherwise it was swapped meanwhile, which is a change.
                Err(e) => {
                    let now = rustix::fs::statat(dir, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW);
                    return Err(match now {
                        Ok(st)
                            if FileType::from_raw_mode(st.st_mode) == FileType::Directory
                                && identity(&st) == seen =>
                        {
                            unreadable(os(e), &path)
                        }
                        _ => changed(&path),
                    });
                }
            };
            self.dir(&sub, &path, depth + 1)?;
        }
        Ok(())
    }
}

/// A failure to read directory `path` (`""`: the workspace): one the
/// sandbox user's permissions caused names the directory.
fn unreadable(f: Failure, path: &str) -> Failure {
    if f.kind != FailureKind::PermissionDenied {
        return f;
    }
    Failure::new(
        FailureKind::PermissionDenied,
        format!(
            "{} cannot be read by the sandbox user ({})",
            shown(path),
            f.message
        ),
    )
}

impl Workspace {
    /// Every entry under the workspace (see [`sandboxd_proto::Op::Snapshot`]).
    pub(crate) fn snapshot(&self, max_entries: usize) -> Result<Vec<SnapshotEntry>, Failure> {
        let mut r = Resolve { path: "", hops: 0 };
        let Located { dir, .. } = self.locate(&mut r, Vec::new(), false, None)?;
        let mut walk = Walk {
            max_entries,
            entries: Vec::new(),
        };
        walk.dir(&dir, "", 1)?;
        Ok(walk.entries)
    }

    /// The directory `path` is in and its last name (not followed if a
    /// symlink); `root` when `path` is the workspace itself.
    fn leaf_of(
        &self,
        path: &str,
        root: impl FnOnce() -> Failure,
    ) -> Result<(OwnedFd, Name), Failure> {
        let parts = parse(path)?;
        let mut r = Resolve { path, hops: 0 };
        let Located { dir, leaf } = self.locate(&mut r, parts, false, None)?;
        Ok((dir, leaf.ok_or_else(root)?))
    }

    /// Regular file `path` (not followed if a symlink), opened and checked
    /// to be `expect`: the open file, read by [`read_checked`].
    pub(crate) fn open_exact(&self, path: &str, expect: FileIdentity) -> Result<File, Failure> {
        let (dir, leaf) = self.leaf_of(path, || not_regular(path))?;
        let flags =
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
        let fd =
            rustix::fs::openat(&dir, leaf.as_slice(), flags, Mode::empty()).map_err(
                |e| match e {
                    Errno::NOENT | Errno::LOOP | Errno::NXIO | Errno::NODEV => changed(path),
                    e => unreadable(os(e), path),
                },
            )?;
        let st = rustix::fs::fstat(&fd).map_err(os)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || identity(&st) != expect {
            return Err(changed(path));
        }
        Ok(File::from(fd))
    }

    /// Sets each path's permission bits, refusing a symlink.
    pub(crate) fn set_modes(&self, modes: &[PathMode]) -> Result<(), Failure> {
        for m in modes {
            if m.mode > 0o7777 {
                return Err(Failure::new(
                    FailureKind::Invalid,
                    format!("mode {:o} of {} is over 0o7777", m.mode, shown(&m.path)),
                ));
            }
            let (dir, leaf) = self.leaf_of(&m.path, || {
                Failure::new(
                    FailureKind::Invalid,
                    "the workspace directory's mode is not set",
                )
            })?;
            let st = rustix::fs::statat(&dir, leaf.as_slice(), AtFlags::SYMLINK_NOFOLLOW).map_err(
                |e| match e {
                    Errno::NOENT => not_found(&m.path),
                    e => os(e),
                },
            )?;
            if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
                return Err(not_regular(&m.path));
            }
            // Linux's chmod follows a symlink swapped in after the look
            // above; the agent has no right the sandbox user lacks, so that
            // race changes nothing the user could not change itself.
            rustix::fs::chmodat(
                &dir,
                leaf.as_slice(),
                Mode::from_raw_mode(m.mode),
                AtFlags::empty(),
            )
            .map_err(os)?;
        }
        Ok(())
    }

    /// Makes each symlink; something already at a path is refused.
    pub(crate) fn make_symlinks(&self, links: &[NewSymlink]) -> Result<(), Failure> {
        for l in links {
            if l.target.is_empty() || l.target.len() > MAX_LINK_TARGET || l.target.contains('\0') {
                return Err(Failure::new(
                    FailureKind::Invalid,
                    format!(
                        "the target of {} is empty, too long or holds NUL",
                        shown(&l.path)
                    ),
                ));
            }
            let (dir, leaf) = self.leaf_of(&l.path, || {
                Failure::new(
                    FailureKind::AlreadyExists,
                    "the workspace directory is there",
                )
            })?;
            rustix::fs::symlinkat(l.target.as_str(), &dir, leaf.as_slice()).map_err(
                |e| match e {
                    Errno::EXIST => Failure::new(
                        FailureKind::AlreadyExists,
                        format!("{} exists", shown(&l.path)),
                    ),
                    e => os(e),
                },
            )?;
        }
        Ok(())
    }
}

/// Reads `file` piece by piece into `piece` (false: stop, nobody takes
/// more), then checks that it is still `expect` (a write during the read
/// changes its times or size).
pub(crate) fn read_checked(
    mut file: File,
    path: &str,
    expect: FileIdentity,
    mut piece: impl FnMut(Vec<u8>) -> bool,
) -> Result<(), Failure> {
    let mut read = 0u64;
    loop {
        let mut buf = vec![0u8; READ_PIECE];
        let n = loop {
            match file.read(&mut buf) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_failure(e)),
            }
        };
        if n == 0 {
            break;
        }
        read += n as u64;
        if read > expect.size {
            return Err(changed(path));
        }
        buf.truncate(n);
        if !piece(buf) {
            return Ok(());
        }
    }
    let st = rustix::fs::fstat(&file).map_err(os)?;
    if read != expect.size || identity(&st) != expect {
        return Err(changed(path));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::{PermissionsExt, symlink};

    use super::*;
    use crate::files::fixture::{fixture, kind};

    fn entry<'a>(all: &'a [SnapshotEntry], path: &str) -> &'a SnapshotEntry {
        all.iter()
            .find(|e| e.path == path)
            .unwrap_or_else(|| panic!("{path} in {all:?}"))
    }

    #[test]
    fn a_snapshot_lists_every_entry_and_follows_no_symlink() {
        let f = fixture();
        fs::create_dir_all(f.ws.join("a/empty")).expect("mkdir");
        fs::write(f.ws.join("a/x"), "xx").expect("write");
        fs::set_permissions(f.ws.join("a/x"), fs::Permissions::from_mode(0o751)).expect("chmod");
        symlink(&f.outside, f.ws.join("out")).expect("symlink");
        let all = f.w.snapshot(100).expect("snapshot");
        let paths: Vec<&str> = all.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["a", "out", "a/empty", "a/x"]);
        let x = entry(&all, "a/x");
        assert_eq!(
            (x.kind, x.mode, x.identity.size),
            (EntryKind::File, 0o751, 2)
        );
        let out = entry(&all, "out");
        assert_eq!(out.kind, EntryKind::Symlink);
        assert_eq!(out.target.as_deref(), f.outside.to_str());
        assert_eq!(kind(f.w.snapshot(3)), FailureKind::TooMany);
    }

    #[test]
    fn special_files_are_left_out_and_depth_is_bounded() {
        let f = fixture();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            f.ws.join("fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .expect("mkfifo");
        fs::write(f.ws.join("f"), "x").expect("write");
        let all = f.w.snapshot(10).expect("snapshot");
        let paths: Vec<&str> = all.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["f"], "the FIFO is left out");
        let deep = f.ws.join(vec!["d"; MAX_SNAPSHOT_DEPTH + 1].join("/"));
        fs::create_dir_all(deep).expect("mkdir");
        assert_eq!(kind(f.w.snapshot(100_000)), FailureKind::TooMany);
    }

    #[test]
    fn a_file_is_read_only_while_it_is_what_the_snapshot_saw() {
        let f = fixture();
        fs::write(f.ws.join("f"), "one").expect("write");
        let all = f.w.snapshot(10).expect("snapshot");
        let expect = entry(&all, "f").identity;
        let file = f.w.open_exact("f", expect).expect("open");
        let mut got = Vec::new();
        read_checked(file, "f", expect, |p| {
            got.extend(p);
            true
        })
        .expect("read");
        assert_eq!(got, b"one");
        fs::write(f.ws.join("f"), "two!").expect("rewrite");
        assert_eq!(kind(f.w.open_exact("f", expect)), FailureKind::Changed);
        symlink("f", f.ws.join("l")).expect("symlink");
        assert_eq!(kind(f.w.open_exact("l", expect)), FailureKind::Changed);
    }

    #[test]
    fn modes_and_symlinks_are_made_without_following_one() {
        let f = fixture();
        fs::write(f.ws.join("f"), "x").expect("write");
        let link = NewSymlink {
            path: "l".into(),
            target: f.outside.join("secret").to_str().expect("utf-8").into(),
        };
        f.w.make_symlinks(std::slice::from_ref(&link))
            .expect("symlink");
        assert_eq!(
            fs::read_link(f.ws.join("l")).expect("link"),
            f.outside.join("secret")
        );
        assert_eq!(kind(f.w.make_symlinks(&[link])), FailureKind::AlreadyExists);
        let set = |path: &str, mode| {
            f.w.set_modes(&[PathMode {
                path: path.into(),
                mode,
            }])
        };
        set("f", 0o600).expect("chmod");
        let mode = fs::metadata(f.ws.join("f"))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o600);
        assert_eq!(kind(set("l", 0o600)), FailureKind::NotRegular);
        let outside = fs::metadata(f.outside.join("secret")).expect("meta");
        assert_ne!(outside.permissions().mode() & 0o7777, 0o600, "not followed");
    }
}
