//! Path resolution that cannot leave the workspace: the [`Workspace`]
//! (its directory and every spelling it is mounted at), a request path's
//! components, and the walk every operation starts with. A path is walked
//! from the workspace root one component at a time, each opened relative
//! to the directory before it with `O_NOFOLLOW`; a symlink met on the way
//! is followed by hand, only while it stays inside, at most [`MAX_HOPS`]
//! per path. What the walk gives an operation is an open directory and a
//! name in it ([`Located`]), never a path to open again.

use std::os::fd::OwnedFd;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use sandboxd_proto::{Failure, FailureKind};

use super::entries::Name;
use super::failure::{changed, escape, io_failure, link_gone, not_found, os, shown};
use crate::nofollow::open_dir;

/// Most symlinks followed while resolving one path (the kernel's own
/// limit, MAXSYMLINKS); more is a loop, or as good as one.
const MAX_HOPS: u32 = 40;

/// The workspace: its canonical directory and every spelling it is mounted
/// at (the same volume mounted again; an absolute symlink target under any
/// of them stays inside).
pub(crate) struct Workspace {
    /// The canonical directory: every walk starts by opening it. It is
    /// configuration, not sandbox input, so it is opened following symlinks.
    root: String,
    /// The components of every spelling, canonical first.
    spellings: Vec<Vec<Name>>,
    /// Tests interleave changes with a walk here, to race it on purpose.
    #[cfg(test)]
    pub(super) hook: Option<Hook>,
}

