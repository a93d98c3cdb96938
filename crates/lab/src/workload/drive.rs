//! Running the workload: one task per conversation (a synthetic one
//! sleeping until it arrives and between turns, or a trace's, [`super::replay`]),
//! each turn sent by [`super::turn`]; the scale-up command at its moment;
//! and the run's deadline, after which whatever is still running is cut.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

use super::chat::{self, Conversation};
use super::client::{Pool, Target};
use super::replay::{self, Replay};
use super::report::{Outcome, ScaleUp};
use super::turn::{Chat, Run, Who, one_turn};
use super::{WorkloadArgs, WorkloadError};

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
