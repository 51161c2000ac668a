//! The protocol between sandboxd and `sandboxd-agent`, the process manager
//! inside every sandbox, defined once for both sides.
//!
//! One long-lived byte stream per sandbox carries length-prefixed frames
//! (tokio-util's [`LengthDelimitedCodec`]: a 4-byte big-endian length, then
//! the body), each body one [`Request`] (sandboxd to agent) or one
//! [`Response`] (agent to sandboxd) in postcard, a compact serde format.
//! Requests carry an id; every response names the request it answers, so
//! any number of requests are in flight at once (a long poll for a
//! command's end next to a file write). A request gets exactly one
//! response with `more: false`, after zero or more with `more: true`
//! (chunks of a file, of a listing, of a tail).
//!
//! The agent runs as the sandbox user, so whatever runs in the sandbox can
//! kill, replace or impersonate it: sandboxd treats every response as
//! hostile input. Frames from the agent are at most [`MAX_AGENT_FRAME`]
//! bytes; data travels in pieces of at most [`CHUNK`]; sandboxd validates
//! every field it uses and lets no answer decide anything outside the
//! sandbox it came from. Frames from sandboxd may be larger, up to
//! [`MAX_HOST_FRAME`]; a file write's content follows its request in
//! [`Op::WriteData`] pieces.
//!
//! Both sides are built together (sandboxd embeds the agent it was built
//! with), and [`VERSION`] is checked at [`Op::Hello`].

pub mod egress;
pub mod shape;
pub mod watch;

use bytes::Bytes;
pub use egress::{Allowlist, Cidr, Denied, DomainPattern, EgressPolicy, NameCheck, never_reason};
use serde::{Deserialize, Serialize};
use tokio_util::codec::LengthDelimitedCodec;
pub use watch::{
    MAX_FILE_WATCHES, MAX_WATCH_BATCH, MAX_WATCH_DIRS, MAX_WATCH_PATH, MAX_WATCH_QUEUE, WatchEnd,
    WatchEvent, WatchKind, WatchStart,
};

/// Bumped on any change to the types below.
pub const VERSION: u32 = 10;

/// Largest piece of bulk data (file content, a tail) in one response.
pub const CHUNK: usize = 1024 * 1024;
/// Largest piece of a file's content in one [`Op::WriteData`]: small
/// enough that the agent starts writing soon after the write starts.
pub const WRITE_PIECE: usize = 256 * 1024;
/// Largest frame sandboxd accepts from an agent: one chunk plus framing.
pub const MAX_AGENT_FRAME: usize = CHUNK + 64 * 1024;
/// Largest frame the agent accepts from sandboxd.
pub const MAX_HOST_FRAME: usize = 1 << 30;
/// Longest string sandboxd keeps from an agent's description of a command
/// (its summary) or of a failure.
pub const MAX_TEXT: usize = 4096;
/// Most directory entries in one response.
pub const ENTRIES_PER_CHUNK: usize = 2048;
/// Most bytes of input in one [`Op::Stdin`].
pub const STDIN_PIECE: usize = 1024 * 1024;
/// Longest an [`Op::Stdin`] waits for the command to read its input.
pub const STDIN_WAIT_MS: u64 = 5000;

/// The frame codec for a side that accepts frames up to `max_frame` bytes.
pub fn codec(max_frame: usize) -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .length_field_length(4)
        .max_frame_length(max_frame)
        .new_codec()
}

/// A frame body that could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
#[error("protocol frame: {0}")]
pub struct FrameError(String);

/// Encodes a message into one frame body. Sized first, so a large one (a
/// file) is written once, not copied each time a growing buffer doubles.
pub fn encode<T: Serialize>(message: &T) -> Result<Bytes, FrameError> {
    let size =
        postcard::experimental::serialized_size(message).map_err(|e| FrameError(e.to_string()))?;
    postcard::to_extend(message, Vec::with_capacity(size))
        .map(Bytes::from)
        .map_err(|e| FrameError(e.to_string()))
}

/// Decodes one frame body; trailing bytes are an error.
pub fn decode<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, FrameError> {
    match postcard::take_from_bytes(body) {
        Ok((value, [])) => Ok(value),
        Ok((_, rest)) => Err(FrameError(format!(
            "{} bytes after the message",
            rest.len()
        ))),
        Err(e) => Err(FrameError(e.to_string())),
    }
}

/// sandboxd to agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub id: u64,
    pub op: Op,
}

