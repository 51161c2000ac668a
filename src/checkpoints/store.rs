//! One sandbox's checkpoint store on the host, in sandboxd's state
//! directory (see `Config::checkpoint_dir`), never in the workspace volume
//! and never mounted into a container: `objects/` holds each content once,
//! named by its SHA-256 (so every checkpoint of the sandbox shares it);
//! `manifests/` one JSON manifest per checkpoint; `tmp/` what is being
//! written. Directories are 0700 and files 0600.
//!
//! Its file I/O blocks, so the async side runs it through
//! [`Store::blocking`], on tokio's blocking threads, never on a worker of
//! the runtime.
//!
//! Everything is written to `tmp/`, synced, then renamed into place (and
//! the directory synced), and a manifest only after every object it names:
//! a crash (a SIGKILL mid-checkpoint) leaves at most unreferenced objects
//! and temporary files, which the next checkpoint of the sandbox sweeps,
//! never a manifest that names a missing object or half a file.

use std::collections::HashSet;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::manifest::{Manifest, VERSION};

/// Why the store failed: one line, naming the path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StoreError(String);

impl StoreError {
    /// There is no state directory to keep checkpoints in.
    pub(super) fn none_configured() -> StoreError {
        StoreError("no state_dir is set (SANDBOXD_STATE_DIR) to keep checkpoints in".into())
    }
}

type StoreResult<T> = Result<T, StoreError>;

fn failed(what: &str, path: &Path, e: std::io::Error) -> StoreError {
    StoreError(format!("cannot {what} {}: {e}", path.display()))
}

/// Lowercase hex of a hash.
pub(super) fn hex(hash: &[u8]) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

/// A name the store gives out (an object's hash, a checkpoint's id): plain
/// lowercase hex or `[a-z0-9]`, so it is one path component.
fn plain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
}

/// One sandbox's store.
#[derive(Debug, Clone)]
pub(super) struct Store {
    dir: PathBuf,
}

impl Store {
    pub(super) fn at(dir: PathBuf) -> Store {
        Store { dir }
    }

