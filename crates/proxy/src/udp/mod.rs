//! Data path `mode: udp`: consistent hashing for datagrams.
//!
//! `datagram ─▶ flow table (client address, or QUIC connection ID) ─▶ known
//! flow: send on its socket | new flow: key ─▶ the routing decision's plan
//! ([`crate::routing::decision`]) ─▶ its own socket to the first backend
//! that takes it ─▶ commit ─▶ send`; each flow's task relays the
//! backend's answers to the client from the address the client sent to.
//!
//! A flow is what one client address sends to one listening address, keyed
//! by the client's address (`key.from: source_ip` or `source_addr`) or by
//! the destination connection ID of its first QUIC packet (`key.from:
//! quic`), so that every magpie with the same config sends it to the same
//! backend; a QUIC client that moves to another address opens a flow there
//! on the backend its connection is on ([`flows`]). Its own upstream
//! socket is what tells the backend's answers apart. A flow keeps
//! its backend for its whole life: a reload that changes the table moves
//! only new flows, and a removed backend's flows end at their idle timeout.
//! A flow whose backend health marked down ends at the client's next
//! datagram, which opens a new flow on a backend that is up.
//!
//! Bounds: at most `max_connections` flows (a new one past it is dropped
//! and counted), each ending after `idle_timeout` without a datagram either
//! way or after `udp.responses` answers; nothing is queued, so a datagram
//! that finds a socket buffer full is dropped and counted.
//!
//! | module | owns |
//! |---|---|
//! | [`batch`] | datagrams read in batches (recvmmsg), readiness given up on a short one |
//! | [`flows`] | the flow table, by address and by connection ID |
//! | [`flow`] | one flow: its socket, its answers, its end and its line |

pub(crate) mod batch;
pub(crate) mod flow;
pub(crate) mod flows;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::UdpSocket;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::config::KeyConfig;
use crate::intake::listener::Drained;
use crate::net::{connected_datagram, is_resource_exhaustion};
use crate::routing::backend::Backend;
use crate::routing::decision::{self, Request, Slot};
use crate::routing::instance::Instance;
use crate::routing::keys::SessionKey;
use crate::routing::snapshot::Snapshot;
use crate::telemetry::datagrams::{DatagramDrop, FlowEnd};
use crate::telemetry::stats::Exhausted;
use crate::telemetry::supervise::{self, Task};
use crate::telemetry::throttle::Throttle;
use batch::{Batch, MAX_DATAGRAM, SocketDrops, with_batch};
use flow::{Flow, Opened, Relay};
use flows::{Flows, Found};
use magpie_core::key::{self, FallbackReason};

/// How often a receive loop reads its socket's drop count besides after a
/// full batch ([`SocketDrops`]).
const DROPS_READ_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// One listening socket and its address.
struct Listening {
    socket: Arc<UdpSocket>,
    local: SocketAddr,
}

/// What every receive loop shares.
struct Shared {
    instance: Arc<Instance>,
    flows: Arc<Flows>,
    tracker: TaskTracker,
    /// Fires at shutdown: the flows then only await answers on their way.
    draining: CancellationToken,
}

/// Serves `sockets` until `shutdown`; then stops reading them and lets the
/// open flows relay the answers on their way (each until it has had none
/// for [`flow::DRAIN_IDLE`] or its idle timeout), for at most
/// `shutdown_grace`.
pub(crate) async fn serve(
    sockets: Vec<UdpSocket>,
    instance: Arc<Instance>,
    shutdown: CancellationToken,
) -> Drained {
    let shared = Arc::new(Shared {
        instance: Arc::clone(&instance),
        flows: Arc::new(Flows::default()),
        tracker: TaskTracker::new(),
        draining: shutdown.clone(),
    });
    let loops: Vec<_> = sockets
        .into_iter()
        .map(|socket| {
            let (socket, shared, stop) = (Arc::new(socket), Arc::clone(&shared), shutdown.clone());
            supervise::spawn(Task::Accept, move || {
                receive(Arc::clone(&socket), Arc::clone(&shared), stop.clone())
            })
        })
        .collect();
    shutdown.cancelled().await;
    instance.start_draining();
    for receive_loop in loops {
        if let Err(e) = receive_loop.await {
            warn!(error = %e, "datagram receive loop ended abnormally");
        }
    }
    let tracker = &shared.tracker;
    tracker.close();
    let grace = instance.snapshot.load().config.shutdown_grace;
    info!(open = shared.flows.len(), grace = ?grace, "shutting down: no new datagrams; open flows relay the answers on their way");
    let mut cut = 0;
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        let open = shared.flows.all();
        cut = open.len();
        for flow in open {
            flow.stop(FlowEnd::Shutdown);
        }
        tracker.wait().await;
    }
    Drained { cut, failed: false }
}

/// Reads one socket's datagrams, a batch at a time, until `stop`.
async fn receive(socket: Arc<UdpSocket>, shared: Arc<Shared>, stop: CancellationToken) {
    let to = match socket.local_addr() {
        Ok(local) => Listening {
            socket: Arc::clone(&socket),
            local,
        },
        Err(e) => {
            warn!(error = %e, "a datagram socket has no address");
            return;
        }
    };
    let drops = SocketDrops::default();
    // Drops before this process read the socket (one handed over) are not
    // its own.
    drops.since_last(&socket);
    let count_drops = || {
        let dropped = drops.since_last(&socket);
        let stats = &shared.instance.stats.datagrams;
        stats.count_drops(DatagramDrop::ReceiveBuffer, dropped);
    };
    let mut every_second = tokio::time::interval(DROPS_READ_EVERY);
    every_second.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return count_drops(),
            _ = every_second.tick() => count_drops(),
            ready = socket.readable() => if let Err(e) = ready {
                warn!(error = %e, "a datagram socket failed");
                return count_drops();
            },
        }
        loop {
            let more = with_batch(|batch| take_batch(batch, &shared, &to));
            if !more {
                break;
            }
            // A full batch: the buffer may have overflowed, and more wait,
            // after the other tasks' turn.
            count_drops();
            tokio::task::yield_now().await;
        }
    }
}