#[cfg(test)]
pub(super) type Hook = Box<dyn Fn(Step<'_>) + Send + Sync>;

/// A point in an operation where a test may change the workspace under it.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step<'a> {
    /// A walk checked that this directory (its resolved path) is one, and
    /// is about to open it.
    OpenDir(&'a str),
    /// A read or list is about to open its target (the request's path).
    OpenTarget(&'a str),
    /// A write is about to create this file's temporary (the request's path).
    Stage(&'a str),
}

/// Where an operation's target lies: an open directory, and the target's
/// name in it (`None`: the directory itself is the target, because the
/// path is the workspace or a symlink on it ends in `..`).
pub(super) struct Located {
    pub(super) dir: OwnedFd,
    pub(super) leaf: Option<Name>,
}

/// One request path being resolved: how it was sent (for messages) and how
/// many symlinks were followed for it so far, in directory components and
/// as the final one alike (helper.py counted them apart, per walk).
pub(super) struct Resolve<'a> {
    pub(super) path: &'a str,
    pub(super) hops: u32,
}

impl Resolve<'_> {
    /// Counts a symlink followed; refuses one more than [`MAX_HOPS`].
    fn hop(&mut self) -> Result<(), Failure> {
        self.hops += 1;
        if self.hops > MAX_HOPS {
            return Err(Failure::new(
                FailureKind::SymlinkEscape,
                format!("{} has too many levels of symlinks", shown(self.path)),
            ));
        }
        Ok(())
    }
}

/// A directory a write created, with the directory it is in: removed again
/// if the write fails.
pub(super) struct Created {
    pub(super) parent: OwnedFd,
    pub(super) name: Name,
}

impl Workspace {
    /// `dirs`: absolute, normalised paths, canonical first (e.g.
    /// `["/workspace", "/vercel/sandbox/workspace"]`).
    pub(crate) fn new(dirs: Vec<String>) -> Workspace {
        let spellings = dirs
            .iter()
            .map(|d| {
                d.split('/')
                    .filter(|c| !c.is_empty() && *c != ".")
                    .map(|c| c.as_bytes().to_vec())
                    .collect()
            })
            .collect();
        Workspace {
            root: dirs.into_iter().next().unwrap_or_default(),
            spellings,
            #[cfg(test)]
            hook: None,
        }
    }

    /// Opens the directory holding the target of `parts`, and gives the
    /// target's name in it (`None` when `parts` is empty or ends in `..`:
    /// the directory is the target). With `follow_last`, a final symlink is
    /// followed (inside the workspace only); without, it is the target.
    /// With `created`, missing directories are made (see [`Self::walk_dirs`]).
    pub(super) fn locate(
        &self,
        r: &mut Resolve<'_>,
        mut parts: Vec<Name>,
        follow_last: bool,
        mut created: Option<&mut Vec<Created>>,
    ) -> Result<Located, Failure> {
        loop {
            let leaf = match parts.last() {
                Some(last) if last.as_slice() != b".." => parts.pop(),
                _ => None,
            };
            let Some(leaf) = leaf else {
                let (dir, _) = self.walk_dirs(r, parts, created.as_deref_mut())?;
                return Ok(Located { dir, leaf: None });
            };
            let (dir, stack) = self.walk_dirs(r, parts, created.as_deref_mut())?;
            if !follow_last {
                return Ok(Located {
                    dir,
                    leaf: Some(leaf),
                });
            }
            match rustix::fs::statat(&dir, leaf.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {}
                Ok(_) | Err(Errno::NOENT) => {
                    return Ok(Located {
                        dir,
                        leaf: Some(leaf),
                    });
                }
                Err(e) => return Err(os(e)),
            }
            r.hop()?;
            let target = rustix::fs::readlinkat(&dir, leaf.as_slice(), Vec::new())
                .map_err(|e| link_gone(e, r.path))?
                .into_bytes();
            parts = if target.starts_with(b"/") {
                self.under_workspace(&target)
                    .ok_or_else(|| escape(r.path))?
            } else {
                // Relative to the link's directory: its resolved components
                // and the target's, from the workspace root again, so that
                // `..` is resolved against the real directories walked and
                // cannot climb above the root. Empty components go too, so
                // `dir/` names `dir` (helper.py made it a name "" and failed).
                let mut resolved = stack;
                resolved.extend(
                    target
                        .split(|b| *b == b'/')
                        .filter(|c| !c.is_empty() && *c != b".")
                        .map(<[u8]>::to_vec),
                );
                resolved
            };
        }
    }

    /// Opens the directory `parts` names, one component at a time from the
    /// workspace root, following symlinks by hand and only inside the
    /// workspace. Returns it and its resolved components (no symlinks,
    /// relative to the root). With `created`, a missing directory is made
    /// (0755) and recorded there; without, it is NotFound.
    fn walk_dirs(
        &self,
        r: &mut Resolve<'_>,
        parts: Vec<Name>,
        mut created: Option<&mut Vec<Created>>,
    ) -> Result<(OwnedFd, Vec<Name>), Failure> {
        let root = self.open_root()?;
        // `fds[i]` is the directory `stack[..=i]` names; `..` goes back one,
        // to the directory we came from, never above the root.
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut stack: Vec<Name> = Vec::new();
        // Components still to walk, the next one last.
        let mut todo = parts;
        todo.reverse();
        while let Some(name) = todo.pop() {
            match name.as_slice() {
                b"" | b"." => continue,
                b".." => {
                    if stack.pop().is_none() {
                        return Err(escape(r.path));
                    }
                    fds.pop();
                    continue;
                }
                _ => {}
            }
            let cur = fds.last().unwrap_or(&root);
            let st = match rustix::fs::statat(cur, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::NOENT) => {
                    let Some(created) = created.as_deref_mut() else {
                        return Err(not_found(r.path));
                    };
                    // The parent's fd first: once the directory exists it
                    // must be recorded, to be removed if the write fails.
                    let parent = cur.try_clone().map_err(io_failure)?;
                    // 0755 as helper.py made them (the umask applies).
                    rustix::fs::mkdirat(cur, name.as_slice(), Mode::from_raw_mode(0o755))
                        .map_err(os)?;
                    created.push(Created {
                        parent,
                        name: name.clone(),
                    });
                    rustix::fs::statat(cur, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW)
                        .map_err(os)?
                }
                Err(e) => return Err(os(e)),
            };
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Symlink => {
                    r.hop()?;
                    let target = rustix::fs::readlinkat(cur, name.as_slice(), Vec::new())
                        .map_err(|e| link_gone(e, r.path))?
                        .into_bytes();
                    if target.starts_with(b"/") {
                        let rest = self
                            .under_workspace(&target)
                            .ok_or_else(|| escape(r.path))?;
                        fds.clear();
                        stack.clear();
                        todo.extend(rest.into_iter().rev());
                    } else {
                        // Walked from here: `..` in it pops what we walked.
                        todo.extend(target.split(|b| *b == b'/').rev().map(<[u8]>::to_vec));
                    }
                }
                FileType::Directory => {
                    #[cfg(test)]
                    self.checkpoint(Step::OpenDir(&join(&stack, &name)));
                    let fd = open_dir(cur, name.as_slice()).map_err(|e| match e {
                        // Swapped for a symlink (or a file) since the stat.
                        Errno::LOOP | Errno::NOTDIR => changed(r.path),
                        e => os(e),
                    })?;
                    fds.push(fd);
                    stack.push(name);
                }
                _ => {
                    return Err(Failure::new(
                        FailureKind::NotDirectory,
                        format!("{}: {} is not a directory", r.path, join(&stack, &name)),
                    ));
                }
            }
        }
        Ok((fds.pop().unwrap_or(root), stack))
    }

    fn open_root(&self) -> Result<OwnedFd, Failure> {
        if self.root.is_empty() {
            return Err(Failure::new(
                FailureKind::Other,
                "no workspace directory is configured",
            ));
        }
        rustix::fs::open(
            self.root.as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(os)
    }

    /// The components of absolute `target` below the workspace, or `None`
    /// when it lies under no spelling of it. What follows the spelling may
    /// hold `..`, which the walk refuses to climb above the root.
    fn under_workspace(&self, target: &[u8]) -> Option<Vec<Name>> {
        let clean: Vec<&[u8]> = target
            .split(|b| *b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
            .collect();
        self.spellings.iter().find_map(|ws| {
            let matches =
                clean.len() >= ws.len() && clean.iter().zip(ws).all(|(c, w)| *c == w.as_slice());
            matches.then(|| clean[ws.len()..].iter().map(|c| c.to_vec()).collect())
        })
    }

    #[cfg(test)]
    pub(super) fn checkpoint(&self, step: Step<'_>) {
        if let Some(hook) = &self.hook {
            hook(step);
        }
    }
}

/// A request path's components, by helper.py's rules (empty and `.`
/// components dropped; `""` is the workspace itself), checked again
/// although sandboxd already did: `..` or a NUL byte is Invalid.
pub(super) fn parse(path: &str) -> Result<Vec<Name>, Failure> {
    let mut parts = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                return Err(Failure::new(
                    FailureKind::Invalid,
                    format!("{path}: '..' is not allowed in paths"),
                ));
            }
            c if c.contains('\0') => {
                return Err(Failure::new(
                    FailureKind::Invalid,
                    format!("{path:?}: the path contains a NUL byte"),
                ));
            }
            c => parts.push(c.as_bytes().to_vec()),
        }
    }
    Ok(parts)
}

