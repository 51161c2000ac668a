//! Which `Host` and `Origin` values name this server: the defence against
//! DNS rebinding and cross-site requests.
//!
//! A web page can make a browser send requests to sandboxd on loopback.
//! Under DNS rebinding the page's own host name resolves to 127.0.0.1, so
//! the browser treats sandboxd as same-origin and reads its answers. The
//! browser cannot hide the name it used, though: it sends it as `Host`,
//! and as `Origin` on every request that writes and on WebSocket upgrades.
//! So a request is served only when `Host` names this server (loopback,
//! the address it is bound to, or an `allowed_hosts` entry) and an
//! `Origin`, when present, is this server itself or a `cors_origins` entry.
//! Clients that send no `Origin` (curl, server-side SDKs) are unaffected.
//!
//! One more shape of `Host` is this server's: `PORT-ID.NAME`, where `NAME`
//! names this server, addresses port `PORT` of sandbox `ID` (E2B's
//! `get_host`). It is the sandbox's, not the API's: such a request is
//! forwarded to the port and never reaches a route, and its name is not
//! this server's as an `Origin`, so a page served by a sandbox cannot call
//! the API.

use std::net::IpAddr;

/// One `allowed_hosts` entry: an exact name or address, `*.suffix`, or `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// This name or address, any port.
    Exact(String),
    /// Any name ending in `.suffix` (not `suffix` itself), any port.
    Subdomains(String),
    /// Any host at all: the check is off.
    Any,
}

impl HostPattern {
    /// Parses an entry: `sandboxd`, `sandbox.example.com`, `10.0.0.5`,
    /// `[fd00::1]`, `*.example.com` or `*`. Ports are not part of it.
    pub fn parse(entry: &str) -> Result<HostPattern, String> {
        let e = entry.trim().to_ascii_lowercase();
        if e == "*" {
            return Ok(HostPattern::Any);
        }
        if let Some(suffix) = e.strip_prefix("*.") {
            return if is_dns_name(suffix) && suffix.contains('.') {
                Ok(HostPattern::Subdomains(suffix.to_string()))
            } else {
                Err(format!(
                    "{entry:?}: a pattern is *. and a domain with a dot, e.g. *.example.com"
                ))
            };
        }
        if let Some(ip) = parse_ip(&e) {
            return Ok(HostPattern::Exact(ip.to_string()));
        }
        if is_dns_name(&e) {
            Ok(HostPattern::Exact(e))
        } else {
            Err(format!(
                "{entry:?} is not a host name, an IP address or a *.domain pattern (no scheme, port or path)"
            ))
        }
    }

    fn matches(&self, host: &Host) -> bool {
        match self {
            HostPattern::Any => true,
            HostPattern::Exact(name) => *name == host.name,
            HostPattern::Subdomains(suffix) => host
                .name
                .strip_suffix(suffix.as_str())
                .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.')),
        }
    }
}

/// A web origin as browsers send it: `scheme://host[:port]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebOrigin {
    scheme: Scheme,
    host: Host,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    Http,
    Https,
}

impl Scheme {
    fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

impl WebOrigin {
    /// Parses `http://host[:port]` or `https://host[:port]`; no path.
    pub fn parse(origin: &str) -> Result<WebOrigin, String> {
        let o = origin.trim().to_ascii_lowercase();
        let (scheme, rest) = if let Some(r) = o.strip_prefix("http://") {
            (Scheme::Http, r)
        } else if let Some(r) = o.strip_prefix("https://") {
            (Scheme::Https, r)
        } else {
            return Err(format!("{origin:?} is not an http:// or https:// origin"));
        };
        let mut host = Host::parse(rest)
            .ok_or_else(|| format!("{origin:?} is not scheme://host[:port] (no path, no user)"))?;
        host.port = Some(host.port.unwrap_or(scheme.default_port()));
        Ok(WebOrigin { scheme, host })
    }

    /// As browsers serialise it: the default port left out.
    pub fn serialized(&self) -> String {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        let name = self.host.bracketed();
        match self.host.port {
            Some(p) if p != self.scheme.default_port() => format!("{scheme}://{name}:{p}"),
            _ => format!("{scheme}://{name}"),
        }
    }
}

/// The host part of a `Host` header or an origin: a lowercase name or a
/// canonical IP address, and the port if one was given.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Host {
    name: String,
    ip: Option<IpAddr>,
    port: Option<u16>,
}

