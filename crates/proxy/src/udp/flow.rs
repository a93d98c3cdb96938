//! One flow: its own connected socket towards its backend, and the task
//! that relays the backend's answers to the client from the address the
//! client sent to, until the flow idles out, reaches `udp.responses`, or
//! is stopped (its backend went down, or magpie shuts down).
//!
//! Nothing is queued: a datagram that finds a socket's send buffer full is
//! dropped and counted, as the network would drop it. An idle flow holds a
//! socket, a task and this struct, no buffer: answers are read into one
//! batch per thread ([`super::batch`]).

use std::io::{self, ErrorKind};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use socket2::{SockAddr, SockRef};
use tokio::net::UdpSocket;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::batch::{MAX_DATAGRAM, SocketDrops, with_batch};
use crate::routing::backend::{ActiveGuard, Backend};
use crate::routing::health::passive;
use crate::routing::instance::Instance;
use crate::routing::route::How;
use crate::telemetry::access_log::{Entry, Status};
use crate::telemetry::datagrams::{DatagramDrop, FlowEnd};

/// During a drain, how long a flow waits for an answer already on its way.
pub(crate) const DRAIN_IDLE: Duration = Duration::from_secs(1);

/// What a flow's relay needs beside the flow: the instance, the drain's
/// signal, and how it leaves the flow table.
#[derive(Debug)]
pub(crate) struct Relay<L> {
    pub(crate) instance: Arc<Instance>,
    pub(crate) draining: CancellationToken,
    pub(crate) leave: L,
}

/// What a new flow starts with.
#[derive(Debug)]
pub(crate) struct Opened {
    pub(crate) backend: Arc<Backend>,
    pub(crate) upstream: UdpSocket,
    pub(crate) slot: ActiveGuard,
    pub(crate) client: SocketAddr,
    /// The socket the client sent to (at `local`): answers leave from it.
    pub(crate) local: SocketAddr,
    pub(crate) listener: Arc<UdpSocket>,
    pub(crate) key: u64,
    pub(crate) how: How,
}

#[derive(Debug)]
pub(crate) struct Flow {
    pub(crate) backend: Arc<Backend>,
    upstream: UdpSocket,
    listener: Arc<UdpSocket>,
    /// Where its answers go.
    pub(crate) client: SocketAddr,
    /// The listening address its client sent to, where answers leave from.
    pub(crate) local: SocketAddr,
    /// Connection IDs it carried (`key.from: quic`), for the table.
    ids: Mutex<Vec<Box<[u8]>>>,
    pub(crate) key: u64,
    pub(crate) how: How,
    started: Instant,
    /// Milliseconds from `started` to the last datagram either way.
    last: AtomicU64,
    from_client: Counted,
    to_client: Counted,
    /// Answers its upstream socket dropped, its receive buffer full.
    drops: SocketDrops,
    stop: CancellationToken,
    stopped_as: OnceLock<FlowEnd>,
    _slot: ActiveGuard,
}

#[derive(Debug, Default)]
struct Counted {
    datagrams: AtomicU64,
    bytes: AtomicU64,
}

