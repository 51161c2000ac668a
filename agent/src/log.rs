//! `Log`: one command's output as a bounded ring of numbered records, kept
//! inside the sandbox (so it counts against the sandbox's memory, not
//! sandboxd's), and the readers following it.
//!
//! Bytes are decoded as UTF-8 per stream with carry-over, so a character
//! split across two reads arrives whole; invalid bytes become U+FFFD.
//! The ring is capped in bytes. When it is full, the oldest records go,
//! unless a reader that keeps reading has not read them yet: then the
//! command waits (its pipes fill and its writes block) until the reader
//! catches up, so a reader who keeps reading gets every byte. A reader
//! that stops asking for [`FOLLOWER_IDLE`] no longer holds anything back,
//! and a reader that needed dropped records gets one `Dropped` record
//! saying how many output bytes it missed.
//!
//! The `exit` record is kept apart and never dropped. Output that
//! processes the command left running write after it follows it, with
//! higher numbers; a reader sees it only when it asks to read past the end.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use sandboxd_proto::shape::Shaper;
use sandboxd_proto::{Ended, Record, RecordBody, ShapeInfo, ShapeSpec, Stream};

/// A reader that has not asked for this long holds nothing back.
pub(crate) const FOLLOWER_IDLE: Duration = Duration::from_secs(10);
/// A new log holds its output for a first reader this long: a client
/// starts a command, then asks for its log, and a fast command must not
/// fill the ring in between.
pub(crate) const FIRST_READER_WITHIN: Duration = Duration::from_secs(2);
/// The follower id standing in for the first reader until one comes.
const FIRST_READER: u64 = u64::MAX;
/// Most evicted-record checkpoints kept to account drops for a reader
/// that resumes far back.
const MAX_CHECKPOINTS: usize = 64;
/// What a record costs beyond its text, for the byte cap.
const RECORD_OVERHEAD: usize = 32;

/// What `raw` bytes of output can weigh as a record: each invalid byte
/// decodes to U+FFFD (three bytes), a character carried over from the read
/// before adds up to three, and every record has its overhead.
fn largest_record(raw: usize) -> usize {
    raw.saturating_mul(3) + 3 + RECORD_OVERHEAD
}

#[derive(Debug)]
struct Entry {
    seq: u64,
    /// Output bytes (both streams) before this record.
    start: u64,
    raw: u64,
    body: RecordBody,
    size: usize,
}

#[derive(Debug, Default)]
struct Utf8Carry {
    pending: Vec<u8>,
    /// Sequences that were not UTF-8 (each became U+FFFD).
    invalid: u64,
}

impl Utf8Carry {
    /// Decodes what can be decoded; keeps an incomplete trailing character.
    fn decode(&mut self, input: &[u8]) -> String {
        let joined;
        let bytes: &[u8] = if self.pending.is_empty() {
            input
        } else {
            let mut v = std::mem::take(&mut self.pending);
            v.extend_from_slice(input);
            joined = v;
            &joined
        };
        let mut out = String::with_capacity(bytes.len());
        let mut rest = bytes;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(&String::from_utf8_lossy(valid));
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{FFFD}');
                            self.invalid += 1;
                            rest = &after[n..];
                        }
                        None => {
                            self.pending.extend_from_slice(after);
                            break;
                        }
                    }
                }
            }
        }
        out
    }

    /// What is left at the end can never complete.
    fn flush(&mut self) -> String {
        let left = std::mem::take(&mut self.pending);
        self.invalid += u64::from(!left.is_empty());
        String::from_utf8_lossy(&left).into_owned()
    }
}

#[derive(Debug, Clone, Copy)]
struct Follower {
    /// The last record it has read.
    after: u64,
    seen: Instant,
}

/// The last `cap` bytes of one stream, and how many bytes were cut before
/// them (for `commands:run`).
#[derive(Debug)]
pub(crate) struct Tail {
    buf: VecDeque<u8>,
    cap: usize,
    cut: u64,
}

