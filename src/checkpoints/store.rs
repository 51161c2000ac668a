//! One sandbox's checkpoint store on the host, in sandboxd's state
//! directory (see `Config::checkpoint_dir`), never in the workspace volume
//! and never mounted into a container: `objects/` holds each content once,
//! named by its SHA-256 (so every checkpoint of the sandbox shares it),
//! and `packs/` the small ones, many to a file, named the same way (see
//! [`super::pack`]);
//! `trees/` the checkpoints' entries in pieces (see `manifest::split`),
//! each piece once by its SHA-256 too; `manifests/` one small JSON
//! manifest per checkpoint naming its trees; `usage` the objects' bytes;
//! `tmp/` what is being written. Directories are 0700 and files 0600.
//!
//! Its file I/O blocks, so the async side runs it through
//! [`Store::blocking`], on tokio's blocking threads, never on a worker of
//! the runtime.
//!
//! A change (a checkpoint, a delete) runs between [`Store::begin`] and
//! [`Store::end`], which mark the store `changing` (durably). Objects and
//! trees are written to `tmp/` and renamed into place (packs written in
//! place) unsynced, then each is synced, with its directory, before the
//! manifest that names them is written, synced and renamed into place: a crash (a SIGKILL or a power
//! cut mid-checkpoint) leaves at most unreferenced or half-written objects
//! and trees, and the marker, which makes the next change sweep every
//! object and tree no manifest names first, never a manifest that names a
//! missing object or half a file. Without the marker, nothing is swept
//! and `usage` is believed: a checkpoint's cost does not grow with the
//! store.

use std::collections::{HashMap, HashSet};
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::manifest::{Entry, EntryKind, INLINE_VERSION, Manifest, VERSION, split};
use super::pack::{LoadedPacks, Packs};
use super::recent::Newest;
pub(super) use super::store_files::{StoreError, StoreResult, hex};
use super::store_files::{failed, plain, start_writeback, sync_dir};

/// Present while a change of the store is under way, or was cut short.
const CHANGING: &str = "changing";
/// The objects' bytes, in decimal, when no change is under way.
const USAGE: &str = "usage";

/// One sandbox's store.
#[derive(Debug, Clone)]
pub(super) struct Store {
    dir: PathBuf,
    packs: LoadedPacks,
    /// The files this value and its clones (one operation's) wrote and
    /// have not synced.
    unsynced: Arc<Mutex<Vec<PathBuf>>>,
}

impl Store {
    /// The store in `dir`, its packs' indexes loaded into `packs`.
    pub(super) fn at(dir: PathBuf, packs: LoadedPacks) -> Store {
        Store {
            dir,
            packs,
            unsynced: Arc::default(),
        }
    }

    /// The files written and not yet synced. A panic while they were
    /// held leaves a list that is whole at every step, so it is used on.
    fn unsynced(&self) -> std::sync::MutexGuard<'_, Vec<PathBuf>> {
        self.unsynced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes files written, to sync before a manifest names them.
    fn written(&self, paths: impl IntoIterator<Item = PathBuf>) {
        self.unsynced().extend(paths);
    }

    /// Makes every file noted as written durable, and the directories
    /// that name them. Only those: a `syncfs` would also flush whatever
    /// else is dirty on the file system (a workspace just written, on the
    /// same disk), which cost a third of a first checkpoint.
    fn sync_written(&self) -> StoreResult<()> {
        let paths = std::mem::take(&mut *self.unsynced());
        for path in &paths {
            File::open(path)
                .and_then(|f| f.sync_data())
                .map_err(|e| failed("sync", path, e))?;
        }
        for d in ["objects", "packs", "trees"] {
            sync_dir(&self.sub(d))?;
        }
        Ok(())
    }

