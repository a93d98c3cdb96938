//! One client connection, from accept to close.
//!
//! `(PROXY header) ─▶ key ─▶ route ─▶ connect first that takes it ─▶
//! (PROXY v2 out) ─▶ replay ─▶ copy both ways ─▶ count`.
//!
//! The snapshot is loaded once per connection; what the connection needs
//! (its route, its settings) is taken out of it before the first connect, so
//! an old table is not kept alive by long connections.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::copy::{End, Pending, Transfer, copy_both_ways};
use super::header_key::{HeaderKey, Want, read_header_key};
use crate::backend::{ActiveGuard, Backend, Side};
use crate::config::{Config, KeyConfig};
use crate::health::passive::{self, Blame};
use crate::key;
use crate::listener::Accepted;
use crate::net::{Client, Local, Peer, reset_on_close};
use crate::proxy_protocol::{self, Origin, Signature};
use crate::route::Route;
use crate::snapshot::Shared;
use crate::stats::{ClientFailure, Stats};
use crate::throttle::Throttle;

/// How long an untrusted peer (with PROXY input on) has to show its first
/// bytes before magpie connects anyway and keeps watching them in the copy.
pub const SIGNATURE_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// One accepted connection and what serving it needs.
pub struct Connection {
    /// The accepted socket, tuned.
    stream: TcpStream,
    /// Where the TCP connection came from.
    peer: Peer,
    /// The address it was accepted on.
    local: Local,
    shared: Arc<Shared>,
    /// Fired when the shutdown grace is over: close now.
    stop: CancellationToken,
    /// The `max_connections` slot, held until the connection ends.
    _slot: OwnedSemaphorePermit,
}

/// The client's first bytes, read before a backend was chosen (a PROXY
/// header's trailing bytes, a request head); they are replayed to it.
struct FirstBytes {
    buf: Vec<u8>,
    filled: usize,
}

impl Connection {
    pub fn new(accepted: Accepted) -> Connection {
        Connection {
            stream: accepted.stream,
            peer: accepted.peer,
            local: accepted.local,
            shared: accepted.shared,
            stop: accepted.stop,
            _slot: accepted.slot,
        }
    }

    /// Serves the connection until it ends. Never panics on anything a peer
    /// sends; every failure is logged and counted.
    pub async fn serve(mut self) {
        let snapshot = self.shared.snapshot.load_full();
        let config = Arc::clone(&snapshot.config);
        // Empty until a PROXY header, a signature check or a header key
        // reads into it; freed once its bytes are replayed.
        let mut first = FirstBytes {
            buf: Vec::new(),
            filled: 0,
        };

        // 1. Who the client really is.
        let Some((client, local)) = self.origin(&config, &mut first).await else {
            return;
        };
        // Untrusted peers must not pass a PROXY header on when PROXY input is
        // on: decided from their first bytes before any backend is touched,
        // if they speak within SIGNATURE_WAIT; else watched in the copy.
        let pp = &config.proxy_protocol;
        let mut check_signature = !pp.accept_from.is_empty() && !pp.is_trusted(self.peer.0.ip());
        if check_signature {
            match self.first_signature(&mut first).await {
                Signature::Yes => {
                    self.refuse_untrusted_header();
                    return;
                }
                Signature::No => check_signature = false,
                Signature::Maybe => {}
            }
        }

        // 2. The key; 3. who may take it.
        let key = self.key(&config, client, &mut first).await;
        let route = Route::plan(&snapshot, key);
        drop(snapshot);

        // 4. Connect to the first that does.
        let stats = &self.shared.stats;
        let (backend, mut upstream, _active) = match connect_first(&route, &config, stats).await {
            Ok(connected) => connected,
            Err(failure) => {
                if failure == ClientFailure::NoBackend {
                    warn!(%client, tried = route.targets.len(), "no backend took the connection; closing client");
                }
                stats.count_client_failure(failure);
                return;
            }
        };
        debug!(%client, backend = %backend.name, "connected");
        let connected = tokio::time::Instant::now();

        // 5. PROXY v2 out, then copy (starting with the bytes read so far).
        if config.proxy_protocol.send_v2 {
            let header = proxy_protocol::v2_header(client.0, local.0);
            if let Err(e) = upstream.write_all(&header).await {
                warn!(backend = %backend.name, error = %e, "cannot send PROXY header to backend");
                return;
            }
        }
        let end = copy_both_ways(
            &mut self.stream,
            &mut upstream,
            Pending {
                buf: std::mem::take(&mut first.buf),
                filled: first.filled,
            },
            Transfer {
                backend: &backend,
                idle_timeout: config.idle_timeout,
                stop: &self.stop,
                check_signature,
                copy: config.copy,
            },
        )
        .await;
        backend
            .live
            .traffic
            .connection_duration
            .observe(connected.elapsed());
        match end {
            End::Refused => self.refuse_untrusted_header(),
            End::Idle => {
                backend.live.traffic.count_idle_close();
                debug!(%client, backend = %backend.name, "idle_timeout passed; connection closed")
            }
            End::Aborted(side, e) => {
                // Pass the abort on: the other side gets a reset too.
                let other = match side {
                    Side::Client => &upstream,
                    Side::Backend => &self.stream,
                };
                reset_on_close(other);
                backend.live.traffic.count_reset(side);
                debug!(%client, backend = %backend.name, aborted_by = side.as_str(), error = %e, "connection aborted; passing the reset on")
            }
            End::Stopped => {
                // The shutdown grace is over: cut, and say so to both sides.
                reset_on_close(&self.stream);
                reset_on_close(&upstream);
                debug!(%client, backend = %backend.name, "shutdown grace over; connection reset")
            }
            other => {
                debug!(%client, backend = %backend.name, end = ?other, "connection closed")
            }
        }
    }

