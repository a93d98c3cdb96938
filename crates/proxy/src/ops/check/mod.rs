//! What `magpie check` prints: where magpie listens, the settings that decide
//! where keys go and what clients must send, how mode tcp copies bytes, the
//! pool with each backend's table share, the fingerprint, and warnings for
//! settings that often surprise. Pure: it reads a built snapshot and the
//! environment it is told.

use std::fmt::Write as _;

use crate::config::tls::EXPIRY_WARNING;
use crate::config::{
    Config, CopyMode, HttpConfig, KeyConfig, Mode, PER_BACKEND_AUTO_MAX, PerBackend, SPLICE_AFTER,
};
use crate::routing::snapshot::{Snapshot, Table};
use magpie_core::key::group::GroupBy;

/// Where `check` runs, for the warnings that depend on it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Environment {
    /// In a container (Docker, Kubernetes, Podman).
    pub in_container: bool,
    /// Seconds since the Unix epoch: certificate expiry is warned about
    /// from it (0: never).
    pub now: i64,
}

impl Environment {
    /// Looks at this process's surroundings.
    pub fn detect() -> Environment {
        let in_container = std::path::Path::new("/.dockerenv").exists()
            || std::path::Path::new("/run/.containerenv").exists()
            || std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
        Environment {
            in_container,
            now: crate::config::tls::now(),
        }
    }
}

/// A PROXY `accept_from` block this large is more than the load balancers in
/// front of magpie: every other client in it is refused.
const WIDE_V4_PREFIX: u8 = 16;
const WIDE_V6_PREFIX: u8 = 48;

/// The report `check` prints for `snapshot`, built from `file`.
pub fn report(
    file: &str,
    snapshot: &Snapshot,
    env: Environment,
) -> Result<String, std::fmt::Error> {
    let config = &snapshot.config;
    let mut out = String::new();
    writeln!(out, "{file}: ok")?;
    let listen: Vec<String> = config.listen.iter().map(|a| a.to_string()).collect();
    writeln!(out, "listen:      {}", listen.join(", "))?;
    tls_lines(&mut out, config)?;
    match config.admin {
        Some(a) => writeln!(out, "admin:       {a}")?,
        None => writeln!(out, "admin:       off")?,
    }
    writeln!(out, "mode:        {}", config.mode.as_str())?;
    match config.mode {
        Mode::Tcp => writeln!(out, "copy:        {}", copy_text(config.copy))?,
        Mode::Http => writeln!(out, "deadlines:   {}", deadlines_text(&config.http))?,
        Mode::Udp => writeln!(out, "flows:       {}", flows_text(config))?,
    }
    writeln!(out, "key:         {}", key_text(&config.key))?;
    if let Some(group) = &config.group {
        writeln!(
            out,
            "group:       {}",
            group_text(group, config.group_choices, config.queue.is_some())
        )?;
    }
    writeln!(out, "proxy in:    {}", proxy_in(config))?;
    writeln!(out, "proxy out:   {}", proxy_out(config))?;
    writeln!(out, "health:      {}", health_text(config))?;
    writeln!(out, "load:        {}", load_text(config))?;
    writeln!(out, "bounded:     {}", bounded_text(config))?;
    writeln!(out, "sessions:    {}", sessions_text(config))?;
    if config.mode == Mode::Http {
        writeln!(out, "limits:      {}", limits_text(config))?;
    }
    writeln!(out, "access log:  {}", access_log_text(config))?;
    writeln!(out, "metrics:     {}", metrics_text(snapshot))?;
    if let Some(d) = &config.discovery {
        let sources: Vec<String> = d.sources.iter().map(|s| s.source.to_string()).collect();
        let resolver = d.resolver.map_or("system".to_string(), |r| r.to_string());
        writeln!(
            out,
            "discovery:   {} every {} (resolver {resolver})",
            sources.join(", "),
            humantime::format_duration(d.interval)
        )?;
    }
    writeln!(out, "algorithm:   {:?}", snapshot.table.algorithm())?;
    writeln!(out, "fingerprint: {}", snapshot.fingerprint)?;
    match (&config.disaggregation, &snapshot.prefill) {
        (Some(split), Some(prefill)) => {
            let skip = match split.skip_below_tokens {
                0 => "every request split".to_string(),
                n => format!("a turn whose decode backend lacks under {n} tokens goes there alone"),
            };
            writeln!(
                out,
                "split:       prefill and decode pools, {} protocol; {skip}; prefill timeout {}",
                split.protocol.as_str(),
                humantime::format_duration(split.prefill_timeout)
            )?;
            writeln!(out, "backends (decode pool: the table):")?;
            pool_lines(&mut out, snapshot)?;
            writeln!(out, "prefill pool ({}):", prefill.fingerprint)?;
            pool_lines(&mut out, prefill)?;
        }
        _ => {
            writeln!(out, "backends:")?;
            pool_lines(&mut out, snapshot)?;
        }
    }
    for w in warnings(snapshot, env) {
        writeln!(out, "warning: {w}")?;
    }
    Ok(out)
}

