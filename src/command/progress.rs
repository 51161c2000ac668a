//! A running command's output as progress: its log followed from the
//! start, the stdout and stderr text gathered and handed to a reporter at
//! most every so often, the newest characters of it only.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::Commands;

impl Commands {
    /// Follows the command's log until it ends or `stop`, calling
    /// `report(text, bytes_so_far)` with the output since the last report
    /// (its newest `max_chars` characters), at most every `every`; stops
    /// early when `report` answers false.
    pub async fn report_output<F, Fut>(
        &self,
        sandbox_id: &str,
        command_id: &str,
        every: Duration,
        max_chars: usize,
        stop: CancellationToken,
        mut report: F,
    ) where
        F: FnMut(String, u64) -> Fut,
        Fut: Future<Output = bool>,
    {
        let Ok(lines) = self
            .follow_logs(sandbox_id, command_id, 0, false, stop.clone())
            .await
        else {
            return;
        };
        let mut lines = std::pin::pin!(lines);
        let mut pending = String::new();
        let mut seen = 0u64;
        let mut last = Instant::now();
        loop {
            let chunk = tokio::select! {
                c = lines.next() => c,
                _ = stop.cancelled() => None,
            };
            let Some(chunk) = chunk else { break };
            // The records are the log's own NDJSON lines.
            for line in chunk.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                let Ok(record) = serde_json::from_slice::<serde_json::Value>(line) else {
                    continue;
                };
                if matches!(record["stream"].as_str(), Some("stdout" | "stderr"))
                    && let Some(data) = record["data"].as_str()
                {
                    seen += data.len() as u64;
                    pending.push_str(data);
                    keep_newest(&mut pending, max_chars);
                }
            }
            if !pending.is_empty() && last.elapsed() >= every {
                if !report(std::mem::take(&mut pending), seen).await {
                    break;
                }
                last = Instant::now();
            }
        }
    }
}

/// Drops all but the last `max` characters of `s`.
fn keep_newest(s: &mut String, max: usize) {
    let chars = s.chars().count();
    if chars > max {
        let cut = s
            .char_indices()
            .nth(chars - max)
            .map_or(s.len(), |(i, _)| i);
        s.replace_range(..cut, "");
    }
}

#[cfg(test)]
mod tests {
    use super::keep_newest;

    #[test]
    fn keeps_the_newest_characters() {
        let mut s = "aé€b".to_string();
        keep_newest(&mut s, 2);
        assert_eq!(s, "€b");
        let mut short = "ab".to_string();
        keep_newest(&mut short, 5);
        assert_eq!(short, "ab");
    }
}
