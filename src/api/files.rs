//! File routes: `files:read`, `files:write`, `files:list`, `files:delete`.
//! Contents travel as standard base64; it is decoded and encoded here, at
//! the edge, and the domain sees bytes.

use std::sync::Arc;

use axum::extract::State;
use base64::Engine as _;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use super::dto;
use super::error::ApiError;
use super::extract::{Json, Path, Query};
use crate::app::App;
use crate::files::FileToWrite;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct PathQuery {
    /// Absolute under the workspace or relative to it.
    path: Option<String>,
}

/// `GET /v1/sandboxes/{id}/files:read?path=P`
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files:read", tags = ["files", "compat"],
    extensions(("x-compat" = json!(true))),
    summary = "Read a file", params(("id" = String, Path, description = "The sandboxId"),
        ("path" = String, Query, description = "Absolute under the workspace or relative to it")),
    responses((status = 200, description = "The content, or `found: false`", body = dto::FileRead)))]
pub(super) async fn read_file(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> Result<axum::Json<dto::FileRead>, ApiError> {
    let path = q
        .path
        .ok_or_else(|| ApiError::bad_request("path: the query parameter is required"))?;
    let content = app.files.read(&id, &path).await?;
    Ok(axum::Json(content.into()))
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
    responses((status = 200, description = "Written", body = dto::Done)))]
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
            let content = base64::engine::general_purpose::STANDARD
                .decode(f.content_base64.as_bytes())
                .map_err(|e| {
                    ApiError::bad_request(format!(
                        "files[{i}].contentBase64: not valid base64 ({e})"
                    ))
                })?;
            Ok(FileToWrite {
                path: f.path,
                content,
                mode: f.mode,
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
