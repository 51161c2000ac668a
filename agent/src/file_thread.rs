//! The threads that do the agent's file I/O and its searches, each
//! started at launch (a sandbox at its pids limit cannot start one later)
//! and each holding its own [`Workspace`]: blocking calls run there, one
//! after the other, and never stall the agent's runtime.

use std::sync::mpsc as std_mpsc;

use sandboxd_proto::{Failure, FailureKind};
use tokio::sync::oneshot;

use crate::files::Workspace;

type FileJob = Box<dyn FnOnce(&Workspace) + Send>;

/// One thread that runs jobs on its workspace.
#[derive(Debug)]
pub(crate) struct FileThread {
    jobs: std_mpsc::Sender<FileWork>,
}

enum FileWork {
    Workspace(Vec<String>),
    Job(FileJob),
}

impl std::fmt::Debug for FileWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FileWork")
    }
}

impl FileThread {
    /// Starts the thread `name`, its workspace `/workspace` until
    /// [`FileThread::set_workspace`].
    pub(crate) fn start(name: &str) -> std::io::Result<FileThread> {
        let (tx, rx) = std_mpsc::channel::<FileWork>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let mut ws = Workspace::new(vec!["/workspace".into()]);
                while let Ok(work) = rx.recv() {
                    match work {
                        FileWork::Workspace(dirs) => ws = Workspace::new(dirs),
                        FileWork::Job(job) => job(&ws),
                    }
                }
            })?;
        Ok(FileThread { jobs: tx })
    }

    pub(crate) fn set_workspace(&self, dirs: Vec<String>) {
        let _ = self.jobs.send(FileWork::Workspace(dirs));
    }

    /// Runs `f` on the thread and returns its result.
    pub(crate) async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Workspace) -> Result<T, Failure> + Send + 'static,
    ) -> Result<T, Failure> {
        let (tx, rx) = oneshot::channel();
        let job: FileJob = Box::new(move |ws| {
            let _ = tx.send(f(ws));
        });
        if self.jobs.send(FileWork::Job(job)).is_err() {
            return Err(Failure::new(FailureKind::Other, "the file thread is gone"));
        }
        rx.await
            .unwrap_or_else(|_| Err(Failure::new(FailureKind::Other, "the file thread failed")))
    }
}