/// Agent to sandboxd: an answer (or a part of one) to request `id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    pub id: u64,
    /// More responses to the same request follow.
    pub more: bool,
    pub reply: Reply,
}

/// What sandboxd asks. Paths of file operations are relative to the
/// workspace, '/'-separated, every component non-empty and neither `.`
/// nor `..` (sandboxd checked them; the agent checks again).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// First on every connection. Answered by [`Reply::Hello`].
    Hello(Hello),
    /// Start a command. Answered by [`Reply::Spawned`] once it runs, or an
    /// error; a program that cannot be started still makes a command that
    /// ends at once with 126 or 127 and says why on stderr.
    Spawn(Spawn),
    /// End a command's process tree (a running one, or the processes a
    /// finished one left): SIGTERM, the grace period, then SIGKILL until
    /// nothing is left. Answered [`Reply::Ok`] as soon as SIGTERM is sent.
    Kill { command: String },
    /// Records of a command's log after `after`. Waits up to `wait_ms` for
    /// one when there is none yet. Answered by [`Reply::Log`].
    ReadLog(ReadLog),
    /// A reader of a command's log went away.
    Unfollow { command: String, follower: u64 },
    /// Answered by [`Reply::Ended`] once the command has ended.
    Wait { command: String },
    /// The last `tail_bytes` of each stream of a command started with
    /// them: [`Reply::TailPart`]s, then [`Reply::Ok`]. A command started
    /// with a [`ShapeSpec`] answers [`Reply::Shaped`] parts instead.
    Tail { command: String },
    /// What a command started with [`Spawn::changes`] changed in the
    /// workspace by its end: [`Reply::ChangesPart`]s, then
    /// [`Reply::Changes`]. [`FailureKind::NotFound`] for a command started
    /// without, [`FailureKind::StillRunning`] for one still running.
    Changes { command: String },
    /// Drop a finished command and its log.
    Forget { command: String },
    /// Input (at most [`STDIN_PIECE`] bytes) for a running command started
    /// with [`Spawn::stdin_open`]: [`Reply::Ok`] once all of it is in the
    /// pipe, [`FailureKind::StdinClosed`] when its stdin is not open (or
    /// the command has ended), [`FailureKind::InputNotRead`] when the
    /// command has not read it for [`STDIN_WAIT_MS`] (part of it may be
    /// in).
    Stdin { command: String, data: Bytes },
    /// Close the stdin of a command started with [`Spawn::stdin_open`]
    /// (the command reads its end): [`Reply::Ok`], or
    /// [`FailureKind::StdinClosed`] when it is not open.
    CloseStdin { command: String },
    /// Every command the agent knows: [`Reply::Commands`].
    List,
    /// A file's content: [`Reply::Data`] pieces, then [`Reply::Ok`].
    ReadFile { path: String, max_bytes: u64 },
    /// Writes every file or none: [`Reply::Ok`], or
    /// [`Reply::PreconditionFailed`] (nothing written) when a file's
    /// [`Precondition`] does not hold. The check and the write are one step
    /// of the agent's file thread. The files' content follows in
    /// [`Op::WriteData`] frames with this request's id.
    WriteFiles { files: Vec<NewFile> },
    /// The next piece (at most [`WRITE_PIECE`] bytes) of the content of the
    /// [`Op::WriteFiles`] with the same id: each file's [`NewFile::size`]
    /// bytes in order, no piece holding bytes of two files. Not answered;
    /// a piece of no write under way is dropped.
    WriteData { data: Bytes },
    /// What each path is (the final symlink not followed), with its SHA-256
    /// when `sha256` and it is a regular file: one [`Reply::Stats`].
    Stat { paths: Vec<String>, sha256: bool },
    /// Lines matching a regular expression under a directory:
    /// [`Reply::Matches`] pieces, then [`Reply::Searched`].
    Search(Search),
    /// A directory's entries, sorted by name: [`Reply::Entries`] pieces,
    /// then [`Reply::Ok`].
    ListDir { path: String },
    /// Deletes paths in order: [`Reply::Ok`].
    Delete { paths: Vec<String>, recursive: bool },
    /// Moves `from` to `to` (the final component of either not followed;
    /// missing parents of `to` made): [`Reply::Ok`];
    /// [`FailureKind::AlreadyExists`] when `to` exists and not `overwrite`.
    Rename {
        from: String,
        to: String,
        overwrite: bool,
    },
    /// Makes a directory and its missing parents: [`Reply::MadeDir`].
    MakeDir { path: String },
    /// Every entry under the workspace, walked without following a
    /// symlink, each directory's names in byte order (a directory before
    /// what it holds): [`Reply::Snapshot`] pieces, then [`Reply::Ok`].
    /// FIFOs, sockets and devices are left out. [`FailureKind::TooMany`]
    /// past `max_entries` entries or [`MAX_SNAPSHOT_DEPTH`] levels;
    /// [`FailureKind::Invalid`] for a name or a link target that is not
    /// UTF-8.
    Snapshot { max_entries: u32 },
    /// The content of regular file `path` (its final component not
    /// followed), sent only when the file is `expect` both before and
    /// after the read: [`Reply::Data`] pieces, then [`Reply::Ok`];
    /// [`FailureKind::Changed`] when it is not (it changed meanwhile).
    ReadExact { path: String, expect: FileIdentity },
    /// Sets each path's permission bits (at most 0o7777); a symlink at a
    /// path is refused, not followed ([`FailureKind::NotRegular`]):
    /// [`Reply::Ok`].
    SetModes { modes: Vec<PathMode> },
    /// Makes symbolic links (their directories exist):
    /// [`Reply::Ok`]; [`FailureKind::AlreadyExists`] when something is at
    /// a path.
    MakeSymlinks { links: Vec<NewSymlink> },
    /// Forward TCP connections from `listen` (all addresses) to
    /// 127.0.0.1:`port`, accepting peers in `allow` (an IPv4 CIDR) only.
    /// Idempotent. [`Reply::Ok`].
    Relay {
        port: u16,
        listen: u16,
        allow: String,
    },
    /// Whether something accepts connections on 127.0.0.1:`port`, waiting
    /// up to `wait_ms`: [`Reply::Probed`].
    Probe { port: u16, wait_ms: u32 },
    /// Start a terminal session: [`Reply::Spawned`] once its process runs.
    PtyOpen(PtyOpen),
    /// A session's screen output from byte `after` on (bytes are numbered
    /// from 0 since the session started), waiting up to `wait_ms` for some
    /// when there is none yet: [`Reply::PtyOutput`].
    PtyRead {
        pty: String,
        after: u64,
        max_bytes: u32,
        wait_ms: u32,
    },
    /// Bytes typed into a session: [`Reply::Ok`].
    PtyWrite {
        pty: String,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// A new window size: [`Reply::Ok`].
    PtyResize { pty: String, cols: u16, rows: u16 },
    /// End a session's process tree like [`Op::Kill`]: [`Reply::Ok`].
    PtyKill { pty: String },
    /// Every session the agent holds, running and ended: [`Reply::Ptys`].
    PtyList,
    /// Answered by [`Reply::PtyEnded`] once the session's process has ended.
    PtyWait { pty: String },
    /// Watch a directory (see [`watch`]): [`Reply::Watching`], then
    /// [`Reply::WatchEvents`] parts, then [`Reply::WatchEnded`].
    Watch(WatchStart),
    /// End the watch started by request `watch` of this connection:
    /// [`Reply::Ok`] (also when there is no such watch).
    Unwatch { watch: u64 },
}

