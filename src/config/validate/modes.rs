//! Validation of what depends on `mode`: the key (`key.*`), `copy`, the
//! `http` and `sessions` sections, and the HTTP parts of `health`.
//!
//! Part of [`Validator`]. A setting that means nothing in the chosen mode is
//! an error at its line and column rather than silently ignored: a body key,
//! `http.*`, `sessions` or `health.passive_status` in `mode: tcp`; sending
//! PROXY headers (its upstream connections are pooled and carry many
//! clients) or `copy` (hyper moves the bytes) in `mode: http`.

use serde_saphyr::{Location, Spanned};

use super::Validator;
use crate::config::raw::{
    KeyFrom, RawHealth, RawHttp, RawKey, RawRedis, RawSessions, StatusRange, StoreKind,
};
use crate::config::{
    CopyMode, DEFAULT_HTTP_MAX_BYTES, DEFAULT_HTTP_READ_TIMEOUT, DEFAULT_MAX_BYTES,
    DEFAULT_READ_TIMEOUT, DEFAULT_REDIS_ADDR, DEFAULT_REDIS_PREFIX, DEFAULT_REDIS_TIMEOUT,
    DEFAULT_SESSION_MAX, DEFAULT_SESSION_TTL, Fallback, FieldPath, HealthConfig, HttpConfig,
    KeyConfig, MAX_HTTP_MAX_BYTES, MAX_MAX_BYTES, MAX_READ_TIMEOUT, MAX_REDIS_PREFIX,
    MAX_REDIS_TIMEOUT, MAX_SESSION_MAX, MAX_SESSION_TTL, MIN_MAX_BYTES, Mode, RedisConfig,
    SessionsConfig,
};

