//! The session tokens' file in the state directory: JSON, the tokens'
//! SHA-256 hashes and never a token, mode 0600, replaced whole and durably
//! (see `durable_file`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Record;
use crate::durable_file;

/// The file's name in the state directory.
pub(super) const FILE_NAME: &str = "session-tokens.json";

/// The format's version; another one is refused, not guessed at.
const VERSION: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Contents {
    version: u32,
    tokens: Vec<Stored>,
}

/// One token as the file holds it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Stored {
    id: String,
    session_key: String,
    /// Lowercase hex SHA-256 of the token.
    sha256: String,
    created_at: u64,
    expires_at: u64,
}

/// The file, and why reading or writing it failed (one line, naming it).
#[derive(Debug, Clone)]
pub(super) struct StateFile {
    dir: PathBuf,
    path: PathBuf,
}

impl StateFile {
    pub(super) fn in_dir(dir: &Path) -> StateFile {
        StateFile {
            dir: dir.to_path_buf(),
            path: dir.join(FILE_NAME),
        }
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Makes the directory (0700) if missing and reads the file; no file
    /// is no tokens. Anything unreadable is an error, never an empty set.
    pub(super) fn read(&self) -> Result<Vec<Record>, String> {
        durable_file::make_dir(&self.dir)?;
        let Some(text) = durable_file::read(&self.path)? else {
            return Ok(Vec::new());
        };
        parse(&text).map_err(|reason| {
            format!(
                "{} is not a session token file ({reason}); move it aside to start without its tokens",
                self.path.display()
            )
        })
    }

    /// Replaces the file with `records`, durably.
    pub(super) fn write(&self, records: &[Record]) -> Result<(), String> {
        let contents = Contents {
            version: VERSION,
            tokens: records.iter().map(Stored::from).collect(),
        };
        // Serialising plain strings and numbers cannot fail.
        let mut bytes = serde_json::to_vec_pretty(&contents).unwrap_or_default();
        bytes.push(b'\n');
        durable_file::replace(&self.dir, FILE_NAME, &bytes)
    }
}

fn parse(text: &str) -> Result<Vec<Record>, String> {
    let contents: Contents = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if contents.version != VERSION {
        return Err(format!(
            "version {} where {VERSION} is known",
            contents.version
        ));
    }
    contents
        .tokens
        .into_iter()
        .map(|s| {
            let hash = hash_from_hex(&s.sha256)
                .ok_or_else(|| format!("token {}: sha256 is not 64 hex digits", s.id))?;
            Ok(Record {
                id: s.id,
                session_key: s.session_key,
                hash,
                created_at: s.created_at,
                expires_at: s.expires_at,
            })
        })
        .collect()
}

fn hash_from_hex(hex: &str) -> Option<[u8; 32]> {
    if !crate::id::is_hex_id(hex, 64) {
        return None;
    }
    let mut hash = [0u8; 32];
    for (i, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(hash)
}

impl From<&Record> for Stored {
    fn from(r: &Record) -> Self {
        Stored {
            id: r.id.clone(),
            session_key: r.session_key.clone(),
            sha256: r.hash.iter().map(|b| format!("{b:02x}")).collect(),
            created_at: r.created_at,
            expires_at: r.expires_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "sandboxd-state-{name}-{}-{}",
            std::process::id(),
            crate::id::random_hex(4).expect("random")
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn record() -> Record {
        Record {
            id: "0123456789abcdef".into(),
            session_key: "chat:1".into(),
            hash: [7; 32],
            created_at: 1,
            expires_at: u64::MAX,
        }
    }

    #[test]
    fn a_write_reads_back_with_mode_0600_in_a_0700_dir() {
        let dir = temp_dir("roundtrip").join("nested");
        let file = StateFile::in_dir(&dir);
        assert_eq!(file.read().expect("no file is no tokens"), Vec::new());
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        file.write(&[record()]).expect("write");
        assert_eq!(mode(file.path()), 0o600);
        assert_eq!(file.read().expect("read"), vec![record()]);
        assert!(
            !dir.join(format!("{FILE_NAME}.tmp")).exists(),
            "the temporary file was renamed"
        );
        let _ = std::fs::remove_dir_all(dir.parent().expect("parent"));
    }

    #[test]
    fn a_corrupt_file_is_an_error_naming_it_never_an_empty_set() {
        let dir = temp_dir("corrupt");
        let file = StateFile::in_dir(&dir);
        file.write(&[record()]).expect("write");
        let good = std::fs::read_to_string(file.path()).expect("read");
        let cases = [
            "{not json".to_string(),
            good.replace("\"version\": 1", "\"version\": 2"),
            good.replace(&"07".repeat(32), &"0g".repeat(32)),
            String::new(),
        ];
        for text in cases {
            std::fs::write(file.path(), &text).expect("corrupt it");
            let e = file.read().expect_err(&text);
            assert!(
                e.contains(&file.path().display().to_string()),
                "the error names the file: {e}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_directory_that_cannot_be_made_is_an_error_naming_it() {
        let dir = temp_dir("blocked");
        std::fs::write(&dir, "a file where the directory should be").expect("block");
        let e = StateFile::in_dir(&dir.join("state"))
            .read()
            .expect_err("no dir");
        assert!(e.contains(&dir.display().to_string()), "{e}");
        let _ = std::fs::remove_file(&dir);
    }
}
