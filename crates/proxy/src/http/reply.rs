//! What a client gets: a backend's response streamed through
//! ([`ResponseBody`]), or a short answer magpie writes itself (`502`, `504`,
//! `400`, ...). A reply holds its request's [`Busy`] mark on the client
//! connection's clock: when it is dropped (sent, or abandoned) the
//! connection idles, so its keep-alive deadline starts then. A backend body that
//! fails half-way marks the connection cut, so an HTTP/1 client sees a reset
//! rather than an end.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame, SizeHint};

use super::client_deadlines::Busy;
use super::response_body::{BoxError, ResponseBody};

/// What magpie answers a client with: a backend's response, or a short
/// answer of its own, and its request's mark on the connection's clock.
#[derive(Debug)]
pub(crate) struct Reply {
    body: ReplyBody,
    busy: Option<Busy>,
}

#[derive(Debug)]
enum ReplyBody {
    /// Boxed: a backend body's bookkeeping (its lease, slot, usage scanner and
    /// timer) is many times a short answer's size.
    Backend(Box<ResponseBody>),
    Local(Full<Bytes>),
}

impl Reply {
    pub(crate) fn text(body: impl Into<Bytes>) -> Reply {
        Reply {
            body: ReplyBody::Local(Full::new(body.into())),
            busy: None,
        }
    }

    pub(crate) fn backend(body: ResponseBody) -> Reply {
        Reply {
            body: ReplyBody::Backend(Box::new(body)),
            busy: None,
        }
    }

    /// Holds `busy` until this reply is done.
    pub(crate) fn ending(mut self, busy: Busy) -> Reply {
        self.busy = Some(busy);
        self
    }
}

impl Body for Reply {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match &mut this.body {
            ReplyBody::Backend(d) => {
                let polled = Pin::new(&mut **d).poll_frame(cx);
                if let (Poll::Ready(Some(Err(_))), Some(busy)) = (&polled, &this.busy) {
                    busy.cut();
                }
                polled
            }
            ReplyBody::Local(full) => Pin::new(full)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(|never| match never {}))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.body {
            ReplyBody::Backend(d) => d.is_end_stream(),
            ReplyBody::Local(full) => full.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.body {
            ReplyBody::Backend(d) => d.size_hint(),
            ReplyBody::Local(full) => full.size_hint(),
        }
    }
}
