//! Replacing magpie's binary without a blip: SIGUSR2 starts the binary at
//! the same path with the same arguments, hands it the listening sockets
//! (as systemd's socket activation does: `LISTEN_FDS`, fds from 3, matched
//! to `listen` and `admin` by address) and the session pins (groups' homes
//! among them), and once it serves, stops accepting and drains as on
//! SIGTERM. The sockets never close, so no connection attempt is refused;
//! connections in flight finish in the old process within
//! `shutdown_grace`; conversations keep their pins. If the new process
//! fails (exits, or is not serving within [`READY_TIMEOUT`]), the old one
//! keeps serving and says why. If the old one is told to stop while the new
//! one is still starting, the upgrade is abandoned: the new process is
//! killed (it holds the listening sockets and must not keep them without
//! serving), and the hand-over directory removed, whatever ends the wait.
//!
//! Why re-exec with inherited sockets (nginx's USR2) rather than a new
//! process fetching them from the old one (HAProxy's `-x`, Envoy's hot
//! restart): the new process starts exactly as under systemd's socket
//! activation, one code path for both, and nothing but the signal is
//! needed to start it.
//!
//! The two processes talk over a Unix socket in a private (0700) directory
//! the old one makes, named in `MAGPIE_HANDOVER`: the old writes one JSON
//! line per pin and `end`, the new answers `ready` once its listeners
//! serve. Under systemd (`NOTIFY_SOCKET`) the old tells it the new main
//! PID before it exits.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::routing::instance::Instance;

/// Names the hand-over socket, for the new process.
pub(crate) const HANDOVER_ENV: &str = "MAGPIE_HANDOVER";
/// How long the new process may take to connect and then to serve.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest line of the hand-over (a pin is well under 1 KiB).
const MAX_LINE: usize = 4096;
/// The most pins a hand-over carries.
const MAX_PINS: usize = 10_000_000;

/// One session pin, handed over.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct PinRecord {
    /// The key's hash.
    pub(crate) k: u64,
    /// The backend's name.
    pub(crate) b: String,
    /// Milliseconds unused.
    pub(crate) i: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error("the hand-over socket {path}: {source}")]
    Socket { path: PathBuf, source: io::Error },
    #[error("cannot start {exe}: {source}")]
    Spawn { exe: String, source: io::Error },
    #[error("the new process exited ({0}) before it served")]
    Exited(std::process::ExitStatus),
    #[error("the new process was not serving within {0:?}")]
    Timeout(Duration),
    #[error("the hand-over broke: {0}")]
    Broken(String),
    #[error("this process was told to stop before the new one served")]
    Abandoned,
}

/// The new process's side: the connection to the old one.
pub(crate) struct Handover {
    reader: BufReader<UnixStream>,
}

impl Handover {
    /// Connects to the old process when `MAGPIE_HANDOVER` names a socket.
    pub(crate) async fn connect_from_env() -> Result<Option<Handover>, UpgradeError> {
        let Some(path) = std::env::var_os(HANDOVER_ENV) else {
            return Ok(None);
        };
        let path = PathBuf::from(path);
        let stream = UnixStream::connect(&path)
            .await
            .map_err(|source| UpgradeError::Socket { path, source })?;
        Ok(Some(Handover {
            reader: BufReader::new(stream),
        }))
    }

    /// The pins the old process holds, up to its `end` line.
    pub(crate) async fn pins(&mut self) -> Result<Vec<PinRecord>, UpgradeError> {
        let mut pins = Vec::new();
        let mut line = String::new();
        loop {
            next_line(&mut self.reader, &mut line).await?;
            if line.trim_end() == "end" {
                return Ok(pins);
            }
            let pin = serde_json::from_str(&line).map_err(|e| broken(io::Error::other(e)))?;
            if pins.len() < MAX_PINS {
                pins.push(pin);
            }
        }
    }

    /// Tells the old process this one serves: it stops accepting.
    pub(crate) async fn ready(mut self) -> Result<(), UpgradeError> {
        let stream = self.reader.get_mut();
        stream.write_all(b"ready\n").await.map_err(broken)?;
        stream.flush().await.map_err(broken)
    }
}

fn broken(e: io::Error) -> UpgradeError {
    UpgradeError::Broken(e.to_string())
}

