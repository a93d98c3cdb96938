//! Backends on `127.0.0.1:0`: the demo's HTTP backends, and raw TCP backends
//! that greet and echo, stay silent, or count what they got.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::within;

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
            let addr = magpie_lab::demo::tcp::start_backend(name, bind, stop.clone())
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

/// The greeting's backend name, or `None` when the connection closed (or
/// was reset) before a whole greeting arrived.
pub async fn try_read_greeting(stream: &mut TcpStream) -> Option<String> {
    let mut line = Vec::new();
    within("the backend's greeting line or a close", async {
        loop {
            let mut byte = [0u8; 1];
            match stream.read(&mut byte).await {
                Ok(0) | Err(_) => return None,
                Ok(_) if byte[0] == b'\n' => break,
                Ok(_) => line.push(byte[0]),
            }
            assert!(line.len() < 256, "greeting line too long: {line:?}");
        }
        let text = String::from_utf8_lossy(&line).into_owned();
        Some(text.strip_prefix("backend: ").unwrap_or(&text).to_string())
    })
    .await
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