/// A terminal session to start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyOpen {
    /// sandboxd's id for it (24 lowercase hex digits).
    pub pty: String,
    /// What runs; `argv[0]` is the program's name as it sees it (a login
    /// shell's starts with `-`), `program` the file run.
    pub program: String,
    pub argv: Vec<String>,
    /// Added to the agent's environment.
    pub env: Vec<(String, String)>,
    /// Absolute; created if missing. `None`: the workspace.
    pub cwd: Option<String>,
    pub cols: u16,
    pub rows: u16,
    /// What sandboxd shows as its command.
    pub summary: String,
    pub created_at_ms: u64,
    /// Refused with [`FailureKind::TooMany`] when this many run already.
    pub max_running: u32,
    /// The label a client addresses it by (E2B's process tag), kept with
    /// it and listed in [`PtyState`].
    pub tag: Option<String>,
}

/// Settings of this sandboxd, sent on every connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub version: u32,
    /// Every path the workspace is mounted at, the canonical one first.
    pub workspace: Vec<String>,
    pub kill_grace_ms: u64,
    /// Output one command keeps (a ring of records).
    pub output_buffer_bytes: u64,
    /// Output all commands together keep.
    pub output_memory_bytes: u64,
    /// Most finished commands kept.
    pub max_finished: u32,
    /// The sandbox's pids limit, for an agent that cannot read it from
    /// its cgroup (under gVisor).
    pub pids_limit: u64,
    /// Most inotify watches the agent holds at once for `changes`, all
    /// its commands together (0: none, every report is a scan).
    pub changes_watch_budget: u32,
}