/// The next line of the hand-over into `line`: at most [`MAX_LINE`] bytes,
/// and the other side may not end before it.
async fn next_line(
    reader: &mut BufReader<UnixStream>,
    line: &mut String,
) -> Result<(), UpgradeError> {
    line.clear();
    let mut limited = reader.take(MAX_LINE as u64 + 1);
    let n = limited.read_line(line).await.map_err(broken)?;
    if n == 0 || n > MAX_LINE {
        return Err(UpgradeError::Broken("a line too long, or none".into()));
    }
    Ok(())
}

/// The old process's side: the sockets to hand over (duplicates of the
/// listeners, in the config's order).
pub(crate) struct Sockets(pub Vec<OwnedFd>);

/// SIGUSR2, handled from the moment this is made (before the listeners are
/// announced, so a signal sent as soon as they are does not kill magpie);
/// `None` when it cannot be handled.
pub(crate) struct Signal(Option<tokio::signal::unix::Signal>);

impl Signal {
    pub(crate) fn handle() -> Signal {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::user_defined2()) {
            Ok(s) => Signal(Some(s)),
            Err(e) => {
                warn!(error = %e, "cannot handle SIGUSR2: binary upgrades are off");
                Signal(None)
            }
        }
    }
}

/// What a hand-over stops: the data path (a drain, as on SIGTERM) and the
/// admin endpoint (the new process serves it).
pub(crate) struct Stops {
    pub(crate) shutdown: CancellationToken,
    pub(crate) admin: CancellationToken,
}

/// Waits for SIGUSR2 and hands over to a new process; on success stops
/// the admin endpoint (the new process serves it) and starts the drain. Ends when `shutdown` fires, closing its copies
/// of the sockets, so a stopping magpie refuses new connections.
pub(crate) fn spawn(instance: Arc<Instance>, sockets: Sockets, signal: Signal, stops: Stops) {
    let Stops {
        shutdown,
        admin: admin_stop,
    } = stops;
    let Signal(Some(mut usr2)) = signal else {
        return;
    };
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = usr2.recv() => {}
            }
            info!("SIGUSR2: starting the new binary");
            match hand_over(&instance, &sockets, &shutdown).await {
                Ok(pid) => {
                    info!(pid, "handed over to the new process; draining");
                    notify_main_pid(pid);
                    admin_stop.cancel();
                    shutdown.cancel();
                    return;
                }
                Err(UpgradeError::Abandoned) => {
                    warn!(
                        "binary upgrade abandoned: this process stops, and the new one was killed"
                    );
                    return;
                }
                Err(e) => error!("binary upgrade failed, this process keeps serving: {e}"),
            }
        }
    });
}

/// Starts the new process, gives it the pins, waits until it serves (or
/// fails, or `shutdown` abandons it).
async fn hand_over(
    instance: &Instance,
    sockets: &Sockets,
    shutdown: &CancellationToken,
) -> Result<u32, UpgradeError> {
    let dir = HandoverDir(private_dir()?);
    let path = dir.0.join("handover.sock");
    let listener = UnixListener::bind(&path).map_err(|source| UpgradeError::Socket {
        path: path.clone(),
        source,
    })?;
    let mut starting = Starting {
        child: spawn_new(sockets, &path)?,
        settled: false,
    };
    let pid = starting.child.id().unwrap_or(0);
    info!(pid, "the new process started; waiting until it serves");
    let talk = async {
        let (stream, _) = listener.accept().await.map_err(broken)?;
        send_pins(instance, stream).await
    };
    let outcome = tokio::select! {
        status = starting.child.wait() => match status {
            Ok(s) => Err(UpgradeError::Exited(s)),
            Err(e) => Err(broken(e)),
        },
        talked = tokio::time::timeout(READY_TIMEOUT, talk) => {
            talked.unwrap_or(Err(UpgradeError::Timeout(READY_TIMEOUT)))
        }
        _ = shutdown.cancelled() => Err(UpgradeError::Abandoned),
    };
    match outcome {
        // It serves: it outlives this process.
        Ok(()) => starting.settled = true,
        // A new process that is not serving must not serve later, nor keep
        // the listening sockets: killed, and waited for a moment.
        Err(_) => starting.kill().await,
    }
    outcome.map(|()| pid)
}

/// A new process that does not serve yet: killed when the hand-over ends
/// without it serving, even when the wait itself is dropped (this process
/// exits meanwhile).
struct Starting {
    child: tokio::process::Child,
    /// It serves, or was killed already: left alone from then on.
    settled: bool,
}

/// How long a killed new process is waited for.
const KILL_WAIT: Duration = Duration::from_secs(5);

