//! What every connection of the proxy shares ([`Proxy`]): the policy, the
//! resolver, and for each client address its connections, its lookups
//! under way and its budget of `egress-denied` lines; the slots a
//! connection holds while it is open; the answer and log line of a
//! refusal; and the report, once a second, of what was suppressed or
//! turned away.

use std::collections::HashMap;
use std::net::{IpAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use hyper::header::{HeaderName, HeaderValue};
use hyper::{Response, StatusCode};
use sandboxd_proto::egress::{Denied, EgressPolicy};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::answer::{Body, sanitise, text};
use super::limits::Limits;

#[cfg(test)]
use std::net::SocketAddr;

/// Resolves a name to its addresses, blocking: getaddrinfo, or a test's.
pub(super) type Resolver = dyn Fn(&str, u16) -> std::io::Result<Vec<IpAddr>> + Send + Sync;

/// getaddrinfo, as the egress container's resolv.conf says.
fn system_resolver(name: &str, port: u16) -> std::io::Result<Vec<IpAddr>> {
    Ok((name, port).to_socket_addrs()?.map(|a| a.ip()).collect())
}

/// What every connection shares.
pub(super) struct Proxy {
    pub(super) policy: EgressPolicy,
    /// Where `egress-denied` lines go: stdout, or a test's buffer.
    log: Box<dyn Fn(&str) + Send + Sync>,
    pub(super) limits: Limits,
    pub(super) resolver: Arc<Resolver>,
    /// Clients with connections open, lookups under way or counts not yet
    /// reported.
    clients: Mutex<HashMap<IpAddr, Client>>,
    /// Connections closed unserved because the proxy was full, since the
    /// last report.
    pub(super) full: AtomicU64,
    /// Destinations tests run on loopback, exempt from the policy.
    #[cfg(test)]
    pub(super) exempt: Vec<SocketAddr>,
}

/// What the proxy holds for one client address.
#[derive(Debug)]
pub(super) struct Client {
    connections: usize,
    /// Its lookups under way, [`Limits::client_lookups`] at most.
    pub(super) lookups: Arc<Semaphore>,
    /// `egress-denied` lines it may print now: a bucket of tokens that
    /// refills at [`Limits::log_per_second`] up to [`Limits::log_burst`].
    log_tokens: f64,
    refilled: Instant,
    /// Since the last report: lines not printed, connections closed at
    /// its cap, lookups answered 503 at its cap.
    suppressed: u64,
    closed: u64,
    pub(super) busy: u64,
}

impl Proxy {
    pub(super) fn new(policy: EgressPolicy, log: Box<dyn Fn(&str) + Send + Sync>) -> Proxy {
        Proxy {
            policy,
            log,
            limits: Limits::DEFAULT,
            resolver: Arc::new(system_resolver),
            clients: Mutex::default(),
            full: AtomicU64::new(0),
            #[cfg(test)]
            exempt: Vec::new(),
        }
    }

    /// The client table. A panic elsewhere while it was held leaves
    /// counts that are still counts: the table is used on.
    pub(super) fn clients(&self) -> MutexGuard<'_, HashMap<IpAddr, Client>> {
        self.clients.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `client`'s entry, made if it has none.
    pub(super) fn client<'a>(
        &self,
        table: &'a mut HashMap<IpAddr, Client>,
        client: IpAddr,
    ) -> &'a mut Client {
        table.entry(client).or_insert_with(|| Client {
            connections: 0,
            lookups: Arc::new(Semaphore::new(self.limits.client_lookups)),
            log_tokens: self.limits.log_burst,
            refilled: Instant::now(),
            suppressed: 0,
            closed: 0,
            busy: 0,
        })
    }

    /// Counts a connection of `client`, or `None` (counted as closed) if
    /// it has all it may hold.
    pub(super) fn admit(self: &Arc<Self>, client: IpAddr) -> Option<ClientSlot> {
        let mut table = self.clients();
        let entry = self.client(&mut table, client);
        if entry.connections >= self.limits.client_connections {
            entry.closed += 1;
            return None;
        }
        entry.connections += 1;
        Some(ClientSlot {
            proxy: Arc::clone(self),
            client,
        })
    }

    /// Prints an `egress-denied` line if `client` has a token left, or
    /// counts it for the next report.
    fn log_denial(&self, client: IpAddr, line: &str) {
        let allowed = {
            let mut table = self.clients();
            let entry = self.client(&mut table, client);
            self.refill(entry);
            if entry.log_tokens >= 1.0 {
                entry.log_tokens -= 1.0;
                true
            } else {
                entry.suppressed += 1;
                false
            }
        };
        if allowed {
            (self.log)(line);
        }
    }

    fn refill(&self, entry: &mut Client) {
        let now = Instant::now();
        let earned = now.duration_since(entry.refilled).as_secs_f64() * self.limits.log_per_second;
        entry.log_tokens = (entry.log_tokens + earned).min(self.limits.log_burst);
        entry.refilled = now;
    }

    /// Prints what was suppressed or turned away since the last report,
    /// and forgets the clients that have nothing left to count. A client
    /// is kept until its bucket is full again, so that closing every
    /// connection does not buy it a new one.
    pub(super) fn report(&self) {
        let mut denials = Vec::new();
        let mut turned_away = Vec::new();
        let full = self.full.swap(0, Ordering::Relaxed);
        if full > 0 {
            turned_away.push(format!(
                "{full} connections closed unserved: the proxy holds {} at most",
                self.limits.connections
            ));
        }
        {
            let mut table = self.clients();
            for (ip, entry) in table.iter_mut() {
                self.refill(entry);
                if entry.suppressed > 0 {
                    denials.push(format!(
                        "egress-denied-suppressed {ip} {}",
                        entry.suppressed
                    ));
                }
                if entry.closed > 0 {
                    turned_away.push(format!(
                        "{ip}: {} connections closed: it holds {} at most",
                        entry.closed, self.limits.client_connections
                    ));
                }
                if entry.busy > 0 {
                    turned_away.push(format!(
                        "{ip}: {} requests answered 503: it has {} name lookups under way at most",
                        entry.busy, self.limits.client_lookups
                    ));
                }
                (entry.suppressed, entry.closed, entry.busy) = (0, 0, 0);
            }
            table.retain(|_, entry| {
                entry.connections > 0
                    || entry.lookups.available_permits() < self.limits.client_lookups
                    || entry.log_tokens < self.limits.log_burst
            });
        }
        for line in denials {
            (self.log)(&line);
        }
        for line in turned_away {
            eprintln!("sandboxd-agent egress: {line}");
        }
    }

    /// The policy's verdict on an address a request would connect to.
    pub(super) fn check_addr(&self, ip: IpAddr, port: u16) -> Result<(), Denied> {
        #[cfg(test)]
        if self.exempt.contains(&SocketAddr::new(ip, port)) {
            return Ok(());
        }
        // Only tests' exemptions look at the port.
        let _ = port;
        self.policy.check_addr(ip, false)
    }
}

