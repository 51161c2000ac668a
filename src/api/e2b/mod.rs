//! The E2B dialect: what E2B's own SDKs (Python `e2b` 2.x, npm `e2b` 2.x)
//! need from one server to drive sandboxd unchanged, with `E2B_API_URL`
//! and `E2B_SANDBOX_URL` both set to sandboxd's address. It only
//! translates: an E2B sandbox is an ordinary sandboxd sandbox (made by the
//! same create as `POST /v1/sandboxes`), and each call maps onto `App`'s
//! sandboxes, commands, files and terminal sessions. What this module
//! owns is the wire: the control plane's JSON and its `{code, message}`
//! errors (`control`), envd's Connect RPCs (`connect`, `wire`, `process`,
//! `filesystem`) and its plain file routes (`transfer`), and the two
//! credentials.
//!
//! The control plane takes `X-API-KEY`, checked like the admin token (any
//! key when none is configured). envd calls name their sandbox in
//! `E2b-Sandbox-Id` and carry its access token in `X-Access-Token` (see
//! `access_token`); the API key opens none of them. A call for a sandbox
//! that is gone answers 502 with a message saying it "was not found",
//! which the SDKs read as a sandbox that is no longer running. What the
//! domain cannot do yet answers Connect's `unimplemented` (501 on the
//! control plane), naming what is missing.

mod access_token;
mod connect;
mod control;
mod filesystem;
mod process;
mod signed_url;
mod transfer;
mod wire;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};

use crate::api::error::{ApiError, ErrorCode};
use crate::app::App;
use crate::ports::Opening;
use access_token::AccessTokens;
use connect::{Code, ConnectError};
use signed_url::{Operation, SignedUrl};

/// The version of envd sandboxd answers as: the SDKs choose their
/// requests by it (octet-stream uploads from 0.5.7 on, for one).
const ENVD_VERSION: &str = "0.5.7";
/// The home directory E2B's SDKs assume for their default user `user`.
const E2B_HOME: &str = "/home/user";

/// What the E2B handlers share: the app and the access tokens.
#[derive(Debug)]
struct E2b {
    app: Arc<App>,
    tokens: AccessTokens,
}

/// The sandbox an envd call names, once its token has been checked.
#[derive(Debug, Clone)]
struct SandboxId(String);

/// The E2B routes, for `api::router` to merge beside its own. The access
/// tokens' secret is read (or made) here, once.
pub(super) fn routes(app: &Arc<App>) -> Router<Arc<App>> {
    let state = Arc::new(E2b {
        app: Arc::clone(app),
        tokens: AccessTokens::load(app.config.state_dir()),
    });
    let control = Router::new()
        .route("/v2/sandboxes", post(control::create).get(control::list))
        .route("/sandboxes/{id}", get(control::info).delete(control::kill))
        .route("/v2/sandboxes/{id}/connect", post(control::connect))
        .route("/sandboxes/{id}/timeout", post(control::set_timeout))
        .route("/sandboxes/{id}/metrics", get(control::metrics))
        .route("/sandboxes/{id}/pause", post(control::pause))
        .route_layer(from_fn_with_state(Arc::clone(&state), require_api_key));
    let envd = Router::new()
        .route("/process.Process/Start", post(process::start))
        .route("/process.Process/Connect", post(process::connect))
        .route("/process.Process/List", post(process::list))
        .route("/process.Process/SendSignal", post(process::send_signal))
        .route("/process.Process/SendInput", post(process::send_input))
        .route("/process.Process/StreamInput", post(process::stream_input))
        .route("/process.Process/CloseStdin", post(process::close_stdin))
        .route("/process.Process/Update", post(process::update))
        .route("/process.Process/{method}", any(process::other))
        .route("/filesystem.Filesystem/Stat", post(filesystem::stat))
        .route("/filesystem.Filesystem/ListDir", post(filesystem::list_dir))
        .route("/filesystem.Filesystem/Remove", post(filesystem::remove))
        .route("/filesystem.Filesystem/Move", post(filesystem::rename))
        .route("/filesystem.Filesystem/MakeDir", post(filesystem::make_dir))
        .route(
            "/filesystem.Filesystem/WatchDir",
            post(filesystem::watch_dir),
        )
        .route(
            "/filesystem.Filesystem/CreateWatcher",
            post(filesystem::create_watcher),
        )
        .route(
            "/filesystem.Filesystem/GetWatcherEvents",
            post(filesystem::watcher_events),
        )
        .route(
            "/filesystem.Filesystem/RemoveWatcher",
            post(filesystem::remove_watcher),
        )
        .route("/filesystem.Filesystem/{method}", any(filesystem::other))
        .route("/files", get(transfer::download).post(transfer::upload))
        .route("/health", get(health))
        .route_layer(from_fn_with_state(Arc::clone(&state), require_access_token));
    control.merge(envd).with_state(state)
}

