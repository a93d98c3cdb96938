//! Copying one connection's bytes both ways until both sides are done.
//!
//! Two buffers per connection, one per direction, with no allocation per
//! read. Half-close is honoured: one side's EOF shuts down the other side's
//! write half while the other direction keeps flowing. Activity in either
//! direction resets the idle timer. The copy ends early when the connection
//! idles out, when the shutdown grace is over, or when its backend was removed
//! and its `drain_timeout` passed.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{Backend, Side};
use crate::proxy_protocol::{self, Signature};

/// Size of each direction's copy buffer (HAProxy's default `bufsize` too).
pub const COPY_BUFFER: usize = 16 * 1024;

/// How a copy ended.
#[derive(Debug)]
pub enum End {
    Done,
    Idle,
    /// The shutdown grace is over while bytes could still flow.
    Stopped,
    Drained,
    /// An untrusted peer started with a PROXY signature.
    Refused,
    /// One side's socket failed (typically a reset): the other side must see
    /// an abort too, not a clean end.
    Aborted(Side, io::Error),
}

/// The client's bytes read before the copy started (a header key's request
/// head, say): `buf[..filled]` is sent to the backend first, and `buf` then
/// serves as the client-to-backend copy buffer, cut back to [`COPY_BUFFER`]
/// if a long head grew it.
pub struct Pending<'a> {
    pub buf: &'a mut Vec<u8>,
    pub filled: usize,
}

/// The rules of one copy.
pub struct Transfer<'a> {
    /// Counts the bytes; its `closing` token ends the copy (drain timeout).
    pub backend: &'a Backend,
    pub idle_timeout: Duration,
    /// The shutdown grace is over.
    pub stop: &'a CancellationToken,
    /// The client must not begin with a PROXY signature (PROXY input is on
    /// and this peer is not trusted).
    pub check_signature: bool,
}

/// Copies `client` ⇄ `upstream` until both directions end, or the transfer's
/// rules end it.
pub async fn copy_both_ways(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    pending: Pending<'_>,
    transfer: Transfer<'_>,
) -> End {
    let started = Instant::now();
    let last_activity = AtomicU64::new(0);
    let touch = || last_activity.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
    let mut down_buf = vec![0u8; COPY_BUFFER];

    let (mut client_r, mut client_w) = client.split();
    let (mut up_r, mut up_w) = upstream.split();
    let live = &transfer.backend.live;
    let up = pipe(
        Direction {
            from: (&mut client_r, Side::Client),
            to: (&mut up_w, Side::Backend),
        },
        pending,
        transfer.check_signature,
        |n| {
            live.add_bytes_sent(n);
            touch();
        },
    );
    let down = pipe(
        Direction {
            from: (&mut up_r, Side::Backend),
            to: (&mut client_w, Side::Client),
        },
        Pending {
            buf: &mut down_buf,
            filled: 0,
        },
        false,
        |n| {
            live.add_bytes_received(n);
            touch();
        },
    );
    let idle = transfer.idle_timeout;
    let idle_watch = async {
        loop {
            let last = started + Duration::from_millis(last_activity.load(Ordering::Relaxed));
            if Instant::now() >= last + idle {
                return;
            }
            tokio::time::sleep_until(last + idle).await;
        }
    };
    let closing = live.closing();
    tokio::select! {
        result = async { tokio::try_join!(up, down) } => match result {
            Ok(_) => End::Done,
            Err(PipeError::Refused) => End::Refused,
            Err(PipeError::Io(side, e)) => End::Aborted(side, e),
        },
        _ = idle_watch => End::Idle,
        _ = transfer.stop.cancelled() => End::Stopped,
        _ = closing.cancelled() => End::Drained,
    }
}

#[derive(Debug)]
enum PipeError {
    Refused,
    /// Reading from or writing to this side failed.
    Io(Side, io::Error),
}

