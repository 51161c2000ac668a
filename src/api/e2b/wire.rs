//! envd's messages (E2B's `process` and `filesystem` protos) in the proto3
//! JSON mapping the SDKs use: lowerCamelCase names (the proto's own
//! snake_case names accepted too), enums by name (or number), `bytes` as
//! standard base64, int64 as strings, Timestamps as RFC 3339, defaults
//! omitted or `null`. Unknown fields are ignored, as proto3 JSON readers
//! do, so a newer SDK's additions do not break a call.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A `bytes` field: standard base64 out; standard or URL-safe, padded or
/// not, in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct B64(pub(super) Vec<u8>);

impl Serialize for B64 {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for B64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = Option::<String>::deserialize(d)?.unwrap_or_default();
        let trimmed = text.trim_end_matches('=');
        let padded = format!("{trimmed}{}", "=".repeat((4 - trimmed.len() % 4) % 4));
        STANDARD
            .decode(&padded)
            .or_else(|_| URL_SAFE.decode(&padded))
            .map(B64)
            .map_err(|e| serde::de::Error::custom(format!("invalid base64: {e}")))
    }
}

/// A field that may be `null`, read as its default.
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// `process.ProcessConfig`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ProcessConfig {
    #[serde(default, deserialize_with = "nullable")]
    pub(super) cmd: String,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) args: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) envs: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) cwd: Option<String>,
}

/// `process.PTY`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Pty {
    #[serde(default)]
    pub(super) size: Option<PtySize>,
}

/// `process.PTY.Size`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct PtySize {
    #[serde(default, deserialize_with = "nullable")]
    pub(super) cols: u32,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) rows: u32,
}

/// `process.StartRequest`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct StartRequest {
    #[serde(default, deserialize_with = "nullable")]
    pub(super) process: ProcessConfig,
    #[serde(default)]
    pub(super) pty: Option<Pty>,
    /// Keep the command's stdin open for `SendInput` and `CloseStdin`
    /// (the SDKs' `stdin=True`); unset or false: it reads end of file.
    #[serde(default)]
    pub(super) stdin: Option<bool>,
    #[serde(default)]
    pub(super) tag: Option<String>,
}

/// `process.ProcessSelector`: a pid or a tag.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ProcessSelector {
    #[serde(default)]
    pub(super) pid: Option<u32>,
    #[serde(default)]
    pub(super) tag: Option<String>,
}

/// Requests that name one process only (`Connect`, `CloseStdin`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SelectRequest {
    #[serde(default, deserialize_with = "nullable")]
    pub(super) process: ProcessSelector,
}

/// `process.ProcessInput`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ProcessInput {
    #[serde(default)]
    pub(super) stdin: Option<B64>,
    #[serde(default)]
    pub(super) pty: Option<B64>,
}

/// `process.SendInputRequest`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SendInputRequest {
    #[serde(default, deserialize_with = "nullable")]
    pub(super) process: ProcessSelector,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) input: ProcessInput,
}

/// `process.StreamInputRequest`: one event each, `start` first, then
/// `data` and `keepalive` in any order.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct StreamInputRequest {
    #[serde(default)]
    pub(super) start: Option<SelectRequest>,
    #[serde(default)]
    pub(super) data: Option<StreamInputData>,
}

/// `process.StreamInputRequest.DataEvent`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct StreamInputData {
    #[serde(default, deserialize_with = "nullable")]
    pub(super) input: ProcessInput,
}

/// `process.UpdateRequest`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct UpdateRequest {
    #[serde(default, deserialize_with = "nullable")]
    pub(super) process: ProcessSelector,
    #[serde(default)]
    pub(super) pty: Option<Pty>,
}

/// `process.Signal`, by name or number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Signal {
    #[default]
    Unspecified,
    Term,
    Kill,
}

impl<'de> Deserialize<'de> for Signal {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Name(String),
            Number(i64),
        }
        Ok(match Option::<Raw>::deserialize(d)? {
            Some(Raw::Name(n)) if n == "SIGNAL_SIGTERM" => Signal::Term,
            Some(Raw::Number(15)) => Signal::Term,
            Some(Raw::Name(n)) if n == "SIGNAL_SIGKILL" => Signal::Kill,
            Some(Raw::Number(9)) => Signal::Kill,
            _ => Signal::Unspecified,
        })
    }
}

/// `process.SendSignalRequest`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SendSignalRequest {
    #[serde(default, deserialize_with = "nullable")]
    pub(super) process: ProcessSelector,
    #[serde(default)]
    pub(super) signal: Signal,
}

