//! File routes: `files:read`, `files:write`, `files:edit`, `files:list`,
//! `files:delete`, `files:move`, `files:mkdir`, `files:stat`,
//! `files:search`, and the NDJSON stream of `files:watch`. Contents travel
//! as standard base64; it is decoded and encoded here, at the edge, and the
//! domain sees bytes.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use super::dto;
use super::error::ApiError;
use super::extract::{Json, Path, Query};
use crate::app::App;
use crate::files::{FileEdit, FileToWrite, FileWatch, SearchRequest, WatchEvent};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct PathQuery {
    /// Absolute under the workspace or relative to it.
    path: Option<String>,
}

/// `files:read`'s query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct ReadQuery {
    /// Absolute under the workspace or relative to it.
    path: Option<String>,
    /// First line to return (1-based); with `endLine`, asks for lines as
    /// text instead of `contentBase64`.
    start_line: Option<u64>,
    /// Last line to return (1-based, inclusive).
    end_line: Option<u64>,
}

/// `GET /v1/sandboxes/{id}/files:read?path=P[&startLine=A][&endLine=B]`
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files:read", tags = ["files", "compat"],
    extensions(("x-compat" = json!(true))),
    summary = "Read a file, or a range of its lines", params(("id" = String, Path, description = "The sandboxId"),
        ReadQuery),
    responses((status = 200, description = "The content (or the lines), or `found: false`", body = dto::FileRead)))]
pub(super) async fn read_file(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Query(q): Query<ReadQuery>,
) -> Result<Response, ApiError> {
    let path = q
        .path
        .ok_or_else(|| ApiError::bad_request("path: the query parameter is required"))?;
    if q.start_line.is_none() && q.end_line.is_none() {
        let content = app.files.read(&id, &path).await?;
        return Ok(dto::file_read_response(content));
    }
    let lines = app
        .files
        .read_lines(&id, &path, q.start_line, q.end_line)
        .await?;
    Ok(axum::Json(dto::FileRead::from(lines)).into_response())
}

/// One file of `files:write`, as the client sends it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct WriteFile {
    path: String,
    /// Strict standard base64 with padding.
    content_base64: String,
    /// Permission bits 0–511; default 420 (0o644).
    #[serde(default)]
    mode: Option<i64>,
    /// Write only if the file's content now has this SHA-256 (64 hex
    /// digits), as `files:read` gave it.
    #[serde(default)]
    if_match: Option<String>,
    /// `"*"`: write only if no file is there (create only).
    #[serde(default)]
    if_none_match: Option<String>,
}

/// `files:write`: all files or none.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct WriteRequest {
    /// At least one.
    files: Vec<WriteFile>,
}

/// `POST /v1/sandboxes/{id}/files:write`
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files:write", tags = ["files", "compat"],
    extensions(("x-compat" = json!(true))),
    summary = "Write files, all or none", params(("id" = String, Path, description = "The sandboxId")), request_body = WriteRequest,
    responses((status = 200, description = "Written (a failed `ifMatch` or `ifNoneMatch` is 409 `precondition_failed` with `failed`, and nothing is written)", body = dto::Done)))]
pub(super) async fn write_files(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Json(req): Json<WriteRequest>,
) -> Result<axum::Json<dto::Done>, ApiError> {
    let files = req
        .files
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            let content = crate::files::text::decode_base64(&f.content_base64).map_err(|e| {
                ApiError::bad_request(format!("files[{i}].contentBase64: not valid base64 ({e})"))
            })?;
            Ok(FileToWrite {
                path: f.path,
                content,
                mode: f.mode,
                if_match: f.if_match,
                if_none_match: f.if_none_match,
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    app.files.write(&id, files).await?;
    Ok(axum::Json(dto::Done::new()))
}

/// `GET /v1/sandboxes/{id}/files:list?path=P` (the workspace when omitted)
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files:list", tags = ["files"],
    summary = "List a directory (default: the workspace)", params(("id" = String, Path, description = "The sandboxId"), PathQuery),
    responses((status = 200, description = "Entries sorted by name", body = dto::FileList)))]
