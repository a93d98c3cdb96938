//! One request to the first backend of its route that takes it, in the
//! pass-through: the same phases as hyper's path ([`crate::http::forward`]:
//! choose, connect, send, account), over [`RawConn`]s.
//!
//! The head and the body bytes already read go in one write. A pooled
//! connection that fails that write before any byte went is dropped and
//! another tried; a new one that does, or a failed connect, moves on to the
//! next target. Once a byte went, the request goes nowhere else. The rest
//! of the body is then passed on as the client sends it
//! (`Exchange::pump`), while the backend is watched: an answer that comes
//! before the body's end is relayed while the rest of the body still flows
//! ([`super::relay`]). The response head must come within
//! `http.response_timeout` of the request's latest byte.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use tokio::time::{Instant, Sleep};
use tracing::{debug, warn};

use super::framing::{BodyEnd, FramingError};
pub use super::io::READ_CHUNK;
use super::io::{ClientBuf, ClientIo, poll_read_into, write_all};
use super::response::{self, ResponseHead};
use crate::config::Config;
use crate::http::backend_deadlines::{Progress, passed};
use crate::http::forward::{Failure, timed_out};
use crate::http::pool::RawConn;
use crate::http::pool::{Lease, Limits, Pool, UPSTREAM_BUFFER_BYTES};
use crate::http::upstream;
use crate::routing::backend::{Backend, CodeClass};
use crate::routing::health::passive::{self, Blame};
use crate::routing::instance::Instance;

/// The most bytes a client may send ahead (its next requests) while it
/// waits for an answer; past it they wait in the socket.
const MAX_AHEAD: usize = 16 << 10;

/// The request on its way: the client it comes from and how far its body
/// has been read.
pub struct Outbound<'x, S> {
    pub client: &'x mut S,
    /// The client's bytes: first the body bytes walked and not yet sent.
    pub buf: &'x mut ClientBuf,
    /// How many of `buf`'s unconsumed bytes belong to the body and wait to
    /// be sent.
    pub walked: usize,
    /// Where the request body ends, walked as far as it was read.
    pub end: BodyEnd,
    /// The head as the backend gets it.
    pub head: &'x [u8],
    /// The key budget's share of the body bytes read for the key, given
    /// back once they are sent.
    pub held: Option<crate::telemetry::key_budget::Held>,
    /// The connection's one timer, for every deadline of its requests
    /// ([`passed`]).
    pub timer: Pin<&'x mut Sleep>,
}

/// Where a request goes, and what it is counted with.
pub struct Plan<'a> {
    pub config: &'a Config,
    pub pool: &'a Arc<Pool<RawConn>>,
    pub instance: &'a Instance,
    /// The request is a `HEAD`: its answer has no body.
    pub head_method: bool,
}

/// A backend's answer, its head read.
pub struct Answered {
    pub lease: Lease<RawConn>,
    pub sent: Instant,
    pub received: Received,
}

/// What came back, and how the request went.
pub struct Received {
    pub head: ResponseHead,
    /// The backend's bytes: the head, then what came of the body.
    pub rbuf: Vec<u8>,
    /// How far the request body got (for the access log).
    pub progress: Arc<Progress>,
}

/// What sending a request to one backend came to.
pub enum Attempt {
    Answered(Box<Answered>),
    /// Not a byte of it went: it may go to the next target.
    Unsent,
    /// It must go nowhere else.
    Failed(Failure),
    /// The client went away first.
    ClientGone,
}

/// Sends the request to `backend` over a pooled connection, or a new one.
pub async fn send<S: ClientIo>(
    backend: &Arc<Backend>,
    out: &mut Outbound<'_, S>,
    plan: &Plan<'_>,
) -> Attempt {
    loop {
        let mut lease = match connect(backend, plan).await {
            Ok(lease) => lease,
            Err(Blame::Backend) => return Attempt::Unsent,
            Err(Blame::Local) => return Attempt::Failed(Failure::LocalResources),
        };
        let sent = Instant::now();
        let progress = Progress::new();
        let body = &out.buf.unconsumed()[..out.walked];
        match write_all(&mut lease.conn.io, &[out.head, body]).await {
            Ok(()) => {}
            Err(e) if !e.wrote_any => {
                debug!(backend = %backend.name, fresh = lease.fresh, error = %e.error, "connection closed before the request was sent");
                if lease.fresh {
                    return Attempt::Unsent;
                }
                continue;
            }
            Err(e) => return failed_after_send(backend, e.error.into()),
        }
        progress.sent(body.len() as u64);
        out.held = None;
        out.buf.consume(out.walked);
        out.walked = 0;
        let exchange = Exchange {
            lease,
            sent,
            progress,
            rbuf: Vec::new(),
        };
        return exchange.run(backend, out, plan).await;
    }
}

