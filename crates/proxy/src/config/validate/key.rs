//! Validation of the `key` section.
//!
//! Part of [`Validator`]. `key.from` decides which settings apply: an
//! address key takes none of the read settings (each one written is an error
//! at its place, not silently ignored); every other kind shares
//! `read_timeout`, `max_bytes` and `fallback`, with defaults and bounds that
//! depend on the mode. Body and conversation keys need `mode: http`, where
//! each request is keyed; in mode tcp the key is read once per connection,
//! from its request head, or (`sni`, mode tcp only) from its TLS
//! ClientHello.
//!
//! `key.group` needs mode http, a session key read from the request
//! (`from: header`, `body` or `conversation`) and `sessions`: a group only
//! places a conversation's first request, and the session pin is what keeps
//! the conversation on the replica its group placed it on.

use serde_saphyr::{Location, Spanned};

use super::Validator;
use crate::config::raw::{KeyFrom, RawGroup, RawKey};
use crate::config::{
    DEFAULT_GROUP_CHOICES, DEFAULT_HTTP_MAX_BYTES, DEFAULT_HTTP_READ_TIMEOUT, DEFAULT_MAX_BYTES,
    DEFAULT_READ_TIMEOUT, KeyConfig, KeyRead, MAX_GROUP_CHOICES, MAX_GROUP_PREFIX_BYTES,
    MAX_HTTP_MAX_BYTES, MAX_MAX_BYTES, MAX_READ_TIMEOUT, MIN_GROUP_PREFIX_BYTES, MIN_MAX_BYTES,
    Mode,
};
use magpie_core::key::Fallback;
use magpie_core::key::group::GroupBy;
use magpie_core::key::json::FieldPath;

