//! Deleting from the workspace ([`Workspace::delete`]): paths in order, a
//! directory only when asked to be recursive, and a tree removed without
//! following a symlink in it ([`remove_tree`]).

use std::os::fd::OwnedFd;

use rustix::fs::{AtFlags, FileType};
use rustix::io::Errno;
use sandboxd_proto::{Failure, FailureKind};

use super::entries::{Name, read_names};
use super::failure::os;
use super::resolve::{Located, Resolve, Workspace, parse};
use crate::nofollow::open_dir;

/// A directory being removed by [`remove_tree`]: its fd, its
/// name in its parent, and the entries still to remove.
struct Level {
    fd: OwnedFd,
    name: Name,
    todo: Vec<Name>,
}

impl Workspace {
    /// Deletes in order; missing paths (or paths whose parent is missing)
    /// are skipped; a directory needs `recursive` (NeedsRecursive); a
    /// recursive delete does not follow symlinks inside the tree; a final
    /// symlink is removed itself. A failure stops there: the paths before
    /// it stay deleted.
    pub(crate) fn delete(&self, paths: &[String], recursive: bool) -> Result<(), Failure> {
        let mut parsed = Vec::with_capacity(paths.len());
        for path in paths {
            let parts = parse(path)?;
            if parts.is_empty() {
                return Err(Failure::new(
                    FailureKind::Invalid,
                    "the workspace directory itself cannot be deleted",
                ));
            }
            parsed.push((path.as_str(), parts));
        }
        for (path, parts) in parsed {
            let mut r = Resolve { path, hops: 0 };
            let Located { dir, leaf } = match self.locate(&mut r, parts, false, None) {
                Ok(located) => located,
                Err(e) if e.kind == FailureKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let Some(leaf) = leaf else {
                return Err(Failure::new(
                    FailureKind::Invalid,
                    format!("{path} names a directory through '..' or '.'; name it directly"),
                ));
            };
            let st = match rustix::fs::statat(&dir, leaf.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(os(e)),
            };
            if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                if !recursive {
                    return Err(Failure::new(
                        FailureKind::NeedsRecursive,
                        format!("{path} is a directory; delete it with recursive: true"),
                    ));
                }
                remove_tree(&dir, leaf)?;
            } else {
                rustix::fs::unlinkat(&dir, leaf.as_slice(), AtFlags::empty()).map_err(os)?;
            }
        }
        Ok(())
    }
}

/// Removes directory `name` in `parent` and everything in it, without
/// following symlinks (each is removed itself). Iterative, so a deep tree
/// cannot overflow the stack; each level holds its directory open so that
/// nothing is reached through a path that could change.
fn remove_tree(parent: &OwnedFd, name: Name) -> Result<(), Failure> {
    fn open(dir: &OwnedFd, name: Name) -> Result<Level, Failure> {
        let fd = open_dir(dir, name.as_slice()).map_err(os)?;
        let todo = read_names(&fd)?;
        Ok(Level { fd, name, todo })
    }
    let mut levels = vec![open(parent, name)?];
    while let Some(top) = levels.last_mut() {
        if let Some(entry) = top.todo.pop() {
            let st = rustix::fs::statat(&top.fd, entry.as_slice(), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(os)?;
            if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                let next = open(&top.fd, entry)?;
                levels.push(next);
            } else {
                rustix::fs::unlinkat(&top.fd, entry.as_slice(), AtFlags::empty()).map_err(os)?;
            }
        } else if let Some(done) = levels.pop() {
            let dir = levels.last().map_or(parent, |l| &l.fd);
            rustix::fs::unlinkat(dir, done.name.as_slice(), AtFlags::REMOVEDIR).map_err(os)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;

    use super::*;
    use crate::files::fixture::{fixture, kind, read_text, write};

    #[test]
    fn a_final_symlink_is_deleted_itself() {
        let f = fixture();
        write(&f.w, "real/f", "x").expect("write");
        symlink(&f.outside, f.ws.join("out")).expect("symlink");
        symlink("real", f.ws.join("to_dir")).expect("symlink");
        symlink("real/f", f.ws.join("to_file")).expect("symlink");
        let paths = ["out", "to_dir", "to_file"].map(String::from);
        f.w.delete(&paths, false).expect("not directories");
        for p in &paths {
            assert!(fs::symlink_metadata(f.ws.join(p)).is_err(), "{p}");
        }
        assert!(f.outside.join("secret").exists());
        assert_eq!(read_text(&f.w, "real/f"), "x");
    }

    #[test]
    fn delete_rules() {
        let f = fixture();
        for p in ["f1", "f2", "dir/a", "file"] {
            write(&f.w, p, "x").expect("write");
        }
        let paths = |ps: &[&str]| ps.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        f.w.delete(&paths(&["missing", "nodir/missing"]), false)
            .expect("missing paths are skipped");
        // In order; a failure stops there, what came before stays deleted.
        let e = f.w.delete(&paths(&["f1", "dir", "f2"]), false);
        assert_eq!(
            e.expect_err("a directory").message,
            "dir is a directory; delete it with recursive: true"
        );
        assert!(!f.ws.join("f1").exists());
        assert!(f.ws.join("dir/a").exists() && f.ws.join("f2").exists());
        assert_eq!(
            kind(f.w.delete(&paths(&["file/x"]), false)),
            FailureKind::NotDirectory
        );
        // A tree, with symlinks in it that lead out: removed, not followed.
        write(&f.w, "tree/a/b/c", "x").expect("write");
        write(&f.w, "tree/.hidden", "x").expect("write");
        fs::create_dir(f.ws.join("tree/empty")).expect("mkdir");
        symlink(&f.outside, f.ws.join("tree/a/out")).expect("symlink");
        symlink(f.outside.join("secret"), f.ws.join("tree/secret")).expect("symlink");
        f.w.delete(&paths(&["tree", "dir", "f2"]), true)
            .expect("recursive");
        assert!(!f.ws.join("tree").exists() && !f.ws.join("dir").exists());
        assert!(f.outside.join("secret").exists() && f.outside.join("sub/f").exists());
        // Deep trees are no problem for the stack.
        let deep = vec!["d"; 300].join("/");
        write(&f.w, &format!("{deep}/f"), "x").expect("write");
        f.w.delete(&paths(&["d"]), true).expect("deep");
        assert!(!f.ws.join("d").exists());
        assert_eq!(
            f.w.list_dir("").expect("list").len(),
            1,
            "only `file` is left"
        );
    }
}
