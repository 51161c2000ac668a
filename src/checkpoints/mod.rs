//! Workspace checkpoints: a sandbox's workspace recorded at a moment
//! (every path, kind, mode, content and symlink target, empty directories
//! too), listed, compared with another checkpoint or with the workspace
//! now, restored exactly, and deleted.
//!
//! The content lives on the host in the sandbox's [`store`], each content
//! once however many checkpoints hold it; a checkpoint's [`manifest`]
//! names it by hash, in trees that the next checkpoint shares where
//! nothing changed. A checkpoint lists the workspace on the host under
//! runc ([`host_walk`]), else through the agent ([`tree`]), and reads only
//! files whose identity (inode, size, modification and change times)
//! differs from the newest checkpoint's or that it saw changed just
//! before it ([`manifest::unchanged_since`]), or every file with
//! `verify`, which also stores again content the store lost. It reads no
//! other checkpoint, and the newest one's entries are kept in memory
//! ([`recent`]), so its cost grows with what changed and with the
//! workspace's entries, not with the checkpoints kept. A file that changes
//! while it is read makes the checkpoint start over once, then fail with
//! [`CheckpointError::WorkspaceChanging`]; a refused checkpoint (a limit,
//! a failure) leaves no manifest and removes the content it stored.
//!
//! Operations on one sandbox's checkpoints run one at a time, under a lock
//! kept only while some operation holds or waits for it. The store's file
//! I/O runs on blocking threads, never on a worker of the async runtime.

mod host;
mod host_walk;
mod manifest;
mod pack;
mod recent;
mod store;
mod store_files;
mod text_diff;
mod tree;

use std::sync::Arc;
use std::time::Instant;

use dashmap::DashMap;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use host::HostTree;
use host_walk::WalkLimits;
use recent::{Newest, Recent};
use sandboxd_proto::{FailureKind, ShapeSpec};

use crate::agent_client::AgentError;
use crate::config::Config;
use crate::field_error::FieldError;
use crate::sandbox::{SandboxError, Sandboxes};
pub use manifest::EntryKind;
use manifest::{Entry, Manifest, TreeDiff, VERSION, compare, unchanged_since};
use store::{Store, StoreError};
use text_diff::Reader;
pub use text_diff::{DEFAULT_CHARS as TEXT_DIFF_DEFAULT_CHARS, DiffText};

/// Workspaces walked on the host at once (each on up to four threads):
/// sandboxd's CPU, which no sandbox's limit bounds. Another walk is the
/// agent's, within its sandbox's limit.
const HOST_WALKS: usize = 2;
/// Files a checkpoint reads at once. A large one holds at most a few of
/// the agent's pieces in memory (see `tree`), so a checkpoint of large
/// files holds about this many MiB times four.
const FILES_IN_FLIGHT: usize = 8;
/// Files up to this size are read whole and stored a batch at a time
/// (of at most [`BATCH_BYTES`] and [`BATCH_FILES`]), as one pack, on one
/// blocking thread, while the next batch is read: a hand-off to a thread
/// per file cost more than the file (profiled: 9 context switches a
/// file). Larger files are streamed into the store as they are read.
const SMALL_FILE: u64 = 256 * 1024;
// A restore reads a packed object whole: one of the agent's pieces.
const _: () = assert!(SMALL_FILE <= sandboxd_proto::WRITE_PIECE as u64);
const BATCH_BYTES: u64 = 8 * 1024 * 1024;
const BATCH_FILES: usize = 512;

/// Most entries of each list of a diff that are shown; all are counted.
pub const MAX_DIFF_SHOWN: usize = 1000;
/// Longest label, in bytes.
pub const MAX_LABEL_BYTES: usize = 256;

/// What can go wrong with a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(transparent)]
    Invalid(#[from] FieldError),
    #[error("no checkpoint {0:?} in this sandbox")]
    NotFound(String),
    #[error("a checkpoint labelled {0:?} exists in this sandbox")]
    LabelTaken(String),
    #[error("the sandbox has {max} checkpoints, as many as it may keep; delete one first")]
    TooMany { max: usize },
    /// Past the store's bytes or a checkpoint's entries.
    #[error("{0}")]
    StoreFull(String),
    /// Files kept changing while they were read.
    #[error("{0}; nothing was stored, try again when the workspace is still")]
    WorkspaceChanging(String),
    /// The workspace holds what a checkpoint cannot keep (a name that is
    /// not UTF-8, a tree too deep).
    #[error("{0}")]
    Unsupported(String),
    /// The workspace holds a file or directory the sandbox user may not
    /// read (it made it so).
    #[error("{0}; nothing was stored")]
    Unreadable(String),
    /// Commands run in the sandbox and the restore may not end them.
    #[error("{0}")]
    CommandsRunning(String),
    #[error("the checkpoint store failed: {0}")]
    Store(StoreError),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
}

