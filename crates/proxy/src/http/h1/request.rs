//! One request through the pass-through, in phases: its head (within the
//! head deadline, at most `limits.max_head_bytes`), its keys (from the head,
//! or read from the body), its routing decision's plan
//! ([`crate::routing::decision`], as on hyper's path), the journey to the first backend that takes it
//! ([`crate::http::journey`] over [`super::send::RawWire`]), and the answer
//! relayed back ([`super::relay`]) or magpie's own.

use std::pin::Pin;
use std::sync::Arc;

use tokio::time::{Instant, Sleep};
use tracing::debug;

use super::body_key::{self, BodyFailed};
use super::framing::{BodyEnd, Framing};
use super::head::{self, Head, Parse};
use super::io::{ClientBuf, ClientIo, JOIN_BELOW, write_all};
use super::relay::{self, Relayed};
use super::send::{Outbound, READ_CHUNK, RawWire, Received};
use super::{Client, Next};
use crate::config::Config;
use crate::http::journey::{Answered, Failure, Forwarded, Journey, LocalAnswer};
use crate::http::request_key::{HeadKeys, KeyPlan, RequestKey};
use crate::http::request_log::RequestLog;
use crate::http::{disaggregation, engine_priority};
use crate::routing::decision;
use crate::routing::llm::disaggregation::{Decision, PrefillPlan};
use crate::telemetry::key_budget::Held;
use crate::telemetry::stats::ClientFailure;

/// The answer to a head that did not arrive in time.
const TIMEOUT_408: &[u8] = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\ncontent-length: 40\r\nconnection: close\r\n\r\nthe request head did not arrive in time\n";
/// The answer to a head larger than `limits.max_head_bytes`.
const TOO_LARGE_431: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\ncontent-length: 44\r\nconnection: close\r\n\r\nthe request head exceeds limits.max_head_bytes\n";

/// Serves the request whose bytes start `buf` (or are about to arrive).
pub(crate) async fn serve<S: ClientIo>(
    io: &mut S,
    buf: &mut ClientBuf,
    c: &Client<'_>,
    timer: Pin<&mut Sleep>,
) -> Next {
    let snapshot = c.instance.snapshot.load_full();
    let config = Arc::clone(&snapshot.config);
    let cx = head::Context {
        plan: KeyPlan::of(&config, c.arrival.client, &c.instance.stats.key_budget),
        queue: config.queue.as_ref(),
        arrival: c.arrival,
        instance: c.instance,
    };
    let mut head = match read_head(io, buf, &cx, &config, c).await {
        Ok(head) => head,
        Err(next) => return next,
    };
    buf.consume(head.len);
    let mut end = BodyEnd::new(head.framing);
    let keyed = match body_keys(io, buf, &mut end, &head, &cx.plan).await {
        Ok(keyed) => keyed,
        Err(why) => return refuse_body(io, why, &mut head.log, c).await,
    };
    let keyed_bytes = keyed.walked as u64;
    let prompt_bytes = match head.framing {
        Framing::Length(n) => n,
        _ => keyed_bytes,
    };
    let asked = (keyed.found).request(head.standing, prompt_bytes, &c.instance.stats);
    if let Some(log) = head.log.as_mut() {
        log.keyed(asked.keys.session);
    }
    let plan = decision::plan(c.instance, &snapshot, asked).await;
    let split = (config.disaggregation).map(|_| plan.prefill_route(c.instance, &snapshot));
    drop(snapshot);
    let mut walked = outgoing_body(c, &config, split, &mut head, buf, keyed.walked).await;
    if walked <= JOIN_BELOW {
        head.upstream.extend_from_slice(&buf.unconsumed()[..walked]);
        buf.consume(walked);
        walked = 0;
    }
    let out = Outbound {
        client: io,
        buf,
        walked,
        end,
        head: &head.upstream,
        held: keyed.held,
        timer,
    };
    let mut wire = RawWire {
        out,
        pool: c.pool,
        head_method: head.head_method,
        socket: c.socket,
    };
    let mut journey = Journey {
        plan,
        claim: c.conn.claim(config.http.reuse),
        with_body: head.with_body,
        held: keyed_bytes,
        config: &config,
        instance: c.instance,
        log: &mut head.log,
    };
    let close = head.close;
    match journey.forward(&mut wire).await {
        Forwarded::Answered(answered) => respond(*answered, &mut wire.out, close, c).await,
        Forwarded::Failed(failure) => failed(&failure, &mut wire.out, close, &mut head.log).await,
        Forwarded::ClientGone => Next::Close,
    }
}

