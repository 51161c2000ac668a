//! The Connect protocol (connectrpc.com/docs/protocol) with its JSON codec,
//! as E2B's SDKs speak it to envd over HTTP/1.1. Unary calls: a bare JSON
//! body in, a bare JSON body out, an error as a non-2xx status with
//! `{"code": "not_found", "message": …}`. Server streaming: one enveloped
//! request message in (a flag byte, a big-endian u32 length, the JSON),
//! enveloped messages out, closed by an end-of-stream envelope (flag 0x02)
//! holding `{}` or `{"error": {…}}`. The deadline a client asks for
//! (`Connect-Timeout-Ms`) and E2B's keepalive events
//! (`Keepalive-Ping-Interval`) are kept here, so handlers only produce
//! messages. Request bodies are read whole up to [`MAX_MESSAGE_BYTES`].
//! Client streaming (`StreamInput`): enveloped request messages decoded as
//! they arrive, each at most [`MAX_MESSAGE_BYTES`], and one enveloped
//! answer closed by the end of stream once the client has ended.

use std::convert::Infallible;
use std::pin::Pin;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::{Stream, StreamExt, TryStreamExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::error::{ApiError, ErrorCode};

/// The largest request message taken (a PTY's input, a path): far above
/// what the SDKs send in one message.
pub(super) const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// Flag of an end-of-stream envelope.
const END_STREAM: u8 = 0x02;
/// Flag of a compressed envelope (the SDKs never compress).
const COMPRESSED: u8 = 0x01;
/// The shortest keepalive period honoured.
const MIN_KEEPALIVE: Duration = Duration::from_secs(1);

/// Connect's error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Code {
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
}

impl Code {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code (the protocol's table).
    pub(super) fn status(self) -> StatusCode {
        match self {
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

/// A Connect error: a code and a sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ConnectError {
    pub(super) code: Code,
    pub(super) message: String,
}

/// The JSON of an error, in a unary answer and in an end-of-stream message.
#[derive(Serialize)]
struct ErrorJson<'a> {
    code: &'static str,
    message: &'a str,
}

impl ConnectError {
    pub(super) fn new(code: Code, message: impl Into<String>) -> Self {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    /// What this sandboxd cannot do yet, naming the capability it lacks.
    pub(super) fn unimplemented(what: &str) -> Self {
        Self::new(
            Code::Unimplemented,
            format!("sandboxd does not support {what} yet"),
        )
    }

    fn json(&self) -> ErrorJson<'_> {
        ErrorJson {
            code: self.code.as_str(),
            message: &self.message,
        }
    }
}

impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        (self.code.status(), axum::Json(self.json())).into_response()
    }
}

impl From<ApiError> for ConnectError {
    /// The code closest to each of sandboxd's own.
    fn from(e: ApiError) -> Self {
        use ErrorCode as E;
        let code = match e.code {
            E::InvalidRequest
            | E::SymlinkEscape
            | E::IsADirectory
            | E::NotADirectory
            | E::NotARegularFile
            | E::MethodNotAllowed
            | E::UnsupportedMediaType => Code::InvalidArgument,
            E::Unauthorized => Code::Unauthenticated,
            E::PermissionDenied | E::OriginNotAllowed | E::HostNotAllowed => Code::PermissionDenied,
            E::NotFound
            | E::SandboxNotFound
            | E::CommandNotFound
            | E::PtyNotFound
            | E::FileNotFound
            | E::TokenNotFound
            | E::CheckpointNotFound => Code::NotFound,
            E::FileExists | E::CheckpointLabelTaken => Code::AlreadyExists,
            E::NeedsRecursive
            | E::PathChanged
            | E::PreconditionFailed
            | E::NoNetwork
            | E::SandboxPaused
            | E::SandboxNotPaused
            | E::CommandFinished
            | E::StdinClosed
            | E::StdinNotRead
            | E::WorkspaceChanging
            | E::WorkspaceUnsupported
            | E::CommandsRunning => Code::FailedPrecondition,
            E::BodyTooLarge
            | E::FileTooLarge
            | E::AtCapacity
            | E::TooManyCommands
            | E::TooManyProcesses
            | E::TooManyPtys
            | E::TooManyTokens
            | E::TooManyWatches
            | E::TooManyCheckpoints
            | E::CheckpointStoreFull
            | E::InsufficientStorage => Code::ResourceExhausted,
            E::EngineError | E::AgentFailed | E::PortPublishFailed => Code::Internal,
            E::EngineUnavailable
            | E::RandomUnavailable
            | E::ImageMissing
            | E::WorkspaceQuotaUnsupported
            | E::ShuttingDown
            | E::StateWriteFailed => Code::Unavailable,
        };
        ConnectError::new(code, e.message)
    }
}

