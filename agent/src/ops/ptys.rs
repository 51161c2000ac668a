//! The operations on terminal sessions: open one, read its screen output,
//! type into it, resize it, end it, list them, wait for one's end.

use std::time::Duration;

use sandboxd_proto::{CHUNK, PtyOpen, Reply};

use super::{Agent, Answer};

pub(crate) async fn open(agent: &Agent, open: PtyOpen, answer: Answer) {
    let r = agent
        .ptys
        .open(open)
        .await
        .map(|pid| Reply::Spawned { pid });
    answer.result(r).await
}

pub(crate) async fn read(
    agent: &Agent,
    pty: String,
    after: u64,
    max_bytes: u32,
    wait_ms: u32,
    answer: Answer,
) {
    let r = match agent.ptys.get(&pty) {
        Ok(p) => {
            let max = (max_bytes as usize).min(CHUNK);
            let wait = Duration::from_millis(u64::from(wait_ms));
            Ok(Reply::PtyOutput(p.read(after, max, wait).await))
        }
        Err(f) => Err(f),
    };
    answer.result(r).await
}

pub(crate) async fn write(agent: &Agent, pty: String, data: Vec<u8>, answer: Answer) {
    let r = match agent.ptys.get(&pty) {
        Ok(p) => p.write(&data).await.map(|()| Reply::Ok),
        Err(f) => Err(f),
    };
    answer.result(r).await
}

pub(crate) async fn resize(agent: &Agent, pty: String, cols: u16, rows: u16, answer: Answer) {
    let r = agent
        .ptys
        .get(&pty)
        .and_then(|p| p.resize(cols, rows))
        .map(|()| Reply::Ok);
    answer.result(r).await
}

pub(crate) async fn kill(agent: &Agent, pty: String, answer: Answer) {
    let r = agent.ptys.get(&pty).map(|p| {
        p.kill();
        Reply::Ok
    });
    answer.result(r).await
}

pub(crate) async fn list(agent: &Agent, answer: Answer) {
    answer.last(Reply::Ptys(agent.ptys.states())).await
}

pub(crate) async fn wait(agent: &Agent, pty: String, answer: Answer) {
    let r = match agent.ptys.get(&pty) {
        Ok(p) => Ok(Reply::PtyEnded(p.wait().await)),
        Err(f) => Err(f),
    };
    answer.result(r).await
}
