//! Raw HTTP/1.1 backends that report the exact bytes they receive: a
//! recorder that answers every request alike, and a scripted backend whose
//! answer depends on the request's path.

use std::net::SocketAddr;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::{find, read_until, within};

/// A backend on `127.0.0.1:0` that serves each connection it accepts with
/// `serve`, given the connection's number (from 0): its address.
async fn serve_each<F, Fut>(serve: F) -> SocketAddr
where
    F: Fn(TcpStream, u64) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("an address");
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, n));
            n += 1;
        }
    });
    addr
}

/// A raw backend that reports what it sees as `T`s.
pub struct Reporting<T> {
    pub addr: SocketAddr,
    seen: mpsc::UnboundedReceiver<T>,
}

impl<T> Reporting<T> {
    /// The backend, named `a`, as a config lists it.
    pub fn pairs(&self) -> Vec<(String, SocketAddr)> {
        vec![("a".to_string(), self.addr)]
    }

    /// What it saw next.
    pub async fn next(&mut self) -> T {
        within("the backend to see something", self.seen.recv())
            .await
            .expect("the backend runs")
    }
}

/// What the raw backend saw on one connection.
#[derive(Debug)]
pub enum Recorded {
    /// A request head (the body is still to come).
    Head(String),
    /// A whole request: head and body, as written on the wire.
    Request(String),
    /// magpie closed the connection; the bytes of an unfinished request.
    Closed(String),
}

/// A raw HTTP/1.1 backend: it reports every head, request and close, and
/// answers each whole request with `answer`.
pub type Recorder = Reporting<Recorded>;

impl Recorder {
    pub async fn start(answer: &'static str) -> Recorder {
        let (tx, seen) = mpsc::unbounded_channel();
        let addr = serve_each(move |stream, _| record(stream, answer, tx.clone())).await;
        Reporting { addr, seen }
    }

    /// The next whole request (heads before it are skipped).
    pub async fn request(&mut self) -> String {
        loop {
            match self.next().await {
                Recorded::Request(r) => return r,
                Recorded::Head(_) => {}
                Recorded::Closed(partial) => panic!("closed before a request: {partial:?}"),
            }
        }
    }

    /// Nothing reached the backend so far.
    pub fn nothing_yet(&mut self) {
        if let Ok(seen) = self.seen.try_recv() {
            panic!("the backend got {seen:?}");
        }
    }
}

