//! Which paths a search looks at: ripgrep's `--glob` rules, compiled by
//! `globset` into one automaton ([`Globs`]), within [`MAX_GLOB_BYTES`].

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use sandboxd_proto::{Failure, FailureKind};

/// Most bytes of all globs together. Compiling them takes time the
/// deadline cannot cut short, about proportional to their length: 32 KiB
/// of the costliest globs tried (`?` after `?`) compiled in 130 ms on the
/// test machine, while the 400 KB a request could carry otherwise (100
/// of 4096 bytes) took up to 0.7 s before globset refused them as too
/// large, and over 4 s under gVisor. Real lists of globs are a few
/// hundred bytes.
pub(crate) const MAX_GLOB_BYTES: usize = 32 * 1024;

/// ripgrep's `--glob` rules: a glob without `/` matches a name at any
/// depth, one with `/` the path from the searched directory; `*` and `?`
/// stay within a name, `**` crosses directories, `[...]` is a class, `{a,b}`
/// alternatives. The last glob that matches decides; `!` excludes. With
/// any including glob, a file no glob matches is left out (a directory
/// is not, so the files under it are still looked at).
///
/// The matching is `globset`'s (ripgrep's own): every glob is compiled
/// into one automaton, so a path is matched in time linear in its length
/// whatever the globs are (a matcher that expanded braces or backtracked
/// on stars could be made to run for ever by one request). What is ours
/// is the translation: a glob without `/` becomes `**/glob`, which is the
/// same as matching the name at any depth.
#[derive(Debug)]
pub(crate) struct Globs {
    set: GlobSet,
    /// Per glob, in the order given: whether it excludes.
    excludes: Vec<bool>,
    any_include: bool,
}

impl Globs {
    pub(crate) fn new(globs: &[String]) -> Result<Globs, Failure> {
        let total: usize = globs.iter().map(String::len).sum();
        if total > MAX_GLOB_BYTES {
            return Err(Failure::new(
                FailureKind::Invalid,
                format!("globs: {total} bytes together, at most {MAX_GLOB_BYTES}"),
            ));
        }
        let mut set = GlobSetBuilder::new();
        let mut excludes = Vec::with_capacity(globs.len());
        for g in globs {
            let (exclude, body) = match g.strip_prefix('!') {
                Some(rest) => (true, rest),
                None => (false, g.as_str()),
            };
            let body = body.strip_prefix("./").unwrap_or(body);
            let anchored = body.trim_end_matches('/').contains('/');
            let body = body.trim_start_matches('/').trim_end_matches('/');
            if body.is_empty() {
                return Err(Failure::new(
                    FailureKind::Invalid,
                    format!("globs: {g:?} is empty"),
                ));
            }
            let pattern = if anchored {
                body.to_string()
            } else {
                format!("**/{body}")
            };
            let glob = GlobBuilder::new(&pattern)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map_err(|e| {
                    Failure::new(FailureKind::Invalid, format!("globs: {g:?}: {}", e.kind()))
                })?;
            set.add(glob);
            excludes.push(exclude);
        }
        let set = set.build().map_err(|e| {
            Failure::new(
                FailureKind::Invalid,
                format!("globs: too complex together ({})", e.kind()),
            )
        })?;
        let any_include = excludes.iter().any(|exclude| !exclude);
        Ok(Globs {
            set,
            excludes,
            any_include,
        })
    }

