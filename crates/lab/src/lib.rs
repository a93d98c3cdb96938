//! The lab beside the proxy: `magpie simulate` (how hashing schemes move keys
//! and balance load when a pool changes), `magpie plan` (what a config change
//! would move, before it is made), `magpie demo` (three simulated inference
//! replicas and magpie in front of them, and with `--load` a comparison with
//! round robin; `--mode tcp`: three plain HTTP backends) and `magpie engine` (a simulated inference
//! engine with a prefix cache and a GPU's time model, to route LLM traffic
//! to without a GPU) and `magpie workload` (multi-turn chats against such
//! engines, through any router, measuring cache hits against the ideal) and
//! `magpie datagrams` (a UDP echo server and load, for mode udp's benchmark).
//! Nothing on the data path imports it.

pub mod bounds;
pub mod datagrams;
pub mod demo;
pub mod engine;
pub mod plan;
pub mod simulate;
pub mod workload;
