//! File routes: `files:read`, `files:write`, `files:list`, `files:delete`.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::json;

use super::error::ApiError;
use super::extract::{Json, Path, Query};
use crate::app::App;
use crate::files::WriteFile;

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
) -> Result<Response, ApiError> {
    let path = q
        .path
        .ok_or_else(|| ApiError::bad_request("path: the query parameter is required"))?;
    Ok(match app.files.read(&id, &path).await? {
        Some(content) => {
            let b64 = base64::engine::general_purpose::STANDARD.encode(content);
            axum::Json(json!({"found": true, "contentBase64": b64})).into_response()
        }
        None => axum::Json(json!({"found": false})).into_response(),
    })
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
) -> Result<Response, ApiError> {
    app.files.write(&id, req.files).await?;
    Ok(axum::Json(json!({"ok": true})).into_response())
}

/// `GET /v1/sandboxes/{id}/files:list?path=P` (the workspace when omitted)
pub(super) async fn list_files(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> Result<Response, ApiError> {
    let path = q.path.unwrap_or_else(|| app.config.workspace_dir.clone());
    let entries = app.files.list(&id, &path).await?;
    Ok(axum::Json(json!({ "entries": entries })).into_response())
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
) -> Result<Response, ApiError> {
    app.files.delete(&id, req.paths, req.recursive).await?;
    Ok(axum::Json(json!({"ok": true})).into_response())
}
