//! Reading the workspace: a file's content, bounded and only from a
//! regular file ([`Workspace::read_file`]), and what paths are, with a
//! regular file's hash when asked ([`Workspace::stat`]).

use std::fs::File;
use std::io::Read;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use sandboxd_proto::{EntryKind, Failure, FailureKind, PathStat};

use super::entries::{dir_entry, hash_at};
use super::failure::{changed, io_failure, is_directory, not_found, not_regular, os, shown};
use super::resolve::{Located, Resolve, Workspace, parse};

#[cfg(test)]
use super::resolve::Step;

impl Workspace {
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
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::{PermissionsExt, symlink};
    use std::time::Duration;

    use super::*;
    use crate::files::fixture::{fixture, hash, kind, nf, write};

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
}
