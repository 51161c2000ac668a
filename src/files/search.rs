//! Searching the workspace: lines matching a regular expression under a
//! directory, found by the agent (with `rg` when the image has it, else
//! its own search) and checked here: at most the matches asked for, each
//! with a plain relative path, lines within the agent's bound and no more
//! context than asked for.

use sandboxd_proto::MAX_TEXT;

use super::{
    ENTRY_BYTES, FieldError, FileError, FileResult, Files, Intake, Weigh, agent_broke, buffered,
};

/// Most matches a search may return details of, and the default.
pub const MAX_SEARCH_RESULTS: u32 = 10_000;
pub const DEFAULT_SEARCH_RESULTS: u32 = 100;
/// Most context lines before and after a match.
pub const MAX_SEARCH_CONTEXT: u32 = 10;
/// Longest pattern and glob, most globs.
pub const MAX_PATTERN_BYTES: usize = 4096;
pub const MAX_GLOBS: usize = 100;
/// What the agent may send of one line (its own bound, checked here).
const MAX_MATCH_LINE_BYTES: usize = 1024;

/// A search request as the caller made it.
#[derive(Debug, Clone, Default)]
pub struct SearchRequest {
    pub pattern: String,
    pub path: Option<String>,
    pub globs: Vec<String>,
    pub max_results: Option<u32>,
    pub context: Option<u32>,
    pub case_insensitive: bool,
    /// Use the agent's own search even when the image has `rg`.
    pub builtin: bool,
}

/// One matching line; `path` is absolute under the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchMatch {
    pub path: String,
    pub line: u64,
    pub column: u64,
    pub text: String,
    pub before: Vec<String>,
    pub after: Vec<String>,
}

/// A search's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchResult {
    pub matches: Vec<SearchMatch>,
    /// Every matching line, past the cap too.
    pub total_matches: u64,
    pub files_searched: u64,
    pub files_skipped: u64,
    pub truncated: bool,
    pub used_rg: bool,
    pub rg_unavailable: Option<String>,
    pub timed_out: bool,
}

impl Files {
    /// Lines matching `req.pattern` under a directory of the workspace.
    pub async fn search(&self, sandbox_id: &str, req: SearchRequest) -> FileResult<SearchResult> {
        if req.pattern.is_empty() || req.pattern.len() > MAX_PATTERN_BYTES {
            return Err(FieldError::new(
                "pattern",
                format!("1 to {MAX_PATTERN_BYTES} bytes, got {}", req.pattern.len()),
            )
            .into());
        }
        if req.globs.len() > MAX_GLOBS {
            return Err(FieldError::new("globs", format!("at most {MAX_GLOBS}")).into());
        }
        for (i, g) in req.globs.iter().enumerate() {
            if g.is_empty() || g.len() > MAX_PATTERN_BYTES || g.contains('\0') {
                return Err(FieldError::new(
                    format!("globs[{i}]"),
                    format!("1 to {MAX_PATTERN_BYTES} bytes without NUL"),
                )
                .into());
            }
        }
        let max_results = req.max_results.unwrap_or(DEFAULT_SEARCH_RESULTS);
        if !(1..=MAX_SEARCH_RESULTS).contains(&max_results) {
            return Err(FieldError::new(
                "maxResults",
                format!("must be between 1 and {MAX_SEARCH_RESULTS} (got {max_results})"),
            )
            .into());
        }
        let context = req.context.unwrap_or(0);
        if context > MAX_SEARCH_CONTEXT {
            return Err(FieldError::new(
                "context",
                format!("must be between 0 and {MAX_SEARCH_CONTEXT} (got {context})"),
            )
            .into());
        }
        let dir = self.parse(req.path.as_deref().unwrap_or(&self.config.workspace_dir))?;
        let base = dir.absolute(&self.config.workspace_dir);
        // The agent stops in time to answer before sandboxd gives up on it.
        let limit = u64::try_from(self.config.agent_timeout.as_millis()).unwrap_or(u64::MAX);
        let deadline_ms =
            u32::try_from(limit.saturating_sub(limit / 4).clamp(500, 60_000)).unwrap_or(60_000);
        let search = sandboxd_proto::Search {
            pattern: req.pattern,
            path: dir.relative(),
            globs: req.globs,
            max_results,
            context,
            case_insensitive: req.case_insensitive,
            builtin: req.builtin,
            deadline_ms,
        };
        let mut matches = Vec::new();
        let intake = Intake::new(
            MAX_SEARCH_DETAIL_BYTES,
            buffered(|list: Vec<sandboxd_proto::Match>| {
                if matches.len() + list.len() > max_results as usize {
                    return Err("more matches than the cap".into());
                }
                for m in list {
                    matches.push(search_match(&base, m, context)?);
                }
                Ok(())
            }),
        );
        let limit = self.config.agent_timeout;
        let done = self
            .call_streamed(sandbox_id, &intake, |conn| {
                let (search, intake) = (search.clone(), &intake);
                async move { conn.search(search, limit, |list| intake.part(list)).await }
            })
            .await
            .map_err(|e| match e {
                // The agent compiles the pattern (and globs): its refusal
                // names them, not the path.
                FileError::Invalid(f) => match f.message.split_once(": ") {
                    Some((field @ ("pattern" | "globs"), why)) => {
                        FieldError::new(field, why.to_string()).into()
                    }
                    _ => FileError::Invalid(f),
                },
                e => e,
            })?;
        drop(intake);
        let returned = matches.len() as u64;
        if done.total_matches < returned {
            return Err(agent_broke("fewer matches counted than sent"));
        }
        Ok(SearchResult {
            truncated: done.total_matches > returned,
            matches,
            total_matches: done.total_matches,
            files_searched: done.files_searched,
            files_skipped: done.files_skipped,
            used_rg: done.used_rg,
            rg_unavailable: done.rg_missing_reason.map(|r| cut_text(r, MAX_TEXT)),
            timed_out: done.timed_out,
        })
    }
}