    /// Runs `work` on this store on a blocking thread.
    pub(super) async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Store) -> StoreResult<T> + Send + 'static,
    ) -> StoreResult<T> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || work(&store))
            .await
            .map_err(|e| StoreError(format!("a task of the store ended early: {e}")))?
    }

    fn sub(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Makes the directories (0700) if missing.
    fn make_dirs(&self) -> StoreResult<()> {
        for d in ["objects", "manifests", "tmp"] {
            let path = self.sub(d);
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&path)
                .map_err(|e| failed("create", &path, e))?;
        }
        Ok(())
    }

    /// The entries of directory `name` (none when it is missing).
    fn listing(&self, name: &str) -> StoreResult<Vec<std::fs::DirEntry>> {
        let dir = self.sub(name);
        match std::fs::read_dir(&dir) {
            Ok(l) => l
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| failed("list", &dir, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(failed("list", &dir, e)),
        }
    }

    /// Every checkpoint, newest first.
    pub(super) fn manifests(&self) -> StoreResult<Vec<Manifest>> {
        let mut all = Vec::new();
        for item in self.listing("manifests")? {
            let name = item.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            if let Some(m) = self.manifest(id)? {
                all.push(m);
            }
        }
        all.sort_by_key(|m| std::cmp::Reverse((m.created_at, m.seq)));
        Ok(all)
    }

    /// The checkpoint `id`, if there is one.
    pub(super) fn manifest(&self, id: &str) -> StoreResult<Option<Manifest>> {
        if !plain(id) {
            return Ok(None);
        }
        let path = self.sub("manifests").join(format!("{id}.json"));
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(failed("read", &path, e)),
        };
        let m: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| StoreError(format!("{} is not a manifest: {e}", path.display())))?;
        if m.version != VERSION || m.id != id {
            return Err(StoreError(format!(
                "{} is a manifest of another version or id",
                path.display()
            )));
        }
        Ok(Some(m))
    }

    /// Writes `m` durably, after every object it names.
    pub(super) fn save_manifest(&self, m: &Manifest) -> StoreResult<()> {
        self.make_dirs()?;
        // Serialising strings and numbers cannot fail.
        let bytes = serde_json::to_vec(m).unwrap_or_default();
        let mut tmp = self.temp_file()?;
        tmp.file
            .write_all(&bytes)
            .and_then(|()| tmp.file.sync_all())
            .map_err(|e| failed("write", &tmp.path, e))?;
        let to = self.sub("manifests").join(format!("{}.json", m.id));
        std::fs::rename(&tmp.path, &to).map_err(|e| failed("rename into", &to, e))?;
        sync_dir(&self.sub("manifests"))
    }

    /// Removes checkpoint `id`'s manifest: whether there was one.
    pub(super) fn remove_manifest(&self, id: &str) -> StoreResult<bool> {
        if !plain(id) {
            return Ok(false);
        }
        let path = self.sub("manifests").join(format!("{id}.json"));
        match std::fs::remove_file(&path) {
            Ok(()) => sync_dir(&self.sub("manifests")).map(|()| true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(failed("remove", &path, e)),
        }
    }

    fn object_path(&self, sha256: &str) -> StoreResult<PathBuf> {
        if !plain(sha256) {
            return Err(StoreError(format!("{sha256:?} is not an object name")));
        }
        Ok(self.sub("objects").join(sha256))
    }

    /// Object `sha256` to read, checked to hold `size` bytes.
    pub(super) fn open_object(&self, sha256: &str, size: u64) -> StoreResult<File> {
        let path = self.object_path(sha256)?;
        let file = File::open(&path).map_err(|e| failed("open", &path, e))?;
        let len = file.metadata().map_err(|e| failed("stat", &path, e))?.len();
        if len != size {
            return Err(StoreError(format!(
                "{} holds {len} bytes, its checkpoint says {size}",
                path.display()
            )));
        }
        Ok(file)
    }

    /// The first `size` bytes of object `sha256`, which holds that many.
    pub(super) fn read_object(&self, sha256: &str, size: u64) -> StoreResult<Vec<u8>> {
        let mut content = Vec::new();
        self.open_object(sha256, size)?
            .read_to_end(&mut content)
            .map_err(|e| StoreError(format!("cannot read object {sha256}: {e}")))?;
        Ok(content)
    }

    /// A new object written from `pieces` as they come, until the channel
    /// closes: its writer, to finish or discard; `None` (nothing kept)
    /// when more than `max` bytes came.
    pub(super) fn receive_object(
        &self,
        mut pieces: mpsc::Receiver<Vec<u8>>,
        max: u64,
    ) -> StoreResult<Option<ObjectWriter>> {
        let mut writer = self.new_object()?;
        while let Some(piece) = pieces.blocking_recv() {
            if writer.size + piece.len() as u64 > max {
                writer.discard();
                return Ok(None);
            }
            if let Err(e) = writer.write(&piece) {
                writer.discard();
                return Err(e);
            }
        }
        Ok(Some(writer))
    }

    /// A new object, written piece by piece.
    fn new_object(&self) -> StoreResult<ObjectWriter> {
        self.make_dirs()?;
        Ok(ObjectWriter {
            tmp: self.temp_file()?,
            hash: Sha256::new(),
            size: 0,
        })
    }

    fn temp_file(&self) -> StoreResult<TempFile> {
        let name = crate::id::random_hex(12).map_err(|e| StoreError(e.to_string()))?;
        let path = self.sub("tmp").join(name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| failed("create", &path, e))?;
        Ok(TempFile { path, file })
    }

    /// Removes what an interrupted write left in `tmp/`.
    pub(super) fn clear_temporaries(&self) -> StoreResult<()> {
        let dir = self.sub("tmp");
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(failed("remove", &dir, e)),
        }
        self.make_dirs()
    }

    /// Removes every object not in `keep`: the bytes freed.
    pub(super) fn sweep(&self, keep: &HashSet<&str>) -> StoreResult<u64> {
        let mut freed = 0;
        for (name, size) in self.objects()? {
            if !keep.contains(name.as_str()) {
                let path = self.object_path(&name)?;
                std::fs::remove_file(&path).map_err(|e| failed("remove", &path, e))?;
                freed += size;
            }
        }
        Ok(freed)
    }

    /// Removes objects `names` (ones a refused checkpoint stored).
    pub(super) fn remove_objects(&self, names: &[String]) -> StoreResult<()> {
        for name in names {
            let path = self.object_path(name)?;
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(failed("remove", &path, e)),
            }
        }
        Ok(())
    }

    /// Every object's name and size.
    pub(super) fn objects(&self) -> StoreResult<Vec<(String, u64)>> {
        let mut out = Vec::new();
        for item in self.listing("objects")? {
            let size = item
                .metadata()
                .map_err(|e| failed("stat", &item.path(), e))?
                .len();
            if let Some(name) = item.file_name().to_str() {
                out.push((name.to_string(), size));
            }
        }
        Ok(out)
    }
}

/// A file in `tmp/`.
#[derive(Debug)]
struct TempFile {
    path: PathBuf,
    file: File,
}

/// An object being written: hashed as it goes, named by its hash at the
/// end.
#[derive(Debug)]
pub(super) struct ObjectWriter {
    tmp: TempFile,
    hash: Sha256,
    size: u64,
}

/// A finished object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Stored {
    pub(super) sha256: String,
    pub(super) size: u64,
    /// It was not in the store before.
    pub(super) new: bool,
}

