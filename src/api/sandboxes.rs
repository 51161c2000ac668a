//! Sandbox routes: create or reconnect, list, get, and the `{id}:stop` /
//! `{id}:restart` actions.

use std::sync::Arc;

use axum::extract::State;

use super::dto;
use super::error::ApiError;
use super::extract::{Json, Path};
use crate::app::App;
use crate::sandbox::spec::CreateSandboxRequest;

/// `POST /v1/sandboxes`
pub(super) async fn create_sandbox(
    State(app): State<Arc<App>>,
    Json(req): Json<CreateSandboxRequest>,
) -> Result<axum::Json<dto::SandboxCreated>, ApiError> {
    let created = app.create_sandbox(req).await?;
    Ok(axum::Json(created.into()))
}

/// `GET /v1/sandboxes`
pub(super) async fn list_sandboxes(
    State(app): State<Arc<App>>,
) -> Result<axum::Json<dto::SandboxList>, ApiError> {
    let list = app.sandboxes.list().await?;
    Ok(axum::Json(list.into()))
}

/// `GET /v1/sandboxes/{id}`
pub(super) async fn get_sandbox(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<axum::Json<dto::Sandbox>, ApiError> {
    let info = app.sandboxes.get(&id).await?;
    Ok(axum::Json(info.into()))
}

/// `POST /v1/sandboxes/{id}:stop` and `POST /v1/sandboxes/{id}:restart`. The
/// router cannot split a segment at a colon, so the action is parsed here.
pub(super) async fn sandbox_action(
    State(app): State<Arc<App>>,
    Path(segment): Path<String>,
) -> Result<axum::Json<dto::Done>, ApiError> {
    let Some((id, action)) = segment.rsplit_once(':') else {
        return Err(ApiError::method_not_allowed(
            "POST on a sandbox needs an action: {id}:stop or {id}:restart",
        ));
    };
    match action {
        "stop" => app.sandboxes.stop(id).await?,
        "restart" => app.sandboxes.restart(id).await?,
        other => {
            return Err(ApiError::not_found(format!(
                "unknown sandbox action {other:?}; use :stop or :restart"
            )));
        }
    }
    Ok(axum::Json(dto::Done::new()))
}