/// One envelope: the flag byte, the length, the data.
pub(super) fn envelope(flags: u8, data: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + data.len());
    out.put_u8(flags);
    out.put_u32(u32::try_from(data.len()).unwrap_or(u32::MAX));
    out.put_slice(data);
    out.freeze()
}

/// The end-of-stream envelope: `{}`, or the error.
fn end_of_stream(error: Option<&ConnectError>) -> Bytes {
    #[derive(Serialize)]
    struct End<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<ErrorJson<'a>>,
    }
    let json = serde_json::to_vec(&End {
        error: error.map(ConnectError::json),
    })
    .unwrap_or_else(|_| b"{}".to_vec());
    envelope(END_STREAM, &json)
}

/// The one message of a streaming request's body: exactly one
/// uncompressed envelope.
fn unwrap_envelope(body: &[u8]) -> Result<&[u8], ConnectError> {
    let bad = |why: &str| ConnectError::new(Code::InvalidArgument, why.to_string());
    let (&[flags, a, b, c, d], data) = body
        .split_first_chunk::<5>()
        .ok_or_else(|| bad("the request holds no complete envelope"))?;
    if flags & COMPRESSED != 0 {
        return Err(ConnectError::unimplemented("compressed messages"));
    }
    if flags != 0 {
        return Err(bad("the request's envelope has unknown flags"));
    }
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    if data.len() != len {
        return Err(bad(
            "the request's envelope length does not match its body (one message expected)",
        ));
    }
    Ok(data)
}

/// A message from JSON; an empty body is the empty message.
fn decode<T: DeserializeOwned>(json: &[u8]) -> Result<T, ConnectError> {
    let json = if json.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        json
    };
    serde_json::from_slice(json)
        .map_err(|e| ConnectError::new(Code::InvalidArgument, format!("invalid message: {e}")))
}

/// The request's body, at most [`MAX_MESSAGE_BYTES`].
async fn body_bytes(req: Request) -> Result<Bytes, ConnectError> {
    axum::body::to_bytes(req.into_body(), MAX_MESSAGE_BYTES)
        .await
        .map_err(|e| {
            ConnectError::new(
                Code::ResourceExhausted,
                format!(
                    "the request message could not be read (at most {MAX_MESSAGE_BYTES} bytes): {e}"
                ),
            )
        })
}

/// Whether the request's content type is `want` (parameters ignored).
fn content_type_is(headers: &HeaderMap, want: &str) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case(want))
}

/// The deadline a client asked for (`Connect-Timeout-Ms`: 1 to 10 digits).
fn timeout_of(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get("connect-timeout-ms")?.to_str().ok()?;
    if v.is_empty() || v.len() > 10 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse::<u64>().ok().map(Duration::from_millis)
}

/// How often E2B's client wants a keepalive event (seconds), when it asks.
fn keepalive_of(headers: &HeaderMap) -> Option<Duration> {
    let secs: u64 = headers
        .get("keepalive-ping-interval")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs).max(MIN_KEEPALIVE))
}

/// A unary call's request message, with its deadline.
#[derive(Debug)]
pub(super) struct Unary<T> {
    pub(super) message: T,
    pub(super) deadline: Option<Duration>,
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Unary<T> {
    type Rejection = ConnectError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        if !content_type_is(req.headers(), "application/json") {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "a unary call takes content-type: application/json (the JSON codec)",
            ));
        }
        let deadline = timeout_of(req.headers());
        let body = body_bytes(req).await?;
        Ok(Unary {
            message: decode(&body)?,
            deadline,
        })
    }
}

/// `work`'s result, or `deadline_exceeded` once the call's deadline has
/// passed.
async fn within<R>(
    deadline: Option<Duration>,
    work: impl Future<Output = Result<R, ConnectError>>,
) -> Result<R, ConnectError> {
    match deadline {
        Some(d) => tokio::time::timeout(d, work).await.unwrap_or_else(|_| {
            Err(ConnectError::new(
                Code::DeadlineExceeded,
                "the call's deadline (Connect-Timeout-Ms) passed",
            ))
        }),
        None => work.await,
    }
}