impl Validator<'_> {
    pub(super) fn key(&mut self, raw: Option<RawKey>, mode: Mode) -> KeyConfig {
        let Some(raw) = raw else {
            return KeyConfig::SourceIp;
        };
        let from = raw.from.as_ref().map_or(KeyFrom::SourceIp, |f| f.value);
        let from_at = raw
            .from
            .as_ref()
            .map_or(Location::UNKNOWN, |f| f.referenced);
        if from == KeyFrom::Quic {
            return self.quic_key(&raw, mode, from_at);
        }
        self.no_quic_settings(&raw);
        match from {
            KeyFrom::SourceIp | KeyFrom::SourceAddr => {
                self.no_read_settings(&raw);
                return match from {
                    KeyFrom::SourceAddr => KeyConfig::SourceAddr,
                    _ => KeyConfig::SourceIp,
                };
            }
            KeyFrom::Body if mode != Mode::Http => {
                self.err(&from_at, "key.from: body needs mode: http");
            }
            KeyFrom::Conversation if mode != Mode::Http => {
                self.err(&from_at, "key.from: conversation needs mode: http");
            }
            KeyFrom::Header if mode == Mode::Udp => {
                self.err(&from_at, "key.from: header needs mode: tcp or http (in mode udp the key is the client's address or a QUIC connection ID)");
            }
            KeyFrom::Sni if mode == Mode::Udp => {
                self.err(&from_at, "key.from: sni needs mode: tcp (in mode udp, key QUIC by its connection ID: key.from: quic)");
            }
            KeyFrom::Sni if mode == Mode::Http => {
                self.err(&from_at, "key.from: sni needs mode: tcp (mode http reads requests in plain text; sni keys TLS passed through undecrypted)");
            }
            _ => {}
        }
        let read = self.key_read(&raw, mode);
        let body_field = self.body_field(raw.body_field.as_ref(), mode);
        match from {
            KeyFrom::Body => self.body_key(&raw, body_field, read, from_at),
            KeyFrom::Sni => self.sni_key(&raw, read),
            KeyFrom::Conversation => KeyConfig::Conversation {
                header: raw.header.as_ref().map(|h| self.header_name(h)),
                body_field,
                read,
            },
            _ => {
                let name = match &raw.header {
                    Some(h) => self.header_name(h),
                    None => {
                        self.err(&from_at, "key.from is header but key.header (the header name, e.g. x-session-id) is missing");
                        String::new()
                    }
                };
                KeyConfig::Header {
                    name,
                    body_field,
                    read,
                }
            }
        }
    }

    /// `key.group`, with what it needs: mode http, a session key read from
    /// the request, and `sessions`.
    pub(super) fn group(
        &mut self,
        raw: Option<Spanned<RawGroup>>,
        key: &KeyConfig,
        mode: Mode,
        sessions: bool,
    ) -> Option<GroupBy> {
        let raw = raw?;
        let at = raw.referenced;
        if mode != Mode::Http {
            self.err(
                &at,
                "key.group needs mode: http (the group is read from each request)",
            );
        } else if key.read().is_none() {
            self.err(&at, "key.group needs key.from: header, body or conversation: that key names the session, the group only places its first request");
        } else if !sessions {
            self.err(&at, "key.group needs sessions: the session pin is what keeps a conversation on the replica its group placed it on (add e.g. sessions: {ttl: 30m})");
        }
        let group = match raw.value {
            RawGroup::System => GroupBy::System,
            RawGroup::Conversation => {
                if matches!(key, KeyConfig::Conversation { .. }) {
                    self.err(&at, "key.group: conversation with key.from: conversation groups nothing: the session key is the conversation already (use key.from: header or body for the session, or another group)");
                }
                GroupBy::Conversation
            }
            RawGroup::PrefixBytes(n) => {
                if !(MIN_GROUP_PREFIX_BYTES..=MAX_GROUP_PREFIX_BYTES).contains(&n) {
                    self.err(&at, format!("key.group.prefix_bytes {n} is out of range ({MIN_GROUP_PREFIX_BYTES} to {MAX_GROUP_PREFIX_BYTES})"));
                }
                // At most MAX_GROUP_PREFIX_BYTES once valid.
                GroupBy::PrefixBytes(n.min(MAX_GROUP_PREFIX_BYTES) as usize)
            }
            RawGroup::Header(name) => GroupBy::Header(self.header_name(&Spanned {
                value: name,
                referenced: at,
                defined: raw.defined,
            })),
        };
        Some(group)
    }

    /// `key.group_choices`: only beside `key.group`, 1 to
    /// [`MAX_GROUP_CHOICES`], and no more than `connect.attempts` (a route
    /// holds that many candidates to choose from).
    pub(super) fn group_choices(
        &mut self,
        raw: Option<Spanned<u64>>,
        grouped: bool,
        attempts: u32,
    ) -> usize {
        let Some(n) = raw else {
            return DEFAULT_GROUP_CHOICES as usize;
        };
        if !grouped {
            self.err(
                &n.referenced,
                "key.group_choices applies only with key.group",
            );
        } else if n.value > u64::from(attempts) && n.value <= MAX_GROUP_CHOICES {
            self.err(
                &n.referenced,
                format!(
                    "key.group_choices {} is more than connect.attempts ({attempts}): a request's route holds connect.attempts candidates, the ones a new group chooses from",
                    n.value
                ),
            );
        } else if !(1..=MAX_GROUP_CHOICES).contains(&n.value) {
            self.err(
                &n.referenced,
                format!(
                    "key.group_choices {} is out of range (1 to {MAX_GROUP_CHOICES})",
                    n.value
                ),
            );
        }
        n.value.clamp(1, MAX_GROUP_CHOICES) as usize
    }

    /// Read settings under an address key are a silent mistake: each is an
    /// error at its place.
    fn no_read_settings(&mut self, raw: &RawKey) {
        let fallback = raw.fallback.as_ref().map(|h| ("fallback", h.referenced));
        for (field, at) in byte_read_settings(raw)
            .into_iter()
            .chain([fallback])
            .flatten()
        {
            self.err(
                &at,
                format!(
                    "key.{field} only applies with key.from: header, body, conversation, sni or quic"
                ),
            );
        }
    }

    /// `read_timeout`, `max_bytes` and `fallback`, with the mode's defaults
    /// and bounds.
    fn key_read(&mut self, raw: &RawKey, mode: Mode) -> KeyRead {
        let (default_timeout, default_max, max_max) = match mode {
            Mode::Tcp | Mode::Udp => (DEFAULT_READ_TIMEOUT, DEFAULT_MAX_BYTES, MAX_MAX_BYTES),
            Mode::Http => (
                DEFAULT_HTTP_READ_TIMEOUT,
                DEFAULT_HTTP_MAX_BYTES,
                MAX_HTTP_MAX_BYTES,
            ),
        };
        let read_timeout = self.positive(
            raw.read_timeout.clone(),
            "key.read_timeout",
            default_timeout,
            MAX_READ_TIMEOUT,
        );
        let max_bytes = match &raw.max_bytes {
            Some(m) if m.value < MIN_MAX_BYTES || m.value > max_max => {
                self.err(
                    &m.referenced,
                    format!(
                        "key.max_bytes {} is out of range ({MIN_MAX_BYTES} to {max_max} in mode {})",
                        m.value,
                        mode.as_str()
                    ),
                );
                default_max
            }
            Some(m) => m.value,
            None => default_max,
        } as usize;
        KeyRead {
            read_timeout,
            max_bytes,
            fallback: raw
                .fallback
                .as_ref()
                .map_or(Fallback::SourceIp, |f| f.value),
        }
    }

    /// `key.body_field`: a field name or a JSON pointer, in mode http only.
    fn body_field(&mut self, raw: Option<&Spanned<String>>, mode: Mode) -> Option<FieldPath> {
        let f = raw?;
        if mode != Mode::Http {
            self.err(
                &f.referenced,
                "key.body_field needs mode: http (in mode tcp the key is read once per connection, from the request head)",
            );
            return None;
        }
        match FieldPath::parse(f.value.trim()) {
            Ok(path) => Some(path),
            Err(e) => {
                self.err(&f.referenced, format!("key.body_field {:?} {e}", f.value));
                None
            }
        }
    }

    /// `from: body`: the field is required, a header is not allowed.
    fn body_key(
        &mut self,
        raw: &RawKey,
        field: Option<FieldPath>,
        read: KeyRead,
        from_at: Location,
    ) -> KeyConfig {
        if let Some(h) = &raw.header {
            self.err(
                &h.referenced,
                "key.header only applies with key.from: header (use from: header with body_field to try both)",
            );
        }
        match field {
            Some(field) => KeyConfig::Body { field, read },
            None => {
                if raw.body_field.is_none() {
                    self.err(&from_at, "key.from is body but key.body_field (e.g. prompt_cache_key or /metadata/session_id) is missing");
                }
                KeyConfig::SourceIp
            }
        }
    }

    /// `from: sni`: the server name is the key, so no header is read.
    fn sni_key(&mut self, raw: &RawKey, read: KeyRead) -> KeyConfig {
        if let Some(h) = &raw.header {
            self.err(
                &h.referenced,
                "key.header only applies with key.from: header or conversation (from: sni keys by the TLS server name)",
            );
        }
        KeyConfig::Sni { read }
    }

    /// A `key.header` name, lower-cased.
    fn header_name(&mut self, h: &Spanned<String>) -> String {
        let name = h.value.trim().to_ascii_lowercase();
        if name.is_empty() || !name.bytes().all(is_http_token_byte) {
            self.err(
                &h.referenced,
                format!("{:?} is not a valid HTTP header name", h.value),
            );
        }
        name
    }
}

