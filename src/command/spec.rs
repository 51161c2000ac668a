//! A command request, validated into the argv, environment and limits that
//! will run. Every refusal names the field.

use std::collections::BTreeMap;
use std::time::Duration;

use sandboxd_proto::{SHAPE_MARKER_CHARS as MARKER_CHARS, ShapeSpec};
use serde::Deserialize;
use utoipa::ToSchema;

use crate::config::Config;
use crate::field_error::FieldError;
use crate::process_fields::{self, no_nul, summarise};

/// Default for `maxOutputBytes` of `commands:run`.
pub const DEFAULT_RUN_OUTPUT_BYTES: usize = 1024 * 1024;
/// Most `maxOutputBytes` a run may ask for, per stream.
pub const MAX_RUN_OUTPUT_BYTES: usize = 16 * 1024 * 1024;
/// Range of `output.maxChars`.
pub const MIN_SHAPED_CHARS: u32 = 256;
pub const MAX_SHAPED_CHARS: u32 = 1_000_000;

/// `output`: how to shape each stream.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = OutputBody)]
pub struct OutputRequest {
    /// Most characters of each shaped stream (256–1000000), the line that
    /// says what was omitted included.
    pub max_chars: i64,
    /// Characters given to the head (0 to `maxChars` − 80); default a
    /// quarter of `maxChars`.
    #[serde(default)]
    pub head_chars: Option<i64>,
    /// Keep escape sequences and carriage returns; default `false`
    /// (collapsed).
    #[serde(default)]
    pub raw: Option<bool>,
}

/// `POST …/commands` and `…/commands:run` bodies. Exactly one of `cmd` and
/// `command` is required; the domain checks the rules and names the field.
// Named `CommandBody` in the OpenAPI document, as it always was.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = CommandBody)]
pub struct CommandRequest {
    /// A program; run with `args` as its argv, without re-parsing.
    #[serde(default)]
    pub cmd: Option<String>,
    /// Only with `cmd`.
    #[serde(default)]
    pub args: Option<Vec<String>>,
    /// A shell script, instead of `cmd`.
    #[serde(default)]
    pub command: Option<String>,
    /// Default `bash`.
    #[serde(default)]
    pub shell: Option<String>,
    /// Default `true`: a login shell.
    #[serde(default)]
    pub login: Option<bool>,
    /// Workspace-relative or absolute under the workspace; created if missing.
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Text the command reads as its stdin.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Keep the command's stdin open: input is sent with
    /// `POST …/commands/{commandId}/stdin` until `…:closeStdin`. Not with
    /// `stdin`. Default `false` (stdin is `stdin`, then its end).
    #[serde(default)]
    pub stdin_open: Option<bool>,
    /// At least 1; capped to `max_timeout_ms` (the answer gives the
    /// effective value).
    #[serde(default)]
    pub timeout_ms: Option<i64>,
    /// Accepted and ignored: every command runs detached from the request.
    // RemcoChat sends it.
    #[serde(default)]
    pub detached: Option<bool>,
    /// Only used by `commands:run`: bytes of each stream's tail to return
    /// (0–16777216).
    #[serde(default)]
    pub max_output_bytes: Option<i64>,
    /// Each stream shaped for a model: in the `commands:run` answer and in
    /// the `exit` record of the log. Not with `maxOutputBytes`.
    #[serde(default)]
    pub output: Option<OutputRequest>,
    /// Report the files the command created, modified and deleted in the
    /// workspace by its end: in the `commands:run` answer and in the
    /// `exit` record of its log.
    // Parsed by `super::changes::parse`, which names the field it refuses;
    // `ChangesParam` only describes it.
    #[serde(default)]
    #[schema(value_type = Option<ChangesParam>)]
    pub changes: Option<serde_json::Value>,
    /// A label: a checkpoint of the workspace is taken just before the
    /// command starts (see `POST …/checkpoints`), and the answer gives its
    /// `checkpointId`. A label the sandbox has is refused (409
    /// `checkpoint_label_taken`) and the command does not start.
    // Taken out by `App` before the command layer parses the request.
    #[serde(default)]
    pub checkpoint: Option<String>,
}