impl CheckpointError {
    fn from_agent(e: AgentError) -> Self {
        match e {
            AgentError::Refused(f) => match f.kind {
                FailureKind::Changed | FailureKind::NotFound => {
                    CheckpointError::WorkspaceChanging(f.message)
                }
                FailureKind::TooMany => CheckpointError::StoreFull(f.message),
                FailureKind::PermissionDenied => CheckpointError::Unreadable(f.message),
                FailureKind::Invalid | FailureKind::TooLarge => {
                    CheckpointError::Unsupported(f.message)
                }
                _ => CheckpointError::Sandbox(AgentError::Refused(f).into()),
            },
            other => CheckpointError::Sandbox(other.into()),
        }
    }

    /// A read of a path the snapshot saw as a regular file: one that is
    /// now reached through a symlink, or is no longer a file in a
    /// directory, changed since the snapshot.
    fn from_read(e: AgentError) -> Self {
        match e {
            AgentError::Refused(f)
                if matches!(
                    f.kind,
                    FailureKind::SymlinkEscape
                        | FailureKind::NotDirectory
                        | FailureKind::IsDirectory
                        | FailureKind::NotRegular
                ) =>
            {
                CheckpointError::WorkspaceChanging(f.message)
            }
            other => CheckpointError::from_agent(other),
        }
    }

    fn agent_broke(what: &str) -> Self {
        CheckpointError::Sandbox(AgentError::Protocol(what.to_string()).into())
    }
}

pub type CheckpointResult<T> = Result<T, CheckpointError>;

/// A checkpoint as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    pub checkpoint_id: String,
    pub label: Option<String>,
    pub created_at: u64,
    /// Regular files in it.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Bytes this checkpoint added to the store.
    pub new_bytes: u64,
    pub duration_ms: u64,
}

impl From<&Manifest> for CheckpointInfo {
    fn from(m: &Manifest) -> Self {
        CheckpointInfo {
            checkpoint_id: m.id.clone(),
            label: m.label.clone(),
            created_at: m.created_at,
            files: m.files,
            bytes: m.bytes,
            new_bytes: m.new_bytes,
            duration_ms: m.duration_ms,
        }
    }
}

/// One changed path of a diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiffEntry {
    pub path: String,
    /// What it is after (what it was, for a deleted one).
    pub kind: EntryKind,
    /// A file's size before; `None` when it was not a file.
    pub size_before: Option<u64>,
    pub size_after: Option<u64>,
}

/// What changed between two trees: at most [`MAX_DIFF_SHOWN`] of each
/// list, sorted by path, and exact counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    pub created: Vec<DiffEntry>,
    pub modified: Vec<DiffEntry>,
    pub deleted: Vec<DiffEntry>,
    pub created_count: u64,
    pub modified_count: u64,
    pub deleted_count: u64,
    /// The unified diff of the text files among the paths shown, when
    /// asked for.
    pub text: Option<DiffText>,
}

fn file_size(e: &Entry) -> Option<u64> {
    (e.kind == EntryKind::File).then_some(e.size)
}

impl From<TreeDiff<'_>> for Diff {
    fn from(d: TreeDiff<'_>) -> Self {
        let one = |before: Option<&Entry>, after: Option<&Entry>| {
            let shown = after.or(before);
            DiffEntry {
                path: shown.map(|e| e.path.clone()).unwrap_or_default(),
                kind: shown.map_or(EntryKind::File, |e| e.kind),
                size_before: before.and_then(file_size),
                size_after: after.and_then(file_size),
            }
        };
        Diff {
            created_count: d.created.len() as u64,
            modified_count: d.modified.len() as u64,
            deleted_count: d.deleted.len() as u64,
            created: (d.created.iter().take(MAX_DIFF_SHOWN))
                .map(|e| one(None, Some(e)))
                .collect(),
            modified: (d.modified.iter().take(MAX_DIFF_SHOWN))
                .map(|(o, n)| one(Some(o), Some(n)))
                .collect(),
            deleted: (d.deleted.iter().take(MAX_DIFF_SHOWN))
                .map(|e| one(Some(e), None))
                .collect(),
            text: None,
        }
    }
}

/// The paths a diff shows, each with its entry before and after, sorted
/// by path.
fn shown<'a>(d: &TreeDiff<'a>) -> Vec<(Option<&'a Entry>, Option<&'a Entry>)> {
    let mut all: Vec<(Option<&Entry>, Option<&Entry>)> = (d.created.iter().take(MAX_DIFF_SHOWN))
        .map(|e| (None, Some(*e)))
        .chain((d.modified.iter().take(MAX_DIFF_SHOWN)).map(|(o, n)| (Some(*o), Some(*n))))
        .chain((d.deleted.iter().take(MAX_DIFF_SHOWN)).map(|e| (Some(*e), None)))
        .collect();
    all.sort_by(|x, y| {
        let path = |(b, a): &(Option<&Entry>, Option<&Entry>)| a.or(*b).map(|e| e.path.clone());
        path(x).cmp(&path(y))
    });
    all
}

