//! `sandboxd-agent egress --listen <port> [policy]`: the HTTP proxy that is
//! a sandbox's only way out. Sandboxes sit on internal networks with no
//! route out; an egress container on those networks runs this role, and
//! every command in a sandbox gets `HTTP_PROXY`/`HTTPS_PROXY` pointing at
//! it. The policy (`sandboxd_proto::egress`) arrives on the command line.
//!
//! Two kinds of request are proxied, each checked against the policy
//! before any byte reaches the destination:
//! - `CONNECT host:port`: a tunnel (HTTPS and anything else over TCP),
//!   its bytes moved in the kernel (`splice.rs`);
//! - absolute-form `http://` requests: forwarded as origin-form HTTP/1.1,
//!   bodies streamed both ways.
//!
//! A name is resolved once, every address it resolves to is checked (one
//! refused address refuses the name), and the connection goes to an
//! address that was checked, so a second answer from DNS cannot swap in
//! another. A refusal is answered `403` with a one-line reason and
//! printed as one `egress-denied` line on stdout, which sandboxd follows.
//! Hyper parses all HTTP.
//!
//! One proxy serves many sandboxes, each from its own link network, so a
//! client's address names its sandbox, and no one sandbox may take the
//! proxy from the others: each client address has its own caps on
//! connections and name lookups at once, and its own budget of
//! `egress-denied` lines (past it they are counted, and stdout gets one
//! `egress-denied-suppressed <client> <count>` line a second instead,
//! which sandboxd's parser skips); request heads are bounded, and a
//! tunnel or forwarded exchange with no byte either way for a while is
//! closed. What was turned away for a cap is counted and goes to stderr
//! once a second at most. The global numbers are sized against the
//! container's limits (`src/engine/container_spec.rs`): see
//! [`MAX_CONNECTIONS`](limits::MAX_CONNECTIONS) and [`LOOKUP_THREADS`].
//!
//! One thread serves every connection (the work is waiting on sockets),
//! plus a few for name lookups, which block.
//!
//! The parts, each using only those listed before it: [`limits`] (the
//! numbers it works to), [`answer`] (its own plain-text answers),
//! [`dest`] (where a request wants to go), [`activity`] (when a byte last
//! went through), [`proxy`] (what every connection shares: the policy and
//! each client's counts), [`resolve`] (checking a destination, resolving
//! it and connecting), [`tunnel`] (`CONNECT`), [`forward`] (`http://`
//! requests) and [`connection`] (accepting and serving connections); the
//! command line is here.

mod activity;
mod answer;
mod connection;
mod dest;
mod forward;
mod limits;
mod proxy;
mod resolve;
mod tunnel;

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use sandboxd_proto::egress::EgressPolicy;
use tokio::net::{TcpListener, TcpSocket};
use tokio::signal::unix::{SignalKind, signal};

use connection::serve;
use limits::LOOKUP_THREADS;
use proxy::Proxy;

#[cfg(test)]
mod fixture;

const USAGE: &str = "usage: sandboxd-agent egress --listen <port> [--deny CIDR]... \
                     [--allowlist] [--allow-domain PATTERN]... [--allow-cidr CIDR]...";

/// `sandboxd-agent egress`.
pub(crate) fn run() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(2).collect();
    let (port, policy) = match parse_args(&args) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("sandboxd-agent egress: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(LOOKUP_THREADS)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandboxd-agent egress: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async {
        let listener = match bind(port) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("sandboxd-agent egress: cannot listen on port {port}: {e}");
                return ExitCode::FAILURE;
            }
        };
        // PID 1 of its container: without handlers SIGTERM would be
        // ignored and every stop would wait for the engine's SIGKILL.
        let (mut term, mut int) = match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(t), Ok(i)) => (t, i),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("sandboxd-agent egress: signals: {e}");
                return ExitCode::FAILURE;
            }
        };
        let proxy = Arc::new(Proxy::new(policy, Box::new(print_line)));
        // sandboxd waits for this line before it counts the proxy started.
        eprintln!("egress listening on port {port}");
        tokio::select! {
            () = serve(listener, proxy) => ExitCode::FAILURE,
            _ = term.recv() => ExitCode::SUCCESS,
            _ = int.recv() => ExitCode::SUCCESS,
        }
    });
    // Lookups still blocking in getaddrinfo are not waited for.
    runtime.shutdown_background();
    code
}

/// `--listen <port>` first, then the policy's own arguments.
fn parse_args(args: &[String]) -> Result<(u16, EgressPolicy), String> {
    let [flag, port, policy @ ..] = args else {
        return Err("--listen <port> comes first".into());
    };
    if flag != "--listen" {
        return Err(format!("--listen <port> comes first, not {flag:?}"));
    }
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("{port:?} is not a port"))?;
    Ok((port, EgressPolicy::from_args(policy)?))
}

fn bind(port: u16) -> std::io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(SocketAddr::from(([0, 0, 0, 0], port)))?;
    socket.listen(1024)
}

/// Writes one line to stdout at once: sandboxd reads it as it comes.
fn print_line(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use sandboxd_proto::egress::Cidr;

    use super::*;

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arguments_name_the_port_then_the_policy() {
        let (port, policy) = parse_args(&strings(&["--listen", "3128"])).expect("args");
        assert_eq!((port, policy), (3128, EgressPolicy::default()));
        let (_, policy) = parse_args(&strings(&[
            "--listen",
            "3128",
            "--deny",
            "203.0.113.0/24",
            "--allow-domain",
            "pypi.org",
        ]))
        .expect("args");
        assert_eq!(
            policy.deny,
            vec![Cidr::parse("203.0.113.0/24").expect("cidr")]
        );
        assert!(policy.allowlist.is_some());
        for bad in [
            &[][..],
            &["--listen"],
            &["--listen", "0"],
            &["--listen", "65536"],
            &["--listen", "x"],
            &["--deny", "10.0.0.0/8", "--listen", "3128"],
            &["--listen", "3128", "--allow-domain", "*"],
        ] {
            assert!(parse_args(&strings(bad)).is_err(), "{bad:?}");
        }
    }
}
