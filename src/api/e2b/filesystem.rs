//! envd's `filesystem.Filesystem` service over sandboxd's files: `Stat`
//! (`Files::stat`), `ListDir` (`Files::list_whole_tree`), `Remove`
//! (`Files::delete`, recursive), `Move` (`Files::rename`), `MakeDir`
//! (`Files::make_dir`), `WatchDir` (`Files::watch`, streamed) and the
//! polling watchers `CreateWatcher`, `GetWatcherEvents` and
//! `RemoveWatcher` (`Files::hold_watch`). Paths keep the domain's rules
//! (under the workspace or one of its aliases, symlinks resolved inside
//! the sandbox); answers give them absolute, relative ones under E2B's
//! home.

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;

use super::connect::{self, Code, ConnectError, Streaming, Unary, to_json};
use super::wire::{
    CreatedWatcher, Empty, EntryInfo, EntryResponse, EventType, FileType, FilesystemEvent,
    ListDirRequest, ListDirResponse, MoveRequest, PathRequest, WatchDirEvent, WatchRequest,
    WatcherEvents, WatcherRequest, permissions, rfc3339,
};
use super::{E2b, SandboxId, absolute, failed};
use std::future::ready;

use futures_util::{StreamExt, stream};

use crate::files::{EntryKind, FileChange, WatchEnded, WatchEvent};

fn file_type(kind: EntryKind) -> FileType {
    match kind {
        EntryKind::File => FileType::File,
        EntryKind::Dir => FileType::Directory,
        EntryKind::Symlink => FileType::Symlink,
        EntryKind::Other => FileType::Unspecified,
    }
}

/// An entry as envd describes it. sandboxd does not resolve owners'
/// names, so `owner` and `group` are empty.
fn entry_info(path: String, kind: EntryKind, size: u64, mode: u32, mtime_ms: i64) -> EntryInfo {
    let kind = file_type(kind);
    let name = path
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string();
    EntryInfo {
        name,
        kind,
        path,
        size,
        mode,
        permissions: permissions(kind, mode),
        owner: String::new(),
        group: String::new(),
        modified_time: rfc3339(mtime_ms),
    }
}

fn not_found(path: &str) -> ConnectError {
    ConnectError::new(Code::NotFound, format!("path '{path}' does not exist"))
}

impl E2b {
    /// What is at `path`; `not_found` when nothing is.
    async fn entry(&self, sid: &str, path: &str) -> Result<EntryInfo, ConnectError> {
        let shown = absolute(&self.app, path);
        let info = self
            .app
            .files
            .stat(sid, vec![shown.clone()], false)
            .await
            .map_err(failed(sid))?
            .into_iter()
            .next()
            .ok_or_else(|| ConnectError::new(Code::Internal, "the stat answered no path"))?;
        let kind = info.kind.ok_or_else(|| not_found(path))?;
        Ok(entry_info(shown, kind, info.size, info.mode, info.mtime_ms))
    }
}

/// `POST /filesystem.Filesystem/Stat`.
pub(super) async fn stat(
    State(e2b): State<Arc<E2b>>,
    Extension(SandboxId(sid)): Extension<SandboxId>,
    call: Unary<PathRequest>,
) -> Response {
    connect::unary(call.deadline, async move {
        let entry = e2b.entry(&sid, &call.message.path).await?;
        Ok(EntryResponse { entry })
    })
    .await
}

