//! Socket calls shared by the copy and scheduled paths: reads that clear readiness, kernel
//! receive timestamps, whole writes, half-close and reset.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Largest single read. Big enough that bulk transfers cost few syscalls per megabyte.
pub(super) const READ_CHUNK: usize = 128 * 1024;

/// One read (`read` returns the byte count and what else it got) under `src`'s current
/// readiness. A short read, under `asked` bytes, means the socket's queue is empty: the readiness
/// is cleared with it, as tokio's own `poll_read` does, so the next wait parks at once instead of
/// costing a read that only says EAGAIN (half of all reads on a request-response stream). The
/// clearing is tokio's own (an error of kind WouldBlock out of `try_io`), tied to the readiness
/// the read ran under, so data that arrived meanwhile still wakes the next wait.
fn read_clearing<T>(
    src: &TcpStream,
    asked: usize,
    read: impl FnOnce() -> io::Result<(usize, T)>,
) -> io::Result<(usize, T)> {
    let mut short = None;
    let result = src.try_io(Interest::READABLE, || {
        let (n, got) = read()?;
        if n > 0 && n < asked {
            short = Some((n, got));
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok((n, got))
    });
    match short {
        Some(got) => Ok(got),
        None => result,
    }
}

thread_local! {
    /// Where reads land: one per worker thread, not per connection, so idle connections hold no
    /// buffer and a busy one pays no allocation per read. It is zeroed once: `recvmsg` needs
    /// initialised memory, and zeroing 128 KiB per read was 8 % of a scheduled proxy's time on
    /// 100-byte calls.
    static SCRATCH: std::cell::RefCell<Box<[u8]>> =
        std::cell::RefCell::new(vec![0; READ_CHUNK].into_boxed_slice());
}

/// What one [`forward_some`] did.
pub(super) enum Forwarded {
    /// The source's end of stream.
    End,
    /// Read, and every byte taken by the destination at once: this many.
    Passed(usize),
    /// Read, but the destination took only `passed` bytes: `rest` is still to be written.
    Left { passed: usize, rest: Bytes },
    /// The destination refused the write: its peer is gone.
    WriteFailed,
}

/// Waits for data on `src`, reads one chunk into this thread's scratch buffer, and writes it to
/// `dst` at once. The common case, a message the destination takes whole, allocates nothing; only
/// what it could not take is copied out (and is then the caller's to write). An error is the
/// source's: it reset, or reading failed.
pub(super) async fn forward_some(src: &TcpStream, dst: &TcpStream) -> io::Result<Forwarded> {
    loop {
        src.readable().await?;
        // Synchronous from the read to the write: the buffer is never held across an await.
        let step = SCRATCH.with_borrow_mut(|buf| {
            let n = match read_clearing(src, READ_CHUNK, || Ok((src.try_read(buf)?, ()))) {
                Ok((0, ())) => return Ok(Some(Forwarded::End)),
                Ok((n, ())) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(None),
                Err(e) => return Err(e),
            };
            let passed = match dst.try_write(&buf[..n]) {
                Ok(passed) => passed,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) =>
                {
                    0
                }
                Err(_) => return Ok(Some(Forwarded::WriteFailed)),
            };
            Ok(Some(if passed == n {
                Forwarded::Passed(n)
            } else {
                Forwarded::Left {
                    passed,
                    rest: Bytes::copy_from_slice(&buf[passed..n]),
                }
            }))
        })?;
        if let Some(step) = step {
            return Ok(step);
        }
    }
}