impl Tail {
    pub(crate) fn new(cap: usize) -> Self {
        Tail {
            buf: VecDeque::new(),
            cap,
            cut: 0,
        }
    }

    pub(crate) fn push(&mut self, bytes: &[u8]) {
        let bytes = if bytes.len() > self.cap {
            let extra = bytes.len() - self.cap;
            self.cut += extra as u64;
            &bytes[extra..]
        } else {
            bytes
        };
        self.buf.extend(bytes);
        let over = self.buf.len().saturating_sub(self.cap);
        if over > 0 {
            self.buf.drain(..over);
            self.cut += over as u64;
        }
    }

    /// The text kept, and the bytes cut before it. A character cut in half
    /// at the start is dropped whole (and counted as cut).
    pub(crate) fn finish(&self) -> (String, u64) {
        let bytes: Vec<u8> = self.buf.iter().copied().collect();
        let mut start = 0;
        if self.cut > 0 {
            while start < bytes.len() && start < 3 && (bytes[start] & 0b1100_0000) == 0b1000_0000 {
                start += 1;
            }
        }
        let text = String::from_utf8_lossy(&bytes[start..]).into_owned();
        (text, self.cut + start as u64)
    }
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Log {
    records: VecDeque<Entry>,
    retained: usize,
    cap: usize,
    next_seq: u64,
    /// Output bytes written so far.
    total: u64,
    carry: [Utf8Carry; 2],
    /// (seq, end offset) of some evicted records, thinned when full.
    checkpoints: Vec<(u64, u64)>,
    /// The exit record: its seq, content, and the output offset then.
    exit: Option<(u64, Ended, u64)>,
    followers: HashMap<u64, Follower>,
    /// Each stream's shaper while the command runs (when asked for).
    shapers: Option<Box<[Shaper; 2]>>,
    /// Each stream as shaped at the command's end.
    shaped: Option<Box<[(String, ShapeInfo); 2]>>,
}

/// What one read returns.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub(crate) records: Vec<Record>,
    /// The reader reached the end it asked for: the exit record, or (past
    /// it) the last output once nothing can add more.
    pub(crate) complete: bool,
}

fn stream_index(stream: Stream) -> usize {
    match stream {
        Stream::Stdout => 0,
        Stream::Stderr => 1,
    }
}

impl Log {
    /// A log that keeps about `cap` bytes of records.
    pub(crate) fn new(cap: usize) -> Self {
        let now = Instant::now();
        // Seen long enough ago that it lapses FIRST_READER_WITHIN from now.
        let first = Follower {
            after: 0,
            seen: now
                .checked_sub(FOLLOWER_IDLE - FIRST_READER_WITHIN)
                .unwrap_or(now),
        };
        Log {
            records: VecDeque::new(),
            retained: 0,
            cap,
            next_seq: 1,
            total: 0,
            carry: [Utf8Carry::default(), Utf8Carry::default()],
            checkpoints: Vec::new(),
            exit: None,
            followers: HashMap::from([(FIRST_READER, first)]),
            shapers: None,
            shaped: None,
        }
    }

    /// No reader is coming to read from the start (a run to its end): no
    /// output is held back for one.
    pub(crate) fn expect_no_first_reader(&mut self) {
        self.followers.remove(&FIRST_READER);
    }

    /// Shapes each stream as `spec` says, for [`Log::shaped`].
    pub(crate) fn shape(&mut self, spec: ShapeSpec) {
        self.shapers = Some(Box::new([Shaper::new(spec), Shaper::new(spec)]));
    }

    /// Each stream as shaped when the command ended (output its leftovers
    /// wrote after that is not in it), if the command asked for it.
    pub(crate) fn shaped(&self) -> Option<[(String, ShapeInfo); 2]> {
        let oldest = self.records.front().map(|r| r.seq);
        let mut shaped = self.shaped.as_deref().cloned()?;
        for (_, info) in &mut shaped {
            if let Some(m) = &mut info.middle {
                // The ring may have moved on since.
                m.retained = m.retained && oldest.is_some_and(|o| o <= m.after + 1);
            }
        }
        Some(shaped)
    }