/// `POST /filesystem.Filesystem/ListDir`: the entries down to `depth`
/// levels (0 and 1: the directory's own), none left out
/// (`Files::list_whole_tree`).
pub(super) async fn list_dir(
    State(e2b): State<Arc<E2b>>,
    Extension(SandboxId(sid)): Extension<SandboxId>,
    call: Unary<ListDirRequest>,
) -> Response {
    connect::unary(call.deadline, async move {
        let req = call.message;
        let dir = absolute(&e2b.app, &req.path);
        let tree = e2b
            .app
            .files
            .list_whole_tree(&sid, &dir, req.depth.max(1))
            .await
            .map_err(failed(&sid))?;
        let base = dir.trim_end_matches('/');
        let entries = tree
            .into_iter()
            .map(|t| {
                let e = t.entry;
                entry_info(
                    format!("{base}/{}", t.path),
                    e.kind,
                    e.size,
                    e.mode,
                    e.mtime_ms,
                )
            })
            .collect();
        Ok(ListDirResponse { entries })
    })
    .await
}

/// `POST /filesystem.Filesystem/Remove`: a file, or a directory with what
/// it holds; `not_found` when nothing is there.
pub(super) async fn remove(
    State(e2b): State<Arc<E2b>>,
    Extension(SandboxId(sid)): Extension<SandboxId>,
    call: Unary<PathRequest>,
) -> Response {
    connect::unary(call.deadline, async move {
        let entry = e2b.entry(&sid, &call.message.path).await?;
        e2b.app
            .files
            .delete(&sid, vec![entry.path], true)
            .await
            .map_err(failed(&sid))?;
        Ok(Empty {})
    })
    .await
}

/// `POST /filesystem.Filesystem/Move`: what is at `source` goes to
/// `destination`, replacing what was there (as envd's rename does).
pub(super) async fn rename(
    State(e2b): State<Arc<E2b>>,
    Extension(SandboxId(sid)): Extension<SandboxId>,
    call: Unary<MoveRequest>,
) -> Response {
    connect::unary(call.deadline, async move {
        let req = call.message;
        let to = absolute(&e2b.app, &req.destination);
        e2b.app
            .files
            .rename(&sid, &absolute(&e2b.app, &req.source), &to, true)
            .await
            .map_err(failed(&sid))?;
        let entry = e2b.entry(&sid, &to).await?;
        Ok(EntryResponse { entry })
    })
    .await
}

/// `POST /filesystem.Filesystem/MakeDir`: the directory and its missing
/// parents; `already_exists` when it was there (the SDKs answer false).
pub(super) async fn make_dir(
    State(e2b): State<Arc<E2b>>,
    Extension(SandboxId(sid)): Extension<SandboxId>,
    call: Unary<PathRequest>,
) -> Response {
    connect::unary(call.deadline, async move {
        let path = absolute(&e2b.app, &call.message.path);
        let made = e2b
            .app
            .files
            .make_dir(&sid, &path)
            .await
            .map_err(failed(&sid))?;
        if !made {
            return Err(ConnectError::new(
                Code::AlreadyExists,
                format!("directory '{path}' already exists"),
            ));
        }
        let entry = e2b.entry(&sid, &path).await?;
        Ok(EntryResponse { entry })
    })
    .await
}

/// A watch's event as envd's, if it has one: an overflow has none in
/// envd's protocol (the events it stands for are lost, as envd loses them
/// past its own buffer); the end of a watch for another reason than its
/// directory going is the stream's error.
fn watch_event(e: WatchEvent) -> Option<Result<FilesystemEvent, ConnectError>> {
    match e {
        WatchEvent::Change { kind, name, .. } => Some(Ok(FilesystemEvent {
            name,
            kind: match kind {
                FileChange::Create => EventType::Create,
                FileChange::Write => EventType::Write,
                FileChange::Remove => EventType::Remove,
                FileChange::Rename => EventType::Rename,
                FileChange::Chmod => EventType::Chmod,
            },
        })),
        WatchEvent::Overflow | WatchEvent::Ended(WatchEnded::DirectoryGone) => None,
        WatchEvent::Ended(why) => Some(Err(ConnectError::new(Code::Unavailable, why.reason()))),
    }
}