/// `process.ProcessInfo`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ProcessInfo {
    pub(super) config: ProcessConfig,
    pub(super) pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) tag: Option<String>,
}

/// `process.ListResponse`.
#[derive(Debug, Clone, Serialize)]
pub(super) struct ListResponse {
    pub(super) processes: Vec<ProcessInfo>,
}

/// An empty answer (`SendSignalResponse`, `UpdateResponse`, …).
#[derive(Debug, Clone, Copy, Serialize)]
pub(super) struct Empty {}

/// `process.ProcessEvent`, inside `StartResponse`/`ConnectResponse`'s
/// `event`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) enum ProcessEvent {
    Start { pid: u32 },
    Data(DataEvent),
    End(EndEvent),
    Keepalive {},
}

/// `process.ProcessEvent.DataEvent`: one of the three outputs.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) enum DataEvent {
    Stdout(B64),
    Stderr(B64),
    Pty(B64),
}

/// `process.ProcessEvent.EndEvent`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct EndEvent {
    pub(super) exit_code: i64,
    pub(super) exited: bool,
    pub(super) status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) error: Option<String>,
}

/// `StartResponse` and `ConnectResponse`: `{"event": {…}}`.
#[derive(Debug, Clone, Serialize)]
pub(super) struct EventMessage {
    pub(super) event: ProcessEvent,
}

/// Requests that carry one path (`Stat`, `Remove`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct PathRequest {
    #[serde(default, deserialize_with = "nullable")]
    pub(super) path: String,
}

/// `filesystem.ListDirRequest`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ListDirRequest {
    #[serde(default, deserialize_with = "nullable")]
    pub(super) path: String,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) depth: u32,
}

/// `filesystem.MoveRequest`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct MoveRequest {
    #[serde(default, deserialize_with = "nullable")]
    pub(super) source: String,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) destination: String,
}

/// `filesystem.WatchDirRequest` and `CreateWatcherRequest` (their other
/// fields, entry info and network mounts, are not served).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct WatchRequest {
    #[serde(default, deserialize_with = "nullable")]
    pub(super) path: String,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) recursive: bool,
}

/// `GetWatcherEventsRequest` and `RemoveWatcherRequest`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct WatcherRequest {
    #[serde(default, deserialize_with = "nullable")]
    pub(super) watcher_id: String,
}

/// `CreateWatcherResponse`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct CreatedWatcher {
    pub(super) watcher_id: String,
}

/// `filesystem.EventType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(super) enum EventType {
    #[serde(rename = "EVENT_TYPE_CREATE")]
    Create,
    #[serde(rename = "EVENT_TYPE_WRITE")]
    Write,
    #[serde(rename = "EVENT_TYPE_REMOVE")]
    Remove,
    #[serde(rename = "EVENT_TYPE_RENAME")]
    Rename,
    #[serde(rename = "EVENT_TYPE_CHMOD")]
    Chmod,
}

/// `filesystem.FilesystemEvent`: a path relative to the watched directory.
#[derive(Debug, Clone, Serialize)]
pub(super) struct FilesystemEvent {
    pub(super) name: String,
    #[serde(rename = "type")]
    pub(super) kind: EventType,
}

/// `WatchDirResponse`: one of its three events (a oneof, so
/// `{"start": {}}`, `{"filesystem": {…}}` or `{"keepalive": {}}`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) enum WatchDirEvent {
    Start {},
    Filesystem(FilesystemEvent),
    Keepalive {},
}

/// `GetWatcherEventsResponse`.
#[derive(Debug, Clone, Serialize)]
pub(super) struct WatcherEvents {
    pub(super) events: Vec<FilesystemEvent>,
}

/// `filesystem.FileType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(super) enum FileType {
    #[serde(rename = "FILE_TYPE_UNSPECIFIED")]
    Unspecified,
    #[serde(rename = "FILE_TYPE_FILE")]
    File,
    #[serde(rename = "FILE_TYPE_DIRECTORY")]
    Directory,
    #[serde(rename = "FILE_TYPE_SYMLINK")]
    Symlink,
}

/// `filesystem.EntryInfo`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct EntryInfo {
    pub(super) name: String,
    #[serde(rename = "type")]
    pub(super) kind: FileType,
    pub(super) path: String,
    /// int64: a string in proto3 JSON.
    #[serde(serialize_with = "int64")]
    pub(super) size: u64,
    pub(super) mode: u32,
    pub(super) permissions: String,
    pub(super) owner: String,
    pub(super) group: String,
    pub(super) modified_time: String,
}

fn int64<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.to_string())
}

