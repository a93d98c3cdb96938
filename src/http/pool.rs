//! Keep-alive connections to backends (`mode: http`), reused across requests
//! and clients.
//!
//! A connection is opened on demand (`net::connect`, counted against the
//! backend like a TCP-path connect), handed to hyper's HTTP/1.1 client, and
//! returned to its backend's idle list by the response body when the client
//! has read it to the end (a response abandoned half-way closes its
//! connection instead). Idle lists are bounded ([`MAX_IDLE_PER_BACKEND`]) and an idle
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

use super::body::Upload;
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

impl Pool {
    /// The most recently used idle connection to `addr` that is still open
    /// and fresh, if any; older or closed ones met on the way are dropped.
    /// Its last response was read to the end, so it is ready for a request
    /// as soon as its connection task has noticed (`SendRequest::ready`).
    pub fn checkout(&self, addr: SocketAddr) -> Option<Sender> {
        let mut idle = lock(&self.idle);
        let list = idle.get_mut(&addr)?;
        while let Some(entry) = list.pop_back() {
            if entry.since.elapsed() < IDLE_TIMEOUT && !entry.sender.is_closed() {
                return Some(entry.sender);
            }
        }
        None
    }

    /// Puts `sender` back once the response it carried has been read to the
    /// end. Entries are kept in the order they came back, so the ones that
    /// idled out are at the front.
    pub fn checkin(&self, addr: SocketAddr, sender: Sender) {
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

/// Opens a new connection to `backend` and starts hyper's client on it.
pub async fn connect(backend: &Arc<Backend>, timeout: Duration) -> io::Result<Sender> {
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
    Ok(sender)
}

/// A poisoned lock only means another thread panicked while holding it; the
/// lists themselves are still valid.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
