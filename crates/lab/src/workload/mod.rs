//! `magpie workload`: multi-turn chats against OpenAI-compatible endpoints,
//! measuring what routing does to an inference fleet's prefix caches.
//!
//! N conversations of T turns each arrive as a Poisson process. Each starts
//! with one of S shared system prompts, sends a user message, appends the
//! answer to its history and, after an exponential think time, sends the next
//! message with the whole history, as a chat client does. Every request goes
//! over one bounded pool of keep-alive connections per URL, taken by whichever
//! request is next (as the OpenAI SDK's pool does), so conversations are
//! multiplexed over connections; several URLs take turns per request (two
//! routers behind round robin). Everything random comes from `--seed`.
//!
//! Per request it records the time to the first streamed byte, the whole
//! time, the engine that served it (`x-engine`) and the usage's prompt and
//! cached tokens. Besides the realized hit ratio, it computes the ideal: the
//! uncached tokens one infinite cache shared by every engine would have
//! prefilled, with the engine's own tokenizer and block hashing
//! ([`crate::engine::prompt`]).
//!
//! | module | owns |
//! |---|---|
//! | [`chat`] | the conversations: system prompts, messages, arrivals, think times |
//! | `client` | the connection pools and one request: send, stream, measure |
//! | [`mix`] | who sends each conversation and at which priority: tenants and classes |
//! | `drive` | running it: a task per conversation, the scale-up, the deadline |
//! | `turn` | one request: its body and key, the ideal cache it is checked against, its record |
//! | [`trace`] | a production trace (Mooncake's format): its window, its conversations rebuilt, each block rendered as text |
//! | [`trace_cache`] | what one LRU cache of a share of a window's blocks would prefill: the reference when caches are small |
//! | `replay` | sending a trace's conversations at its clock, sped up |
//! | [`report`] | the records' summary: hit ratio, prefill ÷ ideal, TTFT, splits, shares, moves |

use crate::bounds::{OutOfRange, range};
use std::time::Duration;

pub mod chat;
mod client;
mod drive;
pub mod mix;
mod replay;
pub mod report;
#[cfg(test)]
mod tests;
pub mod trace;
pub mod trace_cache;
mod turn;

pub use report::{Record, Summary};

/// How a request names its conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyMode {
    /// `x-session-id: conv-N`.
    Header,
    /// `"prompt_cache_key": "conv-N"` in the JSON body.
    Body,
    /// `x-smg-routing-key: conv-N` (SGLang's model gateway, policy manual).
    Smg,
    /// No key: the router sees only the messages.
    None,
}

/// `magpie workload`'s options.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkloadArgs {
    /// Base URLs, comma-separated (http://host:port); requests take turns.
    #[arg(long, value_delimiter = ',', required_unless_present = "describe")]
    pub url: Vec<String>,
    /// Conversations.
    #[arg(long, default_value_t = 100)]
    pub conversations: usize,
    /// Turns per conversation.
    #[arg(long, default_value_t = 5)]
    pub turns: usize,
    /// Distinct system prompts the conversations share.
    #[arg(long, default_value_t = 4)]
    pub system_prompts: usize,
    /// Tokens per system prompt.
    #[arg(long, default_value_t = 1000)]
    pub system_tokens: usize,
    /// Tokens of tool definitions sent with each system prompt (0: none).
    #[arg(long, default_value_t = 0)]
    pub tool_tokens: usize,
    /// Tokens per user message.
    #[arg(long, default_value_t = 100)]
    pub user_tokens: usize,
    /// Tokens per answer (the requests' max_tokens).
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// New conversations per second (Poisson arrivals).
    #[arg(long, default_value_t = 5.0)]
    pub rate: f64,
    /// Mean think time between a conversation's turns (ms, exponential).
    #[arg(long, default_value_t = 1000.0)]
    pub think_ms: f64,
    /// Keep-alive connections per URL; a request waits for a free one.
    #[arg(long, default_value_t = 32)]
    pub connections: usize,
    /// How a request names its conversation.
    #[arg(long, value_enum, default_value_t = KeyMode::Header)]
    pub key: KeyMode,
    /// Ask for whole answers instead of streams.
    #[arg(long)]
    pub no_stream: bool,
    /// The model field of every request.
    #[arg(long, default_value = "magpie-sim")]
    pub model: String,
    /// Seed of everything random.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Tokens per KV block, as the engines have it (for the ideal cache).
    #[arg(long, default_value_t = 16)]
    pub block_tokens: usize,
    /// The whole run stops after this long, finished or not (seconds).
    #[arg(long, default_value_t = 300.0)]
    pub max_seconds: f64,
    /// One request's limit, connecting included.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Run --scale-up-cmd this many seconds into the run.
    #[arg(long, requires = "scale_up_cmd")]
    pub scale_up_at: Option<f64>,
    /// A shell command (sh -c) that adds a replica; the summary reports how
    /// many live conversations moved to another engine after it finished.
    #[arg(long, requires = "scale_up_at")]
    pub scale_up_cmd: Option<String>,
    /// Tenants and their shares of the conversations (name:weight,
    /// comma-separated); each request names its own in --tenant-header.
    #[arg(long, value_delimiter = ',', value_parser = mix::parse_share)]
    pub tenants: Vec<mix::Share>,
    #[arg(long, default_value = "x-tenant")]
    pub tenant_header: String,
    /// Send only this tenant's conversations, exactly as they are in the
    /// whole mix (a tenant's baseline without its neighbours).
    #[arg(long, requires = "tenants")]
    pub only_tenant: Option<String>,
    /// Priority classes and their shares of the conversations
    /// (name:weight); each request names its own in --class-header.
    #[arg(long, value_delimiter = ',', value_parser = mix::parse_share)]
    pub classes: Vec<mix::Share>,
    #[arg(long, default_value = "x-priority")]
    pub class_header: String,
    /// A request meets its service level when its first token comes within
    /// this many milliseconds: goodput is the share of requests that do.
    #[arg(long, default_value_t = 1000.0)]
    pub slo_ms: f64,
    /// Replay this trace (Mooncake's format: one JSON object per request,
    /// its timestamp in ms, input and output lengths, and ids of 512-token
    /// blocks) instead of synthetic conversations.
    #[arg(long, conflicts_with_all = SYNTHETIC)]
    pub trace: Option<std::path::PathBuf>,
    /// The window's start, seconds into the trace.
    #[arg(long, default_value_t = 0.0, requires = "trace")]
    pub trace_from: f64,
    /// The window's length, seconds of the trace.
    #[arg(long, default_value_t = 3600.0, requires = "trace")]
    pub trace_seconds: f64,
    /// Replay this many times faster than the trace's clock.
    #[arg(long, default_value_t = 1.0, requires = "trace")]
    pub speedup: f64,
    /// Spread the requests that share a timestamp evenly over the time to
    /// the trace's next one (a trace stamped by a coarse clock); without
    /// it they are sent at once.
    #[arg(long, requires = "trace")]
    pub trace_spread: bool,
    /// Divide the trace's lengths by this: a power of two from 1 to 512.
    #[arg(long, default_value_t = 1, requires = "trace")]
    pub token_scale: usize,
    /// Print the trace window's figures (JSON) and send nothing.
    #[arg(long, requires = "trace")]
    pub describe: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also write every request's record to this file, one JSON object per
    /// line (conversation, turn, engine, TTFT, tokens, error).
    #[arg(long)]
    pub records: Option<std::path::PathBuf>,
}

