//! A request head as the pass-through takes it: parsed in place (the crate
//! `httparse`, no allocation), checked, keyed, and written again for the
//! backend with its hop-by-hop headers left out, every other byte as it
//! came (a `Content-Length` goes last, so a body rewritten for the engine's
//! priority can restate it).
//!
//! Only plain HTTP/1.1 requests are taken: an origin-form target, one
//! `Host`, a body framed by one `Content-Length` or by `chunked` alone (or
//! none), no `Expect` and no `Upgrade`. Anything else (HTTP/1.0, HTTP/2's
//! preface, an absolute-form or authority-form target, `CONNECT`, a head
//! `httparse` refuses, framing that needs normalising) is handed over:
//! hyper serves the connection from that request on, with the refusals of
//! [`super::super::normalize`]. So each rule of RFC 9112 lives in one
//! place, and the pass-through never forwards what it did not understand.

use std::io::Write;
use std::mem::MaybeUninit;
use std::sync::Arc;

use httparse::{Header, Status};

use super::framing::Framing;
use crate::config::QueueConfig;
use crate::http::fields::HOP_BY_HOP_BUT_FRAMING;
use crate::http::request_key::{HeadKeys, KeyPlan, head_keys};
use crate::http::request_log::{Arrival, RequestLine, RequestLog};
use crate::routing::instance::Instance;
use crate::routing::queue::Standing;

/// The most header fields one request head may have (hyper's limit too).
pub(crate) const MAX_HEADERS: usize = 100;

/// What a buffer holding the start of a request came to.
pub(crate) enum Parse<'a> {
    /// The head is not complete yet.
    Partial,
    /// Not for the pass-through: hyper serves the connection from here.
    Handover(Handover),
    Ready(Box<Head<'a>>),
}

/// Why a request is handed over to hyper, which serves its connection from
/// then on. The list is short on purpose: each case is rare from the
/// clients magpie serves, and for each hyper's path already keeps the rule
/// (its parser's, or [`crate::http::normalize`]'s), so no rule of RFC 9112
/// is written twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handover {
    /// `httparse` refused the head (HTTP/2's preface among them): hyper
    /// answers `400`, or speaks HTTP/2.
    Unparsed,
    /// HTTP/1.0: its keep-alive and framing rules are hyper's.
    Http10,
    /// `CONNECT` (refused with `405`) or a target that is not origin-form
    /// (an authority-form one is refused, an absolute-form one rewritten).
    Target,
    /// Framing to refuse or normalise: no `Host` or several, several
    /// `Content-Length`s or one beside `Transfer-Encoding`, a coding other
    /// than `chunked`, or a `Connection` that names a framing field.
    Framing,
    /// `Expect` or `Upgrade`: an exchange the pass-through does not hold.
    ExpectOrUpgrade,
}

/// A request head, checked and written again for the backend.
pub(crate) struct Head<'a> {
    /// Its length in the buffer; the body (if any) starts there.
    pub(crate) len: usize,
    pub(crate) framing: Framing,
    /// A `HEAD` request: its answer has no body, whatever its headers say.
    pub(crate) head_method: bool,
    /// It carries a body (a length above 0, or chunked).
    pub(crate) with_body: bool,
    /// The client asked to close the connection after this request.
    pub(crate) close: bool,
    /// The head as the backend gets it.
    pub(crate) upstream: Vec<u8>,
    pub(crate) keys: HeadKeys<'a>,
    /// The access-log line, when the log samples the request.
    pub(crate) log: Option<RequestLog>,
    /// Its class and tenant (with a header's tenant), for the queue.
    pub(crate) standing: Standing,
}

/// What a head is read with.
pub(crate) struct Context<'a, 's> {
    pub(crate) plan: KeyPlan<'a>,
    pub(crate) queue: Option<&'a QueueConfig>,
    pub(crate) arrival: Arrival,
    pub(crate) instance: &'s Arc<Instance>,
}