/// Serves one connection: reads requests (bodies by content-length or
/// chunked) and answers each. A connection that never carried a byte (a
/// health check's) is not reported.
async fn record(mut stream: TcpStream, answer: &'static str, tx: mpsc::UnboundedSender<Recorded>) {
    let mut buf = Vec::new();
    let mut served = false;
    loop {
        let Some(head_end) = read_until(&mut stream, &mut buf, |b| find(b, b"\r\n\r\n")).await
        else {
            if served || !buf.is_empty() {
                let _ = tx.send(Recorded::Closed(String::from_utf8_lossy(&buf).into_owned()));
            }
            return;
        };
        served = true;
        let head = String::from_utf8_lossy(&buf[..head_end + 4]).to_ascii_lowercase();
        let _ = tx.send(Recorded::Head(head.clone()));
        let body_end = if head.contains("transfer-encoding: chunked") {
            read_until(&mut stream, &mut buf, |b| {
                find(&b[head_end + 2..], b"\r\n0\r\n\r\n").map(|at| head_end + 2 + at + 7)
            })
            .await
        } else {
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|n| n.trim().parse::<usize>().ok())
                .unwrap_or(0);
            let end = head_end + 4 + length;
            read_until(&mut stream, &mut buf, |b| (b.len() >= end).then_some(end)).await
        };
        let Some(end) = body_end else {
            let _ = tx.send(Recorded::Closed(String::from_utf8_lossy(&buf).into_owned()));
            return;
        };
        let request: Vec<u8> = buf.drain(..end).collect();
        let _ = tx.send(Recorded::Request(
            String::from_utf8_lossy(&request).into_owned(),
        ));
        if stream.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// One request as the backend got it, and the connection it came on.
#[derive(Debug)]
pub struct Received {
    pub conn: u64,
    pub bytes: String,
}

/// A raw HTTP/1.1 backend whose answer depends on the request's path:
///
/// * `/chunked`: a chunked answer with an extension and a trailer;
/// * `/until-close`: a body without length, ended by closing;
/// * `/early`: `413` as soon as the head is in, the body unread, then close;
/// * `POST /refused`: `413` once the body is read, then a close it does not
///   announce;
/// * anything else (`HEAD` too): `content-length: 100` of `x`, or none
///   for `HEAD`; the connection's number in `x-conn`.
pub type ScriptedBackend = Reporting<Received>;

impl ScriptedBackend {
    pub async fn start() -> ScriptedBackend {
        let (tx, seen) = mpsc::unbounded_channel();
        let addr = serve_each(move |stream, conn| serve_scripted(stream, conn, tx.clone())).await;
        Reporting { addr, seen }
    }
}

/// Serves one connection's requests until it closes.
async fn serve_scripted(mut stream: TcpStream, conn: u64, tx: mpsc::UnboundedSender<Received>) {
    let mut buf = Vec::new();
    loop {
        let Some(head_end) = read_until(&mut stream, &mut buf, |b| {
            find(b, b"\r\n\r\n").map(|at| at + 4)
        })
        .await
        else {
            return;
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        if head.starts_with("post /early") {
            let answer = "HTTP/1.1 413 Content Too Large\r\ncontent-length: 9\r\nconnection: close\r\n\r\ntoo large";
            let _ = stream.write_all(answer.as_bytes()).await;
            return;
        }
        let end = if head.contains("transfer-encoding: chunked") {
            read_until(&mut stream, &mut buf, |b| {
                find(&b[head_end - 2..], b"\r\n\r\n")
                    .filter(|&at| at > 2)
                    .map(|at| head_end - 2 + at + 4)
            })
            .await
        } else {
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|n| n.trim().parse::<usize>().ok())
                .unwrap_or(0);
            read_until(&mut stream, &mut buf, |b| {
                (b.len() >= head_end + length).then_some(head_end + length)
            })
            .await
        };
        let Some(end) = end else { return };
        let request: Vec<u8> = buf.drain(..end).collect();
        let _ = tx.send(Received {
            conn,
            bytes: String::from_utf8_lossy(&request).into_owned(),
        });
        if head.starts_with("post /refused") {
            // An error answer to a body it read, then a close it did not
            // announce, as some servers do after a `413`.
            let answer = "HTTP/1.1 413 Content Too Large\r\ncontent-length: 9\r\n\r\ntoo large";
            let _ = stream.write_all(answer.as_bytes()).await;
            return;
        }
        let answer = if head.starts_with("get /chunked") {
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nx-trailer: t\r\n\r\n".to_string()
        } else if head.starts_with("get /until-close") {
            "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it, then the end".to_string()
        } else if head.starts_with("get /hop") {
            "HTTP/1.1 200 OK\r\nconnection: keep-alive, x-hop\r\nkeep-alive: timeout=5\r\nx-hop: 1\r\nx-kept: 1\r\ncontent-length: 2\r\n\r\nok".to_string()
        } else {
            let body = if head.starts_with("head ") {
                String::new()
            } else {
                "x".repeat(100)
            };
            format!("HTTP/1.1 200 OK\r\ncontent-length: 100\r\nx-conn: {conn}\r\n\r\n{body}")
        };
        if stream.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
        if head.starts_with("get /until-close") {
            return;
        }
    }
}

/// The answer a rogue backend slips in for another request: a whole
/// response, so that whoever reads it takes it for theirs.
pub const INJECTED: &str = "HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\ninjected";

/// A raw HTTP/1.1 backend that misbehaves on purpose, by path, to try to
/// answer another client's request:
///
/// * `/extra`: answers `first`, then writes [`INJECTED`] as well;
/// * `HEAD /head-body`, `/no-content` (`204`), `/not-modified` (`304`): a
///   head that allows no body, then [`INJECTED`] as if it were one;
/// * `/early`: `413` at once, without reading the request's body, and the
///   body (itself a request for `/smuggled`) is then read as a request,
///   answered with [`INJECTED`] (after `delay`);
/// * anything else: `mine`, the honest answer.
///
/// The injected bytes follow the honest answer after `delay`; each write of
/// them is reported.
pub type Rogue = Reporting<()>;

impl Rogue {
    pub async fn start(delay: std::time::Duration) -> Rogue {
        let (tx, injected) = mpsc::unbounded_channel();
        let addr = serve_each(move |stream, _| serve_rogue(stream, delay, tx.clone())).await;
        Reporting {
            addr,
            seen: injected,
        }
    }

    /// Waits until the injected bytes went out.
    pub async fn wait_injected(&mut self) {
        self.next().await;
    }
}

/// Serves one connection of a [`Rogue`].
async fn serve_rogue(
    mut stream: TcpStream,
    delay: std::time::Duration,
    injected: mpsc::UnboundedSender<()>,
) {
    let mut buf = Vec::new();
    loop {
        let Some(head_end) = read_until(&mut stream, &mut buf, |b| {
            find(b, b"\r\n\r\n").map(|at| at + 4)
        })
        .await
        else {
            return;
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
        buf.drain(..head_end);
        let honest = match path.as_str() {
            "/extra" => "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfirst",
            "/head-body" => "HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\n",
            "/no-content" => "HTTP/1.1 204 No Content\r\n\r\n",
            "/not-modified" => "HTTP/1.1 304 Not Modified\r\n\r\n",
            "/early" => "HTTP/1.1 413 Content Too Large\r\ncontent-length: 9\r\n\r\ntoo large",
            "/smuggled" => INJECTED,
            _ => "HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nmine",
        };
        if path != "/early" {
            // Read the body (if any) before answering, as an honest server does.
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|n| n.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if read_until(&mut stream, &mut buf, |b| {
                (b.len() >= length).then_some(length)
            })
            .await
            .is_none()
            {
                return;
            }
            buf.drain(..length);
        }
        if path == "/smuggled" {
            tokio::time::sleep(delay).await;
        }
        if stream.write_all(honest.as_bytes()).await.is_err() {
            return;
        }
        if path == "/smuggled" {
            let _ = injected.send(());
        }
        if ["/extra", "/head-body", "/no-content", "/not-modified"].contains(&path.as_str()) {
            tokio::time::sleep(delay).await;
            if stream.write_all(INJECTED.as_bytes()).await.is_err() {
                return;
            }
            let _ = injected.send(());
        }
    }
}
