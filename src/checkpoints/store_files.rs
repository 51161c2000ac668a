//! The file-level pieces the checkpoint store's parts share (its
//! objects and manifests in [`super::store`], its packs in
//! [`super::pack`]): the error that names a path, the names the store
//! gives out, and making files durable.

use std::fs::File;
use std::path::Path;

/// Why the store failed: one line, naming the path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StoreError(pub(super) String);

impl StoreError {
    /// A task of the store that panicked or was cancelled.
    pub(super) fn ended_early(e: impl std::fmt::Display) -> StoreError {
        StoreError(format!("a task of the store ended early: {e}"))
    }

    /// There is no state directory to keep checkpoints in.
    pub(super) fn none_configured() -> StoreError {
        StoreError("no state_dir is set (SANDBOXD_STATE_DIR) to keep checkpoints in".into())
    }
}

pub(super) type StoreResult<T> = Result<T, StoreError>;

pub(super) fn failed(what: &str, path: &Path, e: std::io::Error) -> StoreError {
    StoreError(format!("cannot {what} {}: {e}", path.display()))
}

/// Lowercase hex of a hash.
pub(super) fn hex(hash: &[u8]) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

/// A name the store gives out (an object's hash, a checkpoint's id): plain
/// lowercase hex or `[a-z0-9]`, so it is one path component.
pub(super) fn plain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
}

/// Starts writing `file`'s dirty pages to disk, without waiting: by the
/// time the store syncs it (`Store::sync_written`), most of it is there, so the
/// disk's writing overlaps the rest of the checkpoint instead of
/// following it. (Linux starts that writeback for `POSIX_FADV_DONTNEED`;
/// the pages it then drops are only the clean ones.) A hint: a failure
/// changes nothing.
pub(super) fn start_writeback(file: &File) {
    let _ = rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::DontNeed);
}

pub(super) fn sync_dir(dir: &Path) -> StoreResult<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| failed("sync", dir, e))
}

/// A directory of a test's own (`PREFIX-PID-RANDOM` in the system's
/// temporary directory), removed when dropped.
#[cfg(test)]
pub(super) struct Scratch(pub(super) std::path::PathBuf);

#[cfg(test)]
impl Scratch {
    pub(super) fn new(prefix: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "{prefix}-{}-{}",
            std::process::id(),
            crate::id::random_hex(4).expect("random")
        ));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        Scratch(dir)
    }
}

#[cfg(test)]
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
