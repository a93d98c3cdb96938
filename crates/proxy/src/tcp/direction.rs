//! One direction of a copy: read from one socket, write what was read to the
//! other, until EOF, which is passed on as a write shutdown.
//!
//! A direction holds memory only while bytes are in flight: it waits for its
//! source to become readable holding nothing, then takes a 16 KiB buffer
//! from a shared pool (or, on the splice path, a pipe from the pipe pool),
//! moves bytes until the source has no more, and gives it back. The bytes a
//! header key read before the copy began are sent first, then freed.
//!
//! Every `Pending` a direction returns comes from tokio after a read or write
//! said `WouldBlock` (or after a short read, which proves the socket drained),
//! so the task is registered for exactly the event it waits for: no wakeup
//! can be lost. `copy::tests` run hundreds of rounds against full socket
//! buffers to hold this.

use std::io;
use std::net::Shutdown;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, ready};

use socket2::SockRef;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::tcp::{ReadHalf, WriteHalf};

use super::pipe::{Fill, PooledPipe};
use crate::config::CopyMode;
use crate::config::SPLICE_AFTER;
use crate::intake::proxy_protocol::{self, Signature};
use crate::routing::backend::Side;

/// Size of a copy buffer (HAProxy's default `bufsize` too).
pub(crate) const COPY_BUFFER: usize = 16 * 1024;

/// Buffers kept for reuse; beyond this, returned buffers are freed (4 MiB).
const POOL_MAX: usize = 256;

static POOL: Mutex<Vec<Box<[u8]>>> = Mutex::new(Vec::new());

/// A copy buffer from the pool (or a new one), given back when dropped.
pub(super) struct PoolBuffer(Option<Box<[u8]>>);

impl PoolBuffer {
    pub(super) fn take() -> PoolBuffer {
        let reused = POOL.lock().unwrap_or_else(|e| e.into_inner()).pop();
        PoolBuffer(Some(
            reused.unwrap_or_else(|| vec![0u8; COPY_BUFFER].into_boxed_slice()),
        ))
    }

    pub(super) fn bytes(&mut self) -> &mut [u8] {
        self.0.as_deref_mut().unwrap_or_default()
    }

