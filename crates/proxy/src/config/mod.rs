//! The config file: YAML text → [`RawConfig`] (serde) → validated [`Config`].
//!
//! This is the first arrow of the data flow, in three rooms: `raw.rs` parses
//! (unknown fields and duplicate keys are errors), `validate/` turns loose
//! values into real types (socket addresses, durations, CIDR blocks, enums) so
//! an invalid `Config` cannot be built, and `resolve.rs` looks up host names in
//! `backends[].addr`, once per load; nothing on the data path resolves names.
//! This file holds what the rest of magpie uses: the validated types, the
//! errors, and every default and limit as a named constant, so the reference (docs/configuration.md), the
//! example configs and the code agree. Every problem is reported with the
//! file, line and column it comes from, and validation collects all problems
//! instead of stopping at the first.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;

use magpie_core::key::group::GroupBy;

mod access_log;
mod disaggregation;
mod duration;
mod engine_load;
mod error;
pub mod file;
mod key;
mod limits;
mod metrics;
mod queue;
mod udp;
pub use access_log::{
    AccessLogConfig, DEFAULT_ACCESS_LOG_QUEUE, LogField, LogFormat, LogTarget, MAX_ACCESS_LOG_QUEUE,
};
pub mod tls;
pub use disaggregation::*;
pub use engine_load::{Gauges, LoadConfig, LoadLimits, LoadPreset};
pub use error::{ConfigError, ConfigErrors, Place, Places};
pub use key::{KeyConfig, KeyRead, KeySources};
pub use limits::*;
pub use metrics::{MetricsConfig, PER_BACKEND_AUTO_MAX, PerBackend};
pub use queue::*;
pub use tls::{Certificate, ListenerTls};
pub use udp::{DatagramProbe, UdpConfig};
pub(crate) use validate::reaches;
mod raw;
mod raw_listen;
mod raw_udp;
mod resolve;
mod validate;

pub use raw::{HumanDuration, RawConfig};

/// The default admin/metrics address.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:9090";

// ---------------------------------------------------------------------------
// Validated: what the rest of magpie uses. The enums first are read by serde
// directly (raw.rs uses them too): their YAML spelling is their meaning.

/// The placement scheme behind the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    Maglev,
    Ring,
}

impl Algorithm {
    /// As written in the config (and shown by `/table` and the metrics).
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::Maglev => "maglev",
            Algorithm::Ring => "ring",
        }
    }
}

/// What a lookup does when every candidate is marked down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AllDown {
    /// Try the candidates anyway, primary first (fail open).
    TryAnyway,
    /// Close the client at once.
    Refuse,
}

/// How traffic is keyed and forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// One key per TCP connection; bytes are copied both ways.
    #[default]
    Tcp,
    /// One key per HTTP request; requests go over pooled connections.
    Http,
    /// One key per flow of datagrams (what one client address sends);
    /// each flow has its own socket towards its backend.
    Udp,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Tcp => "tcp",
            Mode::Http => "http",
            Mode::Udp => "udp",
        }
    }
}

/// How `mode: tcp` copies a connection's bytes (`copy`).
///
/// `buffered` is the default: on loopback, splice cuts the proxy's CPU per
/// Gbit/s to 0.62× with 8 streams but moves a single stream 0.84× as fast
/// (docs/performance.md), so it is a choice for hosts where the proxy's CPU
/// is the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyMode {
    /// Each direction starts buffered and turns to splice once it has moved
    /// more than [`SPLICE_AFTER`] bytes: short exchanges never pay for a
    /// pipe, bulk transfers skip the copy through userspace.
    Auto,
    /// Through pooled 16 KiB buffers in userspace.
    #[default]
    Buffered,
    /// splice(2) through pooled pipes (buffered where no pipe can be had:
    /// not Linux, or out of descriptors).
    Splice,
}

impl CopyMode {
    pub fn as_str(self) -> &'static str {
        match self {
            CopyMode::Auto => "auto",
            CopyMode::Buffered => "buffered",
            CopyMode::Splice => "splice",
        }
    }
}

