//! The simulated engine's time model: one GPU, owned by one task.
//!
//! Requests wait in a queue (`waiting`) until a batch slot is free and the
//! GPU is not prefilling: first in, first out, or with `priority` by their
//! `priority` (the lowest value first, as vLLM's `--scheduling-policy
//! priority`; first in, first out among equals). Prefill is serialised: one
//! at a time, costing `prefill_us_per_token` for each prompt token the prefix
//! cache does not hold, in chunks of `prefill_chunk_tokens`; at a chunk's end
//! a waiting request of a higher priority takes the GPU, and the one it
//! interrupted waits again, keeping what it computed. Prefill produces the
//! first token (the time to first token is the wait plus the prefill). The running batch, up to `max_running` sequences
//! including the one in prefill, decodes together: every
//! `decode_ms_per_token` each decoding sequence gets one more token. The
//! cache is consulted when a prefill starts (a queued request benefits from
//! what ran before it); a request holds its prompt's blocks while it runs and
//! adds its answer's blocks when it completes, since the next turn's prompt
//! holds the answer.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::EngineConfig;
use super::cache::PrefixCache;

/// One request for the GPU.
pub struct Job {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Chained hashes of the whole blocks of the prompt followed by the
    /// answer; the first `prompt_blocks` are the prompt's own.
    pub blocks: Vec<u64>,
    pub prompt_blocks: usize,
    /// Tokens to generate (at least 1).
    pub max_tokens: usize,
    /// Its `priority` (lower first, with `priority` scheduling; 0 when the
    /// request gives none).
    pub priority: i64,
    /// Where the sequence's progress goes. Unbounded, but a job sends at most
    /// `max_tokens` events, and `max_tokens` is bounded by the config.
    pub events: mpsc::UnboundedSender<Event>,
    /// A prefill half's lease: once done, its blocks stay held under it
    /// until pulled ([`Msg::Release`]) or `kv_lease` passes.
    pub lease: Option<u64>,
    /// A decode half's: the prompt's leading blocks pulled from a prefill
    /// engine; those its cache lacks move first, then it prefills the rest.
    pub imported_blocks: usize,
}

/// What the GPU's inbox carries.
pub enum Msg {
    Job(Job),
    /// A decode engine pulled this lease's blocks: they are let go.
    Release(u64),
}

/// A sequence's progress, as the GPU makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Prefill done: the first token is out. `cached_tokens` of the prompt
    /// came from the prefix cache.
    First { cached_tokens: usize },
    /// One more token. After `max_tokens` tokens in all the channel closes.
    Token,
}

/// What the engine has done, for `/metrics` and for tests.
#[derive(Default)]
pub struct Counters {
    pub requests: AtomicU64,
    pub finished: AtomicU64,
    pub cancelled: AtomicU64,
    pub rejected: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    pub waiting: AtomicU64,
    pub running: AtomicU64,
    pub cache_held: AtomicU64,
    pub cache_blocks: AtomicU64,
    pub evictions: AtomicU64,
    /// Time spent prefilling, in microseconds.
    pub prefill_busy_us: AtomicU64,
    /// KV tokens moved in from prefill engines (decode halves).
    pub kv_received_tokens: AtomicU64,
    /// Prefill halves' leases held, not pulled yet.
    pub leases: AtomicU64,
}

/// A job in the batch, or waiting for the GPU.
struct Seq {
    job: Job,
    /// Of `job.blocks`, how many it holds in the cache (all from the first).
    held: usize,
    /// Prompt tokens the cache held when its prefill started.
    cached: usize,
    /// Prompt tokens still to prefill; `None` before its prefill starts.
    left: Option<usize>,
    /// Its place among waiting sequences of its priority.
    arrival: u64,
    emitted: usize,
}

/// A waiting sequence in the queue's order: the lowest priority value
/// first (all 0 without `priority`), then the earliest.
struct Waiting {
    order: (i64, u64),
    seq: Seq,
}

