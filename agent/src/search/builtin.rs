//! The agent's own search, for when `rg` is missing, fails or is not
//! wanted: a walk of the directory in path order that follows no symlink,
//! each regular file that passes the globs read whole (up to
//! [`MAX_FILE_BYTES`]) and searched line by line, the clock looked at
//! between files and within one.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::time::Instant;

use regex::bytes::Regex;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use sandboxd_proto::{Failure, FailureKind, Match, Search, Searched};

use super::collect::Collector;
use super::globs::Globs;

/// Files larger than this are not searched (`rg --max-filesize` too).
pub(crate) const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// The agent's own search: a walk of `dir` in path order, not following
/// symlinks, each regular file that passes the globs read whole (up to
/// [`MAX_FILE_BYTES`]) and searched line by line.
pub(super) fn builtin(
    dir: &OwnedFd,
    regex: &Regex,
    globs: &Globs,
    s: &Search,
    deadline: Instant,
) -> Result<(Vec<Match>, Searched), Failure> {
    let mut c = Collector::new(s.max_results as usize, s.context as usize);
    let mut searched = Searched {
        total_matches: 0,
        files_searched: 0,
        files_skipped: 0,
        used_rg: false,
        rg_missing_reason: None,
        timed_out: false,
    };
    let root = dir
        .try_clone()
        .map_err(|e| Failure::new(FailureKind::Other, e.to_string()))?;
    // Directories still to walk: fd, relative path, names left (reversed).
    let mut stack: Vec<(OwnedFd, String, Vec<Vec<u8>>)> = Vec::new();
    let mut names = crate::files::sorted_names(&root)?;
    names.reverse();
    stack.push((root, String::new(), names));
    let file_flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
    while let Some((fd, prefix, todo)) = stack.last_mut() {
        if Instant::now() >= deadline {
            searched.timed_out = true;
            break;
        }
        let Some(name) = todo.pop() else {
            stack.pop();
            continue;
        };
        let rel = format!("{prefix}{}", String::from_utf8_lossy(&name));
        let Ok(st) = rustix::fs::statat(&*fd, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                if !globs.allows(&rel, true) {
                    continue;
                }
                let Ok(sub) = crate::nofollow::open_dir(&*fd, name.as_slice()) else {
                    continue;
                };
                let Ok(mut names) = crate::files::sorted_names(&sub) else {
                    continue;
                };
                names.reverse();
                stack.push((sub, format!("{rel}/"), names));
            }
            FileType::RegularFile => {
                if !globs.allows(&rel, false) {
                    continue;
                }
                if u64::try_from(st.st_size).unwrap_or(u64::MAX) > MAX_FILE_BYTES {
                    searched.files_skipped += 1;
                    continue;
                }
                let Ok(f) = rustix::fs::openat(&*fd, name.as_slice(), file_flags, Mode::empty())
                else {
                    continue;
                };
                let mut content = Vec::new();
                if File::from(f)
                    .take(MAX_FILE_BYTES + 1)
                    .read_to_end(&mut content)
                    .is_err()
                {
                    continue;
                }
                if content.len() as u64 > MAX_FILE_BYTES || content.contains(&0) {
                    searched.files_skipped += 1;
                    continue;
                }
                searched.files_searched += 1;
                if !search_content(&mut c, &rel, &content, regex, deadline) {
                    searched.timed_out = true;
                    break;
                }
            }
            // Symlinks are not followed (as rg without -L); FIFOs,
            // sockets and devices are not files to search.
            _ => {}
        }
    }
    let (matches, total) = c.finish();
    searched.total_matches = total;
    Ok((matches, searched))
}

/// Lines or bytes of a file searched between two looks at the clock: a
/// file of up to [`MAX_FILE_BYTES`] with a costly pattern takes seconds,
/// so the deadline is checked within it too, not only between files.
const CLOCK_EVERY_LINES: u64 = 1024;
const CLOCK_EVERY_BYTES: usize = 256 * 1024;

