//! The admin token: with one set, every route but health needs it in one of
//! the three headers; no token, a wrong one, an empty bearer or the token
//! in the query string get 401 and change nothing, and the token is never
//! logged.

use crate::harness::{ServerOptions, TestServer};
use serde_json::json;

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
