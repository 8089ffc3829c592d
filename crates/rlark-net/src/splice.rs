//! Zero-copy forwarding between two kernel TCP sockets with `splice(2)`: kernel mode's
//! local path (a redirected connection to a member on this agent) and egress path. Each
//! direction moves bytes socket → pipe → socket inside the kernel, so the agent never
//! copies them to user space (`tokio::io::copy_bidirectional` reads every byte into a
//! buffer of ours and writes it back). `rlark bench net`'s "rlark local (kernel)" row
//! measures it (docs/benchmarks.md).
//!
//! Like `copy_bidirectional`: both directions run until each has seen end of file and
//! passed it on as a half-close (`shutdown(SHUT_WR)`), or until the first error, which
//! ends both. Every byte is reported to `on_bytes` as it reaches the other socket.
//!
//! One subtlety of `splice` with `SPLICE_F_NONBLOCK`: `EAGAIN` from socket → pipe can be
//! the socket's (nothing to read) or the pipe's (out of slots: a pipe holds 16 buffers,
//! whatever their size). Only the socket's may clear the socket's readiness, or a waiting
//! byte would never be read again. So a read into an empty pipe (which cannot be out of
//! slots) goes through tokio's readiness; a read into a non-empty pipe does not, and its
//! `EAGAIN` just means "drain first".

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::pipe::{PipeFlags, SpliceFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Bytes asked of one `splice` call, and the most one direction holds in its pipe (a
/// default pipe's 16 page-sized buffers).
const PIPE_BYTES: usize = 64 * 1024;

/// Which way bytes moved, for [`bidirectional`]'s `on_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the first socket to the second.
    AToB,
    /// From the second socket to the first.
    BToA,
}

/// One direction's pipe.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    fn new() -> io::Result<Pipe> {
        let (read, write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
        Ok(Pipe { read, write })
    }
}

fn splice(from: impl AsFd, to: impl AsFd, len: usize) -> io::Result<usize> {
    rustix::pipe::splice(
        from,
        None,
        to,
        None,
        len,
        SpliceFlags::MOVE | SpliceFlags::NONBLOCK,
    )
    .map_err(io::Error::from)
}

/// Moves bytes between `a` and `b` both ways until both directions are finished; returns
/// the bytes moved (a → b, b → a) or the first error.
pub async fn bidirectional(
    a: &TcpStream,
    b: &TcpStream,
    on_bytes: impl Fn(Direction, u64),
) -> io::Result<(u64, u64)> {
    let (up, down) = (Pipe::new()?, Pipe::new()?);
    tokio::try_join!(
        pump(a, b, &up, |n| on_bytes(Direction::AToB, n)),
        pump(b, a, &down, |n| on_bytes(Direction::BToA, n)),
    )
}

/// One direction: `from` → `pipe` → `to`, then a half-close of `to`.
async fn pump(
    from: &TcpStream,
    to: &TcpStream,
    pipe: &Pipe,
    on_bytes: impl Fn(u64),
) -> io::Result<u64> {
    let mut in_pipe = 0usize;
    let mut total = 0u64;
    let mut eof = false;
    loop {
        let mut moved = false;
        if !eof && in_pipe < PIPE_BYTES {
            let room = PIPE_BYTES - in_pipe;
            let read = if in_pipe == 0 {
                from.try_io(Interest::READABLE, || splice(from, &pipe.write, room))
            } else {
                splice(from, &pipe.write, room)
            };
            match read {
                Ok(0) => eof = true,
                Ok(n) => {
                    in_pipe += n;
                    moved = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        if in_pipe > 0 {
            match to.try_io(Interest::WRITABLE, || splice(&pipe.read, to, in_pipe)) {
                Ok(n) => {
                    in_pipe -= n;
                    total += n as u64;
                    on_bytes(n as u64);
                    moved = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        if eof && in_pipe == 0 {
            rustix::net::shutdown(to, rustix::net::Shutdown::Write).map_err(io::Error::from)?;
            return Ok(total);
        }
        if moved {
            continue;
        }
        if in_pipe > 0 {
            // The write found `to` full (its readiness is cleared): wait for room. What
            // waits in the pipe goes first.
            to.writable().await?;
        } else {
            // The read into the empty pipe found nothing (readiness cleared).
            from.readable().await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// Two connected sockets.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    #[tokio::test]
    async fn bytes_move_both_ways_with_half_close_and_are_counted() {
        // left <-> (a | b) <-> right: the agent splices a and b.
        let (mut left, a) = pair().await;
        let (b, mut right) = pair().await;
        let counted = Mutex::new((0u64, 0u64));
        let forward = bidirectional(&a, &b, |direction, n| {
            let mut counted = counted.lock().unwrap();
            match direction {
                Direction::AToB => counted.0 += n,
                Direction::BToA => counted.1 += n,
            }
        });
        // 8 MiB one way (far more than a pipe holds), 1 MiB back, then each side closes.
        let upload: Vec<u8> = (0..8 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
        let download: Vec<u8> = (0..1024 * 1024).map(|i| (i % 241) as u8).collect();
        let ends = async {
            let send_up = async {
                left.write_all(&upload).await.unwrap();
                left.shutdown().await.unwrap();
                let mut got = Vec::new();
                left.read_to_end(&mut got).await.unwrap();
                got
            };
            let send_down = async {
                let mut got = Vec::new();
                // Reads everything up to the half-close that crossed the splice.
                right.read_to_end(&mut got).await.unwrap();
                right.write_all(&download).await.unwrap();
                right.shutdown().await.unwrap();
                got
            };
            tokio::join!(send_up, send_down)
        };
        let (moved, (at_left, at_right)) = tokio::join!(forward, ends);
        let moved = moved.unwrap();
        assert_eq!(at_right, upload);
        assert_eq!(at_left, download);
        assert_eq!(moved, (upload.len() as u64, download.len() as u64));
        assert_eq!(*counted.lock().unwrap(), moved);
    }

    #[tokio::test]
    async fn many_small_writes_are_not_stranded_in_a_full_pipe() {
        // Each write is its own segment (nodelay, a pause between): the pipe's slots fill
        // before its bytes do; every byte must still arrive.
        let (mut left, a) = pair().await;
        let (b, mut right) = pair().await;
        left.set_nodelay(true).unwrap();
        let forward = bidirectional(&a, &b, |_, _| {});
        let writes = async {
            for i in 0..200u32 {
                left.write_all(&i.to_be_bytes()).await.unwrap();
                if i % 20 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            left.shutdown().await.unwrap();
        };
        let reads = async {
            let mut got = Vec::new();
            right.read_to_end(&mut got).await.unwrap();
            right.shutdown().await.unwrap();
            got
        };
        let (moved, (), got) = tokio::join!(forward, writes, reads);
        let want: Vec<u8> = (0..200u32).flat_map(u32::to_be_bytes).collect();
        assert_eq!(got, want);
        assert_eq!(moved.unwrap(), (800, 0));
    }

    #[tokio::test]
    async fn a_reset_ends_both_directions_with_the_error() {
        let (left, a) = pair().await;
        let (b, _right) = pair().await;
        // SO_LINGER 0: closing sends RST instead of FIN.
        rustix::net::sockopt::set_socket_linger(&left, Some(std::time::Duration::ZERO)).unwrap();
        drop(left);
        let error = bidirectional(&a, &b, |_, _| {}).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionReset, "{error}");
    }
}
