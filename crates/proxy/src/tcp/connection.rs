//! One client connection, from accept to close, in named phases:
//!
//! `intake (PROXY header) ─▶ signature check ─▶ key ─▶ the routing
//! decision's plan ([`crate::routing::decision`]) ─▶ connect to the first
//! target that takes it ─▶ commit ─▶ (PROXY v2 out) ─▶ copy both ways,
//! replaying the bytes read ahead ─▶ account for the end`.
//!
//! The snapshot is loaded once per connection; what the connection needs
//! (its route, its settings) is taken out of it before the first connect, so
//! an old table is not kept alive by long connections.

use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::connection_log::ConnectionLog;
use super::copy::{End, Transfer, copy_both_ways};
use super::header_key::{HeaderKey, Want, read_header_key};
use super::sni_key::{HelloWant, read_sni_key};
use crate::config::{Config, KeyConfig};
use crate::intake::listener::Accepted;
use crate::intake::proxy_protocol::{self, Addresses, Intake, Signature};
use crate::intake::read_ahead::ReadAhead;
use crate::net::{Client, Peer, reset_on_close};
use crate::routing::backend::{ActiveGuard, Backend, Side, Spill};
use crate::routing::decision::{self, Plan, Request, Taken};
use crate::routing::health::passive::{self, Blame};
use crate::routing::instance::Instance;
use crate::routing::keys::SessionKey;
use crate::routing::queue::Refusal;
use crate::telemetry::stats::{ClientFailure, Stats};
use magpie_core::key;

/// Serves one accepted connection until it ends. Never panics on anything a
/// peer sends; every failure is logged and counted.
pub(crate) async fn serve(accepted: Accepted) {
    let Accepted {
        stream,
        peer,
        local,
        instance,
        stop,
        slot: _slot,
        ..
    } = accepted;
    let stats = &instance.stats;
    let snapshot = instance.snapshot.load_full();
    let config = Arc::clone(&snapshot.config);
    let addresses = Addresses { peer, local };
    let Some(mut intake) =
        proxy_protocol::intake(stream, addresses, &config.proxy_protocol, stats).await
    else {
        return;
    };
    let Some(check_signature) = signature_check(&mut intake, stats).await else {
        return;
    };
    let (key, fallback) = key(&config, &mut intake, stats).await;
    let mut log = ConnectionLog::start(&instance, intake.client, intake.local, key);
    // In a block of its own, and its connects boxed: neither the plan nor
    // the connects' state is carried through the copy, so an open
    // connection's task stays small (1,280 bytes against 1,384 before the
    // plan, in a debug build).
    let (backend, mut upstream, _active, how) = {
        let request = Request::connection(SessionKey::new(key), fallback, &config);
        let mut plan = decision::plan_now(&instance, &snapshot, request);
        drop(snapshot);
        let connecting = Box::pin(connect_first(&mut plan, &config, &instance, &mut intake));
        match connecting.await {
            Ok((backend, upstream, active)) => {
                let how = plan.commit(&instance, &backend).how;
                (backend, upstream, active, how)
            }
            Err(failure) => {
                if failure == ClientFailure::NoBackend {
                    warn!(client = %intake.client, tried = plan.targets().len(), "no backend took the connection; closing client");
                }
                stats.count_client_failure(failure);
                log.failed(&instance, failure.as_str());
                return;
            }
        }
    };
    log.connected(&backend, how.as_str());
    debug!(client = %intake.client, backend = %backend.name, how = how.as_str(), "connected");
    let connected = Instant::now();
    if config.proxy_protocol.send_v2 && !send_proxy_header(&intake, &backend, &mut upstream).await {
        log.failed(&instance, "proxy_header_failed");
        return;
    }
    let transfer = Transfer {
        backend: &backend,
        idle_timeout: config.idle_timeout,
        stop: &stop,
        check_signature,
        copy: config.copy,
    };
    let copied = copy_both_ways(&mut intake.stream, &mut upstream, transfer).await;
    log.copied(&instance, &copied);
    let ended = Ended {
        backend: &backend,
        downstream: intake.stream.stream(),
        upstream: &upstream,
        client: intake.client,
    };
    ended.account(copied.end, connected, stats);
}

/// Sends the PROXY v2 header naming the client; `false` when it failed.
async fn send_proxy_header(intake: &Intake, backend: &Backend, upstream: &mut TcpStream) -> bool {
    let header = proxy_protocol::v2_header(intake.client.0, intake.local.0);
    match upstream.write_all(&header).await {
        Ok(()) => true,
        Err(e) => {
            warn!(backend = %backend.name, error = %e, "cannot send PROXY header to backend");
            false
        }
    }
}

/// Whether the copy must still watch an untrusted peer's first bytes for a
/// PROXY signature (PROXY input on, peer not trusted, and it said too little
/// within [`proxy_protocol::SIGNATURE_WAIT`]). `None`: it sent one, and is
/// refused before any backend is touched.
async fn signature_check(intake: &mut Intake, stats: &Stats) -> Option<bool> {
    if !intake.untrusted {
        return Some(false);
    }
    match proxy_protocol::first_signature(&mut intake.stream).await {
        Signature::Yes => {
            // An untrusted peer sent no header of its own: it is the client.
            refuse_untrusted_header(stats, Peer(intake.client.0));
            None
        }
        Signature::No => Some(false),
        Signature::Maybe => Some(true),
    }
}

fn refuse_untrusted_header(stats: &Stats, peer: Peer) {
    proxy_protocol::refuse(stats, peer, &"PROXY header from an untrusted peer");
}

