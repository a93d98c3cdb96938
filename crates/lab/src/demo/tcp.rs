//! `magpie demo --mode tcp`: three small HTTP backends on loopback, and magpie in front of
//! them keyed by the `x-session-id` header, all in one process.
//!
//! Each backend answers every request with a plain-text body whose first line
//! is `backend: NAME`, followed by the session key it saw, so `curl` shows at
//! once where a session lands. The same backends serve the integration tests.

use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use magpie_proxy::config::Mode;

use super::SESSION_HEADER;

/// The largest request head a demo backend reads.
const MAX_HEAD: usize = 64 * 1024;

/// Starts one demo backend on `addr` (port 0 for any); returns where it listens.
/// It stops when `stop` fires.
pub async fn start_backend(
    name: &str,
    addr: SocketAddr,
    stop: CancellationToken,
) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let name = name.to_string();
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                _ = stop.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        debug!(error = %e, "demo backend accept failed");
                        continue;
                    }
                },
            };
            let name = name.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    result = serve_http(stream, &name) => {
                        if let Err(e) = result {
                            debug!(error = %e, "demo backend connection ended");
                        }
                    }
                }
            });
        }
    });
    Ok(local)
}

/// Answers HTTP/1.1 requests on one connection (keep-alive) until the client
/// closes or asks to.
async fn serve_http(mut stream: TcpStream, name: &str) -> io::Result<()> {
    let mut buf = vec![0u8; MAX_HEAD];
    let mut filled = 0;
    loop {
        // Read a complete head.
        let (head_len, session, body_len, close) = loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut req = httparse::Request::new(&mut headers);
            match req.parse(&buf[..filled]) {
                Ok(httparse::Status::Complete(n)) => {
                    let find = |h: &str| {
                        req.headers
                            .iter()
                            .find(|x| x.name.eq_ignore_ascii_case(h))
                            .map(|x| String::from_utf8_lossy(x.value).trim().to_string())
                    };
                    let session = find(SESSION_HEADER);
                    let body_len: usize = find("content-length")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    let close = find("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"))
                        || req.version == Some(0);
                    break (n, session, body_len, close);
                }
                Ok(httparse::Status::Partial) if filled < buf.len() => {}
                _ => {
                    stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await?;
                    return Ok(());
                }
            }
            let n = stream.read(&mut buf[filled..]).await?;
            if n == 0 {
                return Ok(());
            }
            filled += n;
        };
        // Skip the body.
        let mut to_skip = (head_len + body_len).saturating_sub(filled);
        let mut consumed = (head_len + body_len).min(filled);
        while to_skip > 0 {
            let n = stream.read(&mut buf[..to_skip.min(MAX_HEAD)]).await?;
            if n == 0 {
                return Ok(());
            }
            to_skip -= n;
            consumed = 0;
            filled = 0;
        }
        buf.copy_within(consumed..filled, 0);
        filled -= consumed;

        let body = format!(
            "backend: {name}\nsession: {}\n",
            session.as_deref().unwrap_or("(none)")
        );
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nx-backend: {name}\r\n{}\r\n{body}",
            body.len(),
            if close { "Connection: close\r\n" } else { "" }
        );
        stream.write_all(response.as_bytes()).await?;
        if close {
            return Ok(());
        }
    }
}

/// The demo's config: Maglev, keyed by `x-session-id` (per connection, or per
/// request with the `prompt_cache_key` body field as a second choice), in
/// front of `backends`. Its backends speak HTTP over TCP: any mode but http
/// gives the mode tcp demo.
pub fn config_yaml(
    mode: Mode,
    listen: SocketAddr,
    admin: SocketAddr,
    backends: &[(String, SocketAddr)],
) -> String {
    let (mode_line, body, http) = match mode {
        Mode::Tcp | Mode::Udp => ("", "", ""),
        Mode::Http => (
            "mode: http\n",
            "  body_field: prompt_cache_key\n",
            "http:\n  expose_backend: true\n",
        ),
    };
    let mut yaml = format!(
        "{mode_line}listen: \"{listen}\"\nadmin: \"{admin}\"\nmax_connections: 1000\nplacement:\n  algorithm: maglev\nkey:\n  from: header\n  header: {SESSION_HEADER}\n{body}  fallback: source_ip\n{http}backends:\n"
    );
    for (name, addr) in backends {
        yaml.push_str(&format!("  - name: {name}\n    addr: \"{addr}\"\n"));
    }
    yaml
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn backend_answers_with_its_name_and_session() {
        let stop = CancellationToken::new();
        let addr = start_backend("demo-a", "127.0.0.1:0".parse().unwrap(), stop.clone())
            .await
            .unwrap();
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"POST / HTTP/1.1\r\nx-session-id: alice\r\ncontent-length: 3\r\n\r\nabcGET / HTTP/1.1\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert_eq!(out.matches("backend: demo-a\n").count(), 2, "{out}");
        assert!(out.contains("session: alice\n"), "{out}");
        assert!(out.contains("session: (none)\n"), "{out}");
        stop.cancel();
    }
}
