//! A backend's response head as the pass-through takes it: parsed in place,
//! its framing decided (RFC 9112 §6.3), and written again for the client
//! with its hop-by-hop headers left out and magpie's own added.

use std::mem::MaybeUninit;

use httparse::{Header, ParserConfig, Status};

use super::framing::Framing;
use crate::http::fields::{BACKEND_HEADER, HOP_BY_HOP_BUT_FRAMING, usage_reader};
use magpie_core::usage::UsageScanner;

/// The most header fields one response head may have.
const MAX_HEADERS: usize = 100;

/// What the bytes at the start of a backend's answer came to.
pub(crate) enum Parsed {
    /// The head is not complete yet.
    Partial,
    /// Not a response head magpie can pass on.
    Invalid,
    /// An interim `1xx` answer (not `101`) of this many bytes: skipped.
    Interim(usize),
    /// `101 Switching Protocols`, which magpie never asks for.
    Switched,
    Ready(ResponseHead),
}

/// A response head, written again for the client.
pub(crate) struct ResponseHead {
    /// Its length in the backend's bytes; the body starts there.
    pub(crate) len: usize,
    pub(crate) status: u16,
    pub(crate) framing: Framing,
    /// The backend closes the connection after this response.
    pub(crate) close: bool,
    /// A successful, uncompressed JSON or event-stream answer's usage reader.
    pub(crate) usage: Option<UsageScanner>,
    /// The status line and header fields for the client, without the empty
    /// line that ends them (magpie may add fields).
    pub(crate) client: Vec<u8>,
}

/// What a response head is read for.
pub(crate) struct Request<'a> {
    /// The request was `HEAD`: no body follows, whatever the head says.
    pub(crate) head_method: bool,
    /// `x-magpie-backend`'s value, when `http.expose_backend` is on.
    pub(crate) expose: Option<&'a str>,
}

