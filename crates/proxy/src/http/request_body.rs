//! A request body on its way to the backend: the bytes already read to find
//! the key, then the rest of the client's stream, frame by frame. Nothing is
//! buffered beyond what the key needed, and what was is counted in the key
//! budget ([`Held`]) until it has been handed on.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::HeaderMap;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use crate::telemetry::key_budget::Held;

/// A request body: `head` (the chunks already read, may be none), then
/// `rest`.
#[derive(Debug)]
pub(crate) struct RequestBody {
    head: VecDeque<Bytes>,
    /// The key budget's share of `head`, given back once it is sent on.
    held: Option<Held>,
    rest: Option<Incoming>,
    /// Trailers met while reading the head (then `rest` is `None`).
    trailers: Option<HeaderMap>,
}

impl RequestBody {
    /// The client's body, untouched.
    pub(crate) fn streaming(body: Incoming) -> RequestBody {
        RequestBody {
            head: VecDeque::new(),
            held: None,
            rest: Some(body),
            trailers: None,
        }
    }

    /// The chunks of `head` then whatever of `rest` is left (`None`: the
    /// body ended); `held` is given back once `head` is sent on.
    pub(crate) fn replay(
        head: impl IntoIterator<Item = Bytes>,
        held: Held,
        rest: Option<Incoming>,
    ) -> RequestBody {
        RequestBody {
            head: head.into_iter().filter(|b| !b.is_empty()).collect(),
            held: Some(held),
            rest,
            trailers: None,
        }
    }

    /// Bytes read already and held until they are sent on.
    pub(crate) fn held(&self) -> u64 {
        self.head.iter().map(|b| b.len() as u64).sum()
    }

    /// The body, when it was read whole (and is not empty).
    pub(crate) fn whole(&self) -> Option<Vec<u8>> {
        if self.rest.is_some() || self.head.is_empty() {
            return None;
        }
        Some(self.head.iter().flat_map(|b| b.iter().copied()).collect())
    }

    /// The body rewritten by `edit`, when it was read whole and `edit`
    /// gives a new one (its length); else as it was.
    pub(crate) fn rewrite(&mut self, edit: impl FnOnce(&[u8]) -> Option<Vec<u8>>) -> Option<u64> {
        let new = edit(&self.whole()?)?;
        let len = new.len() as u64;
        self.head = VecDeque::from([Bytes::from(new)]);
        Some(len)
    }

    /// Sends `trailers` after the head (for a body read to its end).
    pub(crate) fn with_trailers(mut self, trailers: Option<HeaderMap>) -> RequestBody {
        self.trailers = trailers;
        self
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(head) = self.head.pop_front() {
            if self.head.is_empty() {
                self.held = None;
            }
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
        self.head.is_empty()
            && self.trailers.is_none()
            && self.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let head: u64 = self.head.iter().map(|h| h.len() as u64).sum();
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
