//! One client connection, from accept to close.
//!
//! `(PROXY header) ─▶ key ─▶ snapshot candidates ─▶ connect first that takes
//! it ─▶ (PROXY v2 out) ─▶ replay ─▶ copy both ways ─▶ count`.
//!
//! The snapshot is loaded once per connection; what the connection needs
//! (its target backends, its settings) is taken out of it before the first
//! connect, so an old table is not kept alive by long connections.
//!
//! Copying uses two fixed buffers per connection (one per direction, no
//! allocation per read) and honours half-close: one side's EOF shuts down the
//! other side's write half while the other direction keeps flowing. Activity
//! in either direction resets the idle timer.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::backend::{ActiveGuard, Backend, ConnectFailure};
use crate::config::{AllDown, Config, KeyConfig};
use crate::key::{self, HeaderKey};
use crate::metrics::ClientFailure;
use crate::placement::{MAX_CANDIDATES, bounded};
use crate::proxy_protocol::{self, Origin, Signature};
use crate::snapshot::{Shared, Snapshot};

/// Size of each direction's copy buffer (HAProxy's default `bufsize` too).
pub const COPY_BUFFER: usize = 16 * 1024;

/// How a connection ended, for the debug log.
#[derive(Debug)]
enum End {
    Done,
    Idle,
    Stopped,
    Drained,
    /// An untrusted peer started with a PROXY signature.
    Refused,
    Error(io::Error),
}

/// Serves one accepted connection until it ends. Never panics on anything a
/// peer sends; every failure is logged and counted.
pub async fn handle(
    mut client: TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let snapshot = shared.snapshot.load_full();
    let config = Arc::clone(&snapshot.config);

    let buf_len = match &config.key {
        KeyConfig::Header { max_bytes, .. } => COPY_BUFFER.max(*max_bytes),
        _ => COPY_BUFFER,
    };
    let mut up_buf = vec![0u8; buf_len];
    let mut filled = 0usize;

    // 1. Who the client really is.
    let (mut client_addr, mut client_dst) = (peer, local);
    let pp = &config.proxy_protocol;
    let trusted = pp.is_trusted(peer.ip());
    if trusted {
        match proxy_protocol::read_header(&mut client, &mut up_buf, &mut filled, pp.header_timeout)
            .await
        {
            Ok(Origin::Proxied {
                source,
                destination,
            }) => {
                client_addr = source;
                client_dst = destination;
            }
            Ok(Origin::Local) => {}
            Err(e) => {
                warn!(%peer, error = %e, "refusing connection: bad PROXY header from a trusted peer");
                shared
                    .stats
                    .count_client_failure(ClientFailure::ProxyProtocol);
                return;
            }
        }
    }
    // Untrusted peers must not pass a PROXY header on when PROXY input is on.
    let check_signature = !trusted && !pp.accept_from.is_empty();

    // 2. The key.
    let key = match &config.key {
        KeyConfig::SourceIp => key::source_ip_key(client_addr.ip()),
        KeyConfig::SourceAddr => key::source_addr_key(client_addr),
        KeyConfig::Header {
            name,
            read_timeout,
            max_bytes,
            fallback,
        } => {
            match key::read_header_key(
                &mut client,
                &mut up_buf,
                &mut filled,
                *max_bytes,
                name,
                *read_timeout,
            )
            .await
            {
                HeaderKey::Found(k) => k,
                HeaderKey::Fallback(reason) => {
                    debug!(client = %client_addr, reason = reason.as_str(), "header key not found, using fallback key");
                    shared.stats.count_fallback(reason);
                    key::fallback_key(*fallback, client_addr)
                }
            }
        }
    };

    // 3. Who may take it.
    let plan = Plan::new(&snapshot, key, true);
    drop(snapshot);

    // 4. Connect to the first that does.
    let Some((backend, mut upstream, _active)) = connect_first(&plan, &config).await else {
        warn!(client = %client_addr, tried = plan.targets.len(), "no backend took the connection; closing client");
        shared.stats.count_client_failure(ClientFailure::NoBackend);
        return;
    };
    debug!(client = %client_addr, backend = %backend.name, "connected");

    // 5. PROXY v2 out, then copy (starting with the bytes read so far).
    if config.proxy_protocol.send_v2 {
        let header = proxy_protocol::v2_header(client_addr, client_dst);
        if let Err(e) = upstream.write_all(&header).await {
            warn!(backend = %backend.name, error = %e, "cannot send PROXY header to backend");
            return;
        }
    }
    let end = copy_both_ways(
        &mut client,
        &mut upstream,
        &mut up_buf,
        filled,
        check_signature,
        &backend,
        config.idle_timeout,
        &stop,
    )
    .await;
    match end {
        End::Refused => {
            warn!(%peer, "refusing connection: PROXY header from an untrusted peer");
            shared
                .stats
                .count_client_failure(ClientFailure::ProxyProtocol);
        }
        End::Error(e) => {
            debug!(client = %client_addr, backend = %backend.name, error = %e, "connection ended with an error")
        }
        other => {
            debug!(client = %client_addr, backend = %backend.name, end = ?other, "connection closed")
        }
    }
}

