//! Running the workload: one task per conversation, sleeping until it
//! arrives and between turns; the ideal cache every request is checked
//! against when it is sent; the scale-up command at its moment; and the
//! run's deadline, after which whatever is still running is cut.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

use super::chat::{self, Conversation};
use super::client::{Pool, Target};
use super::mix;
use super::report::{Outcome, Record, ScaleUp};
use super::replay::{self, Replay};
use super::{KeyMode, WorkloadArgs, WorkloadError};
use crate::engine::prompt::{block_hashes, render_chat, token_count};

/// What every conversation of one workload run shares.
pub(super) struct Run {
    pub(super) args: WorkloadArgs,
    pools: Vec<Pool>,
    next_url: AtomicUsize,
    systems: Vec<String>,
    /// Each system prompt's tool definitions, if any, as sent.
    tools: Vec<Option<Value>>,
    /// Every block some request already had: one infinite cache shared by all.
    ideal: Mutex<HashSet<u64>>,
    records: Mutex<Vec<Record>>,
    pub(super) start: Instant,
}

pub async fn run(args: &WorkloadArgs, trace: Option<Replay>) -> Result<Outcome, WorkloadError> {
    let mut pools = Vec::new();
    for url in &args.url {
        pools.push(Pool::new(Target::parse(url)?, args.connections));
    }
    let systems = (0..args.system_prompts)
        .map(|i| chat::system_prompt(args.seed, i, args.system_tokens))
        .collect();
    let tools = (0..args.system_prompts)
        .map(|i| chat::tools(args.seed, i, args.tool_tokens))
        .collect();
    let start = Instant::now();
    let shared = Arc::new(Run {
        args: args.clone(),
        pools,
        next_url: AtomicUsize::new(0),
        systems,
        tools,
        ideal: Mutex::new(HashSet::new()),
        records: Mutex::new(Vec::new()),
        start,
    });
    let mut tasks = JoinSet::new();
    let facts = trace.as_ref().map(|t| t.facts.clone());
    spawn_conversations(&shared, trace, &mut tasks);
    let scale_up = match (args.scale_up_at, &args.scale_up_cmd) {
        (Some(at), Some(cmd)) => Some(tokio::spawn(scale_up(start, at, cmd.clone()))),
        _ => None,
    };
    let deadline = start + Duration::from_secs_f64(args.max_seconds);
    let mut cut = 0;
    loop {
        tokio::select! {
            joined = tasks.join_next() => match joined {
                Some(Err(e)) if e.is_panic() => tracing::error!("a conversation panicked: {e}"),
                Some(_) => {}
                None => break,
            },
            () = sleep_until(deadline) => {
                cut = tasks.len();
                tasks.abort_all();
                break;
            }
        }
    }
    let scale_up = match scale_up {
        Some(task) => task.await.ok(),
        None => None,
    };
    let records = shared
        .records
        .lock()
        .map(|mut r| std::mem::take(&mut *r))
        .unwrap_or_default();
    Ok(Outcome {
        records,
        scale_up,
        cut,
        elapsed: start.elapsed(),
        trace: facts,
    })
}

/// A task per conversation: the trace's, or the synthetic ones; only
/// `--only-tenant`'s when given.
fn spawn_conversations(shared: &Arc<Run>, trace: Option<Replay>, tasks: &mut JoinSet<()>) {
    let args = &shared.args;
    let only = args.only_tenant.as_deref();
    let skip = |who: &Who| only.is_some_and(|t| who.tenant.as_ref().is_none_or(|mine| mine != t));
    if let Some(trace) = trace {
        for thread in trace.threads {
            let who = Who::of(args, thread.id);
            if !skip(&who) {
                tasks.spawn(replay::thread(Arc::clone(shared), thread, who));
            }
        }
        return;
    }
    let all = chat::conversations(
        args.seed,
        args.conversations,
        args.turns,
        args.system_prompts,
        args.rate,
        args.think_ms,
    );
    for conversation in all {
        let who = Who::of(args, conversation.id);
        if !skip(&who) {
            tasks.spawn(converse(Arc::clone(shared), conversation, who));
        }
    }
}

/// Runs the scale-up command at its moment; returns when it finished and how.
async fn scale_up(start: Instant, at: f64, cmd: String) -> ScaleUp {
    sleep_until(start + Duration::from_secs_f64(at)).await;
    let run = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(&cmd)
        .kill_on_drop(true)
        .status();
    let status = match tokio::time::timeout(Duration::from_secs(120), run).await {
        Ok(Ok(s)) if s.success() => "ok".to_string(),
        Ok(Ok(s)) => format!("failed: {s}"),
        Ok(Err(e)) => format!("cannot run: {e}"),
        Err(_) => "timed out after 120 s".to_string(),
    };
    ScaleUp {
        at,
        finished_at: start.elapsed().as_secs_f64(),
        status,
        live_conversations: 0,
        moved: 0,
    }
}

/// Who sends a conversation, and at which priority ([`mix`]).
#[derive(Debug, Clone, Default)]
pub(super) struct Who {
    tenant: Option<String>,
    class: Option<String>,
}

impl Who {
    fn of(args: &WorkloadArgs, id: usize) -> Who {
        let name = |shares: &[mix::Share], what| {
            mix::draw(shares, args.seed, id, what).map(|i| shares[i].name.clone())
        };
        Who {
            tenant: name(&args.tenants, "tenant"),
            class: name(&args.classes, "class"),
        }
    }
}

/// One conversation, turn by turn, until its last turn or its first failure.
async fn converse(shared: Arc<Run>, conversation: Conversation, who: Who) {
    let args = &shared.args;
    sleep_until(shared.start + conversation.arrival).await;
    let mut history: Vec<(&'static str, String)> =
        vec![("system", shared.systems[conversation.system].clone())];
    for turn in 0..args.turns {
        if turn > 0 {
            tokio::time::sleep(conversation.thinks[turn - 1]).await;
        }
        let user = chat::user_message(args.seed, conversation.id, turn, args.user_tokens);
        history.push(("user", user));
        let chat = Chat {
            conversation: conversation.id,
            key: format!("conv-{}", conversation.id),
            who: &who,
            turn,
            tools: shared.tools[conversation.system].as_ref(),
            history: &history,
            max_tokens: args.max_tokens,
        };
        let Some(content) = one_turn(&shared, chat).await else {
            return;
        };
        history.push(("assistant", content));
    }
}

/// One turn of a conversation: what it sends.
pub(super) struct Chat<'a> {
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
pub(super) async fn one_turn(shared: &Run, chat: Chat<'_>) -> Option<String> {
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
