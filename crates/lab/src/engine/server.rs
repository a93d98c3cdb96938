//! The simulated engine's HTTP/1.1 server (hyper, keep-alive): the routes,
//! reading and checking a completion request, and handing it to the GPU.
//!
//! Nothing a client sends is trusted: the body is read up to
//! `max_body_bytes` (413 beyond), JSON that does not parse or lacks what a
//! completion needs is a 400 with an OpenAI-style error body, and a full
//! queue is a 503.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::CONTENT_LENGTH;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::gpu::{Event, Job, Msg};
use super::prompt;
use super::reply::{self, ApiError, Kind, Reply, Shape, Usage};
use super::state::State;
use super::transfer::{self, Half};
use super::{ENGINE_HEADER, EngineConfig};

/// A client that never finishes its request head does not hold a task forever.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Accepts connections until `stop` fires; each is served in its own task.
pub async fn accept_loop(listener: TcpListener, state: Arc<State>, stop: CancellationToken) {
    loop {
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: wait a moment
                    // rather than spin on an error that repeats at once.
                    debug!(error = %e, "engine accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        if let Err(e) = stream.set_nodelay(true) {
            debug!(%peer, error = %e, "engine: cannot set TCP_NODELAY");
        }
        let state = Arc::clone(&state);
        let stop = stop.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let state = Arc::clone(&state);
                async move { Ok::<_, Infallible>(answer(req, &state).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                result = conn => if let Err(e) = result {
                    debug!(%peer, error = %e, "engine connection ended with an error");
                },
                () = stop.cancelled() => {}
            }
        });
    }
}

/// Answers one request, with the engine's name on it.
async fn answer(req: Request<Incoming>, state: &State) -> Response<Reply> {
    let mut response = route(req, state).await.unwrap_or_else(ApiError::response);
    response
        .headers_mut()
        .insert(ENGINE_HEADER, state.engine.clone());
    response
}

async fn route(req: Request<Incoming>, state: &State) -> Result<Response<Reply>, ApiError> {
    let get = req.method() == Method::GET;
    let post = req.method() == Method::POST;
    match req.uri().path() {
        "/health" | "/v1/health" if get => Ok(reply::empty()),
        "/v1/models" if get => Ok(reply::json(&reply::models(state))),
        "/server_info" | "/get_server_info" if get => Ok(reply::json(&reply::server_info(state))),
        "/model_info" | "/get_model_info" if get => Ok(reply::json(&reply::model_info(state))),
        "/metrics" if get => Ok(reply::metrics(state)),
        "/v1/chat/completions" if post => complete(req, Kind::Chat, state).await,
        "/v1/completions" if post => complete(req, Kind::Text, state).await,
        "/kv/pull" if post => pull(req, state).await,
        "/health"
        | "/v1/health"
        | "/v1/models"
        | "/server_info"
        | "/get_server_info"
        | "/model_info"
        | "/get_model_info"
        | "/metrics"
        | "/v1/chat/completions"
        | "/v1/completions"
        | "/kv/pull" => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{} is not allowed here", req.method()),
        )),
        path => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no route for {path}"),
        )),
    }
}

/// A completion request, read and checked.
struct Ask {
    prompt: String,
    max_tokens: usize,
    stream: bool,
    include_usage: bool,
    model: String,
    /// The body's `priority` (0 when it gives none).
    priority: i64,
    /// Which half of a disaggregated request it is, if one.
    half: Half,
}

