//! Validation: a [`RawConfig`] becomes a [`Config`], or a list of every
//! problem with its line and column.
//!
//! Second step of the config arrow, between [`raw`](super::raw) (what the YAML
//! says) and [`Config`] (what the rest of magpie uses). Loose values become
//! real types (socket addresses, durations, CIDR blocks, enums), defaults are
//! filled in, and ranges and cross-field rules are checked here and only here,
//! so an invalid `Config` cannot be built. The validator keeps going after a
//! problem, so `check` reports them all at once. Host names go to
//! [`resolve`](super::resolve), the only I/O on the way.
//!
//! This file holds the validator, its bound helpers, the top-level fields
//! (listen, admin, placement); the rest is one file per concern:
//!
//! | file | validates |
//! |---|---|
//! | `backends.rs` | `backends` written with `name` and `addr` |
//! | `discovery.rs` | `backends` entries with `dns` or `srv`, and `discovery` |
//! | `key.rs` | the `key` section |
//! | `settings.rs` | the sections that tune a connection (connect, proxy_protocol, health, reload) |
//! | `load.rs` | `health.load`: engine load signals, their gauges and limits |
//! | `modes.rs` | what depends on `mode`: `copy`, `http`, `sessions`, HTTP health |
//! | `metrics.rs` | the `metrics` section |
//! | `access_log.rs` | the `access_log` section: path, format, fields, sample, queue |
//! | `tls.rs` | a `listen` entry's `tls`: its certificate files, loaded |
//! | `upstream_tls.rs` | TLS to backends: `backends[].tls` and `upstream_tls` (the CA file read, its client config made) |

use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::Path;
use std::time::Duration;

use serde_saphyr::{Location, Spanned};

use super::raw::{HumanDuration, RawConfig, RawPlacement};
use super::raw_listen::Listen;
use super::resolve;
use super::{
    Algorithm, BackendConfig, Config, ConfigError, ConfigErrors, DEFAULT_ADMIN,
    DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_POINTS_PER_WEIGHT,
    DEFAULT_SHUTDOWN_GRACE, DEFAULT_SPILL_MIN_EXCESS, DEFAULT_UDP_IDLE_TIMEOUT, ListenerTls,
    MAX_DRAIN_TIMEOUT, MAX_IDLE_TIMEOUT, MAX_MAX_CONNECTIONS, MAX_RING_POINTS, MAX_SHUTDOWN_GRACE,
    MAX_SLOW_START, MAX_SPILL_MIN_EXCESS, MAX_TABLE_SIZE, Mode, Place, PlacementConfig, Places,
};
use magpie_core::placement::{bounded, maglev};

mod access_log;
mod backends;
mod disaggregation;
mod discovery;
mod engine_load;
mod key;
mod metrics;
mod modes;
mod queue;
mod settings;
mod tls;
mod udp;
mod upstream_tls;

pub(super) struct Validator<'a> {
    file: &'a Path,
    names: resolve::Names,
    errors: Vec<ConfigError>,
    /// Where a backend's `max_inflight` was first written: it needs `queue`.
    inflight_written: Option<Location>,
}

impl<'a> Validator<'a> {
    pub(super) fn new(file: &'a Path, names: resolve::Names) -> Self {
        Validator {
            file,
            names,
            errors: Vec::new(),
            inflight_written: None,
        }
    }

    fn err(&mut self, at: &Location, problem: impl Into<String>) {
        self.errors.push(ConfigError {
            file: self.file.to_path_buf(),
            line: at.line(),
            column: at.column(),
            problem: problem.into(),
        });
    }

    /// A duration above zero and at most `max`; `default` when absent or
    /// wrong (the error is recorded).
    fn positive(
        &mut self,
        d: Option<Spanned<HumanDuration>>,
        what: &str,
        default: Duration,
        max: Duration,
    ) -> Duration {
        match d {
            Some(d) if d.value.0.is_zero() => {
                self.err(&d.referenced, format!("{what} must be greater than zero"));
                default
            }
            Some(d) => self.at_most(&d, what, max).unwrap_or(default),
            None => default,
        }
    }

    /// `d` if it is at most `max`; otherwise the error is recorded.
    fn at_most(
        &mut self,
        d: &Spanned<HumanDuration>,
        what: &str,
        max: Duration,
    ) -> Option<Duration> {
        if d.value.0 <= max {
            return Some(d.value.0);
        }
        self.err(
            &d.referenced,
            format!(
                "{what} {} is too long (at most {})",
                humantime::format_duration(d.value.0),
                humantime::format_duration(max)
            ),
        );
        None
    }

