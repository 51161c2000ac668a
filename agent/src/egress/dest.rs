//! Where a request wants to go ([`Dest`]): the `host:port` of a
//! `CONNECT` or of an `http://` URL, parsed strictly (a name of safe
//! characters, an IPv4 or bracketed IPv6 address, a port; no
//! credentials), and shown the one way log lines and answers show it.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

/// Where a request wants to go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Dest {
    pub(super) host: Host,
    pub(super) port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Host {
    Ip(IpAddr),
    /// Letters, digits, `.`, `-` and `_` only (checked).
    Name(String),
}

impl Dest {
    /// `host:port` as hyper found it in a request (a name, an IPv4
    /// address or a bracketed IPv6 address), the port optional if there
    /// is a `default`. Credentials (`user@`) are refused: nothing here
    /// would use them, and they would end up in the log.
    pub(super) fn parse(authority: &str, default: Option<u16>) -> Result<Dest, &'static str> {
        if authority.contains('@') {
            return Err("credentials in the address are not supported");
        }
        let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
            let (inside, after) = rest.split_once(']').ok_or("an unclosed '['")?;
            let ip: Ipv6Addr = inside.parse().map_err(|_| "not an IPv6 address in [ ]")?;
            let port = match after {
                "" => None,
                _ => Some(after.strip_prefix(':').ok_or("junk after ']'")?),
            };
            (Host::Ip(IpAddr::V6(ip)), port)
        } else {
            let (host, port) = match authority.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            };
            let host = if let Ok(ip) = host.parse() {
                Host::Ip(IpAddr::V4(ip))
            } else if !host.is_empty()
                && host.len() <= 253
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-_".contains(&b))
            {
                Host::Name(host.to_owned())
            } else {
                return Err("not a host name or IP address");
            };
            (host, port)
        };
        let port = match port {
            None => default.ok_or("no port")?,
            Some(p) if (1..=5).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or("not a port")?,
            Some(_) => return Err("not a port"),
        };
        Ok(Dest { host, port })
    }
}

impl fmt::Display for Dest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}:{}", self.port),
            Host::Name(name) => write!(f, "{name}:{}", self.port),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_parse() {
        let ok = |a: &str, default: Option<u16>| Dest::parse(a, default).expect(a).to_string();
        assert_eq!(ok("example.com:443", None), "example.com:443");
        assert_eq!(ok("Example.COM", Some(80)), "Example.COM:80");
        assert_eq!(ok("10.0.0.1:8080", None), "10.0.0.1:8080");
        assert_eq!(ok("[::1]:443", None), "[::1]:443");
        assert_eq!(ok("[::1]", Some(80)), "[::1]:80");
        assert_eq!(ok("[::FFFF:127.0.0.1]:80", None), "[::ffff:127.0.0.1]:80");
        assert_eq!(ok("_srv.example.com:1", None), "_srv.example.com:1");
        assert_eq!(
            Dest::parse("[2001:db8::1]:65535", None),
            Ok(Dest {
                host: Host::Ip("2001:db8::1".parse().expect("ip")),
                port: 65535
            })
        );
        for (bad, default) in [
            ("example.com", None),
            ("[::1]", None),
            ("example.com:", Some(80)),
            ("example.com:0", None),
            ("example.com:65536", None),
            ("example.com:+80", None),
            ("example.com:080080", None),
            ("example.com:http", None),
            ("::1:443", None),
            ("[::1:443", None),
            ("[::1]443", None),
            ("[10.0.0.1]:80", None),
            ("[fe80::1%25eth0]:80", None),
            ("user:pw@example.com:80", None),
            (":443", None),
            ("", Some(80)),
            ("exa%6dple.com:80", None),
            ("example.com:80:80", None),
        ] {
            assert!(Dest::parse(bad, default).is_err(), "{bad:?}");
        }
    }
}
