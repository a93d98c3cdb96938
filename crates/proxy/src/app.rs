//! Start and run a whole magpie: the first snapshot, every listener, the
//! admin endpoint, health checks, engine load scrapes, the access log's
//! writer, reloads, and the drain at shutdown.
//!
//! `Config ──build──▶ Snapshot ──▶ Instance` happens here once; then each piece
//! gets the `Instance` it needs and the shutdown token, and runs as its own task.
//! Binding happens before [`start`] returns, so a port that is taken is an
//! error here, not a log line later.
//!
//! Each bound socket is announced with one log line in a fixed, machine-readable
//! form, `listening role=proxy addr=IP:PORT` (and `role=admin`), so scripts and
//! tests that start magpie on port 0 learn where it listens.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, UdpSocket};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{Config, Mode};
use crate::http::HttpPath;
use crate::intake::listener::{self, Drained};
use crate::net::activation::Inherited;
use crate::net::{adopt, adopt_datagram, bind, bind_datagram};
use crate::ops::upgrade::{self, Handover, Sockets, UpgradeError};
use crate::routing::discovery::{Discovery, DiscoveryError};
use crate::routing::instance::Instance;
use crate::routing::snapshot::{Snapshot, SnapshotError};
use crate::telemetry::supervise::{self, Task};
use std::os::fd::{AsFd, OwnedFd};

/// How long the exit waits for the access log's last lines.
const ACCESS_LOG_FLUSH: std::time::Duration = std::time::Duration::from_secs(5);

/// File descriptors kept aside for listeners, admin, health checks and logs.
const FD_MARGIN: u64 = 64;

/// Raises the soft RLIMIT_NOFILE as far as the hard limit allows, and warns
/// if it still cannot hold `max_connections` (two descriptors each).
pub(crate) fn check_fd_limit(max_connections: usize) {
    // Two per connection, and the pipes splice may hold (in use and pooled).
    let pipes = 2 * (crate::tcp::pipe::MAX_IN_USE + crate::tcp::pipe::POOL_MAX) as u64;
    let needed = 2 * max_connections as u64 + pipes + FD_MARGIN;
    let soft = match rlimit::increase_nofile_limit(needed.max(1 << 16)) {
        Ok(soft) => soft,
        Err(e) => {
            warn!(error = %e, "cannot read or raise the open-file limit");
            return;
        }
    };
    if needed > soft {
        warn!(
            limit = soft,
            needed,
            "open-file limit is below 2 x max_connections + {pipes} (splice pipes) + {FD_MARGIN}: accepts will fail before max_connections is reached (raise `ulimit -n`)"
        );
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// `place` is `file:line:column` of the address in the config.
    #[error("{place}: cannot listen on {addr}: {}", bind_problem(error))]
    Bind {
        addr: SocketAddr,
        place: String,
        error: io::Error,
    },
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error("table build was interrupted")]
    BuildAborted,
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    #[error("cannot hand the admin listener to its thread: {0}")]
    AdminListener(io::Error),
    /// The error names the file.
    #[error("cannot open the access log {0}")]
    AccessLog(io::Error),
    #[error("cannot set up TLS: {0}")]
    Tls(rustls::Error),
    #[error(
        "LISTEN_FDS passed sockets on {0:?} that no listen or admin address of the config names"
    )]
    Unclaimed(Vec<SocketAddr>),
    #[error("the socket inherited for {addr} cannot be used: {error}")]
    Adopt { addr: SocketAddr, error: io::Error },
    #[error("binary upgrade: {0}")]
    Upgrade(#[from] UpgradeError),
}

fn bind_error(config: &Config, addr: SocketAddr, error: io::Error) -> StartError {
    StartError::Bind {
        addr,
        place: config.place_of(addr),
        error,
    }
}

/// Why a bind failed, in words an operator can act on.
fn bind_problem(error: &io::Error) -> String {
    match error.kind() {
        io::ErrorKind::AddrInUse => {
            "the address is already in use (another process listens on it)".to_string()
        }
        io::ErrorKind::AddrNotAvailable => {
            "no interface of this machine has that address".to_string()
        }
        io::ErrorKind::PermissionDenied => {
            "permission denied (ports below 1024 need root or CAP_NET_BIND_SERVICE)".to_string()
        }
        _ => error.to_string(),
    }
}

