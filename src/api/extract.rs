//! Extractors whose rejections are [`ApiError`]s, so malformed input always
//! gets our JSON error shape and a 4xx.

use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use bytes::Bytes;
use serde::de::DeserializeOwned;

use super::error::{ApiError, ErrorCode};

/// A JSON body. Requires `content-type: application/json`: that forces a
/// CORS preflight on browsers, so a web page cannot drive a token-less
/// sandboxd on loopback with a plain form post.
#[derive(Debug)]
pub(super) struct Json<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"));
        if !is_json {
            return Err(ApiError::new(
                ErrorCode::UnsupportedMediaType,
                "the body must be JSON, sent with content-type: application/json",
            ));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(body_error)?;
        serde_json::from_slice(&bytes)
            .map(Json)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
    }
}

fn body_error(e: BytesRejection) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(
            ErrorCode::BodyTooLarge,
            "the request body is larger than max_body_bytes",
        )
    } else {
        ApiError::bad_request(format!("could not read the request body: {e}"))
    }
}

/// Path parameters.
#[derive(Debug)]
pub(super) struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| Path(p.0))
            .map_err(|e: PathRejection| ApiError::bad_request(format!("invalid path: {e}")))
    }
}

/// Query parameters.
#[derive(Debug)]
pub(super) struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Query(q.0))
            .map_err(|e: QueryRejection| ApiError::bad_request(format!("invalid query: {e}")))
    }
}
