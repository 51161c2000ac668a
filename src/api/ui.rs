//! The web console at `/ui/`: static files built from `ui/` and embedded in
//! the binary by build.rs (see README, Web console), served with a strict
//! Content-Security-Policy and anti-framing headers. The console is only
//! files: it needs no token to load, and every call it makes goes to the
//! public API with the token like any other client's. When the binary was
//! built without `ui/dist`, `/ui/` answers a page saying how to build it.
//! The Host and Origin checks of every route apply here too (they are
//! layered around the whole router in `api/mod.rs`).

use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/ui_assets.rs"));
}

/// `GET /ui`: the console lives under the slash (its assets are relative).
pub(super) async fn redirect() -> Redirect {
    Redirect::permanent("/ui/")
}

/// `GET /ui/`: the console's page.
pub(super) async fn index(headers: HeaderMap) -> Response {
    answer(embedded::UI_ASSETS, "index.html", &headers)
}

/// `GET /ui/{*path}`: one of its files.
pub(super) async fn asset(Path(path): Path<String>, headers: HeaderMap) -> Response {
    answer(embedded::UI_ASSETS, &path, &headers)
}

/// Shown at `/ui/` by a binary built without the console.
const NOT_BUILT: &str = "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<title>sandboxd console not built</title></head><body>\
<h1>The web console is not in this build</h1>\
<p>This sandboxd binary was built without <code>ui/dist</code>. Build the console, \
then sandboxd again, from the repository:</p>\
<pre>scripts/build-ui.sh\ncargo build --release</pre>\
<p>The API itself works as usual.</p></body></html>\n";

/// The file at `path` of `assets` with the console's headers, the
/// not-built page for the index of an empty table, else a 404.
fn answer(assets: &[(&str, &[u8])], path: &str, headers: &HeaderMap) -> Response {
    let found = assets.iter().find(|(name, _)| *name == path);
    let mut resp = match found {
        Some((name, bytes)) => {
            ([(header::CONTENT_TYPE, content_type(name))], bytes.to_vec()).into_response()
        }
        None if assets.is_empty() && path == "index.html" => (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            NOT_BUILT,
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "no such file of the web console\n",
        )
            .into_response(),
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let h = resp.headers_mut();
    if let Ok(csp) = HeaderValue::from_str(&content_security_policy(host)) {
        h.insert(header::CONTENT_SECURITY_POLICY, csp);
    }
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // A new build of sandboxd serves new files under the same names.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// Only the console's own files, no inline script or style, no framing.
/// The terminal's WebSocket goes to this same host; `'self'` covers it in
/// current browsers, and the `ws:`/`wss:` sources name it for those that
/// read `'self'` as http(s) only. A `Host` with anything but the
/// characters of a name, an address and a port is left out rather than
/// copied into the header.
fn content_security_policy(host: Option<&str>) -> String {
    let plain = |h: &&str| {
        !h.is_empty()
            && h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
    };
    let sockets = host
        .filter(plain)
        .map(|h| format!(" ws://{h} wss://{h}"))
        .unwrap_or_default();
    format!(
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
         connect-src 'self'{sockets}; object-src 'none'; base-uri 'none'; \
         form-action 'self'; frame-ancestors 'none'"
    )
}

fn content_type(name: &str) -> &'static str {
    match name.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("json" | "map") => "application/json",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("woff2") => "font/woff2",
        Some("txt") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header_of(resp: &Response, name: header::HeaderName) -> String {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    }

    #[test]
    fn a_build_without_the_console_says_how_to_build_it() {
        let resp = answer(&[], "index.html", &HeaderMap::new());
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        assert!(header_of(&resp, header::CONTENT_TYPE).starts_with("text/html"));
        assert_eq!(header_of(&resp, header::X_FRAME_OPTIONS), "DENY");
        // Another file of an empty table is a plain 404.
        let other = answer(&[], "app.js", &HeaderMap::new());
        assert!(header_of(&other, header::CONTENT_TYPE).starts_with("text/plain"));
        assert!(NOT_BUILT.contains("scripts/build-ui.sh"));
    }

    #[test]
    fn files_get_their_type_and_every_answer_the_headers() {
        let assets: &[(&str, &[u8])] = &[("index.html", b"<p>"), ("app.js", b"x")];
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        let js = answer(assets, "app.js", &headers);
        assert_eq!(js.status(), StatusCode::OK);
        assert_eq!(
            header_of(&js, header::CONTENT_TYPE),
            "text/javascript; charset=utf-8"
        );
        let csp = header_of(&js, header::CONTENT_SECURITY_POLICY);
        assert!(csp.contains("script-src 'self';"), "{csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert!(
            csp.contains("connect-src 'self' ws://127.0.0.1:8080 wss://127.0.0.1:8080;"),
            "{csp}"
        );
        assert!(!csp.contains("unsafe"), "{csp}");
        assert_eq!(header_of(&js, header::X_CONTENT_TYPE_OPTIONS), "nosniff");
        assert_eq!(header_of(&js, header::REFERRER_POLICY), "no-referrer");
        let missing = answer(assets, "nope.js", &headers);
        assert_eq!(missing.status(), StatusCode::NOT_FOUND);
        assert_eq!(header_of(&missing, header::X_FRAME_OPTIONS), "DENY");
    }

    #[test]
    fn a_host_that_could_add_a_directive_is_left_out_of_the_policy() {
        let csp = content_security_policy(Some("evil.example; script-src *"));
        assert!(csp.contains("connect-src 'self';"), "{csp}");
        assert!(!csp.contains("evil"), "{csp}");
        let csp = content_security_policy(Some("[::1]:9000"));
        assert!(csp.contains("ws://[::1]:9000 wss://[::1]:9000"), "{csp}");
    }
}
