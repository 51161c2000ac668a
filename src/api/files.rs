//! File routes: `files:read`, `files:write`, `files:list`, `files:delete`.
//! Contents travel as standard base64; it is decoded and encoded here, at
//! the edge, and the domain sees bytes.

use std::sync::Arc;

use axum::extract::State;
use base64::Engine as _;
use serde::Deserialize;

use super::dto;
use super::error::ApiError;
use super::extract::{Json, Path, Query};
use crate::app::App;
use crate::files::FileToWrite;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PathQuery {
    path: Option<String>,
}

/// `GET /v1/sandboxes/{id}/files:read?path=P`
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
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct WriteFile {
    path: String,
    content_base64: String,
    #[serde(default)]
    mode: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WriteRequest {
    files: Vec<WriteFile>,
}

/// `POST /v1/sandboxes/{id}/files:write`
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
pub(super) async fn list_files(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> Result<axum::Json<dto::FileList>, ApiError> {
    let path = q.path.unwrap_or_else(|| app.config.workspace_dir.clone());
    let entries = app.files.list(&id, &path).await?;
    Ok(axum::Json(entries.into()))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DeleteRequest {
    paths: Vec<String>,
    #[serde(default)]
    recursive: bool,
}

/// `POST /v1/sandboxes/{id}/files:delete`
pub(super) async fn delete_files(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Json(req): Json<DeleteRequest>,
) -> Result<axum::Json<dto::Done>, ApiError> {
    app.files.delete(&id, req.paths, req.recursive).await?;
    Ok(axum::Json(dto::Done::new()))
}