/// A started magpie: where it listens, its shared state, and its task.
pub struct Running {
    pub listen: Vec<SocketAddr>,
    /// Where the admin endpoint listens, if it is on.
    pub admin: Option<SocketAddr>,
    /// Its state, which the tests reach through `testing::Probe`.
    #[cfg(feature = "testing")]
    pub(crate) instance: Arc<Instance>,
    task: tokio::task::JoinHandle<Drained>,
}

impl Running {
    /// Resolves when magpie has shut down and every connection is closed,
    /// with how many had to be cut when the grace period ended.
    pub async fn wait(self) -> Drained {
        match self.task.await {
            Ok(drained) => drained,
            Err(e) => {
                tracing::error!(error = %e, "the server task failed");
                Drained {
                    cut: 0,
                    failed: true,
                }
            }
        }
    }
}

/// Builds the first snapshot, binds every listener and the admin endpoint, and
/// serves until `shutdown` fires, with health checks, and with reloads of
/// `config.source` when that is a file. Binding happens before this returns,
/// so a port that is taken is an error here, not a log line later.
pub async fn start(config: Config, shutdown: CancellationToken) -> Result<Running, StartError> {
    start_with(config, shutdown, Inherited::none()).await
}

/// [`start`], each listener taking the socket `inherited` holds for its
/// address (systemd's socket activation) instead of binding its own.
pub async fn start_with(
    config: Config,
    shutdown: CancellationToken,
    mut inherited: Inherited,
) -> Result<Running, StartError> {
    let discovery = Arc::new(Discovery::default());
    let (config, snapshot) = first_snapshot(config, &discovery).await?;
    let usr2 = upgrade::Signal::handle();
    // Started by a binary upgrade: the old process's pins, before anything
    // is served.
    let mut handover = Handover::connect_from_env().await?;
    let pins = match &mut handover {
        Some(h) => h.pins().await?,
        None => Vec::new(),
    };
    let mut bound = Bound::bind(&config, &mut inherited)?;
    // The admin thread's descriptors are taken before anyone hears of the
    // listeners, so clients cannot take them first.
    // The admin listener leaves this runtime's reactor: only the admin
    // thread's watches it.
    let admin_listener = match bound.admin_listener.take() {
        Some(l) => Some(l.into_std().map_err(StartError::AdminListener)?),
        None => None,
    };
    let prepared = admin_listener.as_ref().map(|l| {
        crate::ops::admin::Prepared::new(l)
            .inspect_err(|e| tracing::warn!(error = %e, "cannot prepare the admin thread"))
            .ok()
    });
    bound.announce(&config, &snapshot);
    let instance = Arc::new(Instance::with_discovery(snapshot, discovery));
    upgrade::import_pins(&instance, &pins);
    // The admin endpoint outlives the listeners: during a drain, operators
    // watch the active connections go down. It stops when the drain is done.
    let drained = CancellationToken::new();
    if let Some(listener) = admin_listener {
        spawn_admin(listener, prepared.flatten(), &instance, &drained);
    }
    let tls = crate::http::tls::acceptors(&instance).map_err(StartError::Tls)?;
    spawn_background(&config, &instance, &shutdown);
    let sockets = Sockets(std::mem::take(&mut bound.sockets));
    let stops = upgrade::Stops {
        shutdown: shutdown.clone(),
        admin: drained.clone(),
    };
    upgrade::spawn(Arc::clone(&instance), sockets, usr2, stops);
    let sockets = Listening {
        streams: bound.listeners,
        datagrams: bound.datagrams,
        tls,
    };
    let serving = serve(config.mode, sockets, Arc::clone(&instance), shutdown);
    let logged = Arc::clone(&instance);
    let task = tokio::spawn(async move {
        let ended = serving.await;
        flush_access_log(&logged).await;
        drained.cancel();
        ended
    });
    if let Some(handover) = handover {
        // The old process stops accepting once this one serves.
        handover.ready().await?;
    }
    Ok(Running {
        listen: bound.listen,
        admin: bound.admin,
        #[cfg(feature = "testing")]
        instance,
        task,
    })
}

