//! Containers' logs: following what a container prints on stdout, line by
//! line with the engine's time stamps, and waiting for a container to
//! print something (a proxy saying it listens).

use std::time::Duration;

use bollard::query_parameters::LogsOptionsBuilder;
use futures_util::StreamExt;

use super::{Engine, EngineResult};

/// One line of a container's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// When the engine logged it, as `YYYY-MM-DDTHH:MM:SS.nnnnnnnnn`:
    /// later lines sort after earlier ones.
    pub at: String,
    pub text: String,
}

impl LogLine {
    /// A line as the engine sends it with time stamps: RFC 3339 with up
    /// to nine fraction digits (trailing zeros dropped), in UTC, a space,
    /// the text. The fraction is padded so stamps compare as strings.
    fn parse(line: &str) -> Option<LogLine> {
        let (stamp, text) = line.split_once(' ')?;
        let stamp = stamp.strip_suffix('Z')?;
        let (seconds, fraction) = stamp.split_once('.').unwrap_or((stamp, ""));
        let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if seconds.len() != 19 || fraction.len() > 9 || !digits(fraction) {
            return None;
        }
        Some(LogLine {
            at: format!("{seconds}.{fraction:0<9}"),
            text: text.to_string(),
        })
    }
}

impl Engine {
    /// The lines `container` prints on stdout from `since` (unix seconds)
    /// on, as they come, until it stops, each with the time the engine
    /// logged it; lines longer than `max` bytes (and what cannot be read
    /// as text) are skipped, so what is held is bounded.
    pub fn follow_stdout_lines(
        &self,
        container: &str,
        since: i32,
        max: usize,
    ) -> impl futures_util::Stream<Item = LogLine> + use<> {
        let options = LogsOptionsBuilder::new()
            .follow(true)
            .stdout(true)
            .stderr(false)
            .since(since)
            .timestamps(true)
            .build();
        let chunks = match self.docker() {
            Ok(docker) => docker.logs(container, Some(options)).boxed(),
            Err(_) => futures_util::stream::empty().boxed(),
        };
        // Room for the engine's time stamp in front of each line.
        let max = max + 64;
        let mut partial: Vec<u8> = Vec::new();
        let mut skipping = false;
        chunks
            .take_while(|c| std::future::ready(c.is_ok()))
            .flat_map(move |chunk| {
                let mut lines = Vec::new();
                for &b in chunk.map(|c| c.into_bytes()).unwrap_or_default().iter() {
                    if b == b'\n' {
                        if !skipping {
                            lines.extend(
                                String::from_utf8(std::mem::take(&mut partial))
                                    .ok()
                                    .and_then(|l| LogLine::parse(&l)),
                            );
                        }
                        partial.clear();
                        skipping = false;
                    } else if partial.len() >= max {
                        skipping = true;
                        partial.clear();
                    } else if !skipping {
                        partial.push(b);
                    }
                }
                futures_util::stream::iter(lines)
            })
    }

    /// Whether `container` prints `needle` (on stdout or stderr, from its
    /// start) within `within`; false when it ends or time is up first. What
    /// is kept to find a needle split across chunks is bounded.
    pub async fn wait_for_output(
        &self,
        container: &str,
        needle: &str,
        within: Duration,
    ) -> EngineResult<bool> {
        use futures_util::StreamExt;
        let docker = self.docker()?;
        let options = LogsOptionsBuilder::new()
            .follow(true)
            .stdout(true)
            .stderr(true)
            .build();
        let mut logs = docker.logs(container, Some(options));
        let keep = needle.len().max(1) * 2 + 4096;
        let mut seen: Vec<u8> = Vec::new();
        let search = async {
            while let Some(chunk) = logs.next().await {
                seen.extend_from_slice(&chunk?.into_bytes());
                if seen.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                    return Ok(true);
                }
                let cut = seen.len().saturating_sub(keep);
                seen.drain(..cut);
            }
            Ok(false)
        };
        match tokio::time::timeout(within, search).await {
            Ok(found) => found,
            Err(_) => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LogLine;

    #[test]
    fn log_time_stamps_are_padded_to_sort_as_strings() {
        let a = LogLine::parse("2026-11-25T10:00:00.1Z egress-denied x").expect("line");
        let b = LogLine::parse("2026-11-25T10:00:00.12Z next").expect("line");
        let c = LogLine::parse("2026-11-25T10:00:01Z later").expect("line");
        assert_eq!(a.at, "2026-11-25T10:00:00.100000000");
        assert_eq!(a.text, "egress-denied x");
        assert!(a.at < b.at && b.at < c.at, "{a:?} {b:?} {c:?}");
        for bad in [
            "no-stamp",
            "2026-11-25T10:00:00.1 no-zone",
            "2026-11-25T10:00:00.1234567890Z too-fine",
            "2026-11-25T10:00:00.1xZ not-digits",
            "10:00:00Z short",
        ] {
            assert_eq!(LogLine::parse(bad), None, "{bad}");
        }
    }
}
