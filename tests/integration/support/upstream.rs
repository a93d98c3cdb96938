//! A raw HTTP/1.1 backend for the deadline and pool tests: it answers as
//! told (never, a head and one chunk then nothing, or at once), and counts
//! the connections it accepted and those its peer closed, so a test can wait
//! for magpie to close one.
//!
//! `GET /hold/N` is answered only once N such requests are waiting at once
//! (so magpie must open N connections to it).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Barrier, Notify};

use super::within;

/// How an [`Upstream`] answers a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Reads the request and never writes a byte.
    Never,
    /// A chunked `200` head and one chunk (`first`), then nothing.
    HeadThenStall,
    /// `200` with `backend: NAME`, keep-alive.
    Ok,
}

/// One raw backend; it runs until the test's runtime ends.
pub struct Upstream {
    pub name: String,
    pub addr: SocketAddr,
    answer: Answer,
    /// Connections accepted, and those closed by magpie (EOF or reset).
    pub accepted: AtomicU64,
    pub closed: AtomicU64,
    changed: Notify,
    holds: Mutex<HashMap<usize, Arc<Barrier>>>,
}

impl Upstream {
    pub async fn start(name: &str, answer: Answer) -> Arc<Upstream> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("cannot start upstream {name}: {e}"));
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let upstream = Arc::new(Upstream {
            name: name.to_string(),
            addr,
            answer,
            accepted: AtomicU64::new(0),
            closed: AtomicU64::new(0),
            changed: Notify::new(),
            holds: Mutex::new(HashMap::new()),
        });
        let u = Arc::clone(&upstream);
        tokio::spawn(async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((s, _)) => s,
                    Err(e) => {
                        eprintln!("upstream {}: accept: {e}", u.name);
                        continue;
                    }
                };
                u.accepted.fetch_add(1, Ordering::SeqCst);
                u.changed.notify_waiters();
                tokio::spawn(Arc::clone(&u).serve(stream));
            }
        });
        upstream
    }

    /// (name, address), for configs.
    pub fn pair(&self) -> (String, SocketAddr) {
        (self.name.clone(), self.addr)
    }

    /// Waits until `n` connections were accepted.
    pub async fn wait_accepted(&self, n: u64) {
        self.wait(&format!("{} connections to {}", n, self.name), || {
            self.accepted.load(Ordering::SeqCst) >= n
        })
        .await;
    }

    /// Waits until magpie closed `n` of its connections.
    pub async fn wait_closed(&self, n: u64) {
        self.wait(
            &format!("magpie to close {n} connections to {}", self.name),
            || self.closed.load(Ordering::SeqCst) >= n,
        )
        .await;
    }

    async fn wait(&self, what: &str, done: impl Fn() -> bool) {
        within(what, async {
            loop {
                let changed = self.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if done() {
                    return;
                }
                changed.await;
            }
        })
        .await;
    }

    async fn serve(self: Arc<Self>, mut stream: TcpStream) {
        let mut buf = Vec::new();
        self.exchange(&mut stream, &mut buf).await;
        self.closed.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// Answers requests until the peer closes the connection.
    async fn exchange(&self, stream: &mut TcpStream, buf: &mut Vec<u8>) {
        while let Some(path) = read_head(stream, buf).await {
            let reply = match self.answer {
                Answer::Never => None,
                Answer::HeadThenStall => Some(
                    "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n"
                        .to_string(),
                ),
                Answer::Ok => {
                    if let Some(n) = path.strip_prefix("/hold/").and_then(|n| n.parse().ok()) {
                        self.hold(n).wait().await;
                    }
                    let body = format!("backend: {}\n", self.name);
                    Some(format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    ))
                }
            };
            let Some(reply) = reply else { break };
            if stream.write_all(reply.as_bytes()).await.is_err() {
                return;
            }
            if self.answer != Answer::Ok {
                break;
            }
        }
        // Nothing more is sent: wait for magpie to close its end.
        let mut sink = [0u8; 1024];
        while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
    }

    fn hold(&self, n: usize) -> Arc<Barrier> {
        let mut holds = self.holds.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(holds.entry(n).or_insert_with(|| Arc::new(Barrier::new(n))))
    }
}

/// Reads one request head (requests here have no body); its path, or
/// `None` once the peer closed the connection.
async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.drain(..end + 4);
            return head.split(' ').nth(1).map(str::to_string);
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}
