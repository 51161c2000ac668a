//! Terminal session routes: open, list, kill, attach tickets, and the
//! WebSocket a viewer attaches with. The socket is adapted here to the
//! domain's viewer streams (binary frames are terminal bytes; text frames
//! are JSON control messages); the domain serves it.

use std::sync::Arc;

use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, close_code};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use utoipa::IntoParams;

use super::auth;
use super::dto;
use super::error::{ApiError, ErrorCode};
use super::extract::{Json, Path, Query};
use crate::app::App;
use crate::pty::{MAX_WINDOW, OUTPUT_CHUNK, PtyRequest, ViewerEvent, ViewerInput};

/// Largest WebSocket message or frame a viewer may send.
const MAX_VIEWER_MESSAGE: usize = 64 * 1024;

/// `POST /v1/sandboxes/{id}/ptys`
#[utoipa::path(post, path = "/v1/sandboxes/{id}/ptys", tags = ["ptys"],
    summary = "Start a terminal session", params(("id" = String, Path, description = "The sandboxId")),
    request_body = PtyRequest,
    responses((status = 201, description = "Started", body = dto::PtyOpened)))]
pub(super) async fn open_pty(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Json(body): Json<PtyRequest>,
) -> Result<(StatusCode, axum::Json<dto::PtyOpened>), ApiError> {
    let pty_id = app.ptys.open(&id, body).await?;
    Ok((StatusCode::CREATED, axum::Json(dto::PtyOpened { pty_id })))
}

/// `GET /v1/sandboxes/{id}/ptys`
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ptys", tags = ["ptys"],
    summary = "List terminal sessions, oldest first", params(("id" = String, Path, description = "The sandboxId")),
    responses((status = 200, description = "Running ones, and ended ones for the command retention time", body = dto::PtyList)))]
pub(super) async fn list_ptys(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<axum::Json<dto::PtyList>, ApiError> {
    let list = app.ptys.list(&id).await?;
    Ok(axum::Json(dto::PtyList::from(list)))
}

/// `POST …/ptys/{ptyId}:kill` and `…:ticket` (this route is outside the
/// token layer, for the attach beside it; the layer is on this handler).
pub(super) async fn pty_action(
    State(app): State<Arc<App>>,
    Path((id, segment)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    match segment.rsplit_once(':') {
        Some((pty, "kill")) => kill_pty(&app, &id, pty)
            .await
            .map(IntoResponse::into_response),
        Some((pty, "ticket")) => pty_ticket(&app, &id, pty)
            .await
            .map(IntoResponse::into_response),
        _ => Err(ApiError::not_found(
            "unknown terminal session action; use POST …/ptys/{ptyId}:kill or :ticket",
        )),
    }
}

/// `POST /v1/sandboxes/{id}/ptys/{ptyId}:kill`
#[utoipa::path(post, path = "/v1/sandboxes/{id}/ptys/{ptyId}:kill", tags = ["ptys"],
    summary = "End a terminal session's process tree",
    params(("id" = String, Path, description = "The sandboxId"), ("ptyId" = String, Path, description = "The ptyId")),
    responses((status = 200, description = "SIGTERM is on its way", body = dto::Done)))]
async fn kill_pty(app: &App, id: &str, pty: &str) -> Result<axum::Json<dto::Done>, ApiError> {
    app.ptys.kill(id, pty).await?;
    Ok(axum::Json(dto::Done::new()))
}

/// `POST /v1/sandboxes/{id}/ptys/{ptyId}:ticket`
#[utoipa::path(post, path = "/v1/sandboxes/{id}/ptys/{ptyId}:ticket", tags = ["ptys"],
    summary = "A single-use ticket to attach to a session without the token (for browsers)",
    params(("id" = String, Path, description = "The sandboxId"), ("ptyId" = String, Path, description = "The ptyId")),
    responses((status = 200, description = "Good for one attach within expiresInMs", body = dto::PtyTicket)))]