/// RFC 9110 `tchar`: the bytes allowed in a header field name.
fn is_http_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The settings written that only keys read from the client's bytes use
/// (`header`, `body_field`, `read_timeout`, `max_bytes`), with where.
pub(super) fn byte_read_settings(raw: &RawKey) -> [Option<(&'static str, Location)>; 4] {
    [
        raw.header.as_ref().map(|h| ("header", h.referenced)),
        (raw.body_field.as_ref()).map(|h| ("body_field", h.referenced)),
        (raw.read_timeout.as_ref()).map(|h| ("read_timeout", h.referenced)),
        raw.max_bytes.as_ref().map(|h| ("max_bytes", h.referenced)),
    ]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::test_util::{parse, problems};
    use crate::config::{KeyConfig, KeyRead};
    use magpie_core::key::Fallback;
    use magpie_core::key::sni::server_name_key;

    fn config(mode: &str, key: &str) -> String {
        format!(
            "mode: {mode}\nkey: {key}\nlisten: 127.0.0.1:7000\nbackends:\n  - {{name: a, addr: 127.0.0.1:8001}}\n"
        )
    }

    #[test]
    fn sni_keys_tcp_connections_with_the_header_keys_read_settings() {
        let c = parse(&config("tcp", "{from: sni}")).unwrap();
        let read = KeyRead {
            read_timeout: Duration::from_millis(200),
            max_bytes: 8192,
            fallback: Fallback::SourceIp,
        };
        assert_eq!(c.key, KeyConfig::Sni { read });
        let c = parse(&config(
            "tcp",
            "{from: sni, max_bytes: 16384, read_timeout: 1s, fallback: source_addr}",
        ))
        .unwrap();
        let read = KeyRead {
            read_timeout: Duration::from_secs(1),
            max_bytes: 16384,
            fallback: Fallback::SourceAddr,
        };
        assert_eq!(c.key, KeyConfig::Sni { read });
        // A server name as text is keyed as the hello's name is.
        assert_eq!(
            c.key.key_of_text(" API.example.com. "),
            Ok(server_name_key(b"api.example.com"))
        );
    }

    #[test]
    fn sni_needs_mode_tcp_and_takes_no_header() {
        assert_eq!(
            problems(&config("http", "{from: sni}")),
            [
                "test.yaml:2:13: key.from: sni needs mode: tcp (mode http reads requests in plain text; sni keys TLS passed through undecrypted)"
            ]
        );
        assert_eq!(
            problems(&config("tcp", "{from: sni, header: host}")),
            [
                "test.yaml:2:26: key.header only applies with key.from: header or conversation (from: sni keys by the TLS server name)"
            ]
        );
        let p = problems(&config("tcp", "{from: sni, max_bytes: 8}"));
        assert_eq!(p.len(), 1);
        assert!(
            p[0].starts_with("test.yaml:2:29: key.max_bytes 8 is out of range"),
            "{p:?}"
        );
    }
}