/// One line per backend of a pool: its address, weight, share of the
/// pool's table, zone, TLS and role (when not `both`).
fn pool_lines(out: &mut String, snapshot: &Snapshot) -> std::fmt::Result {
    for (b, share) in snapshot.backends.iter().zip(&snapshot.shares) {
        writeln!(
            out,
            "  {:<20} {:<22} weight {:>5}  share {:>6.2}%{}{}{}",
            b.name,
            b.addr.to_string(),
            b.weight,
            share * 100.0,
            b.zone
                .as_deref()
                .map(|z| format!("  zone {z}"))
                .unwrap_or_default(),
            b.tls.as_ref().map_or(String::new(), |t| match t.verify {
                true => format!("  tls (certificate for {})", t.name.to_str()),
                false => "  tls (certificate not checked)".to_string(),
            }),
            match b.role {
                crate::config::Role::Both => String::new(),
                role => format!("  role {}", role.as_str()),
            }
        )?;
    }
    Ok(())
}

/// Settings that often surprise.
pub(crate) fn warnings(snapshot: &Snapshot, env: Environment) -> Vec<String> {
    let config = &snapshot.config;
    let mut out = Vec::new();
    if let Table::Maglev(m) = &snapshot.table
        && let Some(w) =
            magpie_core::placement::maglev::sparse_warning(m.table_size(), snapshot.backends.len())
    {
        out.push(w);
    }
    if let Some(crate::config::LogTarget::File(path)) =
        config.access_log.as_ref().map(|l| &l.target)
        && let Some(dir) = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty() && !d.is_dir())
    {
        out.push(format!(
            "access_log.path {}: the directory {} does not exist here, so magpie run would not start",
            path.display(),
            dir.display()
        ));
    }
    let shared_store = config.sessions.as_ref().is_some_and(|s| s.redis.is_some());
    if config.group_choices > 1 && !shared_store {
        out.push(format!(
            "key.group_choices {} with sessions.store: local: each magpie chooses new groups' homes by its own load, so several magpies agree on them only with sessions.store: redis (or key.group_choices: 1)",
            config.group_choices
        ));
    }
    if config
        .backends
        .iter()
        .any(|b| b.tls.as_ref().is_some_and(|t| !t.verify))
    {
        out.push("upstream_tls.verify is false: backends' certificates are not checked, so anyone on the path to a backend can pose as it; give upstream_tls.ca instead".to_string());
    }
    for net in &config.proxy_protocol.accept_from {
        let wide = match net {
            ipnet::IpNet::V4(n) => n.prefix_len() < WIDE_V4_PREFIX,
            ipnet::IpNet::V6(n) => n.prefix_len() < WIDE_V6_PREFIX,
        };
        if wide {
            out.push(format!(
                "proxy_protocol.accept_from has {net}: every peer in it must send a PROXY header, so a client there that connects directly is refused; list only the load balancers in front of magpie"
            ));
        }
    }
    if env.in_container {
        for addr in config.listen.iter().chain(&config.admin) {
            if addr.ip().is_loopback() {
                out.push(format!(
                    "{addr} is a loopback address and magpie runs in a container: nothing outside the container reaches it; listen on 0.0.0.0 (or [::])"
                ));
            }
        }
    }
    if config.http.idle_timeout_unused {
        out.push(format!(
            "idle_timeout is not used in mode http: a client connection idles for http.keepalive_timeout ({}), and a backend's answer is bounded by http.response_timeout and http.stream_idle_timeout",
            humantime::format_duration(config.http.keepalive_timeout)
        ));
    }
    let n = snapshot.backends.len();
    if config.metrics.per_backend == PerBackend::On && n > PER_BACKEND_AUTO_MAX {
        out.push(format!(
            "metrics.per_backend is on with {n} backends: every /metrics scrape renders about {:.1} MB of text (about 11 KB per backend); auto writes pool totals above {PER_BACKEND_AUTO_MAX}",
            n as f64 * 0.011
        ));
    }
    out.extend(expiry_warnings(config, env.now));
    if config.health.is_none() {
        out.push("no health section: a dead backend is not taken out of the rotation; every connection to it costs a failed connect before the next candidate".to_string());
    }
    out
}

