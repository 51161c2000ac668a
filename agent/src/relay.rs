//! Port relays: a server that listens on 127.0.0.1 inside the sandbox is
//! made reachable from the sandbox's port proxy by a listener on every
//! address that accepts only peers from the sandbox's link network and
//! forwards each connection to 127.0.0.1. Relays live in the agent, so
//! they outlive a restart of sandboxd and need no `socat` in the image.
//! Also here: whether a server answers on a port yet.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::rc::Rc;
use std::time::{Duration, Instant};

use sandboxd_proto::{Failure, FailureKind};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// An IPv4 network: base address and prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cidr {
    base: u32,
    prefix: u32,
}

impl Cidr {
    pub(crate) fn parse(s: &str) -> Option<Cidr> {
        let (ip, bits) = s.split_once('/')?;
        let ip: Ipv4Addr = ip.parse().ok()?;
        let prefix: u32 = bits.parse().ok().filter(|b| *b <= 32)?;
        let mask = mask(prefix);
        Some(Cidr {
            base: u32::from(ip) & mask,
            prefix,
        })
    }

    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        let v4 = match ip {
            IpAddr::V4(v4) => v4,
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => v4,
                None => return false,
            },
        };
        u32::from(v4) & mask(self.prefix) == self.base
    }
}

fn mask(prefix: u32) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    }
}

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
        let cidr = Cidr::parse(allow).ok_or_else(|| {
            Failure::new(
                FailureKind::Invalid,
                format!("{allow:?} is not an IPv4 CIDR"),
            )
        })?;
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
    fn cidrs_hold_their_addresses_only() {
        let c = Cidr::parse("10.213.4.8/29").expect("cidr");
        assert!(c.contains("10.213.4.9".parse().expect("ip")));
        assert!(c.contains("::ffff:10.213.4.14".parse().expect("ip")));
        assert!(!c.contains("10.213.4.16".parse().expect("ip")));
        assert!(!c.contains("::1".parse().expect("ip")));
        assert!(Cidr::parse("10.0.0.0/33").is_none());
        assert!(Cidr::parse("nonsense").is_none());
        assert!(
            Cidr::parse("0.0.0.0/0")
                .expect("all")
                .contains("1.2.3.4".parse().expect("ip"))
        );
    }
}
