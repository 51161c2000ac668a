//! E2B's control plane (its `openapi.yml`, the part the SDKs' `Sandbox`
//! class calls): create, connect, info, list, kill, pause and a new
//! timeout; what the domain cannot serve yet answers 501 naming what is
//! missing. E2B's `timeout` is a sandbox's lifetime (see
//! `sandbox::lifetime`), not an idle TTL. Bodies are JSON; every error is
//! `{code, message}` with the HTTP status as `code`, which the SDKs turn
//! into their exceptions (401: `AuthenticationException`, 404: not found,
//! 429: rate limit).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::wire::rfc3339;
use super::{E2b, ENVD_VERSION};
use crate::api::error::{ApiError, ErrorCode};
use crate::api::extract::Path;
use crate::sandbox::lifetime::{AtEnd, LifetimeChange};
use crate::sandbox::spec::{CreateSandboxRequest, NetworkRequest};
use crate::sandbox::{SandboxInfo, metadata};

/// Most sandboxes one page of a list holds, and the default.
const MAX_PAGE: usize = 1000;
const DEFAULT_PAGE: usize = 100;
/// Largest control-plane body taken.
const MAX_BODY_BYTES: usize = 1024 * 1024;
/// What `clientID` says: there is one node.
const CLIENT_ID: &str = "sandboxd";
/// A create's lifetime when it names none: the SDKs' own default (E2B's
/// documented five minutes).
const DEFAULT_TIMEOUT_SECS: i64 = 300;

/// A control-plane error: `{"code": status, "message": …}`.
#[derive(Debug)]
pub(super) struct ControlError {
    status: StatusCode,
    message: String,
}

impl ControlError {
    pub(super) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ControlError {
            status,
            message: message.into(),
        }
    }

    fn unimplemented(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_IMPLEMENTED,
            format!("sandboxd does not support {what} yet"),
        )
    }
}

impl IntoResponse for ControlError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.status.as_u16(), "message": self.message});
        (self.status, axum::Json(body)).into_response()
    }
}

impl From<ApiError> for ControlError {
    fn from(e: ApiError) -> Self {
        ControlError::new(e.status(), e.message)
    }
}

/// A JSON body (an empty one is `{}`), at most [`MAX_BODY_BYTES`].
fn json_body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, ControlError> {
    let bytes = body.map_err(|e| ControlError::new(e.status(), e.body_text()))?;
    if bytes.len() > MAX_BODY_BYTES {
        return Err(ControlError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {MAX_BODY_BYTES} bytes"),
        ));
    }
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        &bytes
    };
    serde_json::from_slice(bytes)
        .map_err(|e| ControlError::new(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))
}

/// The body of `POST /sandboxes/{id}/timeout` and of connect: seconds.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct Timeout {
    timeout: Option<i64>,
}

/// A timeout in seconds as milliseconds: 0 to what the SDKs' int32
/// holds.
fn timeout_ms(secs: i64) -> Result<u64, ControlError> {
    u64::try_from(secs)
        .ok()
        .filter(|s| *s <= u64::from(i32::MAX.unsigned_abs()))
        .map(|s| s * 1000)
        .ok_or_else(|| {
            ControlError::new(
                StatusCode::BAD_REQUEST,
                format!("timeout must be 0 to {} seconds, not {secs}", i32::MAX),
            )
        })
}

/// `POST /v2/sandboxes`'s body; fields the SDKs add later are ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    /// Seconds.
    timeout: Option<i64>,
    metadata: Option<BTreeMap<String, String>>,
    #[serde(rename = "envVars")]
    env_vars: Option<BTreeMap<String, String>>,
    #[serde(rename = "autoPause")]
    auto_pause: Option<bool>,
    /// `{"enabled": bool}`: resumed by traffic, which sandboxd does not do.
    #[serde(rename = "autoResume")]
    auto_resume: Option<serde_json::Value>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    network: Option<serde_json::Value>,
    mcp: Option<serde_json::Value>,
    #[serde(rename = "volumeMounts")]
    volume_mounts: Option<serde_json::Value>,
}

