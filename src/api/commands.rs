//! Command routes: start, run, list, wait, kill, and the NDJSON log stream.

use std::collections::BTreeMap;
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
use crate::command::spec::{CommandRequest, OutputRequest};

/// `POST …/commands` and `…/commands:run` bodies. Exactly one of `cmd` and
/// `command` is required; the domain checks the rules and names the field.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct CommandBody {
    /// A program; run with `args` as its argv, without re-parsing.
    #[serde(default)]
    cmd: Option<String>,
    /// Only with `cmd`.
    #[serde(default)]
    args: Option<Vec<String>>,
    /// A shell script, instead of `cmd`.
    #[serde(default)]
    command: Option<String>,
    /// Default `bash`.
    #[serde(default)]
    shell: Option<String>,
    /// Default `true`: a login shell.
    #[serde(default)]
    login: Option<bool>,
    /// Workspace-relative or absolute under the workspace; created if missing.
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    env: Option<BTreeMap<String, String>>,
    /// Text the command reads as its stdin.
    #[serde(default)]
    stdin: Option<String>,
    /// At least 1; capped to `max_timeout_ms` (the answer gives the
    /// effective value).
    #[serde(default)]
    timeout_ms: Option<i64>,
    /// Accepted and ignored: every command runs detached from the request.
    #[serde(default)]
    detached: Option<bool>,
    /// Only used by `commands:run`: bytes of each stream's tail to return
    /// (0–16777216).
    #[serde(default)]
    max_output_bytes: Option<i64>,
    /// Each stream shaped for a model: in the `commands:run` answer and in
    /// the `exit` record of the log. Not with `maxOutputBytes`.
    #[serde(default)]
    output: Option<OutputBody>,
    /// Report the files the command created, modified and deleted in the
    /// workspace by its end: in the `commands:run` answer and in the
    /// `exit` record of its log.
    #[serde(default)]
    #[schema(value_type = Option<ChangesParam>)]
    changes: Option<serde_json::Value>,
}

/// `output`: how to shape each stream.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct OutputBody {
    /// Most characters of each shaped stream (256–1000000), the line that
    /// says what was omitted included.
    max_chars: i64,
    /// Characters given to the head (0 to `maxChars` − 80); default a
    /// quarter of `maxChars`.
    #[serde(default)]
    head_chars: Option<i64>,
    /// Keep escape sequences and carriage returns; default `false`
    /// (collapsed).
    #[serde(default)]
    raw: Option<bool>,
}

/// `changes`: `true` (ignore `.git`, `node_modules`, `__pycache__` and
/// `.venv`, list up to 1000), `false` (the default: no report), or options.
#[derive(Debug, ToSchema)]
#[serde(untagged)]
#[allow(
    dead_code,
    reason = "it describes the field; the domain parses it and names the field it refuses"
)]
enum ChangesParam {
    On(bool),
    With(ChangesOptions),
}

/// Options of `changes`; each left out keeps its default.
#[derive(Debug, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "it describes the field; the domain parses it and names the field it refuses"
)]
struct ChangesOptions {
    /// Directory names (no `/`) whose trees are left out, at any depth: at
    /// most 64, each 1–255 bytes. Replaces the default list.
    ignore: Option<Vec<String>>,
    /// Most changes listed, 1–10000 (default 1000); `more` counts the rest.
    #[schema(minimum = 1, maximum = 10000)]
    max: Option<u32>,
}

impl From<CommandBody> for CommandRequest {
    fn from(b: CommandBody) -> Self {
        CommandRequest {
            cmd: b.cmd,
            args: b.args,
            command: b.command,
            shell: b.shell,
            login: b.login,
            cwd: b.cwd,
            env: b.env,
            stdin: b.stdin,
            timeout_ms: b.timeout_ms,
            detached: b.detached,
            max_output_bytes: b.max_output_bytes,
            output: b.output.map(|o| OutputRequest {
                max_chars: o.max_chars,
                head_chars: o.head_chars,
                raw: o.raw,
            }),
            changes: b.changes,
        }
    }
}

/// `POST /v1/sandboxes/{id}/commands`
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands", tags = ["commands", "compat"],
    extensions(("x-compat" = json!(true))),
    summary = "Start a command", params(("id" = String, Path, description = "The sandboxId")), request_body = CommandBody,
    responses((status = 200, description = "Started", body = dto::CommandStarted)))]
pub(super) async fn start_command(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Json(req): Json<CommandBody>,
) -> Result<axum::Json<dto::CommandStarted>, ApiError> {
    let cmd = app.commands.start(&id, req.into()).await?;
    Ok(axum::Json(dto::CommandStarted::from(&*cmd)))
}

/// `POST /v1/sandboxes/{id}/commands:run`
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands:run", tags = ["commands"],
    summary = "Run a command and answer when it has ended", params(("id" = String, Path, description = "The sandboxId")),
    request_body = CommandBody,
    responses((status = 200, description = "Ended, with the tails of its output", body = dto::CommandRun)))]
pub(super) async fn run_command(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Json(req): Json<CommandBody>,
) -> Result<axum::Json<dto::CommandRun>, ApiError> {
    let out = app.commands.run(&id, req.into(), &app.shutdown).await?;
    Ok(axum::Json(out.into()))
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

/// `POST /v1/sandboxes/{id}/commands/{cid}:kill`
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands/{cid}:kill", tags = ["commands", "compat"],
    operation_id = "kill_command",
    extensions(("x-compat" = json!(true))),
    summary = "End a command's whole process tree", params(("id" = String, Path, description = "The sandboxId"), ("cid" = String, Path, description = "The commandId")),
    responses((status = 200, description = "SIGTERM is on its way", body = dto::Done)))]
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
    responses((status = 200, content_type = "application/x-ndjson", body = super::openapi::LogRecord,
        description = "One LogRecord per line; the stream ends after the `exit` record (unless `leftovers`)")))]
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
