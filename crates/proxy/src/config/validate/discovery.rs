//! Validation of DNS discovery: `backends[].dns`, `backends[].srv` and the
//! `discovery` section. The names are resolved later, by
//! [`crate::routing::discovery`], at start and every `discovery.interval`.

use std::net::SocketAddr;

use serde_saphyr::{Location, Spanned};

use super::Validator;
use crate::config::raw::{RawBackend, RawDiscovery};
use crate::config::{
    DEFAULT_DISCOVERY_INTERVAL, DiscoveryConfig, MAX_DISCOVERY_INTERVAL, MAX_WEIGHT,
    MIN_DISCOVERY_INTERVAL, Source, SourceConfig,
};

impl Validator<'_> {
    /// A `dns` or `srv` entry of `backends` (`b` has one of them).
    pub(super) fn source(&mut self, b: RawBackend, at: &Location) -> Option<SourceConfig> {
        for (field, given) in [("name", b.name.is_some()), ("addr", b.addr.is_some())] {
            if given {
                self.err(
                    at,
                    format!("a dns or srv backend entry has no {field}: its backends are named by what the name resolves to"),
                );
            }
        }
        let source = match (b.dns, b.srv) {
            (Some(_), Some(srv)) => {
                self.err(&srv.referenced, "a backend entry has dns or srv, not both");
                return None;
            }
            (Some(dns), None) => {
                let text = dns.value.trim();
                match text.rsplit_once(':') {
                    Some((host, port))
                        if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) =>
                    {
                        Source::Dns {
                            host: host
                                .trim_start_matches('[')
                                .trim_end_matches(']')
                                .to_string(),
                            port: port.parse().unwrap_or_default(),
                        }
                    }
                    _ => {
                        self.err(
                            &dns.referenced,
                            format!("dns {text:?} is not host:port (write e.g. vllm.default.svc.cluster.local:8000)"),
                        );
                        return None;
                    }
                }
            }
            (None, Some(srv)) => {
                let text = srv.value.trim();
                if !text.starts_with('_') || text.split('.').count() < 3 {
                    self.err(
                        &srv.referenced,
                        format!("srv {text:?} is not a service name (write e.g. _http._tcp.vllm.default.svc.cluster.local)"),
                    );
                    return None;
                }
                if b.weight.is_some() {
                    self.err(
                        at,
                        "an srv entry takes its weights from the SRV records; leave weight out",
                    );
                }
                Source::Srv {
                    name: text.to_string(),
                }
            }
            (None, None) => return None,
        };
        let weight = match b.weight {
            Some(w) if w.value > MAX_WEIGHT => {
                self.err(
                    &w.referenced,
                    format!("weight {} is too large (at most {MAX_WEIGHT})", w.value),
                );
                1
            }
            Some(w) => w.value,
            None => 1,
        };
        let zone = (b.zone.map(|z| z.value.trim().to_string())).filter(|z| !z.is_empty());
        Some(SourceConfig {
            source,
            weight,
            zone,
            max_inflight: self.backend_max_inflight(b.max_inflight),
        })
    }

    /// The `discovery` section, for the `dns`/`srv` entries found.
    pub(super) fn discovery(
        &mut self,
        raw: Option<Spanned<RawDiscovery>>,
        sources: Vec<SourceConfig>,
    ) -> Option<DiscoveryConfig> {
        if sources.is_empty() {
            if let Some(raw) = raw {
                self.err(
                    &raw.referenced,
                    "discovery needs a backend entry with dns or srv",
                );
            }
            return None;
        }
        let (interval, resolver) = match raw {
            None => (None, None),
            Some(r) => (r.value.interval, r.value.resolver),
        };
        let interval = match interval {
            Some(i) if i.value.0 < MIN_DISCOVERY_INTERVAL => {
                self.err(
                    &i.referenced,
                    format!(
                        "discovery.interval {} is too short (at least {})",
                        humantime::format_duration(i.value.0),
                        humantime::format_duration(MIN_DISCOVERY_INTERVAL)
                    ),
                );
                DEFAULT_DISCOVERY_INTERVAL
            }
            Some(i) => self
                .at_most(&i, "discovery.interval", MAX_DISCOVERY_INTERVAL)
                .unwrap_or(DEFAULT_DISCOVERY_INTERVAL),
            None => DEFAULT_DISCOVERY_INTERVAL,
        };
        let resolver = resolver.and_then(|r| {
            let text = r.value.trim();
            match text.parse::<SocketAddr>() {
                Ok(addr) => Some(addr),
                Err(_) => {
                    self.err(
                        &r.referenced,
                        format!("discovery.resolver {text:?} is not an ip:port address (write e.g. 10.96.0.10:53)"),
                    );
                    None
                }
            }
        });
        Some(DiscoveryConfig {
            interval,
            resolver,
            sources,
        })
    }
}