/// `changes`: `true` (ignore `.git`, `node_modules`, `__pycache__` and
/// `.venv`, list up to 1000), `false` (the default: no report), or options.
#[derive(Debug, ToSchema)]
#[serde(untagged)]
#[allow(
    dead_code,
    reason = "it describes the field; the domain parses it and names the field it refuses"
)]
enum ChangesParam {
    On(bool),
    With(ChangesOptions),
}

/// Options of `changes`; each left out keeps its default.
#[derive(Debug, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "it describes the field; the domain parses it and names the field it refuses"
)]
struct ChangesOptions {
    /// Directory names (no `/`) whose trees are left out, at any depth: at
    /// most 64, each 1–255 bytes. Replaces the default list.
    ignore: Option<Vec<String>>,
    /// Most changes listed, 1–10000 (default 1000); `more` counts the rest.
    #[schema(minimum = 1, maximum = 10000)]
    max: Option<u32>,
}

/// What will run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandSpec {
    pub argv: Vec<String>,
    /// Added to the sandbox's environment.
    pub env: Vec<(String, String)>,
    /// Absolute path inside the sandbox, created if missing.
    pub cwd: Option<String>,
    pub stdin: Vec<u8>,
    /// The stdin stays open for input sent later.
    pub stdin_open: bool,
    /// The effective timeout: what was asked for, capped to `max_timeout`.
    pub timeout: Duration,
    /// What was asked for, when it was capped.
    pub requested_timeout: Option<Duration>,
    pub summary: String,
    pub max_output_bytes: usize,
    /// Shape the streams instead of keeping their tails.
    pub shape: Option<ShapeSpec>,
    /// What the agent watches for the files the command changes.
    pub changes: Option<sandboxd_proto::ChangesSpec>,
}

fn bad(field: &str, msg: impl std::fmt::Display) -> FieldError {
    FieldError::new(field, msg.to_string())
}

fn is_shell(cmd: &str) -> bool {
    matches!(
        cmd,
        "bash" | "sh" | "/bin/bash" | "/bin/sh" | "/usr/bin/bash" | "/usr/bin/sh"
    )
}