impl PartialEq for Waiting {
    fn eq(&self, other: &Self) -> bool {
        self.order == other.order
    }
}

impl Eq for Waiting {}

impl PartialOrd for Waiting {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Waiting {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.order.cmp(&other.order)
    }
}

struct Gpu {
    config: EngineConfig,
    cache: PrefixCache,
    waiting: BinaryHeap<Reverse<Waiting>>,
    /// Jobs queued so far: the order among equal priorities.
    arrivals: u64,
    /// The sequence in prefill and when its prefill ends.
    prefill: Option<(Instant, Seq)>,
    decoding: Vec<Seq>,
    next_step: Instant,
    /// Decode halves whose KV is moving in, each until its end.
    moving: Vec<(Instant, Seq)>,
    /// Prefill halves' blocks, held until pulled or until then.
    leased: HashMap<u64, (Vec<u64>, Instant)>,
    counters: Arc<Counters>,
}

/// Runs the GPU until `stop` fires or every sender of `jobs` is gone.
pub async fn run(
    config: EngineConfig,
    mut jobs: mpsc::Receiver<Msg>,
    counters: Arc<Counters>,
    stop: CancellationToken,
) {
    let mut gpu = Gpu {
        cache: PrefixCache::new(config.cache_blocks),
        config,
        waiting: BinaryHeap::new(),
        arrivals: 0,
        prefill: None,
        decoding: Vec::new(),
        next_step: Instant::now(),
        moving: Vec::new(),
        leased: HashMap::new(),
        counters,
    };
    loop {
        gpu.start_prefill();
        gpu.publish();
        let prefill_end = gpu.prefill.as_ref().map(|(at, _)| *at);
        let timer = gpu.next_timer();
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            msg = jobs.recv() => match msg {
                Some(Msg::Job(job)) => gpu.enqueue(job),
                Some(Msg::Release(lease)) => gpu.release_lease(lease),
                None => return,
            },
            () = sleep_until(timer.unwrap_or(gpu.next_step)), if timer.is_some() => gpu.timers(),
            () = sleep_until(prefill_end.unwrap_or(gpu.next_step)), if prefill_end.is_some() => {
                gpu.end_chunk();
            }
            () = sleep_until(gpu.next_step), if !gpu.decoding.is_empty() => gpu.step(),
        }
    }
}

impl Gpu {
    fn running(&self) -> usize {
        self.decoding.len() + usize::from(self.prefill.is_some())
    }

    /// Queues a job, or drops it when `max_waiting` jobs wait already (its
    /// channel then closes before any event: the server answers 503).
    fn enqueue(&mut self, job: Job) {
        if self.waiting.len() >= self.config.max_waiting {
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters.requests.fetch_add(1, Ordering::Relaxed);
            let seq = Seq {
                job,
                held: 0,
                cached: 0,
                left: None,
                arrival: self.arrivals,
                emitted: 0,
            };
            self.arrivals += 1;
            if seq.job.imported_blocks > 0 {
                self.import(seq);
            } else {
                self.wait(seq);
            }
        }
    }

    /// A decode half: its prefill begins at once, counting the imported
    /// blocks as cached; the blocks its cache lacked move in (off the
    /// prefill lane) before it waits for the GPU.
    fn import(&mut self, seq: Seq) {
        let prompt = &seq.job.blocks[..seq.job.prompt_blocks];
        let local = self.cache.matched(prompt);
        let imported = seq.job.imported_blocks.min(seq.job.prompt_blocks);
        let moved = imported.saturating_sub(local) * self.config.block_tokens;
        self.counters
            .kv_received_tokens
            .fetch_add(moved as u64, Ordering::Relaxed);
        let seq = self.begin(seq.job, seq.arrival);
        let transfer = moved as f64 * self.config.kv_transfer_us_per_token / 1_000_000.0;
        let until = Instant::now() + Duration::from_secs_f64(transfer);
        self.moving.push((until, seq));
    }