/// Waits for data and reads up to `most` bytes, returning also when the bytes reached the socket: the kernel's receive
/// timestamp, so the proxy's own wake-up latency does not add to the emulated delay.
pub(super) async fn read_stamped(
    src: &TcpStream,
    most: usize,
) -> io::Result<Option<(Bytes, Instant)>> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    use std::os::fd::AsRawFd;
    let most = most.min(READ_CHUNK);
    loop {
        src.readable().await?;
        // Synchronous from the read to the copy: the scratch buffer is never held across an
        // await. The bytes are copied out at their size, which a small message needs anyway.
        let result = SCRATCH.with_borrow_mut(|scratch| {
            let buf = &mut scratch[..most];
            read_clearing(src, most, || {
                let mut iov = [io::IoSliceMut::new(buf)];
                let mut cmsg = nix::cmsg_space!(nix::sys::time::TimeSpec);
                let msg = recvmsg::<()>(
                    src.as_raw_fd(),
                    &mut iov,
                    Some(&mut cmsg),
                    MsgFlags::empty(),
                )
                .map_err(io::Error::from)?;
                let stamp = msg.cmsgs().ok().and_then(|mut c| {
                    c.find_map(|m| match m {
                        ControlMessageOwned::ScmTimestampns(ts) => Some(ts),
                        _ => None,
                    })
                });
                Ok((msg.bytes, stamp))
            })
            .map(|(n, stamp)| (Bytes::copy_from_slice(&scratch[..n]), stamp))
        });
        let (bytes, stamp) = match result {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if bytes.is_empty() {
            return Ok(None);
        }
        let arrived = stamp.map_or_else(Instant::now, kernel_stamp_to_instant);
        return Ok(Some((bytes, arrived)));
    }
}

/// Converts a `SO_TIMESTAMPNS` (wall clock) stamp to an `Instant` through its age. A stamp from
/// the future or older than a second means the wall clock moved: use "now" instead.
fn kernel_stamp_to_instant(stamp: nix::sys::time::TimeSpec) -> Instant {
    let now = Instant::now();
    let stamp = Duration::new(stamp.tv_sec() as u64, stamp.tv_nsec() as u32);
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    match wall.checked_sub(stamp) {
        Some(age) if age < Duration::from_secs(1) => now.checked_sub(age).unwrap_or(now),
        _ => now,
    }
}

/// Asks the kernel to stamp received data, for [`read_stamped`].
pub fn enable_receive_timestamps(sock: &TcpStream) {
    if let Err(e) =
        nix::sys::socket::setsockopt(sock, nix::sys::socket::sockopt::ReceiveTimestampns, &true)
    {
        tracing::debug!("no kernel receive timestamps ({e}); delays start when the proxy reads");
    }
}

/// Writes all of `data`, advancing it as it goes: dropped while waiting, `data` is what is
/// left to write.
pub(super) async fn write_all(dst: &TcpStream, data: &mut Bytes) -> io::Result<()> {
    while !data.is_empty() {
        match dst.try_write(data) {
            Ok(n) => data.advance(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => dst.writable().await?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes and drains every buffer in `bufs`.
pub(super) async fn write_all_vectored(
    dst: &TcpStream,
    bufs: &mut VecDeque<Bytes>,
) -> io::Result<()> {
    while !bufs.is_empty() {
        let result = {
            let slices: Vec<IoSlice<'_>> = bufs.iter().map(|b| IoSlice::new(b)).collect();
            dst.try_write_vectored(&slices)
        };
        match result {
            Ok(mut n) => {
                while n > 0 {
                    let front = bufs.front_mut().expect("wrote at most what was queued");
                    if n >= front.len() {
                        n -= front.len();
                        bufs.pop_front();
                    } else {
                        front.advance(n);
                        n = 0;
                    }
                }
                while bufs.front().is_some_and(Bytes::is_empty) {
                    bufs.pop_front();
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => dst.writable().await?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

pub(super) fn shutdown_write(dst: &TcpStream) {
    // Fails only if the peer is already gone, which the other direction will notice.
    let _ = socket2::SockRef::from(dst).shutdown(std::net::Shutdown::Write);
}

/// Makes the eventual close of `sock` an RST instead of a FIN.
pub fn reset_on_close(sock: &TcpStream) {
    let _ = socket2::SockRef::from(sock).set_linger(Some(Duration::ZERO));
}

pub(super) fn reset_and_abort(sock: &TcpStream, abort: &CancellationToken) {
    reset_on_close(sock);
    abort.cancel();
}
