//! The proxy's own answers: one line of plain text with a status (a bad
//! destination, a failure to reach it), and a destination made safe for a
//! log line ([`sanitise`]). [`Body`] is what every answer carries: such a
//! line, or an origin's body streamed through.

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};

/// The body of an answer: the proxy's own, or an origin's.
pub(super) type Body = Either<Full<Bytes>, Incoming>;

/// Most bytes of a destination in an `egress-denied` line.
pub(super) const MAX_LOGGED: usize = 300;

/// `dest` for a log line: at most [`MAX_LOGGED`] bytes of characters that
/// cannot split or forge a line, anything else as `?`.
pub(super) fn sanitise(dest: &str) -> String {
    dest.bytes()
        .take(MAX_LOGGED)
        .map(|b| {
            if b.is_ascii_alphanumeric() || b".:_-[]*".contains(&b) {
                char::from(b)
            } else {
                '?'
            }
        })
        .collect()
}

pub(super) fn bad_destination(why: &str) -> Response<Body> {
    text(
        StatusCode::BAD_REQUEST,
        &format!("sandboxd egress: bad destination: {why}"),
    )
}

pub(super) fn failed(status: StatusCode, shown: &str, why: &str) -> Response<Body> {
    text(
        status,
        &format!("sandboxd egress: {} {why}", sanitise(shown)),
    )
}

/// A one-line plain-text answer.
pub(super) fn text(status: StatusCode, line: &str) -> Response<Body> {
    let mut answer = Response::new(Either::Left(Full::new(Bytes::from(format!("{line}\n")))));
    *answer.status_mut() = status;
    answer.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_destinations_are_sanitised() {
        assert_eq!(sanitise("pypi.org:443"), "pypi.org:443");
        assert_eq!(sanitise("[::ffff:127.0.0.1]:80"), "[::ffff:127.0.0.1]:80");
        assert_eq!(sanitise("*_a-b"), "*_a-b");
        assert_eq!(sanitise("a b\nc\u{e9}"), "a?b?c??");
        assert_eq!(sanitise(&"x".repeat(400)).len(), MAX_LOGGED);
        assert_eq!(sanitise(&"\u{e9}".repeat(400)).len(), MAX_LOGGED);
    }
}
