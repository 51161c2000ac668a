//! `files:search` inside the sandbox: lines matching a regular expression
//! under a workspace directory, as structured matches with exact counts.
//!
//! `rg --json` does the search when the image has it (fast, and ripgrep's
//! semantics are what callers know); otherwise, or when asked, or when
//! `rg` cannot be started or fails, the agent's own search does, with the
//! same rules: the same regex syntax (both use Rust's `regex`), every file
//! searched (hidden ones too, `.gitignore` not read), symlinks not
//! followed, files sorted by path, binary files (a NUL byte) and files over
//! [`MAX_FILE_BYTES`](builtin::MAX_FILE_BYTES) skipped, `--glob` rules for
//! globs, matched by `globset` as `rg` does ([`Globs`]).
//!
//! What `rg` prints is as untrusted as the files it read: every line kept
//! is cut to [`MAX_LINE_BYTES`](collect::MAX_LINE_BYTES), the details kept
//! are bounded by the cap and [`MAX_DETAIL_BYTES`](collect::MAX_DETAIL_BYTES),
//! an output line of `rg` over [`MAX_RG_MESSAGE`](rg::MAX_RG_MESSAGE) is
//! skipped (counted if it was a match), and the search stops at its
//! deadline (said in the answer: the counts are then what was seen). The
//! agent's own search looks at the clock between files and within a file;
//! what cannot be cut short, compiling the globs, is bounded by
//! [`MAX_GLOB_BYTES`](globs::MAX_GLOB_BYTES).
//!
//! The parts, each using only those listed before it: [`collect`] (the
//! matches kept, whichever engine found them), [`globs`] (which paths are
//! searched), [`builtin`] (the agent's own search) and [`rg`] (running
//! `rg --json` and reading what it prints); [`search`] here picks the
//! engine.

mod builtin;
mod collect;
mod globs;
mod rg;

use std::time::Instant;

use regex::bytes::RegexBuilder;
use sandboxd_proto::{Failure, FailureKind, Match, Search, Searched};

use crate::files::Workspace;
use builtin::builtin;
use globs::Globs;
use rg::{find_rg, run_rg};

/// Largest compiled regex (the `regex` crate's own limit is 10 MiB too).
const REGEX_SIZE: usize = 10 * 1024 * 1024;

/// Runs a search: the matches whose details are kept (at most
/// `max_results`, within [`MAX_DETAIL_BYTES`](collect::MAX_DETAIL_BYTES))
/// and how it went.
pub(crate) fn search(
    ws: &Workspace,
    s: &Search,
    deadline: Instant,
) -> Result<(Vec<Match>, Searched), Failure> {
    let regex = RegexBuilder::new(&s.pattern)
        .case_insensitive(s.case_insensitive)
        .size_limit(REGEX_SIZE)
        .build()
        .map_err(|e| Failure::new(FailureKind::Invalid, format!("pattern: {e}")))?;
    let globs = Globs::new(&s.globs)?;
    let dir = ws.open_dir(&s.path)?;
    let why_not = if s.builtin {
        Some("the request asked for the built-in search".to_string())
    } else {
        match find_rg() {
            None => Some("rg is not on the sandbox's PATH".to_string()),
            Some(rg) => match run_rg(&rg, &dir, s, deadline) {
                Ok(done) => return Ok(done),
                Err(why) => Some(why),
            },
        }
    };
    let (matches, mut searched) = builtin(&dir, &regex, &globs, s, deadline)?;
    searched.rg_missing_reason = why_not;
    Ok((matches, searched))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builtin_request(pattern: &str, globs: &[&str]) -> Search {
        Search {
            pattern: pattern.into(),
            path: String::new(),
            globs: globs.iter().map(|g| g.to_string()).collect(),
            max_results: 100,
            context: 0,
            case_insensitive: false,
            builtin: true,
            deadline_ms: 10_000,
        }
    }

    #[test]
    fn the_builtin_walks_in_path_order_without_following_symlinks() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let ws = tmp.path().join("ws");
        let outside = tmp.path().join("outside");
        for (p, c) in [
            ("ws/b/z.txt", "hit\n"),
            ("ws/a.txt", "x\nhit\n"),
            ("ws/.h/c.rs", "hit\n"),
            ("ws/bin.dat", "\0hit\n"),
            ("outside/o.txt", "hit\n"),
        ] {
            let path = tmp.path().join(p);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, c).expect("write");
        }
        std::os::unix::fs::symlink(&outside, ws.join("out")).expect("symlink");
        std::os::unix::fs::symlink(ws.join("a.txt"), ws.join("link.txt")).expect("symlink");
        let w = Workspace::new(vec![ws.to_str().expect("utf-8").to_string()]);
        let far = Instant::now() + std::time::Duration::from_secs(10);
        let (m, done) = search(&w, &builtin_request("hit", &[]), far).expect("search");
        let got: Vec<(&str, u64)> = m.iter().map(|m| (m.path.as_str(), m.line)).collect();
        assert_eq!(got, [(".h/c.rs", 1), ("a.txt", 2), ("b/z.txt", 1)]);
        assert_eq!(
            (
                done.files_searched,
                done.files_skipped,
                done.used_rg,
                done.timed_out
            ),
            (3, 1, false, false)
        );
        let (m, _) = search(&w, &builtin_request("hit", &["*.txt", "!b"]), far).expect("search");
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].path, "a.txt");
        // Past its deadline, it says so rather than answer late.
        let (m, done) = search(&w, &builtin_request("hit", &[]), Instant::now()).expect("search");
        assert!(done.timed_out && m.is_empty());
        let e = search(&w, &builtin_request("(", &[]), far).expect_err("bad pattern");
        assert_eq!(e.kind, FailureKind::Invalid);
        assert!(e.message.starts_with("pattern: "), "{}", e.message);
    }
}
