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

use crate::intake::read_ahead::ReadAhead;
use magpie_core::key::{FallbackReason, text_key};

/// Header lines parsed without allocating; a head with more is parsed again
/// with room for as many as it has lines.
const STACK_HEADERS: usize = 64;

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
/// of `bytes`. Pure: no I/O; allocates only for a head of more than 64
/// header lines.
pub fn scan_head(bytes: &[u8], header: &str) -> HeadScan {
    let mut headers = [httparse::EMPTY_HEADER; STACK_HEADERS];
    match scan_with(bytes, header, &mut headers) {
        Err(httparse::Error::TooManyHeaders) => {
            // A head cannot have more header lines than newlines.
            let lines = bytes.iter().filter(|&&b| b == b'\n').count();
            let mut headers = vec![httparse::EMPTY_HEADER; lines];
            scan_with(bytes, header, &mut headers)
                .unwrap_or(HeadScan::Fallback(FallbackReason::NotHttp))
        }
        Err(_) => HeadScan::Fallback(FallbackReason::NotHttp),
        Ok(scan) => scan,
    }
}

fn scan_with<'b>(
    bytes: &'b [u8],
    header: &str,
    headers: &mut [httparse::Header<'b>],
) -> Result<HeadScan, httparse::Error> {
    let mut req = httparse::Request::new(headers);
    Ok(match req.parse(bytes)? {
        httparse::Status::Complete(_) => match req
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(header))
        {
            Some(h) if !h.value.trim_ascii().is_empty() => HeadScan::Found(text_key(h.value)),
            _ => HeadScan::Fallback(FallbackReason::MissingHeader),
        },
        httparse::Status::Partial => HeadScan::NeedMore,
    })
}

/// Whether `bytes[from..]` (with three bytes before it, for a terminator
/// split across reads) can hold the end of a request head: a blank line.
fn may_end_head(bytes: &[u8], from: usize) -> bool {
    let window = &bytes[from.saturating_sub(3)..];
    window.windows(2).any(|w| w == b"\n\n") || window.windows(3).any(|w| w == b"\n\r\n")
}

/// What to read: the header (lower-case), at most `limit` bytes of head,
/// within `deadline`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Want<'a> {
    pub(crate) header: &'a str,
    pub(crate) limit: usize,
    pub(crate) deadline: Duration,
}

/// The outcome of reading a header key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeaderKey {
    Found(u64),
    Fallback(FallbackReason),
}

