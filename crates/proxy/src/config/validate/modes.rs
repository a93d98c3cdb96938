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
    CopyMode, DEFAULT_BODY_TIMEOUT, DEFAULT_FIRST_BYTE_TIMEOUT, DEFAULT_H2_RESETS_PER_SECOND,
    DEFAULT_KEEPALIVE_TIMEOUT, DEFAULT_KEY_BUFFER_BYTES, DEFAULT_MAX_HEAD_BYTES,
    DEFAULT_POOL_IDLE_TIMEOUT, DEFAULT_POOL_MAX_IDLE, DEFAULT_REDIS_ADDR, DEFAULT_REDIS_PREFIX,
    DEFAULT_REDIS_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT, DEFAULT_SESSION_MAX, DEFAULT_SESSION_TTL,
    DEFAULT_STREAM_IDLE_TIMEOUT, HealthConfig, HttpConfig, LimitsConfig, MAX_FIRST_BYTE_TIMEOUT,
    MAX_H2_RESETS_PER_SECOND, MAX_HTTP_TIMEOUT, MAX_KEY_BUFFER_BYTES, MAX_MAX_HEAD_BYTES,
    MAX_POOL_IDLE_TIMEOUT, MAX_POOL_MAX_IDLE, MAX_REDIS_PREFIX, MAX_REDIS_TIMEOUT, MAX_SESSION_MAX,
    MAX_SESSION_TTL, MIN_KEY_BUFFER_BYTES, MIN_MAX_HEAD_BYTES, Mode, RedisConfig, SessionsConfig,
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

    /// The `http` section: only in `mode: http`. `idle_written`: the
    /// top-level `idle_timeout` was written, which mode http does not use
    /// (its client deadlines are `keepalive_timeout` and `first_byte_timeout`).
    pub(super) fn http(
        &mut self,
        raw: Option<Spanned<RawHttp>>,
        mode: Mode,
        idle_written: bool,
    ) -> HttpConfig {
        let idle_timeout_unused = mode == Mode::Http && idle_written;
        let Some(raw) = raw else {
            return HttpConfig {
                idle_timeout_unused,
                ..HttpConfig::default()
            };
        };
        if mode != Mode::Http {
            self.err(&raw.referenced, "the http section needs mode: http");
        }
        let raw = raw.value;
        let mut timeout = |d, what, default, max| self.positive(d, what, default, max);
        let response_timeout = timeout(
            raw.response_timeout,
            "http.response_timeout",
            DEFAULT_RESPONSE_TIMEOUT,
            MAX_HTTP_TIMEOUT,
        );
        let stream_idle_timeout = timeout(
            raw.stream_idle_timeout,
            "http.stream_idle_timeout",
            DEFAULT_STREAM_IDLE_TIMEOUT,
            MAX_HTTP_TIMEOUT,
        );
        let body_timeout = timeout(
            raw.body_timeout,
            "http.body_timeout",
            DEFAULT_BODY_TIMEOUT,
            MAX_HTTP_TIMEOUT,
        );
        let keepalive_timeout = timeout(
            raw.keepalive_timeout,
            "http.keepalive_timeout",
            DEFAULT_KEEPALIVE_TIMEOUT,
            MAX_HTTP_TIMEOUT,
        );
        let first_byte_timeout = timeout(
            raw.first_byte_timeout,
            "http.first_byte_timeout",
            DEFAULT_FIRST_BYTE_TIMEOUT,
            MAX_FIRST_BYTE_TIMEOUT,
        );
        let pool_idle_timeout = timeout(
            raw.pool_idle_timeout,
            "http.pool_idle_timeout",
            DEFAULT_POOL_IDLE_TIMEOUT,
            MAX_POOL_IDLE_TIMEOUT,
        );
        let pool_max_idle = self.count(
            raw.pool_max_idle_per_backend,
            "http.pool_max_idle_per_backend",
            DEFAULT_POOL_MAX_IDLE,
            0..=MAX_POOL_MAX_IDLE,
        );
        HttpConfig {
            expose_backend: raw.expose_backend.unwrap_or(false),
            reuse: raw.reuse.unwrap_or_default(),
            response_timeout,
            stream_idle_timeout,
            body_timeout,
            keepalive_timeout,
            first_byte_timeout,
            pool_idle_timeout,
            // At most MAX_POOL_MAX_IDLE, so this fits any usize.
            pool_max_idle_per_backend: pool_max_idle as usize,
            idle_timeout_unused,
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
        let h2_resets_per_second = self.count(
            raw.value.h2_resets_per_second,
            "limits.h2_resets_per_second",
            DEFAULT_H2_RESETS_PER_SECOND,
            1..=MAX_H2_RESETS_PER_SECOND,
        );
        LimitsConfig {
            // At most MAX_MAX_HEAD_BYTES, so this fits any usize.
            max_head_bytes: max_head_bytes as usize,
            key_buffer_bytes,
            h2_resets_per_second,
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::test_util::{parse, problems};
    use crate::config::{
        HttpConfig, MAX_FIRST_BYTE_TIMEOUT, MAX_HTTP_TIMEOUT, MAX_POOL_IDLE_TIMEOUT,
        MAX_POOL_MAX_IDLE,
    };

    fn http(section: &str) -> String {
        format!(
            "mode: http\nlisten: 127.0.0.1:7000\n{section}backends:\n  - {{name: a, addr: 127.0.0.1:8001}}\n"
        )
    }

    #[test]
    fn http_deadlines_have_defaults_and_inclusive_bounds() {
        let c = parse(&http("")).unwrap();
        assert_eq!(c.http, HttpConfig::default());
        assert_eq!(c.http.response_timeout, Duration::from_secs(300));
        assert_eq!(c.http.stream_idle_timeout, Duration::from_secs(300));
        assert_eq!(c.http.keepalive_timeout, Duration::from_secs(60));
        assert_eq!(c.http.first_byte_timeout, Duration::from_secs(10));
        assert_eq!(c.http.pool_idle_timeout, Duration::from_secs(4));
        assert_eq!(c.http.pool_max_idle_per_backend, 32);
        let c = parse(&http("http: {response_timeout: 24h, stream_idle_timeout: 1d, keepalive_timeout: 24h, first_byte_timeout: 1h, pool_idle_timeout: 1h, pool_max_idle_per_backend: 10000}\n")).unwrap();
        let h = &c.http;
        assert_eq!(
            (
                h.response_timeout,
                h.stream_idle_timeout,
                h.keepalive_timeout
            ),
            (MAX_HTTP_TIMEOUT, MAX_HTTP_TIMEOUT, MAX_HTTP_TIMEOUT)
        );
        assert_eq!(h.first_byte_timeout, MAX_FIRST_BYTE_TIMEOUT);
        assert_eq!(h.pool_idle_timeout, MAX_POOL_IDLE_TIMEOUT);
        assert_eq!(h.pool_max_idle_per_backend as u64, MAX_POOL_MAX_IDLE);
        // No idle connections at all is a choice, not a mistake.
        let c = parse(&http(
            "http: {pool_max_idle_per_backend: 0, response_timeout: 1ms}\n",
        ))
        .unwrap();
        assert_eq!(c.http.pool_max_idle_per_backend, 0);
        assert_eq!(c.http.response_timeout, Duration::from_millis(1));
    }

    #[test]
    fn http_deadlines_out_of_bounds_are_errors_at_their_place() {
        for (section, want) in [
            (
                "http: {response_timeout: 0s}\n",
                "test.yaml:3:26: http.response_timeout must be greater than zero",
            ),
            (
                "http: {stream_idle_timeout: 25h}\n",
                "test.yaml:3:29: http.stream_idle_timeout 1day 1h is too long (at most 1day)",
            ),
            (
                "http: {keepalive_timeout: 0ms}\n",
                "http.keepalive_timeout must be greater than zero",
            ),
            (
                "http: {first_byte_timeout: 2h}\n",
                "http.first_byte_timeout 2h is too long (at most 1h)",
            ),
            (
                "http: {pool_idle_timeout: 61m}\n",
                "http.pool_idle_timeout 1h 1m is too long (at most 1h)",
            ),
            (
                "http: {pool_max_idle_per_backend: 10001}\n",
                "http.pool_max_idle_per_backend 10001 is too large (at most 10000)",
            ),
            ("http: {pool_idle: 4s}\n", "pool_idle"),
        ] {
            let p = problems(&http(section)).join("\n");
            assert!(
                p.contains(want),
                "for {section:?} expected {want:?} in:\n{p}"
            );
        }
        // Mode tcp has no http section, deadlines included.
        let tcp = "listen: 127.0.0.1:7000\nhttp: {response_timeout: 1m}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n";
        assert!(problems(tcp)[0].contains("the http section needs mode: http"));
    }

    #[test]
    fn idle_timeout_is_noted_as_unused_in_mode_http_only() {
        let c = parse(&http("idle_timeout: 10m\n")).unwrap();
        assert!(c.http.idle_timeout_unused);
        assert!(!parse(&http("")).unwrap().http.idle_timeout_unused);
        let tcp = "listen: 127.0.0.1:7000\nidle_timeout: 10m\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n";
        assert!(!parse(tcp).unwrap().http.idle_timeout_unused);
    }
}