/// `POST /filesystem.Filesystem/WatchDir`: `start`, then the directory's
/// events as they come (`Files::watch`), to the end of the watch.
pub(super) async fn watch_dir(
    State(e2b): State<Arc<E2b>>,
    Extension(SandboxId(sid)): Extension<SandboxId>,
    call: Streaming<WatchRequest>,
) -> Response {
    let req = call.message;
    let path = absolute(&e2b.app, &req.path);
    let shutdown = e2b.app.shutdown.clone();
    let watch = match e2b
        .app
        .files
        .watch(&sid, &path, req.recursive, shutdown)
        .await
    {
        Ok(w) => w,
        Err(e) => return connect::stream_error(&failed(&sid)(e)),
    };
    let message = |m: WatchDirEvent| to_json(&m);
    let start = stream::iter([message(WatchDirEvent::Start {})]);
    let events = stream::unfold(watch, |mut w| async move { w.next().await.map(|e| (e, w)) })
        .filter_map(|e| ready(watch_event(e)))
        .map(move |e| e.and_then(|e| message(WatchDirEvent::Filesystem(e))));
    let keepalive = message(WatchDirEvent::Keepalive {}).unwrap_or_default();
    connect::stream_reply(call.timing, keepalive, start.chain(events))
}

/// `POST /filesystem.Filesystem/CreateWatcher`: a watch held for polling
/// (`Files::hold_watch`).
pub(super) async fn create_watcher(
    State(e2b): State<Arc<E2b>>,
    Extension(SandboxId(sid)): Extension<SandboxId>,
    call: Unary<WatchRequest>,
) -> Response {
    connect::unary(call.deadline, async move {
        let req = call.message;
        let path = absolute(&e2b.app, &req.path);
        let shutdown = e2b.app.shutdown.clone();
        let watcher_id = e2b
            .app
            .files
            .hold_watch(&sid, &path, req.recursive, shutdown)
            .await
            .map_err(failed(&sid))?;
        Ok(CreatedWatcher { watcher_id })
    })
    .await
}

fn no_watcher(id: &str) -> ConnectError {
    ConnectError::new(Code::NotFound, format!("watcher '{id}' not found"))
}

/// `POST /filesystem.Filesystem/GetWatcherEvents`: what happened since
/// the last call.
pub(super) async fn watcher_events(
    State(e2b): State<Arc<E2b>>,
    Extension(SandboxId(sid)): Extension<SandboxId>,
    call: Unary<WatcherRequest>,
) -> Response {
    connect::unary(call.deadline, async move {
        let id = call.message.watcher_id;
        let held = e2b.app.files.held_events(&sid, &id);
        let events = held
            .ok_or_else(|| no_watcher(&id))?
            .into_iter()
            .filter_map(watch_event)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(WatcherEvents { events })
    })
    .await
}

/// `POST /filesystem.Filesystem/RemoveWatcher`.
pub(super) async fn remove_watcher(
    State(e2b): State<Arc<E2b>>,
    Extension(SandboxId(sid)): Extension<SandboxId>,
    call: Unary<WatcherRequest>,
) -> Response {
    connect::unary(call.deadline, async move {
        let id = call.message.watcher_id;
        if e2b.app.files.release_watch(&sid, &id) {
            Ok(Empty {})
        } else {
            Err(no_watcher(&id))
        }
    })
    .await
}

/// Every other method: `unimplemented`.
pub(super) async fn other(headers: HeaderMap) -> Response {
    let e = ConnectError::unimplemented("this method of filesystem.Filesystem");
    connect::refuse(&headers, &e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_named_by_its_last_component() {
        let e = entry_info("/home/user/dir/".into(), EntryKind::Dir, 0, 0o755, 0);
        assert_eq!(e.name, "dir");
        assert_eq!(e.kind, FileType::Directory);
        assert_eq!(e.permissions, "drwxr-xr-x");
        let f = entry_info("/home/user/a.txt".into(), EntryKind::File, 3, 0o600, 0);
        assert_eq!((f.name.as_str(), f.size), ("a.txt", 3));
    }
}
