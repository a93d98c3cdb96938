//! No task dies silently. Long-lived tasks (accept loops, the admin
//! endpoint, health checks, engine load scrapes, reloading) run under [`spawn`]: if one panics —
//! a bug, since nothing a peer or the config can do should panic — the panic
//! is logged, counted in `magpie_task_restarts_total{task}`, and the task is
//! started again after a short pause. A task that returns has finished its
//! job (shutdown) and is not restarted.
//!
//! Every panic, in any task (a connection's too), also goes through the hook
//! [`install_panic_hook`] sets: one log line with its place, and
//! `magpie_panics_total`.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tracing::error;

use magpie_core::labels;

/// Pause before a panicked task starts again, so a task that panics at once
/// every time does not spin.
const RESTART_PAUSE: Duration = Duration::from_secs(1);

labels! {
    /// The long-lived tasks, for the restart counter's label.
    pub(crate) enum Task {
        Accept => "accept",
        Admin => "admin",
        Health => "health",
        EngineLoad => "engine_load",
        Reload => "reload",
        AccessLog => "access_log",
        Fleet => "fleet",
    }
}

static RESTARTS: [AtomicU64; Task::COUNT] = [const { AtomicU64::new(0) }; Task::COUNT];
static PANICS: AtomicU64 = AtomicU64::new(0);

/// Times `task` panicked and was started again, in this process.
pub(crate) fn restarts(task: Task) -> u64 {
    RESTARTS[task.index()].load(Ordering::Relaxed)
}

/// Panics in any thread or task of this process (with the hook installed).
pub(crate) fn panics() -> u64 {
    PANICS.load(Ordering::Relaxed)
}

/// Runs `start()` as a task; when that task panics, logs, counts and runs
/// `start()` again. Returns the supervising task's handle, which finishes
/// when a run returns normally.
pub(crate) fn spawn<F, Fut>(task: Task, mut start: F) -> tokio::task::JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            match tokio::spawn(start()).await {
                Ok(()) => return,
                Err(e) if e.is_panic() => {
                    RESTARTS[task.index()].fetch_add(1, Ordering::Relaxed);
                    error!(
                        task = task.as_str(),
                        "task panicked; starting it again in {RESTART_PAUSE:?}"
                    );
                    tokio::time::sleep(RESTART_PAUSE).await;
                }
                // Cancelled: only at runtime shutdown.
                Err(_) => return,
            }
        }
    })
}

/// Logs every panic through `tracing` (one line, with its place) and counts
/// it, then lets the default hook print it as before.
pub fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::Relaxed);
        let place = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        error!(%place, %message, "panic (a bug in magpie; please report it)");
        default(info);
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn a_panicking_task_is_counted_and_started_again() {
        let runs = Arc::new(AtomicU64::new(0));
        let before = restarts(Task::Health);
        let counted = Arc::clone(&runs);
        let handle = spawn(Task::Health, move || {
            let runs = Arc::clone(&counted);
            async move {
                if runs.fetch_add(1, Ordering::Relaxed) < 2 {
                    panic!("test panic");
                }
            }
        });
        handle.await.expect("the supervisor itself does not fail");
        assert_eq!(
            runs.load(Ordering::Relaxed),
            3,
            "two panics, then a normal end"
        );
        assert_eq!(restarts(Task::Health) - before, 2);
    }
}
