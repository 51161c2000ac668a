//! What a command changed in the workspace (`"changes"` on a command
//! request): the option as a request gives it, validated into what the
//! agent is asked to watch, and the agent's report, fetched after the
//! command's end and checked before anyone sees it. The watching itself is
//! the agent's (see `sandboxd-agent`'s `changes`).
//!
//! The agent runs as the sandbox user, so its report is hostile input: no
//! more entries than were asked for, paths relative to the workspace (no
//! `..`, no empty or absolute ones, at most [`MAX_CHANGE_PATH`] bytes),
//! sizes only on files that are there.

use std::time::Duration;

use sandboxd_proto::{ChangeKind, ChangeMethod, ChangesSpec, MAX_CHANGE_PATH};
use serde::Serialize;

use crate::agent_client::AgentConn;
use crate::field_error::FieldError;

/// Directories left out when the request names none.
pub const DEFAULT_IGNORE: [&str; 4] = [".git", "node_modules", "__pycache__", ".venv"];
/// Changes listed when the request does not say.
pub const DEFAULT_MAX: u32 = 1000;
/// Most changes a request may ask to be listed.
pub const MAX_MAX: u32 = 10_000;
/// Most names in `ignore`.
pub const MAX_IGNORE: usize = 64;
/// Longest name in `ignore`, in bytes (a file name's limit).
pub const MAX_IGNORE_NAME: usize = 255;

fn bad(field: &str, msg: impl Into<String>) -> FieldError {
    FieldError::new(field, msg)
}

/// The `changes` field: `true` (the defaults), `false` (none), or
/// `{"ignore": [NAME…], "max": N}`.
pub fn parse(value: Option<serde_json::Value>) -> Result<Option<ChangesSpec>, FieldError> {
    let defaults = || ChangesSpec {
        ignore: DEFAULT_IGNORE.iter().map(|s| s.to_string()).collect(),
        max: DEFAULT_MAX,
    };
    let options = match value {
        None | Some(serde_json::Value::Null) | Some(serde_json::Value::Bool(false)) => {
            return Ok(None);
        }
        Some(serde_json::Value::Bool(true)) => return Ok(Some(defaults())),
        Some(serde_json::Value::Object(o)) => o,
        Some(_) => {
            return Err(bad(
                "changes",
                "must be true, false or an object {\"ignore\": [...], \"max\": N}",
            ));
        }
    };
    let mut spec = defaults();
    for (key, value) in options {
        match key.as_str() {
            "max" => {
                spec.max = value
                    .as_u64()
                    .filter(|n| (1..=u64::from(MAX_MAX)).contains(n))
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| {
                        bad(
                            "changes.max",
                            format!("must be an integer from 1 to {MAX_MAX} (got {value})"),
                        )
                    })?;
            }
            "ignore" => {
                let serde_json::Value::Array(names) = value else {
                    return Err(bad("changes.ignore", "must be an array of directory names"));
                };
                if names.len() > MAX_IGNORE {
                    return Err(bad(
                        "changes.ignore",
                        format!("at most {MAX_IGNORE} names (got {})", names.len()),
                    ));
                }
                spec.ignore = names
                    .into_iter()
                    .enumerate()
                    .map(|(i, n)| ignore_name(i, n))
                    .collect::<Result<_, _>>()?;
            }
            other => {
                return Err(bad(
                    &format!("changes.{other}"),
                    "unknown field; changes takes ignore and max",
                ));
            }
        }
    }
    Ok(Some(spec))
}

/// One name of `ignore`: a directory's name, not a path.
fn ignore_name(i: usize, value: serde_json::Value) -> Result<String, FieldError> {
    let field = format!("changes.ignore[{i}]");
    let serde_json::Value::String(name) = value else {
        return Err(bad(&field, "must be a string"));
    };
    let ok = !name.is_empty()
        && name.len() <= MAX_IGNORE_NAME
        && name != "."
        && name != ".."
        && !name.contains(['/', '\0']);
    if !ok {
        return Err(bad(
            &field,
            format!(
                "must be a directory name (1 to {MAX_IGNORE_NAME} bytes, no '/', not . or ..), e.g. node_modules"
            ),
        ));
    }
    Ok(name)
}

/// What a command changed, checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Changes {
    /// Sorted by path.
    pub files: Vec<ChangedFile>,
    /// Changes beyond `files`.
    pub more: u64,
    pub method: Method,
    pub complete: bool,
}

/// One changed file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChangedFile {
    pub path: String,
    pub kind: Kind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

/// What happened to a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Created,
    Modified,
    Deleted,
}

/// How the changes were found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    Inotify,
    Scan,
}

