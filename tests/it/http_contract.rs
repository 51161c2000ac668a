//! The HTTP contract in process, without an engine, through
//! `tower::ServiceExt::oneshot`: whatever arrives (method, path, headers,
//! body), the answer is JSON and never a 500 or a panic.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use sandboxd::app::App;
use sandboxd::config::Config;
use tower::ServiceExt;

fn config(token: Option<&str>) -> Config {
    let token = token.map(str::to_string);
    Config::from_toml_and_env("max_body_bytes = 4096", move |k| match k {
        "SANDBOXD_ADMIN_TOKEN" => token.clone(),
        _ => None,
    })
    .expect("config")
}

/// Answers `req` as a loopback client sends it (with `Host: localhost`
/// unless it names a Host of its own).
async fn answer(token: Option<&str>, mut req: Request<Body>) -> (StatusCode, serde_json::Value) {
    req.headers_mut()
        .entry(axum::http::header::HOST)
        .or_insert(axum::http::HeaderValue::from_static("localhost"));
    let router = sandboxd::api::router(App::new(config(token)));
    let resp = router.oneshot(req).await.expect("infallible");
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    // HEAD answers carry no body by definition.
    let json = if bytes.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|_| {
            panic!(
                "non-JSON answer {status}: {:?}",
                String::from_utf8_lossy(&bytes)
            )
        })
    };
    (status, json)
}

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("v1".to_string()),
        Just("sandboxes".to_string()),
        Just("health".to_string()),
        Just("0123456789abcdef01234567".to_string()),
        Just("0123456789abcdef01234567:stop".to_string()),
        Just("x:restart".to_string()),
        Just(":".to_string()),
        Just("%2e%2e".to_string()),
        Just("..".to_string()),
        "[a-zA-Z0-9:._~%-]{0,12}",
        "\\PC{0,6}".prop_map(|s| s
            .chars()
            .filter(|c| !c.is_whitespace() && *c != '?' && *c != '#')
            .collect()),
    ]
}

fn method() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just("GET"),
        Just("POST"),
        Just("PUT"),
        Just("DELETE"),
        Just("PATCH"),
        Just("HEAD")
    ]
}

proptest! {
    // Failing cases are kept next to this file, in
    // http_contract.proptest-regressions (proptest's default would be a
    // proptest-regressions/ directory beside tests/it, the crate root of
    // this test binary).
    #![proptest_config(ProptestConfig {
        cases: 300,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn any_request_gets_json_and_no_500(
        m in method(),
        segs in proptest::collection::vec(segment(), 0..5),
        body in proptest::collection::vec(any::<u8>(), 0..600),
        json_ct in any::<bool>(),
        with_token in any::<bool>(),
    ) {
        let path = format!("/{}", segs.join("/"));
        let Ok(uri) = path.parse::<axum::http::Uri>() else { return Ok(()); };
        let mut builder = Request::builder().method(m).uri(uri);
        if json_ct {
            builder = builder.header("content-type", "application/json");
        }
        if with_token {
            builder = builder.header("x-sandboxd-admin-token", "tok");
        }
        let req = builder.body(Body::from(body)).expect("request");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
        let (status, json) = rt.block_on(answer(Some("tok"), req));
        prop_assert!(status != StatusCode::INTERNAL_SERVER_ERROR, "{} {} -> {}", m, path, json);
        if m != "HEAD" {
            prop_assert!(json.get("code").is_some() || json.get("ok").is_some(), "{} {} -> {}", m, path, json);
        }
        if !with_token && path.starts_with("/v1/sandboxes") && status != StatusCode::NOT_FOUND && status != StatusCode::METHOD_NOT_ALLOWED {
            prop_assert_eq!(status, StatusCode::UNAUTHORIZED);
        }
    }

    #[test]
    fn any_create_body_is_4xx_or_engine_unavailable(body in "\\PC{0,300}") {
        let req = Request::builder()
            .method("POST")
            .uri("/v1/sandboxes")
            .header("content-type", "application/json")
            .body(Body::from(body))
            .expect("request");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
        let (status, json) = rt.block_on(answer(None, req));
        prop_assert!(
            status.is_client_error() || status == StatusCode::SERVICE_UNAVAILABLE,
            "{} {}", status, json
        );
    }
}

#[tokio::test]
async fn unknown_route_and_method_are_json() {
    let (s, j) = answer(
        None,
        Request::get("/nope").body(Body::empty()).expect("req"),
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(j["code"], "not_found");
    let (s, j) = answer(
        None,
        Request::delete("/v1/health")
            .body(Body::empty())
            .expect("req"),
    )
    .await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(j["code"], "method_not_allowed");
}

#[tokio::test]
async fn deeply_nested_json_is_a_400() {
    let body = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let config = Config::from_toml_and_env("max_body_bytes = 1000000", |_| None).expect("config");
    let router = sandboxd::api::router(App::new(config));
    let req = Request::post("/v1/sandboxes")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Body::from(body))
        .expect("req");
    let resp = router.oneshot(req).await.expect("infallible");
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
}
