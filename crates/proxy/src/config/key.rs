//! The validated `key` section: where a connection's or a request's key
//! comes from, and how it is read.
//!
//! Address keys (`source_ip`, `source_addr`) always find their key. Every
//! other kind reads it from the client's bytes, and shares one [`KeyRead`]:
//! how long and how much may be read, and which address key stands in when
//! nothing is found. The functions that turn bytes into keys are in
//! [`magpie_core::key`]; this file only says which of them apply.

use std::net::SocketAddr;
use std::time::Duration;

use magpie_core::key::json::FieldPath;
use magpie_core::key::{self, Fallback, KeyTextError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyConfig {
    SourceIp,
    SourceAddr,
    /// An HTTP header's value (per connection in `mode: tcp`, per request in
    /// `mode: http`).
    Header {
        /// Lower-case, so matching is case-insensitive.
        name: String,
        /// `mode: http`: a JSON body field tried when the header is absent.
        body_field: Option<FieldPath>,
        read: KeyRead,
    },
    /// `mode: http`: a field of the JSON request body.
    Body {
        field: FieldPath,
        read: KeyRead,
    },
    /// `mode: http`: the conversation's head in a chat body
    /// ([`magpie_core::key::conversation`]); a header, then a body field, when
    /// configured and present, take precedence.
    Conversation {
        header: Option<String>,
        body_field: Option<FieldPath>,
        read: KeyRead,
    },
    /// `mode: tcp`: the server name of the TLS ClientHello a connection
    /// starts with ([`magpie_core::key::sni`]).
    Sni {
        read: KeyRead,
    },
    /// `mode: udp`: the destination connection ID of a QUIC packet
    /// ([`magpie_core::key::quic`]); IDs in short headers are `cid_length`
    /// bytes long. A datagram without one is keyed by `fallback`.
    Quic {
        cid_length: usize,
        fallback: Fallback,
    },
}

/// How a key is read from the client's bytes, and what stands in when none
/// is found: one for every key that is not an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRead {
    /// The longest the head (and in mode http the body) may take to arrive.
    pub read_timeout: Duration,
    /// The most bytes read to find the key.
    pub max_bytes: usize,
    /// The address key used when no key is found.
    pub fallback: Fallback,
}

/// Where a key is looked for, in order: the part of the key settings that
/// decides keys (not the timeouts and byte limits of reading them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeySources<'a> {
    /// `key.from` as written.
    pub from: &'static str,
    pub header: Option<&'a str>,
    pub body_field: Option<&'a FieldPath>,
    /// The conversation's head (`from: conversation`), after the others.
    pub conversation: bool,
    /// The TLS ClientHello's server name (`from: sni`).
    pub server_name: bool,
}