impl fmt::Display for CopyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `tcp`, `http` or `udp`; a change needs a restart, like `listen`.
    pub mode: Mode,
    /// The file this came from (for messages), or `<inline>`.
    pub source: PathBuf,
    /// `h64` of the text this was parsed from: reload compares it to the file's
    /// current content to tell a real change from a touch.
    pub content_hash: u64,
    pub listen: Vec<SocketAddr>,
    /// One per `listen` address, in its order: the certificates of a
    /// listener that terminates TLS (mode http), `None` for cleartext.
    pub tls: Vec<Option<ListenerTls>>,
    pub admin: Option<SocketAddr>,
    /// Where `listen` and `admin` are written, so that a bind error at start
    /// can point at the line.
    pub places: Places,
    pub placement: PlacementConfig,
    pub key: KeyConfig,
    /// `key.group` (mode http, with `sessions`): what the table is looked up
    /// by for a conversation's first request; `key` is then the session key.
    /// `None` looks the table up by `key`, as without groups.
    pub group: Option<GroupBy>,
    /// `key.group_choices`: of how many of its first candidates a group
    /// without a pin takes the least busy (1: the table's first that takes
    /// it).
    pub group_choices: usize,
    pub connect: ConnectConfig,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    /// `mode: tcp`: how bytes are copied. Not in the fingerprint: it does
    /// not change where a key goes.
    pub copy: CopyMode,
    pub shutdown_grace: Duration,
    pub drain_timeout: Option<Duration>,
    pub proxy_protocol: ProxyProtocolConfig,
    pub health: Option<HealthConfig>,
    pub reload: ReloadConfig,
    pub http: HttpConfig,
    /// Memory bounds (mode http).
    pub limits: LimitsConfig,
    /// Session pins (`mode: http` only); `None` keeps routing stateless.
    pub sessions: Option<SessionsConfig>,
    /// In file order; placement sorts by name itself.
    /// The backends: the ones written in the file, and once discovery ran,
    /// the ones it found (`discovered`).
    pub backends: Vec<BackendConfig>,
    /// `dns` and `srv` entries, resolved again every `discovery.interval`.
    pub discovery: Option<DiscoveryConfig>,
    /// What `/metrics` writes for a large pool. Not in the fingerprint.
    pub metrics: MetricsConfig,
    /// One line per request (mode http) or connection (mode tcp); `None`
    /// is off. Not in the fingerprint.
    pub access_log: Option<AccessLogConfig>,
    /// Per-backend limits and the queue in front of them; `None`: requests
    /// (or connections) go out as they come.
    pub queue: Option<QueueConfig>,
    /// `mode: udp`: how flows end.
    pub udp: UdpConfig,
    /// Prefill and decode on separate pools (mode http); `None`: every
    /// backend serves whole requests.
    pub disaggregation: Option<DisaggregationConfig>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PlacementConfig {
    pub algorithm: Algorithm,
    pub table_size: u64,
    pub points_per_weight: u32,
    pub bounded_load: Option<f64>,
    /// With `bounded_load`: a key spills only when its candidate is also this
    /// many requests (or connections) above its mean share.
    pub spill_min_excess: u64,
    /// A backend that joins (added by a reload, or back up) takes over its
    /// keys over this long; `None`: at once.
    pub slow_start: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectConfig {
    pub timeout: Duration,
    pub attempts: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProxyProtocolConfig {
    /// Peers that must send a PROXY header; empty means PROXY input is off.
    pub accept_from: Vec<IpNet>,
    pub header_timeout: Duration,
    pub send_v2: bool,
}

impl ProxyProtocolConfig {
    pub fn is_trusted(&self, peer: IpAddr) -> bool {
        let peer = magpie_core::key::canonical_ip(peer);
        self.accept_from.iter().any(|net| net.contains(&peer))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct HealthConfig {
    pub interval: Duration,
    pub timeout: Duration,
    pub rise: u32,
    pub fall: u32,
    /// Consecutive data-path connect failures that mark a backend down; 0 = off.
    pub passive_failures: u32,
    pub when_all_down: AllDown,
    /// An HTTP check (`GET` this path) instead of a TCP connect.
    pub http_path: Option<String>,
    /// The statuses an HTTP check accepts.
    pub expect_status: RangeInclusive<u16>,
    /// `mode: http`: 502/503/504 answers count towards `passive_failures`.
    pub passive_status: bool,
    /// Engine load signals read from each backend's metrics; `None`: off.
    pub load: Option<LoadConfig>,
    /// Checks go to this port of the backend's address instead of its own
    /// (`health.port`; mode udp needs it unless `datagram` is set).
    pub port: Option<u16>,
    /// Mode udp: a datagram sent to the backend, whose answer must start
    /// with `expect` (`health.datagram`), instead of a TCP or HTTP check.
    pub datagram: Option<DatagramProbe>,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            interval: DEFAULT_HEALTH_INTERVAL,
            timeout: DEFAULT_HEALTH_TIMEOUT,
            rise: DEFAULT_RISE,
            fall: DEFAULT_FALL,
            passive_failures: DEFAULT_PASSIVE_FAILURES,
            when_all_down: AllDown::TryAnyway,
            http_path: None,
            expect_status: DEFAULT_EXPECT_STATUS,
            passive_status: false,
            load: None,
            port: None,
            datagram: None,
        }
    }
}

/// Which idle upstream connection a request may take (`http.reuse`): a
/// backend's connection is shared by every client, and a backend that
/// misbehaves (bytes after its answer, an answer that races the next
/// request) could answer whoever takes it next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reuse {
    /// A client connection's first request never takes a connection another
    /// client used; later requests take their own connection first, then
    /// any.
    #[default]
    Safe,
    /// Any request takes any idle connection, its own first.
    Always,
    /// A request takes only a connection its own client connection used.
    Never,
}

impl Reuse {
    pub fn as_str(self) -> &'static str {
        match self {
            Reuse::Safe => "safe",
            Reuse::Always => "always",
            Reuse::Never => "never",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// Add `x-magpie-backend: NAME` to responses.
    pub expose_backend: bool,
    /// Which idle upstream connection a request may take.
    pub reuse: Reuse,
    /// From a request's last byte sent to its response head; past it, `504`.
    pub response_timeout: Duration,
    /// The longest gap between the bytes of a response body; past it the
    /// client's stream is cut (a reset, never a clean end).
    pub stream_idle_timeout: Duration,
    /// The longest a request body may send nothing while it is passed on;
    /// past it the client gets `408` and the backend's connection closes.
    pub body_timeout: Duration,
    /// A client connection idle between requests is closed after this.
    pub keepalive_timeout: Duration,
    /// A client connection that has sent nothing at all is closed after this.
    pub first_byte_timeout: Duration,
    /// An idle pooled upstream connection is closed after this.
    pub pool_idle_timeout: Duration,
    /// Idle pooled upstream connections kept per backend at most.
    pub pool_max_idle_per_backend: usize,
    /// `idle_timeout` was written, which mode http does not use (`check`
    /// says so).
    pub idle_timeout_unused: bool,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            expose_backend: false,
            reuse: Reuse::Safe,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            stream_idle_timeout: DEFAULT_STREAM_IDLE_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
            first_byte_timeout: DEFAULT_FIRST_BYTE_TIMEOUT,
            pool_idle_timeout: DEFAULT_POOL_IDLE_TIMEOUT,
            pool_max_idle_per_backend: DEFAULT_POOL_MAX_IDLE as usize,
            idle_timeout_unused: false,
        }
    }
}

