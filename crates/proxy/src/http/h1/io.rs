//! The pass-through's byte plumbing: the client's bytes not yet consumed
//! ([`ClientBuf`]), reads into a vector's spare room, writes of several
//! slices at once, and how an idle client connection is waited on without
//! a buffer ([`ClientIo`]).

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BufMut;
use tokio::io::{AsyncRead, AsyncWrite};

/// How much of the client's bytes is read at once.
pub(crate) const READ_CHUNK: usize = 8 << 10;
/// Body bytes up to this many go out in one buffer with the head they
/// follow (copied, which costs less than a second slice in the kernel).
pub(crate) const JOIN_BELOW: usize = 4 << 10;

/// A client stream the pass-through serves: the socket, or TLS over it.
pub(crate) trait ClientIo: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> ClientIo for T {}

/// The client's bytes read and not yet consumed: `bytes[start..]`.
#[derive(Default)]
pub(crate) struct ClientBuf {
    bytes: Vec<u8>,
    start: usize,
}

impl ClientBuf {
    /// The bytes not yet consumed.
    pub(crate) fn unconsumed(&self) -> &[u8] {
        &self.bytes[self.start..]
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.start == self.bytes.len()
    }

    /// `n` more bytes were consumed.
    pub(crate) fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.bytes.len());
    }

    /// Frees the memory of an empty buffer (an idle connection holds none).
    pub(crate) fn release(&mut self) {
        if self.is_empty() {
            self.bytes = Vec::new();
            self.start = 0;
        }
    }

    /// The bytes not yet consumed, taken out.
    pub(crate) fn take(&mut self) -> Vec<u8> {
        let mut bytes = std::mem::take(&mut self.bytes);
        bytes.drain(..self.start);
        self.start = 0;
        bytes
    }

    /// Room for `want` more bytes after the unconsumed ones, which move to
    /// the front first when there is not.
    fn make_room(&mut self, want: usize) {
        if self.start > 0 && self.bytes.capacity() - self.bytes.len() < want {
            self.bytes.drain(..self.start);
            self.start = 0;
        }
        let spare = self.bytes.capacity() - self.bytes.len();
        if spare < want {
            self.bytes.reserve_exact(want);
        }
    }

    /// Reads at most `want` more bytes from `io`: how many (0 at its end).
    pub(crate) fn poll_read<S: AsyncRead + Unpin>(
        &mut self,
        io: &mut S,
        cx: &mut Context<'_>,
        want: usize,
    ) -> Poll<io::Result<usize>> {
        self.make_room(want);
        let mut room = (&mut self.bytes).limit(want);
        tokio_util::io::poll_read_buf(Pin::new(io), cx, &mut room)
    }

    /// Waits for the next request's first bytes on an idle connection,
    /// holding no buffer while there are none: the buffer a read needs is
    /// freed again whenever the read finds nothing (a socket reported
    /// readable that is not, as a newly accepted one may be, costs one
    /// empty read).
    pub(crate) fn poll_idle<S: AsyncRead + Unpin>(
        &mut self,
        io: &mut S,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<usize>> {
        let polled = self.poll_read(io, cx, READ_CHUNK);
        if polled.is_pending() {
            self.release();
        }
        polled
    }

    /// Reads what the client sends ahead into the room the buffer has
    /// (room for one read is made only when there is none), while its
    /// bytes stay under `max`: `Pending` past it.
    pub(crate) fn poll_read_ahead<S: AsyncRead + Unpin>(
        &mut self,
        io: &mut S,
        cx: &mut Context<'_>,
        max: usize,
    ) -> Poll<io::Result<usize>> {
        let held = self.bytes.len() - self.start;
        if held >= max {
            return Poll::Pending;
        }
        let spare = self.bytes.capacity() - self.bytes.len();
        let want = if spare > 0 { spare } else { READ_CHUNK };
        let polled = self.poll_read(io, cx, want.min(max - held));
        if polled.is_pending() {
            // Nothing sent ahead: no buffer kept while the answer streams.
            self.release();
        }
        polled
    }

    /// Reads at most `want` more bytes from `io`.
    pub(crate) async fn read<S: AsyncRead + Unpin>(
        &mut self,
        io: &mut S,
        want: usize,
    ) -> io::Result<usize> {
        poll_fn(|cx| self.poll_read(io, cx, want)).await
    }
}

/// Reads at most `want` more bytes from `io` into `buf`'s spare room (made
/// if missing): how many (0 at its end). An empty `buf` whose read finds
/// nothing is freed, so a request that waits (a long prefill, a quiet
/// stream) holds no buffer meanwhile.
pub(crate) fn poll_read_into<S: AsyncRead + Unpin>(
    io: &mut S,
    cx: &mut Context<'_>,
    buf: &mut Vec<u8>,
    want: usize,
) -> Poll<io::Result<usize>> {
    if buf.capacity() - buf.len() < want {
        buf.reserve_exact(want);
    }
    let mut room = buf.limit(want);
    let polled = tokio_util::io::poll_read_buf(Pin::new(io), cx, &mut room);
    if polled.is_pending() && buf.is_empty() {
        *buf = Vec::new();
    }
    polled
}

