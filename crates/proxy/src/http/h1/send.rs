//! The pass-through's wire format ([`RawWire`]): a request written to its
//! backend by magpie itself, the answer's head read back; the journey
//! ([`crate::http::journey`]) runs everything else.
//!
//! The head and the body bytes already read go in one write. A connection
//! that fails that write before any byte went hands the request back (the
//! journey tries the next pooled connection, or the next target). Once a
//! byte went, the rest of the body is passed on as the client sends it
//! (`Flight::pump`), while the backend is watched: an answer that comes
//! before the body's end is relayed while the rest of the body still flows
//! ([`super::relay`]). The response head must come within
//! `http.response_timeout` of the request's latest byte; `1xx` answers
//! before it are skipped.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use tokio::time::{Instant, Sleep};
use tracing::debug;

use super::framing::{BodyEnd, FramingError};
pub(crate) use super::io::READ_CHUNK;
use super::io::{ClientBuf, ClientIo, poll_read_into, write_all};
use super::response::{self, ResponseHead};
use crate::config::Config;
use crate::http::backend_deadlines::{HeadDeadlines, Late, Progress, passed};
use crate::http::journey::{Exchange, Failure, Wire};
use crate::http::pool::{Lease, Pool, RawConn, UPSTREAM_BUFFER_BYTES};
use crate::http::upstream::UpstreamIo;
use crate::routing::backend::Backend;

/// The most bytes a client may send ahead (its next requests) while it
/// waits for an answer; past it they wait in the socket.
const MAX_AHEAD: usize = 16 << 10;

/// The request on its way: the client it comes from and how far its body
/// has been read.
pub(crate) struct Outbound<'x, S> {
    pub(crate) client: &'x mut S,
    /// The client's bytes: first the body bytes walked and not yet sent.
    pub(crate) buf: &'x mut ClientBuf,
    /// How many of `buf`'s unconsumed bytes belong to the body and wait to
    /// be sent.
    pub(crate) walked: usize,
    /// Where the request body ends, walked as far as it was read.
    pub(crate) end: BodyEnd,
    /// The head as the backend gets it.
    pub(crate) head: &'x [u8],
    /// The key budget's share of the body bytes read for the key, given
    /// back once they are sent.
    pub(crate) held: Option<crate::telemetry::key_budget::Held>,
    /// The connection's one timer, for every deadline of its requests
    /// ([`passed`]).
    pub(crate) timer: Pin<&'x mut Sleep>,
}

/// The pass-through's request on its way to a backend, over the pool's
/// connections.
pub(crate) struct RawWire<'x, 'p, S> {
    pub(crate) out: Outbound<'x, S>,
    pub(crate) pool: &'p Arc<Pool<RawConn>>,
    /// The request is a `HEAD`: its answer has no body.
    pub(crate) head_method: bool,
    /// The client's socket, for its leaving while the body waits unread.
    pub(crate) socket: &'p tokio::net::TcpStream,
}

/// An answer's head, and the backend's bytes read so far: the head, then
/// what came of the body.
pub(crate) struct Received {
    pub(crate) head: ResponseHead,
    pub(crate) rbuf: Vec<u8>,
}

impl<S: ClientIo> Wire for RawWire<'_, '_, S> {
    type Conn = RawConn;
    type Head = Received;

    fn pool(&self) -> &Arc<Pool<RawConn>> {
        self.pool
    }

    async fn start(io: UpstreamIo, backend: &Arc<Backend>) -> io::Result<RawConn> {
        Ok(RawConn::new(io, backend))
    }

    /// The pool lends only connections that stayed quiet while idle.
    async fn ready(_conn: &mut RawConn) -> bool {
        true
    }

    async fn exchange(
        &mut self,
        backend: &Arc<Backend>,
        mut lease: Lease<RawConn>,
        config: &Config,
    ) -> Exchange<Self> {
        let out = &mut self.out;
        let sent = Instant::now();
        let progress = Progress::new();
        let body = &out.buf.unconsumed()[..out.walked];
        match write_all(&mut lease.conn.io, &[out.head, body]).await {
            Ok(()) => {}
            Err(e) if !e.wrote_any => {
                debug!(backend = %backend.name, fresh = lease.fresh, error = %e.error, "connection closed before the request was sent");
                return Exchange::NotSent { fresh: lease.fresh };
            }
            Err(e) => return Exchange::Failed(Failure::after_send(backend, e.error.into())),
        }
        progress.sent(body.len() as u64);
        out.held = None;
        out.buf.consume(out.walked);
        out.walked = 0;
        let flight = Flight {
            lease,
            sent,
            progress,
            rbuf: Vec::new(),
        };
        flight.run(backend, out, config, self.head_method).await
    }

