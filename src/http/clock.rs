//! Deadlines on an HTTP/1 client connection: a request head must arrive
//! within `key.read_timeout` of its first byte (else `408`), and a keep-alive
//! connection may idle between requests for `idle_timeout`.
//!
//! hyper's own `header_read_timeout` starts counting as soon as it waits for
//! a head, idle keep-alive time included, and closes without an answer; a
//! 200 ms head deadline would then cut every pooled client connection after
//! 200 ms of quiet. So the connection's socket is wrapped ([`Timed`]) and the
//! request's phase is kept in a [`Clock`] the wrapper and the request handler
//! share:
//!
//! * `Idle`: between requests; the idle deadline runs from the end of the
//!   last response;
//! * `Head`: the first byte of a head arrived; the head deadline runs from it;
//! * `Serving`: the handler has the request; no deadline here (the response
//!   may stream for minutes).
//!
//! A deadline that passes while hyper waits to read ends the read with EOF;
//! for a head, the wrapper first writes a `408` itself. HTTP/2 connections
//! (prior knowledge) multiplex requests and keep their own pings, so the
//! wrapper stands aside once it sees the HTTP/2 preface.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::read_ahead::ReadAhead;

/// The answer to a head that did not arrive in time.
const TIMEOUT_408: &[u8] = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\ncontent-length: 40\r\nconnection: close\r\n\r\nthe request head did not arrive in time\n";
/// What every HTTP/2 connection starts with.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n";

const IDLE: u64 = 0;
const HEAD: u64 = 1;
const SERVING: u64 = 2;

/// The phase of a connection's current request, shared by its socket wrapper
/// and its request handler. Packed in one atomic: phase in the low 2 bits,
/// milliseconds since `epoch` when the phase began above them.
#[derive(Debug)]
pub struct Clock {
    epoch: Instant,
    state: AtomicU64,
    /// A head deadline passed and a 408 was sent.
    pub timed_out: AtomicBool,
}

impl Clock {
    pub fn new() -> Arc<Clock> {
        Arc::new(Clock {
            epoch: Instant::now(),
            state: AtomicU64::new(IDLE),
            timed_out: AtomicBool::new(false),
        })
    }

    fn set(&self, phase: u64) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.state.store(ms << 2 | phase, Ordering::Relaxed);
    }

    fn get(&self) -> (u64, Instant) {
        let s = self.state.load(Ordering::Relaxed);
        (s & 3, self.epoch + Duration::from_millis(s >> 2))
    }

    /// The handler has a complete head.
    pub fn serving(&self) {
        self.set(SERVING);
    }

    /// The response is done (or abandoned): the connection idles.
    pub fn idle(&self) {
        self.set(IDLE);
    }
}

/// A client socket with the head and idle deadlines of its [`Clock`]. The
/// socket is shared, so that after hyper is done with it the connection can
/// still be closed gently ([`linger`]).
pub struct Timed {
    stream: Arc<TcpStream>,
    clock: Arc<Clock>,
    head_timeout: Duration,
    idle_timeout: Duration,
    sleep: Pin<Box<Sleep>>,
    /// The deadline `sleep` is set to, if any.
    armed: Option<Instant>,
    /// Nothing read yet (the HTTP/2 preface check is pending).
    first_read: bool,
    /// Client bytes read before hyper took over (what came with a PROXY
    /// header); handed out before anything else.
    pending: Vec<u8>,
    /// HTTP/2: no deadlines here.
    h2: bool,
}

impl Timed {
    /// The client's stream with the deadlines of `clock`; the bytes already
    /// read from it (what came with a PROXY header) are handed out first.
    pub fn new(
        stream: ReadAhead,
        clock: Arc<Clock>,
        head_timeout: Duration,
        idle_timeout: Duration,
    ) -> Timed {
        let (stream, pending) = stream.into_parts();
        Timed {
            stream: Arc::new(stream),
            clock,
            head_timeout,
            idle_timeout,
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            armed: None,
            first_read: true,
            pending,
            h2: false,
        }
    }