    /// A count within `range`; `default` when absent or out of range (the
    /// error is recorded).
    fn count<T: Copy + Into<u64>>(
        &mut self,
        v: Option<Spanned<T>>,
        what: &str,
        default: T,
        range: RangeInclusive<u64>,
    ) -> T {
        let Some(v) = v else {
            return default;
        };
        let n: u64 = v.value.into();
        if n < *range.start() {
            self.err(
                &v.referenced,
                format!("{what} must be at least {}", range.start()),
            );
        } else if n > *range.end() {
            self.err(
                &v.referenced,
                format!("{what} {n} is too large (at most {})", range.end()),
            );
        } else {
            return v.value;
        }
        default
    }

    pub(super) fn validate(mut self, mut raw: RawConfig) -> Result<Config, ConfigErrors> {
        let mode = raw.mode.map(|m| m.value).unwrap_or_default();
        let mut places = Places::default();
        let (listen, tls) = self.listen(raw.listen, mode, &mut places);
        let admin = self.admin(raw.admin, &listen, &mut places);
        let split = self.disaggregation(raw.disaggregation, mode);
        let protocol = split.as_ref().map(|(c, _)| c.protocol);
        let (mut backends, sources, upstream_tls) =
            self.backends(raw.backends, &listen, admin, protocol);
        let disaggregation = self.pools(split, &backends, !sources.is_empty());
        self.upstream_tls(raw.upstream_tls, mode, &mut backends, upstream_tls);
        let discovery = self.discovery(raw.discovery, sources);
        let placement = self.placement(raw.placement, &backends);
        let raw_group = raw.key.as_mut().and_then(|k| k.group.take());
        let raw_choices = raw.key.as_mut().and_then(|k| k.group_choices.take());
        let key = self.key(raw.key, mode);
        let connect = self.connect(raw.connect);
        let idle_written = raw.idle_timeout.is_some();
        let idle_timeout = self.idle_timeout(raw.idle_timeout, mode);
        let max_connections = self.max_connections(raw.max_connections);
        let shutdown_grace = self.shutdown_grace(raw.shutdown_grace);
        let drain_timeout = self.drain_timeout(raw.drain_timeout);
        self.send_needs_tcp(raw.proxy_protocol.as_ref(), mode);
        self.proxy_protocol_needs_streams(raw.proxy_protocol.as_ref(), mode);
        let copy = self.copy(raw.copy, mode);
        let proxy_protocol = self.proxy_protocol(raw.proxy_protocol);
        let health = raw.health.map(|h| self.health(h, mode));
        let reload = self.reload(raw.reload);
        let http = self.http(raw.http, mode, idle_written);
        let sessions = self.sessions(raw.sessions, mode);
        let limits = self.limits(raw.limits, mode);
        let group = self.group(raw_group, &key, mode, sessions.is_some());
        let group_choices = self.group_choices(raw_choices, group.is_some(), connect.attempts);
        let access_log = self.access_log(raw.access_log);
        let queue = self.queue(raw.queue, mode, group.is_some(), key.read().is_some());
        let udp = self.udp(raw.udp, mode);

        if self.errors.is_empty() {
            Ok(Config {
                mode,
                source: self.file.to_path_buf(),
                content_hash: 0,
                listen,
                tls,
                admin,
                places,
                placement,
                key,
                group,
                group_choices,
                connect,
                idle_timeout,
                // At most MAX_MAX_CONNECTIONS, so this fits any usize.
                max_connections: max_connections as usize,
                copy,
                shutdown_grace,
                drain_timeout,
                proxy_protocol,
                health,
                reload,
                http,
                limits,
                sessions,
                backends,
                discovery,
                metrics: Validator::metrics(raw.metrics),
                access_log,
                queue,
                udp,
                disaggregation,
            })
        } else {
            self.errors.sort_by_key(|e| (e.line, e.column));
            Err(ConfigErrors(self.errors))
        }
    }

    /// `max_connections`.
    fn max_connections(&mut self, raw: Option<Spanned<u64>>) -> u64 {
        let range = 1..=MAX_MAX_CONNECTIONS;
        self.count(raw, "max_connections", DEFAULT_MAX_CONNECTIONS, range)
    }