/// One line per certificate a listener presents: its file, names and expiry.
fn tls_lines(out: &mut String, config: &Config) -> std::fmt::Result {
    for (addr, tls) in config.listen.iter().zip(&config.tls) {
        for (i, c) in tls.iter().flat_map(|t| t.certificates.iter().enumerate()) {
            let default = if i == 0 { ", the default" } else { "" };
            writeln!(
                out,
                "tls:         {addr}: {} for {} (expires {}{default})",
                c.cert_file.display(),
                c.names.join(", "),
                c.expiry_text(),
            )?;
        }
    }
    Ok(())
}

/// Certificates that expire within [`EXPIRY_WARNING`] of `now` (expired
/// ones never get here: validation refuses them).
fn expiry_warnings(config: &Config, now: i64) -> Vec<String> {
    let soon = i64::try_from(EXPIRY_WARNING.as_secs()).unwrap_or(i64::MAX);
    config
        .certificates()
        .filter(|c| now > 0 && c.not_after - now < soon)
        .map(|c| {
            let days = (c.not_after - now) as f64 / 86_400.0;
            format!(
                "certificate {} expires at {} (in {days:.1} days): renew it; magpie loads the new file when it changes",
                c.cert_file.display(),
                c.expiry_text()
            )
        })
        .collect()
}

/// Mode http's deadlines towards backends and clients, and its pool.
fn deadlines_text(http: &HttpConfig) -> String {
    let d = humantime::format_duration;
    format!(
        "backend head {} after the request (else 504), body gaps {} (else cut); client first byte {}, body gaps {} (else 408), keep-alive idle {}; pool {} idle per backend for {}, reuse {}",
        d(http.response_timeout),
        d(http.stream_idle_timeout),
        d(http.first_byte_timeout),
        d(http.body_timeout),
        d(http.keepalive_timeout),
        http.pool_max_idle_per_backend,
        d(http.pool_idle_timeout),
        http.reuse.as_str(),
    )
}

fn bounded_text(config: &Config) -> String {
    config
        .placement
        .bounded_load
        .map_or("off".to_string(), |c| {
            let excess = config.placement.spill_min_excess;
            format!("{c} x fair share, and {excess} over the mean, before a key spills")
        })
}

/// Mode http's memory bounds.
fn limits_text(config: &Config) -> String {
    let l = config.limits;
    format!(
        "request heads up to {} bytes; bodies read for keys hold up to {} bytes in total; an HTTP/2 client resetting over {} dispatched streams a second gets GOAWAY",
        l.max_head_bytes, l.key_buffer_bytes, l.h2_resets_per_second
    )
}

