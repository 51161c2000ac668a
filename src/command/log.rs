//! `OutputLog`: one command's output as a bounded ring of numbered NDJSON
//! records, with a watch channel that wakes live readers.
//!
//! Each record is encoded once, when it arrives, into the exact line readers
//! send (`Bytes`, so any number of readers share it without copying). The
//! ring is capped in bytes; when it is full the oldest records go, and a
//! reader that needed them gets one `dropped` record saying how many bytes
//! it missed. The producer never waits for a reader.
//!
//! Bytes are decoded as UTF-8 per stream with carry-over, so a character
//! split across two reads arrives whole; invalid bytes become U+FFFD.

use std::collections::VecDeque;
use std::sync::Mutex;

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::watch;

use crate::engine::OutputStream;

/// Most evicted-record checkpoints kept to estimate drops for `?after=`.
const MAX_CHECKPOINTS: usize = 64;
/// Most bytes of lines handed out in one read.
const MAX_BATCH_BYTES: usize = 1024 * 1024;

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExitInfo {
    pub exit_code: i64,
    pub timed_out: bool,
    pub killed: bool,
}

#[derive(Debug)]
struct Record {
    seq: u64,
    /// Output bytes (both streams) before this record.
    start: u64,
    raw_len: u64,
    line: Bytes,
}

#[derive(Debug, Default)]
struct Utf8Carry(Vec<u8>);

