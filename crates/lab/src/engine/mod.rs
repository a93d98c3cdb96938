//! `magpie engine`: a simulated OpenAI-compatible inference engine, so
//! routing experiments need no GPU, no model and nothing but magpie.
//!
//! It serves `POST /v1/chat/completions` and `/v1/completions` (plain and
//! streamed as server-sent events), `GET /health`, `/v1/models`, `/metrics`
//! (vLLM's names) and `/server_info`, `/model_info` (what SGLang's model
//! gateway reads to register a worker). It has what makes routing matter: a
//! prefix cache of KV blocks with LRU eviction, and a GPU whose prefill costs
//! time per uncached token, one at a time, so a request that lands where its
//! conversation's blocks are is served sooner and costs less; with
//! `--priority`, a request's `priority` field orders the queue and
//! interrupts a lower one's prefill between chunks; with `--role`, it
//! serves either half of a disaggregated request, by vLLM's protocol or
//! SGLang's ([`transfer`]). Every answer carries `x-engine: NAME`.
//!
//! | module | owns |
//! |---|---|
//! | [`prompt`] | chat template, tokenizer, chained block hashes, answer text |
//! | [`cache`] | the prefix cache: blocks, holds, LRU eviction |
//! | [`gpu`] | the time model: queue, serial prefill, batched decode |
//! | `server` | the HTTP/1.1 server: routes, request parsing, limits |
//! | `reply` | response bodies: JSON, server-sent events, metrics, info |
//! | [`transfer`] | disaggregated prefill and decode: which half a request asks for, leases, pulls |
//! | `state` | what every connection of one engine shares: settings, the queue to its GPU, counters, its name |

use crate::bounds::{OutOfRange, range};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub mod cache;
pub mod gpu;
pub mod prompt;
mod reply;
mod server;
mod state;
#[cfg(test)]
mod tests;
pub mod transfer;

/// The header every answer carries: the engine's name.
pub const ENGINE_HEADER: &str = "x-engine";

/// How a simulated engine behaves. [`EngineConfig::validate`] checks the bounds.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The name in `x-engine` and in logs.
    pub name: String,
    /// The model name `/v1/models` lists and metrics carry.
    pub model: String,
    /// Tokens per KV block.
    pub block_tokens: usize,
    /// Blocks the prefix cache holds.
    pub cache_blocks: usize,
    /// Prefill time per uncached prompt token, in microseconds.
    pub prefill_us_per_token: f64,
    /// Time per decode step of the running batch, in milliseconds.
    pub decode_ms_per_token: f64,
    /// Sequences in the batch (prefill included).
    pub max_running: usize,
    /// Waiting requests go by their body's `priority`, the lowest first (as
    /// vLLM's `--scheduling-policy priority`); else first in, first out.
    pub priority: bool,
    /// Prompt tokens prefilled in one go; at each chunk's end a request of
    /// a higher priority may take the GPU. 0: a prompt in one go.
    pub prefill_chunk_tokens: usize,
    /// Requests that may wait; beyond, 503.
    pub max_waiting: usize,
    /// Answer length when a request gives no `max_tokens`.
    pub default_max_tokens: usize,
    /// The largest `max_tokens` accepted.
    pub max_tokens_limit: usize,
    /// The largest request body; beyond, 413.
    pub max_body_bytes: usize,
    /// Which half of a disaggregated request it serves (SGLang's protocol;
    /// vLLM's says it in the body).
    pub role: transfer::Role,
    /// Time to move one token's KV in from a prefill engine, in
    /// microseconds.
    pub kv_transfer_us_per_token: f64,
    /// How long a prefill half holds its blocks for a pull, and how long a
    /// pull waits for them.
    pub kv_lease: std::time::Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            name: "engine".into(),
            model: "magpie-sim".into(),
            block_tokens: 16,
            cache_blocks: 2000,
            prefill_us_per_token: 50.0,
            decode_ms_per_token: 10.0,
            max_running: 32,
            priority: false,
            prefill_chunk_tokens: 512,
            max_waiting: 4096,
            default_max_tokens: 64,
            max_tokens_limit: 8192,
            max_body_bytes: 8 << 20,
            role: transfer::Role::Both,
            kv_transfer_us_per_token: 10.0,
            kv_lease: std::time::Duration::from_secs(30),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    OutOfRange(#[from] OutOfRange),
    #[error("{option} must be 1 to {max} visible ASCII characters, not {value:?}")]
    BadName {
        option: &'static str,
        max: usize,
        value: String,
    },
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

impl EngineConfig {
    /// Checks every option's bounds.
    pub fn validate(&self) -> Result<(), EngineError> {
        name("--name", &self.name, 64)?;
        name("--model", &self.model, 256)?;
        let count = |option, value: usize, min: usize, max: usize| {
            range(option, value as f64, min as f64, max as f64)
        };
        count("--block-tokens", self.block_tokens, 1, 1024)?;
        count("--cache-blocks", self.cache_blocks, 1, 10_000_000)?;
        range(
            "--prefill-us-per-token",
            self.prefill_us_per_token,
            0.0,
            100_000.0,
        )?;
        range(
            "--decode-ms-per-token",
            self.decode_ms_per_token,
            0.0,
            10_000.0,
        )?;
        count("--max-running", self.max_running, 1, 100_000)?;
        count("--prefill-chunk", self.prefill_chunk_tokens, 0, 10_000_000)?;
        count("--max-waiting", self.max_waiting, 1, 1_000_000)?;
        count("--max-tokens-limit", self.max_tokens_limit, 1, 1_000_000)?;
        count(
            "--max-tokens",
            self.default_max_tokens,
            1,
            self.max_tokens_limit,
        )?;
        count("--max-body-bytes", self.max_body_bytes, 1024, 1 << 30)?;
        range(
            "--kv-transfer-us-per-token",
            self.kv_transfer_us_per_token,
            0.0,
            100_000.0,
        )?;
        let lease_ms = self.kv_lease.as_millis().min(u128::from(u32::MAX)) as usize;
        count("--kv-lease-ms", lease_ms, 1, 600_000)?;
        Ok(())
    }
}

fn name(option: &'static str, value: &str, max: usize) -> Result<(), EngineError> {
    if !value.is_empty() && value.len() <= max && value.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(EngineError::BadName {
            option,
            max,
            value: value.to_string(),
        })
    }
}

