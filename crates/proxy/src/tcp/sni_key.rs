//! The `sni` key of a TCP connection: the server name of the TLS
//! ClientHello in its first bytes, read under a deadline.
//!
//! Like the header key ([`super::header_key`]), the start of the stream is
//! read into a bounded buffer and later replayed, unchanged, to the backend:
//! magpie never decrypts or answers the TLS itself. The scan
//! ([`magpie_core::key::sni::HelloScanner`]) resumes where it stopped and says
//! how many bytes it needs before it can decide anything, so each byte is
//! looked at once and the scan runs again only once they have arrived,
//! however finely the hello is split.

use std::time::Duration;

use crate::intake::read_ahead::ReadAhead;
use magpie_core::key::FallbackReason;
use magpie_core::key::sni::{HelloScan, HelloScanner};

/// How much may be read for the hello, and for how long.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HelloWant {
    /// The most bytes read ahead in all (`key.max_bytes`).
    pub(crate) limit: usize,
    /// `key.read_timeout`.
    pub(crate) deadline: Duration,
}

/// Reads from `stream` until the ClientHello decides, `limit` bytes are
/// held, the stream ends, or `deadline` passes: the server name's key, or
/// why there is none. The bytes read stay read ahead for the caller to
/// replay, after any read before (a PROXY header's segment, a signature
/// check).
pub(crate) async fn read_sni_key(
    stream: &mut ReadAhead,
    want: HelloWant,
) -> Result<u64, FallbackReason> {
    let HelloWant { limit, deadline } = want;
    let mut scanner = HelloScanner::new(limit);
    let read = async {
        loop {
            let need = match scanner.scan(stream.bytes()) {
                HelloScan::Found(key) => return Ok(key),
                HelloScan::Fallback(reason) => return Err(reason),
                HelloScan::NeedMore(need) => need,
            };
            while stream.bytes().len() < need {
                match stream.read_more(limit).await {
                    Ok(0) | Err(_) => return Err(FallbackReason::Closed),
                    Ok(_) => {}
                }
            }
        }
    };
    tokio::time::timeout(deadline, read)
        .await
        .unwrap_or(Err(FallbackReason::Timeout))
}

#[cfg(test)]
mod tests {
    use super::*;
    use magpie_core::key::sni::server_name_key;
    use magpie_core::key::sni::testing::{client_hello, in_records};
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    async fn pair() -> (TcpStream, ReadAhead) {
        let (client, accepted) = crate::net::loopback_pair().await;
        (client, ReadAhead::new(accepted))
    }

    fn want(limit: usize, deadline: Duration) -> HelloWant {
        HelloWant { limit, deadline }
    }

    /// A hello in 3-byte records, written 5 bytes at a time: found, and
    /// what was read is exactly what was sent.
    #[tokio::test]
    async fn a_hello_in_small_records_and_segments_is_read_whole() {
        let hello = in_records(&client_hello("seg.example"), 3);
        let (mut client, mut server) = pair().await;
        let sent = hello.clone();
        let writer = tokio::spawn(async move {
            for chunk in sent.chunks(5) {
                client.write_all(chunk).await.unwrap();
                client.flush().await.unwrap();
            }
            client
        });
        let got = read_sni_key(&mut server, want(64 << 10, Duration::from_secs(30))).await;
        assert_eq!(got, Ok(server_name_key(b"seg.example")));
        assert_eq!(server.bytes(), &hello[..]);
        drop(writer.await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn half_a_hello_falls_back_at_the_deadline() {
        let hello = client_hello("slow.example");
        let (mut client, mut server) = pair().await;
        client.write_all(&hello[..40]).await.unwrap();
        let got = read_sni_key(&mut server, want(8192, Duration::from_millis(200))).await;
        assert_eq!(got, Err(FallbackReason::Timeout));
        assert_eq!(server.bytes(), &hello[..40]);
        drop(client);
    }

    #[tokio::test]
    async fn end_of_stream_and_other_bytes_fall_back() {
        let hello = client_hello("eof.example");
        let (mut client, mut server) = pair().await;
        client.write_all(&hello[..20]).await.unwrap();
        drop(client);
        let got = read_sni_key(&mut server, want(8192, Duration::from_secs(5))).await;
        assert_eq!(got, Err(FallbackReason::Closed));
        assert_eq!(server.bytes(), &hello[..20]);

        // Refused from the first byte: nothing more is waited for.
        let (mut client, mut server) = pair().await;
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let got = read_sni_key(&mut server, want(8192, Duration::from_secs(3600))).await;
        assert_eq!(got, Err(FallbackReason::NotTls));
        assert!(b"GET / HTTP/1.1\r\n".starts_with(server.bytes()));
        drop(client);
    }
}
