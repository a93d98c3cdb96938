//! A production trace, replayed: Mooncake's format (one JSON object per
//! request: `timestamp` in ms, `input_length` and `output_length` in tokens,
//! `hash_ids`, one id per 512-token block of the prompt, chained, the last
//! block possibly partial).
//!
//! The text is not in the trace, so each block id is rendered as a fixed text
//! of its own ([`block_text`]): requests whose ids start alike share exactly
//! those blocks of prompt. The first block (one system prompt in Mooncake's
//! conversation trace) is the system message, the rest the user's. Lengths
//! are divided by `--token-scale` (a power of two, so a block stays whole
//! engine blocks) so that simulated engines keep up.
//!
//! Conversations are rebuilt ([`threads`]): a request whose ids extend an
//! earlier one's whole blocks (all of them, or all but a partial last one)
//! and share more than the first block is that conversation's next turn.

use std::collections::{HashMap, HashSet};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::trace_cache::{Blocks, OneCache, one_cache};
use crate::engine::prompt::answer_text;
use magpie_core::hash::{h64, h64_parts};

/// Tokens per block of the trace.
pub const TRACE_BLOCK_TOKENS: usize = 512;
/// At most this many requests are read from a trace.
pub const MAX_REQUESTS: usize = 10_000_000;
/// A request's input or output beyond this many tokens is an error.
const MAX_TOKENS: u64 = 100_000_000;

/// One request of the trace, as written.
#[derive(Debug, Clone, Deserialize)]
struct Line {
    timestamp: u64,
    input_length: u64,
    output_length: u64,
    hash_ids: Vec<u64>,
}

/// One request of the window.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceRequest {
    /// Since the window's start, at the trace's clock.
    pub at: Duration,
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub ids: Vec<u64>,
}

impl TraceRequest {
    /// The ids of its whole blocks: all of them, or all but a partial last one.
    fn whole_ids(&self) -> &[u64] {
        let whole = self.input_tokens / TRACE_BLOCK_TOKENS;
        &self.ids[..whole.min(self.ids.len())]
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read the trace {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {problem}")]
    Line {
        path: PathBuf,
        line: usize,
        column: usize,
        problem: String,
    },
    #[error("{path}: more than {MAX_REQUESTS} requests in the window")]
    TooMany { path: PathBuf },
}

/// The window of a trace to replay: `length` from `from`, both at the trace's clock.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub from: Duration,
    pub length: Duration,
}

/// The requests of `path` within `window`, in arrival order, their times
/// from the window's start.
pub fn load(path: &Path, window: Window) -> Result<Vec<TraceRequest>, TraceError> {
    let read = |source| TraceError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read)?;
    let (from, to) = (window.from, window.from.saturating_add(window.length));
    let mut out = Vec::new();
    for (n, text) in std::io::BufReader::new(file).lines().enumerate() {
        let text = text.map_err(read)?;
        if text.trim().is_empty() {
            continue;
        }
        let bad = |column, problem: String| TraceError::Line {
            path: path.to_path_buf(),
            line: n + 1,
            column,
            problem,
        };
        let line: Line = serde_json::from_str(&text).map_err(|e| bad(e.column(), e.to_string()))?;
        if line.hash_ids.is_empty() || line.input_length == 0 {
            return Err(bad(
                1,
                "a request needs hash_ids and an input_length above 0".into(),
            ));
        }
        if line.input_length > MAX_TOKENS || line.output_length > MAX_TOKENS {
            return Err(bad(1, format!("a length above {MAX_TOKENS} tokens")));
        }
        let at = Duration::from_millis(line.timestamp);
        if at < from || at >= to {
            continue;
        }
        if out.len() == MAX_REQUESTS {
            return Err(TraceError::TooMany {
                path: path.to_path_buf(),
            });
        }
        out.push(TraceRequest {
            at: at - from,
            input_tokens: line.input_length as usize,
            output_tokens: line.output_length as usize,
            ids: line.hash_ids,
        });
    }
    // Written in arrival order; sorted in case a file is not.
    out.sort_by_key(|r| r.at);
    Ok(out)
}