/// A running engine: where it listens and what it has done.
#[derive(Clone)]
pub struct Engine {
    addr: SocketAddr,
    counters: Arc<gpu::Counters>,
}

/// A copy of an engine's counters and gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// Requests queued (rejected ones not included).
    pub requests: u64,
    pub finished: u64,
    /// Requests whose client went away before the answer was complete.
    pub cancelled: u64,
    /// Requests refused because `max_waiting` requests were waiting.
    pub rejected: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub generation_tokens: u64,
    pub waiting: u64,
    pub running: u64,
    pub cache_blocks: u64,
    pub cache_held: u64,
    pub evictions: u64,
    pub prefill_busy_us: u64,
    pub kv_received_tokens: u64,
    pub leases: u64,
}

impl Engine {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn counts(&self) -> Counts {
        let c = &*self.counters;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        Counts {
            requests: get(&c.requests),
            finished: get(&c.finished),
            cancelled: get(&c.cancelled),
            rejected: get(&c.rejected),
            prompt_tokens: get(&c.prompt_tokens),
            cached_tokens: get(&c.cached_tokens),
            generation_tokens: get(&c.generation_tokens),
            waiting: get(&c.waiting),
            running: get(&c.running),
            cache_blocks: get(&c.cache_blocks),
            cache_held: get(&c.cache_held),
            evictions: get(&c.evictions),
            prefill_busy_us: get(&c.prefill_busy_us),
            kv_received_tokens: get(&c.kv_received_tokens),
            leases: get(&c.leases),
        }
    }
}

/// Starts an engine on `addr` (port 0 for any); it runs until `stop` fires.
pub async fn start(
    config: EngineConfig,
    addr: SocketAddr,
    stop: CancellationToken,
) -> Result<Engine, EngineError> {
    config.validate()?;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| EngineError::Listen { addr, source })?;
    serve(config, listener, stop)
}