    /// The socket, for closing the connection after hyper is done with it.
    pub fn socket(&self) -> Arc<TcpStream> {
        Arc::clone(&self.stream)
    }

    /// Whether the current deadline passed; arms the timer otherwise.
    fn deadline_passed(&mut self, cx: &mut Context<'_>) -> Option<u64> {
        if self.h2 {
            return None;
        }
        let (phase, since) = self.clock.get();
        let deadline = match phase {
            IDLE => since + self.idle_timeout,
            HEAD => since + self.head_timeout,
            _ => return None,
        };
        if self.armed != Some(deadline) {
            self.sleep.as_mut().reset(deadline);
            self.armed = Some(deadline);
        }
        self.sleep.as_mut().poll(cx).is_ready().then_some(phase)
    }
}

impl AsyncRead for Timed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.deadline_passed(cx) {
            Some(HEAD) => {
                // Best effort: the socket's send buffer is empty between
                // requests, so this short answer fits at once.
                if let Err(e) = this.stream.try_write(TIMEOUT_408) {
                    tracing::debug!(error = %e, "cannot send 408");
                }
                this.clock.timed_out.store(true, Ordering::Relaxed);
                return Poll::Ready(Ok(()));
            }
            Some(_) => return Poll::Ready(Ok(())),
            None => {}
        }
        let before = buf.filled().len();
        let polled = if !this.pending.is_empty() {
            let n = this.pending.len().min(buf.remaining());
            buf.put_slice(&this.pending[..n]);
            this.pending.drain(..n);
            Poll::Ready(Ok(()))
        } else {
            loop {
                if let Err(e) = std::task::ready!(this.stream.poll_read_ready(cx)) {
                    return Poll::Ready(Err(e));
                }
                // Into the unfilled part as it is: no zeroing per read.
                match this.stream.try_read_buf(buf) {
                    Ok(_) => break Poll::Ready(Ok(())),
                    // Readiness was stale; the next poll waits for fresh news.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
        };
        let got = &buf.filled()[before..];
        if !got.is_empty() {
            if this.first_read {
                this.first_read = false;
                let n = got.len().min(H2_PREFACE.len());
                this.h2 = got[..n] == H2_PREFACE[..n];
            }
            if this.clock.get().0 == IDLE {
                this.clock.set(HEAD);
            }
        }
        polled
    }
}

impl AsyncWrite for Timed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            std::task::ready!(self.stream.poll_write_ready(cx))?;
            match self.stream.try_write(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                done => return Poll::Ready(done),
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            std::task::ready!(self.stream.poll_write_ready(cx))?;
            match self.stream.try_write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                done => return Poll::Ready(done),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Writes go straight to the socket.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(socket2::SockRef::from(&*self.stream).shutdown(std::net::Shutdown::Write))
    }
}

/// How long, and how much, a connection that ended with an error may still
/// be read (and discarded) before it is closed.
const LINGER_TIME: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 64 << 20;

/// Closes a client connection gently after an error answer (`400`, `431`,
/// `408`): stop writing, then read and discard what the client is still
/// sending, until it closes or a short limit passes. Closing a socket with
/// unread input sends a reset, and a reset can destroy the answer before the
/// client reads it (nginx's "lingering close" does the same).
pub async fn linger(stream: &TcpStream) {
    if let Err(e) = socket2::SockRef::from(stream).shutdown(std::net::Shutdown::Write) {
        tracing::debug!(error = %e, "cannot shut down the client's write side");
        return;
    }
    let mut sink = [0u8; 16 * 1024];
    let mut read = 0;
    let drain = async {
        while read < LINGER_BYTES {
            if stream.readable().await.is_err() {
                return;
            }
            match stream.try_read(&mut sink) {
                Ok(0) => return,
                Ok(n) => read += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(_) => return,
            }
        }
    };
    if tokio::time::timeout(LINGER_TIME, drain).await.is_err() {
        tracing::debug!("client still sending after the linger time; closing");
    }
}