/// A connection to `backend`: the most recently pooled one still open,
/// else a new one (counted like a TCP-path connect).
async fn connect(backend: &Arc<Backend>, plan: &Plan<'_>) -> Result<Lease<RawConn>, Blame> {
    let limits = Limits::of(&plan.config.http);
    if let Some(lease) = plan.pool.checkout(backend.addr, limits) {
        return Ok(lease);
    }
    let started = Instant::now();
    match upstream::open(backend, plan.config.connect.timeout).await {
        Ok(io) => {
            let traffic = &backend.live.traffic;
            traffic.connect_time.observe(started.elapsed());
            traffic.count_connection();
            passive::succeeded(&**backend);
            let conn = RawConn::new(io, backend);
            Ok(Lease::fresh(conn, backend.addr, limits, plan.pool))
        }
        Err(e) => {
            let health = plan.config.health.as_ref();
            Err(passive::connect_failed(
                &**backend,
                &e,
                health,
                &plan.instance.stats,
            ))
        }
    }
}

/// The backend failed once the request was (at least partly) written.
fn failed_after_send(backend: &Backend, error: crate::http::response_body::BoxError) -> Attempt {
    backend.live.traffic.count_request(CodeClass::Error);
    warn!(backend = %backend.name, %error, "backend failed after the request was sent");
    Attempt::Failed(Failure::AfterSend {
        backend: backend.name.clone(),
        error,
    })
}

/// A request whose head went to its backend.
struct Exchange {
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
}

impl Exchange {
    async fn run<S: ClientIo>(
        mut self,
        backend: &Arc<Backend>,
        out: &mut Outbound<'_, S>,
        plan: &Plan<'_>,
    ) -> Attempt {
        let timeout = plan.config.http.response_timeout;
        let mut request_done = true;
        if !out.end.is_done() {
            match self.pump(out, timeout).await {
                Ok(done) => request_done = done,
                Err(attempt) => return self.failed(backend, attempt, plan),
            }
        }
        loop {
            let parsed = response::parse(
                &self.rbuf,
                &response::Request {
                    head_method: plan.head_method,
                    expose: plan
                        .config
                        .http
                        .expose_backend
                        .then_some(backend.name.as_str()),
                },
            );
            match parsed {
                response::Parsed::Ready(head) => {
                    return Attempt::Answered(Box::new(Answered {
                        lease: self.lease,
                        sent: self.sent,
                        received: Received {
                            head,
                            rbuf: self.rbuf,
                            progress: self.progress,
                        },
                    }));
                }
                response::Parsed::Interim(len) => {
                    self.rbuf.drain(..len);
                    continue;
                }
                response::Parsed::Switched => {
                    backend.live.traffic.count_request(CodeClass::Error);
                    warn!(backend = %backend.name, "backend answered 101 Switching Protocols unasked; the client gets 502");
                    return Attempt::Failed(Failure::Switched {
                        backend: backend.name.clone(),
                    });
                }
                response::Parsed::Invalid => {
                    return failed_after_send(backend, "the response head is malformed".into());
                }
                response::Parsed::Partial if self.rbuf.len() >= UPSTREAM_BUFFER_BYTES => {
                    return failed_after_send(backend, "the response head is too large".into());
                }
                response::Parsed::Partial => {}
            }
            let watch = request_done;
            let event = poll_fn(|cx| self.poll_head(cx, out, watch, timeout)).await;
            match event {
                Event::Backend(0) => {
                    return failed_after_send(
                        backend,
                        "the connection closed before a response head".into(),
                    );
                }
                Event::Backend(_) | Event::ClientRead | Event::Wrote(_) => {}
                other => return self.failed(backend, other, plan),
            }
        }
    }

    /// The outcome of an event that ends the exchange.
    fn failed(self, backend: &Arc<Backend>, event: Event, plan: &Plan<'_>) -> Attempt {
        match event {
            Event::TimedOut => {
                timed_out(backend, plan.config);
                Attempt::Failed(Failure::ResponseTimeout {
                    backend: backend.name.clone(),
                    after: plan.config.http.response_timeout,
                })
            }
            Event::ClientGone => {
                backend.live.traffic.count_client_abort();
                Attempt::ClientGone
            }
            Event::ClientBody(e) => {
                debug!(backend = %backend.name, error = %e, "the request body failed while it was sent");
                Attempt::Failed(Failure::ClientBody { error: e.into() })
            }
            Event::BackendFailed(e) => failed_after_send(backend, e.into()),
            _ => failed_after_send(
                backend,
                "the connection closed before a response head".into(),
            ),
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
        timeout: std::time::Duration,
    ) -> Result<bool, Event> {
        while !(out.end.is_done() && out.walked == 0) {
            let event = poll_fn(|cx| self.poll_pump(cx, out, timeout)).await;
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

    fn poll_pump<S: ClientIo>(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Outbound<'_, S>,
        timeout: std::time::Duration,
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
        if passed(cx, &mut out.timer, self.progress.last() + timeout) {
            return Poll::Ready(Event::TimedOut);
        }
        Poll::Pending
    }
}
