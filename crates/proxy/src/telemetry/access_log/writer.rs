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
//! after a failed write. The task runs under [`crate::telemetry::supervise`].

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::{Mutex, mpsc, oneshot};
use tracing::{info, warn};

use super::{Control, Counters, Entry, Queue, line};
use crate::config::{AccessLogConfig, LogTarget};
use crate::telemetry::throttle::Throttle;

/// Bytes gathered before a write.
pub(crate) const BATCH_BYTES: usize = 64 << 10;
/// How long a line may wait in memory for others to share its write.
pub(crate) const FLUSH_AFTER: Duration = Duration::from_millis(100);
/// How often a batch being gathered looks for more lines.
const GATHER_TICK: Duration = Duration::from_millis(5);

/// The writer task's state, shared with a restarted one.
#[derive(Debug, Clone)]
pub(crate) struct Writer {
    pub(super) settings: Arc<ArcSwapOption<AccessLogConfig>>,
    pub(super) queue: Arc<Queue>,
    pub(super) controls: Arc<Mutex<mpsc::UnboundedReceiver<Control>>>,
    pub(super) counters: Arc<Counters>,
}

/// Where lines go, once opened.
enum Output {
    Stderr,
    File(File),
}

/// What the writer holds between writes.
struct Gathered {
    output: Option<Output>,
    /// Formatted lines, not yet written.
    bytes: Vec<u8>,
    lines: u64,
    /// Lines taken off the queue (kept for its allocation).
    #[allow(clippy::vec_box)]
    taken: Vec<Box<Entry>>,
    /// Flushes answered after the next write.
    flushes: Vec<oneshot::Sender<()>>,
}

impl Gathered {
    fn obey(&mut self, control: Control) {
        match control {
            Control::Reopen => {
                info!("access log reopened");
                self.output = None;
            }
            Control::Flush(done) => self.flushes.push(done),
        }
    }
}

/// One batch on its way to the blocking thread and back.
struct Batch {
    output: Option<Output>,
    target: LogTarget,
    /// Formatted lines.
    bytes: Vec<u8>,
    lines: u64,
}

impl Writer {
    /// Writes lines until the access log is dropped (magpie has stopped).
    pub(crate) async fn run(self) {
        let mut usr1 = match signal(SignalKind::user_defined1()) {
            Ok(s) => Some(s),
            Err(e) => {
                warn!(error = %e, "cannot listen for SIGUSR1; the access log reopens only on reload");
                None
            }
        };
        let mut controls = self.controls.lock().await;
        let mut gathered = Gathered {
            output: None,
            bytes: Vec::with_capacity(BATCH_BYTES),
            lines: 0,
            taken: Vec::new(),
            flushes: Vec::new(),
        };
        loop {
            tokio::select! {
                () = self.queue.arrived() => {}
                control = controls.recv() => match control {
                    Some(control) => gathered.obey(control),
                    None => return,
                },
                () = usr1_received(&mut usr1) => gathered.obey(Control::Reopen),
            }
            let gathering = tokio::time::Instant::now() + FLUSH_AFTER;
            loop {
                self.gather(&mut gathered);
                let now = tokio::time::Instant::now();
                if !gathered.flushes.is_empty()
                    || gathered.bytes.is_empty()
                    || gathered.bytes.len() >= BATCH_BYTES
                    || now >= gathering
                {
                    break;
                }
                // Looked for every tick rather than woken by each line: a
                // wake per line is a task switch per request.
                let tick = tokio::time::sleep_until(gathering.min(now + GATHER_TICK));
                tokio::select! {
                    () = tick => {}
                    control = controls.recv() => match control {
                        Some(control) => gathered.obey(control),
                        None => return,
                    },
                }
            }
            self.write_gathered(&mut gathered).await;
        }
    }

    /// Formats every waiting line into the batch.
    fn gather(&self, gathered: &mut Gathered) {
        self.queue.take(&mut gathered.taken);
        let settings = self.settings.load();
        for entry in gathered.taken.drain(..) {
            if let Some(s) = &*settings {
                line::write(&entry, s.format, &s.fields, &mut gathered.bytes);
                gathered.lines += 1;
            }
        }
    }

    /// Writes the batch, if it has lines, and answers the flushes.
    async fn write_gathered(&self, gathered: &mut Gathered) {
        let target = self.settings.load().as_ref().map(|s| s.target.clone());
        if let Some(target) = target.filter(|_| !gathered.bytes.is_empty()) {
            let batch = Batch {
                output: gathered.output.take(),
                target,
                bytes: std::mem::take(&mut gathered.bytes),
                lines: gathered.lines,
            };
            let done = self.write(batch).await;
            gathered.output = done.output;
            gathered.bytes = done.bytes;
        }
        gathered.bytes.clear();
        gathered.lines = 0;
        for done in gathered.flushes.drain(..) {
            // The one who asked may have stopped waiting.
            done.send(()).ok();
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
                bytes: Vec::with_capacity(BATCH_BYTES),
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
            Output::Stderr => io::stderr().lock().write_all(&batch.bytes),
            Output::File(f) => f.write_all(&batch.bytes),
        }
    })();
    (batch, result)
}

/// Whether `target` can be opened for appending (creating it if need be);
/// the error names the file.
pub(crate) fn can_open(target: &LogTarget) -> io::Result<()> {
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