/// What sandboxd keeps about a command, held by the agent for it so that
/// it survives a restart of sandboxd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandMeta {
    pub summary: String,
    pub started_at_ms: u64,
    pub timeout_ms: u64,
    /// Shape each stream's output for a model: [`Op::Tail`] then answers
    /// [`Reply::Shaped`] parts.
    pub shape: Option<ShapeSpec>,
    /// It was started with [`Spawn::changes`].
    pub changes: bool,
    /// The label a client addresses it by besides its pid (E2B's process
    /// tag).
    pub tag: Option<String>,
}

/// Characters of a shaped stream kept for the line that says what was
/// omitted.
pub const SHAPE_MARKER_CHARS: u32 = 80;

/// How to shape a stream's output: its head and its tail within a budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShapeSpec {
    /// Most characters of the shaped text (the omission marker included).
    pub max_chars: u32,
    /// Characters of it given to the head.
    pub head_chars: u32,
    /// Keep escape sequences and carriage returns as they came.
    pub raw: bool,
}

/// What shaping one stream kept and left out. Counts are of the stream's
/// text as its log holds it (before collapsing), so the middle can be read
/// back from the log exactly.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShapeInfo {
    pub total_chars: u64,
    /// Lines: newlines, plus one for a last line without one.
    pub total_lines: u64,
    /// Bytes the stream wrote.
    pub total_bytes: u64,
    pub omitted_chars: u64,
    /// Newlines in the omitted part.
    pub omitted_lines: u64,
    /// UTF-8 bytes of the omitted part.
    pub omitted_bytes: u64,
    /// Characters of the shaped text from the head, and from the tail.
    pub head_chars: u64,
    pub tail_chars: u64,
    /// Not text (NUL bytes, or much that is not UTF-8): nothing is shown.
    pub binary: bool,
    /// Collapsing escape sequences or carriage returns changed the text.
    pub collapsed: bool,
    /// Where the omitted part is in the log, when something is.
    pub middle: Option<Middle>,
}

/// The omitted part of a stream in its command's log: skip `skip_chars` of
/// the stream's text in the records after `after`, then take the omitted
/// characters; the last of them is in record `until`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Middle {
    pub after: u64,
    pub until: u64,
    pub skip_chars: u64,
    /// The log still holds all of it.
    pub retained: bool,
}

/// A command to start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spawn {
    /// sandboxd's id for it.
    pub command: String,
    pub argv: Vec<String>,
    /// Added to the agent's environment.
    pub env: Vec<(String, String)>,
    /// Absolute; created if missing. `None`: the workspace.
    pub cwd: Option<String>,
    #[serde(with = "serde_bytes")]
    pub stdin: Vec<u8>,
    /// The command's stdin stays open for [`Op::Stdin`] until
    /// [`Op::CloseStdin`] or its end (`stdin` is then empty).
    pub stdin_open: bool,
    /// Keep the last this many bytes of each stream for [`Op::Tail`].
    pub tail_bytes: u32,
    /// A client reads the log from its start (a started command): output
    /// is held back for a first reader for a moment. A run to its end
    /// (`commands:run`) has none coming, and holds nothing.
    pub awaits_reader: bool,
    /// Watch the workspace while it runs, for [`Op::Changes`].
    pub changes: Option<ChangesSpec>,
    pub meta: CommandMeta,
}

/// What to watch for [`Op::Changes`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangesSpec {
    /// Directory names (plain names, no `/`) whose trees are left out, at
    /// any depth.
    pub ignore: Vec<String>,
    /// Most changes listed; the rest are counted.
    pub max: u32,
}

/// Longest path of a [`Change`], in bytes.
pub const MAX_CHANGE_PATH: usize = 4096;

/// A file a command created, modified or deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// Relative to the workspace, '/'-separated.
    pub path: String,
    pub kind: ChangeKind,
    /// Its size now (`None` when deleted).
    pub size: Option<u64>,
}

/// What happened to a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeKind {
    Created,
    Modified,
    Deleted,
}