    #[cfg(test)]
    pub(super) fn pooled() -> usize {
        POOL.lock().unwrap_or_else(|e| e.into_inner()).len()
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

/// Why a direction stopped early.
#[derive(Debug)]
pub(super) enum PipeError {
    /// An untrusted client began with a PROXY signature.
    Refused,
    /// Reading from or writing to this side failed.
    Io(Side, io::Error),
}

/// The bytes a direction holds between a read and the write that passes
/// them on.
enum Held {
    /// Nothing in flight: an idle direction holds no memory.
    Nothing,
    /// A copy buffer from the pool; `[start..end]` not yet written.
    Buffer(PoolBuffer),
    /// The client's first bytes, then read into while a PROXY signature is
    /// checked; freed once sent.
    Head(Vec<u8>),
    /// A pipe from the pipe pool (splice path); its bytes not yet written.
    Pipe(PooledPipe),
}

impl Held {
    /// A buffer's or a head's bytes; nothing for a pipe (its bytes are in
    /// the kernel).
    fn bytes(&mut self) -> &mut [u8] {
        match self {
            Held::Buffer(buf) => buf.bytes(),
            Held::Head(head) => head,
            Held::Nothing | Held::Pipe(_) => &mut [],
        }
    }
}

pub(super) struct Direction {
    /// The side read from, the side written to.
    sides: (Side, Side),
    held: Held,
    /// For a buffer or head, `[start..end]` is read and not yet written.
    start: usize,
    end: usize,
    /// EOF passed on: this direction is over.
    pub(super) done: bool,
    /// The client must not begin with a PROXY signature (up direction only).
    pub(super) check_signature: bool,
    copy: CopyMode,
    /// No pipe could be had: stay buffered.
    no_pipe: bool,
    /// Bytes written so far, and the part not yet added to the counters.
    pub(super) moved: u64,
    uncounted: u64,
}

impl Direction {
    /// `head` is sent first (the client's bytes read before the copy).
    pub(super) fn new(sides: (Side, Side), copy: CopyMode, head: Vec<u8>) -> Direction {
        let end = head.len();
        let held = if end > 0 {
            Held::Head(head)
        } else {
            Held::Nothing
        };
        Direction {
            sides,
            held,
            start: 0,
            end,
            done: false,
            check_signature: false,
            copy,
            no_pipe: false,
            moved: 0,
            uncounted: 0,
        }
    }

    /// Bytes written since the last call.
    pub(super) fn take_counted(&mut self) -> u64 {
        std::mem::take(&mut self.uncounted)
    }

    fn wrote(&mut self, n: usize) {
        self.moved += n as u64;
        self.uncounted += n as u64;
    }

    /// Whether the next read goes through a pipe.
    fn splicing(&self) -> bool {
        !self.no_pipe
            && match self.copy {
                CopyMode::Buffered => false,
                CopyMode::Splice => true,
                CopyMode::Auto => self.moved >= SPLICE_AFTER,
            }
    }

    /// Moves bytes until EOF (`Ready(Ok)`), a failure, or both sockets would
    /// block. `other_done`: the opposite direction is over, so the sockets
    /// close right after this one's EOF and need no shutdown first.
    pub(super) fn poll(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut ReadHalf<'_>,
        to: &mut WriteHalf<'_>,
        other_done: bool,
    ) -> Poll<Result<(), PipeError>> {
        let from_side = self.sides.0;
        loop {
            if self.done {
                return Poll::Ready(Ok(()));
            }
            if self.check_signature {
                ready!(self.poll_signature(cx, from))?;
                continue;
            }
            // 1. Write what is held.
            if ready!(self.poll_write_held(cx, to))? {
                continue;
            }
            // 2. All written: a head is freed; wait for the source holding
            // nothing (a buffer goes back to its pool, a pipe to its own).
            if matches!(self.held, Held::Head(_)) {
                self.held = Held::Nothing;
            }
            match from.as_ref().poll_read_ready(cx) {
                Poll::Pending => {
                    self.held = Held::Nothing;
                    return Poll::Pending;
                }
                Poll::Ready(result) => result.map_err(|e| PipeError::Io(from_side, e))?,
            }
            // 3. Read.
            let eof = if self.splicing() {
                match self.read_into_pipe(from)? {
                    Some(eof) => eof,
                    None => continue,
                }
            } else {
                ready!(self.poll_read_into_buffer(cx, from))?
            };
            if eof {
                return Poll::Ready(self.pass_eof(to, other_done));
            }
        }
    }

    /// Writes some of what is held: `Ready(Ok(true))` when there was
    /// something to write (the caller goes round again), `Ready(Ok(false))`
    /// when nothing is held.
    fn poll_write_held(
        &mut self,
        cx: &mut Context<'_>,
        to: &mut WriteHalf<'_>,
    ) -> Poll<Result<bool, PipeError>> {
        let to_side = self.sides.1;
        let to_err = |e| PipeError::Io(to_side, e);
        match &mut self.held {
            Held::Buffer(_) | Held::Head(_) if self.start < self.end => {
                let bytes = &self.held.bytes()[self.start..self.end];
                let n = ready!(Pin::new(&mut *to).poll_write(cx, bytes)).map_err(to_err)?;
                if n == 0 {
                    return Poll::Ready(Err(to_err(io::ErrorKind::WriteZero.into())));
                }
                self.start += n;
                self.wrote(n);
            }
            Held::Pipe(pipe) if !pipe.is_empty() => {
                let socket = to.as_ref();
                ready!(socket.poll_write_ready(cx)).map_err(to_err)?;
                match socket.try_io(Interest::WRITABLE, || pipe.drain_into(socket)) {
                    Ok(n) => self.wrote(n),
                    // Readiness was stale: the next round waits for news.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Poll::Ready(Err(to_err(e))),
                }
            }
            _ => return Poll::Ready(Ok(false)),
        }
        Poll::Ready(Ok(true))
    }

    /// Moves what the readable source has into a pipe (taken from the pool
    /// if none is held): `Some(true)` at EOF, `Some(false)` otherwise, `None`
    /// when no pipe could be had (the direction stays buffered from now on).
    fn read_into_pipe(&mut self, from: &mut ReadHalf<'_>) -> Result<Option<bool>, PipeError> {
        if !matches!(self.held, Held::Pipe(_)) {
            match PooledPipe::take() {
                Ok(pipe) => self.held = Held::Pipe(pipe),
                Err(_) => {
                    // Out of descriptors (or not Linux): buffers work too.
                    self.no_pipe = true;
                    return Ok(None);
                }
            }
        }
        let Held::Pipe(pipe) = &mut self.held else {
            return Ok(None);
        };
        let socket = from.as_ref();
        let capacity = pipe.capacity();
        match socket.try_io(Interest::READABLE, || pipe.fill_from(socket, capacity)) {
            Ok(Fill::Moved(_)) | Ok(Fill::Full) => Ok(Some(false)),
            Ok(Fill::Eof) => Ok(Some(true)),
            // The pipe was empty: the socket is dry, and its readiness is
            // cleared; the next poll waits.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Some(false)),
            Err(e) => Err(PipeError::Io(self.sides.0, e)),
        }
    }

    /// Reads what the readable source has into a pooled buffer (taken if
    /// none is held): `Ready(true)` at EOF. A buffer met with nothing to
    /// read goes back to its pool.
    fn poll_read_into_buffer(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut ReadHalf<'_>,
    ) -> Poll<Result<bool, PipeError>> {
        if !matches!(self.held, Held::Buffer(_)) {
            self.held = Held::Buffer(PoolBuffer::take());
        }
        let Held::Buffer(buf) = &mut self.held else {
            return Poll::Ready(Ok(false));
        };
        let mut read = ReadBuf::new(buf.bytes());
        match Pin::new(&mut *from).poll_read(cx, &mut read) {
            Poll::Pending => {
                self.held = Held::Nothing;
                return Poll::Pending;
            }
            Poll::Ready(result) => result.map_err(|e| PipeError::Io(self.sides.0, e))?,
        }
        (self.start, self.end) = (0, read.filled().len());
        Poll::Ready(Ok(self.end == 0))
    }

    /// EOF from the source: this direction is over, and the other side's
    /// write half is shut down (unless both directions are over, when the
    /// close that follows sends the FIN).
    fn pass_eof(&mut self, to: &mut WriteHalf<'_>, other_done: bool) -> Result<(), PipeError> {
        self.held = Held::Nothing;
        self.done = true;
        if other_done {
            return Ok(());
        }
        match SockRef::from(to.as_ref()).shutdown(Shutdown::Write) {
            // Already gone: the other direction will say so.
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
            Err(e) => Err(PipeError::Io(self.sides.1, e)),
        }
    }

    /// Reads the client's first bytes until they do or do not start with a
    /// PROXY signature.
    fn poll_signature(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut ReadHalf<'_>,
    ) -> Poll<Result<(), PipeError>> {
        let from_side = self.sides.0;
        if matches!(self.held, Held::Nothing) {
            self.held = Held::Head(Vec::new());
        }
        let Held::Head(head) = &mut self.held else {
            // Only a head is held before the signature is decided.
            self.check_signature = false;
            return Poll::Ready(Ok(()));
        };
        loop {
            match proxy_protocol::signature(&head[..self.end]) {
                Signature::Yes => return Poll::Ready(Err(PipeError::Refused)),
                Signature::No => {
                    self.check_signature = false;
                    return Poll::Ready(Ok(()));
                }
                Signature::Maybe => {}
            }
            if head.len() < self.end + 64 {
                head.resize(self.end + 64, 0);
            }
            let mut read = ReadBuf::new(&mut head[self.end..]);
            ready!(Pin::new(&mut *from).poll_read(cx, &mut read))
                .map_err(|e| PipeError::Io(from_side, e))?;
            let n = read.filled().len();
            if n == 0 {
                self.check_signature = false;
                return Poll::Ready(Ok(()));
            }
            self.end += n;
        }
    }
}
