//! Joins two TCP sockets in the kernel: each direction moves its bytes
//! socket → pipe → socket with splice(2), so a tunnel's bytes never pass
//! through this process's memory and are not copied into it and out
//! again. The egress proxy's CONNECT tunnels (every HTTPS download a
//! sandbox makes) go through here: a copy loop through 8 KiB buffers ran
//! a 100 MB download at 0.25× a direct one (bench/RESULTS.md).
//!
//! Each direction holds one pipe (two descriptors, at most its 64 KiB of
//! capacity in flight, in the kernel) and reads from its socket only
//! once the pipe is empty, so a reader that stalls holds back its writer
//! by at most that much.

use std::io;

use rustix::net::Shutdown;
use rustix::pipe::{PipeFlags, SpliceFlags, pipe_with, splice};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// The most one splice moves: a pipe's default capacity on Linux.
const CHUNK: usize = 64 * 1024;

/// Moves bytes both ways between `a` and `b` until both ways have ended
/// (the end of one side's stream is passed on as a shutdown of the other
/// side's writing) or either fails. `moved` is called whenever bytes
/// have moved, either way.
pub(crate) async fn join(a: &TcpStream, b: &TcpStream, moved: &impl Fn()) -> io::Result<()> {
    tokio::try_join!(one_way(a, b, moved), one_way(b, a, moved))?;
    Ok(())
}

async fn one_way(from: &TcpStream, to: &TcpStream, moved: &impl Fn()) -> io::Result<()> {
    let (pipe_out, pipe_in) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
    loop {
        // The pipe is empty here, so a splice that would block is waiting
        // on the socket, never on the pipe: readiness stays truthful.
        let mut held = transfer(from, Interest::READABLE, |sock| {
            splice(sock, None, &pipe_in, None, CHUNK, flags())
        })
        .await?;
        if held == 0 {
            rustix::net::shutdown(to, Shutdown::Write)?;
            return Ok(());
        }
        moved();
        while held > 0 {
            let sent = transfer(to, Interest::WRITABLE, |sock| {
                splice(&pipe_out, None, sock, None, held, flags())
            })
            .await?;
            held -= sent;
            moved();
        }
    }
}

fn flags() -> SpliceFlags {
    SpliceFlags::MOVE | SpliceFlags::NONBLOCK
}

/// Runs `op` on `sock` once it is ready for `interest`, waiting again
/// whenever the socket turns out not to be.
async fn transfer(
    sock: &TcpStream,
    interest: Interest,
    op: impl Fn(&TcpStream) -> rustix::io::Result<usize>,
) -> io::Result<usize> {
    loop {
        sock.ready(interest).await?;
        match sock.try_io(interest, || op(sock).map_err(io::Error::from)) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            done => return done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (a, b) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (a.expect("connect"), b.expect("accept").0)
    }

    /// client ⇄ (a | b) ⇄ server: 8 MiB each way, then each side's end
    /// of stream passed on, and `moved` called.
    #[tokio::test]
    async fn bytes_and_ends_pass_both_ways() {
        let (mut client, a) = pair().await;
        let (b, mut server) = pair().await;
        let calls = Cell::new(0u64);
        let moved = || calls.set(calls.get() + 1);
        let data: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 251) as u8).collect();
        let joined = join(&a, &b, &moved);
        let ends = async {
            let (mut cr, mut cw) = client.split();
            let (mut sr, mut sw) = server.split();
            let up = async {
                cw.write_all(&data).await.expect("client write");
                cw.shutdown().await.expect("client shutdown");
            };
            let down = async {
                sw.write_all(&data).await.expect("server write");
                sw.shutdown().await.expect("server shutdown");
            };
            let (mut at_server, mut at_client) = (Vec::new(), Vec::new());
            let read_s = sr.read_to_end(&mut at_server);
            let read_c = cr.read_to_end(&mut at_client);
            let (_, _, s, c) = tokio::join!(up, down, read_s, read_c);
            s.expect("server read");
            c.expect("client read");
            (at_server, at_client)
        };
        let (joined, (at_server, at_client)) = tokio::join!(joined, ends);
        joined.expect("join");
        assert!(at_server == data, "client to server bytes differ");
        assert!(at_client == data, "server to client bytes differ");
        assert!(calls.get() >= 2);
    }
}
