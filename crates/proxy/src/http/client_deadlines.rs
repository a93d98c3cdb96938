//! Deadlines on a client connection (`mode: http`): a connection that sends
//! nothing at all is closed after `http.first_byte_timeout`, one that idles
//! between requests after `http.keepalive_timeout`, and a request head must
//! arrive within `key.read_timeout` of its first byte (else `408`). Either
//! close frees the connection's `max_connections` slot. (`idle_timeout` is
//! mode tcp's: `check` says so when it is written in mode http.)
//!
//! hyper's own `header_read_timeout` starts counting as soon as it waits for
//! a head, idle keep-alive time included, and closes without an answer; a
//! 200 ms head deadline would then cut every pooled client connection after
//! 200 ms of quiet. So the connection's socket is wrapped ([`Timed`]) and the
//! request's phase is kept in a [`Clock`] the wrapper and the request handler
//! share:
//!
//! * `Idle`: no request is being served; the deadline runs from the end of
//!   the last response (or from the connection's start, when nothing was
//!   read yet);
//! * `Head`: the first byte of a head arrived; the head deadline runs from it;
//! * `Serving`: the handler has a request ([`Busy`]); no deadline here (the
//!   response may stream for minutes; the backend's deadlines are
//!   [`super::backend_deadlines`]'s).
//!
//! A deadline that passes while hyper waits to read ends the read with EOF;
//! for a head, the wrapper first writes a `408` itself. An HTTP/2 connection
//! (prior knowledge) multiplexes requests, so it has no head deadline: it is
//! `Serving` while any request is, and idle once none is and nothing has
//! been read for `keepalive_timeout`.
//!
//! A response whose body fails half-way (a backend that stalled or failed)
//! marks the clock `cut`: an HTTP/1 connection is then closed with a reset,
//! so the client cannot take what it got for a complete answer.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::telemetry::stats::QuietClose;

/// When a drain begins, an idle client connection waits this long for a
/// request that may be on its way (a connection accepted just before the
/// drain, a keep-alive client's next request) before it is closed; one
/// that comes is answered with `connection: close`. A client that sent it
/// gets an answer, not a close that races its request.
pub(crate) const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(1);

/// The answer to a head that did not arrive in time.
const TIMEOUT_408: &[u8] = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\ncontent-length: 40\r\nconnection: close\r\n\r\nthe request head did not arrive in time\n";
/// What every HTTP/2 connection starts with.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n";

const IDLE: u64 = 0;
const HEAD: u64 = 1;
const SERVING: u64 = 2;

/// The state's layout: phase in the low 2 bits, requests being served in the
/// next 20 (an HTTP/2 connection serves up to hyper's stream limit at
/// once), milliseconds since `epoch` when the phase began above them.
const PHASE_BITS: u32 = 2;
const COUNT_BITS: u32 = 20;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
const MS_SHIFT: u32 = PHASE_BITS + COUNT_BITS;

/// The phase of a connection's requests, shared by its socket wrapper and
/// its request handler. Packed in one atomic, updated by compare-and-swap,
/// so concurrent HTTP/2 requests never leave it idle while one is served.
#[derive(Debug)]
pub(crate) struct Clock {
    epoch: Instant,
    state: AtomicU64,
    /// A head deadline passed and a 408 was sent.
    pub(crate) timed_out: AtomicBool,
    /// The connection was closed for being quiet: 0, or 1 + the
    /// [`QuietClose`]'s index.
    quiet: AtomicU8,
    /// A response was cut half-way: close an HTTP/1 connection with a reset.
    cut: AtomicBool,
    /// The client speaks HTTP/2 (its streams are reset one by one instead).
    h2: AtomicBool,
    /// The socket's reader while a request is served: no deadline is armed
    /// then, so it is woken when the connection idles, to arm one.
    reader: Mutex<Option<Waker>>,
}

impl Clock {
    /// When the connection began (its first byte's deadline runs from here).
    pub(crate) fn started(&self) -> Instant {
        self.epoch
    }

    /// Why the connection was closed for being quiet, if it was.
    pub(crate) fn quiet_close(&self) -> Option<QuietClose> {
        let n = self.quiet.load(Ordering::Relaxed) as usize;
        n.checked_sub(1)
            .and_then(|i| QuietClose::ALL.get(i).copied())
    }

    /// The client speaks HTTP/2.
    pub(crate) fn is_h2(&self) -> bool {
        self.h2.load(Ordering::Relaxed)
    }

