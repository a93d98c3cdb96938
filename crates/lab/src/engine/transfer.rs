//! Disaggregated prefill and decode (`--role`): a request's prompt is
//! prefilled on one engine and its answer decoded on another, which pulls
//! the prompt's KV blocks from the first, as the two protocols routers
//! drive do it:
//!
//! * vLLM (NIXL): the router sends the request to a prefill engine with
//!   `kv_transfer_params: {do_remote_decode: true}` (and `max_tokens: 1`);
//!   the answer carries `kv_transfer_params` saying where the KV is
//!   (`remote_host`, `remote_port`, `remote_request_id`); the router sends
//!   the request again, with those, to a decode engine.
//! * SGLang: the router sends the same body to a prefill and a decode
//!   engine at once, with `bootstrap_host`, `bootstrap_port` (the prefill
//!   engine's) and a random `bootstrap_room`; the engine's `--role` says
//!   which half it serves.
//!
//! The prefill engine holds the prompt's blocks under a lease (the room, or
//! a number of its own) until a decode engine pulls them (`POST /kv/pull`),
//! or for `--kv-lease-ms`, after which they are let go. A pull waits as
//! long for a lease that is not there yet (SGLang's decode half may come
//! first). The decode engine moves only the blocks its own cache lacks,
//! at `--kv-transfer-us-per-token` each, off the GPU's prefill lane; a
//! pull that fails leaves it to prefill the whole prompt itself.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::debug;

/// Which half of a disaggregated request an engine serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Role {
    /// Whole requests; SGLang's bootstrap fields are ignored.
    #[default]
    Both,
    /// SGLang's prefill half of a request with a `bootstrap_room`.
    Prefill,
    /// SGLang's decode half of a request with a `bootstrap_room`.
    Decode,
}

/// What a completion request's body makes of it here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Half {
    /// The whole request: prefill and decode here.
    Whole,
    /// Its prefill: the prompt's blocks are held under `lease` for a decode
    /// engine to pull, the answer ends after one token; with `vllm`, it
    /// says where the blocks are in `kv_transfer_params`.
    Prefill { lease: u64, vllm: bool },
    /// Its decode: the prompt's blocks are pulled from `host`:`port` under
    /// `lease` first.
    Decode { host: String, port: u16, lease: u64 },
}

type Object = serde_json::Map<String, Value>;

/// The half `request` asks of an engine of `role`; `new_lease` numbers a
/// vLLM prefill's lease.
pub fn half(request: &Object, role: Role, new_lease: impl FnOnce() -> u64) -> Result<Half, String> {
    if let Some(params) = request.get("kv_transfer_params").and_then(Value::as_object) {
        let flag = |name| params.get(name).and_then(Value::as_bool) == Some(true);
        if flag("do_remote_decode") {
            return Ok(Half::Prefill {
                lease: new_lease(),
                vllm: true,
            });
        }
        if flag("do_remote_prefill") {
            let lease = params.get("remote_request_id").and_then(number);
            return from(params, "remote_host", "remote_port", lease);
        }
        return Ok(Half::Whole);
    }
    let room = request.get("bootstrap_room").filter(|r| !r.is_null());
    match (role, room) {
        (Role::Both, _) | (_, None) => Ok(Half::Whole),
        (Role::Prefill, Some(room)) => match number(room) {
            Some(lease) => Ok(Half::Prefill { lease, vllm: false }),
            None => Err("bootstrap_room must be a non-negative integer".into()),
        },
        (Role::Decode, Some(room)) => {
            from(request, "bootstrap_host", "bootstrap_port", number(room))
        }
    }
}

/// A decode half's source: `host` and `port` fields of `object`.
fn from(object: &Object, host: &str, port: &str, lease: Option<u64>) -> Result<Half, String> {
    let host_value = object.get(host).and_then(Value::as_str);
    let port_value = object.get(port).and_then(number);
    match (
        host_value,
        port_value.and_then(|p| u16::try_from(p).ok()),
        lease,
    ) {
        (Some(h), Some(p), Some(lease)) if !h.is_empty() && h.len() <= 255 && p > 0 => {
            Ok(Half::Decode {
                host: h.to_string(),
                port: p,
                lease,
            })
        }
        _ => Err(format!(
            "a decode half needs {host} (text), {port} (1 to 65535) and its lease"
        )),
    }
}

/// A non-negative integer, written as a number or as decimal text.
fn number(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// What a vLLM prefill's answer says of its KV: where a decode engine
/// pulls it.
pub fn vllm_params(name: &str, addr: std::net::SocketAddr, lease: u64, blocks: usize) -> Value {
    json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_engine_id": name,
        "remote_request_id": lease.to_string(),
        "remote_block_ids": (0..blocks).collect::<Vec<_>>(),
        "remote_host": addr.ip().to_string(),
        "remote_port": addr.port(),
        "tp_size": 1,
    })
}

/// The prefill side's leases whose blocks are ready to pull: how many
/// prompt blocks each holds, until when.
pub struct Leases {
    ready: Mutex<HashMap<u64, (usize, Instant)>>,
    changed: Notify,
    ttl: Duration,
}

impl Leases {
    pub fn new(ttl: Duration) -> Leases {
        Leases {
            ready: Mutex::new(HashMap::new()),
            changed: Notify::new(),
            ttl,
        }
    }

