//! `GET /v1/health`: the one route without a token. Answers within about two
//! seconds whatever the engine does.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::dto;
use crate::app::App;

/// 200 with the engine version, or 503 saying why not.
#[utoipa::path(get, path = "/v1/health", tags = ["health", "compat"],
    extensions(("x-compat" = json!(true))), security(()),
    summary = "Whether the engine answers (no token needed)",
    responses(
        (status = 200, description = "The engine answers", body = dto::Healthy),
        (status = 503, description = "It does not", body = dto::Unhealthy)))]
pub(super) async fn health(State(app): State<Arc<App>>) -> Response {
    match app.engine_version().await {
        Ok(version) => Json(dto::Healthy {
            ok: true,
            engine: "docker",
            version,
        })
        .into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(dto::Unhealthy {
                ok: false,
                engine: "docker",
                error: e,
            }),
        )
            .into_response(),
    }
}