/// Runs one completion through the GPU. Answers when the first token is out:
/// a streamed answer then goes on token by token, a plain one is sent whole.
async fn complete(
    req: Request<Incoming>,
    kind: Kind,
    state: &State,
) -> Result<Response<Reply>, ApiError> {
    let body = read_body(req, state.config.max_body_bytes).await?;
    let mut ask = parse(kind, &body, state)?;
    let (lease, imported_blocks) = match &ask.half {
        Half::Whole => (None, 0),
        // A prefill half answers once its first token is out.
        Half::Prefill { lease, .. } => (Some(*lease), 0),
        Half::Decode { host, port, lease } => {
            let wait = state.config.kv_lease;
            (None, transfer::pull(host, *port, *lease, wait).await)
        }
    };
    if lease.is_some() {
        ask.max_tokens = 1;
    }
    let answer = prompt::answer_text(
        magpie_core::hash::h64(ask.prompt.as_bytes()),
        ask.max_tokens,
    );
    let (events, mut progress) = mpsc::unbounded_channel();
    let job = Job {
        lease,
        imported_blocks,
        ..job(&ask, &answer, events, &state.config)
    };
    let (prompt_tokens, prompt_blocks) = (job.prompt_tokens, job.prompt_blocks);
    if state.jobs.try_send(Msg::Job(job)).is_err() {
        state.counters.rejected.fetch_add(1, Ordering::Relaxed);
        return Err(overloaded());
    }
    let Some(Event::First { cached_tokens }) = progress.recv().await else {
        return Err(overloaded());
    };
    let shape = shape(kind, &ask, state);
    let usage = Usage {
        prompt_tokens,
        completion_tokens: ask.max_tokens,
        cached_tokens,
    };
    if ask.stream && lease.is_none() {
        let usage = ask.include_usage.then_some(usage);
        return Ok(reply::stream(shape, answer, usage, progress));
    }
    let mut emitted = 1;
    while progress.recv().await.is_some() {
        emitted += 1;
    }
    if emitted < ask.max_tokens {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the engine is shutting down".into(),
        ));
    }
    let Half::Prefill { lease, vllm } = ask.half else {
        return Ok(reply::json(&reply::whole(&shape, &answer, &usage)));
    };
    // The GPU holds the blocks under the lease: a decode engine may pull.
    state.leases.ready(lease, prompt_blocks);
    if ask.stream {
        let usage = ask.include_usage.then_some(usage);
        return Ok(reply::stream(shape, answer, usage, progress));
    }
    let mut whole = reply::whole(&shape, &answer, &usage);
    if vllm {
        let params = transfer::vllm_params(&state.config.name, state.addr, lease, prompt_blocks);
        whole["kv_transfer_params"] = params;
    }
    Ok(reply::json(&whole))
}

/// What every chunk of `ask`'s answer repeats: a new id, its model.
fn shape(kind: Kind, ask: &Ask, state: &State) -> Shape {
    let n = state.next_id.fetch_add(1, Ordering::Relaxed);
    Shape {
        kind,
        id: format!("{}-{}-{n}", kind.id_prefix(), state.config.name),
        model: ask.model.clone(),
        created: state.started,
    }
}

/// `ask`'s job for the GPU, answering `answer`, its progress to `events`;
/// a whole request's (no lease, nothing imported).
fn job(
    ask: &Ask,
    answer: &str,
    events: mpsc::UnboundedSender<Event>,
    config: &EngineConfig,
) -> Job {
    let block_bytes = config.block_tokens * prompt::BYTES_PER_TOKEN;
    Job {
        prompt_tokens: prompt::token_count(&ask.prompt),
        // The prompt's whole blocks are the first of the prompt and answer's.
        blocks: prompt::block_hashes(&format!("{}{answer}", ask.prompt), config.block_tokens),
        prompt_blocks: ask.prompt.len() / block_bytes,
        max_tokens: ask.max_tokens,
        priority: ask.priority,
        events,
        lease: None,
        imported_blocks: 0,
    }
}

/// A decode engine pulls a lease's KV (`{"lease": N}`): how many blocks it
/// holds, once its prefill is done (waiting up to the lease's time); the
/// blocks are then let go here.
async fn pull(req: Request<Incoming>, state: &State) -> Result<Response<Reply>, ApiError> {
    let body = read_body(req, 4096).await?;
    let value: Option<Value> = serde_json::from_slice(&body).ok();
    let lease = value.as_ref().and_then(|v| v.get("lease")?.as_u64());
    let lease = lease.ok_or_else(|| bad("lease must be a non-negative integer"))?;
    let Some(blocks) = state.leases.take(lease).await else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no KV under lease {lease}"),
        ));
    };
    // The GPU is gone only when the engine stops.
    let _ = state.jobs.send(Msg::Release(lease)).await;
    Ok(reply::json(&serde_json::json!({ "blocks": blocks })))
}

