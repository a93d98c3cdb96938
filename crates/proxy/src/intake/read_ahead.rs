//! A client stream and the bytes already read from it: the one shape the
//! intake's read-ahead has, from the PROXY header to the replay.
//!
//! Before a backend is chosen, magpie may have to read some of what the
//! client sends: a PROXY header (taken off the front and consumed), the first
//! bytes of an untrusted peer (checked for a PROXY signature), a request head
//! (scanned for a header key). Whatever was read and not consumed belongs to
//! the client's stream and is replayed first, unchanged: to the backend in
//! mode tcp, to the HTTP parser in mode http. Reading is always *reading*
//! into a bounded buffer, never a peek (tokio's `peek` does not consume
//! readiness and can spin).

use std::io;

use bytes::BufMut;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The smallest step the buffer grows by when it is full.
const MIN_GROWTH: usize = 4096;

/// A stream with the bytes read from it that nothing has consumed yet.
#[derive(Debug)]
pub(crate) struct ReadAhead {
    stream: TcpStream,
    /// The bytes read ahead, in order; empty until something reads.
    ahead: Vec<u8>,
}

impl ReadAhead {
    pub(crate) fn new(stream: TcpStream) -> ReadAhead {
        ReadAhead {
            stream,
            ahead: Vec::new(),
        }
    }

    /// The bytes read so far and not consumed.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.ahead
    }

    /// Reads once more from the stream, keeping at most `limit` bytes ahead
    /// in all (the buffer grows by doubling, but never past `limit`).
    /// `Ok(0)` when the peer closed its side, or when `limit` bytes are
    /// already held.
    pub(crate) async fn read_more(&mut self, limit: usize) -> io::Result<usize> {
        let room = limit.saturating_sub(self.ahead.len());
        if room == 0 {
            return Ok(0);
        }
        if self.ahead.len() == self.ahead.capacity() {
            let grow = self.ahead.len().max(MIN_GROWTH).min(room);
            self.ahead.reserve_exact(grow);
        }
        // Into the spare capacity as it is: no zeroing per read.
        let mut window = (&mut self.ahead).limit(room);
        self.stream.read_buf(&mut window).await
    }

    /// Drops the first `n` bytes read (a PROXY header, once parsed).
    pub(crate) fn consume(&mut self, n: usize) {
        self.ahead.drain(..n.min(self.ahead.len()));
    }

    pub(crate) fn stream(&self) -> &TcpStream {
        &self.stream
    }

    pub(crate) fn stream_mut(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    /// Takes the bytes read ahead, to be replayed; the buffer is left empty
    /// and unallocated.
    pub(crate) fn take_bytes(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.ahead)
    }

    /// The stream, and the bytes to replay before anything else it carries.
    pub(crate) fn into_parts(self) -> (TcpStream, Vec<u8>) {
        (self.stream, self.ahead)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    async fn pair() -> (TcpStream, ReadAhead) {
        let (client, accepted) = crate::net::loopback_pair().await;
        (client, ReadAhead::new(accepted))
    }

    #[tokio::test]
    async fn reads_up_to_the_limit_consumes_and_replays() {
        let (mut client, mut ahead) = pair().await;
        client.write_all(b"PROXY hello world").await.unwrap();
        let mut got = 0;
        while got < 11 {
            got += ahead.read_more(11).await.unwrap();
        }
        assert_eq!(ahead.bytes(), b"PROXY hello");
        // At the limit nothing more is read.
        assert_eq!(ahead.read_more(11).await.unwrap(), 0);
        ahead.consume(6);
        assert_eq!(ahead.bytes(), b"hello");
        while ahead.bytes().len() < 11 {
            ahead.read_more(64).await.unwrap();
        }
        assert_eq!(ahead.bytes(), b"hello world");
        drop(client);
        assert_eq!(ahead.read_more(64).await.unwrap(), 0, "EOF");
        let (_, replay) = ahead.into_parts();
        assert_eq!(replay, b"hello world");
    }

    #[tokio::test]
    async fn the_buffer_grows_only_as_far_as_needed() {
        let (mut client, mut ahead) = pair().await;
        let sent = vec![7u8; 100_000];
        let writer = tokio::spawn(async move {
            client.write_all(&sent).await.unwrap();
            client
        });
        while ahead.bytes().len() < 100_000 {
            assert!(ahead.read_more(1 << 20).await.unwrap() > 0);
        }
        assert!(ahead.bytes().iter().all(|&b| b == 7));
        let capacity = ahead.take_bytes().capacity();
        assert!(capacity < 2 * 100_000 + MIN_GROWTH, "capacity {capacity}");
        assert!(ahead.bytes().is_empty());
        drop(writer.await.unwrap());
    }
}