    /// Bytes of records held now.
    pub(crate) fn retained(&self) -> usize {
        self.retained
    }

    /// Whether `incoming` more bytes would push out records that a reader
    /// who keeps reading has not read: then the command should wait.
    /// Making room can take several records (a small one the reader has
    /// read may sit before a large one it has not), so this finds the last
    /// record that would go, not only the oldest.
    pub(crate) fn must_wait(&self, incoming: usize, now: Instant) -> bool {
        let need = (self.retained + largest_record(incoming)).saturating_sub(self.cap);
        if need == 0 {
            return false;
        }
        let mut freed = 0;
        let mut last_going = None;
        for r in &self.records {
            freed += r.size;
            last_going = Some(r.seq);
            if freed >= need {
                break;
            }
        }
        let Some(last_going) = last_going else {
            return false;
        };
        self.followers
            .values()
            .any(|f| now.duration_since(f.seen) < FOLLOWER_IDLE && f.after < last_going)
    }

    /// Appends output of one stream. Whether to wait for readers first is
    /// the caller's business (see [`Log::must_wait`]).
    pub(crate) fn append(&mut self, stream: Stream, raw: &[u8]) {
        let text = self.carry[stream_index(stream)].decode(raw);
        self.push_output(stream, text, raw.len() as u64);
    }

    /// Adds an `error` record: something went wrong outside the command.
    pub(crate) fn error(&mut self, message: &str) {
        let seq = self.take_seq();
        let body = RecordBody::Error {
            message: message.to_string(),
        };
        self.push(seq, 0, body, message.len());
    }

    /// Ends the log: flushes undecodable leftovers, then the exit record
    /// (numbered `ended.seq` is filled in). Only the first call counts.
    pub(crate) fn finish(&mut self, mut ended: Ended) -> Ended {
        if let Some((_, e, _)) = &self.exit {
            return e.clone();
        }
        self.flush_carry();
        if let Some(shapers) = self.shapers.take() {
            let oldest = self.records.front().map(|r| r.seq);
            let [out, err] = *shapers;
            let [out_carry, err_carry] = &self.carry;
            self.shaped = Some(Box::new([
                out.finish(out_carry.invalid, oldest),
                err.finish(err_carry.invalid, oldest),
            ]));
        }
        ended.seq = self.take_seq();
        self.exit = Some((ended.seq, ended.clone(), self.total));
        ended
    }

    /// Flushes what no read can complete (the pipes closed).
    pub(crate) fn flush_carry(&mut self) {
        for stream in [Stream::Stdout, Stream::Stderr] {
            let left = self.carry[stream_index(stream)].flush();
            self.push_output(stream, left, 0);
        }
    }

    /// Drops the oldest records until at most `max` bytes are held (the
    /// exit record stays). Readers that needed them get a `Dropped` record.
    pub(crate) fn trim_to(&mut self, max: usize) {
        while self.retained > max {
            if !self.evict_oldest() {
                break;
            }
        }
    }

    /// A reader asks for records after `after`; it now follows the log.
    pub(crate) fn follow(&mut self, follower: u64, after: u64, now: Instant) {
        self.followers.remove(&FIRST_READER);
        self.followers
            .insert(follower, Follower { after, seen: now });
    }

    /// A reader went away.
    pub(crate) fn unfollow(&mut self, follower: u64) {
        self.followers.remove(&follower);
    }