/// The backends one connection will try, in order, taken from a snapshot.
pub struct Plan {
    pub targets: Vec<Arc<Backend>>,
    /// Bounded-load factor, pool load and weight when the plan was made.
    bounded: Option<(f64, u64, u64)>,
}

impl Plan {
    /// Walks the candidates: down backends are skipped (and counted as
    /// spills), so are backends at their bounded-load cap; at most
    /// `connect.attempts` targets are kept. If health left nobody, the policy
    /// decides: try the candidates anyway (fail open), or refuse.
    /// `count_spills` is false for questions (admin `/route`) that route nothing.
    pub fn new(snapshot: &Snapshot, key: u64, count_spills: bool) -> Plan {
        let config = &snapshot.config;
        let attempts = config.connect.attempts as usize;
        let bounded = config
            .placement
            .bounded_load
            .map(|c| (c, snapshot.total_active(), snapshot.total_weight));
        let mut targets = Vec::with_capacity(attempts);
        let mut skipped_down = false;
        for backend in snapshot.candidates(key) {
            if !backend.live.is_up() {
                if count_spills {
                    backend.live.count_spill();
                }
                skipped_down = true;
                continue;
            }
            if let Some((c, total, weight)) = bounded
                && backend.live.active() >= bounded::cap(c, total, backend.weight, weight)
            {
                if count_spills {
                    backend.live.count_spill();
                }
                continue;
            }
            targets.push(Arc::clone(backend));
            if targets.len() == attempts {
                break;
            }
        }
        if targets.is_empty() {
            let all_down = config
                .health
                .as_ref()
                .map(|h| h.when_all_down)
                .unwrap_or(AllDown::TryAnyway);
            // Everyone was down (or full, which a factor >= 1 only allows in
            // a pool larger than MAX_CANDIDATES): fail open, primary first,
            // unless told to refuse.
            if !(skipped_down && all_down == AllDown::Refuse) {
                targets.extend(snapshot.candidates(key).take(attempts).cloned());
                return Plan {
                    targets,
                    bounded: None,
                };
            }
        }
        debug_assert!(targets.len() <= MAX_CANDIDATES);
        Plan { targets, bounded }
    }
}

/// Connects to the first target that takes the connection, with the connect
/// timeout per attempt. A target that filled up since the plan was made is
/// skipped without a connect.
async fn connect_first(
    plan: &Plan,
    config: &Config,
) -> Option<(Arc<Backend>, TcpStream, ActiveGuard)> {
    for backend in &plan.targets {
        let guard = match plan.bounded {
            Some((c, total, weight)) => {
                match backend
                    .live
                    .try_reserve(bounded::cap(c, total, backend.weight, weight))
                {
                    Some(g) => g,
                    None => {
                        backend.live.count_spill();
                        continue;
                    }
                }
            }
            None => backend.live.reserve(),
        };
        match crate::net::connect(backend.addr, config.connect.timeout).await {
            Ok(stream) => {
                backend.live.count_connection();
                return Some((Arc::clone(backend), stream, guard));
            }
            Err(e) => {
                let why = ConnectFailure::of(&e);
                let consecutive = backend.live.count_connect_failure(why);
                warn!(backend = %backend.name, addr = %backend.addr, error = %e, "connect failed; trying the next candidate");
                if let Some(health) = &config.health
                    && health.passive_failures > 0
                    && consecutive >= health.passive_failures
                    && backend.live.set_up(false)
                {
                    warn!(backend = %backend.name, failures = consecutive, "marked down after consecutive connect failures");
                }
            }
        }
    }
    None
}

