//! A backend's answer on its way to the client, in the pass-through: its
//! head written again, then its body bytes as they came, read one buffer at
//! a time and written before the next read, so a client that reads slowly
//! holds the backend back instead of filling magpie's memory (at most one
//! [`UPSTREAM_BUFFER_BYTES`] buffer per request).
//!
//! An answer may come before the request's body has all been sent (an echo
//! that streams as it reads, an early `413`): the rest of the body is then
//! passed on beside it, both directions in one state machine, until the
//! answer ends. A client that sends its next requests meanwhile has them
//! kept for later, up to one buffer; one that closes is noticed at once.
//!
//! As in hyper's path ([`crate::http::response_body`]): the body's data is read
//! for its `usage`; a body that pauses for `http.stream_idle_timeout` while
//! the client waits, or that the backend cuts or garbles, ends in a reset
//! towards the client, never in a clean end; read to its end, the
//! connection goes back to the pool.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::AsyncWrite;
use tokio::time::Instant;
use tracing::debug;

use super::framing::{BodyEnd, Framing};
use super::io::{ClientIo, JOIN_BELOW, poll_read_into, poll_write_from};
use super::send::{Outbound, READ_CHUNK};
use crate::http::backend_deadlines::Progress;
use crate::http::backend_deadlines::passed;
use crate::http::pool::UPSTREAM_BUFFER_BYTES;
use crate::http::pool::{RawConn, discarded};
use crate::http::response_body::InFlight;
use crate::routing::backend::Discard;
use magpie_core::usage::UsageScanner;

/// How a response ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Relayed {
    /// Passed on whole, and its request's body sent whole.
    Complete,
    /// Passed on whole before its request's body was: the connections
    /// close.
    Early,
    /// The client went away first.
    ClientGone,
    /// The backend cut it, garbled it, or paused too long, or the client's
    /// body broke its framing: the client must see a reset.
    Cut,
}

/// One response to relay.
pub(crate) struct Response {
    /// The head for the client, without its final empty line.
    pub(crate) client_head: Vec<u8>,
    /// The backend's bytes read so far; the body's start at `body_start`.
    pub(crate) rbuf: Vec<u8>,
    pub(crate) body_start: usize,
    pub(crate) framing: Framing,
    pub(crate) usage: Option<UsageScanner>,
    /// The client connection closes after it (`connection: close` is added).
    pub(crate) close: bool,
    /// The backend said it closes the connection after it.
    pub(crate) backend_closes: bool,
}

/// Relays `response`, whose request is `in_flight` and came from `out`.
pub(crate) async fn relay<S: ClientIo>(
    mut response: Response,
    in_flight: InFlight<RawConn>,
    out: &mut Outbound<'_, S>,
    progress: Arc<Progress>,
) -> Relayed {
    if response.close {
        response
            .client_head
            .extend_from_slice(b"connection: close\r\n");
    }
    response.client_head.extend_from_slice(b"\r\n");
    let limit = in_flight.stream_idle;
    let mut state = Relay {
        head: response.client_head,
        rbuf: response.rbuf,
        pending: response.body_start..response.body_start,
        written: 0,
        body: Body {
            end: BodyEnd::new(response.framing),
            usage: response.usage.map(Box::new),
            bytes_out: 0,
            unfit: response.backend_closes.then_some(Discard::Closed),
        },
        in_flight: Some(in_flight),
        settled: None,
        progress,
        last: Instant::now(),
        limit,
    };
    let fresh = response.body_start..state.rbuf.len();
    if state
        .take(fresh, out.end.is_done() && out.walked == 0)
        .is_err()
    {
        return state.end_with(Relayed::Cut);
    }
    if state.pending.len() <= JOIN_BELOW {
        state
            .head
            .extend_from_slice(&state.rbuf[state.pending.clone()]);
        state.pending = 0..0;
    }
    let how = poll_fn(|cx| state.poll(cx, out)).await;
    state.end_with(how)
}

/// A response on its way, and the rest of its request's body.
struct Relay {
    /// The head for the client, until it is written.
    head: Vec<u8>,
    rbuf: Vec<u8>,
    /// The body bytes of `rbuf` still to write.
    pending: std::ops::Range<usize>,
    /// How much of `head` and `pending` (in that order) went.
    written: usize,
    body: Body,
    /// The request, until its answer was read whole (or failed).
    in_flight: Option<InFlight<RawConn>>,
    /// How the answer ended, once it was read whole: what is left is
    /// writing its last bytes.
    settled: Option<Relayed>,
    progress: Arc<Progress>,
    /// When the backend last sent bytes.
    last: Instant,
    limit: Duration,
}