/// The options of synthetic conversations, which a trace replaces.
const SYNTHETIC: [&str; 9] = [
    "conversations",
    "turns",
    "system_prompts",
    "system_tokens",
    "tool_tokens",
    "user_tokens",
    "max_tokens",
    "rate",
    "think_ms",
];

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error(transparent)]
    OutOfRange(#[from] OutOfRange),
    #[error("--url {0:?}: expected http://host:port (https is not supported)")]
    Url(String),
    #[error("--only-tenant {0:?} is not one of --tenants")]
    UnknownTenant(String),
    #[error("--token-scale {0}: expected a power of two from 1 to 512")]
    TokenScale(usize),
    #[error("{0}")]
    Trace(String),
    #[error("cannot write the summary: {0}")]
    Output(#[from] std::io::Error),
}

impl WorkloadArgs {
    /// Checks the bounds, so a typo cannot start a run of a billion requests.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        let count = |option, value: usize, min: usize, max: usize| {
            range(option, value as f64, min as f64, max as f64)
        };
        count("--conversations", self.conversations, 1, 1_000_000)?;
        count("--turns", self.turns, 1, 1000)?;
        count("--system-prompts", self.system_prompts, 1, 10_000)?;
        count("--system-tokens", self.system_tokens, 0, 1_000_000)?;
        count("--tool-tokens", self.tool_tokens, 0, 1_000_000)?;
        count("--user-tokens", self.user_tokens, 1, 1_000_000)?;
        count("--max-tokens", self.max_tokens, 1, 1_000_000)?;
        count("--connections", self.connections, 1, 10_000)?;
        count("--block-tokens", self.block_tokens, 1, 1024)?;
        range("--rate", self.rate, 0.001, 100_000.0)?;
        range("--think-ms", self.think_ms, 0.0, 3_600_000.0)?;
        range("--max-seconds", self.max_seconds, 0.1, 86_400.0)?;
        range("--slo-ms", self.slo_ms, 1.0, 3_600_000.0)?;
        range("--trace-from", self.trace_from, 0.0, 31_536_000.0)?;
        range("--trace-seconds", self.trace_seconds, 0.001, 31_536_000.0)?;
        range("--speedup", self.speedup, 0.01, 10_000.0)?;
        replay::scale(self)?;
        if let Some(t) = &self.only_tenant
            && !self.tenants.iter().any(|s| &s.name == t)
        {
            return Err(WorkloadError::UnknownTenant(t.clone()));
        }
        if let Some(at) = self.scale_up_at {
            range("--scale-up-at", at, 0.0, self.max_seconds)?;
        }
        for url in &self.url {
            client::Target::parse(url)?;
        }
        Ok(())
    }
}

/// Runs the workload and returns the summary.
pub async fn run(args: &WorkloadArgs) -> Result<Summary, WorkloadError> {
    args.validate()?;
    let trace = replay::Replay::load(args)?;
    let outcome = drive::run(args, trace).await?;
    Ok(Summary::of(args, &outcome))
}

/// `magpie workload`: runs, then prints the summary (text or JSON) and
/// writes the records if asked.
pub async fn main(args: &WorkloadArgs) -> Result<(), WorkloadError> {
    args.validate()?;
    let trace = replay::Replay::load(args)?;
    if args.describe
        && let Some(trace) = &trace
    {
        let facts = serde_json::to_string_pretty(&trace.facts).map_err(std::io::Error::other)?;
        return print(&format!("{facts}\n"));
    }
    let outcome = drive::run(args, trace).await?;
    if let Some(path) = &args.records {
        report::write_records(path, &outcome.records)?;
    }
    let summary = Summary::of(args, &outcome);
    let text = if args.json {
        format!(
            "{}\n",
            serde_json::to_string_pretty(&summary).map_err(std::io::Error::other)?
        )
    } else {
        summary.to_string()
    };
    print(&text)
}

/// Writes `text` to stdout; a closed pipe is no error.
fn print(text: &str) -> Result<(), WorkloadError> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}