/// Reads a batch of the datagrams waiting on `to`'s socket and sends each
/// on; whether more may wait.
fn take_batch(batch: &mut Batch, shared: &Shared, to: &Listening) -> bool {
    static ERRORS: Throttle = Throttle::new(std::time::Duration::from_secs(1));
    let more = match batch.read(&to.socket) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(e) => {
            if let Some(held_back) = ERRORS.allow() {
                warn!(error = %e, held_back, "cannot receive a datagram");
            }
            false
        }
    };
    let stats = &shared.instance.stats.datagrams;
    for (datagram, client) in batch.datagrams() {
        let Some(client) = client else { continue };
        let delivered = match datagram.len() > MAX_DATAGRAM {
            true => Err(DatagramDrop::Oversized),
            false => deliver(shared, to, client, datagram),
        };
        if let Err(why) = delivered {
            stats.count_drop(why);
        }
    }
    more
}

/// Sends one client datagram on: through its flow, or a new one.
fn deliver(
    shared: &Shared,
    listener: &Listening,
    client: SocketAddr,
    datagram: &[u8],
) -> Result<(), DatagramDrop> {
    let snapshot = shared.instance.snapshot.load();
    let id = match &snapshot.config.key {
        KeyConfig::Quic { cid_length, .. } => {
            key::quic::destination_cid(datagram, *cid_length).ok()
        }
        _ => None,
    };
    let new = NewFlow {
        snapshot: &snapshot,
        listener,
        client,
        id,
        moved_from: None,
    };
    let flow = match shared.flows.lookup(listener.local, client, id) {
        Found::Flow(flow) if flow.backend.live.health.is_up() => flow,
        Found::Flow(flow) => {
            // Its backend is down: the next datagram finds one that is up.
            shared.flows.remove(&flow);
            flow.stop(FlowEnd::BackendDown);
            open(shared, new)?
        }
        Found::Moved(backend) => open(
            shared,
            NewFlow {
                moved_from: Some(backend),
                ..new
            },
        )?,
        Found::Nothing => open(shared, new)?,
    };
    flow.forward(datagram, &shared.instance)
}

/// What a new flow starts from.
struct NewFlow<'a> {
    /// The snapshot its first datagram was read under.
    snapshot: &'a Snapshot,
    /// The socket its first datagram came to.
    listener: &'a Listening,
    client: SocketAddr,
    /// `key.from: quic`: its first datagram's connection ID, if it had one.
    id: Option<&'a [u8]>,
    /// The backend of the connection it belongs to, when its client moved
    /// (a QUIC connection ID another flow carried).
    moved_from: Option<Arc<Backend>>,
}

/// A new flow for `new.client`: keyed, routed (to its connection's
/// backend first when its client moved), given its socket, entered in the
/// table and its task started.
fn open(shared: &Shared, new: NewFlow<'_>) -> Result<Arc<Flow>, DatagramDrop> {
    let NewFlow {
        snapshot,
        listener,
        client,
        id,
        moved_from,
    } = new;
    let instance = &shared.instance;
    let config = &snapshot.config;
    if shared.flows.len() >= config.max_connections {
        return Err(DatagramDrop::TableFull);
    }
    let (key, fallback) = flow_key(&config.key, client, id);
    if fallback {
        instance.stats.count_fallback(FallbackReason::NotQuic);
    }
    let request = Request::flow(SessionKey::new(key), fallback, moved_from);
    let mut plan = decision::plan_now(instance, snapshot, request);
    while let Some(Slot {
        backend,
        active: slot,
        ..
    }) = plan.take_now()
    {
        let upstream = match connected_datagram(backend.addr) {
            Ok(socket) => socket,
            Err(e) if is_resource_exhaustion(&e) => {
                instance.stats.count_exhausted(Exhausted::Connect);
                return Err(DatagramDrop::NoBackend);
            }
            Err(e) => {
                debug!(backend = %backend.name, error = %e, "cannot open a socket to the backend");
                continue;
            }
        };
        let how = plan.commit(instance, &backend).how;
        let flow = Arc::new(Flow::new(Opened {
            backend: Arc::clone(&backend),
            upstream,
            slot,
            client,
            listener: Arc::clone(&listener.socket),
            local: listener.local,
            key,
            how,
        }));
        shared.flows.insert(Arc::clone(&flow), id);
        instance.stats.datagrams.flow_created();
        backend.live.traffic.count_connection();
        let table = Arc::clone(&shared.flows);
        let relay = Relay {
            instance: Arc::clone(instance),
            draining: shared.draining.clone(),
            leave: move |f: &Arc<Flow>| table.remove(f),
        };
        shared.tracker.spawn(Arc::clone(&flow).relay(relay));
        return Ok(flow);
    }
    Err(DatagramDrop::NoBackend)
}

/// A new flow's key, and whether it is the fallback key (`key.from: quic`
/// and a first datagram without a connection ID `id`).
fn flow_key(config: &KeyConfig, client: SocketAddr, id: Option<&[u8]>) -> (u64, bool) {
    match (config, id) {
        (KeyConfig::Quic { .. }, Some(id)) => (key::quic::cid_key(id), false),
        (KeyConfig::Quic { fallback, .. }, None) => (key::fallback_key(*fallback, client), true),
        (other, _) => (other.address_key(client), false),
    }
}
