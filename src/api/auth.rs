//! The admin token check: from `x-sandboxd-admin-token`,
//! `x-remcochat-admin-token` (compat) or `Authorization: Bearer`, compared in
//! constant time. Never from the query string, which ends up in logs.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::error::{ApiError, ErrorCode};
use crate::app::App;

/// Refuses requests without the configured token; a no-op without one.
pub(super) async fn require_token(
    State(app): State<Arc<App>>,
    req: Request,
    next: Next,
) -> Response {
    match app.config.admin_token.as_ref() {
        Some(token) if !presented_matches(req.headers(), token.expose()) => ApiError::new(
            ErrorCode::Unauthorized,
            "a valid admin token is required (x-sandboxd-admin-token or Authorization: Bearer)",
        )
        .into_response(),
        _ => next.run(req).await,
    }
}

/// Whether the request's headers carry the configured token (or none is
/// configured): for a route that also takes another credential.
pub(super) fn presented(app: &App, headers: &HeaderMap) -> bool {
    app.config
        .admin_token
        .as_ref()
        .is_none_or(|token| presented_matches(headers, token.expose()))
}

fn presented_matches(headers: &HeaderMap, token: &str) -> bool {
    let candidates = [
        headers.get("x-sandboxd-admin-token").map(|v| v.as_bytes()),
        headers.get("x-remcochat-admin-token").map(|v| v.as_bytes()),
        headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer ")),
    ];
    // Check every header, without stopping early, so timing says nothing
    // about which one was tried.
    candidates.iter().fold(false, |ok, c| {
        let matched = c.is_some_and(|c| !c.is_empty() && bool::from(c.ct_eq(token.as_bytes())));
        ok | matched
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                axum::http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                v.parse().expect("value"),
            );
        }
        h
    }

    #[test]
    fn each_header_form_is_accepted() {
        for h in [
            headers(&[("x-sandboxd-admin-token", "tok")]),
            headers(&[("x-remcochat-admin-token", "tok")]),
            headers(&[("authorization", "Bearer tok")]),
        ] {
            assert!(presented_matches(&h, "tok"));
        }
    }

    #[test]
    fn wrong_empty_or_missing_is_refused() {
        for h in [
            headers(&[]),
            headers(&[("x-sandboxd-admin-token", "tok2")]),
            headers(&[("x-sandboxd-admin-token", "to")]),
            headers(&[("authorization", "Bearer ")]),
            headers(&[("authorization", "Basic tok")]),
            headers(&[("authorization", "tok")]),
        ] {
            assert!(!presented_matches(&h, "tok"), "{h:?}");
        }
    }
}
