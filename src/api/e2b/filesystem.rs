//! envd's `filesystem.Filesystem` service over sandboxd's files:
//! `Stat` (`Files::stat`), `ListDir` (`Files::list`, a level at a time
//! down to the depth asked) and `Remove` (`Files::delete`, recursive).
//! Paths keep the domain's rules (under the workspace or one of its
//! aliases, symlinks resolved inside the sandbox); answers give them
//! absolute, relative ones under E2B's home. Renaming, making directories
//! and watching answer `unimplemented` until the domain has them.

use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path as AxumPath, State};
use axum::http::HeaderMap;
use axum::response::Response;

use super::connect::{self, Code, ConnectError, Unary};
use super::wire::{
    Empty, EntryInfo, EntryResponse, FileType, ListDirRequest, ListDirResponse, PathRequest,
    permissions, rfc3339,
};
use super::{E2b, SandboxId, absolute, failed};
use crate::files::EntryKind;

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

/// Every other method: `unimplemented`, naming what the domain lacks.
pub(super) async fn other(AxumPath(method): AxumPath<String>, headers: HeaderMap) -> Response {
    let what = match method.as_str() {
        "Move" => "renaming files (rename needs it in the domain)",
        "MakeDir" => "making directories (make_dir needs it in the domain)",
        "WatchDir" | "CreateWatcher" | "GetWatcherEvents" | "RemoveWatcher" => {
            "watching a directory (watch_dir needs file watching in the domain)"
        }
        _ => "this method of filesystem.Filesystem",
    };
    connect::refuse(&headers, &ConnectError::unimplemented(what))
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