impl NewSandbox {
    /// What the request asks that the domain cannot do yet, if anything.
    fn unsupported(&self) -> Option<&'static str> {
        let set = |v: &Option<serde_json::Value>| v.as_ref().is_some_and(|v| !v.is_null());
        if self
            .auto_resume
            .as_ref()
            .is_some_and(|v| v["enabled"] == serde_json::Value::Bool(true))
        {
            Some("autoResume (resumed by traffic); Sandbox.connect resumes a paused sandbox")
        } else if set(&self.network) {
            Some("network rules (network); allow_internet_access is supported")
        } else if set(&self.mcp) {
            Some("the MCP gateway (mcp)")
        } else if set(&self.volume_mounts) {
            Some("volume mounts (volumeMounts)")
        } else {
            None
        }
    }
}

/// A sandbox as create and connect answer it.
#[derive(Debug, Serialize)]
struct Created {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "clientID")]
    client_id: &'static str,
    #[serde(rename = "envdVersion")]
    envd_version: &'static str,
    #[serde(rename = "envdAccessToken")]
    envd_access_token: String,
    /// What the SDKs' `get_host(port)` puts after `PORT-ID.`: `e2b_domain`,
    /// else the `Host` the request was sent to (envd is reached through
    /// `E2B_SANDBOX_URL` either way).
    domain: Option<String>,
}

/// A sandbox as info and list answer it.
#[derive(Debug, Serialize)]
struct Detail {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "clientID")]
    client_id: &'static str,
    #[serde(rename = "startedAt")]
    started_at: String,
    #[serde(rename = "endAt")]
    end_at: String,
    #[serde(rename = "envdVersion")]
    envd_version: &'static str,
    #[serde(rename = "cpuCount")]
    cpu_count: u32,
    #[serde(rename = "memoryMB")]
    memory_mb: u32,
    #[serde(rename = "diskSizeMB")]
    disk_size_mb: u64,
    metadata: BTreeMap<String, String>,
    state: &'static str,
}

impl E2b {
    /// The template a sandbox shows: one that creates its runtime, else
    /// the runtime's own name.
    fn template_of(&self, runtime: &str) -> String {
        self.app
            .config
            .e2b_template(runtime)
            .unwrap_or(runtime)
            .to_string()
    }

    fn detail(&self, s: &SandboxInfo) -> Detail {
        let config = &self.app.config;
        let disk = if config.workspace_tmpfs_mb > 0 {
            config.workspace_tmpfs_mb
        } else {
            config.workspace_size_mb
        };
        let ms = |t: u64| rfc3339(i64::try_from(t).unwrap_or(i64::MAX));
        Detail {
            template_id: self.template_of(&s.runtime),
            sandbox_id: s.id.clone(),
            client_id: CLIENT_ID,
            started_at: ms(s.created_at),
            end_at: ms(s.expires_at),
            envd_version: ENVD_VERSION,
            cpu_count: s.resources.vcpus,
            memory_mb: s.resources.memory_mb,
            disk_size_mb: disk,
            metadata: s.metadata.clone(),
            state: if s.paused { "paused" } else { "running" },
        }
    }

    fn created(
        &self,
        sandbox_id: String,
        runtime: &str,
        headers: &HeaderMap,
    ) -> Result<Created, ControlError> {
        let token = self
            .tokens
            .token(&sandbox_id)
            .ok_or_else(|| self.tokens_off())?;
        Ok(Created {
            template_id: self.template_of(runtime),
            sandbox_id,
            client_id: CLIENT_ID,
            envd_version: ENVD_VERSION,
            envd_access_token: token,
            domain: self.domain(headers),
        })
    }

