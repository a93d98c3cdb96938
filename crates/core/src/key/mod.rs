//! The key of a connection or a request: what placement hashes to pick a
//! backend. Pure: the data paths read the bytes, this module turns them into
//! a `u64`; it imports nothing from the config, which says which of these
//! apply (the proxy's `config::KeyConfig`).
//!
//! * `source_ip`: the client's address. IPv4 is hashed as its 4 bytes, IPv6
//!   as all 16 (no /64 truncation); an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`,
//!   what a dual-stack socket reports) is first turned back into IPv4, so one
//!   client gets one key whichever socket it came through.
//! * `source_addr`: the same bytes followed by the port, big-endian.
//! * `header`: the value of one HTTP/1.x request header, hashed as its bytes
//!   (surrounding white space trimmed); the TCP path (`tcp::header_key`) reads
//!   it from a connection's first bytes, the HTTP path from each request.
//! * `body`: a field of a JSON body, such as `prompt_cache_key` ([`json`]);
//!   a string is keyed exactly as a header with that text.
//! * `conversation`: the head of a chat conversation: its model, system
//!   prompt and first user message ([`conversation`]).
//! * `sni`: the server name of a TLS ClientHello, lower-cased and without a
//!   trailing dot ([`sni`]); the TCP path (`tcp::sni_key`) reads the hello
//!   from a connection's first bytes, which stay encrypted end to end.
//! * `quic` (mode udp): the destination connection ID of a QUIC packet
//!   ([`quic`]), so a client whose address changes keeps its backend.
//!
//! With `key.group` (mode http), a second key, the group ([`group`]: a
//! chat body's instructions and tools, a prefix of them, or a tenant header),
//! is what the table is looked up by; the key above is then the session key
//! that names the conversation and its pin.
//!
//! When a key that is read from the bytes cannot be found, the [`Fallback`]
//! address key is used and the [`FallbackReason`] counted. The same text
//! always gives the same key, so `magpie lookup KEY` and the admin
//! `/route?key=` answer exactly what the proxy does.

pub mod conversation;
pub mod group;
pub mod json;
pub mod quic;
pub mod sni;

use std::net::{IpAddr, SocketAddr};

use serde::Deserialize;

use crate::hash::{h64, h64_parts};
use crate::labels;

/// The `source_ip` key.
pub fn source_ip_key(ip: IpAddr) -> u64 {
    match canonical_ip(ip) {
        IpAddr::V4(v4) => h64(&v4.octets()),
        IpAddr::V6(v6) => h64(&v6.octets()),
    }
}

/// The `source_addr` key: address bytes, then the port big-endian.
pub fn source_addr_key(addr: SocketAddr) -> u64 {
    let port = addr.port().to_be_bytes();
    match canonical_ip(addr.ip()) {
        IpAddr::V4(v4) => h64_parts(&[&v4.octets(), &port]),
        IpAddr::V6(v6) => h64_parts(&[&v6.octets(), &port]),
    }
}

/// An IPv4-mapped IPv6 address becomes IPv4; everything else is unchanged.
/// A dual-stack socket reports IPv4 clients as `::ffff:a.b.c.d`; keys, trust
/// rules and PROXY headers all see the one canonical form.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// The key of a header value (or any key given as text, e.g. to `lookup`).
pub fn text_key(value: &[u8]) -> u64 {
    h64(value.trim_ascii())
}

/// An address key: the client's IP, or its IP and port. It is the key
/// itself with `key.from: source_ip` or `source_addr`, and the stand-in
/// (`key.fallback`) when a key read from the client's bytes is not found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fallback {
    SourceIp,
    SourceAddr,
}

impl Fallback {
    /// As written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Fallback::SourceIp => "source_ip",
            Fallback::SourceAddr => "source_addr",
        }
    }
}

