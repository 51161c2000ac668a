//! The numbers the proxy works to, each with why it is what it is: caps
//! on connections and lookups (for the whole proxy and per client), the
//! buffers of a connection, the timeouts, and the budget of
//! `egress-denied` lines; gathered in [`Limits`], which tests shorten.

use std::time::Duration;

/// Connections served at once, tunnels included; beyond, new ones are
/// closed at once rather than queued behind a flood. Sized against the
/// container's 384 MiB. A forwarded request whose reader stalls holds, on
/// its client's connection, [`HEAD_BUFFER`] read and as much queued to
/// write, and on the origin's [`ORIGIN_BUFFER`] read: with 16 KiB on both
/// sides 81 KiB of resident memory each was measured (with hyper's default
/// buffers it was 1 MiB, and the 4096 connections allowed before could ask
/// for 4 GiB); the origin's larger buffer adds about 48 KiB, 129 KiB in
/// all. A tunnel's bytes go through the kernel (`splice.rs`): a stalled
/// one holds no buffer here, and at most a pipe's 64 KiB each way there,
/// 128 KiB. 2048 × 129 KiB is 258 MiB at worst, which leaves 126 MiB for the
/// process itself (a few MiB) and for the kernel's socket buffers, which
/// the container is charged for and which the kernel stops growing as the
/// container nears its limit. Each connection holds two descriptors, the
/// client's and the destination's: 4096, half the container's nofile
/// limit of 8192, the rest ample for the lookups' sockets and the
/// listener.
const MAX_CONNECTIONS: usize = 2048;
/// Connections one client may hold at once: a package manager's parallel
/// downloads use tens; 16 clients at their cap fill the proxy, so one
/// sandbox alone cannot. Past it a new connection is closed at once, as
/// past [`MAX_CONNECTIONS`], rather than answered 429: answering means
/// reading its request first, the work a flood should not get.
pub(super) const CLIENT_CONNECTIONS: usize = 128;
/// Name lookups one client may have under way at once: an eighth of
/// [`LOOKUP_THREADS`], so one sandbox resolving slow names cannot hold
/// every lookup thread. A lookup counts until getaddrinfo returns, even
/// after its request gave up waiting for it.
pub(super) const CLIENT_LOOKUPS: usize = 8;
/// How long a lookup past [`CLIENT_LOOKUPS`] waits for one of its client's
/// to finish before it is answered 503.
const LOOKUP_WAIT: Duration = Duration::from_secs(2);
/// The most a client's connection buffers: a request head must fit (hyper
/// answers 431 past it). Request bodies stream through in pieces of at
/// most this.
pub(super) const HEAD_BUFFER: usize = 16 * 1024;
/// The most the origin's side of a forwarded request buffers: its
/// response head must fit (502 past it; nginx's default for a proxied
/// head is 4 or 8 KiB) and its body comes through in pieces of at most
/// this. Pieces of [`HEAD_BUFFER`] halved a 100 MB download's speed
/// (bench/: 0.36× a direct download, 0.62× with this).
pub(super) const ORIGIN_BUFFER: usize = 64 * 1024;
/// Longest a client may take to send a request's head, or to start the
/// next one on a kept-alive connection.
pub(super) const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a name lookup may take (the resolver retries on its own).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest connecting to a destination may take, all its addresses together.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest an origin may stay silent before its response head, counted
/// from the last byte of the request it was sent: 504 after. Counting
/// from the last byte lets a long upload through.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);
/// A tunnel or forwarded exchange that moves no byte either way for this
/// long is closed, and its slot freed. Clients already live with
/// middleboxes that drop silent connections after 4 to 6 minutes (cloud
/// NAT gateways and load balancers), so this breaks nothing new.
const IDLE_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// Threads for name lookups (getaddrinfo blocks): enough for bursts, and
/// with the serving thread and the engine's init 66 of the container's
/// 128 pids.
pub(super) const LOOKUP_THREADS: usize = 64;
/// `egress-denied` lines a client may print in a burst, and then each
/// second: enough for a person to see every refusal, too few for one
/// sandbox to flood sandboxd's log or the container's.
const LOG_BURST: f64 = 20.0;
const LOG_PER_SECOND: f64 = 10.0;
/// How often the counts of what was suppressed or turned away are printed.
pub(super) const REPORT_EVERY: Duration = Duration::from_secs(1);

/// The numbers a proxy works to: the constants above, shorter in tests.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub(super) connections: usize,
    pub(super) client_connections: usize,
    pub(super) client_lookups: usize,
    pub(super) lookup_wait: Duration,
    pub(super) lookup_timeout: Duration,
    pub(super) connect_timeout: Duration,
    pub(super) response_timeout: Duration,
    pub(super) idle_timeout: Duration,
    pub(super) log_burst: f64,
    pub(super) log_per_second: f64,
}

impl Limits {
    pub(super) const DEFAULT: Limits = Limits {
        connections: MAX_CONNECTIONS,
        client_connections: CLIENT_CONNECTIONS,
        client_lookups: CLIENT_LOOKUPS,
        lookup_wait: LOOKUP_WAIT,
        lookup_timeout: LOOKUP_TIMEOUT,
        connect_timeout: CONNECT_TIMEOUT,
        response_timeout: RESPONSE_TIMEOUT,
        idle_timeout: IDLE_TIMEOUT,
        log_burst: LOG_BURST,
        log_per_second: LOG_PER_SECOND,
    };
}
