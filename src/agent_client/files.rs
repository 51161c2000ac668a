//! The file operations of the agent client: read, write, stat, search,
//! list, delete, move and make directories in the workspace (paths
//! relative to it). Each method
//! sends one `Op` and gives back the answer it is due, or [`AgentError`];
//! an answer in parts hands each part to the caller's `part`, which may
//! refuse it (a bound passed), ending the call as a protocol error.
//!
//! `limit` is how long the agent may take to answer before it counts as
//! stuck and the connection is closed. An operation answered `Ok` takes
//! any answer that is not a refusal: nothing is taken from it.

use std::time::Duration;

use sandboxd_proto::{DirEntry, Match, Mismatch, NewFile, Op, PathStat, Reply, Search, Searched};

use super::{AgentConn, AgentResult, Content, no_parts, reply_name, unexpected};

/// How a write went: every file written, or none because a file's
/// precondition did not hold (the agent names which).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOutcome {
    Written,
    PreconditionFailed(Vec<Mismatch>),
}

impl AgentConn {
    /// A file's content, at most `max_bytes` of it, handed to `part` piece
    /// by piece.
    pub async fn read_file(
        &self,
        path: String,
        max_bytes: u64,
        limit: Duration,
        mut part: impl FnMut(Vec<u8>) -> Result<(), String>,
    ) -> AgentResult<()> {
        let op = Op::ReadFile { path, max_bytes };
        self.call_parts_within(op, limit, |p| match p {
            Reply::Data(d) => part(d),
            other => Err(format!("{} in a file", reply_name(&other))),
        })
        .await
        .map(drop)
    }

    /// Writes every file or none; `content` is the files' bytes in order,
    /// in pieces of at most [`sandboxd_proto::WRITE_PIECE`] bytes (or
    /// files on the host, read as they are sent).
    pub async fn write_files(
        &self,
        files: Vec<NewFile>,
        content: impl IntoIterator<Item = impl Into<Content>>,
        limit: Duration,
    ) -> AgentResult<WriteOutcome> {
        let op = Op::WriteFiles { files };
        let content = content.into_iter().map(Into::into).collect();
        match self.call_with_content_within(op, content, limit).await? {
            Reply::Ok => Ok(WriteOutcome::Written),
            Reply::PreconditionFailed(failed) => Ok(WriteOutcome::PreconditionFailed(failed)),
            other => Err(unexpected("a write", &other)),
        }
    }

    /// What each path is (the final symlink not followed), with the
    /// SHA-256 of regular files when `sha256`.
    pub async fn stat(
        &self,
        paths: Vec<String>,
        sha256: bool,
        limit: Duration,
    ) -> AgentResult<Vec<PathStat>> {
        let op = Op::Stat { paths, sha256 };
        match self.call_parts_within(op, limit, no_parts).await? {
            Reply::Stats(stats) => Ok(stats),
            other => Err(unexpected("a stat", &other)),
        }
    }

    /// Lines matching `search`: the matches handed to `part` piece by
    /// piece, then how the search went.
    pub async fn search(
        &self,
        search: Search,
        limit: Duration,
        mut part: impl FnMut(Vec<Match>) -> Result<(), String>,
    ) -> AgentResult<Searched> {
        let last = self
            .call_parts_within(Op::Search(search), limit, |p| match p {
                Reply::Matches(list) => part(list),
                other => Err(format!("{} in a search", reply_name(&other))),
            })
            .await?;
        match last {
            Reply::Searched(done) => Ok(done),
            other => Err(unexpected("a search", &other)),
        }
    }

    /// A directory's entries, sorted by name, handed to `part` piece by
    /// piece.
    pub async fn list_dir(
        &self,
        path: String,
        limit: Duration,
        mut part: impl FnMut(Vec<DirEntry>) -> Result<(), String>,
    ) -> AgentResult<()> {
        self.call_parts_within(Op::ListDir { path }, limit, |p| match p {
            Reply::Entries(list) => part(list),
            other => Err(format!("{} in a listing", reply_name(&other))),
        })
        .await
        .map(drop)
    }

    /// Moves `from` to `to` (workspace-relative); an existing `to` is
    /// refused unless `overwrite`.
    pub async fn rename(
        &self,
        from: String,
        to: String,
        overwrite: bool,
        limit: Duration,
    ) -> AgentResult<()> {
        let op = Op::Rename {
            from,
            to,
            overwrite,
        };
        self.call_parts_within(op, limit, no_parts).await.map(drop)
    }

    /// Makes a directory and its missing parents: whether it was made.
    pub async fn make_dir(&self, path: String, limit: Duration) -> AgentResult<bool> {
        match self.call_within(Op::MakeDir { path }, limit).await? {
            Reply::MadeDir { created } => Ok(created),
            other => Err(unexpected("a directory made", &other)),
        }
    }

    /// Deletes `paths` in order; a directory needs `recursive`.
    pub async fn delete(
        &self,
        paths: Vec<String>,
        recursive: bool,
        limit: Duration,
    ) -> AgentResult<()> {
        let op = Op::Delete { paths, recursive };
        self.call_parts_within(op, limit, no_parts).await.map(drop)
    }
}
