//! Running the lab's independent pieces of work side by side: one worker
//! per available core (the process's CPU affinity counts), each taking the
//! next job in list order until none is left. Results come back in job
//! order, so the report does not depend on which worker ran what.

use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `work` applied to every job, results in job order. List the longest jobs
/// first: workers take them in order, so short ones fill the gaps at the end.
pub(super) fn map<J, T, F>(jobs: Vec<J>, work: F) -> Vec<T>
where
    J: Send,
    T: Send,
    F: Fn(J) -> T + Sync,
{
    let workers = std::thread::available_parallelism()
        .map_or(1, NonZeroUsize::get)
        .min(jobs.len());
    if workers <= 1 {
        return jobs.into_iter().map(work).collect();
    }
    let count = jobs.len();
    let jobs: Vec<Mutex<Option<J>>> = jobs.into_iter().map(|j| Mutex::new(Some(j))).collect();
    let next = AtomicUsize::new(0);
    let run = || {
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(slot) = jobs.get(i) else {
                return done;
            };
            // Each index is handed out once, so the lock is never contended
            // and the job is always there; a poisoned lock only means another
            // worker panicked, and that panic is re-raised below.
            let job = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(job) = job {
                done.push((i, work(job)));
            }
        }
    };
    let mut results: Vec<Option<T>> = (0..count).map(|_| None).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = (1..workers).map(|_| s.spawn(run)).collect();
        let mut all = run();
        for h in handles {
            match h.join() {
                Ok(done) => all.extend(done),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        for (i, t) in all {
            results[i] = Some(t);
        }
    });
    results
        .into_iter()
        .map(|t| t.expect("every job ran exactly once"))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn results_in_job_order() {
        let jobs: Vec<u64> = (0..100).collect();
        let got = super::map(jobs, |j| j * j);
        assert_eq!(got, (0..100).map(|j| j * j).collect::<Vec<_>>());
        assert!(super::map(Vec::<u8>::new(), |j| j).is_empty());
    }
}