/// The body, whole in `read`, with the engine's priority written in
/// ([`crate::http::engine_priority`]), when the config writes it and the
/// body is one JSON object.
fn engine_body(config: &Config, head: &Head<'_>, read: &[u8]) -> Option<Vec<u8>> {
    let value = config
        .queue
        .as_ref()?
        .priority
        .engine_value(head.standing.class)?;
    let whole = head.framing == Framing::Length(read.len() as u64) && !read.is_empty();
    whole.then(|| engine_priority::with_priority(read, value))?
}

/// Writes the body the backend gets after `head` when it differs from the
/// client's (the engine's priority, a disaggregated request's decode half);
/// of the `walked` body bytes at the start of `buf`, those left to pass on.
async fn outgoing_body(
    c: &Client<'_>,
    config: &Arc<Config>,
    split: Option<Result<PrefillPlan, Decision>>,
    head: &mut Head<'_>,
    buf: &mut ClientBuf,
    walked: usize,
) -> usize {
    let mut body = engine_body(config, head, &buf.unconsumed()[..walked]);
    if let Some(route) = split {
        let read = &buf.unconsumed()[..walked];
        body = halves(c, config, route, head, body, read).await;
    }
    let Some(body) = body else {
        return walked;
    };
    head.replace_body(&body);
    buf.consume(walked);
    0
}

/// The body the decode half goes on with (`None`: as it came), once its
/// prefill half went by `route` ([`crate::http::disaggregation`]): `read`
/// is what was read of the body, `body` what it would go on as without
/// the split.
async fn halves(
    c: &Client<'_>,
    config: &Arc<Config>,
    route: Result<PrefillPlan, Decision>,
    head: &mut Head<'_>,
    body: Option<Vec<u8>>,
    read: &[u8],
) -> Option<Vec<u8>> {
    let whole = head.framing == Framing::Length(read.len() as u64) && !read.is_empty();
    let leg = disaggregation::Leg::of_head(&head.upstream);
    let original = match (&body, whole && leg.is_some()) {
        (_, false) => None,
        (Some(body), true) => Some(body.as_slice()),
        (None, true) => Some(read),
    };
    let leg = leg.unwrap_or_else(|| disaggregation::Leg::new("/", []));
    let halves = disaggregation::prefill(c.instance, config, route, &leg, original).await;
    if let Some(log) = head.log.as_mut() {
        log.split(halves.decision.as_str(), halves.prefill.as_deref());
    }
    halves.body.or(body)
}

/// Reads until `buf` starts with a whole head: the head, or what the
/// connection does next (a `408` or `431` was sent, or hyper takes over).
async fn read_head<'a, S: ClientIo>(
    io: &mut S,
    buf: &mut ClientBuf,
    cx: &head::Context<'a, '_>,
    config: &Config,
    c: &Client<'_>,
) -> Result<Box<Head<'a>>, Next> {
    let limit = config.limits.max_head_bytes;
    // The connection waited for the head's first bytes, which are in.
    let deadline = Instant::now() + c.deadlines.head;
    loop {
        match head::parse(buf.unconsumed(), cx) {
            Parse::Ready(head) => return Ok(head),
            Parse::Handover(why) => {
                debug!(client = %c.arrival.client, ?why, "request handed over to hyper");
                return Err(Next::Handover);
            }
            Parse::Partial => {}
        }
        let have = buf.unconsumed().len();
        if have >= limit {
            c.instance
                .stats
                .count_client_failure(ClientFailure::BadRequest);
            return Err(answer_raw(io, TOO_LARGE_431).await);
        }
        let want = READ_CHUNK.min(limit - have);
        match tokio::time::timeout_at(deadline, buf.read(io, want)).await {
            Ok(Ok(0) | Err(_)) => return Err(Next::Close),
            Ok(Ok(_)) => {}
            Err(_) => {
                c.instance
                    .stats
                    .count_client_failure(ClientFailure::HeadTimeout);
                return Err(answer_raw(io, TIMEOUT_408).await);
            }
        }
    }
}

/// Writes one of magpie's fixed answers; the connection closes gently after.
async fn answer_raw<S: ClientIo>(io: &mut S, answer: &[u8]) -> Next {
    if let Err(e) = write_all(io, &[answer]).await {
        debug!(error = %e.error, "cannot send magpie's answer");
    }
    Next::Linger
}