/// `StatResponse` (and `MoveResponse`, `MakeDirResponse`).
#[derive(Debug, Clone, Serialize)]
pub(super) struct EntryResponse {
    pub(super) entry: EntryInfo,
}

/// `filesystem.ListDirResponse`.
#[derive(Debug, Clone, Serialize)]
pub(super) struct ListDirResponse {
    pub(super) entries: Vec<EntryInfo>,
}

/// Milliseconds since the epoch as an RFC 3339 time stamp (UTC, with
/// milliseconds), as proto3 JSON writes a Timestamp.
pub(super) fn rfc3339(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // The civil date of a day count (Howard Hinnant's algorithm), years
    // starting in March.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// `ls -l`'s permission string of a mode (type and the nine bits).
pub(super) fn permissions(kind: FileType, mode: u32) -> String {
    let t = match kind {
        FileType::Directory => 'd',
        FileType::Symlink => 'l',
        _ => '-',
    };
    let bits: String = (0..9)
        .map(|i| {
            let on = mode & (0o400 >> i) != 0;
            match (on, i % 3) {
                (false, _) => '-',
                (true, 0) => 'r',
                (true, 1) => 'w',
                (true, _) => 'x',
            }
        })
        .collect();
    format!("{t}{bits}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requests_read_camel_and_snake_case_nulls_and_unknown_fields() {
        let start: StartRequest = serde_json::from_value(json!({
            "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": null, "cwd": "/home/user"},
            "pty": {"size": {"cols": 80, "rows": 24}},
            "stdin": false,
            "somethingNew": 1
        }))
        .expect("start");
        assert_eq!(start.process.args, ["-l", "-c", "echo hi"]);
        assert_eq!(start.process.cwd.as_deref(), Some("/home/user"));
        assert_eq!(start.pty.and_then(|p| p.size).map(|s| s.cols), Some(80));
        let list: ListDirRequest =
            serde_json::from_value(json!({"path": "/a", "depth": 3})).expect("list");
        assert_eq!(list.depth, 3);
        let sig: SendSignalRequest =
            serde_json::from_value(json!({"process": {"pid": 7}, "signal": "SIGNAL_SIGKILL"}))
                .expect("signal");
        assert_eq!((sig.process.pid, sig.signal), (Some(7), Signal::Kill));
        let sig: SendSignalRequest =
            serde_json::from_value(json!({"process": {"pid": 7}, "signal": 15})).expect("number");
        assert_eq!(sig.signal, Signal::Term);
        let input: SendInputRequest =
            serde_json::from_value(json!({"process": {"pid": 1}, "input": {"pty": "aGk"}}))
                .expect("input");
        assert_eq!(input.input.pty, Some(B64(b"hi".to_vec())));
    }

    #[test]
    fn events_are_oneofs_with_base64_bytes_and_camel_case() {
        let data = EventMessage {
            event: ProcessEvent::Data(DataEvent::Stdout(B64(b"hi\n".to_vec()))),
        };
        assert_eq!(
            serde_json::to_value(&data).expect("json"),
            json!({"event": {"data": {"stdout": "aGkK"}}})
        );
        let end = EventMessage {
            event: ProcessEvent::End(EndEvent {
                exit_code: 3,
                exited: true,
                status: "exit status 3".into(),
                error: None,
            }),
        };
        assert_eq!(
            serde_json::to_value(&end).expect("json"),
            json!({"event": {"end": {"exitCode": 3, "exited": true, "status": "exit status 3"}}})
        );
        let keepalive = EventMessage {
            event: ProcessEvent::Keepalive {},
        };
        assert_eq!(
            serde_json::to_value(&keepalive).expect("json"),
            json!({"event": {"keepalive": {}}})
        );
    }

    #[test]
    fn entries_write_int64_as_strings_enums_by_name_and_rfc3339_times() {
        let e = EntryInfo {
            name: "a".into(),
            kind: FileType::File,
            path: "/home/user/a".into(),
            size: 5,
            mode: 0o644,
            permissions: permissions(FileType::File, 0o644),
            owner: String::new(),
            group: String::new(),
            modified_time: rfc3339(1_709_208_000_123),
        };
        let v = serde_json::to_value(&e).expect("json");
        assert_eq!(v["size"], "5");
        assert_eq!(v["type"], "FILE_TYPE_FILE");
        assert_eq!(v["permissions"], "-rw-r--r--");
        assert_eq!(v["modifiedTime"], "2024-02-29T12:00:00.123Z");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_868_800_000), "2000-03-01T00:00:00.000Z");
        assert_eq!(permissions(FileType::Directory, 0o755), "drwxr-xr-x");
    }
}
