//! Moving a path within the workspace ([`Workspace::rename`]): both ends
//! resolved by the walk that cannot leave the workspace, the final
//! component of each taken as it is (a symlink is moved or replaced
//! itself, never followed), the destination's missing parent directories
//! made (and removed again when the move fails), and no existing
//! destination replaced unless asked.

use rustix::fs::{AtFlags, RenameFlags};
use rustix::io::Errno;
use sandboxd_proto::{Failure, FailureKind};

use super::entries::Name;
use super::failure::{not_found, os};
use super::resolve::{Created, Located, Resolve, Workspace, parse};

impl Workspace {
    /// Moves `from` to `to`. Without `overwrite`, an existing `to` is
    /// [`FailureKind::AlreadyExists`] and nothing moves; with it, `to` is
    /// replaced (a directory only by a directory, and only when empty).
    pub(crate) fn rename(&self, from: &str, to: &str, overwrite: bool) -> Result<(), Failure> {
        let (from_parts, to_parts) = (parse(from)?, parse(to)?);
        if from_parts.is_empty() || to_parts.is_empty() {
            return Err(Failure::new(
                FailureKind::Invalid,
                "the workspace directory itself cannot be moved or replaced",
            ));
        }
        let (src_dir, src_leaf) = leaf_of(
            self.locate(
                &mut Resolve {
                    path: from,
                    hops: 0,
                },
                from_parts,
                false,
                None,
            )?,
            from,
        )?;
        match rustix::fs::statat(&src_dir, src_leaf.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) => {}
            Err(Errno::NOENT) => return Err(not_found(from)),
            Err(e) => return Err(os(e)),
        }
        let mut created = Vec::new();
        let moved = self
            .locate(
                &mut Resolve { path: to, hops: 0 },
                to_parts,
                false,
                Some(&mut created),
            )
            .and_then(|located| leaf_of(located, to))
            .and_then(|(dst_dir, dst_leaf)| {
                let flags = if overwrite {
                    RenameFlags::empty()
                } else {
                    RenameFlags::NOREPLACE
                };
                let tried = rustix::fs::renameat_with(
                    &src_dir,
                    src_leaf.as_slice(),
                    &dst_dir,
                    dst_leaf.as_slice(),
                    flags,
                );
                let renamed = match tried {
                    // A filesystem without RENAME_NOREPLACE: looked at
                    // first instead. Only the sandbox's own processes
                    // could put something there in between.
                    Err(Errno::INVAL) if !overwrite => {
                        let there = rustix::fs::statat(
                            &dst_dir,
                            dst_leaf.as_slice(),
                            AtFlags::SYMLINK_NOFOLLOW,
                        );
                        match there {
                            Ok(_) => Err(Errno::EXIST),
                            Err(Errno::NOENT) => rustix::fs::renameat(
                                &src_dir,
                                src_leaf.as_slice(),
                                &dst_dir,
                                dst_leaf.as_slice(),
                            ),
                            Err(e) => Err(e),
                        }
                    }
                    other => other,
                };
                renamed.map_err(|e| rename_failure(e, from, to))
            });
        if moved.is_err() {
            remove_created(&created);
        }
        moved
    }
}

/// The directory and the name of a path that is not the workspace itself.
fn leaf_of(located: Located, path: &str) -> Result<(std::os::fd::OwnedFd, Name), Failure> {
    match located.leaf {
        Some(leaf) => Ok((located.dir, leaf)),
        None => Err(Failure::new(
            FailureKind::Invalid,
            format!("{path} names a directory through '..' or '.'; name it directly"),
        )),
    }
}

/// Directories made for a move that failed, removed again, newest first.
fn remove_created(created: &[Created]) {
    for c in created.iter().rev() {
        let _ = rustix::fs::unlinkat(&c.parent, c.name.as_slice(), AtFlags::REMOVEDIR);
    }
}

