//! A backend's response body on its way to the client, counted and timed.
//!
//! It holds the request's in-flight slot (what bounded load counts) and the
//! lease on the upstream connection until the last frame has passed or the
//! client has gone: read to the end, the connection goes back to the pool;
//! abandoned half-way, it closes. A Server-Sent Events stream or a chunked
//! generation flows through as each frame arrives.
//!
//! A body that pauses for `http.stream_idle_timeout` while the client waits
//! for it ([`Silence`]) is cut: the backend's connection is closed, the slot
//! given back, the timeout counted against the backend, and the client gets
//! an error instead of the next frame, so its stream ends in a reset (HTTP/1)
//! or a reset stream (HTTP/2), never in a clean end that would pass for a
//! complete answer.
//!
//! A JSON or event-stream answer is also read for its `usage` as it passes
//! ([`magpie_core::usage`], at most [`magpie_core::usage::MAX_BUFFER`] bytes held): at
//! its end the engine's token counts go where the routing decision said
//! ([`Tally`]: the backend's counters, and whether the cache was missed, and
//! why).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::time::Instant;
use tracing::warn;

use super::backend_deadlines::Silence;
use super::pool::{Conn, Lease, Pooled, discarded};
use super::request_log::RequestLog;
use crate::routing::backend::{ActiveGuard, Backend, Discard, TimeoutKind};
use crate::routing::decision::FirstByte;
use crate::routing::llm::usage::{Tally, Tokens};
use crate::telemetry::access_log;
use crate::telemetry::throttle::Throttle;
use magpie_core::usage::{Usage, UsageScanner};

/// The error type of every body on this path.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request in flight to a backend, from the moment it was sent, over a
/// connection of hyper's client ([`Conn`]) or of the pass-through.
pub(crate) struct InFlight<C: Pooled = Conn> {
    pub(crate) backend: Arc<Backend>,
    /// The backend's in-flight slot (bounded load counts these), held
    /// until the request ends.
    pub(crate) _slot: ActiveGuard,
    pub(crate) sent: Instant,
    /// The connection it went over, back to the pool at the response's end.
    pub(crate) lease: Lease<C>,
    /// What the response's usage is counted against.
    pub(crate) tally: Tally,
    /// `http.stream_idle_timeout`.
    pub(crate) stream_idle: std::time::Duration,
    /// The request's access-log line, written at the body's end.
    pub(crate) log: Option<RequestLog>,
    /// Counts the request as awaiting its first byte of body until that
    /// byte passes.
    pub(crate) awaiting: Option<FirstByte>,
    /// Whether its connection may carry another request once the answer
    /// ends cleanly: not after an error answer to a request with a body.
    pub(crate) reusable: bool,
}

impl<C: Pooled> InFlight<C> {
    /// The first byte of the answer's body passed: the request no longer
    /// awaits it, and its work teaches the backend's prefill rate.
    pub(crate) fn body_began(&mut self) {
        if let Some(first) = self.awaiting.take() {
            first.arrived();
        }
    }
}

impl<C: Pooled> std::fmt::Debug for InFlight<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("backend", &self.backend.name)
            .field("sent", &self.sent)
            .finish()
    }
}

/// A backend's response body, counted and timed on its way to the client.
#[derive(Debug)]
pub(crate) struct ResponseBody {
    body: Incoming,
    /// `Some` until the body ended (or failed); then the slot is given back.
    in_flight: Option<InFlight>,
    /// Reads the answer's `usage`, for a JSON or event-stream body (boxed:
    /// most of a scanner is its buffers' bookkeeping).
    usage: Option<Box<UsageScanner>>,
    silence: Silence,
    /// The body's bytes passed to the client (for the access log).
    bytes_out: u64,
}

impl ResponseBody {
    /// `body`, read for its usage when `usage` is given.
    pub(crate) fn new(
        body: Incoming,
        in_flight: InFlight,
        usage: Option<UsageScanner>,
    ) -> ResponseBody {
        ResponseBody {
            body,
            silence: Silence::new(in_flight.stream_idle),
            in_flight: Some(in_flight),
            usage: usage.map(Box::new),
            bytes_out: 0,
        }
    }

