//! Sandbox routes: create or reconnect, list, get, and the `{id}:stop` /
//! `{id}:restart` actions.

use std::sync::Arc;

use axum::extract::State;
use serde::Deserialize;
use utoipa::ToSchema;

use super::dto;
use super::error::ApiError;
use super::extract::{Json, Path};
use crate::app::App;
use crate::sandbox::spec::{CreateSandboxRequest, NetworkRequest, ResourcesRequest};

/// `POST /v1/sandboxes` as the client sends it. Only `sessionKey` is
/// required; ranges are checked by the domain, which names the field.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct CreateSandbox {
    /// 1–256 characters; one sandbox per session key.
    session_key: String,
    /// A configured runtime name (`default`, `node24`, `python3.13`, …).
    #[serde(default)]
    runtime: Option<String>,
    /// 10000–21600000.
    #[serde(default)]
    idle_ttl_ms: Option<i64>,
    #[serde(default)]
    resources: Option<CreateResources>,
    #[serde(default)]
    network: Option<CreateNetwork>,
    /// Ports to allow (each 1–65535, at most `max_ports`).
    #[serde(default)]
    ports: Option<Vec<i64>>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct CreateResources {
    /// 1–8.
    #[serde(default)]
    vcpus: Option<i64>,
    /// 256–16384.
    #[serde(default)]
    memory_mb: Option<i64>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateNetwork {
    /// `default` (the server's `network_default`, out of the box
    /// `internet`), `none`, `internet`, `allowlist`, or `open` where the
    /// server enables it (`network_modes`).
    #[serde(default)]
    mode: Option<String>,
    /// Mode `allowlist` only: at most 64 domains (`pypi.org`,
    /// `*.npmjs.org`: any subdomain) and CIDRs (`203.0.113.0/24`, or one
    /// address) the sandbox may reach.
    #[serde(default)]
    allow: Option<Vec<String>>,
}

impl From<CreateSandbox> for CreateSandboxRequest {
    fn from(r: CreateSandbox) -> Self {
        CreateSandboxRequest {
            session_key: r.session_key,
            runtime: r.runtime,
            idle_ttl_ms: r.idle_ttl_ms,
            resources: r.resources.map(|x| ResourcesRequest {
                vcpus: x.vcpus,
                memory_mb: x.memory_mb,
            }),
            network: r.network.map(|n| NetworkRequest {
                mode: n.mode,
                allow: n.allow,
            }),
            ports: r.ports,
        }
    }
}

/// `POST /v1/sandboxes`
#[utoipa::path(post, path = "/v1/sandboxes", tags = ["sandboxes", "compat"],
    extensions(("x-compat" = json!(true))),
    summary = "Create the session's sandbox, or reconnect to it", request_body = CreateSandbox,
    responses((status = 200, description = "`created: false` when the session already had one", body = dto::SandboxCreated)))]
pub(super) async fn create_sandbox(
    State(app): State<Arc<App>>,
    Json(req): Json<CreateSandbox>,
) -> Result<axum::Json<dto::SandboxCreated>, ApiError> {
    let created = app.create_sandbox(req.into()).await?;
    Ok(axum::Json(created.into()))
}

/// `GET /v1/sandboxes`
#[utoipa::path(get, path = "/v1/sandboxes", tags = ["sandboxes"], summary = "List sandboxes",
    responses((status = 200, description = "Ordered by createdAt", body = dto::SandboxList)))]
pub(super) async fn list_sandboxes(
    State(app): State<Arc<App>>,
) -> Result<axum::Json<dto::SandboxList>, ApiError> {
    let list = app.sandboxes.list().await?;
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
        "stop" => stop(&app, id).await,
        "restart" => restart(&app, id).await,
        other => Err(ApiError::not_found(format!(
            "unknown sandbox action {other:?}; use :stop or :restart"
        ))),
    }
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
