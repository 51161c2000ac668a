//! `GET /v1/health`: answered without a token, with the engine's name and
//! version when the engine answers.

use crate::harness::TestServer;

#[tokio::test]
async fn health_reports_the_engine_version() {
    let server = TestServer::start().await;
    let expected = server
        .docker
        .version()
        .await
        .expect("engine version")
        .version;
    let (status, body) = server.get("/v1/health").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ok"], true);
    assert_eq!(body["engine"], "docker");
    assert_eq!(body["version"].as_str(), expected.as_deref());
}
