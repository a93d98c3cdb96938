//! Copying one connection's bytes both ways until both sides are done.
//!
//! Each direction waits for its socket to become readable holding no
//! buffer; only then does it take a 16 KiB buffer from a shared pool, read
//! and write until the socket has nothing more, and give the buffer back. An
//! idle connection holds no copy buffer at all, however long it stays open;
//! a streaming one holds one per busy direction. The bytes a header key read
//! before the copy started are sent first and then freed.
//!
//! Half-close is honoured: one side's EOF shuts down the other side's write
//! half while the other direction keeps flowing. Activity in either direction
//! resets the idle timer. The copy ends early when the connection idles out,
//! when the shutdown grace is over, or when its backend was removed and its
//! `drain_timeout` passed. A failed read or write is an abort by that side.

use std::io;
use std::net::Shutdown;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use socket2::SockRef;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{Backend, Side};
use crate::proxy_protocol::{self, Signature};

/// Size of a copy buffer (HAProxy's default `bufsize` too).
pub const COPY_BUFFER: usize = 16 * 1024;

/// Buffers kept for reuse; beyond this, returned buffers are freed (4 MiB).
const POOL_MAX: usize = 256;

static POOL: Mutex<Vec<Box<[u8]>>> = Mutex::new(Vec::new());

/// A copy buffer from the pool (or a new one), given back when dropped.
struct PoolBuffer(Option<Box<[u8]>>);

impl PoolBuffer {
    fn take() -> PoolBuffer {
        let reused = POOL.lock().unwrap_or_else(|e| e.into_inner()).pop();
        PoolBuffer(Some(
            reused.unwrap_or_else(|| vec![0u8; COPY_BUFFER].into_boxed_slice()),
        ))
    }

    fn bytes(&mut self) -> &mut [u8] {
        self.0.as_deref_mut().unwrap_or_default()
    }
}

impl Drop for PoolBuffer {
    fn drop(&mut self) {
        if let Some(buf) = self.0.take() {
            let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
            if pool.len() < POOL_MAX {
                pool.push(buf);
            }
        }
    }
}

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
/// head, say): `buf[..filled]` is sent to the backend first; then `buf` is
/// emptied and its memory freed.
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
    let (client, upstream) = (&*client, &*upstream);
    let live = &transfer.backend.live;
    let up = async {
        let mut pending = pending;
        if transfer.check_signature {
            refuse_signature(client, &mut pending).await?;
        }
        let (buf, filled) = (pending.buf, pending.filled);
        if filled > 0 {
            write_all(upstream, &buf[..filled])
                .await
                .map_err(|e| PipeError::Io(Side::Backend, e))?;
            live.add_bytes_sent(filled as u64);
            touch();
        }
        *buf = Vec::new();
        pump((client, Side::Client), (upstream, Side::Backend), |n| {
            live.add_bytes_sent(n);
            touch();
        })
        .await
    };
    let down = pump((upstream, Side::Backend), (client, Side::Client), |n| {
        live.add_bytes_received(n);
        touch();
    });
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

/// Reads the client's first bytes into `pending` until they do or do not
/// start with a PROXY signature.
async fn refuse_signature(client: &TcpStream, pending: &mut Pending<'_>) -> Result<(), PipeError> {
    loop {
        match proxy_protocol::signature(&pending.buf[..pending.filled]) {
            Signature::Yes => return Err(PipeError::Refused),
            Signature::No => return Ok(()),
            Signature::Maybe => {}
        }
        if pending.buf.len() < pending.filled + 64 {
            pending.buf.resize(pending.filled + 64, 0);
        }
        client
            .readable()
            .await
            .map_err(|e| PipeError::Io(Side::Client, e))?;
        match client.try_read(&mut pending.buf[pending.filled..]) {
            Ok(0) => return Ok(()),
            Ok(n) => pending.filled += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(PipeError::Io(Side::Client, e)),
        }
    }
}

/// Copies `from` into `to` until EOF, then shuts down `to`'s write half. A
/// buffer is held only from the moment `from` is readable until it has
/// nothing more to give.
async fn pump(
    (from, from_side): (&TcpStream, Side),
    (to, to_side): (&TcpStream, Side),
    mut on_bytes: impl FnMut(u64),
) -> Result<(), PipeError> {
    loop {
        from.readable()
            .await
            .map_err(|e| PipeError::Io(from_side, e))?;
        let mut buf = PoolBuffer::take();
        loop {
            match from.try_read(buf.bytes()) {
                Ok(0) => {
                    drop(buf);
                    return match SockRef::from(to).shutdown(Shutdown::Write) {
                        // Already gone: the other direction will say so.
                        Ok(()) => Ok(()),
                        Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
                        Err(e) => Err(PipeError::Io(to_side, e)),
                    };
                }
                Ok(n) => {
                    write_all(to, &buf.bytes()[..n])
                        .await
                        .map_err(|e| PipeError::Io(to_side, e))?;
                    on_bytes(n as u64);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(PipeError::Io(from_side, e)),
            }
        }
    }
}

/// Writes all of `data` to `to`, waiting for room as needed.
async fn write_all(to: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        to.writable().await?;
        match to.try_write(data) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A connected pair of loopback sockets.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (a, b) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (a.unwrap(), b.unwrap().0)
    }

    #[tokio::test]
    async fn pump_copies_then_shuts_down_and_keeps_no_buffer() {
        let (mut writer, from) = pair().await;
        let (to, mut reader) = pair().await;
        let data: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let sent = data.clone();
        let feeding = tokio::spawn(async move {
            writer.write_all(&sent).await.unwrap();
            writer.shutdown().await.unwrap();
            writer
        });
        let mut total = 0;
        let (pumped, out) = tokio::join!(
            pump((&from, Side::Client), (&to, Side::Backend), |n| total += n),
            async {
                let mut out = Vec::new();
                reader.read_to_end(&mut out).await.unwrap();
                out
            }
        );
        pumped.unwrap();
        assert_eq!(out, data);
        assert_eq!(total, data.len() as u64);
        drop(feeding.await.unwrap());
    }

    #[tokio::test]
    async fn a_proxy_signature_split_across_reads_is_refused() {
        let (mut peer, client) = pair().await;
        let writer = tokio::spawn(async move {
            peer.write_all(b"PRO").await.unwrap();
            tokio::task::yield_now().await;
            peer.write_all(b"XY TCP4 1.2.3.4 5.6.7.8 1 2\r\n")
                .await
                .unwrap();
            peer
        });
        let mut buf = Vec::new();
        let mut pending = Pending {
            buf: &mut buf,
            filled: 0,
        };
        let got = refuse_signature(&client, &mut pending).await;
        assert!(matches!(got, Err(PipeError::Refused)), "{got:?}");
        drop(writer.await.unwrap());
    }

    #[test]
    fn buffers_go_back_to_the_pool() {
        drop(PoolBuffer::take());
        // Other tests take and give back buffers too: at least this one is there.
        assert!(!POOL.lock().unwrap().is_empty());
        assert_eq!(PoolBuffer::take().bytes().len(), COPY_BUFFER);
    }
}