    /// Records after `after`, at most about `max_bytes` of them (at least
    /// one). Without `past_exit` the read ends with the exit record;
    /// `output_closed` says no more output can come after it.
    pub(crate) fn read(
        &self,
        after: u64,
        max_bytes: usize,
        past_exit: bool,
        output_closed: bool,
    ) -> Batch {
        let mut batch = Batch::default();
        let mut cursor = after;
        let mut size = 0;
        let exit_seq = self.exit.as_ref().map(|(s, ..)| *s);
        if exit_seq.is_none_or(|s| cursor < s) {
            let before_exit = self.exit.as_ref().map(|(s, _, offset)| (*s, *offset));
            if !self.emit(&mut batch, &mut cursor, &mut size, max_bytes, before_exit) {
                return batch;
            }
            let Some((seq, ended, _)) = &self.exit else {
                return batch;
            };
            if size >= max_bytes && !batch.records.is_empty() {
                return batch;
            }
            batch.records.push(Record {
                seq: *seq,
                body: RecordBody::Exit(ended.clone()),
            });
            cursor = *seq;
        }
        if !past_exit {
            batch.complete = true;
            return batch;
        }
        if self.emit(&mut batch, &mut cursor, &mut size, max_bytes, None) {
            batch.complete = output_closed;
        }
        batch
    }

    /// Adds the held records numbered after `cursor` (and below `until`'s
    /// seq, when given with the output offset there) to `batch`, after a
    /// `Dropped` record for any this reader missed. False when the byte
    /// budget ran out first.
    fn emit(
        &self,
        batch: &mut Batch,
        cursor: &mut u64,
        size: &mut usize,
        max_bytes: usize,
        until: Option<(u64, u64)>,
    ) -> bool {
        let from = *cursor;
        let in_range = |seq: u64| seq > from && until.is_none_or(|(u, _)| seq < u);
        let (front_seq, front_start) = match self.records.iter().find(|r| in_range(r.seq)) {
            Some(r) => (r.seq, r.start),
            None => until.unwrap_or((self.next_seq, self.total)),
        };
        if front_seq > from + 1 {
            let lost = front_start.saturating_sub(self.end_of(from));
            if lost > 0 {
                batch.records.push(Record {
                    seq: front_seq - 1,
                    body: RecordBody::Dropped { bytes: lost },
                });
            }
            *cursor = front_seq - 1;
        }
        for r in self.records.iter().filter(|r| in_range(r.seq)) {
            if *size >= max_bytes && !batch.records.is_empty() {
                return false;
            }
            *size += r.size;
            batch.records.push(Record {
                seq: r.seq,
                body: r.body.clone(),
            });
            *cursor = r.seq;
        }
        true
    }

    /// The text of the last records, about `max_bytes` of it (stdout and
    /// stderr as they came).
    pub(crate) fn recent_text(&self, max_bytes: usize) -> String {
        let mut parts = Vec::new();
        let mut size = 0;
        for r in self.records.iter().rev() {
            if let RecordBody::Output { text, .. } = &r.body {
                parts.push(text.as_str());
                size += text.len();
                if size >= max_bytes {
                    break;
                }
            }
        }
        parts.reverse();
        let all: String = parts.concat();
        let cut = all.len().saturating_sub(max_bytes);
        let start = (cut..=all.len())
            .find(|i| all.is_char_boundary(*i))
            .unwrap_or(all.len());
        all[start..].to_string()
    }

    fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    fn push_output(&mut self, stream: Stream, text: String, raw: u64) {
        let shaper = self
            .shapers
            .as_deref_mut()
            .map(|s| &mut s[stream_index(stream)]);
        if text.is_empty() {
            if let Some(shaper) = shaper {
                shaper.raw_bytes(raw);
            }
            self.total += raw;
            return;
        }
        let seq = self.next_seq;
        if let Some(shaper) = shaper {
            shaper.feed(seq, &text, raw);
        }
        let seq = self.take_seq();
        let size = text.len();
        self.push(seq, raw, RecordBody::Output { stream, text, raw }, size);
    }

    fn push(&mut self, seq: u64, raw: u64, body: RecordBody, text_len: usize) {
        let size = text_len + RECORD_OVERHEAD;
        self.retained += size;
        self.records.push_back(Entry {
            seq,
            start: self.total,
            raw,
            body,
            size,
        });
        self.total += raw;
        // Keep the newest record even if it alone is over the cap. Readers
        // who keep reading were waited for before this was read.
        while self.retained > self.cap && self.records.len() > 1 {
            self.evict_oldest();
        }
    }

