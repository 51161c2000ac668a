//! The operations sandboxd asks the agent for: one module per family of
//! [`Op`](sandboxd_proto::Op) variants (commands, files, searches, ports,
//! terminal sessions, file watches), one function per operation, each answering its
//! request in full; and what they share: the agent's state ([`Agent`])
//! and where one request's answers go ([`Answer`]). `serve` reads the
//! requests, answers the hello and dispatches the rest here.

pub(crate) mod commands;
pub(crate) mod files;
pub(crate) mod ports;
pub(crate) mod ptys;
pub(crate) mod search;
pub(crate) mod watch;

use std::rc::Rc;

use sandboxd_proto::{CHUNK, Failure, Reply, Response};
use tokio::sync::mpsc;

use crate::commands::Commands;
use crate::file_thread::FileThread;
use crate::pty::Ptys;
use crate::relay::Relays;

/// What every connection shares.
#[derive(Debug)]
pub(crate) struct Agent {
    pub(crate) commands: Rc<Commands>,
    pub(crate) ptys: Rc<Ptys>,
    pub(crate) relays: Rc<Relays>,
    pub(crate) files: FileThread,
    /// Searches run here, one after the other, each within the deadline
    /// its request set when it came.
    pub(crate) searches: FileThread,
    /// Tells sandboxd whether it reconnects to the same agent process.
    pub(crate) boot: u64,
}

/// Where the answers to one request go.
pub(crate) struct Answer {
    id: u64,
    tx: mpsc::Sender<Response>,
}

impl Answer {
    /// The answers to request `id`, sent on its connection's `tx`.
    pub(crate) fn new(id: u64, tx: mpsc::Sender<Response>) -> Answer {
        Answer { id, tx }
    }

    /// The request's id (a watch is stopped by it).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// One part of a longer answer; false when the connection is gone
    /// (the rest need not be made).
    pub(crate) async fn part(&self, reply: Reply) -> bool {
        self.tx
            .send(Response {
                id: self.id,
                more: true,
                reply,
            })
            .await
            .is_ok()
    }

    /// Parts, one after the other; false when the connection went away
    /// (the rest were not made).
    pub(crate) async fn parts(&self, replies: impl IntoIterator<Item = Reply>) -> bool {
        for reply in replies {
            if !self.part(reply).await {
                return false;
            }
        }
        true
    }

    pub(crate) async fn last(self, reply: Reply) {
        let _ = self
            .tx
            .send(Response {
                id: self.id,
                more: false,
                reply,
            })
            .await;
    }

    /// The last answer: `r`, or the failure as [`Reply::Error`].
    pub(crate) async fn result(self, r: Result<Reply, Failure>) {
        self.last(r.unwrap_or_else(Reply::Error)).await;
    }
}

/// `items` in pieces that each fit a frame: at most about half a
/// [`CHUNK`] of them by `weight` (a guess at each one's encoded size) per
/// piece, and at least one item.
fn frame_pieces<T>(items: Vec<T>, weight: impl Fn(&T) -> usize) -> Vec<Vec<T>> {
    let mut pieces = Vec::new();
    let mut piece = Vec::new();
    let mut bytes = 0usize;
    for item in items {
        let w = weight(&item);
        if !piece.is_empty() && bytes + w > CHUNK / 2 {
            pieces.push(std::mem::take(&mut piece));
            bytes = 0;
        }
        bytes += w;
        piece.push(item);
    }
    if !piece.is_empty() {
        pieces.push(piece);
    }
    pieces
}
