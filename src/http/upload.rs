//! A request body on its way to the backend: the bytes already read to find
//! the key, then the rest of the client's stream, frame by frame. Nothing is
//! buffered beyond what the key needed.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::HeaderMap;
use hyper::body::{Body, Frame, Incoming, SizeHint};

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