/// How the changes were found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeMethod {
    /// inotify events while the command ran.
    Inotify,
    /// The workspace as listed at the start against what is there at the
    /// end.
    Scan,
}

/// The end of a changes answer: what the listed parts leave out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangesSummary {
    /// Changes beyond the ones sent.
    pub more: u64,
    pub method: ChangeMethod,
    /// Every change is accounted for exactly.
    pub complete: bool,
}

/// A read of a command's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadLog {
    pub command: String,
    /// Who reads: the agent holds a command's output back (rather than
    /// drop it) while a reader that keeps reading has not read it.
    pub follower: u64,
    /// Records with a `seq` above this.
    pub after: u64,
    /// Most bytes of record data in the answer (at least one record).
    pub max_bytes: u32,
    pub wait_ms: u32,
    /// Read past the `exit` record: the output of processes the command
    /// left running. Otherwise the log ends with `exit`.
    pub past_exit: bool,
}

/// A file to write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewFile {
    pub path: String,
    /// Permission bits, at most 0o777.
    pub mode: u32,
    /// Bytes of content, sent in [`Op::WriteData`] pieces.
    pub size: u64,
    /// What must hold of the file before the write for any file to be
    /// written.
    pub precondition: Precondition,
}

/// What a write needs of a file's present state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Precondition {
    None,
    /// The file exists and its content has this SHA-256.
    IfMatch([u8; 32]),
    /// No file exists at the path (create only).
    IfNoneMatch,
}

/// Deepest directory level an [`Op::Snapshot`] walks.
pub const MAX_SNAPSHOT_DEPTH: usize = 256;
/// Longest symlink target an [`Op::Snapshot`] answers or an
/// [`Op::MakeSymlinks`] makes, in bytes.
pub const MAX_LINK_TARGET: usize = 4096;

/// One entry of an [`Op::Snapshot`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotEntry {
    /// Relative to the workspace, '/'-separated.
    pub path: String,
    /// Never [`EntryKind::Other`].
    pub kind: EntryKind,
    /// Permission bits, at most 0o7777.
    pub mode: u32,
    pub identity: FileIdentity,
    /// A symlink's target, as it is (never followed).
    pub target: Option<String>,
}

/// What tells a file's content unchanged without reading it: the same
/// inode with the same size, modification and status-change times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileIdentity {
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub ino: u64,
}

/// A path and the permission bits to give it ([`Op::SetModes`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathMode {
    pub path: String,
    pub mode: u32,
}

/// A symbolic link to make ([`Op::MakeSymlinks`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewSymlink {
    pub path: String,
    pub target: String,
}

/// A file whose precondition did not hold, and its content's SHA-256 now
/// (`None`: no such file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mismatch {
    pub path: String,
    pub current: Option<[u8; 32]>,
}

/// What a path is, for [`Op::Stat`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathStat {
    /// `None`: nothing at the path (or a directory on it is missing).
    pub kind: Option<EntryKind>,
    pub size: u64,
    pub mode: u32,
    pub mtime_ms: i64,
    pub sha256: Option<[u8; 32]>,
}

/// A search, for [`Op::Search`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Search {
    /// A regular expression in Rust's `regex` syntax (ripgrep's).
    pub pattern: String,
    /// The directory searched, relative to the workspace like every path.
    pub path: String,
    /// ripgrep's `--glob`s: `!` excludes; later ones take precedence.
    pub globs: Vec<String>,
    /// Most matches whose details are sent; all are counted.
    pub max_results: u32,
    /// Lines of context before and after each match.
    pub context: u32,
    pub case_insensitive: bool,
    /// Search with the agent's own search even when `rg` is there.
    pub builtin: bool,
    /// Give up after this long (counts are then not exact).
    pub deadline_ms: u32,
}

/// One matching line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Match {
    /// Relative to the searched directory.
    pub path: String,
    /// 1-based.
    pub line: u64,
    /// 1-based byte offset of the first match in the line.
    pub column: u64,
    pub text: String,
    pub before: Vec<String>,
    pub after: Vec<String>,
}

/// How a search went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Searched {
    /// Matching lines, all of them, past the cap too.
    pub total_matches: u64,
    pub files_searched: u64,
    /// Files left out as binary or too large (the agent's own search).
    pub files_skipped: u64,
    pub used_rg: bool,
    /// Why `rg` was not used, when it was not.
    pub rg_missing_reason: Option<String>,
    /// The search stopped at its deadline: the counts are what was seen.
    pub timed_out: bool,
}