    fn evict_oldest(&mut self) -> bool {
        let Some(old) = self.records.pop_front() else {
            return false;
        };
        self.retained -= old.size;
        if self.checkpoints.len() >= MAX_CHECKPOINTS {
            // Thin out evenly: every other one goes.
            let mut keep = false;
            self.checkpoints.retain(|_| {
                keep = !keep;
                keep
            });
        }
        self.checkpoints.push((old.seq, old.start + old.raw));
        true
    }

    /// The output offset after record `after`: exact for 0 and for
    /// records still held, else a lower bound from the checkpoints.
    fn end_of(&self, after: u64) -> u64 {
        if after == 0 {
            return 0;
        }
        if let Some((seq, _, offset)) = &self.exit {
            if *seq == after {
                return *offset;
            }
        }
        if let Some(r) = self.records.iter().find(|r| r.seq == after) {
            return r.start + r.raw;
        }
        self.checkpoints
            .iter()
            .rev()
            .find(|(seq, _)| *seq <= after)
            .map(|(_, end)| *end)
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandboxd_proto::Usage;

    fn ended(code: i32) -> Ended {
        Ended {
            exit_code: code,
            timed_out: false,
            killed: false,
            duration_ms: 1,
            oom_killed: false,
            usage: Usage::default(),
            seq: 0,
        }
    }

    fn texts(b: &Batch) -> Vec<String> {
        b.records
            .iter()
            .map(|r| match &r.body {
                RecordBody::Output { stream, text, .. } => format!("{stream:?}:{text}"),
                RecordBody::Dropped { bytes } => format!("dropped:{bytes}"),
                RecordBody::Error { message } => format!("error:{message}"),
                RecordBody::Exit(e) => format!("exit:{}", e.exit_code),
            })
            .collect()
    }

    #[test]
    fn records_are_numbered_and_the_exit_ends_a_read() {
        let mut log = Log::new(1 << 20);
        log.append(Stream::Stdout, b"a\n");
        log.append(Stream::Stderr, b"b\n");
        let e = log.finish(ended(3));
        assert_eq!(e.seq, 3);
        log.append(Stream::Stdout, b"later\n");
        let b = log.read(0, 1 << 20, false, false);
        assert_eq!(texts(&b), ["Stdout:a\n", "Stderr:b\n", "exit:3"]);
        assert!(b.complete);
        let seqs: Vec<u64> = b.records.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, [1, 2, 3]);
        let past = log.read(3, 1 << 20, true, false);
        assert_eq!(texts(&past), ["Stdout:later\n"]);
        assert!(!past.complete, "leftovers may still print");
        assert!(log.read(4, 1 << 20, true, true).complete);
        assert!(log.read(3, 1 << 20, false, false).complete);
    }

    #[test]
    fn split_utf8_arrives_whole_and_invalid_bytes_become_replacement() {
        let mut log = Log::new(1 << 20);
        let euro = "€".as_bytes();
        log.append(Stream::Stdout, &euro[..1]);
        log.append(Stream::Stdout, &euro[1..]);
        log.append(Stream::Stdout, b"\xff!");
        log.append(Stream::Stdout, &euro[..2]);
        log.finish(ended(0));
        let b = log.read(0, 1 << 20, false, false);
        assert_eq!(
            texts(&b),
            ["Stdout:€", "Stdout:\u{FFFD}!", "Stdout:\u{FFFD}", "exit:0"]
        );
    }

