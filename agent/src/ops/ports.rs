//! The operations on ports: relay one to the sandbox's other addresses,
//! and probe whether something accepts connections on it (with the
//! latest command's recent output when nothing does, to say why).

use std::time::Duration;

use sandboxd_proto::Reply;

use super::{Agent, Answer};
use crate::relay;

/// Bytes of recent output a failed probe reports.
const RECENT_OUTPUT: usize = 4096;

pub(crate) async fn relay(agent: &Agent, port: u16, listen: u16, allow: String, answer: Answer) {
    let r = agent
        .relays
        .ensure(port, listen, &allow)
        .map(|()| Reply::Ok);
    answer.result(r).await
}

pub(crate) async fn probe(agent: &Agent, port: u16, wait_ms: u32, answer: Answer) {
    let ready = relay::probe(port, Duration::from_millis(u64::from(wait_ms))).await;
    let recent_output = if ready {
        String::new()
    } else {
        agent
            .commands
            .latest()
            .map(|c| c.log.borrow().recent_text(RECENT_OUTPUT))
            .unwrap_or_default()
    };
    answer
        .last(Reply::Probed {
            ready,
            recent_output,
        })
        .await
}
