//! The MCP dialect: `/v1/sessions/{sessionKey}/mcp`, the Streamable HTTP
//! transport of the Model Context Protocol, served by the `rmcp` crate.
//! It sits at the HTTP edge beside the REST handlers and only translates:
//! each tool calls the same domain methods a REST route calls (`App`'s
//! create, `commands`, `files`, `ports`, `checkpoints`, its restore) and
//! maps domain errors through [`ApiError`] into tool results with
//! `isError: true`.
//!
//! The session's sandbox is what a create with that session key gives:
//! made on the first tool call (with the runtime, resources, network mode
//! and ports of the endpoint's query), reconnected on each later one, made
//! again when it went away. The query is validated like a create body
//! before any MCP handling.
//!
//! Revisions: `2026-07-28` (stateless: every request stands alone, so a
//! sandboxd restart is invisible; a client cancels by closing the
//! response stream) and `2025-11-25` (the `initialize` handshake and an
//! `Mcp-Session-Id` kept in memory: after a sandboxd restart the id is
//! unknown and rmcp answers 404, which tells the client to initialize
//! again; it cancels with `notifications/cancelled`).

mod bash;
mod checkpoints;
mod tools;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde::Deserialize;
use tower::ServiceExt;

use super::error::ApiError;
use super::extract::{Path, Query};
use crate::app::App;
use crate::field_error::FieldError;
use crate::sandbox::SandboxError;
use crate::sandbox::spec::{CreateSandboxRequest, NetworkRequest, ResourcesRequest, SandboxSpec};

/// The protocol revisions served: the newest `rmcp` knows and the one
/// before it.
const REVISIONS: [ProtocolVersion; 2] =
    [ProtocolVersion::V_2025_11_25, ProtocolVersion::V_2026_07_28];

/// The transport, built once; each request gets a [`SessionServer`].
pub(super) type McpService = StreamableHttpService<SessionServer, LocalSessionManager>;

/// The endpoint's query: what a create body would carry besides the key.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct SessionQuery {
    runtime: Option<String>,
    vcpus: Option<i64>,
    memory_mb: Option<i64>,
    /// A network mode, as `network.mode` of a create.
    network: Option<String>,
    /// Comma-separated ports to allow, e.g. `3000,8080`.
    ports: Option<String>,
}

/// What a tool call needs of the HTTP request it came in: the session's
/// create request and the request id its log lines carry.
#[derive(Debug, Clone)]
struct Session {
    create: CreateSandboxRequest,
    request_id: String,
    host: Option<String>,
}

/// The transport for the router, sharing the server's shutdown.
pub(super) fn service(app: Arc<App>) -> McpService {
    let tools = Arc::new(SessionServer::tool_router() + SessionServer::checkpoint_tools());
    let config = StreamableHttpServerConfig::default()
        // Host and Origin are checked for every route by the router.
        .disable_allowed_hosts()
        .disable_allowed_origins()
        .with_max_request_body_bytes(app.config.max_body_bytes)
        // A short keep-alive lets a dropped response (a 2026-07-28
        // client's cancellation) be noticed soon.
        .with_sse_keep_alive(Some(std::time::Duration::from_secs(1)))
        .with_cancellation_token(app.shutdown.child_token());
    let factory_app = Arc::clone(&app);
    StreamableHttpService::new(
        move || {
            Ok(SessionServer {
                app: Arc::clone(&factory_app),
                tools: ToolRouter::clone(&tools),
            })
        },
        Arc::new(LocalSessionManager::default()),
        config,
    )
}

/// `/v1/sessions/{sessionKey}/mcp` (POST, GET, DELETE): validates the key
/// and the query like a create body, then hands the request to rmcp.
pub(super) async fn endpoint(
    State(app): State<Arc<App>>,
    Path(session_key): Path<String>,
    Query(q): Query<SessionQuery>,
    axum::Extension(service): axum::Extension<McpService>,
    mut req: Request,
) -> Response {
    let create = match create_request(session_key, q) {
        Ok(c) => c,
        Err(e) => return ApiError::from(SandboxError::from(e)).into_response(),
    };
    if let Err(e) = SandboxSpec::parse(create.clone(), &app.config) {
        return ApiError::from(SandboxError::from(e)).into_response();
    }
    let session = Session {
        create,
        request_id: header(&req, "x-request-id").unwrap_or_default(),
        host: header(&req, axum::http::header::HOST.as_str()),
    };
    req.extensions_mut().insert(session);
    match service.oneshot(req).await {
        Ok(resp) => resp.map(axum::body::Body::new),
        Err(never) => match never {},
    }
}