    /// `idle_timeout`, whose default depends on the mode (a UDP flow's is
    /// shorter: nothing says when it ends).
    fn idle_timeout(&mut self, raw: Option<Spanned<HumanDuration>>, mode: Mode) -> Duration {
        let default = match mode {
            Mode::Udp => DEFAULT_UDP_IDLE_TIMEOUT,
            _ => DEFAULT_IDLE_TIMEOUT,
        };
        self.positive(raw, "idle_timeout", default, MAX_IDLE_TIMEOUT)
    }

    /// `shutdown_grace`: zero is allowed, and closes open connections at once.
    fn shutdown_grace(&mut self, raw: Option<Spanned<HumanDuration>>) -> Duration {
        raw.and_then(|d| self.at_most(&d, "shutdown_grace", MAX_SHUTDOWN_GRACE))
            .unwrap_or(DEFAULT_SHUTDOWN_GRACE)
    }

    /// `drain_timeout`: off unless written; never zero.
    fn drain_timeout(&mut self, raw: Option<Spanned<HumanDuration>>) -> Option<Duration> {
        raw.map(|d| {
            if d.value.0.is_zero() {
                self.err(&d.referenced, "drain_timeout must be greater than zero (leave it out to let connections to removed backends finish on their own)");
            }
            self.at_most(&d, "drain_timeout", MAX_DRAIN_TIMEOUT)
                .unwrap_or(d.value.0)
        })
    }