    pub(crate) fn new() -> Arc<Clock> {
        Arc::new(Clock {
            epoch: Instant::now(),
            state: AtomicU64::new(IDLE),
            timed_out: AtomicBool::new(false),
            quiet: AtomicU8::new(0),
            cut: AtomicBool::new(false),
            h2: AtomicBool::new(false),
            reader: Mutex::new(None),
        })
    }

    /// Moves to the phase and count `next` makes of the current ones, from
    /// now; `next` returning `None` leaves the state as it is. The phase
    /// moved to, if any.
    fn update(&self, next: impl Fn(u64, u64) -> Option<(u64, u64)>) -> Option<u64> {
        let ms = self.epoch.elapsed().as_millis() as u64;
        let mut current = self.state.load(Ordering::Relaxed);
        loop {
            let (phase, count) = next(current & 3, (current >> PHASE_BITS) & COUNT_MASK)?;
            let new = ms << MS_SHIFT | (count & COUNT_MASK) << PHASE_BITS | phase;
            match self.state.compare_exchange_weak(
                current,
                new,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(phase),
                Err(seen) => current = seen,
            }
        }
    }

    fn get(&self) -> (u64, Instant) {
        let s = self.state.load(Ordering::Relaxed);
        (s & 3, self.epoch + Duration::from_millis(s >> MS_SHIFT))
    }

    /// The handler has a complete head; the request is served until the
    /// guard is dropped (its reply sent, or abandoned).
    pub(crate) fn serving(self: &Arc<Self>) -> Busy {
        self.update(|_, count| Some((SERVING, count + 1)));
        Busy(Arc::clone(self))
    }

    /// Bytes came in: a head begins (HTTP/1), or an idle HTTP/2 connection
    /// starts its idle time again.
    fn read(&self, h2: bool) {
        self.update(|phase, count| {
            (phase == IDLE).then_some((if h2 { IDLE } else { HEAD }, count))
        });
    }

    /// Wakes `waker` when the connection idles (registered before the phase
    /// is looked at again, so an idling in between is not missed).
    fn wake_on_idle(&self, waker: &Waker) {
        let mut reader = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        if !reader.as_ref().is_some_and(|r| r.will_wake(waker)) {
            *reader = Some(waker.clone());
        }
    }

    /// Whether an HTTP/1 connection's response was cut half-way.
    pub(crate) fn was_cut(&self) -> bool {
        self.cut.load(Ordering::Relaxed)
    }
}

/// One request being served on a connection; dropped, and none left, the
/// connection idles from then.
#[derive(Debug)]
pub(crate) struct Busy(Arc<Clock>);

impl Busy {
    /// The response failed half-way: the client must not see a clean end.
    pub(crate) fn cut(&self) {
        if !self.0.h2.load(Ordering::Relaxed) {
            self.0.cut.store(true, Ordering::Relaxed);
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let now = self.0.update(|_, count| {
            let left = count.saturating_sub(1);
            Some((if left == 0 { IDLE } else { SERVING }, left))
        });
        if now == Some(IDLE) {
            let reader = self
                .0
                .reader
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            if let Some(reader) = reader {
                reader.wake();
            }
        }
    }
}

/// How long a client connection may take, phase by phase.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadlines {
    /// From a head's first byte to its end (`key.read_timeout`).
    pub(crate) head: Duration,
    /// From the connection's start while it has sent nothing.
    pub(crate) first_byte: Duration,
    /// From the end of a response while no other is served.
    pub(crate) keepalive: Duration,
}