impl Relay {
    /// Moves both directions as far as they go.
    fn poll<S: ClientIo>(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Outbound<'_, S>,
    ) -> Poll<Relayed> {
        loop {
            let request_done = out.end.is_done() && out.walked == 0;
            let answer = match self.poll_answer(cx, out.client, request_done) {
                Poll::Ready(Some(how)) => return Poll::Ready(how),
                Poll::Ready(None) => true,
                Poll::Pending => false,
            };
            if self.settled.is_some() {
                // Only the answer's last bytes are left to write.
                if answer {
                    continue;
                }
                return Poll::Pending;
            }
            let upload = if request_done {
                self.poll_watch(cx, out)
            } else {
                self.poll_upload(cx, out)
            };
            let upload = match upload {
                Poll::Ready(Some(how)) => return Poll::Ready(how),
                Poll::Ready(None) => true,
                Poll::Pending => false,
            };
            if answer || upload {
                continue;
            }
            let waiting = self.written >= self.head.len() && self.pending.is_empty();
            if waiting && passed(cx, &mut out.timer, self.last + self.limit) {
                if let Some(in_flight) = &self.in_flight {
                    in_flight.fell_silent();
                }
                return Poll::Ready(Relayed::Cut);
            }
            return Poll::Pending;
        }
    }

