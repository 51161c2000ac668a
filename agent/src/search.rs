//! `files:search` inside the sandbox: lines matching a regular expression
//! under a workspace directory, as structured matches with exact counts.
//!
//! `rg --json` does the search when the image has it (fast, and ripgrep's
//! semantics are what callers know); otherwise, or when asked, or when
//! `rg` cannot be started or fails, the agent's own search does, with the
//! same rules: the same regex syntax (both use Rust's `regex`), every file
//! searched (hidden ones too, `.gitignore` not read), symlinks not
//! followed, files sorted by path, binary files (a NUL byte) and files over
//! [`MAX_FILE_BYTES`] skipped, `--glob` rules for globs, matched by
//! `globset` as `rg` does ([`Globs`]).
//!
//! What `rg` prints is as untrusted as the files it read: every line kept
//! is cut to [`MAX_LINE_BYTES`], the details kept are bounded by the cap and
//! [`MAX_DETAIL_BYTES`], an output line of `rg` over [`MAX_RG_MESSAGE`] is
//! skipped (counted if it was a match), and the search stops at its
//! deadline (said in the answer: the counts are then what was seen). The
//! agent's own search looks at the clock between files and within a file;
//! what cannot be cut short, compiling the globs, is bounded by
//! [`MAX_GLOB_BYTES`].

use std::collections::VecDeque;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::Instant;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use regex::bytes::{Regex, RegexBuilder};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use sandboxd_proto::{Failure, FailureKind, Match, Search, Searched};

use crate::files::Workspace;

/// Files larger than this are not searched (`rg --max-filesize` too).
pub(crate) const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;
/// The longest line text (and context line) kept, in bytes.
pub(crate) const MAX_LINE_BYTES: usize = 1024;
/// Most bytes of match details (paths, lines, context) in one answer.
pub(crate) const MAX_DETAIL_BYTES: usize = 16 * 1024 * 1024;
/// Longest output line of `rg` read; a longer one is skipped.
const MAX_RG_MESSAGE: usize = 4 * 1024 * 1024;
/// Largest compiled regex (the `regex` crate's own limit is 10 MiB too).
const REGEX_SIZE: usize = 10 * 1024 * 1024;
/// Most bytes of all globs together. Compiling them takes time the
/// deadline cannot cut short, about proportional to their length: 32 KiB
/// of the costliest globs tried (`?` after `?`) compiled in 130 ms on the
/// test machine, while the 400 KB a request could carry otherwise (100
/// of 4096 bytes) took up to 0.7 s before globset refused them as too
/// large, and over 4 s under gVisor. Real lists of globs are a few
/// hundred bytes.
pub(crate) const MAX_GLOB_BYTES: usize = 32 * 1024;

/// Runs a search: the matches whose details are kept (at most
/// `max_results`, within [`MAX_DETAIL_BYTES`]) and how it went.
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

/// Collects the matches of one search, file by file, line by line: the
/// lines before each match come from a window of the last lines seen, the
/// lines after it are added as they come. Lines are fed in order within a
/// file; a gap in line numbers (lines `rg` did not print, being in no
/// match's context) empties the window.
#[derive(Debug)]
pub(crate) struct Collector {
    max_results: usize,
    context: usize,
    /// Matches whose lines after are still coming.
    open: VecDeque<Match>,
    pub(crate) done: Vec<Match>,
    window: VecDeque<String>,
    last_line: u64,
    path: String,
    pub(crate) total: u64,
    bytes: usize,
    /// Details were left out for lack of room (cap or bytes).
    pub(crate) full: bool,
}

impl Collector {
    pub(crate) fn new(max_results: usize, context: usize) -> Collector {
        Collector {
            max_results,
            context,
            open: VecDeque::new(),
            done: Vec::new(),
            window: VecDeque::new(),
            last_line: 0,
            path: String::new(),
            total: 0,
            bytes: 0,
            full: false,
        }
    }

    /// How many matches have details so far.
    fn kept(&self) -> usize {
        self.done.len() + self.open.len()
    }

    /// Whether lines still matter beyond counting matches: details are
    /// still taken, or a kept match still waits for lines after it.
    pub(crate) fn wants_text(&self) -> bool {
        !self.open.is_empty() || (self.kept() < self.max_results && !self.full)
    }

    /// A new file begins.
    pub(crate) fn file(&mut self, path: &str) {
        self.flush();
        self.path = path.to_string();
    }