    /// Whether `rel` (from the searched directory, `/`-separated) is
    /// searched (a file) or walked (a directory).
    pub(crate) fn allows(&self, rel: &str, is_dir: bool) -> bool {
        if self.excludes.is_empty() {
            return true;
        }
        let last = self.set.matches(rel).into_iter().max();
        match last.and_then(|i| self.excludes.get(i)) {
            Some(exclude) => !exclude,
            None => is_dir || !self.any_include,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn globs(v: &[&str]) -> Result<Globs, Failure> {
        Globs::new(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn globs_match_like_ripgrep() {
        // One including glob: whether a file is searched.
        let m = |p: &str, t: &str| globs(&[p]).expect("glob").allows(t, false);
        assert!(m("*.rs", "main.rs"));
        assert!(
            m("*.rs", "src/main.rs"),
            "without /: the name, at any depth"
        );
        assert!(!m("src/*.rs", "src/a/main.rs"), "* stays in a name");
        assert!(!m("src/*.rs", "lib/src/main.rs"), "with /: from the top");
        assert!(m("/src/*.rs", "src/main.rs") && m("./src/*.rs", "src/main.rs"));
        assert!(m("src/**/*.rs", "src/a/b/main.rs"));
        assert!(m("src/**/*.rs", "src/main.rs"), "**/ may match nothing");
        assert!(m("**/x", "a/b/x") && m("**/x", "x"));
        assert!(m("a?c", "abc") && !m("d/a?c", "d/a/c"));
        assert!(m("*.{js,ts}", "a.ts") && m("*.{js,ts}", "a.js") && !m("*.{js,ts}", "a.rs"));
        assert!(m("[a-c]x", "bx") && !m("[!a-c]x", "bx") && m("[!a-c]x", "dx"));
        assert!(m("\\*x", "*x") && !m("\\*x", "ax"), "a backslash escapes");
        assert!(m("node_modules", "web/node_modules"));
        // What globset refuses is refused naming the glob.
        for bad in ["a[", "{a,b", "[z-a]"] {
            let e = globs(&[bad]).expect_err(bad);
            assert_eq!(e.kind, FailureKind::Invalid);
            assert!(
                e.message.starts_with(&format!("globs: {bad:?}: ")),
                "{}",
                e.message
            );
        }
    }

    /// Glob `i` of a bomb: 682 brace pairs whose alternatives both start
    /// with a star, then `*[c]` (4096 bytes, the longest a request may
    /// carry). Expanded it is 2^682 globs; as a language, `*c`.
    fn bomb_glob(i: usize) -> String {
        let mut g: String = (0..682)
            .map(|j| format!("{{*{},*}}", char::from(b'a' + ((i + j) % 26) as u8)))
            .collect();
        g.push_str("*[c]");
        g
    }

    /// What a matcher that expanded braces or backtracked would never
    /// finish compiles and matches at once: as many bomb globs as fit in
    /// [`MAX_GLOB_BYTES`]; one more is refused before anything compiles.
    #[test]
    fn a_brace_and_star_bomb_compiles_and_matches_at_once() {
        let bomb: Vec<String> = (0..100).map(bomb_glob).collect();
        assert!(bomb.iter().all(|g| g.len() == 4096));
        let fit = MAX_GLOB_BYTES / 4096;
        let started = Instant::now();
        let g = Globs::new(&bomb[..fit]).expect("they compile");
        let compiled = started.elapsed();
        let name = format!("d/{}", "ab".repeat(120));
        let started = Instant::now();
        assert!(!g.allows(&name, false));
        assert!(g.allows(&format!("{name}c"), false));
        let matched = started.elapsed();
        assert!(
            compiled < std::time::Duration::from_secs(1)
                && matched < std::time::Duration::from_millis(100),
            "compiled in {compiled:?}, matched in {matched:?}"
        );
        for n in [fit + 1, 100] {
            let e = Globs::new(&bomb[..n]).expect_err("too long together");
            assert_eq!(e.kind, FailureKind::Invalid);
            assert_eq!(
                e.message,
                format!(
                    "globs: {} bytes together, at most {MAX_GLOB_BYTES}",
                    n * 4096
                )
            );
        }
    }

    #[test]
    fn the_last_matching_glob_decides() {
        let g = globs;
        let only_rs = g(&["*.rs"]).expect("globs");
        assert!(only_rs.allows("src/a.rs", false));
        assert!(!only_rs.allows("src/a.txt", false));
        assert!(only_rs.allows("src", true), "directories are still walked");
        let no_nm = g(&["!node_modules"]).expect("globs");
        assert!(!no_nm.allows("node_modules", true));
        assert!(!no_nm.allows("web/node_modules", true));
        assert!(no_nm.allows("a.js", false));
        let both = g(&["*.js", "!vendor.js"]).expect("globs");
        assert!(both.allows("a.js", false) && !both.allows("x/vendor.js", false));
        let anchored = g(&["src/*.rs"]).expect("globs");
        assert!(anchored.allows("src/a.rs", false) && !anchored.allows("lib/src/a.rs", false));
        let order = g(&["!vendor.js", "*.js"]).expect("globs");
        assert!(order.allows("x/vendor.js", false), "the later glob decides");
        assert!(g(&["!"]).is_err());
    }
}