    /// The answer's next step: write what is pending, else read more.
    /// `Ready(None)`: progress was made.
    fn poll_answer<S: ClientIo>(
        &mut self,
        cx: &mut Context<'_>,
        client: &mut S,
        request_done: bool,
    ) -> Poll<Option<Relayed>> {
        let head_left = self.head.len().saturating_sub(self.written);
        if head_left > 0 || !self.pending.is_empty() {
            let parts = [&self.head[..], &self.rbuf[self.pending.clone()]];
            return match poll_write_from(client, cx, &parts, self.written) {
                Poll::Ready(Ok(0) | Err(_)) => Poll::Ready(Some(Relayed::ClientGone)),
                Poll::Ready(Ok(n)) => {
                    self.written += n;
                    let body_written = self.written.saturating_sub(self.head.len());
                    if body_written >= self.pending.len() {
                        self.head = Vec::new();
                        self.written = 0;
                        self.pending = 0..0;
                    }
                    Poll::Ready(None)
                }
                Poll::Pending => Poll::Pending,
            };
        }
        if let Some(how) = self.settled {
            return Poll::Ready(Some(how));
        }
        let Some(in_flight) = self.in_flight.as_mut() else {
            return Poll::Ready(Some(Relayed::Cut));
        };
        self.rbuf.clear();
        let conn = &mut in_flight.lease.conn.io;
        match poll_read_into(conn, cx, &mut self.rbuf, UPSTREAM_BUFFER_BYTES) {
            Poll::Ready(Ok(0)) if self.body.end.until_close() => {
                self.settle(request_done);
                Poll::Ready(None)
            }
            Poll::Ready(Ok(0)) => Poll::Ready(Some(Relayed::Cut)),
            Poll::Ready(Ok(n)) => {
                self.last = Instant::now();
                match self.take(0..n, request_done) {
                    Ok(()) => Poll::Ready(None),
                    Err(()) => Poll::Ready(Some(Relayed::Cut)),
                }
            }
            Poll::Ready(Err(e)) => {
                debug!(backend = %in_flight.backend.name, error = %e, "backend failed mid-response");
                Poll::Ready(Some(Relayed::Cut))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// Walks the backend's `fresh` bytes of `rbuf`: those of the body are
    /// pending for the client. An answer read whole settles its request
    /// at once, before its last bytes are written: its line is logged and
    /// its connection pooled as on hyper's path, when the backend's body
    /// ends.
    fn take(&mut self, fresh: std::ops::Range<usize>, request_done: bool) -> Result<(), ()> {
        let start = fresh.start;
        let Some(in_flight) = self.in_flight.as_mut() else {
            return Err(());
        };
        let n = self.body.walk(&self.rbuf[fresh], in_flight)?;
        self.pending = start..start + n;
        if self.body.end.is_done() {
            self.settle(request_done);
        }
        Ok(())
    }

    /// The answer was read whole: its request ends, `Complete` or (its
    /// body not sent whole) `Early`.
    fn settle(&mut self, request_done: bool) {
        let how = if request_done {
            Relayed::Complete
        } else {
            Relayed::Early
        };
        self.finish(how);
        self.settled = Some(how);
    }

    /// The request's body is still on its way: pass more of it on.
    fn poll_upload<S: ClientIo>(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Outbound<'_, S>,
    ) -> Poll<Option<Relayed>> {
        if out.walked > 0 {
            let pending = &out.buf.unconsumed()[..out.walked];
            let Some(in_flight) = self.in_flight.as_mut() else {
                return Poll::Ready(Some(Relayed::Cut));
            };
            return match Pin::new(&mut in_flight.lease.conn.io).poll_write(cx, pending) {
                Poll::Ready(Ok(0) | Err(_)) => Poll::Ready(Some(Relayed::Cut)),
                Poll::Ready(Ok(n)) => {
                    out.buf.consume(n);
                    out.walked -= n;
                    self.progress.sent(n as u64);
                    Poll::Ready(None)
                }
                Poll::Pending => Poll::Pending,
            };
        }
        match out.buf.poll_read(out.client, cx, READ_CHUNK) {
            Poll::Ready(Ok(0) | Err(_)) => Poll::Ready(Some(Relayed::ClientGone)),
            Poll::Ready(Ok(_)) => {
                let fresh = &out.buf.unconsumed()[out.walked..];
                match out.end.walk(fresh, &mut |_| {}) {
                    Ok(n) => {
                        out.walked += n;
                        Poll::Ready(None)
                    }
                    Err(e) => {
                        debug!(error = %e, "the request body broke its framing mid-answer");
                        Poll::Ready(Some(Relayed::Cut))
                    }
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// The request was sent whole: watch the client while the backend is
    /// quiet, keeping what it sends ahead (up to a buffer) and noticing when
    /// it closes.
    fn poll_watch<S: ClientIo>(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Outbound<'_, S>,
    ) -> Poll<Option<Relayed>> {
        match out
            .buf
            .poll_read_ahead(out.client, cx, UPSTREAM_BUFFER_BYTES)
        {
            Poll::Ready(Ok(0) | Err(_)) => Poll::Ready(Some(Relayed::ClientGone)),
            Poll::Ready(Ok(_)) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    /// The response is over, `how`.
    fn end_with(mut self, how: Relayed) -> Relayed {
        self.finish(how);
        how
    }

    /// The request ends, `how`, unless it already did: counted, and its
    /// connection pooled only when both directions ended cleanly and the
    /// backend keeps it open.
    fn finish(&mut self, how: Relayed) {
        let Some(mut in_flight) = self.in_flight.take() else {
            return;
        };
        let complete = matches!(how, Relayed::Complete | Relayed::Early);
        if how == Relayed::ClientGone {
            in_flight.backend.live.traffic.count_client_abort();
        }
        let body = &mut self.body;
        let usage = body
            .usage
            .take()
            .filter(|_| complete)
            .and_then(|u| u.finish());
        let reuse = how == Relayed::Complete && body.unfit.is_none() && body.end.is_done();
        in_flight.lease.conn.spent |= !reuse;
        // What the backend did that keeps its connection out of the pool.
        let why = match how {
            Relayed::Early => Some(Discard::EarlyAnswer),
            Relayed::Complete => body.unfit,
            Relayed::ClientGone | Relayed::Cut => None,
        };
        if let Some(why) = why {
            discarded(&in_flight.lease.conn, why);
        }
        in_flight.finish(complete, body.bytes_out, usage);
    }
}

/// A response body as it passes.
struct Body {
    end: BodyEnd,
    usage: Option<Box<UsageScanner>>,
    bytes_out: u64,
    /// Why the connection cannot carry another request, if the backend
    /// made it so: it said it closes, or sent bytes past the answer's end.
    unfit: Option<Discard>,
}

impl Body {
    /// Walks the body's next bytes: how many belong to it. Its data is read
    /// for usage, and its first byte ends the request's wait for one. Bytes
    /// past its end leave the connection unfit for another request.
    fn walk(&mut self, bytes: &[u8], in_flight: &mut InFlight<RawConn>) -> Result<usize, ()> {
        let usage = &mut self.usage;
        let mut data_seen = false;
        let n = self
            .end
            .walk(bytes, &mut |data| {
                data_seen |= !data.is_empty();
                if let Some(usage) = usage.as_mut() {
                    usage.feed(data);
                }
            })
            .map_err(|e| debug!(backend = %in_flight.backend.name, error = %e, "malformed response body"))?;
        if data_seen {
            in_flight.body_began();
        }
        if n < bytes.len() {
            self.unfit = Some(Discard::Unsolicited);
        }
        self.bytes_out += n as u64;
        in_flight.backend.live.traffic.add_bytes_received(n as u64);
        Ok(n)
    }
}
