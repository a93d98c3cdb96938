//! What every integration test needs: backends on `127.0.0.1:0`, magpie
//! started in-process from a YAML string, a small HTTP client, and the built
//! binary.
//!
//! Every wait that could hang goes through [`within`], so a broken proxy makes
//! a test fail with a message instead of stalling the suite.

#![allow(dead_code)]

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use magpie::app::{self, Running};
use magpie::backend::Backend;
use magpie::config::Config;
use magpie::snapshot::Shared;

/// The safety net on every await that could hang.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Awaits `f`, failing the test with `what` if it takes longer than [`PATIENCE`].
pub async fn within<F: Future>(what: &str, f: F) -> F::Output {
    within_for(PATIENCE, what, f).await
}

/// [`within`] with an explicit limit.
pub async fn within_for<F: Future>(limit: Duration, what: &str, f: F) -> F::Output {
    match tokio::time::timeout(limit, f).await {
        Ok(out) => out,
        Err(_) => panic!("timed out after {limit:?}: {what}"),
    }
}

pub fn loopback(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

/// An address nobody listens on: bound to an ephemeral port, then released,
/// so connecting to it is refused.
pub fn dead_addr() -> SocketAddr {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port to learn a free one");
    listener
        .local_addr()
        .expect("a bound listener has an address")
}

// ---------------------------------------------------------------------------
// HTTP backends (the demo's: each answers `backend: NAME\nsession: KEY\n`).

/// A set of demo HTTP backends; they stop when this is dropped.
pub struct HttpBackends {
    pub list: Vec<(String, SocketAddr)>,
    stop: CancellationToken,
}

impl HttpBackends {
    pub async fn start(names: &[&str]) -> HttpBackends {
        Self::start_on("127.0.0.1:0".parse().expect("a literal address"), names).await
    }

    pub async fn start_on(bind: SocketAddr, names: &[&str]) -> HttpBackends {
        let stop = CancellationToken::new();
        let mut list = Vec::new();
        for name in names {
            let addr = magpie::demo::start_backend(name, bind, stop.clone())
                .await
                .unwrap_or_else(|e| panic!("cannot start HTTP backend {name} on {bind}: {e}"));
            list.push((name.to_string(), addr));
        }
        HttpBackends { list, stop }
    }
}

impl Drop for HttpBackends {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

// ---------------------------------------------------------------------------
// Raw TCP backends.

/// What a raw backend does with a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Writes `backend: NAME\n` at once, then echoes every byte back.
    GreetEcho,
    /// Reads and keeps everything, sends nothing.
    Silent,
    /// Reads until EOF, then writes `received N bytes\n` and closes.
    CountAtEof,
}

/// One connection a raw backend served, reported when the client side ended.
#[derive(Debug)]
pub struct Received {
    pub backend: String,
    pub bytes: Vec<u8>,
}

/// Raw TCP backends sharing one report channel; they stop when dropped.
pub struct RawBackends {
    pub list: Vec<(String, SocketAddr)>,
    reports: mpsc::UnboundedReceiver<Received>,
    stop: CancellationToken,
}

impl RawBackends {
    pub async fn start(names: &[&str], behaviour: Behaviour) -> RawBackends {
        let stop = CancellationToken::new();
        let (tx, reports) = mpsc::unbounded_channel();
        let mut list = Vec::new();
        for name in names {
            let listener = TcpListener::bind("127.0.0.1:0")
                .await
                .unwrap_or_else(|e| panic!("cannot start raw backend {name}: {e}"));
            let addr = listener
                .local_addr()
                .expect("a bound listener has an address");
            tokio::spawn(raw_accept_loop(
                listener,
                name.to_string(),
                behaviour,
                tx.clone(),
                stop.clone(),
            ));
            list.push((name.to_string(), addr));
        }
        RawBackends {
            list,
            reports,
            stop,
        }
    }

    /// The next finished connection, in the order they finished.
    pub async fn next_report(&mut self) -> Received {
        within("a raw backend to report a finished connection", async {
            self.reports
                .recv()
                .await
                .expect("raw backends live as long as this value")
        })
        .await
    }

    /// Finished connections reported so far, without waiting.
    pub fn reports_so_far(&mut self) -> Vec<Received> {
        let mut out = Vec::new();
        while let Ok(r) = self.reports.try_recv() {
            out.push(r);
        }
        out
    }
}

impl Drop for RawBackends {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn raw_accept_loop(
    listener: TcpListener,
    name: String,
    behaviour: Behaviour,
    reports: mpsc::UnboundedSender<Received>,
    stop: CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    eprintln!("raw backend {name}: accept failed: {e}");
                    continue;
                }
            },
        };
        let name = name.clone();
        let reports = reports.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                bytes = serve_raw(stream, &name, behaviour) => {
                    // The receiver is gone once a test has finished; nobody asks then.
                    reports.send(Received { backend: name, bytes }).ok();
                }
            }
        });
    }
}