    /// `e2b_domain`, else the request's `Host` (which the Host rule has
    /// let through, so it names this server).
    fn domain(&self, headers: &HeaderMap) -> Option<String> {
        let configured = &self.app.config.e2b_domain;
        if !configured.is_empty() {
            return Some(configured.clone());
        }
        headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_ascii_lowercase)
    }

    fn tokens_off(&self) -> ControlError {
        ControlError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the E2B routes are off: {}",
                self.tokens.unusable().unwrap_or("no access-token secret")
            ),
        )
    }

    /// The sandbox, or the SDKs' 404.
    async fn sandbox(&self, id: &str) -> Result<SandboxInfo, ControlError> {
        self.app.sandboxes.get(id).await.map_err(|e| {
            let e = ApiError::from(e);
            if e.code == ErrorCode::SandboxNotFound {
                ControlError::new(StatusCode::NOT_FOUND, format!("sandbox {id:?} not found"))
            } else {
                e.into()
            }
        })
    }
}

/// How an E2B sandbox's session key begins.
pub(super) const SESSION_PREFIX: &str = "e2b-";

/// The session key of an E2B sandbox: from `Idempotency-Key`, so a
/// retried create finds the sandbox the first one made, else random.
fn session_key(headers: &HeaderMap) -> Result<String, ControlError> {
    match headers.get("idempotency-key").map(HeaderValue::as_bytes) {
        Some(key) if !key.is_empty() => {
            let hash = Sha256::digest(key);
            let hex: String = hash[..16].iter().map(|b| format!("{b:02x}")).collect();
            Ok(format!("{SESSION_PREFIX}{hex}"))
        }
        _ => crate::id::random_hex(12)
            .map(|r| format!("{SESSION_PREFIX}{r}"))
            .map_err(|e| ControlError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())),
    }
}

/// `POST /v2/sandboxes`: a sandbox of the template's runtime, made by the
/// same create as `POST /v1/sandboxes`.
pub(super) async fn create(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ControlError> {
    let req: NewSandbox = json_body(body)?;
    let template = req.template_id.as_deref().unwrap_or("base");
    let runtime = e2b.app.config.e2b_runtime(template).ok_or_else(|| {
        ControlError::new(
            StatusCode::NOT_FOUND,
            format!("template '{template}' not found (e2b_templates lists the templates)"),
        )
    })?;
    if let Some(what) = req.unsupported() {
        return Err(ControlError::unimplemented(what));
    }
    let lifetime = LifetimeChange::Set {
        length_ms: timeout_ms(req.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS))?,
        at_end: Some(if req.auto_pause == Some(true) {
            AtEnd::Pause
        } else {
            AtEnd::Stop
        }),
    };
    if e2b.tokens.unusable().is_some() {
        return Err(e2b.tokens_off());
    }
    let network = (req.allow_internet_access == Some(false)).then(|| NetworkRequest {
        mode: Some("none".into()),
        allow: None,
    });
    let create = CreateSandboxRequest {
        session_key: session_key(&headers)?,
        runtime: Some(runtime.to_string()),
        idle_ttl_ms: None,
        resources: None,
        network,
        ports: None,
        metadata: req.metadata,
        env: req.env_vars,
        from: None,
    };
    let created = e2b
        .app
        .create_sandbox_with_lifetime(create, lifetime)
        .await
        .map_err(ApiError::from)?;
    let answer = e2b.created(created.sandbox_id, runtime, &headers)?;
    Ok((StatusCode::CREATED, axum::Json(answer)).into_response())
}