/// The connection's key: its address, or a header or TLS server name read
/// from its first bytes (they stay read ahead, to be replayed), and whether
/// it is the fallback.
async fn key(config: &Config, intake: &mut Intake, stats: &Stats) -> (u64, bool) {
    let client = intake.client;
    // Validation allows body and conversation keys in mode http only.
    let (found, read) = match &config.key {
        KeyConfig::Header { name, read, .. } => {
            let want = Want {
                header: name,
                limit: read.max_bytes,
                deadline: read.read_timeout,
            };
            let found = match read_header_key(&mut intake.stream, want).await {
                HeaderKey::Found(k) => Ok(k),
                HeaderKey::Fallback(reason) => Err(reason),
            };
            (found, read)
        }
        KeyConfig::Sni { read } => {
            let want = HelloWant {
                limit: read.max_bytes,
                deadline: read.read_timeout,
            };
            (read_sni_key(&mut intake.stream, want).await, read)
        }
        _ => return (config.key.address_key(client.0), false),
    };
    match found {
        Ok(k) => (k, false),
        Err(reason) => {
            let from = config.key.sources().from;
            debug!(%client, from, reason = reason.as_str(), "key not found, using fallback key");
            stats.count_fallback(reason);
            (key::fallback_key(read.fallback, client.0), true)
        }
    }
}

/// Connects to the next target of `plan` that takes the connection, with
/// the connect timeout per attempt: the backend, its socket and the slot
/// the connection holds there. A target that refuses the connection is
/// passed over; when magpie itself is out of resources, the others are not
/// tried.
async fn connect_first(
    plan: &mut Plan,
    config: &Config,
    instance: &Arc<Instance>,
    intake: &mut Intake,
) -> Result<(Arc<Backend>, TcpStream, ActiveGuard), ClientFailure> {
    loop {
        let taken = match &config.queue {
            None => plan.take_now().map_or(Taken::None, Taken::Slot),
            Some(_) => {
                let held = intake.stream.bytes().len() as u64;
                let gone = client_gone(&mut intake.stream);
                // Boxed: a connection that never waits does not carry the
                // wait's state in its task.
                Box::pin(plan.take(instance, config, held, gone)).await
            }
        };
        let slot = match taken {
            Taken::Slot(slot) => slot,
            Taken::None => return Err(ClientFailure::NoBackend),
            Taken::Refused(Refusal::TimedOut) => return Err(ClientFailure::QueueTimeout),
            Taken::Refused(_) => return Err(ClientFailure::QueueFull),
        };
        let backend = slot.backend;
        let started = Instant::now();
        match crate::net::connect(backend.addr, config.connect.timeout).await {
            Ok(upstream) => {
                backend.live.traffic.connect_time.observe(started.elapsed());
                backend.live.traffic.count_connection();
                passive::succeeded(&*backend);
                return Ok((backend, upstream, slot.active));
            }
            Err(e) => {
                let health = config.health.as_ref();
                let stats = &instance.stats;
                if passive::connect_failed(&*backend, &e, health, stats) == Blame::Local {
                    return Err(ClientFailure::LocalResources);
                }
                plan.passed_over(Spill::Down);
            }
        }
    }
}

/// The most a connection waiting in the queue reads ahead of its client
/// (to see it leave); the rest waits in the socket.
const QUEUED_READ_AHEAD: usize = 16 << 10;

/// Resolves when the client closes (or breaks) its side while its
/// connection waits in the queue; what it sends meanwhile is kept, up to
/// [`QUEUED_READ_AHEAD`], for the backend, and past that left in the
/// socket, whose own state then tells that the client left.
async fn client_gone(stream: &mut ReadAhead) {
    loop {
        if stream.bytes().len() >= QUEUED_READ_AHEAD {
            return crate::net::peer_closed(stream.stream()).await;
        }
        if matches!(stream.read_more(QUEUED_READ_AHEAD).await, Ok(0) | Err(_)) {
            return;
        }
    }
}

/// A copied connection at its end.
struct Ended<'a> {
    backend: &'a Backend,
    /// The client's socket and the backend's.
    downstream: &'a TcpStream,
    upstream: &'a TcpStream,
    client: Client,
}

impl Ended<'_> {
    /// Counts how the copy ended and passes an abort on: a reset on one side
    /// (or the grace running out) reaches the other side as a reset too.
    fn account(&self, end: End, connected: Instant, stats: &Stats) {
        let backend = self.backend;
        let traffic = &backend.live.traffic;
        traffic.connection_duration.observe(connected.elapsed());
        match end {
            // Only an untrusted peer is watched: it is the client.
            End::Refused => refuse_untrusted_header(stats, Peer(self.client.0)),
            End::Idle => {
                traffic.count_idle_close();
                debug!(client = %self.client, backend = %backend.name, "idle_timeout passed; connection closed")
            }
            End::Aborted(side, e) => {
                let other = match side {
                    Side::Client => self.upstream,
                    Side::Backend => self.downstream,
                };
                reset_on_close(other);
                traffic.count_reset(side);
                debug!(client = %self.client, backend = %backend.name, aborted_by = side.as_str(), error = %e, "connection aborted; passing the reset on")
            }
            End::Stopped => {
                // The shutdown grace is over: cut, and say so to both sides.
                reset_on_close(self.downstream);
                reset_on_close(self.upstream);
                debug!(client = %self.client, backend = %backend.name, "shutdown grace over; connection reset")
            }
            other => {
                debug!(client = %self.client, backend = %backend.name, end = ?other, "connection closed")
            }
        }
    }
}
