//! Routing state: which backends there are, how each is doing, and which
//! backend takes a key. The data paths ask [`route`] and nothing else which
//! backends to try.
//!
//! | module | owns |
//! |---|---|
//! | [`snapshot`] | `Snapshot`: version, fingerprint, backends, table, settings; built from a `Config`, never changed |
//! | [`instance`] | one running magpie's state: the snapshot behind one `ArcSwap`, and what lives beside it |
//! | [`route`] | candidates + accept policy (health, bounded-load caps, attempts, fail-open) → the backends to try, and why ([`route::How`]) |
//! | [`backend`] | a backend's identity and live state: load, traffic, health, drain |
//! | [`health`] | a backend's health: its state, active checks (TCP or HTTP) with rise/fall, passive failures, engine load scraped from its metrics |
//! | [`sessions`] | session pins: a key's backend kept while the key is in use; groups' homes; the shared store |
//! | [`key_memory`] | what routing last did with each key: where and why, where it spilled (it stays), cache misses and their causes |
//! | [`queue`] | `queue`: per-backend limits on what is in flight, the bounded queue in front of them, its order (priority, tenants in turn, first in first out) and the wait for a key's home before a spill |
//! | [`discovery`] | `dns` and `srv` backends: resolved at start, on reload and every interval; last good answer kept |

pub mod backend;
pub mod discovery;
pub mod health;
pub mod instance;
pub mod key_memory;
pub mod queue;
pub mod route;
pub mod sessions;
pub mod snapshot;
