//! A disaggregated request's prefill half (`disaggregation`, mode http):
//! sent to the prefill pool before (vLLM's protocol) or beside (SGLang's)
//! the decode half, which then goes on its journey as any request does.
//!
//! Where the halves go is the routing decision's
//! ([`crate::routing::llm::disaggregation`]): the decode half by the
//! request's plan, the prefill half by the prefill pool's route for its
//! conversation, or no split at all. Here the prefill half is sent:
//!
//! * vLLM's: the body with `kv_transfer_params: {do_remote_decode: true}`,
//!   `stream: false` and `max_tokens: 1` (no `stream_options`,
//!   `min_tokens`, and `max_completion_tokens: 1` where written) goes to
//!   the prefill backend; its JSON answer's `kv_transfer_params` (where its
//!   KV waits) are written into the decode half's body.
//! * SGLang's: the body with `bootstrap_host`, `bootstrap_port` (the prefill
//!   backend's) and a random `bootstrap_room` goes to both at once: the
//!   prefill half once its connection is open, its answer read and dropped;
//!   the client gets the decode half's.
//!
//! A prefill backend that refuses the connection, fails or does not answer
//! within `disaggregation.prefill_timeout` is counted against and the next
//! one tried; after [`PREFILL_TRIES`] the decode backend gets the request
//! as the client sent it and prefills it itself. The prefill half holds a
//! slot at its backend (its bounded-load cap counts it) while it runs, and
//! reads at most [`MAX_PREFILL_ANSWER_BYTES`] of an answer.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use tokio::time::{Instant, timeout};
use tracing::{debug, warn};

use super::fields::HOP_BY_HOP;
use super::journey::account;
use super::upstream;
use crate::config::{Config, DisaggregationConfig, Protocol};
use crate::routing::backend::{ActiveGuard, Backend, CodeClass, TimeoutKind, WorkGuard};
use crate::routing::health::passive;
use crate::routing::instance::Instance;
use crate::routing::llm::disaggregation::{Decision, PREFILL_TRIES, PrefillPlan, PrefillRoom};

/// The most of a prefill backend's answer read (vLLM's answer carries its
/// KV's block ids: a few bytes per block of 16 tokens).
pub(crate) const MAX_PREFILL_ANSWER_BYTES: usize = 1 << 20;

/// The client's request as its prefill half repeats it: its target and
/// the header fields passed on (not hop-by-hop ones, nor its framing,
/// `Host` or `Accept-Encoding`: the prefill half's answer is read here,
/// uncompressed).
pub(crate) struct Leg {
    target: String,
    headers: HeaderMap,
}

impl Leg {
    /// The leg of a request with this target and these header fields.
    pub(crate) fn new<'h>(
        target: &str,
        fields: impl IntoIterator<Item = (&'h str, &'h [u8])>,
    ) -> Leg {
        let mut headers = HeaderMap::new();
        for (name, value) in fields {
            let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
                continue;
            };
            let skip = HOP_BY_HOP.contains(&name.as_str())
                || name == header::HOST
                || name == header::CONTENT_LENGTH
                || name == header::EXPECT
                || name == header::ACCEPT_ENCODING;
            if let (false, Ok(value)) = (skip, HeaderValue::from_bytes(value)) {
                headers.append(name, value);
            }
        }
        Leg {
            target: target.to_string(),
            headers,
        }
    }

    /// The leg of the request whose HTTP/1.1 head is `head`.
    pub(crate) fn of_head(head: &[u8]) -> Option<Leg> {
        let mut fields = [httparse::EMPTY_HEADER; 128];
        let mut request = httparse::Request::new(&mut fields);
        request.parse(head).ok()?;
        let target = request.path?;
        Some(Leg::new(
            target,
            request.headers.iter().map(|h| (h.name, h.value)),
        ))
    }
}

/// What the prefill half came to: the decode half's body (`None`: as the
/// client sent it), why, and the prefill backend that took it.
pub(crate) struct Halves {
    pub(crate) body: Option<Vec<u8>>,
    pub(crate) decision: Decision,
    pub(crate) prefill: Option<Arc<Backend>>,
}

