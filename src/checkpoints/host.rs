//! The workspace read on the host. Under runc a sandbox's workspace volume
//! is a directory of this host (`Sandboxes::workspace_host_dir`), so a
//! checkpoint reads the files its snapshot names there, at the disk's
//! speed, instead of through the agent and the engine's stream. The files
//! are the sandbox's, so hostile input here too: every open resolves
//! beneath the volume's directory and crosses no symlink, magic link or
//! mount (`openat2`), opens without following or blocking, and takes only
//! a regular file with the inode, size, modification and change times the
//! snapshot saw, the same again after the read, which stops at that size.
//! A file that fails any of this (changed, replaced, a directory swapped
//! for a link, a directory sandboxd may not read) is a miss, and the
//! agent reads it instead, as it reads every file under other runtimes.
//! So is a file the sandbox user might not read ([`sandbox_user_may`]):
//! the agent, which reads as the sandbox user, refuses it, and a
//! checkpoint answers the same under every runtime.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

use super::manifest::Entry;
use super::store::{Store, StoreResult, Stored};

/// Bytes read at once from a large file.
const PIECE: usize = 1024 * 1024;

/// The workspace's directory on the host, open.
pub(super) struct HostTree {
    root: OwnedFd,
    /// The sandbox user (in the sandbox's terms).
    uid: u32,
}

/// Whether the sandbox user, `uid`, may certainly do what `need` (`0o4`
/// read, `0o1` search, or both) to open file `fd` of `st`, by its mode
/// bits. Its owner's rights are the owner bits. Anyone else's may be the
/// group's or the others' (the user's groups are the image's), and the
/// owner may be the user under another number (an engine that maps user
/// ids), so every class must allow, and no access ACL may name anyone.
pub(super) fn sandbox_user_may(fd: BorrowedFd<'_>, st: &Stat, uid: u32, need: u32) -> bool {
    let class = |shift: u32| (st.st_mode >> shift) & need == need;
    if st.st_uid == uid {
        return class(6);
    }
    class(6)
        && class(3)
        && class(0)
        && matches!(
            rustix::fs::fgetxattr_query(fd, "system.posix_acl_access"),
            Err(Errno::NODATA | Errno::OPNOTSUPP)
        )
}

/// Whether `st` is the file the agent's snapshot saw.
#[allow(
    clippy::unnecessary_cast,
    reason = "the stat fields are i64 on 64-bit targets, narrower elsewhere"
)]
fn same_file(st: &Stat, e: &Entry) -> bool {
    let ns = |secs: i64, nanos: i64| secs.saturating_mul(1_000_000_000).saturating_add(nanos);
    rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile
        && u64::try_from(st.st_size).ok() == Some(e.size)
        && ns(st.st_mtime as i64, st.st_mtime_nsec as i64) == e.mtime_ns
        && ns(st.st_ctime as i64, st.st_ctime_nsec as i64) == e.ctime_ns
        && st.st_ino as u64 == e.ino
}

impl HostTree {
    /// Opens the workspace's directory (a path the engine gave, not the
    /// sandbox), whose sandbox user is `uid`.
    pub(super) fn open(dir: &Path, uid: u32) -> io::Result<HostTree> {
        let root = rustix::fs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(HostTree { root, uid })
    }

    /// The sandbox user.
    pub(super) fn uid(&self) -> u32 {
        self.uid
    }

    /// The volume's directory, open as a path only.
    pub(super) fn root(&self) -> &OwnedFd {
        &self.root
    }

    /// File `e`, open, when it is the file the snapshot saw.
    fn open_file(&self, e: &Entry) -> Option<File> {
        let fd = rustix::fs::openat2(
            &self.root,
            e.path.as_str(),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH
                | ResolveFlags::NO_SYMLINKS
                | ResolveFlags::NO_MAGICLINKS
                | ResolveFlags::NO_XDEV,
        )
        .ok()?;
        let st = rustix::fs::fstat(&fd).ok()?;
        (same_file(&st, e) && sandbox_user_may(fd.as_fd(), &st, self.uid, 0o4))
            .then(|| File::from(fd))
    }

    /// Whether `file` is still the file the snapshot saw.
    fn unchanged(file: &File, e: &Entry) -> bool {
        rustix::fs::fstat(file).is_ok_and(|st| same_file(&st, e))
    }

    /// The content of file `e`, or `None` for a miss.
    pub(super) fn read(&self, e: &Entry) -> Option<Vec<u8>> {
        let mut file = self.open_file(e)?;
        let size = usize::try_from(e.size).ok()?;
        let mut content = Vec::with_capacity(size);
        // One byte past the size shows a file that grew.
        file.by_ref()
            .take(e.size.saturating_add(1))
            .read_to_end(&mut content)
            .ok()?;
        (content.len() == size && Self::unchanged(&file, e)).then_some(content)
    }

