//! Listening sockets handed over at start: systemd's socket activation
//! (`LISTEN_FDS` sockets from fd 3 on, for the process `LISTEN_PID` names,
//! or for any process when it is unset). With a `.socket` unit, systemd
//! holds the listening socket while magpie restarts, so a connection that
//! comes in between waits in the socket's backlog instead of being refused.
//!
//! [`Inherited::from_env`] reads and clears the variables; `main` calls it
//! before any thread starts. Each listener of the config then takes the
//! inherited socket bound to exactly its address ([`Inherited::take`]), or
//! binds its own (a port 0 in the config takes the first socket on its IP
//! address); a socket that no `listen` or `admin` address names is a start
//! error, not a port silently left open. `mode: udp` takes datagram
//! sockets (`ListenDatagram=`) the same way ([`Inherited::take_datagram`]).

use std::io;
use std::net::{SocketAddr, TcpListener, UdpSocket};

/// Listening sockets inherited at start, with the address each is bound to.
#[derive(Debug, Default)]
pub struct Inherited {
    sockets: Vec<(SocketAddr, TcpListener)>,
    datagrams: Vec<(SocketAddr, UdpSocket)>,
}

/// An inherited socket that is neither a listening TCP socket nor a UDP one.
#[derive(Debug, thiserror::Error)]
#[error(
    "LISTEN_FDS: the socket at fd {fd} is neither a listening TCP socket nor a UDP socket: {source}"
)]
pub struct ActivationError {
    pub(crate) fd: usize,
    #[source]
    pub(crate) source: io::Error,
}

impl Inherited {
    /// None: magpie binds every socket itself.
    pub(crate) fn none() -> Inherited {
        Inherited::default()
    }

    /// The sockets systemd passed, if any (the variables are cleared, so a
    /// child process does not take them for its own).
    pub fn from_env() -> Result<Inherited, ActivationError> {
        let mut fds = listenfd::ListenFd::from_env();
        let mut inherited = Inherited::default();
        for idx in 0..fds.len() {
            let fd = idx + 3;
            let bad = |source| ActivationError { fd, source };
            // Not a TCP socket leaves it in place, for the UDP try.
            if let Ok(Some(listener)) = fds.take_tcp_listener(idx) {
                let addr = listener.local_addr().map_err(bad)?;
                inherited.sockets.push((addr, listener));
            } else if let Some(socket) = fds.take_udp_socket(idx).map_err(bad)? {
                let addr = socket.local_addr().map_err(bad)?;
                inherited.datagrams.push((addr, socket));
            }
        }
        Ok(inherited)
    }

    /// The inherited socket bound to `addr`, taken; for a port 0 (any
    /// port), the first one on its IP address (a binary upgrade hands the
    /// sockets over in the config's order).
    pub(crate) fn take(&mut self, addr: SocketAddr) -> Option<TcpListener> {
        take_bound(&mut self.sockets, addr)
    }

    /// The inherited UDP socket bound to `addr`, taken, as [`Self::take`].
    pub(crate) fn take_datagram(&mut self, addr: SocketAddr) -> Option<UdpSocket> {
        take_bound(&mut self.datagrams, addr)
    }

    /// The addresses of the sockets not taken.
    pub(crate) fn left(&self) -> Vec<SocketAddr> {
        let datagrams = self.datagrams.iter().map(|(a, _)| *a);
        self.sockets
            .iter()
            .map(|(a, _)| *a)
            .chain(datagrams)
            .collect()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.sockets.is_empty() && self.datagrams.is_empty()
    }
}

/// The socket of `sockets` bound to `addr`, taken; for a port 0, the
/// first one on its IP address.
fn take_bound<T>(sockets: &mut Vec<(SocketAddr, T)>, addr: SocketAddr) -> Option<T> {
    let exact = sockets.iter().position(|(a, _)| *a == addr);
    let any_port = || {
        (addr.port() == 0)
            .then(|| sockets.iter().position(|(a, _)| a.ip() == addr.ip()))
            .flatten()
    };
    let i = exact.or_else(any_port)?;
    Some(sockets.remove(i).1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_is_taken_by_its_exact_address_once() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut inherited = Inherited {
            sockets: vec![(addr, listener)],
            datagrams: Vec::new(),
        };
        let other: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert!(inherited.take(other).is_none());
        assert_eq!(inherited.left(), [addr]);
        assert!(inherited.take(addr).is_some());
        assert!(inherited.take(addr).is_none());
        assert!(inherited.is_empty() && Inherited::none().is_empty());
    }

    #[test]
    fn a_port_0_takes_the_first_socket_on_its_address() {
        let (one, two) = (
            TcpListener::bind("127.0.0.1:0").unwrap(),
            TcpListener::bind("127.0.0.1:0").unwrap(),
        );
        let (a, b) = (one.local_addr().unwrap(), two.local_addr().unwrap());
        let mut inherited = Inherited {
            sockets: vec![(a, one), (b, two)],
            datagrams: Vec::new(),
        };
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let v6: SocketAddr = "[::1]:0".parse().unwrap();
        assert!(inherited.take(v6).is_none());
        assert_eq!(inherited.take(any).unwrap().local_addr().unwrap(), a);
        assert_eq!(inherited.take(any).unwrap().local_addr().unwrap(), b);
    }

    #[test]
    fn datagram_sockets_are_taken_apart_from_listeners() {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        let mut inherited = Inherited {
            sockets: Vec::new(),
            datagrams: vec![(addr, socket)],
        };
        assert!(inherited.take(addr).is_none());
        assert_eq!(inherited.left(), [addr]);
        assert!(inherited.take_datagram(addr).is_some());
        assert!(inherited.is_empty());
    }
}
