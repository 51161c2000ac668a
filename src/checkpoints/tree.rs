//! The workspace's tree as the agent shows it, and the restore's changes
//! sent back through it. Everything the agent answers is hostile input:
//! a snapshot is bounded in entries, every path passes the workspace path
//! rules and must be plain (normalised, relative), once, under a
//! directory listed before it; modes stay within 0o7777, link targets
//! within [`MAX_LINK_TARGET`]; a file's content is taken only up to the
//! size the snapshot gave, and only when the agent read it as the file
//! the snapshot saw (else the checkpoint is retried, then refused).
//!
//! A restore's [`Plan`] is made here from two trees, on the host: what
//! to delete, the directories, symlinks and files to make, and the modes
//! to set, in an order that works (directories made writable before
//! they are written in, given their exact modes last).

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use sandboxd_proto::{
    FileIdentity, MAX_LINK_TARGET, NewFile, NewSymlink, PathMode, Precondition, SnapshotEntry,
    WRITE_PIECE,
};
use tokio::sync::mpsc;

use super::CheckpointError;
use super::manifest::{Entry, EntryKind, compare, unchanged_since};
use super::store::{Store, StoreError, Stored, hex};
use crate::agent_client::{AgentConn, Content, WriteOutcome};
use crate::workspace_path::WorkspacePath;

/// Most paths in one stat of the current tree.
const STAT_BATCH: usize = 512;
/// Pieces of a file read from the agent that wait for the disk.
const PIECES_IN_FLIGHT: usize = 4;
/// Most content bytes in one write of a restore (files larger than a
/// piece are read from the store as they are sent, never held whole).
const WRITE_BATCH_BYTES: u64 = 32 * 1024 * 1024;
/// Most files in one write of a restore.
const WRITE_BATCH_FILES: usize = 1024;

fn identity(e: &Entry) -> FileIdentity {
    FileIdentity {
        size: e.size,
        mtime_ns: e.mtime_ns,
        ctime_ns: e.ctime_ns,
        ino: e.ino,
    }
}

/// Checks one snapshot entry and makes it a tree entry (no hash yet).
fn checked(
    e: SnapshotEntry,
    dirs: &[&str],
    seen_dirs: &HashSet<String>,
    seen: &mut HashSet<String>,
) -> Result<Entry, String> {
    let plain = WorkspacePath::parse(&e.path, dirs)
        .ok()
        .filter(|p| !p.is_root() && p.relative() == e.path)
        .is_some();
    if !plain {
        return Err(format!("a snapshot path {:?} that is not plain", e.path));
    }
    if let Some((parent, _)) = e.path.rsplit_once('/') {
        if !seen_dirs.contains(parent) {
            return Err(format!("{:?} before its directory", e.path));
        }
    }
    if !seen.insert(e.path.clone()) {
        return Err(format!("{:?} twice in a snapshot", e.path));
    }
    if e.mode > 0o7777 {
        return Err(format!("mode {:o} of {:?}", e.mode, e.path));
    }
    let kind = match e.kind {
        sandboxd_proto::EntryKind::File => EntryKind::File,
        sandboxd_proto::EntryKind::Dir => EntryKind::Dir,
        sandboxd_proto::EntryKind::Symlink => EntryKind::Symlink,
        sandboxd_proto::EntryKind::Other => {
            return Err(format!("{:?}: a special file in a snapshot", e.path));
        }
    };
    let target_ok = match (&e.target, kind) {
        (Some(t), EntryKind::Symlink) => {
            !t.is_empty() && t.len() <= MAX_LINK_TARGET && !t.contains('\0')
        }
        (None, EntryKind::File | EntryKind::Dir) => true,
        _ => false,
    };
    if !target_ok {
        return Err(format!("{:?}: a link target that does not fit", e.path));
    }
    Ok(Entry {
        path: e.path,
        kind,
        mode: e.mode,
        size: if kind == EntryKind::File {
            e.identity.size
        } else {
            0
        },
        sha256: None,
        target: e.target,
        mtime_ns: e.identity.mtime_ns,
        ctime_ns: e.identity.ctime_ns,
        ino: e.identity.ino,
    })
}

/// The agent of one sandbox, for one checkpoint operation.
pub(super) struct Agent<'a> {
    pub(super) conn: &'a AgentConn,
    pub(super) limit: Duration,
    pub(super) dirs: Vec<&'a str>,
}

