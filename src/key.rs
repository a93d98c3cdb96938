//! The key of a connection: what placement hashes to pick a backend.
//!
//! Sits between accept (and the PROXY header, if any) and lookup. Three kinds:
//!
//! * `source_ip`: the client's address. IPv4 is hashed as its 4 bytes, IPv6
//!   as all 16 (no /64 truncation); an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`,
//!   what a dual-stack socket reports) is first turned back into IPv4, so one
//!   client gets one key whichever socket it came through.
//! * `source_addr`: the same bytes followed by the port, big-endian.
//! * `header`: the value of one HTTP/1.x request header, hashed as its bytes
//!   (surrounding white space trimmed). The start of the stream is *read* into a
//!   bounded buffer (never peeked: tokio's `peek` does not consume readiness and
//!   can spin), until the request head is complete, the buffer is full, the
//!   peer stops, or the deadline passes; the proxy then replays those bytes to
//!   the backend. Anything short of a complete head that carries the header
//!   gives the fallback key and a [`FallbackReason`].
//!
//! The same text always gives the same key, so `magpie lookup KEY` and the
//! admin `/route?key=` answer exactly what the proxy does.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::config::Fallback;
use crate::hash::{h64, h64_parts};
use crate::net::canonical_ip;

/// How many header lines a request head may have before we stop parsing it.
const MAX_HEADERS: usize = 64;

/// The `source_ip` key.
pub fn source_ip_key(ip: IpAddr) -> u64 {
    match canonical_ip(ip) {
        IpAddr::V4(v4) => h64(&v4.octets()),
        IpAddr::V6(v6) => h64(&v6.octets()),
    }
}

/// The `source_addr` key: address bytes, then the port big-endian.
pub fn source_addr_key(addr: SocketAddr) -> u64 {
    let port = addr.port().to_be_bytes();
    match canonical_ip(addr.ip()) {
        IpAddr::V4(v4) => h64_parts(&[&v4.octets(), &port]),
        IpAddr::V6(v6) => h64_parts(&[&v6.octets(), &port]),
    }
}

/// The key of a header value (or any key given as text, e.g. to `lookup`).
pub fn text_key(value: &[u8]) -> u64 {
    h64(value.trim_ascii())
}

/// The key for a client by the configured fallback.
pub fn fallback_key(fallback: Fallback, client: SocketAddr) -> u64 {
    match fallback {
        Fallback::SourceIp => source_ip_key(client.ip()),
        Fallback::SourceAddr => source_addr_key(client),
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyTextError {
    #[error("{0:?} is not an IP address (the key is the source IP)")]
    NotIp(String),
    #[error("{0:?} is not an ip:port address (the key is the source address)")]
    NotSocketAddr(String),
}

/// The key the proxy would use for a key written as text: a header value in
/// header mode, an IP in `source_ip` mode, an `ip:port` in `source_addr` mode.
/// This is what `magpie lookup`, `plan --keys` and `/route?key=` hash.
pub fn key_for_text(config: &crate::config::KeyConfig, text: &str) -> Result<u64, KeyTextError> {
    use crate::config::KeyConfig;
    let text = text.trim();
    match config {
        KeyConfig::Header { .. } => Ok(text_key(text.as_bytes())),
        KeyConfig::SourceIp => text
            .parse::<IpAddr>()
            .map(source_ip_key)
            .map_err(|_| KeyTextError::NotIp(text.to_string())),
        KeyConfig::SourceAddr => text
            .parse::<SocketAddr>()
            .map(source_addr_key)
            .map_err(|_| KeyTextError::NotSocketAddr(text.to_string())),
    }
}

/// Why a header key was not found; each is counted separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallbackReason {
    /// A complete request head without the header.
    MissingHeader,
    /// The bytes are not an HTTP/1.x request.
    NotHttp,
    /// The head did not fit in `max_bytes`.
    TooLarge,
    /// The deadline passed before the head was complete.
    Timeout,
    /// The client stopped sending (EOF or error) before the head was complete.
    Closed,
}

impl FallbackReason {
    pub const ALL: [FallbackReason; 5] = [
        FallbackReason::MissingHeader,
        FallbackReason::NotHttp,
        FallbackReason::TooLarge,
        FallbackReason::Timeout,
        FallbackReason::Closed,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            FallbackReason::MissingHeader => "missing_header",
            FallbackReason::NotHttp => "not_http",
            FallbackReason::TooLarge => "too_large",
            FallbackReason::Timeout => "timeout",
            FallbackReason::Closed => "closed",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// What looking at a request head found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadScan {
    /// The head is complete and carries the header: its key.
    Found(u64),
    /// More bytes could still complete the head.
    NeedMore,
    /// No key can come from these bytes.
    Fallback(FallbackReason),
}

/// Looks for `header` (lower-case) in the HTTP/1.x request head at the start
/// of `bytes`. Pure: no I/O, no allocation.
pub fn scan_head(bytes: &[u8], header: &str) -> HeadScan {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(bytes) {
        Ok(httparse::Status::Complete(_)) => {
            match req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(header))
            {
                Some(h) if !h.value.trim_ascii().is_empty() => HeadScan::Found(text_key(h.value)),
                _ => HeadScan::Fallback(FallbackReason::MissingHeader),
            }
        }
        Ok(httparse::Status::Partial) => HeadScan::NeedMore,
        // Includes TooManyHeaders: a head we will not parse is not HTTP to us.
        Err(_) => HeadScan::Fallback(FallbackReason::NotHttp),
    }
}

/// The outcome of reading a header key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderKey {
    Found(u64),
    Fallback(FallbackReason),
}