/// Which ports of a sandbox its port hosts open: every port of an E2B
/// sandbox, as in E2B, and the allowlisted ones of any other.
pub(in crate::api) fn port_opening(session_key: &str) -> Opening {
    if session_key.starts_with(control::SESSION_PREFIX) {
        Opening::OnFirstUse
    } else {
        Opening::Allowlisted
    }
}

/// The control plane's check: `X-API-KEY` is the admin token.
async fn require_api_key(State(e2b): State<Arc<E2b>>, req: Request, next: Next) -> Response {
    let key = req.headers().get("x-api-key").map(|v| v.as_bytes());
    if super::auth::key_matches(&e2b.app, key) {
        next.run(req).await
    } else {
        control::ControlError::new(
            StatusCode::UNAUTHORIZED,
            "a valid API key is required in X-API-KEY (sandboxd's admin token)",
        )
        .into_response()
    }
}

/// envd's check: the sandbox `E2b-Sandbox-Id` names exists and
/// `X-Access-Token` is its token. Its answers have envd's error shape,
/// which the Connect clients and the file routes' clients both read.
async fn require_access_token(
    State(e2b): State<Arc<E2b>>,
    mut req: Request,
    next: Next,
) -> Response {
    let checked = match check_access(&e2b, &req) {
        Ok(id) => running(&e2b, id).await,
        Err(e) => Err(e),
    };
    match checked {
        Ok(id) => {
            req.extensions_mut().insert(SandboxId(id));
            next.run(req).await
        }
        // A streaming call hears it as its stream's end, as Connect has
        // it; the others by status.
        Err(e) if connect::is_streaming(req.headers()) => connect::stream_error(&e.into_connect()),
        Err(e) => e.into_response(),
    }
}

