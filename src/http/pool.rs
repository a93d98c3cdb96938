//! Keep-alive connections to backends (`mode: http`), reused across requests
//! and clients.
//!
//! A connection is opened on demand (`net::connect`, counted against the
//! backend like a TCP-path connect) and handed to hyper's HTTP/1.1 client. A
//! request holds its connection as a [`Lease`]; the response body gives the
//! lease back to its backend's idle list when the client has read it to the
//! end (a response abandoned half-way drops the lease, which closes the
//! connection). Idle lists are bounded ([`MAX_IDLE_PER_BACKEND`]) and an idle
//! connection is not reused after [`IDLE_TIMEOUT`]: servers such as uvicorn
//! (vLLM, SGLang) close idle keep-alive connections after 5 s, and a request
//! sent on a connection the server is closing is lost. Connections are kept
//! by backend address, so a reload that keeps a backend keeps them.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::time::Instant;
use tracing::debug;

use super::upload::Upload;
use crate::backend::Backend;

/// Idle connections kept per backend.
pub const MAX_IDLE_PER_BACKEND: usize = 128;
/// How long an idle connection may wait for its next request.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// A sender for requests on one upstream connection.
pub type Sender = SendRequest<Upload>;

struct Idle {
    sender: Sender,
    since: Instant,
}

/// The idle connections of every backend, by address (addresses are unique
/// within a pool, and a connection to an address serves whichever backend
/// has it).
#[derive(Default)]
pub struct Pool {
    idle: Mutex<HashMap<SocketAddr, VecDeque<Idle>>>,
}

/// One upstream connection, held by one request from its send to the end of
/// its response. Given back, it waits in the pool for the next request;
/// dropped, it closes.
pub struct Lease {
    pub sender: Sender,
    /// Opened for this request (not taken from the pool).
    pub fresh: bool,
    addr: SocketAddr,
    pool: Arc<Pool>,
}

impl Lease {
    /// The response was read to its end: the connection goes back to the pool.
    pub fn give_back(self) {
        self.pool.checkin(self.addr, self.sender);
    }
}

impl Pool {
    /// The most recently used idle connection to `addr` that is still open
    /// and fresh, if any; older or closed ones met on the way are dropped.
    /// Its last response was read to the end, so it is ready for a request
    /// as soon as its connection task has noticed (`SendRequest::ready`).
    pub fn checkout(self: &Arc<Self>, addr: SocketAddr) -> Option<Lease> {
        let mut idle = lock(&self.idle);
        let list = idle.get_mut(&addr)?;
        while let Some(entry) = list.pop_back() {
            if entry.since.elapsed() < IDLE_TIMEOUT && !entry.sender.is_closed() {
                return Some(Lease {
                    sender: entry.sender,
                    fresh: false,
                    addr,
                    pool: Arc::clone(self),
                });
            }
        }
        None
    }

    /// Puts `sender` back once the response it carried has been read to the
    /// end. Entries are kept in the order they came back, so the ones that
    /// idled out are at the front.
    fn checkin(&self, addr: SocketAddr, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        let mut idle = lock(&self.idle);
        let list = idle.entry(addr).or_default();
        while list
            .front()
            .is_some_and(|e| e.since.elapsed() >= IDLE_TIMEOUT)
        {
            list.pop_front();
        }
        if list.len() < MAX_IDLE_PER_BACKEND {
            list.push_back(Idle {
                sender,
                since: Instant::now(),
            });
        }
    }
}

/// Opens a new connection to `backend` for `pool` and starts hyper's client
/// on it.
pub async fn connect(
    pool: &Arc<Pool>,
    backend: &Arc<Backend>,
    timeout: Duration,
) -> io::Result<Lease> {
    let stream = crate::net::connect(backend.addr, timeout).await?;
    let (sender, connection) = http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await
        .map_err(io::Error::other)?;
    let open = backend.live.open_upstream();
    let name = backend.name.clone();
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            debug!(backend = %name, error = %e, "upstream connection ended with an error");
        }
        drop(open);
    });
    Ok(Lease {
        sender,
        fresh: true,
        addr: backend.addr,
        pool: Arc::clone(pool),
    })
}

/// A poisoned lock only means another thread panicked while holding it; the
/// lists themselves are still valid.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