pub(super) async fn list_files(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> Result<axum::Json<dto::FileList>, ApiError> {
    let path = q.path.unwrap_or_else(|| app.config.workspace_dir.clone());
    let entries = app.files.list(&id, &path).await?;
    Ok(axum::Json(entries.into()))
}

/// `files:delete`: paths are deleted in the order given.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct DeleteRequest {
    /// At least one; a missing path is skipped.
    paths: Vec<String>,
    /// Needed for a directory.
    #[serde(default)]
    recursive: bool,
}

/// `POST /v1/sandboxes/{id}/files:delete`
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files:delete", tags = ["files"],
    summary = "Delete files and directories", params(("id" = String, Path, description = "The sandboxId")), request_body = DeleteRequest,
    responses((status = 200, description = "Deleted", body = dto::Done)))]
pub(super) async fn delete_files(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Json(req): Json<DeleteRequest>,
) -> Result<axum::Json<dto::Done>, ApiError> {
    app.files.delete(&id, req.paths, req.recursive).await?;
    Ok(axum::Json(dto::Done::new()))
}

/// `files:move`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct MoveRequest {
    /// The path moved (a symlink is moved itself).
    from: String,
    /// Where it goes; missing parent directories are made.
    to: String,
    /// Replace what is at `to` (a directory only by a directory, and
    /// only when empty); default `false`: `409 file_exists`.
    #[serde(default)]
    overwrite: bool,
}

/// `POST /v1/sandboxes/{id}/files:move`
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files:move", tags = ["files"],
    summary = "Move or rename a file or directory within the workspace", params(("id" = String, Path, description = "The sandboxId")), request_body = MoveRequest,
    responses((status = 200, description = "Moved (404 `file_not_found` for a missing `from`, 409 `file_exists` for an existing `to` without `overwrite`)", body = dto::Done)))]
pub(super) async fn move_file(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Json(req): Json<MoveRequest>,
) -> Result<axum::Json<dto::Done>, ApiError> {
    app.files
        .rename(&id, &req.from, &req.to, req.overwrite)
        .await?;
    Ok(axum::Json(dto::Done::new()))
}

/// `files:mkdir`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct MakeDirRequest {
    /// The directory; missing parents are made too.
    path: String,
}

/// `POST /v1/sandboxes/{id}/files:mkdir`
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files:mkdir", tags = ["files"],
    summary = "Make a directory and its missing parents", params(("id" = String, Path, description = "The sandboxId")), request_body = MakeDirRequest,
    responses((status = 200, description = "`created: false` when a directory was there already (anything else there is 400 `not_a_directory`)", body = dto::DirMade)))]
pub(super) async fn make_dir(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Json(req): Json<MakeDirRequest>,
) -> Result<axum::Json<dto::DirMade>, ApiError> {
    let created = app.files.make_dir(&id, &req.path).await?;
    Ok(axum::Json(created.into()))
}

/// `files:stat`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct StatRequest {
    /// 1 to 1000 paths.
    paths: Vec<String>,
    /// Also the SHA-256 of each regular file.
    #[serde(default)]
    sha256: bool,
}

/// `POST /v1/sandboxes/{id}/files:stat`
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files:stat", tags = ["files"],
    summary = "What paths are: type, size, mode, mtime, hash", params(("id" = String, Path, description = "The sandboxId")), request_body = StatRequest,
    responses((status = 200, description = "One entry per path, in order", body = dto::StatList)))]
pub(super) async fn stat_files(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Json(req): Json<StatRequest>,
) -> Result<axum::Json<dto::StatList>, ApiError> {
    let infos = app.files.stat(&id, req.paths, req.sha256).await?;
    Ok(axum::Json(infos.into()))
}

/// Which search runs.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum SearchEngine {
    /// `rg` when the image has it, else the agent's own.
    #[default]
    Auto,
    /// The agent's own search, even when the image has `rg`.
    Builtin,
}

/// `files:search`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct SearchBody {
    /// A regular expression, Rust `regex` syntax (ripgrep's); 1 to 4096 bytes.
    pattern: String,
    /// The directory searched; default: the workspace.
    #[serde(default)]
    path: Option<String>,
    /// ripgrep `--glob`s (at most 100, together at most 32 KiB): `*.rs`, `src/**/*.ts`, `!node_modules`.
    #[serde(default)]
    globs: Vec<String>,
    /// Matches returned, 1 to 10000; default 100. All are counted.
    #[serde(default)]
    max_results: Option<u32>,
    /// Lines before and after each match, 0 to 10; default 0.
    #[serde(default)]
    context: Option<u32>,
    #[serde(default)]
    case_insensitive: bool,
    #[serde(default)]
    engine: SearchEngine,
}

