//! What an open directory holds, looked at without following a symlink:
//! its names, an entry as a listing shows it, whether a name is taken,
//! and a regular file's SHA-256. Every operation reaches the workspace
//! through directory descriptors ([`crate::nofollow::open_dir`]); these
//! are the looks they share.

use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;
use sandboxd_proto::{DirEntry, EntryKind, Failure};
use sha2::{Digest, Sha256};

use super::failure::{changed, io_failure, os};

/// One path component, as the kernel sees it: bytes (a symlink's target
/// need not be UTF-8).
pub(super) type Name = Vec<u8>;

/// The SHA-256 of regular file `leaf` in `dir` (not followed if a
/// symlink), or `None` when there is no such file or it is not a regular
/// one. Opened non-blocking, so a FIFO cannot hang the agent.
pub(super) fn hash_at(dir: &OwnedFd, leaf: &[u8], path: &str) -> Result<Option<[u8; 32]>, Failure> {
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
pub(super) fn exists_at(dir: &OwnedFd, leaf: &[u8]) -> Result<bool, Failure> {
    match rustix::fs::statat(dir, leaf, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(_) => Ok(true),
        Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(os(e)),
    }
}

/// The names in a directory, `.` and `..` left out, sorted by bytes.
pub(crate) fn sorted_names(dir: &OwnedFd) -> Result<Vec<Name>, Failure> {
    let mut names = read_names(dir)?;
    names.sort();
    Ok(names)
}

/// The names in a directory, `.` and `..` left out, in no order.
pub(super) fn read_names(dir: &OwnedFd) -> Result<Vec<Name>, Failure> {
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

pub(super) fn dir_entry(name: &[u8], st: &Stat) -> DirEntry {
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
