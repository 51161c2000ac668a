//! What the file operations' tests share: a workspace in a temporary
//! directory with an alias spelling and a directory outside it, writes of
//! whole contents, a hook that swaps a directory for a symlink mid-walk,
//! and the looks the tests take after an operation.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use sandboxd_proto::{Failure, FailureKind, Mismatch, NewFile, Precondition};
use sha2::{Digest, Sha256};

use super::resolve::{Step, Workspace};
use super::write::Content;
use crate::temp_name::TEMP_PREFIX;

/// A workspace in a temporary directory, its alias spelling (a symlink
/// to it, as a second mount would be), and a directory outside it.
pub(super) struct Fixture {
    _tmp: tempfile::TempDir,
    pub(super) ws: PathBuf,
    pub(super) alias: PathBuf,
    pub(super) outside: PathBuf,
    pub(super) w: Workspace,
}

pub(super) fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().expect("tempdir");
    let base = tmp.path().canonicalize().expect("canonical tempdir");
    let ws = base.join("ws");
    let alias = base.join("alias");
    let outside = base.join("outside");
    fs::create_dir(&ws).expect("mkdir ws");
    symlink(&ws, &alias).expect("alias");
    fs::create_dir_all(outside.join("sub")).expect("mkdir outside");
    fs::write(outside.join("secret"), "secret").expect("write secret");
    fs::write(outside.join("sub/f"), "outside f").expect("write outside f");
    let w = Workspace::new(vec![text(&ws), text(&alias)]);
    Fixture {
        _tmp: tmp,
        ws,
        alias,
        outside,
        w,
    }
}

pub(super) fn text(p: &Path) -> String {
    p.to_str().expect("utf-8 temp path").to_string()
}

/// A file of a write with its content.
pub(super) struct Whole(pub(super) NewFile, Vec<u8>);

pub(super) fn nf(path: &str, mode: u32, content: impl Into<Vec<u8>>) -> Whole {
    let content = content.into();
    let file = NewFile {
        path: path.to_string(),
        mode,
        size: content.len() as u64,
        precondition: Precondition::None,
    };
    Whole(file, content)
}

/// Pieces handed over one by one, as the connection would.
impl Content for std::collections::VecDeque<Bytes> {
    fn next_piece(&mut self) -> Result<Bytes, Failure> {
        self.pop_front()
            .ok_or_else(|| Failure::new(FailureKind::Invalid, "no more pieces"))
    }
}

impl Workspace {
    /// Writes `files`, their content in pieces of 3 bytes.
    pub(super) fn write_whole(&self, files: Vec<Whole>) -> Result<Vec<Mismatch>, Failure> {
        let mut pieces = std::collections::VecDeque::new();
        for Whole(_, content) in &files {
            for piece in content.chunks(3) {
                pieces.push_back(Bytes::copy_from_slice(piece));
            }
        }
        let files = files.into_iter().map(|Whole(f, _)| f).collect();
        self.write_files(files, &mut pieces)
    }
}

pub(super) fn write(w: &Workspace, path: &str, content: &str) -> Result<(), Failure> {
    let failed = w.write_whole(vec![nf(path, 0o644, content)])?;
    assert!(failed.is_empty(), "no preconditions, none fail");
    Ok(())
}

pub(super) fn kind<T: std::fmt::Debug>(r: Result<T, Failure>) -> FailureKind {
    r.expect_err("should fail").kind
}

pub(super) fn read_text(w: &Workspace, path: &str) -> String {
    String::from_utf8(w.read_file(path, 1 << 20).expect("read")).expect("utf-8")
}

/// Temporaries of writes left anywhere under `dir` (symlinks not followed).
pub(super) fn temps_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).expect("read_dir") {
            let e = e.expect("entry");
            if e.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
                found.push(e.path());
            }
            if e.file_type().expect("type").is_dir() {
                todo.push(e.path());
            }
        }
    }
    found
}

pub(super) fn is_symlink(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink())
}

pub(super) fn hash(content: &[u8]) -> [u8; 32] {
    Sha256::digest(content).into()
}

/// Swaps `dir` for a symlink to `to` the first time `at` is reached.
pub(super) fn swap_at(f: &mut Fixture, at: Step<'static>, dir: &str, to: PathBuf) {
    let from = f.ws.join(dir);
    let done = AtomicBool::new(false);
    f.w.hook = Some(Box::new(move |step| {
        if step == at && !done.swap(true, Ordering::SeqCst) {
            let moved = from.with_extension("moved");
            fs::rename(&from, moved).expect("move away");
            symlink(&to, &from).expect("swap in a symlink");
        }
    }));
}
