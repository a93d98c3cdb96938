//! magpie's core: what the proxy, `magpie lookup` and the lab must agree on
//! bit for bit, with no async runtime and no I/O.
//!
//! | module | owns |
//! |---|---|
//! | [`hash`] | `h64`, the one hash everything uses (BLAKE2b, 8-byte digest) |
//! | [`label`] | label enums (a counter's series names), declared once with [`labels!`] |
//! | [`placement`] | the placement schemes: Maglev, ring, rendezvous, jump, mod N; bounded-load caps; the candidate walk |
//! | [`key`] | keys from an address, a header value, a JSON body field, a conversation's head or a TLS ClientHello's server name; group keys; fallback reasons |
//! | [`usage`] | token counts read from LLM responses as they stream: OpenAI and Anthropic shapes, JSON or SSE |
//!
//! The proxy (`magpie-proxy`) and the lab (`magpie-lab`) build on this
//! crate; it depends on neither.

#![deny(unsafe_code)]

pub mod hash;
pub mod key;
pub mod label;
pub mod placement;
pub mod usage;
