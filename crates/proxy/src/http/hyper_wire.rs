//! hyper's wire format (`mode: http` over hyper: HTTP/2, and the HTTP/1
//! requests the pass-through hands over): requests written by hyper's
//! HTTP/1.1 client on a pooled connection, answers turned into hyper
//! responses whose body streams back counted ([`ResponseBody`]). The
//! journey ([`super::journey`]) runs everything else.
//!
//! A request goes to the backend as HTTP/1.1 ([`prepare`]): origin-form
//! target, a `Host` header, no hop-by-hop headers, HTTP/2's cookies joined.
//! Its answer loses its hop-by-hop headers and may name the backend
//! (`http.expose_backend`).

use std::io;
use std::sync::Arc;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode, Uri, Version};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::debug;

use super::backend_deadlines::{self, HeadDeadlines, Late, Outgoing, Progress};
use super::fields::{BACKEND_HEADER, HOP_BY_HOP, usage_reader};
use super::journey::{Exchange, Failure, LocalAnswer, Wire};
use super::pool::{self, Conn, Lease, Pool};
use super::reply::Reply;
use super::request_body::RequestBody;
use super::response_body::{InFlight, ResponseBody};
use super::upstream::UpstreamIo;
use crate::config::Config;
use crate::routing::backend::Backend;

/// A request on its way through hyper's client: it is handed back by a
/// connection that closed before it went, for the next.
pub(crate) struct HyperWire<'p> {
    pub(crate) pool: &'p Arc<Pool>,
    request: Option<Request<RequestBody>>,
    /// The client's socket under any TLS.
    socket: &'p TcpStream,
}

impl<'p> HyperWire<'p> {
    /// `request`, prepared for its backend, to go over `pool`'s
    /// connections; its client's `socket`.
    pub(crate) fn new(
        request: Request<RequestBody>,
        pool: &'p Arc<Pool>,
        socket: &'p TcpStream,
    ) -> HyperWire<'p> {
        HyperWire {
            pool,
            request: Some(prepare(request)),
            socket,
        }
    }
}

impl Wire for HyperWire<'_> {
    /// hyper drops a request's future when its HTTP/2 stream is reset; the
    /// client's connection closing is told by its socket, which hyper does
    /// not read while a body waits unread.
    async fn client_gone(&mut self) {
        crate::net::peer_closed(self.socket).await
    }

    type Conn = Conn;
    type Head = Response<Incoming>;

    fn pool(&self) -> &Arc<Pool<Conn>> {
        self.pool
    }

    async fn start(io: UpstreamIo, backend: &Arc<Backend>) -> io::Result<Conn> {
        pool::start(io, backend).await
    }

    async fn ready(conn: &mut Conn) -> bool {
        conn.sender.ready().await.is_ok()
    }

    async fn exchange(
        &mut self,
        backend: &Arc<Backend>,
        mut lease: Lease<Conn>,
        config: &Config,
    ) -> Exchange<Self> {
        let Some(request) = self.request.take() else {
            return Exchange::Failed(Failure::LocalResources);
        };
        let sent = Instant::now();
        let progress = Progress::new();
        let request = request.map(|body| Outgoing::new(body, Arc::clone(&progress)));
        let head = lease.conn.sender.try_send_request(request);
        let deadlines = HeadDeadlines::of(&config.http);
        let answer = match backend_deadlines::response_head(head, &progress, deadlines).await {
            Ok(answer) => answer,
            // The lease is dropped here: its connection closes.
            Err(Late::Response) => {
                return Exchange::Failed(Failure::timed_out(backend, deadlines.response));
            }
            Err(Late::Body) => {
                return Exchange::Failed(Failure::BodyTimeout {
                    after: deadlines.body,
                });
            }
        };
        let mut error = match answer {
            Ok(response) if response.status() == StatusCode::SWITCHING_PROTOCOLS => {
                // The lease is dropped here: its connection closes.
                return Exchange::Failed(Failure::switched(backend));
            }
            Ok(head) => {
                return Exchange::Answered {
                    head,
                    lease,
                    sent,
                    progress,
                };
            }
            Err(error) => error,
        };
        let Some(back) = error.take_message() else {
            let error = error.into_error();
            if error.is_user() {
                // Only the client's body fails as the user's: the backend is
                // not to blame, and its connection is gone with the error.
                debug!(backend = %backend.name, %error, "the request body failed while it was sent");
                return Exchange::Failed(Failure::ClientBody);
            }
            return Exchange::Failed(Failure::after_send(backend, error.into()));
        };
        debug!(backend = %backend.name, fresh = lease.fresh, error = %error.error(), "connection closed before the request was sent");
        self.request = Some(back.map(Outgoing::into_inner));
        Exchange::NotSent { fresh: lease.fresh }
    }

    fn status(head: &Response<Incoming>) -> u16 {
        head.status().as_u16()
    }
}

