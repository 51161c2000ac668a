//! `sandboxd healthcheck`: asks the configured address for `/v1/health` and
//! turns the answer into an exit code, for container health checks (no curl
//! needed in the image).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::config::Config;

/// How long the whole check may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Ok(line) when sandboxd answers ok:true; Err(line) otherwise. Each is the
/// one line to print.
pub async fn check(config: &Config) -> Result<String, String> {
    // A wildcard bind is reachable on loopback.
    let host = if config.bind_host.is_unspecified() {
        match config.bind_host {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        }
    } else {
        config.bind_host
    };
    let addr = SocketAddr::new(host, config.port);
    match tokio::time::timeout(TIMEOUT, ask(addr)).await {
        Ok(Ok((200, body))) => Ok(format!("ok: {addr} {}", body.trim())),
        Ok(Ok((status, body))) => Err(format!(
            "unhealthy: {addr} answered {status} {}",
            body.trim()
        )),
        Ok(Err(e)) => Err(format!("unhealthy: {addr}: {e}")),
        Err(_) => Err(format!(
            "unhealthy: {addr} did not answer within {} s",
            TIMEOUT.as_secs()
        )),
    }
}

async fn ask(addr: SocketAddr) -> std::io::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET /v1/health HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.take(64 * 1024).read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("not an HTTP answer"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}