/// Runs a unary handler within the call's deadline and answers its
/// message as JSON, or its error.
pub(super) async fn unary<R: Serialize>(
    deadline: Option<Duration>,
    work: impl Future<Output = Result<R, ConnectError>>,
) -> Response {
    match within(deadline, work).await {
        Ok(reply) => axum::Json(reply).into_response(),
        Err(e) => e.into_response(),
    }
}

/// A server-streaming call's request message, with its deadline and the
/// keepalive period the client asked for.
#[derive(Debug)]
pub(super) struct Streaming<T> {
    pub(super) message: T,
    pub(super) timing: Timing,
}

/// When a stream must end, and how often it says it is alive.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Timing {
    pub(super) deadline: Option<Duration>,
    pub(super) keepalive: Option<Duration>,
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Streaming<T> {
    type Rejection = Response;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        if !content_type_is(req.headers(), "application/connect+json") {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "a streaming call takes content-type: application/connect+json",
            )
            .into_response());
        }
        let timing = Timing {
            deadline: timeout_of(req.headers()),
            keepalive: keepalive_of(req.headers()),
        };
        let parsed = async {
            let body = body_bytes(req).await?;
            decode(unwrap_envelope(&body)?)
        };
        match parsed.await {
            Ok(message) => Ok(Streaming { message, timing }),
            Err(e) => Err(stream_error(&e)),
        }
    }
}

/// An error for a call whatever its kind: the end of a stream for a
/// streaming call, a status and a code for a unary one.
pub(super) fn refuse(headers: &HeaderMap, e: &ConnectError) -> Response {
    if is_streaming(headers) {
        stream_error(e)
    } else {
        e.clone().into_response()
    }
}

/// Whether a request is a streaming call (its content type says so).
pub(super) fn is_streaming(headers: &HeaderMap) -> bool {
    content_type_is(headers, "application/connect+json")
}

/// A message's JSON, for a stream.
pub(super) fn to_json<T: Serialize>(message: &T) -> Result<Bytes, ConnectError> {
    serde_json::to_vec(message)
        .map(Bytes::from)
        .map_err(|e| ConnectError::new(Code::Internal, format!("encoding a message: {e}")))
}

/// A client-streaming call's request messages, decoded as they arrive,
/// with its deadline.
pub(super) struct ClientStream<T> {
    pub(super) messages: Pin<Box<dyn Stream<Item = Result<T, ConnectError>> + Send>>,
    pub(super) deadline: Option<Duration>,
}

impl<S: Send + Sync, T: DeserializeOwned + Send + 'static> FromRequest<S> for ClientStream<T> {
    type Rejection = Response;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        if !is_streaming(req.headers()) {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "a streaming call takes content-type: application/connect+json",
            )
            .into_response());
        }
        let deadline = timeout_of(req.headers());
        let body = req.into_body().into_data_stream();
        // Each step yields a whole message when the buffer holds one, else
        // reads another chunk (or notes the end) and yields nothing.
        let steps = futures_util::stream::try_unfold(
            (body, BytesMut::new(), false),
            |(mut body, mut buf, ended)| async move {
                if let Some(message) = take_envelope(&mut buf)? {
                    return Ok(Some((Some(message), (body, buf, ended))));
                }
                if ended && buf.is_empty() {
                    return Ok(None);
                }
                if ended {
                    return Err(ConnectError::new(
                        Code::InvalidArgument,
                        "the request ended inside a message",
                    ));
                }
                match body.next().await {
                    Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
                    Some(Err(e)) => {
                        return Err(ConnectError::new(
                            Code::InvalidArgument,
                            format!("the request could not be read: {e}"),
                        ));
                    }
                    None => return Ok(Some((None, (body, buf, true)))),
                }
                Ok(Some((None, (body, buf, false))))
            },
        );
        let messages = steps.try_filter_map(|m| async move { m.map(|m| decode(&m)).transpose() });
        Ok(ClientStream {
            messages: Box::pin(messages),
            deadline,
        })
    }
}

