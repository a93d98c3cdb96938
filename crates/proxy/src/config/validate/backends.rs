//! Validation of the pool written in the file: `backends` entries with a
//! `name` and an `addr` (the `dns` and `srv` entries go to `discovery.rs`).
//!
//! Part of [`Validator`]. Names are identities: not empty, no white space,
//! unique. Addresses are resolved once here (`resolve.rs`), must differ
//! between backends, and must not reach magpie's own listeners (a loop).

use std::net::SocketAddr;

use serde_saphyr::{Location, Spanned};

use super::{Validator, reaches};
use crate::config::raw::RawBackend;
use crate::config::resolve;
use crate::config::{BackendConfig, MAX_WEIGHT, Protocol, SourceConfig};

/// The backends validated so far, with their names and addresses (an
/// address maps to its index): checking each new one against a list would
/// be quadratic in the pool size.
#[derive(Default)]
struct Pool {
    backends: Vec<BackendConfig>,
    /// The backends written with `tls: true`, by index, and where.
    tls: Vec<(usize, Location)>,
    names: std::collections::HashSet<String>,
    addrs: std::collections::HashMap<SocketAddr, usize>,
}

/// Where a backend entry was written, and what it is checked against:
/// magpie's own listen and admin addresses, and the disaggregation
/// protocol (if any).
struct Written<'a> {
    at: &'a Location,
    own: &'a [SocketAddr],
    protocol: Option<Protocol>,
}

impl Validator<'_> {
    pub(super) fn backends(
        &mut self,
        raw: Spanned<Vec<Spanned<RawBackend>>>,
        listen: &[SocketAddr],
        admin: Option<SocketAddr>,
        protocol: Option<Protocol>,
    ) -> (
        Vec<BackendConfig>,
        Vec<SourceConfig>,
        Vec<(usize, Location)>,
    ) {
        let mut sources = Vec::new();
        if raw.value.is_empty() {
            self.err(
                &raw.referenced,
                "backends is empty: at least one backend is needed",
            );
            return (Vec::new(), sources, Vec::new());
        }
        let own: Vec<SocketAddr> = listen.iter().copied().chain(admin).collect();
        let mut pool = Pool::default();
        for entry in raw.value {
            let b = entry.value;
            if b.dns.is_some() || b.srv.is_some() {
                if let Some(tls) = b.tls.as_ref().filter(|t| t.value) {
                    self.err(&tls.referenced, "tls is not supported on a dns or srv entry yet: write its backends with addr");
                }
                self.no_role_on_source(&b);
                sources.extend(self.source(b, &entry.referenced));
                continue;
            }
            let tls = b.tls.as_ref().filter(|t| t.value).map(|t| t.referenced);
            let written = Written {
                at: &entry.referenced,
                own: &own,
                protocol,
            };
            if let Some(backend) = self.backend(b, written, &mut pool) {
                pool.tls.extend(tls.map(|at| (pool.backends.len(), at)));
                pool.addrs.insert(backend.addr, pool.backends.len());
                pool.backends.push(backend);
            }
        }
        let out = pool.backends;
        if !out.is_empty() && out.iter().all(|b| b.weight == 0) && sources.is_empty() {
            self.err(
                &raw.referenced,
                "every backend has weight 0: nothing could take a connection",
            );
        }
        (out, sources, pool.tls)
    }

    /// One backend written with `name` and `addr`; `None` when it has a
    /// problem (recorded). `own` are magpie's listen and admin addresses.
    fn backend(
        &mut self,
        b: RawBackend,
        written: Written<'_>,
        pool: &mut Pool,
    ) -> Option<BackendConfig> {
        let Written { at, own, protocol } = written;
        let (Some(b_name), Some(b_addr)) = (b.name, b.addr) else {
            self.err(
                at,
                "a backend needs name and addr (or dns: host:port, or srv: _service._proto.name)",
            );
            return None;
        };
        let name = self.backend_name(&b_name, pool)?;
        let addr = self.backend_addr(&b_addr, &name, pool, own)?;
        let weight = match b.weight {
            Some(w) if w.value > MAX_WEIGHT => {
                self.err(
                    &w.referenced,
                    format!("weight {} is too large (at most {MAX_WEIGHT})", w.value),
                );
                return None;
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
        let (role, bootstrap_port) = self.backend_role((b.role, b.bootstrap_port), &name, protocol);
        let max_inflight = self.backend_max_inflight(b.max_inflight);
        Some(BackendConfig {
            name,
            addr_text: b_addr.value.trim().to_string(),
            addr,
            weight,
            zone,
            discovered: false,
            tls: None,
            max_inflight,
            role,
            bootstrap_port,
        })
    }

    /// A backend's name: not empty, no white space or control characters,
    /// unique (it is the backend's identity).
    fn backend_name(&mut self, raw: &Spanned<String>, pool: &mut Pool) -> Option<String> {
        let name = raw.value.trim().to_string();
        let problem = if name.is_empty() {
            "backend name is empty".to_string()
        } else if name.chars().any(|c| c.is_control() || c.is_whitespace()) {
            format!("backend name {name:?} contains whitespace or control characters")
        } else if !pool.names.insert(name.clone()) {
            format!("duplicate backend name {name:?}: names are identities and must be unique")
        } else {
            return Some(name);
        };
        self.err(&raw.referenced, problem);
        None
    }

    /// A backend's address: resolved, not another backend's, and not one
    /// that reaches magpie itself (that would loop).
    fn backend_addr(
        &mut self,
        raw: &Spanned<String>,
        name: &str,
        pool: &Pool,
        own: &[SocketAddr],
    ) -> Option<SocketAddr> {
        let addr = self.resolve(raw)?;
        let problem = if let Some(&other) = pool.addrs.get(&addr) {
            format!(
                "backend {name:?} has the same address {addr} as backend {:?}",
                pool.backends[other].name
            )
        } else if let Some(own) = own.iter().find(|&&own| reaches(addr, own)) {
            if addr == *own {
                format!("backend {name:?} points at magpie's own address {addr}: that would loop")
            } else {
                format!(
                    "backend {name:?} at {addr} reaches magpie's own listener {own}: that would loop"
                )
            }
        } else {
            return Some(addr);
        };
        self.err(&raw.referenced, problem);
        None
    }

    /// Resolution is resolve.rs's job; this only puts its error in place.
    fn resolve(&mut self, s: &Spanned<String>) -> Option<SocketAddr> {
        match resolve::backend_addr(s.value.trim(), self.names) {
            Ok(addr) => Some(addr),
            Err(e) => {
                self.err(&s.referenced, e.to_string());
                None
            }
        }
    }
}