    /// Line `n` of the current file; `column` (1-based) when it matches.
    /// `text` is only read when [`Self::wants_text`].
    pub(crate) fn line(&mut self, n: u64, text: &[u8], column: Option<u64>) {
        if n != self.last_line.wrapping_add(1) {
            self.flush_open();
            self.window.clear();
        }
        self.last_line = n;
        if column.is_some() {
            self.total += 1;
        }
        if !self.wants_text() {
            self.window.clear();
            return;
        }
        let shown = cut(text);
        for m in self.open.iter_mut() {
            if m.after.len() < self.context {
                self.bytes += shown.len();
                m.after.push(shown.clone());
            }
        }
        while self
            .open
            .front()
            .is_some_and(|m| m.after.len() >= self.context)
        {
            if let Some(m) = self.open.pop_front() {
                self.done.push(m);
            }
        }
        if let Some(column) = column {
            let before: Vec<String> = self.window.iter().cloned().collect();
            let weight = 64
                + self.path.len()
                + shown.len()
                + before.iter().map(String::len).sum::<usize>()
                + self.context * MAX_LINE_BYTES;
            if self.kept() < self.max_results && self.bytes + weight <= MAX_DETAIL_BYTES {
                self.bytes += weight - self.context * MAX_LINE_BYTES;
                let m = Match {
                    path: self.path.clone(),
                    line: n,
                    column,
                    text: shown.clone(),
                    before,
                    after: Vec::new(),
                };
                if self.context == 0 {
                    self.done.push(m);
                } else {
                    self.open.push_back(m);
                }
            } else if self.kept() < self.max_results {
                self.full = true;
            }
        }
        if self.context > 0 {
            if self.window.len() == self.context {
                self.window.pop_front();
            }
            self.window.push_back(shown);
        }
    }

    /// A line whose text is unknown (an `rg` message too long to read):
    /// counted, and it breaks the run of lines.
    pub(crate) fn unknown_line(&mut self, matched: bool) {
        self.flush_open();
        self.window.clear();
        self.last_line = 0;
        if matched {
            self.total += 1;
        }
    }

    fn flush_open(&mut self) {
        self.done.extend(self.open.drain(..));
    }

    /// The current file ended.
    fn flush(&mut self) {
        self.flush_open();
        self.window.clear();
        self.last_line = 0;
    }

    /// Every kept match, in order.
    pub(crate) fn finish(mut self) -> (Vec<Match>, u64) {
        self.flush();
        (self.done, self.total)
    }
}