/// A header's value as text.
fn header(req: &Request, name: &str) -> Option<String> {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// The create request the query describes for `session_key`.
fn create_request(
    session_key: String,
    q: SessionQuery,
) -> Result<CreateSandboxRequest, FieldError> {
    let ports = q
        .ports
        .map(|list| {
            list.split(',')
                .map(|p| {
                    p.trim().parse::<i64>().map_err(|_| {
                        FieldError::new("ports", format!("{p:?} is not a port number"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    let resources = (q.vcpus.is_some() || q.memory_mb.is_some()).then_some(ResourcesRequest {
        vcpus: q.vcpus,
        memory_mb: q.memory_mb,
    });
    Ok(CreateSandboxRequest {
        session_key,
        runtime: q.runtime,
        idle_ttl_ms: None,
        resources,
        network: q.network.map(|mode| NetworkRequest {
            mode: Some(mode),
            allow: None,
        }),
        ports,
        metadata: None,
        env: None,
        from: None,
    })
}

/// One request's MCP server: the tools of the session whose endpoint it
/// came in on.
#[derive(Clone)]
pub(super) struct SessionServer {
    app: Arc<App>,
    tools: ToolRouter<SessionServer>,
}

impl std::fmt::Debug for SessionServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionServer")
    }
}

impl SessionServer {
    /// The session a tool call came in on (the endpoint put it there).
    fn session(ctx: &RequestContext<RoleServer>) -> Option<Session> {
        ctx.extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.extensions.get::<Session>())
            .cloned()
    }

    /// The session's sandbox, created or reconnected exactly as a create
    /// for its key does; a tool error when there is none to be had.
    async fn sandbox(&self, session: &Session) -> Result<String, CallToolResult> {
        self.app
            .create_sandbox(session.create.clone())
            .await
            .map(|c| c.sandbox_id)
            .map_err(tool_error)
    }

    /// What `initialize` says besides name and version.
    fn instructions(&self) -> String {
        let c = &self.app.config;
        let network = match c.network_default.as_str() {
            "internet" => {
                "The network reaches the public internet only (never the host or private addresses). "
            }
            "none" => "The sandbox has no network. ",
            "allowlist" => "The network reaches only the server's allowlisted destinations. ",
            _ => "",
        };
        format!(
            "A Linux sandbox for this chat session. The workspace is {ws}: paths are relative to it or absolute under it. {network}\
             To get a URL for a server: start it in the background with bash, bound to 0.0.0.0 \
             (e.g. `python3 -m http.server 8000 --bind 0.0.0.0 &`), then call sandboxUrl with its port.",
            ws = c.workspace_dir
        )
    }
}

impl ServerHandler for SessionServer {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        info.protocol_version = ProtocolVersion::V_2025_11_25;
        info.server_info = Implementation::new("sandboxd", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(self.instructions());
        info
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Owned(REVISIONS.to_vec())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult {
            tools: self.tools.list_all(),
            ..ListToolsResult::default()
        })
    }

    /// Every call answers with a tool result: arguments the schema refuses
    /// and unknown tools too (as `isError`), so a model reads why.
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let started = Instant::now();
        let tool = tools::known_name(&request.name);
        let session = Self::session(&context);
        let cancelled = context.ct.clone();
        let answer = match self
            .tools
            .call(ToolCallContext::new(self, request, context))
            .await
        {
            Ok(CallToolResponse::Complete(r)) => r,
            Ok(other) => return Ok(other),
            Err(e) => error_result(format!("invalid call: {}", e.message), "invalid_request"),
        };
        let outcome = if cancelled.is_cancelled() {
            "cancelled"
        } else if answer.is_error == Some(true) {
            "tool_error"
        } else {
            "ok"
        };
        crate::telemetry::mcp_tool_call(tool, outcome);
        tracing::info!(
            tool,
            outcome,
            session_key = session
                .as_ref()
                .map_or("", |s| s.create.session_key.as_str()),
            request_id = session.as_ref().map_or("", |s| s.request_id.as_str()),
            duration_ms = started.elapsed().as_millis() as u64,
            "mcp tool call"
        );
        Ok(CallToolResponse::Complete(answer))
    }
}

/// The one mapping of domain errors to tool results: the API's sentence
/// and code, `isError: true`.
fn tool_error(e: impl Into<ApiError>) -> CallToolResult {
    let e = e.into();
    let mut message = e.message.clone();
    if let Some(failed) = &e.failed {
        if let Ok(v) = serde_json::to_string(failed) {
            message.push_str(&format!(" (now: {v})"));
        }
    }
    error_result(message, e.code.as_str())
}

/// A tool error with `message` for the model and `code` for a program.
fn error_result(message: String, code: &str) -> CallToolResult {
    let mut r = CallToolResult::error(vec![ContentBlock::text(format!("{message} [{code}]"))]);
    r.structured_content = Some(serde_json::json!({ "error": message, "code": code }));
    r
}