    fn socket_addr(&mut self, s: &Spanned<String>, what: &str) -> Option<SocketAddr> {
        match s.value.trim().parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                self.err(
                    &s.referenced,
                    format!("{what} {:?} is not an ip:port address (write e.g. 127.0.0.1:7000 or [::1]:7000)", s.value),
                );
                None
            }
        }
    }

    /// The `listen` addresses, and each one's TLS (`None`: cleartext).
    fn listen(
        &mut self,
        raw: Spanned<Listen>,
        mode: Mode,
        places: &mut Places,
    ) -> (Vec<SocketAddr>, Vec<Option<ListenerTls>>) {
        let items = match raw.value {
            Listen::One(one) => vec![(
                Spanned {
                    value: one,
                    referenced: raw.referenced,
                    defined: raw.defined,
                },
                None,
            )],
            Listen::Many(many) => many.into_iter().map(tls::split_item).collect(),
        };
        if items.is_empty() {
            self.err(&raw.referenced, "listen needs at least one address");
        }
        let mut out: Vec<SocketAddr> = Vec::new();
        let mut out_tls = Vec::new();
        for (item, raw_tls) in items {
            let listener_tls = raw_tls.and_then(|t| self.listener_tls(t, mode));
            if let Some(addr) = self.socket_addr(&item, "listen address") {
                self.datagram_listen(addr, mode, &item.referenced);
                if out.contains(&addr) {
                    self.err(
                        &item.referenced,
                        format!("listen address {addr} is given twice"),
                    );
                } else {
                    out.push(addr);
                    out_tls.push(listener_tls);
                    places.listen.push(place(&item.referenced));
                }
            }
        }
        (out, out_tls)
    }

    fn admin(
        &mut self,
        raw: Option<Spanned<String>>,
        listen: &[SocketAddr],
        places: &mut Places,
    ) -> Option<SocketAddr> {
        let raw = match raw {
            None => return DEFAULT_ADMIN.parse().ok(),
            Some(r) if r.value.trim() == "off" => return None,
            Some(r) => r,
        };
        let addr = self.socket_addr(&raw, "admin address")?;
        places.admin = Some(place(&raw.referenced));
        if addr.port() != 0 && listen.contains(&addr) {
            self.err(
                &raw.referenced,
                format!("admin address {addr} is also a listen address"),
            );
        }
        Some(addr)
    }

    fn placement(
        &mut self,
        raw: Option<RawPlacement>,
        backends: &[BackendConfig],
    ) -> PlacementConfig {
        let raw = raw.unwrap_or_default();
        let algorithm = raw
            .algorithm
            .as_ref()
            .map(|a| a.value)
            .unwrap_or(Algorithm::Maglev);
        let table_size = self.table_size(&raw, algorithm, backends.len());
        let points_per_weight = match &raw.points_per_weight {
            Some(p) if algorithm != Algorithm::Ring => {
                self.err(
                    &p.referenced,
                    "points_per_weight applies to algorithm ring only",
                );
                p.value
            }
            Some(p) if p.value == 0 => {
                self.err(&p.referenced, "points_per_weight must be at least 1");
                p.value
            }
            Some(p) => p.value,
            None => DEFAULT_POINTS_PER_WEIGHT,
        };
        if algorithm == Algorithm::Ring && points_per_weight > 0 {
            self.ring_points(&raw, points_per_weight, backends);
        }
        let bounded_load = raw.bounded_load.as_ref().map(|b| {
            if bounded::check_factor(b.value).is_err() {
                self.err(&b.referenced, format!("bounded_load {} must be a number >= 1.0 (1.25 lets a backend take 25% more than its share)", b.value));
            }
            b.value
        });
        let spill_min_excess = self.spill_min_excess(&raw, bounded_load.is_some());
        let slow_start = (raw.slow_start.as_ref())
            .and_then(|d| self.at_most(d, "placement.slow_start", MAX_SLOW_START))
            .filter(|d| !d.is_zero());
        PlacementConfig {
            algorithm,
            table_size,
            points_per_weight,
            bounded_load,
            spill_min_excess,
            slow_start,
        }
    }

    /// `table_size`: Maglev only, prime, at most [`MAX_TABLE_SIZE`], at
    /// least one slot per backend.
    fn table_size(&mut self, raw: &RawPlacement, algorithm: Algorithm, backends: usize) -> u64 {
        match &raw.table_size {
            Some(t) => {
                if algorithm != Algorithm::Maglev {
                    self.err(&t.referenced, "table_size applies to algorithm maglev only");
                } else if !maglev::is_prime(t.value) {
                    self.err(
                        &t.referenced,
                        format!(
                            "table_size {} is not prime (try 65537, 131071 or 655373)",
                            t.value
                        ),
                    );
                } else if t.value > MAX_TABLE_SIZE {
                    self.err(
                        &t.referenced,
                        format!(
                            "table_size {} is too large (at most {MAX_TABLE_SIZE})",
                            t.value
                        ),
                    );
                } else if (t.value as usize) < backends {
                    self.err(
                        &t.referenced,
                        format!(
                            "table_size {} is smaller than the number of backends ({})",
                            t.value, backends
                        ),
                    );
                }
                t.value
            }
            None => maglev::DEFAULT_TABLE_SIZE,
        }
    }

    /// `spill_min_excess`: only beside `bounded_load`, at most
    /// [`MAX_SPILL_MIN_EXCESS`].
    fn spill_min_excess(&mut self, raw: &RawPlacement, bounded: bool) -> u64 {
        let Some(e) = &raw.spill_min_excess else {
            return DEFAULT_SPILL_MIN_EXCESS;
        };
        if !bounded {
            self.err(
                &e.referenced,
                "spill_min_excess applies only with bounded_load",
            );
        } else if e.value > MAX_SPILL_MIN_EXCESS {
            self.err(
                &e.referenced,
                format!(
                    "spill_min_excess {} must be at most {MAX_SPILL_MIN_EXCESS}",
                    e.value
                ),
            );
        }
        e.value
    }

    /// The ring's size is checked whatever set `points_per_weight`: the
    /// default times large weights builds a ring as surely as a written value.
    /// The error points at `points_per_weight` if written, else at `algorithm`.
    fn ring_points(&mut self, raw: &RawPlacement, per_weight: u32, backends: &[BackendConfig]) {
        let weight: u64 = backends.iter().map(|b| u64::from(b.weight)).sum();
        let total = weight.saturating_mul(u64::from(per_weight));
        if total <= MAX_RING_POINTS {
            return;
        }
        match (&raw.points_per_weight, &raw.algorithm) {
            (Some(p), _) => self.err(&p.referenced, format!("the ring would have {total} points (at most {MAX_RING_POINTS}); lower points_per_weight or the weights")),
            (None, a) => self.err(
                &a.as_ref().map_or(Location::UNKNOWN, |a| a.referenced),
                format!("the ring would have {total} points with the default points_per_weight {per_weight} (at most {MAX_RING_POINTS}); set a lower points_per_weight or lower the weights"),
            ),
        }
    }
}

fn place(at: &Location) -> Place {
    Place {
        line: at.line(),
        column: at.column(),
    }
}

