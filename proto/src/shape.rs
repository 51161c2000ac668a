//! Output shaped for a model with a context budget: one stream's text cut
//! to a head and a tail within a number of characters, with exact counts of
//! what was left out and where it is in the command's log, escape
//! sequences and carriage-return progress bars collapsed, and output that
//! is not text reported as such instead of dumped.
//!
//! A [`Shaper`] sees the stream's text as its log decodes it, record by
//! record, so its counts and its pointer into the log are those of the
//! text a reader of the log gets. It keeps the head and a window of the
//! tail (at most twice the tail's share), never the whole stream: shaping
//! a gigabyte costs the budget's memory, not the output's.
//!
//! It is here, with the protocol, because both sides shape text: the
//! agent a command's streams, sandboxd a checkpoint's text diff (fed as
//! one record, its pointer unused), so the two follow the same rules.

use std::collections::VecDeque;

use crate::{Middle, SHAPE_MARKER_CHARS as MARKER_RESERVE, ShapeInfo, ShapeSpec};

/// More undecodable sequences than this make a stream binary.
const BINARY_AFTER_INVALID: u64 = 32;

/// Shapes one stream; see the module docs.
#[derive(Debug, Clone)]
pub struct Shaper {
    spec: ShapeSpec,
    /// Characters of the head when the stream is cut.
    head_cap: usize,
    /// Characters of the tail when the stream is cut.
    tail_cap: usize,
    /// Characters kept after the head: all of them fit when the stream is
    /// within budget.
    window: usize,
    head: String,
    head_chars: usize,
    /// (seq, stream offset of its first character) of the records that gave
    /// the head characters.
    head_records: Vec<(u64, u64)>,
    tail: String,
    tail_chars: usize,
    /// Stream offset of `tail`'s first character.
    tail_start: u64,
    /// Records from the one holding character `tail_start - 1` on.
    tail_records: VecDeque<(u64, u64)>,
    /// The record holding the first character after the head.
    after_head: Option<(u64, u64)>,
    total_chars: u64,
    total_bytes: u64,
    utf8_bytes: u64,
    newlines: u64,
    last_is_newline: bool,
    nul: bool,
}

impl Shaper {
    /// `spec` is sandboxd's, checked there; out-of-range numbers are clamped
    /// here rather than trusted.
    pub fn new(spec: ShapeSpec) -> Shaper {
        let max = spec.max_chars.max(MARKER_RESERVE * 2) as usize;
        let content = max - MARKER_RESERVE as usize;
        let head_cap = (spec.head_chars as usize).min(content);
        Shaper {
            spec,
            head_cap,
            tail_cap: content - head_cap,
            window: max - head_cap,
            head: String::new(),
            head_chars: 0,
            head_records: Vec::new(),
            tail: String::new(),
            tail_chars: 0,
            tail_start: head_cap as u64,
            tail_records: VecDeque::new(),
            after_head: None,
            total_chars: 0,
            total_bytes: 0,
            utf8_bytes: 0,
            newlines: 0,
            last_is_newline: false,
            nul: false,
        }
    }

    /// Bytes the stream wrote that decoded to nothing yet (a character
    /// split across reads).
    pub fn raw_bytes(&mut self, raw: u64) {
        self.total_bytes += raw;
    }

    /// The text of record `seq`, from `raw` bytes of the stream.
    pub fn feed(&mut self, seq: u64, text: &str, raw: u64) {
        self.total_bytes += raw;
        if text.is_empty() {
            return;
        }
        let offset = self.total_chars;
        let chars = text.chars().count();
        self.total_chars += chars as u64;
        self.utf8_bytes += text.len() as u64;
        self.newlines += text.bytes().filter(|&b| b == b'\n').count() as u64;
        self.last_is_newline = text.ends_with('\n');
        self.nul |= text.as_bytes().contains(&0);
        let mut rest = text;
        let mut rest_offset = offset;
        if self.head_chars < self.head_cap {
            let take = (self.head_cap - self.head_chars).min(chars);
            let split = byte_index(rest, take);
            self.head.push_str(&rest[..split]);
            self.head_chars += take;
            self.head_records.push((seq, offset));
            rest = &rest[split..];
            rest_offset += take as u64;
        }
        if rest.is_empty() {
            return;
        }
        // Records are found by where they start, also one the head took
        // the first characters of.
        if self.after_head.is_none() {
            self.after_head = Some((seq, offset));
        }
        self.tail_records.push_back((seq, offset));
        self.tail.push_str(rest);
        self.tail_chars += (offset + chars as u64 - rest_offset) as usize;
        if self.tail_chars > self.window.saturating_mul(2).max(1) {
            self.trim_tail(self.window);
        }
    }