/// A line as kept: lossy UTF-8, the line ending dropped, cut to
/// [`MAX_LINE_BYTES`] at a character boundary.
fn cut(line: &[u8]) -> String {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = &line[..line.len().min(MAX_LINE_BYTES + 4)];
    let mut text = String::from_utf8_lossy(line).into_owned();
    if text.len() > MAX_LINE_BYTES {
        let mut end = MAX_LINE_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// `rg` on the agent's PATH (or the usual directories when it has none).
fn find_rg() -> Option<String> {
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
    path.split(':').filter(|d| !d.is_empty()).find_map(|d| {
        let candidate = format!("{d}/rg");
        rustix::fs::access(candidate.as_str(), rustix::fs::Access::EXEC_OK)
            .ok()
            .map(|()| candidate)
    })
}

/// One message of `rg --json`, the parts used.
#[derive(serde::Deserialize)]
#[serde(tag = "type", content = "data", rename_all = "lowercase")]
enum RgMessage {
    Begin(RgBegin),
    End(serde::de::IgnoredAny),
    Match(RgLine),
    Context(RgLine),
    Summary(RgSummary),
}

#[derive(serde::Deserialize)]
struct RgBegin {
    path: RgData,
}

#[derive(serde::Deserialize)]
struct RgLine {
    lines: RgData,
    line_number: Option<u64>,
    #[serde(default)]
    submatches: Vec<RgSubmatch>,
}

#[derive(serde::Deserialize)]
struct RgSubmatch {
    start: u64,
}

#[derive(serde::Deserialize)]
struct RgSummary {
    stats: RgStats,
}

#[derive(serde::Deserialize)]
struct RgStats {
    searches: u64,
}

/// Text `rg` gives as UTF-8 (`text`) or, when it is not, as base64
/// (`bytes`).
#[derive(serde::Deserialize)]
struct RgData {
    text: Option<String>,
    bytes: Option<String>,
}

impl RgData {
    fn into_bytes(self) -> Vec<u8> {
        match (self.text, self.bytes) {
            (Some(t), _) => t.into_bytes(),
            (None, Some(b)) => base64_decode(&b),
            (None, None) => Vec::new(),
        }
    }
}

/// Standard base64, what `rg` uses for bytes that are not UTF-8; anything
/// else in it is skipped.
fn base64_decode(s: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => continue,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// Runs `rg --json` in `dir` (through `/proc/self/fd`, so the directory
/// the walk opened is the one searched, whatever the path names by now).
/// `Err`: why its answer cannot be used (the caller falls back).
fn run_rg(
    rg: &str,
    dir: &OwnedFd,
    s: &Search,
    deadline: Instant,
) -> Result<(Vec<Match>, Searched), String> {
    let mut cmd = Command::new(rg);
    cmd.args([
        "--json",
        "--line-number",
        "--no-config",
        "--no-messages",
        "--hidden",
        "--no-ignore",
        "--sort",
        "path",
        "--max-filesize",
    ])
    .arg(MAX_FILE_BYTES.to_string())
    .arg("--context")
    .arg(s.context.to_string());
    if s.case_insensitive {
        cmd.arg("--ignore-case");
    }
    for g in &s.globs {
        cmd.arg("--glob").arg(g);
    }
    cmd.arg("--regexp")
        .arg(&s.pattern)
        .arg("--")
        .arg(".")
        .current_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("rg could not start: {e}"))?;
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        return Err("rg's output could not be read".into());
    };
    let result = read_rg(OwnedFd::from(stdout), s, deadline);
    if !result.as_ref().is_ok_and(|(_, d)| !d.timed_out) {
        // Stopped at the deadline, or its output was unusable: it may run.
        let _ = child.kill();
    }
    // The agent reaps every child (SIGCHLD), so this may find none.
    let _ = child.wait();
    result
}

/// Reads and collects `rg --json`'s output until it ends or the deadline.
fn read_rg(out: OwnedFd, s: &Search, deadline: Instant) -> Result<(Vec<Match>, Searched), String> {
    let mut c = Collector::new(s.max_results as usize, s.context as usize);
    let mut files: u64 = 0;
    let mut summary: Option<u64> = None;
    let mut timed_out = false;
    let mut pending: Vec<u8> = Vec::new();
    // Inside a message too long to keep: whether it is a match.
    let mut skipping: Option<bool> = None;
    let mut buf = vec![0u8; 64 * 1024];
    let mut file = File::from(out);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            timed_out = true;
            break;
        }
        let timeout = rustix::event::Timespec {
            tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut fds = [rustix::event::PollFd::new(
            &file,
            rustix::event::PollFlags::IN,
        )];
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(format!("rg's output: {e}")),
        }
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("rg's output: {e}")),
        };
        let mut chunk = &buf[..n];
        while !chunk.is_empty() {
            let newline = chunk.iter().position(|b| *b == b'\n');
            let (piece, rest, whole) = match newline {
                Some(i) => (&chunk[..i], &chunk[i + 1..], true),
                None => (chunk, &[][..], false),
            };
            chunk = rest;
            if let Some(matched) = skipping {
                if whole {
                    skipping = None;
                    c.unknown_line(matched);
                }
                continue;
            }
            pending.extend_from_slice(piece);
            if pending.len() > MAX_RG_MESSAGE {
                let matched = pending.starts_with(br#"{"type":"match""#);
                pending.clear();
                if whole {
                    c.unknown_line(matched);
                } else {
                    skipping = Some(matched);
                }
                continue;
            }
            if !whole {
                continue;
            }
            let message = std::mem::take(&mut pending);
            match serde_json::from_slice::<RgMessage>(&message) {
                Ok(RgMessage::Begin(b)) => {
                    files += 1;
                    let path = String::from_utf8_lossy(&b.path.into_bytes()).into_owned();
                    c.file(path.strip_prefix("./").unwrap_or(&path));
                }
                Ok(RgMessage::Match(l)) => {
                    let column = l.submatches.first().map_or(1, |m| m.start + 1);
                    c.line(
                        l.line_number.unwrap_or(0),
                        &l.lines.into_bytes(),
                        Some(column),
                    );
                }
                Ok(RgMessage::Context(l)) => {
                    c.line(l.line_number.unwrap_or(0), &l.lines.into_bytes(), None);
                }
                Ok(RgMessage::End(_)) => c.flush(),
                Ok(RgMessage::Summary(sum)) => summary = Some(sum.stats.searches),
                Err(e) => return Err(format!("rg printed what is not its JSON: {e}")),
            }
        }
    }
    if summary.is_none() && !timed_out {
        return Err("rg ended without its summary (it failed)".into());
    }
    let (matches, total) = c.finish();
    Ok((
        matches,
        Searched {
            total_matches: total,
            files_searched: summary.unwrap_or(files),
            files_skipped: 0,
            used_rg: true,
            rg_missing_reason: None,
            timed_out,
        },
    ))
}

