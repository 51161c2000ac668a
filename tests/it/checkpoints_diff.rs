//! A checkpoint diff's text (`text=true`) against a real sandboxd and the
//! real engine: a chat turn that modifies, creates and deletes text files
//! and adds a binary one gives exactly the hunks `diff -u` gives (checked
//! against `diff -u` run in the sandbox) and git's one line for the
//! binary; a tiny budget cuts it at whole lines around the omission line
//! with exact counts; the diff to the workspace now reads it through the
//! agent and does not read a file over the per-file cap.

use serde_json::{Value, json};

use crate::checkpoints::{checkpoint, id, sh_ok};
use crate::harness::TestServer;

/// `GET …/diff?QUERY`: status and body.
async fn diff(server: &TestServer, sid: &str, from: &str, query: &str) -> (u16, Value) {
    server
        .get(&format!(
            "/v1/sandboxes/{sid}/checkpoints/{from}/diff?{query}"
        ))
        .await
}

async fn diff_ok(server: &TestServer, sid: &str, from: &str, query: &str) -> Value {
    let (status, v) = diff(server, sid, from, query).await;
    assert_eq!(status, 200, "{v}");
    v
}

fn text(v: &Value) -> &str {
    v["text"]["diff"].as_str().expect("text.diff")
}

/// `notes.txt` before the turn: 1 to 10, one a line.
const NOTES_BEFORE: &str = "seq 1 10 > notes.txt";
/// The turn's change to it: line 5 rewritten, line 11 added.
const NOTES_CHANGE: &str = "sed -i 's/^5$/five/' notes.txt && echo 11 >> notes.txt";
/// What `diff -u` gives for that change, after its two header lines.
const NOTES_HUNKS: &str = "@@ -2,9 +2,10 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n 9\n 10\n+11\n";

/// The section of a created `new.txt` of `lines` lines `line N`.
fn created_new(lines: u32) -> String {
    let body: String = (1..=lines).map(|i| format!("+line {i}\n")).collect();
    format!("--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1,{lines} @@\n{body}")
}