    /// Keeps the last `keep` characters of the tail window.
    fn trim_tail(&mut self, keep: usize) {
        let drop = self.tail_chars.saturating_sub(keep);
        if drop == 0 {
            return;
        }
        let split = byte_index(&self.tail, drop);
        self.tail.drain(..split);
        self.tail_chars -= drop;
        self.tail_start += drop as u64;
        let last_dropped = self.tail_start - 1;
        while self.tail_records.len() > 1
            && self
                .tail_records
                .get(1)
                .is_some_and(|r| r.1 <= last_dropped)
        {
            self.tail_records.pop_front();
        }
    }

    /// The shaped text and what it kept. `invalid`: sequences of the
    /// stream that were not UTF-8; `oldest_retained`: the first record its
    /// log still holds.
    pub fn finish(mut self, invalid: u64, oldest_retained: Option<u64>) -> (String, ShapeInfo) {
        let total_lines = self.newlines + u64::from(self.total_chars > 0 && !self.last_is_newline);
        let mut info = ShapeInfo {
            total_chars: self.total_chars,
            total_lines,
            total_bytes: self.total_bytes,
            ..ShapeInfo::default()
        };
        if self.nul || invalid > BINARY_AFTER_INVALID {
            info.binary = true;
            info.omitted_chars = self.total_chars;
            info.omitted_lines = self.newlines;
            info.omitted_bytes = self.utf8_bytes;
            return (String::new(), info);
        }
        if self.total_chars <= u64::from(self.spec.max_chars) {
            let mut all = std::mem::take(&mut self.head);
            all.push_str(&self.tail);
            let shown = self.show(&all);
            info.collapsed = shown != all;
            info.head_chars = shown.chars().count() as u64;
            return (shown, info);
        }
        self.trim_tail(self.tail_cap);
        // Cut at a line boundary when one is in the half of the head (or
        // of the tail) next to the cut.
        let head_keep = match self.head.rfind('\n') {
            Some(i) if self.head[..=i].chars().count() >= self.head_cap / 2 => i + 1,
            _ => self.head.len(),
        };
        let tail_skip = match self.tail.find('\n') {
            Some(i) if self.tail[..=i].chars().count() <= self.tail_cap / 2 => i + 1,
            _ => 0,
        };
        let head = &self.head[..head_keep];
        let tail = &self.tail[tail_skip..];
        let (head_n, tail_n) = (head.chars().count() as u64, tail.chars().count() as u64);
        let lines = |s: &str| s.bytes().filter(|&b| b == b'\n').count() as u64;
        info.omitted_chars = self.total_chars - head_n - tail_n;
        info.omitted_lines = self.newlines - lines(head) - lines(tail);
        info.omitted_bytes = self.utf8_bytes - head.len() as u64 - tail.len() as u64;
        let from = head_n;
        let to = self.tail_start + (self.tail_chars as u64 - tail_n);
        let first = if from < self.head_chars as u64 {
            containing(self.head_records.iter().copied(), from)
        } else {
            self.after_head
        };
        let last = containing(self.tail_records.iter().copied(), to - 1);
        if let (Some((after, start)), Some((until, _))) = (first, last) {
            info.middle = Some(Middle {
                after: after.saturating_sub(1),
                until,
                skip_chars: from - start,
                retained: oldest_retained.is_some_and(|o| o <= after),
            });
        }
        let (head_shown, tail_shown) = (self.show(head), self.show(tail));
        info.collapsed = head_shown != head || tail_shown != tail;
        info.head_chars = head_shown.chars().count() as u64;
        info.tail_chars = tail_shown.chars().count() as u64;
        let mut text = head_shown;
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!(
            "[… {} lines, {} characters omitted …]\n",
            info.omitted_lines, info.omitted_chars
        ));
        text.push_str(&tail_shown);
        (text, info)
    }

    fn show(&self, text: &str) -> String {
        if self.spec.raw {
            text.to_string()
        } else {
            collapse(text)
        }
    }
}

/// The record holding stream offset `at`: the last one starting at or
/// before it.
fn containing(records: impl Iterator<Item = (u64, u64)>, at: u64) -> Option<(u64, u64)> {
    records.take_while(|r| r.1 <= at).last()
}

/// Byte index of character `n` of `s` (its length when it has fewer).
fn byte_index(s: &str, n: usize) -> usize {
    s.char_indices().nth(n).map_or(s.len(), |(i, _)| i)
}

