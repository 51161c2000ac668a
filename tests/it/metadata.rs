//! A sandbox's metadata: given at create, shown with the sandbox, kept
//! across a restart of sandboxd (it lives in the labels, a claimed pool
//! member's on its claim), filtered on in the list, and refused when out
//! of bounds.

use serde_json::{Value, json};

use crate::harness::TestServer;

/// The ids the list answers for `query` (a list is no use of them).
pub(crate) async fn listed(server: &TestServer, query: &str) -> Vec<String> {
    let (status, v) = server.get(&format!("/v1/sandboxes{query}")).await;
    assert_eq!(status, 200, "{v}");
    v["sandboxes"]
        .as_array()
        .expect("sandboxes")
        .iter()
        .filter_map(|s| s["sandboxId"].as_str().map(String::from))
        .collect()
}

#[tokio::test]
async fn metadata_is_kept_shown_and_filtered_on() {
    let mut server = TestServer::start().await;
    let tagged = server
        .create(json!({"sessionKey": "a", "network": {"mode": "none"},
            "metadata": {"user-id": "42", "purpose": "eval, with = signs"}}))
        .await;
    let other = server
        .create(
            json!({"sessionKey": "b", "network": {"mode": "none"}, "metadata": {"user-id": "7"}}),
        )
        .await;
    let plain = server
        .create(json!({"sessionKey": "c", "network": {"mode": "none"}}))
        .await;

    let (_, v) = server.get(&format!("/v1/sandboxes/{tagged}")).await;
    assert_eq!(
        v["metadata"],
        json!({"user-id": "42", "purpose": "eval, with = signs"})
    );
    let (_, v) = server.get(&format!("/v1/sandboxes/{plain}")).await;
    assert_eq!(v["metadata"], json!({}));

    let all = listed(&server, "").await;
    assert!(
        [&tagged, &other, &plain].iter().all(|id| all.contains(id)),
        "{all:?}"
    );
    assert_eq!(
        listed(&server, "?metadata.user-id=42").await,
        vec![tagged.clone()]
    );
    assert_eq!(
        listed(
            &server,
            "?metadata.user-id=42&metadata.purpose=eval%2C%20with%20%3D%20signs"
        )
        .await,
        vec![tagged.clone()]
    );
    assert!(
        listed(&server, "?metadata.user-id=42&metadata.purpose=x")
            .await
            .is_empty()
    );
    assert_eq!(
        listed(&server, "?metadata.user-id=7").await,
        vec![other.clone()]
    );

    // Kept across a restart of sandboxd: read back from the labels.
    server.restart().await;
    let (_, v) = server.get(&format!("/v1/sandboxes/{tagged}")).await;
    assert_eq!(
        v["metadata"],
        json!({"user-id": "42", "purpose": "eval, with = signs"})
    );
    assert_eq!(listed(&server, "?metadata.user-id=42").await, vec![tagged]);

    // A create that finds the session's sandbox keeps its metadata.
    let (status, v) = server
        .post(
            "/v1/sandboxes",
            json!({"sessionKey": "b", "network": {"mode": "none"}, "metadata": {"user-id": "8"}}),
        )
        .await;
    assert_eq!((status, v["created"].clone()), (200, json!(false)), "{v}");
    assert_eq!(listed(&server, "?metadata.user-id=7").await, vec![other]);
}

#[tokio::test]
async fn metadata_out_of_bounds_is_refused_by_field() {
    let server = TestServer::start().await;
    let many: serde_json::Map<String, Value> =
        (0..33).map(|i| (format!("k{i}"), json!("v"))).collect();
    for (metadata, field) in [
        (json!({"bad key": "v"}), "metadata"),
        (json!({"k": "v".repeat(1025)}), "metadata.k"),
        (Value::Object(many), "metadata"),
        (json!({"k": 1}), ""),
    ] {
        let (status, v) = server
            .post(
                "/v1/sandboxes",
                json!({"sessionKey": "x", "metadata": metadata}),
            )
            .await;
        assert_eq!(status, 400, "{v}");
        assert!(
            v["error"].as_str().unwrap_or("").contains(field),
            "{field}: {v}"
        );
    }
    for query in ["?user-id=42", "?metadata.bad%20key=1"] {
        let (status, v) = server.get(&format!("/v1/sandboxes{query}")).await;
        assert_eq!(
            (status, v["code"].clone()),
            (400, json!("invalid_request")),
            "{query}: {v}"
        );
    }
    assert!(listed(&server, "").await.is_empty(), "nothing was made");
}