/// A request's keys, the body bytes read for them, and their share of the
/// key budget.
struct Keyed {
    found: RequestKey,
    walked: usize,
    held: Option<Held>,
}

/// The keys of the request `head` names: from the head alone, or from the
/// body it starts in `buf`.
async fn body_keys<S: ClientIo>(
    io: &mut S,
    buf: &mut ClientBuf,
    end: &mut BodyEnd,
    head: &Head<'_>,
    plan: &KeyPlan<'_>,
) -> Result<Keyed, BodyFailed> {
    let wants = match &head.keys {
        HeadKeys::Known(found) => {
            // The body bytes that came with the head go first.
            let walked = end
                .walk(buf.unconsumed(), &mut |_| {})
                .map_err(BodyFailed::Framing)?;
            return Ok(Keyed {
                found: *found,
                walked,
                held: None,
            });
        }
        HeadKeys::ReadBody(wants) => wants,
    };
    let share = plan.budget.share(plan.budget_max);
    let read = body_key::read(io, buf, end, wants, share).await?;
    Ok(Keyed {
        found: wants.keys(&read.outcome),
        walked: read.walked,
        held: Some(read.held),
    })
}

/// The body could not be read for its key: `400`, counted, and the
/// connection closes.
async fn refuse_body<S: ClientIo>(
    io: &mut S,
    why: BodyFailed,
    log: &mut Option<RequestLog>,
    c: &Client<'_>,
) -> Next {
    debug!(client = %c.arrival.client, %why, "request body failed while reading its key");
    c.instance
        .stats
        .count_client_failure(ClientFailure::BadRequest);
    local(io, &LocalAnswer::body_unreadable(), log).await
}

/// Writes magpie's own short answer (and its log line); what the
/// connection does next.
async fn local<S: ClientIo>(
    io: &mut S,
    answer: &LocalAnswer,
    log: &mut Option<RequestLog>,
) -> Next {
    let bytes = encode(answer);
    if let Some(log) = log.take() {
        log.answered_locally(answer.status.as_u16(), answer.text.len() as u64);
    }
    if let Err(e) = write_all(io, &[&bytes]).await {
        debug!(error = %e.error, "cannot send magpie's answer");
        return Next::Close;
    }
    if answer.close {
        Next::Linger
    } else {
        Next::KeepAlive
    }
}

/// An answer of magpie's own as HTTP/1.1 bytes.
fn encode(answer: &LocalAnswer) -> Vec<u8> {
    let reason = answer.status.canonical_reason().unwrap_or("");
    let close = if answer.close {
        "connection: close\r\n"
    } else {
        ""
    };
    let retry = match answer.retry_after {
        Some(seconds) => format!("retry-after: {seconds}\r\n"),
        None => String::new(),
    };
    let mut out = format!(
        "HTTP/1.1 {} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\n{retry}{close}\r\n",
        answer.status.as_u16(),
        answer.text.len()
    )
    .into_bytes();
    out.extend_from_slice(answer.text.as_bytes());
    out
}

/// Relays a backend's answer; what the connection does next.
async fn respond<S: ClientIo>(
    answered: Answered<RawWire<'_, '_, S>>,
    out: &mut Outbound<'_, S>,
    close_asked: bool,
    c: &Client<'_>,
) -> Next {
    let Answered {
        head: Received { head, rbuf },
        in_flight,
        progress,
        ..
    } = answered;
    // An answer that ends before its request's body closes the
    // connection too, unannounced, as it cannot be known yet.
    let close = close_asked || head.framing == Framing::Close || c.shutdown.is_cancelled();
    let response = relay::Response {
        client_head: head.client,
        body_start: head.len,
        rbuf,
        framing: head.framing,
        usage: head.usage,
        close,
        backend_closes: head.close,
    };
    match relay::relay(response, in_flight, out, progress).await {
        Relayed::Complete if close => Next::Close,
        Relayed::Complete => Next::KeepAlive,
        Relayed::Early | Relayed::ClientGone => Next::Close,
        Relayed::Cut => Next::Reset,
    }
}

/// No backend answered: magpie's own answer (the journey counted it).
async fn failed<S: ClientIo>(
    failure: &Failure,
    out: &mut Outbound<'_, S>,
    close_asked: bool,
    log: &mut Option<RequestLog>,
) -> Next {
    let mut answer = failure.answer();
    // A body not read to its end cannot be followed by a request.
    answer.close |= !(out.end.is_done() && out.walked == 0) || close_asked;
    local(out.client, &answer, log).await
}
