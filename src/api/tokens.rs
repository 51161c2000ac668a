//! Session token routes: make a token for one session, list a session's
//! live tokens (never their secrets), revoke one or all. They take the
//! admin token like every other route; a session token reaches only its
//! session's MCP endpoint (see `auth::require_session_access`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;

use super::dto;
use super::error::ApiError;
use super::extract::{Json, Path};
use crate::app::App;
use crate::session_tokens::TokenRequest;

/// `POST /v1/sessions/{sessionKey}/tokens`
#[utoipa::path(post, path = "/v1/sessions/{sessionKey}/tokens", tags = ["sessions"],
    summary = "Make a token that reaches this session only",
    params(("sessionKey" = String, Path, description = "The session key (1–256 characters, as in a create)")),
    request_body = TokenRequest,
    responses((status = 201, description = "Made and saved; the token is shown this once", body = dto::TokenIssued)))]
pub(super) async fn issue_token(
    State(app): State<Arc<App>>,
    Path(session_key): Path<String>,
    Json(body): Json<TokenRequest>,
) -> Result<(StatusCode, axum::Json<dto::TokenIssued>), ApiError> {
    let issued = app.session_tokens.issue(&session_key, body).await?;
    Ok((StatusCode::CREATED, axum::Json(issued.into())))
}

/// `GET /v1/sessions/{sessionKey}/tokens`
#[utoipa::path(get, path = "/v1/sessions/{sessionKey}/tokens", tags = ["sessions"],
    summary = "List the session's live tokens, oldest first, without their secrets",
    params(("sessionKey" = String, Path, description = "The session key")),
    responses((status = 200, description = "The live tokens", body = dto::SessionTokenList)))]
pub(super) async fn list_tokens(
    State(app): State<Arc<App>>,
    Path(session_key): Path<String>,
) -> Result<axum::Json<dto::SessionTokenList>, ApiError> {
    Ok(axum::Json(app.session_tokens.list(&session_key)?.into()))
}

/// `DELETE /v1/sessions/{sessionKey}/tokens`
#[utoipa::path(delete, path = "/v1/sessions/{sessionKey}/tokens", tags = ["sessions"],
    summary = "Revoke every token of the session",
    params(("sessionKey" = String, Path, description = "The session key")),
    responses((status = 200, description = "Revoked and saved", body = dto::TokensRevoked)))]
pub(super) async fn revoke_tokens(
    State(app): State<Arc<App>>,
    Path(session_key): Path<String>,
) -> Result<axum::Json<dto::TokensRevoked>, ApiError> {
    let revoked = app.session_tokens.revoke_all(&session_key).await?;
    Ok(axum::Json(revoked.into()))
}

/// `DELETE /v1/sessions/{sessionKey}/tokens/{tokenId}`
#[utoipa::path(delete, path = "/v1/sessions/{sessionKey}/tokens/{tokenId}", tags = ["sessions"],
    summary = "Revoke one token of the session",
    params(("sessionKey" = String, Path, description = "The session key"),
        ("tokenId" = String, Path, description = "The token's id")),
    responses((status = 200, description = "Revoked and saved", body = dto::Done)))]
pub(super) async fn revoke_token(
    State(app): State<Arc<App>>,
    Path((session_key, id)): Path<(String, String)>,
) -> Result<axum::Json<dto::Done>, ApiError> {
    app.session_tokens.revoke(&session_key, &id).await?;
    Ok(axum::Json(dto::Done::new()))
}
