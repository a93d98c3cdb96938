//! Validation of the settings sections: `connect`, `proxy_protocol`,
//! `health` and `reload`.
//!
//! Part of [`Validator`]: the parent file validates the top-level fields and
//! calls these for the sections that tune how a connection is connected and
//! watched. Each
//! fills in its defaults and checks its bounds with the parent's helpers, so a
//! `Config` never holds a value outside what docs/configuration.md documents.

use std::net::IpAddr;

use ipnet::IpNet;
use serde_saphyr::Spanned;

use super::Validator;
use crate::config::raw::{ProxySend, RawConnect, RawHealth, RawProxyProtocol, RawReload};
use crate::config::{
    AllDown, ConnectConfig, DEFAULT_ATTEMPTS, DEFAULT_CONNECT_TIMEOUT, DEFAULT_FALL,
    DEFAULT_HEALTH_INTERVAL, DEFAULT_HEALTH_TIMEOUT, DEFAULT_PASSIVE_FAILURES,
    DEFAULT_PROXY_HEADER_TIMEOUT, DEFAULT_RISE, HealthConfig, MAX_ATTEMPTS, MAX_CONNECT_TIMEOUT,
    MAX_HEALTH_INTERVAL, MAX_HEALTH_TIMEOUT, MAX_PASSIVE_FAILURES, MAX_POLL_INTERVAL,
    MAX_PROXY_HEADER_TIMEOUT, MAX_RISE_FALL, MIN_POLL_INTERVAL, Mode, ProxyProtocolConfig,
    ReloadConfig,
};

impl Validator<'_> {
    /// `proxy_protocol.send` is mode tcp's only.
    pub(super) fn send_needs_tcp(&mut self, raw: Option<&RawProxyProtocol>, mode: Mode) {
        if mode == Mode::Http
            && let Some(send) = raw.and_then(|p| p.send.as_ref())
        {
            self.err(&send.referenced, "proxy_protocol.send needs mode: tcp (in mode http, upstream connections are pooled and carry many clients)");
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

    pub(super) fn health(&mut self, raw: Spanned<RawHealth>, mode: Mode) -> HealthConfig {
        let at = raw.referenced;
        let mut raw = raw.value;
        let mut http = HealthConfig::default();
        self.http_health(&mut raw, mode, &mut http);
        let (port, datagram) = self.probe_target(&mut raw, mode, at);
        let load = raw.load.take().map(|l| self.load(l));
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
            load,
            port,
            datagram,
            ..http
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
