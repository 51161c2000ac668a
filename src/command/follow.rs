//! Following a command's log: replay what its [`OutputLog`] retains after a
//! cursor, then the records as they arrive, with a heartbeat line when
//! nothing happened for a while, until the `exit` record or shutdown. The
//! stream keeps its sandbox busy (no expiry, no eviction) while it is open.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::Stream;
use tokio_util::sync::CancellationToken;

use super::Command;
use super::log::{Cursor, heartbeat_line};
use crate::sandbox::registry::OpenRequest;

struct Follow {
    cmd: Arc<Command>,
    cursor: Cursor,
    rx: tokio::sync::watch::Receiver<u64>,
    pending: VecDeque<Bytes>,
    done: bool,
    heartbeat: Duration,
    shutdown: CancellationToken,
    _busy: OpenRequest,
}

/// NDJSON chunks of `cmd`'s log after record `after`.
pub(super) fn follow(
    cmd: Arc<Command>,
    after: u64,
    heartbeat: Duration,
    shutdown: CancellationToken,
    busy: OpenRequest,
) -> impl Stream<Item = Bytes> + Send + 'static {
    let state = Follow {
        rx: cmd.log.subscribe(),
        cursor: Cursor::after(after),
        cmd,
        pending: VecDeque::new(),
        done: false,
        heartbeat,
        shutdown,
        _busy: busy,
    };
    futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(chunk) = st.pending.pop_front() {
                return Some((chunk, st));
            }
            if st.done {
                return None;
            }
            // Mark as seen before reading, so an append after the read
            // still wakes us.
            st.rx.borrow_and_update();
            let batch = st.cmd.log.read(&mut st.cursor);
            st.done = batch.done;
            if !batch.lines.is_empty() {
                let mut buf = BytesMut::with_capacity(batch.lines.iter().map(Bytes::len).sum());
                for line in batch.lines {
                    buf.extend_from_slice(&line);
                }
                st.pending.push_back(buf.freeze());
                continue;
            }
            if st.done {
                return None;
            }
            tokio::select! {
                changed = st.rx.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                }
                _ = tokio::time::sleep(st.heartbeat) => {
                    st.pending.push_back(heartbeat_line(st.cursor.after));
                }
                _ = st.shutdown.cancelled() => return None,
            }
        }
    })
}
