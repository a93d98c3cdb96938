//! The header key of a TCP connection, read from its first bytes.
//!
//! Sits between accept (and the PROXY header, if any) and routing. The start
//! of the stream is *read* into a bounded buffer (never peeked: tokio's `peek`
//! does not consume readiness and can spin) until the HTTP/1.x request head is
//! complete, the buffer is full, the peer stops, or the deadline passes; the
//! connection then replays those bytes to the backend. Anything short of a
//! complete head that carries the header gives the fallback key and a
//! [`FallbackReason`].

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::key::{FallbackReason, text_key};

/// How many header lines a request head may have before we stop parsing it.
const MAX_HEADERS: usize = 64;

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

/// What to read: the header (lower-case), at most `limit` bytes of head,
/// within `deadline`.
#[derive(Debug, Clone, Copy)]
pub struct Want<'a> {
    pub header: &'a str,
    pub limit: usize,
    pub deadline: Duration,
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
    want: Want<'_>,
) -> HeaderKey {
    let Want {
        header,
        limit,
        deadline,
    } = want;
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
    use crate::hash::h64;
    use tokio::io::AsyncWriteExt;

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
            Want {
                header: "x-session-id",
                limit: 256,
                deadline: Duration::from_secs(5),
            },
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
            Want {
                header: "x-session-id",
                limit: 256,
                deadline: Duration::from_millis(200),
            },
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
            Want {
                header: "x-session-id",
                limit: 64,
                deadline: Duration::from_secs(5),
            },
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
            Want {
                header: "x-session-id",
                limit: 256,
                deadline: Duration::from_secs(5),
            },
        )
        .await;
        assert_eq!(got, HeaderKey::Fallback(FallbackReason::Closed));
        assert_eq!(filled, 9);
    }
}