async fn pty_ticket(
    app: &App,
    id: &str,
    pty: &str,
) -> Result<axum::Json<dto::PtyTicket>, ApiError> {
    let t = app.ptys.ticket(id, pty).await?;
    Ok(axum::Json(dto::PtyTicket {
        ticket: t.ticket,
        expires_in_ms: t.expires_in_ms,
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct AttachQuery {
    /// A ticket from `…:ticket`, instead of the token's headers.
    #[serde(default)]
    ticket: Option<String>,
}

/// `GET /v1/sandboxes/{id}/ptys/{ptyId}` with a WebSocket upgrade.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ptys/{ptyId}", tags = ["ptys"],
    operation_id = "attach_pty",
    summary = "Attach to a terminal session (WebSocket): binary frames are terminal bytes both ways, text frames JSON control messages",
    params(("id" = String, Path, description = "The sandboxId"), ("ptyId" = String, Path, description = "The ptyId"), AttachQuery),
    security((), ("adminToken" = []), ("remcochatToken" = []), ("bearer" = [])),
    responses((status = 101, description = "Switching to the WebSocket protocol")))]
pub(super) async fn attach_pty(
    State(app): State<Arc<App>>,
    Path((id, pty)): Path<(String, String)>,
    Query(q): Query<AttachQuery>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let by_token = auth::presented(&app, &headers);
    // A ticket is used up when presented, whatever follows.
    let by_ticket = q
        .ticket
        .as_deref()
        .is_some_and(|t| app.ptys.redeem(t, &id, &pty));
    if !by_token && !by_ticket {
        return Err(ApiError::new(
            ErrorCode::Unauthorized,
            "attaching needs the admin token's headers or an unused, unexpired ticket from …/ptys/{ptyId}:ticket",
        ));
    }
    let upgrade = upgrade
        .map_err(|e| ApiError::bad_request(format!("attaching needs a WebSocket upgrade: {e}")))?;
    let sandbox = app.ptys.check(&id, &pty).await?;
    Ok(upgrade
        .max_message_size(MAX_VIEWER_MESSAGE)
        .max_frame_size(MAX_VIEWER_MESSAGE)
        .on_upgrade(move |socket| async move {
            let (sink, stream) = split(socket);
            app.ptys.view(sandbox, pty, stream, sink).await;
        }))
}

/// The socket as the domain's viewer streams: frames in become input
/// (a close or an error ends the input), events out become frames, the
/// session's end followed by a normal close.
fn split(
    socket: WebSocket,
) -> (
    impl futures_util::Sink<ViewerEvent> + Unpin,
    impl futures_util::Stream<Item = ViewerInput> + Unpin,
) {
    let (sink, stream) = socket.split();
    let input = stream
        .take_while(|m| std::future::ready(matches!(m, Ok(m) if !matches!(m, Message::Close(_)))))
        .filter_map(|m| std::future::ready(m.ok().map(viewer_input)));
    let output = sink.with_flat_map(|ev: ViewerEvent| {
        futures_util::stream::iter(frames(ev).into_iter().map(Ok))
    });
    (Box::pin(output), input.boxed())
}

/// What a frame from a viewer means.
fn viewer_input(m: Message) -> ViewerInput {
    match m {
        Message::Binary(b) => ViewerInput::Bytes(b),
        Message::Text(t) => match serde_json::from_str::<dto::PtyControl>(t.as_str()) {
            Ok(dto::PtyControl::Resize { cols, rows })
                if (1..=MAX_WINDOW).contains(&cols) && (1..=MAX_WINDOW).contains(&rows) =>
            {
                ViewerInput::Resize { cols, rows }
            }
            _ => ViewerInput::Other,
        },
        _ => ViewerInput::Other,
    }
}

/// The frames an event is sent as.
fn frames(ev: ViewerEvent) -> Vec<Message> {
    let text =
        |m: dto::PtyMessage| Message::Text(serde_json::to_string(&m).unwrap_or_default().into());
    let close = |code, reason: &'static str| {
        Message::Close(Some(CloseFrame {
            code,
            reason: reason.into(),
        }))
    };
    match ev {
        ViewerEvent::Output(b) => {
            debug_assert!(b.len() <= OUTPUT_CHUNK as usize);
            vec![Message::Binary(b)]
        }
        ViewerEvent::Writer(writer) => vec![text(dto::PtyMessage::Writer { writer })],
        ViewerEvent::Exit { exit_code, signal } => vec![
            text(dto::PtyMessage::Exit { exit_code, signal }),
            close(close_code::NORMAL, "the session ended"),
        ],
        ViewerEvent::Lagged { skipped } => vec![text(dto::PtyMessage::Lagged {
            skipped_bytes: skipped,
        })],
    }
}