/// The response to pass on: hop-by-hop headers dropped, the backend named if
/// asked, the body counted until its end (its connection goes back to the
/// pool then).
pub(crate) fn respond(
    response: Response<Incoming>,
    in_flight: InFlight,
    config: &Config,
) -> Response<Reply> {
    let expose = config
        .http
        .expose_backend
        .then(|| HeaderValue::from_bytes(in_flight.backend.name.as_bytes()).ok())
        .flatten();
    let (mut parts, body) = response.into_parts();
    // Only a successful, uncompressed answer reports usage worth reading.
    let content_type = parts.headers.get(header::CONTENT_TYPE);
    let usage = usage_reader(
        parts.status.as_u16(),
        parts.headers.contains_key(header::CONTENT_ENCODING),
        content_type.and_then(|v| v.to_str().ok()),
    );
    strip_hop_by_hop(&mut parts.headers);
    if let Some(name) = expose {
        parts
            .headers
            .insert(HeaderName::from_static(BACKEND_HEADER), name);
    }
    parts.version = Version::HTTP_11;
    let body = ResponseBody::new(body, in_flight, usage);
    Response::from_parts(parts, Reply::backend(body))
}

/// The request as a backend gets it over HTTP/1.1: origin-form target, a
/// `Host` header, no hop-by-hop headers. A target with an authority (HTTP/2's
/// `:authority`, an HTTP/1.1 absolute-form target) names the host, over a
/// differing `Host` (RFC 9113 §8.3.1, RFC 9112 §3.2.2); HTTP/2's `cookie`
/// fields are joined into one (RFC 9113 §8.2.3).
fn prepare<B>(request: Request<B>) -> Request<B> {
    let (mut parts, body) = request.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    if let Some(authority) = parts.uri.authority()
        && let Ok(host) = HeaderValue::from_str(authority.as_str())
    {
        parts.headers.insert(header::HOST, host);
    }
    if parts.version == Version::HTTP_2 {
        join_cookies(&mut parts.headers);
    }
    // HTTP/1 clients send origin-form already; HTTP/2 gives a full URI.
    if parts.uri.scheme().is_some() || parts.uri.authority().is_some() {
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        if let Ok(uri) = path.parse::<Uri>() {
            parts.uri = uri;
        }
    }
    parts.version = Version::HTTP_11;
    Request::from_parts(parts, body)
}

/// Several `cookie` fields become one, joined with `; `, as an HTTP/1.1
/// server expects.
fn join_cookies(headers: &mut HeaderMap) {
    let cookies: Vec<&[u8]> = headers
        .get_all(header::COOKIE)
        .iter()
        .map(HeaderValue::as_bytes)
        .collect();
    if cookies.len() < 2 {
        return;
    }
    if let Ok(joined) = HeaderValue::from_bytes(&cookies.join(&b"; "[..])) {
        headers.insert(header::COOKIE, joined);
    }
}

/// Removes hop-by-hop headers, and those the `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in &named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// magpie's own answer, as hyper sends it.
pub(crate) fn answer(answer: LocalAnswer) -> Response<Reply> {
    let mut r = local(answer.status, answer.text);
    if answer.close {
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    if let Some(seconds) = answer.retry_after {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    r
}

/// A short plain-text answer from magpie itself.
pub(crate) fn local(status: StatusCode, text: impl Into<Bytes>) -> Response<Reply> {
    let mut r = Response::new(Reply::text(text));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go_with_those_connection_names() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, "keep-alive, x-private".parse().unwrap());
        h.insert("x-private", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
        h.insert("x-session-id", "s".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-session-id"));
    }

    #[test]
    fn http2_cookies_join_and_authority_names_the_host() {
        let request = Request::get("http://right.example/p?q")
            .version(Version::HTTP_2)
            .header(header::HOST, "wrong.example")
            .header(header::COOKIE, "a=1")
            .header(header::COOKIE, "b=2")
            .body(())
            .unwrap();
        let prepared = prepare(request);
        let h = prepared.headers();
        assert_eq!(h.get_all(header::HOST).iter().count(), 1);
        assert_eq!(h[header::HOST], "right.example");
        assert_eq!(h.get_all(header::COOKIE).iter().count(), 1);
        assert_eq!(h[header::COOKIE], "a=1; b=2");
        assert_eq!(prepared.uri(), "/p?q");
        // An HTTP/1.1 absolute-form target too; an origin-form one keeps
        // its Host, and its cookies as they came.
        let request = Request::get("http://right.example/")
            .header(header::HOST, "other.example")
            .body(())
            .unwrap();
        assert_eq!(prepare(request).headers()[header::HOST], "right.example");
        let request = Request::get("/")
            .header(header::HOST, "other.example")
            .header(header::COOKIE, "a=1")
            .header(header::COOKIE, "b=2")
            .body(())
            .unwrap();
        let prepared = prepare(request);
        assert_eq!(prepared.headers()[header::HOST], "other.example");
        assert_eq!(prepared.headers().get_all(header::COOKIE).iter().count(), 2);
    }
}