/// A piece of a stream's plain tail (see [`Op::Tail`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TailPart {
    pub stream: Stream,
    pub text: String,
    /// Bytes of the stream left out before the tail.
    pub cut_bytes: u64,
}

/// A piece of a stream's shaped text (see [`CommandMeta::shape`]); every
/// piece carries the stream's [`ShapeInfo`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShapedPart {
    pub stream: Stream,
    pub text: String,
    pub info: ShapeInfo,
}

/// What the agent answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Hello(HelloReply),
    Spawned {
        pid: u32,
    },
    Ok,
    Log(LogChunk),
    Ended(Ended),
    Commands(Vec<CommandState>),
    TailPart(TailPart),
    Shaped(ShapedPart),
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    Entries(Vec<DirEntry>),
    Probed {
        ready: bool,
        recent_output: String,
    },
    PtyOutput(PtyOutput),
    Ptys(Vec<PtyState>),
    PtyEnded(PtyEnded),
    Stats(Vec<PathStat>),
    PreconditionFailed(Vec<Mismatch>),
    Matches(Vec<Match>),
    Searched(Searched),
    ChangesPart(Vec<Change>),
    Snapshot(Vec<SnapshotEntry>),
    Changes(ChangesSummary),
    /// Whether [`Op::MakeDir`] made the directory (`false`: one was there).
    MadeDir {
        created: bool,
    },
    Error(Failure),
    /// A watch's inotify watches are in place: events follow.
    Watching,
    /// Events of a watch, oldest first: at most [`MAX_WATCH_BATCH`].
    WatchEvents(Vec<WatchEvent>),
    /// The last answer of a watch.
    WatchEnded(WatchEnd),
}

/// Part of a session's screen output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyOutput {
    /// The number of `data`'s first byte: above the `after` asked for when
    /// the bytes between are no longer kept (the scrollback is a ring).
    pub start: u64,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    /// Set once the session has ended and every byte it wrote is in the
    /// scrollback: nothing follows `data`.
    pub ended: Option<PtyEnded>,
}

/// A terminal session as the agent knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyState {
    pub pty: String,
    pub summary: String,
    pub created_at_ms: u64,
    pub ended: Option<PtyEnded>,
    /// [`PtyOpen::tag`].
    pub tag: Option<String>,
}

/// How a session's process ended: its exit code, or the signal that ended
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyEnded {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub duration_ms: u64,
    pub ended_at_ms: u64,
}

/// The agent's side of the handshake.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloReply {
    pub version: u32,
    /// Random per agent start: a different one means the sandbox restarted
    /// and every process in it is new.
    pub boot: u64,
    pub commands: Vec<CommandState>,
}

/// A command as the agent knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandState {
    pub command: String,
    pub meta: CommandMeta,
    pub ended: Option<Ended>,
    /// Processes of its tree still alive (after its end: what it left).
    pub processes: u32,
    /// The pid of its own process in the sandbox (0: it never started).
    pub pid: u32,
}

/// Which output stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Part of a command's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogChunk {
    pub records: Vec<Record>,
    /// No record will follow these for this reader: the log ended (at
    /// `exit`, or past it once the leftover processes are gone).
    pub complete: bool,
}

/// One numbered record of a command's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub seq: u64,
    pub body: RecordBody,
}

/// What a record holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RecordBody {
    /// Output, decoded as UTF-8 per stream (a character split across
    /// reads arrives whole; invalid bytes are U+FFFD); `raw` is how many
    /// bytes the command wrote for it.
    Output {
        stream: Stream,
        text: String,
        raw: u64,
    },
    /// Records that were dropped before this reader read them, and how
    /// many output bytes they held.
    Dropped { bytes: u64 },
    /// Something outside the command went wrong.
    Error { message: String },
    /// The command ended.
    Exit(Ended),
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ended {
    pub exit_code: i32,
    pub timed_out: bool,
    pub killed: bool,
    pub duration_ms: u64,
    /// The memory limit's OOM killer ended a process of the sandbox while
    /// the command ran, and the command died of SIGKILL.
    pub oom_killed: bool,
    pub usage: Usage,
    /// `seq` of its `exit` record.
    pub seq: u64,
}

