//! `files:search` cannot be made to hang by what a request carries: the
//! most and longest globs the API takes, built to blow up a matcher that
//! expands braces or backtracks on stars, get an answer within the
//! search's own deadline (three quarters of `agent_timeout_ms`), from the
//! built-in search and from `rg`: refused past the bytes the agent
//! compiles, run with as many as fit; the sandbox's next search still
//! works.
//! (tests/it/files.rs has what searches find.)

use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::{ServerOptions, TestServer, b64};

/// sandboxd's `agent_timeout_ms` here; the search stops at three quarters
/// of it (src/files/mod.rs), which is the bound the answers are held to.
const AGENT_TIMEOUT_MS: u64 = 4000;
const SEARCH_DEADLINE: Duration = Duration::from_millis(AGENT_TIMEOUT_MS * 3 / 4);
/// The way to the agent and back (HTTP, the agent's connection, the
/// answer's encoding), on top of the deadline.
const TRANSPORT: Duration = Duration::from_millis(1000);

/// Glob `i` of the bomb, 4096 bytes (the API's longest): 682 brace pairs
/// whose alternatives both start with a star, then `*[c]`. Expanded, it
/// is 2^682 globs; matched by backtracking, every star tries every split
/// of the name. Compiled to an automaton, it is a few thousand states.
/// As a language it is `*c`: any name that ends in `c`. The letters vary
/// with `i`, so that no two globs are the same.
fn bomb_glob(i: usize) -> String {
    let mut g: String = (0..682)
        .map(|j| format!("{{*{},*}}", char::from(b'a' + ((i + j) % 26) as u8)))
        .collect();
    g.push_str("*[c]");
    assert_eq!(g.len(), 4096);
    g
}

#[tokio::test]
async fn a_brace_and_star_bomb_answers_within_the_deadline_and_the_next_search_works() {
    let server = TestServer::start_with(
        ServerOptions::default().env("SANDBOXD_AGENT_TIMEOUT_MS", &AGENT_TIMEOUT_MS.to_string()),
    )
    .await;
    let sid = server.offline_sandbox().await;
    // A name of many a's and b's gives the stars the most to try.
    let long_name = format!("{}.txt", "ab".repeat(100));
    let (s, v) = server
        .write_files(
            &sid,
            json!([
                {"path": "needle.txt", "contentBase64": b64(b"a needle\n")},
                {"path": format!("dir/{long_name}"), "contentBase64": b64(b"needle too\n")},
            ]),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let bomb: Vec<String> = (0..100).map(bomb_glob).collect();
    for engine in ["builtin", "auto"] {
        // All 100: over the 32 KiB the agent compiles at most, refused at
        // once (compiling them would take longer than the deadline under
        // gVisor).
        let started = Instant::now();
        let (s, v) = server
            .search(
                &sid,
                json!({"pattern": "needle", "globs": bomb, "engine": engine}),
            )
            .await;
        let took = started.elapsed();
        eprintln!("{engine}: 100 bomb globs answered in {took:?}");
        assert!(
            took <= SEARCH_DEADLINE + TRANSPORT,
            "{engine}: 100 bomb globs took {took:?}, past the search's deadline of {SEARCH_DEADLINE:?}: {s} {v}"
        );
        assert_eq!(
            (s, v["code"].clone(), v["error"].clone()),
            (
                400,
                json!("invalid_request"),
                json!("globs: 409600 bytes together, at most 32768")
            ),
            "{engine}"
        );
        // The 8 that fit compile, and the search runs with them.
        let started = Instant::now();
        let (s, v) = server
            .search(
                &sid,
                json!({"pattern": "needle", "globs": bomb[..8], "engine": engine}),
            )
            .await;
        let took = started.elapsed();
        eprintln!("{engine}: 8 bomb globs answered in {took:?}");
        assert!(
            took <= SEARCH_DEADLINE + TRANSPORT,
            "{engine}: 8 bomb globs took {took:?}, past the search's deadline of {SEARCH_DEADLINE:?}: {s} {v}"
        );
        assert_eq!(s, 200, "{engine}: {v}");
        // Every glob includes and none matches either file (neither name
        // ends in c): nothing is searched, and that is known, not a count
        // cut short by the deadline.
        assert_eq!(
            (
                v["timedOut"].clone(),
                v["totalMatches"].clone(),
                v["filesSearched"].clone(),
                v["usedRg"].clone()
            ),
            (json!(false), json!(0), json!(0), json!(engine == "auto")),
            "{engine}: {v}"
        );
    }
    // The sandbox's search thread is free: the next search finds both
    // files (the positive control that the globs, not the files, left
    // them out above).
    let started = Instant::now();
    let (s, v) = server
        .search(&sid, json!({"pattern": "needle", "engine": "builtin"}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert!(started.elapsed() <= SEARCH_DEADLINE + TRANSPORT);
    let paths: Vec<&str> = v["matches"]
        .as_array()
        .expect("matches")
        .iter()
        .filter_map(|m| m["path"].as_str())
        .collect();
    assert_eq!(
        paths,
        [
            format!("/workspace/dir/{long_name}").as_str(),
            "/workspace/needle.txt"
        ],
        "{v}"
    );
    assert_eq!(v["timedOut"], false, "{v}");
    // A bomb glob that matches is applied, not skipped: a name ending in
    // `c` is included.
    let (s, v) = server
        .write_files(
            &sid,
            json!([{"path": "abc", "contentBase64": b64(b"needle\n")}]),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = server
        .search(
            &sid,
            json!({"pattern": "needle", "globs": [bomb_glob(0)], "engine": "builtin"}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["totalMatches"].clone(), v["matches"][0]["path"].clone()),
        (json!(1), json!("/workspace/abc")),
        "{v}"
    );
}