/// Serves one connection; returns every byte the peer sent. An I/O error
/// (a reset) ends the connection like EOF does.
async fn serve_raw(mut stream: TcpStream, name: &str, behaviour: Behaviour) -> Vec<u8> {
    let mut received = Vec::new();
    if behaviour == Behaviour::GreetEcho
        && let Err(e) = stream
            .write_all(format!("backend: {name}\n").as_bytes())
            .await
    {
        eprintln!("raw backend {name}: greeting failed: {e}");
        return received;
    }
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match stream.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                eprintln!("raw backend {name}: read failed: {e}");
                return received;
            }
        };
        received.extend_from_slice(&buf[..n]);
        if behaviour == Behaviour::GreetEcho
            && let Err(e) = stream.write_all(&buf[..n]).await
        {
            eprintln!("raw backend {name}: echo failed: {e}");
            return received;
        }
    }
    if behaviour == Behaviour::CountAtEof {
        let reply = format!("received {} bytes\n", received.len());
        if let Err(e) = stream.write_all(reply.as_bytes()).await {
            eprintln!("raw backend {name}: reply failed: {e}");
        }
    }
    if let Err(e) = stream.shutdown().await {
        eprintln!("raw backend {name}: shutdown failed: {e}");
    }
    received
}

/// Reads the `backend: NAME\n` line a [`Behaviour::GreetEcho`] backend sends first.
pub async fn read_greeting(stream: &mut TcpStream) -> String {
    let mut line = Vec::new();
    within("the backend's greeting line", async {
        loop {
            let mut byte = [0u8; 1];
            match stream.read(&mut byte).await {
                Ok(0) => panic!(
                    "connection closed before the greeting ended; got {:?}",
                    String::from_utf8_lossy(&line)
                ),
                Ok(_) if byte[0] == b'\n' => break,
                Ok(_) => line.push(byte[0]),
                Err(e) => panic!("reading the greeting failed: {e}"),
            }
            assert!(line.len() < 256, "greeting line too long: {line:?}");
        }
    })
    .await;
    let line = String::from_utf8(line).expect("the greeting is UTF-8");
    line.strip_prefix("backend: ")
        .unwrap_or_else(|| panic!("not a greeting: {line:?}"))
        .to_string()
}

// ---------------------------------------------------------------------------
// magpie in-process.

/// A running magpie; it shuts down when dropped.
pub struct Magpie {
    pub addr: SocketAddr,
    /// The admin endpoint, when the config turns it on.
    pub admin: Option<SocketAddr>,
    pub shared: Arc<Shared>,
    running: Option<Running>,
    shutdown: CancellationToken,
}

impl Magpie {
    /// Starts magpie from a complete YAML config.
    pub async fn start(yaml: &str) -> Magpie {
        let config = Config::parse(Path::new("test.yaml"), yaml)
            .unwrap_or_else(|e| panic!("test config rejected:\n{e}\n--- config ---\n{yaml}"));
        let shutdown = CancellationToken::new();
        let running = app::start(config, shutdown.clone())
            .await
            .unwrap_or_else(|e| panic!("magpie did not start: {e}"));
        Magpie::running(running, shutdown)
    }