impl Agent<'_> {
    /// Every entry of the workspace, checked, sorted by path, without
    /// hashes.
    pub(super) async fn snapshot(&self, max_entries: u32) -> Result<Vec<Entry>, CheckpointError> {
        let mut entries = Vec::new();
        let mut seen = HashSet::new();
        let mut seen_dirs = HashSet::new();
        let max = usize::try_from(max_entries).unwrap_or(usize::MAX);
        self.conn
            .snapshot(max_entries, self.limit, |part| {
                for e in part {
                    if entries.len() >= max {
                        return Err("more snapshot entries than asked for".to_string());
                    }
                    let e = checked(e, &self.dirs, &seen_dirs, &mut seen)?;
                    if e.kind == EntryKind::Dir {
                        seen_dirs.insert(e.path.clone());
                    }
                    entries.push(e);
                }
                Ok(())
            })
            .await
            .map_err(CheckpointError::from_agent)?;
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(entries)
    }

    /// Reads file `e` into the store (only while it is what the snapshot
    /// saw), written to disk on a blocking thread as the pieces come.
    pub(super) async fn store_file(
        &self,
        store: &Store,
        e: &Entry,
    ) -> Result<Stored, CheckpointError> {
        let (pieces, received) = mpsc::channel(PIECES_IN_FLIGHT);
        let expected = e.size;
        let (writer, read) = tokio::join!(
            store.blocking(move |s| s.receive_object(received, expected)),
            self.conn
                .read_exact(e.path.clone(), identity(e), self.limit, pieces),
        );
        // A store that failed ended the read: its error is the one to tell.
        let Some(writer) = writer.map_err(CheckpointError::Store)? else {
            return Err(CheckpointError::agent_broke(
                "more bytes of a file than its size",
            ));
        };
        let kept = match read {
            Err(err) => Err(CheckpointError::from_read(err)),
            Ok(()) if writer.size() != expected => Err(CheckpointError::WorkspaceChanging(
                format!("{} changed while it was read", e.path),
            )),
            Ok(()) => Ok(()),
        };
        if let Err(err) = kept {
            // Removing the partial object can only fail to free space the
            // next checkpoint's sweep of `tmp/` frees.
            let _ = store
                .blocking(move |_| {
                    writer.discard();
                    Ok(())
                })
                .await;
            return Err(err);
        }
        store
            .blocking(move |s| writer.finish(s))
            .await
            .map_err(CheckpointError::Store)
    }

    /// The content of file `e`, which the caller bounds by its size,
    /// read only while it is the file the snapshot saw.
    pub(super) async fn read_file(&self, e: &Entry) -> Result<Vec<u8>, CheckpointError> {
        let (pieces, mut received) = mpsc::channel::<Vec<u8>>(PIECES_IN_FLIGHT);
        let max = e.size;
        let collect = async move {
            let mut content = Vec::new();
            while let Some(piece) = received.recv().await {
                if (content.len() + piece.len()) as u64 > max {
                    return None;
                }
                content.extend_from_slice(&piece);
            }
            Some(content)
        };
        let (content, read) = tokio::join!(
            collect,
            self.conn
                .read_exact(e.path.clone(), identity(e), self.limit, pieces),
        );
        let Some(content) = content else {
            return Err(CheckpointError::agent_broke(
                "more bytes of a file than its size",
            ));
        };
        read.map_err(CheckpointError::from_read)?;
        if content.len() as u64 != e.size {
            return Err(CheckpointError::WorkspaceChanging(format!(
                "{} changed while it was read",
                e.path
            )));
        }
        Ok(content)
    }

    /// Fills in the hash of every file of `current`: from `known` (a
    /// checkpoint's entries, whose walk began at `walked_at_ns`) when the
    /// file is the one that checkpoint saw
    /// ([`unchanged_since`](super::manifest::unchanged_since)), else
    /// hashed by the agent.
    pub(super) async fn hash_current(
        &self,
        current: &mut [Entry],
        known: &[Entry],
        walked_at_ns: i64,
    ) -> Result<(), CheckpointError> {
        let known: BTreeMap<&str, &Entry> = known
            .iter()
            .filter(|k| k.kind == EntryKind::File)
            .map(|k| (k.path.as_str(), k))
            .collect();
        let mut unknown = Vec::new();
        for (i, e) in current.iter_mut().enumerate() {
            if e.kind != EntryKind::File {
                continue;
            }
            match known.get(e.path.as_str()) {
                Some(k) if unchanged_since(k, walked_at_ns, e) => e.sha256.clone_from(&k.sha256),
                _ => unknown.push(i),
            }
        }
        for batch in unknown.chunks(STAT_BATCH) {
            let paths: Vec<String> = batch.iter().map(|i| current[*i].path.clone()).collect();
            let stats = self
                .conn
                .stat(paths, true, self.limit)
                .await
                .map_err(CheckpointError::from_read)?;
            if stats.len() != batch.len() {
                return Err(CheckpointError::agent_broke("a stat of other paths"));
            }
            for (i, st) in batch.iter().zip(stats) {
                let e = &mut current[*i];
                match st.sha256 {
                    Some(h) if st.size == e.size => e.sha256 = Some(hex(&h)),
                    _ => {
                        return Err(CheckpointError::WorkspaceChanging(format!(
                            "{} changed while the workspace was read",
                            e.path
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// Makes the workspace `target`, from `current` (hashed), with the
    /// content in `store`.
    pub(super) async fn apply(
        &self,
        plan: &Plan<'_>,
        store: &Store,
    ) -> Result<(), CheckpointError> {
        let fail = CheckpointError::from_agent;
        if !plan.modes_before.is_empty() {
            self.conn
                .set_modes(plan.modes_before.clone(), self.limit)
                .await
                .map_err(fail)?;
        }
        if !plan.delete.is_empty() {
            self.conn
                .delete(plan.delete.clone(), true, self.limit)
                .await
                .map_err(fail)?;
        }
        for d in &plan.make_dirs {
            self.conn
                .make_dir(d.clone(), self.limit)
                .await
                .map_err(fail)?;
        }
        if !plan.links.is_empty() {
            self.conn
                .make_symlinks(plan.links.clone(), self.limit)
                .await
                .map_err(fail)?;
        }
        for batch in write_batches(&plan.write) {
            let files: Vec<NewFile> = batch
                .iter()
                .map(|e| NewFile {
                    path: e.path.clone(),
                    mode: e.mode & 0o777,
                    size: e.size,
                    precondition: Precondition::None,
                })
                .collect();
            let objects: Vec<(String, u64)> = batch
                .iter()
                .map(|e| (e.sha256.clone().unwrap_or_default(), e.size))
                .collect();
            let content = store
                .blocking(move |s| contents(s, &objects))
                .await
                .map_err(CheckpointError::Store)?;
            match self
                .conn
                .write_files(files, content, self.limit)
                .await
                .map_err(fail)?
            {
                WriteOutcome::Written => {}
                WriteOutcome::PreconditionFailed(_) => {
                    return Err(CheckpointError::agent_broke(
                        "a precondition failure of a write without one",
                    ));
                }
            }
        }
        if !plan.modes_after.is_empty() {
            self.conn
                .set_modes(plan.modes_after.clone(), self.limit)
                .await
                .map_err(fail)?;
        }
        Ok(())
    }
}

/// The content of `objects` (hash, size) for a write: a small one read
/// now, in one piece, a larger one opened for the connection to read as
/// it sends it.
fn contents(store: &Store, objects: &[(String, u64)]) -> Result<Vec<Content>, StoreError> {
    let mut content = Vec::with_capacity(objects.len());
    for (sha256, size) in objects {
        if *size <= WRITE_PIECE as u64 {
            let bytes = store.read_object(sha256, *size)?;
            if !bytes.is_empty() {
                content.push(Content::Bytes(Bytes::from(bytes)));
            }
        } else {
            let file = tokio::fs::File::from_std(store.open_object(sha256, *size)?);
            content.push(Content::File { file, size: *size });
        }
    }
    Ok(content)
}

/// Files in writes of bounded size.
fn write_batches<'a>(files: &[&'a Entry]) -> Vec<Vec<&'a Entry>> {
    let mut batches = Vec::new();
    let mut batch: Vec<&Entry> = Vec::new();
    let mut bytes = 0u64;
    for e in files {
        if !batch.is_empty()
            && (bytes + e.size > WRITE_BATCH_BYTES || batch.len() >= WRITE_BATCH_FILES)
        {
            batches.push(std::mem::take(&mut batch));
            bytes = 0;
        }
        bytes += e.size;
        batch.push(e);
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    batches
}

/// What a restore does, in order.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Plan<'a> {
    /// Directories made writable for their owner first (their exact
    /// modes are set last).
    pub(super) modes_before: Vec<PathMode>,
    /// Removed (recursively), none under another.
    pub(super) delete: Vec<String>,
    /// Parents first.
    pub(super) make_dirs: Vec<String>,
    pub(super) links: Vec<NewSymlink>,
    pub(super) write: Vec<&'a Entry>,
    /// Deepest first.
    pub(super) modes_after: Vec<PathMode>,
}

/// The plan that makes `current` into `target` (both hashed, sorted).
pub(super) fn plan<'a>(current: &'a [Entry], target: &'a [Entry]) -> Plan<'a> {
    let diff = compare(current, target);
    let mut p = Plan::default();
    let mut removed: Vec<&str> = diff.deleted.iter().map(|e| e.path.as_str()).collect();
    let mut made: Vec<&Entry> = diff.created.clone();
    for (old, new) in &diff.modified {
        let replaced =
            old.kind != new.kind || (new.kind == EntryKind::Symlink && old.target != new.target);
        if replaced {
            removed.push(old.path.as_str());
            made.push(new);
        } else if new.kind == EntryKind::File && old.sha256 != new.sha256 {
            p.write.push(new);
        } else {
            p.modes_after.push(PathMode {
                path: new.path.clone(),
                mode: new.mode,
            });
        }
    }
    removed.sort_unstable();
    for path in removed {
        let under_removed = p.delete.last().is_some_and(|d: &String| {
            path.starts_with(d.as_str()) && path.as_bytes().get(d.len()) == Some(&b'/')
        });
        if !under_removed {
            p.delete.push(path.to_string());
        }
    }
    made.sort_by(|a, b| a.path.cmp(&b.path));
    for e in made {
        match e.kind {
            EntryKind::Dir => {
                p.make_dirs.push(e.path.clone());
                p.modes_after.push(PathMode {
                    path: e.path.clone(),
                    mode: e.mode,
                });
            }
            EntryKind::Symlink => p.links.push(NewSymlink {
                path: e.path.clone(),
                target: e.target.clone().unwrap_or_default(),
            }),
            EntryKind::File => p.write.push(e),
        }
    }
    p.write.sort_by(|a, b| a.path.cmp(&b.path));
    // Write sets only the bits up to 0o777.
    for e in &p.write {
        if e.mode > 0o777 {
            p.modes_after.push(PathMode {
                path: e.path.clone(),
                mode: e.mode,
            });
        }
    }
    // Directories something is made in or removed from must be open to
    // their owner meanwhile.
    let mut touched: HashSet<&str> = HashSet::new();
    let changed = (p.delete.iter().chain(&p.make_dirs))
        .map(String::as_str)
        .chain(p.links.iter().map(|l| l.path.as_str()))
        .chain(p.write.iter().map(|e| e.path.as_str()));
    for path in changed {
        let mut at = path;
        while let Some((parent, _)) = at.rsplit_once('/') {
            touched.insert(parent);
            at = parent;
        }
    }
    let kept_dirs: BTreeMap<&str, &Entry> = target
        .iter()
        .filter(|e| e.kind == EntryKind::Dir)
        .map(|e| (e.path.as_str(), e))
        .collect();
    for e in current {
        let Some(t) = kept_dirs.get(e.path.as_str()) else {
            continue;
        };
        if e.kind == EntryKind::Dir && e.mode & 0o700 != 0o700 && touched.contains(e.path.as_str())
        {
            p.modes_before.push(PathMode {
                path: e.path.clone(),
                mode: e.mode | 0o700,
            });
            p.modes_after.push(PathMode {
                path: t.path.clone(),
                mode: t.mode,
            });
        }
    }
    // Deepest first, each path once: a directory closed to its owner last.
    p.modes_after.sort_by(|a, b| {
        b.path
            .matches('/')
            .count()
            .cmp(&a.path.matches('/').count())
            .then(a.path.cmp(&b.path))
    });
    p.modes_after.dedup_by(|a, b| a.path == b.path);
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoints::manifest::tests::{dir, file, link};

    #[test]
    fn a_plan_deletes_what_goes_makes_what_comes_and_sets_modes_last() {
        let current = vec![
            file("a", "same", 0o644),
            dir("gone"),
            file("gone/x", "x", 0o644),
            file("m", "new content", 0o644),
            link("l", "a"),
            file("ro/f", "f", 0o644),
            dir_with_mode("ro", 0o555),
            file("k", "k", 0o644),
        ];
        let mut current = current;
        current.sort_by(|a, b| a.path.cmp(&b.path));
        let mut target = vec![
            file("a", "same", 0o600),
            file("m", "old content", 0o644),
            link("l", "m"),
            dir("empty"),
            dir_with_mode("ro", 0o555),
            file("ro/f", "g", 0o644),
            dir("k"),
        ];
        target.sort_by(|a, b| a.path.cmp(&b.path));
        let p = plan(&current, &target);
        assert_eq!(p.delete, ["gone", "k", "l"]);
        assert_eq!(p.make_dirs, ["empty", "k"]);
        assert_eq!(p.links.len(), 1);
        let written: Vec<&str> = p.write.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(written, ["m", "ro/f"]);
        assert_eq!(p.modes_before.len(), 1);
        assert_eq!(p.modes_before[0].mode, 0o755);
        let after: Vec<(&str, u32)> = p
            .modes_after
            .iter()
            .map(|m| (m.path.as_str(), m.mode))
            .collect();
        assert_eq!(
            after,
            [("a", 0o600), ("empty", 0o755), ("k", 0o755), ("ro", 0o555)]
        );
        assert_eq!(plan(&target, &target), Plan::default());
    }

    fn dir_with_mode(path: &str, mode: u32) -> Entry {
        Entry { mode, ..dir(path) }
    }
}