/// One direction: bytes read from `from` are written to `to`.
struct Direction<'a, R, W> {
    from: (&'a mut R, Side),
    to: (&'a mut W, Side),
}

/// Copies `from` into `to` until EOF, then shuts down `to`'s write half.
/// The pending bytes are sent first. With `check_signature`, the stream must
/// not begin with a PROXY signature.
async fn pipe<R, W>(
    direction: Direction<'_, R, W>,
    pending: Pending<'_>,
    mut check_signature: bool,
    mut on_bytes: impl FnMut(u64),
) -> Result<(), PipeError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let Direction {
        from: (from, from_side),
        to: (to, to_side),
    } = direction;
    let read_failed = |e| PipeError::Io(from_side, e);
    let write_failed = |e| PipeError::Io(to_side, e);
    let Pending { buf, mut filled } = pending;
    loop {
        while check_signature {
            match proxy_protocol::signature(&buf[..filled]) {
                Signature::Yes => return Err(PipeError::Refused),
                Signature::No => check_signature = false,
                Signature::Maybe => {
                    match from.read(&mut buf[filled..]).await.map_err(read_failed)? {
                        0 => check_signature = false,
                        n => filled += n,
                    }
                }
            }
        }
        if filled > 0 {
            to.write_all(&buf[..filled]).await.map_err(write_failed)?;
            on_bytes(filled as u64);
            if buf.len() > COPY_BUFFER {
                // A long head is replayed: give its memory back.
                buf.truncate(COPY_BUFFER);
                buf.shrink_to_fit();
            }
        }
        filled = from.read(buf).await.map_err(read_failed)?;
        if filled == 0 {
            to.shutdown().await.map_err(write_failed)?;
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both<'a, R, W>(from: &'a mut R, to: &'a mut W) -> Direction<'a, R, W> {
        Direction {
            from: (from, Side::Client),
            to: (to, Side::Backend),
        }
    }

    #[tokio::test]
    async fn pipe_replays_then_copies_then_shuts_down() {
        let (mut a, mut a_peer) = tokio::io::duplex(64);
        let (mut b_peer, mut b) = tokio::io::duplex(64);
        let mut buf = vec![0u8; 16];
        buf[..3].copy_from_slice(b"pre");
        a_peer.write_all(b"-rest").await.unwrap();
        drop(a_peer);
        let mut total = 0;
        let pending = Pending {
            buf: &mut buf,
            filled: 3,
        };
        pipe(both(&mut a, &mut b_peer), pending, true, |n| total += n)
            .await
            .unwrap();
        let mut out = Vec::new();
        b.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, b"pre-rest");
        assert_eq!(total, 8);
    }

    /// A head that grew the buffer to 1 MiB gives that memory back once it
    /// is replayed: the connection keeps a COPY_BUFFER for the rest of its life.
    #[tokio::test]
    async fn a_grown_buffer_shrinks_after_its_replay() {
        let (mut a, mut a_peer) = tokio::io::duplex(64);
        let (mut b_peer, mut b) = tokio::io::duplex(2 << 20);
        let mut buf = vec![b'h'; 1 << 20];
        a_peer.write_all(b"tail").await.unwrap();
        drop(a_peer);
        let pending = Pending {
            buf: &mut buf,
            filled: 1 << 20,
        };
        pipe(both(&mut a, &mut b_peer), pending, false, |_| {})
            .await
            .unwrap();
        assert_eq!(buf.len(), COPY_BUFFER);
        assert!(
            buf.capacity() < 2 * COPY_BUFFER,
            "capacity {}",
            buf.capacity()
        );
        let mut out = Vec::new();
        b.read_to_end(&mut out).await.unwrap();
        assert_eq!(out.len(), (1 << 20) + 4);
    }

    #[tokio::test]
    async fn pipe_refuses_a_proxy_signature_split_across_reads() {
        let (mut a, mut a_peer) = tokio::io::duplex(64);
        let (mut b_peer, _b) = tokio::io::duplex(64);
        let mut buf = vec![0u8; 64];
        a_peer.write_all(b"PRO").await.unwrap();
        let writer = tokio::spawn(async move {
            tokio::task::yield_now().await;
            a_peer
                .write_all(b"XY TCP4 1.2.3.4 5.6.7.8 1 2\r\n")
                .await
                .unwrap();
            a_peer
        });
        let pending = Pending {
            buf: &mut buf,
            filled: 0,
        };
        let got = pipe(both(&mut a, &mut b_peer), pending, true, |_| {}).await;
        assert!(matches!(got, Err(PipeError::Refused)), "{got:?}");
        drop(writer.await.unwrap());
    }
}
