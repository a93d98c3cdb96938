//! The key of a connection: what placement hashes to pick a backend. Pure:
//! the data paths read the bytes, this module turns them into a `u64`.
//!
//! Three kinds:
//!
//! * `source_ip`: the client's address. IPv4 is hashed as its 4 bytes, IPv6
//!   as all 16 (no /64 truncation); an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`,
//!   what a dual-stack socket reports) is first turned back into IPv4, so one
//!   client gets one key whichever socket it came through.
//! * `source_addr`: the same bytes followed by the port, big-endian.
//! * `header`: the value of one HTTP/1.x request header, hashed as its bytes
//!   (surrounding white space trimmed); the TCP path (`tcp::header_key`) reads it from
//!   a connection's first bytes. When none can be read, the fallback key is
//!   used and the [`FallbackReason`] counted.
//!
//! The same text always gives the same key, so `magpie lookup KEY` and the
//! admin `/route?key=` answer exactly what the proxy does.

pub mod conversation;
pub mod json;

use std::net::{IpAddr, SocketAddr};

use crate::config::Fallback;
use crate::hash::{h64, h64_parts};
use crate::label::labels;
use crate::net::canonical_ip;

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

/// The key of a header value (or any key given as text, e.g. to `lookup`).
pub fn text_key(value: &[u8]) -> u64 {
    h64(value.trim_ascii())
}

/// The key for a client by the configured fallback.
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
}

/// The key the proxy would use for a key written as text: a header value in
/// header mode, an IP in `source_ip` mode, an `ip:port` in `source_addr` mode.
/// This is what `magpie lookup`, `plan --keys` and `/route?key=` hash.
pub fn key_for_text(config: &crate::config::KeyConfig, text: &str) -> Result<u64, KeyTextError> {
    use crate::config::KeyConfig;
    let text = text.trim();
    match config {
        KeyConfig::Header { .. } | KeyConfig::Body { .. } | KeyConfig::Conversation { .. } => {
            Ok(text_key(text.as_bytes()))
        }
        KeyConfig::SourceIp => text
            .parse::<IpAddr>()
            .map(source_ip_key)
            .map_err(|_| KeyTextError::NotIp(text.to_string())),
        KeyConfig::SourceAddr => text
            .parse::<SocketAddr>()
            .map(source_addr_key)
            .map_err(|_| KeyTextError::NotSocketAddr(text.to_string())),
    }
}

/// The key the proxy would use for a client at address `text` (`ip` or
/// `ip:port`): in `source_ip`/`source_addr` mode the key itself; in header
/// and body modes the fallback key a client gets when its request carries
/// none. This is what `magpie lookup --addr` and `/route?addr=` hash.
pub fn key_for_address(config: &crate::config::KeyConfig, text: &str) -> Result<u64, KeyTextError> {
    use crate::config::KeyConfig;
    let text = text.trim();
    let by_ip = |text: &str| {
        text.parse::<IpAddr>()
            .or_else(|_| text.parse::<SocketAddr>().map(|a| a.ip()))
            .map(source_ip_key)
            .map_err(|_| KeyTextError::NotIp(text.to_string()))
    };
    let by_addr = |text: &str| {
        text.parse::<SocketAddr>()
            .map(source_addr_key)
            .map_err(|_| KeyTextError::NotSocketAddr(text.to_string()))
    };
    match config {
        KeyConfig::SourceIp => by_ip(text),
        KeyConfig::SourceAddr => by_addr(text),
        KeyConfig::Header { fallback, .. }
        | KeyConfig::Body { fallback, .. }
        | KeyConfig::Conversation { fallback, .. } => match fallback {
            Fallback::SourceIp => by_ip(text),
            Fallback::SourceAddr => by_addr(text),
        },
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
        /// The head did not fit in `max_bytes`.
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn text_keys_follow_the_key_mode() {
        use crate::config::KeyConfig;
        use std::time::Duration;
        let header = KeyConfig::Header {
            name: "x-session-id".into(),
            body_field: None,
            read_timeout: Duration::from_millis(200),
            max_bytes: 8192,
            fallback: Fallback::SourceIp,
        };
        assert_eq!(key_for_text(&header, " s1 "), Ok(h64(b"s1")));
        assert_eq!(
            key_for_text(&KeyConfig::SourceIp, "192.0.2.7"),
            Ok(h64(&[192, 0, 2, 7]))
        );
        assert!(key_for_text(&KeyConfig::SourceIp, "alice").is_err());
        assert_eq!(
            key_for_text(&KeyConfig::SourceAddr, "192.0.2.7:1000"),
            Ok(source_addr_key("192.0.2.7:1000".parse().unwrap()))
        );
    }

    #[test]
    fn an_address_gives_the_fallback_key_in_header_mode() {
        use crate::config::KeyConfig;
        let client: SocketAddr = "127.0.0.1:5555".parse().unwrap();
        for fallback in [Fallback::SourceIp, Fallback::SourceAddr] {
            let header = KeyConfig::Header {
                name: "x-session-id".into(),
                body_field: None,
                read_timeout: std::time::Duration::from_millis(200),
                max_bytes: 8192,
                fallback,
            };
            assert_eq!(
                key_for_address(&header, "127.0.0.1:5555"),
                Ok(fallback_key(fallback, client))
            );
        }
        assert_eq!(
            key_for_address(&KeyConfig::SourceIp, "127.0.0.1"),
            Ok(source_ip_key(client.ip()))
        );
        assert!(key_for_address(&KeyConfig::SourceAddr, "127.0.0.1").is_err());
    }
}
