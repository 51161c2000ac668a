//! Output shaped for a model (`"output": {"maxChars": …}`): head and tail
//! within the budget with exact counts, a cursor that reads the omitted
//! middle back from the log, progress bars collapsed, binary output
//! reported by size, and exact counts when the log's ring dropped output.

use serde_json::{Value, json};

use crate::harness::TestServer;

/// The stream's text in the records of `records` the cursor `middle`
/// names: after `after` up to `until`, less `skipChars`, `chars` long.
fn read_middle(records: &[Value], middle: &Value, stream: &str, chars: u64) -> String {
    let (after, until) = (
        middle["after"].as_u64().expect("after"),
        middle["until"].as_u64().expect("until"),
    );
    let joined: String = records
        .iter()
        .filter(|r| r["stream"] == stream)
        .filter(|r| {
            let seq = r["seq"].as_u64().unwrap_or(0);
            seq > after && seq <= until
        })
        .filter_map(|r| r["data"].as_str())
        .collect();
    joined
        .chars()
        .skip(middle["skipChars"].as_u64().expect("skipChars") as usize)
        .take(chars as usize)
        .collect()
}

/// The first `n` characters of `s`, and the last `m`.
fn ends(s: &str, n: u64, m: u64) -> (String, String) {
    let chars: Vec<char> = s.chars().collect();
    let head = chars[..n as usize].iter().collect();
    let tail = chars[chars.len() - m as usize..].iter().collect();
    (head, tail)
}

#[tokio::test]
async fn a_200000_line_output_fits_the_budget_with_exact_totals_and_a_cursor_to_its_exact_middle() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let script = "seq 200000 | sed 's/^/line /'; echo done >&2";
    let expected: String = (1..=200_000).map(|i| format!("line {i}\n")).collect();
    let r = server
        .run(
            &sid,
            json!({"command": script, "output": {"maxChars": 4000, "headChars": 1000}}),
        )
        .await;
    assert_eq!(r["exitCode"], 0, "{r}");
    let stdout = r["stdout"].as_str().expect("stdout");
    let shape = &r["output"]["stdout"];
    assert!(stdout.chars().count() <= 4000, "{}", stdout.len());
    assert_eq!(shape["totalLines"], 200_000, "{shape}");
    assert_eq!(shape["totalChars"].as_u64(), Some(expected.len() as u64));
    assert_eq!(shape["totalBytes"].as_u64(), Some(expected.len() as u64));
    let (head_n, tail_n) = (
        shape["headChars"].as_u64().expect("headChars"),
        shape["tailChars"].as_u64().expect("tailChars"),
    );
    let (head, tail) = ends(stdout, head_n, tail_n);
    assert!(
        head_n <= 1000 && head.ends_with('\n'),
        "whole lines: {head:?}"
    );
    assert!(
        tail.starts_with("line ") && tail.ends_with("line 200000\n"),
        "{tail:?}"
    );
    assert!(expected.starts_with(&head) && expected.ends_with(&tail));
    let omitted = shape["omittedChars"].as_u64().expect("omittedChars");
    assert_eq!(omitted, expected.len() as u64 - head_n - tail_n);
    assert_eq!(
        shape["omittedLines"].as_u64(),
        Some(200_000 - head.lines().count() as u64 - tail.lines().count() as u64)
    );
    assert_eq!(r["stdoutTruncatedBytes"], shape["omittedBytes"]);
    let marker = format!(
        "[… {} lines, {omitted} characters omitted …]\n",
        shape["omittedLines"]
    );
    assert_eq!(stdout, format!("{head}{marker}{tail}"));
    // The cursor reads the omitted middle back from the log, exactly.
    let middle = &shape["middle"];
    assert_eq!(middle["retained"], true, "{middle}");
    let cid = middle["commandId"].as_str().expect("commandId");
    let records = server
        .log_records(&sid, cid, &format!("?after={}", middle["after"]))
        .await;
    let mid = read_middle(&records, middle, "stdout", omitted);
    assert_eq!(format!("{head}{mid}{tail}"), expected);
    // The other stream is shaped too, and small enough to be whole.
    assert_eq!(r["stderr"], "done\n");
    assert_eq!(r["output"]["stderr"]["omittedChars"], 0);
    assert!(r["output"]["stderr"].get("middle").is_none());

    // A streamed command has the same in its exit record.
    let cid = server
        .start_command(
            &sid,
            json!({"command": script, "output": {"maxChars": 4000, "headChars": 1000}}),
        )
        .await;
    let records = server.log_records(&sid, &cid, "").await;
    let exit = records.last().expect("exit");
    assert_eq!(exit["stream"], "exit");
    assert_eq!(
        (&exit["stdout"], &exit["stderr"]),
        (&r["stdout"], &r["stderr"])
    );
    let streamed = &exit["output"]["stdout"];
    assert_eq!(streamed["middle"]["commandId"], json!(cid));
    let mid = read_middle(&records, &streamed["middle"], "stdout", omitted);
    assert_eq!(format!("{head}{mid}{tail}"), expected);
}

