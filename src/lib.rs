//! magpie: a Layer-4 consistent-hash TCP load balancer.
//!
//! ```text
//! YAML file ──parse──▶ RawConfig ──validate──▶ Config ──build──▶ Snapshot ──publish──▶ ArcSwap<Snapshot>
//!                                                                                     │ load() once per connection
//! accept ─▶ (PROXY header) ─▶ key ─▶ snapshot.candidates(key) ─▶ connect first that takes it ─▶ copy both ways
//!                                                                                     │
//!                                                      per-backend live state (atomics) ─▶ metrics / admin
//! ```
//!
//! Each arrow is one module's job, and nothing flows backwards: the data path
//! never writes config, and placement never does I/O.
//!
//! | module | owns |
//! |---|---|
//! | [`hash`] | `h64`, the one hash everything uses |
//! | [`placement`] | pure placement schemes: Maglev, ring, rendezvous, jump, mod N, bounded loads |
//! | [`simulate`] | the placement lab behind `magpie simulate` |

pub mod hash;
pub mod placement;
pub mod simulate;