/// Reads from `stream` (up to `limit` bytes ahead in all) until the head
/// decides, the limit is reached, the stream ends, or `deadline` passes. The
/// bytes read stay read ahead for the caller to replay, after any read
/// before (the rest of a PROXY header's segment, a signature check).
///
/// The head is parsed again only when the new bytes may end it, or when it
/// has doubled since the last parse (which also catches a stream that is not
/// HTTP early): parsing costs O(n) overall, however the head is split.
pub(crate) async fn read_header_key(stream: &mut ReadAhead, want: Want<'_>) -> HeaderKey {
    let Want {
        header,
        limit,
        deadline,
    } = want;
    let read = async {
        let mut parse_at = 0;
        let mut scanned = 0;
        loop {
            let filled = stream.bytes().len();
            if filled >= parse_at || may_end_head(stream.bytes(), scanned) {
                match scan_head(stream.bytes(), header) {
                    HeadScan::Found(k) => return HeaderKey::Found(k),
                    HeadScan::Fallback(r) => return HeaderKey::Fallback(r),
                    HeadScan::NeedMore => parse_at = (filled * 2).max(1),
                }
            }
            scanned = filled;
            if filled >= limit {
                return HeaderKey::Fallback(FallbackReason::TooLarge);
            }
            match stream.read_more(limit).await {
                Ok(0) | Err(_) => return HeaderKey::Fallback(FallbackReason::Closed),
                Ok(_) => {}
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
    use magpie_core::hash::h64;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    /// The session header, at most `limit` bytes, within `deadline`.
    fn want(limit: usize, deadline: Duration) -> Want<'static> {
        Want {
            header: "x-session-id",
            limit,
            deadline,
        }
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
    fn a_head_with_more_than_64_headers_is_still_http() {
        let mut head = b"GET / HTTP/1.1\r\nHost: x\r\n".to_vec();
        for i in 0..200 {
            head.extend_from_slice(format!("x-pad-{i}: {i}\r\n").as_bytes());
        }
        head.extend_from_slice(b"x-session-id: deep\r\n\r\n");
        assert_eq!(
            scan_head(&head, "x-session-id"),
            HeadScan::Found(h64(b"deep"))
        );
    }

    #[test]
    fn a_blank_line_split_across_reads_is_seen() {
        let head = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        // However the last read split it, the new bytes may end the head.
        for seen_before in 0..=head.len() {
            assert!(
                may_end_head(head, seen_before),
                "new bytes from {seen_before}"
            );
        }
        assert!(may_end_head(b"GET / HTTP/1.1\n\n", 15));
        assert!(!may_end_head(b"GET / HTTP/1.1\r\nHost: x\r\n", 0));
        // A blank line long gone is not looked at again.
        assert!(!may_end_head(b"x\n\nabcdefgh", 8));
    }

    /// A connected loopback pair: the client's end, and magpie's.
    async fn pair() -> (TcpStream, ReadAhead) {
        let (client, accepted) = crate::net::loopback_pair().await;
        (client, ReadAhead::new(accepted))
    }

    /// A 1 MiB head arriving 100 bytes at a time: found, replayed exactly,
    /// and the buffer grew from nothing only as far as the head.
    #[tokio::test]
    async fn a_long_head_in_small_segments_is_read_whole() {
        let mut head = b"POST / HTTP/1.1\r\n".to_vec();
        while head.len() < (1 << 20) - 100 {
            head.extend_from_slice(
                b"x-pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n",
            );
        }
        head.extend_from_slice(b"x-session-id: s9\r\n\r\n");
        let (mut client, mut server) = pair().await;
        let sent = head.clone();
        let writer = tokio::spawn(async move {
            for chunk in sent.chunks(100) {
                client.write_all(chunk).await.unwrap();
            }
            client
        });
        let got = read_header_key(&mut server, want(2 << 20, Duration::from_secs(30))).await;
        assert_eq!(got, HeaderKey::Found(h64(b"s9")));
        assert_eq!(server.bytes(), &head[..]);
        let capacity = server.take_bytes().capacity();
        assert!(
            capacity < 2 * head.len(),
            "buffer {capacity} for a head of {}",
            head.len()
        );
        drop(writer.await.unwrap());
    }

    #[tokio::test]
    async fn read_stops_at_complete_head_and_keeps_bytes() {
        let (mut client, mut server) = pair().await;
        let req = b"POST /v1/chat HTTP/1.1\r\nx-session-id: s1\r\ncontent-length: 2\r\n\r\nhi";
        client.write_all(req).await.unwrap();
        let got = read_header_key(&mut server, want(256, Duration::from_secs(5))).await;
        assert_eq!(got, HeaderKey::Found(h64(b"s1")));
        assert!(req.starts_with(server.bytes()));
        assert!(server.bytes().len() >= req.len() - 2, "the whole head");
    }

    #[tokio::test(start_paused = true)]
    async fn slow_client_falls_back_at_the_deadline() {
        let (mut client, mut server) = pair().await;
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let got = read_header_key(&mut server, want(256, Duration::from_millis(200))).await;
        assert_eq!(got, HeaderKey::Fallback(FallbackReason::Timeout));
        assert_eq!(server.bytes(), b"GET / HTTP/1.1\r\n");
        drop(client);
    }

    #[tokio::test]
    async fn full_buffer_and_eof_fall_back() {
        let (mut client, mut server) = pair().await;
        client
            .write_all(b"GET / HTTP/1.1\r\nx-pad: ")
            .await
            .unwrap();
        client.write_all(&[b'a'; 200]).await.unwrap();
        let got = read_header_key(&mut server, want(64, Duration::from_secs(5))).await;
        assert_eq!(got, HeaderKey::Fallback(FallbackReason::TooLarge));
        assert_eq!(server.bytes().len(), 64);

        let (mut client, mut server) = pair().await;
        client.write_all(b"GET / HTT").await.unwrap();
        drop(client);
        let got = read_header_key(&mut server, want(256, Duration::from_secs(5))).await;
        assert_eq!(got, HeaderKey::Fallback(FallbackReason::Closed));
        assert_eq!(server.bytes(), b"GET / HTT");
    }
}