    /// Starts magpie from a config file, which it then watches for reloads.
    pub async fn start_file(path: &Path) -> Magpie {
        let config = Config::load(path).unwrap_or_else(|e| panic!("test config rejected:\n{e}"));
        let shutdown = CancellationToken::new();
        let running = app::start(config, shutdown.clone())
            .await
            .unwrap_or_else(|e| panic!("magpie did not start: {e}"));
        Magpie::running(running, shutdown)
    }

    fn running(running: Running, shutdown: CancellationToken) -> Magpie {
        Magpie {
            addr: running.listen[0],
            admin: running.admin,
            shared: Arc::clone(&running.shared),
            running: Some(running),
            shutdown,
        }
    }

    /// Starts magpie on `127.0.0.1:0` with `settings` (YAML lines) in front of `backends`.
    pub async fn with(settings: &str, backends: &[(String, SocketAddr)]) -> Magpie {
        Magpie::start(&config_yaml("127.0.0.1:0", settings, backends)).await
    }

    /// The backends for `key`, primary first, by name.
    pub fn candidates(&self, key: u64) -> Vec<String> {
        self.shared
            .snapshot
            .load()
            .candidates(key)
            .map(|b| b.name.clone())
            .collect()
    }

    pub fn primary(&self, key: u64) -> String {
        self.candidates(key)
            .into_iter()
            .next()
            .expect("a snapshot always has a candidate")
    }

    pub fn backend(&self, name: &str) -> Arc<Backend> {
        Arc::clone(
            self.shared
                .snapshot
                .load()
                .backend(name)
                .unwrap_or_else(|| panic!("no backend named {name}")),
        )
    }

    /// Active connections per backend, in name order.
    pub fn active(&self) -> Vec<(String, u64)> {
        self.shared
            .snapshot
            .load()
            .backends
            .iter()
            .map(|b| (b.name.clone(), b.live.active()))
            .collect()
    }

    /// Stops accepting and waits until every connection is closed.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(running) = self.running.take() {
            within("magpie to shut down", running.wait()).await;
        }
    }
}

