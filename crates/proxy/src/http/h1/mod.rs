//! The HTTP/1.1 pass-through (`mode: http`): plain HTTP/1.1 requests served
//! without hyper, each head parsed in place and forwarded as it came (less
//! its hop-by-hop fields), each body passed on in the framing it came in,
//! over upstream connections that belong to no task of their own.
//!
//! hyper parses and writes every message twice (as server and as client)
//! and hands each upstream request to a connection task; for the chat
//! requests magpie exists for, that was most of its time per request. Here
//! one task serves one client connection: read a head, key it, route it,
//! write it to the backend, read the answer's head, relay the answer, and
//! go back to waiting, holding no buffer while the connection is idle.
//!
//! It takes only what it fully understands ([`head`]): anything else is
//! handed over with the bytes already read, and hyper's path
//! ([`super::HttpPath`]) serves the connection from there on, HTTP/2 with
//! prior knowledge included. Both paths share keys, routing, pins,
//! accounting, deadlines and the access log, so a request is routed,
//! counted and logged alike whichever serves it.
//!
//! | module | owns |
//! |---|---|
//! | [`head`] | a request head: parsed, checked, keyed, written again for the backend; what is handed over |
//! | [`framing`] | where a body ends: a length, or the chunked coding walked strictly |
//! | [`body_key`] | a request body read for its key, as far as the key needs |
//! | [`request`] | one request: its head, its keys, its route, the journey ([`crate::http::journey`]), the answer relayed or magpie's own |
//! | [`send`] | the pass-through's wire format for the journey: the request written, the rest of its body pumped, the response head read |
//! | [`response`] | a response head: parsed, framed, written again for the client |
//! | [`relay`] | a response body to the client, one buffer at a time: usage, silence, cuts |
//! | [`io`] | the client's unconsumed bytes, reads into spare room, vectored writes, idle waits without a buffer |

pub(crate) mod body_key;
pub(crate) mod framing;
pub(crate) mod head;
pub(crate) mod io;
pub(crate) mod relay;
pub(crate) mod request;
pub(crate) mod response;
pub(crate) mod send;

use std::future::poll_fn;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use tokio::time::Instant;

use tokio_util::sync::CancellationToken;

use self::io::{ClientBuf, ClientIo};
use super::backend_deadlines::passed;
use super::client_deadlines::{Deadlines, FIRST_REQUEST_GRACE};
use super::pool::Pool;
use super::pool::RawConn;
use super::request_log::Arrival;
use super::reuse::ClientConn;
use crate::routing::instance::Instance;
use crate::telemetry::stats::QuietClose;

/// What every request on one client connection shares.
pub(crate) struct Client<'c> {
    pub(crate) instance: &'c Arc<Instance>,
    pub(crate) pool: &'c Arc<Pool<RawConn>>,
    pub(crate) arrival: Arrival,
    pub(crate) deadlines: Deadlines,
    /// When the first byte's deadline began: the accept (a TLS handshake
    /// counts against it).
    pub(crate) accepted: Instant,
    /// Fired at shutdown: finish the request in flight, then close.
    pub(crate) shutdown: &'c CancellationToken,
    /// Fired when the shutdown grace is over: close now.
    pub(crate) stop: &'c CancellationToken,
    /// Tells its requests from other clients' for the upstream pool.
    pub(crate) conn: &'c ClientConn,
    /// The client's socket under any TLS: whether the client left is read
    /// off it while a request waits with its body unread.
    pub(crate) socket: &'c tokio::net::TcpStream,
}

/// What a connection does after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Wait for the next request.
    KeepAlive,
    /// Close it.
    Close,
    /// Close it gently after an error answer: stop writing, read what the
    /// client still sends for a short while (so a reset cannot destroy the
    /// answer).
    Linger,
    /// Close it with a reset: a response was cut half-way.
    Reset,
    /// hyper serves it from this request on.
    Handover,
}

/// How a connection left the pass-through.
pub(crate) enum Ended<S> {
    /// It is over: closed as this says (not [`Next::KeepAlive`] nor
    /// [`Next::Handover`]).
    Closed(Next),
    /// hyper serves the rest of it, these bytes first.
    Handover(S, Vec<u8>),
}

/// Serves the requests of one client connection until it closes, shutdown,
/// or a request that hyper must serve.
///
/// Shutdown and the end of its grace are awaited once for the whole
/// connection, not once per request: shutdown closes it while it idles (a
/// request in flight finishes first, its answer saying `connection:
/// close`; an idle one waits [`FIRST_REQUEST_GRACE`] for a request that
/// may be on its way, and answers it so), the grace's end closes it
/// whatever it does.
pub(crate) async fn serve<S: ClientIo>(io: S, c: &Client<'_>) -> Ended<S> {
    let idle = AtomicBool::new(true);
    let requests = pin!(requests(io, c, &idle));
    let mut requests = requests;
    tokio::select! {
        ended = &mut requests => return ended,
        _ = c.stop.cancelled() => return Ended::Closed(Next::Reset),
        _ = c.shutdown.cancelled() => {}
    }
    if idle.load(Ordering::Relaxed) {
        // A request may be on its way (a connection accepted just before
        // the drain, a keep-alive client sending its next): it gets a moment
        // to arrive, and is answered `connection: close`.
        tokio::select! {
            ended = &mut requests => return ended,
            _ = c.stop.cancelled() => return Ended::Closed(Next::Reset),
            () = tokio::time::sleep(FIRST_REQUEST_GRACE) => {}
        }
    }
    if idle.load(Ordering::Relaxed) {
        return Ended::Closed(Next::Close);
    }
    tokio::select! {
        ended = requests => ended,
        _ = c.stop.cancelled() => Ended::Closed(Next::Reset),
    }
}

/// The request loop of [`serve`]; `idle` says when it waits between
/// requests.
async fn requests<S: ClientIo>(mut io: S, c: &Client<'_>, idle: &AtomicBool) -> Ended<S> {
    let mut buf = ClientBuf::default();
    // One timer for every idle wait of the connection, set again only when
    // it fires early (the connection was busy meanwhile).
    let mut since = c.accepted;
    let mut sleep = pin!(tokio::time::sleep_until(since + c.deadlines.first_byte));
    let mut limit = c.deadlines.first_byte;
    let mut why_quiet = QuietClose::FirstByte;
    loop {
        if buf.is_empty() {
            // Idle: no buffer is held while the client is quiet.
            buf.release();
            idle.store(true, Ordering::Relaxed);
            let mut quiet = false;
            let read = poll_fn(|cx| match buf.poll_idle(&mut io, cx) {
                Poll::Pending if passed(cx, &mut sleep, since + limit) => {
                    quiet = true;
                    Poll::Ready(Ok(0))
                }
                polled => polled,
            });
            let read = read.await;
            if quiet {
                c.instance.stats.count_quiet_close(why_quiet);
            }
            if !matches!(read, Ok(n) if n > 0) {
                return Ended::Closed(Next::Close);
            }
            idle.store(false, Ordering::Relaxed);
        }
        // Boxed: a request's state (its keys, route, upstream exchange) is
        // kilobytes, which an idle connection should not keep.
        let next = Box::pin(request::serve(&mut io, &mut buf, c, sleep.as_mut())).await;
        (limit, why_quiet) = (c.deadlines.keepalive, QuietClose::Keepalive);
        since = Instant::now();
        match next {
            Next::KeepAlive if !c.shutdown.is_cancelled() => {}
            Next::KeepAlive => return Ended::Closed(Next::Close),
            Next::Handover => return Ended::Handover(io, buf.take()),
            closed => return Ended::Closed(closed),
        }
    }
}
