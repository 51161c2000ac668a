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

/// One record of a command's log as a reader gets it: what
/// `Commands::follow_lines` streams, typed, and what [`LogLine::render`]
/// writes as one NDJSON line for the REST log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogLine {
    /// Output of one stream, as UTF-8 text.
    Output {
        stream: Stream,
        text: String,
        seq: u64,
    },
    /// Records dropped before this reader read them, and the output bytes
    /// they held.
    Dropped { bytes: u64, seq: u64 },
    /// Something outside the command went wrong (sandboxd ended it).
    Error { message: String, seq: u64 },
    /// The command ended.
    Exit(Box<ExitRecord>),
    /// Nothing new: the stream is alive, at record `seq`.
    Heartbeat { seq: u64 },
}

/// The `exit` record: how the command ended; `oom_killed` and `usage`
/// when the agent said them, and the shaped streams and changes of a
/// command that asked for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitRecord {
    pub exit: ExitInfo,
    pub oom_killed: Option<bool>,
    pub usage: Option<Usage>,
    pub shaped: Option<Shaped>,
    pub changes: Option<Changes>,
    pub seq: u64,
}

impl ExitRecord {
    /// The agent's end record, with what the command asked for.
    pub fn of_agent(e: &Ended, seq: u64, shaped: Option<Shaped>, changes: Option<Changes>) -> Self {
        ExitRecord {
            exit: exit_of(e),
            oom_killed: Some(e.oom_killed),
            usage: Some(Usage::from(e.usage)),
            shaped,
            changes,
            seq,
        }
    }
}

impl LogLine {
    /// One agent record, as it reads to a client.
    pub fn of_record(r: &Record) -> LogLine {
        let seq = r.seq;
        match &r.body {
            RecordBody::Output { stream, text, .. } => LogLine::Output {
                stream: *stream,
                text: text.clone(),
                seq,
            },
            RecordBody::Dropped { bytes } => LogLine::Dropped { bytes: *bytes, seq },
            RecordBody::Error { message } => LogLine::Error {
                message: message.clone(),
                seq,
            },
            RecordBody::Exit(e) => {
                LogLine::Exit(Box::new(ExitRecord::of_agent(e, seq, None, None)))
            }
        }
    }

    /// The record's number in the log.
    pub fn seq(&self) -> u64 {
        match self {
            LogLine::Output { seq, .. }
            | LogLine::Dropped { seq, .. }
            | LogLine::Error { seq, .. }
            | LogLine::Heartbeat { seq } => *seq,
            LogLine::Exit(e) => e.seq,
        }
    }

    /// The record as one NDJSON line (see docs/API.md, the log).
    pub fn render(&self) -> Bytes {
        match self {
            LogLine::Output { stream, text, seq } => line(&OutputLine {
                stream: match stream {
                    Stream::Stdout => "stdout",
                    Stream::Stderr => "stderr",
                },
                data: text,
                seq: *seq,
            }),
            LogLine::Dropped { bytes, seq } => line(&DroppedLine {
                stream: "dropped",
                bytes: *bytes,
                seq: *seq,
            }),
            LogLine::Error { message, seq } => line(&ErrorLine {
                stream: "error",
                message,
                seq: *seq,
            }),
            LogLine::Heartbeat { seq } => line(&HeartbeatLine {
                stream: "heartbeat",
                seq: *seq,
            }),
            LogLine::Exit(e) => line(&ExitLine {
                stream: "exit",
                exit_code: e.exit.exit_code,
                timed_out: e.exit.timed_out,
                killed: e.exit.killed,
                oom_killed: e.oom_killed,
                usage: e.usage,
                stdout: e.shaped.as_ref().map(|s| s.stdout.as_str()),
                stderr: e.shaped.as_ref().map(|s| s.stderr.as_str()),
                output: e.shaped.as_ref().map(|s| &s.shapes),
                changes: e.changes.as_ref(),
                seq: e.seq,
            }),
        }
    }

    /// Records as consecutive NDJSON lines.
    pub fn render_all(lines: &[LogLine]) -> Bytes {
        lines
            .iter()
            .flat_map(|l| l.render())
            .collect::<Vec<u8>>()
            .into()
    }
}

/// How the agent's end record reads to a client.
pub fn exit_of(e: &Ended) -> ExitInfo {
    ExitInfo {
        exit_code: i64::from(e.exit_code),
        timed_out: e.timed_out,
        killed: e.killed,
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
        let out = LogLine::of_record(&Record {
            seq: 1,
            body: RecordBody::Output {
                stream: Stream::Stderr,
                text: "a \"b\"\n".into(),
                raw: 7,
            },
        })
        .render();
        assert_eq!(
            parse(&out),
            serde_json::json!({"stream": "stderr", "data": "a \"b\"\n", "seq": 1})
        );
        let exit = LogLine::of_record(&Record {
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
        })
        .render();
        assert_eq!(
            parse(&exit),
            serde_json::json!({"stream": "exit", "exitCode": 137, "timedOut": false, "killed": false,
                "oomKilled": true, "usage": {"cpuUserMs": 1, "cpuSystemMs": 2, "maxRssKb": 3}, "seq": 2})
        );
        assert_eq!(
            parse(&LogLine::Heartbeat { seq: 9 }.render()),
            serde_json::json!({"stream": "heartbeat", "seq": 9})
        );
        assert_eq!(
            parse(
                &LogLine::of_record(&Record {
                    seq: 4,
                    body: RecordBody::Dropped { bytes: 10 }
                })
                .render()
            ),
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
