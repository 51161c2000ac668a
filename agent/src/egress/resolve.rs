//! From a destination to a connection: the policy's verdict on it, a
//! name resolved once on a lookup thread under one of its client's lookup
//! permits, every address it resolves to checked, and the connection made
//! to an address that was checked; or the answer to give instead.

use std::net::IpAddr;
use std::sync::Arc;

use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::answer::{Body, failed};
use super::dest::{Dest, Host};
use super::proxy::Proxy;

/// Checks `dest` against the policy, resolving a name, and connects to
/// an address that passed; or the answer to give instead.
pub(super) async fn open(
    dest: &Dest,
    client: IpAddr,
    proxy: &Proxy,
) -> Result<TcpStream, Response<Body>> {
    let shown = dest.to_string();
    let mut addrs = match &dest.host {
        Host::Ip(ip) => {
            proxy
                .check_addr(*ip, dest.port)
                .map_err(|denied| proxy.refuse(client, &shown, denied, None))?;
            vec![ip.to_canonical()]
        }
        Host::Name(name) => {
            let check = proxy
                .policy
                .check_name(name)
                .map_err(|denied| proxy.refuse(client, &shown, denied, None))?;
            let addrs = resolve(proxy, client, name, dest.port, &shown).await?;
            proxy
                .policy
                .check_resolved(check, &addrs)
                .map_err(|(ip, denied)| proxy.refuse(client, &shown, denied, Some(ip)))?;
            addrs
        }
    };
    // IPv4 first: the egress container has no IPv6 route.
    addrs.sort_by_key(IpAddr::is_ipv6);
    let attempt = async {
        let mut last = std::io::Error::other("no address");
        for ip in addrs {
            match TcpStream::connect((ip, dest.port)).await {
                Ok(stream) => return Ok(stream),
                Err(e) => last = e,
            }
        }
        Err(last)
    };
    let limit = proxy.limits.connect_timeout;
    match tokio::time::timeout(limit, attempt).await {
        Ok(Ok(stream)) => {
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
        Ok(Err(e)) => Err(failed(
            StatusCode::BAD_GATEWAY,
            &shown,
            &format!("cannot connect: {e}"),
        )),
        Err(_) => Err(failed(
            StatusCode::GATEWAY_TIMEOUT,
            &shown,
            &format!("no connection within {} s", limit.as_secs()),
        )),
    }
}

/// Every address `name` resolves to, each once, in the resolver's order.
/// The lookup runs on a lookup thread under one of `client`'s lookup
/// permits, held until the resolver returns: a lookup the request gave up
/// on still counts while it blocks a thread.
async fn resolve(
    proxy: &Proxy,
    client: IpAddr,
    name: &str,
    port: u16,
    shown: &str,
) -> Result<Vec<IpAddr>, Response<Body>> {
    let lookups = {
        let mut table = proxy.clients();
        Arc::clone(&proxy.client(&mut table, client).lookups)
    };
    let permit = match tokio::time::timeout(proxy.limits.lookup_wait, lookups.acquire_owned()).await
    {
        Ok(Ok(permit)) => permit,
        // Err(_) inside: the semaphore was closed, which nothing does.
        Ok(Err(_)) | Err(_) => {
            if let Some(entry) = proxy.clients().get_mut(&client) {
                entry.busy += 1;
            }
            let mut answer = failed(
                StatusCode::SERVICE_UNAVAILABLE,
                shown,
                &format!(
                    "not looked up: this sandbox has {} name lookups under way already; try again",
                    proxy.limits.client_lookups
                ),
            );
            answer
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return Err(answer);
        }
    };
    let limit = proxy.limits.lookup_timeout;
    let deadline = Instant::now() + limit;
    let resolver = Arc::clone(&proxy.resolver);
    let owned = name.to_owned();
    let lookup = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        // Queued behind busy threads until after the request gave up:
        // nobody waits for the answer any more.
        if Instant::now() >= deadline {
            return Ok(Vec::new());
        }
        resolver(&owned, port)
    });
    let found = match tokio::time::timeout_at(deadline, lookup).await {
        Ok(Ok(Ok(found))) => found,
        Ok(Ok(Err(e))) => {
            return Err(failed(
                StatusCode::BAD_GATEWAY,
                shown,
                &format!("does not resolve: {e}"),
            ));
        }
        Ok(Err(_)) => {
            return Err(failed(
                StatusCode::BAD_GATEWAY,
                shown,
                "does not resolve: the lookup failed",
            ));
        }
        Err(_) => {
            return Err(failed(
                StatusCode::GATEWAY_TIMEOUT,
                shown,
                &format!("no answer from DNS within {} s", limit.as_secs()),
            ));
        }
    };
    let mut addrs: Vec<IpAddr> = Vec::new();
    for ip in found.into_iter().map(|ip| ip.to_canonical()) {
        if !addrs.contains(&ip) {
            addrs.push(ip);
        }
    }
    if addrs.is_empty() {
        return Err(failed(
            StatusCode::BAD_GATEWAY,
            shown,
            "does not resolve: no address",
        ));
    }
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use sandboxd_proto::egress::{Allowlist, EgressPolicy};
    use tokio::io::AsyncWriteExt;

    use super::*;
    use crate::egress::fixture::{
        ask, ask_from, assert_refused, connect_from, listen, proxy, read_answer, start, until,
    };
    use crate::egress::limits::CLIENT_LOOKUPS;
    use crate::egress::proxy::Resolver;

    #[tokio::test]
    async fn loopback_in_every_form_is_refused_and_logged() {
        let (proxy, lines) = start(EgressPolicy::default()).await;
        let port = proxy.port();

        let answer = ask(
            proxy,
            &format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nhost: 127.0.0.1:{port}"),
        )
        .await;
        assert_refused(
            &answer,
            &format!("sandboxd egress: 127.0.0.1:{port} refused: loopback address"),
        );

        let answer = ask(
            proxy,
            &format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\nhost: x"),
        )
        .await;
        assert_refused(
            &answer,
            &format!("sandboxd egress: 127.0.0.1:{port} refused: loopback address"),
        );

        let answer = ask(proxy, "GET http://[::1]:80/ HTTP/1.1\r\nhost: [::1]").await;
        assert_refused(
            &answer,
            "sandboxd egress: [::1]:80 refused: loopback address",
        );

        let answer = ask(
            proxy,
            "GET http://[::ffff:127.0.0.1]/x?y HTTP/1.1\r\nhost: x",
        )
        .await;
        assert_refused(
            &answer,
            "sandboxd egress: [::ffff:127.0.0.1]:80 refused: loopback address",
        );

        let answer = ask(
            proxy,
            "CONNECT [::ffff:169.254.169.254]:80 HTTP/1.1\r\nhost: x",
        )
        .await;
        assert_refused(
            &answer,
            "sandboxd egress: [::ffff:169.254.169.254]:80 refused: link-local address",
        );

        // A name is judged by what it resolves to (localhost: /etc/hosts).
        let answer = ask(
            proxy,
            &format!("GET http://localhost:{port}/ HTTP/1.1\r\nhost: x"),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
        assert!(
            answer.contains(&format!(
                "sandboxd egress: localhost:{port} refused: loopback address ("
            )),
            "{answer}"
        );

        let lines = lines.lock().expect("lines").clone();
        assert_eq!(
            lines,
            [
                format!("egress-denied 127.0.0.1 127.0.0.1:{port} loopback"),
                format!("egress-denied 127.0.0.1 127.0.0.1:{port} loopback"),
                "egress-denied 127.0.0.1 [::1]:80 loopback".to_owned(),
                "egress-denied 127.0.0.1 [::ffff:127.0.0.1]:80 loopback".to_owned(),
                "egress-denied 127.0.0.1 [::ffff:169.254.169.254]:80 link-local".to_owned(),
                format!("egress-denied 127.0.0.1 localhost:{port} loopback"),
            ]
        );
    }

    #[tokio::test]
    async fn an_allowlist_refuses_unlisted_names_before_any_lookup() {
        let policy = EgressPolicy {
            allowlist: Some(Allowlist::default()),
            deny: Vec::new(),
        };
        let (proxy, lines) = start(policy).await;
        let answer = ask(proxy, "CONNECT pypi.org:443 HTTP/1.1\r\nhost: pypi.org:443").await;
        assert_refused(
            &answer,
            "sandboxd egress: pypi.org:443 refused: not on the sandbox's allowlist",
        );
        assert_eq!(
            *lines.lock().expect("lines"),
            ["egress-denied 127.0.0.1 pypi.org:443 not-allowlisted"]
        );
    }

    /// A resolver whose `slow.test` blocks until the gate opens, counting
    /// the lookups that entered it; every name resolves to 127.0.0.1.
    #[derive(Clone, Default)]
    struct Gate {
        state: Arc<(Mutex<(bool, usize)>, std::sync::Condvar)>,
    }

    impl Gate {
        fn resolver(&self) -> Arc<Resolver> {
            let gate = self.clone();
            Arc::new(move |name: &str, _port: u16| {
                if name == "slow.test" {
                    let (lock, opened) = &*gate.state;
                    let mut state = lock.lock().expect("gate");
                    state.1 += 1;
                    while !state.0 {
                        state = opened.wait(state).expect("gate");
                    }
                }
                Ok(vec![IpAddr::from([127, 0, 0, 1])])
            })
        }

        fn entered(&self) -> usize {
            self.state.0.lock().expect("gate").1
        }

        fn open(&self) {
            self.state.0.lock().expect("gate").0 = true;
            self.state.1.notify_all();
        }
    }

    /// A failed test does not leave lookup threads blocked forever (the
    /// runtime waits for them when it is dropped).
    impl Drop for Gate {
        fn drop(&mut self) {
            if Arc::strong_count(&self.state) == 1 {
                return;
            }
            if let Ok(mut state) = self.state.0.lock() {
                state.0 = true;
            }
            self.state.1.notify_all();
        }
    }

    #[tokio::test]
    async fn one_client_cannot_hold_every_lookup() {
        let gate = Gate::default();
        let (mut proxy, lines) = proxy(EgressPolicy::default());
        proxy.resolver = gate.resolver();
        proxy.limits.lookup_wait = Duration::from_millis(200);
        let proxy = listen(proxy).await;
        let head = b"CONNECT slow.test:443 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";

        let mut waiting = Vec::new();
        for _ in 0..CLIENT_LOOKUPS {
            let mut conn = connect_from(2, proxy).await;
            conn.write_all(head).await.expect("write");
            waiting.push(conn);
        }
        until("the client's lookups to start", || {
            gate.entered() == CLIENT_LOOKUPS
        })
        .await;

        // One more from the same client waits, then is turned away.
        let answer = ask_from(2, proxy, "CONNECT slow.test:443 HTTP/1.1\r\nhost: x").await;
        assert!(
            answer.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{answer}"
        );
        assert!(answer.contains("\r\nretry-after: 1\r\n"), "{answer}");
        assert!(
            answer.ends_with(
                "sandboxd egress: slow.test:443 not looked up: this sandbox has 8 name \
                 lookups under way already; try again\n"
            ),
            "{answer}"
        );
        assert_eq!(gate.entered(), CLIENT_LOOKUPS);

        // Another client's lookup starts at once.
        let mut other = connect_from(3, proxy).await;
        other.write_all(head).await.expect("write");
        until("the other client's lookup to start", || {
            gate.entered() == CLIENT_LOOKUPS + 1
        })
        .await;

        // The lookups end; the answers (127.0.0.1) are judged as usual.
        gate.open();
        for conn in waiting.iter_mut().chain([&mut other]) {
            let answer = read_answer(conn).await;
            assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
        }
        let lines = lines.lock().expect("lines");
        assert_eq!(lines.len(), CLIENT_LOOKUPS + 1, "{lines:?}");
    }
}