impl Host {
    /// `name`, `name:port`, `1.2.3.4[:port]`, `[v6][:port]`; nothing else.
    fn parse(s: &str) -> Option<Host> {
        let s = s.to_ascii_lowercase();
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (inside, after) = rest.split_once(']')?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':')?),
            };
            (format!("[{inside}]"), port)
        } else {
            match s.split_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (s.clone(), None),
            }
        };
        let port = match port {
            None => None,
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
                Some(p.parse().ok()?)
            }
            Some(_) => return None,
        };
        let ip = parse_ip(&host);
        if ip.is_none() && !is_dns_name(&host) {
            return None;
        }
        let name = ip.map_or(host, |ip| ip.to_string());
        Some(Host { name, ip, port })
    }

    fn is_loopback(&self) -> bool {
        self.name == "localhost" || self.ip.is_some_and(|ip| ip.is_loopback())
    }

    fn bracketed(&self) -> String {
        match self.ip {
            Some(IpAddr::V6(v6)) => format!("[{v6}]"),
            _ => self.name.clone(),
        }
    }
}

/// `1.2.3.4` or `[v6]` (or a bare v6) as an address.
fn parse_ip(s: &str) -> Option<IpAddr> {
    let inner = s
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(s);
    inner.parse().ok()
}

/// Letters, digits, hyphens and dots, in labels of 1 to 63 characters.
fn is_dns_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// A sandbox port named by `Host`: `PORT-ID.NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortHost {
    pub port: u16,
    /// As written (lowercase letters, digits); not checked to be a sandbox.
    pub sandbox_id: String,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No `Host` (an HTTP/1.0 request): the server it meant is unknown.
    #[error("the request has no Host header; send the name you reach sandboxd by")]
    NoHost,
    /// `Host` names another server.
    #[error(
        "the Host header {0:?} does not name this server (DNS rebinding?); \
         loopback names and allowed_hosts (SANDBOXD_ALLOWED_HOSTS) are served"
    )]
    Host(String),
    /// `Origin` is neither this server nor a `cors_origins` entry.
    #[error(
        "the Origin header {0:?} is not this server (same scheme, host and port) \
         nor one of cors_origins (SANDBOXD_CORS_ORIGINS)"
    )]
    Origin(String),
}

/// The hosts that name this server and the origins allowed to call it;
/// by default loopback only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OriginPolicy {
    bind_host: Option<IpAddr>,
    allowed: Vec<HostPattern>,
    cors: Vec<WebOrigin>,
}

/// Longest header value quoted back in a refusal.
const QUOTE_MAX: usize = 200;

impl OriginPolicy {
    /// From validated settings: the bound address (served by its own
    /// address unless it is a wildcard), `allowed_hosts` and
    /// `cors_origins`. Entries that do not parse are refused.
    pub fn new(
        bind_host: IpAddr,
        allowed_hosts: &[String],
        cors_origins: &[String],
    ) -> Result<OriginPolicy, String> {
        Ok(OriginPolicy {
            bind_host: (!bind_host.is_unspecified()).then_some(bind_host),
            allowed: allowed_hosts
                .iter()
                .map(|h| HostPattern::parse(h))
                .collect::<Result<_, _>>()?,
            cors: cors_origins
                .iter()
                .map(|o| WebOrigin::parse(o))
                .collect::<Result<_, _>>()?,
        })
    }

    /// Whether `allowed_hosts` has `*`: every `Host` is served.
    pub fn any_host(&self) -> bool {
        self.allowed.contains(&HostPattern::Any)
    }

    /// The `cors_origins`, as browsers send them in `Origin`.
    pub fn cors_origins(&self) -> Vec<String> {
        self.cors.iter().map(WebOrigin::serialized).collect()
    }

    /// Whether `host` (the request's `Host`) names this server.
    pub fn check_host(&self, host: Option<&str>) -> Result<(), Refusal> {
        let raw = host.ok_or(Refusal::NoHost)?;
        let refused = || Refusal::Host(quote(raw));
        let host = Host::parse(raw).ok_or_else(refused)?;
        let own = host.is_loopback()
            || self.bind_host.is_some_and(|b| host.ip == Some(b))
            || self.allowed.iter().any(|p| p.matches(&host));
        if own { Ok(()) } else { Err(refused()) }
    }