/// `s` cut to at most `max` bytes at a character boundary.
fn cut_text(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// Most bytes of match details held from one search (the agent's own
/// bound plus what the parts weigh besides text).
const MAX_SEARCH_DETAIL_BYTES: usize = 24 * 1024 * 1024;

/// A match from the agent, checked: its path relative and plain (made
/// absolute under `base`, the searched directory), its lines within the
/// bound and its context within what was asked for.
fn search_match(base: &str, m: sandboxd_proto::Match, context: u32) -> Result<SearchMatch, String> {
    let plain = !m.path.is_empty()
        && m.path.len() <= crate::workspace_path::MAX_PATH_BYTES
        && !m.path.starts_with('/')
        && !m.path.contains('\0')
        && m.path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
    if !plain {
        return Err("a match with a path that is not a plain relative one".into());
    }
    let lines_ok = m.before.len() <= context as usize
        && m.after.len() <= context as usize
        && std::iter::once(&m.text)
            .chain(&m.before)
            .chain(&m.after)
            .all(|l| l.len() <= MAX_MATCH_LINE_BYTES);
    if !lines_ok || m.line == 0 || m.column == 0 {
        return Err("a match out of bounds".into());
    }
    Ok(SearchMatch {
        path: format!("{}/{}", base.trim_end_matches('/'), m.path),
        line: m.line,
        column: m.column,
        text: m.text,
        before: m.before,
        after: m.after,
    })
}

impl Weigh for Vec<sandboxd_proto::Match> {
    fn weight(&self) -> usize {
        self.iter()
            .map(|m| {
                ENTRY_BYTES
                    + m.path.len()
                    + m.text.len()
                    + m.before
                        .iter()
                        .chain(&m.after)
                        .map(String::len)
                        .sum::<usize>()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_bounded_matches_come_back_from_a_search() {
        let m = |path: &str| sandboxd_proto::Match {
            path: path.into(),
            line: 3,
            column: 1,
            text: "hit".into(),
            before: vec!["a".into()],
            after: vec![],
        };
        let ok = search_match("/workspace/src", m("a/b.rs"), 1).expect("plain");
        assert_eq!(ok.path, "/workspace/src/a/b.rs");
        assert_eq!(
            search_match("/workspace", m("x"), 1).map(|m| m.path),
            Ok("/workspace/x".to_string())
        );
        for bad in ["", "/etc/passwd", "../x", "a/../b", "a//b", "./a", "a\0b"] {
            assert!(search_match("/workspace", m(bad), 1).is_err(), "{bad:?}");
        }
        assert!(
            search_match("/workspace", m("a"), 0).is_err(),
            "more context than asked"
        );
        let long = sandboxd_proto::Match {
            text: "x".repeat(MAX_MATCH_LINE_BYTES + 1),
            ..m("a")
        };
        assert!(search_match("/workspace", long, 1).is_err());
        let zero = sandboxd_proto::Match { line: 0, ..m("a") };
        assert!(search_match("/workspace", zero, 1).is_err());
    }
}
