//! Port relays: a server that listens on 127.0.0.1 inside the sandbox is
//! made reachable from the sandbox's port proxy by a listener on every
//! address that accepts only peers from the sandbox's link network and
//! forwards each connection to 127.0.0.1. Relays live in the agent, so
//! they outlive a restart of sandboxd and need no `socat` in the image.
//! Also here: whether a server answers on a port yet.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use sandboxd_proto::{Cidr, Failure, FailureKind};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// The relays running, by listening port.
#[derive(Debug, Default)]
pub(crate) struct Relays {
    running: RefCell<HashMap<u16, (u16, Cidr)>>,
}

impl Relays {
    /// Makes sure `listen` forwards to `port` for peers in `allow`.
    pub(crate) fn ensure(
        self: &Rc<Self>,
        port: u16,
        listen: u16,
        allow: &str,
    ) -> Result<(), Failure> {
        let cidr = allowed_peers(allow)?;
        if let Some((p, c)) = self.running.borrow().get(&listen) {
            if *p == port && *c == cidr {
                return Ok(());
            }
        }
        let listener = bind(listen).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                Failure::new(
                    FailureKind::PortInUse,
                    format!("port {listen}, which relays port {port}, is taken by a process in the sandbox"),
                )
            } else {
                Failure::new(FailureKind::Other, format!("relay on port {listen}: {e}"))
            }
        })?;
        self.running.borrow_mut().insert(listen, (port, cidr));
        let relays = Rc::clone(self);
        tokio::task::spawn_local(async move {
            loop {
                let Ok((conn, peer)) = listener.accept().await else {
                    break;
                };
                if !cidr.contains(peer.ip()) {
                    continue;
                }
                tokio::task::spawn_local(forward(conn, port));
            }
            relays.running.borrow_mut().remove(&listen);
        });
        Ok(())
    }
}

/// The peers a relay accepts: an IPv4 CIDR (relays listen on IPv4 only,
/// so an IPv6 network would silently accept nobody).
fn allowed_peers(allow: &str) -> Result<Cidr, Failure> {
    Cidr::parse(allow)
        .ok()
        .filter(|c| c.network().is_ipv4())
        .ok_or_else(|| {
            Failure::new(
                FailureKind::Invalid,
                format!("{allow:?} is not an IPv4 CIDR"),
            )
        })
}

fn bind(port: u16) -> std::io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(SocketAddr::from(([0, 0, 0, 0], port)))?;
    socket.listen(128)
}

async fn forward(mut conn: TcpStream, port: u16) {
    if let Ok(mut target) = TcpStream::connect(("127.0.0.1", port)).await {
        let _ = conn.set_nodelay(true);
        let _ = target.set_nodelay(true);
        let _ = tokio::io::copy_bidirectional(&mut conn, &mut target).await;
    }
}

/// Whether something accepts connections on 127.0.0.1:`port`, trying
/// every 100 ms for up to `wait`.
pub(crate) async fn probe(port: u16, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    loop {
        let attempt = tokio::time::timeout(
            Duration::from_millis(500),
            TcpStream::connect(("127.0.0.1", port)),
        )
        .await;
        if matches!(attempt, Ok(Ok(_))) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relays_accept_peers_of_an_ipv4_cidr_only() {
        let c = allowed_peers("10.213.4.8/29").expect("cidr");
        assert!(c.contains("10.213.4.9".parse().expect("ip")));
        assert!(c.contains("::ffff:10.213.4.14".parse().expect("ip")));
        assert!(!c.contains("10.213.4.16".parse().expect("ip")));
        assert!(!c.contains("::1".parse().expect("ip")));
        assert!(allowed_peers("10.0.0.0/33").is_err());
        assert!(allowed_peers("nonsense").is_err());
        assert!(allowed_peers("fd00::/8").is_err());
        assert!(
            allowed_peers("0.0.0.0/0")
                .expect("all")
                .contains("1.2.3.4".parse().expect("ip"))
        );
    }
}
