//! The L4 data path (`mode: tcp`): one key per connection.
//!
//! `accept ─▶ (PROXY header) ─▶ key from address or first bytes ─▶ route ─▶
//! connect first that takes it ─▶ copy both ways`.
//!
//! | module | owns |
//! |---|---|
//! | [`connection`] | one connection: origin, key, route, connect, copy, count |
//! | [`header_key`] | reading a header key from the first bytes, under a deadline |
//! | [`copy`] | copying both ways with half-close, idle timeout, drain and stop |
//! | [`direction`] | one direction: pooled buffers or pipes held only while bytes are in flight |
//! | [`pipe`] | splice(2) through pooled pipes: socket → pipe → socket without a userspace copy (Linux) |

pub mod connection;
pub mod copy;
pub mod direction;
pub mod header_key;
// The one module allowed `unsafe`: three libc calls (pipe2, fcntl, splice).
#[allow(unsafe_code)]
pub mod pipe;

/// Serves one accepted connection of the TCP path. A plain function, not an
/// `async fn`: its future is the connection's own, not a second one around it.
pub fn serve_connection(accepted: crate::listener::Accepted) -> impl Future<Output = ()> {
    connection::Connection::new(accepted).serve()
}
