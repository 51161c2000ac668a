//! The store against a real state directory: what is kept (hashes only),
//! what verifies, expiry, limits, reload, and a corrupt file.

use super::*;

/// A store over a fresh temporary directory (removed on drop).
struct Fixture {
    dir: PathBuf,
    store: Arc<SessionTokens>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn config(dir: &std::path::Path, max_ttl_ms: &str) -> Config {
    let dir = dir.display().to_string();
    let max = max_ttl_ms.to_string();
    Config::from_toml_and_env("", move |k| match k {
        "SANDBOXD_STATE_DIR" => Some(dir.clone()),
        "SANDBOXD_SESSION_TOKEN_TTL_MS" => Some("1000".into()),
        "SANDBOXD_SESSION_TOKEN_MAX_TTL_MS" => Some(max.clone()),
        _ => None,
    })
    .expect("config")
}

fn fixture() -> Fixture {
    let dir = std::env::temp_dir().join(format!(
        "sandboxd-tokens-{}-{}",
        std::process::id(),
        random_hex(4).expect("random")
    ));
    let store = Arc::new(SessionTokens::new(&config(&dir, "86400000")));
    store.load().expect("load an empty dir");
    Fixture { dir, store }
}

fn ttl(ms: i64) -> TokenRequest {
    TokenRequest { ttl_ms: Some(ms) }
}

#[tokio::test]
async fn a_token_verifies_for_its_session_only_and_only_as_made() {
    let f = fixture();
    let a = f.store.issue("chat:a", ttl(60_000)).await.expect("issue");
    let b = f.store.issue("chat:b", ttl(60_000)).await.expect("issue");
    assert!(a.token.starts_with(TOKEN_PREFIX));
    let secret = &a.token[TOKEN_PREFIX.len()..];
    assert!(
        crate::id::is_hex_id(secret, 64),
        "256 bits as hex: {secret}"
    );
    assert_ne!(a.token, b.token);
    assert!(f.store.verify("chat:a", &a.token), "positive control");
    assert!(!f.store.verify("chat:b", &a.token), "another session's");
    assert!(!f.store.verify("chat:a", &b.token));
    let mut altered = a.token.clone();
    altered.pop();
    altered.push(if a.token.ends_with('0') { '1' } else { '0' });
    assert!(!f.store.verify("chat:a", &altered));
    assert!(!f.store.verify("chat:a", ""));
    assert!(!f.store.verify("chat:a", &a.id), "the id is no token");
}

#[tokio::test]
async fn the_file_holds_hashes_never_a_token_and_reloads() {
    let f = fixture();
    let a = f.store.issue("chat:a", ttl(60_000)).await.expect("issue");
    let path = f.store.path().expect("path");
    let text = std::fs::read_to_string(&path).expect("read the file");
    assert!(!text.contains(&a.token[TOKEN_PREFIX.len()..]), "{text}");
    let hex: String = sha256(&a.token)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert!(text.contains(&hex), "the hash is kept: {text}");

    let again = SessionTokens::new(&config(&f.dir, "86400000"));
    assert_eq!(again.load().expect("reload"), 1);
    assert!(again.verify("chat:a", &a.token), "a new process accepts it");
    assert_eq!(
        again.list("chat:a").expect("list"),
        f.store.list("chat:a").expect("list")
    );
}

#[tokio::test]
async fn revocation_is_saved_and_an_unknown_id_is_not_found() {
    let f = fixture();
    let a = f.store.issue("chat:a", ttl(60_000)).await.expect("issue");
    let a2 = f.store.issue("chat:a", ttl(60_000)).await.expect("issue");
    let b = f.store.issue("chat:b", ttl(60_000)).await.expect("issue");
    assert!(
        matches!(
            f.store.revoke("chat:b", &a.id).await,
            Err(TokenError::NotFound(_))
        ),
        "another session's id is unknown here"
    );
    f.store.revoke("chat:a", &a.id).await.expect("revoke");
    assert!(!f.store.verify("chat:a", &a.token));
    assert!(f.store.verify("chat:a", &a2.token));
    assert_eq!(f.store.revoke_all("chat:a").await.expect("all"), 1);
    assert!(!f.store.verify("chat:a", &a2.token));
    assert!(
        f.store.verify("chat:b", &b.token),
        "other sessions keep theirs"
    );

    let again = SessionTokens::new(&config(&f.dir, "86400000"));
    again.load().expect("reload");
    assert!(!again.verify("chat:a", &a.token) && !again.verify("chat:a", &a2.token));
    assert!(again.verify("chat:b", &b.token));
}

#[tokio::test]
async fn an_expired_token_is_refused_unlisted_and_pruned_from_the_file() {
    let f = fixture();
    let short = f.store.issue("chat:a", ttl(1_000)).await.expect("issue");
    let long = f.store.issue("chat:a", ttl(60_000)).await.expect("issue");
    assert!(f.store.verify("chat:a", &short.token), "positive control");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert!(!f.store.verify("chat:a", &short.token));
    let ids: Vec<String> = f
        .store
        .list("chat:a")
        .expect("list")
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(ids, std::slice::from_ref(&long.id));
    f.store.prune().await.expect("prune");
    let text = std::fs::read_to_string(f.store.path().expect("path")).expect("read");
    assert!(!text.contains(&short.id), "pruned from the file: {text}");
    assert!(text.contains(&long.id));
}

#[tokio::test]
async fn ttls_out_of_range_and_bad_keys_are_refused_by_field_and_store_nothing() {
    let f = fixture();
    for req in [ttl(999), ttl(86_400_001), ttl(-1)] {
        match f.store.issue("chat:a", req).await {
            Err(TokenError::Invalid(e)) => assert_eq!(e.field, "ttlMs"),
            other => panic!("{other:?}"),
        }
    }
    match f
        .store
        .issue(&"k".repeat(257), TokenRequest::default())
        .await
    {
        Err(TokenError::Invalid(e)) => assert_eq!(e.field, "sessionKey"),
        other => panic!("{other:?}"),
    }
    assert!(f.store.list("chat:a").expect("list").is_empty());
    let issued = f
        .store
        .issue("chat:a", TokenRequest::default())
        .await
        .expect("default ttl");
    assert_eq!(
        issued.expires_at - issued.created_at,
        1_000,
        "the configured default"
    );
}

#[tokio::test]
async fn a_session_holds_at_most_its_share_of_tokens() {
    let f = fixture();
    for _ in 0..MAX_PER_SESSION {
        f.store.issue("chat:a", ttl(60_000)).await.expect("issue");
    }
    assert!(matches!(
        f.store.issue("chat:a", ttl(60_000)).await,
        Err(TokenError::TooManyForSession)
    ));
    f.store
        .issue("chat:b", ttl(60_000))
        .await
        .expect("another session still may");
}

#[tokio::test]
async fn a_corrupt_file_stops_the_load_and_is_left_alone() {
    let f = fixture();
    let path = f.store.path().expect("path");
    std::fs::write(&path, "{\"version\": 1, \"tokens\": [").expect("corrupt it");
    let again = SessionTokens::new(&config(&f.dir, "86400000"));
    match again.load() {
        Err(TokenError::Load(e)) => assert!(e.contains(&path.display().to_string()), "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        std::fs::read_to_string(&path).expect("read"),
        "{\"version\": 1, \"tokens\": [",
        "nothing overwrote it"
    );
}

#[tokio::test]
async fn a_failed_save_changes_nothing() {
    let f = fixture();
    let a = f.store.issue("chat:a", ttl(60_000)).await.expect("issue");
    // A directory where the temporary file goes: the write fails.
    let tmp = f.dir.join(format!("{}.tmp", state_file::FILE_NAME));
    std::fs::create_dir(&tmp).expect("block the temporary file");
    assert!(matches!(
        f.store.revoke("chat:a", &a.id).await,
        Err(TokenError::Save(_))
    ));
    assert!(
        f.store.verify("chat:a", &a.token),
        "still live: the revocation was not saved"
    );
    std::fs::remove_dir(&tmp).expect("unblock");
    f.store.revoke("chat:a", &a.id).await.expect("revoke");
}