/// Memory bounds of mode http (`limits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitsConfig {
    /// The most of one request head (HTTP/1.1 and HTTP/2), and of what is
    /// queued towards a client that reads slowly.
    pub max_head_bytes: usize,
    /// The most body bytes all requests together hold while their keys are
    /// looked for.
    pub key_buffer_bytes: u64,
    /// Streams one HTTP/2 client may reset after dispatch, per second,
    /// before its connection gets GOAWAY.
    pub h2_resets_per_second: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_head_bytes: DEFAULT_MAX_HEAD_BYTES as usize,
            key_buffer_bytes: DEFAULT_KEY_BUFFER_BYTES,
            h2_resets_per_second: DEFAULT_H2_RESETS_PER_SECOND,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionsConfig {
    /// A pin is released after this long unused.
    pub ttl: Duration,
    /// At most this many pins; the least recently used goes first.
    pub max: usize,
    /// `store: redis`: pins shared by every magpie using the same Redis
    /// (the local map then caches them); `None` for `store: local`.
    pub redis: Option<RedisConfig>,
}

/// Where shared pins live (`sessions.redis`).
#[derive(Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// `host:port`, resolved when connecting.
    pub addr: String,
    /// Prepended to every key magpie writes.
    pub prefix: String,
    /// The longest a request waits on the store before routing by the table.
    pub timeout: Duration,
    pub username: Option<String>,
    pub password: Option<String>,
}

