//! The simulated engine's response bodies: completions whole (OpenAI's JSON)
//! or streamed (server-sent events, `data: {...}` per token, a usage chunk
//! when asked for, `data: [DONE]`), errors in OpenAI's shape, the vLLM-named
//! metrics, and the info documents routers read.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::gpu::Event;
use super::prompt::BYTES_PER_TOKEN;
use super::state::State;

/// Chat or plain completion: the shape of the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Text,
}

impl Kind {
    pub fn id_prefix(self) -> &'static str {
        match self {
            Kind::Chat => "chatcmpl",
            Kind::Text => "cmpl",
        }
    }
}

/// What every chunk of one answer repeats.
pub struct Shape {
    pub kind: Kind,
    pub id: String,
    pub model: String,
    pub created: u64,
}

#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
}

impl Usage {
    fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }
}

/// A response body: whole, or a stream of events.
pub enum Reply {
    Whole(Option<Bytes>),
    Stream(Box<Sse>),
}

impl Body for Reply {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Reply::Whole(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Reply::Stream(sse) => sse.poll_next(cx).map(|b| b.map(|b| Ok(Frame::data(b)))),
        }
    }
}

/// A streamed answer: one `data:` event per token as the GPU makes it, then
/// the finish, the usage (if asked for) and `[DONE]`.
pub struct Sse {
    shape: Shape,
    answer: String,
    usage: Option<Usage>,
    tokens: usize,
    progress: mpsc::UnboundedReceiver<Event>,
    /// Tokens sent so far.
    sent: usize,
    tail: VecDeque<Bytes>,
    ended: bool,
}

impl Sse {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        if self.sent == 0 {
            // The first token was out before the response was.
            self.sent = 1;
            return Poll::Ready(Some(self.token_event(0)));
        }
        loop {
            if let Some(bytes) = self.tail.pop_front() {
                return Poll::Ready(Some(bytes));
            }
            if self.ended {
                return Poll::Ready(None);
            }
            match self.progress.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(_)) => {
                    let i = self.sent;
                    self.sent += 1;
                    return Poll::Ready(Some(self.token_event(i)));
                }
                Poll::Ready(None) => {
                    self.ended = true;
                    // An answer cut short (the engine stopping) ends without
                    // [DONE], so the client sees it is incomplete.
                    if self.sent >= self.tokens {
                        self.finish();
                    }
                }
            }
        }
    }

    fn token_event(&self, i: usize) -> Bytes {
        let start = (i * BYTES_PER_TOKEN).min(self.answer.len());
        let end = ((i + 1) * BYTES_PER_TOKEN).min(self.answer.len());
        let text = self.answer.get(start..end).unwrap_or("");
        event(&self.chunk(i == 0, Some(text)))
    }

    fn chunk(&self, first: bool, text: Option<&str>) -> Value {
        let finish = if text.is_none() {
            json!("length")
        } else {
            Value::Null
        };
        let choice = match self.shape.kind {
            Kind::Chat => {
                let mut delta = serde_json::Map::new();
                if first {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(text) = text {
                    delta.insert("content".into(), json!(text));
                }
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
            Kind::Text => {
                json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish})
            }
        };
        envelope(&self.shape, true, vec![choice])
    }

    fn finish(&mut self) {
        self.tail.push_back(event(&self.chunk(false, None)));
        if let Some(usage) = self.usage {
            let mut last = envelope(&self.shape, true, Vec::new());
            last["usage"] = usage.json();
            self.tail.push_back(event(&last));
        }
        self.tail.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
    }
}