/// Parses the response head at the start of `buf`.
pub(crate) fn parse(buf: &[u8], request: &Request<'_>) -> Parsed {
    let mut slots = [const { MaybeUninit::<Header<'_>>::uninit() }; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut []);
    let parsed =
        ParserConfig::default().parse_response_with_uninit_headers(&mut response, buf, &mut slots);
    let len = match parsed {
        Ok(Status::Complete(len)) => len,
        Ok(Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Invalid,
    };
    let (Some(version), Some(status)) = (response.version, response.code) else {
        return Parsed::Invalid;
    };
    match status {
        101 => return Parsed::Switched,
        100..=199 => return Parsed::Interim(len),
        _ => {}
    }
    let headers = &*response.headers;
    let Some(fields) = Fields::of(headers) else {
        return Parsed::Invalid;
    };
    let framing = if request.head_method || status == 204 || status == 304 {
        Framing::Empty
    } else {
        fields.framing
    };
    let usage = usage_reader(status, fields.encoded, fields.content_type);
    let line = StatusLine {
        status,
        reason: response.reason.unwrap_or(""),
    };
    Parsed::Ready(ResponseHead {
        len,
        status,
        framing,
        // An HTTP/1.0 answer keeps no connection open that magpie relies on.
        close: fields.close || version == 0 || framing == Framing::Close,
        usage,
        client: client_head(&line, headers, &fields, request.expose),
    })
}

/// What the header fields say.
struct Fields<'h> {
    framing: Framing,
    close: bool,
    /// `Content-Encoding` is set: the usage cannot be read.
    encoded: bool,
    content_type: Option<&'h str>,
    /// Transfer-Encoding frames the body: Content-Length is not passed on.
    chunked_or_coded: bool,
    named: Vec<&'h str>,
}

impl<'h> Fields<'h> {
    /// `None` for a head whose framing cannot be trusted (lengths that differ).
    fn of(headers: &[Header<'h>]) -> Option<Fields<'h>> {
        let mut length: Option<u64> = None;
        let mut coded = false;
        let mut last_chunked = false;
        let mut fields = Fields {
            framing: Framing::Close,
            close: false,
            encoded: false,
            content_type: None,
            chunked_or_coded: false,
            named: Vec::new(),
        };
        for h in headers {
            let name = h.name;
            if name.eq_ignore_ascii_case("content-length") {
                let n = std::str::from_utf8(h.value).ok()?.trim().parse().ok()?;
                if length.is_some_and(|l| l != n) {
                    return None;
                }
                length = Some(n);
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                coded = true;
                let value = std::str::from_utf8(h.value).ok()?;
                let last = value.rsplit(',').next().unwrap_or("").trim();
                last_chunked = last.eq_ignore_ascii_case("chunked");
            } else if name.eq_ignore_ascii_case("connection") {
                for token in std::str::from_utf8(h.value).ok()?.split(',').map(str::trim) {
                    if token.eq_ignore_ascii_case("close") {
                        fields.close = true;
                    } else if !token.eq_ignore_ascii_case("keep-alive") && !token.is_empty() {
                        fields.named.push(token);
                    }
                }
            } else if name.eq_ignore_ascii_case("content-encoding") {
                fields.encoded = true;
            } else if name.eq_ignore_ascii_case("content-type") {
                fields.content_type = std::str::from_utf8(h.value).ok();
            }
        }
        fields.chunked_or_coded = coded;
        fields.framing = match (coded, length) {
            (true, _) if last_chunked => Framing::Chunked,
            (true, _) => Framing::Close,
            (false, Some(n)) => Framing::Length(n),
            (false, None) => Framing::Close,
        };
        Some(fields)
    }
}

struct StatusLine<'a> {
    status: u16,
    reason: &'a str,
}

/// The status line and fields for the client: HTTP/1.1, hop-by-hop fields
/// (and a `Content-Length` beside a transfer coding) left out, the backend
/// named when asked.
fn client_head(
    line: &StatusLine<'_>,
    headers: &[Header<'_>],
    fields: &Fields<'_>,
    expose: Option<&str>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"HTTP/1.1 ");
    let mut code = [0u8; 3];
    code[0] = b'0' + (line.status / 100 % 10) as u8;
    code[1] = b'0' + (line.status / 10 % 10) as u8;
    code[2] = b'0' + (line.status % 10) as u8;
    out.extend_from_slice(&code);
    out.push(b' ');
    out.extend_from_slice(line.reason.as_bytes());
    out.extend_from_slice(b"\r\n");
    for h in headers {
        // `Transfer-Encoding` passes with the body it frames; a
        // `Content-Length` beside it is left out.
        let dropped = HOP_BY_HOP_BUT_FRAMING
            .iter()
            .chain(&fields.named)
            .any(|n| h.name.eq_ignore_ascii_case(n))
            || (fields.chunked_or_coded && h.name.eq_ignore_ascii_case("content-length"))
            || (expose.is_some() && h.name.eq_ignore_ascii_case(BACKEND_HEADER));
        if !dropped {
            out.extend_from_slice(h.name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(h.value);
            out.extend_from_slice(b"\r\n");
        }
    }
    if let Some(name) = expose {
        out.extend_from_slice(BACKEND_HEADER.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(head: &str, request: Request<'_>) -> ResponseHead {
        match parse(head.as_bytes(), &request) {
            Parsed::Ready(r) => r,
            _ => panic!("not a head: {head:?}"),
        }
    }

    const GET: Request<'static> = Request {
        head_method: false,
        expose: None,
    };

    #[test]
    fn framing_by_status_method_and_fields() {
        let r = ready("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", GET);
        assert_eq!((r.len, r.framing, r.close), (38, Framing::Length(5), false));
        let r = ready(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
            GET,
        );
        assert_eq!(r.framing, Framing::Chunked);
        assert!(!String::from_utf8_lossy(&r.client).contains("Content-Length"));
        let r = ready("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", GET);
        assert_eq!((r.framing, r.close), (Framing::Close, true));
        let r = ready("HTTP/1.1 200 OK\r\n\r\n", GET);
        assert_eq!((r.framing, r.close), (Framing::Close, true));
        let r = ready("HTTP/1.1 204 No Content\r\n\r\n", GET);
        assert_eq!(r.framing, Framing::Empty);
        let head = Request {
            head_method: true,
            expose: None,
        };
        let r = ready("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", head);
        assert_eq!(r.framing, Framing::Empty);
        let r = ready("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", GET);
        assert!(r.close);
        let r = ready(
            "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
            GET,
        );
        assert!(r.close);
    }

    #[test]
    fn interim_switched_and_invalid_answers() {
        assert!(matches!(
            parse(b"HTTP/1.1 100 Continue\r\n\r\n", &GET),
            Parsed::Interim(25)
        ));
        assert!(matches!(
            parse(b"HTTP/1.1 101 Switching Protocols\r\n\r\n", &GET),
            Parsed::Switched
        ));
        assert!(matches!(
            parse(b"HTTP/1.1 200 OK\r\nContent-Len", &GET),
            Parsed::Partial
        ));
        assert!(matches!(
            parse(
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                &GET
            ),
            Parsed::Invalid
        ));
        assert!(matches!(parse(b"SSH-2.0\r\n\r\n", &GET), Parsed::Invalid));
    }

    #[test]
    fn the_client_gets_the_fields_but_hop_by_hop_ones_and_the_backend_named() {
        let request = Request {
            head_method: false,
            expose: Some("b1"),
        };
        let r = ready(
            "HTTP/1.1 200 Fine\r\nConnection: keep-alive, x-hop\r\nKeep-Alive: timeout=5\r\nX-Hop: 1\r\nContent-Type: text/event-stream\r\nx-magpie-backend: forged\r\nContent-Length: 0\r\n\r\n",
            request,
        );
        assert_eq!(
            String::from_utf8(r.client).unwrap(),
            "HTTP/1.1 200 Fine\r\nContent-Type: text/event-stream\r\nContent-Length: 0\r\nx-magpie-backend: b1\r\n"
        );
        assert!(r.usage.is_some());
    }
}
