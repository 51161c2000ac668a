//! The answers of a file operation that failed: the [`Failure`] each
//! refusal of the workspace's operations gives, its kind and message as
//! helper.py gave them, and the mapping of an OS error to a kind sandboxd
//! tells apart (with a write past RLIMIT_FSIZE named as such).

use rustix::io::Errno;
use sandboxd_proto::{Failure, FailureKind};

/// A request path as messages show it.
pub(super) fn shown(path: &str) -> &str {
    if path.is_empty() {
        "the workspace directory"
    } else {
        path
    }
}

pub(super) fn escape(path: &str) -> Failure {
    Failure::new(
        FailureKind::SymlinkEscape,
        format!(
            "{} leads outside the workspace through a symlink",
            shown(path)
        ),
    )
}

pub(super) fn not_found(path: &str) -> Failure {
    Failure::new(
        FailureKind::NotFound,
        format!("{} does not exist", shown(path)),
    )
}

/// `readlinkat` of what was a symlink a moment ago: EINVAL (it is not one
/// any more) or ENOENT (it is gone) mean the sandbox changed the path.
pub(super) fn link_gone(e: Errno, path: &str) -> Failure {
    match e {
        Errno::INVAL | Errno::NOENT => changed(path),
        other => os(other),
    }
}

pub(super) fn changed(path: &str) -> Failure {
    Failure::new(
        FailureKind::Changed,
        format!("{} changed while it was being opened", shown(path)),
    )
}

pub(super) fn is_directory(path: &str) -> Failure {
    Failure::new(
        FailureKind::IsDirectory,
        format!("{} is a directory", shown(path)),
    )
}

pub(super) fn not_regular(path: &str) -> Failure {
    Failure::new(
        FailureKind::NotRegular,
        format!("{} is not a regular file", shown(path)),
    )
}

/// An OS error no step above explained, as helper.py answered it: a kind
/// sandboxd tells apart, and the OS's text.
pub(super) fn os(e: Errno) -> Failure {
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

pub(super) fn io_failure(e: std::io::Error) -> Failure {
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