#[tokio::test]
async fn a_progress_bar_with_carriage_returns_and_colours_collapses_to_its_final_state() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let script = r#"echo start; for p in 0 25 50 75 100; do printf '\r\033[32m[%-4s]\033[0m %d%%' "$(printf '%*s' $((p / 25)) '' | tr ' ' '#')" "$p"; done; printf '\n\033[1mdone\033[0m\r\n'"#;
    let r = server
        .run(
            &sid,
            json!({"command": script, "output": {"maxChars": 1000}}),
        )
        .await;
    assert_eq!(r["stdout"], "start\n[####] 100%\ndone\n", "{r}");
    assert_eq!(r["output"]["stdout"]["collapsed"], true);
    // raw keeps what the program wrote.
    let raw = server
        .run(
            &sid,
            json!({"command": script, "output": {"maxChars": 1000, "raw": true}}),
        )
        .await;
    let raw_out = raw["stdout"].as_str().expect("stdout");
    assert!(
        raw_out.contains("\r\u{1b}[32m[#   ]\u{1b}[0m 25%"),
        "{raw_out:?}"
    );
    assert_eq!(raw["output"]["stdout"]["collapsed"], false);
    assert_eq!(
        raw["output"]["stdout"]["totalChars"].as_u64(),
        Some(raw_out.chars().count() as u64)
    );
}

#[tokio::test]
async fn five_megabytes_of_random_bytes_are_reported_as_binary_with_their_size() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let r = server
        .run(
            &sid,
            json!({"command": "head -c 5000000 /dev/urandom; echo fine >&2", "output": {"maxChars": 2000}}),
        )
        .await;
    let shape = &r["output"]["stdout"];
    assert_eq!(
        (&r["stdout"], &shape["binary"], &shape["totalBytes"]),
        (&json!(""), &json!(true), &json!(5_000_000)),
        "{shape}"
    );
    // Positive control: text on the other stream is text.
    assert_eq!(r["stderr"], "fine\n");
    assert_eq!(r["output"]["stderr"]["binary"], false);
    // One NUL byte is enough.
    let r = server
        .run(
            &sid,
            json!({"command": "printf 'PK\\0\\3'", "output": {"maxChars": 2000}}),
        )
        .await;
    assert_eq!(
        (&r["stdout"], &r["output"]["stdout"]["binary"]),
        (&json!(""), &json!(true))
    );
}

#[tokio::test]
async fn counts_stay_exact_when_the_log_ring_dropped_output_and_the_cursor_says_so() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    // 20 MB through an 8 MiB ring nobody reads.
    let total: u64 = 20_000_000;
    let r = server
        .run(
            &sid,
            json!({"command": format!("yes 0123456789 | head -c {total}"), "output": {"maxChars": 1000}, "timeoutMs": 120000}),
        )
        .await;
    let shape = &r["output"]["stdout"];
    assert_eq!(shape["totalBytes"].as_u64(), Some(total), "{shape}");
    assert_eq!(shape["totalChars"].as_u64(), Some(total));
    assert_eq!(shape["totalLines"].as_u64(), Some(total.div_ceil(11)));
    let shown = shape["headChars"].as_u64().unwrap_or(0) + shape["tailChars"].as_u64().unwrap_or(0);
    assert_eq!(shape["omittedChars"].as_u64(), Some(total - shown));
    assert_eq!(shape["middle"]["retained"], false, "{shape}");
}