/// Reads from `stream` into `buf[*filled..limit]` until `scan_head` decides, the
/// buffer reaches `limit`, the stream ends, or `deadline` passes. The bytes read
/// stay in `buf[..*filled]` for the caller to replay. `buf[..*filled]` may
/// already hold bytes read earlier (after a PROXY header).
pub async fn read_header_key<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut [u8],
    filled: &mut usize,
    limit: usize,
    header: &str,
    deadline: Duration,
) -> HeaderKey {
    let limit = limit.min(buf.len());
    let read = async {
        loop {
            match scan_head(&buf[..*filled], header) {
                HeadScan::Found(k) => return HeaderKey::Found(k),
                HeadScan::Fallback(r) => return HeaderKey::Fallback(r),
                HeadScan::NeedMore => {}
            }
            if *filled >= limit {
                return HeaderKey::Fallback(FallbackReason::TooLarge);
            }
            match stream.read(&mut buf[*filled..limit]).await {
                Ok(0) | Err(_) => return HeaderKey::Fallback(FallbackReason::Closed),
                Ok(n) => *filled += n,
            }
        }
    };
    match tokio::time::timeout(deadline, read).await {
        Ok(outcome) => outcome,
        Err(_) => HeaderKey::Fallback(FallbackReason::Timeout),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[test]
    fn mapped_ipv4_hashes_like_ipv4() {
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(source_ip_key(v4), source_ip_key(mapped));
        assert_eq!(source_ip_key(v4), h64(&[192, 0, 2, 7]));
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(
            source_ip_key(v6),
            h64(&"2001:db8::1"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets())
        );
        // Hosts in one /64 still get different keys.
        assert_ne!(
            source_ip_key(v6),
            source_ip_key("2001:db8::2".parse().unwrap())
        );
    }

    #[test]
    fn source_addr_adds_the_port() {
        let a: SocketAddr = "192.0.2.7:1000".parse().unwrap();
        let b: SocketAddr = "192.0.2.7:1001".parse().unwrap();
        assert_ne!(source_addr_key(a), source_addr_key(b));
        assert_eq!(source_addr_key(a), h64(&[192, 0, 2, 7, 0x03, 0xe8]));
    }

    #[test]
    fn scan_finds_header_case_insensitively() {
        let head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Session-ID:  abc \r\n\r\nbody";
        assert_eq!(
            scan_head(head, "x-session-id"),
            HeadScan::Found(h64(b"abc"))
        );
        assert_eq!(
            scan_head(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "x-session-id"),
            HeadScan::Fallback(FallbackReason::MissingHeader)
        );
        assert_eq!(
            scan_head(b"GET / HTTP/1.1\r\nHo", "x-session-id"),
            HeadScan::NeedMore
        );
        assert_eq!(scan_head(b"", "x-session-id"), HeadScan::NeedMore);
        assert_eq!(
            scan_head(b"\x16\x03\x01\x02\x00\x01\x00", "x-session-id"),
            HeadScan::Fallback(FallbackReason::NotHttp)
        );
    }

    #[test]
    fn text_keys_follow_the_key_mode() {
        use crate::config::KeyConfig;
        let header = KeyConfig::Header {
            name: "x-session-id".into(),
            read_timeout: Duration::from_millis(200),
            max_bytes: 8192,
            fallback: Fallback::SourceIp,
        };
        assert_eq!(key_for_text(&header, " s1 "), Ok(h64(b"s1")));
        assert_eq!(
            key_for_text(&KeyConfig::SourceIp, "192.0.2.7"),
            Ok(h64(&[192, 0, 2, 7]))
        );
        assert!(key_for_text(&KeyConfig::SourceIp, "alice").is_err());
        assert_eq!(
            key_for_text(&KeyConfig::SourceAddr, "192.0.2.7:1000"),
            Ok(source_addr_key("192.0.2.7:1000".parse().unwrap()))
        );
    }

    #[tokio::test]
    async fn read_stops_at_complete_head_and_keeps_bytes() {
        let (mut client, mut server) = tokio::io::duplex(1024);
        let req = b"POST /v1/chat HTTP/1.1\r\nx-session-id: s1\r\ncontent-length: 2\r\n\r\nhi";
        client.write_all(req).await.unwrap();
        let mut buf = vec![0u8; 256];
        let mut filled = 0;
        let got = read_header_key(
            &mut server,
            &mut buf,
            &mut filled,
            256,
            "x-session-id",
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(got, HeaderKey::Found(h64(b"s1")));
        assert_eq!(&buf[..filled], &req[..]);
    }

    #[tokio::test(start_paused = true)]
    async fn slow_client_falls_back_at_the_deadline() {
        let (mut client, mut server) = tokio::io::duplex(1024);
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let mut buf = vec![0u8; 256];
        let mut filled = 0;
        let got = read_header_key(
            &mut server,
            &mut buf,
            &mut filled,
            256,
            "x-session-id",
            Duration::from_millis(200),
        )
        .await;
        assert_eq!(got, HeaderKey::Fallback(FallbackReason::Timeout));
        assert_eq!(filled, 16);
        drop(client);
    }

    #[tokio::test]
    async fn full_buffer_and_eof_fall_back() {
        let (mut client, mut server) = tokio::io::duplex(4096);
        client
            .write_all(b"GET / HTTP/1.1\r\nx-pad: ")
            .await
            .unwrap();
        client.write_all(&[b'a'; 200]).await.unwrap();
        let mut buf = vec![0u8; 256];
        let mut filled = 0;
        let got = read_header_key(
            &mut server,
            &mut buf,
            &mut filled,
            64,
            "x-session-id",
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(got, HeaderKey::Fallback(FallbackReason::TooLarge));
        assert_eq!(filled, 64);

        let (mut client, mut server) = tokio::io::duplex(4096);
        client.write_all(b"GET / HTT").await.unwrap();
        drop(client);
        let mut filled = 0;
        let got = read_header_key(
            &mut server,
            &mut buf,
            &mut filled,
            256,
            "x-session-id",
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(got, HeaderKey::Fallback(FallbackReason::Closed));
        assert_eq!(filled, 9);
    }
}