impl CommandSpec {
    /// Validates `req`; the error is a sentence naming the field.
    pub fn parse(req: CommandRequest, config: &Config) -> Result<CommandSpec, FieldError> {
        let login = req.login.unwrap_or(true);
        let shell = req.shell.unwrap_or_else(|| "bash".into());
        let shell_ok = !shell.is_empty()
            && shell.len() <= 256
            && shell
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'_' | b'-'));
        if !shell_ok {
            return Err(bad("shell", "must be a program name or path, e.g. bash"));
        }
        let flag = if login { "-lc" } else { "-c" };
        let (argv, summary) = match (req.cmd, req.command) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "cmd",
                    "give either cmd (with args) or command, not both",
                ));
            }
            (None, None) => {
                return Err(bad(
                    "cmd",
                    "a command is required (cmd with args, or command)",
                ));
            }
            (None, Some(script)) => {
                if req.args.is_some() {
                    return Err(bad("args", "goes with cmd, not with command"));
                }
                no_nul("command", &script)?;
                let summary = summarise(&script);
                (vec![shell, flag.to_string(), script], summary)
            }
            (Some(cmd), None) => {
                if cmd.is_empty() {
                    return Err(bad("cmd", "must not be empty"));
                }
                no_nul("cmd", &cmd)?;
                let args = req.args.unwrap_or_default();
                for (i, a) in args.iter().enumerate() {
                    no_nul(&format!("args[{i}]"), a)?;
                }
                if is_shell(&cmd) && args.first().is_some_and(|a| a.starts_with('-')) {
                    // The client chose the shell and its flags (RemcoChat
                    // sends bash -lc SCRIPT): run exactly that.
                    let summary = match args
                        .iter()
                        .position(|a| a.starts_with('-') && a.contains('c'))
                    {
                        Some(i) if i + 1 < args.len() => summarise(&args[i + 1]),
                        _ => summarise(&args.join(" ")),
                    };
                    let mut argv = vec![cmd];
                    argv.extend(args);
                    (argv, summary)
                } else {
                    let summary = summarise(
                        &std::iter::once(cmd.as_str())
                            .chain(args.iter().map(String::as_str))
                            .collect::<Vec<_>>()
                            .join(" "),
                    );
                    let mut argv = vec![cmd];
                    argv.extend(args);
                    if login {
                        argv = process_fields::through_login_shell(shell, argv);
                    }
                    (argv, summary)
                }
            }
        };

        let env = process_fields::env_vars(req.env)?;
        let cwd = process_fields::cwd(req.cwd, config)?;

        // Longer than the maximum is capped, not refused: RemcoChat sends
        // its own configured limit (up to 5 h), and the original capped.
        let (timeout, requested_timeout) = match req.timeout_ms {
            None => (config.default_timeout, None),
            Some(t) => {
                let asked = u64::try_from(t)
                    .ok()
                    .filter(|t| *t >= 1)
                    .map(Duration::from_millis)
                    .ok_or_else(|| bad("timeoutMs", format!("must be at least 1 (got {t})")))?;
                if asked > config.max_timeout {
                    (config.max_timeout, Some(asked))
                } else {
                    (asked, None)
                }
            }
        };
        let max_output_bytes = match req.max_output_bytes {
            None => DEFAULT_RUN_OUTPUT_BYTES,
            Some(n) => usize::try_from(n)
                .ok()
                .filter(|n| *n <= MAX_RUN_OUTPUT_BYTES)
                .ok_or_else(|| {
                    bad(
                        "maxOutputBytes",
                        format!("must be between 0 and {MAX_RUN_OUTPUT_BYTES} (got {n})"),
                    )
                })?,
        };

        if req.output.is_some() && req.max_output_bytes.is_some() {
            return Err(bad(
                "output",
                "give output (shaped streams) or maxOutputBytes (tails), not both",
            ));
        }
        let shape = req.output.map(shape_of).transpose()?;
        let changes = super::changes::parse(req.changes)?;
        let stdin_open = req.stdin_open.unwrap_or(false);
        if stdin_open && req.stdin.is_some() {
            return Err(bad(
                "stdinOpen",
                "give stdin (text read at once) or stdinOpen (input sent later), not both",
            ));
        }

        Ok(CommandSpec {
            argv,
            env,
            cwd,
            stdin: req.stdin.map(String::into_bytes).unwrap_or_default(),
            stdin_open,
            timeout,
            requested_timeout,
            summary,
            max_output_bytes,
            shape,
            changes,
        })
    }
}

/// Checks `output`.
fn shape_of(o: OutputRequest) -> Result<ShapeSpec, FieldError> {
    shape_spec("output.", o.max_chars, o.head_chars, o.raw.unwrap_or(false))
}

