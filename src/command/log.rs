//! A command's log as clients read it: NDJSON records, one per line,
//! rendered from the records the agent keeps (see `sandboxd-proto`). The
//! agent's records are checked here before they are passed on: numbers
//! must rise after the reader's position, and text is what the protocol
//! decoded (valid UTF-8, bounded by the frame).

use bytes::Bytes;
use sandboxd_proto::{Ended, Record, RecordBody, ShapeInfo, Stream};
use serde::Serialize;

use super::changes::Changes;

/// How a command ended, as `wait` and the `exit` record say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitInfo {
    pub exit_code: i64,
    pub timed_out: bool,
    pub killed: bool,
}

/// CPU time and peak memory of a command's process tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub cpu_user_ms: u64,
    pub cpu_system_ms: u64,
    pub max_rss_kb: u64,
}

impl From<sandboxd_proto::Usage> for Usage {
    fn from(u: sandboxd_proto::Usage) -> Self {
        Usage {
            cpu_user_ms: u.user_ms,
            cpu_system_ms: u.system_ms,
            max_rss_kb: u.max_rss_kb,
        }
    }
}

/// What shaping kept of one stream (see docs/API.md, Shaped output).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Shape {
    pub total_chars: u64,
    pub total_lines: u64,
    pub total_bytes: u64,
    pub omitted_chars: u64,
    pub omitted_lines: u64,
    pub omitted_bytes: u64,
    pub head_chars: u64,
    pub tail_chars: u64,
    pub binary: bool,
    pub collapsed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub middle: Option<Middle>,
}

/// Where the omitted part of a stream is in its command's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Middle {
    pub command_id: String,
    pub after: u64,
    pub until: u64,
    pub skip_chars: u64,
    pub retained: bool,
}

/// Both streams shaped: their texts and what they kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shaped {
    pub stdout: String,
    pub stderr: String,
    pub shapes: Shapes,
}

/// What shaping kept of each stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Shapes {
    pub stdout: Shape,
    pub stderr: Shape,
}

impl Shape {
    /// What the agent says about a stream it shaped into `text` for
    /// `command_id` within `max_chars`, checked: the numbers must agree
    /// with each other and with the text.
    pub fn from_agent(
        info: &ShapeInfo,
        text: &str,
        command_id: &str,
        max_chars: u32,
    ) -> Result<Shape, String> {
        let shown = text.chars().count() as u64;
        let consistent = shown <= u64::from(max_chars)
            && info.omitted_chars <= info.total_chars
            && info.omitted_lines <= info.total_lines
            && info.head_chars + info.tail_chars <= shown
            && (info.binary || info.omitted_chars > 0 || shown <= info.total_chars)
            && info.middle.is_none_or(|m| m.after < m.until)
            && (info.middle.is_some() || info.binary || info.omitted_chars == 0);
        if !consistent {
            return Err(format!("shaped output that does not add up ({info:?})"));
        }
        Ok(Shape {
            total_chars: info.total_chars,
            total_lines: info.total_lines,
            total_bytes: info.total_bytes,
            omitted_chars: info.omitted_chars,
            omitted_lines: info.omitted_lines,
            omitted_bytes: info.omitted_bytes,
            head_chars: info.head_chars,
            tail_chars: info.tail_chars,
            binary: info.binary,
            collapsed: info.collapsed,
            middle: info.middle.map(|m| Middle {
                command_id: command_id.to_string(),
                after: m.after,
                until: m.until,
                skip_chars: m.skip_chars,
                retained: m.retained,
            }),
        })
    }
}

#[derive(Serialize)]
struct OutputLine<'a> {
    stream: &'static str,
    data: &'a str,
    seq: u64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ExitLine<'a> {
    stream: &'static str,
    exit_code: i64,
    timed_out: bool,
    killed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    oom_killed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stdout: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stderr: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<&'a Shapes>,
    #[serde(skip_serializing_if = "Option::is_none")]
    changes: Option<&'a Changes>,
    seq: u64,
}

#[derive(Serialize)]
struct ErrorLine<'a> {
    stream: &'static str,
    message: &'a str,
    seq: u64,
}

#[derive(Serialize)]
struct DroppedLine {
    stream: &'static str,
    bytes: u64,
    seq: u64,
}

#[derive(Serialize)]
struct HeartbeatLine {
    stream: &'static str,
    seq: u64,
}

