//! Command routes: start, run, list, wait, kill, and the NDJSON log stream.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde_json::json;

use super::error::ApiError;
use super::extract::{Json, Path, Query};
use crate::app::App;
use crate::command::log::{Cursor, heartbeat_line};
use crate::command::spec::CommandRequest;

/// `POST /v1/sandboxes/{id}/commands`
pub(super) async fn start_command(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Json(req): Json<CommandRequest>,
) -> Result<Response, ApiError> {
    let cmd = app.commands.start(&id, req).await?;
    Ok(axum::Json(json!({"commandId": cmd.id})).into_response())
}

/// `POST /v1/sandboxes/{id}/commands:run`
pub(super) async fn run_command(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Json(req): Json<CommandRequest>,
) -> Result<Response, ApiError> {
    let out = app.commands.run(&id, req, &app.shutdown).await?;
    Ok(axum::Json(out).into_response())
}

/// `GET /v1/sandboxes/{id}/commands`
pub(super) async fn list_commands(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let list = app.commands.list(&id).await?;
    Ok(axum::Json(json!({ "commands": list })).into_response())
}

/// `GET /v1/sandboxes/{id}/commands/{cid}/wait`
pub(super) async fn wait_command(
    State(app): State<Arc<App>>,
    Path((id, cid)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let done = app.commands.wait(&id, &cid, &app.shutdown).await?;
    Ok(axum::Json(done).into_response())
}

/// `POST /v1/sandboxes/{id}/commands/{cid}:kill`
pub(super) async fn command_action(
    State(app): State<Arc<App>>,
    Path((id, segment)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    match segment.rsplit_once(':') {
        Some((cid, "kill")) => {
            app.commands.kill(&id, cid).await?;
            Ok(axum::Json(json!({"ok": true})).into_response())
        }
        _ => Err(ApiError::not_found(
            "unknown command action; use POST …/commands/{commandId}:kill",
        )),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LogsQuery {
    #[serde(default)]
    after: Option<u64>,
}

struct LogStream {
    app: Arc<App>,
    cmd: Arc<crate::command::Command>,
    cursor: Cursor,
    rx: tokio::sync::watch::Receiver<u64>,
    pending: VecDeque<Bytes>,
    done: bool,
    _busy: crate::sandbox::registry::OpenRequest,
}

/// `GET /v1/sandboxes/{id}/commands/{cid}/logs`: replay, then follow.
pub(super) async fn stream_logs(
    State(app): State<Arc<App>>,
    Path((id, cid)): Path<(String, String)>,
    Query(q): Query<LogsQuery>,
) -> Result<Response, ApiError> {
    let (sandbox, cmd) = app.commands.get(&id, &cid).await?;
    if cmd.is_lost() {
        return Err(crate::command::CommandError::Lost(cmd.id.clone()).into());
    }
    let state = LogStream {
        rx: cmd.log.subscribe(),
        cursor: Cursor::after(q.after.unwrap_or(0)),
        app: Arc::clone(&app),
        cmd,
        pending: VecDeque::new(),
        done: false,
        _busy: sandbox.open_request(),
    };
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(chunk) = st.pending.pop_front() {
                return Some((Ok::<_, std::convert::Infallible>(chunk), st));
            }
            if st.done {
                return None;
            }
            // Mark as seen before reading, so an append after the read
            // still wakes us.
            st.rx.borrow_and_update();
            let batch = st.cmd.log.read(&mut st.cursor);
            st.done = batch.done;
            if !batch.lines.is_empty() {
                let mut buf = BytesMut::with_capacity(batch.lines.iter().map(Bytes::len).sum());
                for line in batch.lines {
                    buf.extend_from_slice(&line);
                }
                st.pending.push_back(buf.freeze());
                continue;
            }
            if st.done {
                return None;
            }
            tokio::select! {
                changed = st.rx.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                }
                _ = tokio::time::sleep(Duration::from_millis(st.app.config.log_heartbeat_ms)) => {
                    st.pending.push_back(heartbeat_line(st.cursor.after));
                }
                _ = st.app.shutdown.cancelled() => return None,
            }
        }
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}
