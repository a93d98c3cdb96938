//! A backend's health, in one room: its state, the active checks that probe
//! it, and the passive evidence the data paths bring.
//!
//! | module | owns |
//! |---|---|
//! | [`state`] | up or down, the streaks that move it (rise, fall, passive failures), transitions |
//! | [`active`] | the check loop: a TCP connect or an HTTP `GET` per backend, every `interval` |
//! | [`passive`] | failed connects and failed answers on the data path; whose fault a failure was |
//! | [`engine_load`] | engine load: an inference engine's queue and KV cache as last scraped, fresh or aged out |
//! | [`engine_scrape`] | the scrape loop: each backend's own `/metrics` every `health.load.interval` |
//! | [`exposition`] | the few gauges engine load needs, read out of Prometheus text (pure, bounded) |
//!
//! Health marks backends up or down; it never rebuilds the table. A lookup
//! skips down backends, so a flapping backend never moves the keys of healthy
//! ones, and every instance with the same config still routes a key the same
//! way. Backends start *up*: traffic flows from the first moment, and a dead
//! backend is taken out after `fall` failed checks (or sooner, after
//! `passive_failures` failed connects on the data path).
//!
//! Engine load never marks anything down: a backend whose engine reports a
//! long queue or a full KV cache is passed over for new keys while the value
//! is fresh, and a failed scrape only lets the value age out.
//!
//! This room sits below the backends it judges: it knows a backend only as a
//! [`Target`] (a name, an address, a [`Health`], an [`EngineLoad`]) and the
//! pool only as [`Targets`], which the backend and the snapshot implement.

pub(crate) mod active;
pub(crate) mod engine_load;
pub(crate) mod engine_scrape;
pub(crate) mod exposition;
pub(crate) mod passive;
pub(crate) mod state;

use std::net::SocketAddr;
use std::sync::Arc;

pub(crate) use active::run;
pub(crate) use engine_load::{EngineLoad, ScrapeResult};
pub(crate) use state::{CheckOutcome, ConnectFailure, Health};

use crate::config::HealthConfig;
use crate::telemetry::stats::Stats;

/// Something health can judge: a backend.
pub(crate) trait Target: Send + Sync + 'static {
    /// The name it is logged by.
    fn name(&self) -> &str;
    fn addr(&self) -> SocketAddr;
    fn health(&self) -> &Health;
    /// What its inference engine last said about its load (`health.load`).
    fn engine(&self) -> &EngineLoad;
    /// How it is reached over TLS, if it is: checks go over TLS too.
    fn tls(&self) -> Option<&crate::net::tls_client::BackendTls> {
        None
    }
}

/// One round of checks: the `health` section in force (none: no checks) and
/// the targets to probe.
pub(crate) struct Round<T> {
    pub(crate) health: Option<HealthConfig>,
    pub(crate) targets: Vec<Arc<T>>,
}

/// What the check loop probes: the pool as it is now.
pub(crate) trait Targets: Send + Sync + 'static {
    type Target: Target;
    /// The settings and targets in force now; asked again every round.
    fn round(&self) -> Round<Self::Target>;
    /// Where a check skipped for want of file descriptors is counted.
    fn stats(&self) -> &Stats;
}