    /// Reads the client's first bytes until they do or do not start with a
    /// PROXY signature, for at most [`SIGNATURE_WAIT`]. `Maybe` when the
    /// client said too little in that time (a server-speaks-first protocol).
    async fn first_signature(&mut self, first: &mut FirstBytes) -> Signature {
        // A signature is decided within its first 12 bytes.
        if first.buf.len() < first.filled + 64 {
            first.buf.resize(first.filled + 64, 0);
        }
        let read = async {
            loop {
                match proxy_protocol::signature(&first.buf[..first.filled]) {
                    Signature::Maybe => {}
                    decided => return decided,
                }
                match self.stream.read(&mut first.buf[first.filled..]).await {
                    // The client is done or gone: nothing to pass on.
                    Ok(0) | Err(_) => return Signature::No,
                    Ok(n) => first.filled += n,
                }
            }
        };
        tokio::time::timeout(SIGNATURE_WAIT, read)
            .await
            .unwrap_or(Signature::Maybe)
    }

    /// Counts, and logs at most once a second, a PROXY header from a peer
    /// that is not trusted to send one.
    fn refuse_untrusted_header(&self) {
        static LOG: Throttle = Throttle::new(std::time::Duration::from_secs(1));
        self.shared
            .stats
            .count_client_failure(ClientFailure::ProxyProtocol);
        if let Some(held_back) = LOG.allow() {
            warn!(peer = %self.peer, held_back, "refusing connection: PROXY header from an untrusted peer");
        }
    }

    /// The real client and destination: from a trusted peer's PROXY header,
    /// else the socket's own. `None` when a trusted peer sent no valid header
    /// (the connection is refused and counted).
    async fn origin(&mut self, config: &Config, first: &mut FirstBytes) -> Option<(Client, Local)> {
        let pp = &config.proxy_protocol;
        let own = (Client(self.peer.0), self.local);
        if !pp.is_trusted(self.peer.0.ip()) {
            return Some(own);
        }
        first.buf.resize(proxy_protocol::MAX_HEADER_BYTES, 0);
        let header = proxy_protocol::read_header(
            &mut self.stream,
            &mut first.buf,
            &mut first.filled,
            pp.header_timeout,
        )
        .await;
        match header {
            Ok(Origin::Proxied {
                source,
                destination,
            }) => Some((Client(source), Local(destination))),
            Ok(Origin::Local) => Some(own),
            Err(e) => {
                warn!(peer = %self.peer, error = %e, "refusing connection: bad PROXY header from a trusted peer");
                self.shared
                    .stats
                    .count_client_failure(ClientFailure::ProxyProtocol);
                None
            }
        }
    }

    /// The connection's key, reading the first bytes in header mode.
    async fn key(&mut self, config: &Config, client: Client, first: &mut FirstBytes) -> u64 {
        // Address keys; validation allows body and conversation keys in
        // mode http only.
        let KeyConfig::Header { name, read, .. } = &config.key else {
            return config.key.address_key(client.0);
        };
        let found = read_header_key(
            &mut self.stream,
            &mut first.buf,
            &mut first.filled,
            Want {
                header: name,
                limit: read.max_bytes,
                deadline: read.read_timeout,
            },
        )
        .await;
        match found {
            HeaderKey::Found(k) => k,
            HeaderKey::Fallback(reason) => {
                debug!(%client, reason = reason.as_str(), "header key not found, using fallback key");
                self.shared.stats.count_fallback(reason);
                key::fallback_key(read.fallback, client.0)
            }
        }
    }
}

/// Connects to the first target of `route` that takes the connection, with
/// the connect timeout per attempt. A target that filled up since the route
/// was planned is skipped without a connect. When magpie itself is out of
/// resources, the others are not tried.
async fn connect_first(
    route: &Route,
    config: &Config,
    stats: &Stats,
) -> Result<(Arc<Backend>, TcpStream, ActiveGuard), ClientFailure> {
    for backend in &route.targets {
        let Some(guard) = route.reserve(backend) else {
            continue;
        };
        let started = tokio::time::Instant::now();
        match crate::net::connect(backend.addr, config.connect.timeout).await {
            Ok(stream) => {
                backend.live.traffic.connect_time.observe(started.elapsed());
                backend.live.traffic.count_connection();
                passive::succeeded(&**backend);
                return Ok((Arc::clone(backend), stream, guard));
            }
            Err(e) => {
                if passive::connect_failed(&**backend, &e, config.health.as_ref(), stats)
                    == Blame::Local
                {
                    return Err(ClientFailure::LocalResources);
                }
            }
        }
    }
    Err(ClientFailure::NoBackend)
}
