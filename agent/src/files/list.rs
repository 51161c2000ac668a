//! Listing the workspace: a directory's entries, sorted, symlinks in it
//! not followed ([`Workspace::list_dir`]), and a directory opened for an
//! operation that walks it ([`Workspace::open_dir`], for the search).

use std::os::fd::OwnedFd;

use rustix::fs::{AtFlags, FileType};
use rustix::io::Errno;
use sandboxd_proto::{DirEntry, Failure, FailureKind};

use super::entries::{dir_entry, read_names};
use super::failure::{changed, not_found, os, shown};
use super::resolve::{Located, Resolve, Workspace, parse};
use crate::nofollow::open_dir;

#[cfg(test)]
use super::resolve::Step;

impl Workspace {
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
        open_dir(&dir, leaf.as_slice()).map_err(|e| match e {
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
                open_dir(&dir, leaf.as_slice()).map_err(|e| match e {
                    Errno::LOOP | Errno::NOTDIR => changed(path),
                    e => os(e),
                })?
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
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;
    use std::time::{Duration, SystemTime};

    use sandboxd_proto::EntryKind;

    use super::*;
    use crate::files::fixture::{fixture, kind, nf};

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
            rustix::fs::Mode::from_raw_mode(0o600),
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
}
