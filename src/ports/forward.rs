//! A sandbox port reached by name rather than by its own URL: the HTTP
//! layer hands over a request whose `Host` was `PORT-ID.DOMAIN` (E2B's
//! `get_host(port)`), and it goes the same way as a request to the port's
//! URL (host port -> proxy -> relay in the sandbox -> the server), so it
//! has the same hardening and isolation. The request and the answer pass
//! through as they are, bodies streamed; an upgrade (a WebSocket) becomes
//! a byte pipe between the two connections. The sandbox counts as in use
//! until the answer's body ends or the pipe closes.
//!
//! Whether a port not yet allowlisted opens on first use is the caller's
//! rule, decided by the sandbox's session key: E2B's sandboxes have every
//! port open, sandboxd's own only those their create allowlisted.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;

use super::{PortError, Ports};

/// Longest wait for the port's proxy to accept the connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether a port the sandbox has not allowlisted opens when named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// Only allowlisted ports answer.
    Allowlisted,
    /// Any port opens on first use, up to `max_ports`.
    OnFirstUse,
}

/// Why a named port could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error(transparent)]
    Port(#[from] PortError),
    #[error("port {0} is not one of this sandbox's ports (its create lists them in `ports`)")]
    NotAllowed(u16),
    #[error("port {port} would be this sandbox's port number {count}; at most {max} (max_ports)")]
    TooManyPorts { port: u16, count: usize, max: usize },
    #[error("the sandbox is running but nothing answers on port {0}")]
    NotAnswering(u16),
}

/// Headers of one hop only (RFC 9110 7.6.1), not passed on; an upgrade
/// keeps `connection` and `upgrade`, which it needs.
const HOP_BY_HOP: [&str; 6] = [
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
];

impl Ports {
    /// Forwards `req` to `port` of the sandbox and answers what the server
    /// there answered; `opening` says, from the sandbox's session key,
    /// whether a port it has not allowlisted opens now.
    pub async fn forward(
        &self,
        sandbox_id: &str,
        port: u16,
        opening: impl FnOnce(&str) -> Opening,
        mut req: Request<Body>,
    ) -> Result<Response<Body>, ForwardError> {
        let sandbox = self
            .sandboxes
            .lookup(sandbox_id)
            .await
            .map_err(PortError::from)?;
        if !sandbox.ports().allowed.contains(&port) {
            if opening(&sandbox.session_key) == Opening::Allowlisted {
                return Err(ForwardError::NotAllowed(port));
            }
            let max = self.config.max_ports;
            sandbox
                .allow_ports(&BTreeSet::from([port]), max)
                .map_err(|count| ForwardError::TooManyPorts { port, count, max })?;
        }
        // Open while the answer streams (or the upgraded connection
        // lasts), as a log stream is: the sandbox is in use, so it does
        // not idle out under the request, and its idle time starts after.
        let busy = sandbox.open_request();
        let published = self
            .publish(sandbox_id, port, None, None)
            .await?
            .ok_or(ForwardError::NotAllowed(port))?;
        let stream = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect(self.proxy_address(published.host_port)),
        )
        .await
        .map_err(|_| ForwardError::NotAnswering(port))?
        .map_err(|_| ForwardError::NotAnswering(port))?;
        let (mut sender, connection) = http1::handshake::<_, Body>(TokioIo::new(stream))
            .await
            .map_err(|_| ForwardError::NotAnswering(port))?;
        // The connection's own task: it ends when either side closes it,
        // as the server's own connection tasks do.
        tokio::spawn(connection.with_upgrades());
        let upgrading = is_upgrade(req.headers());
        let client_side = upgrading.then(|| hyper::upgrade::on(&mut req));
        strip_hop_by_hop(req.headers_mut(), upgrading);
        let mut answer = sender
            .send_request(req)
            .await
            .map_err(|_| ForwardError::NotAnswering(port))?;
        if let Some(client_side) =
            client_side.filter(|_| answer.status() == StatusCode::SWITCHING_PROTOCOLS)
        {
            let server_side = hyper::upgrade::on(&mut answer);
            tokio::spawn(async move {
                let _busy = busy;
                if let (Ok(client), Ok(server)) = tokio::join!(client_side, server_side) {
                    let _ = tokio::io::copy_bidirectional(
                        &mut TokioIo::new(client),
                        &mut TokioIo::new(server),
                    )
                    .await;
                }
            });
            return Ok(answer.map(Body::new));
        }
        strip_hop_by_hop(answer.headers_mut(), false);
        Ok(answer.map(|body| {
            Body::new(body.map_frame(move |frame| {
                let _ = &busy;
                frame
            }))
        }))
    }

    /// Where a proxy's host port is reached from sandboxd: the publish
    /// address, or loopback when that is a wildcard.
    fn proxy_address(&self, host_port: u16) -> SocketAddr {
        let ip = self.config.publish_host_ip;
        let ip = if ip.is_unspecified() {
            match ip {
                IpAddr::V4(_) => IpAddr::from([127, 0, 0, 1]),
                IpAddr::V6(_) => IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
            }
        } else {
            ip
        };
        SocketAddr::new(ip, host_port)
    }
}

/// `Connection: upgrade` with an `Upgrade` header: a WebSocket or the like.
fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Drops one hop's headers, and those `Connection` names; an upgrade keeps
/// `Connection` and `Upgrade`.
fn strip_hop_by_hop(headers: &mut HeaderMap, upgrading: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .filter(|n| !(upgrading && *n == header::UPGRADE))
        .collect();
    named.iter().for_each(|n| {
        headers.remove(n);
    });
    HOP_BY_HOP.iter().for_each(|n| {
        headers.remove(*n);
    });
    if !upgrading {
        headers.remove(header::CONNECTION);
        headers.remove(header::UPGRADE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    HeaderName::from_bytes(k.as_bytes()).expect("name"),
                    v.parse().expect("value"),
                )
            })
            .collect()
    }

    #[test]
    fn an_upgrade_needs_both_headers() {
        assert!(is_upgrade(&headers(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket")
        ])));
        assert!(!is_upgrade(&headers(&[("upgrade", "websocket")])));
        assert!(!is_upgrade(&headers(&[("connection", "upgrade")])));
    }

    #[test]
    fn one_hops_headers_are_dropped_and_an_upgrade_keeps_its_own() {
        let mut h = headers(&[
            ("connection", "upgrade, x-hop"),
            ("upgrade", "websocket"),
            ("x-hop", "1"),
            ("keep-alive", "5"),
            ("transfer-encoding", "chunked"),
            ("x-kept", "1"),
        ]);
        strip_hop_by_hop(&mut h, true);
        let mut names: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        names.sort();
        assert_eq!(names, ["connection", "upgrade", "x-kept"]);
        strip_hop_by_hop(&mut h, false);
        assert_eq!(
            h.keys().map(HeaderName::as_str).collect::<Vec<_>>(),
            ["x-kept"]
        );
    }
}