/// A client stream with the deadlines of its [`Clock`]: the socket itself
/// ([`ClientSocket`](super::socket::ClientSocket)), or TLS over it.
pub(crate) struct Timed<S> {
    inner: S,
    clock: Arc<Clock>,
    deadlines: Deadlines,
    sleep: Pin<Box<Sleep>>,
    /// The deadline `sleep` is set to, if any.
    armed: Option<Instant>,
    /// Nothing read yet (the HTTP/2 preface check is pending).
    first_read: bool,
    /// HTTP/2: no head deadline.
    h2: bool,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Timed<S> {
    /// `inner` with the deadlines of `clock`.
    pub(crate) fn new(inner: S, clock: Arc<Clock>, deadlines: Deadlines) -> Timed<S> {
        Timed {
            inner,
            clock,
            deadlines,
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            armed: None,
            first_read: true,
            h2: false,
        }
    }

    /// Whether the current deadline passed; arms the timer otherwise.
    fn deadline_passed(&mut self, cx: &mut Context<'_>) -> Option<u64> {
        let (mut phase, mut since) = self.clock.get();
        if phase == SERVING {
            self.clock.wake_on_idle(cx.waker());
            (phase, since) = self.clock.get();
        }
        let deadline = match phase {
            IDLE if self.first_read => since + self.deadlines.first_byte,
            IDLE => since + self.deadlines.keepalive,
            HEAD if !self.h2 => since + self.deadlines.head,
            _ => return None,
        };
        if self.armed != Some(deadline) {
            self.sleep.as_mut().reset(deadline);
            self.armed = Some(deadline);
        }
        self.sleep.as_mut().poll(cx).is_ready().then_some(phase)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Timed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.deadline_passed(cx) {
            Some(HEAD) => {
                // Best effort: the send buffer is empty between requests,
                // so this short answer fits at once.
                let inner = Pin::new(&mut this.inner);
                if let Poll::Ready(Err(e)) = inner.poll_write(cx, TIMEOUT_408) {
                    tracing::debug!(error = %e, "cannot send 408");
                }
                if let Poll::Ready(Err(e)) = Pin::new(&mut this.inner).poll_flush(cx) {
                    tracing::debug!(error = %e, "cannot send 408");
                }
                this.clock.timed_out.store(true, Ordering::Relaxed);
                return Poll::Ready(Ok(()));
            }
            Some(_) => {
                // Idle: nothing at all yet, or nothing since the last answer.
                let why = match this.first_read {
                    true => QuietClose::FirstByte,
                    false => QuietClose::Keepalive,
                };
                this.clock
                    .quiet
                    .store(why.index() as u8 + 1, Ordering::Relaxed);
                return Poll::Ready(Ok(()));
            }
            None => {}
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        let got = &buf.filled()[before..];
        if !got.is_empty() {
            if this.first_read {
                this.first_read = false;
                let n = got.len().min(H2_PREFACE.len());
                this.h2 = got[..n] == H2_PREFACE[..n];
                this.clock.h2.store(this.h2, Ordering::Relaxed);
            }
            this.clock.read(this.h2);
        }
        polled
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Timed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// How long, and how much, a connection that ended with an error may still
/// be read (and discarded) before it is closed.
const LINGER_TIME: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 64 << 20;
const LINGER_BUFFER: usize = 16 << 10;

/// Closes a client connection gently after an error answer (`400`, `431`,
/// `408`): stop writing, then read and discard what the client is still
/// sending, until it closes or a short limit passes. Closing a socket with
/// unread input sends a reset, and a reset can destroy the answer before the
/// client reads it (nginx's "lingering close" does the same).
pub(crate) async fn linger(stream: &TcpStream) {
    if let Err(e) = socket2::SockRef::from(stream).shutdown(std::net::Shutdown::Write) {
        tracing::debug!(error = %e, "cannot shut down the client's write side");
        return;
    }
    // On the heap, and only here: an array in this future would be part of
    // every connection's task, lingering or not.
    let mut sink = vec![0u8; LINGER_BUFFER];
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

#[cfg(test)]
mod tests {
    use super::*;

    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_connection_idles_when_its_last_request_ends() {
        let clock = Clock::new();
        assert_eq!(clock.get().0, IDLE);
        clock.read(false);
        assert_eq!(clock.get().0, HEAD);
        // Two HTTP/2 streams at once: idle only once both ended.
        let a = clock.serving();
        let b = clock.serving();
        drop(a);
        assert_eq!(clock.get().0, SERVING);
        let woken = Arc::new(Count(0.into()));
        clock.wake_on_idle(&Waker::from(Arc::clone(&woken)));
        drop(b);
        assert_eq!(clock.get().0, IDLE);
        assert_eq!(
            woken.0.load(Ordering::SeqCst),
            1,
            "the reader is woken to arm its deadline"
        );
        // HTTP/2 reads while idle restart the idle time; they begin no head.
        clock.read(true);
        assert_eq!(clock.get().0, IDLE);
    }

    #[test]
    fn only_an_http1_response_is_cut_with_a_reset() {
        let clock = Clock::new();
        let busy = clock.serving();
        busy.cut();
        assert!(clock.was_cut());
        let clock = Clock::new();
        clock.h2.store(true, Ordering::Relaxed);
        clock.serving().cut();
        assert!(!clock.was_cut());
    }
}
