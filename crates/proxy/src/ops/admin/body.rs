//! The admin endpoint's response body: bytes already in memory, handed to
//! hyper in pieces of at most [`CHUNK`] bytes.
//!
//! A `/metrics` body can be tens of megabytes. Given in one piece, hyper
//! would try to write all of it in one call, and the kernel copies what the
//! socket buffer takes (megabytes on loopback) while the admin thread does
//! nothing else. In pieces, each write stays small and `/healthz` or
//! `/readyz` answer between them. The length is known, so the response
//! still carries a `Content-Length`.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Frame, SizeHint};

/// The largest piece handed to hyper at once.
pub(crate) const CHUNK: usize = 64 * 1024;

/// A body of known bytes, yielded [`CHUNK`] at a time.
#[derive(Debug, Default)]
pub(crate) struct Body {
    rest: Bytes,
}

impl Body {
    pub(crate) fn new(bytes: impl Into<Bytes>) -> Body {
        Body { rest: bytes.into() }
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.rest.is_empty() {
            return Poll::Ready(None);
        }
        let n = self.rest.len().min(CHUNK);
        Poll::Ready(Some(Ok(Frame::data(self.rest.split_to(n)))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.rest.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_body_comes_in_pieces_of_at_most_a_chunk_and_whole() {
        let bytes: Vec<u8> = (0..(2 * CHUNK + 7)).map(|i| (i % 251) as u8).collect();
        let mut body = Body::new(bytes.clone());
        assert_eq!(
            hyper::body::Body::size_hint(&body).exact(),
            Some(bytes.len() as u64)
        );
        let mut sizes = Vec::new();
        let mut got = Vec::new();
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            sizes.push(data.len());
            got.extend_from_slice(&data);
        }
        assert_eq!(sizes, vec![CHUNK, CHUNK, 7]);
        assert_eq!(got, bytes);
        assert!(hyper::body::Body::is_end_stream(&Body::new(Bytes::new())));
    }
}
