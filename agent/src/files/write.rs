//! Writing the workspace: every file of a request or none
//! ([`Workspace::write_files`]). Each content goes to a temporary beside
//! its target as its pieces come ([`Content`]), the targets' preconditions
//! are checked first, and the temporaries are renamed over their targets
//! only once all are written; a failure before that undoes what the
//! write did ([`Staging`]).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use bytes::Bytes;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use sandboxd_proto::{Failure, FailureKind, Mismatch, NewFile, Precondition};

use super::entries::{Name, exists_at, hash_at};
use super::failure::{io_failure, is_directory, os};
use super::resolve::{Created, Located, Resolve, Workspace, parse};
use crate::temp_name::TEMP_PREFIX;

#[cfg(test)]
use super::resolve::Step;

/// Largest mode a written file may get: no setuid, setgid or sticky bits.
const MAX_MODE: u32 = 0o777;
/// How long a write waits for the next piece of its content. sandboxd
/// sends them all at once, so a longer gap means it is gone or stuck, and
/// the file thread must not wait for it.
const PIECE_WAIT: Duration = Duration::from_secs(30);

/// Where the content of a write comes from, piece by piece, while earlier
/// pieces are being written.
pub(crate) trait Content {
    /// The next piece, or why none comes.
    fn next_piece(&mut self) -> Result<Bytes, Failure>;
}

/// The pieces sandboxd sends, as the connection hands them over.
impl Content for Receiver<Bytes> {
    fn next_piece(&mut self) -> Result<Bytes, Failure> {
        self.recv_timeout(PIECE_WAIT).map_err(|e| {
            let why = match e {
                RecvTimeoutError::Timeout => "stopped coming",
                RecvTimeoutError::Disconnected => "ended before every file was whole",
            };
            // sandboxd's failing, not the request's: not `Invalid`, which
            // sandboxd answers as a bad path.
            Failure::new(
                FailureKind::Other,
                format!("the content of the write {why}"),
            )
        })
    }
}

/// What a write has done so far, so that a failure can undo it.
#[derive(Default)]
struct Staging {
    /// Directories it created, in the order it created them.
    created: Vec<Created>,
    /// Each file's directory and name, in request order.
    targets: Vec<(OwnedFd, Name)>,
    /// The temporary of each target staged so far, in the same order.
    temps: Vec<Name>,
    /// How many temporaries have been renamed over their targets.
    renamed: usize,
}

impl Staging {
    /// Removes the temporaries not renamed yet, then the directories the
    /// write created (newest first, so children go before their parents).
    /// Best effort: a directory the sandbox filled meanwhile stays.
    fn undo(self) {
        for ((dir, _), temp) in self.targets.iter().zip(&self.temps).skip(self.renamed) {
            let _ = rustix::fs::unlinkat(dir, temp.as_slice(), AtFlags::empty());
        }
        for c in self.created.iter().rev() {
            let _ = rustix::fs::unlinkat(&c.parent, c.name.as_slice(), AtFlags::REMOVEDIR);
        }
    }
}

