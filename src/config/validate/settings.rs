//! Validation of the settings sections: `key`, `connect`, `proxy_protocol`,
//! `health` and `reload`.
//!
//! Part of [`Validator`]: the parent file validates the pool (listen, admin,
//! backends, placement) and the top-level fields and calls these for the
//! sections that tune how a connection is keyed, connected and watched. Each
//! fills in its defaults and checks its bounds with the parent's helpers, so a
//! `Config` never holds a value outside what README documents.

use std::net::IpAddr;

use ipnet::IpNet;
use serde_saphyr::{Location, Spanned};

use super::Validator;
use crate::config::raw::{
    KeyFrom, ProxySend, RawConnect, RawHealth, RawKey, RawProxyProtocol, RawReload,
};
use crate::config::{
    AllDown, ConnectConfig, DEFAULT_ATTEMPTS, DEFAULT_CONNECT_TIMEOUT, DEFAULT_FALL,
    DEFAULT_HEALTH_INTERVAL, DEFAULT_HEALTH_TIMEOUT, DEFAULT_MAX_BYTES, DEFAULT_PASSIVE_FAILURES,
    DEFAULT_PROXY_HEADER_TIMEOUT, DEFAULT_READ_TIMEOUT, DEFAULT_RISE, Fallback, HealthConfig,
    KeyConfig, MAX_ATTEMPTS, MAX_CONNECT_TIMEOUT, MAX_HEALTH_INTERVAL, MAX_HEALTH_TIMEOUT,
    MAX_MAX_BYTES, MAX_PASSIVE_FAILURES, MAX_POLL_INTERVAL, MAX_PROXY_HEADER_TIMEOUT,
    MAX_READ_TIMEOUT, MAX_RISE_FALL, MIN_MAX_BYTES, MIN_POLL_INTERVAL, ProxyProtocolConfig,
    ReloadConfig,
};