impl Utf8Carry {
    /// Decodes what can be decoded; keeps an incomplete trailing character.
    fn decode(&mut self, input: &[u8]) -> String {
        let joined;
        let bytes: &[u8] = if self.0.is_empty() {
            input
        } else {
            let mut v = std::mem::take(&mut self.0);
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
                            rest = &after[n..];
                        }
                        None => {
                            self.0.extend_from_slice(after);
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
        let left = std::mem::take(&mut self.0);
        String::from_utf8_lossy(&left).into_owned()
    }
}

#[derive(Debug)]
struct State {
    records: VecDeque<Record>,
    retained: usize,
    cap: usize,
    next_seq: u64,
    total: u64,
    stdout_bytes: u64,
    stderr_bytes: u64,
    carry: [Utf8Carry; 2],
    /// (seq, end offset) of some evicted records, thinned when full.
    checkpoints: Vec<(u64, u64)>,
    exit: Option<(u64, Bytes, ExitInfo)>,
}

/// Where a reader is: after which record, and how many output bytes it has
/// accounted for (known for readers that followed from the start).
#[derive(Debug, Clone, Copy, Default)]
pub struct Cursor {
    pub after: u64,
    offset: Option<u64>,
}

impl Cursor {
    /// A reader resuming after record `after` (0 = from the beginning).
    pub fn after(after: u64) -> Self {
        Cursor {
            after,
            offset: (after == 0).then_some(0),
        }
    }
}

/// What one read returns.
#[derive(Debug, Default)]
pub struct Batch {
    /// NDJSON lines, each ending in `\n`.
    pub lines: Vec<Bytes>,
    /// The exit record was included (or already passed): nothing more comes.
    pub done: bool,
}

/// See the module docs.
#[derive(Debug)]
pub struct OutputLog {
    state: Mutex<State>,
    changed: watch::Sender<u64>,
}

#[derive(Serialize)]
struct DataLine<'a> {
    stream: &'static str,
    data: &'a str,
    seq: u64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ExitLine {
    stream: &'static str,
    #[serde(flatten)]
    info: ExitInfo,
    seq: u64,
}

fn encode<T: Serialize>(value: &T) -> Bytes {
    // Serialising our own plain structs cannot fail; an empty line would be
    // skipped by NDJSON readers if it somehow did.
    let mut v = serde_json::to_vec(value).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

/// A `dropped` line.
fn dropped_line(bytes: u64, seq: u64) -> Bytes {
    encode(&serde_json::json!({"stream": "dropped", "bytes": bytes, "seq": seq}))
}

/// A `heartbeat` line: says the stream is alive, at record `seq`.
pub fn heartbeat_line(seq: u64) -> Bytes {
    encode(&serde_json::json!({"stream": "heartbeat", "seq": seq}))
}

impl OutputLog {
    /// A log that keeps at most `cap` bytes of lines.
    pub fn new(cap: usize) -> Self {
        OutputLog {
            state: Mutex::new(State {
                records: VecDeque::new(),
                retained: 0,
                cap,
                next_seq: 1,
                total: 0,
                stdout_bytes: 0,
                stderr_bytes: 0,
                carry: [Utf8Carry::default(), Utf8Carry::default()],
                checkpoints: Vec::new(),
                exit: None,
            }),
            changed: watch::channel(0).0,
        }
    }

    /// Wakes when a record is added.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Appends output of one stream.
    pub fn append(&self, stream: OutputStream, raw: &[u8]) {
        let seq = {
            let Ok(mut st) = self.state.lock() else {
                return;
            };
            let idx = match stream {
                OutputStream::Stdout => 0,
                OutputStream::Stderr => 1,
            };
            match stream {
                OutputStream::Stdout => st.stdout_bytes += raw.len() as u64,
                OutputStream::Stderr => st.stderr_bytes += raw.len() as u64,
            }
            let text = st.carry[idx].decode(raw);
            st.push(stream, &text, raw.len() as u64);
            st.next_seq - 1
        };
        self.changed.send_replace(seq);
    }

    /// Adds an `error` record: something went wrong outside the command
    /// (the engine restarted, the stream broke). Readers see it before the
    /// exit record.
    pub fn error(&self, message: &str) {
        let seq = {
            let Ok(mut st) = self.state.lock() else {
                return;
            };
            let seq = st.next_seq;
            st.next_seq += 1;
            let line =
                encode(&serde_json::json!({"stream": "error", "message": message, "seq": seq}));
            st.retained += line.len();
            let start = st.total;
            st.records.push_back(Record {
                seq,
                start,
                raw_len: 0,
                line,
            });
            seq
        };
        self.changed.send_replace(seq);
    }

    /// Ends the log: flushes undecodable leftovers, adds the exit record.
    /// Only the first call counts.
    pub fn finish(&self, info: ExitInfo) {
        let seq = {
            let Ok(mut st) = self.state.lock() else {
                return;
            };
            if st.exit.is_some() {
                return;
            }
            for (idx, stream) in [(0, OutputStream::Stdout), (1, OutputStream::Stderr)] {
                let left = st.carry[idx].flush();
                st.push(stream, &left, 0);
            }
            let seq = st.next_seq;
            st.next_seq += 1;
            let line = encode(&ExitLine {
                stream: "exit",
                info,
                seq,
            });
            st.exit = Some((seq, line, info));
            seq
        };
        self.changed.send_replace(seq);
    }

    /// The exit record's content, once there is one.
    pub fn exit(&self) -> Option<ExitInfo> {
        self.state
            .lock()
            .ok()
            .and_then(|st| st.exit.as_ref().map(|e| e.2))
    }

    /// Bytes written to stdout and stderr so far.
    pub fn byte_counts(&self) -> (u64, u64) {
        self.state
            .lock()
            .map(|st| (st.stdout_bytes, st.stderr_bytes))
            .unwrap_or((0, 0))
    }

    /// Bytes of lines held now.
    pub fn retained_bytes(&self) -> usize {
        self.state.lock().map(|st| st.retained).unwrap_or(0)
    }

    /// Drops the oldest records until at most `max` bytes are held (the
    /// exit record stays). Readers that needed them get a `dropped` record.
    pub fn trim_to(&self, max: usize) {
        if let Ok(mut st) = self.state.lock() {
            while st.retained > max {
                let Some(old) = st.records.pop_front() else {
                    break;
                };
                st.retained -= old.line.len();
                st.checkpoint(old.seq, old.start + old.raw_len);
            }
        }
    }

    /// The last record number handed out.
    pub fn last_seq(&self) -> u64 {
        self.state.lock().map(|st| st.next_seq - 1).unwrap_or(0)
    }

    /// The lines after `cursor`, advancing it. A `dropped` line stands in
    /// for records that were evicted before this reader got them.
    pub fn read(&self, cursor: &mut Cursor) -> Batch {
        let Ok(st) = self.state.lock() else {
            return Batch {
                lines: vec![],
                done: true,
            };
        };
        let mut batch = Batch::default();
        // Where retained output starts: the first record, or (all of it
        // dropped) the end of the output.
        let (front_seq, front_start) = match st.records.front() {
            Some(r) => (r.seq, r.start),
            None => (
                st.exit.as_ref().map(|e| e.0).unwrap_or(st.next_seq),
                st.total,
            ),
        };
        if front_seq > cursor.after + 1 {
            let seen = cursor
                .offset
                .unwrap_or_else(|| st.estimated_end(cursor.after));
            let lost = front_start.saturating_sub(seen);
            if lost > 0 {
                batch.lines.push(dropped_line(lost, front_seq - 1));
            }
            cursor.after = front_seq - 1;
            cursor.offset = Some(front_start);
        }
        let skip =
            usize::try_from((cursor.after + 1).saturating_sub(front_seq)).unwrap_or(usize::MAX);
        let mut size = 0;
        for r in st.records.iter().skip(skip) {
            if size >= MAX_BATCH_BYTES {
                return batch;
            }
            size += r.line.len();
            batch.lines.push(r.line.clone());
            cursor.after = r.seq;
            cursor.offset = Some(r.start + r.raw_len);
        }
        if let Some((seq, line, _)) = &st.exit {
            if cursor.after < *seq {
                batch.lines.push(line.clone());
                cursor.after = *seq;
            }
            batch.done = true;
        }
        batch
    }
}

impl State {
    fn push(&mut self, stream: OutputStream, text: &str, raw_len: u64) {
        if text.is_empty() {
            self.total += raw_len;
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let line = encode(&DataLine {
            stream: match stream {
                OutputStream::Stdout => "stdout",
                OutputStream::Stderr => "stderr",
            },
            data: text,
            seq,
        });
        self.retained += line.len();
        self.records.push_back(Record {
            seq,
            start: self.total,
            raw_len,
            line,
        });
        self.total += raw_len;
        // Keep the newest record even if it alone is over the cap.
        while self.retained > self.cap && self.records.len() > 1 {
            if let Some(old) = self.records.pop_front() {
                self.retained -= old.line.len();
                self.checkpoint(old.seq, old.start + old.raw_len);
            }
        }
    }

    fn checkpoint(&mut self, seq: u64, end: u64) {
        if self.checkpoints.len() >= MAX_CHECKPOINTS {
            // Thin out evenly: every other one goes.
            let mut keep = false;
            self.checkpoints.retain(|_| {
                keep = !keep;
                keep
            });
        }
        self.checkpoints.push((seq, end));
    }

    /// A lower bound for the output offset after record `after`, for
    /// readers that resumed with `?after=` into evicted records.
    fn estimated_end(&self, after: u64) -> u64 {
        self.checkpoints
            .iter()
            .rev()
            .find(|(seq, _)| *seq <= after)
            .map(|(_, end)| *end)
            .unwrap_or(0)
    }
}

/// The last `cap` bytes of one stream, as a terminal would show them, and
/// how many bytes were cut before them.
#[derive(Debug)]
pub struct Tail {
    buf: VecDeque<u8>,
    cap: usize,
    cut: u64,
}

impl Tail {
    pub fn new(cap: usize) -> Self {
        Tail {
            buf: VecDeque::new(),
            cap,
            cut: 0,
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
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

    /// The text kept, and the bytes cut before it. A character cut in half at
    /// the start is dropped whole (and counted as cut).
    pub fn finish(&self) -> (String, u64) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn lines(batch: &Batch) -> Vec<Value> {
        batch
            .lines
            .iter()
            .map(|l| {
                assert_eq!(l.last(), Some(&b'\n'));
                serde_json::from_slice(l).expect("json line")
            })
            .collect()
    }

    #[test]
    fn records_are_numbered_and_streams_kept_apart() {
        let log = OutputLog::new(1 << 20);
        log.append(OutputStream::Stdout, b"out\n");
        log.append(OutputStream::Stderr, b"err\n");
        log.finish(ExitInfo {
            exit_code: 3,
            timed_out: false,
            killed: false,
        });
        let mut c = Cursor::after(0);
        let b = log.read(&mut c);
        assert!(b.done);
        let v = lines(&b);
        assert_eq!(
            v[0],
            serde_json::json!({"stream": "stdout", "data": "out\n", "seq": 1})
        );
        assert_eq!(
            v[1],
            serde_json::json!({"stream": "stderr", "data": "err\n", "seq": 2})
        );
        assert_eq!(
            v[2],
            serde_json::json!({"stream": "exit", "exitCode": 3, "timedOut": false, "killed": false, "seq": 3})
        );
        // Resuming after 1 gives the rest.
        let mut c = Cursor::after(1);
        let v = lines(&log.read(&mut c));
        assert_eq!(v.len(), 2);
        assert_eq!(v[0]["seq"], 2);
        // Nothing after the end.
        let b = log.read(&mut c);
        assert!(b.lines.is_empty() && b.done);
    }

    #[test]
    fn split_utf8_arrives_whole_and_invalid_bytes_become_replacement() {
        let log = OutputLog::new(1 << 20);
        let euro = "€".as_bytes();
        log.append(OutputStream::Stdout, &euro[..1]);
        log.append(OutputStream::Stdout, &euro[1..]);
        log.append(OutputStream::Stdout, b"a\xffb");
        log.append(OutputStream::Stdout, &euro[..2]);
        log.finish(ExitInfo {
            exit_code: 0,
            timed_out: false,
            killed: false,
        });
        let v = lines(&log.read(&mut Cursor::after(0)));
        let text: String = v
            .iter()
            .filter(|l| l["stream"] == "stdout")
            .map(|l| l["data"].as_str().expect("data").to_string())
            .collect();
        assert_eq!(text, "€a\u{FFFD}b\u{FFFD}");
        assert_eq!(log.byte_counts(), (3 + 3 + 2, 0));
    }

    #[test]
    fn a_late_reader_learns_exactly_what_it_missed() {
        let log = OutputLog::new(200);
        for _ in 0..100 {
            log.append(OutputStream::Stdout, &[b'x'; 10]);
        }
        let v = lines(&log.read(&mut Cursor::after(0)));
        assert_eq!(v[0]["stream"], "dropped");
        let kept: u64 = v[1..]
            .iter()
            .map(|l| l["data"].as_str().expect("data").len() as u64)
            .sum();
        assert_eq!(v[0]["bytes"].as_u64().expect("bytes") + kept, 1000);
        assert_eq!(
            v[0]["seq"].as_u64().expect("seq") + 1,
            v[1]["seq"].as_u64().expect("seq")
        );
        assert!(log.state.lock().expect("lock").retained <= 200);
    }

    #[test]
    fn a_live_reader_that_falls_behind_gets_a_drop_then_carries_on() {
        let log = OutputLog::new(300);
        let mut c = Cursor::after(0);
        log.append(OutputStream::Stdout, b"first");
        assert_eq!(lines(&log.read(&mut c)).len(), 1);
        for _ in 0..50 {
            log.append(OutputStream::Stdout, &[b'y'; 20]);
        }
        let v = lines(&log.read(&mut c));
        assert_eq!(v[0]["stream"], "dropped");
        let kept: u64 = v[1..]
            .iter()
            .map(|l| l["data"].as_str().expect("data").len() as u64)
            .sum();
        assert_eq!(
            v[0]["bytes"].as_u64().expect("bytes") + kept,
            1000,
            "exact for a reader that followed"
        );
        log.append(OutputStream::Stdout, b"z");
        let v = lines(&log.read(&mut c));
        assert_eq!(v.len(), 1);
        assert_eq!(v[0]["data"], "z");
    }

    #[test]
    fn memory_stays_bounded_under_a_flood() {
        let log = OutputLog::new(64 * 1024);
        let chunk = vec![b'q'; 32 * 1024];
        for _ in 0..2000 {
            log.append(OutputStream::Stdout, &chunk);
        }
        let st = log.state.lock().expect("lock");
        assert!(st.retained <= 64 * 1024 + 40 * 1024, "{}", st.retained);
        assert!(st.checkpoints.len() <= MAX_CHECKPOINTS);
        assert_eq!(st.stdout_bytes, 2000 * 32 * 1024);
    }

    #[test]
    fn trimming_reports_drops_and_keeps_the_exit() {
        let log = OutputLog::new(1 << 20);
        for _ in 0..10 {
            log.append(OutputStream::Stdout, b"0123456789");
        }
        log.finish(ExitInfo {
            exit_code: 0,
            timed_out: false,
            killed: false,
        });
        log.trim_to(0);
        assert_eq!(log.retained_bytes(), 0);
        let v = lines(&log.read(&mut Cursor::after(0)));
        assert_eq!(v.len(), 2, "{v:?}");
        assert_eq!(v[0]["stream"], "dropped");
        assert_eq!(v[0]["bytes"], 100, "all output accounted for");
        assert_eq!(v[1]["stream"], "exit");
    }

    #[test]
    fn tail_keeps_the_end_and_counts_the_cut() {
        let mut t = Tail::new(4);
        t.push(b"abcdef");
        t.push(b"gh");
        assert_eq!(t.finish(), ("efgh".into(), 4));
        let mut t = Tail::new(4);
        t.push("x€".as_bytes()); // 4 bytes, fits
        t.push(b"y"); // cuts "x"
        assert_eq!(t.finish(), ("€y".into(), 1));
        let mut t = Tail::new(3);
        t.push("€€".as_bytes()); // keeps the last 3 bytes: a whole "€"
        assert_eq!(t.finish(), ("€".into(), 3));
        let mut t = Tail::new(4);
        t.push("€€".as_bytes()); // keeps 1 continuation byte + "€": the half goes
        assert_eq!(t.finish(), ("€".into(), 3));
    }
}