impl KeyConfig {
    pub fn sources(&self) -> KeySources<'_> {
        let none = KeySources {
            from: "source_ip",
            header: None,
            body_field: None,
            conversation: false,
            server_name: false,
        };
        match self {
            KeyConfig::SourceIp => none,
            KeyConfig::SourceAddr => KeySources {
                from: "source_addr",
                ..none
            },
            KeyConfig::Header {
                name, body_field, ..
            } => KeySources {
                from: "header",
                header: Some(name),
                body_field: body_field.as_ref(),
                ..none
            },
            KeyConfig::Body { field, .. } => KeySources {
                from: "body",
                body_field: Some(field),
                ..none
            },
            KeyConfig::Conversation {
                header, body_field, ..
            } => KeySources {
                from: "conversation",
                header: header.as_deref(),
                body_field: body_field.as_ref(),
                conversation: true,
                ..none
            },
            KeyConfig::Sni { .. } => KeySources {
                from: "sni",
                server_name: true,
                ..none
            },
            KeyConfig::Quic { .. } => KeySources {
                from: "quic",
                ..none
            },
        }
    }

    /// How the key is read from the client's bytes; `None` for address keys.
    pub fn read(&self) -> Option<&KeyRead> {
        match self {
            KeyConfig::Header { read, .. }
            | KeyConfig::Body { read, .. }
            | KeyConfig::Conversation { read, .. }
            | KeyConfig::Sni { read } => Some(read),
            KeyConfig::SourceIp | KeyConfig::SourceAddr | KeyConfig::Quic { .. } => None,
        }
    }

    /// The address key of a client: the key itself for address keys, the
    /// fallback key for the others.
    pub fn by_address(&self) -> Fallback {
        match self {
            KeyConfig::SourceIp => Fallback::SourceIp,
            KeyConfig::SourceAddr => Fallback::SourceAddr,
            KeyConfig::Quic { fallback, .. } => *fallback,
            _ => self.read().map_or(Fallback::SourceIp, |r| r.fallback),
        }
    }

    /// The key of a client at `client` when its bytes carry none (or when
    /// the key is its address).
    pub fn address_key(&self, client: SocketAddr) -> u64 {
        key::fallback_key(self.by_address(), client)
    }

    /// The key the proxy would use for a key written as text: a header value
    /// (or body field) in those modes, a server name with `sni` (any case,
    /// a trailing dot or not), an IP (or `ip:port`, the port left out) in
    /// `source_ip` mode, an `ip:port` in `source_addr` mode, a connection
    /// ID in hex with `quic`. This is what
    /// `magpie lookup`, `plan --keys` and `/route?key=` hash.
    pub fn key_of_text(&self, text: &str) -> Result<u64, KeyTextError> {
        match self {
            KeyConfig::SourceIp => key::address_text_key(Fallback::SourceIp, text),
            KeyConfig::SourceAddr => key::address_text_key(Fallback::SourceAddr, text),
            KeyConfig::Sni { .. } => Ok(key::sni::server_name_key(text.trim().as_bytes())),
            KeyConfig::Quic { .. } => key::quic::from_hex(text.trim())
                .map(|cid| key::quic::cid_key(&cid))
                .ok_or_else(|| KeyTextError::NotHex(text.to_string())),
            _ => Ok(key::text_key(text.trim().as_bytes())),
        }
    }

    /// The key the proxy would use for a client at address `text` (`ip` or
    /// `ip:port`): in `source_ip`/`source_addr` mode the key itself; in the
    /// other modes the fallback key a client gets when its request carries
    /// none. This is what `magpie lookup --addr` and `/route?addr=` hash.
    pub fn key_of_address(&self, text: &str) -> Result<u64, KeyTextError> {
        key::address_text_key(self.by_address(), text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use magpie_core::hash::h64;

    fn header(fallback: Fallback) -> KeyConfig {
        KeyConfig::Header {
            name: "x-session-id".into(),
            body_field: None,
            read: KeyRead {
                read_timeout: Duration::from_millis(200),
                max_bytes: 8192,
                fallback,
            },
        }
    }

    #[test]
    fn text_keys_follow_the_key_mode() {
        let header = header(Fallback::SourceIp);
        assert_eq!(header.key_of_text(" s1 "), Ok(h64(b"s1")));
        assert_eq!(
            KeyConfig::SourceIp.key_of_text("192.0.2.7"),
            Ok(h64(&[192, 0, 2, 7]))
        );
        assert!(KeyConfig::SourceIp.key_of_text("alice").is_err());
        // As the error for a bad one says: ip:port is accepted too, and the
        // port is not part of a source_ip key.
        assert_eq!(
            KeyConfig::SourceIp.key_of_text("192.0.2.7:1000"),
            Ok(h64(&[192, 0, 2, 7]))
        );
        assert_eq!(
            KeyConfig::SourceAddr.key_of_text("192.0.2.7:1000"),
            Ok(key::source_addr_key("192.0.2.7:1000".parse().unwrap()))
        );
    }

    #[test]
    fn a_quic_key_is_written_as_its_connection_id_in_hex() {
        let quic = KeyConfig::Quic {
            cid_length: 8,
            fallback: Fallback::SourceIp,
        };
        assert_eq!(
            quic.key_of_text("0102ff"),
            Ok(key::quic::cid_key(&[1, 2, 255]))
        );
        assert_eq!(
            quic.key_of_text("conv-1"),
            Err(KeyTextError::NotHex("conv-1".into()))
        );
        let client: SocketAddr = "127.0.0.1:5555".parse().unwrap();
        assert_eq!(quic.address_key(client), key::source_ip_key(client.ip()));
    }

    #[test]
    fn an_address_gives_the_fallback_key_in_header_mode() {
        let client: SocketAddr = "127.0.0.1:5555".parse().unwrap();
        for fallback in [Fallback::SourceIp, Fallback::SourceAddr] {
            let header = header(fallback);
            assert_eq!(
                header.key_of_address("127.0.0.1:5555"),
                Ok(key::fallback_key(fallback, client))
            );
            assert_eq!(
                header.address_key(client),
                key::fallback_key(fallback, client)
            );
        }
        assert_eq!(
            KeyConfig::SourceIp.key_of_address("127.0.0.1"),
            Ok(key::source_ip_key(client.ip()))
        );
        assert!(KeyConfig::SourceAddr.key_of_address("127.0.0.1").is_err());
    }
}
