//! The admin token: with one set, every route but health needs it
//! (`/metrics` included) in one of the three headers; no token, a wrong
//! one, an empty bearer or the token in the query string get 401 and
//! change nothing, and the token is never logged.

use serde_json::json;

use crate::harness::{ServerOptions, TestServer};

#[tokio::test]
async fn token_guards_every_route_but_health() {
    let token = "t0ken-Very-Secret-42";
    let server = TestServer::start_with(ServerOptions::default().token(token)).await;
    let c = &server.client;
    let base = &server.base;
    let routes: Vec<(&str, String)> = vec![
        ("GET", "/v1/sandboxes".into()),
        ("POST", "/v1/sandboxes".into()),
        ("GET", "/v1/sandboxes/0123456789abcdef01234567".into()),
        ("POST", "/v1/sandboxes/0123456789abcdef01234567:stop".into()),
        (
            "POST",
            "/v1/sandboxes/0123456789abcdef01234567:restart".into(),
        ),
    ];
    let body = json!({"sessionKey": "should-never-exist"});
    for (method, path) in &routes {
        let url = format!("{base}{path}");
        let attempts: Vec<reqwest::RequestBuilder> = vec![
            c.request(method.parse().expect("method"), &url),
            c.request(method.parse().expect("method"), &url)
                .header("x-sandboxd-admin-token", "wrong"),
            c.request(method.parse().expect("method"), &url)
                .header("authorization", "Bearer "),
            c.request(
                method.parse().expect("method"),
                format!("{url}?token={token}"),
            ),
            c.request(
                method.parse().expect("method"),
                format!("{url}?admin_token={token}"),
            ),
        ];
        for rb in attempts {
            let resp = rb.json(&body).send().await.expect("send");
            assert_eq!(resp.status().as_u16(), 401, "{method} {path}");
            let v: serde_json::Value = resp.json().await.expect("json error");
            assert_eq!(v["code"], "unauthorized");
        }
    }
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
    let routes: Vec<(&str, String)> = vec![
        ("GET", "/metrics".into()),
        ("GET", "/v1/sandboxes".into()),
        ("POST", "/v1/sandboxes".into()),
        ("GET", format!("/v1/sandboxes/{sid}")),
        ("POST", format!("/v1/sandboxes/{sid}:restart")),
        ("POST", format!("/v1/sandboxes/{sid}:stop")),
        ("GET", format!("/v1/sandboxes/{sid}/commands")),
        ("POST", format!("/v1/sandboxes/{sid}/commands")),
        ("POST", format!("/v1/sandboxes/{sid}/commands:run")),
        ("GET", format!("/v1/sandboxes/{sid}/commands/{cid}/wait")),
        ("GET", format!("/v1/sandboxes/{sid}/commands/{cid}/logs")),
        ("POST", format!("/v1/sandboxes/{sid}/commands/{cid}:kill")),
        ("GET", format!("/v1/sandboxes/{sid}/files:read?path=a")),
        ("POST", format!("/v1/sandboxes/{sid}/files:write")),
        ("GET", format!("/v1/sandboxes/{sid}/files:list")),
        ("POST", format!("/v1/sandboxes/{sid}/files:delete")),
        ("GET", format!("/v1/sandboxes/{sid}/ports/3000")),
    ];
    let body = json!({"sessionKey": "x", "command": "touch /workspace/pwned", "files": [{"path": "pwned", "contentBase64": ""}], "paths": ["a"]});
    for (method, path) in &routes {
        let url = format!("{}{path}", server.base);
        let sep = if path.contains('?') { '&' } else { '?' };
        for rb in [
            server.client.request(method.parse().expect("method"), &url),
            server
                .client
                .request(method.parse().expect("method"), &url)
                .header("x-sandboxd-admin-token", "nope"),
            server
                .client
                .request(method.parse().expect("method"), &url)
                .header("authorization", "Bearer "),
            server.client.request(
                method.parse().expect("method"),
                format!("{url}{sep}token={token}"),
            ),
        ] {
            let resp = rb.json(&body).send().await.expect("send");
            assert_eq!(resp.status(), 401, "{method} {path}");
        }
    }
    // Nothing happened: the sandbox and its command run, nothing was written.
    let (s, view) = server.get(&format!("/v1/sandboxes/{sid}")).await;
    assert_eq!(s, 200);
    assert_eq!(view["runningCommands"], 1);
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