impl Workspace {
    /// Every file or none: each path is resolved first (missing parent
    /// directories are created, 0755), then each content is written to a
    /// temporary file next to its target, piece by piece as `content`
    /// gives them (each file's `size` bytes, in order, no piece spanning
    /// two files), and the temporaries are renamed
    /// over their targets only once all are written. On a failure before
    /// the renames, the temporaries and the directories it created are
    /// removed. A final symlink is followed (inside the workspace only).
    ///
    /// Each file's [`Precondition`] is checked once every target is
    /// resolved and before anything is staged: when any does not hold,
    /// nothing is written and the answer is the files that failed, with
    /// their present hashes (an empty list: written). Check and write run
    /// on the agent's one file thread, so no other file request comes
    /// between them.
    pub(crate) fn write_files(
        &self,
        files: Vec<NewFile>,
        content: &mut dyn Content,
    ) -> Result<Vec<Mismatch>, Failure> {
        // Everything that can be checked without the filesystem is, before
        // anything is touched.
        let mut parsed = Vec::with_capacity(files.len());
        for f in &files {
            let parts = parse(&f.path)?;
            if parts.is_empty() {
                return Err(Failure::new(
                    FailureKind::Invalid,
                    "the workspace directory itself is not a file",
                ));
            }
            if f.mode > MAX_MODE {
                return Err(Failure::new(
                    FailureKind::Invalid,
                    format!(
                        "{}: the mode must be 0 to 511 (0o777), got {}",
                        f.path, f.mode
                    ),
                ));
            }
            parsed.push(parts);
        }
        let mut staging = Staging::default();
        match self.stage_and_commit(&files, parsed, content, &mut staging) {
            Ok(failed) if failed.is_empty() => Ok(failed),
            Ok(failed) => {
                staging.undo();
                Ok(failed)
            }
            Err(e) => {
                staging.undo();
                Err(e)
            }
        }
    }

    /// The body of [`Workspace::write_files`]; whatever it did is in
    /// `staging`, for the caller to undo on failure.
    fn stage_and_commit(
        &self,
        files: &[NewFile],
        parsed: Vec<Vec<Name>>,
        content: &mut dyn Content,
        staging: &mut Staging,
    ) -> Result<Vec<Mismatch>, Failure> {
        for (f, parts) in files.iter().zip(parsed) {
            let mut r = Resolve {
                path: &f.path,
                hops: 0,
            };
            let Located { dir, leaf } =
                self.locate(&mut r, parts, true, Some(&mut staging.created))?;
            let Some(leaf) = leaf else {
                return Err(is_directory(&f.path));
            };
            match rustix::fs::statat(&dir, leaf.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                    return Err(is_directory(&f.path));
                }
                Ok(_) | Err(Errno::NOENT) => {}
                Err(e) => return Err(os(e)),
            }
            staging.targets.push((dir, leaf));
        }
        let mut failed = Vec::new();
        for (f, (dir, leaf)) in files.iter().zip(&staging.targets) {
            if f.precondition == Precondition::None {
                continue;
            }
            let current = hash_at(dir, leaf, &f.path)?;
            let holds = match f.precondition {
                Precondition::None => true,
                Precondition::IfMatch(want) => current == Some(want),
                Precondition::IfNoneMatch => current.is_none() && !exists_at(dir, leaf)?,
            };
            if !holds {
                failed.push(Mismatch {
                    path: f.path.clone(),
                    current,
                });
            }
        }
        if !failed.is_empty() {
            return Ok(failed);
        }
        let mut random = File::open("/dev/urandom").map_err(io_failure)?;
        for (f, (dir, _)) in files.iter().zip(&staging.targets) {
            #[cfg(test)]
            self.checkpoint(Step::Stage(&f.path));
            let temp = temp_name(&mut random)?;
            // A new file (O_EXCL), so nothing the sandbox prepared under
            // that name is written through.
            let fd = rustix::fs::openat(
                dir,
                temp.as_slice(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .map_err(os)?;
            staging.temps.push(temp);
            // Exactly `mode`, whatever the umask.
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(f.mode)).map_err(os)?;
            let mut file = File::from(fd);
            let mut left = f.size;
            while left > 0 {
                let piece = content.next_piece()?;
                let n = u64::try_from(piece.len()).unwrap_or(u64::MAX);
                if n == 0 || n > left {
                    return Err(Failure::new(
                        FailureKind::Other,
                        format!("{}: a piece of content past its size", f.path),
                    ));
                }
                file.write_all(&piece).map_err(io_failure)?;
                left -= n;
            }
        }
        for ((dir, leaf), temp) in staging.targets.iter().zip(&staging.temps) {
            rustix::fs::renameat(dir, temp.as_slice(), dir, leaf.as_slice()).map_err(os)?;
            staging.renamed += 1;
        }
        Ok(Vec::new())
    }
}