    /// The earliest of the moves' ends and the leases' times.
    fn next_timer(&self) -> Option<Instant> {
        let moves = self.moving.iter().map(|(at, _)| *at);
        moves.chain(self.leased.values().map(|(_, at)| *at)).min()
    }

    /// Moves that ended wait for the GPU; leases past their time let go.
    fn timers(&mut self) {
        let now = Instant::now();
        let (done, moving) = std::mem::take(&mut self.moving)
            .into_iter()
            .partition(|(at, _)| *at <= now);
        self.moving = moving;
        for (_, seq) in done {
            self.wait(seq);
        }
        let expired: Vec<u64> = (self.leased.iter())
            .filter(|(_, (_, at))| *at <= now)
            .map(|(lease, _)| *lease)
            .collect();
        for lease in expired {
            self.release_lease(lease);
        }
    }

    fn release_lease(&mut self, lease: u64) {
        if let Some((blocks, _)) = self.leased.remove(&lease) {
            self.cache.release(&blocks);
        }
    }

    /// Queues `seq` in its order: a sequence interrupted mid-prefill comes
    /// back where it was.
    fn wait(&mut self, seq: Seq) {
        let order = (self.priority(&seq), seq.arrival);
        self.waiting.push(Reverse(Waiting { order, seq }));
    }

    /// `seq`'s priority, as this GPU schedules: 0 for all without `priority`.
    fn priority(&self, seq: &Seq) -> i64 {
        if self.config.priority {
            seq.job.priority
        } else {
            0
        }
    }

    /// The priority of the first waiting sequence, if any.
    fn first_waiting(&self) -> Option<i64> {
        self.waiting.peek().map(|w| w.0.order.0)
    }

    /// Takes the next waiting sequence into prefill (its next chunk), if
    /// the GPU and a batch slot are free.
    fn start_prefill(&mut self) {
        while self.prefill.is_none() && self.running() < self.config.max_running {
            let Some(Reverse(Waiting { seq, .. })) = self.waiting.pop() else {
                return;
            };
            if seq.job.events.is_closed() {
                self.cancel(seq);
                continue;
            }
            let seq = match seq.left {
                Some(_) => seq,
                None => self.begin(seq.job, seq.arrival),
            };
            let chunk = self.chunk(&seq);
            let cost = self.prefill_time(chunk);
            self.prefill = Some((Instant::now() + cost, seq));
        }
    }

    /// A job's prefill begins: what the cache holds of its prompt is taken
    /// and counted.
    fn begin(&mut self, job: Job, arrival: u64) -> Seq {
        let prompt = &job.blocks[..job.prompt_blocks];
        // At least one token is computed, as in vLLM: a prompt cached
        // whole recomputes its last block.
        let imported = job.imported_blocks.min(job.prompt_blocks);
        let mut matched = self.cache.matched(prompt).max(imported);
        if matched * self.config.block_tokens >= job.prompt_tokens {
            matched = matched.saturating_sub(1);
        }
        let cached = matched * self.config.block_tokens;
        let held = self.cache.acquire(prompt);
        let uncached = job.prompt_tokens - cached;
        let c = &self.counters;
        c.prompt_tokens
            .fetch_add(job.prompt_tokens as u64, Ordering::Relaxed);
        c.cached_tokens.fetch_add(cached as u64, Ordering::Relaxed);
        c.prefill_busy_us.fetch_add(
            self.prefill_time(uncached).as_micros() as u64,
            Ordering::Relaxed,
        );
        Seq {
            job,
            held,
            cached,
            left: Some(uncached),
            arrival,
            emitted: 0,
        }
    }

    /// The tokens of `seq`'s next chunk.
    fn chunk(&self, seq: &Seq) -> usize {
        let left = seq.left.unwrap_or(0);
        match self.config.prefill_chunk_tokens {
            0 => left,
            n => left.min(n),
        }
    }

    fn prefill_time(&self, tokens: usize) -> Duration {
        Duration::from_secs_f64(tokens as f64 * self.config.prefill_us_per_token / 1_000_000.0)
    }