    /// The sandbox port `host` names, when it is `PORT-ID.NAME` with `PORT`
    /// 1–65535 (no leading zero), `ID` letters and digits, and `NAME` a
    /// host [`Self::check_host`] serves.
    pub fn port_host(&self, host: Option<&str>) -> Option<PortHost> {
        let (label, rest) = host?.split_once('.')?;
        let (port, id) = label.split_once('-')?;
        let port: u16 = Some(port)
            .filter(|p| !p.starts_with('0') && p.bytes().all(|b| b.is_ascii_digit()))?
            .parse()
            .ok()?;
        let id = id.to_ascii_lowercase();
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return None;
        }
        self.check_host(Some(rest)).ok()?;
        Some(PortHost {
            port,
            sandbox_id: id,
        })
    }

    /// Whether `origin`, when sent, may call this server: the page is
    /// served by this very server (its host and port are the request's
    /// `Host`, which must name this server; `https` too, for a TLS proxy
    /// in front), or it is one of `cors_origins`.
    pub fn check_origin(&self, host: Option<&str>, origin: Option<&str>) -> Result<(), Refusal> {
        let Some(raw) = origin else { return Ok(()) };
        let refused = || Refusal::Origin(quote(raw));
        let origin = WebOrigin::parse(raw).map_err(|_| refused())?;
        if self.cors.contains(&origin) {
            return Ok(());
        }
        self.check_host(host).map_err(|_| refused())?;
        let host = host.and_then(Host::parse).ok_or_else(refused)?;
        let host_port = host.port.unwrap_or(origin.scheme.default_port());
        if origin.host.name == host.name && origin.host.port == Some(host_port) {
            Ok(())
        } else {
            Err(refused())
        }
    }
}