/// What the kernel's refusal of a rename means for this one.
fn rename_failure(e: Errno, from: &str, to: &str) -> Failure {
    match e {
        Errno::EXIST | Errno::NOTEMPTY => Failure::new(
            FailureKind::AlreadyExists,
            format!("{to} exists; move with overwrite to replace it (a directory only when empty)"),
        ),
        Errno::NOENT => not_found(from),
        Errno::INVAL => Failure::new(
            FailureKind::Invalid,
            format!("{from} cannot be moved into itself ({to})"),
        ),
        Errno::ISDIR => Failure::new(
            FailureKind::IsDirectory,
            format!("{to} is a directory; a file cannot replace it"),
        ),
        Errno::NOTDIR => Failure::new(
            FailureKind::NotDirectory,
            format!("{to} is not a directory; a directory cannot replace it"),
        ),
        e => os(e),
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;

    use super::*;
    use crate::files::fixture::{fixture, read_text, write};

    #[test]
    fn a_move_renames_makes_parents_and_replaces_only_when_asked() {
        let f = fixture();
        write(&f.w, "a", "A").expect("write");
        write(&f.w, "b", "B").expect("write");
        f.w.rename("a", "new/dir/a2", false).expect("moved");
        assert_eq!(read_text(&f.w, "new/dir/a2"), "A");
        assert!(fs::symlink_metadata(f.ws.join("a")).is_err(), "gone");

        let e = f.w.rename("b", "new/dir/a2", false).expect_err("exists");
        assert_eq!(e.kind, FailureKind::AlreadyExists, "{e:?}");
        assert_eq!(read_text(&f.w, "b"), "B", "nothing moved");
        f.w.rename("b", "new/dir/a2", true).expect("replaced");
        assert_eq!(read_text(&f.w, "new/dir/a2"), "B");

        let e = f.w.rename("missing", "x/y", false).expect_err("missing");
        assert_eq!(e.kind, FailureKind::NotFound, "{e:?}");
        assert!(
            fs::symlink_metadata(f.ws.join("x")).is_err(),
            "no parent left made"
        );
        let e =
            f.w.rename("new", "new/dir/inside", false)
                .expect_err("into itself");
        assert_eq!(e.kind, FailureKind::Invalid, "{e:?}");
        let e =
            f.w.rename("", "elsewhere", false)
                .expect_err("the workspace");
        assert_eq!(e.kind, FailureKind::Invalid, "{e:?}");
    }

    #[test]
    fn a_move_never_leaves_the_workspace_and_moves_a_symlink_itself() {
        let f = fixture();
        write(&f.w, "real/f", "x").expect("write");
        symlink(&f.outside, f.ws.join("out")).expect("symlink");
        symlink("real/f", f.ws.join("link")).expect("symlink");

        // Into a directory outside through a symlink, or out of one.
        let e =
            f.w.rename("real/f", "out/stolen", false)
                .expect_err("escape");
        assert_eq!(e.kind, FailureKind::SymlinkEscape, "{e:?}");
        assert!(!f.outside.join("stolen").exists());
        let e =
            f.w.rename("out/secret", "taken", false)
                .expect_err("escape");
        assert_eq!(e.kind, FailureKind::SymlinkEscape, "{e:?}");
        assert!(f.outside.join("secret").exists());

        // The link itself moves; its target stays where it is.
        f.w.rename("link", "real/link2", false).expect("moved");
        let moved = fs::symlink_metadata(f.ws.join("real/link2")).expect("there");
        assert!(moved.file_type().is_symlink());
        assert_eq!(read_text(&f.w, "real/f"), "x");
        // A symlink pointing outside moves as a link too, and its target
        // is untouched (a positive control of the moves above).
        f.w.rename("out", "out2", false).expect("moved");
        assert!(
            fs::symlink_metadata(f.ws.join("out2"))
                .expect("there")
                .file_type()
                .is_symlink()
        );
        assert!(f.outside.join("secret").exists());
    }
}
