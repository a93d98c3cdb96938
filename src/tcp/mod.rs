//! The L4 data path (`mode: tcp`): one key per connection.
//!
//! `accept ─▶ (PROXY header) ─▶ key from address or first bytes ─▶ route ─▶
//! connect first that takes it ─▶ copy both ways`.
//!
//! | module | owns |
//! |---|---|
//! | [`listener`] | the accept loop, `max_connections`, the drain at shutdown |
//! | [`connection`] | one connection: origin, key, route, connect, copy, count |
//! | [`header_key`] | reading a header key from the first bytes, under a deadline |
//! | [`copy`] | copying both ways with half-close, idle timeout, drain and stop |

pub mod connection;
pub mod copy;
pub mod header_key;
pub mod listener;

pub use listener::serve;
