//! The HTTP edge: routes, layers (tracing, body limit, auth) and JSON
//! fallbacks. Handlers parse into typed values, call the domain and map its
//! errors through [`ApiError`]; no engine type is visible here.

mod auth;
mod checkpoints;
mod commands;
mod dto;
mod e2b;
pub mod error;
mod extract;
mod files;
mod health;
mod mcp;
pub mod openapi;
mod port_host;
mod ports;
mod ptys;
mod sandboxes;
mod tokens;
mod ui;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::handler::Handler;
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, delete, get, post};
use tower_http::request_id::{PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

use crate::app::App;
use crate::telemetry;
use error::{ApiError, ErrorCode};

/// The whole API.
pub fn router(app: Arc<App>) -> Router {
    let protected = Router::new()
        .route(
            "/v1/sandboxes",
            post(sandboxes::create_sandbox).get(sandboxes::list_sandboxes),
        )
        .route(
            "/v1/sandboxes/{id}",
            get(sandboxes::get_sandbox).post(sandboxes::sandbox_action),
        )
        .route(
            "/v1/sandboxes/{id}/commands",
            post(commands::start_command).get(commands::list_commands),
        )
        .route(
            "/v1/sandboxes/{id}/commands:run",
            post(commands::run_command),
        )
        .route(
            "/v1/sandboxes/{id}/commands/{cid}",
            post(commands::command_action),
        )
        .route(
            "/v1/sandboxes/{id}/commands/{cid}/stdin",
            post(commands::send_stdin),
        )
        .route(
            "/v1/sandboxes/{id}/commands/{cid}/wait",
            get(commands::wait_command),
        )
        .route(
            "/v1/sandboxes/{id}/commands/{cid}/logs",
            get(commands::stream_logs),
        )
        .route("/v1/sandboxes/{id}/files:read", get(files::read_file))
        .route("/v1/sandboxes/{id}/files:write", post(files::write_files))
        .route("/v1/sandboxes/{id}/files:list", get(files::list_files))
        .route("/v1/sandboxes/{id}/files:delete", post(files::delete_files))
        .route("/v1/sandboxes/{id}/files:move", post(files::move_file))
        .route("/v1/sandboxes/{id}/files:mkdir", post(files::make_dir))
        .route("/v1/sandboxes/{id}/files:stat", post(files::stat_files))
        .route("/v1/sandboxes/{id}/files:search", post(files::search_files))
        .route("/v1/sandboxes/{id}/files:edit", post(files::edit_file))
        .route("/v1/sandboxes/{id}/files:watch", get(files::watch_files))
        .route(
            "/v1/sandboxes/{id}/checkpoints",
            post(checkpoints::create_checkpoint).get(checkpoints::list_checkpoints),
        )
        .route(
            "/v1/sandboxes/{id}/checkpoints/{cp}",
            post(checkpoints::checkpoint_action).delete(checkpoints::delete_checkpoint),
        )
        .route(
            "/v1/sandboxes/{id}/checkpoints/{cp}/diff",
            get(checkpoints::diff_checkpoint),
        )
        .route("/v1/sandboxes/{id}/ports/{port}", get(ports::port_url))
        .route(
            "/v1/sandboxes/{id}/ptys",
            post(ptys::open_pty).get(ptys::list_ptys),
        )
        .route(
            "/v1/sessions/{sessionKey}/tokens",
            post(tokens::issue_token)
                .get(tokens::list_tokens)
                .delete(tokens::revoke_tokens),
        )
        .route(
            "/v1/sessions/{sessionKey}/tokens/{tokenId}",
            delete(tokens::revoke_token),
        )
        .route("/metrics", get(metrics))
        .route("/v1/openapi.json", get(openapi::serve))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&app),
            auth::require_token,
        ));

    // Attaching takes the token or a ticket, so the token layer sits on
    // the actions beside it, not on the route.
    let token_layer = axum::middleware::from_fn_with_state(Arc::clone(&app), auth::require_token);
    // The MCP dialect (rmcp answers POST, GET and DELETE itself) takes the
    // admin token or a token of that session.
    let session_layer =
        axum::middleware::from_fn_with_state(Arc::clone(&app), auth::require_session_access);
    let routes = Router::new()
        .route(HEALTH, get(health::health))
        // The web console's files: no token (every API call it makes
        // carries one), the Host and Origin checks below as everywhere.
        .route("/ui", get(ui::redirect))
        .route("/ui/", get(ui::index))
        .route("/ui/{*path}", get(ui::asset))
        .route(
            "/v1/sessions/{sessionKey}/mcp",
            any(mcp::endpoint)
                .layer(axum::Extension(mcp::service(Arc::clone(&app))))
                .layer(session_layer),
        )
        .route(
            "/v1/sandboxes/{id}/ptys/{pty}",
            get(ptys::attach_pty).post(ptys::pty_action.layer(token_layer)),
        )
        .merge(protected)
        // E2B's SDKs: its control plane and envd, each with its own
        // credentials (see `e2b`).
        .merge(e2b::routes(&app))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // A declared length over the limit is refused before reading; a
        // chunked body is cut off once it passes the limit while read.
        .layer(DefaultBodyLimit::max(app.config.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&app),
            refuse_declared_oversize,
        ));
    // CORS headers only for the origins an operator listed; without any a
    // browser's cross-origin call fails its preflight.
    let cors_origins = app.config.origin_policy.cors_origins();
    let routes = if cors_origins.is_empty() {
        routes
    } else {
        routes.layer(cors(&cors_origins))
    };
    routes
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&app),
            check_host_and_origin,
        ))
        .layer(axum::middleware::from_fn(telemetry::track_http))
        // Every request gets an id (or keeps the caller's), which its log
        // lines carry and the answer returns in x-request-id.
        .layer(
            TraceLayer::new_for_http().make_span_with(|req: &axum::http::Request<_>| {
                let id = req
                    .headers()
                    .get("x-request-id")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                tracing::info_span!("request", request_id = %id, method = %req.method(), uri = %req.uri().path())
            }),
        )
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(SetRequestIdLayer::x_request_id(telemetry::RandomRequestId))
        .with_state(app)
}

