//! The matches a search keeps, whichever engine found them: the
//! [`Collector`] is fed files and lines in order and keeps each match with
//! the lines around it, within the cap asked for and [`MAX_DETAIL_BYTES`],
//! each line cut to [`MAX_LINE_BYTES`]; every match is counted.

use std::collections::VecDeque;

use sandboxd_proto::Match;

/// The longest line text (and context line) kept, in bytes.
pub(crate) const MAX_LINE_BYTES: usize = 1024;
/// Most bytes of match details (paths, lines, context) in one answer.
pub(crate) const MAX_DETAIL_BYTES: usize = 16 * 1024 * 1024;

/// Collects the matches of one search, file by file, line by line: the
/// lines before each match come from a window of the last lines seen, the
/// lines after it are added as they come. Lines are fed in order within a
/// file; a gap in line numbers (lines `rg` did not print, being in no
/// match's context) empties the window.
#[derive(Debug)]
pub(crate) struct Collector {
    max_results: usize,
    pub(super) context: usize,
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
    pub(super) fn flush(&mut self) {
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
