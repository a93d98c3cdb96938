//! Validation of what depends on `mode` besides the key (`key.rs`): `copy`,
//! the `http` and `sessions` sections, and the HTTP parts of `health`.
//!
//! Part of [`Validator`]. A setting that means nothing in the chosen mode is
//! an error at its line and column rather than silently ignored: `http.*`,
//! `sessions` or `health.passive_status` in `mode: tcp`; sending PROXY
//! headers (its upstream connections are pooled and carry many clients) or
//! `copy` (hyper moves the bytes) in `mode: http`.

use serde_saphyr::Spanned;

use super::Validator;
use crate::config::raw::{
    RawHealth, RawHttp, RawLimits, RawRedis, RawSessions, StatusRange, StoreKind,
};
use crate::config::{
    CopyMode, DEFAULT_KEY_BUFFER_BYTES, DEFAULT_MAX_HEAD_BYTES, DEFAULT_REDIS_ADDR,
    DEFAULT_REDIS_PREFIX, DEFAULT_REDIS_TIMEOUT, DEFAULT_SESSION_MAX, DEFAULT_SESSION_TTL,
    HealthConfig, HttpConfig, LimitsConfig, MAX_KEY_BUFFER_BYTES, MAX_MAX_HEAD_BYTES,
    MAX_REDIS_PREFIX, MAX_REDIS_TIMEOUT, MAX_SESSION_MAX, MAX_SESSION_TTL, MIN_KEY_BUFFER_BYTES,
    MIN_MAX_HEAD_BYTES, Mode, RedisConfig, SessionsConfig,
};

impl Validator<'_> {
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

    /// The `limits` section: only in `mode: http`.
    pub(super) fn limits(&mut self, raw: Option<Spanned<RawLimits>>, mode: Mode) -> LimitsConfig {
        let Some(raw) = raw else {
            return LimitsConfig::default();
        };
        if mode != Mode::Http {
            self.err(&raw.referenced, "the limits section needs mode: http");
        }
        let max_head_bytes = self.count(
            raw.value.max_head_bytes,
            "limits.max_head_bytes",
            DEFAULT_MAX_HEAD_BYTES,
            MIN_MAX_HEAD_BYTES..=MAX_MAX_HEAD_BYTES,
        );
        let key_buffer_bytes = self.count(
            raw.value.key_buffer_bytes,
            "limits.key_buffer_bytes",
            DEFAULT_KEY_BUFFER_BYTES,
            MIN_KEY_BUFFER_BYTES..=MAX_KEY_BUFFER_BYTES,
        );
        LimitsConfig {
            // At most MAX_MAX_HEAD_BYTES, so this fits any usize.
            max_head_bytes: max_head_bytes as usize,
            key_buffer_bytes,
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