    /// File `e` streamed into the store: `Ok(None)` for a miss (nothing
    /// stored), an error only for the store's own failures.
    pub(super) fn store(&self, store: &Store, e: &Entry) -> StoreResult<Option<Stored>> {
        let Some(mut file) = self.open_file(e) else {
            return Ok(None);
        };
        let mut writer = store.new_object()?;
        let mut piece = vec![0u8; PIECE];
        let complete = loop {
            let n = match file.read(&mut piece) {
                Ok(0) => break writer.size() == e.size,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break false,
            };
            if writer.size() + n as u64 > e.size {
                break false;
            }
            if let Err(err) = writer.write(&piece[..n]) {
                writer.discard();
                return Err(err);
            }
        };
        if !complete || !Self::unchanged(&file, e) {
            writer.discard();
            return Ok(None);
        }
        writer.finish(store).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;
    use crate::checkpoints::manifest::EntryKind;

    fn entry(dir: &Path, path: &str) -> Entry {
        let m = std::fs::symlink_metadata(dir.join(path)).unwrap();
        Entry {
            path: path.into(),
            kind: EntryKind::File,
            mode: m.mode() & 0o7777,
            size: m.size(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            ctime_ns: m.ctime() * 1_000_000_000 + m.ctime_nsec(),
            ino: m.ino(),
            sha256: None,
            target: None,
        }
    }

    /// The uid that owns what a test makes.
    fn owner(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().uid()
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("sandboxd-host-tree-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("ws/sub")).unwrap();
        dir
    }

    #[test]
    fn a_file_as_the_snapshot_saw_it_is_read_and_anything_else_is_a_miss() {
        let dir = scratch("read");
        let ws = dir.join("ws");
        std::fs::write(ws.join("sub/f"), b"hello").unwrap();
        std::fs::write(dir.join("outside"), b"secret").unwrap();
        let tree = HostTree::open(&ws, owner(&ws)).unwrap();

        // Control: the file as the snapshot saw it.
        let seen = entry(&ws, "sub/f");
        assert_eq!(tree.read(&seen).as_deref(), Some(&b"hello"[..]));

        // Changed since the snapshot (a new size: two writes within one
        // clock tick may keep the times, as for the agent's own check).
        std::fs::write(ws.join("sub/f"), b"HELLO!").unwrap();
        assert_eq!(tree.read(&seen), None, "a changed file is a miss");

        // One its owner may not read (the agent answers for it).
        std::fs::set_permissions(ws.join("sub/f"), std::fs::Permissions::from_mode(0o244)).unwrap();
        assert_eq!(
            tree.read(&entry(&ws, "sub/f")),
            None,
            "an unreadable file is a miss"
        );
        std::fs::set_permissions(ws.join("sub/f"), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(
            tree.read(&entry(&ws, "sub/f")).as_deref(),
            Some(&b"HELLO!"[..])
        );
        // Another user's file is read only when every class may read it:
        // the user's groups are not known here, nor whether the owner is
        // the user under another number.
        let as_other = HostTree::open(&ws, owner(&ws) + 1).unwrap();
        assert_eq!(
            as_other.read(&entry(&ws, "sub/f")).as_deref(),
            Some(&b"HELLO!"[..]),
            "0o644: anyone may read it"
        );
        for mode in [0o604, 0o640, 0o044] {
            std::fs::set_permissions(ws.join("sub/f"), std::fs::Permissions::from_mode(mode))
                .unwrap();
            let e = entry(&ws, "sub/f");
            assert_eq!(as_other.read(&e), None, "{mode:o}: a class may not read");
            if mode & 0o400 != 0 {
                assert!(tree.read(&e).is_some(), "{mode:o}: its owner may");
            }
        }
        std::fs::set_permissions(ws.join("sub/f"), std::fs::Permissions::from_mode(0o644)).unwrap();

        // A directory swapped for a link to outside the workspace, with
        // an entry that matches the file out there: never followed.
        let outside = entry(&dir, "outside");
        // Control: that entry names the file, read where it is.
        let at_dir = HostTree::open(&dir, owner(&dir)).unwrap();
        assert_eq!(at_dir.read(&outside).as_deref(), Some(&b"secret"[..]));
        std::fs::rename(ws.join("sub"), ws.join("old")).unwrap();
        std::os::unix::fs::symlink(&dir, ws.join("sub")).unwrap();
        let through_link = Entry {
            path: "sub/outside".into(),
            ..outside.clone()
        };
        assert_eq!(tree.read(&through_link), None, "a link is never followed");
        // ... nor is a path that climbs out.
        let climbing = Entry {
            path: "../outside".into(),
            ..outside
        };
        assert_eq!(tree.read(&climbing), None, "nothing outside is read");
        // Control: the same file under its own name in the workspace
        // (a link as the last component is not followed either).
        std::os::unix::fs::symlink(dir.join("outside"), ws.join("last")).unwrap();
        let last = Entry {
            path: "last".into(),
            ..entry(&dir, "outside")
        };
        assert_eq!(tree.read(&last), None, "a final link is not followed");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_fifo_is_a_miss_without_blocking_and_a_large_file_streams_into_the_store() {
        let dir = scratch("fifo");
        let ws = dir.join("ws");
        std::fs::write(ws.join("f"), b"x").unwrap();
        let as_file = entry(&ws, "f");
        std::fs::remove_file(ws.join("f")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            ws.join("f"),
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let tree = HostTree::open(&ws, owner(&ws)).unwrap();
        let fifo = Entry {
            ino: std::fs::symlink_metadata(ws.join("f")).unwrap().ino(),
            ..as_file
        };
        assert_eq!(tree.read(&fifo), None, "a fifo is a miss");

        let content: Vec<u8> = (0..3 * PIECE + 17).map(|i| (i % 251) as u8).collect();
        std::fs::write(ws.join("big"), &content).unwrap();
        let store = Store::at(dir.join("store"), Default::default());
        let big = entry(&ws, "big");
        let stored = tree.store(&store, &big).unwrap().unwrap();
        assert_eq!(stored.size, content.len() as u64);
        assert_eq!(
            store.read_object(&stored.sha256, stored.size).unwrap(),
            content
        );
        // Grown since the snapshot: a miss, nothing stored.
        std::fs::write(ws.join("big"), [&content[..], b"more"].concat()).unwrap();
        assert_eq!(tree.store(&store, &big).unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