#[tokio::test]
async fn a_turns_text_diff_is_diff_u_with_binaries_in_one_line_and_cuts_within_its_budget() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    sh_ok(
        &server,
        &sid,
        &format!("{NOTES_BEFORE} && printf 'bye\\n' > old.txt && printf 'same\\n' > keep.txt"),
    )
    .await;
    let cp1 = checkpoint(&server, &sid, "turn-1").await;
    let t1 = id(&cp1);
    sh_ok(
        &server,
        &sid,
        &format!(
            "cp notes.txt /tmp/notes.before && {NOTES_CHANGE} && rm old.txt && chmod 600 keep.txt \
             && seq 1 40 | sed 's/^/line /' > new.txt && printf 'PK\\003\\004\\000\\001' > img.bin"
        ),
    )
    .await;
    let cp2 = checkpoint(&server, &sid, "turn-2").await;
    let t2 = id(&cp2);

    // `diff -u` in the sandbox gives the hunks the text diff must give.
    let r = server
        .sh(&sid, "diff -u /tmp/notes.before notes.txt | tail -n +3")
        .await;
    assert_eq!(r["stdout"], NOTES_HUNKS, "{r}");

    let whole = diff_ok(&server, &sid, t1, &format!("to={t2}&text=true")).await;
    let expected = format!(
        "Binary files /dev/null and b/img.bin differ\n{}--- a/notes.txt\n+++ b/notes.txt\n{NOTES_HUNKS}\
         --- a/old.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n",
        created_new(40)
    );
    assert_eq!(text(&whole), expected, "{whole}");
    let chars = expected.chars().count() as u64;
    assert_eq!(
        whole["text"],
        json!({
            "diff": expected,
            "totalChars": chars,
            "totalLines": expected.lines().count(),
            "omittedChars": 0,
            "omittedLines": 0,
            "headChars": chars,
            "tailChars": 0,
            "files": 4,
        }),
        "keep.txt changed its mode only: no section"
    );
    let counts = json!({"created": 2, "modified": 2, "deleted": 1});
    assert_eq!(whole["counts"], counts, "{whole}");

    // Without `text=true` there is none (the opt-in is what adds it).
    let plain = diff_ok(&server, &sid, t1, &format!("to={t2}")).await;
    assert!(plain.get("text").is_none(), "{plain}");
    assert_eq!(plain["counts"], counts);

    // A tiny budget: head and tail of the whole, cut at whole lines,
    // around one line that says exactly what was left out.
    let cut = diff_ok(
        &server,
        &sid,
        t1,
        &format!("to={t2}&text=true&maxChars=256&headChars=100"),
    )
    .await;
    assert_eq!(cut["counts"], counts, "the paths' counts stay exact");
    let t = &cut["text"];
    let shown = text(&cut);
    assert!(shown.chars().count() <= 256, "{cut}");
    let total: Vec<char> = expected.chars().collect();
    assert_eq!(t["totalChars"], chars);
    let (head, tail) = (
        t["headChars"].as_u64().expect("headChars") as usize,
        t["tailChars"].as_u64().expect("tailChars") as usize,
    );
    let omitted: String = total[head..total.len() - tail].iter().collect();
    assert_eq!(t["omittedChars"], omitted.chars().count() as u64, "{cut}");
    assert_eq!(t["omittedLines"], omitted.matches('\n').count() as u64);
    let head_text: String = total[..head].iter().collect();
    let tail_text: String = total[total.len() - tail..].iter().collect();
    assert!(
        head_text.ends_with('\n') && head > 50,
        "a whole-line head: {cut}"
    );
    assert!(tail_text.ends_with("-bye\n") && tail > 50, "{cut}");
    assert_eq!(
        shown,
        format!(
            "{head_text}[… {} lines, {} characters omitted …]\n{tail_text}",
            t["omittedLines"], t["omittedChars"]
        )
    );

    // The budget's rules are the shaped output's, with the field named.
    for (query, field) in [
        ("text=true&maxChars=100", "maxChars"),
        ("text=true&maxChars=256&headChars=200", "headChars"),
        ("maxChars=1000", "maxChars"),
    ] {
        let (status, v) = diff(&server, &sid, t1, &format!("to={t2}&{query}")).await;
        assert_eq!(
            (status, v["code"].as_str()),
            (400, Some("invalid_request")),
            "{query}: {v}"
        );
        assert!(
            v["error"].as_str().unwrap_or("").contains(field),
            "{query}: {v}"
        );
    }
}

#[tokio::test]
async fn a_text_diff_to_the_workspace_now_reads_it_and_leaves_a_file_over_the_cap_unread() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    sh_ok(
        &server,
        &sid,
        &format!("{NOTES_BEFORE} && printf 'a\\r\\nb' > crlf.txt"),
    )
    .await;
    let cp1 = checkpoint(&server, &sid, "turn-1").await;
    let t1 = id(&cp1);
    let same = diff_ok(&server, &sid, t1, "to=current&text=true").await;
    assert_eq!(same["text"]["diff"], "", "{same}");
    assert_eq!(same["text"]["files"], 0);

    sh_ok(
        &server,
        &sid,
        &format!(
            "{NOTES_CHANGE} && printf 'a\\r\\nc' > crlf.txt \
             && head -c 1100000 /dev/zero | tr '\\0' 'x' > big.txt"
        ),
    )
    .await;
    let now = diff_ok(&server, &sid, t1, "to=current&text=true").await;
    assert_eq!(
        text(&now),
        format!(
            "Files /dev/null and b/big.txt differ (over 1048576 bytes: not compared)\n\
             --- a/crlf.txt\n+++ b/crlf.txt\n@@ -1,2 +1,2 @@\n a\r\n-b\n\\ No newline at end of file\n\
             +c\n\\ No newline at end of file\n\
             --- a/notes.txt\n+++ b/notes.txt\n{NOTES_HUNKS}"
        ),
        "{now}"
    );
    assert_eq!(
        now["counts"],
        json!({"created": 1, "modified": 2, "deleted": 0})
    );
    assert_eq!(now["text"]["files"], 3);
}
