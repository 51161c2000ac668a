//! Requests whose `Host` names a sandbox port (`PORT-ID.DOMAIN`, the names
//! E2B's `get_host(port)` builds): forwarded by `Ports::forward`, with no
//! API key (like a port's own URL), and answered in the shape of E2B's
//! own proxy when they cannot be: `{sandboxId, port, code, message}`, 502
//! for a sandbox that is gone or a port nothing answers on.

use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::e2b::port_opening;
use super::error::{ApiError, ErrorCode};
use crate::app::App;
use crate::origin_policy::PortHost;
use crate::ports::ForwardError;

/// An answer in place of the port's, as E2B's proxy gives it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Unreachable {
    sandbox_id: String,
    port: u16,
    code: u16,
    message: String,
}

/// Forwards `req` to the port `target` names.
pub(super) async fn forward(app: &App, target: PortHost, req: Request) -> Response {
    let forwarded = app
        .ports
        .forward(&target.sandbox_id, target.port, port_opening, req)
        .await;
    forwarded.unwrap_or_else(|e| unreachable(target, e))
}

fn unreachable(target: PortHost, e: ForwardError) -> Response {
    let (status, message) = match e {
        ForwardError::Port(e) => {
            let e = ApiError::from(e);
            if e.code == ErrorCode::SandboxNotFound {
                (
                    StatusCode::BAD_GATEWAY,
                    format!("The sandbox {} was not found", target.sandbox_id),
                )
            } else {
                (e.code.status(), e.message)
            }
        }
        e @ ForwardError::NotAnswering(_) => (StatusCode::BAD_GATEWAY, e.to_string()),
        e @ (ForwardError::NotAllowed(_) | ForwardError::TooManyPorts { .. }) => {
            (StatusCode::FORBIDDEN, e.to_string())
        }
    };
    let body = Unreachable {
        sandbox_id: target.sandbox_id,
        port: target.port,
        code: status.as_u16(),
        message,
    };
    (status, axum::Json(body)).into_response()
}