/// `.sandboxd-` and 16 random hex digits.
fn temp_name(random: &mut File) -> Result<Name, Failure> {
    let mut bytes = [0u8; 8];
    random.read_exact(&mut bytes).map_err(io_failure)?;
    Ok(format!("{TEMP_PREFIX}{:016x}", u64::from_ne_bytes(bytes)).into_bytes())
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

    use super::*;
    use crate::files::fixture::{fixture, hash, kind, nf, read_text, temps_under, write};

    #[test]
    fn binary_content_round_trips() {
        let f = fixture();
        let every_byte: Vec<u8> = (0..=255u8).cycle().take(3 * 256 + 7).collect();
        // Larger than a protocol chunk, and than the first read's guess.
        let big: Vec<u8> = (0..3_000_000u32)
            .map(|i| (i.wrapping_mul(7) >> 3) as u8)
            .collect();
        f.w.write_whole(vec![
            nf("a/b/bytes", 0o644, every_byte.clone()),
            nf("empty", 0o644, Vec::new()),
            nf("big", 0o600, big.clone()),
        ])
        .expect("write");
        assert_eq!(
            f.w.read_file("a/b/bytes", 1 << 20).expect("read"),
            every_byte
        );
        assert_eq!(
            f.w.read_file("./a//b/bytes", 1 << 20).expect("read"),
            every_byte
        );
        assert_eq!(f.w.read_file("empty", 0).expect("read"), Vec::<u8>::new());
        assert_eq!(f.w.read_file("big", 3_000_000).expect("read"), big);
        assert!(f.ws.join("a/b").is_dir(), "missing parents are created");
        assert!(temps_under(&f.ws).is_empty());
    }

    #[test]
    fn written_files_get_exactly_their_mode_and_our_user() {
        let f = fixture();
        for (i, mode) in [0o000, 0o400, 0o640, 0o751, 0o777].into_iter().enumerate() {
            let path = format!("m{i}");
            f.w.write_whole(vec![nf(&path, mode, "x")]).expect("write");
            let meta = fs::symlink_metadata(f.ws.join(&path)).expect("stat");
            assert_eq!(meta.permissions().mode() & 0o7777, mode, "{path}: no umask");
            assert_eq!(meta.uid(), rustix::process::geteuid().as_raw());
        }
    }

    #[test]
    fn a_rewrite_is_a_new_file_not_the_old_one_changed() {
        let f = fixture();
        write(&f.w, "f", "old").expect("write");
        fs::hard_link(f.ws.join("f"), f.ws.join("keep")).expect("link");
        let before = fs::metadata(f.ws.join("f")).expect("stat").ino();
        write(&f.w, "f", "new").expect("rewrite");
        assert_eq!(read_text(&f.w, "f"), "new");
        assert_eq!(read_text(&f.w, "keep"), "old", "the old inode is untouched");
        assert_ne!(fs::metadata(f.ws.join("f")).expect("stat").ino(), before);
    }

    #[test]
    fn the_root_cannot_be_written_or_deleted_and_modes_stop_at_0o777() {
        let f = fixture();
        for root in ["", ".", "/", "./"] {
            let w = f.w.write_whole(vec![nf(root, 0o644, "x")]);
            assert_eq!(kind(w), FailureKind::Invalid, "{root:?}");
            let d = f.w.delete(&[root.to_string()], true);
            assert_eq!(kind(d), FailureKind::Invalid, "{root:?}");
            assert_eq!(kind(f.w.read_file(root, 10)), FailureKind::IsDirectory);
        }
        for mode in [0o1000, 0o4755, 0o2755, u32::MAX] {
            let w = f.w.write_whole(vec![nf("m", mode, "x")]);
            assert_eq!(kind(w), FailureKind::Invalid, "{mode:o}");
        }
        assert!(!f.ws.join("m").exists());
        assert!(f.ws.is_dir());
    }

    #[test]
    fn a_failed_precondition_writes_nothing_and_names_the_hash_now() {
        let f = fixture();
        write(&f.w, "a", "one").expect("write");
        write(&f.w, "real/b", "bee").expect("write");
        symlink("real/b", f.ws.join("to_b")).expect("symlink");
        let with = |path: &str, content: &str, p: Precondition| {
            let mut whole = nf(path, 0o644, content);
            whole.0.precondition = p;
            whole
        };
        let stale = hash(b"old");
        let failed =
            f.w.write_whole(vec![
                with("new/dir/c", "c", Precondition::None),
                with("to_b", "B", Precondition::IfMatch(hash(b"bee"))),
                with("a", "A", Precondition::IfMatch(stale)),
                with("real/b", "B", Precondition::IfNoneMatch),
                with("gone", "g", Precondition::IfMatch(stale)),
            ])
            .expect("answered");
        assert_eq!(
            failed,
            [
                Mismatch {
                    path: "a".into(),
                    current: Some(hash(b"one"))
                },
                Mismatch {
                    path: "real/b".into(),
                    current: Some(hash(b"bee"))
                },
                Mismatch {
                    path: "gone".into(),
                    current: None
                },
            ]
        );
        assert_eq!(read_text(&f.w, "a"), "one");
        assert_eq!(read_text(&f.w, "real/b"), "bee");
        assert!(!f.ws.join("new").exists() && !f.ws.join("gone").exists());
        assert!(temps_under(&f.ws).is_empty());
        // Through the symlink, with the hash it has: written.
        let failed =
            f.w.write_whole(vec![
                with("to_b", "B", Precondition::IfMatch(hash(b"bee"))),
                with("fresh", "f", Precondition::IfNoneMatch),
            ])
            .expect("written");
        assert!(failed.is_empty());
        assert_eq!(read_text(&f.w, "real/b"), "B");
        assert_eq!(read_text(&f.w, "fresh"), "f");
    }

    #[test]
    fn a_write_refused_at_a_later_target_changes_nothing() {
        let f = fixture();
        write(&f.w, "keep", "old").expect("write");
        fs::create_dir(f.ws.join("adir")).expect("mkdir");
        let files = vec![
            nf("new/dir/a", 0o644, "a"),
            nf("keep", 0o644, "new"),
            nf("adir", 0o644, "x"),
        ];
        let e = f.w.write_whole(files).expect_err("a directory");
        assert_eq!(e.kind, FailureKind::IsDirectory);
        assert_eq!(e.message, "adir is a directory");
        let files = vec![nf("x/y/z", 0o644, "z"), nf("keep/sub", 0o644, "x")];
        assert_eq!(kind(f.w.write_whole(files)), FailureKind::NotDirectory);
        assert!(
            !f.ws.join("new").exists(),
            "created directories are removed"
        );
        assert!(!f.ws.join("x").exists(), "created directories are removed");
        assert_eq!(read_text(&f.w, "keep"), "old");
        assert!(temps_under(&f.ws).is_empty());
    }

    #[test]
    fn a_write_failing_after_staging_leaves_no_temporaries() {
        let mut f = fixture();
        write(&f.w, "keep", "old").expect("write");
        fs::create_dir(f.ws.join("gone")).expect("mkdir");
        // The third file's directory disappears once the first two are
        // staged: creating its temporary fails.
        let gone = f.ws.join("gone");
        f.w.hook = Some(Box::new(move |step| {
            if step == Step::Stage("gone/f") {
                fs::remove_dir(&gone).expect("rmdir");
            }
        }));
        let files = vec![
            nf("n1/n2/first", 0o644, "first"),
            nf("keep", 0o644, "new"),
            nf("gone/f", 0o644, "x"),
        ];
        assert_eq!(kind(f.w.write_whole(files)), FailureKind::Changed);
        assert!(temps_under(&f.ws).is_empty(), "{:?}", temps_under(&f.ws));
        assert!(!f.ws.join("n1").exists(), "created directories are removed");
        assert_eq!(read_text(&f.w, "keep"), "old");
    }

    #[test]
    fn a_write_whose_content_ends_early_or_overruns_a_file_leaves_nothing() {
        let f = fixture();
        write(&f.w, "keep", "old").expect("write");
        let files = || {
            vec![
                NewFile {
                    path: "n/first".into(),
                    mode: 0o644,
                    size: 4,
                    precondition: Precondition::None,
                },
                NewFile {
                    path: "keep".into(),
                    mode: 0o644,
                    size: 3,
                    precondition: Precondition::None,
                },
            ]
        };
        // The connection goes away after the first file's content.
        let (tx, mut rx) = std::sync::mpsc::channel();
        tx.send(Bytes::from_static(b"abcd")).expect("send");
        drop(tx);
        let e = f.w.write_files(files(), &mut rx).expect_err("ended early");
        assert_eq!(e.kind, FailureKind::Other);
        assert_eq!(
            e.message,
            "the content of the write ended before every file was whole"
        );
        // A piece holding bytes of the first and the second file.
        let mut pieces: std::collections::VecDeque<Bytes> =
            [&b"ab"[..], b"cdnew"].map(Bytes::copy_from_slice).into();
        let e = f.w.write_files(files(), &mut pieces).expect_err("overrun");
        assert_eq!(e.kind, FailureKind::Other);
        assert_eq!(e.message, "n/first: a piece of content past its size");
        assert_eq!(read_text(&f.w, "keep"), "old");
        assert!(!f.ws.join("n").exists(), "created directories are removed");
        assert!(temps_under(&f.ws).is_empty());
    }

    /// RLIMIT_FSIZE and SIGXFSZ belong to the whole process, so this test
    /// runs itself again, alone, in a child process that sets them.
    #[test]
    fn a_write_past_the_file_size_limit_is_too_large() {
        const CHILD: &str = "SANDBOXD_AGENT_TEST_FSIZE_CHILD";
        const NAME: &str = "files::write::tests::a_write_past_the_file_size_limit_is_too_large";
        if std::env::var_os(CHILD).is_none() {
            let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
                .args(["--exact", NAME, "--test-threads=1", "--nocapture"])
                .env(CHILD, "1")
                .output()
                .expect("run the child");
            let said = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(out.status.success(), "child failed: {said}");
            assert!(said.contains("1 passed"), "child ran no test: {said}");
            return;
        }
        // As the agent must: a handler for SIGXFSZ, so that a write past the
        // limit fails with EFBIG instead of killing the process.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .expect("runtime");
        let xfsz =
            tokio::signal::unix::SignalKind::from_raw(rustix::process::Signal::XFSZ.as_raw());
        let _handler = rt
            .block_on(async { tokio::signal::unix::signal(xfsz) })
            .expect("SIGXFSZ handler");
        let f = fixture();
        let fsize = rustix::process::Resource::Fsize;
        let old = rustix::process::getrlimit(fsize);
        rustix::process::setrlimit(
            fsize,
            rustix::process::Rlimit {
                current: Some(4096),
                maximum: old.maximum,
            },
        )
        .expect("setrlimit");
        let files = vec![
            nf("small", 0o644, vec![1; 100]),
            nf("d/big", 0o644, vec![2; 10_000]),
        ];
        let e = f.w.write_whole(files).expect_err("too big");
        assert_eq!(e.kind, FailureKind::TooLarge);
        assert_eq!(
            e.message,
            "the file would exceed the sandbox's file size limit of 4096 bytes"
        );
        assert!(!f.ws.join("small").exists() && !f.ws.join("d").exists());
        assert!(temps_under(&f.ws).is_empty());
    }
}