/// Checks a budget for shaped text given as `{at}maxChars` and
/// `{at}headChars` (field names in refusals): the head defaults to a
/// quarter of the budget. Also the budget of a checkpoint's text diff.
pub fn shape_spec(
    at: &str,
    max_chars: i64,
    head_chars: Option<i64>,
    raw: bool,
) -> Result<ShapeSpec, FieldError> {
    let max = u32::try_from(max_chars)
        .ok()
        .filter(|n| (MIN_SHAPED_CHARS..=MAX_SHAPED_CHARS).contains(n))
        .ok_or_else(|| {
            bad(
                &format!("{at}maxChars"),
                format!(
                    "must be between {MIN_SHAPED_CHARS} and {MAX_SHAPED_CHARS} (got {max_chars})"
                ),
            )
        })?;
    let most_head = max - MARKER_CHARS;
    let head_chars = match head_chars {
        None => max / 4,
        Some(h) => u32::try_from(h)
            .ok()
            .filter(|h| *h <= most_head)
            .ok_or_else(|| {
                bad(
                    &format!("{at}headChars"),
                    format!(
                        "must be between 0 and maxChars - {MARKER_CHARS} ({most_head}) (got {h})"
                    ),
                )
            })?,
    };
    Ok(ShapeSpec {
        max_chars: max,
        head_chars,
        raw,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process_fields::SUMMARY_CHARS;

    fn config() -> Config {
        Config::from_toml_and_env("", |_| None).expect("defaults")
    }

    fn parse(json: serde_json::Value) -> Result<CommandSpec, String> {
        CommandSpec::parse(serde_json::from_value(json).expect("shape"), &config())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn remcochat_form_runs_as_sent() {
        let s = parse(serde_json::json!({"cmd": "bash", "args": ["-lc", "npm test"], "timeoutMs": 30000, "detached": true})).expect("ok");
        assert_eq!(s.argv, ["bash", "-lc", "npm test"]);
        assert_eq!(s.summary, "npm test");
        assert_eq!(s.timeout, Duration::from_secs(30));
    }

    #[test]
    fn other_programs_go_through_a_login_shell_without_reparsing() {
        let s =
            parse(serde_json::json!({"cmd": "printf", "args": ["%s\n", "a b 'c'"]})).expect("ok");
        assert_eq!(
            s.argv,
            [
                "bash",
                "-lc",
                "exec \"$@\"",
                "sandboxd",
                "printf",
                "%s\n",
                "a b 'c'"
            ]
        );
        let s = parse(serde_json::json!({"cmd": "ls", "login": false})).expect("ok");
        assert_eq!(s.argv, ["ls"]);
    }

    #[test]
    fn script_form_uses_the_shell() {
        let s = parse(serde_json::json!({"command": "echo hi", "shell": "sh", "login": false}))
            .expect("ok");
        assert_eq!(s.argv, ["sh", "-c", "echo hi"]);
        assert_eq!(s.timeout, config().default_timeout);
    }

    #[test]
    fn refusals_name_the_field() {
        for (json, field) in [
            (serde_json::json!({}), "cmd"),
            (serde_json::json!({"cmd": "a", "command": "b"}), "either"),
            (serde_json::json!({"command": "b", "args": ["x"]}), "args"),
            (serde_json::json!({"cmd": ""}), "cmd"),
            (
                serde_json::json!({"cmd": "a", "args": ["x\u{0}"]}),
                "args[0]",
            ),
            (
                serde_json::json!({"command": "a", "env": {"1X": "v"}}),
                "env",
            ),
            (
                serde_json::json!({"command": "a", "env": {"A-B": "v"}}),
                "env",
            ),
            (serde_json::json!({"command": "a", "cwd": "../x"}), "cwd"),
            (serde_json::json!({"command": "a", "cwd": "/etc"}), "cwd"),
            (
                serde_json::json!({"command": "a", "timeoutMs": 0}),
                "timeoutMs",
            ),
            (
                serde_json::json!({"command": "a", "timeoutMs": -5}),
                "timeoutMs",
            ),
            (
                serde_json::json!({"command": "a", "shell": "bash; rm"}),
                "shell",
            ),
            (
                serde_json::json!({"command": "a", "maxOutputBytes": -1}),
                "maxOutputBytes",
            ),
        ] {
            let e = parse(json.clone()).expect_err("refused");
            assert!(e.contains(field), "{json}: {e}");
        }
    }

    #[test]
    fn long_timeouts_are_capped_and_remembered() {
        let s = parse(serde_json::json!({"command": "a", "timeoutMs": 18_000_000})).expect("ok");
        assert_eq!(s.timeout, config().max_timeout);
        assert_eq!(s.requested_timeout, Some(Duration::from_secs(18_000)));
        let s = parse(serde_json::json!({"command": "a", "timeoutMs": 1000})).expect("ok");
        assert_eq!(
            (s.timeout, s.requested_timeout),
            (Duration::from_secs(1), None)
        );
    }

    #[test]
    fn max_output_bytes_is_zero_to_16_mib_and_1_mib_when_omitted() {
        let s = parse(serde_json::json!({"command": "a"})).expect("ok");
        assert_eq!(s.max_output_bytes, 1024 * 1024);
        for n in [0, 16 * 1024 * 1024] {
            let s = parse(serde_json::json!({"command": "a", "maxOutputBytes": n})).expect("ok");
            assert_eq!(s.max_output_bytes, n);
        }
        let e = parse(serde_json::json!({"command": "a", "maxOutputBytes": 16 * 1024 * 1024 + 1}))
            .expect_err("refused");
        assert!(e.contains("maxOutputBytes"), "{e}");
    }

    #[test]
    fn cwd_env_and_stdin_pass_through() {
        let s = parse(serde_json::json!({"command": "x", "cwd": "sub/dir", "env": {"A_1": "v v"}, "stdin": "in"})).expect("ok");
        assert_eq!(s.cwd.as_deref(), Some("/workspace/sub/dir"));
        let aliased =
            parse(serde_json::json!({"command": "x", "cwd": "/vercel/sandbox/workspace/d"}))
                .expect("the alias is accepted");
        assert_eq!(
            aliased.cwd.as_deref(),
            Some("/workspace/d"),
            "and reported canonically"
        );
        assert_eq!(s.env, [("A_1".to_string(), "v v".to_string())]);
        assert_eq!(s.stdin, b"in");
        assert!(!s.stdin_open, "closed after its text by default");
    }

    #[test]
    fn an_open_stdin_goes_without_stdin_text() {
        let s = parse(serde_json::json!({"command": "cat", "stdinOpen": true})).expect("ok");
        assert!(s.stdin_open && s.stdin.is_empty());
        let e = parse(serde_json::json!({"command": "cat", "stdinOpen": true, "stdin": "x"}))
            .expect_err("refused");
        assert!(e.contains("stdinOpen"), "{e}");
    }

    #[test]
    fn summaries_are_short_single_lines() {
        let long = "x ".repeat(200);
        let s = parse(serde_json::json!({"command": format!("echo\n{long}")})).expect("ok");
        assert!(s.summary.chars().count() <= SUMMARY_CHARS);
        assert!(!s.summary.contains('\n'));
    }

    #[test]
    fn output_gives_the_head_a_quarter_by_default_and_keeps_room_for_the_marker() {
        let s =
            parse(serde_json::json!({"command": "x", "output": {"maxChars": 1000}})).expect("ok");
        assert_eq!(
            s.shape,
            Some(ShapeSpec {
                max_chars: 1000,
                head_chars: 250,
                raw: false
            })
        );
        let s = parse(serde_json::json!({"command": "x", "output": {"maxChars": 1000, "headChars": 920, "raw": true}}))
            .expect("ok");
        assert_eq!(s.shape.map(|s| (s.head_chars, s.raw)), Some((920, true)));
        assert_eq!(
            parse(serde_json::json!({"command": "x"}))
                .expect("ok")
                .shape,
            None
        );
        for (output, field) in [
            (serde_json::json!({"maxChars": 255}), "output.maxChars"),
            (serde_json::json!({"maxChars": -1}), "output.maxChars"),
            (
                serde_json::json!({"maxChars": 1_000_001}),
                "output.maxChars",
            ),
            (
                serde_json::json!({"maxChars": 1000, "headChars": 921}),
                "output.headChars",
            ),
            (
                serde_json::json!({"maxChars": 1000, "headChars": -1}),
                "output.headChars",
            ),
        ] {
            let e =
                parse(serde_json::json!({"command": "x", "output": output})).expect_err("refused");
            assert!(e.starts_with(field), "{e}");
        }
    }
}