impl Validator<'_> {
    pub(super) fn key(&mut self, raw: Option<RawKey>, mode: Mode) -> KeyConfig {
        let Some(raw) = raw else {
            return KeyConfig::SourceIp;
        };
        let from = raw
            .from
            .as_ref()
            .map(|f| f.value)
            .unwrap_or(KeyFrom::SourceIp);
        let from_at = raw
            .from
            .as_ref()
            .map(|f| f.referenced)
            .unwrap_or(Location::UNKNOWN);
        if !matches!(
            from,
            KeyFrom::Header | KeyFrom::Body | KeyFrom::Conversation
        ) {
            // Header settings under an address key are a silent mistake.
            let stray = [
                raw.header.as_ref().map(|h| ("header", h.referenced)),
                raw.body_field
                    .as_ref()
                    .map(|h| ("body_field", h.referenced)),
                raw.read_timeout
                    .as_ref()
                    .map(|h| ("read_timeout", h.referenced)),
                raw.max_bytes.as_ref().map(|h| ("max_bytes", h.referenced)),
                raw.fallback.as_ref().map(|h| ("fallback", h.referenced)),
            ];
            for (field, at) in stray.into_iter().flatten() {
                self.err(
                    &at,
                    format!("key.{field} only applies with key.from: header, body or conversation"),
                );
            }
            return match from {
                KeyFrom::SourceAddr => KeyConfig::SourceAddr,
                _ => KeyConfig::SourceIp,
            };
        }
        let (default_timeout, default_max, max_max) = match mode {
            Mode::Tcp => (DEFAULT_READ_TIMEOUT, DEFAULT_MAX_BYTES, MAX_MAX_BYTES),
            Mode::Http => (
                DEFAULT_HTTP_READ_TIMEOUT,
                DEFAULT_HTTP_MAX_BYTES,
                MAX_HTTP_MAX_BYTES,
            ),
        };
        let read_timeout = self.positive(
            raw.read_timeout,
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
        let fallback = raw.fallback.map(|f| f.value).unwrap_or(Fallback::SourceIp);
        let body_field = raw.body_field.as_ref().and_then(|f| {
            if mode == Mode::Tcp {
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
        });
        if from == KeyFrom::Body {
            if mode == Mode::Tcp {
                self.err(&from_at, "key.from: body needs mode: http");
            }
            if let Some(h) = &raw.header {
                self.err(
                    &h.referenced,
                    "key.header only applies with key.from: header (use from: header with body_field to try both)",
                );
            }
            let Some(field) = body_field else {
                if raw.body_field.is_none() {
                    self.err(&from_at, "key.from is body but key.body_field (e.g. prompt_cache_key or /metadata/session_id) is missing");
                }
                return KeyConfig::SourceIp;
            };
            return KeyConfig::Body {
                field,
                read_timeout,
                max_bytes,
                fallback,
            };
        }
        if from == KeyFrom::Conversation {
            if mode == Mode::Tcp {
                self.err(&from_at, "key.from: conversation needs mode: http");
            }
            let header = raw.header.as_ref().map(|h| self.header_name(h));
            return KeyConfig::Conversation {
                header,
                body_field,
                read_timeout,
                max_bytes,
                fallback,
            };
        }
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
            read_timeout,
            max_bytes,
            fallback,
        }
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

    /// `copy`: only in `mode: tcp`.
    pub(super) fn copy(&mut self, raw: Option<Spanned<CopyMode>>, mode: Mode) -> CopyMode {
        let Some(raw) = raw else {
            return CopyMode::default();
        };
        if mode != Mode::Tcp {
            self.err(
                &raw.referenced,
                "copy applies to mode tcp only (in mode http, requests and responses are streamed by the HTTP stack)",
            );
        }
        raw.value
    }

    /// The `http` section: only in `mode: http`.
    pub(super) fn http(&mut self, raw: Option<Spanned<RawHttp>>, mode: Mode) -> HttpConfig {
        let Some(raw) = raw else {
            return HttpConfig::default();
        };
        if mode != Mode::Http {
            self.err(&raw.referenced, "the http section needs mode: http");
        }
        HttpConfig {
            expose_backend: raw.value.expose_backend.unwrap_or(false),
        }
    }

    /// The `sessions` section: only in `mode: http`.
    pub(super) fn sessions(
        &mut self,
        raw: Option<Spanned<RawSessions>>,
        mode: Mode,
    ) -> Option<SessionsConfig> {
        let raw = raw?;
        if mode != Mode::Http {
            self.err(
                &raw.referenced,
                "sessions needs mode: http (pins follow requests, not connections)",
            );
        }
        let ttl = self.positive(
            raw.value.ttl,
            "sessions.ttl",
            DEFAULT_SESSION_TTL,
            MAX_SESSION_TTL,
        );
        let max = self.count(
            raw.value.max,
            "sessions.max",
            DEFAULT_SESSION_MAX,
            1..=MAX_SESSION_MAX,
        );
        let redis = self.session_store(raw.value.store, raw.value.redis);
        Some(SessionsConfig {
            ttl,
            max: max as usize,
            redis,
        })
    }

    /// `sessions.store` and `sessions.redis`.
    fn session_store(
        &mut self,
        store: Option<Spanned<StoreKind>>,
        redis: Option<Spanned<RawRedis>>,
    ) -> Option<RedisConfig> {
        let kind = store.as_ref().map_or(StoreKind::Local, |s| s.value);
        if kind == StoreKind::Local {
            if let Some(redis) = redis {
                self.err(
                    &redis.referenced,
                    "sessions.redis needs sessions.store: redis",
                );
            }
            return None;
        }
        let raw = redis.map(|r| r.value).unwrap_or(RawRedis {
            addr: None,
            prefix: None,
            timeout: None,
            username: None,
            password: None,
        });
        let addr = match raw.addr {
            None => DEFAULT_REDIS_ADDR.to_string(),
            Some(a) => {
                let text = a.value.trim().to_string();
                let port_ok = text
                    .rsplit_once(':')
                    .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
                if !port_ok {
                    self.err(
                        &a.referenced,
                        format!("sessions.redis.addr {text:?} is not host:port (write e.g. 127.0.0.1:6379)"),
                    );
                }
                text
            }
        };
        let prefix = match raw.prefix {
            None => DEFAULT_REDIS_PREFIX.to_string(),
            Some(p) => {
                if p.value.len() > MAX_REDIS_PREFIX {
                    self.err(
                        &p.referenced,
                        format!(
                            "sessions.redis.prefix is {} bytes long (at most {MAX_REDIS_PREFIX})",
                            p.value.len()
                        ),
                    );
                }
                p.value
            }
        };
        let timeout = self.positive(
            raw.timeout,
            "sessions.redis.timeout",
            DEFAULT_REDIS_TIMEOUT,
            MAX_REDIS_TIMEOUT,
        );
        Some(RedisConfig {
            addr,
            prefix,
            timeout,
            username: raw.username,
            password: raw.password,
        })
    }

    /// `health.http_path`, `health.expect_status` and `health.passive_status`,
    /// taken out of `raw` and filled into `health`.
    pub(super) fn http_health(
        &mut self,
        raw: &mut RawHealth,
        mode: Mode,
        health: &mut HealthConfig,
    ) {
        if let Some(path) = &raw.http_path {
            let text = path.value.trim();
            if !text.starts_with('/') || text.parse::<hyper::Uri>().is_err() {
                self.err(
                    &path.referenced,
                    format!("health.http_path {text:?} is not a request path (write e.g. /health)"),
                );
            }
            health.http_path = Some(text.to_string());
        }
        if let Some(range) = &raw.expect_status {
            let StatusRange(lo, hi) = range.value;
            if !(100..=599).contains(&lo) || !(100..=599).contains(&hi) || lo > hi {
                self.err(
                    &range.referenced,
                    format!("health.expect_status {lo}-{hi} is not a range of HTTP statuses (100 to 599, low first)"),
                );
            } else if raw.http_path.is_none() {
                self.err(
                    &range.referenced,
                    "health.expect_status applies to HTTP checks only (set health.http_path)",
                );
            }
            health.expect_status = lo..=hi;
        }
        if let Some(on) = &raw.passive_status {
            if mode != Mode::Http && on.value {
                self.err(&on.referenced, "health.passive_status needs mode: http");
            }
            health.passive_status = on.value;
        }
    }
}

/// RFC 9110 `tchar`: the bytes allowed in a header field name.
fn is_http_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}
