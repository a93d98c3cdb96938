//! Replaying a trace ([`super::trace`]): its window read and its
//! conversations rebuilt before the run, then one task per conversation
//! that sends each turn at its time (sped up by `--speedup`), or when the
//! turn before it is answered if that is later, as a client that waits for
//! an answer before it sends the next message.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::sleep_until;

use super::trace::{self, FactsSetup, Scale, Thread, TraceError, TraceFacts, Window};
use super::turn::{Chat, Run, Who, one_turn};
use super::{WorkloadArgs, WorkloadError};

/// A trace's window, ready to send.
pub struct Replay {
    pub threads: Vec<Thread>,
    pub facts: TraceFacts,
}

impl Replay {
    /// Reads `--trace`'s window and rebuilds its conversations; none without `--trace`.
    pub fn load(args: &WorkloadArgs) -> Result<Option<Replay>, WorkloadError> {
        let Some(path) = &args.trace else {
            return Ok(None);
        };
        let setup = FactsSetup {
            path: path.clone(),
            window: Window {
                from: Duration::from_secs_f64(args.trace_from),
                length: Duration::from_secs_f64(args.trace_seconds),
            },
            speedup: args.speedup,
            scale: scale(args)?,
            engine_block_tokens: args.block_tokens,
        };
        let mut requests = trace::load(path, setup.window)?;
        if args.trace_spread {
            trace::spread(&mut requests);
        }
        let threads = trace::threads(requests);
        let facts = trace::facts(&threads, &setup);
        Ok(Some(Replay { threads, facts }))
    }
}

/// `--token-scale`, checked.
pub fn scale(args: &WorkloadArgs) -> Result<Scale, WorkloadError> {
    Scale::new(args.token_scale).ok_or(WorkloadError::TokenScale(args.token_scale))
}

impl From<TraceError> for WorkloadError {
    fn from(e: TraceError) -> Self {
        WorkloadError::Trace(e.to_string())
    }
}

/// One rebuilt conversation, turn by turn. A failed turn does not end it:
/// the trace's next turns came all the same.
pub(super) async fn thread(shared: Arc<Run>, thread: Thread, who: Who) {
    let args = &shared.args;
    let Ok(scale) = scale(args) else {
        return;
    };
    // The seed names the conversations, so each seed hashes them anew.
    let key = format!("conv-{}-{}", args.seed, thread.id);
    for (turn, request) in thread.turns.iter().enumerate() {
        sleep_until(shared.start + request.at.div_f64(args.speedup)).await;
        let history = trace::render(request, scale);
        let chat = Chat {
            conversation: thread.id,
            key: key.clone(),
            who: &who,
            turn,
            tools: None,
            history: &history,
            max_tokens: scale.tokens(request.output_tokens),
        };
        one_turn(&shared, chat).await;
    }
}
