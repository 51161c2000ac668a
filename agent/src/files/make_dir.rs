//! Making a directory in the workspace ([`Workspace::make_dir`]), its
//! missing parents too, through the walk that cannot leave it, and
//! saying whether it was made or was there.

use rustix::fs::{AtFlags, FileType, Mode};
use rustix::io::Errno;
use sandboxd_proto::{Failure, FailureKind};

use super::failure::os;
use super::resolve::{Located, Resolve, Workspace, parse};

impl Workspace {
    /// Makes directory `path` (0755, the umask applies) and its missing
    /// parents: `true` when it was made, `false` when a directory was
    /// there. Anything else there (a file, a symlink, which is not
    /// followed) is [`FailureKind::NotDirectory`].
    pub(crate) fn make_dir(&self, path: &str) -> Result<bool, Failure> {
        let parts = parse(path)?;
        let mut created = Vec::new();
        let mut r = Resolve { path, hops: 0 };
        let Located { dir, leaf } = self.locate(&mut r, parts, false, Some(&mut created))?;
        // The workspace itself.
        let Some(leaf) = leaf else {
            return Ok(false);
        };
        match rustix::fs::mkdirat(&dir, leaf.as_slice(), Mode::from_raw_mode(0o755)) {
            Ok(()) => Ok(true),
            Err(Errno::EXIST) => {
                let st = rustix::fs::statat(&dir, leaf.as_slice(), AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(os)?;
                if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                    Ok(false)
                } else {
                    Err(Failure::new(
                        FailureKind::NotDirectory,
                        format!("{path} exists and is not a directory"),
                    ))
                }
            }
            Err(e) => Err(os(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;

    use super::*;
    use crate::files::fixture::{fixture, write};

    #[test]
    fn a_directory_is_made_once_with_its_parents() {
        let f = fixture();
        assert_eq!(f.w.make_dir("a/b/c"), Ok(true));
        assert!(f.ws.join("a/b/c").is_dir());
        assert_eq!(f.w.make_dir("a/b/c"), Ok(false), "already there");
        assert_eq!(f.w.make_dir("a"), Ok(false));
        assert_eq!(f.w.make_dir(""), Ok(false), "the workspace");
        write(&f.w, "file", "x").expect("write");
        let e = f.w.make_dir("file").expect_err("a file");
        assert_eq!(e.kind, FailureKind::NotDirectory, "{e:?}");
    }

    #[test]
    fn a_directory_is_never_made_outside_the_workspace() {
        let f = fixture();
        symlink(&f.outside, f.ws.join("out")).expect("symlink");
        let e = f.w.make_dir("out/new").expect_err("escape");
        assert_eq!(e.kind, FailureKind::SymlinkEscape, "{e:?}");
        assert!(!f.outside.join("new").exists());
        // A symlink as the last component is not followed.
        symlink("a", f.ws.join("to_a")).expect("symlink");
        fs::create_dir(f.ws.join("a")).expect("mkdir");
        let e = f.w.make_dir("to_a").expect_err("a symlink");
        assert_eq!(e.kind, FailureKind::NotDirectory, "{e:?}");
        // Through a symlink that stays inside: made where it leads.
        assert_eq!(f.w.make_dir("to_a/inner"), Ok(true));
        assert!(f.ws.join("a/inner").is_dir());
    }
}
