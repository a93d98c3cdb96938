//! The read-only admin HTTP endpoint (default `127.0.0.1:9090`).
//!
//! | path | answer |
//! |---|---|
//! | `GET /metrics` | Prometheus text format ([`crate::metrics`]) |
//! | `GET /healthz` | 200 while the process runs |
//! | `GET /readyz` | 200 when a table is published and at least one backend is up, else 503; 503 from the first SIGTERM on (draining) |
//! | `GET /table` | JSON: version, fingerprint, algorithm, and every backend's name, address, weight, zone, up, active and share |
//! | `GET /route?key=K` | JSON: the candidates for `K` in order, and the one a connection would be sent to now |
//! | `GET /route?addr=A` | the same for a client at address `A` (in header and body modes: its fallback key) |
//! | `GET /route?key=K&group=G` | with `key.group`: the candidates of group `G` (a header group's value, or a body group's hash `0x…`), the session's pin and its rank among them; without `group=`, the group of the key's last request |
//!
//! No endpoint changes state. `/route` takes the key as text, the way
//! `magpie lookup` does: a header value in header mode, an IP in `source_ip`
//! mode, `ip:port` in `source_addr` mode.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus::Registry;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::key::group::GroupBy;
use crate::recent::Last;
use crate::route::Route;
use crate::snapshot::{Shared, Snapshot};
use crate::stats::Exhausted;

type Body = Full<Bytes>;

/// How long a client may take to send a request head.
const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves the admin endpoint on `listener` until `shutdown`.
pub async fn serve(listener: Arc<TcpListener>, shared: Arc<Shared>, shutdown: CancellationToken) {
    let registry = Arc::new(crate::metrics::registry(Arc::clone(&shared)));
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    crate::listener::accept_failed(&e, &shared.stats, Exhausted::AdminAccept).await;
                    continue;
                }
            },
        };
        let shared = Arc::clone(&shared);
        let registry = Arc::clone(&registry);
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let response = answer(&req, &shared, &registry);
                async move { Ok::<_, Infallible>(response) }
            });
            // A client that never finishes its request head does not hold a
            // task forever.
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                result = conn => if let Err(e) = result {
                    debug!(%peer, error = %e, "admin connection ended with an error");
                },
                _ = shutdown.cancelled() => {}
            }
        });
    }
}

/// Answers one request. Pure apart from reading shared state.
pub fn answer<B>(req: &Request<B>, shared: &Shared, registry: &Registry) -> Response<Body> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and HEAD: the admin endpoint is read-only\n",
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let snapshot = shared.snapshot.load_full();
    match req.uri().path() {
        "/metrics" => {
            let mut r = text(StatusCode::OK, crate::metrics::render(registry));
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if shared.is_draining() => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: draining (shutting down)\n",
        ),
        "/readyz" => {
            let up = snapshot
                .backends
                .iter()
                .filter(|b| b.weight > 0 && b.live.health.is_up())
                .count();
            if up > 0 {
                text(
                    StatusCode::OK,
                    format!(
                        "ready: table version {}, {up} backends up\n",
                        snapshot.version
                    ),
                )
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not ready: no backend is up\n",
                )
            }
        }
        "/table" => json_response(StatusCode::OK, table_json(&snapshot)),
        "/route" => route_answer(req.uri().query().unwrap_or(""), &snapshot, shared),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; try /metrics, /healthz, /readyz, /table or /route?key=K\n",
        ),
    }
}

pub fn table_json(snapshot: &Snapshot) -> serde_json::Value {
    let backends: Vec<_> = snapshot
        .backends
        .iter()
        .zip(&snapshot.shares)
        .map(|(b, share)| {
            json!({
                "name": b.name,
                "addr": b.addr.to_string(),
                "weight": b.weight,
                "zone": b.zone,
                "up": b.live.health.is_up(),
                "active": b.live.load.active(),
                "share": share,
            })
        })
        .collect();
    json!({
        "version": snapshot.version,
        "fingerprint": snapshot.fingerprint,
        "algorithm": snapshot.table.algorithm().as_str(),
        "bounded_load": snapshot.config.placement.bounded_load,
        "backends": backends,
    })
}

