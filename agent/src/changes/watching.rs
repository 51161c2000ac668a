//! The task that watches while a command runs ([`Watching`]): it reads
//! the events as they gather, out of the runtime's poll set between two
//! reads ([`GATHER`]), and concludes the watch once the command's own
//! process has ended.

use std::time::Duration;

use sandboxd_proto::ChangeMethod;
use tokio::sync::oneshot;

use super::inotify::register;
use super::report::Report;
use super::watch::Watch;

/// How long events gather before they are read, the descriptor out of the
/// runtime's poll set meanwhile: the agent shares the sandbox's CPU with
/// the command, and a wake-up of its thread per event (epoll reports every
/// event queued) made a command that writes 1,000 files a third slower.
/// The kernel queues 16,384 events (and merges repeats of the same one),
/// so this is far from overflowing it.
const GATHER: Duration = Duration::from_millis(10);

impl Watch {
    /// Reads events until `stop`, then concludes: the task that watches
    /// while the command runs.
    pub(crate) fn spawn(mut self) -> Watching {
        let (stop, stopped) = oneshot::channel::<()>();
        let (tx, report) = oneshot::channel();
        tokio::task::spawn_local(async move {
            tokio::pin!(stopped);
            let mut stop_seen = false;
            loop {
                // Registered only while nothing is queued (a registration
                // reports what is queued already).
                let waiting = match &self.inotify {
                    None => break,
                    Some(ino) => ino.fd.try_clone().and_then(register),
                };
                let ready: Result<(), ()> = match &waiting {
                    Ok(fd) => tokio::select! {
                        _ = &mut stopped => {
                            stop_seen = true;
                            break;
                        }
                        ready = fd.readable() => ready.map(drop).map_err(drop),
                    },
                    Err(_) => Err(()),
                };
                drop(waiting);
                if ready.is_err() {
                    self.lost = true;
                    break;
                }
                tokio::select! {
                    _ = &mut stopped => {
                        stop_seen = true;
                        break;
                    }
                    _ = tokio::time::sleep(GATHER) => self.read_events(),
                }
            }
            // Scanning, or inotify failed: nothing to read until the end.
            if !stop_seen {
                let _ = stopped.await;
            }
            let _ = tx.send(self.conclude());
        });
        Watching { stop, report }
    }
}

/// A watch running while its command runs.
#[derive(Debug)]
pub(crate) struct Watching {
    stop: oneshot::Sender<()>,
    report: oneshot::Receiver<Report>,
}

impl Watching {
    /// The report, once the command's own process has ended.
    pub(crate) async fn finish(self) -> Report {
        let _ = self.stop.send(());
        self.report.await.unwrap_or(Report {
            changes: Vec::new(),
            more: 0,
            method: ChangeMethod::Scan,
            complete: false,
        })
    }
}
