//! Sandbox routes: create or reconnect, list, get, and the `{id}:stop` /
//! `{id}:restart` actions.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::error::ApiError;
use super::extract::{Json, Path};
use crate::app::App;
use crate::sandbox::spec::CreateSandboxRequest;

/// `POST /v1/sandboxes`
pub(super) async fn create_sandbox(
    State(app): State<Arc<App>>,
    Json(req): Json<CreateSandboxRequest>,
) -> Result<Response, ApiError> {
    let created = app.sandboxes.create(req).await?;
    // Publish the allowlisted ports in the background; the answer does
    // not wait for it.
    if created.ports_added {
        let prepare = Arc::clone(&app);
        let id = created.sandbox_id.clone();
        tokio::spawn(async move { prepare.ports.prepare(&id).await });
    }
    Ok(
        axum::Json(json!({"sandboxId": created.sandbox_id, "created": created.created}))
            .into_response(),
    )
}

/// `GET /v1/sandboxes`
pub(super) async fn list_sandboxes(State(app): State<Arc<App>>) -> Result<Response, ApiError> {
    let list = app.sandboxes.list().await?;
    Ok(axum::Json(json!({ "sandboxes": list })).into_response())
}

/// `GET /v1/sandboxes/{id}`
pub(super) async fn get_sandbox(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let view = app.sandboxes.get(&id).await?;
    Ok(axum::Json(view).into_response())
}

/// `POST /v1/sandboxes/{id}:stop` and `POST /v1/sandboxes/{id}:restart`. The
/// router cannot split a segment at a colon, so the action is parsed here.
pub(super) async fn sandbox_action(
    State(app): State<Arc<App>>,
    Path(segment): Path<String>,
) -> Result<Response, ApiError> {
    let Some((id, action)) = segment.rsplit_once(':') else {
        return Err(ApiError::new(
            axum::http::StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
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
    Ok(axum::Json(json!({"ok": true})).into_response())
}
