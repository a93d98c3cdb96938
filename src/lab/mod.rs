//! The lab beside the proxy: `magpie simulate` (how hashing schemes move keys
//! and balance load when a pool changes), `magpie plan` (what a config change
//! would move, before it is made) and `magpie demo` (three HTTP backends and
//! magpie in front of them). Nothing on the data path imports it.

pub mod demo;
pub mod plan;
pub mod simulate;
