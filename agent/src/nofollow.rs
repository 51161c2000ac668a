//! Opening a directory without following a symlink, on every runtime:
//! the one way the agent's walks (files, checkpoints, search, watches)
//! step into a directory of the workspace, which the sandbox may swap for
//! a link at any moment.

use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// How a directory is opened: a symlink in its place makes the open fail
/// (ELOOP or ENOTDIR) instead of being followed, under runc.
const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Opens directory `name` in `dir` without following a symlink: ELOOP or
/// ENOTDIR when `name` is a symlink. gVisor (runsc 20240729) follows a
/// final symlink despite `O_NOFOLLOW` when `O_DIRECTORY` is given, so the
/// open is checked against what `name` is after it: not the directory
/// opened (a link followed, or a swap meanwhile) is ELOOP, as the kernel
/// answers for a link.
pub(crate) fn open_dir(dir: impl AsFd, name: &[u8]) -> Result<OwnedFd, Errno> {
    let fd = rustix::fs::openat(&dir, name, DIR_FLAGS, Mode::empty())?;
    let opened = rustix::fs::fstat(&fd)?;
    let named = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    if FileType::from_raw_mode(named.st_mode) != FileType::Directory
        || (named.st_dev, named.st_ino) != (opened.st_dev, opened.st_ino)
    {
        return Err(Errno::LOOP);
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_opens_and_a_link_to_one_does_not() {
        let dir = std::env::temp_dir().join(format!("agent-nofollow-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("real")).expect("mkdir");
        std::os::unix::fs::symlink(dir.join("real"), dir.join("link")).expect("symlink");
        std::fs::write(dir.join("file"), b"x").expect("write");
        let parent = rustix::fs::open(&dir, DIR_FLAGS, Mode::empty()).expect("open");
        // Control: the directory itself opens.
        assert!(open_dir(&parent, b"real").is_ok());
        let refused = |name: &[u8]| open_dir(&parent, name).err();
        assert!(matches!(
            refused(b"link"),
            Some(Errno::LOOP | Errno::NOTDIR)
        ));
        assert!(matches!(refused(b"file"), Some(Errno::NOTDIR)));
        assert_eq!(refused(b"gone"), Some(Errno::NOENT));
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