/// Spreads the requests (in arrival order) that share a timestamp evenly
/// over the time to the next timestamp, keeping their order: a trace
/// written by a coarse clock (Mooncake's conversation trace stamps its
/// requests every 3 s) says in which tick a request came, not that a tick's
/// requests came at once. The last tick spreads over the gap before it.
pub fn spread(requests: &mut [TraceRequest]) {
    let (mut start, mut gap) = (0, Duration::ZERO);
    while let Some(first) = requests.get(start) {
        let at = first.at;
        let end = start + requests[start..].iter().take_while(|r| r.at == at).count();
        gap = requests
            .get(end)
            .map_or(gap, |next| next.at.saturating_sub(at));
        let n = (end - start) as f64;
        for (i, request) in requests[start..end].iter_mut().enumerate() {
            request.at = at + gap.mul_f64(i as f64 / n);
        }
        start = end;
    }
}

/// One rebuilt conversation: its turns in order.
#[derive(Debug, Clone)]
pub struct Thread {
    pub id: usize,
    pub turns: Vec<TraceRequest>,
}

/// The conversations of `requests` (in arrival order): a request joins the
/// conversation of the latest earlier request whose whole blocks it starts
/// with, the longest such, if they are more than the first block;
/// otherwise it starts a conversation.
pub fn threads(requests: Vec<TraceRequest>) -> Vec<Thread> {
    let mut out: Vec<Thread> = Vec::new();
    // The chained hash of a request's whole ids -> its conversation.
    let mut by_prefix: HashMap<u64, usize> = HashMap::new();
    for request in requests {
        let prefixes = prefix_hashes(&request.ids);
        // Longest first; more than the first block.
        let joined = (2..=prefixes.len())
            .rev()
            .find_map(|len| by_prefix.get(&prefixes[len - 1]).copied());
        let thread = joined.unwrap_or_else(|| {
            out.push(Thread {
                id: out.len(),
                turns: Vec::new(),
            });
            out.len() - 1
        });
        let whole = request.whole_ids().len();
        if whole >= 2 {
            by_prefix.insert(prefixes[whole - 1], thread);
        }
        out[thread].turns.push(request);
    }
    out
}

/// The chained hashes of every prefix of `ids`: element i covers ids[..=i].
fn prefix_hashes(ids: &[u64]) -> Vec<u64> {
    let mut previous = 0u64;
    (ids.iter())
        .map(|id| {
            previous = h64_parts(&[&previous.to_be_bytes(), &id.to_be_bytes()]);
            previous
        })
        .collect()
}

/// How a request's tokens are rendered: lengths divided by `scale`.
#[derive(Debug, Clone, Copy)]
pub struct Scale(usize);

impl Scale {
    /// A power of two from 1 to 512 (so a 512-token block keeps at least one token).
    pub fn new(scale: usize) -> Option<Scale> {
        (scale.is_power_of_two() && scale <= TRACE_BLOCK_TOKENS).then_some(Scale(scale))
    }

    /// Tokens per rendered block.
    pub fn block_tokens(self) -> usize {
        TRACE_BLOCK_TOKENS / self.0
    }

    /// A length of the trace, rendered (at least one token).
    pub fn tokens(self, trace_tokens: usize) -> usize {
        trace_tokens.div_ceil(self.0).max(1)
    }
}

/// Block `id`'s text: `tokens` of the engine's words, seeded by the id alone,
/// so fewer tokens of the same block are a prefix of more.
pub fn block_text(id: u64, tokens: usize) -> String {
    answer_text(h64(format!("trace block {id}").as_bytes()), tokens)
}

/// A request's messages: its first block as the system prompt, its second
/// as the first user message, the rest as a second one, every block whole
/// but the last, which holds what is left of the request's scaled input. A
/// conversation's turns all start with its first two blocks, so its head (the
/// system prompt and the first user message, `key.from: conversation`) stays
/// the same from turn to turn.
pub fn render(request: &TraceRequest, scale: Scale) -> Vec<(&'static str, String)> {
    let block = scale.block_tokens();
    let total = scale.tokens(request.input_tokens);
    let n = request.ids.len();
    let mut texts = (request.ids.iter().enumerate()).map(|(i, &id)| {
        let tokens = if i + 1 < n {
            block
        } else {
            total.saturating_sub(block * (n - 1)).clamp(1, block)
        };
        block_text(id, tokens)
    });
    let mut messages = vec![("system", texts.next().unwrap_or_default())];
    messages.extend(texts.next().map(|first| ("user", first)));
    let rest: String = texts.collect();
    if !rest.is_empty() {
        messages.push(("user", rest));
    }
    messages
}

