//! The config file: YAML text → [`RawConfig`] (serde) → validated [`Config`].
//!
//! This is the first arrow of the data flow. Parsing rejects unknown fields and
//! duplicate keys; validation turns loose values into real types (socket
//! addresses, durations, CIDR blocks, enums), so an invalid `Config` cannot be
//! built. Every problem is reported with the file, line and column it comes
//! from, and validation collects all problems instead of stopping at the first.
//!
//! Host names in `backends[].addr` are resolved here, once per load; nothing
//! on the data path resolves names.

use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;
use serde_saphyr::{Location, Spanned};

use crate::placement::maglev;

/// The default admin/metrics address.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:9090";

/// One problem in a config file, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based; 0 when the problem has no single place (e.g. the file is unreadable).
    pub line: u64,
    pub column: u64,
    pub problem: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file.display(), self.problem)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.file.display(),
                self.line,
                self.column,
                self.problem
            )
        }
    }
}

/// All the problems found in one config file (never empty).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Raw: what the YAML says, shaped by serde. Fields that validation checks are
// `Spanned`, so a semantic error can name its line and column.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    listen: Spanned<OneOrMany<Spanned<String>>>,
    #[serde(default)]
    admin: Option<Spanned<String>>,
    #[serde(default)]
    placement: Option<RawPlacement>,
    #[serde(default)]
    key: Option<RawKey>,
    #[serde(default)]
    connect: Option<RawConnect>,
    #[serde(default)]
    idle_timeout: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    max_connections: Option<Spanned<u64>>,
    #[serde(default)]
    shutdown_grace: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    drain_timeout: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    proxy_protocol: Option<RawProxyProtocol>,
    #[serde(default)]
    health: Option<Spanned<RawHealth>>,
    #[serde(default)]
    reload: Option<RawReload>,
    backends: Spanned<Vec<Spanned<RawBackend>>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlacement {
    #[serde(default)]
    algorithm: Option<Spanned<Algorithm>>,
    #[serde(default)]
    table_size: Option<Spanned<u64>>,
    #[serde(default)]
    points_per_weight: Option<Spanned<u32>>,
    #[serde(default)]
    bounded_load: Option<Spanned<f64>>,
}

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum KeyFrom {
    SourceIp,
    SourceAddr,
    Header,
}

