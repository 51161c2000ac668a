//! The egress section (`--only egress`): 100 MB from a server in a network
//! namespace on this machine (tests/it/harness/fakenet.rs; needs root),
//! `curl` by name through the egress proxy of an `internet` sandbox, and
//! the same through a CONNECT tunnel; floor column: the same download by
//! address straight out of an `open` sandbox. Each timed as one command
//! (start + wait), 3 samples after one warm-up.

use serde_json::json;

use crate::fakenet;
use crate::report::{Line, RunFigures, line};
use crate::requests::{create_sandbox, run_cmd};
use crate::support::{Res, Server};

const EGRESS: &str = "download 100 MB through the egress policy (MB/s)";
const EGRESS_TUNNEL: &str = "the same through a CONNECT tunnel (MB/s)";

pub(crate) const LINES: &[Line] = &[
    line(
        EGRESS,
        "≥ 0.8× direct in mode open (floor column)",
        Some(|v, f| f.is_some_and(|f| v >= 0.8 * f)),
    ),
    line(
        EGRESS_TUNNEL,
        "≥ 0.8× direct in mode open (floor column)",
        Some(|v, f| f.is_some_and(|f| v >= 0.8 * f)),
    ),
];

/// 100 MB from the fake internet's "public" server: by name through the
/// egress proxy of an `internet` sandbox, against the same download by
/// address straight out of an `open` sandbox; both timed as one command
/// (start + wait), 3 samples each, interleaved.
pub(crate) async fn measure(server: &Server, fig: &mut RunFigures) -> Res<()> {
    const MB: f64 = 100.0;
    let _net = fakenet::FakeNet::start().await;
    let through = create_sandbox(server, json!({"sessionKey": "egress"})).await?;
    let direct = create_sandbox(
        server,
        json!({"sessionKey": "egress-open", "network": {"mode": "open"}}),
    )
    .await?;
    let get = |how: &str, url: &str| json!({"command": format!("curl -sSf {how} -o /dev/null '{url}'"), "timeoutMs": 120000});
    let url = format!("http://public.test/big?mb={MB}");
    let via_proxy = get("", &url);
    // What HTTPS takes (pip, npm, git): a CONNECT tunnel, here without the
    // TLS, whose cost both sides would share.
    let via_tunnel = get("--proxytunnel", &url);
    let straight = get("", &format!("http://{}/big?mb={MB}", fakenet::PUBLIC));
    run_cmd(server, &through, via_proxy.clone()).await?;
    run_cmd(server, &through, via_tunnel.clone()).await?;
    run_cmd(server, &direct, straight.clone()).await?;
    let (mut a, mut t, mut b) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        a.push(MB / (run_cmd(server, &through, via_proxy.clone()).await?.0 / 1000.0));
        t.push(MB / (run_cmd(server, &through, via_tunnel.clone()).await?.0 / 1000.0));
        b.push(MB / (run_cmd(server, &direct, straight.clone()).await?.0 / 1000.0));
    }
    fig.p50(EGRESS, &a, &b);
    fig.p50(EGRESS_TUNNEL, &t, &b);
    Ok(())
}