#[tokio::test]
async fn bad_output_requests_are_refused_naming_the_field() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    for (body, field) in [
        (
            json!({"command": "true", "output": {"maxChars": 10}}),
            "output.maxChars",
        ),
        (
            json!({"command": "true", "output": {"maxChars": 2_000_000}}),
            "output.maxChars",
        ),
        (
            json!({"command": "true", "output": {"maxChars": 1000, "headChars": 990}}),
            "output.headChars",
        ),
        (
            json!({"command": "true", "output": {"maxChars": 1000}, "maxOutputBytes": 10}),
            "output",
        ),
        (
            json!({"command": "true", "output": {"maxChars": 1000, "tail": 1}}),
            "tail",
        ),
        (json!({"command": "true", "output": {}}), "maxChars"),
    ] {
        for route in ["commands", "commands:run"] {
            let (s, v) = server
                .post(&format!("/v1/sandboxes/{sid}/{route}"), body.clone())
                .await;
            assert_eq!(
                (s, v["code"].clone()),
                (400, json!("invalid_request")),
                "{body}: {v}"
            );
            assert!(
                v["error"].as_str().unwrap_or("").contains(field),
                "{body}: {v}"
            );
        }
    }
    // Positive control: the smallest budget is accepted.
    let r = server
        .run(
            &sid,
            json!({"command": "echo ok", "output": {"maxChars": 256, "headChars": 0}}),
        )
        .await;
    assert_eq!(r["stdout"], "ok\n", "{r}");
}

#[tokio::test]
async fn output_that_leftovers_write_after_the_end_is_not_in_the_shaped_exit_record() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let cid = server
        .start_command(
            &sid,
            json!({"command": "(sleep 1; echo late) & echo early", "output": {"maxChars": 1000}}),
        )
        .await;
    server.wait_command(&sid, &cid).await;
    // Positive control: the leftover did write, into the log past the exit.
    crate::harness::eventually(
        std::time::Duration::from_secs(20),
        "the leftover's line in the log",
        || async {
            let records = server.log_records(&sid, &cid, "?leftovers=true").await;
            records.iter().any(|r| r["data"] == "late\n")
        },
    )
    .await;
    let records = server.log_records(&sid, &cid, "").await;
    let exit = records.last().expect("exit");
    assert_eq!(exit["stream"], "exit", "{exit}");
    assert_eq!(exit["stdout"], "early\n", "{exit}");
    assert_eq!(exit["output"]["stdout"]["totalChars"], 6);
}

#[tokio::test]
async fn shaped_output_and_changes_come_together_in_the_answer_and_the_exit_record() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let body = json!({
        "command": "seq 5000; echo made > made.txt",
        "output": {"maxChars": 300, "headChars": 100},
        "changes": true,
    });
    let r = server.run(&sid, body.clone()).await;
    assert_eq!(r["output"]["stdout"]["totalLines"], 5000, "{r}");
    assert!(
        r["stdout"].as_str().unwrap_or("").ends_with("5000\n"),
        "{r}"
    );
    assert_eq!(
        r["changes"]["files"],
        json!([{"path": "made.txt", "kind": "created", "size": 5}]),
        "{r}"
    );
    // The second time the file is there already: modified.
    let cid = server.start_command(&sid, body).await;
    let records = server.log_records(&sid, &cid, "").await;
    let exit = records.last().expect("exit");
    assert_eq!(
        (&exit["stream"], &exit["stdout"]),
        (&json!("exit"), &r["stdout"])
    );
    assert_eq!(exit["changes"]["files"][0]["kind"], "modified", "{exit}");
}
