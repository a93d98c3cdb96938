//! DNS discovery: `backends[].dns` (every A/AAAA answer is a backend, named
//! by its address) and `backends[].srv` (each target of the SRV records of
//! the lowest priority, named `target:port`, weighted by the record).
//!
//! [`Discovery::expand`] turns a config's `dns`/`srv` entries into backends,
//! next to the ones written in the file; it runs at start, on every reload,
//! and every `discovery.interval` (the reload loop publishes a changed set
//! like a reload: version + 1, unchanged backends keep their live state).
//! Answers are sorted, so the same records give the same backends, and the
//! same table, on every instance.
//!
//! A lookup that fails, times out or comes back empty keeps that entry's last
//! good answer (counted in `magpie_discovery_lookups_total` and logged at
//! most once a minute); with no good answer yet, the expansion fails: at
//! start magpie does not start, on a reload the running table stays. The
//! pool is never emptied by DNS.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::RData;
use hickory_resolver::proto::rr::rdata::SRV;
use tracing::warn;

use crate::config::{BackendConfig, Config, DiscoveryConfig, Source, SourceConfig};
use crate::telemetry::throttle::Throttle;
use magpie_core::labels;

/// How long one DNS question may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("backends: {entry}: {problem}, and there is no earlier answer to keep")]
    NoAnswer { entry: Source, problem: String },
    #[error("cannot set up the DNS resolver: {0}")]
    Resolver(String),
    #[error("backends: discovery found no backend with a weight above 0")]
    Empty,
}

labels! {
    /// What a lookup gave, for `magpie_discovery_lookups_total{result}`.
    pub(crate) enum Lookup {
        Ok => "ok",
        Empty => "empty",
        Failed => "error",
    }
}

/// Resolvers and the last good answer of every source.
#[derive(Default)]
pub struct Discovery {
    resolvers: Mutex<HashMap<Option<SocketAddr>, Arc<TokioResolver>>>,
    last_good: Mutex<HashMap<Source, Vec<BackendConfig>>>,
    lookups: [AtomicU64; Lookup::COUNT],
    /// Per discovered entry that reaches magpie itself: when it was last
    /// said, and how many times it was found since.
    self_loops: Mutex<HashMap<String, (Instant, u64)>>,
}

/// A discovered entry that reaches magpie's own listener is said at most
/// this often.
const SELF_LOOP_EVERY: Duration = Duration::from_secs(60);
/// Entries remembered for that; beyond, the ones said long ago are forgotten.
const SELF_LOOPS_KEPT: usize = 4096;

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Discovery {
    pub(crate) fn lookups(&self, result: Lookup) -> u64 {
        self.lookups[result.index()].load(Ordering::Relaxed)
    }

    /// `config` with its `dns`/`srv` entries resolved: the file's backends
    /// plus what was found (earlier finds replaced). Unchanged without
    /// discovery.
    pub async fn expand(&self, mut config: Config) -> Result<Config, DiscoveryError> {
        let Some(discovery) = config.discovery.clone() else {
            return Ok(config);
        };
        let resolver = self.resolver(&discovery)?;
        config.backends.retain(|b| !b.discovered);
        let mut names: HashSet<String> = config.backends.iter().map(|b| b.name.clone()).collect();
        let mut addrs: HashSet<SocketAddr> = config.backends.iter().map(|b| b.addr).collect();
        for source in &discovery.sources {
            for found in self.resolve(&resolver, source).await? {
                let own = config.listen.iter().chain(&config.admin);
                if own.clone().any(|&o| crate::config::reaches(found.addr, o)) {
                    self.self_loop(&found.name);
                    continue;
                }
                if names.insert(found.name.clone()) && addrs.insert(found.addr) {
                    config.backends.push(found);
                }
            }
        }
        if !config.backends.iter().any(|b| b.weight > 0) {
            return Err(DiscoveryError::Empty);
        }
        Ok(config)
    }

    /// Says that the discovered `name` reaches magpie itself (and is left
    /// out), once per [`SELF_LOOP_EVERY`] per entry.
    fn self_loop(&self, name: &str) {
        let now = Instant::now();
        let mut said = lock(&self.self_loops);
        if let Some((at, held_back)) = said.get_mut(name)
            && now.duration_since(*at) < SELF_LOOP_EVERY
        {
            *held_back += 1;
            return;
        }
        if said.len() >= SELF_LOOPS_KEPT {
            said.retain(|_, (at, _)| now.duration_since(*at) < SELF_LOOP_EVERY);
        }
        let held_back = said
            .insert(name.to_string(), (now, 0))
            .map_or(0, |(_, n)| n);
        drop(said);
        warn!(backend = %name, held_back, "discovered backend reaches magpie's own listener; left out");
    }

    fn resolver(&self, discovery: &DiscoveryConfig) -> Result<Arc<TokioResolver>, DiscoveryError> {
        let mut resolvers = lock(&self.resolvers);
        if let Some(r) = resolvers.get(&discovery.resolver) {
            return Ok(Arc::clone(r));
        }
        let builder = match discovery.resolver {
            None => TokioResolver::builder_tokio()
                .map_err(|e| DiscoveryError::Resolver(e.to_string()))?,
            Some(addr) => {
                let mut server = NameServerConfig::udp_and_tcp(addr.ip());
                for connection in &mut server.connections {
                    connection.port = addr.port();
                }
                TokioResolver::builder_with_config(
                    ResolverConfig::from_name_servers(vec![server]),
                    TokioRuntimeProvider::default(),
                )
            }
        };
        let mut options = ResolverOpts::default();
        // Every interval asks again: the answer's TTL is the interval.
        options.cache_size = 0;
        options.timeout = LOOKUP_TIMEOUT;
        options.attempts = 1;
        let resolver = builder
            .with_options(options)
            .build()
            .map_err(|e| DiscoveryError::Resolver(e.to_string()))?;
        let resolver = Arc::new(resolver);
        resolvers.insert(discovery.resolver, Arc::clone(&resolver));
        Ok(resolver)
    }

    /// One source's backends: a fresh answer, or the last good one.
    async fn resolve(
        &self,
        resolver: &TokioResolver,
        source: &SourceConfig,
    ) -> Result<Vec<BackendConfig>, DiscoveryError> {
        static LOG: Throttle = Throttle::new(Duration::from_secs(60));
        let answer = match &source.source {
            Source::Dns { host, port } => dns(resolver, host, *port, source).await,
            Source::Srv { name } => srv(resolver, name, source).await,
        };
        let problem = match answer {
            Ok(found) if !found.is_empty() => {
                self.count(Lookup::Ok);
                lock(&self.last_good).insert(source.source.clone(), found.clone());
                return Ok(found);
            }
            Ok(_) => {
                self.count(Lookup::Empty);
                "the answer is empty".to_string()
            }
            Err(e) => {
                self.count(Lookup::Failed);
                e
            }
        };
        match lock(&self.last_good).get(&source.source) {
            Some(kept) => {
                if let Some(held_back) = LOG.allow() {
                    warn!(source = %source.source, %problem, held_back, "DNS lookup failed; keeping the last good answer");
                }
                Ok(kept.clone())
            }
            None => Err(DiscoveryError::NoAnswer {
                entry: source.source.clone(),
                problem,
            }),
        }
    }

    fn count(&self, result: Lookup) {
        self.lookups[result.index()].fetch_add(1, Ordering::Relaxed);
    }
}

