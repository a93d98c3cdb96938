//! The workload's HTTP client: a bounded pool of keep-alive HTTP/1.1
//! connections per URL (hyper), and one completion request through it,
//! timed to its first streamed byte and to its end.
//!
//! Any request takes any idle connection, as the OpenAI SDK's pool does; a
//! request finding all `--connections` busy waits for one. What a server
//! sends is bounded: a response body of at most [`MAX_RESPONSE`] bytes, an
//! event of at most [`MAX_EVENT`].

use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tracing::debug;

use super::WorkloadError;
use crate::engine::ENGINE_HEADER;

/// The largest response body read.
const MAX_RESPONSE: usize = 64 << 20;
/// The largest server-sent event.
const MAX_EVENT: usize = 1 << 20;

/// A base URL: where to connect and the path to put before `/v1/...`.
#[derive(Debug, Clone)]
pub struct Target {
    pub authority: String,
    pub base_path: String,
}

impl Target {
    pub fn parse(url: &str) -> Result<Self, WorkloadError> {
        let bad = || WorkloadError::Url(url.to_string());
        let rest = url.strip_prefix("http://").ok_or_else(bad)?;
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let port_ok = authority
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !port_ok {
            return Err(bad());
        }
        let path = path.trim_end_matches('/');
        Ok(Self {
            authority: authority.to_string(),
            base_path: if path.is_empty() {
                String::new()
            } else {
                format!("/{path}")
            },
        })
    }
}

/// One URL's connections.
pub struct Pool {
    target: Target,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
    permits: Semaphore,
}

/// What a completed request told.
#[derive(Debug, Default)]
pub struct Answer {
    pub engine: Option<String>,
    /// From sending the request to the first byte of its body.
    pub ttft: Duration,
    pub total: Duration,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: u64,
    pub content: String,
}

/// Why a request failed, short (the summary counts them by this).
pub type Failure = String;

impl Pool {
    pub fn new(target: Target, connections: usize) -> Self {
        Self {
            target,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(connections),
        }
    }

    /// An idle connection that still works, or a new one.
    async fn connection(&self) -> Result<SendRequest<Full<Bytes>>, Failure> {
        loop {
            let candidate = self.idle.lock().ok().and_then(|mut idle| idle.pop());
            let Some(mut sender) = candidate else { break };
            if sender.ready().await.is_ok() {
                return Ok(sender);
            }
        }
        let stream = TcpStream::connect(&self.target.authority)
            .await
            .map_err(|e| format!("connect: {}", e.kind()))?;
        if let Err(e) = stream.set_nodelay(true) {
            debug!(error = %e, "workload: cannot set TCP_NODELAY");
        }
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                debug!(error = %e, "workload connection ended with an error");
            }
        });
        Ok(sender)
    }

    /// POSTs `body` to `path` (after the base path) with `headers`, and reads
    /// the answer, streamed or whole.
    pub async fn post(
        &self,
        path: &str,
        headers: &[(&str, String)],
        body: Bytes,
        stream: bool,
    ) -> Result<Answer, Failure> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| "pool closed".to_string())?;
        let mut sender = self.connection().await?;
        let mut request = Request::post(format!("{}{path}", self.target.base_path))
            .header("host", &self.target.authority)
            .header("content-type", "application/json");
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let request = request
            .body(Full::new(body))
            .map_err(|e| format!("request: {e}"))?;
        let sent = Instant::now();
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("send: {e}"))?;
        let status = response.status();
        let engine = response
            .headers()
            .get(ENGINE_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        let mut body = response.into_body();
        let mut reader = Reader::new(stream);
        let mut first = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("body: {e}"))?;
            if let Ok(data) = frame.into_data()
                && !data.is_empty()
            {
                first.get_or_insert_with(|| sent.elapsed());
                reader.feed(&data)?;
            }
        }
        let total = sent.elapsed();
        if status != StatusCode::OK {
            return Err(format!("status {}", status.as_u16()));
        }
        let mut answer = reader.finish()?;
        answer.engine = engine;
        answer.ttft = first.unwrap_or(total);
        answer.total = total;
        if !sender.is_closed()
            && let Ok(mut idle) = self.idle.lock()
        {
            idle.push(sender);
        }
        Ok(answer)
    }
}