    /// `lease`'s prefill is done: its `blocks` may be pulled. Leases past
    /// their time are let go here (the GPU let go of their blocks).
    pub fn ready(&self, lease: u64, blocks: usize) {
        let now = Instant::now();
        if let Ok(mut ready) = self.ready.lock() {
            ready.retain(|_, (_, until)| *until > now);
            ready.insert(lease, (blocks, now + self.ttl));
        }
        self.changed.notify_waiters();
    }

    /// Takes `lease`'s blocks, waiting for its prefill up to the lease's
    /// time; `None` when it never came or expired.
    pub async fn take(&self, lease: u64) -> Option<usize> {
        let deadline = Instant::now() + self.ttl;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(blocks) = self.try_take(lease) {
                return Some(blocks);
            }
            tokio::time::timeout_at(deadline, changed).await.ok()?;
        }
    }

    fn try_take(&self, lease: u64) -> Option<usize> {
        let mut ready = self.ready.lock().ok()?;
        match ready.remove(&lease) {
            Some((blocks, until)) if until > Instant::now() => Some(blocks),
            _ => None,
        }
    }
}

/// Pulls `lease`'s blocks from the prefill engine at `host`:`port`: how
/// many it had (0 when the pull fails, within `wait` and a second).
pub async fn pull(host: &str, port: u16, lease: u64, wait: Duration) -> usize {
    let asked = tokio::time::timeout(wait + Duration::from_secs(1), ask(host, port, lease));
    match asked.await {
        Ok(Ok(blocks)) => blocks,
        Ok(Err(error)) => {
            debug!(%host, port, lease, %error, "KV pull failed: prefilling here");
            0
        }
        Err(_) => {
            debug!(%host, port, lease, "KV pull timed out: prefilling here");
            0
        }
    }
}

async fn ask(host: &str, port: u16, lease: u64) -> Result<usize, String> {
    let stream = (TcpStream::connect((host, port)).await).map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let body = Bytes::from(json!({ "lease": lease }).to_string());
    let request = Request::post("/kv/pull")
        .header("host", host)
        .header("content-type", "application/json")
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    if status != StatusCode::OK {
        return Err(format!("{status}"));
    }
    let value: Value = serde_json::from_slice(&body.to_bytes()).map_err(|e| e.to_string())?;
    let blocks = value.get("blocks").and_then(Value::as_u64);
    blocks
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| "no blocks in the answer".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(value: Value) -> Object {
        value.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn each_protocol_says_its_half() {
        let vllm_prefill = object(json!({"kv_transfer_params": {"do_remote_decode": true}}));
        assert_eq!(
            half(&vllm_prefill, Role::Both, || 7),
            Ok(Half::Prefill {
                lease: 7,
                vllm: true
            })
        );
        let params = vllm_params("p", "127.0.0.1:9".parse().unwrap(), 7, 3);
        let decode = object(json!({ "kv_transfer_params": params }));
        let expected = Half::Decode {
            host: "127.0.0.1".into(),
            port: 9,
            lease: 7,
        };
        assert_eq!(half(&decode, Role::Both, || 0), Ok(expected));
        let sglang =
            object(json!({"bootstrap_host": "h", "bootstrap_port": 8998, "bootstrap_room": 5}));
        assert_eq!(half(&sglang, Role::Both, || 0), Ok(Half::Whole));
        assert_eq!(
            half(&sglang, Role::Prefill, || 0),
            Ok(Half::Prefill {
                lease: 5,
                vllm: false
            })
        );
        let expected = Half::Decode {
            host: "h".into(),
            port: 8998,
            lease: 5,
        };
        assert_eq!(half(&sglang, Role::Decode, || 0), Ok(expected));
        assert_eq!(
            half(&object(json!({})), Role::Decode, || 0),
            Ok(Half::Whole)
        );
    }

    #[test]
    fn a_decode_half_without_its_source_is_refused() {
        for body in [
            json!({"kv_transfer_params": {"do_remote_prefill": true, "remote_port": 1, "remote_request_id": "1"}}),
            json!({"kv_transfer_params": {"do_remote_prefill": true, "remote_host": "h", "remote_port": 70000, "remote_request_id": "1"}}),
            json!({"kv_transfer_params": {"do_remote_prefill": true, "remote_host": "h", "remote_port": 1}}),
            json!({"bootstrap_host": "h", "bootstrap_room": 1}),
        ] {
            assert!(
                half(&object(body.clone()), Role::Decode, || 0).is_err(),
                "{body}"
            );
        }
        let room = object(json!({"bootstrap_room": -1}));
        assert!(half(&room, Role::Prefill, || 0).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_pull_waits_for_its_lease_then_takes_it_once() {
        let leases = std::sync::Arc::new(Leases::new(Duration::from_secs(5)));
        let waiting = tokio::spawn({
            let leases = std::sync::Arc::clone(&leases);
            async move { leases.take(3).await }
        });
        tokio::task::yield_now().await;
        leases.ready(3, 12);
        assert_eq!(waiting.await.unwrap(), Some(12));
        assert_eq!(leases.try_take(3), None);
        // A lease nobody makes ready: the pull gives up at the lease's time.
        assert_eq!(leases.take(4).await, None);
        // One past its time is not taken.
        leases.ready(5, 1);
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(leases.take(5).await, None);
    }
}