/// The key for a client by an address key (`key.fallback`, or an address
/// `key.from`).
pub fn fallback_key(fallback: Fallback, client: SocketAddr) -> u64 {
    match fallback {
        Fallback::SourceIp => source_ip_key(client.ip()),
        Fallback::SourceAddr => source_addr_key(client),
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyTextError {
    #[error("{0:?} is not an IP address (the key is the source IP; ip:port is accepted too)")]
    NotIp(String),
    #[error("{0:?} is not an ip:port address (the key is the source address)")]
    NotSocketAddr(String),
    #[error("{0:?} is not a connection ID in hex (the key is a QUIC connection ID)")]
    NotHex(String),
}

/// The key of a client whose address is written as text: `ip` or `ip:port`
/// by `source_ip` (the port is not part of the key), `ip:port` by
/// `source_addr`.
pub fn address_text_key(by: Fallback, text: &str) -> Result<u64, KeyTextError> {
    let text = text.trim();
    match by {
        Fallback::SourceIp => text
            .parse::<IpAddr>()
            .or_else(|_| text.parse::<SocketAddr>().map(|a| a.ip()))
            .map(source_ip_key)
            .map_err(|_| KeyTextError::NotIp(text.to_string())),
        Fallback::SourceAddr => text
            .parse::<SocketAddr>()
            .map(source_addr_key)
            .map_err(|_| KeyTextError::NotSocketAddr(text.to_string())),
    }
}

labels! {
    /// Why no key was read from a request, so the fallback key was used; each
    /// is counted separately.
    pub enum FallbackReason {
        /// A complete request head without the header (and, with a body field,
        /// no body that could carry it).
        MissingHeader => "missing_header",
        /// The bytes are not an HTTP/1.x request.
        NotHttp => "not_http",
        /// `key.from: sni`: the bytes are not a TLS ClientHello (another
        /// first byte than a handshake record's, or a malformed hello).
        NotTls => "not_tls",
        /// `key.from: sni`: a complete ClientHello without a server name.
        NoSni => "no_sni",
        /// `key.from: quic`: a datagram too short for its QUIC header, or
        /// one whose connection ID is empty.
        NotQuic => "not_quic",
        /// The head (or the ClientHello) did not fit in `max_bytes`.
        TooLarge => "too_large",
        /// The deadline passed before the head was complete.
        Timeout => "timeout",
        /// The client stopped sending (EOF or error) before the head was complete.
        Closed => "closed",
        /// The JSON body has no such field.
        MissingField => "missing_field",
        /// The field is there but neither a string nor a number.
        FieldType => "field_type",
        /// The body is not JSON (by content type or by content).
        NotJson => "not_json",
        /// `key.from: conversation`: the JSON body holds no user message.
        NoConversation => "no_conversation",
        /// Reading the body for the key would have held more than
        /// `limits.key_buffer_bytes` across all requests.
        BufferBudget => "buffer_budget",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_ipv4_becomes_ipv4() {
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(canonical_ip(mapped), "192.0.2.7".parse::<IpAddr>().unwrap());
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(canonical_ip(v6), v6);
    }

    #[test]
    fn mapped_ipv4_hashes_like_ipv4() {
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(source_ip_key(v4), source_ip_key(mapped));
        assert_eq!(source_ip_key(v4), h64(&[192, 0, 2, 7]));
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(
            source_ip_key(v6),
            h64(&"2001:db8::1"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets())
        );
        // Hosts in one /64 still get different keys.
        assert_ne!(
            source_ip_key(v6),
            source_ip_key("2001:db8::2".parse().unwrap())
        );
    }

    #[test]
    fn source_addr_adds_the_port() {
        let a: SocketAddr = "192.0.2.7:1000".parse().unwrap();
        let b: SocketAddr = "192.0.2.7:1001".parse().unwrap();
        assert_ne!(source_addr_key(a), source_addr_key(b));
        assert_eq!(source_addr_key(a), h64(&[192, 0, 2, 7, 0x03, 0xe8]));
    }
}
