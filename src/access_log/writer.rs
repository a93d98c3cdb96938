//! The writer: takes lines off the queue, formats them, and writes them in
//! batches, off the runtime's threads.
//!
//! Lines are gathered in memory up to [`BATCH_BYTES`], or for at most
//! [`FLUSH_AFTER`] from the first of them, then written with one `write` on
//! a blocking thread (nginx's `buffer=` and `flush=` do the same). Writing
//! whenever the queue ran empty cost a thread hand-off for every few
//! lines: a quarter of the requests per second of a busy core. A flush (at
//! shutdown, or asked for) writes at once. While a write is stuck (a full disk, a pipe nobody
//! reads), lines pile up in the queue to `access_log.queue` and the rest are
//! dropped and counted: traffic never waits for the log.
//!
//! The file is opened for appending at the first line, and opened again at
//! SIGUSR1 (logrotate's `postrotate`), after a reload changed the path, and
//! after a failed write. The task runs under [`crate::supervise`].

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{Mutex, mpsc};
use tracing::{info, warn};

use super::{Counters, Message, line};
use crate::config::{AccessLogConfig, LogTarget};
use crate::throttle::Throttle;

/// Bytes gathered before a write.
pub const BATCH_BYTES: usize = 64 << 10;
/// How long a line may wait in memory for others to share its write.
pub const FLUSH_AFTER: Duration = Duration::from_millis(100);
/// How often a batch being gathered looks for more lines.
const GATHER_TICK: Duration = Duration::from_millis(5);

/// The writer task's state, shared with a restarted one.
#[derive(Debug, Clone)]
pub struct Writer {
    pub(super) settings: Arc<ArcSwapOption<AccessLogConfig>>,
    pub(super) receiver: Arc<Mutex<mpsc::UnboundedReceiver<Message>>>,
    pub(super) counters: Arc<Counters>,
}

/// Where lines go, once opened.
enum Output {
    Stderr,
    File(File),
}

/// One batch on its way to the blocking thread and back.
struct Batch {
    output: Option<Output>,
    target: LogTarget,
    /// Formatted lines.
    bytes: String,
    lines: u64,
}

impl Writer {
    /// Writes lines until the access log is dropped (magpie has stopped).
    pub async fn run(self) {
        let mut usr1 = match signal(SignalKind::user_defined1()) {
            Ok(s) => Some(s),
            Err(e) => {
                warn!(error = %e, "cannot listen for SIGUSR1; the access log reopens only on reload");
                None
            }
        };
        let mut receiver = self.receiver.lock().await;
        let mut output = None;
        let mut bytes = String::with_capacity(BATCH_BYTES);
        let mut flushes = Vec::new();
        loop {
            let mut lines = 0;
            let first = tokio::select! {
                m = receiver.recv() => m,
                () = usr1_received(&mut usr1) => Some(Message::Reopen),
            };
            let Some(first) = first else {
                return;
            };
            let gathering = tokio::time::Instant::now() + FLUSH_AFTER;
            let mut next = Some(first);
            while let Some(message) = next {
                let mut flush = false;
                match message {
                    Message::Line(entry) => {
                        self.counters.queued.fetch_sub(1, Ordering::Relaxed);
                        if let Some(s) = &*self.settings.load() {
                            line::write(&entry, s.format, &s.fields, &mut bytes);
                            lines += 1;
                        }
                    }
                    Message::Reopen => {
                        info!("access log reopened");
                        output = None;
                    }
                    Message::Flush(done) => {
                        flushes.push(done);
                        flush = true;
                    }
                }
                if flush || bytes.len() >= BATCH_BYTES {
                    break;
                }
                next = next_message(&mut receiver, gathering, !bytes.is_empty()).await;
            }
            let target = self.settings.load().as_ref().map(|s| s.target.clone());
            if let Some(target) = target.filter(|_| !bytes.is_empty()) {
                let batch = Batch {
                    output: output.take(),
                    target,
                    bytes,
                    lines,
                };
                let done = self.write(batch).await;
                output = done.output;
                bytes = done.bytes;
            }
            bytes.clear();
            for done in flushes.drain(..) {
                // The one who asked may have stopped waiting.
                done.send(()).ok();
            }
        }
    }

    /// Writes `batch` on a blocking thread (opening its output first if
    /// need be); counts its lines, or the failure.
    async fn write(&self, batch: Batch) -> Batch {
        static LOG: Throttle = Throttle::new(Duration::from_secs(10));
        let lines = batch.lines;
        let done = tokio::task::spawn_blocking(move || write_blocking(batch)).await;
        let failed = match done {
            Ok((batch, Ok(()))) => {
                self.counters.lines.fetch_add(lines, Ordering::Relaxed);
                return batch;
            }
            Ok((batch, Err(e))) => Some((batch, e.to_string())),
            Err(e) => {
                warn!(error = %e, "access log write did not finish");
                None
            }
        };
        self.counters.write_errors.fetch_add(1, Ordering::Relaxed);
        let (mut batch, error) = failed.unwrap_or_else(|| {
            let empty = Batch {
                output: None,
                target: LogTarget::Stderr,
                bytes: String::with_capacity(BATCH_BYTES),
                lines: 0,
            };
            (empty, "the writing thread panicked".to_string())
        });
        if let Some(held_back) = LOG.allow() {
            warn!(%error, lines, held_back, "cannot write the access log; its lines are lost and the file is opened again for the next ones");
        }
        // Opened again at the next batch.
        batch.output = None;
        batch
    }
}

/// The next message for the batch being gathered: one already waiting,
/// else, while the batch has lines and `gathering` is not past, one that
/// arrives by then. Looked for every [`GATHER_TICK`] rather than awaited: a
/// waiting receiver is woken by every line sent, a task switch per request.
async fn next_message(
    receiver: &mut mpsc::UnboundedReceiver<Message>,
    gathering: tokio::time::Instant,
    gathered: bool,
) -> Option<Message> {
    loop {
        match receiver.try_recv() {
            Ok(message) => return Some(message),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) => {}
        }
        let now = tokio::time::Instant::now();
        if !gathered || now >= gathering {
            return None;
        }
        tokio::time::sleep_until(gathering.min(now + GATHER_TICK)).await;
    }
}

/// Resolves at each SIGUSR1; never when there is no handler.
async fn usr1_received(usr1: &mut Option<Signal>) {
    let received = match usr1 {
        Some(s) => s.recv().await.is_some(),
        None => false,
    };
    if !received {
        std::future::pending::<()>().await;
    }
}

fn write_blocking(mut batch: Batch) -> (Batch, io::Result<()>) {
    let result = (|| {
        let output = match batch.output.take() {
            Some(o) => o,
            None => open(&batch.target)?,
        };
        let output = batch.output.insert(output);
        match output {
            Output::Stderr => io::stderr().lock().write_all(batch.bytes.as_bytes()),
            Output::File(f) => f.write_all(batch.bytes.as_bytes()),
        }
    })();
    (batch, result)
}

/// Whether `target` can be opened for appending (creating it if need be);
/// the error names the file.
pub fn can_open(target: &LogTarget) -> io::Result<()> {
    open(target).map(drop)
}

fn open(target: &LogTarget) -> io::Result<Output> {
    match target {
        LogTarget::Stderr => Ok(Output::Stderr),
        LogTarget::File(path) => OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map(Output::File)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    }
}
