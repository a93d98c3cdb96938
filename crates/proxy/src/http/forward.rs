//! One request, from its route to the backend's streamed response, in named
//! phases: `choose (the next target with room) ─▶ connect (pooled, or new) ─▶
//! send ─▶ account (status, latency, passive health) ─▶ respond (headers,
//! the body streamed back)`.
//!
//! A connect that fails, or a pooled connection that turns out closed before
//! the request was written, moves on to the next target (a failed connect
//! counts against its backend, as on the TCP path). Once any byte of the
//! request was written it is never sent again: LLM requests are not
//! idempotent. When no target takes it, the client gets `502` with a
//! one-line reason. A backend that sends no response head within
//! `http.response_timeout` of the request's last byte gets its connection
//! closed and the client `504` (counted against it as a timeout; a failed
//! answer for passive health only with `health.passive_status`, like a 504
//! of its own).

use std::sync::Arc;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode, Uri, Version};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::backend_deadlines::{self, Outgoing, Progress};
use super::logged::{Answer, Logged};
use super::pinning::Opening;
use super::pool::{self, Lease, Limits, Pool};
use super::reply::Reply;
use super::request_body::RequestBody;
use super::response_body::{BoxError, FirstByte, InFlight, ResponseBody, Tally};
use crate::config::Config;
use crate::routing::backend::{ActiveGuard, Awaiting, Backend, CodeClass, Spill, TimeoutKind};
use crate::routing::health::passive::{self, Blame};
use crate::routing::instance::Instance;
use crate::routing::recent::Decision;
use crate::routing::route::{Keys, Route};
use crate::telemetry::stats::ClientFailure;
use magpie_core::usage::UsageScanner;

/// The header that names the backend, when `http.expose_backend` is on.
pub const BACKEND_HEADER: &str = "x-magpie-backend";

/// Headers that describe one hop, not the message (RFC 9110 §7.6.1); they
/// are never passed on.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// What a request needs besides itself.
pub struct Forward<'a> {
    pub route: &'a Route,
    /// The request's keys (the session key's memory, [`crate::routing::recent`],
    /// notes its group too), and whether its session pin was lost.
    pub keys: Keys,
    pub pin_lost: bool,
    pub config: &'a Config,
    pub pool: &'a Arc<Pool>,
    pub instance: &'a Arc<Instance>,
    /// The request's access-log line, if it is sampled; it moves into the
    /// response body once a backend answers.
    pub log: &'a mut Option<Logged>,
    /// Set when the request opens a conversation (`key.group_choices`).
    pub opening: Option<Opening>,
}

/// Why a request reached no backend.
#[derive(Debug)]
pub enum Failure {
    /// Every target was down, full or refused the connection.
    NoBackend { tried: Vec<String> },
    /// magpie itself ran out of file descriptors or memory connecting.
    LocalResources,
    /// The backend failed after the request was (at least partly) written.
    AfterSend { backend: String, error: BoxError },
    /// The backend sent no response head within `http.response_timeout`.
    ResponseTimeout {
        backend: String,
        after: std::time::Duration,
    },
    /// The client's body failed (a malformed chunk, a cut) while it was
    /// sent on: the client's fault, not the backend's.
    ClientBody { error: BoxError },
    /// The backend answered `101 Switching Protocols`, which magpie never
    /// asks for (it passes no `Upgrade` on).
    Switched { backend: String },
}

impl Failure {
    /// How it is counted in `magpie_client_failures_total`.
    pub fn client_failure(&self) -> ClientFailure {
        match self {
            Failure::LocalResources => ClientFailure::LocalResources,
            Failure::ClientBody { .. } => ClientFailure::BadRequest,
            Failure::NoBackend { .. } => ClientFailure::NoBackend,
            Failure::AfterSend { .. } | Failure::Switched { .. } => ClientFailure::BackendFailed,
            Failure::ResponseTimeout { .. } => ClientFailure::ResponseTimeout,
        }
    }