impl Drop for Magpie {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A config: `listen`, admin off, `settings` (YAML lines, may be empty), `backends`.
pub fn config_yaml(listen: &str, settings: &str, backends: &[(String, SocketAddr)]) -> String {
    let mut yaml = format!("listen: \"{listen}\"\nadmin: off\n{settings}");
    if !yaml.ends_with('\n') {
        yaml.push('\n');
    }
    yaml.push_str("backends:\n");
    for (name, addr) in backends {
        yaml.push_str(&format!("  - name: {name}\n    addr: \"{addr}\"\n"));
    }
    yaml
}

/// [`config_yaml`] with the admin endpoint on `127.0.0.1:0`.
pub fn config_yaml_with_admin(
    listen: &str,
    settings: &str,
    backends: &[(String, SocketAddr)],
) -> String {
    config_yaml(listen, settings, backends).replace("admin: off", "admin: 127.0.0.1:0")
}

/// Header-mode settings keyed by `x-session-id`.
pub const SESSION_KEY: &str = "key:\n  from: header\n  header: x-session-id\n";

// ---------------------------------------------------------------------------
// Clients.

/// Connects to `to` from `source` (any 127.0.0.x works on Linux loopback).
pub async fn connect_from(source: IpAddr, to: SocketAddr) -> TcpStream {
    within(&format!("connect from {source} to {to}"), async {
        let socket = match source {
            IpAddr::V4(_) => TcpSocket::new_v4(),
            IpAddr::V6(_) => TcpSocket::new_v6(),
        }
        .expect("create a client socket");
        socket
            .bind(SocketAddr::new(source, 0))
            .unwrap_or_else(|e| panic!("bind the client socket to {source}: {e}"));
        socket
            .connect(to)
            .await
            .unwrap_or_else(|e| panic!("connect from {source} to {to}: {e}"))
    })
    .await
}

pub async fn connect(to: SocketAddr) -> TcpStream {
    within(&format!("connect to {to}"), async {
        TcpStream::connect(to)
            .await
            .unwrap_or_else(|e| panic!("connect to {to}: {e}"))
    })
    .await
}

/// The request the HTTP clients below send.
pub fn request(session: Option<&str>, close: bool) -> String {
    let mut req = String::from("GET / HTTP/1.1\r\nHost: magpie.test\r\n");
    if let Some(s) = session {
        req.push_str(&format!("x-session-id: {s}\r\n"));
    }
    if close {
        req.push_str("Connection: close\r\n");
    }
    req.push_str("\r\n");
    req
}

/// One request over a fresh connection (closed after), returning the body.
pub async fn http_get(to: SocketAddr, session: Option<&str>) -> String {
    let stream = connect(to).await;
    http_exchange_closing(stream, session).await
}

/// [`http_get`] from a chosen source address.
pub async fn http_get_from(source: IpAddr, to: SocketAddr, session: Option<&str>) -> String {
    let stream = connect_from(source, to).await;
    http_exchange_closing(stream, session).await
}

async fn http_exchange_closing(mut stream: TcpStream, session: Option<&str>) -> String {
    within("an HTTP exchange", async {
        stream
            .write_all(request(session, true).as_bytes())
            .await
            .expect("send the request");
        let mut response = Vec::new();
        stream
            .read_to_end(&mut response)
            .await
            .expect("read the response");
        let text = String::from_utf8(response).expect("the response is UTF-8");
        match text.split_once("\r\n\r\n") {
            Some((head, body)) if head.starts_with("HTTP/1.1 200") => body.to_string(),
            _ => panic!("not a 200 response: {text:?}"),
        }
    })
    .await
}

/// One request on a connection that stays open; reads exactly one response
/// (by its Content-Length) and returns the body.
pub async fn http_keepalive(stream: &mut TcpStream, session: Option<&str>) -> String {
    within("an HTTP exchange on a kept-alive connection", async {
        stream
            .write_all(request(session, false).as_bytes())
            .await
            .expect("send the request");
        let mut data = Vec::new();
        let mut buf = [0u8; 1024];
        let head_end = loop {
            if let Some(i) = data.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = stream.read(&mut buf).await.expect("read the response");
            assert!(
                n > 0,
                "connection closed mid-response: {:?}",
                String::from_utf8_lossy(&data)
            );
            data.extend_from_slice(&buf[..n]);
        };
        let head = String::from_utf8_lossy(&data[..head_end]).to_string();
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .unwrap_or_else(|| panic!("no content-length in {head:?}"));
        while data.len() < head_end + length {
            let n = stream.read(&mut buf).await.expect("read the body");
            assert!(n > 0, "connection closed mid-body");
            data.extend_from_slice(&buf[..n]);
        }
        String::from_utf8(data[head_end..head_end + length].to_vec()).expect("UTF-8 body")
    })
    .await
}

/// The backend name in a demo backend's body (`backend: NAME`).
pub fn backend_of(body: &str) -> String {
    body.lines()
        .find_map(|l| l.strip_prefix("backend: "))
        .unwrap_or_else(|| panic!("no backend line in {body:?}"))
        .to_string()
}

/// The session line in a demo backend's body.
pub fn session_of(body: &str) -> String {
    body.lines()
        .find_map(|l| l.strip_prefix("session: "))
        .unwrap_or_else(|| panic!("no session line in {body:?}"))
        .to_string()
}

/// Reads until the peer closes. `Ok(bytes)` for an orderly EOF; `Err` for a reset.
pub async fn read_until_closed(stream: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    within("the connection to be closed", stream.read_to_end(&mut out))
        .await
        .map(|_| out)
}

// ---------------------------------------------------------------------------
// Data.

/// `len` deterministic pseudo-random bytes (xorshift64), cheap in debug builds.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = vec![0u8; len.next_multiple_of(8)];
    for chunk in out.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

// ---------------------------------------------------------------------------
// Files and the binary.

static FILE_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A file in Cargo's scratch directory for integration tests, removed on drop.
pub struct TempFile {
    pub path: PathBuf,
}

impl TempFile {
    /// Writes `text` to a fresh directory as `name`, so messages can name the file.
    pub fn new(name: &str, text: &str) -> TempFile {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "magpie-{}-{}",
            std::process::id(),
            FILE_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        TempFile { path }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(dir) = self.path.parent()
            && let Err(e) = std::fs::remove_dir_all(dir)
        {
            eprintln!("cannot remove {}: {e}", dir.display());
        }
    }
}

/// The `magpie` binary Cargo built for these tests.
pub fn magpie_bin() -> &'static str {
    env!("CARGO_BIN_EXE_magpie")
}

