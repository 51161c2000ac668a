//! The fields every request to start a process shares (a command, a
//! terminal session): strings that become argv or environment (no NUL
//! bytes), environment variable names, the working directory (in the
//! workspace), the tag a client addresses it by, and the one-line summary
//! shown for it. Each refusal names
//! the field, so the 400s of both read the same way.

use std::collections::BTreeMap;

use crate::config::Config;
use crate::field_error::FieldError;
use crate::workspace_path::WorkspacePath;

/// Longest summary shown, in characters.
pub const SUMMARY_CHARS: usize = 120;
/// Longest tag, in bytes.
pub const MAX_TAG_BYTES: usize = 256;

/// Refuses `s` (the value of `field`) if it holds a NUL byte, which no
/// argv or environment string can carry.
pub fn no_nul(field: &str, s: &str) -> Result<(), FieldError> {
    if s.contains('\0') {
        Err(FieldError::new(field, "must not contain NUL bytes"))
    } else {
        Ok(())
    }
}

/// The `env` field: names of letters, digits and `_`, not starting with a
/// digit; values without NUL bytes.
pub fn env_vars(
    env: Option<BTreeMap<String, String>>,
) -> Result<Vec<(String, String)>, FieldError> {
    let mut out = Vec::new();
    for (name, value) in env.unwrap_or_default() {
        let valid = name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid {
            return Err(FieldError::new(
                "env",
                format!("{name:?} is not a valid variable name"),
            ));
        }
        no_nul(&format!("env.{name}"), &value)?;
        out.push((name, value));
    }
    Ok(out)
}

/// The `cwd` field: workspace-relative, or absolute under either spelling
/// of the workspace; answered as the absolute path under the canonical one.
pub fn cwd(cwd: Option<String>, config: &Config) -> Result<Option<String>, FieldError> {
    let Some(c) = cwd else {
        return Ok(None);
    };
    let dirs: Vec<&str> = config.workspace_dirs().collect();
    let p = WorkspacePath::parse(&c, &dirs).map_err(|e| FieldError::new("cwd", e.to_string()))?;
    Ok(Some(p.absolute(&config.workspace_dir)))
}

/// The `tag` field: a label the process is found by besides its pid
/// (E2B's process tag), 1 to [`MAX_TAG_BYTES`] bytes without control
/// characters, kept as given. Also what a tag read back from an agent must
/// be.
pub fn tag(tag: Option<String>) -> Result<Option<String>, FieldError> {
    let Some(t) = tag else {
        return Ok(None);
    };
    if t.is_empty() || t.len() > MAX_TAG_BYTES {
        return Err(FieldError::new(
            "tag",
            format!("must be 1 to {MAX_TAG_BYTES} bytes (it is {})", t.len()),
        ));
    }
    if t.chars().any(char::is_control) {
        return Err(FieldError::new(
            "tag",
            "must not contain control characters",
        ));
    }
    Ok(Some(t))
}

/// `argv` run through `shell` as a login shell, so the PATH the profiles
/// set applies, without re-parsing: the shell gets the argv as `"$@"` and
/// execs it, so the program is the process (its exit code its own).
pub fn through_login_shell(shell: String, argv: Vec<String>) -> Vec<String> {
    let mut out = vec![
        shell,
        "-lc".to_string(),
        "exec \"$@\"".to_string(),
        "sandboxd".to_string(),
    ];
    out.extend(argv);
    out
}

/// `text` on one line (runs of whitespace as one space), cut to
/// [`SUMMARY_CHARS`] with `…` where it was cut.
pub fn summarise(text: &str) -> String {
    let one_line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= SUMMARY_CHARS {
        one_line
    } else {
        let mut s: String = one_line.chars().take(SUMMARY_CHARS - 1).collect();
        s.push('…');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_bounded_printable_and_kept_as_given() {
        let longest = "é".repeat(MAX_TAG_BYTES / 2);
        assert_eq!(tag(None), Ok(None));
        assert_eq!(
            tag(Some(" web server ".into())),
            Ok(Some(" web server ".into()))
        );
        assert_eq!(tag(Some(longest.clone())), Ok(Some(longest.clone())));
        for bad in [
            String::new(),
            format!("{longest}x"),
            "a\nb".into(),
            "a\0b".into(),
        ] {
            assert_eq!(
                tag(Some(bad.clone())).map_err(|e| e.field),
                Err("tag".into()),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn env_names_and_values_are_checked_and_named() {
        let env = |pairs: &[(&str, &str)]| {
            Some(
                pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                    .collect(),
            )
        };
        assert_eq!(
            env_vars(env(&[("A_1", "x y"), ("_B", "")])).ok(),
            Some(vec![
                ("A_1".into(), "x y".into()),
                ("_B".into(), String::new())
            ])
        );
        assert_eq!(
            env_vars(env(&[("1X", "y")])).map_err(|e| e.field),
            Err("env".into())
        );
        assert_eq!(
            env_vars(env(&[("A-B", "y")])).map_err(|e| e.field),
            Err("env".into())
        );
        assert_eq!(
            env_vars(env(&[("A", "a\0b")])).map_err(|e| e.field),
            Err("env.A".into())
        );
        assert_eq!(env_vars(None).ok(), Some(vec![]));
    }

    #[test]
    fn summaries_are_one_bounded_line() {
        assert_eq!(summarise("  echo\n  hi\t there "), "echo hi there");
        let long = "x".repeat(SUMMARY_CHARS + 10);
        let s = summarise(&long);
        assert_eq!(s.chars().count(), SUMMARY_CHARS);
        assert!(s.ends_with('…'));
    }
}
