//! Moving a path within the workspace and making a directory: both
//! checked here lexically like every file request, then done by the agent
//! through its walk that cannot leave the workspace. A move takes the
//! final component of each path as it is (a symlink is moved or replaced
//! itself, never followed) and replaces nothing unless asked.

use super::{FileResult, Files};
use crate::field_error::FieldError;

impl Files {
    /// Moves `from` to `to` within the workspace, making `to`'s missing
    /// parent directories. An existing `to` is [`super::FileError::Exists`]
    /// unless `overwrite` (a directory is replaced only by a directory,
    /// and only when empty); a missing `from` is
    /// [`super::FileError::NotFound`].
    pub async fn rename(
        &self,
        sandbox_id: &str,
        from: &str,
        to: &str,
        overwrite: bool,
    ) -> FileResult<()> {
        let (from, to) = (self.parse_field("from", from)?, self.parse_field("to", to)?);
        for (field, path) in [("from", &from), ("to", &to)] {
            if path.is_root() {
                return Err(FieldError::new(
                    field,
                    "the workspace directory itself cannot be moved or replaced",
                )
                .into());
            }
        }
        let (from, to) = (from.relative(), to.relative());
        let limit = self.config.agent_timeout;
        self.on_agent(sandbox_id, |conn| {
            let (from, to) = (from.clone(), to.clone());
            async move { conn.rename(from, to, overwrite, limit).await }
        })
        .await
    }

    /// Makes directory `path` and its missing parents: `true` when it was
    /// made, `false` when a directory was there already. Anything else
    /// there (a file, a symlink) is [`super::FileError::NotDirectory`].
    pub async fn make_dir(&self, sandbox_id: &str, path: &str) -> FileResult<bool> {
        let rel = self.parse_field("path", path)?.relative();
        let limit = self.config.agent_timeout;
        self.on_agent(sandbox_id, |conn| {
            let rel = rel.clone();
            async move { conn.make_dir(rel, limit).await }
        })
        .await
    }
}