/// What changed from `old` to `new`, with its text shaped by `text` when
/// given, the sides read by `reader`.
async fn described(
    old: &[Entry],
    new: &[Entry],
    reader: Reader<'_>,
    text: Option<ShapeSpec>,
) -> CheckpointResult<Diff> {
    let tree = compare(old, new);
    let text = match text {
        Some(spec) => Some(reader.text(&shown(&tree), spec).await?),
        None => None,
    };
    Ok(Diff {
        text,
        ..Diff::from(tree)
    })
}

/// `small` (indices of `entries`) cut into batches to store together.
fn batches(entries: &[Entry], small: Vec<usize>) -> Vec<Vec<usize>> {
    let mut all: Vec<Vec<usize>> = Vec::new();
    let mut bytes = 0;
    for i in small {
        let size = entries[i].size;
        match all.last_mut() {
            Some(last) if last.len() < BATCH_FILES && bytes + size <= BATCH_BYTES => {
                last.push(i);
                bytes += size;
            }
            _ => {
                all.push(vec![i]);
                bytes = size;
            }
        }
    }
    all
}

/// The other side of a diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiffTarget {
    Checkpoint(String),
    /// The workspace now.
    Current,
}

/// One lock per sandbox with operations under way.
type Locks = DashMap<String, Arc<tokio::sync::Mutex<()>>>;

/// See the module docs.
#[derive(Debug, Clone)]
pub struct Checkpoints {
    config: Arc<Config>,
    sandboxes: Arc<Sandboxes>,
    /// A sandbox's operations run one at a time.
    locks: Arc<Locks>,
    recent: Arc<Recent>,
    /// Turns to walk a workspace on the host (see [`walk`]).
    host_walks: Arc<tokio::sync::Semaphore>,
}

/// A sandbox's lock, held; its entry leaves the map when no one else
/// holds or waits for it.
struct Held<'a> {
    /// Dropped first.
    _guard: tokio::sync::OwnedMutexGuard<()>,
    _prune: Prune<'a>,
}

/// Removes a sandbox's lock from the map once it is the map's alone.
struct Prune<'a> {
    locks: &'a Locks,
    sandbox_id: String,
}

impl Drop for Prune<'_> {
    fn drop(&mut self) {
        // The count is read under the map's shard lock, which a new taker
        // also holds while it clones the lock: none is missed.
        self.locks
            .remove_if(&self.sandbox_id, |_, l| Arc::strong_count(l) == 1);
    }
}

/// The workspace's directory on the host, open, or `None` (logged) when
/// sandboxd may not open it: the agent reads every file then.
async fn open_host_tree(store: &Store, dir: std::path::PathBuf, uid: u32) -> Option<Arc<HostTree>> {
    let opened = store
        .blocking(move |_| Ok(HostTree::open(&dir, uid).map_err(|e| (dir, e))))
        .await;
    match opened {
        Ok(Ok(tree)) => Some(Arc::new(tree)),
        Ok(Err((dir, e))) => {
            tracing::debug!(dir = %dir.display(), error = %e, "the workspace is read through the agent");
            None
        }
        Err(_) => None,
    }
}

/// Every entry of the workspace, checked, sorted by path, without hashes:
/// walked on the host where it may be ([`host_walk`]) and while fewer
/// than [`HOST_WALKS`] other walks run there, by the agent otherwise and
/// wherever the host's walk leaves it to the agent.
async fn walk(
    agent: &tree::Agent<'_>,
    host: Option<&Arc<HostTree>>,
    store: &Store,
    config: &Config,
    host_walks: &tokio::sync::Semaphore,
) -> CheckpointResult<Vec<Entry>> {
    if let (Some(host), Ok(_turn)) = (host, host_walks.try_acquire()) {
        let host = Arc::clone(host);
        let dirs: Vec<String> = agent.dirs.iter().map(|d| (*d).to_string()).collect();
        let max_entries = usize::try_from(config.checkpoint_max_entries).unwrap_or(usize::MAX);
        let walked = store
            .blocking(move |_| {
                let dirs: Vec<&str> = dirs.iter().map(String::as_str).collect();
                Ok(host.walk(&WalkLimits {
                    max_entries,
                    dirs: &dirs,
                }))
            })
            .await;
        if let Ok(Some(entries)) = walked {
            crate::telemetry::checkpoint_walked("host");
            return Ok(entries);
        }
    }
    crate::telemetry::checkpoint_walked("agent");
    agent.snapshot(config.checkpoint_max_entries).await
}

/// Where a checkpoint reads the workspace's files: on the host where it
/// may ([`host`]), through the agent for every other file and every miss.
struct FileSource<'a> {
    agent: &'a tree::Agent<'a>,
    host: Option<&'a Arc<HostTree>>,
    store: &'a Store,
}