    /// The backend the request failed at, if it reached one.
    pub fn backend(&self) -> Option<&str> {
        match self {
            Failure::AfterSend { backend, .. }
            | Failure::ResponseTimeout { backend, .. }
            | Failure::Switched { backend } => Some(backend),
            _ => None,
        }
    }

    /// The one-line answer: `400` when the client's body failed (and the
    /// connection closes), `503` when magpie is out of resources, `504` when
    /// the backend did not answer in time, else `502`.
    pub fn reply(&self) -> Response<Reply> {
        let answer = self.answer();
        let mut r = local(answer.status, answer.text);
        if answer.close {
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        r
    }

    /// What the client is told, on either HTTP/1.1 path.
    pub fn answer(&self) -> LocalAnswer {
        let (status, text) = match self {
            Failure::NoBackend { tried } if tried.is_empty() => (
                StatusCode::BAD_GATEWAY,
                "magpie: no backend is available for this request\n".to_string(),
            ),
            Failure::NoBackend { tried } => (
                StatusCode::BAD_GATEWAY,
                format!(
                    "magpie: no backend took the request (tried {})\n",
                    tried.join(", ")
                ),
            ),
            Failure::LocalResources => (
                StatusCode::SERVICE_UNAVAILABLE,
                "magpie: out of local resources (file descriptors or memory); try again\n"
                    .to_string(),
            ),
            Failure::AfterSend { backend, error } => (
                StatusCode::BAD_GATEWAY,
                format!("magpie: backend {backend} failed after the request was sent: {error}\n"),
            ),
            Failure::ClientBody { .. } => (
                StatusCode::BAD_REQUEST,
                "magpie: the request body could not be read\n".to_string(),
            ),
            Failure::Switched { backend } => (
                StatusCode::BAD_GATEWAY,
                format!("magpie: backend {backend} switched protocols (101) unasked\n"),
            ),
            Failure::ResponseTimeout { backend, after } => (
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "magpie: backend {backend} sent no response head within {} of the request\n",
                    humantime::format_duration(*after)
                ),
            ),
        };
        LocalAnswer {
            status,
            text,
            close: matches!(self, Failure::ClientBody { .. }),
        }
    }
}

/// A short answer of magpie's own: its status, its one line of text, and
/// whether the connection closes after it.
pub struct LocalAnswer {
    pub status: StatusCode,
    pub text: String,
    pub close: bool,
}

/// A response on its way, and the backend it comes from.
pub struct Served {
    pub response: Response<Reply>,
    pub backend: Arc<Backend>,
}

/// Sends `request` to the first target of the route that takes it, in
/// phases: choose (the next target with room), connect (a pooled connection
/// or a new one), send, account (status, latency, passive health), respond.
pub async fn forward(
    request: Request<RequestBody>,
    mut forward: Forward<'_>,
) -> Result<Served, Failure> {
    let mut request = prepare(request);
    let mut opening = forward.opening.take();
    let mut tried = Vec::new();
    let mut how = forward.route.how;
    for backend in &forward.route.targets {
        let Some((slot, awaiting)) = claim(forward.route, backend, &mut opening) else {
            how = how.passed_over(Spill::AtCap);
            continue;
        };
        tried.push(backend.name.clone());
        match send(backend, request, &forward).await {
            Attempt::Answered {
                response,
                lease,
                sent,
                progress,
            } => {
                account(backend, response.status().as_u16(), sent, forward.config);
                let mut log = forward.log.take();
                if let Some(log) = &mut log {
                    log.answered(Answer {
                        backend,
                        how: how.as_str(),
                        status: response.status().as_u16(),
                        progress: &progress,
                    });
                }
                let decision = Decision {
                    how,
                    pin_lost: forward.pin_lost,
                    group: forward.keys.group,
                };
                let session = forward.keys.session;
                let moved = forward.instance.recent.routed(session, backend, decision);
                let in_flight = InFlight {
                    backend: Arc::clone(backend),
                    slot,
                    sent,
                    lease,
                    tally: Tally {
                        instance: Arc::clone(forward.instance),
                        key: session,
                        moved,
                    },
                    stream_idle: forward.config.http.stream_idle_timeout,
                    log,
                    awaiting: Some(awaiting),
                };
                return Ok(Served {
                    response: respond(response, in_flight, forward.config),
                    backend: Arc::clone(backend),
                });
            }
            Attempt::Unsent(back) => {
                request = back;
                how = how.passed_over(Spill::Down);
            }
            Attempt::Failed(failure) => return Err(failure),
        }
    }
    Err(Failure::NoBackend { tried })
}

