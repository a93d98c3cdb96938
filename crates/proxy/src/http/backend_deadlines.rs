//! The deadlines of a request on its way (`mode: http`): its response head
//! must come within `http.response_timeout` of the last byte of the request
//! sent to the backend, its body may pause at most `http.stream_idle_timeout`
//! between two frames, and while the client's own request body stalls (the
//! backend waits for it), `http.body_timeout` applies instead of the
//! response timeout: a client that stops sending its body holds a backend's
//! slot that long, not minutes.
//!
//! The request body goes to hyper as an [`Outgoing`], which notes when it
//! last handed a frame over, and whether it is waiting for the client's
//! next one ([`Progress`]): the head deadline runs from the request's last
//! byte sent, so a long upload is not cut while it flows, and a backend
//! that stops reading one is. [`Silence`] times the pauses of a
//! response body while the client waits for it (not while the client is slow
//! to read: then the body is not asked for). Both timers are re-armed lazily,
//! when they fire early, so a streamed answer costs no timer update per
//! frame.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::request_body::RequestBody;

/// When a request's latest frame was handed to its backend connection.
#[derive(Debug)]
pub(crate) struct Progress {
    epoch: Instant,
    /// Milliseconds from `epoch` to the latest frame.
    ms: AtomicU64,
    /// The body's bytes sent so far (for the access log).
    bytes: AtomicU64,
    /// The body waits for the client's next bytes.
    stalled: AtomicBool,
}

/// Which deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Late {
    /// The backend sent no response head within `http.response_timeout`.
    Response,
    /// The client's request body sent nothing for `http.body_timeout`.
    Body,
}

/// The two deadlines a request's head waits under.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadDeadlines {
    /// `http.response_timeout`.
    pub(crate) response: Duration,
    /// `http.body_timeout`.
    pub(crate) body: Duration,
}

impl HeadDeadlines {
    pub(crate) fn of(http: &crate::config::HttpConfig) -> HeadDeadlines {
        HeadDeadlines {
            response: http.response_timeout,
            body: http.body_timeout,
        }
    }

    /// When waiting ends as `progress` stands: the body timeout (or the
    /// response's, if shorter) while the client's body stalls, else the
    /// response timeout, from the latest byte sent.
    pub(crate) fn deadline(&self, progress: &Progress) -> (Instant, Late) {
        let (after, late) = match progress.stalled() && self.body < self.response {
            true => (self.body, Late::Body),
            false => (self.response, Late::Response),
        };
        (progress.last() + after, late)
    }
}

impl Progress {
    /// A request about to be sent: its head counts as its first byte.
    pub(crate) fn new() -> Arc<Progress> {
        Arc::new(Progress {
            epoch: Instant::now(),
            ms: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            stalled: AtomicBool::new(false),
        })
    }

    /// Whether the request body waits for the client's next bytes.
    pub(crate) fn stalled(&self) -> bool {
        self.stalled.load(Ordering::Relaxed)
    }

    /// The request body waits for the client's next bytes (or no longer).
    pub(crate) fn set_stalled(&self, stalled: bool) {
        self.stalled.store(stalled, Ordering::Relaxed);
    }

    /// The request body's bytes sent so far.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// `n` more bytes of the request body went (or only its head, `n == 0`).
    pub(crate) fn sent(&self, n: u64) {
        self.touch();
        self.bytes.fetch_add(n, Ordering::Relaxed);
    }

    fn touch(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.ms.store(ms, Ordering::Relaxed);
    }

    /// When the latest byte went.
    pub(crate) fn last(&self) -> Instant {
        self.epoch + Duration::from_millis(self.ms.load(Ordering::Relaxed))
    }
}

/// A request body on its way to a backend, noting its progress.
#[derive(Debug)]
pub(crate) struct Outgoing {
    body: RequestBody,
    progress: Arc<Progress>,
}

impl Outgoing {
    pub(crate) fn new(body: RequestBody, progress: Arc<Progress>) -> Outgoing {
        Outgoing { body, progress }
    }

    /// The body again (a request handed back unsent).
    pub(crate) fn into_inner(self) -> RequestBody {
        self.body
    }
}