/// `access_log`: where lines go, in which format, and what they hold.
fn access_log_text(config: &Config) -> String {
    use crate::config::LogTarget;
    let Some(log) = &config.access_log else {
        return "off".to_string();
    };
    let target = match &log.target {
        LogTarget::Stderr => "stderr".to_string(),
        LogTarget::File(path) => path.display().to_string(),
    };
    let fields: Vec<&str> = log.fields.iter().map(|f| f.as_str()).collect();
    let per = match config.mode {
        Mode::Http => "request",
        Mode::Tcp => "connection",
        Mode::Udp => "flow",
    };
    format!(
        "{} to {target}, one line per {per} ({}% sampled), fields {}; keys {}, queries {}; at most {} lines queued",
        log.format.as_str(),
        log.sample * 100.0,
        fields.join(" "),
        if log.log_keys {
            "written raw"
        } else {
            "hashed"
        },
        if log.log_query { "kept" } else { "stripped" },
        log.queue
    )
}

/// `metrics.per_backend`: what `/metrics` writes for this pool.
fn metrics_text(snapshot: &Snapshot) -> String {
    let setting = snapshot.config.metrics.per_backend;
    let n = snapshot.every_backend().count();
    let now = if setting.applies(n) {
        "per backend"
    } else {
        "pool totals"
    };
    let rule = match setting {
        PerBackend::Auto => {
            format!("auto (per backend up to {PER_BACKEND_AUTO_MAX} backends, then pool totals)")
        }
        PerBackend::On => "on (always per backend)".to_string(),
        PerBackend::Off => "off (always pool totals)".to_string(),
    };
    let plural = if n == 1 { "" } else { "s" };
    format!("per_backend {rule}: {now} for {n} backend{plural}")
}

fn key_text(key: &KeyConfig) -> String {
    let k = key.sources();
    let mut parts = Vec::new();
    if let KeyConfig::Quic {
        cid_length,
        fallback,
    } = key
    {
        return format!(
            "the QUIC destination connection ID (short headers: {cid_length} bytes), else {}",
            fallback.as_str()
        );
    }
    parts.extend(k.header.map(|h| format!("header {h}")));
    parts.extend(k.body_field.map(|b| format!("body field {}", b.text)));
    if k.conversation {
        parts.push("the conversation's head".to_string());
    }
    if k.server_name {
        parts.push("the TLS server name".to_string());
    }
    match key.read() {
        Some(read) => format!("{}, else {}", parts.join(", then "), read.fallback.as_str()),
        None => k.from.to_string(),
    }
}

/// `key.group`: what places a conversation's first request (under a
/// `queue`, it weighs where it costs least).
fn group_text(group: &GroupBy, choices: usize, queued: bool) -> String {
    let what = match group {
        GroupBy::System => "the body's model, instructions and tools".to_string(),
        GroupBy::PrefixBytes(n) => {
            format!("the first {n} bytes of the body's model, instructions and tools")
        }
        GroupBy::Header(name) => format!("header {name}"),
        GroupBy::Conversation => {
            "the body's model, instructions and first user message".to_string()
        }
    };
    let home = match choices {
        1 => "a group's home is its first candidate that takes it".to_string(),
        n => format!("a new group's home is the least busy of its first {n} candidates"),
    };
    if queued && !matches!(group, GroupBy::Header(_)) {
        return format!(
            "{what}: a conversation's first request goes where it costs least (its wait and the wait it adds), its group's head counted as cached where the engine likely still holds it; the key above pins it; {home} (ties go there)"
        );
    }
    format!(
        "{what}: places a conversation's first request on its group's home; the key above pins it (without a group, the key places it too); {home}"
    )
}

/// Mode udp: how many flows, and what ends one.
fn flows_text(config: &Config) -> String {
    let responses = config.udp.responses.map_or(String::new(), |n| {
        format!(", or after {n} answer{}", if n == 1 { "" } else { "s" })
    });
    format!(
        "at most {}, each with its own socket to its backend; a flow ends after {} without a datagram{responses}",
        config.max_connections,
        humantime::format_duration(config.idle_timeout)
    )
}