    fn status(head: &Received) -> u16 {
        head.head.status
    }

    /// Once the body is all read, by reading ahead (what comes next is the
    /// client's next request, read as while an answer streams); before, off
    /// the socket itself, as a queued request's body is not read beyond what
    /// its key needed: its rest waits in the socket.
    async fn client_gone(&mut self) {
        let out = &mut self.out;
        if !out.end.is_done() {
            return crate::net::peer_closed(self.socket).await;
        }
        loop {
            let read = poll_fn(|cx| out.buf.poll_read_ahead(out.client, cx, MAX_AHEAD)).await;
            if matches!(read, Ok(0) | Err(_)) {
                return;
            }
        }
    }
}

/// A request whose head went to its backend.
struct Flight {
    lease: Lease<RawConn>,
    sent: Instant,
    progress: Arc<Progress>,
    rbuf: Vec<u8>,
}

/// What happened while waiting on the backend.
enum Event {
    /// Bytes from the backend (0: it closed).
    Backend(usize),
    BackendFailed(std::io::Error),
    /// The client's body bytes: `n` more were read, or written on.
    ClientRead,
    Wrote(usize),
    ClientGone,
    /// The client's body broke its framing: its fault, not the backend's.
    ClientBody(FramingError),
    /// `http.response_timeout` passed since the request's latest byte.
    TimedOut,
    /// The client's body sent nothing for `http.body_timeout`.
    BodyTimeout,
}

/// The outcome of an event that ends an exchange.
fn failed<W: Wire>(backend: &Backend, event: Event, config: &Config) -> Exchange<W> {
    match event {
        Event::TimedOut => {
            let after = config.http.response_timeout;
            Exchange::Failed(Failure::timed_out(backend, after))
        }
        Event::BodyTimeout => {
            let after = config.http.body_timeout;
            debug!(backend = %backend.name, timeout = ?after, "the request body stalled; the client gets 408");
            Exchange::Failed(Failure::BodyTimeout { after })
        }
        Event::ClientGone => {
            backend.live.traffic.count_client_abort();
            Exchange::ClientGone
        }
        Event::ClientBody(e) => {
            debug!(backend = %backend.name, error = %e, "the request body failed while it was sent");
            Exchange::Failed(Failure::ClientBody)
        }
        Event::BackendFailed(e) => Exchange::Failed(Failure::after_send(backend, e.into())),
        _ => after_send(backend, "the connection closed before a response head"),
    }
}

/// The backend failed once the request was (at least partly) written.
fn after_send<W: Wire>(backend: &Backend, why: &str) -> Exchange<W> {
    Exchange::Failed(Failure::after_send(backend, why.into()))
}

impl Flight {
    /// Passes the rest of the body on, then waits for the answer's head
    /// (`1xx` answers skipped).
    async fn run<S: ClientIo, W: Wire<Conn = RawConn, Head = Received>>(
        mut self,
        backend: &Arc<Backend>,
        out: &mut Outbound<'_, S>,
        config: &Config,
        head_method: bool,
    ) -> Exchange<W> {
        let timeout = config.http.response_timeout;
        let deadlines = HeadDeadlines::of(&config.http);
        let mut request_done = true;
        if !out.end.is_done() {
            match self.pump(out, deadlines).await {
                Ok(done) => request_done = done,
                Err(event) => return failed(backend, event, config),
            }
        }
        let request = response::Request {
            head_method,
            expose: config.http.expose_backend.then_some(backend.name.as_str()),
        };
        loop {
            match response::parse(&self.rbuf, &request) {
                response::Parsed::Ready(head) => {
                    return Exchange::Answered {
                        head: Received {
                            head,
                            rbuf: self.rbuf,
                        },
                        lease: self.lease,
                        sent: self.sent,
                        progress: self.progress,
                    };
                }
                response::Parsed::Interim(len) => {
                    self.rbuf.drain(..len);
                    continue;
                }
                response::Parsed::Switched => {
                    return Exchange::Failed(Failure::switched(backend));
                }
                response::Parsed::Invalid => {
                    return after_send(backend, "the response head is malformed");
                }
                response::Parsed::Partial if self.rbuf.len() >= UPSTREAM_BUFFER_BYTES => {
                    return after_send(backend, "the response head is too large");
                }
                response::Parsed::Partial => {}
            }
            let watch = request_done;
            match poll_fn(|cx| self.poll_head(cx, out, watch, timeout)).await {
                Event::Backend(0) => {
                    return after_send(backend, "the connection closed before a response head");
                }
                Event::Backend(_) | Event::ClientRead | Event::Wrote(_) => {}
                other => return failed(backend, other, config),
            }
        }
    }

