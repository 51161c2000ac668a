//! The MCP section (issue 40, `--only mcp`): the `bash` tool running `true`
//! over a session's MCP endpoint (`tools/call` on an initialised MCP
//! session, answered as JSON or as an event stream, read to the end),
//! against `commands:run` of `true` in the same session's sandbox (floor
//! column), alternating which goes first, 20 samples of each after 3
//! warm-ups, on one HTTP client; and the size of the tools a model is
//! given (`tools/list`): their descriptions' characters, and their whole
//! definitions' (name, description, input schema) as compact JSON.
//!
//! The client is the protocol's few messages by hand (initialize, the
//! initialized notification, requests), so the figure is sandboxd's,
//! not an SDK's; the SDKs' own clients are tested in tests/it.

use std::time::Instant;

use serde_json::{Value, json};

use crate::report::{Line, RunFigures, line, ratio_at_most};
use crate::support::{Res, Server, ms};

const BASH: &str = "MCP `bash` tool running `true` p50 (ms; floor column: `commands:run`)";
const DESCRIPTIONS: &str = "MCP tool descriptions, all tools (characters)";
const DEFINITIONS: &str =
    "MCP tool definitions as `tools/list` gives them, compact JSON (characters)";

pub(crate) const LINES: &[Line] = &[
    line(
        BASH,
        "≤ 1.2× `commands:run` (floor column)",
        Some(|v, f| ratio_at_most(v, f, 1.2)),
    ),
    line(DESCRIPTIONS, "report", None),
    line(DEFINITIONS, "report", None),
];

/// The protocol revision the bench's client asks for.
const PROTOCOL: &str = "2025-06-18";

/// One initialised MCP session on `server`'s endpoint for a chat session.
struct McpSession<'a> {
    server: &'a Server,
    url: String,
    id: Option<String>,
    next: u64,
}

impl<'a> McpSession<'a> {
    async fn open(server: &'a Server, session_key: &str) -> Res<McpSession<'a>> {
        let mut s = McpSession {
            server,
            url: format!("{}/v1/sessions/{session_key}/mcp", server.base),
            id: None,
            next: 1,
        };
        let init = s
            .request(
                "initialize",
                json!({
                    "protocolVersion": PROTOCOL,
                    "capabilities": {},
                    "clientInfo": {"name": "sandboxd-bench", "version": "1"},
                }),
            )
            .await?;
        if init["serverInfo"]["name"] != "sandboxd" {
            return Err(format!("mcp: initialize answered {init}").into());
        }
        let sent = s
            .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await?;
        if !sent.status().is_success() {
            return Err(format!("mcp: initialized notification: {}", sent.status()).into());
        }
        Ok(s)
    }

    async fn post(&mut self, body: Value) -> Res<reqwest::Response> {
        let mut req = self
            .server
            .client
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", PROTOCOL)
            .json(&body);
        if let Some(id) = &self.id {
            req = req.header("mcp-session-id", id);
        }
        let resp = req.send().await?;
        if let Some(id) = resp.headers().get("mcp-session-id") {
            self.id = Some(id.to_str()?.to_string());
        }
        Ok(resp)
    }

    /// Sends request `method` and reads its answer to the end: the
    /// `result`, or an error naming what came.
    async fn request(&mut self, method: &str, params: Value) -> Res<Value> {
        let id = self.next;
        self.next += 1;
        let resp = self
            .post(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await?;
        let status = resp.status();
        let stream = resp
            .headers()
            .get("content-type")
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        let text = resp.text().await?;
        let messages: Vec<Value> = if stream {
            text.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .filter_map(|d| serde_json::from_str(d.trim()).ok())
                .collect()
        } else {
            serde_json::from_str(&text).into_iter().collect()
        };
        messages
            .into_iter()
            .find(|m| m["id"] == id)
            .and_then(|m| m.get("result").cloned())
            .ok_or_else(|| format!("mcp: {method}: {status} {text}").into())
    }
}

/// See the module docs.
pub(crate) async fn measure(server: &Server, fig: &mut RunFigures) -> Res<()> {
    let mut mcp = McpSession::open(server, "mcp-bench").await?;
    let tools = mcp.request("tools/list", json!({})).await?;
    let tools = tools["tools"]
        .as_array()
        .ok_or_else(|| format!("mcp: tools/list gave {tools}"))?;
    let described: usize = tools
        .iter()
        .filter_map(|t| t["description"].as_str())
        .map(|d| d.chars().count())
        .sum();
    let defined: usize = tools
        .iter()
        .map(|t| {
            json!({"name": t["name"], "description": t["description"], "inputSchema": t["inputSchema"]})
                .to_string()
                .chars()
                .count()
        })
        .sum();
    fig.value(DESCRIPTIONS, described as f64, None);
    fig.value(DEFINITIONS, defined as f64, None);
    // The endpoint made the session's sandbox; a create for the same key
    // reconnects to it.
    let created = server
        .post("/v1/sandboxes", json!({"sessionKey": "mcp-bench"}))
        .await?;
    let sid = created["sandboxId"]
        .as_str()
        .ok_or_else(|| format!("mcp: create gave {created}"))?
        .to_string();
    let run = format!("/v1/sandboxes/{sid}/commands:run");
    let (mut over_mcp, mut over_rest) = (Vec::new(), Vec::new());
    for i in 0..23 {
        let mut pair = [0.0; 2];
        for via_mcp in if i % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        } {
            let t = Instant::now();
            if via_mcp {
                let r = mcp
                    .request(
                        "tools/call",
                        json!({"name": "bash", "arguments": {"command": "true"}}),
                    )
                    .await?;
                pair[0] = ms(t.elapsed());
                if r["isError"] == true {
                    return Err(format!("mcp: bash true: {r}").into());
                }
            } else {
                let v = server.post(&run, json!({"command": "true"})).await?;
                pair[1] = ms(t.elapsed());
                if v["exitCode"] != 0 {
                    return Err(format!("mcp: commands:run true: {v}").into());
                }
            }
        }
        if i >= 3 {
            over_mcp.push(pair[0]);
            over_rest.push(pair[1]);
        }
    }
    fig.p50(BASH, &over_mcp, &over_rest);
    server
        .post(&format!("/v1/sandboxes/{sid}:stop"), json!(null))
        .await?;
    Ok(())
}