impl Halves {
    fn whole(decision: Decision) -> Halves {
        Halves {
            body: None,
            decision,
            prefill: None,
        }
    }
}

/// Sends the prefill half of the request `leg` with `body` (`None`: not
/// read whole) by `route` (`Err`: not split, and why); counts the decision.
pub(crate) async fn prefill(
    instance: &Instance,
    config: &Arc<Config>,
    route: Result<PrefillPlan, Decision>,
    leg: &Leg,
    body: Option<&[u8]>,
) -> Halves {
    let halves = match (&config.disaggregation, route, body) {
        (Some(split), Ok(route), Some(body)) => {
            let cx = Prefill {
                instance,
                config,
                split,
                leg,
            };
            match split.protocol {
                Protocol::Vllm => cx.vllm(&route, body).await,
                Protocol::Sglang => cx.sglang(&route, body).await,
            }
        }
        (_, Err(decision), _) => Halves::whole(decision),
        _ => Halves::whole(Decision::Unsplittable),
    };
    instance.stats.count_split(halves.decision.index());
    halves
}

/// What sending a prefill half needs.
struct Prefill<'a> {
    instance: &'a Instance,
    config: &'a Arc<Config>,
    split: &'a DisaggregationConfig,
    leg: &'a Leg,
}

impl Prefill<'_> {
    /// vLLM's protocol: the prefill half first; its answer's
    /// `kv_transfer_params` go with the decode half.
    async fn vllm(&self, route: &PrefillPlan, body: &[u8]) -> Halves {
        let Some(half) = vllm_prefill_body(body).map(Bytes::from) else {
            return Halves::whole(Decision::Unsplittable);
        };
        let mut tried = Vec::new();
        while let Some((backend, slot, work)) = self.room(route, &mut tried).await {
            let started = Instant::now();
            let sent = self.send(&backend, half.clone(), work);
            let answer = match timeout(self.split.prefill_timeout, sent).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(failed)) => {
                    self.failed(&backend, failed);
                    continue;
                }
                Err(_) => {
                    self.timed_out(&backend);
                    continue;
                }
            };
            drop(slot);
            let params = super::body_fields::field(&answer, "kv_transfer_params");
            let decode = params.and_then(|p| {
                let set = [("kv_transfer_params", p.get())];
                super::body_fields::edit(body, &[], &set)
            });
            match decode {
                Some(decode) => {
                    debug!(backend = %backend.name, took = ?started.elapsed(), "prefill half answered");
                    return Halves {
                        body: Some(decode),
                        decision: Decision::Split,
                        prefill: Some(backend),
                    };
                }
                None => self.failed(&backend, Failed::Answer("no kv_transfer_params".into())),
            }
        }
        Halves::whole(Decision::PrefillFailed)
    }

    /// SGLang's protocol: the prefill half goes once its connection is
    /// open, beside the decode half, both naming the prefill backend's
    /// bootstrap server and one room.
    async fn sglang(&self, route: &PrefillPlan, body: &[u8]) -> Halves {
        let mut tried = Vec::new();
        while let Some((backend, slot, work)) = self.room(route, &mut tried).await {
            let Some(port) = backend.bootstrap_port else {
                continue;
            };
            let host = serde_json::Value::from(backend.addr.ip().to_string()).to_string();
            let room = bootstrap_room().to_string();
            let set = [
                ("bootstrap_host", host.as_str()),
                ("bootstrap_port", &port.to_string()),
                ("bootstrap_room", room.as_str()),
            ];
            let Some(both) = super::body_fields::edit(body, &[], &set) else {
                return Halves::whole(Decision::Unsplittable);
            };
            let connect = self.config.connect.timeout.min(self.split.prefill_timeout);
            let io = match upstream::open(&backend, connect).await {
                Ok(io) => io,
                Err(e) => {
                    self.failed(&backend, Failed::Connect(e));
                    continue;
                }
            };
            let request = half_request(self.leg, &backend, Bytes::from(both.clone()));
            let background = Background {
                backend: Arc::clone(&backend),
                deadline: self.split.prefill_timeout,
                config: Arc::clone(self.config),
                slot,
                work,
            };
            tokio::spawn(background.run(io, request));
            return Halves {
                body: Some(both),
                decision: Decision::Split,
                prefill: Some(backend),
            };
        }
        Halves::whole(Decision::PrefillFailed)
    }

    /// A room for the next try of a prefill half by `route`, at a backend
    /// not `tried` (which it joins); `None` after [`PREFILL_TRIES`] tries,
    /// or when no backend has room.
    async fn room(
        &self,
        route: &PrefillPlan,
        tried: &mut Vec<Arc<Backend>>,
    ) -> Option<PrefillRoom> {
        if tried.len() >= PREFILL_TRIES {
            return None;
        }
        let room = route.room(self.instance, self.config, tried).await?;
        tried.push(Arc::clone(&room.0));
        Some(room)
    }

    /// Sends `body` to `backend` over a new connection and reads its
    /// answer, counted as the journey counts an answer.
    /// `work` is its prefill there, answered at its answer's head.
    async fn send(
        &self,
        backend: &Arc<Backend>,
        body: Bytes,
        work: WorkGuard,
    ) -> Result<Bytes, Failed> {
        let io = upstream::open(backend, self.config.connect.timeout)
            .await
            .map_err(Failed::Connect)?;
        let request = half_request(self.leg, backend, body);
        let sent = Instant::now();
        let answer = exchange(io, request).await?;
        account(backend, answer.status().as_u16(), sent, self.config);
        work.answered();
        read_answer(answer).await
    }

    /// The prefill half at `backend` failed: counted against it.
    fn failed(&self, backend: &Backend, failed: Failed) {
        match &failed {
            Failed::Connect(e) => {
                let health = self.config.health.as_ref();
                passive::connect_failed(backend, e, health, &self.instance.stats);
            }
            Failed::Answer(_) => backend.live.traffic.count_request(CodeClass::Error),
        }
        warn!(backend = %backend.name, error = %failed, "prefill half failed; trying the next prefill backend, then the decode backend alone");
    }

    /// The prefill half at `backend` took longer than its timeout.
    fn timed_out(&self, backend: &Backend) {
        let traffic = &backend.live.traffic;
        traffic.count_request(CodeClass::Error);
        traffic.count_timeout(TimeoutKind::Response);
        warn!(backend = %backend.name, timeout = ?self.split.prefill_timeout, "prefill half did not answer within disaggregation.prefill_timeout");
    }
}