/// `backend`'s in-flight slot if it has room for the request, and the
/// request's place among those awaiting a first byte there (a
/// conversation's opening at the first backend that takes it, a new
/// group's at its home only); `None` when it is at its cap. Both HTTP/1.1
/// paths take a target this way.
pub fn claim(
    route: &Route,
    backend: &Arc<Backend>,
    opening: &mut Option<Opening>,
) -> Option<(ActiveGuard, FirstByte)> {
    let slot = route.reserve(backend)?;
    let (kind, mark) = match opening.take() {
        Some(opening) => opening.claimed_at(&backend.name),
        None => (Awaiting::Turn, None),
    };
    let awaiting = FirstByte {
        count: backend.live.await_first_byte(kind),
        mark,
    };
    Some((slot, awaiting))
}

/// What sending a request to one backend came to.
enum Attempt {
    /// A response head, the connection it came over, when it was sent, and
    /// how far its body got.
    Answered {
        response: Response<Incoming>,
        lease: Lease,
        sent: Instant,
        progress: Arc<Progress>,
    },
    /// Not a byte of it was written: it may go to the next target.
    Unsent(Request<RequestBody>),
    /// It must go nowhere else.
    Failed(Failure),
}

/// Sends `request` to `backend` over a pooled connection, or a new one. A
/// pooled connection found closed before the request went out is dropped
/// and the next one tried; a new one that fails the same way, or a failed
/// connect, hands the request back for the next target. Once a byte was
/// written, the request is never sent again: LLM requests are not
/// idempotent.
async fn send(
    backend: &Arc<Backend>,
    mut request: Request<RequestBody>,
    forward: &Forward<'_>,
) -> Attempt {
    loop {
        let mut lease = match connect(backend, forward).await {
            Ok(lease) => lease,
            Err(Blame::Backend) => return Attempt::Unsent(request),
            Err(Blame::Local) => return Attempt::Failed(Failure::LocalResources),
        };
        let sent = Instant::now();
        let progress = Progress::new();
        let request_out = request.map(|body| Outgoing::new(body, Arc::clone(&progress)));
        let head = lease.conn.sender.try_send_request(request_out);
        let timeout = forward.config.http.response_timeout;
        let Some(answer) = backend_deadlines::response_head(head, &progress, timeout).await else {
            // The lease is dropped here: its connection closes.
            timed_out(backend, forward.config);
            return Attempt::Failed(Failure::ResponseTimeout {
                backend: backend.name.clone(),
                after: timeout,
            });
        };
        let mut error = match answer {
            Ok(response) if response.status() == StatusCode::SWITCHING_PROTOCOLS => {
                // The lease is dropped here: its connection closes.
                backend.live.traffic.count_request(CodeClass::Error);
                warn!(backend = %backend.name, "backend answered 101 Switching Protocols unasked; the client gets 502");
                return Attempt::Failed(Failure::Switched {
                    backend: backend.name.clone(),
                });
            }
            Ok(response) => {
                return Attempt::Answered {
                    response,
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
                return Attempt::Failed(Failure::ClientBody {
                    error: error.into(),
                });
            }
            backend.live.traffic.count_request(CodeClass::Error);
            warn!(backend = %backend.name, %error, "backend failed after the request was sent");
            return Attempt::Failed(Failure::AfterSend {
                backend: backend.name.clone(),
                error: error.into(),
            });
        };
        debug!(backend = %backend.name, fresh = lease.fresh, error = %error.error(), "connection closed before the request was sent");
        request = back.map(Outgoing::into_inner);
        if lease.fresh {
            return Attempt::Unsent(request);
        }
    }
}

/// A connection to `backend` for one request: the most recently pooled one
/// that is ready, else a new one (counted like a TCP-path connect; a failure
/// counts against the backend unless magpie itself is out of resources).
async fn connect(backend: &Arc<Backend>, forward: &Forward<'_>) -> Result<Lease, Blame> {
    let limits = Limits::of(&forward.config.http);
    while let Some(mut lease) = forward.pool.checkout(backend.addr, limits) {
        if lease.conn.sender.ready().await.is_ok() {
            return Ok(lease);
        }
    }
    let started = Instant::now();
    let timeout = forward.config.connect.timeout;
    match pool::connect(forward.pool, backend, timeout, limits).await {
        Ok(lease) => {
            let traffic = &backend.live.traffic;
            traffic.connect_time.observe(started.elapsed());
            traffic.count_connection();
            passive::succeeded(&**backend);
            Ok(lease)
        }
        Err(e) => {
            let health = forward.config.health.as_ref();
            Err(passive::connect_failed(
                &**backend,
                &e,
                health,
                &forward.instance.stats,
            ))
        }
    }
}

/// Counts a response head that did not come in time: a timeout and a failed
/// request for the backend, and with `health.passive_status` a failed answer
/// towards passive health, as a `504` from the backend itself would be.
pub fn timed_out(backend: &Backend, config: &Config) {
    let traffic = &backend.live.traffic;
    traffic.count_timeout(TimeoutKind::Response);
    traffic.count_request(CodeClass::Error);
    warn!(backend = %backend.name, timeout = ?config.http.response_timeout, "backend sent no response head within http.response_timeout; the client gets 504");
    if let Some(health) = config.health.as_ref().filter(|h| h.passive_status) {
        passive::answer_failed(backend, 504, health);
    }
}

/// Counts an answer: its time to first byte and status class, and with
/// `health.passive_status` a 502/503/504 towards passive health (any other
/// answer ends the backend's failure streak).
pub fn account(backend: &Backend, status: u16, sent: Instant, config: &Config) {
    let traffic = &backend.live.traffic;
    traffic.time_to_first_byte.observe(sent.elapsed());
    traffic.count_request(CodeClass::of(status));
    match &config.health {
        Some(health) if health.passive_status && matches!(status, 502..=504) => {
            passive::answer_failed(backend, status, health);
        }
        _ => passive::succeeded(backend),
    }
}

/// The response to pass on: hop-by-hop headers dropped, the backend named if
/// asked, the body counted until its end (its connection goes back to the
/// pool then).
fn respond(response: Response<Incoming>, in_flight: InFlight, config: &Config) -> Response<Reply> {
    let expose = config
        .http
        .expose_backend
        .then(|| HeaderValue::from_bytes(in_flight.backend.name.as_bytes()).ok())
        .flatten();
    let (mut parts, body) = response.into_parts();
    // Only a successful, uncompressed answer reports usage worth reading.
    let usage = (parts.status.is_success()
        && !parts.headers.contains_key(header::CONTENT_ENCODING))
    .then(|| {
        let content_type = parts.headers.get(header::CONTENT_TYPE);
        UsageScanner::for_content_type(content_type.and_then(|v| v.to_str().ok()))
    })
    .flatten();
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
    for name in named.iter().chain(&HOP_BY_HOP) {
        headers.remove(name);
    }
}

/// A short plain-text answer from magpie itself.
pub fn local(status: StatusCode, text: impl Into<Bytes>) -> Response<Reply> {
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
