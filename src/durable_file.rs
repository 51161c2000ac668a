//! Files of the state directory that are replaced whole: a write goes to a
//! temporary file (mode 0600) that is synced and renamed over the old one,
//! and the directory (made 0700 if missing) is synced, so a crash leaves
//! the old file or the new one, never half of either. Errors are one line
//! naming the file.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Makes `dir` (0700) if missing: also when it went away while sandboxd
/// ran.
pub fn make_dir(dir: &Path) -> Result<(), String> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot create the directory {}: {e}", dir.display()))
}

/// Replaces `dir/name` with `bytes`, durably.
pub fn replace(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), String> {
    make_dir(dir)?;
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    let failed = |what: &str, e: std::io::Error| format!("{what} {}: {e}", tmp.display());
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| failed("cannot open", e))?;
    // A temporary file left by an older process keeps its mode on open.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(|e| failed("cannot chmod", e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| failed("cannot write", e))?;
    std::fs::rename(&tmp, &path)
        .map_err(|e| format!("cannot rename {} to {}: {e}", tmp.display(), path.display()))?;
    // The rename itself is durable once the directory is synced.
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("cannot sync {}: {e}", dir.display()))
}

/// The text of `path`; `None` when there is no such file.
pub fn read(path: &Path) -> Result<Option<String>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_replace_makes_the_directory_and_leaves_no_temporary_file() {
        let dir = std::env::temp_dir().join(format!(
            "sandboxd-durable-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        let nested = dir.join("a");
        assert_eq!(read(&nested.join("f")), Ok(None));
        replace(&nested, "f", b"one").expect("first write");
        replace(&nested, "f", b"two").expect("second write");
        assert_eq!(read(&nested.join("f")), Ok(Some("two".into())));
        assert!(!nested.join("f.tmp").exists());
        let mode = |p: &Path| std::fs::metadata(p).expect("metadata").mode() & 0o777;
        assert_eq!((mode(&nested), mode(&nested.join("f"))), (0o700, 0o600));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