/// The sandbox an envd call may reach (if it is there), or why it may
/// not: the one
/// `E2b-Sandbox-Id` names, opened by its `X-Access-Token`, or for a
/// signed file URL (no token sent), the one whose token signed it.
fn check_access(e2b: &E2b, req: &Request) -> Result<String, EnvdError> {
    if let Some(why) = e2b.tokens.unusable() {
        return Err(EnvdError::Call(ConnectError::new(
            Code::Unavailable,
            format!("the E2B routes are off: {why}"),
        )));
    }
    let headers = req.headers();
    let named = headers
        .get("e2b-sandbox-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty());
    let signed = (req.uri().path() == "/files" && !headers.contains_key("x-access-token"))
        .then(|| SignedUrl::from_query(req.uri().query()))
        .flatten();
    let id = match signed {
        Some(url) => signer(e2b, url, req.method(), named)?,
        None => {
            let id = named.ok_or_else(|| {
                EnvdError::Call(ConnectError::new(
                    Code::InvalidArgument,
                    "the E2b-Sandbox-Id header is required on envd calls",
                ))
            })?;
            let presented = headers
                .get("x-access-token")
                .map_or(&b""[..], |v| v.as_bytes());
            if !e2b.tokens.verify(id, presented) {
                return Err(EnvdError::Call(ConnectError::new(
                    Code::Unauthenticated,
                    "X-Access-Token is not this sandbox's envdAccessToken",
                )));
            }
            id.to_string()
        }
    };
    Ok(id)
}

/// The sandbox `id`, when it is there.
async fn running(e2b: &E2b, id: String) -> Result<String, EnvdError> {
    match e2b.app.sandboxes.lookup(&id).await {
        Ok(_) => Ok(id),
        Err(e) => Err(envd_error(&id, e)),
    }
}

/// The sandbox whose token signed `url` (among all, or the one `named`):
/// a GET reads, anything else writes.
fn signer(
    e2b: &E2b,
    url: Result<SignedUrl, signed_url::Refused>,
    method: &Method,
    named: Option<&str>,
) -> Result<String, EnvdError> {
    let refused = |why: signed_url::Refused| {
        EnvdError::Call(ConnectError::new(Code::Unauthenticated, why.to_string()))
    };
    let url = url.map_err(refused)?;
    let operation = if method == Method::GET {
        Operation::Read
    } else {
        Operation::Write
    };
    let ids: Vec<String> = match named {
        Some(id) => vec![id.to_string()],
        None => e2b
            .app
            .sandboxes
            .registry()
            .list()
            .iter()
            .map(|s| s.id.clone())
            .collect(),
    };
    let now = crate::clock::now_ms() / 1000;
    url.signer(&e2b.tokens, operation, now, ids.iter().map(String::as_str))
        .map(str::to_string)
        .map_err(refused)
}

/// A domain error on an envd call: a sandbox that is gone is the 502
/// "was not found" E2B's own proxy answers; anything else keeps its code.
fn envd_error(sandbox_id: &str, e: impl Into<ApiError>) -> EnvdError {
    let e = e.into();
    if e.code == ErrorCode::SandboxNotFound {
        EnvdError::Gone(sandbox_id.to_string())
    } else {
        EnvdError::Call(ConnectError::from(e))
    }
}

/// A domain failure of an envd call on `sandbox_id`, as a Connect error.
fn failed<E: Into<ApiError>>(sandbox_id: &str) -> impl FnOnce(E) -> ConnectError + '_ {
    move |e| envd_error(sandbox_id, e).into_connect()
}

/// An envd call's failure.
#[derive(Debug)]
enum EnvdError {
    /// The sandbox is gone (or never was).
    Gone(String),
    Call(ConnectError),
}

impl EnvdError {
    /// As a Connect error: a gone sandbox is `unavailable`, which the SDKs
    /// read as a sandbox that stopped.
    fn into_connect(self) -> ConnectError {
        match self {
            EnvdError::Gone(id) => ConnectError::new(Code::Unavailable, gone_message(&id)),
            EnvdError::Call(e) => e,
        }
    }
}

impl IntoResponse for EnvdError {
    fn into_response(self) -> Response {
        match self {
            EnvdError::Gone(id) => {
                let mut resp =
                    ConnectError::new(Code::Unavailable, gone_message(&id)).into_response();
                *resp.status_mut() = StatusCode::BAD_GATEWAY;
                resp
            }
            EnvdError::Call(e) => e.into_response(),
        }
    }
}

fn gone_message(sandbox_id: &str) -> String {
    format!("The sandbox {sandbox_id} was not found")
}

/// `GET /health`: envd is up (the sandbox exists: the access check said so).
async fn health() -> StatusCode {
    StatusCode::NO_CONTENT
}

/// Where E2B's home directory is in this sandboxd: `/home/user` when it is
/// one of the workspace's paths (`workspace_aliases`), else the workspace
/// directory itself. Relative E2B paths are taken from it.
fn home(app: &App) -> &str {
    if app.config.workspace_dirs().any(|d| d == E2B_HOME) {
        E2B_HOME
    } else {
        &app.config.workspace_dir
    }
}

/// An E2B path as an absolute one, for answers: relative ones are under
/// [`home`]. The domain checks it again when it is used.
fn absolute(app: &App, path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{}/{}", home(app).trim_end_matches('/'), path)
    }
}