    /// The backend has been silent for `http.stream_idle_timeout`: counted,
    /// its connection closed, its slot given back; the error for the client.
    fn cut(&mut self) -> BoxError {
        let limit = self.silence.limit();
        let name = match &self.in_flight {
            Some(f) => {
                f.fell_silent();
                f.backend.name.clone()
            }
            None => String::new(),
        };
        self.finish(false);
        let limit = humantime::format_duration(limit);
        BoxError::from(format!(
            "backend {name} sent no byte of its response for {limit}"
        ))
    }

    /// The response ended: see [`InFlight::finish`].
    fn finish(&mut self, complete: bool) {
        let Some(f) = self.in_flight.take() else {
            return;
        };
        let usage = self
            .usage
            .take()
            .filter(|_| complete)
            .and_then(|u| u.finish());
        f.finish(complete, self.bytes_out, usage);
    }
}

impl<C: Pooled> InFlight<C> {
    /// The backend sent no byte of its response for
    /// `http.stream_idle_timeout` while the client waited: counted against
    /// it, and logged (at most once a second); the caller cuts the stream.
    pub(crate) fn fell_silent(&self) {
        static LOG: Throttle = Throttle::new(std::time::Duration::from_secs(1));
        let backend = &self.backend;
        backend.live.traffic.count_timeout(TimeoutKind::StreamIdle);
        if let Some(held_back) = LOG.allow() {
            let limit = humantime::format_duration(self.stream_idle);
            warn!(backend = %backend.name, %limit, held_back, "backend sent no byte of its response for http.stream_idle_timeout; the stream is cut");
        }
    }

    /// The response ended, `bytes_out` of its body passed on: time it,
    /// count its usage, write its log line, and give the connection back
    /// when the body was read to its end (`complete`), else let it close.
    pub(crate) fn finish(mut self, complete: bool, bytes_out: u64, usage: Option<Usage>) {
        let traffic = &self.backend.live.traffic;
        traffic.request_duration.observe(self.sent.elapsed());
        if let Some(usage) = usage {
            let tokens = Tokens {
                prompt: usage.prompt_tokens,
                cached: usage.cached_tokens,
            };
            self.tally
                .served(&self.backend, tokens, usage.completion_tokens);
        }
        if let Some(log) = self.log.take() {
            let tokens = usage.map(|u| access_log::Tokens {
                prompt: u.prompt_tokens,
                cached: u.cached_tokens,
            });
            log.ended(bytes_out, tokens);
        }
        if !complete {
            return;
        }
        if self.reusable {
            self.lease.give_back();
            return;
        }
        // Counted once, by what is seen of it first: closed or sent bytes
        // past its answer, else fit but for what its backend may still read
        // as a request. One spent on the way was counted then.
        let why = match self.lease.conn.fit() {
            Ok(()) => Discard::ErrorAfterBody,
            Err(Some(why)) => why,
            Err(None) => return,
        };
        discarded(&self.lease.conn, why);
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                this.silence.frame();
                if let (Some(data), Some(f)) = (frame.data_ref(), &mut this.in_flight) {
                    let traffic = &f.backend.live.traffic;
                    traffic.add_bytes_received(data.len() as u64);
                    this.bytes_out += data.len() as u64;
                    if !data.is_empty() {
                        f.body_began();
                    }
                    if let Some(usage) = &mut this.usage {
                        usage.feed(data);
                    }
                }
            }
            Poll::Ready(None) => self.finish(true),
            Poll::Ready(Some(Err(_))) => self.finish(false),
            Poll::Pending => {
                if self.in_flight.is_some() && self.silence.expired(cx) {
                    return Poll::Ready(Some(Err(self.cut())));
                }
            }
        }
        polled.map(|frame| frame.map(|r| r.map_err(BoxError::from)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        if self.in_flight.is_none() {
            return;
        }
        // An empty body (HEAD, 204, 304) is never polled: it ended all the same.
        if self.body.is_end_stream() {
            self.finish(true);
            return;
        }
        // Dropped before its end: the client went away mid-response.
        if let Some(f) = &self.in_flight {
            f.backend.live.traffic.count_client_abort();
        }
        self.finish(false);
    }
}
