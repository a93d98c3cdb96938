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
//! error, not a port silently left open.

use std::io;
use std::net::{SocketAddr, TcpListener};

/// Listening sockets inherited at start, with the address each is bound to.
#[derive(Debug, Default)]
pub struct Inherited {
    sockets: Vec<(SocketAddr, TcpListener)>,
}

/// An inherited socket that is not a listening TCP socket.
#[derive(Debug, thiserror::Error)]
#[error("LISTEN_FDS: the socket at fd {fd} is not a listening TCP socket: {source}")]
pub struct ActivationError {
    pub fd: usize,
    #[source]
    pub source: io::Error,
}

impl Inherited {
    /// None: magpie binds every socket itself.
    pub fn none() -> Inherited {
        Inherited::default()
    }

    /// The sockets systemd passed, if any (the variables are cleared, so a
    /// child process does not take them for its own).
    pub fn from_env() -> Result<Inherited, ActivationError> {
        let mut fds = listenfd::ListenFd::from_env();
        let mut sockets = Vec::new();
        for idx in 0..fds.len() {
            let fd = idx + 3;
            let bad = |source| ActivationError { fd, source };
            let Some(listener) = fds.take_tcp_listener(idx).map_err(bad)? else {
                continue;
            };
            let addr = listener.local_addr().map_err(bad)?;
            sockets.push((addr, listener));
        }
        Ok(Inherited { sockets })
    }

    /// The inherited socket bound to `addr`, taken; for a port 0 (any
    /// port), the first one on its IP address (a binary upgrade hands the
    /// sockets over in the config's order).
    pub fn take(&mut self, addr: SocketAddr) -> Option<TcpListener> {
        let exact = self.sockets.iter().position(|(a, _)| *a == addr);
        let any_port = || {
            (addr.port() == 0)
                .then(|| self.sockets.iter().position(|(a, _)| a.ip() == addr.ip()))
                .flatten()
        };
        let i = exact.or_else(any_port)?;
        Some(self.sockets.remove(i).1)
    }

    /// The addresses of the sockets not taken.
    pub fn left(&self) -> Vec<SocketAddr> {
        self.sockets.iter().map(|(a, _)| *a).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.sockets.is_empty()
    }
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
        };
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let v6: SocketAddr = "[::1]:0".parse().unwrap();
        assert!(inherited.take(v6).is_none());
        assert_eq!(inherited.take(any).unwrap().local_addr().unwrap(), a);
        assert_eq!(inherited.take(any).unwrap().local_addr().unwrap(), b);
    }
}