/// The `magpie` binary running as a child process, its stderr read line by line.
pub struct Child {
    pub process: tokio::process::Child,
    lines: mpsc::UnboundedReceiver<String>,
    /// Every stderr line seen so far, for failure messages.
    pub log: Vec<String>,
}

impl Child {
    pub fn spawn(args: &[&str]) -> Child {
        let mut process = tokio::process::Command::new(magpie_bin())
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", magpie_bin()));
        let stderr = process.stderr.take().expect("stderr is piped");
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Child {
            process,
            lines,
            log: Vec::new(),
        }
    }

    /// Waits for a stderr line containing `needle` and returns it.
    pub async fn wait_for_line(&mut self, needle: &str) -> String {
        let found = tokio::time::timeout(PATIENCE, async {
            while let Some(line) = self.lines.recv().await {
                self.log.push(line.clone());
                if line.contains(needle) {
                    return Some(line);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(line)) => line,
            Ok(None) => panic!(
                "magpie's stderr ended without {needle:?}:\n{}",
                self.log.join("\n")
            ),
            Err(_) => panic!(
                "no {needle:?} on magpie's stderr within {PATIENCE:?}:\n{}",
                self.log.join("\n")
            ),
        }
    }

    pub fn pid(&self) -> String {
        self.process
            .id()
            .expect("the process has not been reaped yet")
            .to_string()
    }
}

/// The first address in a `listen=[a, b]` field of magpie's start log line.
pub fn listen_addr_in(line: &str) -> SocketAddr {
    let start = line
        .find("listen=[")
        .unwrap_or_else(|| panic!("no listen=[..] in {line:?}"))
        + "listen=[".len();
    let rest = &line[start..];
    let end = rest
        .find([']', ','])
        .unwrap_or_else(|| panic!("unterminated listen list in {line:?}"));
    rest[..end]
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("bad listen address in {line:?}: {e}"))
}

// ---------------------------------------------------------------------------
// The admin endpoint.

/// One request to the admin endpoint: (status, body).
pub async fn admin_request(admin: SocketAddr, raw: &str) -> (u16, String) {
    within("an admin request", async {
        let mut stream = TcpStream::connect(admin)
            .await
            .unwrap_or_else(|e| panic!("connect to admin {admin}: {e}"));
        stream
            .write_all(raw.as_bytes())
            .await
            .expect("send the admin request");
        let mut response = Vec::new();
        stream
            .read_to_end(&mut response)
            .await
            .expect("read the admin response");
        let text = String::from_utf8(response).expect("UTF-8 admin response");
        let (head, body) = text
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status in {head:?}"));
        (status, body.to_string())
    })
    .await
}

/// `GET path` on the admin endpoint: (status, body).
pub async fn admin_get(admin: SocketAddr, path: &str) -> (u16, String) {
    admin_request(
        admin,
        &format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n"),
    )
    .await
}

/// The address in an `admin=Some(..)` field of magpie's start log line.
pub fn admin_addr_in(line: &str) -> SocketAddr {
    let start = line
        .find("admin=Some(")
        .unwrap_or_else(|| panic!("no admin=Some(..) in {line:?}"))
        + "admin=Some(".len();
    let rest = &line[start..];
    let end = rest
        .find(')')
        .unwrap_or_else(|| panic!("unterminated admin field in {line:?}"));
    rest[..end]
        .parse()
        .unwrap_or_else(|e| panic!("bad admin address in {line:?}: {e}"))
}
