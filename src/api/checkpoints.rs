//! Checkpoint routes: make one of a sandbox's workspace, list them,
//! compare one with another or with the workspace now, restore one,
//! delete one. Each parses, makes one domain call and maps the answer.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use super::dto;
use super::error::ApiError;
use super::extract::{Json, Path, Query};
use crate::app::App;
use crate::checkpoints::{CheckpointError, DiffTarget, TEXT_DIFF_DEFAULT_CHARS};
use crate::command::spec::shape_spec;
use crate::field_error::FieldError;
use sandboxd_proto::ShapeSpec;

/// A checkpoint to make.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct CreateCheckpoint {
    /// The caller's name for it (a chat message id, say): 1–256 bytes, no
    /// control characters, unique in the sandbox.
    #[serde(default)]
    label: Option<String>,
    /// Read every file again instead of taking the ones the newest
    /// checkpoint saw unchanged (same inode, size and times) from it.
    #[serde(default)]
    verify: bool,
}

/// `POST /v1/sandboxes/{id}/checkpoints`
#[utoipa::path(post, path = "/v1/sandboxes/{id}/checkpoints", tags = ["checkpoints"],
    summary = "Record the workspace now",
    params(("id" = String, Path, description = "The sandboxId")),
    request_body = CreateCheckpoint,
    responses((status = 201, description = "Made", body = dto::Checkpoint)))]
pub(super) async fn create_checkpoint(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Json(body): Json<CreateCheckpoint>,
) -> Result<(StatusCode, axum::Json<dto::Checkpoint>), ApiError> {
    let made = app.checkpoints.create(&id, body.label, body.verify).await?;
    Ok((StatusCode::CREATED, axum::Json(made.into())))
}

/// `GET /v1/sandboxes/{id}/checkpoints`
#[utoipa::path(get, path = "/v1/sandboxes/{id}/checkpoints", tags = ["checkpoints"],
    summary = "The sandbox's checkpoints, newest first",
    params(("id" = String, Path, description = "The sandboxId")),
    responses((status = 200, description = "Every checkpoint", body = dto::CheckpointList)))]
pub(super) async fn list_checkpoints(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<axum::Json<dto::CheckpointList>, ApiError> {
    let all = app.checkpoints.list(&id).await?;
    Ok(axum::Json(all.into()))
}

/// `DELETE /v1/sandboxes/{id}/checkpoints/{cp}`
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/checkpoints/{cp}", tags = ["checkpoints"],
    summary = "Delete a checkpoint; content no other checkpoint holds is freed",
    params(("id" = String, Path, description = "The sandboxId"), ("cp" = String, Path, description = "The checkpointId")),
    responses((status = 200, description = "Deleted", body = dto::Done)))]
pub(super) async fn delete_checkpoint(
    State(app): State<Arc<App>>,
    Path((id, cp)): Path<(String, String)>,
) -> Result<axum::Json<dto::Done>, ApiError> {
    app.checkpoints.delete(&id, &cp).await?;
    Ok(axum::Json(dto::Done::new()))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct DiffQuery {
    /// Another checkpointId, or `current` (the workspace now).
    to: String,
    /// Also answer `text`: a unified diff (`diff -u`) of the text files
    /// among the paths shown, shaped to `maxChars`. Default `false`.
    #[serde(default)]
    text: Option<bool>,
    /// With `text=true`: most characters of the diff's text (256–1000000,
    /// the omission line included); default 20000.
    #[serde(default)]
    max_chars: Option<i64>,
    /// With `text=true`: characters given to the head (0 to `maxChars` −
    /// 80); default a quarter of `maxChars`.
    #[serde(default)]
    head_chars: Option<i64>,
}

impl DiffQuery {
    /// How to shape the text, when it is asked for.
    fn text(&self) -> Result<Option<ShapeSpec>, CheckpointError> {
        if self.text != Some(true) {
            let given = [("maxChars", self.max_chars), ("headChars", self.head_chars)];
            return match given.iter().find(|(_, v)| v.is_some()) {
                Some((field, _)) => Err(FieldError::new(*field, "only with text=true").into()),
                None => Ok(None),
            };
        }
        let max = self.max_chars.unwrap_or(i64::from(TEXT_DIFF_DEFAULT_CHARS));
        Ok(Some(shape_spec("", max, self.head_chars, true)?))
    }
}

/// `GET /v1/sandboxes/{id}/checkpoints/{cp}/diff`
#[utoipa::path(get, path = "/v1/sandboxes/{id}/checkpoints/{cp}/diff", tags = ["checkpoints"],
    summary = "What changed from a checkpoint to another one, or to the workspace now",
    params(("id" = String, Path, description = "The sandboxId"), ("cp" = String, Path, description = "The checkpointId"), DiffQuery),
    responses((status = 200, description = "The paths created, modified and deleted, and with `text=true` their unified diff", body = dto::CheckpointDiff)))]
pub(super) async fn diff_checkpoint(
    State(app): State<Arc<App>>,
    Path((id, cp)): Path<(String, String)>,
    Query(q): Query<DiffQuery>,
) -> Result<axum::Json<dto::CheckpointDiff>, ApiError> {
    let text = q.text()?;
    let to = match q.to.as_str() {
        "current" => DiffTarget::Current,
        _ => DiffTarget::Checkpoint(q.to),
    };
    let diff = app.checkpoints.diff(&id, &cp, to, text).await?;
    Ok(axum::Json(diff.into()))
}

/// How to restore.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RestoreRequest {
    /// End the sandbox's commands (and processes they left) first;
    /// without it a restore while any run is refused (409
    /// `commands_running`).
    #[serde(default)]
    end_commands: bool,
}

/// `POST /v1/sandboxes/{id}/checkpoints/{cp}:ACTION`
pub(super) async fn checkpoint_action(
    State(app): State<Arc<App>>,
    Path((id, segment)): Path<(String, String)>,
    Json(body): Json<RestoreRequest>,
) -> Result<axum::Json<dto::CheckpointDiff>, ApiError> {
    match segment.rsplit_once(':') {
        Some((cp, "restore")) => restore(&app, &id, cp, body).await,
        _ => Err(ApiError::not_found(
            "unknown checkpoint action; use POST …/checkpoints/{checkpointId}:restore",
        )),
    }
}

/// `POST /v1/sandboxes/{id}/checkpoints/{cp}:restore`
#[utoipa::path(post, path = "/v1/sandboxes/{id}/checkpoints/{cp}:restore", tags = ["checkpoints"],
    operation_id = "restore_checkpoint",
    summary = "Make the workspace exactly the checkpoint's",
    params(("id" = String, Path, description = "The sandboxId"), ("cp" = String, Path, description = "The checkpointId")),
    request_body = RestoreRequest,
    responses((status = 200, description = "Restored: what it changed, from the workspace before to the checkpoint", body = dto::CheckpointDiff)))]
async fn restore(
    app: &App,
    id: &str,
    cp: &str,
    body: RestoreRequest,
) -> Result<axum::Json<dto::CheckpointDiff>, ApiError> {
    let changed = app.restore_checkpoint(id, cp, body.end_commands).await?;
    Ok(axum::Json(changed.into()))
}
