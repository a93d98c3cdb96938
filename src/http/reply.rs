//! What a client gets: a backend's response streamed through
//! ([`Download`]), or a short answer magpie writes itself (`502`, `400`, ...).
//! When a reply is dropped (sent, or abandoned), the client connection's
//! [`Clock`] goes back to idle, so its keep-alive deadline starts then.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame, SizeHint};

use super::clock::Clock;
use super::download::{BoxError, Download};

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