/// One of a client's connections, counted until dropped.
pub(super) struct ClientSlot {
    proxy: Arc<Proxy>,
    client: IpAddr,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        if let Some(entry) = self.proxy.clients().get_mut(&self.client) {
            entry.connections = entry.connections.saturating_sub(1);
        }
    }
}

/// What a connection holds while it, or a tunnel or origin connection it
/// led to, is open: its place in the proxy and in its client's count.
pub(super) struct Slot {
    pub(super) _proxy: OwnedSemaphorePermit,
    pub(super) _client: ClientSlot,
}

impl Proxy {
    /// The answer to a refused destination, and its `egress-denied` line.
    pub(super) fn refuse(
        &self,
        client: IpAddr,
        shown: &str,
        denied: Denied,
        resolved: Option<IpAddr>,
    ) -> Response<Body> {
        let dest = sanitise(shown);
        self.log_denial(
            client,
            &format!("egress-denied {client} {dest} {}", denied.reason),
        );
        let detail = resolved.map(|ip| format!(" ({ip})")).unwrap_or_default();
        let mut answer = text(
            StatusCode::FORBIDDEN,
            &format!(
                "sandboxd egress: {dest} refused: {}{detail}",
                denied.message()
            ),
        );
        answer.headers_mut().insert(
            HeaderName::from_static("x-sandboxd-egress"),
            HeaderValue::from_static("denied"),
        );
        answer
    }
}

#[cfg(test)]
mod tests {
    use sandboxd_proto::egress::EgressPolicy;

    use crate::egress::fixture::{ask_from, assert_refused, listen, proxy, until};

    #[tokio::test]
    async fn refusal_lines_are_rate_limited_per_client() {
        let (mut proxy, lines) = proxy(EgressPolicy::default());
        proxy.limits.log_burst = 5.0;
        proxy.limits.log_per_second = 0.001;
        let proxy = listen(proxy).await;
        for _ in 0..12 {
            let answer = ask_from(2, proxy, "CONNECT 10.0.0.1:80 HTTP/1.1\r\nhost: x").await;
            // Every refusal is still answered in full.
            assert_refused(
                &answer,
                "sandboxd egress: 10.0.0.1:80 refused: private address",
            );
        }
        ask_from(3, proxy, "CONNECT 10.0.0.1:80 HTTP/1.1\r\nhost: x").await;

        // The counts come a second at a time, in one line or more if a
        // report fell between two refusals, before or after the other
        // client's line.
        let suppressed = |lines: &[String]| -> u64 {
            lines
                .iter()
                .filter_map(|l| l.strip_prefix("egress-denied-suppressed 127.0.0.2 "))
                .map(|n| n.parse::<u64>().expect("a count"))
                .sum()
        };
        until("the count of suppressed lines", || {
            suppressed(&lines.lock().expect("lines")) == 7
        })
        .await;
        let lines = lines.lock().expect("lines").clone();
        let printed: Vec<&str> = lines
            .iter()
            .map(String::as_str)
            .filter(|l| !l.starts_with("egress-denied-suppressed 127.0.0.2 "))
            .collect();
        let mut expected = vec!["egress-denied 127.0.0.2 10.0.0.1:80 private"; 5];
        expected.push("egress-denied 127.0.0.3 10.0.0.1:80 private");
        assert_eq!(printed, expected);
        assert_eq!(suppressed(&lines), 7);
    }
}
