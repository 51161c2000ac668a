//! `Files::edit`: an exact, unique replacement in a text file, all or
//! nothing. The file is read, the old text counted, and the new content
//! written with `ifMatch` set to the hash of what was read, so a change
//! made between the read and the write refuses the write instead of being
//! overwritten.

use crate::field_error::FieldError;

use super::{FileError, FileResult, FileToWrite, Files, Mismatch, text};

/// An edit asked for: in `path`, `old_text` (which must occur exactly
/// once) becomes `new_text`; with `if_match`, only while the file's
/// SHA-256 (hex) is that.
#[derive(Debug, Clone, Default)]
pub struct FileEdit {
    pub path: String,
    pub old_text: String,
    pub new_text: String,
    pub if_match: Option<String>,
}

/// A file after an edit: its new SHA-256 (hex) and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edited {
    pub sha256: String,
    pub size: u64,
}

impl Files {
    /// Replaces the one occurrence of `edit.old_text`; zero or several are
    /// refused (naming how many) and nothing is written.
    pub async fn edit(&self, sandbox_id: &str, edit: FileEdit) -> FileResult<Edited> {
        if edit.old_text.is_empty() {
            return Err(FieldError::new("oldText", "must not be empty").into());
        }
        if let Some(h) = &edit.if_match
            && text::parse_hex(h).is_none()
        {
            return Err(FieldError::new(
                "ifMatch",
                format!("must be a SHA-256 as 64 hex digits, got {h:?}"),
            )
            .into());
        }
        let Some(content) = self.read_bytes(sandbox_id, &edit.path).await? else {
            return Err(FileError::NotFound(format!("{}: no such file", edit.path)));
        };
        let read_hash = text::sha256_hex(&content);
        if let Some(h) = &edit.if_match
            && !h.eq_ignore_ascii_case(&read_hash)
        {
            return Err(FileError::PreconditionFailed(vec![Mismatch {
                path: edit.path,
                current_sha256: Some(read_hash),
            }]));
        }
        let Ok(current) = String::from_utf8(content) else {
            return Err(FieldError::new("path", format!("{} is not UTF-8 text", edit.path)).into());
        };
        let found = current.matches(edit.old_text.as_str()).count();
        if found != 1 {
            return Err(FieldError::new(
                "oldText",
                format!(
                    "must occur exactly once in {}; it occurs {found} times (nothing was changed)",
                    edit.path
                ),
            )
            .into());
        }
        // The write keeps the file's permission bits (an edited script
        // stays executable).
        let mode = self
            .stat(sandbox_id, vec![edit.path.clone()], false)
            .await?
            .first()
            .map(|info| i64::from(info.mode & 0o777));
        let updated = current.replacen(&edit.old_text, &edit.new_text, 1);
        let edited = Edited {
            sha256: text::sha256_hex(updated.as_bytes()),
            size: updated.len() as u64,
        };
        self.write(
            sandbox_id,
            vec![FileToWrite {
                path: edit.path,
                content: updated.into_bytes(),
                mode,
                if_match: Some(read_hash),
                if_none_match: None,
            }],
        )
        .await?;
        Ok(edited)
    }
}
