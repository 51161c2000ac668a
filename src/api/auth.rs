//! The admin token check: from `x-sandboxd-admin-token`,
//! `x-remcochat-admin-token` (compat) or `Authorization: Bearer`, compared in
//! constant time. Never from the query string, which ends up in logs. And
//! the check of a session's own routes, which also take a live session
//! token of that session (`Authorization: Bearer sbx_st_…`).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use subtle::ConstantTimeEq;

use super::error::{ApiError, ErrorCode};
use super::extract::Path;
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

/// The session key of a route under `/v1/sessions/{sessionKey}/…`.
#[derive(Debug, Deserialize)]
pub(super) struct SessionPath {
    #[serde(rename = "sessionKey")]
    session_key: String,
}

/// For routes under `/v1/sessions/{sessionKey}/…`: the admin token (any of
/// its three headers), or a live session token of that path's session key
/// in `Authorization: Bearer`. A no-op without a configured admin token,
/// like [`require_token`]; refusals are the same 401.
pub(super) async fn require_session_access(
    State(app): State<Arc<App>>,
    path: Result<Path<SessionPath>, ApiError>,
    req: Request,
    next: Next,
) -> Response {
    // A path that does not parse names no session: only the admin token
    // can pass then.
    let session_token_ok = path.is_ok_and(|Path(p)| {
        bearer(req.headers())
            .and_then(|b| std::str::from_utf8(b).ok())
            .is_some_and(|token| app.session_tokens.verify(&p.session_key, token))
    });
    if session_token_ok || presented(&app, req.headers()) {
        next.run(req).await
    } else {
        ApiError::new(
            ErrorCode::Unauthorized,
            "a valid admin token, or a live token of this session (Authorization: Bearer), is required",
        )
        .into_response()
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
        bearer(headers),
    ];
    // Check every header, without stopping early, so timing says nothing
    // about which one was tried.
    candidates
        .iter()
        .fold(false, |ok, c| ok | one_matches(*c, token))
}

/// Whether one presented value is the token, compared in constant time.
fn one_matches(presented: Option<&[u8]>, token: &str) -> bool {
    presented.is_some_and(|c| !c.is_empty() && bool::from(c.ct_eq(token.as_bytes())))
}

/// Whether a dialect's own key header (E2B's `X-API-KEY`) holds the
/// configured admin token, compared as the admin headers are; true when
/// none is configured, like [`require_token`].
pub(super) fn key_matches(app: &App, presented: Option<&[u8]>) -> bool {
    app.config
        .admin_token
        .as_ref()
        .is_none_or(|token| one_matches(presented, token.expose()))
}

/// The value of `Authorization: Bearer <value>`.
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
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

    /// `require_session_access` on a session route beside `require_token`
    /// on another, against a store in a temporary state directory.
    mod session_access {
        use std::sync::Arc;

        use axum::Router;
        use axum::body::Body;
        use axum::http::{Request, StatusCode};
        use axum::routing::get;
        use tower::ServiceExt;

        use crate::app::App;
        use crate::config::Config;
        use crate::session_tokens::TokenRequest;

        const ADMIN: &str = "admin-Test-Token";

        struct Fixture {
            app: Arc<App>,
            dir: std::path::PathBuf,
        }

        impl Drop for Fixture {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.dir);
            }
        }

        fn fixture(admin: Option<&str>) -> Fixture {
            let dir = std::env::temp_dir().join(format!(
                "sandboxd-auth-{}-{}",
                std::process::id(),
                crate::id::random_hex(4).expect("random")
            ));
            let (state, admin) = (dir.display().to_string(), admin.map(str::to_string));
            let config = Config::from_toml_and_env("", move |k| match k {
                "SANDBOXD_STATE_DIR" => Some(state.clone()),
                "SANDBOXD_ADMIN_TOKEN" => admin.clone(),
                _ => None,
            })
            .expect("config");
            let app = App::new(config);
            app.session_tokens.load().expect("load");
            Fixture { app, dir }
        }

        fn router(app: &Arc<App>) -> Router {
            let session = axum::middleware::from_fn_with_state(
                Arc::clone(app),
                super::super::require_session_access,
            );
            let admin =
                axum::middleware::from_fn_with_state(Arc::clone(app), super::super::require_token);
            Router::new()
                .route("/v1/sessions/{sessionKey}/mcp", get(|| async { "in" }))
                .route_layer(session)
                .merge(
                    Router::new()
                        .route("/v1/sandboxes", get(|| async { "in" }))
                        .route_layer(admin),
                )
        }

        async fn status(app: &Arc<App>, path: &str, auth: Option<(&str, &str)>) -> StatusCode {
            let mut req = Request::get(path);
            if let Some((name, value)) = auth {
                req = req.header(name, value);
            }
            let resp = router(app)
                .oneshot(req.body(Body::empty()).expect("request"))
                .await
                .expect("infallible");
            resp.status()
        }

        #[tokio::test]
        async fn a_session_token_opens_its_own_session_only() {
            let f = fixture(Some(ADMIN));
            let issued = f
                .app
                .session_tokens
                .issue("chat:a", TokenRequest::default())
                .await
                .expect("issue");
            let bearer = format!("Bearer {}", issued.token);
            let token = Some(("authorization", bearer.as_str()));
            assert_eq!(status(&f.app, "/v1/sessions/chat:a/mcp", token).await, 200);
            assert_eq!(status(&f.app, "/v1/sessions/chat:b/mcp", token).await, 401);
            assert_eq!(status(&f.app, "/v1/sandboxes", token).await, 401);
            assert_eq!(status(&f.app, "/v1/sessions/chat:a/mcp", None).await, 401);
            let in_admin_header = Some(("x-sandboxd-admin-token", issued.token.as_str()));
            assert_eq!(
                status(&f.app, "/v1/sessions/chat:a/mcp", in_admin_header).await,
                401,
                "a session token is a Bearer token only"
            );
            for header in ["x-sandboxd-admin-token", "x-remcochat-admin-token"] {
                for path in ["/v1/sessions/chat:b/mcp", "/v1/sandboxes"] {
                    assert_eq!(status(&f.app, path, Some((header, ADMIN))).await, 200);
                }
            }
            let admin_bearer = format!("Bearer {ADMIN}");
            let admin = Some(("authorization", admin_bearer.as_str()));
            assert_eq!(status(&f.app, "/v1/sessions/chat:b/mcp", admin).await, 200);
            f.app
                .session_tokens
                .revoke("chat:a", &issued.id)
                .await
                .expect("revoke");
            assert_eq!(status(&f.app, "/v1/sessions/chat:a/mcp", token).await, 401);
        }

        #[tokio::test]
        async fn without_an_admin_token_it_checks_nothing_like_require_token() {
            let f = fixture(None);
            assert_eq!(status(&f.app, "/v1/sessions/chat:a/mcp", None).await, 200);
            assert_eq!(status(&f.app, "/v1/sandboxes", None).await, 200);
        }
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