    #[test]
    fn a_late_reader_learns_exactly_what_it_missed() {
        let mut log = Log::new(200);
        for _ in 0..20 {
            log.append(Stream::Stdout, &[b'x'; 50]);
        }
        log.finish(ended(0));
        let b = log.read(0, 1 << 20, false, false);
        let RecordBody::Dropped { bytes } = b.records[0].body else {
            panic!("first a drop: {:?}", texts(&b));
        };
        let kept: u64 = b.records[1..]
            .iter()
            .filter_map(|r| match &r.body {
                RecordBody::Output { raw, .. } => Some(*raw),
                _ => None,
            })
            .sum();
        assert_eq!(bytes + kept, 1000, "every byte accounted for");
        assert_eq!(b.records[1].seq, b.records[0].seq + 1);
    }

    #[test]
    fn a_writer_that_waits_when_told_never_pushes_out_an_unread_record() {
        // Caps just past what the raw bytes alone would need: a record's
        // overhead, and invalid bytes weighing three times their size once
        // decoded, must count before the append.
        let cases = [
            (b'x', 4096, 2 * 4096 + RECORD_OVERHEAD + 16),
            (0xff, 1024, 3 * 1024 + RECORD_OVERHEAD + 1024 + 100),
        ];
        for (byte, chunk, cap) in cases {
            let mut log = Log::new(cap);
            log.followers.clear();
            let now = Instant::now();
            log.follow(1, 0, now);
            let mut appended = 0;
            while !log.must_wait(chunk, now) && appended < 100 {
                log.append(Stream::Stdout, &vec![byte; chunk]);
                appended += 1;
            }
            assert!(appended >= 1, "room for one at least");
            assert_eq!(
                log.records.front().map(|r| r.seq),
                Some(1),
                "nothing unread was pushed out ({byte:#x})"
            );
        }
    }

    #[test]
    fn a_small_read_record_before_a_large_unread_one_does_not_let_it_go() {
        // The case a flood met: "ready" (read), then chunks up to the cap.
        let chunk = 1000;
        let cap = 10 * (chunk + RECORD_OVERHEAD);
        let mut log = Log::new(cap);
        log.followers.clear();
        let now = Instant::now();
        log.append(Stream::Stdout, b"ready\n");
        log.follow(1, 1, now);
        let mut appended = 0;
        while !log.must_wait(chunk, now) && appended < 100 {
            log.append(Stream::Stdout, &vec![b'x'; chunk]);
            appended += 1;
        }
        assert!(appended >= 1, "room for one at least");
        let front = log.records.iter().map(|r| r.seq).find(|s| *s > 1);
        assert_eq!(front, Some(2), "the unread record behind \"ready\" stays");
        assert!(
            log.read(1, 1 << 20, false, false)
                .records
                .iter()
                .all(|r| !matches!(r.body, RecordBody::Dropped { .. }))
        );
    }

    #[test]
    fn a_new_log_waits_a_moment_for_its_first_reader() {
        let mut log = Log::new(100);
        log.append(Stream::Stdout, &[b'x'; 90]);
        let now = Instant::now();
        assert!(log.must_wait(50, now), "held for a first reader");
        assert!(
            !log.must_wait(50, now + FIRST_READER_WITHIN),
            "but not for long"
        );
        log.follow(1, 1, now);
        assert!(!log.must_wait(50, now), "the reader that came read it");
    }

    #[test]
    fn a_run_to_its_end_holds_nothing_for_a_first_reader() {
        let mut log = Log::new(100);
        log.expect_no_first_reader();
        log.append(Stream::Stdout, &[b'x'; 90]);
        assert!(!log.must_wait(50, Instant::now()));
        // A reader that does come (through the list) is still waited for.
        log.follow(1, 0, Instant::now());
        assert!(log.must_wait(50, Instant::now()));
    }

