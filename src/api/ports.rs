//! `GET /v1/sandboxes/{id}/ports/{port}`: the URL of a sandbox port.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, header};
use serde::Deserialize;
use utoipa::IntoParams;

use super::dto;
use super::error::ApiError;
use super::extract::{Path, Query};
use crate::app::App;
use crate::ports::MAX_WAIT_MS;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct PortQuery {
    /// 0–60000: wait up to this long for something to accept connections
    /// on the port inside the sandbox; the answer then has `ready`.
    #[serde(default)]
    wait_ms: Option<u64>,
}

/// Publishes the port if needed and answers its URL.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports/{port}", tags = ["ports", "compat"],
    extensions(("x-compat" = json!(true))),
    summary = "The URL of a sandbox port, published if needed",
    params(("id" = String, Path, description = "The sandboxId"), ("port" = u16, Path, minimum = 1, description = "1–65535"), PortQuery),
    responses((status = 200, description = "`found: false` when the port is not allowed", body = dto::PortUrl)))]
pub(super) async fn port_url(
    State(app): State<Arc<App>>,
    Path((id, port)): Path<(String, String)>,
    Query(q): Query<PortQuery>,
    headers: HeaderMap,
) -> Result<axum::Json<dto::PortUrl>, ApiError> {
    let port: u16 = Some(port.as_str())
        .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|p| p.parse().ok())
        .filter(|p| *p >= 1)
        .ok_or_else(|| {
            ApiError::bad_request(format!("port: {port:?} is not a number from 1 to 65535"))
        })?;
    if q.wait_ms.is_some_and(|w| w > MAX_WAIT_MS) {
        return Err(ApiError::bad_request(format!(
            "waitMs: at most {MAX_WAIT_MS}"
        )));
    }
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let answer = app
        .ports
        .publish(&id, port, host, q.wait_ms.map(Duration::from_millis))
        .await?;
    Ok(axum::Json(answer.into()))
}