impl Validator<'_> {
    pub(super) fn key(&mut self, raw: Option<RawKey>) -> KeyConfig {
        let Some(raw) = raw else {
            return KeyConfig::SourceIp;
        };
        let from = raw
            .from
            .as_ref()
            .map(|f| f.value)
            .unwrap_or(KeyFrom::SourceIp);
        if from != KeyFrom::Header {
            // Header settings under a non-header key are a silent mistake.
            let stray = [
                raw.header.as_ref().map(|h| ("header", h.referenced)),
                raw.read_timeout
                    .as_ref()
                    .map(|h| ("read_timeout", h.referenced)),
                raw.max_bytes.as_ref().map(|h| ("max_bytes", h.referenced)),
                raw.fallback.as_ref().map(|h| ("fallback", h.referenced)),
            ];
            for (field, at) in stray.into_iter().flatten() {
                self.err(
                    &at,
                    format!("key.{field} only applies with key.from: header"),
                );
            }
            return match from {
                KeyFrom::SourceAddr => KeyConfig::SourceAddr,
                _ => KeyConfig::SourceIp,
            };
        }
        let name = match &raw.header {
            Some(h) => {
                let name = h.value.trim().to_ascii_lowercase();
                if name.is_empty() || !name.bytes().all(is_http_token_byte) {
                    self.err(
                        &h.referenced,
                        format!("{:?} is not a valid HTTP header name", h.value),
                    );
                }
                name
            }
            None => {
                let at = raw
                    .from
                    .as_ref()
                    .map(|f| f.referenced)
                    .unwrap_or(Location::UNKNOWN);
                self.err(&at, "key.from is header but key.header (the header name, e.g. x-session-id) is missing");
                String::new()
            }
        };
        let read_timeout = self.positive(
            raw.read_timeout,
            "key.read_timeout",
            DEFAULT_READ_TIMEOUT,
            MAX_READ_TIMEOUT,
        );
        let max_bytes = match &raw.max_bytes {
            Some(m) if m.value < MIN_MAX_BYTES || m.value > MAX_MAX_BYTES => {
                self.err(
                    &m.referenced,
                    format!(
                        "key.max_bytes {} is out of range ({MIN_MAX_BYTES} to {MAX_MAX_BYTES})",
                        m.value
                    ),
                );
                DEFAULT_MAX_BYTES
            }
            Some(m) => m.value,
            None => DEFAULT_MAX_BYTES,
        };
        let fallback = raw.fallback.map(|f| f.value).unwrap_or(Fallback::SourceIp);
        KeyConfig::Header {
            name,
            read_timeout,
            max_bytes: max_bytes as usize,
            fallback,
        }
    }

    pub(super) fn connect(&mut self, raw: Option<RawConnect>) -> ConnectConfig {
        let Some(raw) = raw else {
            return ConnectConfig {
                timeout: DEFAULT_CONNECT_TIMEOUT,
                attempts: DEFAULT_ATTEMPTS,
            };
        };
        let timeout = self.positive(
            raw.timeout,
            "connect.timeout",
            DEFAULT_CONNECT_TIMEOUT,
            MAX_CONNECT_TIMEOUT,
        );
        let attempts = self.count(
            raw.attempts,
            "connect.attempts",
            DEFAULT_ATTEMPTS,
            1..=u64::from(MAX_ATTEMPTS),
        );
        ConnectConfig { timeout, attempts }
    }

    pub(super) fn proxy_protocol(&mut self, raw: Option<RawProxyProtocol>) -> ProxyProtocolConfig {
        let Some(raw) = raw else {
            return ProxyProtocolConfig {
                header_timeout: DEFAULT_PROXY_HEADER_TIMEOUT,
                ..Default::default()
            };
        };
        let mut accept_from = Vec::new();
        for item in &raw.accept_from {
            let text = item.value.trim();
            let parsed = text
                .parse::<IpNet>()
                .or_else(|_| text.parse::<IpAddr>().map(IpNet::from));
            match parsed {
                Ok(net) => accept_from.push(net.trunc()),
                Err(_) => self.err(&item.referenced, format!("{text:?} is not an address or CIDR block (write e.g. 10.0.0.0/8 or 127.0.0.1)")),
            }
        }
        let header_timeout = self.positive(
            raw.header_timeout,
            "proxy_protocol.header_timeout",
            DEFAULT_PROXY_HEADER_TIMEOUT,
            MAX_PROXY_HEADER_TIMEOUT,
        );
        ProxyProtocolConfig {
            accept_from,
            header_timeout,
            send_v2: raw.send.map(|s| s.value == ProxySend::V2).unwrap_or(false),
        }
    }

    pub(super) fn health(&mut self, raw: Spanned<RawHealth>) -> HealthConfig {
        let at = raw.referenced;
        let raw = raw.value;
        let interval = self.positive(
            raw.interval,
            "health.interval",
            DEFAULT_HEALTH_INTERVAL,
            MAX_HEALTH_INTERVAL,
        );
        let timeout = self.positive(
            raw.timeout,
            "health.timeout",
            DEFAULT_HEALTH_TIMEOUT,
            MAX_HEALTH_TIMEOUT,
        );
        let streak = 1..=u64::from(MAX_RISE_FALL);
        let rise = self.count(raw.rise, "health.rise", DEFAULT_RISE, streak.clone());
        let fall = self.count(raw.fall, "health.fall", DEFAULT_FALL, streak);
        let passive_failures = self.count(
            raw.passive_failures,
            "health.passive_failures",
            DEFAULT_PASSIVE_FAILURES,
            0..=u64::from(MAX_PASSIVE_FAILURES),
        );
        if timeout > interval {
            self.err(
                &at,
                format!(
                    "health.timeout ({}) is longer than health.interval ({})",
                    humantime::format_duration(timeout),
                    humantime::format_duration(interval)
                ),
            );
        }
        HealthConfig {
            interval,
            timeout,
            rise,
            fall,
            passive_failures,
            when_all_down: raw
                .when_all_down
                .map(|w| w.value)
                .unwrap_or(AllDown::TryAnyway),
        }
    }

    pub(super) fn reload(&mut self, raw: Option<RawReload>) -> ReloadConfig {
        let Some(raw) = raw else {
            return ReloadConfig {
                watch: true,
                poll_interval: None,
            };
        };
        let poll_interval = raw.poll_interval.map(|p| {
            if p.value.0 < MIN_POLL_INTERVAL {
                self.err(
                    &p.referenced,
                    format!(
                        "reload.poll_interval must be at least {}",
                        humantime::format_duration(MIN_POLL_INTERVAL)
                    ),
                );
            }
            self.at_most(&p, "reload.poll_interval", MAX_POLL_INTERVAL)
                .unwrap_or(p.value.0)
        });
        ReloadConfig {
            watch: raw.watch.unwrap_or(true),
            poll_interval,
        }
    }
}

/// RFC 9110 `tchar`: the bytes allowed in a header field name.
fn is_http_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}
