//! A client's socket as mode http reads it: first the bytes the intake
//! already read (what came with a PROXY header), then the socket itself.
//!
//! It sits under everything else on a client connection: under TLS when
//! the listener terminates it, and under the deadlines of
//! [`super::client_deadlines::Timed`]. The socket is shared, so that once hyper (or the
//! TLS handshake) is done with it, the connection can still be closed
//! gently or with a reset.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

use crate::intake::read_ahead::ReadAhead;

pub(crate) struct ClientSocket {
    stream: Arc<TcpStream>,
    /// Client bytes read before the connection was handed over; handed out
    /// before anything else.
    pending: Vec<u8>,
}

impl ClientSocket {
    /// The client's stream, the bytes already read from it first.
    pub(crate) fn new(stream: ReadAhead) -> ClientSocket {
        let (stream, pending) = stream.into_parts();
        ClientSocket {
            stream: Arc::new(stream),
            pending,
        }
    }

    /// The socket, for closing the connection after hyper is done with it.
    pub(crate) fn socket(&self) -> Arc<TcpStream> {
        Arc::clone(&self.stream)
    }
}

impl AsyncRead for ClientSocket {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.pending.is_empty() {
            let n = this.pending.len().min(buf.remaining());
            buf.put_slice(&this.pending[..n]);
            this.pending.drain(..n);
            return Poll::Ready(Ok(()));
        }
        loop {
            std::task::ready!(this.stream.poll_read_ready(cx))?;
            match read_draining(&this.stream, buf) {
                Ok(()) => return Poll::Ready(Ok(())),
                // Readiness was stale; the next poll waits for fresh news.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// One read from `stream` into the unfilled part of `buf` as it is (no
/// zeroing per read). A read that leaves room in `buf` emptied the socket,
/// so its readiness is cleared at once, as tokio's own reads do: the next
/// read waits for the kernel's news instead of asking the socket again and
/// finding nothing (one `recv` per request saved). The readiness cleared is
/// the one seen before this read, so news that came since is kept.
fn read_draining(stream: &TcpStream, buf: &mut ReadBuf<'_>) -> io::Result<()> {
    let mut read = None;
    let cleared = stream.try_io(Interest::READABLE, || {
        let n = stream.try_read_buf(buf)?;
        read = Some(n);
        if n > 0 && buf.remaining() > 0 {
            // Drained: WouldBlock has try_io clear the readiness.
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(())
    });
    match (cleared, read) {
        (_, Some(_)) => Ok(()),
        (Err(e), None) => Err(e),
        (Ok(()), None) => Ok(()),
    }
}

impl AsyncWrite for ClientSocket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            std::task::ready!(self.stream.poll_write_ready(cx))?;
            match self.stream.try_write(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                done => return Poll::Ready(done),
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            std::task::ready!(self.stream.poll_write_ready(cx))?;
            match self.stream.try_write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                done => return Poll::Ready(done),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Writes go straight to the socket.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Not here: the connection's owner closes the socket once it has
        // counted how the connection ended (a refused head, a timeout); a
        // FIN sent by hyper would let the client see the end first.
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_drained_socket_still_wakes_for_what_comes_next() {
        let (mut client, accepted) = crate::net::loopback_pair().await;
        let mut socket = ClientSocket::new(ReadAhead::new(accepted));
        let mut buf = [0u8; 64];
        for round in 0..200u32 {
            let sent = round.to_be_bytes();
            client.write_all(&sent).await.expect("send");
            let mut got = Vec::new();
            while got.len() < sent.len() {
                // Each read leaves room: the socket's readiness is cleared
                // at once, and the next bytes must still be seen.
                let limit = std::time::Duration::from_secs(5);
                let read = tokio::time::timeout(limit, socket.read(&mut buf));
                let n = read.await.expect("woken for the next bytes").expect("read");
                assert_ne!(n, 0, "closed");
                got.extend_from_slice(&buf[..n]);
            }
            assert_eq!(got, sent);
        }
    }
}
