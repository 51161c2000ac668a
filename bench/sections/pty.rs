//! The terminal section (`--only pty`): terminal sessions through their
//! WebSocket — a keystroke's echo, and a program's 64 MiB of output to one
//! viewer: what the viewer received, what the program wrote, what the
//! viewer was told it skipped, and what is neither (must be 0).

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};

use crate::report::{Line, RunFigures, line};
use crate::requests::{create_sandbox, id_of};
use crate::support::{Res, Server, ms, pct};

const PTY_ECHO: &str = "terminal keystroke echo over the WebSocket p50 (ms)";
const PTY_ECHO_P95: &str = "terminal keystroke echo p95 (ms)";
const PTY_OUTPUT: &str = "terminal output a WebSocket viewer received (MB/s)";
const PTY_PROGRAM: &str = "terminal output the program wrote, 64 MiB (MB/s)";
const PTY_SKIPPED: &str = "of it, the viewer was told it skipped (MB)";
const PTY_UNACCOUNTED: &str = "of it, neither received nor told skipped (MB)";

pub(crate) const LINES: &[Line] = &[
    line(PTY_ECHO, "≤ 5 ms", Some(|v, _| v <= 5.0)),
    line(PTY_ECHO_P95, "", None),
    line(PTY_OUTPUT, "report", None),
    line(PTY_PROGRAM, "report", None),
    line(PTY_SKIPPED, "report", None),
    line(PTY_UNACCOUNTED, "0", Some(|v, _| v == 0.0)),
];

/// Terminal sessions through the WebSocket: a keystroke's echo (the
/// terminal's own, under `cat`), 10 warm-up then 100 timed, one at a
/// time; and a program's 64 MiB of output to one viewer, from attach to
/// the `exit` message (the program starts 2 s after the open, so the
/// viewer is attached before its first byte; the rates count from its
/// first byte): what the viewer received, what the program wrote (it never
/// waits for a viewer), what the viewer was told it skipped, and what is
/// neither.
pub(crate) async fn measure(server: &Server, fig: &mut RunFigures) -> Res<()> {
    use tokio_tungstenite::tungstenite::protocol::Message;
    let sid = create_sandbox(
        server,
        json!({"sessionKey": "pty", "network": {"mode": "none"}}),
    )
    .await?;
    let ws_base = server.base.replacen("http://", "ws://", 1);
    let attach = |pty: String| {
        let url = format!("{ws_base}/v1/sandboxes/{sid}/ptys/{pty}");
        async move {
            tokio_tungstenite::connect_async(url)
                .await
                .map(|(ws, _)| ws)
        }
    };
    let open = |body: Value| {
        let path = format!("/v1/sandboxes/{sid}/ptys");
        async move { id_of(&server.post(&path, body).await?, "ptyId") }
    };

    let pty = open(json!({"command": ["cat"]})).await?;
    let mut ws = attach(pty).await?;
    let mut echo = Vec::new();
    for i in 0..110u32 {
        let key = b'a' + (i % 26) as u8;
        let t = Instant::now();
        ws.send(Message::Binary(vec![key].into())).await?;
        loop {
            let frame = tokio::time::timeout(Duration::from_secs(10), ws.next())
                .await?
                .ok_or("the session closed")??;
            if let Message::Binary(b) = frame
                && b.contains(&key)
            {
                break;
            }
        }
        if i >= 10 {
            echo.push(ms(t.elapsed()));
        }
    }
    drop(ws);
    fig.p50(PTY_ECHO, &echo, &[]);
    fig.value(PTY_ECHO_P95, pct(&echo, 0.95), None);

    const BYTES: u64 = 64 << 20;
    let pty = open(json!({
        "command": ["bash", "-c", format!("sleep 2; head -c {BYTES} /dev/zero | tr '\\0' x")]
    }))
    .await?;
    let mut ws = attach(pty).await?;
    let mut t = None;
    let (mut got, mut skipped) = (0u64, 0u64);
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(120), ws.next())
            .await?
            .ok_or("the session closed before its exit")??;
        match frame {
            Message::Binary(b) => {
                t.get_or_insert_with(Instant::now);
                got += b.len() as u64;
            }
            Message::Text(text) => {
                let v: Value = serde_json::from_str(text.as_str())?;
                skipped += v["skippedBytes"].as_u64().unwrap_or(0);
                if v["type"] == "exit" {
                    break;
                }
            }
            _ => {}
        }
    }
    let secs = t.ok_or("no output")?.elapsed().as_secs_f64();
    fig.value(PTY_OUTPUT, got as f64 / secs / 1e6, None);
    fig.value(PTY_PROGRAM, BYTES as f64 / secs / 1e6, None);
    fig.value(PTY_SKIPPED, skipped as f64 / 1e6, None);
    // What the viewer neither got nor was told it missed: should be 0.
    fig.value(
        PTY_UNACCOUNTED,
        BYTES.saturating_sub(got + skipped) as f64 / 1e6,
        None,
    );
    server
        .post(&format!("/v1/sandboxes/{sid}:stop"), json!(null))
        .await?;
    Ok(())
}