/// The config with its DNS names expanded and its first snapshot, once the
/// open-file limit is checked and the access log found writable (as nginx
/// does: at start, not by a counter of failed writes later).
async fn first_snapshot(
    config: Config,
    discovery: &Discovery,
) -> Result<(Arc<Config>, Snapshot), StartError> {
    let config = Arc::new(discovery.expand(config).await?);
    let build = Arc::clone(&config);
    let snapshot =
        tokio::task::spawn_blocking(move || Snapshot::build(build, 1, &Default::default()))
            .await
            .map_err(|_| StartError::BuildAborted)??;
    check_fd_limit(config.max_connections);
    if let Some(log) = &config.access_log {
        crate::telemetry::access_log::writer::can_open(&log.target)
            .map_err(StartError::AccessLog)?;
    }
    Ok((config, snapshot))
}

/// The admin endpoint on its thread, until `drained`.
fn spawn_admin(
    listener: std::net::TcpListener,
    prepared: Option<crate::ops::admin::Prepared>,
    instance: &Arc<Instance>,
    drained: &CancellationToken,
) {
    let listener = Arc::new(listener);
    let (instance, drained) = (Arc::clone(instance), drained.clone());
    // The first run takes what was prepared; a restart prepares anew.
    let mut prepared = prepared;
    supervise::spawn(Task::Admin, move || {
        crate::ops::admin::serve(
            Arc::clone(&listener),
            prepared.take(),
            Arc::clone(&instance),
            drained.clone(),
        )
    });
}

/// The tasks beside the data path: health checks, engine load, the fleet's
/// work (queue and shared store), the access log's writer, and reloads when
/// there is a file (or DNS) to reload from.
fn spawn_background(config: &Config, instance: &Arc<Instance>, shutdown: &CancellationToken) {
    {
        let (instance, shutdown) = (Arc::clone(instance), shutdown.clone());
        supervise::spawn(Task::Health, move || {
            crate::routing::health::run(Arc::clone(&instance), shutdown.clone())
        });
    }
    {
        let (instance, shutdown) = (Arc::clone(instance), shutdown.clone());
        supervise::spawn(Task::EngineLoad, move || {
            crate::routing::health::engine_scrape::run(Arc::clone(&instance), shutdown.clone())
        });
    }
    {
        let (instance, shutdown) = (Arc::clone(instance), shutdown.clone());
        supervise::spawn(Task::Fleet, move || {
            crate::routing::sessions::fleet::run(Arc::clone(&instance), shutdown.clone())
        });
    }
    let writer = instance.access_log.writer();
    supervise::spawn(Task::AccessLog, move || writer.clone().run());
    if config.source.is_file() || config.discovery.is_some() {
        crate::ops::reload::spawn(
            config.source.clone(),
            Arc::clone(instance),
            shutdown.clone(),
        );
    }
}

/// Every connection is closed, so their lines are all queued: waits for
/// them to be written, but not for long when the log cannot be written (a
/// stuck disk or pipe).
async fn flush_access_log(instance: &Instance) {
    let flushed = instance.access_log.flush();
    if tokio::time::timeout(ACCESS_LOG_FLUSH, flushed)
        .await
        .is_err()
    {
        warn!("the access log's last lines were not written within {ACCESS_LOG_FLUSH:?}");
    }
}

/// The sockets magpie listens on, bound before anything is served.
struct Bound {
    listeners: Vec<TcpListener>,
    /// Mode udp: the datagram sockets, in place of listeners.
    datagrams: Vec<UdpSocket>,
    /// Where each listener listens (a port 0 in the config is resolved).
    listen: Vec<SocketAddr>,
    admin_listener: Option<TcpListener>,
    admin: Option<SocketAddr>,
    /// Copies of every listening socket, for a binary upgrade.
    sockets: Vec<OwnedFd>,
}