impl fmt::Debug for RedisConfig {
    // The password stays out of logs and `check`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("addr", &self.addr)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadConfig {
    pub watch: bool,
    pub poll_interval: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendConfig {
    pub name: String,
    /// As written, for messages (`gpu-0.internal:8000`).
    pub addr_text: String,
    pub addr: SocketAddr,
    pub weight: u32,
    pub zone: Option<String>,
    /// Found through a `dns` or `srv` entry, not written in the file.
    pub discovered: bool,
    /// `tls: true` (mode http): requests go over TLS, checked against
    /// `upstream_tls`.
    pub tls: Option<crate::net::tls_client::BackendTls>,
    /// `max_inflight` written for this backend (with `queue`), else
    /// `queue.max_inflight`.
    pub max_inflight: Option<u64>,
    /// Which halves of a disaggregated request it takes (`both` without
    /// `disaggregation`).
    pub role: Role,
    /// `disaggregation.protocol: sglang`: the port its engine's KV
    /// bootstrap server listens on.
    pub bootstrap_port: Option<u16>,
}

#[cfg(test)]
impl BackendConfig {
    /// A backend `name` at 127.0.0.1:`port`, as a file with only those
    /// writes it.
    pub(crate) fn local(name: &str, port: u16) -> BackendConfig {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        BackendConfig {
            name: name.into(),
            addr_text: addr.to_string(),
            addr,
            weight: 1,
            zone: None,
            discovered: false,
            tls: None,
            max_inflight: None,
            role: Role::Both,
            bootstrap_port: None,
        }
    }
}

/// Backends found through DNS (`backends[].dns`, `backends[].srv`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryConfig {
    /// How often the names are resolved again.
    pub interval: Duration,
    /// The DNS server to ask; `None`: the system's resolver configuration.
    pub resolver: Option<SocketAddr>,
    pub sources: Vec<SourceConfig>,
}

/// One `dns` or `srv` entry of `backends`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceConfig {
    pub source: Source,
    /// `dns`: every address's weight; `srv` takes the records' weights.
    pub weight: u32,
    pub zone: Option<String>,
    /// `max_inflight` of each backend found.
    pub max_inflight: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// Every A/AAAA answer for `host` is a backend on `port`, named by its
    /// address.
    Dns { host: String, port: u16 },
    /// Each target of the SRV records of `name` (lowest priority only) is a
    /// backend named `target:port`, weighted by the record.
    Srv { name: String },
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Dns { host, port } => write!(f, "dns {host}:{port}"),
            Source::Srv { name } => write!(f, "srv {name}"),
        }
    }
}

impl Config {
    /// Reads, parses and validates `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let text = file::read(path).map_err(|e| ConfigErrors::of_file(path, &e))?;
        Config::parse(path, &text)
    }

    /// Parses and validates `text`; `file` only names the source in errors.
    pub fn parse(file: &Path, text: &str) -> Result<Config, ConfigErrors> {
        Config::parse_with(file, text, resolve::Names::Resolve)
    }

    /// Like [`Config::parse`], but a host name in `backends[].addr` is an
    /// error instead of a resolver query: for text from anywhere (fuzzing).
    pub fn parse_offline(file: &Path, text: &str) -> Result<Config, ConfigErrors> {
        Config::parse_with(file, text, resolve::Names::Offline)
    }

    fn parse_with(file: &Path, text: &str, names: resolve::Names) -> Result<Config, ConfigErrors> {
        let raw = raw::from_yaml(file, text).map_err(|e| ConfigErrors(vec![e]))?;
        let mut config = validate::Validator::new(file, names).validate(raw)?;
        config.content_hash =
            tls::content_hash(text, config.certificates().map(|c| c.content_hash));
        Ok(config)
    }

    /// The sum of all backend weights.
    pub fn total_weight(&self) -> u64 {
        self.backends.iter().map(|b| u64::from(b.weight)).sum()
    }
}

/// Helpers the config tests share: parse as `test.yaml`, and the rendered
/// problems of a text that must be rejected.
#[cfg(test)]
mod test_util {
    use std::path::Path;

    use super::{Config, ConfigErrors};

    pub(super) fn parse(text: &str) -> Result<Config, ConfigErrors> {
        Config::parse(Path::new("test.yaml"), text)
    }

    pub(super) fn problems(text: &str) -> Vec<String> {
        parse(text)
            .expect_err("config should be rejected")
            .0
            .iter()
            .map(|e| e.to_string())
            .collect()
    }
}

#[cfg(test)]
mod tests;
