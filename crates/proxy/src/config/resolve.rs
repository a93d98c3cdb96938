//! Backend addresses to socket addresses: the one piece of I/O in loading a
//! config.
//!
//! Validation calls [`backend_addr`] once per backend, at load time; nothing on
//! the data path resolves names, so a slow or failing resolver can delay a
//! load or reload but never a connection. An `ip:port` is taken as is, without
//! asking the resolver.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};

#[derive(Debug, thiserror::Error)]
pub(super) enum ResolveError {
    #[error("backend address {0:?} has no port (write host:port)")]
    NoPort(String),
    #[error("backend address {0:?} is not host:port")]
    NotHostPort(String),
    #[error("host {0:?} resolves to no address")]
    NoAddress(String),
    #[error("host {host:?} does not resolve: {source}")]
    Lookup { host: String, source: io::Error },
    #[error("host {0:?} is not resolved here (only ip:port is accepted offline)")]
    Offline(String),
}

/// Whether host names go to the system resolver, or are refused (parsing
/// untrusted text, as the fuzz targets do, must not make DNS queries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Names {
    Resolve,
    Offline,
}

/// `ip:port` as is; `host:port` through the system resolver, first address.
/// `text` is trimmed already.
pub(super) fn backend_addr(text: &str, names: Names) -> Result<SocketAddr, ResolveError> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(ResolveError::NoPort(text.to_string()));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(ResolveError::NotHostPort(text.to_string()));
    }
    if names == Names::Offline {
        return Err(ResolveError::Offline(host.to_string()));
    }
    match text.to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .ok_or_else(|| ResolveError::NoAddress(host.to_string())),
        Err(source) => Err(ResolveError::Lookup {
            host: host.to_string(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_addresses_skip_the_resolver() {
        assert_eq!(
            backend_addr("127.0.0.1:8001", Names::Resolve).unwrap(),
            "127.0.0.1:8001".parse().unwrap()
        );
        assert_eq!(
            backend_addr("[::1]:8001", Names::Resolve).unwrap(),
            "[::1]:8001".parse().unwrap()
        );
    }

    #[test]
    fn names_resolve_through_the_system() {
        let addr = backend_addr("localhost:8002", Names::Resolve).unwrap();
        assert!(addr.ip().is_loopback());
        assert_eq!(addr.port(), 8002);
    }

    #[test]
    fn malformed_addresses_are_named() {
        assert!(matches!(
            backend_addr("127.0.0.1", Names::Resolve),
            Err(ResolveError::NoPort(_))
        ));
        assert!(matches!(
            backend_addr("gpu-0", Names::Resolve),
            Err(ResolveError::NoPort(_))
        ));
        assert!(matches!(
            backend_addr(":80", Names::Resolve),
            Err(ResolveError::NotHostPort(_))
        ));
        assert!(matches!(
            backend_addr("gpu-0:http", Names::Resolve),
            Err(ResolveError::NotHostPort(_))
        ));
    }

    #[test]
    fn offline_refuses_names_and_takes_literals() {
        assert!(matches!(
            backend_addr("localhost:8002", Names::Offline),
            Err(ResolveError::Offline(h)) if h == "localhost"
        ));
        assert!(backend_addr("[::1]:8001", Names::Offline).is_ok());
    }
}
