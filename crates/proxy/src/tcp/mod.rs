//! The L4 data path (`mode: tcp`): one key per connection.
//!
//! `accept ─▶ intake (PROXY header, bytes read ahead) ─▶ key from address or
//! first bytes (a request header or a TLS server name) ─▶ route ─▶ connect first that takes it ─▶ copy both ways`.
//!
//! | module | owns |
//! |---|---|
//! | [`connection`] | one connection in phases: intake, signature check, key, route, connect, copy, account |
//! | [`connection_log`] | a connection's access-log line: begun at accept, written at its end with how it ended |
//! | [`header_key`] | reading a header key from the first bytes, under a deadline |
//! | [`sni_key`] | reading a TLS ClientHello's server name from the first bytes, under a deadline |
//! | [`copy`] | copying both ways with half-close, idle timeout, drain and stop |
//! | [`direction`] | one direction: pooled buffers or pipes held only while bytes are in flight |
//! | [`pipe`] | splice(2) through pooled pipes: socket → pipe → socket without a userspace copy (Linux) |

pub(crate) mod connection;
pub(crate) mod connection_log;
pub(crate) mod copy;
pub(crate) mod direction;
pub(crate) mod header_key;
// The one module allowed `unsafe`: three libc calls (pipe2, fcntl, splice).
pub(crate) mod pipe;
pub(crate) mod sni_key;

/// Serves one accepted connection of the TCP path. A plain function, not an
/// `async fn`: its future is the connection's own, not a second one around it.
pub(crate) fn serve_connection(
    accepted: crate::intake::listener::Accepted,
) -> impl Future<Output = ()> {
    connection::serve(accepted)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::Semaphore;
    use tokio_util::sync::CancellationToken;

    use crate::config::Config;
    use crate::intake::listener::Accepted;
    use crate::net::{Local, Peer};
    use crate::routing::instance::Instance;
    use crate::routing::snapshot::Snapshot;

    /// An idle connection's memory is mostly its task: keep the future the
    /// accept loop spawns small (1,256 bytes in a release build when this
    /// was written; the bound leaves room for compiler changes and debug
    /// builds).
    #[tokio::test]
    async fn the_connection_task_stays_small() {
        let text = "listen: 127.0.0.1:7000\nkey: {from: header, header: x-session-id}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n";
        let config = Config::parse(std::path::Path::new("t.yaml"), text).unwrap();
        let snapshot = Snapshot::build(Arc::new(config), 1, &Default::default()).unwrap();
        let instance = Arc::new(Instance::new(snapshot));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (stream, peer) = accepted.unwrap();
        let accepted = Accepted {
            stream,
            peer: Peer(peer),
            local: Local(addr),
            listener: 0,
            instance,
            shutdown: CancellationToken::new(),
            stop: CancellationToken::new(),
            slot: Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap(),
        };
        let task = super::serve_connection(accepted);
        let size = std::mem::size_of_val(&task);
        eprintln!("the connection task is {size} bytes");
        assert!(size <= 1536, "the connection task is {size} bytes");
        drop((task, client));
    }
}