impl FileSource<'_> {
    /// Large file `e` streamed into the store.
    async fn store_file(&self, e: &Entry) -> Result<store::Stored, CheckpointError> {
        if let Some(host) = self.host {
            let (host, entry) = (Arc::clone(host), e.clone());
            let stored = self.store.blocking(move |s| host.store(s, &entry)).await;
            if let Some(stored) = stored.map_err(CheckpointError::Store)? {
                crate::telemetry::checkpoint_files_read("host", 1);
                return Ok(stored);
            }
        }
        crate::telemetry::checkpoint_files_read("agent", 1);
        self.agent.store_file(self.store, e).await
    }

    /// The contents of small files `batch` (indices into `entries`): read
    /// on the host on one blocking thread, the misses through the agent.
    async fn read_files(
        &self,
        entries: &[Entry],
        batch: Vec<usize>,
    ) -> Vec<(usize, Result<Vec<u8>, CheckpointError>)> {
        let mut got = Vec::with_capacity(batch.len());
        let mut missed = batch;
        if let (Some(host), false) = (self.host, missed.is_empty()) {
            let wanted: Vec<(usize, Entry)> =
                missed.iter().map(|&i| (i, entries[i].clone())).collect();
            let host = Arc::clone(host);
            let read = self
                .store
                .blocking(move |_| {
                    Ok(wanted
                        .into_iter()
                        .map(|(i, e)| (i, host.read(&e)))
                        .collect::<Vec<_>>())
                })
                .await;
            // A blocking task that did not finish leaves every file to
            // the agent.
            if let Ok(read) = read {
                missed.clear();
                for (i, content) in read {
                    match content {
                        Some(content) => got.push((i, Ok(content))),
                        None => missed.push(i),
                    }
                }
                crate::telemetry::checkpoint_files_read("host", got.len() as u64);
            }
        }
        crate::telemetry::checkpoint_files_read("agent", missed.len() as u64);
        let agent = self.agent;
        let through_agent = futures_util::stream::iter(missed)
            .map(|i| async move { (i, agent.read_file(&entries[i]).await) })
            .buffer_unordered(FILES_IN_FLIGHT)
            .collect::<Vec<_>>()
            .await;
        got.extend(through_agent);
        got
    }
}

/// What one try of a checkpoint stored: the objects it added (in the
/// caller's list) and their bytes, each file's hash, its first failure.
struct Tally<'a> {
    added: &'a mut Vec<String>,
    new_bytes: u64,
    hashes: Vec<(usize, String)>,
    failure: Option<CheckpointError>,
    /// The store's bytes before this checkpoint, and the most it may hold.
    stored_before: u64,
    max_bytes: u64,
}

impl Tally<'_> {
    /// Records what storing entry `i` gave: whether the checkpoint goes on.
    fn record(&mut self, i: usize, stored: Result<store::Stored, CheckpointError>) -> bool {
        match stored {
            Ok(stored) => {
                if stored.new {
                    self.added.push(stored.sha256.clone());
                    self.new_bytes += stored.size;
                    if self.would_pass(0) {
                        let max = self.max_bytes;
                        self.failure.get_or_insert(CheckpointError::StoreFull(format!(
                            "the checkpoint store would pass checkpoint_max_store_bytes ({max} bytes); delete checkpoints first"
                        )));
                    }
                }
                self.hashes.push((i, stored.sha256));
            }
            Err(e) => {
                self.failure.get_or_insert(e);
            }
        }
        self.failure.is_none()
    }

    /// Whether `more` bytes on top of what is stored pass the store's.
    fn would_pass(&self, more: u64) -> bool {
        self.stored_before + self.new_bytes + more > self.max_bytes
    }
}

fn store_err(e: StoreError) -> CheckpointError {
    CheckpointError::Store(e)
}

/// Refuses a label (given as `field`) a checkpoint cannot have.
pub fn check_label(field: &str, label: &str) -> CheckpointResult<()> {
    if label.is_empty() || label.len() > MAX_LABEL_BYTES || label.chars().any(char::is_control) {
        return Err(FieldError::new(
            field,
            format!("must be 1 to {MAX_LABEL_BYTES} bytes without control characters"),
        )
        .into());
    }
    Ok(())
}

/// Waits for sandbox `sandbox_id`'s turn in `locks`.
async fn hold<'a>(locks: &'a Locks, sandbox_id: &str) -> Held<'a> {
    // Declared first, dropped last: a waiter that gives up drops its
    // clone of the lock before it looks.
    let prune = Prune {
        locks,
        sandbox_id: sandbox_id.to_string(),
    };
    let lock = Arc::clone(&locks.entry(sandbox_id.to_string()).or_default());
    Held {
        _guard: lock.lock_owned().await,
        _prune: prune,
    }
}

