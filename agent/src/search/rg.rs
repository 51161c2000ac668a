//! Searching with ripgrep: finding `rg`, running `rg --json` in the
//! directory the walk opened, and reading what it prints, as untrusted as
//! the files it read: an output line over [`MAX_RG_MESSAGE`] is skipped
//! (counted if it was a match), and the reading stops at the deadline.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::Instant;

use sandboxd_proto::{Match, Search, Searched};

use super::builtin::MAX_FILE_BYTES;
use super::collect::Collector;

/// Longest output line of `rg` read; a longer one is skipped.
const MAX_RG_MESSAGE: usize = 4 * 1024 * 1024;

/// `rg` on the agent's PATH (or the usual directories when it has none).
pub(super) fn find_rg() -> Option<String> {
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
pub(super) fn run_rg(
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

#[cfg(test)]
mod tests {
    use super::super::collect::MAX_LINE_BYTES;
    use super::*;

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

    #[test]
    fn base64_decodes() {
        assert_eq!(base64_decode("aGk/"), b"hi?");
        assert_eq!(base64_decode("/w=="), [255]);
    }
}