impl Bound {
    fn bind(config: &Config, inherited: &mut Inherited) -> Result<Bound, StartError> {
        let mut listeners = Vec::new();
        let mut datagrams = Vec::new();
        let mut listen = Vec::new();
        for &addr in &config.listen {
            if config.mode == Mode::Udp {
                let socket = Bound::datagram(config, addr, inherited)?;
                listen.push(socket.local_addr().unwrap_or(addr));
                datagrams.push(socket);
                continue;
            }
            let listener = Bound::stream(config, addr, inherited)?;
            listen.push(listener.local_addr().unwrap_or(addr));
            listeners.push(listener);
        }
        let admin_listener = (config.admin)
            .map(|addr| Bound::stream(config, addr, inherited))
            .transpose()?;
        let admin = admin_listener.as_ref().and_then(|l| l.local_addr().ok());
        if !inherited.is_empty() {
            return Err(StartError::Unclaimed(inherited.left()));
        }
        let streams = listeners.iter().chain(&admin_listener).map(|l| l.as_fd());
        let sockets = streams
            .chain(datagrams.iter().map(|d| d.as_fd()))
            .filter_map(|fd| {
                let copy = fd.try_clone_to_owned();
                copy.inspect_err(
                    |e| warn!(error = %e, "cannot keep a copy of a listener for upgrades"),
                )
                .ok()
            })
            .collect();
        Ok(Bound {
            listeners,
            datagrams,
            listen,
            admin_listener,
            admin,
            sockets,
        })
    }

    /// The listener inherited for `addr`, or one bound there.
    fn stream(
        config: &Config,
        addr: SocketAddr,
        inherited: &mut Inherited,
    ) -> Result<TcpListener, StartError> {
        match inherited.take(addr) {
            Some(socket) => adopt(socket).map_err(|error| StartError::Adopt { addr, error }),
            None => bind(addr).map_err(|error| bind_error(config, addr, error)),
        }
    }

    /// Mode udp: the socket inherited for `addr`, or one bound there.
    fn datagram(
        config: &Config,
        addr: SocketAddr,
        inherited: &mut Inherited,
    ) -> Result<UdpSocket, StartError> {
        match inherited.take_datagram(addr) {
            Some(socket) => {
                adopt_datagram(socket).map_err(|error| StartError::Adopt { addr, error })
            }
            None => bind_datagram(addr).map_err(|error| bind_error(config, addr, error)),
        }
    }

    /// One line for the start, and one `listening role=... addr=...` line
    /// per socket, in the fixed form scripts and tests read.
    fn announce(&self, config: &Config, snapshot: &Snapshot) {
        info!(
            config = %config.source.display(),
            listen = ?self.listen,
            admin = ?self.admin,
            backends = snapshot.every_backend().count(),
            algorithm = ?snapshot.table.algorithm(),
            fingerprint = %snapshot.fingerprint,
            key = ?config.key,
            "magpie started"
        );
        for addr in &self.listen {
            info!(role = %"proxy", %addr, "listening");
        }
        if let Some(addr) = self.admin {
            info!(role = %"admin", %addr, "listening");
        }
    }
}

/// What the data path serves: listeners (mode tcp and http) or datagram
/// sockets (mode udp), and each listener's TLS.
struct Listening {
    streams: Vec<TcpListener>,
    datagrams: Vec<UdpSocket>,
    tls: Vec<Option<tokio_rustls::TlsAcceptor>>,
}

/// Serves `sockets` with the data path of `mode` until `shutdown`, then
/// drains.
async fn serve(
    mode: Mode,
    sockets: Listening,
    instance: Arc<Instance>,
    shutdown: CancellationToken,
) -> Drained {
    let listeners = sockets.streams;
    match mode {
        Mode::Udp => crate::udp::serve(sockets.datagrams, instance, shutdown).await,
        Mode::Tcp => {
            listener::serve(listeners, instance, shutdown, crate::tcp::serve_connection).await
        }
        Mode::Http => {
            let path = HttpPath {
                tls: sockets.tls.into(),
                ..HttpPath::default()
            };
            listener::serve(listeners, instance, shutdown, move |a| {
                path.clone().serve_connection(a)
            })
            .await
        }
    }
}