/// The key used when a header key cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fallback {
    SourceIp,
    SourceAddr,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKey {
    #[serde(default)]
    from: Option<Spanned<KeyFrom>>,
    #[serde(default)]
    header: Option<Spanned<String>>,
    #[serde(default)]
    read_timeout: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    max_bytes: Option<Spanned<u64>>,
    #[serde(default)]
    fallback: Option<Spanned<Fallback>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConnect {
    #[serde(default)]
    timeout: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    attempts: Option<Spanned<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProxyProtocol {
    #[serde(default)]
    accept_from: Vec<Spanned<String>>,
    #[serde(default)]
    send: Option<Spanned<ProxySend>>,
    #[serde(default)]
    header_timeout: Option<Spanned<HumanDuration>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ProxySend {
    V2,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    #[serde(default)]
    interval: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    timeout: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    rise: Option<Spanned<u32>>,
    #[serde(default)]
    fall: Option<Spanned<u32>>,
    #[serde(default)]
    passive_failures: Option<Spanned<u32>>,
    #[serde(default)]
    when_all_down: Option<Spanned<AllDown>>,
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReload {
    #[serde(default)]
    watch: Option<bool>,
    #[serde(default)]
    poll_interval: Option<Spanned<HumanDuration>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    name: Spanned<String>,
    addr: Spanned<String>,
    #[serde(default)]
    weight: Option<Spanned<u32>>,
    #[serde(default)]
    zone: Option<Spanned<String>>,
}

/// A duration written the human way: `250ms`, `30s`, `1h`, `1h 30m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text)
            .map(HumanDuration)
            .map_err(|e| {
                serde::de::Error::custom(format!(
                    "invalid duration {text:?} ({e}); write e.g. 250ms, 30s or 1h"
                ))
            })
    }
}

// ---------------------------------------------------------------------------
// Validated: what the rest of magpie uses.

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file this came from (for messages), or `<inline>`.
    pub source: PathBuf,
    /// `h64` of the text this was parsed from: reload compares it to the file's
    /// current content to tell a real change from a touch.
    pub content_hash: u64,
    pub listen: Vec<SocketAddr>,
    pub admin: Option<SocketAddr>,
    pub placement: PlacementConfig,
    pub key: KeyConfig,
    pub connect: ConnectConfig,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    pub shutdown_grace: Duration,
    pub drain_timeout: Option<Duration>,
    pub proxy_protocol: ProxyProtocolConfig,
    pub health: Option<HealthConfig>,
    pub reload: ReloadConfig,
    /// In file order; placement sorts by name itself.
    pub backends: Vec<BackendConfig>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PlacementConfig {
    pub algorithm: Algorithm,
    pub table_size: u64,
    pub points_per_weight: u32,
    pub bounded_load: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyConfig {
    SourceIp,
    SourceAddr,
    Header {
        /// Lower-case, so matching is case-insensitive.
        name: String,
        read_timeout: Duration,
        max_bytes: usize,
        fallback: Fallback,
    },
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
        let peer = crate::net::canonical_ip(peer);
        self.accept_from.iter().any(|net| net.contains(&peer))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthConfig {
    pub interval: Duration,
    pub timeout: Duration,
    pub rise: u32,
    pub fall: u32,
    /// Consecutive data-path connect failures that mark a backend down; 0 = off.
    pub passive_failures: u32,
    pub when_all_down: AllDown,
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
}

// Defaults, named once so README, the example config and the code agree.
pub const DEFAULT_POINTS_PER_WEIGHT: u32 = 160;
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_millis(200);
pub const DEFAULT_MAX_BYTES: u64 = 8192;
pub const MAX_MAX_BYTES: u64 = 1 << 20;
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
pub const DEFAULT_ATTEMPTS: u32 = 3;
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);
pub const DEFAULT_MAX_CONNECTIONS: u64 = 10_000;
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
pub const DEFAULT_PROXY_HEADER_TIMEOUT: Duration = Duration::from_secs(3);
pub const MAX_WEIGHT: u32 = 10_000;
/// Ring points across the whole pool; beyond this a build takes seconds and
/// hundreds of MiB, which is never what anyone meant.
pub const MAX_RING_POINTS: u64 = 10_000_000;

impl Config {
    /// Reads, parses and validates `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigErrors(vec![ConfigError {
                file: path.to_path_buf(),
                line: 0,
                column: 0,
                problem: format!("cannot read: {e}"),
            }])
        })?;
        Config::parse(path, &text)
    }

    /// Parses and validates `text`; `file` only names the source in errors.
    pub fn parse(file: &Path, text: &str) -> Result<Config, ConfigErrors> {
        let raw: RawConfig = serde_saphyr::from_str(text).map_err(|e| {
            let (line, column) = e
                .location()
                .map(|l| (l.line(), l.column()))
                .unwrap_or((0, 0));
            ConfigErrors(vec![ConfigError {
                file: file.to_path_buf(),
                line,
                column,
                problem: first_line_of(&e.to_string()),
            }])
        })?;
        let mut config = Validator::new(file).validate(raw)?;
        config.content_hash = crate::hash::h64(text.as_bytes());
        Ok(config)
    }

    /// The sum of all backend weights.
    pub fn total_weight(&self) -> u64 {
        self.backends.iter().map(|b| u64::from(b.weight)).sum()
    }
}

/// serde-saphyr renders an error with a source snippet over several lines,
/// headed `error: line L column C: problem`; we keep the problem and put the
/// place in front ourselves.
fn first_line_of(rendered: &str) -> String {
    let line = rendered.lines().next().unwrap_or("invalid YAML").trim();
    let line = line.strip_prefix("error: ").unwrap_or(line);
    let line = match line
        .strip_prefix("line ")
        .and_then(|rest| rest.split_once(": "))
    {
        Some((place, problem)) if place.contains(" column ") => problem,
        _ => line,
    };
    // Some messages end with the place instead.
    match line.find(" at line ") {
        Some(i) => line[..i].to_string(),
        None => line.to_string(),
    }
}

struct Validator<'a> {
    file: &'a Path,
    errors: Vec<ConfigError>,
}

