//! The admin token: with one set, every route but health needs it
//! (`/metrics` included) in one of the three headers; no token, a wrong
//! one, an empty bearer or the token in the query string get 401 and
//! change nothing, and the token is never logged. The routes are every
//! operation docs/openapi.json documents, not a hand-kept list, so a new
//! route is covered the day it is documented; the terminal attach, which
//! also takes a single-use ticket, is refused without either.

use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::harness::{ServerOptions, TestServer};

/// One documented operation: method, path template, operationId.
struct Operation {
    method: String,
    path: String,
    id: String,
}

/// Every operation of docs/openapi.json but health, which answers
/// without a token by design.
fn documented_operations() -> Vec<Operation> {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json");
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(file).expect("docs/openapi.json"))
            .expect("docs/openapi.json is JSON");
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            if !["get", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                continue;
            }
            let id = op["operationId"].as_str().expect("operationId");
            if id != "health" {
                ops.push(Operation {
                    method: method.to_uppercase(),
                    path: path.clone(),
                    id: id.to_string(),
                });
            }
        }
    }
    // A guard against an empty or partial derivation: the routes a
    // hand-kept list once missed are there.
    let ids: Vec<&str> = ops.iter().map(|o| o.id.as_str()).collect();
    for must in [
        "create_sandbox",
        "stat_files",
        "search_files",
        "open_pty",
        "list_ptys",
        "attach_pty",
        "kill_pty",
        "pty_ticket",
        "metrics",
    ] {
        assert!(ids.contains(&must), "{must} in docs/openapi.json: {ids:?}");
    }
    assert!(
        ops.iter().any(|o| o.path.ends_with("/files:stat"))
            && ops.iter().any(|o| o.path.ends_with("/files:search")),
        "files:stat and files:search are documented"
    );
    assert!(ops.len() >= 24, "{} operations: {ids:?}", ops.len());
    ops
}

/// `template` with its path parameters replaced from `values`; a parameter
/// without a value fails the test, so a new kind of id is not skipped.
fn fill(template: &str, values: &[(&str, &str)]) -> String {
    let mut path = template.to_string();
    for (name, value) in values {
        path = path.replace(&format!("{{{name}}}"), value);
    }
    assert!(
        !path.contains('{'),
        "no value for a path parameter of {template}: {path}"
    );
    path
}

/// The URL's query-string token attempt. The attach route takes a
/// `ticket` parameter and refuses unknown ones, so there the token is
/// offered as a ticket (which it must not be good for).
fn with_query_token(op: &Operation, url: &str, name: &str, token: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    if op.id == "attach_pty" {
        format!("{url}{sep}ticket={token}")
    } else {
        format!("{url}{sep}{name}={token}")
    }
}

