//! A request's access-log line ([`crate::telemetry::access_log`]): begun when the
//! request arrives (its method, path, protocol, and with `log_keys` its
//! header key), completed as it is routed and answered, and handed to the
//! log when its response body ends, or at once when magpie answers itself.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hyper::{Request, Version};
use tokio::time::Instant;

use super::backend_deadlines::Progress;
use crate::net::{Client, Local};
use crate::routing::backend::Backend;
use crate::routing::instance::Instance;
use crate::routing::keys::SessionKey;
use crate::telemetry::access_log::{Entry, HttpRequest, Recording, Status, Tokens};

/// One request's line while it is gathered.
#[derive(Debug)]
pub(crate) struct RequestLog {
    /// Boxed from the start: it is moved to the writer as a pointer.
    entry: Box<Entry>,
    started: Instant,
    /// Counts the request body's bytes once it is sent to a backend.
    progress: Option<Arc<Progress>>,
    instance: Arc<Instance>,
}

/// Where a request came in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arrival {
    pub(crate) client: Client,
    pub(crate) local: Local,
}

impl RequestLog {
    /// The line of `request`, when the access log samples it.
    pub(crate) fn start<B>(
        request: &Request<B>,
        arrival: Arrival,
        instance: &Arc<Instance>,
    ) -> Option<RequestLog> {
        let headers = request.headers();
        let line = RequestLine {
            method: request.method().as_str(),
            path: request.uri().path_and_query().map_or("/", |p| p.as_str()),
            protocol: protocol(request.version()),
            header: &|name| headers.get(name).map(|v| v.as_bytes()),
        };
        RequestLog::begin(line, arrival, instance)
    }

    /// The line of a request with this head, when the access log samples it.
    pub(crate) fn begin(
        line: RequestLine<'_>,
        arrival: Arrival,
        instance: &Arc<Instance>,
    ) -> Option<RequestLog> {
        let recording = instance.access_log.sampled()?;
        let key = recording
            .log_keys
            .then(|| header_key(line.header, instance))
            .flatten();
        let http = HttpRequest {
            method: method_name(line.method),
            path: Recording::path(&recording, line.path),
            protocol: line.protocol,
        };
        let entry = Box::new(Entry {
            time: SystemTime::UNIX_EPOCH,
            client: arrival.client.0,
            listener: arrival.local.0,
            backend: None,
            key_hash: 0,
            key,
            routed: None,
            status: Status::Code(0),
            bytes_in: 0,
            bytes_out: 0,
            first_byte: None,
            queued: None,
            queue: None,
            split: None,
            duration: Duration::ZERO,
            http: Some(http),
            tokens: None,
        });
        Some(RequestLog {
            entry,
            started: Instant::now(),
            progress: None,
            instance: Arc::clone(instance),
        })
    }

    /// The request's session key.
    pub(crate) fn keyed(&mut self, key: SessionKey) {
        self.entry.key_hash = key.hash();
    }

    /// A backend named by a failure, if it is among `targets`.
    pub(crate) fn tried(&mut self, name: &str, targets: &[Arc<Backend>]) {
        if let Some(b) = targets.iter().find(|b| b.name == name) {
            self.entry.backend = Some((b.name.clone(), b.addr));
        }
    }

    /// It left the queue as `how` says (admitted, or refused) after
    /// waiting `waited` for a backend's room.
    pub(crate) fn queued(&mut self, waited: Duration, how: &'static str) {
        if !waited.is_zero() {
            self.entry.queued = Some(waited);
        }
        self.entry.queue = Some(how);
    }

    /// Its prefill half (`disaggregation`) came to `decision`, at
    /// `prefill`.
    pub(crate) fn split(&mut self, decision: &'static str, prefill: Option<&Backend>) {
        self.entry.split = Some((decision, prefill.map(|b| b.name.clone())));
    }

    /// The backend answered with a response head.
    pub(crate) fn answered(&mut self, answer: Answer<'_>) {
        self.entry.backend = Some((answer.backend.name.clone(), answer.backend.addr));
        self.entry.routed = Some(answer.how);
        self.entry.status = Status::Code(answer.status);
        self.entry.first_byte = Some(self.started.elapsed());
        self.progress = Some(Arc::clone(answer.progress));
    }

    /// The response body ended (or was cut): the line goes to the log.
    pub(crate) fn ended(mut self, bytes_out: u64, tokens: Option<Tokens>) {
        self.entry.bytes_out = bytes_out;
        self.entry.tokens = tokens;
        self.write();
    }

    /// magpie answered itself (a refusal, a failure) with `status` and a
    /// body of `bytes_out`: the line goes now.
    pub(crate) fn answered_locally(mut self, status: u16, bytes_out: u64) {
        self.entry.status = Status::Code(status);
        self.entry.bytes_out = bytes_out;
        self.write();
    }

    fn write(mut self) {
        self.entry.time = SystemTime::now();
        self.entry.duration = self.started.elapsed();
        self.entry.bytes_in = self.progress.as_ref().map_or(0, |p| p.bytes());
        self.instance.access_log.record(self.entry);
    }
}

/// What a line learns from a backend's response head.
pub(crate) struct Answer<'a> {
    pub(crate) backend: &'a Backend,
    /// Why it was this backend (`magpie_requests_routed_total`'s label).
    pub(crate) how: &'static str,
    pub(crate) status: u16,
    pub(crate) progress: &'a Arc<Progress>,
}

/// What a line takes from a request's head.
pub(crate) struct RequestLine<'a> {
    pub(crate) method: &'a str,
    /// The target as sent: path and query.
    pub(crate) path: &'a str,
    pub(crate) protocol: &'static str,
    /// A header's value by its (lower-case) name, the first if repeated.
    pub(crate) header: &'a dyn Fn(&str) -> Option<&'a [u8]>,
}

/// The session key's header value, as text (`log_keys: true`).
fn header_key<'a>(
    header: &dyn Fn(&str) -> Option<&'a [u8]>,
    instance: &Instance,
) -> Option<String> {
    let config = Arc::clone(&instance.snapshot.load().config);
    let value = header(config.key.sources().header?)?;
    Some(String::from_utf8_lossy(value).into_owned())
}

/// The method's name, borrowed for the standard ones.
fn method_name(name: &str) -> Cow<'static, str> {
    const STANDARD: [&str; 9] = [
        "GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "CONNECT", "TRACE",
    ];
    match STANDARD.iter().find(|s| **s == name) {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(name.to_string()),
    }
}

fn protocol(version: Version) -> &'static str {
    match version {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_11 => "HTTP/1.1",
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP",
    }
}