fn overloaded() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "the engine's queue is full".into(),
    )
}

/// The request body, at most `max` bytes.
async fn read_body(req: Request<Incoming>, max: usize) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is over {max} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    match Limited::new(req.into_body(), max).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Err(e) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("cannot read the request body: {e}"),
        )),
    }
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, message.into())
}

/// Reads a completion request: the prompt (rendered from `messages` for a
/// chat), the answer's length and the streaming options.
fn parse(kind: Kind, body: &[u8], state: &State) -> Result<Ask, ApiError> {
    let config = &state.config;
    let value: Value =
        serde_json::from_slice(body).map_err(|e| bad(format!("the body is not JSON: {e}")))?;
    let Some(request) = value.as_object() else {
        return Err(bad("the body must be a JSON object"));
    };
    let prompt = match kind {
        Kind::Chat => chat_prompt(request)?,
        Kind::Text => text_prompt(request)?,
    };
    let max_tokens = match request
        .get("max_completion_tokens")
        .or_else(|| request.get("max_tokens"))
    {
        None | Some(Value::Null) => config.default_max_tokens,
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 && n <= config.max_tokens_limit as u64 => n as usize,
            _ => {
                return Err(bad(format!(
                    "max_tokens must be an integer from 1 to {}",
                    config.max_tokens_limit
                )));
            }
        },
    };
    let priority = match request.get("priority") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_i64()
            .ok_or_else(|| bad("priority must be an integer"))?,
    };
    let flag = |v: Option<&Value>| v.and_then(Value::as_bool).unwrap_or(false);
    let next = || state.next_id.fetch_add(1, Ordering::Relaxed);
    Ok(Ask {
        half: transfer::half(request, config.role, next).map_err(bad)?,
        priority,
        prompt,
        max_tokens,
        stream: flag(request.get("stream")),
        include_usage: flag(
            request
                .get("stream_options")
                .and_then(|o| o.get("include_usage")),
        ),
        model: match request.get("model").and_then(Value::as_str) {
            Some(m) if !m.is_empty() && m.len() <= 256 => m.to_string(),
            _ => config.model.clone(),
        },
    })
}

type Object = serde_json::Map<String, Value>;

/// A chat's prompt: every message's role and text through the template,
/// the tools' JSON first.
fn chat_prompt(request: &Object) -> Result<String, ApiError> {
    let Some(messages) = request.get("messages").and_then(Value::as_array) else {
        return Err(bad("messages must be an array"));
    };
    if messages.is_empty() {
        return Err(bad("messages must not be empty"));
    }
    let mut turns = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        let Some(role) = message.get("role").and_then(Value::as_str) else {
            return Err(bad(format!("messages[{i}].role must be a string")));
        };
        let mut text = content_text(message.get("content"))
            .ok_or_else(|| bad(format!("messages[{i}].content must be text or parts")))?;
        if let Some(calls) = message.get("tool_calls").filter(|c| !c.is_null()) {
            text.push_str(&calls.to_string());
        }
        turns.push((role, text));
    }
    let tools = request
        .get("tools")
        .filter(|t| !t.is_null())
        .map(Value::to_string);
    Ok(prompt::render_chat(
        turns.iter().map(|(role, text)| (*role, text.as_str())),
        tools.as_deref(),
    ))
}

/// A message's text: a string, or the text of its parts, concatenated
/// (none for a message with only tool calls).
fn content_text(content: Option<&Value>) -> Option<String> {
    match content {
        None | Some(Value::Null) => Some(String::new()),
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(parts)) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect(),
        ),
        Some(_) => None,
    }
}

/// A plain completion's prompt: a string, or a one-string array.
fn text_prompt(request: &Object) -> Result<String, ApiError> {
    match request.get("prompt") {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(items)) if items.len() == 1 => items[0]
            .as_str()
            .map(String::from)
            .ok_or_else(|| bad("prompt must be a string")),
        _ => Err(bad("prompt must be a string")),
    }
}