/// The first whole envelope's message in `buf`, taken out of it; `None`
/// while it holds less. One longer than [`MAX_MESSAGE_BYTES`] is refused
/// from its header, so the buffer holds at most one message and a chunk.
fn take_envelope(buf: &mut BytesMut) -> Result<Option<Bytes>, ConnectError> {
    let Some(header) = buf.get(..5) else {
        return Ok(None);
    };
    let flags = header[0];
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if flags != 0 {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            format!("a request message with flags {flags:#04x} (compressed or an end of stream)"),
        ));
    }
    if len > MAX_MESSAGE_BYTES {
        return Err(ConnectError::new(
            Code::ResourceExhausted,
            format!("a request message of {len} bytes (at most {MAX_MESSAGE_BYTES})"),
        ));
    }
    if buf.len() < 5 + len {
        return Ok(None);
    }
    let mut message = buf.split_to(5 + len);
    Ok(Some(message.split_off(5).freeze()))
}

/// Runs a client-streaming handler within the call's deadline and answers
/// its one message and the end of stream, or the end of stream with its
/// error.
pub(super) async fn client_stream_reply<R: Serialize>(
    deadline: Option<Duration>,
    work: impl Future<Output = Result<R, ConnectError>>,
) -> Response {
    match within(deadline, async { to_json(&work.await?) }).await {
        Ok(json) => {
            let mut body = BytesMut::new();
            body.put(envelope(0, &json));
            body.put(end_of_stream(None));
            streaming_response(Body::from(body.freeze()))
        }
        Err(e) => stream_error(&e),
    }
}

/// A streaming answer that is only its end: the error.
pub(super) fn stream_error(e: &ConnectError) -> Response {
    streaming_response(Body::from(end_of_stream(Some(e))))
}

fn streaming_response(body: Body) -> Response {
    let mut resp = Response::new(body);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/connect+json"),
    );
    resp
}

/// What a stream's body is made of while it runs.
struct Running<S> {
    messages: Pin<Box<S>>,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    ticks: Option<tokio::time::Interval>,
    keepalive: Bytes,
    done: bool,
}

impl<S: Stream<Item = Result<Bytes, ConnectError>>> Running<S> {
    /// The next envelope: a message, a keepalive, or the end.
    async fn next(&mut self) -> Option<Bytes> {
        let Running {
            messages,
            deadline,
            ticks,
            keepalive,
            done,
        } = self;
        if *done {
            return None;
        }
        let deadline = async {
            match deadline.as_mut() {
                Some(d) => d.await,
                None => std::future::pending().await,
            }
        };
        let tick = async {
            match ticks.as_mut() {
                Some(t) => t.tick().await,
                None => std::future::pending().await,
            }
        };
        let out = tokio::select! {
            biased;
            () = deadline => Err(Some(ConnectError::new(
                Code::DeadlineExceeded,
                "the call's deadline (Connect-Timeout-Ms) passed",
            ))),
            m = messages.next() => match m {
                Some(Ok(json)) => Ok(envelope(0, &json)),
                Some(Err(e)) => Err(Some(e)),
                None => Err(None),
            },
            _ = tick => Ok(envelope(0, keepalive)),
        };
        Some(out.unwrap_or_else(|end| {
            *done = true;
            end_of_stream(end.as_ref())
        }))
    }
}

