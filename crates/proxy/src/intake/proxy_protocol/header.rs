//! PROXY headers as bytes: parsing v1 and v2 (with "need more bytes" for a
//! header still arriving), telling a signature from its first bytes, and
//! building the v2 header magpie sends on. Pure: no I/O; the fuzz target
//! `proxy_protocol` drives [`parse`] and [`signature`].
//!
//! Parsing and building use the crate `ppp`; this module adds the limits and
//! the mapping to socket addresses.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ppp::v2;
use ppp::{HeaderResult, PartialResult};

use magpie_core::key::canonical_ip;

/// The largest PROXY header we accept. v1 is at most 107 bytes; v2 carries
/// TLVs, which in practice (AWS, GCP, Azure, HAProxy) stay far below this.
pub const MAX_HEADER_BYTES: usize = 4096;

/// The longest v1 line allowed by the specification, CRLF included.
const V1_MAX_BYTES: usize = 107;
const V1_SIGNATURE: &[u8] = b"PROXY ";
const V2_SIGNATURE: &[u8] = b"\r\n\r\n\0\r\nQUIT\n";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProxyProtocolError {
    #[error("no PROXY header from a peer that must send one")]
    Missing,
    #[error("malformed PROXY header")]
    Malformed,
    #[error("PROXY header larger than {MAX_HEADER_BYTES} bytes")]
    TooLarge,
    #[error("no complete PROXY header within {0:?}")]
    Timeout(Duration),
    #[error("peer closed before the PROXY header was complete")]
    Closed,
}

/// What a complete header says about the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A proxied connection: the real client and the address it connected to.
    Proxied {
        source: SocketAddr,
        destination: SocketAddr,
    },
    /// `LOCAL` (v2) or `UNKNOWN` (v1): a health check or similar from the
    /// proxy itself; the peer's own addresses stand.
    Local,
}

/// A complete header: what it says and how many bytes it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parsed {
    pub origin: Origin,
    pub length: usize,
}

/// Parses a header at the start of `bytes`: `Ok(None)` means "need more bytes".
pub fn parse(bytes: &[u8]) -> Result<Option<Parsed>, ProxyProtocolError> {
    match signature(bytes) {
        Signature::No => return Err(ProxyProtocolError::Missing),
        Signature::Maybe => return Ok(None),
        Signature::Yes => {}
    }
    let result = HeaderResult::parse(bytes);
    if result.is_incomplete() {
        // A v1 line is complete at its newline or by 107 bytes; whatever the
        // parser still wants after that, it will not get.
        let v1_over = bytes.starts_with(V1_SIGNATURE)
            && (bytes.contains(&b'\n') || bytes.len() >= V1_MAX_BYTES);
        return if v1_over {
            Err(ProxyProtocolError::Malformed)
        } else if bytes.len() >= MAX_HEADER_BYTES {
            Err(ProxyProtocolError::TooLarge)
        } else {
            Ok(None)
        };
    }
    match result {
        HeaderResult::V1(Ok(h)) => {
            let origin = match h.addresses {
                ppp::v1::Addresses::Tcp4(a) => Origin::Proxied {
                    source: SocketAddr::new(a.source_address.into(), a.source_port),
                    destination: SocketAddr::new(a.destination_address.into(), a.destination_port),
                },
                ppp::v1::Addresses::Tcp6(a) => Origin::Proxied {
                    source: SocketAddr::new(a.source_address.into(), a.source_port),
                    destination: SocketAddr::new(a.destination_address.into(), a.destination_port),
                },
                ppp::v1::Addresses::Unknown => Origin::Local,
            };
            Ok(Some(Parsed {
                origin,
                length: h.header.len(),
            }))
        }
        HeaderResult::V2(Ok(h)) => {
            let origin = match (h.command, h.addresses) {
                (v2::Command::Proxy, v2::Addresses::IPv4(a)) => Origin::Proxied {
                    source: SocketAddr::new(a.source_address.into(), a.source_port),
                    destination: SocketAddr::new(a.destination_address.into(), a.destination_port),
                },
                (v2::Command::Proxy, v2::Addresses::IPv6(a)) => Origin::Proxied {
                    source: SocketAddr::new(a.source_address.into(), a.source_port),
                    destination: SocketAddr::new(a.destination_address.into(), a.destination_port),
                },
                // LOCAL, or an address family we cannot route by (unix,
                // unspecified): the connection stands for itself.
                _ => Origin::Local,
            };
            Ok(Some(Parsed {
                origin,
                length: h.len(),
            }))
        }
        HeaderResult::V1(Err(_)) | HeaderResult::V2(Err(_)) => Err(ProxyProtocolError::Malformed),
    }
}