/// Parses the request at the start of `buf`.
pub(crate) fn parse<'a>(buf: &[u8], cx: &Context<'a, '_>) -> Parse<'a> {
    let mut slots = [const { MaybeUninit::<Header<'_>>::uninit() }; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut []);
    let len = match request.parse_with_uninit_headers(buf, &mut slots) {
        Ok(Status::Complete(len)) => len,
        Ok(Status::Partial) => return Parse::Partial,
        Err(_) => return Parse::Handover(Handover::Unparsed),
    };
    let (Some(method), Some(target), Some(version)) =
        (request.method, request.path, request.version)
    else {
        return Parse::Handover(Handover::Unparsed);
    };
    if version != 1 {
        return Parse::Handover(Handover::Http10);
    }
    if method == "CONNECT" || !target.starts_with('/') {
        return Parse::Handover(Handover::Target);
    }
    let headers = &*request.headers;
    let checked = match Checked::of(headers) {
        Ok(checked) => checked,
        Err(why) => return Parse::Handover(why),
    };
    let header = |name: &str| {
        headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
            .filter(|v| !v.trim_ascii().is_empty())
    };
    let line = RequestLine {
        method,
        path: target,
        protocol: "HTTP/1.1",
        header: &header,
    };
    let log = RequestLog::begin(line, cx.arrival, cx.instance);
    let keys = head_keys(&cx.plan, header, header("content-type"));
    let standing = Standing::of(cx.queue, header);
    Parse::Ready(Box::new(Head {
        len,
        framing: checked.framing,
        head_method: method == "HEAD",
        with_body: !matches!(checked.framing, Framing::Empty | Framing::Length(0)),
        close: checked.close,
        upstream: upstream_head(
            method,
            target,
            headers,
            &checked.named,
            (len, checked.framing),
        ),
        keys,
        log,
        standing,
    }))
}

/// What the header fields say of a request's framing and connection.
struct Checked<'h> {
    framing: Framing,
    close: bool,
    /// Further names the `Connection` header lists: hop-by-hop too.
    named: Vec<&'h str>,
}

impl<'h> Checked<'h> {
    /// Why the request is not for the pass-through, when it is not.
    fn of(headers: &[Header<'h>]) -> Result<Checked<'h>, Handover> {
        let mut hosts = 0;
        let mut length = None;
        let mut chunked = false;
        let mut close = false;
        let mut named = Vec::new();
        for h in headers {
            let name = h.name;
            if name.eq_ignore_ascii_case("host") {
                hosts += 1;
            } else if name.eq_ignore_ascii_case("content-length") {
                if length.is_some() {
                    return Err(Handover::Framing);
                }
                length = Some(content_length(h.value).ok_or(Handover::Framing)?);
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                if chunked || !h.value.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                    return Err(Handover::Framing);
                }
                chunked = true;
            } else if name.eq_ignore_ascii_case("connection") {
                let tokens = std::str::from_utf8(h.value).map_err(|_| Handover::Framing)?;
                for token in tokens.split(',') {
                    match token.trim() {
                        t if t.eq_ignore_ascii_case("close") => close = true,
                        t if t.eq_ignore_ascii_case("keep-alive") || t.is_empty() => {}
                        // A client may not have magpie drop what frames
                        // or names the request, nor ask for a tunnel.
                        t if ["content-length", "transfer-encoding", "host", "upgrade"]
                            .iter()
                            .any(|n| t.eq_ignore_ascii_case(n)) =>
                        {
                            return Err(Handover::Framing);
                        }
                        t => named.push(t),
                    }
                }
            } else if name.eq_ignore_ascii_case("expect") || name.eq_ignore_ascii_case("upgrade") {
                return Err(Handover::ExpectOrUpgrade);
            }
        }
        let framing = match (length, chunked) {
            (Some(_), true) => return Err(Handover::Framing),
            (Some(n), false) => Framing::Length(n),
            (None, true) => Framing::Chunked,
            (None, false) => Framing::Empty,
        };
        if hosts != 1 {
            return Err(Handover::Framing);
        }
        Ok(Checked {
            framing,
            close,
            named,
        })
    }
}

/// A `Content-Length` value: 1 to 19 digits, nothing else.
fn content_length(value: &[u8]) -> Option<u64> {
    let digits = value.trim_ascii();
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// The request line and header fields as the backend gets them: HTTP/1.1,
/// hop-by-hop fields left out.
fn upstream_head(
    method: &str,
    target: &str,
    headers: &[Header<'_>],
    named: &[&str],
    (len, framing): (usize, Framing),
) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 16);
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for h in headers {
        // `Transfer-Encoding` passes with the body it frames.
        let hop = HOP_BY_HOP_BUT_FRAMING
            .iter()
            .chain(named)
            .chain(&["content-length"])
            .any(|n| h.name.eq_ignore_ascii_case(n));
        if !hop {
            out.extend_from_slice(h.name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(h.value);
            out.extend_from_slice(b"\r\n");
        }
    }
    end_head(&mut out, framing);
    out
}

/// The head's last field, the body's `Content-Length` (when it has one),
/// and the blank line.
fn end_head(out: &mut Vec<u8>, framing: Framing) {
    if let Framing::Length(n) = framing {
        // Writing to a Vec cannot fail.
        let _ = write!(out, "content-length: {n}\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

impl Head<'_> {
    /// Sends `body` in place of the request's own, whole, after the head
    /// (its `Content-Length` restated): the body read for the keys,
    /// rewritten for the engine's priority.
    pub(crate) fn replace_body(&mut self, body: &[u8]) {
        self.framing = replace_body(&mut self.upstream, self.framing, body);
    }
}

/// `upstream`, a head [`upstream_head`] wrote with `framing`, restated for
/// `body` and followed by it; the new framing. A body without a length is
/// left alone.
fn replace_body(upstream: &mut Vec<u8>, framing: Framing, body: &[u8]) -> Framing {
    let Framing::Length(n) = framing else {
        return framing;
    };
    let ending = format!("content-length: {n}\r\n\r\n");
    if !upstream.ends_with(ending.as_bytes()) {
        return framing;
    }
    upstream.truncate(upstream.len() - ending.len());
    let framing = Framing::Length(body.len() as u64);
    end_head(upstream, framing);
    upstream.extend_from_slice(body);
    framing
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(head: &str) -> Result<(Framing, bool, Vec<String>), Handover> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut request = httparse::Request::new(&mut headers);
        request.parse(head.as_bytes()).expect("a head");
        Checked::of(request.headers).map(|c| {
            let named = c.named.iter().map(|n| n.to_string()).collect();
            (c.framing, c.close, named)
        })
    }

    #[test]
    fn framing_and_connection_options() {
        let h = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\nConnection: close, X-Private\r\n\r\n";
        assert_eq!(
            checked(h),
            Ok((Framing::Length(12), true, vec!["X-Private".to_string()]))
        );
        let h = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n";
        assert_eq!(checked(h), Ok((Framing::Chunked, false, vec![])));
        let h = "GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\n\r\n";
        assert_eq!(checked(h), Ok((Framing::Empty, false, vec![])));
    }

    #[test]
    fn what_is_handed_over() {
        for h in [
            // No Host, or two.
            "GET / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            // Framing hyper normalises or refuses.
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            // What must not be dropped, tunnels and interim answers.
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nConnection: content-length\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
        ] {
            assert_eq!(checked(h), Err(Handover::Framing), "{h:?}");
        }
        for h in [
            "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
        ] {
            assert_eq!(checked(h), Err(Handover::ExpectOrUpgrade), "{h:?}");
        }
    }

    #[test]
    fn the_backend_gets_the_fields_as_they_came_but_hop_by_hop_ones() {
        let head = "POST /v1/chat?x=1 HTTP/1.1\r\nHost: a\r\nX-Session-Id:  s1 \r\nConnection: x-private\r\nKeep-Alive: timeout=5\r\nX-Private: 1\r\nTE: trailers\r\nTransfer-Encoding: chunked\r\n\r\n";
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut request = httparse::Request::new(&mut headers);
        let len = request.parse(head.as_bytes()).unwrap().unwrap();
        let framing = (len, Framing::Chunked);
        let out = upstream_head(
            "POST",
            "/v1/chat?x=1",
            request.headers,
            &["x-private"],
            framing,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /v1/chat?x=1 HTTP/1.1\r\nHost: a\r\nX-Session-Id: s1\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
    }

    #[test]
    fn a_length_goes_last_and_is_restated_for_a_new_body() {
        let head = "POST / HTTP/1.1\r\ncontent-Length: 2\r\nHost: a\r\n\r\n";
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut request = httparse::Request::new(&mut headers);
        let len = request.parse(head.as_bytes()).unwrap().unwrap();
        let mut out = upstream_head("POST", "/", request.headers, &[], (len, Framing::Length(2)));
        let expected = "POST / HTTP/1.1\r\nHost: a\r\ncontent-length: 2\r\n\r\n";
        assert_eq!(String::from_utf8_lossy(&out), expected);
        let framing = replace_body(&mut out, Framing::Length(2), b"{\"priority\":1}");
        assert_eq!(framing, Framing::Length(14));
        assert_eq!(
            String::from_utf8_lossy(&out),
            "POST / HTTP/1.1\r\nHost: a\r\ncontent-length: 14\r\n\r\n{\"priority\":1}"
        );
    }
}
