//! The OpenAPI document: served at `GET /v1/openapi.json` with the token
//! (401 without), equal to what `sandboxd openapi` prints and to the copy
//! in docs/openapi.json; naming the same routes and error codes as
//! docs/API.md; and good enough to generate a TypeScript client from
//! (clients/typescript) that drives a real sandboxd through a sandbox's
//! life. A missing node or npm fails the test: it is never skipped.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

use crate::harness::{self, ServerOptions, TestServer, binary};

const TOKEN: &str = "openapi-Test-Token-7";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn docs_copy() -> String {
    std::fs::read_to_string(repo().join("docs/openapi.json")).expect("read docs/openapi.json")
}

#[tokio::test]
async fn served_with_the_token_printed_by_the_subcommand_and_equal_to_the_copy() {
    let server = TestServer::start_with(ServerOptions::default().token(TOKEN)).await;
    let url = format!("{}/v1/openapi.json", server.base);

    let resp = server.client.get(&url).send().await.expect("send");
    assert_eq!(resp.status().as_u16(), 401, "the document needs the token");

    let resp = server
        .client
        .get(&url)
        .header("authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status().as_u16(), 200);
    let served: Value = resp.json().await.expect("json");

    let printed = std::process::Command::new(binary())
        .arg("openapi")
        .output()
        .expect("run sandboxd openapi");
    assert!(printed.status.success(), "sandboxd openapi failed");
    let printed = String::from_utf8(printed.stdout).expect("utf-8");

    let copy = docs_copy();
    assert!(
        printed == copy,
        "docs/openapi.json differs from `sandboxd openapi`; regenerate it with \
         `cargo run -q --bin sandboxd -- openapi > docs/openapi.json`"
    );
    let copy: Value = serde_json::from_str(&copy).expect("docs/openapi.json is JSON");
    assert_eq!(served, copy, "the served document is the copy");
    assert!(
        served["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.1")),
        "OpenAPI 3.1"
    );
}

/// `METHOD /path` of every operation in the document.
fn document_routes(doc: &Value) -> BTreeSet<String> {
    doc["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .expect("path item")
                .keys()
                .filter(|m| ["get", "post", "put", "patch", "delete"].contains(&m.as_str()))
                .map(move |m| format!("{} {path}", m.to_uppercase()))
        })
        .collect()
}

/// Every `` `METHOD /path` `` or `` `METHOD …/suffix` `` API.md names,
/// query strings cut, outside the error-code table (whose rows name wrong
/// requests such as `POST /v1/sandboxes/{id}` without an action).
fn api_md_routes(md: &str) -> Vec<String> {
    md.lines()
        .filter(|l| !l.starts_with("| 4") && !l.starts_with("| 5"))
        .flat_map(|l| l.split('`').skip(1).step_by(2))
        .filter(|s| {
            ["GET ", "POST ", "DELETE "]
                .iter()
                .any(|m| s.starts_with(m))
        })
        .map(|s| s.split('?').next().unwrap_or(s).to_string())
        .collect()
}

#[test]
fn api_md_and_the_document_name_the_same_routes_and_error_codes() {
    let doc: Value = serde_json::from_str(&docs_copy()).expect("json");
    let md = std::fs::read_to_string(repo().join("docs/API.md")).expect("read docs/API.md");
    let ours = document_routes(&doc);
    let named = api_md_routes(&md);

    let full: BTreeSet<String> = named.iter().filter(|r| r.contains(" /")).cloned().collect();
    assert_eq!(
        full, ours,
        "docs/API.md's routes (left) and the document's (right) differ"
    );
    // `POST …/commands` stands for a document route ending so.
    for short in named.iter().filter(|r| r.contains(" …/")) {
        let (method, suffix) = short.split_once(" …").expect("short form");
        assert!(
            ours.iter()
                .any(|r| r.starts_with(&format!("{method} /")) && r.ends_with(suffix)),
            "docs/API.md names {short}, which is no route of the document"
        );
    }

    // The routes API.md marks **compat** are the operations marked
    // `x-compat: true` (and tagged `compat`).
    let compat_md: BTreeSet<String> = md
        .lines()
        .filter(|l| l.contains("(**compat**"))
        .filter_map(|l| api_md_routes(l).into_iter().next())
        .collect();
    let compat_doc: BTreeSet<String> = doc["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .expect("path item")
                .iter()
                .filter(|(_, op)| op["x-compat"] == Value::Bool(true))
                .inspect(move |(_, op)| {
                    assert!(
                        op["tags"]
                            .as_array()
                            .is_some_and(|t| t.contains(&"compat".into())),
                        "{path}: x-compat without the compat tag"
                    );
                })
                .map(move |(m, _)| format!("{} {path}", m.to_uppercase()))
        })
        .collect();
    assert_eq!(
        compat_md, compat_doc,
        "docs/API.md's compat routes (left) and the document's (right) differ"
    );

    let codes: BTreeSet<&str> = md
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            cells.get(1)?.parse::<u16>().ok()?;
            cells.get(2)?.strip_prefix('`')?.strip_suffix('`')
        })
        .collect();
    let documented: BTreeSet<&str> = doc["components"]["schemas"]["ErrorCode"]["enum"]
        .as_array()
        .expect("ErrorCode enum")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        codes, documented,
        "docs/API.md's error codes (left) and the document's (right) differ"
    );
}

/// The generated TypeScript client creates a sandbox, runs a command and
/// reads its log stream, writes and reads a file, asks for a port URL and
/// stops the sandbox (clients/typescript/src/smoke.ts).
#[tokio::test]
async fn a_generated_typescript_client_drives_a_sandbox() {
    let server = TestServer::start_with(ServerOptions::default().token(TOKEN)).await;
    let dir = repo().join("clients/typescript");
    let npm = |args: &[&str]| {
        let mut cmd = tokio::process::Command::new("npm");
        cmd.args(args)
            .current_dir(&dir)
            .env("SANDBOXD_URL", &server.base)
            .env("SANDBOXD_TOKEN", TOKEN)
            .kill_on_drop(true);
        cmd
    };
    harness::npm_ci(&dir).await;
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(300),
        npm(&["run", "smoke"]).output(),
    )
    .await
    .expect("the smoke run took over 5 minutes")
    .expect("run `npm run smoke` (node 20 and npm are needed for this test)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("smoke: ok"),
        "the TypeScript client failed:\n{stdout}{}\nsandboxd log: {}",
        String::from_utf8_lossy(&out.stderr),
        server.log.display()
    );
    assert!(
        server.containers().await.is_empty(),
        "the client stopped its sandbox"
    );
}