    /// The packs' indexes, as loaded (`None` before). Indexes a panic
    /// left half changed are dropped, to be loaded again.
    fn packs_held(&self) -> StoreResult<std::sync::MutexGuard<'_, Option<Packs>>> {
        Ok(self.packs.lock().unwrap_or_else(|poisoned| {
            self.packs.clear_poison();
            let mut held = poisoned.into_inner();
            *held = None;
            held
        }))
    }

    /// Drops the packs' indexes kept in memory: the next use loads them
    /// from disk (a `verify` trusts nothing kept).
    pub(super) fn reload_packs(&self) -> StoreResult<()> {
        *self.packs_held()? = None;
        Ok(())
    }

    /// Runs `work` on the packs, loaded if they were not.
    fn with_packs<T>(&self, work: impl FnOnce(&mut Packs) -> StoreResult<T>) -> StoreResult<T> {
        let mut guard = self.packs_held()?;
        let packs = match guard.take() {
            Some(packs) => packs,
            None => Packs::load(self.sub("packs"))?,
        };
        let done = work(guard.insert(packs));
        // A change cut short may have left them other than the disk:
        // loaded again by the next use.
        if done.is_err() {
            *guard = None;
        }
        done
    }

    /// Runs `work` on this store on a blocking thread.
    pub(super) async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Store) -> StoreResult<T> + Send + 'static,
    ) -> StoreResult<T> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || work(&store))
            .await
            .map_err(StoreError::ended_early)?
    }

    fn sub(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Makes the directories (0700) if missing.
    fn make_dirs(&self) -> StoreResult<()> {
        for d in ["objects", "packs", "trees", "manifests", "tmp"] {
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
        let mut m: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| StoreError(format!("{} is not a manifest: {e}", path.display())))?;
        let fits = match (m.version, &m.entries) {
            (VERSION, None) => true,
            (INLINE_VERSION, Some(entries)) => {
                m.files = entries.iter().filter(|e| e.kind == EntryKind::File).count() as u64;
                m.trees.is_empty()
            }
            _ => false,
        };
        if !fits || m.id != id {
            return Err(StoreError(format!(
                "{} is a manifest of another version or id",
                path.display()
            )));
        }
        Ok(Some(m))
    }

    /// Checkpoint `m` as [`Newest`] holds it: its entries and its trees
    /// with how many of them each holds.
    pub(super) fn newest(&self, m: Manifest) -> StoreResult<Newest> {
        let (entries, lens) = self.entries_in_trees(&m)?;
        let walked_at_ns = m.walk_began_ns();
        Ok(Newest {
            id: m.id,
            entries,
            walked_at_ns,
            trees: m.trees.into_iter().zip(lens).collect(),
        })
    }

    /// Checkpoint `m`'s entries, and how many each of its trees holds
    /// (none for a checkpoint made before trees).
    fn entries_in_trees(&self, m: &Manifest) -> StoreResult<(Vec<Entry>, Vec<usize>)> {
        if let Some(inline) = &m.entries {
            return Ok((inline.clone(), Vec::new()));
        }
        let mut all: Vec<Entry> = Vec::new();
        let mut lens = Vec::with_capacity(m.trees.len());
        for tree in &m.trees {
            let part = self.tree(tree)?;
            let first = part.first().map(|e| e.path.as_str());
            let sorted = part.windows(2).all(|w| w[0].path < w[1].path);
            let after = match (all.last(), first) {
                (Some(last), Some(first)) => last.path.as_str() < first,
                (_, first) => first.is_some(),
            };
            if !sorted || !after {
                return Err(StoreError(format!(
                    "tree {tree} of checkpoint {} is out of order",
                    m.id
                )));
            }
            lens.push(part.len());
            all.extend(part);
        }
        Ok((all, lens))
    }

    fn tree(&self, sha256: &str) -> StoreResult<Vec<Entry>> {
        let path = self.named("trees", sha256)?;
        let bytes = std::fs::read(&path).map_err(|e| failed("read", &path, e))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| StoreError(format!("{} is not a tree: {e}", path.display())))
    }

    /// Writes checkpoint `m` with `entries` (sorted by path) durably: its
    /// trees not yet stored, every object and tree made durable, then
    /// its manifest, whose `duration_ms` is the time from `started` to
    /// the moment its content was durable. The trees of `previous` that
    /// hold the same entries are taken as they are. The manifest as
    /// saved, and how many entries each of its trees holds.
    pub(super) fn save_manifest(
        &self,
        mut m: Manifest,
        entries: &[Entry],
        previous: &Newest,
        started: Instant,
    ) -> StoreResult<(Manifest, Vec<usize>)> {
        self.make_dirs()?;
        m.trees.clear();
        let mut lens = Vec::new();
        // The previous checkpoint's trees by their first path: one that
        // holds the same entries is shared as it is.
        let mut shared: HashMap<&str, (&[Entry], &str)> = HashMap::new();
        let mut rest = previous.entries.as_slice();
        for (tree, len) in &previous.trees {
            let Some((part, after)) = rest.split_at_checked(*len) else {
                break;
            };
            if let Some(first) = part.first() {
                shared.insert(first.path.as_str(), (part, tree.as_str()));
            }
            rest = after;
        }
        for part in split(entries) {
            let same = part
                .first()
                .and_then(|e| shared.get(e.path.as_str()))
                .filter(|(p, _)| *p == part);
            if let Some((_, sha256)) = same {
                if self.named("trees", sha256)?.is_file() {
                    m.trees.push((*sha256).to_string());
                    lens.push(part.len());
                    continue;
                }
            }
            // Serialising strings and numbers cannot fail.
            let bytes = serde_json::to_vec(part).unwrap_or_default();
            let sha256 = hex(&Sha256::digest(&bytes));
            let to = self.named("trees", &sha256)?;
            if !to.is_file() {
                let mut tmp = self.temp_file()?;
                tmp.file
                    .write_all(&bytes)
                    .map_err(|e| failed("write", &tmp.path, e))?;
                std::fs::rename(&tmp.path, &to).map_err(|e| failed("rename into", &to, e))?;
                self.written([to]);
            }
            m.trees.push(sha256);
            lens.push(part.len());
        }
        self.sync_written()?;
        m.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let bytes = serde_json::to_vec(&m).unwrap_or_default();
        let mut tmp = self.temp_file()?;
        tmp.file
            .write_all(&bytes)
            .and_then(|()| tmp.file.sync_all())
            .map_err(|e| failed("write", &tmp.path, e))?;
        let to = self.sub("manifests").join(format!("{}.json", m.id));
        std::fs::rename(&tmp.path, &to).map_err(|e| failed("rename into", &to, e))?;
        // Listed from here on, with its content durable: a failure to
        // sync its name leaves it saved, not half made.
        if let Err(e) = sync_dir(&self.sub("manifests")) {
            tracing::warn!(error = %e, checkpoint = %m.id, "a checkpoint's name may not survive a power cut");
        }
        Ok((m, lens))
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
        self.named("objects", sha256)
    }

    /// Object or tree `sha256` of directory `dir`.
    fn named(&self, dir: &str, sha256: &str) -> StoreResult<PathBuf> {
        if !plain(sha256) {
            return Err(StoreError(format!("{sha256:?} is not an object name")));
        }
        Ok(self.sub(dir).join(sha256))
    }

    /// Starts a change: clears `tmp/`, sweeps what a change cut short
    /// left (when the store is marked changing, or its usage is unknown),
    /// and marks the store changing. The objects' bytes.
    pub(super) fn begin(&self) -> StoreResult<u64> {
        self.clear_temporaries()?;
        let marker = self.sub(CHANGING);
        let usage = match std::fs::read_to_string(self.sub(USAGE)) {
            Ok(text) if !marker.exists() => text.trim().parse().ok(),
            _ => None,
        };
        let usage = match usage {
            Some(u) => u,
            None => self.collect_garbage()?,
        };
        if !marker.exists() {
            File::create(&marker).map_err(|e| failed("create", &marker, e))?;
            sync_dir(&self.dir)?;
        }
        Ok(usage)
    }

    /// Ends a change that left the objects `usage` bytes: records it, then
    /// lifts the mark (a mark that a crash keeps costs one sweep).
    pub(super) fn end(&self, usage: u64) -> StoreResult<()> {
        let mut tmp = self.temp_file()?;
        tmp.file
            .write_all(usage.to_string().as_bytes())
            .and_then(|()| tmp.file.sync_all())
            .map_err(|e| failed("write", &tmp.path, e))?;
        let to = self.sub(USAGE);
        std::fs::rename(&tmp.path, &to).map_err(|e| failed("rename into", &to, e))?;
        sync_dir(&self.dir)?;
        let marker = self.sub(CHANGING);
        std::fs::remove_file(&marker).map_err(|e| failed("remove", &marker, e))
    }

    /// Removes every object and tree no checkpoint names: the bytes of
    /// the objects left.
    pub(super) fn collect_garbage(&self) -> StoreResult<u64> {
        let all = self.manifests()?;
        let trees: HashSet<&str> = all
            .iter()
            .flat_map(|m| m.trees.iter().map(String::as_str))
            .collect();
        let mut objects = HashSet::new();
        let mut named = |entries: &[Entry]| {
            objects.extend(entries.iter().filter_map(|e| e.sha256.clone()));
        };
        for tree in &trees {
            named(&self.tree(tree)?);
        }
        for m in &all {
            if let Some(inline) = &m.entries {
                named(inline);
            }
        }
        self.sweep("trees", &trees)?;
        let objects: HashSet<&str> = objects.iter().map(String::as_str).collect();
        let loose = self.sweep("objects", &objects)?;
        let packed = self.with_packs(|p| p.collect(&objects))?;
        Ok(loose + packed)
    }

    /// Object `sha256` to read, checked to hold `size` bytes: one stored
    /// as a file of its own (any larger than `SMALL_FILE`).
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
        let failed = |e: std::io::Error| StoreError(format!("cannot read object {sha256}: {e}"));
        match self.with_packs(|p| Ok(p.read(sha256, size)))? {
            Some(Ok(content)) => return Ok(content),
            // A delete rewrote its pack since the indexes were loaded:
            // loaded again, they say where it is now.
            Some(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                *self.packs_held()? = None;
                if let Some(again) = self.with_packs(|p| Ok(p.read(sha256, size)))? {
                    return again.map_err(failed);
                }
            }
            Some(Err(e)) => return Err(failed(e)),
            None => {}
        }
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

    /// Stores `contents` (small files) in one new pack: what each became,
    /// in order. A content the store holds (in a pack or a file of its
    /// own) is not stored again. Unsynced, as [`ObjectWriter::finish`].
    pub(super) fn put_all(&self, contents: Vec<Vec<u8>>) -> StoreResult<Vec<Stored>> {
        self.make_dirs()?;
        self.with_packs(|packs| {
            let mut done = Vec::with_capacity(contents.len());
            let mut new: Vec<(String, &[u8])> = Vec::new();
            let mut queued = HashSet::new();
            for content in &contents {
                let sha256 = hex(&Sha256::digest(content));
                let stored = !queued.contains(&sha256)
                    && !packs.holds(&sha256, content.len() as u64)
                    && !self.object_path(&sha256)?.is_file();
                if stored {
                    queued.insert(sha256.clone());
                    new.push((sha256.clone(), content.as_slice()));
                }
                done.push(Stored {
                    sha256,
                    size: content.len() as u64,
                    new: stored,
                });
            }
            if !new.is_empty() {
                self.written(packs.write(&new, false)?);
            }
            Ok(done)
        })
    }

    /// A new object, written piece by piece.
    pub(super) fn new_object(&self) -> StoreResult<ObjectWriter> {
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

    /// Removes every file of `dir` not in `keep`: the bytes kept.
    fn sweep(&self, dir: &str, keep: &HashSet<&str>) -> StoreResult<u64> {
        let mut kept = 0;
        for (name, size) in self.sizes(dir)? {
            if keep.contains(name.as_str()) {
                kept += size;
            } else {
                let path = self.sub(dir).join(&name);
                std::fs::remove_file(&path).map_err(|e| failed("remove", &path, e))?;
            }
        }
        Ok(kept)
    }

    /// Removes objects `names` (ones a refused checkpoint stored, whose
    /// packs hold nothing else).
    pub(super) fn remove_objects(&self, names: &[String]) -> StoreResult<()> {
        let all: HashSet<&str> = names.iter().map(String::as_str).collect();
        self.with_packs(|p| p.remove_all_of(&all))?;
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

    /// Every file of `dir`: its name and size.
    fn sizes(&self, dir: &str) -> StoreResult<Vec<(String, u64)>> {
        let mut out = Vec::new();
        for item in self.listing(dir)? {
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
    pub(super) fn write(&mut self, piece: &[u8]) -> StoreResult<()> {
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
    /// is kept and this copy dropped), unsynced: [`Store::save_manifest`]
    /// makes it durable.
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
        start_writeback(&self.tmp.file);
        std::fs::rename(&self.tmp.path, &to).map_err(|e| failed("rename into", &to, e))?;
        store.written([to]);
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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::super::manifest::tests::file;
    use super::super::store_files::Scratch;
    use super::*;

    /// A store in a directory of its own, removed when dropped.
    fn store() -> (Scratch, Store) {
        let dir = Scratch::new("sandboxd-checkpoints");
        let s = Store::at(dir.0.join("sbx"), LoadedPacks::default());
        (dir, s)
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
        assert_eq!(
            s.sizes("objects").expect("objects"),
            [(a.sha256.clone(), 5)]
        );
        let mode =
            |p: &std::path::Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&s.object_path(&a.sha256).expect("path")), 0o600);
        assert_eq!(mode(&s.sub("objects")), 0o700);
        let other = put(&s, b"other");
        let keep: HashSet<&str> = [a.sha256.as_str()].into();
        assert_eq!(s.sweep("objects", &keep).expect("sweep"), 5, "bytes kept");
        assert_eq!(
            s.sizes("objects").expect("objects"),
            [(a.sha256.clone(), 5)]
        );
        assert!(other.new);
        assert!(s.read_object("../x", 5).is_err(), "names are plain");
        let (tx, rx) = mpsc::channel(4);
        tx.try_send(b"toolong".to_vec()).expect("send");
        drop(tx);
        assert!(s.receive_object(rx, 5).expect("receive").is_none());
        assert_eq!(std::fs::read_dir(s.sub("tmp")).expect("tmp").count(), 0);
    }

    fn manifest(id: &str, seq: u64) -> Manifest {
        Manifest {
            version: VERSION,
            id: id.into(),
            label: None,
            created_at: 5,
            seq,
            bytes: 0,
            new_bytes: 0,
            duration_ms: 0,
            files: 0,
            walked_at_ns: 0,
            trees: Vec::new(),
            entries: None,
        }
    }

    /// `n` files `f00000`… whose content hashes are `hash(i)`.
    fn files(n: usize, hash: impl Fn(usize) -> String) -> Vec<Entry> {
        (0..n)
            .map(|i| Entry {
                sha256: Some(hash(i)),
                ..file(&format!("f{i:05}"), "", 0o644)
            })
            .collect()
    }

    fn ids(s: &Store) -> Vec<String> {
        let all = s.manifests().expect("list");
        all.into_iter().map(|m| m.id).collect()
    }

    #[test]
    fn manifests_round_trip_newest_first_sharing_their_unchanged_trees() {
        let (_tmp, s) = store();
        let first = files(2000, |i| format!("{i:064x}"));
        let mut second = first.clone();
        second[1000].sha256 = Some(format!("{:064x}", 99_999));
        s.save_manifest(
            manifest("a1", 1),
            &first,
            &Newest::default(),
            Instant::now(),
        )
        .expect("save");
        let trees_of_one = s.sizes("trees").expect("trees").len();
        assert!(trees_of_one > 10, "{trees_of_one} trees for 2000 entries");
        s.save_manifest(
            manifest("b2", 2),
            &second,
            &Newest::default(),
            Instant::now(),
        )
        .expect("save");
        assert_eq!(
            s.sizes("trees").expect("trees").len(),
            trees_of_one + 1,
            "one changed entry: one more tree, every other shared"
        );
        assert_eq!(ids(&s), ["b2", "a1"]);
        let b2 = s.manifest("b2").expect("read").expect("there");
        assert_eq!(s.newest(b2.clone()).expect("entries").entries, second);
        let a1 = s.manifest("a1").expect("read").expect("there");
        assert_eq!(s.newest(a1.clone()).expect("entries").entries, first);
        assert!(
            s.manifest("../a1").expect("read").is_none(),
            "ids are plain"
        );

        // With a1 kept in memory, a third checkpoint takes a1's trees
        // as they are, except the changed one: the same trees as b2's.
        let a1_kept = s.newest(a1.clone()).expect("a1");
        assert_eq!(a1_kept.entries, first);
        assert_eq!(
            a1_kept.trees.iter().map(|(_, n)| n).sum::<usize>(),
            first.len(),
            "each tree with how many entries it holds"
        );
        let (c3, lens) = s
            .save_manifest(manifest("c3", 3), &second, &a1_kept, Instant::now())
            .expect("save");
        assert_eq!(lens.iter().sum::<usize>(), second.len());
        assert_eq!(c3.trees, b2.trees);
        // A kept tree whose file is gone is written again.
        let gone = s.named("trees", &a1.trees[0]).expect("name");
        std::fs::remove_file(&gone).expect("remove");
        let (d4, _) = s
            .save_manifest(manifest("d4", 4), &second, &a1_kept, Instant::now())
            .expect("save");
        assert_eq!(d4.trees, b2.trees);
        assert!(gone.is_file(), "written again");
        for id in ["c3", "d4"] {
            assert!(s.remove_manifest(id).expect("remove"));
        }

        assert!(s.remove_manifest("b2").expect("remove"));
        assert!(!s.remove_manifest("b2").expect("again"));
        s.collect_garbage().expect("collect");
        assert_eq!(s.sizes("trees").expect("trees").len(), trees_of_one);
        assert_eq!(
            s.newest(a1.clone()).expect("entries").entries,
            first,
            "a1's trees stay"
        );
        assert!(s.remove_manifest("a1").expect("remove"));
        s.collect_garbage().expect("collect");
        assert!(s.sizes("trees").expect("trees").is_empty());
    }

    #[test]
    fn a_change_cut_short_is_swept_by_the_next_and_only_then() {
        let (_tmp, s) = store();
        assert_eq!(s.begin().expect("begin"), 0, "an empty store");
        let kept = put(&s, b"kept!");
        let mut m = manifest("a1", 1);
        m.files = 1;
        let entries = vec![Entry {
            sha256: Some(kept.sha256.clone()),
            ..file("k", "kept!", 0o644)
        }];
        s.save_manifest(m, &entries, &Newest::default(), Instant::now())
            .expect("save");
        s.end(5).expect("end");
        assert!(!s.sub(CHANGING).exists());

        // A change that ends cleanly is believed: nothing is swept.
        let stray = put(&s, b"stray");
        assert_eq!(s.begin().expect("begin"), 5, "the usage recorded");
        assert!(s.object_path(&stray.sha256).expect("path").exists());
        // One cut short (no end): the next sweeps what no manifest names.
        let w = s.new_object().expect("object");
        drop(w);
        assert_eq!(s.begin().expect("begin"), 5, "counted again");
        assert!(!s.object_path(&stray.sha256).expect("path").exists());
        assert!(s.object_path(&kept.sha256).expect("path").exists());
        assert_eq!(std::fs::read_dir(s.sub("tmp")).expect("tmp").count(), 0);
        s.end(5).expect("end");
        std::fs::remove_file(s.sub(USAGE)).expect("remove usage");
        assert_eq!(s.begin().expect("begin"), 5, "an unknown usage is counted");
    }

    #[test]
    fn a_manifest_of_the_first_format_is_read_with_its_entries_inline() {
        let (_tmp, s) = store();
        let inline = r#"{"version":1,"id":"old1","label":"turn","createdAt":7,"seq":1,
            "bytes":3,"newBytes":3,"durationMs":1,"entries":[
            {"path":"d","kind":"dir","mode":493,"size":0,"sha256":null,"target":null,"mtimeNs":1,"ctimeNs":1,"ino":1},
            {"path":"d/a","kind":"file","mode":420,"size":3,"sha256":"aa","target":null,"mtimeNs":1,"ctimeNs":1,"ino":2}]}"#;
        std::fs::create_dir_all(s.sub("manifests")).expect("dir");
        std::fs::write(s.sub("manifests").join("old1.json"), inline).expect("write");
        let m = s.manifest("old1").expect("read").expect("there");
        assert_eq!((m.files, m.label.as_deref()), (1, Some("turn")));
        let paths: Vec<String> = s
            .newest(m)
            .expect("entries")
            .entries
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert_eq!(paths, ["d", "d/a"]);
        std::fs::write(
            s.sub("manifests").join("bad1.json"),
            inline.replace(
                "\"version\":1,\"id\":\"old1\"",
                "\"version\":2,\"id\":\"bad1\"",
            ),
        )
        .expect("write");
        assert!(s.manifest("bad1").is_err(), "version 2 with inline entries");
    }
}
