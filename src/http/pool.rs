//! Keep-alive connections to backends (`mode: http`), reused across requests
//! and clients.
//!
//! A connection is opened on demand (`net::connect`, counted against the
//! backend like a TCP-path connect), handed to hyper's HTTP/1.1 client, and
//! returned to its backend's idle list once its response has been read to the
//! end. Idle lists are bounded ([`MAX_IDLE_PER_BACKEND`]) and an idle
//! connection is not reused after [`IDLE_TIMEOUT`]: servers such as uvicorn
//! (vLLM, SGLang) close idle keep-alive connections after 5 s, and a request
//! sent on a connection the server is closing is lost. Identity is the
//! backend's name and address, as for its live state, so a reload that keeps
//! a backend keeps its connections.

use std::collections::HashMap;
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

/// The idle connections of every backend.
#[derive(Default)]
pub struct Pool {
    idle: Mutex<HashMap<(String, SocketAddr), Vec<Idle>>>,
}

impl Pool {
    /// An idle connection to `backend` that can take a request now, if any.
    /// Connections that closed or idled out are dropped on the way.
    pub fn checkout(&self, backend: &Backend) -> Option<Sender> {
        let mut idle = lock(&self.idle);
        let list = idle.get_mut(&(backend.name.clone(), backend.addr))?;
        while let Some(entry) = list.pop() {
            if entry.since.elapsed() < IDLE_TIMEOUT && entry.sender.is_ready() {
                return Some(entry.sender);
            }
        }
        None
    }

    /// Returns `sender` to `backend`'s idle list once its current response
    /// has been read to the end (or drops it if the connection closes).
    pub fn checkin(self: &Arc<Self>, backend: &Backend, mut sender: Sender) {
        let pool = Arc::clone(self);
        let id = (backend.name.clone(), backend.addr);
        tokio::spawn(async move {
            if sender.ready().await.is_err() {
                return;
            }
            let mut idle = lock(&pool.idle);
            let list = idle.entry(id).or_default();
            list.retain(|e| e.since.elapsed() < IDLE_TIMEOUT && !e.sender.is_closed());
            if list.len() < MAX_IDLE_PER_BACKEND {
                list.push(Idle {
                    sender,
                    since: Instant::now(),
                });
            }
        });
    }

    /// Forgets idle connections to backends no longer in `keep` (after a
    /// reload removed them); dropping a sender closes its connection.
    pub fn retain(&self, keep: impl Fn(&str, SocketAddr) -> bool) {
        lock(&self.idle).retain(|(name, addr), _| keep(name, *addr));
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