/// `POST /v2/sandboxes/{id}/connect`: a running sandbox is connected to
/// as it is (200), its lifetime lengthened to `timeout` from now if that
/// is later; a paused one is resumed first (201), its lifetime `timeout`
/// from now (else its whole length again). A sandbox with no lifetime (one
/// made by sandboxd's own API) keeps its idle TTL.
pub(super) async fn connect(
    State(e2b): State<Arc<E2b>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ControlError> {
    let req: Timeout = json_body(body)?;
    let length_ms = req.timeout.map(timeout_ms).transpose()?;
    let s = e2b.sandbox(&id).await?;
    let status = if s.paused {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    e2b.app
        .connect_sandbox(&id, s.paused, length_ms)
        .await
        .map_err(ApiError::from)?;
    let answer = e2b.created(s.id, &s.runtime, &headers)?;
    Ok((status, axum::Json(answer)).into_response())
}

/// `GET /sandboxes/{id}`.
pub(super) async fn info(
    State(e2b): State<Arc<E2b>>,
    Path(id): Path<String>,
) -> Result<Response, ControlError> {
    let s = e2b.sandbox(&id).await?;
    Ok(axum::Json(e2b.detail(&s)).into_response())
}

/// `DELETE /sandboxes/{id}`: 204 once it is gone (paused or not), 404 if
/// there was none.
pub(super) async fn kill(
    State(e2b): State<Arc<E2b>>,
    Path(id): Path<String>,
) -> Result<StatusCode, ControlError> {
    e2b.sandbox(&id).await?;
    e2b.app.sandboxes.stop(&id).await.map_err(ApiError::from)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v2/sandboxes`' query: `state` may repeat or hold a comma-separated
/// list; `metadata` is itself a query string (`k=v&k2=v2`, encoded).
#[derive(Debug, Default)]
struct ListQuery {
    states: Vec<String>,
    metadata: Vec<(String, String)>,
    limit: Option<String>,
    next_token: Option<String>,
}

fn list_query(raw: Option<&str>) -> ListQuery {
    let pairs: Vec<(String, String)> = form_urlencoded::parse(raw.unwrap_or("").as_bytes())
        .into_owned()
        .collect();
    let last = |key: &str| {
        pairs
            .iter()
            .rev()
            .find(|(k, v)| k == key && !v.is_empty())
            .map(|(_, v)| v.clone())
    };
    ListQuery {
        states: pairs
            .iter()
            .filter(|(k, _)| k == "state")
            .flat_map(|(_, v)| v.split(','))
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect(),
        metadata: pairs
            .iter()
            .filter(|(k, _)| k == "metadata")
            .flat_map(|(_, v)| form_urlencoded::parse(v.as_bytes()).into_owned())
            .collect(),
        limit: last("limit"),
        next_token: last("nextToken"),
    }
}

/// `GET /v2/sandboxes`: sandboxes by id, running and paused (or the states
/// asked), whose metadata holds every pair asked, a page at a time; the
/// next page's token in `x-next-token`.
pub(super) async fn list(
    State(e2b): State<Arc<E2b>>,
    uri: axum::http::Uri,
) -> Result<Response, ControlError> {
    let q = list_query(uri.query());
    let wanted = metadata::filter_of(
        q.metadata
            .into_iter()
            .map(|(k, v)| (format!("metadata.{k}"), v))
            .collect(),
    )
    .map_err(|e| ControlError::new(StatusCode::BAD_REQUEST, e.to_string()))?;
    let limit = match q.limit.as_deref() {
        None => DEFAULT_PAGE,
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_PAGE).contains(n))
            .ok_or_else(|| {
                ControlError::new(
                    StatusCode::BAD_REQUEST,
                    format!("limit must be 1 to {MAX_PAGE}"),
                )
            })?,
    };
    let state_asked = |paused: bool| {
        let state = if paused { "paused" } else { "running" };
        q.states.is_empty() || q.states.iter().any(|s| s == state)
    };
    let mut all: Vec<SandboxInfo> = e2b
        .app
        .sandboxes
        .list_matching(&wanted)
        .await
        .map_err(ApiError::from)?
        .into_iter()
        .filter(|s| state_asked(s.paused))
        .collect();
    all.sort_by(|a, b| a.id.cmp(&b.id));
    let after: Vec<&SandboxInfo> = all
        .iter()
        .filter(|s| q.next_token.as_ref().is_none_or(|t| s.id > *t))
        .collect();
    let page: Vec<Detail> = after.iter().take(limit).map(|s| e2b.detail(s)).collect();
    let mut resp = axum::Json(page).into_response();
    if after.len() > limit
        && let Some(last) = after.get(limit - 1)
        && let Ok(v) = HeaderValue::from_str(&last.id)
    {
        resp.headers_mut().insert("x-next-token", v);
    }
    Ok(resp)
}

/// `POST /sandboxes/{id}/timeout`: the sandbox ends `timeout` seconds
/// from now, sooner or later than before (one made by sandboxd's own API
/// gets a lifetime, ending in a stop, in place of its idle TTL).
pub(super) async fn set_timeout(
    State(e2b): State<Arc<E2b>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ControlError> {
    let req: Timeout = json_body(body)?;
    let secs = req.timeout.ok_or_else(|| {
        ControlError::new(
            StatusCode::BAD_REQUEST,
            "the body needs a timeout in seconds",
        )
    })?;
    let change = LifetimeChange::Set {
        length_ms: timeout_ms(secs)?,
        at_end: None,
    };
    e2b.sandbox(&id).await?;
    e2b.app
        .sandboxes
        .change_lifetime(&id, change)
        .await
        .map_err(ApiError::from)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/pause`: the engine's pause (see
/// `Sandboxes::pause`); 409 when it is paused already.
pub(super) async fn pause(
    State(e2b): State<Arc<E2b>>,
    Path(id): Path<String>,
) -> Result<StatusCode, ControlError> {
    e2b.sandbox(&id).await?;
    e2b.app.sandboxes.pause(&id).await.map_err(ApiError::from)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /sandboxes/{id}/metrics`: sandboxd keeps no samples of a sandbox's
/// use, so the list is empty.
pub(super) async fn metrics(
    State(e2b): State<Arc<E2b>>,
    Path(id): Path<String>,
) -> Result<Response, ControlError> {
    e2b.sandbox(&id).await?;
    Ok(axum::Json(Vec::<()>::new()).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_query_takes_repeated_and_comma_separated_states() {
        let q = list_query(Some("state=running&state=paused,x&limit=5&nextToken=abc"));
        assert_eq!(q.states, ["running", "paused", "x"]);
        assert_eq!(q.limit.as_deref(), Some("5"));
        assert_eq!(q.next_token.as_deref(), Some("abc"));
        assert!(q.metadata.is_empty());
        let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
        assert_eq!(
            list_query(Some("metadata=user%3Dx%26app%3Dmy%2520app")).metadata,
            [pair("user", "x"), pair("app", "my app")],
            "the value is a query string of its own, decoded once more"
        );
        assert!(list_query(Some("metadata=")).metadata.is_empty());
        assert!(list_query(None).states.is_empty());
    }

    #[test]
    fn a_timeout_is_0_to_an_int32_of_seconds() {
        assert_eq!(timeout_ms(0).ok(), Some(0));
        assert_eq!(timeout_ms(300).ok(), Some(300_000));
        assert_eq!(timeout_ms(2_147_483_647).ok(), Some(2_147_483_647_000));
        assert!(timeout_ms(-1).is_err());
        assert!(timeout_ms(2_147_483_648).is_err());
    }

    #[test]
    fn an_idempotency_key_names_one_session_and_none_a_fresh_one() {
        let mut h = HeaderMap::new();
        h.insert("idempotency-key", HeaderValue::from_static("k1"));
        let a = session_key(&h).expect("key");
        assert_eq!(a, session_key(&h).expect("again"));
        assert!(a.starts_with("e2b-") && a.len() == 36, "{a}");
        let none = HeaderMap::new();
        assert_ne!(
            session_key(&none).expect("random"),
            session_key(&none).expect("random")
        );
    }

    #[test]
    fn requests_the_domain_cannot_serve_yet_are_named() {
        let parse =
            |v: serde_json::Value| -> NewSandbox { serde_json::from_value(v).expect("body") };
        assert!(
            parse(serde_json::json!({"templateID": "base", "metadata": {"a": "b"}, "envVars": {"A": "1"}}))
                .unsupported()
                .is_none()
        );
        assert!(
            parse(serde_json::json!({"autoPause": true, "autoResume": {"enabled": false}}))
                .unsupported()
                .is_none()
        );
        [
            (
                serde_json::json!({"autoPause": true, "autoResume": {"enabled": true}}),
                "autoResume",
            ),
            (serde_json::json!({"volumeMounts": []}), "volume"),
        ]
        .into_iter()
        .for_each(|(body, word)| {
            let why = parse(body).unsupported().expect("refused");
            assert!(why.contains(word), "{why}");
        });
    }
}