#[allow(clippy::too_many_arguments)]
async fn copy_both_ways(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    up_buf: &mut [u8],
    prefilled: usize,
    check_signature: bool,
    backend: &Backend,
    idle: Duration,
    stop: &CancellationToken,
) -> End {
    let started = Instant::now();
    let last_activity = AtomicU64::new(0);
    let touch = || last_activity.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
    let mut down_buf = vec![0u8; COPY_BUFFER];

    let (mut client_r, mut client_w) = client.split();
    let (mut up_r, mut up_w) = upstream.split();
    let live = &backend.live;
    let up = pipe(
        &mut client_r,
        &mut up_w,
        up_buf,
        prefilled,
        check_signature,
        |n| {
            live.add_bytes_sent(n);
            touch();
        },
    );
    let down = pipe(&mut up_r, &mut client_w, &mut down_buf, 0, false, |n| {
        live.add_bytes_received(n);
        touch();
    });
    let idle_watch = async {
        loop {
            let last = started + Duration::from_millis(last_activity.load(Ordering::Relaxed));
            if Instant::now() >= last + idle {
                return;
            }
            tokio::time::sleep_until(last + idle).await;
        }
    };
    tokio::select! {
        result = async { tokio::try_join!(up, down) } => match result {
            Ok(_) => End::Done,
            Err(PipeError::Refused) => End::Refused,
            Err(PipeError::Io(e)) => End::Error(e),
        },
        _ = idle_watch => End::Idle,
        _ = stop.cancelled() => End::Stopped,
        _ = live.closing().cancelled() => End::Drained,
    }
}

#[derive(Debug)]
enum PipeError {
    Refused,
    Io(io::Error),
}

impl From<io::Error> for PipeError {
    fn from(e: io::Error) -> Self {
        PipeError::Io(e)
    }
}

/// Copies `from` into `to` until EOF, then shuts down `to`'s write half.
/// `buf[..filled]` is sent first (bytes read earlier, to replay). With
/// `check_signature`, the stream must not begin with a PROXY signature.
async fn pipe<R, W>(
    from: &mut R,
    to: &mut W,
    buf: &mut [u8],
    mut filled: usize,
    mut check_signature: bool,
    mut on_bytes: impl FnMut(u64),
) -> Result<(), PipeError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        while check_signature {
            match proxy_protocol::signature(&buf[..filled]) {
                Signature::Yes => return Err(PipeError::Refused),
                Signature::No => check_signature = false,
                Signature::Maybe => match from.read(&mut buf[filled..]).await? {
                    0 => check_signature = false,
                    n => filled += n,
                },
            }
        }
        if filled > 0 {
            to.write_all(&buf[..filled]).await?;
            on_bytes(filled as u64);
        }
        filled = from.read(buf).await?;
        if filled == 0 {
            to.shutdown().await?;
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pipe_replays_then_copies_then_shuts_down() {
        let (mut a, mut a_peer) = tokio::io::duplex(64);
        let (mut b_peer, mut b) = tokio::io::duplex(64);
        let mut buf = vec![0u8; 16];
        buf[..3].copy_from_slice(b"pre");
        a_peer.write_all(b"-rest").await.unwrap();
        drop(a_peer);
        let mut total = 0;
        pipe(&mut a, &mut b_peer, &mut buf, 3, true, |n| total += n)
            .await
            .unwrap();
        let mut out = Vec::new();
        b.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, b"pre-rest");
        assert_eq!(total, 8);
    }

    #[tokio::test]
    async fn pipe_refuses_a_proxy_signature_split_across_reads() {
        let (mut a, mut a_peer) = tokio::io::duplex(64);
        let (mut b_peer, _b) = tokio::io::duplex(64);
        let mut buf = vec![0u8; 64];
        a_peer.write_all(b"PRO").await.unwrap();
        let writer = tokio::spawn(async move {
            tokio::task::yield_now().await;
            a_peer
                .write_all(b"XY TCP4 1.2.3.4 5.6.7.8 1 2\r\n")
                .await
                .unwrap();
            a_peer
        });
        let got = pipe(&mut a, &mut b_peer, &mut buf, 0, true, |_| {}).await;
        assert!(matches!(got, Err(PipeError::Refused)), "{got:?}");
        drop(writer.await.unwrap());
    }
}