/// A WebSocket upgrade of the attach route with the given headers: the
/// HTTP status it is refused with (or 101).
async fn upgrade_status(url: &str, headers: &[(&'static str, &str)]) -> u16 {
    let mut req = url
        .replacen("http://", "ws://", 1)
        .into_client_request()
        .expect("request");
    for (k, v) in headers {
        req.headers_mut().insert(*k, v.parse().expect("header"));
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok(_) => 101,
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => resp.status().as_u16(),
        Err(e) => panic!("upgrade: {e}"),
    }
}

#[tokio::test]
async fn token_guards_every_route_but_health() {
    let token = "t0ken-Very-Secret-42";
    let server = TestServer::start_with(ServerOptions::default().token(token)).await;
    let c = &server.client;
    let base = &server.base;
    // Ids of nothing: the route matches, no sandbox is touched.
    let values = [
        ("id", "0123456789abcdef01234567"),
        ("cid", "0123456789abcdef01234568"),
        ("ptyId", "0123456789abcdef01234569"),
        ("port", "3000"),
        ("sessionKey", "should-never-exist"),
        ("tokenId", "0123456789abcdef"),
        ("cp", "0123456789abcdef"),
    ];
    let body = json!({"sessionKey": "should-never-exist"});
    let ops = documented_operations();
    for op in &ops {
        let path = fill(&op.path, &values);
        let url = format!("{base}{path}");
        let method: reqwest::Method = op.method.parse().expect("method");
        let attempts: Vec<reqwest::RequestBuilder> = vec![
            c.request(method.clone(), &url),
            c.request(method.clone(), &url)
                .header("x-sandboxd-admin-token", "wrong"),
            c.request(method.clone(), &url)
                .header("authorization", "Bearer "),
            c.request(method.clone(), with_query_token(op, &url, "token", token)),
            c.request(
                method.clone(),
                with_query_token(op, &url, "admin_token", token),
            ),
        ];
        for rb in attempts {
            let resp = rb.json(&body).send().await.expect("send");
            assert_eq!(resp.status().as_u16(), 401, "{} {path}", op.method);
            let v: Value = resp.json().await.expect("json error");
            assert_eq!(v["code"], "unauthorized", "{} {path}", op.method);
        }
        // The control: with the token the same request passes the check
        // (whatever the route then says of ids of nothing, or of a body
        // that is not an object), so the 401s above are the token's.
        let resp = c
            .request(method, &url)
            .header("x-sandboxd-admin-token", token)
            .json(&json!([]))
            .send()
            .await
            .expect("send");
        let status = resp.status().as_u16();
        let v: Value = resp.json().await.unwrap_or(Value::Null);
        assert!(
            status != 401 && v["code"] != "unauthorized",
            "with the token, {} {path} passes the check: {status} {v}",
            op.method
        );
    }
    // The attach as a browser makes it, a WebSocket upgrade: refused
    // without the token's headers or a ticket.
    let attach = ops
        .iter()
        .find(|o| o.id == "attach_pty")
        .expect("attach_pty");
    let url = format!("{base}{}", fill(&attach.path, &values));
    assert_eq!(upgrade_status(&url, &[]).await, 401, "no credential");
    assert_eq!(
        upgrade_status(&url, &[("x-sandboxd-admin-token", "wrong")]).await,
        401,
        "a wrong token"
    );
    assert_eq!(
        upgrade_status(&format!("{url}?ticket=not-a-ticket"), &[]).await,
        401,
        "a ticket never issued"
    );
    assert!(
        server.containers().await.is_empty(),
        "nothing created without a token"
    );
    assert!(server.volumes().await.is_empty());

    // Health needs no token; each accepted header works.
    assert_eq!(
        c.get(format!("{base}/v1/health"))
            .send()
            .await
            .expect("send")
            .status(),
        200
    );
    for (name, value) in [
        ("x-sandboxd-admin-token", token.to_string()),
        ("x-remcochat-admin-token", token.to_string()),
        ("authorization", format!("Bearer {token}")),
    ] {
        let resp = c
            .get(format!("{base}/v1/sandboxes"))
            .header(name, value)
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status(), 200, "{name}");
    }
    assert!(
        !server.log_text().contains(token),
        "the token must never be logged"
    );
}

#[tokio::test]
async fn every_route_needs_the_token() {
    let token = "all-routes-token";
    let server = TestServer::start_with(ServerOptions::default().token(token)).await;
    let sid = server
        .create(json!({"sessionKey": "t", "network": {"mode": "none"}, "ports": [3000]}))
        .await;
    let (_, v) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands"),
            json!({"command": "sleep 30"}),
        )
        .await;
    let cid = v["commandId"].as_str().expect("cid").to_string();
    let (s, v) = server
        .post(
            &format!("/v1/sandboxes/{sid}/ptys"),
            json!({"command": "sleep 600"}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let pty = v["ptyId"].as_str().expect("ptyId").to_string();
    let (s, v) = server.post("/v1/sessions/t/tokens", json!({})).await;
    assert_eq!(s, 201, "{v}");
    let token_id = v["id"].as_str().expect("token id").to_string();
    // Real ids, so that nothing but the token stands between a request
    // and its effect.
    let values = [
        ("id", sid.as_str()),
        ("cid", cid.as_str()),
        ("ptyId", pty.as_str()),
        ("port", "3000"),
        ("sessionKey", "t"),
        ("tokenId", token_id.as_str()),
        ("cp", "0123456789abcdef"),
    ];
    let body = json!({"sessionKey": "x", "command": "touch /workspace/pwned", "files": [{"path": "pwned", "contentBase64": ""}], "paths": ["a"], "pattern": "x"});
    for op in documented_operations() {
        let path = fill(&op.path, &values);
        let url = format!("{}{path}", server.base);
        let method: reqwest::Method = op.method.parse().expect("method");
        for rb in [
            server.client.request(method.clone(), &url),
            server
                .client
                .request(method.clone(), &url)
                .header("x-sandboxd-admin-token", "nope"),
            server
                .client
                .request(method.clone(), &url)
                .header("authorization", "Bearer "),
            server
                .client
                .request(method.clone(), with_query_token(&op, &url, "token", token)),
        ] {
            let resp = rb.json(&body).send().await.expect("send");
            assert_eq!(resp.status(), 401, "{} {path} ({})", op.method, op.id);
        }
        if op.id == "attach_pty" {
            assert_eq!(upgrade_status(&url, &[]).await, 401, "attach {path}");
        }
    }
    // Nothing happened: the sandbox, its command and its terminal run,
    // the session's token is live, nothing was written.
    let (s, tokens) = server.get("/v1/sessions/t/tokens").await;
    assert_eq!(
        (s, tokens["tokens"][0]["id"].clone()),
        (200, json!(token_id)),
        "{tokens}"
    );
    let (s, view) = server.get(&format!("/v1/sandboxes/{sid}")).await;
    assert_eq!(s, 200);
    assert_eq!(view["runningCommands"], 1);
    let (s, ptys) = server.get(&format!("/v1/sandboxes/{sid}/ptys")).await;
    assert_eq!(s, 200, "{ptys}");
    let listed = ptys["ptys"]
        .as_array()
        .map(|l| {
            l.iter()
                .filter(|p| p["ptyId"] == pty.as_str())
                .map(|p| p["state"].clone())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    assert_eq!(
        listed,
        [json!("running")],
        "the terminal still runs: {ptys}"
    );
    assert_eq!(
        server
            .containers_with("sandboxd.role", "sandbox")
            .await
            .len(),
        1
    );
    let (code, out) = server.docker_exec(&sid, "ls -A /workspace").await;
    assert_eq!((code, out.as_str()), (0, ""));
}
