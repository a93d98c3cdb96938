//! The `queue` section: per-backend limits on what is in flight, and the
//! bounded queue in front of them (its size, the body bytes it may hold,
//! how long a request may wait, how long it waits for its key's home before
//! it spills, priority classes and fairness between tenants).
//!
//! Validation ([`super::validate`]) fills in [`QueueConfig`] from the YAML
//! types in [`super::raw`];
//! [`crate::routing::queue`] works from it, and takes a new one at every
//! reload.

use std::time::Duration;

/// `queue.max_inflight`: requests (mode http) or connections (mode tcp) in
/// flight to one backend, unless the backend says otherwise.
pub const DEFAULT_MAX_INFLIGHT: u64 = 64;
pub const MAX_MAX_INFLIGHT: u64 = 1_000_000;
/// `queue.max_prefill_tokens`: off unless written (mode http). The most
/// is some minutes of an engine's prefill.
pub const MAX_MAX_PREFILL_TOKENS: u64 = 100_000_000;
/// `queue.size`: requests (or connections) waiting, all classes together.
pub const DEFAULT_QUEUE_SIZE: u64 = 1024;
pub const MAX_QUEUE_SIZE: u64 = 1_000_000;
/// `queue.max_body_bytes`: body bytes the waiting requests may hold
/// together (read for their keys, not sent yet).
pub const DEFAULT_QUEUE_BODY_BYTES: u64 = 64 << 20;
pub const MAX_QUEUE_BODY_BYTES: u64 = 16 << 30;
/// `queue.timeout`: the longest a request waits before it is refused with
/// `503`.
pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(30);
pub const MAX_QUEUE_TIMEOUT: Duration = Duration::from_secs(3600);
/// `queue.affinity_wait`: how long a request whose key has a home (its pin,
/// or its table owner) waits for that backend at least, before it takes the
/// next candidate with room where that pays in work. A second is about what prefilling a long
/// conversation again costs an engine elsewhere, so waiting up to that long
/// is worth it; longer, and the cache would be cheaper to rebuild.
pub const DEFAULT_AFFINITY_WAIT: Duration = Duration::from_secs(1);
/// `queue.priority.aging`: a request that waited this long counts one class
/// higher (and two after twice as long), so a low class is never starved.
pub const DEFAULT_AGING: Duration = Duration::from_secs(10);
pub const MAX_AGING: Duration = Duration::from_secs(3600);
/// `queue.priority.engine`: the values a class may have at the engine.
pub const MAX_ENGINE_PRIORITY: i64 = 1_000_000;
/// `queue.priority.classes`: the most classes.
pub const MAX_CLASSES: usize = 16;
/// `queue.tenant.max_queued`: off unless written.
pub const MAX_TENANT_QUEUED: u64 = MAX_QUEUE_SIZE;

/// The validated `queue` section.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    pub max_inflight: u64,
    /// A backend whose requests awaiting their first byte are estimated to
    /// hold this many prompt tokens still to prefill takes no more (one
    /// always goes to a backend with none); `None`: work is not limited.
    pub max_prefill_tokens: Option<u64>,
    pub size: usize,
    pub max_body_bytes: u64,
    pub timeout: Duration,
    pub affinity_wait: Duration,
    pub priority: Priority,
    pub tenant: Option<TenantBy>,
    /// At most this many waiting per tenant; `None`: no ceiling.
    pub tenant_max_queued: Option<usize>,
    /// Tenants take turns across classes (each tenant's own requests by
    /// class), not within each class.
    pub tenant_across_classes: bool,
}

/// `queue.priority`: which header names a request's class, the classes
/// from the highest, and the class of a request that names none (or one
/// not in the list).
#[derive(Debug, Clone, PartialEq)]
pub struct Priority {
    /// Lower case; `None`: every request is of the default class.
    pub header: Option<String>,
    pub classes: Vec<String>,
    /// Index into `classes`.
    pub default: usize,
    pub aging: Duration,
    /// Each class's value of the body field `priority`, which engines that
    /// schedule by priority read (in `classes`' order); `None`: not written.
    pub engine: Option<Vec<i64>>,
}

impl Default for Priority {
    fn default() -> Self {
        Priority {
            header: None,
            classes: vec!["default".to_string()],
            default: 0,
            aging: DEFAULT_AGING,
            engine: None,
        }
    }
}

impl Priority {
    /// The class a header's value names: its index, or the default's.
    pub fn class_of(&self, value: Option<&[u8]>) -> usize {
        value
            .map(<[u8]>::trim_ascii)
            .and_then(|v| (self.classes.iter()).position(|c| c.as_bytes().eq_ignore_ascii_case(v)))
            .unwrap_or(self.default)
    }

    /// The `priority` the engine is told for a request of `class`, if any.
    pub fn engine_value(&self, class: usize) -> Option<i64> {
        self.engine.as_ref()?.get(class).copied()
    }
}

/// `queue.tenant`: what tells tenants apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantBy {
    /// A header's value (lower-case name).
    Header(String),
    /// The request's group (`key.group`).
    Group,
}