/// A prefill half that runs beside its decode half (SGLang's), holding its
/// slot until its answer ends or its deadline passes.
struct Background {
    backend: Arc<Backend>,
    deadline: Duration,
    config: Arc<Config>,
    slot: ActiveGuard,
    work: WorkGuard,
}

impl Background {
    async fn run(self, io: upstream::UpstreamIo, request: Request<Full<Bytes>>) {
        let backend = &self.backend;
        let sent = Instant::now();
        let work = self.work;
        let half = async {
            let answer = exchange(io, request).await?;
            account(backend, answer.status().as_u16(), sent, &self.config);
            work.answered();
            read_answer(answer).await
        };
        let failure = match timeout(self.deadline, half).await {
            Ok(Ok(_)) => None,
            Ok(Err(failed)) => Some(failed.to_string()),
            Err(_) => {
                backend.live.traffic.count_timeout(TimeoutKind::Response);
                Some("no answer within disaggregation.prefill_timeout".to_string())
            }
        };
        if let Some(error) = failure {
            backend.live.traffic.count_request(CodeClass::Error);
            warn!(backend = %backend.name, %error, "prefill half failed beside its decode half");
        }
        drop(self.slot);
    }
}

/// Why a prefill half failed.
#[derive(Debug, thiserror::Error)]
enum Failed {
    #[error("cannot connect: {0}")]
    Connect(io::Error),
    #[error("{0}")]
    Answer(String),
}