/// `POST /v1/sandboxes/{id}/files:search`
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files:search", tags = ["files"],
    summary = "Search file contents with a regular expression", params(("id" = String, Path, description = "The sandboxId")), request_body = SearchBody,
    responses((status = 200, description = "Matches, and exact counts of what the cap left out", body = dto::SearchAnswer)))]
pub(super) async fn search_files(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Json(req): Json<SearchBody>,
) -> Result<axum::Json<dto::SearchAnswer>, ApiError> {
    let result = app
        .files
        .search(
            &id,
            SearchRequest {
                pattern: req.pattern,
                path: req.path,
                globs: req.globs,
                max_results: req.max_results,
                context: req.context,
                case_insensitive: req.case_insensitive,
                builtin: matches!(req.engine, SearchEngine::Builtin),
            },
        )
        .await?;
    Ok(axum::Json(result.into()))
}

/// `files:edit`: one exact, unique replacement in a text file.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct EditRequest {
    /// Absolute under the workspace or relative to it; a UTF-8 text file.
    path: String,
    /// Text that must occur exactly once in the file (not empty).
    old_text: String,
    /// What it becomes.
    new_text: String,
    /// Edit only if the file's content now has this SHA-256 (64 hex
    /// digits), as `files:read` gave it.
    #[serde(default)]
    if_match: Option<String>,
}

/// `POST /v1/sandboxes/{id}/files:edit`
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files:edit", tags = ["files"],
    summary = "Replace the one occurrence of a text in a file, all or nothing", params(("id" = String, Path, description = "The sandboxId")), request_body = EditRequest,
    responses((status = 200, description = "Edited (`oldText` found zero or several times is 400 `invalid_request` saying how many; a stale `ifMatch`, or a change between the read and the write, is 409 `precondition_failed`; nothing is written)", body = dto::FileEdited)))]
pub(super) async fn edit_file(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Json(req): Json<EditRequest>,
) -> Result<axum::Json<dto::FileEdited>, ApiError> {
    let edited = app
        .files
        .edit(
            &id,
            FileEdit {
                path: req.path,
                old_text: req.old_text,
                new_text: req.new_text,
                if_match: req.if_match,
            },
        )
        .await?;
    Ok(axum::Json(edited.into()))
}

/// `files:watch`'s query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct WatchQuery {
    /// The directory, absolute under the workspace or relative to it;
    /// default: the workspace.
    path: Option<String>,
    /// Every directory below it too, new ones as they appear; default
    /// `false`.
    recursive: Option<bool>,
}

/// `GET /v1/sandboxes/{id}/files:watch?path=P&recursive=B`
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files:watch", tags = ["files"],
    summary = "Watch a directory: NDJSON events as things happen",
    params(("id" = String, Path, description = "The sandboxId"), WatchQuery),
    responses((status = 200, content_type = "application/x-ndjson", body = dto::WatchLine,
        description = "One WatchLine per line, until the client closes the stream or an `end` line")))]
pub(super) async fn watch_files(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Query(q): Query<WatchQuery>,
) -> Result<Response, ApiError> {
    let path = q.path.unwrap_or_else(|| app.config.workspace_dir.clone());
    let watch = app
        .files
        .watch(
            &id,
            &path,
            q.recursive.unwrap_or(false),
            app.shutdown.clone(),
        )
        .await?;
    let heartbeat = app.config.log_heartbeat;
    // Ends after the `end` line; dropped (the client went), it drops the
    // watch, which stops it in the sandbox.
    let lines =
        futures_util::stream::unfold(Some(watch), move |watch: Option<FileWatch>| async move {
            let mut watch = watch?;
            match tokio::time::timeout(heartbeat, watch.next()).await {
                Err(_) => Some((dto::WatchLine::Heartbeat.render(), Some(watch))),
                Ok(None) => None,
                Ok(Some(event)) => {
                    let last = matches!(event, WatchEvent::Ended(_));
                    let line = dto::WatchLine::from(event).render();
                    Some((line, (!last).then_some(watch)))
                }
            }
        });
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(lines.map(Ok::<_, std::convert::Infallible>)),
    )
        .into_response())
}