impl Starting {
    /// Kills it, and waits (a moment) until it is gone.
    async fn kill(&mut self) {
        self.settled = true;
        if let Err(e) = self.child.start_kill() {
            warn!(error = %e, "cannot kill the new process");
            return;
        }
        if tokio::time::timeout(KILL_WAIT, self.child.wait())
            .await
            .is_err()
        {
            warn!("the killed new process has not exited yet");
        }
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        if !self.settled
            && let Err(e) = self.child.start_kill()
        {
            warn!(error = %e, "cannot kill the new process");
        }
    }
}

/// The hand-over's private directory, removed with everything in it when
/// the hand-over ends, however it ends.
struct HandoverDir(PathBuf);

impl Drop for HandoverDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            warn!(dir = %self.0.display(), error = %e, "cannot remove the hand-over directory");
        }
    }
}

/// Writes every pin, then `end`, then waits for `ready`.
async fn send_pins(instance: &Instance, stream: UnixStream) -> Result<(), UpgradeError> {
    let mut stream = BufReader::new(stream);
    let pins = instance
        .sessions()
        .map(|s| s.pins.export())
        .unwrap_or_default();
    let mut out = Vec::new();
    for (k, backend, idle) in &pins {
        let record = PinRecord {
            k: *k,
            b: backend.to_string(),
            i: u64::try_from(idle.as_millis()).unwrap_or(u64::MAX),
        };
        serde_json::to_writer(&mut out, &record).map_err(|e| broken(io::Error::other(e)))?;
        out.push(b'\n');
    }
    out.extend_from_slice(b"end\n");
    stream.get_mut().write_all(&out).await.map_err(broken)?;
    info!(pins = pins.len(), "session pins handed over");
    let mut line = String::new();
    next_line(&mut stream, &mut line).await?;
    if line.trim_end() == "ready" {
        Ok(())
    } else {
        Err(UpgradeError::Broken(format!(
            "expected ready, got {line:?}"
        )))
    }
}

/// The binary at this process's path, with its arguments, the sockets as
/// fds 3.., and the hand-over socket named.
fn spawn_new(sockets: &Sockets, path: &Path) -> Result<tokio::process::Child, UpgradeError> {
    use command_fds::{CommandFdExt, FdMapping};
    let mut args = std::env::args_os();
    let exe = args.next().unwrap_or_else(|| "magpie".into());
    let spawn_error = |source| UpgradeError::Spawn {
        exe: exe.to_string_lossy().into_owned(),
        source,
    };
    let mut mappings = Vec::new();
    for (i, fd) in sockets.0.iter().enumerate() {
        let parent_fd = fd.try_clone().map_err(spawn_error)?;
        mappings.push(FdMapping {
            parent_fd,
            child_fd: 3 + i as i32,
        });
    }
    let mut command = std::process::Command::new(&exe);
    command
        .args(args)
        .env("LISTEN_FDS", sockets.0.len().to_string())
        .env_remove("LISTEN_PID")
        .env_remove("LISTEN_FDNAMES")
        .env(HANDOVER_ENV, path);
    command
        .fd_mappings(mappings)
        .map_err(|e| spawn_error(io::Error::other(e.to_string())))?;
    tokio::process::Command::from(command)
        .spawn()
        .map_err(spawn_error)
}

/// A new directory only this user may enter, for the hand-over socket.
fn private_dir() -> Result<PathBuf, UpgradeError> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = std::env::temp_dir().join(format!(
        "magpie-upgrade-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|source| UpgradeError::Socket {
            path: dir.clone(),
            source,
        })?;
    Ok(dir)
}

/// Under systemd (`NOTIFY_SOCKET`), the new process becomes the service's
/// main process (the unit says `NotifyAccess=all`).
fn notify_main_pid(pid: u32) {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let message = format!("MAINPID={pid}\n");
    let sent = std::os::unix::net::UnixDatagram::unbound().and_then(|d| {
        let bytes = socket.as_encoded_bytes();
        match bytes.strip_prefix(b"@") {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                d.send_to_addr(message.as_bytes(), &addr)
            }
            None => d.send_to(message.as_bytes(), &socket),
        }
    });
    if let Err(e) = sent {
        warn!(error = %e, "cannot tell systemd the new main PID");
    }
}

/// Loads handed-over pins into this process's sessions.
pub(crate) fn import_pins(instance: &Instance, pins: &[PinRecord]) {
    let Some(sessions) = instance.sessions() else {
        return;
    };
    for pin in pins {
        sessions
            .pins
            .import(pin.k, &pin.b, Duration::from_millis(pin.i));
    }
    info!(pins = pins.len(), "session pins taken over");
}