/// What a window of a trace holds, before any request is sent.
#[derive(Debug, Clone, Serialize)]
pub struct TraceFacts {
    pub path: PathBuf,
    pub from_s: f64,
    pub seconds: f64,
    pub speedup: f64,
    pub token_scale: usize,
    pub requests: usize,
    pub conversations: usize,
    /// Conversations with two or more turns.
    pub multi_turn_conversations: usize,
    /// The most turns of one conversation.
    pub max_turns: usize,
    pub distinct_blocks: usize,
    /// The window's distinct blocks in the engines' blocks (`--block-tokens`)
    /// once scaled: the cache that would hold all of it.
    pub engine_blocks: usize,
    /// The trace's own figure: the share of input tokens in blocks some
    /// earlier request had (an unbounded cache shared by all).
    pub ideal_hit_ratio: f64,
    /// The largest request, scaled (tokens).
    pub max_input_tokens: usize,
    /// One LRU cache of a share of the distinct blocks: what it prefills
    /// over the ideal ([`super::trace_cache`]).
    pub one_cache: Vec<OneCache>,
}

/// The facts of `threads` (one window of `path`).
pub fn facts(threads: &[Thread], setup: &FactsSetup) -> TraceFacts {
    let mut all: Vec<&TraceRequest> = threads.iter().flat_map(|t| &t.turns).collect();
    all.sort_by_key(|r| r.at);
    let mut seen = HashSet::new();
    let (mut hit, mut total) = (0usize, 0usize);
    for r in &all {
        let matched = r.ids.iter().take_while(|id| seen.contains(*id)).count();
        hit += (matched * TRACE_BLOCK_TOKENS).min(r.input_tokens);
        total += r.input_tokens;
        seen.extend(r.ids.iter().copied());
    }
    let block = setup.scale.block_tokens();
    let blocks: Vec<Blocks> = (all.iter())
        .map(|r| Blocks {
            input_tokens: r.input_tokens,
            ids: &r.ids,
        })
        .collect();
    TraceFacts {
        path: setup.path.clone(),
        from_s: setup.window.from.as_secs_f64(),
        seconds: setup.window.length.as_secs_f64(),
        speedup: setup.speedup,
        token_scale: setup.scale.0,
        requests: all.len(),
        conversations: threads.len(),
        multi_turn_conversations: threads.iter().filter(|t| t.turns.len() > 1).count(),
        max_turns: threads.iter().map(|t| t.turns.len()).max().unwrap_or(0),
        distinct_blocks: seen.len(),
        engine_blocks: (seen.len() * block).div_ceil(setup.engine_block_tokens.max(1)),
        ideal_hit_ratio: if total == 0 {
            0.0
        } else {
            hit as f64 / total as f64
        },
        max_input_tokens: (all.iter())
            .map(|r| setup.scale.tokens(r.input_tokens))
            .max()
            .unwrap_or(0),
        one_cache: one_cache(&blocks, TRACE_BLOCK_TOKENS, seen.len(), total - hit),
    }
}

/// How a window is read and rendered, for its facts.
#[derive(Debug, Clone)]
pub struct FactsSetup {
    pub path: PathBuf,
    pub window: Window,
    pub speedup: f64,
    pub scale: Scale,
    pub engine_block_tokens: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::prompt::token_count;

    #[test]
    fn requests_of_one_tick_spread_evenly_to_the_next() {
        let mut requests: Vec<_> = [0, 0, 0, 3000, 3000, 3001]
            .iter()
            .map(|&ms| request(ms, 600, &[ms]))
            .collect();
        spread(&mut requests);
        let at: Vec<u128> = requests.iter().map(|r| r.at.as_millis()).collect();
        assert_eq!(at, [0, 1000, 2000, 3000, 3000, 3001]);
        // Equal ticks: the last spreads over the gap before it.
        let mut requests: Vec<_> = [0, 0, 3000, 3000]
            .iter()
            .map(|&ms| request(ms, 600, &[ms]))
            .collect();
        spread(&mut requests);
        let at: Vec<u128> = requests.iter().map(|r| r.at.as_millis()).collect();
        assert_eq!(at, [0, 1500, 3000, 4500]);
        assert_eq!(requests[1].ids, [0], "order kept");
    }