/// `/route?key=K` or `?addr=A` (and `&group=G` with `key.group`).
fn route_answer(query: &str, snapshot: &Snapshot, shared: &Shared) -> Response<Body> {
    let bad = |e: String| json_response(StatusCode::BAD_REQUEST, json!({ "error": e }));
    // ?key=K as the key mode reads it; ?addr=A as a client at A (in header
    // and body modes: the fallback key).
    let key_config = &snapshot.config.key;
    let (key, key_text) = match (query_param(query, "key"), query_param(query, "addr")) {
        (Some(text), None) => (key_config.key_of_text(&text), text),
        (None, Some(text)) => (key_config.key_of_address(&text), text),
        _ => return bad("give one of ?key=K or ?addr=IP[:PORT]".to_string()),
    };
    let key = match key {
        Ok(key) => key,
        Err(e) => return bad(e.to_string()),
    };
    let last = shared.recent.last(key);
    let pin = shared.sessions().and_then(|s| s.pins.peek(key));
    let Some(by) = &snapshot.config.group else {
        let mut answer = route_json(snapshot, &key_text, key, key);
        answer["pinned"] = json!(pin.as_deref());
        answer["last"] = last_json(last);
        return json_response(StatusCode::OK, answer);
    };
    let given = query_param(query, "group");
    let group = match &given {
        Some(text) => match group_of_text(by, text) {
            Ok(g) => Some((g, "query")),
            Err(e) => return bad(e),
        },
        None => last
            .as_ref()
            .and_then(|l| l.group)
            .map(|g| (g, "last_request")),
    };
    let table_key = group.map_or(key, |(g, _)| g);
    let mut answer = route_json(snapshot, &key_text, key, table_key);
    let pin_rank = pin.as_deref().and_then(|name| {
        let position = snapshot.candidates(table_key).position(|b| b.name == name);
        position.filter(|_| group.is_some()).map(|i| i + 1)
    });
    answer["pinned"] = json!(pin.as_deref());
    answer["last"] = last_json(last);
    answer["session"] = json!({
        "key": key_text,
        "hash": format!("{key:#018x}"),
        "pinned": pin.as_deref(),
    });
    answer["group"] = json!({
        "setting": by.describe(),
        "given": given,
        "hash": group.map(|(g, _)| format!("{g:#018x}")),
        "from": group.map(|(_, from)| from),
        "pin_rank": pin_rank,
    });
    answer["table_key"] = json!(if group.is_some() { "group" } else { "session" });
    json_response(StatusCode::OK, answer)
}

/// A group written as text: a header group's value, or the hash of a body
/// group (`0x` and hex digits, as `/route` shows it).
fn group_of_text(by: &GroupBy, text: &str) -> Result<u64, String> {
    if let GroupBy::Header(_) = by {
        return Ok(crate::key::text_key(text.as_bytes()));
    }
    text.trim()
        .strip_prefix("0x")
        .filter(|hex| !hex.is_empty() && hex.len() <= 16)
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .ok_or_else(|| {
            format!(
                "key.group is {}: give ?group= as the group's hash (0x and up to 16 hex digits, as /route shows it)",
                by.describe()
            )
        })
}

/// The route of session key `key` whose table is looked up by `table_key`
/// (the same key without a group).
pub fn route_json(
    snapshot: &Snapshot,
    key_text: &str,
    key: u64,
    table_key: u64,
) -> serde_json::Value {
    let chosen = Route::preview(snapshot, table_key)
        .first()
        .map(|b| b.name.clone());
    let candidates: Vec<_> = snapshot
        .candidates(table_key)
        .map(|b| {
            json!({
                "name": b.name,
                "addr": b.addr.to_string(),
                "up": b.live.health.is_up(),
                "active": b.live.load.active(),
                "chosen": chosen.as_deref() == Some(b.name.as_str()),
            })
        })
        .collect();
    json!({
        "key": key_text,
        "hash": format!("{key:#018x}"),
        "version": snapshot.version,
        "chosen": chosen,
        "candidates": candidates,
    })
}

/// Where the key's last request (or connection) went and why, if this
/// magpie remembers it.
fn last_json(last: Option<Last>) -> serde_json::Value {
    match last {
        None => serde_json::Value::Null,
        Some(l) => json!({
            "backend": l.backend,
            "how": l.how.as_str(),
            "seconds_ago": l.age.as_secs_f64(),
            "stays_after_spill": l.spilled,
            "prompt_tokens": l.prompt_tokens,
        }),
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn json_response(status: StatusCode, value: serde_json::Value) -> Response<Body> {
    let mut body = serde_json::to_vec_pretty(&value).unwrap_or_default();
    body.push(b'\n');
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// The decoded value of `name` in a query string (`+` is a space, `%XX` a byte).
fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(k) == name).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn a_stalled_request_head_is_dropped() {
        let config = crate::config::Config::parse(
            std::path::Path::new("t.yaml"),
            "listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
        )
        .unwrap();
        let snapshot = Snapshot::build(Arc::new(config), 1, &Default::default()).unwrap();
        let shared = Arc::new(Shared::new(snapshot));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        tokio::spawn(serve(Arc::new(listener), shared, stop.clone()));
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\n")
            .await
            .unwrap();
        let started = tokio::time::Instant::now();
        let mut rest = Vec::new();
        // hyper answers a timed-out head with 408 or just closes; either way it ends.
        if let Err(e) = stream.read_to_end(&mut rest).await {
            eprintln!("the stalled connection ended with {e}");
        }
        assert!(
            started.elapsed() >= HEADER_READ_TIMEOUT,
            "{:?}",
            started.elapsed()
        );
        assert!(!String::from_utf8_lossy(&rest).contains("200 OK"));
        stop.cancel();
    }

    #[test]
    fn query_decoding() {
        assert_eq!(
            query_param("key=a%20b+c&x=1", "key").as_deref(),
            Some("a b c")
        );
        assert_eq!(query_param("x=1&key=%zz", "key").as_deref(), Some("%zz"));
        assert_eq!(query_param("x=1", "key"), None);
        assert_eq!(query_param("key=100%25", "key").as_deref(), Some("100%"));
        assert_eq!(query_param("key=%4", "key").as_deref(), Some("%4"));
    }
}