/// Whether bytes begin like a PROXY header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signature {
    Yes,
    /// Too short to tell: the bytes so far are a prefix of a signature.
    Maybe,
    No,
}

pub fn signature(bytes: &[u8]) -> Signature {
    let mut maybe = false;
    for sig in [V1_SIGNATURE, V2_SIGNATURE] {
        let n = bytes.len().min(sig.len());
        if bytes[..n] == sig[..n] {
            if n == sig.len() {
                return Signature::Yes;
            }
            maybe = true;
        }
    }
    if maybe {
        Signature::Maybe
    } else {
        Signature::No
    }
}

/// A v2 `PROXY` header for a TCP connection from `source` to `destination`.
/// When the families differ, both are written as IPv6 (IPv4-mapped).
pub fn v2_header(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let (src_ip, dst_ip) = (canonical_ip(source.ip()), canonical_ip(destination.ip()));
    let addresses: v2::Addresses = match (src_ip, dst_ip) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            v2::IPv4::new(s, d, source.port(), destination.port()).into()
        }
        (s, d) => v2::IPv6::new(to_v6(s), to_v6(d), source.port(), destination.port()).into(),
    };
    let builder = v2::Builder::with_addresses(
        v2::Version::Two | v2::Command::Proxy,
        v2::Protocol::Stream,
        addresses,
    );
    // Building into a Vec only fails if writing to memory fails.
    builder.build().unwrap_or_default()
}

fn to_v6(ip: IpAddr) -> std::net::Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn v1_and_v2_parse() {
        let v1 = b"PROXY TCP4 192.0.2.1 198.51.100.1 5000 80\r\nGET /";
        let p = parse(v1).unwrap().unwrap();
        assert_eq!(p.length, v1.len() - 5);
        assert_eq!(
            p.origin,
            Origin::Proxied {
                source: addr("192.0.2.1:5000"),
                destination: addr("198.51.100.1:80")
            }
        );
        let v2 = v2_header(addr("[2001:db8::1]:4000"), addr("[2001:db8::2]:443"));
        let p = parse(&v2).unwrap().unwrap();
        assert_eq!(p.length, v2.len());
        assert_eq!(
            p.origin,
            Origin::Proxied {
                source: addr("[2001:db8::1]:4000"),
                destination: addr("[2001:db8::2]:443")
            }
        );
        assert_eq!(
            parse(b"PROXY UNKNOWN\r\n").unwrap().unwrap().origin,
            Origin::Local
        );
    }

    #[test]
    fn partial_garbage_and_signature() {
        let v2 = v2_header(addr("192.0.2.1:1"), addr("192.0.2.2:2"));
        assert_eq!(parse(&v2[..20]), Ok(None));
        assert_eq!(parse(b"PRO"), Ok(None));
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\n"),
            Err(ProxyProtocolError::Missing)
        );
        assert_eq!(
            parse(b"PROXY TCP4 nonsense\r\n"),
            Err(ProxyProtocolError::Malformed)
        );
        assert_eq!(signature(b"PROXY TCP4"), Signature::Yes);
        assert_eq!(signature(&v2), Signature::Yes);
        assert_eq!(signature(b"\r\n\r"), Signature::Maybe);
        assert_eq!(signature(b""), Signature::Maybe);
        assert_eq!(signature(b"GET"), Signature::No);
    }

    #[test]
    fn mixed_families_are_written_as_ipv6() {
        let h = v2_header(addr("192.0.2.1:1"), addr("[2001:db8::2]:2"));
        let p = parse(&h).unwrap().unwrap();
        assert_eq!(
            p.origin,
            Origin::Proxied {
                source: addr("[::ffff:192.0.2.1]:1"),
                destination: addr("[2001:db8::2]:2")
            }
        );
        // An IPv4-mapped pair is written as plain IPv4.
        let h = v2_header(addr("[::ffff:192.0.2.1]:1"), addr("192.0.2.2:2"));
        assert_eq!(h[13], 0x11);
    }
}