/// Writes every byte of `parts` to `io`, several slices per system call.
/// `Err` carries whether any byte was written.
pub(crate) async fn write_all<S: AsyncWrite + Unpin>(
    io: &mut S,
    parts: &[&[u8]],
) -> Result<(), WriteError> {
    let mut written = 0;
    let total: usize = parts.iter().map(|p| p.len()).sum();
    while written < total {
        let n = poll_fn(|cx| poll_write_from(io, cx, parts, written)).await;
        match n {
            Ok(0) => {
                return Err(WriteError {
                    wrote_any: written > 0,
                    error: io::ErrorKind::WriteZero.into(),
                });
            }
            Ok(n) => written += n,
            Err(error) => {
                return Err(WriteError {
                    wrote_any: written > 0,
                    error,
                });
            }
        }
    }
    Ok(())
}

/// One vectored write of `parts` from byte `skip` on.
pub(crate) fn poll_write_from<S: AsyncWrite + Unpin>(
    io: &mut S,
    cx: &mut Context<'_>,
    parts: &[&[u8]],
    mut skip: usize,
) -> Poll<io::Result<usize>> {
    let mut slices = [io::IoSlice::new(&[]); 4];
    let mut count = 0;
    for part in parts {
        if skip >= part.len() {
            skip -= part.len();
            continue;
        }
        if count == slices.len() {
            break;
        }
        slices[count] = io::IoSlice::new(&part[skip..]);
        skip = 0;
        count += 1;
    }
    if count == 1 {
        // One slice: a plain send, cheaper in the kernel than writev.
        return Pin::new(io).poll_write(cx, &slices[0]);
    }
    Pin::new(io).poll_write_vectored(cx, &slices[..count])
}

/// A client stream handed over to hyper: the bytes the pass-through read
/// first, then the stream.
pub(crate) struct Replay<S> {
    read: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S> Replay<S> {
    pub(crate) fn new(inner: S, read: Vec<u8>) -> Replay<S> {
        Replay { read, at: 0, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Replay<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.at < this.read.len() {
            let n = (this.read.len() - this.at).min(buf.remaining());
            buf.put_slice(&this.read[this.at..this.at + n]);
            this.at += n;
            if this.at == this.read.len() {
                this.read = Vec::new();
                this.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Replay<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A write that failed, and whether any of its bytes went first.
#[derive(Debug)]
pub(crate) struct WriteError {
    pub(crate) wrote_any: bool,
    pub(crate) error: io::Error,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn vectored_writes_resume_where_they_stopped() {
        let (mut a, mut b) = tokio::io::duplex(7);
        let writer = tokio::spawn(async move {
            write_all(&mut a, &[b"head ", b"", b"and body", b"!"])
                .await
                .unwrap();
        });
        let mut got = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut b, &mut got)
            .await
            .unwrap();
        writer.await.unwrap();
        assert_eq!(got, b"head and body!");
    }

    #[tokio::test]
    async fn an_idle_wait_holds_no_buffer() {
        let (mut a, mut b) = tokio::io::duplex(64);
        let mut buf = ClientBuf::default();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(buf.poll_idle(&mut b, &mut cx).is_pending());
        assert_eq!(buf.bytes.capacity(), 0, "nothing came: nothing is held");
        tokio::io::AsyncWriteExt::write_all(&mut a, b"GET")
            .await
            .unwrap();
        assert!(matches!(buf.poll_idle(&mut b, &mut cx), Poll::Ready(Ok(3))));
        assert_eq!(buf.unconsumed(), b"GET");
        // What a client sends ahead while an answer streams is kept; when
        // it sends nothing, the buffer goes.
        buf.consume(3);
        assert!(buf.poll_read_ahead(&mut b, &mut cx, 16).is_pending());
        assert_eq!(buf.bytes.capacity(), 0);
        tokio::io::AsyncWriteExt::write_all(&mut a, &[b'x'; 40])
            .await
            .unwrap();
        assert!(matches!(
            buf.poll_read_ahead(&mut b, &mut cx, 16),
            Poll::Ready(Ok(16))
        ));
        assert!(
            buf.poll_read_ahead(&mut b, &mut cx, 16).is_pending(),
            "at most 16 ahead"
        );
    }

    #[tokio::test]
    async fn a_client_buffer_consumes_and_compacts() {
        let (mut a, mut b) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut a, b"abcdef")
            .await
            .unwrap();
        let mut buf = ClientBuf::default();
        assert_eq!(buf.read(&mut b, 4).await.unwrap(), 4);
        buf.consume(3);
        assert_eq!(buf.unconsumed(), b"d");
        assert_eq!(buf.read(&mut b, 16).await.unwrap(), 2);
        assert_eq!(buf.unconsumed(), b"def");
        buf.consume(3);
        buf.release();
        assert_eq!(buf.bytes.capacity(), 0);
    }
}