/// Feeds one file's lines to the collector: matches, and when context is
/// asked for, the lines around them. False when it stopped at `deadline`
/// (checked between lines: one line is searched whole).
fn search_content(
    c: &mut Collector,
    rel: &str,
    content: &[u8],
    regex: &Regex,
    deadline: Instant,
) -> bool {
    let mut started = false;
    let mut n: u64 = 0;
    let mut bytes_since_clock = 0usize;
    // Lines after the last match still to feed as context.
    let mut after_left = 0usize;
    let mut recent: VecDeque<(u64, &[u8])> = VecDeque::new();
    let lines = content.split_inclusive(|b| *b == b'\n');
    for line in lines {
        if n % CLOCK_EVERY_LINES == 0 || bytes_since_clock >= CLOCK_EVERY_BYTES {
            if Instant::now() >= deadline {
                return false;
            }
            bytes_since_clock = 0;
        }
        bytes_since_clock += line.len();
        n += 1;
        let body = line.strip_suffix(b"\n").unwrap_or(line);
        let found = regex.find(body);
        match found {
            Some(m) => {
                if !started {
                    c.file(rel);
                    started = true;
                }
                // The window's lines before it, so the collector sees a run.
                for (k, l) in recent.drain(..) {
                    c.line(k, l, None);
                }
                c.line(n, line, Some(m.start() as u64 + 1));
                after_left = c.context;
            }
            None if after_left > 0 => {
                after_left -= 1;
                c.line(n, line, None);
            }
            None if c.context > 0 && c.wants_text() => {
                if recent.len() == c.context {
                    recent.pop_front();
                }
                recent.push_back((n, line));
            }
            None => {}
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::super::collect::MAX_LINE_BYTES;
    use super::*;

    #[test]
    fn a_large_file_stops_at_the_deadline_between_its_lines() {
        let text = "hit\n".repeat(100_000);
        let re = Regex::new("hit").expect("regex");
        let mut c = Collector::new(10, 0);
        assert!(!search_content(
            &mut c,
            "f",
            text.as_bytes(),
            &re,
            Instant::now()
        ));
        assert_eq!(c.finish().1, 0, "stopped before its first line");
        // Positive control: the same file, in time, is searched whole.
        let mut c = Collector::new(10, 0);
        let far = Instant::now() + std::time::Duration::from_secs(10);
        assert!(search_content(&mut c, "f", text.as_bytes(), &re, far));
        assert_eq!(c.finish().1, 100_000);
    }

    fn lines(c: &mut Collector, text: &str, pattern: &str) {
        let re = Regex::new(pattern).expect("regex");
        let far = Instant::now() + std::time::Duration::from_secs(10);
        assert!(search_content(c, "f", text.as_bytes(), &re, far));
    }

    #[test]
    fn matches_carry_their_context_and_all_are_counted() {
        let text = "a\nb\nX1\nc\nd\ne\nX2\nX3\nf\n";
        let mut c = Collector::new(100, 2);
        lines(&mut c, text, "X");
        let (m, total) = c.finish();
        assert_eq!(total, 3);
        let got: Vec<(u64, Vec<String>, Vec<String>)> = m
            .iter()
            .map(|m| (m.line, m.before.clone(), m.after.clone()))
            .collect();
        let v = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            got,
            [
                (3, v(&["a", "b"]), v(&["c", "d"])),
                (7, v(&["d", "e"]), v(&["X3", "f"])),
                (8, v(&["e", "X2"]), v(&["f"])),
            ]
        );
        let mut c = Collector::new(2, 1);
        lines(&mut c, &"hit\n".repeat(500), "hit");
        let (m, total) = c.finish();
        assert_eq!((m.len(), total), (2, 500));
        assert_eq!(
            m[1].after,
            ["hit"],
            "the last kept match still gets its context"
        );
    }

    #[test]
    fn columns_are_one_based_bytes_and_lines_are_cut() {
        let mut c = Collector::new(10, 0);
        let long = format!("{}needle", "é".repeat(1000));
        lines(&mut c, &format!("  needle\r\n{long}"), "needle");
        let (m, _) = c.finish();
        assert_eq!((m[0].column, m[0].text.as_str()), (3, "  needle"));
        assert_eq!(m[1].column, 2001);
        assert!(m[1].text.len() <= MAX_LINE_BYTES && m[1].text.starts_with('é'));
    }
}
