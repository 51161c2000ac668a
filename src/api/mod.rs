//! The HTTP edge: routes, layers (tracing, body limit, auth) and JSON
//! fallbacks. Handlers parse into typed values, call the domain and map its
//! errors through [`ApiError`]; no engine type is visible here.

mod auth;
pub mod error;
mod extract;
mod health;
mod sandboxes;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{get, post};
use tower_http::trace::TraceLayer;

use crate::app::App;
use error::ApiError;

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
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&app),
            auth::require_token,
        ));

    Router::new()
        .route("/v1/health", get(health::health))
        .merge(protected)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(app.config.max_body_bytes))
        .layer(TraceLayer::new_for_http())
        .with_state(app)
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method",
    )
}