/// The prefill half of `leg` to `backend`, with `body`.
fn half_request(leg: &Leg, backend: &Backend, body: Bytes) -> Request<Full<Bytes>> {
    let mut request = Request::new(Full::new(body));
    *request.method_mut() = Method::POST;
    if let Ok(uri) = leg.target.parse() {
        *request.uri_mut() = uri;
    }
    let headers = request.headers_mut();
    headers.clone_from(&leg.headers);
    if let Ok(host) = HeaderValue::from_str(&backend.addr.to_string()) {
        headers.insert(header::HOST, host);
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    request
}

/// Sends `request` over `io` (HTTP/1.1) and reads its answer's head.
async fn exchange(
    io: upstream::UpstreamIo,
    request: Request<Full<Bytes>>,
) -> Result<Response<hyper::body::Incoming>, Failed> {
    let answer = |e: hyper::Error| Failed::Answer(e.to_string());
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(answer)?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            debug!(error = %e, "prefill connection ended with an error");
        }
    });
    sender.send_request(request).await.map_err(answer)
}

/// A successful answer's body, at most [`MAX_PREFILL_ANSWER_BYTES`].
async fn read_answer(answer: Response<hyper::body::Incoming>) -> Result<Bytes, Failed> {
    let status = answer.status();
    let body = Limited::new(answer.into_body(), MAX_PREFILL_ANSWER_BYTES);
    let bytes = (body.collect().await)
        .map_err(|e| Failed::Answer(format!("its answer's body failed: {e}")))?
        .to_bytes();
    if !status.is_success() {
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
        return Err(Failed::Answer(format!("answered {status}: {text}")));
    }
    Ok(bytes)
}

/// The body of vLLM's prefill half: one token, not streamed, its KV kept
/// for a decode engine to pull. `None` when `body` is not one JSON object.
fn vllm_prefill_body(body: &[u8]) -> Option<Vec<u8>> {
    let one = ("max_completion_tokens", "1");
    let capped = super::body_fields::has(body, one.0);
    let params = r#"{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}"#;
    let mut set = vec![
        ("kv_transfer_params", params),
        ("stream", "false"),
        ("max_tokens", "1"),
    ];
    if capped {
        set.push(one);
    }
    super::body_fields::edit(body, &["stream_options", "min_tokens"], &set)
}

/// A room for one request's KV on SGLang's bootstrap server: random,
/// below 2^63.
fn bootstrap_room() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let hash = magpie_core::hash::h64_parts(&[&n.to_be_bytes(), &now.to_be_bytes()]);
    hash >> 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllms_prefill_half_asks_one_token_and_keeps_its_kv() {
        let body = br#"{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":300,"min_tokens":5}"#;
        let half: serde_json::Value =
            serde_json::from_slice(&vllm_prefill_body(body).unwrap()).unwrap();
        assert_eq!(half["stream"], false);
        assert_eq!(half["max_tokens"], 1);
        assert_eq!(half["max_completion_tokens"], 1);
        assert_eq!(half["kv_transfer_params"]["do_remote_decode"], true);
        assert!(half.get("stream_options").is_none() && half.get("min_tokens").is_none());
        assert_eq!(half["model"], "m");
        let plain: serde_json::Value =
            serde_json::from_slice(&vllm_prefill_body(b"{\"a\":1}").unwrap()).unwrap();
        assert!(plain.get("max_completion_tokens").is_none());
        assert!(vllm_prefill_body(b"[1]").is_none());
    }

    #[test]
    fn a_leg_keeps_the_clients_fields_but_its_framing_and_host() {
        let head = b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: lb\r\ncontent-length: 9\r\nauthorization: Bearer t\r\nconnection: keep-alive\r\nx-session-id: s\r\n\r\n";
        let leg = Leg::of_head(head).unwrap();
        assert_eq!(leg.target, "/v1/chat/completions?x=1");
        assert_eq!(leg.headers["authorization"], "Bearer t");
        assert_eq!(leg.headers["x-session-id"], "s");
        assert!(leg.headers.get("host").is_none());
        assert!(leg.headers.get("content-length").is_none());
        assert!(leg.headers.get("connection").is_none());
        let gzip = Leg::new("/", [("accept-encoding", &b"gzip"[..])]);
        assert!(gzip.headers.is_empty());
    }

    #[test]
    fn rooms_differ_and_fit_in_63_bits() {
        let a = bootstrap_room();
        let b = bootstrap_room();
        assert_ne!(a, b);
        assert!(a < 1 << 63 && b < 1 << 63);
    }
}