    fn request(at_ms: u64, input: usize, ids: &[u64]) -> TraceRequest {
        TraceRequest {
            at: Duration::from_millis(at_ms),
            input_tokens: input,
            output_tokens: 10,
            ids: ids.to_vec(),
        }
    }

    #[test]
    fn next_turns_extend_whole_blocks_and_more_than_the_system_block() {
        let requests = vec![
            request(0, 1200, &[0, 1, 2]),          // blocks 0 and 1 whole, 2 partial
            request(1, 700, &[0, 3]),              // shares only the system block: new
            request(2, 2000, &[0, 1, 4, 5]),       // extends the first's whole blocks
            request(3, 1024, &[0, 3]),             // 3 is whole now, but [0] alone is too short
            request(4, 2600, &[0, 1, 4, 5, 6, 7]), // extends the third, the longest
            request(5, 600, &[9, 10]),             // another system prompt: new
        ];
        let t = threads(requests);
        let turns: Vec<Vec<u64>> = (t.iter())
            .map(|t| t.turns.iter().map(|r| r.at.as_millis() as u64).collect())
            .collect();
        assert_eq!(turns, [vec![0, 2, 4], vec![1], vec![3], vec![5]]);
    }

    #[test]
    fn shared_ids_render_as_shared_text_and_lengths_scale() {
        let scale = Scale::new(16).unwrap();
        assert_eq!(scale.block_tokens(), 32);
        let a = request(0, 1100, &[0, 1, 2]);
        let b = request(0, 1500, &[0, 1, 7]);
        let (ma, mb) = (render(&a, scale), render(&b, scale));
        assert_eq!((ma.len(), mb.len()), (3, 3));
        // The system block and the first user block are shared whole.
        assert_eq!(ma[..2], mb[..2]);
        assert_eq!(token_count(&ma[0].1), 32);
        // 1100 / 16 = 69 tokens: 32 + 32 + 5.
        assert_eq!(token_count(&ma[2].1), 5);
        assert_ne!(ma[2].1, mb[2].1[..20]);
        assert_eq!(render(&request(0, 16, &[4]), scale).len(), 1);
        assert!(Scale::new(3).is_none() && Scale::new(1024).is_none());
    }

    #[test]
    fn the_window_and_bad_lines() {
        let dir = std::env::temp_dir().join(format!("magpie-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.jsonl");
        let line = |ms, ids: &str| {
            format!(
                r#"{{"timestamp": {ms}, "input_length": 600, "output_length": 5, "hash_ids": {ids}}}"#
            )
        };
        let text = [
            line(0, "[0, 1]"),
            line(1500, "[0, 2]"),
            line(3000, "[0, 3]"),
        ]
        .join("\n");
        std::fs::write(&path, text).unwrap();
        let window = Window {
            from: Duration::from_secs(1),
            length: Duration::from_secs(2),
        };
        let got = load(&path, window).unwrap();
        assert_eq!(
            got,
            [request(500, 600, &[0, 2])].map(|mut r| {
                r.output_tokens = 5;
                r
            })
        );
        std::fs::write(
            &path,
            format!(
                "{}\n{{\"timestamp\": 1, \"input_length\": \"x\"}}",
                line(0, "[0]")
            ),
        )
        .unwrap();
        let e = load(&path, window).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}:2:", path.display())), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_ideal_counts_blocks_seen_before() {
        let t = threads(vec![
            request(0, 1024, &[0, 1]),
            request(1, 1536, &[0, 1, 2]),
            request(2, 1000, &[0, 5]),
        ]);
        let setup = FactsSetup {
            path: PathBuf::from("t"),
            window: Window {
                from: Duration::ZERO,
                length: Duration::from_secs(1),
            },
            speedup: 1.0,
            scale: Scale::new(16).unwrap(),
            engine_block_tokens: 16,
        };
        let f = facts(&t, &setup);
        // Hits: 0, then 1024 of 1536, then 512 of 1000.
        assert!((f.ideal_hit_ratio - 1536.0 / 3560.0).abs() < 1e-9, "{f:?}");
        assert_eq!(
            (f.requests, f.conversations, f.multi_turn_conversations),
            (3, 2, 1)
        );
        assert_eq!((f.distinct_blocks, f.engine_blocks), (4, 8));
    }
}
