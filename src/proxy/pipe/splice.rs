//! Bulk on the copy path: bytes moved from socket to socket through a pipe with `splice(2)`.
//!
//! A read and a write copy every byte twice (the source's socket buffer into the proxy, the
//! proxy into the destination's). Spliced into a pipe and out again, the kernel moves
//! references to the received pages instead, and the bytes never enter the proxy. That matters
//! only for bulk: a 100-byte message costs two calls either way. So a direction starts with
//! reads and writes and takes a pipe only once a read fills the whole read buffer; it goes back
//! to reads when the pipe's fills turn small again, keeping the pipe for next time.

use std::io;
use std::os::fd::OwnedFd;

use bytes::{Bytes, BytesMut};
use nix::fcntl::{fcntl, splice, FcntlArg, OFlag, SpliceFFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;

use super::socket::READ_CHUNK;

/// The pipe's capacity asked for: 256 pages. Each received packet's pages take a slot, and a
/// bigger pipe moves more of a bulk stream per pair of calls; the default 16 slots capped one
/// fill at 64 KiB. Linux allows up to `fs.pipe-max-size` (1 MiB by default) unprivileged.
const PIPE_SIZE: usize = 1 << 20;

/// A fill smaller than this ends a bulk spell: the stream is back to messages, which reads and
/// writes move as cheaply and with fewer calls (a spliced fill cannot tell "the socket is
/// empty" from "the pipe is full", so it needs one more call to find the socket empty).
pub(super) const BULK_FILL: usize = READ_CHUNK / 4;

/// One direction's pipe, and how much of the stream it holds.
pub(super) struct Spliced {
    read: OwnedFd,
    write: OwnedFd,
    /// Most one fill may move: the pipe's capacity.
    capacity: usize,
    /// Read from the source, not yet written to the destination.
    held: usize,
}

impl Spliced {
    /// A non-blocking pipe, as big as [`PIPE_SIZE`] or as the system allows.
    pub(super) fn new() -> io::Result<Spliced> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        // Refused past the limits (fs.pipe-max-size, fs.pipe-user-pages-*): the pipe keeps its
        // default size, which only costs more calls.
        let _ = fcntl(&write, FcntlArg::F_SETPIPE_SZ(PIPE_SIZE as i32));
        let capacity = fcntl(&write, FcntlArg::F_GETPIPE_SZ)? as usize;
        Ok(Spliced {
            read,
            write,
            capacity,
            held: 0,
        })
    }

    /// Waits for data on `src` and moves what there is into the pipe, which must be empty (so
    /// a call that would block can only mean the socket is). Returns the count; 0 is `src`'s
    /// end of stream. An error is the source's: it reset, or reading failed.
    pub(super) async fn fill(&mut self, src: &TcpStream) -> io::Result<usize> {
        debug_assert_eq!(self.held, 0, "filled only when empty");
        loop {
            src.readable().await?;
            // Not cleared on a short fill the way reads are (`read_clearing`): a fill also
            // stops when the pipe's slots run out, with data still queued, and a cleared
            // readiness would then wait for data that may never come (the rest of a stream
            // whose FIN has arrived).
            let moved = src.try_io(Interest::READABLE, || {
                splice(src, None, &self.write, None, self.capacity, flags())
                    .map_err(io::Error::from)
            });
            match moved {
                Ok(n) => {
                    self.held = n;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes what the pipe holds to `dst`, telling `wrote` each part taken. Dropped while
    /// waiting for `dst`, the pipe keeps the rest. An error is the destination's: its peer is
    /// gone.
    pub(super) async fn drain(
        &mut self,
        dst: &TcpStream,
        mut wrote: impl FnMut(usize),
    ) -> io::Result<()> {
        while self.held > 0 {
            let moved = dst.try_io(Interest::WRITABLE, || {
                splice(&self.read, None, dst, None, self.held, flags()).map_err(io::Error::from)
            });
            match moved {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.held -= n;
                    wrote(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => dst.writable().await?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Reads out what the pipe holds, emptying it: a direction handed over to the scheduled
    /// pipe delivers these bytes first.
    pub(super) fn take(&mut self) -> io::Result<Bytes> {
        let mut out = BytesMut::zeroed(self.held);
        let mut filled = 0;
        while filled < out.len() {
            match nix::unistd::read(&self.read, &mut out[filled..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => filled += n,
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.held = 0;
        Ok(out.freeze())
    }
}

fn flags() -> SpliceFFlags {
    SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }

    /// Bytes spliced in come out the other socket in order, whole; bytes left in the pipe can
    /// be taken out instead; the source's FIN is a fill of 0.
    #[tokio::test]
    async fn a_pipe_moves_a_stream_whole_and_gives_back_what_it_holds() {
        let (mut client, src) = pair().await;
        let (dst, mut sink) = pair().await;
        let data: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            client.write_all(&sent).await.unwrap();
            client.shutdown().await.unwrap();
        });
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            sink.read_to_end(&mut got).await.unwrap();
            got
        });
        let mut pipe = Spliced::new().unwrap();
        assert!(pipe.capacity >= 64 << 10);
        let mut written = 0;
        let mut taken = Vec::new();
        loop {
            let n = pipe.fill(&src).await.unwrap();
            if n == 0 {
                break;
            }
            assert_eq!(pipe.held, n);
            // Every fourth fill is taken out rather than spliced on, as a hand-over would,
            // and written by hand.
            if taken.len() % 4 == 3 {
                let bytes = pipe.take().unwrap();
                assert_eq!(bytes.len(), n);
                let mut rest = bytes.clone();
                super::super::socket::write_all(&dst, &mut rest)
                    .await
                    .unwrap();
                written += n;
            } else {
                pipe.drain(&dst, |n| written += n).await.unwrap();
            }
            taken.push(n);
            assert_eq!(pipe.held, 0);
        }
        writer.await.unwrap();
        super::super::socket::shutdown_write(&dst);
        let got = reader.await.unwrap();
        assert_eq!(written, data.len());
        assert!(got == data, "the stream arrives whole and in order");
    }
}
