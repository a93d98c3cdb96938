//! Sockets: binding listeners, tuning data-path streams, connecting with a
//! deadline, and the address types a connection carries.
//!
//! Everything here is shared by both data paths, the admin endpoint and the
//! health checks, and imports nothing else from magpie. Socket options that
//! fail are logged, never fatal: a connection works without them.
//!
//! A connection has three addresses that are easy to swap when they travel as
//! bare `SocketAddr`s, so each has its own type:
//!
//! * [`Peer`]: the address the TCP connection came from (a client, or a load
//!   balancer in front of magpie);
//! * [`Client`]: the real client: the peer, or the source a trusted PROXY
//!   header names; this is what keys and logs use;
//! * [`Local`]: the address the client connected to (magpie's own, or the
//!   destination a PROXY header names); it goes into the PROXY v2 header
//!   magpie sends on.
//!
//! | module | owns |
//! |---|---|
//! | [`sys`] | the one module allowed `unsafe`: the system calls with no safe wrapper (pipes and splice for mode tcp, a socket's drop count for mode udp) |
//! | [`activation`] | listening sockets handed over at start (systemd's `LISTEN_FDS`), each taken by the listener of its address |
//! | [`tls_unverified`] | `upstream_tls.verify: false`: a client config that takes any backend certificate (signatures still checked) |
//! | [`tls_client`] | the client side of TLS to backends: one shared rustls config (CA roots, ALPN `http/1.1`, session resumption), the handshake under a deadline, and telling its failure from a failed connect |

pub(crate) mod activation;
#[allow(unsafe_code)]
pub(crate) mod sys;
pub(crate) mod tls_client;
pub(crate) mod tls_unverified;

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use socket2::{Domain, Protocol, SockRef, Socket, TcpKeepalive, Type};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tracing::debug;

/// Listen backlog (the kernel caps it at `net.core.somaxconn`).
pub(crate) const BACKLOG: i32 = 1024;
/// Keepalive: probes start after an idle minute; on the client side (10 s
/// apart, 6 of them) a dead peer of an idle connection is found in ~2 minutes.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_RETRIES: u32 = 6;

/// The address a TCP connection came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Peer(pub SocketAddr);

/// The real client: the peer, or the source named by a trusted PROXY header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Client(pub SocketAddr);

/// The address the client connected to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Local(pub SocketAddr);

macro_rules! display_as_addr {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    )*};
}
display_as_addr!(Peer, Client, Local);

/// Binds a listening socket with SO_REUSEADDR (restarts don't wait out
/// TIME_WAIT) and [`BACKLOG`]. An IPv6 socket is v6-only, so `[::]:p` and
/// `0.0.0.0:p` can both be listed.
///
/// TCP_NODELAY and keepalive are set here, once: Linux copies a listening
/// socket's options to every connection it accepts, which saves five
/// `setsockopt` calls per connection.
pub(crate) fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    tune(&SockRef::from(&socket), &client_keepalive());
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    socket.set_nonblocking(true)?;
    TcpListener::from_std(socket.into())
}

/// A UDP socket for `mode: udp` at `addr`: v6-only for IPv6 (as [`bind`]),
/// without SO_REUSEADDR (two processes would silently share the port), with
/// a receive buffer of [`DATAGRAM_BUFFER`] where the kernel allows it, so a
/// burst waits in the kernel rather than being dropped there.
pub(crate) fn bind_datagram(addr: SocketAddr) -> io::Result<UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    adopt_datagram(socket.into())
}

/// A UDP socket of its own connected to `peer` (from an ephemeral port of
/// the same family), so only `peer`'s datagrams reach it and an ICMP
/// unreachable is reported on it: a flow's socket towards its backend, a
/// health probe's.
pub(crate) fn connected_datagram(peer: SocketAddr) -> io::Result<UdpSocket> {
    let socket = Socket::new(Domain::for_address(peer), Type::DGRAM, Some(Protocol::UDP))?;
    socket.connect(&peer.into())?;
    socket.set_nonblocking(true)?;
    UdpSocket::from_std(socket.into())
}

/// The receive buffer a datagram socket asks for (the kernel caps it at
/// `net.core.rmem_max`).
pub(crate) const DATAGRAM_BUFFER: usize = 4 << 20;

/// A UDP socket bound elsewhere (inherited), tuned as [`bind_datagram`]
/// tunes its own and made non-blocking.
pub(crate) fn adopt_datagram(socket: std::net::UdpSocket) -> io::Result<UdpSocket> {
    // Best effort: a smaller buffer still works.
    if let Err(e) = SockRef::from(&socket).set_recv_buffer_size(DATAGRAM_BUFFER) {
        debug!(error = %e, "cannot enlarge a datagram socket's receive buffer");
    }
    socket.set_nonblocking(true)?;
    UdpSocket::from_std(socket)
}