/// Whether connecting to `backend` would reach magpie's own socket `own`:
/// the same address; or the same port where one side is a wildcard and
/// the other a local address (a listener on `0.0.0.0:P` takes connections to
/// every local IPv4 address, and connecting to `0.0.0.0:P` reaches
/// `127.0.0.1:P`). Port 0 (any port) cannot be checked.
pub(crate) fn reaches(backend: SocketAddr, own: SocketAddr) -> bool {
    if own.port() == 0 || backend.port() != own.port() || backend.is_ipv4() != own.is_ipv4() {
        return backend == own && own.port() != 0;
    }
    let (b, o) = (backend.ip(), own.ip());
    b == o
        || (o.is_unspecified() && is_local(b))
        || (b.is_unspecified() && (o.is_loopback() || o.is_unspecified()))
}

/// Whether `ip` is an address of this machine: loopback, unspecified, or one
/// a socket can bind to (a bind to a foreign address fails at once).
fn is_local(ip: std::net::IpAddr) -> bool {
    ip.is_loopback() || ip.is_unspecified() || std::net::UdpSocket::bind((ip, 0)).is_ok()
}

#[cfg(test)]
mod tests {
    use crate::config::test_util::{parse, problems};
    use crate::config::{
        MAX_ATTEMPTS, MAX_IDLE_TIMEOUT, MAX_MAX_CONNECTIONS, MAX_PASSIVE_FAILURES,
        MAX_POLL_INTERVAL, MAX_RISE_FALL,
    };

    #[test]
    fn semantic_errors_name_their_place() {
        let p = problems(
            "listen: 127.0.0.1:7000\nbackends:\n  - name: a\n    addr: 127.0.0.1:8001\n  - name: a\n    addr: 127.0.0.1:8002\n",
        );
        assert_eq!(
            p,
            vec![
                "test.yaml:5:11: duplicate backend name \"a\": names are identities and must be unique"
            ]
        );
        let p = problems(
            "listen: 127.0.0.1:7000\nbackends:\n  - name: a\n    addr: 127.0.0.1:8001\n  - name: b\n    addr: 127.0.0.1:8001\n",
        );
        assert!(
            p[0].starts_with("test.yaml:6:11: backend \"b\" has the same address"),
            "{p:?}"
        );
    }

    #[test]
    fn every_bound_is_inclusive() {
        let c = parse(
            "listen: 127.0.0.1:7000\nconnect: {timeout: 5m, attempts: 64}\nkey: {from: header, header: x-id, read_timeout: 5m}\nidle_timeout: 7d\nmax_connections: 1000000\nshutdown_grace: 1h\ndrain_timeout: 7d\nproxy_protocol: {header_timeout: 5m}\nhealth: {interval: 1h, timeout: 5m, rise: 100, fall: 100, passive_failures: 1000}\nreload: {poll_interval: 1d}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001, weight: 10000}\n",
        )
        .unwrap();
        assert_eq!(c.max_connections as u64, MAX_MAX_CONNECTIONS);
        assert_eq!(c.connect.attempts, MAX_ATTEMPTS);
        assert_eq!(c.idle_timeout, MAX_IDLE_TIMEOUT);
        assert_eq!(c.reload.poll_interval, Some(MAX_POLL_INTERVAL));
        let health = c.health.unwrap();
        assert_eq!((health.rise, health.fall), (MAX_RISE_FALL, MAX_RISE_FALL));
        assert_eq!(health.passive_failures, MAX_PASSIVE_FAILURES);
        // 62,500 · 160 points is exactly the ring limit.
        let ring = "listen: 127.0.0.1:7000\nplacement: {algorithm: ring}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001, weight: 10000}\n  - {name: b, addr: 127.0.0.1:8002, weight: 10000}\n  - {name: c, addr: 127.0.0.1:8003, weight: 10000}\n  - {name: d, addr: 127.0.0.1:8004, weight: 10000}\n  - {name: e, addr: 127.0.0.1:8005, weight: 10000}\n  - {name: f, addr: 127.0.0.1:8006, weight: 10000}\n  - {name: g, addr: 127.0.0.1:8007, weight: 2500}\n";
        assert!(parse(ring).is_ok());
    }

    #[test]
    fn all_problems_are_reported_at_once() {
        let p = problems(
            "listen: 127.0.0.1:7000\nconnect: {timeout: 0s, attempts: 0}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
        );
        assert_eq!(p.len(), 2, "{p:?}");
    }
}