    /// The backend's next bytes, into what is left of one buffer.
    fn poll_backend(&mut self, cx: &mut Context<'_>) -> Poll<Event> {
        let room = UPSTREAM_BUFFER_BYTES.saturating_sub(self.rbuf.len());
        poll_read_into(&mut self.lease.conn.io, cx, &mut self.rbuf, room).map(|read| match read {
            Ok(n) => Event::Backend(n),
            Err(e) => Event::BackendFailed(e),
        })
    }

    /// Waits for the backend's head: its bytes, the client going away (or
    /// sending ahead, when `watch`), or the deadline.
    fn poll_head<S: ClientIo>(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Outbound<'_, S>,
        watch: bool,
        timeout: std::time::Duration,
    ) -> Poll<Event> {
        if let Poll::Ready(event) = self.poll_backend(cx) {
            return Poll::Ready(event);
        }
        if watch {
            match out.buf.poll_read_ahead(out.client, cx, MAX_AHEAD) {
                Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(Event::ClientGone),
                Poll::Ready(Ok(_)) => return Poll::Ready(Event::ClientRead),
                Poll::Pending => {}
            }
        }
        if passed(cx, &mut out.timer, self.progress.last() + timeout) {
            return Poll::Ready(Event::TimedOut);
        }
        Poll::Pending
    }

    /// Passes the rest of the request body on as the client sends it.
    /// `Ok(true)` once it is all sent, `Ok(false)` when the backend
    /// answered first; `Err` with the event that ended it.
    async fn pump<S: ClientIo>(
        &mut self,
        out: &mut Outbound<'_, S>,
        deadlines: HeadDeadlines,
    ) -> Result<bool, Event> {
        while !(out.end.is_done() && out.walked == 0) {
            let event = poll_fn(|cx| self.poll_pump(cx, out, deadlines)).await;
            match event {
                Event::Backend(0) => return Err(Event::Backend(0)),
                // An answer before the body's end.
                Event::Backend(_) => return Ok(false),
                Event::Wrote(n) => {
                    out.buf.consume(n);
                    out.walked -= n;
                    self.progress.sent(n as u64);
                }
                Event::ClientRead => {
                    let fresh = &out.buf.unconsumed()[out.walked..];
                    match out.end.walk(fresh, &mut |_| {}) {
                        Ok(n) => out.walked += n,
                        Err(e) => return Err(Event::ClientBody(e)),
                    }
                }
                other => return Err(other),
            }
        }
        Ok(true)
    }

    /// The next event while the body is passed on: the backend's bytes,
    /// body bytes written to it or read from the client, or a deadline:
    /// while the client is waited for, the body timeout (its stall), else
    /// the response timeout (the backend does not read).
    fn poll_pump<S: ClientIo>(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Outbound<'_, S>,
        deadlines: HeadDeadlines,
    ) -> Poll<Event> {
        if let Poll::Ready(event) = self.poll_backend(cx) {
            return Poll::Ready(event);
        }
        if out.walked > 0 {
            let pending = &out.buf.unconsumed()[..out.walked];
            match Pin::new(&mut self.lease.conn.io).poll_write(cx, pending) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Event::BackendFailed(std::io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => return Poll::Ready(Event::Wrote(n)),
                Poll::Ready(Err(e)) => return Poll::Ready(Event::BackendFailed(e)),
                Poll::Pending => {}
            }
        } else {
            match out.buf.poll_read(out.client, cx, READ_CHUNK) {
                Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(Event::ClientGone),
                Poll::Ready(Ok(_)) => return Poll::Ready(Event::ClientRead),
                Poll::Pending => {}
            }
        }
        self.progress.set_stalled(out.walked == 0);
        let (deadline, late) = deadlines.deadline(&self.progress);
        if passed(cx, &mut out.timer, deadline) {
            return Poll::Ready(match late {
                Late::Response => Event::TimedOut,
                Late::Body => Event::BodyTimeout,
            });
        }
        Poll::Pending
    }
}