/// Resources a command's process tree used (of the processes reaped by
/// its end).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub user_ms: u64,
    pub system_ms: u64,
    /// The largest resident set of any one process.
    pub max_rss_kb: u64,
}

/// A directory entry; symlinks are not followed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: String,
    pub kind: EntryKind,
    pub size: u64,
    pub mtime_ms: i64,
    pub mode: u32,
}

/// What a directory entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    /// FIFO, socket, device.
    Other,
}

/// Why the agent refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub kind: FailureKind,
    pub message: String,
}

/// The kinds of failure sandboxd tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureKind {
    /// A malformed request (a path component `..`, a mode over 0o777).
    Invalid,
    /// The agent speaks another version.
    Version,
    NotFound,
    /// A symlink leads out of the workspace (or too many in a row).
    SymlinkEscape,
    IsDirectory,
    NotDirectory,
    NeedsRecursive,
    NotRegular,
    TooLarge,
    /// The path changed while it was walked.
    Changed,
    NoSpace,
    PermissionDenied,
    NoSuchCommand,
    DuplicateCommand,
    /// The command, or processes it left, still run.
    StillRunning,
    /// No process could be started: the sandbox is at its pids limit.
    NoProcesses,
    /// Something else listens on the relay's port.
    PortInUse,
    /// At a cap on things running at once (terminal sessions).
    TooMany,
    /// The command's stdin is not open: it was started without
    /// [`Spawn::stdin_open`], it was closed, or the command has ended.
    StdinClosed,
    /// The command has not read its input for a while.
    InputNotRead,
    /// Something is at the path (a move's destination).
    AlreadyExists,
    Other,
}

impl Failure {
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Failure {
            kind,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_form_no_import_cycle() {
        layering::ModuleGraph::of_crate(env!("CARGO_MANIFEST_DIR"))
            .assert_layered(&[(1, &["egress", "shape", "watch"])]);
    }

    #[test]
    fn messages_round_trip() {
        let req = Request {
            id: 7,
            op: Op::Spawn(Spawn {
                command: "0123456789abcdef01234567".into(),
                argv: vec!["bash".into(), "-lc".into(), "echo hi".into()],
                env: vec![("A".into(), "b c".into())],
                cwd: Some("/workspace/x".into()),
                stdin: vec![0, 1, 2, 255],
                stdin_open: false,
                tail_bytes: 1024,
                awaits_reader: false,
                changes: Some(ChangesSpec {
                    ignore: vec![".git".into()],
                    max: 1000,
                }),
                meta: CommandMeta {
                    summary: "echo hi".into(),
                    started_at_ms: 1,
                    timeout_ms: 30_000,
                    shape: Some(ShapeSpec {
                        max_chars: 4000,
                        head_chars: 1000,
                        raw: false,
                    }),
                    changes: true,
                    tag: Some("server".into()),
                },
            }),
        };
        let frame = encode(&req).expect("encode");
        assert_eq!(decode::<Request>(&frame).expect("decode"), req);
        let resp = Response {
            id: 7,
            more: true,
            reply: Reply::Data(vec![9; 300]),
        };
        let frame = encode(&resp).expect("encode");
        assert!(frame.len() < 310, "bytes travel as bytes: {}", frame.len());
        assert_eq!(decode::<Response>(&frame).expect("decode"), resp);
    }

    #[test]
    fn watch_messages_round_trip() {
        let req = Request {
            id: 9,
            op: Op::Watch(WatchStart {
                path: "src".into(),
                recursive: true,
                max_dirs: 4096,
                max_queued: 4096,
            }),
        };
        let frame = encode(&req).expect("encode");
        assert_eq!(decode::<Request>(&frame).expect("decode"), req);
        let resp = Response {
            id: 9,
            more: true,
            reply: Reply::WatchEvents(vec![WatchEvent {
                kind: WatchKind::Rename,
                path: "a/b".into(),
                is_dir: false,
            }]),
        };
        let frame = encode(&resp).expect("encode");
        assert_eq!(decode::<Response>(&frame).expect("decode"), resp);
    }

    #[test]
    fn garbage_and_trailing_bytes_are_refused() {
        assert!(decode::<Response>(&[0xff; 16]).is_err());
        let mut frame = encode(&Response {
            id: 1,
            more: false,
            reply: Reply::Ok,
        })
        .expect("encode")
        .to_vec();
        frame.push(0);
        assert!(decode::<Response>(&frame).is_err());
    }
}