impl<'a> Validator<'a> {
    fn new(file: &'a Path) -> Self {
        Validator {
            file,
            errors: Vec::new(),
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

    /// A duration that must be positive; `default` when absent.
    fn positive(
        &mut self,
        d: Option<Spanned<HumanDuration>>,
        what: &str,
        default: Duration,
    ) -> Duration {
        match d {
            Some(d) if d.value.0.is_zero() => {
                self.err(&d.referenced, format!("{what} must be greater than zero"));
                default
            }
            Some(d) => d.value.0,
            None => default,
        }
    }

    fn validate(mut self, raw: RawConfig) -> Result<Config, ConfigErrors> {
        let listen = self.listen(raw.listen);
        let admin = self.admin(raw.admin, &listen);
        let backends = self.backends(raw.backends, &listen, admin);
        let placement = self.placement(raw.placement, &backends);
        let key = self.key(raw.key);
        let connect = self.connect(raw.connect);
        let idle_timeout = self.positive(raw.idle_timeout, "idle_timeout", DEFAULT_IDLE_TIMEOUT);
        let max_connections = match raw.max_connections {
            Some(m) if m.value == 0 => {
                self.err(&m.referenced, "max_connections must be at least 1");
                0
            }
            Some(m) => usize::try_from(m.value).unwrap_or(usize::MAX),
            None => DEFAULT_MAX_CONNECTIONS as usize,
        };
        // Zero grace is allowed: it means "close open connections at once".
        let shutdown_grace = raw
            .shutdown_grace
            .map(|d| d.value.0)
            .unwrap_or(DEFAULT_SHUTDOWN_GRACE);
        let drain_timeout = raw.drain_timeout.map(|d| {
            if d.value.0.is_zero() {
                self.err(&d.referenced, "drain_timeout must be greater than zero (leave it out to let connections to removed backends finish on their own)");
            }
            d.value.0
        });
        let proxy_protocol = self.proxy_protocol(raw.proxy_protocol);
        let health = raw.health.map(|h| self.health(h));
        let reload = self.reload(raw.reload);

        if self.errors.is_empty() {
            Ok(Config {
                source: self.file.to_path_buf(),
                content_hash: 0,
                listen,
                admin,
                placement,
                key,
                connect,
                idle_timeout,
                max_connections,
                shutdown_grace,
                drain_timeout,
                proxy_protocol,
                health,
                reload,
                backends,
            })
        } else {
            self.errors.sort_by_key(|e| (e.line, e.column));
            Err(ConfigErrors(self.errors))
        }
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

    fn listen(&mut self, raw: Spanned<OneOrMany<Spanned<String>>>) -> Vec<SocketAddr> {
        let items = match raw.value {
            OneOrMany::One(one) => vec![one],
            OneOrMany::Many(many) => many,
        };
        if items.is_empty() {
            self.err(&raw.referenced, "listen needs at least one address");
        }
        let mut out: Vec<SocketAddr> = Vec::new();
        for item in &items {
            if let Some(addr) = self.socket_addr(item, "listen address") {
                if out.contains(&addr) {
                    self.err(
                        &item.referenced,
                        format!("listen address {addr} is given twice"),
                    );
                } else {
                    out.push(addr);
                }
            }
        }
        out
    }

    fn admin(&mut self, raw: Option<Spanned<String>>, listen: &[SocketAddr]) -> Option<SocketAddr> {
        let raw = match raw {
            None => return DEFAULT_ADMIN.parse().ok(),
            Some(r) if r.value.trim() == "off" => return None,
            Some(r) => r,
        };
        let addr = self.socket_addr(&raw, "admin address")?;
        if addr.port() != 0 && listen.contains(&addr) {
            self.err(
                &raw.referenced,
                format!("admin address {addr} is also a listen address"),
            );
        }
        Some(addr)
    }

    fn backends(
        &mut self,
        raw: Spanned<Vec<Spanned<RawBackend>>>,
        listen: &[SocketAddr],
        admin: Option<SocketAddr>,
    ) -> Vec<BackendConfig> {
        if raw.value.is_empty() {
            self.err(
                &raw.referenced,
                "backends is empty: at least one backend is needed",
            );
            return Vec::new();
        }
        let mut out: Vec<BackendConfig> = Vec::new();
        for entry in raw.value {
            let b = entry.value;
            let name = b.name.value.trim().to_string();
            if name.is_empty() {
                self.err(&b.name.referenced, "backend name is empty");
                continue;
            }
            if name.chars().any(|c| c.is_control() || c.is_whitespace()) {
                self.err(
                    &b.name.referenced,
                    format!("backend name {name:?} contains whitespace or control characters"),
                );
                continue;
            }
            if out.iter().any(|o| o.name == name) {
                self.err(
                    &b.name.referenced,
                    format!(
                        "duplicate backend name {name:?}: names are identities and must be unique"
                    ),
                );
                continue;
            }
            let addr_text = b.addr.value.trim().to_string();
            let Some(addr) = self.resolve(&b.addr) else {
                continue;
            };
            if let Some(other) = out.iter().find(|o| o.addr == addr) {
                self.err(
                    &b.addr.referenced,
                    format!(
                        "backend {name:?} has the same address {addr} as backend {:?}",
                        other.name
                    ),
                );
                continue;
            }
            if listen.contains(&addr) || admin == Some(addr) {
                self.err(
                    &b.addr.referenced,
                    format!(
                        "backend {name:?} points at magpie's own address {addr}: that would loop"
                    ),
                );
                continue;
            }
            let weight = match b.weight {
                Some(w) if w.value > MAX_WEIGHT => {
                    self.err(
                        &w.referenced,
                        format!("weight {} is too large (at most {MAX_WEIGHT})", w.value),
                    );
                    continue;
                }
                Some(w) => w.value,
                None => 1,
            };
            let zone = match b.zone {
                Some(z) if z.value.trim().is_empty() => {
                    self.err(&z.referenced, "zone is empty (leave it out instead)");
                    None
                }
                Some(z) => Some(z.value.trim().to_string()),
                None => None,
            };
            out.push(BackendConfig {
                name,
                addr_text,
                addr,
                weight,
                zone,
            });
        }
        if !out.is_empty() && out.iter().all(|b| b.weight == 0) {
            self.err(
                &raw.referenced,
                "every backend has weight 0: nothing could take a connection",
            );
        }
        out
    }

    /// `ip:port` as is; `host:port` through the system resolver, first address.
    fn resolve(&mut self, s: &Spanned<String>) -> Option<SocketAddr> {
        let text = s.value.trim();
        if let Ok(addr) = text.parse::<SocketAddr>() {
            return Some(addr);
        }
        let Some((host, port)) = text.rsplit_once(':') else {
            self.err(
                &s.referenced,
                format!("backend address {text:?} has no port (write host:port)"),
            );
            return None;
        };
        if host.is_empty() || port.parse::<u16>().is_err() {
            self.err(
                &s.referenced,
                format!("backend address {text:?} is not host:port"),
            );
            return None;
        }
        match text.to_socket_addrs() {
            Ok(mut addrs) => match addrs.next() {
                Some(a) => Some(a),
                None => {
                    self.err(
                        &s.referenced,
                        format!("host {host:?} resolves to no address"),
                    );
                    None
                }
            },
            Err(e) => {
                self.err(
                    &s.referenced,
                    format!("host {host:?} does not resolve: {e}"),
                );
                None
            }
        }
    }

    fn placement(
        &mut self,
        raw: Option<RawPlacement>,
        backends: &[BackendConfig],
    ) -> PlacementConfig {
        let raw = raw.unwrap_or(RawPlacement {
            algorithm: None,
            table_size: None,
            points_per_weight: None,
            bounded_load: None,
        });
        let algorithm = raw
            .algorithm
            .as_ref()
            .map(|a| a.value)
            .unwrap_or(Algorithm::Maglev);
        let table_size = match &raw.table_size {
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
                } else if t.value > maglev::MAX_TABLE_SIZE {
                    self.err(
                        &t.referenced,
                        format!(
                            "table_size {} is too large (at most {})",
                            t.value,
                            maglev::MAX_TABLE_SIZE
                        ),
                    );
                } else if (t.value as usize) < backends.len() {
                    self.err(
                        &t.referenced,
                        format!(
                            "table_size {} is smaller than the number of backends ({})",
                            t.value,
                            backends.len()
                        ),
                    );
                }
                t.value
            }
            None => maglev::DEFAULT_TABLE_SIZE,
        };
        let points_per_weight = match &raw.points_per_weight {
            Some(p) => {
                if algorithm != Algorithm::Ring {
                    self.err(
                        &p.referenced,
                        "points_per_weight applies to algorithm ring only",
                    );
                } else if p.value == 0 {
                    self.err(&p.referenced, "points_per_weight must be at least 1");
                } else {
                    let total: u64 = backends.iter().map(|b| u64::from(b.weight)).sum::<u64>()
                        * u64::from(p.value);
                    if total > MAX_RING_POINTS {
                        self.err(&p.referenced, format!("the ring would have {total} points (at most {MAX_RING_POINTS}); lower points_per_weight or the weights"));
                    }
                }
                p.value
            }
            None => DEFAULT_POINTS_PER_WEIGHT,
        };
        let bounded_load = raw.bounded_load.map(|b| {
            if !b.value.is_finite() || b.value < 1.0 {
                self.err(&b.referenced, format!("bounded_load {} must be a number >= 1.0 (1.25 lets a backend take 25% more than its share)", b.value));
            }
            b.value
        });
        PlacementConfig {
            algorithm,
            table_size,
            points_per_weight,
            bounded_load,
        }
    }

    fn key(&mut self, raw: Option<RawKey>) -> KeyConfig {
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
        let read_timeout =
            self.positive(raw.read_timeout, "key.read_timeout", DEFAULT_READ_TIMEOUT);
        let max_bytes = match &raw.max_bytes {
            Some(m) if m.value < 16 || m.value > MAX_MAX_BYTES => {
                self.err(
                    &m.referenced,
                    format!(
                        "key.max_bytes {} is out of range (16 to {MAX_MAX_BYTES})",
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

    fn connect(&mut self, raw: Option<RawConnect>) -> ConnectConfig {
        let Some(raw) = raw else {
            return ConnectConfig {
                timeout: DEFAULT_CONNECT_TIMEOUT,
                attempts: DEFAULT_ATTEMPTS,
            };
        };
        let timeout = self.positive(raw.timeout, "connect.timeout", DEFAULT_CONNECT_TIMEOUT);
        let attempts = match raw.attempts {
            Some(a) if a.value == 0 => {
                self.err(&a.referenced, "connect.attempts must be at least 1");
                DEFAULT_ATTEMPTS
            }
            Some(a) => a.value.min(crate::placement::MAX_CANDIDATES as u32),
            None => DEFAULT_ATTEMPTS,
        };
        ConnectConfig { timeout, attempts }
    }

    fn proxy_protocol(&mut self, raw: Option<RawProxyProtocol>) -> ProxyProtocolConfig {
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
        );
        ProxyProtocolConfig {
            accept_from,
            header_timeout,
            send_v2: raw.send.map(|s| s.value == ProxySend::V2).unwrap_or(false),
        }
    }

    fn health(&mut self, raw: Spanned<RawHealth>) -> HealthConfig {
        let at = raw.referenced;
        let raw = raw.value;
        let interval = self.positive(raw.interval, "health.interval", Duration::from_secs(2));
        let timeout = self.positive(raw.timeout, "health.timeout", Duration::from_secs(1));
        let mut count = |v: Option<Spanned<u32>>, what: &str, default: u32, min: u32| match v {
            Some(v) if v.value < min => {
                self.err(
                    &v.referenced,
                    format!("health.{what} must be at least {min}"),
                );
                default
            }
            Some(v) => v.value,
            None => default,
        };
        let rise = count(raw.rise, "rise", 2, 1);
        let fall = count(raw.fall, "fall", 3, 1);
        let passive_failures = count(raw.passive_failures, "passive_failures", 3, 0);
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

    fn reload(&mut self, raw: Option<RawReload>) -> ReloadConfig {
        let Some(raw) = raw else {
            return ReloadConfig {
                watch: true,
                poll_interval: None,
            };
        };
        let poll_interval = raw.poll_interval.map(|p| {
            if p.value.0 < Duration::from_millis(100) {
                self.err(&p.referenced, "reload.poll_interval must be at least 100ms");
            }
            p.value.0
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigErrors> {
        Config::parse(Path::new("test.yaml"), text)
    }

    fn problems(text: &str) -> Vec<String> {
        parse(text)
            .expect_err("config should be rejected")
            .0
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    const MINIMAL: &str =
        "listen: 127.0.0.1:7000\nbackends:\n  - name: a\n    addr: 127.0.0.1:8001\n";

    #[test]
    fn minimal_config_gets_defaults() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.listen, vec!["127.0.0.1:7000".parse().unwrap()]);
        assert_eq!(c.admin, Some(DEFAULT_ADMIN.parse().unwrap()));
        assert_eq!(c.placement.algorithm, Algorithm::Maglev);
        assert_eq!(c.placement.table_size, 65537);
        assert_eq!(c.key, KeyConfig::SourceIp);
        assert_eq!(
            c.connect,
            ConnectConfig {
                timeout: Duration::from_secs(1),
                attempts: 3
            }
        );
        assert_eq!(c.idle_timeout, Duration::from_secs(3600));
        assert_eq!(c.max_connections, 10_000);
        assert_eq!(c.backends[0].weight, 1);
        assert!(c.health.is_none());
    }

    #[test]
    fn full_config_parses() {
        let c = parse(
            "listen: [127.0.0.1:7000, '[::1]:7000']\nadmin: off\nplacement:\n  algorithm: ring\n  points_per_weight: 100\n  bounded_load: 1.25\nkey:\n  from: header\n  header: X-Session-Id\n  read_timeout: 250ms\n  max_bytes: 4096\n  fallback: source_addr\nconnect:\n  timeout: 500ms\n  attempts: 2\nidle_timeout: 30s\nmax_connections: 5\nshutdown_grace: 0s\nproxy_protocol:\n  accept_from: [10.0.0.0/8, 127.0.0.1]\n  send: v2\nhealth:\n  interval: 2s\n  timeout: 1s\n  when_all_down: refuse\nbackends:\n  - {name: b, addr: 'localhost:8002', weight: 2, zone: z1}\n  - {name: a, addr: 127.0.0.1:8001, weight: 0}\n",
        )
        .unwrap();
        assert_eq!(c.listen.len(), 2);
        assert_eq!(c.admin, None);
        assert_eq!(c.placement.algorithm, Algorithm::Ring);
        assert_eq!(c.placement.bounded_load, Some(1.25));
        assert_eq!(
            c.key,
            KeyConfig::Header {
                name: "x-session-id".into(),
                read_timeout: Duration::from_millis(250),
                max_bytes: 4096,
                fallback: Fallback::SourceAddr
            }
        );
        assert_eq!(c.shutdown_grace, Duration::ZERO);
        assert!(c.proxy_protocol.is_trusted("127.0.0.1".parse().unwrap()));
        assert!(
            c.proxy_protocol
                .is_trusted("::ffff:10.1.2.3".parse().unwrap())
        );
        assert!(!c.proxy_protocol.is_trusted("127.0.0.2".parse().unwrap()));
        assert!(c.proxy_protocol.send_v2);
        assert_eq!(c.health.as_ref().unwrap().when_all_down, AllDown::Refuse);
        assert!(c.backends[0].addr.ip().is_loopback());
        assert_eq!(c.backends[0].zone.as_deref(), Some("z1"));
    }

    #[test]
    fn syntax_error_names_line_and_column() {
        let e = parse("listen: 127.0.0.1:7000\nbackends:\n  - name: a\n    addr: [\n").unwrap_err();
        assert_eq!(e.0.len(), 1);
        assert!(e.0[0].line >= 4, "{e}");
        assert!(e.0[0].column > 0, "{e}");
        assert!(e.to_string().starts_with("test.yaml:"), "{e}");
    }

    #[test]
    fn unknown_fields_and_duplicate_keys_are_rejected() {
        let p = problems(
            "listen: 127.0.0.1:7000\nbogus: 1\nbackends:\n  - name: a\n    addr: 127.0.0.1:8001\n",
        );
        assert!(p[0].contains("bogus"), "{p:?}");
        assert!(
            p[0].starts_with("test.yaml:2:1: unknown field `bogus`"),
            "{p:?}"
        );
        assert!(p[0].starts_with("test.yaml:2:"), "{p:?}");
        let p = problems(
            "listen: 127.0.0.1:7000\nlisten: 127.0.0.1:7001\nbackends:\n  - name: a\n    addr: 127.0.0.1:8001\n",
        );
        assert!(p[0].contains("test.yaml:2:"), "{p:?}");
        let p =
            problems("listen: 127.0.0.1:7000\nbackends:\n  - name: a\n    adr: 127.0.0.1:8001\n");
        assert!(p[0].contains("adr"), "{p:?}");
    }

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
    fn every_listed_mistake_is_rejected() {
        let cases: &[(&str, &str)] = &[
            (
                "listen: 127.0.0.1:7000\nbackends: []\n",
                "backends is empty",
            ),
            (
                "listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001, weight: 0}\n",
                "weight 0",
            ),
            (
                "listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: no-such-host.invalid:80}\n",
                "does not resolve",
            ),
            (
                "listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1}\n",
                "no port",
            ),
            (
                "listen: 127.0.0.1:7000\nplacement: {table_size: 65536}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
                "not prime",
            ),
            (
                "listen: 127.0.0.1:7000\nplacement: {table_size: 2}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n  - {name: b, addr: 127.0.0.1:8002}\n  - {name: c, addr: 127.0.0.1:8003}\n",
                "smaller than the number of backends",
            ),
            (
                "listen: 127.0.0.1:7000\nplacement: {bounded_load: 0.9}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
                "bounded_load",
            ),
            (
                "listen: 127.0.0.1:7000\nkey: {from: header}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
                "key.header",
            ),
            (
                "listen: 127.0.0.1:7000\nkey: {from: header, header: 'bad header'}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
                "not a valid HTTP header name",
            ),
            (
                "listen: 127.0.0.1:7000\nkey: {header: x-session-id}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
                "only applies with key.from: header",
            ),
            (
                "listen: 127.0.0.1:7000\nconnect: {timeout: 0s}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
                "connect.timeout must be greater than zero",
            ),
            (
                "listen: 127.0.0.1:7000\nconnect: {attempts: 0}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
                "attempts must be at least 1",
            ),
            (
                "listen: 127.0.0.1:7000\nidle_timeout: 0s\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
                "idle_timeout must be greater than zero",
            ),
            (
                "listen: 127.0.0.1:7000\nidle_timeout: 5 parsecs\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
                "invalid duration",
            ),
            (
                "listen: 127.0.0.1:7000\nmax_connections: 0\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
                "max_connections",
            ),
            (
                "listen: nowhere\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
                "not an ip:port",
            ),
            (
                "listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:7000}\n",
                "loop",
            ),
            (
                "listen: 127.0.0.1:7000\nadmin: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
                "also a listen address",
            ),
            (
                "listen: 127.0.0.1:7000\nproxy_protocol: {accept_from: [10.0.0.0/33]}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
                "CIDR",
            ),
            (
                "listen: 127.0.0.1:7000\nproxy_protocol: {send: v3}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
                "v3",
            ),
            (
                "listen: 127.0.0.1:7000\nplacement: {algorithm: maglev, points_per_weight: 10}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
                "ring only",
            ),
            (
                "listen: 127.0.0.1:7000\nhealth: {interval: 1s, timeout: 2s}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
                "longer than health.interval",
            ),
            (
                "listen: 127.0.0.1:7000\nhealth: {rise: 0}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
                "rise must be at least 1",
            ),
            (
                "listen: 127.0.0.1:7000\nbackends:\n  - {name: 'a b', addr: 127.0.0.1:8001}\n",
                "whitespace",
            ),
            (
                "listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001, weight: 100000}\n",
                "too large",
            ),
        ];
        for (text, needle) in cases {
            let p = problems(text).join("\n");
            assert!(
                p.contains(needle),
                "for {text:?} expected {needle:?} in:\n{p}"
            );
            assert!(p.starts_with("test.yaml:"), "{p}");
        }
    }

    #[test]
    fn all_problems_are_reported_at_once() {
        let p = problems(
            "listen: 127.0.0.1:7000\nconnect: {timeout: 0s, attempts: 0}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
        );
        assert_eq!(p.len(), 2, "{p:?}");
    }
}
