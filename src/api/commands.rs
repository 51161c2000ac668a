//! Command routes: start, run, list, wait, kill, and the NDJSON log stream.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;

use super::dto;
use super::error::ApiError;
use super::extract::{Json, Path, Query};
use crate::app::App;
use crate::command::spec::CommandRequest;

/// `POST /v1/sandboxes/{id}/commands`
pub(super) async fn start_command(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Json(req): Json<CommandRequest>,
) -> Result<axum::Json<dto::CommandStarted>, ApiError> {
    let cmd = app.commands.start(&id, req).await?;
    Ok(axum::Json(dto::CommandStarted::from(&*cmd)))
}

/// `POST /v1/sandboxes/{id}/commands:run`
pub(super) async fn run_command(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Json(req): Json<CommandRequest>,
) -> Result<axum::Json<dto::CommandRun>, ApiError> {
    let out = app.commands.run(&id, req, &app.shutdown).await?;
    Ok(axum::Json(out.into()))
}

/// `GET /v1/sandboxes/{id}/commands`
pub(super) async fn list_commands(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<axum::Json<dto::CommandList>, ApiError> {
    let list = app.commands.list(&id).await?;
    Ok(axum::Json(list.into()))
}

/// `GET /v1/sandboxes/{id}/commands/{cid}/wait`
pub(super) async fn wait_command(
    State(app): State<Arc<App>>,
    Path((id, cid)): Path<(String, String)>,
) -> Result<axum::Json<dto::CommandEnded>, ApiError> {
    let done = app.commands.wait(&id, &cid, &app.shutdown).await?;
    Ok(axum::Json(done.into()))
}

/// `POST /v1/sandboxes/{id}/commands/{cid}:kill`
pub(super) async fn command_action(
    State(app): State<Arc<App>>,
    Path((id, segment)): Path<(String, String)>,
) -> Result<axum::Json<dto::Done>, ApiError> {
    match segment.rsplit_once(':') {
        Some((cid, "kill")) => {
            app.commands.kill(&id, cid).await?;
            Ok(axum::Json(dto::Done::new()))
        }
        _ => Err(ApiError::not_found(
            "unknown command action; use POST …/commands/{commandId}:kill",
        )),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LogsQuery {
    #[serde(default)]
    after: Option<u64>,
    /// Go on past the `exit` record with what the processes the command
    /// left running print, until they are gone.
    #[serde(default)]
    leftovers: Option<bool>,
}

/// `GET /v1/sandboxes/{id}/commands/{cid}/logs`: replay, then follow.
pub(super) async fn stream_logs(
    State(app): State<Arc<App>>,
    Path((id, cid)): Path<(String, String)>,
    Query(q): Query<LogsQuery>,
) -> Result<Response, ApiError> {
    let lines = app
        .commands
        .follow_logs(
            &id,
            &cid,
            q.after.unwrap_or(0),
            q.leftovers.unwrap_or(false),
            app.shutdown.clone(),
        )
        .await?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(lines.map(Ok::<_, std::convert::Infallible>)),
    )
        .into_response())
}