/// Every address of `host`, sorted, as backends on `port`.
async fn dns(
    resolver: &TokioResolver,
    host: &str,
    port: u16,
    source: &SourceConfig,
) -> Result<Vec<BackendConfig>, String> {
    let ips = addresses(resolver, host).await?;
    Ok(ips
        .into_iter()
        .map(|ip| {
            let addr = SocketAddr::new(ip, port);
            found(addr.to_string(), addr, source.weight, source)
        })
        .collect())
}

/// Each target of the lowest-priority SRV records, at its first address.
async fn srv(
    resolver: &TokioResolver,
    name: &str,
    source: &SourceConfig,
) -> Result<Vec<BackendConfig>, String> {
    let lookup = resolver.srv_lookup(name).await.map_err(|e| e.to_string())?;
    let records: Vec<SRV> = lookup
        .answers()
        .iter()
        .filter_map(|r| match &r.data {
            RData::SRV(srv) => Some(srv.clone()),
            _ => None,
        })
        .collect();
    let Some(best) = records.iter().map(|r| r.priority).min() else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for r in records.iter().filter(|r| r.priority == best) {
        let target = r.target.to_utf8();
        let target = target.trim_end_matches('.');
        let Some(&ip) = addresses(resolver, target).await?.first() else {
            continue;
        };
        let name = format!("{target}:{}", r.port);
        // SRV weight 0 means "rarely"; in magpie 0 would mean "never".
        let weight = u32::from(r.weight).max(1);
        out.push(found(name, SocketAddr::new(ip, r.port), weight, source));
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

async fn addresses(resolver: &TokioResolver, host: &str) -> Result<Vec<IpAddr>, String> {
    let mut ips: Vec<IpAddr> = resolver
        .lookup_ip(host)
        .await
        .map_err(|e| e.to_string())?
        .iter()
        .collect();
    ips.sort();
    ips.dedup();
    Ok(ips)
}

fn found(name: String, addr: SocketAddr, weight: u32, source: &SourceConfig) -> BackendConfig {
    BackendConfig {
        addr_text: addr.to_string(),
        name,
        addr,
        weight,
        zone: source.zone.clone(),
        discovered: true,
        tls: None,
        role: crate::config::Role::Both,
        bootstrap_port: None,
        max_inflight: source.max_inflight,
    }
}