    #[test]
    fn shaped_streams_are_those_of_the_records_and_stop_at_the_exit() {
        let mut log = Log::new(1 << 20);
        log.shape(ShapeSpec {
            max_chars: 1000,
            head_chars: 100,
            raw: false,
        });
        log.append(Stream::Stdout, b"a\xff\n\xe2\x82");
        log.append(Stream::Stderr, b"warn\n");
        log.append(Stream::Stdout, b"\xac\n");
        log.finish(ended(0));
        log.append(Stream::Stdout, b"after the exit\n");
        let [(out, out_info), (err, err_info)] = log.shaped().expect("shaped");
        assert_eq!(out, "a\u{FFFD}\n\u{20ac}\n");
        assert_eq!((out_info.total_bytes, out_info.total_chars), (7, 5));
        assert_eq!((err.as_str(), err_info.total_lines), ("warn\n", 1));
    }

    #[test]
    fn an_active_reader_holds_output_back_an_idle_one_does_not() {
        let mut log = Log::new(300);
        log.followers.clear();
        let t0 = Instant::now();
        log.follow(1, 0, t0);
        for _ in 0..3 {
            log.append(Stream::Stdout, &[b'x'; 60]);
        }
        assert!(log.must_wait(100, t0), "the reader has read nothing yet");
        log.follow(1, 3, t0);
        assert!(!log.must_wait(100, t0), "it read everything");
        log.follow(1, 0, t0);
        assert!(
            !log.must_wait(100, t0 + FOLLOWER_IDLE),
            "a reader that stopped asking holds nothing back"
        );
        log.unfollow(1);
        assert!(!log.must_wait(100, t0));
    }

    #[test]
    fn drops_before_and_after_the_exit_are_told_apart() {
        let mut log = Log::new(100);
        log.append(Stream::Stdout, &[b'a'; 40]);
        log.finish(ended(0));
        for _ in 0..5 {
            log.append(Stream::Stdout, &[b'b'; 40]);
        }
        let b = log.read(0, 1 << 20, false, false);
        assert_eq!(texts(&b), ["dropped:40", "exit:0"], "the exit ends it");
        let all = log.read(0, 1 << 20, true, true);
        let t = texts(&all);
        assert_eq!(t[..2], ["dropped:40", "exit:0"]);
        assert!(t[2].starts_with("dropped:"), "{t:?}");
        assert!(all.complete);
    }

    #[test]
    fn trimming_keeps_the_exit() {
        let mut log = Log::new(1 << 20);
        log.append(Stream::Stdout, b"hello");
        log.error("broke");
        log.finish(ended(137));
        log.trim_to(0);
        assert_eq!(log.retained(), 0);
        let b = log.read(0, 1 << 20, false, false);
        assert_eq!(texts(&b), ["dropped:5", "exit:137"]);
    }

    #[test]
    fn reads_are_bounded_and_resume_without_gaps() {
        let mut log = Log::new(1 << 20);
        for i in 0..100 {
            log.append(Stream::Stdout, format!("{i:03}\n").as_bytes());
        }
        log.finish(ended(0));
        let mut after = 0;
        let mut all = Vec::new();
        loop {
            let b = log.read(after, 200, false, false);
            assert!(!b.records.is_empty());
            after = b.records.last().map(|r| r.seq).unwrap_or(after);
            all.extend(texts(&b));
            if b.complete {
                break;
            }
        }
        assert_eq!(all.len(), 101);
        assert_eq!(all[100], "exit:0");
    }

    #[test]
    fn recent_text_is_the_end_of_the_output() {
        let mut log = Log::new(1 << 20);
        log.append(Stream::Stdout, b"first\n");
        log.append(Stream::Stderr, b"second\n");
        assert_eq!(log.recent_text(9), "t\nsecond\n");
        assert_eq!(log.recent_text(1000), "first\nsecond\n");
    }

    #[test]
    fn tail_keeps_the_end_and_counts_the_cut() {
        let mut t = Tail::new(4);
        t.push(b"abcdef");
        assert_eq!(t.finish(), ("cdef".to_string(), 2));
        let mut t = Tail::new(3);
        t.push("x€".as_bytes());
        assert_eq!(t.finish(), ("€".to_string(), 1));
        let mut t = Tail::new(2);
        t.push("€".as_bytes());
        assert_eq!(t.finish(), (String::new(), 3));
    }
}