/// Starts an engine on a bound listener; it runs until `stop` fires.
pub fn serve(
    config: EngineConfig,
    listener: TcpListener,
    stop: CancellationToken,
) -> Result<Engine, EngineError> {
    config.validate()?;
    let addr = listener
        .local_addr()
        .map_err(|source| EngineError::Listen {
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            source,
        })?;
    let counters = Arc::new(gpu::Counters::default());
    // The GPU's inbox; the queue proper (bounded by max_waiting) is inside it.
    let (jobs, inbox) = mpsc::channel(1024);
    tokio::spawn(gpu::run(
        config.clone(),
        inbox,
        Arc::clone(&counters),
        stop.clone(),
    ));
    let state = Arc::new(state::State::new(config, addr, jobs, Arc::clone(&counters)));
    tokio::spawn(server::accept_loop(listener, state, stop));
    Ok(Engine { addr, counters })
}

/// `magpie engine`: runs one engine until `stop` fires.
pub async fn main(args: &EngineArgs, stop: CancellationToken) -> Result<(), EngineError> {
    let config = args.config();
    let engine = start(config.clone(), args.listen, stop.clone()).await?;
    tracing::info!(
        name = %config.name,
        addr = %engine.addr(),
        prefill_us_per_token = config.prefill_us_per_token,
        decode_ms_per_token = config.decode_ms_per_token,
        cache_blocks = config.cache_blocks,
        role = ?config.role,
        "simulated engine listening"
    );
    stop.cancelled().await;
    Ok(())
}

/// `magpie engine`'s options.
#[derive(Debug, clap::Args)]
pub struct EngineArgs {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// The name in every answer's x-engine header.
    #[arg(long, default_value = "engine")]
    pub name: String,
    /// The model name it serves.
    #[arg(long, default_value = "magpie-sim")]
    pub model: String,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_tokens: usize,
    /// Blocks in the prefix cache.
    #[arg(long, default_value_t = 2000)]
    pub cache_blocks: usize,
    /// Prefill time per uncached prompt token (µs); prefills run one at a time.
    #[arg(long, default_value_t = 50.0)]
    pub prefill_us_per_token: f64,
    /// Time per decode step of the running batch (ms).
    #[arg(long, default_value_t = 10.0)]
    pub decode_ms_per_token: f64,
    /// Sequences decoding together (the one in prefill included).
    #[arg(long, default_value_t = 32)]
    pub max_running: usize,
    /// Requests that may wait for the batch; beyond, 503.
    #[arg(long, default_value_t = 4096)]
    pub max_waiting: usize,
    /// Schedule waiting requests by their body's priority field, the lowest
    /// first (vLLM's --scheduling-policy priority); else first in, first out.
    #[arg(long)]
    pub priority: bool,
    /// Prompt tokens prefilled in one go (0: a whole prompt); at each
    /// chunk's end a waiting request of a higher priority takes the GPU.
    #[arg(long, default_value_t = 512)]
    pub prefill_chunk: usize,
    /// Answer length when a request gives no max_tokens.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// The largest max_tokens a request may ask for.
    #[arg(long, default_value_t = 8192)]
    pub max_tokens_limit: usize,
    /// Which half of a disaggregated request with SGLang's bootstrap fields
    /// it serves (vLLM's kv_transfer_params say it in the body).
    #[arg(long, value_enum, default_value_t = transfer::Role::Both)]
    pub role: transfer::Role,
    /// Time to move one token's KV in from a prefill engine (µs).
    #[arg(long, default_value_t = 10.0)]
    pub kv_transfer_us_per_token: f64,
    /// How long a prefill half holds its KV for a decode engine to pull
    /// (ms); a pull waits as long for it.
    #[arg(long, default_value_t = 30_000)]
    pub kv_lease_ms: u64,
}

impl EngineArgs {
    pub fn config(&self) -> EngineConfig {
        EngineConfig {
            name: self.name.clone(),
            model: self.model.clone(),
            block_tokens: self.block_tokens,
            cache_blocks: self.cache_blocks,
            prefill_us_per_token: self.prefill_us_per_token,
            decode_ms_per_token: self.decode_ms_per_token,
            max_running: self.max_running,
            max_waiting: self.max_waiting,
            priority: self.priority,
            prefill_chunk_tokens: self.prefill_chunk,
            default_max_tokens: self.max_tokens,
            max_tokens_limit: self.max_tokens_limit,
            role: self.role,
            kv_transfer_us_per_token: self.kv_transfer_us_per_token,
            kv_lease: std::time::Duration::from_millis(self.kv_lease_ms),
            ..EngineConfig::default()
        }
    }
}
