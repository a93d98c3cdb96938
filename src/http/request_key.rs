//! The key of one HTTP request: a header, a JSON body field, the
//! conversation's head, or the client's address, in the order the config
//! gives.
//!
//! With `key.from: header`, the header's value is the key; when the header is
//! absent and `key.body_field` is set, the body is tried next. With `from:
//! body`, the body field is the key. With `from: conversation`, a configured
//! header, then a configured body field, then the conversation's head
//! ([`crate::key::conversation`]). Reading a body for its key buffers it
//! (at most `key.max_bytes`, within `key.read_timeout`); the bytes read are
//! then sent on first, followed by the rest of the stream, so the backend
//! receives the body unchanged. Only a JSON body (by `content-type`) is read.
//! When no key is found, the fallback key is used and the reason counted.

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::Request;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderMap};
use tokio::time::Instant;

use super::upload::Upload;
use crate::config::{KeyConfig, KeySources};
use crate::key::conversation::conversation_key;
use crate::key::json::json_field_key;
use crate::key::{self, FallbackReason};
use crate::net::Client;

/// The key a request goes by, and why it is the fallback when it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestKey {
    pub key: u64,
    pub fallback: Option<FallbackReason>,
}

/// The client stopped sending its body while it was read for the key.
#[derive(Debug, thiserror::Error)]
#[error("the request body could not be read: {0}")]
pub struct BodyError(#[from] hyper::Error);

/// Finds `request`'s key; returns it with the request, its body ready to be
/// sent on unchanged.
pub async fn request_key(
    request: Request<Incoming>,
    config: &KeyConfig,
    client: Client,
) -> Result<(RequestKey, Request<Upload>), BodyError> {
    let Some(read) = config.read() else {
        return Ok(address(request, config.address_key(client.0)));
    };
    let sources = config.sources();
    let fall_back = |why| RequestKey {
        key: key::fallback_key(read.fallback, client.0),
        fallback: Some(why),
    };
    let (parts, body) = request.into_parts();
    let from_head = match sources.header.and_then(|h| header_value(&parts.headers, h)) {
        Some(value) => Some(RequestKey {
            key: key::text_key(value),
            fallback: None,
        }),
        None if sources.body_field.is_none() && !sources.conversation => {
            Some(fall_back(FallbackReason::MissingHeader))
        }
        None if !is_json(&parts.headers) => Some(fall_back(FallbackReason::NotJson)),
        None => None,
    };
    if let Some(found) = from_head {
        return Ok((found, Request::from_parts(parts, Upload::streaming(body))));
    }
    let deadline = Instant::now() + read.read_timeout;
    let (outcome, upload) = read_body(body, read.max_bytes, deadline).await?;
    let found = match outcome {
        Read::Complete(ref bytes) => match body_key(&sources, bytes) {
            Ok(key) => RequestKey {
                key,
                fallback: None,
            },
            Err(reason) => fall_back(reason),
        },
        Read::TooLarge => fall_back(FallbackReason::TooLarge),
        Read::Timeout => fall_back(FallbackReason::Timeout),
    };
    Ok((found, Request::from_parts(parts, upload)))
}

/// The key in a complete JSON body: the field, else the conversation.
fn body_key(sources: &KeySources<'_>, bytes: &[u8]) -> Result<u64, FallbackReason> {
    let by_field = match sources.body_field {
        Some(field) => json_field_key(bytes, field),
        None => Err(FallbackReason::MissingField),
    };
    match by_field {
        Err(_) if sources.conversation => conversation_key(bytes),
        found => found,
    }
}

/// The key is the client's address; the body is not looked at.
fn address(request: Request<Incoming>, key: u64) -> (RequestKey, Request<Upload>) {
    let found = RequestKey {
        key,
        fallback: None,
    };
    (found, request.map(Upload::streaming))
}

/// A header's value when present and not blank (the first, if repeated).
fn header_value<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h [u8]> {
    headers
        .get(name)
        .map(|v| v.as_bytes())
        .filter(|v| !v.trim_ascii().is_empty())
}

/// `application/json`, or any `…/…+json` type, parameters allowed.
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
        || essence
            .rsplit_once('+')
            .is_some_and(|(_, suffix)| suffix.eq_ignore_ascii_case("json"))
}

/// What reading a body for its key got.
enum Read {
    /// The whole body.
    Complete(Bytes),
    /// More than `max_bytes`.
    TooLarge,
    /// The deadline passed first.
    Timeout,
}

/// Reads `body` until it ends, passes `max_bytes`, or `deadline` passes;
/// returns what happened and the body to send on (the bytes read, then the
/// rest).
async fn read_body(
    mut body: Incoming,
    max_bytes: usize,
    deadline: Instant,
) -> Result<(Read, Upload), BodyError> {
    let mut buf = BytesMut::new();
    let mut trailers = None;
    let outcome = loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => break Read::Timeout,
            Ok(None) => break Read::Complete(Bytes::new()),
            Ok(Some(frame)) => frame?,
        };
        match frame.into_data() {
            Ok(data) => {
                buf.extend_from_slice(&data);
                if buf.len() > max_bytes {
                    break Read::TooLarge;
                }
            }
            Err(frame) => {
                // Trailers end the body.
                trailers = frame.into_trailers().ok();
                break Read::Complete(Bytes::new());
            }
        }
    };
    let head = buf.freeze();
    Ok(match outcome {
        Read::Complete(_) => (
            Read::Complete(head.clone()),
            Upload::replay(head, None).with_trailers(trailers),
        ),
        unfinished => (unfinished, Upload::replay(head, Some(body))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                hyper::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn json_content_types() {
        for yes in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/vnd.api+json",
        ] {
            assert!(is_json(&headers(&[("content-type", yes)])), "{yes}");
        }
        for no in ["text/plain", "application/jsonx", "multipart/form-data"] {
            assert!(!is_json(&headers(&[("content-type", no)])), "{no}");
        }
        assert!(!is_json(&headers(&[])));
    }

    #[test]
    fn blank_headers_are_absent() {
        let h = headers(&[("x-session-id", "  "), ("x-other", "a")]);
        assert_eq!(header_value(&h, "x-session-id"), None);
        assert_eq!(header_value(&h, "x-other"), Some(&b"a"[..]));
    }
}
