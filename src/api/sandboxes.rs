//! Sandbox routes: create or reconnect, list, get, and the `{id}:stop`,
//! `{id}:restart`, `{id}:pause` and `{id}:resume` actions.

use std::sync::Arc;

use axum::extract::State;

use super::dto;
use super::error::ApiError;
use super::extract::{Json, Path, Query};
use crate::app::App;
use crate::sandbox::metadata;
use crate::sandbox::spec::CreateSandboxRequest;

/// `POST /v1/sandboxes`
#[utoipa::path(post, path = "/v1/sandboxes", tags = ["sandboxes", "compat"],
    extensions(("x-compat" = json!(true))),
    summary = "Create the session's sandbox, or reconnect to it", request_body = CreateSandboxRequest,
    responses((status = 200, description = "`created: false` when the session already had one", body = dto::SandboxCreated)))]
pub(super) async fn create_sandbox(
    State(app): State<Arc<App>>,
    Json(mut req): Json<CreateSandboxRequest>,
) -> Result<axum::Json<dto::SandboxCreated>, ApiError> {
    let created = match req.from.take() {
        None => app.create_sandbox(req).await?,
        Some(from) => app.fork_sandbox(req, from).await?,
    };
    Ok(axum::Json(created.into()))
}

/// `GET /v1/sandboxes`
#[utoipa::path(get, path = "/v1/sandboxes", tags = ["sandboxes"], summary = "List sandboxes",
    params(("metadata.KEY" = Option<String>, Query, description = "Only sandboxes whose metadata has KEY with this value; several must all hold")),
    responses((status = 200, description = "Ordered by createdAt", body = dto::SandboxList)))]
pub(super) async fn list_sandboxes(
    State(app): State<Arc<App>>,
    Query(query): Query<Vec<(String, String)>>,
) -> Result<axum::Json<dto::SandboxList>, ApiError> {
    let wanted = metadata::filter_of(query).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let list = app.sandboxes.list_matching(&wanted).await?;
    Ok(axum::Json(list.into()))
}

/// `GET /v1/sandboxes/{id}`
#[utoipa::path(get, path = "/v1/sandboxes/{id}", tags = ["sandboxes"], summary = "One sandbox",
    params(("id" = String, Path, description = "The sandboxId")), responses((status = 200, description = "The sandbox", body = dto::Sandbox)))]
pub(super) async fn get_sandbox(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<axum::Json<dto::Sandbox>, ApiError> {
    let info = app.sandboxes.get(&id).await?;
    Ok(axum::Json(info.into()))
}

/// `POST /v1/sandboxes/{id}:stop`, `:restart`, `:pause` and `:resume`. The
/// router cannot split a segment at a colon, so the action is parsed here.
pub(super) async fn sandbox_action(
    State(app): State<Arc<App>>,
    Path(segment): Path<String>,
) -> Result<axum::Json<dto::Done>, ApiError> {
    let Some((id, action)) = segment.rsplit_once(':') else {
        return Err(ApiError::method_not_allowed(
            "POST on a sandbox needs an action: {id}:stop, :restart, :pause or :resume",
        ));
    };
    match action {
        "stop" => stop(&app, id).await,
        "restart" => restart(&app, id).await,
        "pause" => pause(&app, id).await,
        "resume" => resume(&app, id).await,
        other => Err(ApiError::not_found(format!(
            "unknown sandbox action {other:?}; use :stop, :restart, :pause or :resume"
        ))),
    }
}

/// `POST /v1/sandboxes/{id}:pause`
#[utoipa::path(post, path = "/v1/sandboxes/{id}:pause", tags = ["sandboxes"],
    operation_id = "pause_sandbox",
    summary = "Freeze every process of the sandbox: memory kept, no CPU, until `:resume`",
    params(("id" = String, Path, description = "The sandboxId")),
    responses((status = 200, description = "Paused (409 `sandbox_paused` when it was already)", body = dto::Done)))]
async fn pause(app: &App, id: &str) -> Result<axum::Json<dto::Done>, ApiError> {
    app.sandboxes.pause(id).await?;
    Ok(axum::Json(dto::Done::new()))
}

/// `POST /v1/sandboxes/{id}:resume`
#[utoipa::path(post, path = "/v1/sandboxes/{id}:resume", tags = ["sandboxes"],
    operation_id = "resume_sandbox",
    summary = "Thaw a paused sandbox: its processes go on where they were",
    params(("id" = String, Path, description = "The sandboxId")),
    responses((status = 200, description = "Resumed (409 `sandbox_not_paused` when it was not paused)", body = dto::Done)))]
async fn resume(app: &App, id: &str) -> Result<axum::Json<dto::Done>, ApiError> {
    app.resume_sandbox(id).await?;
    Ok(axum::Json(dto::Done::new()))
}

/// `POST /v1/sandboxes/{id}:stop`
#[utoipa::path(post, path = "/v1/sandboxes/{id}:stop", tags = ["sandboxes", "compat"],
    operation_id = "stop_sandbox",
    extensions(("x-compat" = json!(true))),
    summary = "Remove the sandbox, its proxies and its workspace (idempotent)", params(("id" = String, Path, description = "The sandboxId")),
    responses((status = 200, description = "Removed, or there was nothing to remove", body = dto::Done)))]
async fn stop(app: &App, id: &str) -> Result<axum::Json<dto::Done>, ApiError> {
    app.sandboxes.stop(id).await?;
    Ok(axum::Json(dto::Done::new()))
}

/// `POST /v1/sandboxes/{id}:restart`
#[utoipa::path(post, path = "/v1/sandboxes/{id}:restart", tags = ["sandboxes"],
    operation_id = "restart_sandbox",
    summary = "Restart the container: every process ends, the workspace stays (a tmpfs one is emptied)", params(("id" = String, Path, description = "The sandboxId")),
    responses((status = 200, description = "Restarted", body = dto::Done)))]
async fn restart(app: &App, id: &str) -> Result<axum::Json<dto::Done>, ApiError> {
    app.sandboxes.restart(id).await?;
    Ok(axum::Json(dto::Done::new()))
}
