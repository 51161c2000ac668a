//! envd's plain file routes: `GET /files?path=` answers a file's bytes
//! (`Files::read`), `POST /files` writes the files of a `multipart/form-data`
//! body (each part's file name its path, unless `path` is given) or the
//! one file of an `application/octet-stream` body, optionally sent with
//! `Content-Encoding: gzip` (`Files::write`). The body limit, the path
//! rules and the file size limit are the domain's and the server's own; a
//! gzip body is inflated to at most `max_file_bytes`. Errors are envd's
//! `{code, message}`, with 502 for a sandbox that is gone.

use std::io::Read;
use std::sync::Arc;

use axum::Extension;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequest, Multipart, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use bytes::Bytes;
use futures_util::{TryStreamExt, stream};
use serde::{Deserialize, Serialize};

use super::control::ControlError;
use super::{E2b, EnvdError, SandboxId, absolute, envd_error, gone_message};
use crate::files::FileToWrite;

/// `/files`' query; `username` (the SDKs' user) is not used, and a signed
/// URL's signature was checked before (see `signed_url`).
#[derive(Debug, Deserialize)]
pub(super) struct FileQuery {
    #[serde(default)]
    path: Option<String>,
}

/// One written file, as envd answers it.
#[derive(Debug, Serialize)]
struct WriteInfo {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    path: String,
}

/// A domain error in envd's file routes' shape.
fn file_error(sid: &str, e: impl Into<crate::api::error::ApiError>) -> ControlError {
    let e = e.into();
    match envd_error(sid, e.clone()) {
        EnvdError::Gone(id) => ControlError::new(StatusCode::BAD_GATEWAY, gone_message(&id)),
        EnvdError::Call(_) => ControlError::from(e),
    }
}

fn bad(message: impl Into<String>) -> ControlError {
    ControlError::new(StatusCode::BAD_REQUEST, message)
}

fn query(q: Result<Query<FileQuery>, QueryRejection>) -> Result<FileQuery, ControlError> {
    q.map(|Query(q)| q)
        .map_err(|e| bad(format!("invalid query: {e}")))
}

/// `GET /files?path=P`: the file's bytes.
pub(super) async fn download(
    State(e2b): State<Arc<E2b>>,
    Extension(SandboxId(sid)): Extension<SandboxId>,
    q: Result<Query<FileQuery>, QueryRejection>,
) -> Result<Response, ControlError> {
    let path = query(q)?
        .path
        .filter(|p| !p.is_empty())
        .ok_or_else(|| bad("path: the query parameter is required"))?;
    let content = e2b
        .app
        .files
        .read(&sid, &path)
        .await
        .map_err(|e| file_error(&sid, e))?
        .ok_or_else(|| {
            ControlError::new(
                StatusCode::NOT_FOUND,
                format!("path '{path}' does not exist"),
            )
        })?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(content.content_base64)
        .map_err(|e| ControlError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

/// `POST /files[?path=P]`: writes every file of the body, or none.
pub(super) async fn upload(
    State(e2b): State<Arc<E2b>>,
    Extension(SandboxId(sid)): Extension<SandboxId>,
    q: Result<Query<FileQuery>, QueryRejection>,
    req: Request,
) -> Result<Response, ControlError> {
    let target = query(q)?.path.filter(|p| !p.is_empty());
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let files = if content_type.starts_with("multipart/form-data") {
        multipart_files(req, target).await?
    } else {
        let path = target.ok_or_else(|| bad("path: the query parameter is required"))?;
        let gzip = req
            .headers()
            .get(header::CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("gzip"));
        let body = Bytes::from_request(req, &())
            .await
            .map_err(|e| ControlError::new(e.status(), e.body_text()))?;
        let content = if gzip {
            gunzip(&body, e2b.app.config.max_file_bytes)?
        } else {
            body.to_vec()
        };
        vec![FileToWrite {
            path,
            content,
            ..FileToWrite::default()
        }]
    };
    let written: Vec<WriteInfo> = files
        .iter()
        .map(|f| {
            let path = absolute(&e2b.app, &f.path);
            let name = path.rsplit('/').next().unwrap_or_default().to_string();
            WriteInfo {
                name,
                kind: "file",
                path,
            }
        })
        .collect();
    e2b.app
        .files
        .write(&sid, files)
        .await
        .map_err(|e| file_error(&sid, e))?;
    Ok(axum::Json(written).into_response())
}

/// The files of a multipart body: each part's file name is its path,
/// unless the query names one.
async fn multipart_files(
    req: Request,
    target: Option<String>,
) -> Result<Vec<FileToWrite>, ControlError> {
    let parts = Multipart::from_request(req, &())
        .await
        .map_err(|e| ControlError::new(e.status(), e.body_text()))?;
    let files: Vec<FileToWrite> = stream::try_unfold(parts, |mut parts| {
        let target = target.clone();
        async move {
            let Some(part) = parts
                .next_field()
                .await
                .map_err(|e| ControlError::new(e.status(), e.body_text()))?
            else {
                return Ok::<_, ControlError>(None);
            };
            let path = target
                .or_else(|| part.file_name().map(str::to_string))
                .filter(|p| !p.is_empty())
                .ok_or_else(|| {
                    bad("each part needs a file name (its path), or the query a path")
                })?;
            let content = part
                .bytes()
                .await
                .map_err(|e| ControlError::new(e.status(), e.body_text()))?;
            let file = FileToWrite {
                path,
                content: content.to_vec(),
                ..FileToWrite::default()
            };
            Ok(Some((file, parts)))
        }
    })
    .try_collect()
    .await?;
    if files.is_empty() {
        return Err(bad("the body holds no file"));
    }
    Ok(files)
}

/// A gzip body, inflated to at most `max` bytes.
fn gunzip(body: &[u8], max: u64) -> Result<Vec<u8>, ControlError> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(body)
        .take(max.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| bad(format!("the gzip body does not inflate: {e}")))?;
    if out.len() as u64 > max {
        return Err(ControlError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the file inflates to more than max_file_bytes ({max})"),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(data).expect("write");
        enc.finish().expect("finish")
    }

    #[test]
    fn a_gzip_body_inflates_within_the_limit_only() {
        assert_eq!(gunzip(&gzip(b"hello"), 5).expect("fits"), b"hello");
        let bomb = gzip(&vec![0u8; 1 << 20]);
        let refused = gunzip(&bomb, 1024).expect_err("too large");
        assert_eq!(
            refused.into_response().status(),
            StatusCode::PAYLOAD_TOO_LARGE
        );
        assert!(gunzip(b"not gzip", 10).is_err());
    }
}
