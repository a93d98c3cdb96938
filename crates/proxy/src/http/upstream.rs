//! A connection to a backend below HTTP: TCP, then TLS for a `tls: true`
//! backend ([`crate::net::tls_client`]). hyper's client ([`super::pool`]) and
//! the HTTP/1.1 pass-through ([`super::h1`]) both speak over an
//! [`UpstreamIo`]; the pass-through keeps it as a [`RawConn`](super::pool::RawConn) between
//! requests.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::routing::backend::{Backend, Discard};

/// A connected backend socket, in the clear or over TLS.
pub(crate) enum UpstreamIo {
    Plain(TcpStream),
    /// Boxed: rustls's state is many times a socket's size.
    Tls(Box<TlsStream<TcpStream>>),
}

/// Connects to `backend` within `timeout`, and for a TLS backend makes the
/// handshake within it again (a failed handshake is
/// [`crate::net::tls_client::is_handshake_failure`]).
pub(crate) async fn open(backend: &Backend, timeout: Duration) -> io::Result<UpstreamIo> {
    let stream = crate::net::connect(backend.addr, timeout).await?;
    Ok(match &backend.tls {
        None => UpstreamIo::Plain(stream),
        Some(tls) => UpstreamIo::Tls(Box::new(tls.handshake(stream, timeout).await?)),
    })
}

impl UpstreamIo {
    /// The TCP socket under it.
    pub(crate) fn socket(&self) -> &TcpStream {
        match self {
            UpstreamIo::Plain(s) => s,
            UpstreamIo::Tls(s) => s.get_ref().0,
        }
    }

    /// Whether an idle connection can still carry a request: not when its
    /// backend closed it, or sent bytes nobody asked for. Costs no system
    /// call unless the socket was reported readable since its last read: an
    /// idle connection that stays quiet never is.
    pub(crate) fn idle_state(&self) -> Result<(), Discard> {
        let mut byte = [0u8; 1];
        match self.socket().try_read(&mut byte) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Ok(n) if n > 0 => Err(Discard::Unsolicited),
            Ok(_) | Err(_) => Err(Discard::Closed),
        }
    }
}

impl AsyncRead for UpstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpstreamIo::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            UpstreamIo::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            UpstreamIo::Tls(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            UpstreamIo::Plain(s) => s.is_write_vectored(),
            UpstreamIo::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_flush(cx),
            UpstreamIo::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpstreamIo::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}
