//! Routing state, and the one decision every data path asks for: which
//! backends there are, how each is doing, and where a request, connection
//! or flow goes. A data path calls [`decision`] twice (plan, then commit)
//! and nothing else of routing decides anything for it.
//!
//! ```text
//! keys ─▶ decision::plan ─▶ route (table + health, caps, attempts) ─▶ pins / key memory / LLM policy
//!                        ─▶ take (queue: limits, order, the wait for a home) ─▶ data path connects
//!                        ─▶ commit (key memory, pins, openings, groups)
//! ```
//!
//! | module | owns |
//! |---|---|
//! | [`keys`] | the hashes a request is routed by, a type each: session, group, opening, tenant |
//! | [`snapshot`] | `Snapshot`: version, fingerprint, backends, table, settings; built from a `Config`, never changed |
//! | [`instance`] | one running magpie's state: the snapshot behind one `ArcSwap`, and what lives beside it |
//! | [`decision`] | one routing decision for every data path: plan (targets, why, what to wait for), take a slot, commit (pins, key memory, openings, work) |
//! | [`route`] | candidates + accept policy (health, bounded-load caps, attempts, fail-open) → the backends to try, and why ([`route::How`]) |
//! | [`backend`] | a backend's identity and live state: load, traffic, health, drain |
//! | [`health`] | a backend's health: its state, active checks (TCP or HTTP) with rise/fall, passive failures, engine load scraped from its metrics |
//! | [`sessions`] | session pins: a key's backend kept while the key is in use; groups' homes; the shared store |
//! | [`key_memory`] | what routing last did with each key: where and why, where it spilled (it stays), the counts of decisions and cache misses |
//! | [`queue`] | `queue`: per-backend limits on what is in flight, the bounded queue in front of them, its order (priority, tenants in turn, first in first out) and the wait for a key's home before a spill |
//! | [`llm`] | the LLM policy behind the decision: groups' homes, conversations' openings, prefill work, engines' usage |
//! | [`discovery`] | `dns` and `srv` backends: resolved at start, on reload and every interval; last good answer kept |

pub(crate) mod backend;
pub(crate) mod decision;
pub(crate) mod discovery;
pub(crate) mod health;
pub(crate) mod instance;
pub(crate) mod key_memory;
pub(crate) mod keys;
pub(crate) mod llm;
pub(crate) mod queue;
pub(crate) mod route;
pub(crate) mod sessions;
pub(crate) mod snapshot;
