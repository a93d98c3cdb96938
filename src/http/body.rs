//! The bodies that pass through the HTTP path, streamed frame by frame.
//!
//! * [`Upload`]: a request body on its way to the backend: the bytes already
//!   read to find the key, then the rest of the client's stream. Nothing is
//!   buffered beyond what the key needed.
//! * [`Download`]: a backend's response body on its way to the client. It
//!   holds the request's in-flight slot (what bounded load counts) until the
//!   last frame has passed or the client has gone, counts the bytes, and
//!   records the request's duration. A Server-Sent Events stream or a chunked
//!   generation flows through as each frame arrives.
//! * [`Reply`]: what the client gets: a download, or a short answer magpie
//!   writes itself (`502`, `400`, ...).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
use hyper::HeaderMap;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::time::Instant;

use super::clock::Clock;
use super::pool::{Pool, Sender};
use crate::backend::{ActiveGuard, Backend};

/// The error type of every body on this path.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request body: `head` (already read, may be empty), then `rest`.
#[derive(Debug)]
pub struct Upload {
    head: Option<Bytes>,
    rest: Option<Incoming>,
    /// Trailers met while reading the head (then `rest` is `None`).
    trailers: Option<HeaderMap>,
}

impl Upload {
    /// The client's body, untouched.
    pub fn streaming(body: Incoming) -> Upload {
        Upload {
            head: None,
            rest: Some(body),
            trailers: None,
        }
    }

    /// `head` then whatever of `rest` is left (`None`: the body ended).
    pub fn replay(head: Bytes, rest: Option<Incoming>) -> Upload {
        Upload {
            head: (!head.is_empty()).then_some(head),
            rest,
            trailers: None,
        }
    }

    /// Sends `trailers` after the head (for a body read to its end).
    pub fn with_trailers(mut self, trailers: Option<HeaderMap>) -> Upload {
        self.trailers = trailers;
        self
    }
}

impl Body for Upload {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(head) = self.head.take() {
            return Poll::Ready(Some(Ok(Frame::data(head))));
        }
        if let Some(trailers) = self.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        match self.rest.as_mut() {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_none()
            && self.trailers.is_none()
            && self.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let head = self.head.as_ref().map_or(0, |h| h.len() as u64);
        let rest = self
            .rest
            .as_ref()
            .map_or(SizeHint::with_exact(0), |r| r.size_hint());
        // Upper first: a lower bound above the old upper would not be allowed.
        let mut hint = SizeHint::new();
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(head));
        }
        hint.set_lower(rest.lower().saturating_add(head));
        hint
    }
}

/// A request in flight to a backend, from the moment it was sent.
pub struct InFlight {
    pub backend: Arc<Backend>,
    /// The backend's in-flight slot (bounded load counts these).
    pub slot: ActiveGuard,
    pub sent: Instant,
    /// The connection it went over, back to the pool at the response's end.
    pub connection: (Arc<Pool>, Sender),
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("backend", &self.backend.name)
            .field("sent", &self.sent)
            .finish()
    }
}

/// A backend's response body, counted and timed on its way to the client.
#[derive(Debug)]
pub struct Download {
    body: Incoming,
    /// `Some` until the body ended (or failed); then the slot is given back.
    in_flight: Option<InFlight>,
}

impl Download {
    pub fn new(body: Incoming, in_flight: InFlight) -> Download {
        Download {
            body,
            in_flight: Some(in_flight),
        }
    }

    /// The response ended: time it, and give the connection back when the
    /// body was read to its end (`complete`), else let it close.
    fn finish(&mut self, complete: bool) {
        if let Some(f) = self.in_flight.take() {
            f.backend
                .live
                .traffic
                .request_duration
                .observe(f.sent.elapsed());
            if complete {
                let (pool, sender) = f.connection;
                pool.checkin(f.backend.addr, sender);
            }
        }
    }
}

impl Body for Download {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(f)) = (frame.data_ref(), &self.in_flight) {
                    f.backend.live.traffic.add_bytes_received(data.len() as u64);
                }
            }
            Poll::Ready(None) => self.finish(true),
            Poll::Ready(Some(Err(_))) => self.finish(false),
            Poll::Pending => {}
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

impl Drop for Download {
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

/// What magpie answers a client with: a backend's response, or a short
/// answer of its own. When it is dropped (sent, or abandoned), the client
/// connection's [`Clock`] goes back to idle.
#[derive(Debug)]
pub struct Reply {
    body: ReplyBody,
    on_end: Option<Arc<Clock>>,
}

#[derive(Debug)]
enum ReplyBody {
    Download(Download),
    Local(Full<Bytes>),
}

impl Reply {
    pub fn text(body: impl Into<Bytes>) -> Reply {
        Reply {
            body: ReplyBody::Local(Full::new(body.into())),
            on_end: None,
        }
    }

    pub fn download(download: Download) -> Reply {
        Reply {
            body: ReplyBody::Download(download),
            on_end: None,
        }
    }

    /// Sets `clock` idle when this reply is done.
    pub fn ending(mut self, clock: Arc<Clock>) -> Reply {
        self.on_end = Some(clock);
        self
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if let Some(clock) = &self.on_end {
            clock.idle();
        }
    }
}

impl Body for Reply {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().body {
            ReplyBody::Download(d) => Pin::new(d).poll_frame(cx),
            ReplyBody::Local(full) => Pin::new(full)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(|never| match never {}))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.body {
            ReplyBody::Download(d) => d.is_end_stream(),
            ReplyBody::Local(full) => full.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.body {
            ReplyBody::Download(d) => d.size_hint(),
            ReplyBody::Local(full) => full.size_hint(),
        }
    }
}