/// Resolved components joined for a message.
fn join(stack: &[Name], name: &[u8]) -> String {
    let mut joined = Vec::new();
    for c in stack {
        joined.extend_from_slice(c);
        joined.push(b'/');
    }
    joined.extend_from_slice(name);
    String::from_utf8_lossy(&joined).into_owned()
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;

    use super::*;
    use crate::files::fixture::{
        fixture, is_symlink, kind, nf, read_text, swap_at, temps_under, text, write,
    };

    #[test]
    fn paths_with_dotdot_or_nul_are_invalid_before_anything_happens() {
        let f = fixture();
        write(&f.w, "ok", "x").expect("write");
        for bad in ["..", "../x", "a/../b", "a/..", "a\0b"] {
            assert_eq!(
                kind(f.w.read_file(bad, 10)),
                FailureKind::Invalid,
                "{bad:?}"
            );
            assert_eq!(kind(f.w.list_dir(bad)), FailureKind::Invalid, "{bad:?}");
            assert_eq!(
                kind(f.w.delete(&["ok".to_string(), bad.to_string()], true)),
                FailureKind::Invalid,
                "{bad:?}"
            );
            assert!(f.ws.join("ok").exists(), "{bad:?}: checked before deleting");
            assert_eq!(
                kind(f.w.write_whole(vec![nf("new", 0o644, "x"), nf(bad, 0o644, "x")])),
                FailureKind::Invalid,
                "{bad:?}"
            );
            assert!(
                !f.ws.join("new").exists(),
                "{bad:?}: checked before writing"
            );
        }
    }

    #[test]
    fn absolute_symlinks_outside_are_refused_everywhere() {
        let f = fixture();
        symlink(&f.outside, f.ws.join("out")).expect("symlink");
        symlink(f.outside.join("secret"), f.ws.join("secret")).expect("symlink");
        let escape = FailureKind::SymlinkEscape;
        // Through a directory component, and as the final component.
        assert_eq!(kind(f.w.read_file("out/secret", 100)), escape);
        assert_eq!(kind(f.w.read_file("secret", 100)), escape);
        assert_eq!(kind(write(&f.w, "out/new", "x")), escape);
        assert_eq!(kind(write(&f.w, "secret", "x")), escape);
        assert_eq!(kind(write(&f.w, "out/sub/new/deeper", "x")), escape);
        assert_eq!(kind(f.w.list_dir("out")), escape);
        assert_eq!(kind(f.w.list_dir("out/sub")), escape);
        assert_eq!(kind(f.w.delete(&["out/secret".to_string()], false)), escape);
        assert_eq!(kind(f.w.delete(&["out/sub".to_string()], true)), escape);
        let e = f.w.read_file("out/secret", 100).expect_err("escape");
        assert_eq!(
            e.message,
            "out/secret leads outside the workspace through a symlink"
        );
        assert_eq!(
            fs::read_to_string(f.outside.join("secret")).expect("read"),
            "secret"
        );
        assert!(f.outside.join("sub/f").exists());
        assert!(!f.outside.join("new").exists() && !f.outside.join("sub/new").exists());
        assert!(temps_under(&f.outside).is_empty());
    }

    #[test]
    fn relative_symlinks_climbing_out_are_refused() {
        let f = fixture();
        fs::create_dir(f.ws.join("d")).expect("mkdir");
        fs::write(f.ws.join("inside"), "inside").expect("write");
        symlink("../outside", f.ws.join("up")).expect("symlink");
        symlink("../../outside/secret", f.ws.join("d/up2")).expect("symlink");
        // Climbs above the root and back down by the workspace's own name:
        // still out (resolved against directories walked, not by spelling).
        symlink("../d/../../ws/inside", f.ws.join("d/back")).expect("symlink");
        symlink("..", f.ws.join("parent")).expect("symlink");
        let escape = FailureKind::SymlinkEscape;
        assert_eq!(kind(f.w.read_file("up/secret", 100)), escape);
        assert_eq!(kind(f.w.read_file("d/up2", 100)), escape);
        assert_eq!(kind(f.w.read_file("d/back", 100)), escape);
        assert_eq!(kind(f.w.list_dir("parent")), escape);
        assert_eq!(kind(f.w.read_file("parent/outside/secret", 100)), escape);
        assert_eq!(kind(write(&f.w, "up/new", "x")), escape);
        assert_eq!(kind(write(&f.w, "d/up2", "x")), escape);
        assert_eq!(
            fs::read_to_string(f.outside.join("secret")).expect("read"),
            "secret"
        );
        assert!(!f.outside.join("new").exists());
    }

    #[test]
    fn symlinks_inside_are_followed() {
        let f = fixture();
        write(&f.w, "real/f", "real").expect("write");
        symlink("real", f.ws.join("rel")).expect("symlink");
        symlink(f.ws.join("real/f"), f.ws.join("abs")).expect("symlink");
        symlink("real/f", f.ws.join("lf")).expect("symlink");
        symlink("new/dir/file", f.ws.join("dangling")).expect("symlink");
        symlink("./../real/.", f.ws.join("real/self")).expect("symlink");
        symlink("..", f.ws.join("real/up")).expect("symlink");
        symlink("real/", f.ws.join("slash")).expect("symlink");
        assert_eq!(read_text(&f.w, "rel/f"), "real");
        assert_eq!(read_text(&f.w, "abs"), "real");
        assert_eq!(read_text(&f.w, "real/self/self/f"), "real");
        assert_eq!(read_text(&f.w, "real/up/real/f"), "real");
        let names = |path| -> Vec<String> {
            let entries = f.w.list_dir(path).expect("list");
            entries.into_iter().map(|e| e.name).collect()
        };
        assert_eq!(names("rel"), ["f", "self", "up"]);
        assert_eq!(names("slash"), ["f", "self", "up"]);
        assert!(names("real/up").contains(&"real".to_string()));
        assert_eq!(kind(f.w.read_file("real/up", 10)), FailureKind::IsDirectory);
        // A write through a final symlink writes its target; the link stays.
        write(&f.w, "lf", "through").expect("write");
        assert_eq!(
            fs::read_to_string(f.ws.join("real/f")).expect("read"),
            "through"
        );
        assert!(is_symlink(&f.ws.join("lf")));
        // ...and creates what the target needs.
        write(&f.w, "dangling", "made").expect("write");
        assert_eq!(
            fs::read_to_string(f.ws.join("new/dir/file")).expect("read"),
            "made"
        );
        assert_eq!(kind(write(&f.w, "real/up", "x")), FailureKind::IsDirectory);
    }

    #[test]
    fn an_absolute_target_under_the_alias_spelling_stays_inside() {
        let f = fixture();
        write(&f.w, "real/f", "real").expect("write");
        symlink(f.alias.join("real/f"), f.ws.join("via_alias")).expect("symlink");
        symlink(f.alias.join("real"), f.ws.join("alias_dir")).expect("symlink");
        symlink(f.alias.join("../outside/secret"), f.ws.join("alias_out")).expect("symlink");
        let aliasx = format!("{}x/real/f", text(&f.alias));
        symlink(&aliasx, f.ws.join("aliasx")).expect("symlink");
        assert_eq!(read_text(&f.w, "via_alias"), "real");
        assert_eq!(read_text(&f.w, "alias_dir/f"), "real");
        write(&f.w, "alias_dir/g", "g").expect("write");
        assert_eq!(fs::read_to_string(f.ws.join("real/g")).expect("read"), "g");
        let escape = FailureKind::SymlinkEscape;
        assert_eq!(kind(f.w.read_file("alias_out", 100)), escape);
        assert_eq!(
            kind(f.w.read_file("aliasx", 100)),
            escape,
            "whole components only"
        );
    }

    #[test]
    fn symlink_loops_and_long_chains_are_refused() {
        let f = fixture();
        symlink("b", f.ws.join("a")).expect("symlink");
        symlink("a", f.ws.join("b")).expect("symlink");
        symlink("d", f.ws.join("d")).expect("symlink");
        symlink("e/x", f.ws.join("e")).expect("symlink");
        let e = f.w.read_file("a", 10).expect_err("loop");
        assert_eq!(e.kind, FailureKind::SymlinkEscape);
        assert_eq!(e.message, "a has too many levels of symlinks");
        assert_eq!(kind(f.w.read_file("d/x", 10)), FailureKind::SymlinkEscape);
        assert_eq!(kind(f.w.read_file("e", 10)), FailureKind::SymlinkEscape);
        assert_eq!(kind(write(&f.w, "a", "x")), FailureKind::SymlinkEscape);
        assert_eq!(kind(f.w.list_dir("d")), FailureKind::SymlinkEscape);
        // 40 symlinks on one path are fine, 41 are not (the kernel's limit),
        // counted over directory components and the final one together.
        write(&f.w, "target/f", "end").expect("write");
        symlink("target", f.ws.join("c0")).expect("symlink");
        for i in 1..=40 {
            symlink(format!("c{}", i - 1), f.ws.join(format!("c{i}"))).expect("symlink");
        }
        symlink("c38/f", f.ws.join("last")).expect("symlink");
        symlink("c39/f", f.ws.join("past")).expect("symlink");
        assert_eq!(read_text(&f.w, "c39/f"), "end", "c39 to c0: 40");
        assert_eq!(read_text(&f.w, "last"), "end", "last, then c38 to c0: 40");
        assert_eq!(kind(f.w.read_file("past", 10)), FailureKind::SymlinkEscape);
        assert_eq!(kind(f.w.read_file("c40/f", 10)), FailureKind::SymlinkEscape);
        symlink("c39", f.ws.join("one_more")).expect("symlink");
        assert_eq!(
            kind(f.w.read_file("one_more/f", 10)),
            FailureKind::SymlinkEscape
        );
    }

    #[test]
    fn a_directory_swapped_for_a_symlink_mid_walk_is_changed() {
        let mut f = fixture();
        write(&f.w, "a/sub/f", "inside").expect("write");
        let outside = f.outside.clone();
        swap_at(&mut f, Step::OpenDir("a"), "a", outside);
        let e = f.w.read_file("a/sub/f", 100).expect_err("swapped");
        assert_eq!(
            (e.kind, e.message.as_str()),
            (
                FailureKind::Changed,
                "a/sub/f changed while it was being opened"
            )
        );
        // Walked again, the symlink is seen and refused.
        assert_eq!(
            kind(f.w.read_file("a/sub/f", 100)),
            FailureKind::SymlinkEscape
        );
        assert_eq!(kind(f.w.list_dir("a/sub")), FailureKind::SymlinkEscape);
    }

    #[test]
    fn a_target_swapped_for_a_symlink_before_its_open_is_changed() {
        let mut f = fixture();
        write(&f.w, "t", "inside").expect("write");
        let secret = f.outside.join("secret");
        swap_at(&mut f, Step::OpenTarget("t"), "t", secret);
        assert_eq!(kind(f.w.read_file("t", 100)), FailureKind::Changed);

        let mut f = fixture();
        write(&f.w, "d/f", "inside").expect("write");
        let outside = f.outside.clone();
        swap_at(&mut f, Step::OpenTarget("d"), "d", outside);
        assert_eq!(kind(f.w.list_dir("d")), FailureKind::Changed);
    }
}