/// A streaming answer: each message enveloped as it comes, `keepalive`
/// (a message's JSON) every period the client asked for, and the end of
/// stream after the last message, the first error, or the deadline.
/// Dropping the body (the client went) drops `messages`.
pub(super) fn stream_reply<S>(timing: Timing, keepalive: Bytes, messages: S) -> Response
where
    S: Stream<Item = Result<Bytes, ConnectError>> + Send + 'static,
{
    let ticks = timing.keepalive.map(|period| {
        let mut t = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    let running = Running {
        messages: Box::pin(messages),
        deadline: timing.deadline.map(|d| Box::pin(tokio::time::sleep(d))),
        ticks,
        keepalive,
        done: false,
    };
    let body = futures_util::stream::unfold(running, |mut r| async move {
        let chunk = r.next().await?;
        Some((Ok::<_, Infallible>(chunk), r))
    });
    streaming_response(Body::from_stream(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request as HttpRequest;

    async fn body_of(resp: Response) -> Vec<u8> {
        axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .map(|b| b.to_vec())
            .unwrap_or_default()
    }

    /// Splits a body into its envelopes: (flags, JSON).
    fn envelopes(body: &[u8]) -> Vec<(u8, serde_json::Value)> {
        let Some((head, rest)) = body.split_first_chunk::<5>() else {
            assert!(body.is_empty(), "a partial envelope at the end");
            return Vec::new();
        };
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let json = serde_json::from_slice(&rest[..len]).expect("json");
        let mut out = vec![(head[0], json)];
        out.extend(envelopes(&rest[len..]));
        out
    }

    #[test]
    fn an_envelope_is_flags_length_and_data() {
        assert_eq!(&envelope(0, b"{}")[..], b"\x00\x00\x00\x00\x02{}");
        assert_eq!(
            &end_of_stream(None)[..],
            b"\x02\x00\x00\x00\x02{}",
            "a clean end is {{}}"
        );
        let err = ConnectError::new(Code::NotFound, "gone");
        assert_eq!(
            envelopes(&end_of_stream(Some(&err))),
            [(
                2,
                serde_json::json!({"error": {"code": "not_found", "message": "gone"}})
            )]
        );
    }

    #[test]
    fn a_request_is_exactly_one_uncompressed_envelope() {
        assert_eq!(
            unwrap_envelope(&envelope(0, b"{\"a\":1}")),
            Ok(&b"{\"a\":1}"[..])
        );
        let mut two = envelope(0, b"{}").to_vec();
        two.extend_from_slice(&envelope(0, b"{}"));
        [
            &b""[..],
            &b"\x00\x00\x00"[..],
            &b"\x00\x00\x00\x00\x05{}"[..],
            &two[..],
        ]
        .iter()
        .for_each(|bad| {
            assert_eq!(
                unwrap_envelope(bad).map_err(|e| e.code),
                Err(Code::InvalidArgument),
                "{bad:?}"
            );
        });
        assert_eq!(
            unwrap_envelope(&envelope(COMPRESSED, b"x")).map_err(|e| e.code),
            Err(Code::Unimplemented)
        );
    }

    #[tokio::test]
    async fn a_client_stream_yields_messages_across_chunks_and_refuses_what_is_malformed() {
        let client_stream = |chunks: Vec<&'static [u8]>| async move {
            let chunks = chunks
                .into_iter()
                .map(|c| Ok::<_, Infallible>(Bytes::from_static(c)));
            let req = HttpRequest::post("/x")
                .header("content-type", "application/connect+json")
                .body(Body::from_stream(futures_util::stream::iter(chunks)))
                .expect("request");
            let Ok(call) = ClientStream::<serde_json::Value>::from_request(req, &()).await else {
                panic!("a streaming request was refused");
            };
            call.messages.collect::<Vec<_>>().await
        };
        // Two messages, the first split inside its header, the second in
        // the chunk that ends the first.
        let got = client_stream(vec![
            b"\x00\x00",
            b"\x00\x00\x02{}\x00\x00\x00",
            b"\x00\x07{\"a\":7}",
        ])
        .await;
        let got: Vec<_> = got.into_iter().map(|m| m.expect("a message")).collect();
        assert_eq!(got, [serde_json::json!({}), serde_json::json!({"a": 7})]);
        assert!(client_stream(vec![]).await.is_empty(), "no message at all");

        let code = |got: Vec<Result<serde_json::Value, ConnectError>>| {
            got.into_iter().find_map(Result::err).map(|e| e.code)
        };
        let truncated = client_stream(vec![b"\x00\x00\x00\x00\x07{\"a\""]).await;
        assert_eq!(code(truncated), Some(Code::InvalidArgument));
        let compressed = client_stream(vec![b"\x01\x00\x00\x00\x02{}"]).await;
        assert_eq!(code(compressed), Some(Code::InvalidArgument));
        let huge = client_stream(vec![b"\x00\x7f\xff\xff\xff"]).await;
        assert_eq!(
            code(huge),
            Some(Code::ResourceExhausted),
            "refused from its header"
        );
        let not_json = client_stream(vec![b"\x00\x00\x00\x00\x01x"]).await;
        assert_eq!(code(not_json), Some(Code::InvalidArgument));
    }

    #[tokio::test]
    async fn a_chunked_streaming_request_is_read_and_bounded() {
        let chunks = vec![
            Ok::<_, Infallible>(Bytes::from_static(b"\x00\x00\x00")),
            Ok(Bytes::from_static(b"\x00\x07{\"a\":7}")),
        ];
        let req = HttpRequest::post("/x")
            .header("content-type", "application/connect+json")
            .header("connect-timeout-ms", "1500")
            .header("keepalive-ping-interval", "50")
            .body(Body::from_stream(futures_util::stream::iter(chunks)))
            .expect("request");
        let call = Streaming::<serde_json::Value>::from_request(req, &())
            .await
            .expect("parsed");
        assert_eq!(call.message, serde_json::json!({"a": 7}));
        assert_eq!(call.timing.deadline, Some(Duration::from_millis(1500)));
        assert_eq!(call.timing.keepalive, Some(Duration::from_secs(50)));

        let huge = envelope(0, &vec![b' '; MAX_MESSAGE_BYTES + 1]);
        let req = HttpRequest::post("/x")
            .header("content-type", "application/connect+json")
            .body(Body::from(huge))
            .expect("request");
        let Err(resp) = Streaming::<serde_json::Value>::from_request(req, &()).await else {
            panic!("an oversized message was taken");
        };
        assert_eq!(resp.status(), StatusCode::OK, "a stream's error is its end");
        let ends = envelopes(&body_of(resp).await);
        assert_eq!(ends[0].0, END_STREAM);
        assert_eq!(ends[0].1["error"]["code"], "resource_exhausted");
    }

    #[tokio::test]
    async fn a_unary_request_takes_json_and_its_error_is_a_status_and_a_code() {
        let req = HttpRequest::post("/x")
            .header("content-type", "application/json")
            .body(Body::from("{\"path\":\"a\"}"))
            .expect("request");
        let call = Unary::<serde_json::Value>::from_request(req, &())
            .await
            .expect("parsed");
        assert_eq!(call.message["path"], "a");
        let req = HttpRequest::post("/x")
            .header("content-type", "application/proto")
            .body(Body::empty())
            .expect("request");
        assert!(
            Unary::<serde_json::Value>::from_request(req, &())
                .await
                .is_err()
        );

        let resp = unary::<()>(None, async { Err(ConnectError::new(Code::NotFound, "no")) }).await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        let body: serde_json::Value = serde_json::from_slice(&body_of(resp).await).expect("json");
        assert_eq!(
            body,
            serde_json::json!({"code": "not_found", "message": "no"})
        );
        let slow = unary(Some(Duration::from_millis(10)), async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(())
        })
        .await;
        assert_eq!(slow.status(), StatusCode::GATEWAY_TIMEOUT);
    }

    #[tokio::test]
    async fn a_stream_ends_after_its_messages_its_error_or_its_deadline() {
        let ok = stream_reply(
            Timing::default(),
            Bytes::from_static(b"{\"k\":1}"),
            futures_util::stream::iter([Ok(Bytes::from_static(b"{\"n\":1}"))]),
        );
        assert_eq!(
            ok.headers().get(header::CONTENT_TYPE).map(|v| v.as_bytes()),
            Some(&b"application/connect+json"[..])
        );
        assert_eq!(
            envelopes(&body_of(ok).await),
            [
                (0, serde_json::json!({"n": 1})),
                (END_STREAM, serde_json::json!({}))
            ]
        );

        let failed = stream_reply(
            Timing::default(),
            Bytes::new(),
            futures_util::stream::iter([
                Err(ConnectError::new(Code::Internal, "broke")),
                Ok(Bytes::from_static(b"{}")),
            ]),
        );
        let got = envelopes(&body_of(failed).await);
        assert_eq!(got.len(), 1, "nothing after the error: {got:?}");
        assert_eq!(got[0].1["error"]["code"], "internal");

        // A stream that never ends: keepalives while it runs, then the
        // deadline ends it.
        let timing = Timing {
            deadline: Some(Duration::from_millis(2500)),
            keepalive: Some(Duration::from_secs(1)),
        };
        let silent = stream_reply(
            timing,
            Bytes::from_static(b"{\"event\":{\"keepalive\":{}}}"),
            futures_util::stream::pending(),
        );
        let got = envelopes(&body_of(silent).await);
        let keepalives = got.iter().filter(|(f, _)| *f == 0).count();
        assert_eq!(keepalives, 2, "{got:?}");
        let last = got.last().expect("an end");
        assert_eq!(last.0, END_STREAM);
        assert_eq!(last.1["error"]["code"], "deadline_exceeded");
    }
}