/// A listening socket bound elsewhere (inherited: [`activation`]), tuned as
/// [`bind`] tunes its own and made non-blocking; its backlog is the one it
/// was given.
pub(crate) fn adopt(listener: std::net::TcpListener) -> io::Result<TcpListener> {
    tune(&SockRef::from(&listener), &client_keepalive());
    listener.set_nonblocking(true)?;
    TcpListener::from_std(listener)
}

/// Client side: a dead client of an idle connection is found in about two
/// minutes.
fn client_keepalive() -> TcpKeepalive {
    TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_RETRIES)
}

/// Backend side: probes start after the same idle minute; their interval
/// and count are the kernel's (one call each saved per connection).
fn backend_keepalive() -> TcpKeepalive {
    TcpKeepalive::new().with_time(KEEPALIVE_IDLE)
}

/// TCP_NODELAY and keepalive. A failure is logged, not fatal: the
/// connection works without them.
fn tune(socket: &SockRef<'_>, keepalive: &TcpKeepalive) {
    if let Err(e) = socket.set_tcp_nodelay(true) {
        debug!(error = %e, "cannot set TCP_NODELAY");
    }
    if let Err(e) = socket.set_tcp_keepalive(keepalive) {
        debug!(error = %e, "cannot set TCP keepalive");
    }
}

/// A TCP connect with a deadline, with the data-path socket options set.
pub(crate) async fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer within {timeout:?}"),
            )
        })??;
    tune(&SockRef::from(&stream), &backend_keepalive());
    Ok(stream)
}

/// How often [`peer_closed`] looks again while bytes wait unread.
const PEER_CLOSED_RECHECK: Duration = Duration::from_millis(50);

/// Resolves when the peer shut its side of `stream` (its FIN, or the socket
/// failed), without reading what waits in it: for a client whose request
/// waits (in the queue) with part of its body still unread. The event loop
/// reports a peer's FIN as the socket's read side closing; while only bytes
/// wait, it looks again every [`PEER_CLOSED_RECHECK`], never spinning.
pub(crate) async fn peer_closed(stream: &TcpStream) {
    loop {
        match stream.ready(tokio::io::Interest::READABLE).await {
            Ok(ready) if !ready.is_read_closed() && !ready.is_error() => {
                tokio::time::sleep(PEER_CLOSED_RECHECK).await;
            }
            _ => return,
        }
    }
}

/// Makes the coming close of `stream` an abort: with SO_LINGER 0 the kernel
/// sends a reset instead of a FIN, so the peer cannot take a cut-off stream
/// for a complete one.
pub(crate) fn reset_on_close(stream: &TcpStream) {
    if let Err(e) = SockRef::from(stream).set_linger(Some(Duration::ZERO)) {
        debug!(error = %e, "cannot set SO_LINGER");
    }
}

/// Whether an I/O error means this process ran out of something (file
/// descriptors, buffers, memory) rather than that a peer misbehaved: EMFILE,
/// ENFILE, ENOBUFS, ENOMEM.
pub(crate) fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(24 | 23 | 105 | 12))
}

/// A connected pair of loopback sockets, the connecting end first, both
/// without Nagle delay like magpie's own; for unit tests that need real
/// sockets.
#[cfg(test)]
pub(crate) async fn loopback_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let addr = listener.local_addr().expect("its address");
    let (a, b) = tokio::join!(TcpStream::connect(addr), listener.accept());
    let (a, b) = (a.expect("connected"), b.expect("accepted").0);
    a.set_nodelay(true).expect("nodelay");
    b.set_nodelay(true).expect("nodelay");
    (a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Accepted sockets get TCP_NODELAY and keepalive from the listener
    /// (nothing is set per connection); connected ones get them set.
    #[tokio::test]
    async fn accepted_sockets_inherit_nodelay_and_keepalive() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let (connected, accepted) =
            tokio::join!(connect(addr, Duration::from_secs(5)), listener.accept());
        let (connected, accepted) = (connected.unwrap(), accepted.unwrap().0);
        for (side, stream) in [("accepted", &accepted), ("connected", &connected)] {
            let sock = SockRef::from(stream);
            assert!(stream.nodelay().unwrap(), "{side}: TCP_NODELAY");
            assert!(sock.keepalive().unwrap(), "{side}: SO_KEEPALIVE");
            assert_eq!(sock.tcp_keepalive_time().unwrap(), KEEPALIVE_IDLE, "{side}");
        }
        let sock = SockRef::from(&accepted);
        assert_eq!(sock.tcp_keepalive_interval().unwrap(), KEEPALIVE_INTERVAL);
        assert_eq!(sock.tcp_keepalive_retries().unwrap(), KEEPALIVE_RETRIES);
    }

    #[test]
    fn addresses_display_bare() {
        let a: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        assert_eq!(Client(a).to_string(), "127.0.0.1:7000");
    }
}