/// Reads a completion's body as it comes: server-sent events or one JSON.
struct Reader {
    stream: bool,
    pending: Vec<u8>,
    read: usize,
    done: bool,
    answer: Answer,
}

impl Reader {
    fn new(stream: bool) -> Self {
        Self {
            stream,
            pending: Vec::new(),
            read: 0,
            done: false,
            answer: Answer::default(),
        }
    }

    fn feed(&mut self, data: &[u8]) -> Result<(), Failure> {
        self.read += data.len();
        if self.read > MAX_RESPONSE {
            return Err("response too large".into());
        }
        self.pending.extend_from_slice(data);
        if !self.stream {
            return Ok(());
        }
        while let Some(end) = self.pending.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = self.pending.drain(..end + 2).collect();
            self.event(&event)?;
        }
        if self.pending.len() > MAX_EVENT {
            return Err("event too large".into());
        }
        Ok(())
    }

    /// One event's `data:` lines.
    fn event(&mut self, event: &[u8]) -> Result<(), Failure> {
        for line in event.split(|&b| b == b'\n') {
            let Some(data) = line.strip_prefix(b"data:") else {
                continue;
            };
            let data = data.trim_ascii();
            if data == b"[DONE]" {
                self.done = true;
                continue;
            }
            let chunk: Value =
                serde_json::from_slice(data).map_err(|_| "event is not JSON".to_string())?;
            let choice = &chunk["choices"][0];
            let text = choice["delta"]["content"]
                .as_str()
                .or_else(|| choice["text"].as_str());
            if let Some(text) = text {
                self.answer.content.push_str(text);
            }
            self.usage(&chunk["usage"]);
        }
        Ok(())
    }

    fn usage(&mut self, usage: &Value) {
        if let Some(prompt) = usage["prompt_tokens"].as_u64() {
            self.answer.prompt_tokens = Some(prompt);
            self.answer.cached_tokens = usage["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0);
        }
    }

    fn finish(mut self) -> Result<Answer, Failure> {
        if self.stream {
            if !self.done {
                return Err("stream ended without [DONE]".into());
            }
        } else {
            let whole: Value = serde_json::from_slice(&self.pending)
                .map_err(|_| "answer is not JSON".to_string())?;
            let choice = &whole["choices"][0];
            let text = choice["message"]["content"]
                .as_str()
                .or_else(|| choice["text"].as_str())
                .unwrap_or("");
            self.answer.content = text.to_string();
            self.usage(&whole["usage"]);
        }
        if self.answer.prompt_tokens.is_none() {
            return Err("no usage in the answer".into());
        }
        Ok(self.answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_or_are_refused() {
        let t = Target::parse("http://127.0.0.1:8000").unwrap();
        assert_eq!(
            (t.authority.as_str(), t.base_path.as_str()),
            ("127.0.0.1:8000", "")
        );
        let t = Target::parse("http://router:80/api/").unwrap();
        assert_eq!(
            (t.authority.as_str(), t.base_path.as_str()),
            ("router:80", "/api")
        );
        for bad in [
            "https://x:1",
            "127.0.0.1:80",
            "http://host",
            "http://:80",
            "http://h:99999",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn events_split_across_frames_are_read_whole() {
        let mut r = Reader::new(true);
        let body = concat!(
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"ab\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"cd\"}}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n",
            "data: [DONE]\n\n"
        );
        for piece in body.as_bytes().chunks(7) {
            r.feed(piece).unwrap();
        }
        let a = r.finish().unwrap();
        assert_eq!(a.content, "abcd");
        assert_eq!((a.prompt_tokens, a.cached_tokens), (Some(9), 4));
        let mut cut = Reader::new(true);
        cut.feed(b"data: {\"choices\":[]}\n\n").unwrap();
        assert!(cut.finish().is_err());
    }
}