/// Text as a terminal would leave it, roughly: escape sequences (colours,
/// cursor moves, titles) removed, and of each line what follows its last
/// carriage return (a progress bar's final state).
pub fn collapse(text: &str) -> String {
    let plain = strip_escapes(text);
    let mut out = String::with_capacity(plain.len());
    for line in plain.split_inclusive('\n') {
        let (body, end) = match line.strip_suffix('\n') {
            Some(b) => (b.strip_suffix('\r').unwrap_or(b), "\n"),
            None => (line, ""),
        };
        let last = body
            .rsplit('\r')
            .find(|segment| !segment.is_empty())
            .unwrap_or("");
        out.push_str(last);
        out.push_str(end);
    }
    out
}

/// Removes ECMA-48 escape sequences: CSI (`ESC [` … final byte), OSC
/// (`ESC ]` … BEL or `ESC \`), and the short `ESC` forms.
fn strip_escapes(text: &str) -> String {
    if !text.contains('\u{1b}') {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('[') => {
                // Parameters and intermediates, then one final byte.
                for c in chars.by_ref() {
                    if ('\u{40}'..='\u{7e}').contains(&c) {
                        break;
                    }
                }
            }
            Some(']') => {
                while let Some(c) = chars.next() {
                    if c == '\u{7}' {
                        break;
                    }
                    if c == '\u{1b}' && chars.peek() == Some(&'\\') {
                        chars.next();
                        break;
                    }
                }
            }
            Some(c) if ('\u{20}'..='\u{2f}').contains(&c) => {
                // An intermediate (a charset choice): one more final byte.
                chars.next();
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(max: u32, head: u32) -> ShapeSpec {
        ShapeSpec {
            max_chars: max,
            head_chars: head,
            raw: false,
        }
    }

    /// Feeds `text` in records of `piece` characters, numbered from 1.
    fn shaped(
        spec: ShapeSpec,
        text: &str,
        piece: usize,
    ) -> (String, ShapeInfo, Vec<(u64, String)>) {
        let mut s = Shaper::new(spec);
        let chars: Vec<char> = text.chars().collect();
        let mut records = Vec::new();
        for (i, chunk) in chars.chunks(piece).enumerate() {
            let t: String = chunk.iter().collect();
            s.feed(i as u64 + 1, &t, t.len() as u64);
            records.push((i as u64 + 1, t));
        }
        let (out, info) = s.finish(0, Some(1));
        (out, info, records)
    }

    /// The middle as a reader of the log gets it through `info.middle`.
    fn middle(info: &ShapeInfo, records: &[(u64, String)]) -> String {
        let m = info.middle.expect("a middle");
        let joined: String = records
            .iter()
            .filter(|(seq, _)| *seq > m.after && *seq <= m.until)
            .map(|(_, t)| t.as_str())
            .collect();
        joined
            .chars()
            .skip(m.skip_chars as usize)
            .take(info.omitted_chars as usize)
            .collect()
    }

    #[test]
    fn output_within_the_budget_is_whole() {
        let (out, info, _) = shaped(spec(1000, 200), "a\nb\n", 1);
        assert_eq!(out, "a\nb\n");
        assert_eq!(
            (info.total_chars, info.total_lines, info.omitted_chars),
            (4, 2, 0)
        );
        assert!(info.middle.is_none());
        let (out, info, _) = shaped(spec(1000, 200), &"x".repeat(1000), 7);
        assert_eq!(
            (out.len(), info.omitted_chars, info.total_lines),
            (1000, 0, 1)
        );
    }

    #[test]
    fn a_long_output_keeps_whole_lines_of_head_and_tail_and_points_at_the_middle() {
        let text: String = (1..=20_000).map(|i| format!("line {i}\n")).collect();
        for piece in [1, 13, 4096, 1 << 20] {
            let (out, info, records) = shaped(spec(2000, 500), &text, piece);
            assert!(
                out.chars().count() <= 2000,
                "{piece}: {}",
                out.chars().count()
            );
            assert_eq!(info.total_lines, 20_000);
            assert_eq!(info.total_chars, text.chars().count() as u64);
            let head = &out[..info.head_chars as usize];
            let tail = &out[out.len() - info.tail_chars as usize..];
            assert!(
                head.starts_with("line 1\n") && head.ends_with('\n'),
                "{piece}"
            );
            assert!(
                tail.ends_with("line 20000\n") && tail.starts_with("line "),
                "{piece}"
            );
            let mid = middle(&info, &records);
            assert_eq!(format!("{head}{mid}{tail}"), text, "{piece}");
            assert_eq!(
                info.omitted_lines,
                20_000 - head.lines().count() as u64 - tail.lines().count() as u64
            );
            assert_eq!(info.omitted_bytes, mid.len() as u64);
            assert!(out.contains(&format!(
                "[… {} lines, {} characters omitted …]\n",
                info.omitted_lines, info.omitted_chars
            )));
        }
    }

    #[test]
    fn any_budget_and_any_record_sizes_give_back_the_whole_text() {
        // A small deterministic generator: lines of varied length (some
        // empty, some longer than the budget), multi-byte characters.
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for round in 0..1000 {
            let lines = next(400) as usize;
            let text: String = (0..lines)
                .map(|i| {
                    let len = match next(10) {
                        0 => 0,
                        1 => next(3000) as usize,
                        _ => next(40) as usize,
                    };
                    let c = if i % 3 == 0 { 'ü' } else { 'x' };
                    format!("{}\n", c.to_string().repeat(len))
                })
                .collect();
            let max = 256 + next(3000) as u32;
            let head = next(u64::from(max - MARKER_RESERVE) + 1) as u32;
            let piece = 1 + next(500) as usize;
            let (out, info, records) = shaped(spec(max, head), &text, piece);
            let what = format!("round {round}: max {max} head {head} piece {piece}");
            assert!(out.chars().count() <= max as usize, "{what}");
            assert_eq!(info.total_chars, text.chars().count() as u64, "{what}");
            if info.omitted_chars == 0 {
                assert_eq!(out, text, "{what}");
                continue;
            }
            let chars: Vec<char> = out.chars().collect();
            let h: String = chars[..info.head_chars as usize].iter().collect();
            let t: String = chars[chars.len() - info.tail_chars as usize..]
                .iter()
                .collect();
            let m = middle(&info, &records);
            let whole = format!("{h}{m}{t}");
            assert!(
                whole == text,
                "{what}: {info:?}; {} + {} + {} chars against {}",
                h.chars().count(),
                m.chars().count(),
                t.chars().count(),
                text.chars().count()
            );
            assert_eq!(
                info.omitted_lines,
                m.bytes().filter(|&b| b == b'\n').count() as u64,
                "{what}"
            );
        }
    }

    #[test]
    fn one_long_line_is_cut_inside_it() {
        let text = "é".repeat(10_000);
        let (out, info, records) = shaped(spec(1000, 300), &text, 777);
        assert_eq!((info.head_chars, info.tail_chars), (300, 620));
        assert_eq!(info.omitted_chars, 10_000 - 920);
        assert_eq!(
            middle(&info, &records).chars().count() as u64,
            info.omitted_chars
        );
        assert!(out.chars().count() <= 1000);
    }

    #[test]
    fn nul_bytes_or_many_invalid_sequences_make_it_binary() {
        let mut s = Shaper::new(spec(1000, 100));
        s.feed(1, "PK\u{0}\u{3}", 4);
        let (out, info) = s.finish(0, Some(1));
        assert_eq!((out.as_str(), info.binary, info.total_bytes), ("", true, 4));
        let mut s = Shaper::new(spec(1000, 100));
        s.feed(1, "ok", 2);
        assert!(!s.finish(BINARY_AFTER_INVALID, Some(1)).1.binary);
        let mut s = Shaper::new(spec(1000, 100));
        s.feed(1, "ok", 2);
        assert!(s.finish(BINARY_AFTER_INVALID + 1, Some(1)).1.binary);
    }

    #[test]
    fn progress_bars_and_colours_collapse_to_their_final_state() {
        let bar: String = (0..=100)
            .map(|p| format!("\r\u{1b}[32m[{:<10}]\u{1b}[0m {p}%", "#".repeat(p / 10)))
            .collect();
        let text = format!("start\n{bar}\n\u{1b}]0;title\u{7}done\r\n");
        let (out, info, _) = shaped(spec(100_000, 1000), &text, 50);
        assert_eq!(out, "start\n[##########] 100%\ndone\n");
        assert!(info.collapsed);
        let raw = ShapeSpec {
            raw: true,
            ..spec(100_000, 1000)
        };
        let (out, info, _) = shaped(raw, &text, 50);
        assert_eq!((out, info.collapsed), (text, false));
    }

    #[test]
    fn a_trailing_carriage_return_keeps_the_text_before_it() {
        assert_eq!(collapse("50%\r100%\r"), "100%");
        assert_eq!(collapse("a\u{1b}(Bb\u{1b}[1;31mc"), "abc");
    }

    #[test]
    fn a_middle_the_log_dropped_is_said_not_retained() {
        let text: String = (1..=5000).map(|i| format!("{i}\n")).collect();
        let mut s = Shaper::new(spec(500, 100));
        for (i, line) in text.split_inclusive('\n').enumerate() {
            s.feed(i as u64 + 1, line, line.len() as u64);
        }
        let (_, info) = s.finish(0, Some(4000));
        assert_eq!(info.middle.map(|m| m.retained), Some(false));
    }
}