impl Counted {
    fn add(&self, bytes: usize) {
        self.datagrams.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

impl Flow {
    pub(crate) fn new(opened: Opened) -> Flow {
        Flow {
            backend: opened.backend,
            upstream: opened.upstream,
            listener: opened.listener,
            client: opened.client,
            local: opened.local,
            ids: Mutex::new(Vec::new()),
            key: opened.key,
            how: opened.how,
            started: Instant::now(),
            last: AtomicU64::new(0),
            from_client: Counted::default(),
            to_client: Counted::default(),
            drops: SocketDrops::default(),
            stop: CancellationToken::new(),
            stopped_as: OnceLock::new(),
            _slot: opened.slot,
        }
    }

    /// Remembers connection ID `id`, unless it holds `max` already.
    pub(crate) fn add_id(&self, id: &[u8], max: usize) -> bool {
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        if ids.len() >= max {
            return false;
        }
        ids.push(id.into());
        true
    }

    /// Its connection IDs, taken (it is leaving the table).
    pub(crate) fn take_ids(&self) -> Vec<Box<[u8]>> {
        std::mem::take(&mut *self.ids.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Ends the flow as `why` (its task writes its line).
    pub(crate) fn stop(&self, why: FlowEnd) {
        let _ = self.stopped_as.set(why);
        self.stop.cancel();
    }

    /// Sends a client's datagram on to the backend; `Err` says why it was
    /// dropped.
    pub(crate) fn forward(&self, datagram: &[u8], instance: &Instance) -> Result<(), DatagramDrop> {
        self.touch();
        // A plain send(2): a new socket has no readiness in tokio's
        // reactor yet, and a datagram socket needs none.
        match SockRef::from(&self.upstream).send(datagram) {
            Ok(_) => {
                self.from_client.add(datagram.len());
                self.backend
                    .live
                    .traffic
                    .count_datagram_sent(datagram.len());
                Ok(())
            }
            Err(e) => Err(self.send_failed(&e, instance)),
        }
    }

    fn send_failed(&self, e: &io::Error, instance: &Instance) -> DatagramDrop {
        match e.kind() {
            ErrorKind::WouldBlock => DatagramDrop::BackendBusy,
            ErrorKind::ConnectionRefused => {
                self.refused(e, instance);
                DatagramDrop::BackendRefused
            }
            _ if e.raw_os_error() == Some(libc::EMSGSIZE) => DatagramDrop::Oversized,
            _ => {
                debug!(backend = %self.backend.name, error = %e, "cannot send a datagram to the backend");
                DatagramDrop::BackendBusy
            }
        }
    }

    /// The backend's host said its port is closed (ICMP): passive health.
    fn refused(&self, e: &io::Error, instance: &Instance) {
        let snapshot = instance.snapshot.load();
        let health = snapshot.config.health.as_ref();
        passive::connect_failed(&*self.backend, e, health, &instance.stats);
    }

    fn touch(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.last.fetch_max(ms, Ordering::Relaxed);
    }

    /// When it last carried a datagram either way.
    fn last_active(&self) -> Instant {
        self.started + Duration::from_millis(self.last.load(Ordering::Relaxed))
    }

    /// Relays answers until the flow ends; then it leaves the table (by
    /// `leave`), is counted and logged.
    /// Once `draining` fires (magpie shuts down and reads no more client
    /// datagrams), only answers already on their way are awaited: the flow
    /// ends after [`DRAIN_IDLE`] without one.
    pub(crate) async fn relay(self: Arc<Self>, relay: Relay<impl FnOnce(&Arc<Flow>)>) {
        let Relay {
            instance,
            draining,
            leave,
        } = relay;
        let config = Arc::clone(&instance.snapshot.load().config);
        let (mut idle, responses) = (config.idle_timeout, config.udp.responses);
        drop(config);
        let idle_out = tokio::time::sleep(idle);
        tokio::pin!(idle_out);
        let mut drained = false;
        let why = loop {
            tokio::select! {
                _ = self.stop.cancelled() => break *self.stopped_as.get().unwrap_or(&FlowEnd::Shutdown),
                _ = draining.cancelled(), if !drained => {
                    drained = true;
                    idle = idle.min(DRAIN_IDLE);
                    idle_out.as_mut().reset(self.last_active() + idle);
                }
                _ = &mut idle_out => {
                    let until = self.last_active() + idle;
                    if until <= Instant::now() {
                        break if drained { FlowEnd::Shutdown } else { FlowEnd::Idle };
                    }
                    idle_out.as_mut().reset(until);
                }
                ready = self.upstream.readable() => {
                    if let Err(e) = ready {
                        debug!(backend = %self.backend.name, error = %e, "flow socket failed");
                        break FlowEnd::Idle;
                    }
                    let more = self.relay_ready(&instance, responses);
                    if self.answered_all(responses) {
                        break FlowEnd::Responses;
                    }
                    if more {
                        // A full batch: let the other flows have a turn.
                        tokio::task::yield_now().await;
                    }
                }
            }
        };
        leave(&self);
        if why == FlowEnd::Responses {
            // Answers already waiting are past its responses: counted as
            // dropped, not lost with the socket unseen.
            while self.relay_ready(&instance, responses) {}
        }
        let dropped = self.drops.since_last(&self.upstream);
        instance
            .stats
            .datagrams
            .count_drops(DatagramDrop::ReceiveBuffer, dropped);
        instance.stats.datagrams.flow_ended(why);
        self.log(&instance, why);
    }

    /// Whether it relayed its `udp.responses` answers.
    fn answered_all(&self, responses: Option<u64>) -> bool {
        responses.is_some_and(|n| self.to_client.datagrams.load(Ordering::Relaxed) >= n)
    }

    /// Relays a batch of the answers waiting on the upstream socket, none
    /// past `responses` (those are counted as dropped, as is what the
    /// socket dropped itself, after a full read); whether more may wait.
    fn relay_ready(&self, instance: &Instance, responses: Option<u64>) -> bool {
        let stats = &instance.stats.datagrams;
        with_batch(|batch| {
            let more = match batch.read(&self.upstream) {
                Ok(()) => true,
                Err(e) if e.kind() == ErrorKind::WouldBlock => false,
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                    self.refused(&e, instance);
                    stats.count_drop(DatagramDrop::BackendRefused);
                    true
                }
                Err(e) => {
                    debug!(backend = %self.backend.name, error = %e, "cannot read the backend's answer");
                    false
                }
            };
            if more {
                // A full read: the buffer may have overflowed.
                let dropped = self.drops.since_last(&self.upstream);
                stats.count_drops(DatagramDrop::ReceiveBuffer, dropped);
            }
            if batch.is_empty() {
                return more;
            }
            self.touch();
            let to = SockAddr::from(self.client);
            let client = SockRef::from(&*self.listener);
            for (answer, _) in batch.datagrams() {
                if self.answered_all(responses) {
                    stats.count_drop(DatagramDrop::AfterResponses);
                    continue;
                }
                if answer.len() > MAX_DATAGRAM {
                    stats.count_drop(DatagramDrop::Oversized);
                    continue;
                }
                self.backend
                    .live
                    .traffic
                    .count_datagram_received(answer.len());
                match client.send_to(answer, &to) {
                    Ok(_) => self.to_client.add(answer.len()),
                    Err(_) => stats.count_drop(DatagramDrop::ReplyFailed),
                }
            }
            more
        })
    }

    /// Its access-log line, if the log samples it.
    fn log(&self, instance: &Instance, why: FlowEnd) {
        if instance.access_log.sampled().is_none() {
            return;
        }
        let entry = Entry {
            time: SystemTime::now(),
            client: self.client,
            listener: self.local,
            backend: Some((self.backend.name.clone(), self.backend.addr)),
            key_hash: self.key,
            key: None,
            routed: Some(self.how.as_str()),
            status: Status::Ended(why.as_str()),
            bytes_in: self.from_client.bytes.load(Ordering::Relaxed),
            bytes_out: self.to_client.bytes.load(Ordering::Relaxed),
            first_byte: None,
            queued: None,
            queue: None,
            split: None,
            duration: self.started.elapsed(),
            http: None,
            tokens: None,
        };
        instance.access_log.record(Box::new(entry));
    }
}
