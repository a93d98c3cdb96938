//! Access logs operators can ship: one line per request (mode http, written
//! when its response body ends or it fails, so bytes and times are final)
//! and one per connection (mode tcp, when it closes).
//!
//! `data path ─▶ sampled? ─▶ Box<Entry> ─push─▶ bounded queue ─▶ writer ─▶ file`.
//!
//! A data path asks [`AccessLog::sampled`] first (nothing is gathered for a
//! line that is not written), fills in an [`Entry`] and hands it to
//! [`AccessLog::record`], which never waits: when `access_log.queue` lines
//! are already waiting, the line is dropped and counted. The writer, a task
//! of its own, formats the lines and writes them in batches; a disk that
//! stalls costs lines, never traffic.
//!
//! Sampling is deterministic: with `sample: s`, the n-th request is logged
//! when `floor(n·s)` steps past `floor((n-1)·s)`, so exactly that share is
//! written, evenly spread, with one atomic add per request.
//!
//! This module knows the config's types and nothing of the data paths: they
//! fill an `Entry` with plain values (addresses, names, the routing reason's
//! label text).
//!
//! | module | owns |
//! |---|---|
//! | [`line`] | an entry as one JSON or text line, the fields in the configured order |
//! | [`put`] | numbers, addresses and times written without `core::fmt` |
//! | [`writer`] | the writer task: batching, flushing, reopening on SIGUSR1 and on a changed path |

pub(crate) mod line;
mod put;
pub(crate) mod writer;

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwapOption;
use tokio::sync::{Mutex, Notify, mpsc, oneshot};

use crate::config::AccessLogConfig;

/// One request's or connection's line, before it is formatted.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    /// When it ended.
    pub(crate) time: SystemTime,
    pub(crate) client: SocketAddr,
    pub(crate) listener: SocketAddr,
    /// The backend's name and address, when one was chosen.
    pub(crate) backend: Option<(String, SocketAddr)>,
    /// `h64` of the session key.
    pub(crate) key_hash: u64,
    /// The raw key, only with `log_keys: true` (a header's value).
    pub(crate) key: Option<String>,
    /// Why this backend: `magpie_requests_routed_total`'s `how` label.
    pub(crate) routed: Option<&'static str>,
    pub(crate) status: Status,
    /// From the client: a request's body, a connection's bytes.
    pub(crate) bytes_in: u64,
    /// To the client.
    pub(crate) bytes_out: u64,
    pub(crate) first_byte: Option<Duration>,
    /// How long it waited in the queue (`queue`), if it waited.
    pub(crate) queued: Option<Duration>,
    /// How it left the queue (`queue`, mode http): admitted (`at_once`,
    /// `waited`, `spilled`, `placed`) or refused (`full`, `tenant_full`,
    /// `timeout`, `client_gone`).
    pub(crate) queue: Option<&'static str>,
    /// How a disaggregated request was served (`disaggregation`): `split`,
    /// `decode_holds`, `unsplittable`, `prefill_failed`; and the prefill
    /// backend that took its prefill half.
    pub(crate) split: Option<(&'static str, Option<String>)>,
    pub(crate) duration: Duration,
    /// Mode http only.
    pub(crate) http: Option<HttpRequest>,
    /// Token counts the usage scanner read from the response.
    pub(crate) tokens: Option<Tokens>,
}

/// What a line says of an HTTP request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HttpRequest {
    /// Borrowed for the standard methods: no allocation per request.
    pub(crate) method: Cow<'static, str>,
    /// The query stripped unless `log_query: true`.
    pub(crate) path: String,
    /// `HTTP/1.1`, `HTTP/2.0`, ...
    pub(crate) protocol: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tokens {
    pub(crate) prompt: u64,
    pub(crate) cached: u64,
}

/// How it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Mode http: the status code the client got.
    Code(u16),
    /// Mode tcp: `closed`, `idle`, `aborted_by_client`, `no_backend`, ...
    Ended(&'static str),
}

/// What a request needs to know while its line is gathered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Recording {
    pub(crate) log_keys: bool,
    pub(crate) log_query: bool,
}

impl Recording {
    /// `path_and_query` as the line writes it.
    pub(crate) fn path(&self, path_and_query: &str) -> String {
        match path_and_query.split_once('?') {
            Some((path, _)) if !self.log_query => path.to_string(),
            _ => path_and_query.to_string(),
        }
    }
}

/// What the writer is told besides lines.
#[derive(Debug)]
pub(crate) enum Control {
    /// SIGUSR1, or a reload changed the path: close and open the file again.
    Reopen,
    /// Answered once every line queued before it is written (or failed).
    Flush(oneshot::Sender<()>),
}

/// Lines waiting for the writer: a vector behind a lock (one push per
/// line, no atomics of a channel's own) that the writer empties in one
/// swap; the writer is woken only when the first line of a batch arrives.
#[derive(Debug, Default)]
// Entries come boxed from the data path (a request moves its line as a
// pointer); pushing the box keeps it so.
#[allow(clippy::vec_box)]
pub(crate) struct Queue {
    lines: std::sync::Mutex<Vec<Box<Entry>>>,
    arrived: Notify,
}

impl Queue {
    /// Adds `entry` unless `bound` lines are waiting; false when it is full.
    fn push(&self, entry: Box<Entry>, bound: usize) -> bool {
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        if lines.len() >= bound {
            return false;
        }
        let first = lines.is_empty();
        lines.push(entry);
        drop(lines);
        if first {
            self.arrived.notify_one();
        }
        true
    }

