//! Requests magpie refuses itself, before reading a byte of their body or
//! choosing a backend (RFC 9110, 9112; what HAProxy refuses too):
//!
//! | request | answer |
//! |---|---|
//! | `CONNECT` (magpie does not tunnel) | `405`, with `Allow` |
//! | an authority-form target (`GET host:443`) without `CONNECT` | `400` |
//! | more than one `Host` | `400` |
//! | `chunked` more than once in `Transfer-Encoding` | `400` |
//! | any transfer coding besides `chunked` | `501` |
//!
//! hyper itself answers `400` to a `Transfer-Encoding` whose last coding is
//! not `chunked`, and to a malformed head. Each refusal here is counted in
//! `magpie_client_failures_total{reason="bad_request"}`.

use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tracing::debug;

use super::hyper_wire::local;
use super::reply::Reply;
use crate::net::Client;
use crate::telemetry::stats::{ClientFailure, Stats};

/// The methods magpie forwards: every standard one but `CONNECT`.
const ALLOW: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS, TRACE, PATCH";

/// Why a request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    Connect,
    AuthorityForm,
    DuplicateHost,
    ChunkedTwice,
    UnknownCoding,
}

impl Refusal {
    /// The refusal `request` earns, if any.
    pub(crate) fn of<B>(request: &Request<B>) -> Option<Refusal> {
        let uri = request.uri();
        if request.method() == Method::CONNECT {
            return Some(Refusal::Connect);
        }
        if uri.scheme().is_none() && uri.authority().is_some() {
            return Some(Refusal::AuthorityForm);
        }
        if request.headers().get_all(header::HOST).iter().count() > 1 {
            return Some(Refusal::DuplicateHost);
        }
        transfer_coding(request.headers())
    }

    /// magpie's one-line answer; the connection closes after it.
    pub(crate) fn reply(self) -> Response<Reply> {
        let (status, text) = match self {
            Refusal::Connect => (
                StatusCode::METHOD_NOT_ALLOWED,
                "magpie: CONNECT is not supported (magpie does not tunnel)\n",
            ),
            Refusal::AuthorityForm => (
                StatusCode::BAD_REQUEST,
                "magpie: an authority-form target is only for CONNECT\n",
            ),
            Refusal::DuplicateHost => (
                StatusCode::BAD_REQUEST,
                "magpie: the request has more than one Host header\n",
            ),
            Refusal::ChunkedTwice => (
                StatusCode::BAD_REQUEST,
                "magpie: the chunked transfer coding is applied more than once\n",
            ),
            Refusal::UnknownCoding => (
                StatusCode::NOT_IMPLEMENTED,
                "magpie: only the chunked transfer coding is supported\n",
            ),
        };
        let mut response = local(status, text);
        let headers = response.headers_mut();
        if self == Refusal::Connect {
            headers.insert(header::ALLOW, HeaderValue::from_static(ALLOW));
        }
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        response
    }
}

/// Refuses `request` if it must be: its answer, counted in `stats`.
pub(crate) fn refuse<B>(
    request: &Request<B>,
    stats: &Stats,
    client: Client,
) -> Option<Response<Reply>> {
    let refusal = Refusal::of(request)?;
    debug!(%client, ?refusal, method = %request.method(), "request refused");
    stats.count_client_failure(ClientFailure::BadRequest);
    Some(refusal.reply())
}

/// `Transfer-Encoding`, every line of it: `chunked` once and nothing else.
fn transfer_coding(headers: &HeaderMap) -> Option<Refusal> {
    let mut chunked = 0;
    for value in headers.get_all(header::TRANSFER_ENCODING) {
        let Ok(value) = value.to_str() else {
            return Some(Refusal::UnknownCoding);
        };
        for coding in value.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            if !coding.eq_ignore_ascii_case("chunked") {
                return Some(Refusal::UnknownCoding);
            }
            chunked += 1;
        }
    }
    (chunked > 1).then_some(Refusal::ChunkedTwice)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(method: &str, target: &str, headers: &[(&str, &str)]) -> Option<Refusal> {
        let mut request = Request::builder().method(method).uri(target);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        Refusal::of(&request.body(()).expect("a request"))
    }

    #[test]
    fn each_refusal_and_what_passes() {
        assert_eq!(refusal("CONNECT", "a:443", &[]), Some(Refusal::Connect));
        assert_eq!(refusal("GET", "a:443", &[]), Some(Refusal::AuthorityForm));
        assert_eq!(refusal("GET", "http://a/x", &[]), None);
        let two_hosts = [("host", "a"), ("host", "b")];
        assert_eq!(
            refusal("GET", "/", &two_hosts),
            Some(Refusal::DuplicateHost)
        );
        let te = |v: &'static str| refusal("POST", "/", &[("transfer-encoding", v)]);
        assert_eq!(te("chunked"), None);
        assert_eq!(te("Chunked"), None);
        assert_eq!(te("gzip, chunked"), Some(Refusal::UnknownCoding));
        assert_eq!(te("identity"), Some(Refusal::UnknownCoding));
        assert_eq!(te("chunked, chunked"), Some(Refusal::ChunkedTwice));
        let split = [
            ("transfer-encoding", "chunked"),
            ("transfer-encoding", "chunked"),
        ];
        assert_eq!(refusal("POST", "/", &split), Some(Refusal::ChunkedTwice));
    }
}