impl ObjectWriter {
    fn write(&mut self, piece: &[u8]) -> StoreResult<()> {
        self.hash.update(piece);
        self.size += piece.len() as u64;
        self.tmp
            .file
            .write_all(piece)
            .map_err(|e| failed("write", &self.tmp.path, e))
    }

    /// Bytes written so far.
    pub(super) fn size(&self) -> u64 {
        self.size
    }

    /// Stores the content under its hash (once: an object already there
    /// is kept and this copy dropped).
    pub(super) fn finish(self, store: &Store) -> StoreResult<Stored> {
        let sha256 = hex(&self.hash.finalize());
        let to = store.object_path(&sha256)?;
        if to.is_file() {
            std::fs::remove_file(&self.tmp.path)
                .map_err(|e| failed("remove", &self.tmp.path, e))?;
            return Ok(Stored {
                sha256,
                size: self.size,
                new: false,
            });
        }
        self.tmp
            .file
            .sync_all()
            .map_err(|e| failed("sync", &self.tmp.path, e))?;
        std::fs::rename(&self.tmp.path, &to).map_err(|e| failed("rename into", &to, e))?;
        sync_dir(&store.sub("objects"))?;
        Ok(Stored {
            sha256,
            size: self.size,
            new: true,
        })
    }

    /// Drops the partial object.
    pub(super) fn discard(self) {
        let _ = std::fs::remove_file(&self.tmp.path);
    }
}

fn sync_dir(dir: &Path) -> StoreResult<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| failed("sync", dir, e))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// A store in a directory of its own, removed when dropped.
    struct Scratch(PathBuf);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn store() -> (Scratch, Store) {
        let dir = std::env::temp_dir().join(format!(
            "sandboxd-checkpoints-{}-{}",
            std::process::id(),
            crate::id::random_hex(4).expect("random")
        ));
        let s = Store::at(dir.join("sbx"));
        (Scratch(dir), s)
    }

    fn put(s: &Store, content: &[u8]) -> Stored {
        let (tx, rx) = mpsc::channel(4);
        tx.try_send(content[..1].to_vec()).expect("send");
        tx.try_send(content[1..].to_vec()).expect("send");
        drop(tx);
        let w = s
            .receive_object(rx, 5)
            .expect("receive")
            .expect("in bounds");
        w.finish(s).expect("finish")
    }

    #[test]
    fn objects_are_stored_once_by_hash_and_private() {
        let (_tmp, s) = store();
        let a = put(&s, b"hello");
        assert!(a.new);
        assert_eq!(a.sha256, hex(&Sha256::digest(b"hello")));
        assert!(!put(&s, b"hello").new, "the same content is stored once");
        assert_eq!(s.read_object(&a.sha256, 5).expect("read"), b"hello");
        assert!(s.read_object(&a.sha256, 4).is_err(), "a size that differs");
        assert_eq!(s.objects().expect("objects"), [(a.sha256.clone(), 5)]);
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&s.object_path(&a.sha256).expect("path")), 0o600);
        assert_eq!(mode(&s.sub("objects")), 0o700);
        let other = put(&s, b"other");
        let keep: HashSet<&str> = [a.sha256.as_str()].into();
        assert_eq!(s.sweep(&keep).expect("sweep"), 5);
        assert_eq!(s.objects().expect("objects"), [(a.sha256.clone(), 5)]);
        assert!(other.new);
        assert!(s.read_object("../x", 5).is_err(), "names are plain");
        let (tx, rx) = mpsc::channel(4);
        tx.try_send(b"toolong".to_vec()).expect("send");
        drop(tx);
        assert!(s.receive_object(rx, 5).expect("receive").is_none());
        assert_eq!(std::fs::read_dir(s.sub("tmp")).expect("tmp").count(), 0);
    }

    #[test]
    fn manifests_round_trip_newest_first_and_temporaries_are_cleared() {
        let (_tmp, s) = store();
        let m = |id: &str, seq| Manifest {
            version: VERSION,
            id: id.into(),
            label: None,
            created_at: 5,
            seq,
            bytes: 0,
            new_bytes: 0,
            duration_ms: 0,
            entries: Vec::new(),
        };
        s.save_manifest(&m("a1", 1)).expect("save");
        s.save_manifest(&m("b2", 2)).expect("save");
        let ids: Vec<String> = s
            .manifests()
            .expect("list")
            .into_iter()
            .map(|m| m.id)
            .collect();
        assert_eq!(ids, ["b2", "a1"]);
        assert!(s.remove_manifest("a1").expect("remove"));
        assert!(!s.remove_manifest("a1").expect("again"));
        let w = s.new_object().expect("object");
        drop(w);
        assert_eq!(std::fs::read_dir(s.sub("tmp")).expect("tmp").count(), 1);
        s.clear_temporaries().expect("clear");
        assert_eq!(std::fs::read_dir(s.sub("tmp")).expect("tmp").count(), 0);
    }
}
