//! Clients: TCP connects from chosen loopback sources, a small HTTP/1.1
//! client, and deterministic test data.

use std::io;
use std::net::{IpAddr, SocketAddr};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use super::within;

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

pub async fn http_exchange_closing(mut stream: TcpStream, session: Option<&str>) -> String {
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

/// Where `needle` first occurs in `haystack`.
pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Reads from `stream` into `buf` until `done` finds its mark there; `None`
/// at EOF or an error.
pub async fn read_until(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    done: impl Fn(&[u8]) -> Option<usize>,
) -> Option<usize> {
    loop {
        if let Some(at) = done(buf) {
            return Some(at);
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}