/// `GET /metrics`: Prometheus text exposition.
#[utoipa::path(get, path = "/metrics", tags = ["metrics"], summary = "Prometheus metrics",
    responses((status = 200, content_type = "text/plain; version=0.0.4", body = String,
        description = "Prometheus text exposition")))]
async fn metrics(State(app): State<Arc<App>>) -> Response {
    let sandboxes = app.sandboxes.registry().list();
    let running: usize = sandboxes.iter().map(|s| s.running_commands()).sum();
    telemetry::set_gauges(
        sandboxes.len(),
        running,
        &app.sandboxes.pool_sizes(),
        app.sandboxes.link_networks_ahead(),
        app.sandboxes.teardowns_pending(),
    );
    let body = app.metrics.as_ref().map(|h| h.render()).unwrap_or_default();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

/// The route every Host may ask: load balancers check it by their own name.
const HEALTH: &str = "/v1/health";

/// Refuses a request whose `Host` names another server (a page that
/// rebound its own name to our address) or whose `Origin` is another site,
/// token or not, before anything else reads it. `GET /v1/health` answers
/// any Host. A `Host` naming a sandbox port sends the request there.
async fn check_host_and_origin(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let text = |v: &header::HeaderValue| v.to_str().unwrap_or("\u{fffd}").to_string();
    // An absolute-form target's authority overrides Host (RFC 9112 3.2.2).
    let host = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_string())
        .or_else(|| req.headers().get(header::HOST).map(text));
    let origin = req.headers().get(header::ORIGIN).map(text);
    let policy = &app.config.origin_policy;
    if let Some(target) = policy.port_host(host.as_deref()) {
        return port_host::forward(&app, target, req).await;
    }
    let checked = if req.uri().path() == HEALTH {
        Ok(())
    } else {
        policy.check_host(host.as_deref())
    }
    .and_then(|()| policy.check_origin(host.as_deref(), origin.as_deref()));
    match checked {
        Ok(()) => next.run(req).await,
        Err(refusal) => ApiError::from(refusal).into_response(),
    }
}

/// Answers preflights and labels answers for the listed origins.
fn cors(origins: &[String]) -> tower_http::cors::CorsLayer {
    use axum::http::{HeaderName, HeaderValue, Method};
    let origins: Vec<HeaderValue> = origins
        .iter()
        .filter_map(|o| HeaderValue::from_str(o).ok())
        .collect();
    tower_http::cors::CorsLayer::new()
        .allow_origin(origins)
        .allow_methods([Method::GET, Method::POST, Method::DELETE])
        .allow_headers([
            header::CONTENT_TYPE,
            header::AUTHORIZATION,
            HeaderName::from_static("x-sandboxd-admin-token"),
            HeaderName::from_static("x-remcochat-admin-token"),
            HeaderName::from_static("x-request-id"),
        ])
        .expose_headers([HeaderName::from_static("x-request-id")])
        .max_age(std::time::Duration::from_secs(600))
}

async fn refuse_declared_oversize(
    State(app): State<Arc<App>>,
    req: Request,
    next: Next,
) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > app.config.max_body_bytes as u64 => {
            let mut resp = ApiError::new(
                ErrorCode::BodyTooLarge,
                format!(
                    "the request body ({n} bytes) is larger than max_body_bytes ({})",
                    app.config.max_body_bytes
                ),
            )
            .into_response();
            // The body stays unread: the connection cannot be reused.
            resp.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
            resp
        }
        _ => next.run(req).await,
    }
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed("this route does not take that method")
}