    /// Moves every waiting line into `into` (which the writer keeps empty).
    #[allow(clippy::vec_box)]
    pub(crate) fn take(&self, into: &mut Vec<Box<Entry>>) {
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::swap(&mut *lines, into);
    }

    /// Resolves when lines may be waiting.
    pub(crate) async fn arrived(&self) {
        self.arrived.notified().await;
    }
}

/// Lines written, dropped and failed, for the metrics.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    lines: AtomicU64,
    dropped: AtomicU64,
    write_errors: AtomicU64,
}

impl Counters {
    pub(crate) fn lines(&self) -> u64 {
        self.lines.load(Ordering::Relaxed)
    }
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
    pub(crate) fn write_errors(&self) -> u64 {
        self.write_errors.load(Ordering::Relaxed)
    }
}

/// The access log of one magpie: its settings, its queue, its counters.
#[derive(Debug)]
pub(crate) struct AccessLog {
    settings: Arc<ArcSwapOption<AccessLogConfig>>,
    queue: Arc<Queue>,
    control: mpsc::UnboundedSender<Control>,
    /// The control channel's other end, for the writer (and a restarted one).
    controls: Arc<Mutex<mpsc::UnboundedReceiver<Control>>>,
    counters: Arc<Counters>,
    /// Requests seen by sampling.
    seen: AtomicU64,
}

impl AccessLog {
    pub(crate) fn new(config: Option<&AccessLogConfig>) -> AccessLog {
        let (control, controls) = mpsc::unbounded_channel();
        AccessLog {
            settings: Arc::new(ArcSwapOption::from(config.cloned().map(Arc::new))),
            queue: Arc::default(),
            control,
            controls: Arc::new(Mutex::new(controls)),
            counters: Arc::default(),
            seen: AtomicU64::new(0),
        }
    }

    /// Takes a reload's settings; a changed path reopens the file.
    pub(crate) fn configure(&self, config: Option<&AccessLogConfig>) {
        let next = config.cloned().map(Arc::new);
        let old = self.settings.swap(next);
        let old_target = old.as_ref().map(|c| &c.target);
        if config.map(|c| &c.target) != old_target {
            self.reopen();
        }
    }

    /// Closes the file and opens it again at its path (what SIGUSR1 does,
    /// after logrotate moved the file away).
    pub(crate) fn reopen(&self) {
        // Only fails once the writer is gone, at shutdown.
        if self.control.send(Control::Reopen).is_err() {
            tracing::debug!("access log writer is gone; nothing to reopen");
        }
    }

    /// Resolves once every line queued so far is written (or failed): at
    /// shutdown, after the drain, so no line is lost at exit. Returns at
    /// once when the writer is gone.
    pub(crate) async fn flush(&self) {
        let (done, flushed) = oneshot::channel();
        if self.control.send(Control::Flush(done)).is_ok() && flushed.await.is_err() {
            tracing::debug!("access log writer stopped before flushing");
        }
    }

    /// `Some` when this request (or connection) is to be logged.
    pub(crate) fn sampled(&self) -> Option<Recording> {
        let settings = self.settings.load();
        let s = settings.as_ref()?;
        let recording = Recording {
            log_keys: s.log_keys,
            log_query: s.log_query,
        };
        if s.sample >= 1.0 {
            return Some(recording);
        }
        let n = self.seen.fetch_add(1, Ordering::Relaxed) as f64;
        let steps = ((n + 1.0) * s.sample).floor() > (n * s.sample).floor();
        steps.then_some(recording)
    }

    /// Queues `entry` for the writer, or drops and counts it when
    /// `access_log.queue` lines are waiting already. Never waits (but for
    /// the queue's lock, held for a push or a swap).
    pub(crate) fn record(&self, entry: Box<Entry>) {
        let bound = match &*self.settings.load() {
            Some(s) => s.queue,
            None => return,
        };
        if !self.queue.push(entry, bound) {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// What the writer task works with.
    pub(crate) fn writer(&self) -> writer::Writer {
        writer::Writer {
            settings: Arc::clone(&self.settings),
            queue: Arc::clone(&self.queue),
            controls: Arc::clone(&self.controls),
            counters: Arc::clone(&self.counters),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LogField, LogFormat, LogTarget};

    fn config(sample: f64, queue: usize) -> AccessLogConfig {
        AccessLogConfig {
            target: LogTarget::Stderr,
            format: LogFormat::Json,
            fields: LogField::ALL.to_vec(),
            sample,
            log_keys: false,
            log_query: false,
            queue,
        }
    }

    #[test]
    fn sampling_logs_exactly_its_share_evenly() {
        let log = AccessLog::new(Some(&config(0.25, 10)));
        let picked: Vec<bool> = (0..8).map(|_| log.sampled().is_some()).collect();
        assert_eq!(
            picked,
            [false, false, false, true, false, false, false, true]
        );
        let log = AccessLog::new(Some(&config(0.0, 10)));
        assert!((0..100).all(|_| log.sampled().is_none()));
        assert!(AccessLog::new(None).sampled().is_none());
    }

    #[test]
    fn the_query_is_stripped_unless_asked_for() {
        let strip = Recording {
            log_keys: false,
            log_query: false,
        };
        assert_eq!(strip.path("/v1/chat?user=42&k=v"), "/v1/chat");
        assert_eq!(strip.path("/plain"), "/plain");
        let keep = Recording {
            log_query: true,
            ..strip
        };
        assert_eq!(keep.path("/v1/chat?user=42"), "/v1/chat?user=42");
    }
}