    /// A chunk's prefill is done: the sequence's first token is out if it
    /// was its last; else it goes on, unless a waiting sequence of a higher
    /// priority takes the GPU.
    fn end_chunk(&mut self) {
        let Some((_, mut seq)) = self.prefill.take() else {
            return;
        };
        let chunk = self.chunk(&seq);
        let left = seq.left.unwrap_or(0) - chunk;
        seq.left = Some(left);
        if left == 0 {
            return self.finish_prefill(seq);
        }
        if self
            .first_waiting()
            .is_some_and(|p| p < self.priority(&seq))
        {
            self.wait(seq);
        } else {
            let cost = self.prefill_time(self.chunk(&seq));
            self.prefill = Some((Instant::now() + cost, seq));
        }
    }

    fn finish_prefill(&mut self, mut seq: Seq) {
        let cached_tokens = seq.cached;
        seq.emitted = 1;
        self.counters
            .generation_tokens
            .fetch_add(1, Ordering::Relaxed);
        if seq.job.events.send(Event::First { cached_tokens }).is_err() {
            self.cancel(seq);
        } else if seq.job.max_tokens <= 1 {
            self.complete(seq);
        } else {
            if self.decoding.is_empty() {
                self.next_step = Instant::now() + self.decode_step();
            }
            self.decoding.push(seq);
        }
    }

    fn decode_step(&self) -> Duration {
        Duration::from_secs_f64(self.config.decode_ms_per_token / 1000.0)
    }

    /// One decode step: a token for every decoding sequence.
    fn step(&mut self) {
        let batch = std::mem::take(&mut self.decoding);
        let mut tokens = 0;
        for mut seq in batch {
            seq.emitted += 1;
            tokens += 1;
            if seq.job.events.send(Event::Token).is_err() {
                self.cancel(seq);
            } else if seq.emitted >= seq.job.max_tokens {
                self.complete(seq);
            } else {
                self.decoding.push(seq);
            }
        }
        self.counters
            .generation_tokens
            .fetch_add(tokens, Ordering::Relaxed);
        // Steps keep their cadence; a GPU that fell behind does not bunch them.
        self.next_step = (self.next_step + self.decode_step()).max(Instant::now());
    }

    /// A finished sequence: its answer's blocks join the cache (when its
    /// prompt's chain is whole), then it lets go of everything.
    /// A prefill half keeps holding its blocks under its lease.
    fn complete(&mut self, mut seq: Seq) {
        if seq.held == seq.job.prompt_blocks {
            seq.held += self.cache.acquire(&seq.job.blocks[seq.held..]);
        }
        self.counters.finished.fetch_add(1, Ordering::Relaxed);
        let Some(lease) = seq.job.lease else {
            return self.cache.release(&seq.job.blocks[..seq.held]);
        };
        // A lease given again (a room reused) lets the first go.
        self.release_lease(lease);
        seq.job.blocks.truncate(seq.held);
        let until = Instant::now() + self.config.kv_lease;
        self.leased.insert(lease, (seq.job.blocks, until));
    }

    /// A sequence whose client went away: it stops, keeping what it computed.
    fn cancel(&mut self, seq: Seq) {
        self.cache.release(&seq.job.blocks[..seq.held]);
        self.counters.cancelled.fetch_add(1, Ordering::Relaxed);
    }

    /// The gauges.
    fn publish(&self) {
        let c = &self.counters;
        c.waiting
            .store(self.waiting.len() as u64, Ordering::Relaxed);
        c.running.store(self.running() as u64, Ordering::Relaxed);
        c.cache_held
            .store(self.cache.held() as u64, Ordering::Relaxed);
        c.cache_blocks
            .store(self.cache.len() as u64, Ordering::Relaxed);
        c.evictions.store(self.cache.evictions(), Ordering::Relaxed);
        c.leases.store(self.leased.len() as u64, Ordering::Relaxed);
    }
}