/// The agent's own search: a walk of `dir` in path order, not following
/// symlinks, each regular file that passes the globs read whole (up to
/// [`MAX_FILE_BYTES`]) and searched line by line.
fn builtin(
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
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
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
                let Ok(sub) = rustix::fs::openat(&*fd, name.as_slice(), dir_flags, Mode::empty())
                else {
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

    /// What `rg --json --context 1` prints for `needle` in a file
    /// `./d/f.txt` of "a\nneedle\nb\n", then an overlong match line, then
    /// its summary.
    fn rg_output(long: usize) -> Vec<u8> {
        let mut out = String::new();
        out.push_str(r#"{"type":"begin","data":{"path":{"text":"./d/f.txt"}}}"#);
        out.push('\n');
        out.push_str(r#"{"type":"context","data":{"path":{"text":"./d/f.txt"},"lines":{"text":"a\n"},"line_number":1,"absolute_offset":0,"submatches":[]}}"#);
        out.push('\n');
        out.push_str(r#"{"type":"match","data":{"path":{"text":"./d/f.txt"},"lines":{"text":"  needle\r\n"},"line_number":2,"absolute_offset":2,"submatches":[{"match":{"text":"needle"},"start":2,"end":8}]}}"#);
        out.push('\n');
        out.push_str(r#"{"type":"context","data":{"path":{"text":"./d/f.txt"},"lines":{"bytes":"Yv8K"},"line_number":3,"absolute_offset":12,"submatches":[]}}"#);
        out.push('\n');
        out.push_str(r#"{"type":"match","data":{"path":{"text":"./d/f.txt"},"lines":{"text":""#);
        out.push_str(&"x".repeat(long));
        out.push_str(r#"needle"},"line_number":9,"absolute_offset":99,"submatches":[{"match":{"text":"needle"},"start":0,"end":6}]}}"#);
        out.push('\n');
        out.push_str(r#"{"type":"end","data":{"path":{"text":"./d/f.txt"},"binary_offset":null,"stats":{}}}"#);
        out.push('\n');
        out.push_str(r#"{"data":{"elapsed_total":{"human":"0s","nanos":1,"secs":0},"stats":{"bytes_printed":0,"bytes_searched":0,"elapsed":{"human":"0s","nanos":1,"secs":0},"matched_lines":2,"matches":2,"searches":7,"searches_with_match":1}},"type":"summary"}"#);
        out.push('\n');
        out.into_bytes()
    }

    fn read_from(output: Vec<u8>, max_results: u32) -> (Vec<Match>, Searched) {
        let (reader, writer) = rustix::pipe::pipe().expect("pipe");
        let feeder = std::thread::spawn(move || {
            let mut w = File::from(writer);
            std::io::Write::write_all(&mut w, &output).expect("feed");
        });
        let s = Search {
            pattern: "needle".into(),
            path: String::new(),
            globs: vec![],
            max_results,
            context: 1,
            case_insensitive: false,
            builtin: false,
            deadline_ms: 10_000,
        };
        let got = read_rg(
            reader,
            &s,
            Instant::now() + std::time::Duration::from_secs(10),
        )
        .expect("rg output");
        feeder.join().expect("feeder");
        got
    }

    #[test]
    fn rg_json_becomes_matches_with_context_and_exact_counts() {
        let (m, done) = read_from(rg_output(10), 10);
        assert_eq!(
            (done.total_matches, done.files_searched, done.used_rg),
            (2, 7, true)
        );
        assert_eq!(m.len(), 2);
        assert_eq!(
            (
                m[0].path.as_str(),
                m[0].line,
                m[0].column,
                m[0].text.as_str()
            ),
            ("d/f.txt", 2, 3, "  needle")
        );
        assert_eq!(
            (m[0].before.clone(), m[0].after.clone()),
            (vec!["a".to_string()], vec!["b\u{fffd}".to_string()])
        );
        assert_eq!(
            (m[1].line, m[1].before.len()),
            (9, 0),
            "a gap empties the window"
        );
        assert!(m[1].text.len() <= MAX_LINE_BYTES);
        // The cap keeps one; both are counted.
        let (m, done) = read_from(rg_output(10), 1);
        assert_eq!((m.len(), done.total_matches), (1, 2));
    }

    #[test]
    fn an_overlong_rg_line_is_counted_not_kept() {
        let (m, done) = read_from(rg_output(MAX_RG_MESSAGE + 10), 10);
        assert_eq!(done.total_matches, 2);
        assert_eq!(m.len(), 1, "only the line that could be read");
    }

    #[test]
    fn rg_output_without_its_summary_is_refused() {
        let mut out = rg_output(10);
        let cut = out.len() - 300;
        out.truncate(cut);
        let (reader, writer) = rustix::pipe::pipe().expect("pipe");
        std::io::Write::write_all(&mut File::from(writer), &out).expect("feed");
        let s = Search {
            pattern: "needle".into(),
            path: String::new(),
            globs: vec![],
            max_results: 10,
            context: 0,
            case_insensitive: false,
            builtin: false,
            deadline_ms: 10_000,
        };
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        assert!(read_rg(reader, &s, deadline).is_err());
    }

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

    #[test]
    fn base64_decodes() {
        assert_eq!(base64_decode("aGk/"), b"hi?");
        assert_eq!(base64_decode("/w=="), [255]);
    }
}