fn quote(s: &str) -> String {
    s.chars().take(QUOTE_MAX).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allowed: &[&str], cors: &[&str]) -> OriginPolicy {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        OriginPolicy::new(IpAddr::from([127, 0, 0, 1]), &s(allowed), &s(cors)).expect("policy")
    }

    #[test]
    fn loopback_names_are_served_on_any_port() {
        let p = policy(&[], &[]);
        for h in [
            "localhost",
            "localhost:8080",
            "LOCALHOST:1",
            "127.0.0.1",
            "127.0.0.1:9",
            "127.1.2.3:80",
            "[::1]",
            "[::1]:8080",
        ] {
            assert_eq!(p.check_host(Some(h)), Ok(()), "{h}");
        }
    }

    #[test]
    fn other_hosts_and_garbage_are_refused() {
        let p = policy(&[], &[]);
        for h in [
            "attacker.example:8080",
            "attacker.example",
            "localhost.",
            "foo.localhost",
            "10.0.0.1:8080",
            "user@localhost",
            "localhost:80:80",
            "localhost:",
            "localhost:99999",
            "[::1",
            "",
            "local host",
        ] {
            assert!(p.check_host(Some(h)).is_err(), "{h}");
        }
        assert_eq!(p.check_host(None), Err(Refusal::NoHost));
    }

    #[test]
    fn allowed_hosts_exact_and_subdomain_patterns() {
        let p = policy(&["sandboxd", "*.example.com", "10.0.0.5", "[fd00::1]"], &[]);
        for h in [
            "sandboxd:8080",
            "SandboxD",
            "a.example.com",
            "a.b.example.com:443",
            "10.0.0.5:8080",
            "[fd00::1]:1",
        ] {
            assert_eq!(p.check_host(Some(h)), Ok(()), "{h}");
        }
        for h in ["example.com", "aexample.com", "sandboxd.evil", "10.0.0.6"] {
            assert!(p.check_host(Some(h)).is_err(), "{h}");
        }
    }

    #[test]
    fn a_specific_bind_host_is_served_but_a_wildcard_is_not_a_name() {
        let p = OriginPolicy::new("192.0.2.7".parse().expect("ip"), &[], &[]).expect("policy");
        assert_eq!(p.check_host(Some("192.0.2.7:8080")), Ok(()));
        let p = OriginPolicy::new("0.0.0.0".parse().expect("ip"), &[], &[]).expect("policy");
        assert!(p.check_host(Some("0.0.0.0:8080")).is_err());
    }

    #[test]
    fn star_turns_the_host_check_off() {
        let p = policy(&["*"], &[]);
        assert_eq!(p.check_host(Some("anything.example:1")), Ok(()));
    }

    #[test]
    fn bad_entries_are_refused() {
        for e in ["http://x", "x:80", "*.com", "a/b", "", "*.", "exa mple.com"] {
            assert!(HostPattern::parse(e).is_err(), "{e}");
        }
        for o in [
            "null",
            "example.com",
            "ftp://x",
            "http://x/path",
            "http://",
            "http://u@x",
        ] {
            assert!(WebOrigin::parse(o).is_err(), "{o}");
        }
    }

    #[test]
    fn no_origin_is_fine_and_same_origin_is_served() {
        let p = policy(&["sandboxd"], &[]);
        assert_eq!(p.check_origin(Some("evil.example"), None), Ok(()));
        for (host, origin) in [
            ("127.0.0.1:8080", "http://127.0.0.1:8080"),
            ("localhost:8080", "https://localhost:8080"),
            ("sandboxd", "http://sandboxd"),
            ("sandboxd:80", "http://sandboxd"),
            ("sandboxd", "https://sandboxd:443"),
            ("[::1]:8080", "http://[::1]:8080"),
        ] {
            assert_eq!(
                p.check_origin(Some(host), Some(origin)),
                Ok(()),
                "{host} {origin}"
            );
        }
    }

    #[test]
    fn foreign_or_cross_port_origins_are_refused() {
        let p = policy(&[], &[]);
        for (host, origin) in [
            ("127.0.0.1:8080", "http://evil.example"),
            ("127.0.0.1:8080", "http://localhost:8080"),
            ("127.0.0.1:8080", "http://127.0.0.1:3000"),
            ("127.0.0.1:8080", "http://127.0.0.1"),
            ("127.0.0.1", "http://127.0.0.1:8080"),
            ("attacker.example:8080", "http://attacker.example:8080"),
            ("127.0.0.1:8080", "null"),
        ] {
            assert!(
                matches!(
                    p.check_origin(Some(host), Some(origin)),
                    Err(Refusal::Origin(_))
                ),
                "{host} {origin}"
            );
        }
    }

    #[test]
    fn cors_origins_are_served_and_serialised_as_browsers_send_them() {
        let p = policy(
            &[],
            &["https://chat.example.com:443", "http://LOCALHOST:3000"],
        );
        assert_eq!(
            p.cors_origins(),
            vec!["https://chat.example.com", "http://localhost:3000"]
        );
        assert_eq!(
            p.check_origin(Some("127.0.0.1:8080"), Some("https://chat.example.com")),
            Ok(())
        );
        assert_eq!(
            p.check_origin(Some("127.0.0.1:8080"), Some("http://localhost:3000")),
            Ok(())
        );
        assert!(
            p.check_origin(Some("127.0.0.1:8080"), Some("http://chat.example.com"))
                .is_err()
        );
    }

    #[test]
    fn a_port_and_an_id_before_a_served_name_name_a_sandbox_port() {
        let p = policy(&["sandbox.example.com"], &[]);
        let port_host = |h: &str| p.port_host(Some(h));
        let want = |port, id: &str| {
            Some(PortHost {
                port,
                sandbox_id: id.to_string(),
            })
        };
        assert_eq!(port_host("8000-ab12.127.0.0.1:3000"), want(8000, "ab12"));
        assert_eq!(port_host("8000-AB12.localhost"), want(8000, "ab12"));
        assert_eq!(port_host("1-x.sandbox.example.com"), want(1, "x"));
        assert_eq!(port_host("65535-x.localhost:1"), want(65535, "x"));
        for h in [
            // The rest must be served: rebinding cannot reach a port.
            "8000-ab12.attacker.example",
            "8000-ab12.example.com",
            // Not PORT-ID.
            "localhost:3000",
            "127.0.0.1",
            "8000.localhost",
            "8000-.localhost",
            "-ab12.localhost",
            "08000-ab12.localhost",
            "0-ab12.localhost",
            "65536-ab12.localhost",
            "80x-ab12.localhost",
            "8000-ab_12.localhost",
            "8000-ab-12.localhost",
            "8000-ab12.",
        ] {
            assert_eq!(port_host(h), None, "{h}");
        }
        assert_eq!(p.port_host(None), None);
    }

    #[test]
    fn a_page_on_a_port_host_is_not_this_servers_origin() {
        let p = policy(&[], &[]);
        assert!(matches!(
            p.check_origin(
                Some("localhost:3000"),
                Some("http://8000-ab12.localhost:3000")
            ),
            Err(Refusal::Origin(_))
        ));
    }

    #[test]
    fn refusals_quote_a_bounded_header() {
        let long = "a".repeat(5000);
        match policy(&[], &[]).check_host(Some(&long)) {
            Err(Refusal::Host(q)) => assert_eq!(q.len(), QUOTE_MAX),
            other => panic!("{other:?}"),
        }
    }
}
