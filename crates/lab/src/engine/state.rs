//! What every connection of one engine shares: its settings, the queue to
//! its GPU, its counters and the name it signs answers with.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use hyper::header::HeaderValue;
use tokio::sync::mpsc;

use super::EngineConfig;
use super::gpu::{Counters, Msg};
use super::transfer::Leases;

/// What every connection shares.
pub struct State {
    pub config: EngineConfig,
    /// Where it listens: what a prefill half's answer says to pull from.
    pub addr: std::net::SocketAddr,
    pub(super) jobs: mpsc::Sender<Msg>,
    pub counters: Arc<Counters>,
    pub(super) next_id: AtomicU64,
    /// Seconds since the epoch at start (`created` in answers).
    pub started: u64,
    pub(super) engine: HeaderValue,
    /// Prefill halves' KV, ready to pull.
    pub(super) leases: Leases,
}

impl State {
    pub fn new(
        config: EngineConfig,
        addr: std::net::SocketAddr,
        jobs: mpsc::Sender<Msg>,
        counters: Arc<Counters>,
    ) -> Self {
        // The name was validated as visible ASCII, which a header value takes.
        let engine = HeaderValue::from_str(&config.name)
            .unwrap_or_else(|_| HeaderValue::from_static("engine"));
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self {
            leases: Leases::new(config.kv_lease),
            config,
            addr,
            jobs,
            counters,
            next_id: AtomicU64::new(1),
            started,
            engine,
        }
    }
}