impl Checkpoints {
    pub fn new(config: Arc<Config>, sandboxes: Arc<Sandboxes>) -> Self {
        Checkpoints {
            config,
            sandboxes,
            locks: Arc::default(),
            recent: Arc::default(),
            host_walks: Arc::new(tokio::sync::Semaphore::new(HOST_WALKS)),
        }
    }

    fn store(&self, sandbox_id: &str) -> CheckpointResult<Store> {
        self.config
            .checkpoint_dir(sandbox_id)
            .map(|dir| Store::at(dir, self.recent.packs(sandbox_id)))
            .ok_or_else(|| CheckpointError::Store(StoreError::none_configured()))
    }

    /// Waits for the sandbox's turn.
    async fn lock(&self, sandbox_id: &str) -> Held<'_> {
        hold(&self.locks, sandbox_id).await
    }

    /// Records the workspace of `sandbox_id` now. It runs to its end
    /// when the caller goes away: the store's work runs on blocking
    /// threads, which a dropped request would not stop, and must end
    /// under the sandbox's lock, before the next operation sweeps.
    pub async fn create(
        &self,
        sandbox_id: &str,
        label: Option<String>,
        verify: bool,
    ) -> CheckpointResult<CheckpointInfo> {
        let (this, id) = (self.clone(), sandbox_id.to_string());
        tokio::spawn(async move { this.make_checkpoint(&id, label, verify).await })
            .await
            .map_err(|e| CheckpointError::Store(StoreError::ended_early(e)))?
    }

    async fn make_checkpoint(
        &self,
        sandbox_id: &str,
        label: Option<String>,
        verify: bool,
    ) -> CheckpointResult<CheckpointInfo> {
        let started = Instant::now();
        if let Some(l) = &label {
            check_label("label", l)?;
        }
        let sandbox = self.sandboxes.lookup(sandbox_id).await?;
        let _busy = sandbox.open_request();
        let _one = self.lock(&sandbox.id).await;
        let store = self.store(&sandbox.id)?;
        let existing = store.blocking(Store::manifests).await.map_err(store_err)?;
        if let Some(l) = &label {
            if existing.iter().any(|m| m.label.as_ref() == Some(l)) {
                return Err(CheckpointError::LabelTaken(l.clone()));
            }
        }
        if existing.len() >= self.config.checkpoint_max_count {
            return Err(CheckpointError::TooMany {
                max: self.config.checkpoint_max_count,
            });
        }
        let newest = existing.first().filter(|_| !verify).cloned();
        let kept = newest
            .as_ref()
            .and_then(|m| self.recent.newest(&sandbox.id, &m.id));
        let (stored_before, previous) = store
            .blocking(move |s| {
                let usage = s.begin()?;
                if verify {
                    s.reload_packs()?;
                }
                let previous = match (kept, newest) {
                    (Some(kept), _) => kept,
                    (None, Some(m)) => Arc::new(s.newest(m)?),
                    (None, None) => Arc::default(),
                };
                Ok((usage, previous))
            })
            .await
            .map_err(store_err)?;
        let conn = match self.sandboxes.agent(&sandbox).await {
            Ok(conn) => conn,
            Err(e) => {
                store
                    .blocking(move |s| s.end(stored_before))
                    .await
                    .map_err(store_err)?;
                return Err(self.sandboxes.gone_or(&sandbox, e.into()));
            }
        };
        let agent = tree::Agent {
            conn: &conn,
            limit: self.config.agent_timeout,
            dirs: self.config.workspace_dirs().collect(),
        };
        let host = self.host_tree(&sandbox, &store).await;
        let source = FileSource {
            agent: &agent,
            host: host.as_ref(),
            store: &store,
        };
        let mut added = Vec::new();
        let taken = self
            .take(&source, &previous, stored_before, &mut added)
            .await;
        let (entries, new_bytes, walked_at_ns) = match taken {
            Ok(taken) => taken,
            Err(e) => {
                store
                    .blocking(move |s| {
                        s.remove_objects(&added)?;
                        s.end(stored_before)
                    })
                    .await
                    .map_err(store_err)?;
                return Err(self.sandboxes.gone_or(&sandbox, e));
            }
        };
        let id = crate::id::random_hex(8).map_err(SandboxError::from)?;
        let bytes = entries
            .iter()
            .filter(|e| e.kind == EntryKind::File)
            .map(|e| e.size)
            .sum();
        let manifest = Manifest {
            version: VERSION,
            id,
            label,
            created_at: crate::clock::now_ms(),
            seq: existing.first().map_or(1, |m| m.seq + 1),
            bytes,
            new_bytes,
            // Set once its content is durable (`save_manifest`).
            duration_ms: 0,
            files: entries.iter().filter(|e| e.kind == EntryKind::File).count() as u64,
            walked_at_ns,
            trees: Vec::new(),
            entries: None,
        };
        let saved = store
            .blocking(
                move |s| match s.save_manifest(manifest, &entries, &previous, started) {
                    Ok(saved) => s.end(stored_before + new_bytes).map(|()| (saved, entries)),
                    // The store stays marked changing: the next change
                    // sweeps what this one wrote and did not sync.
                    Err(e) => {
                        s.remove_objects(&added)?;
                        Err(e)
                    }
                },
            )
            .await
            .map_err(store_err)?;
        let ((saved, lens), entries) = saved;
        self.recent.put(
            &sandbox.id,
            Newest {
                id: saved.id.clone(),
                entries,
                trees: saved.trees.iter().cloned().zip(lens).collect(),
                walked_at_ns,
            },
        );
        crate::telemetry::checkpoint_made(started, new_bytes, bytes.saturating_sub(new_bytes));
        Ok(CheckpointInfo::from(&saved))
    }

    /// The workspace's entries with their content in the store: a second
    /// try when a file changed under the first. A file `previous` (the
    /// newest checkpoint's entries) saw unchanged is taken from it: a
    /// checkpoint's objects stay while it does. `added` collects the
    /// objects stored anew (removed by the caller on failure).
    async fn take(
        &self,
        source: &FileSource<'_>,
        previous: &Newest,
        stored_before: u64,
        added: &mut Vec<String>,
    ) -> CheckpointResult<(Vec<Entry>, u64, i64)> {
        let max_bytes = self.config.checkpoint_max_store_bytes;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = async {
                let walked_at_ns = crate::clock::now_ns();
                let mut entries = walk(
                    source.agent,
                    source.host,
                    source.store,
                    &self.config,
                    &self.host_walks,
                )
                .await?;
                // Both sorted by path: each entry's namesake in `previous`
                // is found walking the two together.
                let mut known = previous.entries.iter().peekable();
                let mut to_read = Vec::new();
                for (i, e) in entries.iter_mut().enumerate() {
                    while known.next_if(|k| k.path < e.path).is_some() {}
                    if e.kind != EntryKind::File {
                        continue;
                    }
                    let same = known.peek().filter(|k| {
                        k.path == e.path && unchanged_since(k, previous.walked_at_ns, e)
                    });
                    match same {
                        Some(k) => e.sha256.clone_from(&k.sha256),
                        None => to_read.push(i),
                    }
                }
                let (small, large): (Vec<usize>, Vec<usize>) = to_read
                    .into_iter()
                    .partition(|i| entries[*i].size <= SMALL_FILE);
                let mut tally = Tally {
                    added: &mut *added,
                    new_bytes: 0,
                    hashes: Vec::new(),
                    failure: None,
                    stored_before,
                    max_bytes,
                };
                // Large files, several in flight: one at a time, each
                // waited for the agent's round trip and the disk in turn.
                // Their sizes are reserved against the store's bytes: one
                // that would pass them waits until it is alone, so a
                // refused checkpoint writes at most one file past them
                // (the one that shows it, unless it was stored before).
                let mut pending = large.into_iter().peekable();
                let mut in_flight = FuturesUnordered::new();
                let mut reserved = 0u64;
                let mut going = true;
                loop {
                    while going && in_flight.len() < FILES_IN_FLIGHT {
                        let Some(&i) = pending.peek() else { break };
                        let size = entries[i].size;
                        if !in_flight.is_empty() && tally.would_pass(reserved + size) {
                            break;
                        }
                        pending.next();
                        reserved += size;
                        let e = &entries[i];
                        in_flight.push(async move { (i, source.store_file(e).await) });
                    }
                    // Every file started is waited for, after a failure
                    // too, so what each stored is known and removed.
                    let Some((i, stored)) = in_flight.next().await else {
                        break;
                    };
                    reserved -= entries[i].size;
                    going &= tally.record(i, stored);
                }
                drop(in_flight);
                // Small files: a batch is stored while the next is read.
                let mut batches = batches(&entries, small).into_iter();
                let mut read: Vec<(usize, Vec<u8>)> = Vec::new();
                while going || !read.is_empty() {
                    let next = batches.next().filter(|_| going).unwrap_or_default();
                    if next.is_empty() && read.is_empty() {
                        break;
                    }
                    let (indices, contents): (Vec<usize>, Vec<Vec<u8>>) =
                        std::mem::take(&mut read).into_iter().unzip();
                    let reading = source.read_files(&entries, next);
                    let storing = async {
                        if contents.is_empty() {
                            return Ok(Vec::new());
                        }
                        source.store.blocking(move |s| s.put_all(contents)).await
                    };
                    let (got, stored) = tokio::join!(reading, storing);
                    match stored {
                        Ok(stored) => {
                            for (i, stored) in indices.into_iter().zip(stored) {
                                going &= tally.record(i, Ok(stored));
                            }
                        }
                        Err(e) => going &= tally.record(0, Err(CheckpointError::Store(e))),
                    }
                    for (i, content) in got {
                        match content {
                            Ok(content) if going => read.push((i, content)),
                            Ok(_) => {}
                            Err(e) => going &= tally.record(i, Err(e)),
                        }
                    }
                }
                if let Some(e) = tally.failure {
                    return Err(e);
                }
                for (i, sha256) in tally.hashes {
                    entries[i].sha256 = Some(sha256);
                }
                Ok((entries, tally.new_bytes, walked_at_ns))
            }
            .await;
            match result {
                Ok(taken) => return Ok(taken),
                Err(CheckpointError::WorkspaceChanging(_)) if attempt < 2 => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The checkpoints of a sandbox, newest first. The store is outside
    /// the sandbox, so a paused one is listed as it is.
    pub async fn list(&self, sandbox_id: &str) -> CheckpointResult<Vec<CheckpointInfo>> {
        let sandbox = self.sandboxes.lookup_any(sandbox_id).await?;
        let store = self.store(&sandbox.id)?;
        let all = store.blocking(Store::manifests).await.map_err(store_err)?;
        Ok(all.iter().map(CheckpointInfo::from).collect())
    }

    /// Deletes a checkpoint and the content no other one holds (of a
    /// paused sandbox too: only the store changes). Like
    /// [`Checkpoints::create`], it runs to its end.
    pub async fn delete(&self, sandbox_id: &str, checkpoint_id: &str) -> CheckpointResult<()> {
        let (this, id, cp) = (
            self.clone(),
            sandbox_id.to_string(),
            checkpoint_id.to_string(),
        );
        tokio::spawn(async move { this.remove(&id, &cp).await })
            .await
            .map_err(|e| CheckpointError::Store(StoreError::ended_early(e)))?
    }

    async fn remove(&self, sandbox_id: &str, checkpoint_id: &str) -> CheckpointResult<()> {
        let sandbox = self.sandboxes.lookup_any(sandbox_id).await?;
        let _one = self.lock(&sandbox.id).await;
        let store = self.store(&sandbox.id)?;
        let id = checkpoint_id.to_string();
        let removed = store
            .blocking(move |s| {
                let usage = s.begin()?;
                if !s.remove_manifest(&id)? {
                    s.end(usage)?;
                    return Ok(false);
                }
                let usage = s.collect_garbage()?;
                s.end(usage)?;
                Ok(true)
            })
            .await
            .map_err(store_err)?;
        if !removed {
            return Err(CheckpointError::NotFound(checkpoint_id.to_string()));
        }
        Ok(())
    }

    async fn manifest(&self, store: &Store, checkpoint_id: &str) -> CheckpointResult<Manifest> {
        let id = checkpoint_id.to_string();
        store
            .blocking(move |s| s.manifest(&id))
            .await
            .map_err(store_err)?
            .ok_or_else(|| CheckpointError::NotFound(checkpoint_id.to_string()))
    }

    /// Checkpoint `checkpoint_id`'s entries, and when its walk began.
    async fn entries(
        &self,
        sandbox_id: &str,
        store: &Store,
        checkpoint_id: &str,
    ) -> CheckpointResult<Arc<Newest>> {
        let m = self.manifest(store, checkpoint_id).await?;
        if let Some(kept) = self.recent.newest(sandbox_id, &m.id) {
            return Ok(kept);
        }
        store
            .blocking(move |s| s.newest(m).map(Arc::new))
            .await
            .map_err(store_err)
    }

    /// What changed from checkpoint `from` to `to`, with the unified diff
    /// of its text files shaped by `text` when given. Two checkpoints are
    /// compared in the store, so a paused sandbox's are too; the workspace
    /// now needs the sandbox running.
    pub async fn diff(
        &self,
        sandbox_id: &str,
        from: &str,
        to: DiffTarget,
        text: Option<ShapeSpec>,
    ) -> CheckpointResult<Diff> {
        let sandbox = match to {
            DiffTarget::Checkpoint(_) => self.sandboxes.lookup_any(sandbox_id).await?,
            DiffTarget::Current => self.sandboxes.lookup(sandbox_id).await?,
        };
        let store = self.store(&sandbox.id)?;
        let old = self.entries(&sandbox.id, &store, from).await?;
        match to {
            DiffTarget::Checkpoint(id) => {
                let new = self.entries(&sandbox.id, &store, &id).await?;
                described(&old.entries, &new.entries, Reader::new(&store, None), text).await
            }
            DiffTarget::Current => {
                let _busy = sandbox.open_request();
                let made = async {
                    let new = self.current(&sandbox, &store, &old).await?;
                    let conn = self.sandboxes.agent(&sandbox).await?;
                    let agent = tree::Agent {
                        conn: &conn,
                        limit: self.config.agent_timeout,
                        dirs: self.config.workspace_dirs().collect(),
                    };
                    let reader = Reader::new(&store, Some(&agent));
                    described(&old.entries, &new, reader, text).await
                }
                .await;
                made.map_err(|e| self.sandboxes.gone_or(&sandbox, e))
            }
        }
    }

    /// The workspace's directory on the host, open, where sandboxd may
    /// read it ([`host`]).
    async fn host_tree(
        &self,
        sandbox: &crate::sandbox::Sandbox,
        store: &Store,
    ) -> Option<Arc<HostTree>> {
        let dir = self.sandboxes.workspace_host_dir(sandbox).await?;
        open_host_tree(store, dir, self.config.sandbox_uid_gid().0).await
    }

    /// The workspace now, hashed (files `known` saw unchanged are not
    /// read again).
    async fn current(
        &self,
        sandbox: &Arc<crate::sandbox::Sandbox>,
        store: &Store,
        known: &Newest,
    ) -> CheckpointResult<Vec<Entry>> {
        let conn = self.sandboxes.agent(sandbox).await?;
        let agent = tree::Agent {
            conn: &conn,
            limit: self.config.agent_timeout,
            dirs: self.config.workspace_dirs().collect(),
        };
        let host = self.host_tree(sandbox, store).await;
        let mut entries =
            walk(&agent, host.as_ref(), store, &self.config, &self.host_walks).await?;
        agent
            .hash_current(&mut entries, &known.entries, known.walked_at_ns)
            .await?;
        Ok(entries)
    }

    /// Makes the workspace exactly checkpoint `checkpoint_id`'s: what it
    /// changed. The caller saw to it that no command runs.
    pub async fn restore(&self, sandbox_id: &str, checkpoint_id: &str) -> CheckpointResult<Diff> {
        let sandbox = self.sandboxes.lookup(sandbox_id).await?;
        let _busy = sandbox.open_request();
        let _one = self.lock(&sandbox.id).await;
        let store = self.store(&sandbox.id)?;
        let target = self.entries(&sandbox.id, &store, checkpoint_id).await?;
        self.make(&sandbox, &store, &target).await
    }

    /// Checkpoint `checkpoint_id` of sandbox `sandbox_id`.
    pub async fn info(
        &self,
        sandbox_id: &str,
        checkpoint_id: &str,
    ) -> CheckpointResult<CheckpointInfo> {
        let store = self.store(sandbox_id)?;
        let m = self.manifest(&store, checkpoint_id).await?;
        Ok(CheckpointInfo::from(&m))
    }

    /// Makes the workspace of sandbox `into` (a fork just made) exactly
    /// checkpoint `checkpoint_id` of sandbox `from`, whose content stays
    /// meanwhile.
    pub async fn copy(&self, from: &str, checkpoint_id: &str, into: &str) -> CheckpointResult<()> {
        let target = self.sandboxes.lookup(into).await?;
        let _busy = target.open_request();
        let _source_turn = self.lock(from).await;
        let _target_turn = self.lock(&target.id).await;
        let store = self.store(from)?;
        let entries = self.entries(from, &store, checkpoint_id).await?;
        self.make(&target, &store, &entries).await.map(drop)
    }

    /// Makes the workspace of `sandbox` exactly `target`, with the content
    /// in `store`: what it changed.
    async fn make(
        &self,
        sandbox: &Arc<crate::sandbox::Sandbox>,
        store: &Store,
        target: &Newest,
    ) -> CheckpointResult<Diff> {
        let made = async {
            let current = self.current(sandbox, store, target).await?;
            let plan = tree::plan(&current, &target.entries);
            let conn = self.sandboxes.agent(sandbox).await?;
            let agent = tree::Agent {
                conn: &conn,
                limit: self.config.agent_timeout,
                dirs: self.config.workspace_dirs().collect(),
            };
            agent.apply(&plan, store).await?;
            Ok(Diff::from(compare(&current, &target.entries)))
        }
        .await;
        made.map_err(|e| self.sandboxes.gone_or(sandbox, e))
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    #[tokio::test]
    async fn a_sandboxs_lock_is_kept_only_while_it_is_held_or_awaited() {
        let locks = Locks::default();
        let first = hold(&locks, "a").await;
        let mut second = Box::pin(hold(&locks, "a"));
        assert!((&mut second).now_or_never().is_none(), "one at a time");
        drop(first);
        assert_eq!(locks.len(), 1, "kept for the one that waits");
        let second = second.await;
        let other = hold(&locks, "b").await;
        assert_eq!(locks.len(), 2);
        drop((second, other));
        assert!(locks.is_empty(), "none kept once no operation runs");

        let first = hold(&locks, "a").await;
        let mut gives_up = Box::pin(hold(&locks, "a"));
        assert!((&mut gives_up).now_or_never().is_none());
        drop(gives_up);
        assert_eq!(locks.len(), 1);
        drop(first);
        assert!(locks.is_empty(), "a waiter that gave up leaves none behind");
    }
}