/// Whether `path` is one a change may name: relative, '/'-separated, no
/// empty, `.` or `..` component, no NUL, at most [`MAX_CHANGE_PATH`] bytes.
fn valid_path(path: &str) -> bool {
    !path.is_empty()
        && path.len() <= MAX_CHANGE_PATH
        && !path.contains('\0')
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

/// Asks the agent what command `command` changed (it has ended); `max` is
/// the most entries it may send. `None` when the agent could not say or
/// said something that does not hold up (logged).
pub async fn fetch(conn: &AgentConn, command: &str, max: u32, limit: Duration) -> Option<Changes> {
    let mut files: Vec<ChangedFile> = Vec::new();
    let answer = conn
        .changes(command, limit, |piece| {
            if files.len() + piece.len() > max as usize {
                return Err("more changes than asked for".into());
            }
            for c in piece {
                let kind = match c.kind {
                    ChangeKind::Created => Kind::Created,
                    ChangeKind::Modified => Kind::Modified,
                    ChangeKind::Deleted => Kind::Deleted,
                };
                if !valid_path(&c.path) {
                    return Err("a change with a path outside the workspace".into());
                }
                if (kind == Kind::Deleted) != c.size.is_none() {
                    return Err("a size on a deleted file, or none on another".into());
                }
                files.push(ChangedFile {
                    path: c.path,
                    kind,
                    size: c.size,
                });
            }
            Ok(())
        })
        .await;
    // Sorted here: the agent sorts names as bytes, and a name that is not
    // UTF-8 reads differently as text.
    files.sort_by(|a, b| a.path.cmp(&b.path));
    match answer {
        Ok(s) => Some(Changes {
            files,
            more: s.more,
            method: match s.method {
                ChangeMethod::Inotify => Method::Inotify,
                ChangeMethod::Scan => Method::Scan,
            },
            complete: s.complete,
        }),
        Err(e) => {
            tracing::warn!(command_id = command, error = %e, "no list of changes from the agent");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parsed(v: serde_json::Value) -> Result<Option<ChangesSpec>, String> {
        parse(Some(v)).map_err(|e| e.to_string())
    }

    #[test]
    fn true_takes_the_defaults_and_false_asks_for_nothing() {
        let s = parsed(json!(true)).expect("ok").expect("on");
        assert_eq!(s.ignore, DEFAULT_IGNORE);
        assert_eq!(s.max, DEFAULT_MAX);
        assert_eq!(parsed(json!(false)), Ok(None));
        assert_eq!(parse(None), Ok(None));
        let s = parsed(json!({"ignore": ["dist"], "max": 10}))
            .expect("ok")
            .expect("on");
        assert_eq!((s.ignore, s.max), (vec!["dist".to_string()], 10));
        let s = parsed(json!({})).expect("ok").expect("on");
        assert_eq!(
            s.ignore, DEFAULT_IGNORE,
            "options left out keep their default"
        );
        let s = parsed(json!({"ignore": []})).expect("ok").expect("on");
        assert!(s.ignore.is_empty(), "an empty list ignores nothing");
    }

    #[test]
    fn refusals_name_the_field() {
        for (v, field) in [
            (json!(1), "changes"),
            (json!("yes"), "changes"),
            (json!({"max": 0}), "changes.max"),
            (json!({"max": 10_001}), "changes.max"),
            (json!({"max": "5"}), "changes.max"),
            (json!({"ignore": "node_modules"}), "changes.ignore"),
            (json!({"ignore": ["a", "b/c"]}), "changes.ignore[1]"),
            (json!({"ignore": [".."]}), "changes.ignore[0]"),
            (json!({"ignore": [""]}), "changes.ignore[0]"),
            (json!({"ignore": [7]}), "changes.ignore[0]"),
            (json!({"ignore": ["x".repeat(256)]}), "changes.ignore[0]"),
            (json!({"ignore": vec!["a"; 65]}), "changes.ignore"),
            (json!({"paths": []}), "changes.paths"),
        ] {
            let e = parsed(v.clone()).expect_err("refused");
            assert!(e.starts_with(&format!("{field}:")), "{v}: {e}");
        }
    }

    #[test]
    fn only_relative_paths_inside_the_workspace_pass() {
        for ok in ["a", "a/b.txt", "x/.hidden", "a/..b"] {
            assert!(valid_path(ok), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "a/../b",
            "..",
            "./a",
            "a//b",
            "a/",
            "a\0b",
        ] {
            assert!(!valid_path(bad), "{bad:?}");
        }
        assert!(!valid_path(&"a".repeat(MAX_CHANGE_PATH + 1)));
    }
}