fn line<T: Serialize>(value: &T) -> Bytes {
    // Serialising our own plain structs cannot fail; an empty line would be
    // skipped by NDJSON readers if it somehow did.
    let mut v = serde_json::to_vec(value).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

/// A `heartbeat` line: the stream is alive, at record `seq`.
pub fn heartbeat_line(seq: u64) -> Bytes {
    line(&HeartbeatLine {
        stream: "heartbeat",
        seq,
    })
}

/// An `error` line: something outside the command went wrong.
pub fn error_line(message: &str, seq: u64) -> Bytes {
    line(&ErrorLine {
        stream: "error",
        message,
        seq,
    })
}

/// An `exit` line; `oom_killed` and `usage` when the agent said them, and
/// the shaped streams of a command that asked for them.
pub fn exit_line(
    exit: ExitInfo,
    oom_killed: Option<bool>,
    usage: Option<Usage>,
    shaped: Option<&Shaped>,
    seq: u64,
) -> Bytes {
    line(&ExitLine {
        stream: "exit",
        exit_code: exit.exit_code,
        timed_out: exit.timed_out,
        killed: exit.killed,
        oom_killed,
        usage,
        stdout: shaped.map(|s| s.stdout.as_str()),
        stderr: shaped.map(|s| s.stderr.as_str()),
        output: shaped.map(|s| &s.shapes),
        changes: None,
        seq,
    })
}

/// The agent's `exit` record, with the shaped streams and what the command
/// changed when it was started with `output` or `changes` (and its agent
/// could say).
pub fn render_exit(
    e: &Ended,
    seq: u64,
    shaped: Option<&Shaped>,
    changes: Option<&Changes>,
) -> Bytes {
    line(&ExitLine {
        stream: "exit",
        exit_code: i64::from(e.exit_code),
        timed_out: e.timed_out,
        killed: e.killed,
        oom_killed: Some(e.oom_killed),
        usage: Some(Usage::from(e.usage)),
        stdout: shaped.map(|s| s.stdout.as_str()),
        stderr: shaped.map(|s| s.stderr.as_str()),
        output: shaped.map(|s| &s.shapes),
        changes,
        seq,
    })
}

/// How the agent's end record reads to a client.
pub fn exit_of(e: &Ended) -> ExitInfo {
    ExitInfo {
        exit_code: i64::from(e.exit_code),
        timed_out: e.timed_out,
        killed: e.killed,
    }
}

/// Renders one agent record.
pub fn render(r: &Record) -> Bytes {
    match &r.body {
        RecordBody::Output { stream, text, .. } => line(&OutputLine {
            stream: match stream {
                Stream::Stdout => "stdout",
                Stream::Stderr => "stderr",
            },
            data: text,
            seq: r.seq,
        }),
        RecordBody::Dropped { bytes } => line(&DroppedLine {
            stream: "dropped",
            bytes: *bytes,
            seq: r.seq,
        }),
        RecordBody::Error { message } => error_line(message, r.seq),
        RecordBody::Exit(e) => render_exit(e, r.seq, None, None),
    }
}

/// Checks that the agent's records follow a reader at `after`: numbers
/// rise, each above the last. Returns the last one's number.
pub fn check_order(after: u64, records: &[Record]) -> Result<u64, String> {
    let mut last = after;
    for r in records {
        if r.seq <= last {
            return Err(format!("record {} came after {last}", r.seq));
        }
        last = r.seq;
    }
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(b: &Bytes) -> serde_json::Value {
        assert!(b.ends_with(b"\n"));
        serde_json::from_slice(b).expect("json line")
    }

    #[test]
    fn records_render_as_the_contract_says() {
        let out = render(&Record {
            seq: 1,
            body: RecordBody::Output {
                stream: Stream::Stderr,
                text: "a \"b\"\n".into(),
                raw: 7,
            },
        });
        assert_eq!(
            parse(&out),
            serde_json::json!({"stream": "stderr", "data": "a \"b\"\n", "seq": 1})
        );
        let exit = render(&Record {
            seq: 2,
            body: RecordBody::Exit(Ended {
                exit_code: 137,
                timed_out: false,
                killed: false,
                duration_ms: 5,
                oom_killed: true,
                usage: sandboxd_proto::Usage {
                    user_ms: 1,
                    system_ms: 2,
                    max_rss_kb: 3,
                },
                seq: 2,
            }),
        });
        assert_eq!(
            parse(&exit),
            serde_json::json!({"stream": "exit", "exitCode": 137, "timedOut": false, "killed": false,
                "oomKilled": true, "usage": {"cpuUserMs": 1, "cpuSystemMs": 2, "maxRssKb": 3}, "seq": 2})
        );
        assert_eq!(
            parse(&heartbeat_line(9)),
            serde_json::json!({"stream": "heartbeat", "seq": 9})
        );
        assert_eq!(
            parse(&render(&Record {
                seq: 4,
                body: RecordBody::Dropped { bytes: 10 }
            })),
            serde_json::json!({"stream": "dropped", "bytes": 10, "seq": 4})
        );
    }

    #[test]
    fn records_out_of_order_are_refused() {
        let r = |seq| Record {
            seq,
            body: RecordBody::Error {
                message: String::new(),
            },
        };
        assert_eq!(check_order(3, &[r(4), r(7)]), Ok(7));
        assert!(check_order(3, &[r(3)]).is_err());
        assert!(check_order(0, &[r(5), r(5)]).is_err());
        assert_eq!(check_order(2, &[]), Ok(2));
    }
}
