//! `magpie demo`: magpie in front of backends it starts itself, in one
//! process, so a newcomer sees a key land on its backend within seconds.
//!
//! | module | owns |
//! |---|---|
//! | [`llm`] | mode http (the default): three simulated inference engines, and `--load`'s comparison with round robin |
//! | [`tcp`] | `--mode tcp`: three plain HTTP backends that say who answered |
//! | [`disaggregated`] | `--mode disaggregated`: two prefill and two decode engines behind `config/disaggregated.yaml` |

pub mod disaggregated;
pub mod llm;
pub mod tcp;

/// The session header the demos' clients send and magpie hashes.
pub const SESSION_HEADER: &str = "x-session-id";
