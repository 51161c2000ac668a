//! Command routes: start, run, list, wait, kill, input to an open stdin
//! and its close, and the NDJSON log stream.

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
use crate::command::log::LogLine;
use crate::command::spec::CommandRequest;

/// `POST /v1/sandboxes/{id}/commands`
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands", tags = ["commands", "compat"],
    extensions(("x-compat" = json!(true))),
    summary = "Start a command", params(("id" = String, Path, description = "The sandboxId")), request_body = CommandRequest,
    responses((status = 200, description = "Started", body = dto::CommandStarted)))]
pub(super) async fn start_command(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Json(req): Json<CommandRequest>,
) -> Result<axum::Json<dto::CommandStarted>, ApiError> {
    let (cmd, made) = app.start_command(&id, req).await?;
    let started = dto::CommandStarted::from(&*cmd).with_checkpoint(made);
    Ok(axum::Json(started))
}

/// `POST /v1/sandboxes/{id}/commands:run`
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands:run", tags = ["commands"],
    summary = "Run a command and answer when it has ended", params(("id" = String, Path, description = "The sandboxId")),
    request_body = CommandRequest,
    responses((status = 200, description = "Ended, with the tails of its output", body = dto::CommandRun)))]
pub(super) async fn run_command(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Json(req): Json<CommandRequest>,
) -> Result<axum::Json<dto::CommandRun>, ApiError> {
    let (out, made) = app.run_command(&id, req).await?;
    Ok(axum::Json(dto::CommandRun::from(out).with_checkpoint(made)))
}

/// `GET /v1/sandboxes/{id}/commands`
#[utoipa::path(get, path = "/v1/sandboxes/{id}/commands", tags = ["commands"],
    summary = "List commands, oldest first", params(("id" = String, Path, description = "The sandboxId")),
    responses((status = 200, description = "The commands", body = dto::CommandList)))]
pub(super) async fn list_commands(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<axum::Json<dto::CommandList>, ApiError> {
    let list = app.commands.list(&id).await?;
    Ok(axum::Json(list.into()))
}

/// `GET /v1/sandboxes/{id}/commands/{cid}/wait`
#[utoipa::path(get, path = "/v1/sandboxes/{id}/commands/{cid}/wait", tags = ["commands", "compat"],
    extensions(("x-compat" = json!(true))),
    summary = "Wait until a command has ended", params(("id" = String, Path, description = "The sandboxId"), ("cid" = String, Path, description = "The commandId")),
    responses((status = 200, description = "How it ended", body = dto::CommandEnded)))]
pub(super) async fn wait_command(
    State(app): State<Arc<App>>,
    Path((id, cid)): Path<(String, String)>,
) -> Result<axum::Json<dto::CommandEnded>, ApiError> {
    let done = app.commands.wait(&id, &cid, &app.shutdown).await?;
    Ok(axum::Json(done.into()))
}

/// `POST /v1/sandboxes/{id}/commands/{cid}:kill` and `…:closeStdin`. The
/// router cannot split a segment at a colon, so the action is parsed here.
pub(super) async fn command_action(
    State(app): State<Arc<App>>,
    Path((id, segment)): Path<(String, String)>,
) -> Result<axum::Json<dto::Done>, ApiError> {
    match segment.rsplit_once(':') {
        Some((cid, "kill")) => kill(&app, &id, cid).await,
        Some((cid, "closeStdin")) => close_stdin(&app, &id, cid).await,
        _ => Err(ApiError::not_found(
            "unknown command action; use POST …/commands/{commandId}:kill or :closeStdin",
        )),
    }
}

/// `POST /v1/sandboxes/{id}/commands/{cid}:kill`
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands/{cid}:kill", tags = ["commands", "compat"],
    operation_id = "kill_command",
    extensions(("x-compat" = json!(true))),
    summary = "End a command's whole process tree", params(("id" = String, Path, description = "The sandboxId"), ("cid" = String, Path, description = "The commandId")),
    responses((status = 200, description = "SIGTERM is on its way", body = dto::Done)))]
async fn kill(app: &App, id: &str, cid: &str) -> Result<axum::Json<dto::Done>, ApiError> {
    app.commands.kill(id, cid).await?;
    Ok(axum::Json(dto::Done::new()))
}

/// `POST /v1/sandboxes/{id}/commands/{cid}:closeStdin`
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands/{cid}:closeStdin", tags = ["commands"],
    operation_id = "close_command_stdin",
    summary = "Close the stdin of a command started with `stdinOpen`: it reads the end of its input",
    params(("id" = String, Path, description = "The sandboxId"), ("cid" = String, Path, description = "The commandId")),
    responses((status = 200, description = "Closed (409 `stdin_closed` when it was not open, `command_finished` when the command has ended)", body = dto::Done)))]
async fn close_stdin(app: &App, id: &str, cid: &str) -> Result<axum::Json<dto::Done>, ApiError> {
    app.commands.close_stdin(id, cid).await?;
    Ok(axum::Json(dto::Done::new()))
}

/// Input for a command's open stdin.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct StdinRequest {
    /// The bytes, strict standard base64 with padding; at most 1 MiB
    /// decoded.
    data: String,
}

/// `POST /v1/sandboxes/{id}/commands/{cid}/stdin`
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands/{cid}/stdin", tags = ["commands"],
    summary = "Write to the stdin of a running command started with `stdinOpen`",
    params(("id" = String, Path, description = "The sandboxId"), ("cid" = String, Path, description = "The commandId")),
    request_body = StdinRequest,
    responses((status = 200, description = "All of it is in the command's stdin pipe (409 `stdin_closed`, `command_finished`, or `stdin_not_read` when the command has not read it for 5 s)", body = dto::Done)))]
pub(super) async fn send_stdin(
    State(app): State<Arc<App>>,
    Path((id, cid)): Path<(String, String)>,
    Json(req): Json<StdinRequest>,
) -> Result<axum::Json<dto::Done>, ApiError> {
    let data = crate::files::text::decode_base64(&req.data)
        .map_err(|e| ApiError::bad_request(format!("data: not valid base64 ({e})")))?;
    app.commands.send_stdin(&id, &cid, data.into()).await?;
    Ok(axum::Json(dto::Done::new()))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct LogsQuery {
    /// Skip records with `seq` at or below this one (0: from the start).
    #[serde(default)]
    after: Option<u64>,
    /// Go on past the `exit` record with what the processes the command
    /// left running print, until they are gone.
    #[serde(default)]
    leftovers: Option<bool>,
}

/// `GET /v1/sandboxes/{id}/commands/{cid}/logs`: replay, then follow.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/commands/{cid}/logs", tags = ["commands", "compat"],
    extensions(("x-compat" = json!(true))),
    summary = "A command's log: NDJSON records, replay then live, to the `exit` record",
    params(("id" = String, Path, description = "The sandboxId"), ("cid" = String, Path, description = "The commandId"), LogsQuery),
    responses((status = 200, content_type = "application/x-ndjson", body = dto::LogRecord,
        description = "One LogRecord per line; the stream ends after the `exit` record (unless `leftovers`)")))]
pub(super) async fn stream_logs(
    State(app): State<Arc<App>>,
    Path((id, cid)): Path<(String, String)>,
    Query(q): Query<LogsQuery>,
) -> Result<Response, ApiError> {
    let lines = app
        .commands
        .follow_lines(
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
        Body::from_stream(
            lines.map(|l| Ok::<_, std::convert::Infallible>(LogLine::render_all(&l))),
        ),
    )
        .into_response())
}
