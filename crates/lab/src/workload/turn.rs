//! One request of a conversation, synthetic or replayed: its headers and
//! body (the key where `--key` puts it), the ideal cache it is checked
//! against when it is sent, and its record once answered or failed; and
//! what every conversation of a run shares to send it.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::client::Pool;
use super::mix;
use super::report::Record;
use super::{KeyMode, WorkloadArgs};
use crate::engine::prompt::{block_hashes, render_chat, token_count};

/// What every conversation of one workload run shares.
pub struct Run {
    pub args: WorkloadArgs,
    pub pools: Vec<Pool>,
    pub next_url: AtomicUsize,
    /// The synthetic conversations' system prompts.
    pub systems: Vec<String>,
    /// Each system prompt's tool definitions, if any, as sent.
    pub tools: Vec<Option<Value>>,
    /// Every block some request already had: one infinite cache shared by all.
    pub ideal: Mutex<HashSet<u64>>,
    pub records: Mutex<Vec<Record>>,
    pub start: Instant,
}

/// Who sends a conversation, and at which priority ([`mix`]).
#[derive(Debug, Clone, Default)]
pub struct Who {
    pub tenant: Option<String>,
    pub class: Option<String>,
}

impl Who {
    pub fn of(args: &WorkloadArgs, id: usize) -> Who {
        let name = |shares: &[mix::Share], what| {
            mix::draw(shares, args.seed, id, what).map(|i| shares[i].name.clone())
        };
        Who {
            tenant: name(&args.tenants, "tenant"),
            class: name(&args.classes, "class"),
        }
    }
}

/// One turn of a conversation: what it sends.
pub struct Chat<'a> {
    pub conversation: usize,
    /// The conversation's name where `--key` puts it.
    pub key: String,
    pub who: &'a Who,
    pub turn: usize,
    pub tools: Option<&'a Value>,
    pub history: &'a [(&'static str, String)],
    /// The answer's length.
    pub max_tokens: usize,
}

/// Sends one turn, records it, and returns the answer's text (none on failure).
pub async fn one_turn(shared: &Run, chat: Chat<'_>) -> Option<String> {
    let Chat {
        conversation,
        who,
        turn,
        history,
        ..
    } = chat;
    let args = &shared.args;
    // The engine renders the tools as their JSON text, as parsed.
    let tools = chat.tools.map(Value::to_string);
    let prompt = render_chat(
        history.iter().map(|(r, c)| (*r, c.as_str())),
        tools.as_deref(),
    );
    let ideal_uncached = ideal_check(shared, &prompt);
    let (headers, body) = request(args, &chat);
    let url = shared.next_url.fetch_add(1, Ordering::Relaxed) % shared.pools.len();
    let sent = shared.start.elapsed();
    let result = tokio::time::timeout(
        args.timeout,
        shared.pools[url].post("/v1/chat/completions", &headers, body, !args.no_stream),
    )
    .await
    .unwrap_or_else(|_| Err("timeout".into()));
    let mut record = Record {
        conversation,
        turn,
        url,
        sent_s: sent.as_secs_f64(),
        ttft_ms: 0.0,
        total_ms: 0.0,
        engine: None,
        prompt_tokens: token_count(&prompt) as u64,
        cached_tokens: 0,
        ideal_uncached,
        error: None,
        tenant: who.tenant.clone(),
        class: who.class.clone(),
    };
    let content = match result {
        Ok(answer) => {
            record.ttft_ms = answer.ttft.as_secs_f64() * 1000.0;
            record.total_ms = answer.total.as_secs_f64() * 1000.0;
            record.engine = answer.engine;
            record.prompt_tokens = answer.prompt_tokens.unwrap_or(record.prompt_tokens);
            record.cached_tokens = answer.cached_tokens;
            // The next turn's prompt holds this answer: so does the ideal cache.
            let full = format!("{prompt}{}", answer.content);
            if let Ok(mut ideal) = shared.ideal.lock() {
                ideal.extend(block_hashes(&full, args.block_tokens));
            }
            Some(answer.content)
        }
        Err(failure) => {
            record.error = Some(failure);
            None
        }
    };
    if let Ok(mut records) = shared.records.lock() {
        records.push(record);
    }
    content
}

/// The tokens an infinite cache shared by every engine would prefill for
/// `prompt`, as an engine counts them (whole blocks from the start, at least
/// one token computed); the prompt's blocks are then in that cache.
fn ideal_check(shared: &Run, prompt: &str) -> u64 {
    let block = shared.args.block_tokens;
    let hashes = block_hashes(prompt, block);
    let tokens = token_count(prompt);
    let Ok(mut ideal) = shared.ideal.lock() else {
        return tokens as u64;
    };
    let mut matched = hashes.iter().take_while(|h| ideal.contains(h)).count();
    if matched * block >= tokens {
        matched = matched.saturating_sub(1);
    }
    ideal.extend(hashes);
    (tokens - matched * block) as u64
}

/// One turn's headers and body, with the conversation's key where `--key` puts it.
fn request<'a>(args: &'a WorkloadArgs, chat: &Chat<'_>) -> (Vec<(&'a str, String)>, Bytes) {
    let key = chat.key.clone();
    let messages: Vec<Value> = chat
        .history
        .iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    let mut body = json!({
        "model": args.model,
        "messages": messages,
        "max_tokens": chat.max_tokens,
        "stream": !args.no_stream,
    });
    if !args.no_stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    if let Some(tools) = chat.tools {
        body["tools"] = tools.clone();
    }
    let mut headers = Vec::new();
    if let Some(tenant) = &chat.who.tenant {
        headers.push((args.tenant_header.as_str(), tenant.clone()));
    }
    if let Some(class) = &chat.who.class {
        headers.push((args.class_header.as_str(), class.clone()));
    }
    match args.key {
        KeyMode::Header => headers.push(("x-session-id", key)),
        KeyMode::Smg => headers.push(("x-smg-routing-key", key)),
        KeyMode::Body => body["prompt_cache_key"] = json!(key),
        KeyMode::None => {}
    }
    (headers, Bytes::from(body.to_string()))
}
