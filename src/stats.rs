//! The global counters the data paths, reload and admin bump; each only grows.
//!
//! Per-backend counters live in [`crate::backend::Live`]; these are the ones
//! that belong to no backend (accepts, rejections, key fallbacks, reloads).
//! Bumping one is a relaxed atomic add: nothing on the hot path takes a lock
//! or looks up a label. The Prometheus export (`metrics`) reads them at scrape time.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::key::FallbackReason;

/// Why a client connection was closed without reaching a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientFailure {
    /// Every connect attempt failed (or every candidate was refused).
    NoBackend,
    /// A trusted peer sent no valid PROXY header, or an untrusted one sent one.
    ProxyProtocol,
}

impl ClientFailure {
    pub const ALL: [ClientFailure; 2] = [ClientFailure::NoBackend, ClientFailure::ProxyProtocol];

    pub fn as_str(self) -> &'static str {
        match self {
            ClientFailure::NoBackend => "no_backend",
            ClientFailure::ProxyProtocol => "proxy_protocol",
        }
    }
}

/// Global counters; each only grows.
#[derive(Debug, Default)]
pub struct Stats {
    key_fallbacks: [AtomicU64; FallbackReason::ALL.len()],
    rejected: AtomicU64,
    accept_errors: AtomicU64,
    client_failures: [AtomicU64; ClientFailure::ALL.len()],
    accepted: AtomicU64,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
}

impl Stats {
    pub fn count_fallback(&self, why: FallbackReason) {
        self.key_fallbacks[why.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub fn fallbacks(&self, why: FallbackReason) -> u64 {
        self.key_fallbacks[why.index()].load(Ordering::Relaxed)
    }

    pub fn count_rejected(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }

    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }

    pub fn count_accept_error(&self) {
        self.accept_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub fn accept_errors(&self) -> u64 {
        self.accept_errors.load(Ordering::Relaxed)
    }

    pub fn count_client_failure(&self, why: ClientFailure) {
        self.client_failures[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn client_failures(&self, why: ClientFailure) -> u64 {
        self.client_failures[why as usize].load(Ordering::Relaxed)
    }

    pub fn count_accepted(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
    }

    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    pub fn count_reload(&self, ok: bool) {
        let counter = if ok {
            &self.reloads_ok
        } else {
            &self.reloads_failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Reloads that published a snapshot (`true`) or kept the old one (`false`).
    pub fn reloads(&self, ok: bool) -> u64 {
        let counter = if ok {
            &self.reloads_ok
        } else {
            &self.reloads_failed
        };
        counter.load(Ordering::Relaxed)
    }
}