fn copy_text(copy: CopyMode) -> String {
    let how = match copy {
        CopyMode::Auto => format!(
            "buffered, then splice(2) once a direction has moved {} KiB",
            SPLICE_AFTER / 1024
        ),
        CopyMode::Buffered => "through userspace buffers".to_string(),
        CopyMode::Splice => "splice(2) through pipes, no userspace copy".to_string(),
    };
    let here = if copy != CopyMode::Buffered && !cfg!(target_os = "linux") {
        "; splice(2) is Linux only, so buffered here"
    } else {
        ""
    };
    format!("{copy} ({how}{here})")
}

fn proxy_out(config: &Config) -> &'static str {
    if config.proxy_protocol.send_v2 {
        "v2 (every backend connection starts with a PROXY v2 header)"
    } else {
        "none"
    }
}

fn proxy_in(config: &Config) -> String {
    let from = &config.proxy_protocol.accept_from;
    if from.is_empty() {
        return "off (a PROXY header from anyone is refused)".to_string();
    }
    let nets: Vec<String> = from.iter().map(|n| n.to_string()).collect();
    format!(
        "required from {} (within {})",
        nets.join(", "),
        humantime::format_duration(config.proxy_protocol.header_timeout)
    )
}

/// `health.load`: what is scraped, how often, and what makes a backend
/// full for new keys.
fn load_text(config: &Config) -> String {
    let Some(l) = config.health.as_ref().and_then(|h| h.load.as_ref()) else {
        return "off".to_string();
    };
    let name = |g: &Option<String>| g.clone().unwrap_or_else(|| "-".to_string());
    let (waiting, unbounded) = match l.limits.max_waiting {
        Some(m) => (format!("{m} waiting ({}) or ", name(&l.gauges.waiting)), ""),
        None => (String::new(), "; waiting is no limit"),
    };
    format!(
        "GET {} every {} (timeout {}, preset {}); full for new keys above {waiting}{} KV cache usage ({}{unbounded}); running: {}; KV cache size: {}; values ignored after {}",
        l.path,
        humantime::format_duration(l.interval),
        humantime::format_duration(l.timeout),
        l.preset.as_str(),
        l.limits.max_kv_usage,
        name(&l.gauges.kv_usage),
        name(&l.gauges.running),
        name(&l.gauges.kv_capacity),
        humantime::format_duration(l.limits.max_age),
    )
}

fn health_text(config: &Config) -> String {
    let Some(h) = &config.health else {
        return "off".to_string();
    };
    let port = h.port.map_or(String::new(), |p| format!(" on port {p}"));
    let check = match &h.http_path {
        _ if h.datagram.is_some() => {
            let probe = h.datagram.as_ref().map_or(0, |d| d.send.len());
            format!("a datagram of {probe} bytes, its answer checked,")
        }
        Some(path) => format!(
            "HTTP GET {path} ({}-{})",
            h.expect_status.start(),
            h.expect_status.end()
        ),
        None => "TCP connect".to_string(),
    };
    format!(
        "{check}{port} every {}, timeout {}, rise {}, fall {}, passive after {} failed connects",
        humantime::format_duration(h.interval),
        humantime::format_duration(h.timeout),
        h.rise,
        h.fall,
        h.passive_failures
    )
}

fn sessions_text(config: &Config) -> String {
    let Some(s) = &config.sessions else {
        return "off (stateless: every instance routes alike)".to_string();
    };
    let store = match &s.redis {
        Some(r) => format!(
            "shared in redis {} (timeout {})",
            r.addr,
            humantime::format_duration(r.timeout)
        ),
        None => "in this process".to_string(),
    };
    format!(
        "pins for {}, at most {}, {store}",
        humantime::format_duration(s.ttl),
        s.max
    )
}

#[cfg(test)]
mod tests;