impl Body for Outgoing {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        self.progress.set_stalled(polled.is_pending());
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            self.progress.touch();
            if let Some(data) = frame.data_ref() {
                let n = data.len() as u64;
                self.progress.bytes.fetch_add(n, Ordering::Relaxed);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Awaits `head` while its deadline, as `progress` moves it, has not passed
/// ([`HeadDeadlines::deadline`]); which passed, once one has.
pub(crate) async fn response_head<F: Future>(
    head: F,
    progress: &Progress,
    deadlines: HeadDeadlines,
) -> Result<F::Output, Late> {
    tokio::pin!(head);
    loop {
        // A body that flows now may stall later: look again by then.
        let (deadline, late) = deadlines.deadline(progress);
        let wake = match late {
            Late::Response => deadline.min(Instant::now() + deadlines.body),
            Late::Body => deadline,
        };
        tokio::select! {
            biased;
            out = &mut head => return Ok(out),
            _ = tokio::time::sleep_until(wake) => {
                // A frame that went meanwhile moved the deadline.
                let (deadline, late) = deadlines.deadline(progress);
                if deadline <= Instant::now() {
                    return Err(late);
                }
            }
        }
    }
}

/// The pauses of a response body: how long it has had nothing for a client
/// that asked for more.
#[derive(Debug)]
pub(crate) struct Silence {
    limit: Duration,
    /// When the body was first found empty since its latest frame.
    since: Option<Instant>,
    /// Armed at the first pause, then re-armed only when it fires early.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Silence {
    pub(crate) fn new(limit: Duration) -> Silence {
        Silence {
            limit,
            since: None,
            sleep: None,
        }
    }

    pub(crate) fn limit(&self) -> Duration {
        self.limit
    }

    /// A frame came: the pause is over.
    pub(crate) fn frame(&mut self) {
        self.since = None;
    }

    /// The body has nothing now: whether it has been silent for the limit.
    /// If not, `cx` is woken when it would be.
    pub(crate) fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        let now = Instant::now();
        let deadline = *self.since.get_or_insert(now) + self.limit;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        passed(cx, &mut sleep.as_mut(), deadline)
    }
}

/// Whether `deadline` has passed; if not, `cx` is woken when it would. The
/// timer is set again only when it would fire late, or when it fires early
/// (it was armed for an earlier deadline, which moved), so one timer can
/// serve a deadline that moves with every byte at no cost per byte.
pub(crate) fn passed(cx: &mut Context<'_>, sleep: &mut Pin<&mut Sleep>, deadline: Instant) -> bool {
    if sleep.deadline() > deadline {
        sleep.as_mut().reset(deadline);
    }
    loop {
        if sleep.as_mut().poll(cx).is_pending() {
            return false;
        }
        if Instant::now() >= deadline {
            return true;
        }
        sleep.as_mut().reset(deadline);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_head_may_take_the_timeout_from_the_latest_byte() {
        let progress = Progress::new();
        let deadlines = HeadDeadlines {
            response: Duration::from_millis(100),
            body: Duration::from_secs(60),
        };
        // In time.
        let head = tokio::time::sleep(Duration::from_millis(90));
        assert_eq!(response_head(head, &progress, deadlines).await, Ok(()));
        // A byte at 90 ms moves the deadline to 190 ms.
        progress.touch();
        let started = Instant::now();
        let never = std::future::pending::<()>();
        let late = response_head(never, &progress, deadlines).await;
        assert_eq!(late, Err(Late::Response));
        assert_eq!(started.elapsed(), Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_is_late_after_the_body_timeout() {
        let progress = Progress::new();
        let deadlines = HeadDeadlines {
            response: Duration::from_secs(300),
            body: Duration::from_millis(50),
        };
        progress.set_stalled(true);
        let started = Instant::now();
        let never = std::future::pending::<()>();
        let late = response_head(never, &progress, deadlines).await;
        assert_eq!(late, Err(Late::Body));
        assert_eq!(started.elapsed(), Duration::from_millis(50));
        // The body flows again: the response timeout is back.
        progress.set_stalled(false);
        assert_eq!(deadlines.deadline(&progress).1, Late::Response);
    }

    #[tokio::test(start_paused = true)]
    async fn silence_counts_only_pauses_and_rearms_lazily() {
        let mut silence = Silence::new(Duration::from_millis(100));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(!silence.expired(&mut cx));
        tokio::time::advance(Duration::from_millis(60)).await;
        assert!(!silence.expired(&mut cx));
        // A frame at 60 ms: a new pause from 80 ms may last until 180 ms.
        silence.frame();
        tokio::time::advance(Duration::from_millis(20)).await;
        assert!(!silence.expired(&mut cx));
        tokio::time::advance(Duration::from_millis(90)).await;
        assert!(!silence.expired(&mut cx), "fired for the first pause only");
        tokio::time::advance(Duration::from_millis(10)).await;
        assert!(silence.expired(&mut cx));
    }
}
