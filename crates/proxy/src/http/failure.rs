//! Why a request reached no backend, and magpie's own answer to it: the
//! failures of [`super::journey`] and the short local answers both wire
//! formats write ([`LocalAnswer`]).
//!
//! A [`Failure`] only classifies: where it happened ([`Source`]); it is
//! final for its request (the journey tries another target only before a
//! byte was sent, which is no failure). Building one changes nothing: the
//! journey counts it against its backend and marks passive health.

use std::time::Duration;

use hyper::StatusCode;

use super::response_body::BoxError;
use crate::routing::backend::Backend;
use crate::routing::queue::Refusal;
use crate::telemetry::stats::ClientFailure;

/// Where a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// No backend took it: every target was down, full or refused it.
    Pool,
    /// magpie itself (file descriptors, memory).
    Local,
    /// The backend it was sent to.
    Backend,
    /// The client (its body).
    Client,
    /// The queue refused it (`queue`).
    Queue,
}

/// Why a request reached no backend.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Every target was down, full or refused the connection.
    NoBackend { tried: Vec<String> },
    /// magpie itself ran out of file descriptors or memory connecting.
    LocalResources,
    /// The backend failed after the request was (at least partly) written.
    AfterSend { backend: String, error: BoxError },
    /// The backend sent no response head within `http.response_timeout`.
    ResponseTimeout { backend: String, after: Duration },
    /// The client's body failed (a malformed chunk, a cut) while it was
    /// sent on: the client's fault, not the backend's.
    ClientBody,
    /// The client's body sent nothing for `http.body_timeout` while it was
    /// passed on: `408`, the backend's connection closed.
    BodyTimeout { after: Duration },
    /// The backend answered `101 Switching Protocols`, which magpie never
    /// asks for (it passes no `Upgrade` on).
    Switched { backend: String },
    /// The queue refused it (`queue`): full, or it waited too long.
    Refused(Refusal),
}

impl Failure {
    /// The backend failed after the request was (at least partly) written.
    pub(crate) fn after_send(backend: &Backend, error: BoxError) -> Failure {
        Failure::AfterSend {
            backend: backend.name.clone(),
            error,
        }
    }

    /// The backend answered `101` unasked.
    pub(crate) fn switched(backend: &Backend) -> Failure {
        Failure::Switched {
            backend: backend.name.clone(),
        }
    }

    /// The backend sent no response head within `after`
    /// (`http.response_timeout`).
    pub(crate) fn timed_out(backend: &Backend, after: Duration) -> Failure {
        Failure::ResponseTimeout {
            backend: backend.name.clone(),
            after,
        }
    }

    /// Where it failed: whose fault it is, and so who is counted for it.
    pub(crate) fn source(&self) -> Source {
        match self {
            Failure::NoBackend { .. } => Source::Pool,
            Failure::LocalResources => Source::Local,
            Failure::AfterSend { .. }
            | Failure::ResponseTimeout { .. }
            | Failure::Switched { .. } => Source::Backend,
            Failure::ClientBody | Failure::BodyTimeout { .. } => Source::Client,
            Failure::Refused(_) => Source::Queue,
        }
    }

    /// How it is counted in `magpie_client_failures_total`.
    pub(crate) fn client_failure(&self) -> ClientFailure {
        match self {
            Failure::LocalResources => ClientFailure::LocalResources,
            Failure::ClientBody => ClientFailure::BadRequest,
            Failure::BodyTimeout { .. } => ClientFailure::BodyTimeout,
            Failure::NoBackend { .. } => ClientFailure::NoBackend,
            Failure::AfterSend { .. } | Failure::Switched { .. } => ClientFailure::BackendFailed,
            Failure::ResponseTimeout { .. } => ClientFailure::ResponseTimeout,
            Failure::Refused(Refusal::TimedOut) => ClientFailure::QueueTimeout,
            Failure::Refused(_) => ClientFailure::QueueFull,
        }
    }

    /// The backend the request failed at, if it reached one.
    pub(crate) fn backend(&self) -> Option<&str> {
        match self {
            Failure::AfterSend { backend, .. }
            | Failure::ResponseTimeout { backend, .. }
            | Failure::Switched { backend } => Some(backend),
            _ => None,
        }
    }

    /// What the client is told: `400` when the client's body failed (and the
    /// connection closes), `503` when magpie is out of resources, `504` when
    /// the backend did not answer in time, else `502`.
    pub(crate) fn answer(&self) -> LocalAnswer {
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
            Failure::ClientBody => (StatusCode::BAD_REQUEST, BODY_UNREADABLE.to_string()),
            Failure::BodyTimeout { after } => (
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "magpie: the request body sent nothing for {} (http.body_timeout)\n",
                    humantime::format_duration(*after)
                ),
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
            Failure::Refused(Refusal::TimedOut) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "magpie: no backend had room for the request within queue.timeout\n".to_string(),
            ),
            Failure::Refused(Refusal::TenantFull) => (
                StatusCode::TOO_MANY_REQUESTS,
                "magpie: too many of this tenant's requests are waiting\n".to_string(),
            ),
            Failure::Refused(_) => (
                StatusCode::TOO_MANY_REQUESTS,
                "magpie: every backend is at its limit and the queue is full\n".to_string(),
            ),
        };
        LocalAnswer {
            status,
            text,
            close: matches!(self, Failure::ClientBody | Failure::BodyTimeout { .. }),
            retry_after: matches!(self, Failure::Refused(_)).then_some(RETRY_AFTER_SECONDS),
        }
    }
}

/// The answer to a request whose body could not be read (for its key, or
/// while it was sent on).
pub(crate) const BODY_UNREADABLE: &str = "magpie: the request body could not be read\n";

/// What a refusal of the queue's tells the client to wait before it tries
/// again (`Retry-After`, in seconds): long enough for the requests in
/// flight to move on, short enough not to idle a pool that drained.
pub(crate) const RETRY_AFTER_SECONDS: u32 = 1;

/// A short answer of magpie's own: its status, its one line of text,
/// whether the connection closes after it, and a `Retry-After` if any.
pub(crate) struct LocalAnswer {
    pub(crate) status: StatusCode,
    pub(crate) text: String,
    pub(crate) close: bool,
    pub(crate) retry_after: Option<u32>,
}

impl LocalAnswer {
    /// `400`: the request body could not be read for its key; the
    /// connection closes.
    pub(crate) fn body_unreadable() -> LocalAnswer {
        LocalAnswer {
            status: StatusCode::BAD_REQUEST,
            text: BODY_UNREADABLE.to_string(),
            close: true,
            retry_after: None,
        }
    }
}