fn event(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// The fields every answer object starts with.
fn envelope(shape: &Shape, chunk: bool, choices: Vec<Value>) -> Value {
    let object = match (shape.kind, chunk) {
        (Kind::Chat, true) => "chat.completion.chunk",
        (Kind::Chat, false) => "chat.completion",
        (Kind::Text, _) => "text_completion",
    };
    json!({
        "id": shape.id,
        "object": object,
        "created": shape.created,
        "model": shape.model,
        "choices": choices,
    })
}

/// A streamed answer whose first token is out.
pub fn stream(
    shape: Shape,
    answer: String,
    usage: Option<Usage>,
    progress: mpsc::UnboundedReceiver<Event>,
) -> Response<Reply> {
    let tokens = answer.len().div_ceil(BYTES_PER_TOKEN);
    let sse = Sse {
        shape,
        answer,
        usage,
        tokens,
        progress,
        sent: 0,
        tail: VecDeque::new(),
        ended: false,
    };
    let mut r = Response::new(Reply::Stream(Box::new(sse)));
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert("cache-control", HeaderValue::from_static("no-cache"));
    r
}

/// A whole answer's JSON.
pub fn whole(shape: &Shape, answer: &str, usage: &Usage) -> Value {
    let choice = match shape.kind {
        Kind::Chat => json!({
            "index": 0,
            "message": {"role": "assistant", "content": answer},
            "logprobs": null,
            "finish_reason": "length",
        }),
        Kind::Text => {
            json!({"index": 0, "text": answer, "logprobs": null, "finish_reason": "length"})
        }
    };
    let mut value = envelope(shape, false, vec![choice]);
    value["usage"] = usage.json();
    value
}

pub fn json(value: &Value) -> Response<Reply> {
    with_type(
        StatusCode::OK,
        Bytes::from(value.to_string()),
        "application/json",
    )
}

pub fn empty() -> Response<Reply> {
    Response::new(Reply::Whole(None))
}

fn with_type(status: StatusCode, body: Bytes, content_type: &'static str) -> Response<Reply> {
    let mut r = Response::new(Reply::Whole(Some(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// An error, answered in OpenAI's shape.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: String) -> Self {
        Self { status, message }
    }

    pub fn response(self) -> Response<Reply> {
        let kind = if self.status.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        };
        let body = json!({"error": {
            "message": self.message,
            "type": kind,
            "param": null,
            "code": self.status.as_u16(),
        }});
        with_type(
            self.status,
            Bytes::from(body.to_string()),
            "application/json",
        )
    }
}

pub fn models(state: &State) -> Value {
    json!({"object": "list", "data": [{
        "id": state.config.model,
        "object": "model",
        "created": state.started,
        "owned_by": "magpie",
        "root": state.config.model,
        "max_model_len": state.config.max_body_bytes / BYTES_PER_TOKEN,
    }]})
}

/// Enough of SGLang's server info for a router to register the engine.
pub fn server_info(state: &State) -> Value {
    let c = &state.config;
    json!({
        "model_path": c.model,
        "served_model_name": c.model,
        "tokenizer_path": c.model,
        "is_generation": true,
        "page_size": c.block_tokens,
        "max_running_requests": c.max_running,
        "max_total_num_tokens": c.cache_blocks * c.block_tokens,
        "tp_size": 1,
        "dp_size": 1,
        "version": concat!("magpie-engine ", env!("CARGO_PKG_VERSION")),
        "engine_name": c.name,
    })
}

/// SGLang's model info.
pub fn model_info(state: &State) -> Value {
    json!({
        "model_path": state.config.model,
        "tokenizer_path": state.config.model,
        "is_generation": true,
        "model_type": "magpie-sim",
        "architectures": ["MagpieSimForCausalLM"],
    })
}

/// vLLM's metric names: (name, type, help, how to read it).
type Family = (
    &'static str,
    &'static str,
    &'static str,
    fn(&State) -> String,
);

const FAMILIES: [Family; 10] = [
    (
        "vllm:num_requests_running",
        "gauge",
        "Requests in the running batch.",
        |s| read(&s.counters.running),
    ),
    (
        "vllm:num_requests_waiting",
        "gauge",
        "Requests waiting for the batch.",
        |s| read(&s.counters.waiting),
    ),
    (
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage: 1 means 100 percent.",
        |s| {
            let held = s.counters.cache_held.load(Ordering::Relaxed) as f64;
            format!("{:.6}", (held / s.config.cache_blocks as f64).min(1.0))
        },
    ),
    (
        "vllm:prompt_tokens",
        "counter",
        "Prefill tokens processed.",
        |s| read(&s.counters.prompt_tokens),
    ),
    (
        "vllm:generation_tokens",
        "counter",
        "Generation tokens processed.",
        |s| read(&s.counters.generation_tokens),
    ),
    (
        "vllm:prefix_cache_queries",
        "counter",
        "Prefix cache queries, in tokens.",
        |s| read(&s.counters.prompt_tokens),
    ),
    (
        "vllm:prefix_cache_hits",
        "counter",
        "Prefix cache hits, in tokens.",
        |s| read(&s.counters.cached_tokens),
    ),
    (
        "vllm:request_success",
        "counter",
        "Requests finished.",
        |s| read(&s.counters.finished),
    ),
    (
        "magpie_engine:kv_received_tokens",
        "counter",
        "KV tokens moved in from prefill engines (decode halves).",
        |s| read(&s.counters.kv_received_tokens),
    ),
    (
        "magpie_engine:kv_leases",
        "gauge",
        "Prefill halves' KV held for a decode engine to pull.",
        |s| read(&s.counters.leases),
    ),
];

fn read(counter: &std::sync::atomic::AtomicU64) -> String {
    counter.load(Ordering::Relaxed).to_string()
}

/// The metrics in Prometheus text, with vLLM's `model_name` and `engine` labels.
pub fn metrics(state: &State) -> Response<Reply> {
    let model = state
        .config
        .model
        .replace('\\', "\\\\")
        .replace('"', "\\\"");
    let labels = format!("engine=\"0\",model_name=\"{model}\"");
    let mut out = String::new();
    for (name, kind, help, value) in FAMILIES {
        // A counter's sample carries _total, as Python's client writes it.
        let sample = if kind == "counter" {
            format!("{name}_total")
        } else {
            name.to_string()
        };
        // Writing to a String cannot fail.
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{sample}{{{labels}}} {}\n",
            value(state)
        );
    }
    // The cache's size, in the labels of an info gauge, as vLLM says it.
    let _ = write!(
        out,
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
         # TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{{block_size=\"{}\",enable_prefix_caching=\"True\",{labels},num_gpu_blocks=\"{}\"}} 1.0\n",
        state.config.block_tokens, state.config.cache_blocks
    );
    with_type(
        StatusCode::OK,
        Bytes::from(out),
        "text/plain; version=0.0.4; charset=utf-8",
    )
}
