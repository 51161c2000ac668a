//! `sandboxd-agent bridge`: joins its standard input and output to the
//! agent's socket. sandboxd starts one with one exec per connection: the
//! engine carries the bytes, and when sandboxd goes away the exec's input
//! closes, the bridge exits and the agent sees the connection end (no half
//! frame is left in a stream someone else will read).

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::process::ExitCode;

use crate::transport::{PIPE_BYTES, socket_name};

/// Copies until either side closes.
pub(crate) fn run() -> ExitCode {
    let stream = SocketAddr::from_abstract_name(socket_name())
        .and_then(|addr| UnixStream::connect_addr(&addr));
    let stream = match stream {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sandboxd-agent bridge: the agent does not answer: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Larger pipes to and from the engine: a whole piece of a file fits,
    // so neither side waits on the other every 64 KiB. Best effort (the
    // pipes may be something else, the size capped).
    for fd in [rustix::stdio::stdin(), rustix::stdio::stdout()] {
        let _ = rustix::pipe::fcntl_setpipe_size(fd, PIPE_BYTES);
    }
    let Ok(mut upstream) = stream.try_clone() else {
        return ExitCode::FAILURE;
    };
    // sandboxd -> agent on a thread; agent -> sandboxd here. The process
    // ends when the agent closes, or when sandboxd's side does.
    let spawned = std::thread::Builder::new().spawn(move || {
        let _ = copy(&mut std::io::stdin().lock(), &mut upstream);
        let _ = upstream.shutdown(Shutdown::Write);
        // sandboxd is gone: nobody reads what the agent still sends.
        std::process::exit(0);
    });
    if spawned.is_err() {
        return ExitCode::FAILURE;
    }
    let mut downstream = stream;
    let _ = copy(&mut downstream, &mut std::io::stdout().lock());
    ExitCode::SUCCESS
}

fn copy(from: &mut impl Read, to: &mut impl Write) -> std::io::Result<()> {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        to.write_all(&buf[..n])?;
        to.flush()?;
    }
}
