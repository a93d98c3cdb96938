//! `disaggregation`: a request's prefill half on the prefill pool and its
//! decode half on the decode pool, end to end through real `magpie
//! engine`s playing each role, by vLLM's protocol (over HTTP/1.1) and
//! SGLang's (over HTTP/2); a conversation's next turn skipped straight to
//! its decode engine when that one lacks little of it; and the faults: a
//! dead prefill backend costs one connect and the next takes it, no prefill
//! backend (dead or silent past `prefill_timeout`) means the decode engine
//! prefills alone, a dead decode backend is a clean 502.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use magpie_lab::engine::transfer::Role as EngineRole;
use magpie_lab::engine::{self, EngineConfig};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::support::*;

/// A fast `magpie engine` named `name` playing `role`.
async fn engine(name: &str, role: EngineRole, stop: &CancellationToken) -> SocketAddr {
    let config = EngineConfig {
        name: name.to_string(),
        role,
        prefill_us_per_token: 5.0,
        decode_ms_per_token: 0.2,
        kv_transfer_us_per_token: 1.0,
        ..EngineConfig::default()
    };
    let any: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let engine = engine::start(config, any, stop.clone())
        .await
        .expect("the engine starts");
    engine.addr()
}

/// A config with `section` and these backends (name, address, extra fields).
fn yaml(section: &str, backends: &[(&str, SocketAddr, String)]) -> String {
    let mut yaml = format!(
        "mode: http\nlisten: 127.0.0.1:0\nadmin: 127.0.0.1:0\nkey:\n  from: header\n  header: x-session-id\nhealth:\n  interval: 1h\n{section}backends:\n"
    );
    for (name, addr, extra) in backends {
        yaml.push_str(&format!("  - {{name: {name}, addr: \"{addr}\"{extra}}}\n"));
    }
    yaml
}

/// A conversation's request: a long first turn (`history` empty) or the
/// next one.
fn chat(session: &str, history: &[Value], stream: bool) -> Request<Full<Bytes>> {
    let mut messages = vec![json!({"role": "system", "content": "You are terse. ".repeat(40)})];
    messages.extend(history.iter().cloned());
    let mut body = json!({"model": "magpie-sim", "messages": messages, "max_tokens": 4});
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    Request::post("http://magpie/v1/chat/completions")
        .header("host", "magpie")
        .header("content-type", "application/json")
        .header("x-session-id", session)
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a request")
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

/// The text of a whole (not streamed) chat answer.
fn answer_text(body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).expect("a JSON answer");
    v["choices"][0]["message"]["content"]
        .as_str()
        .expect("an answer's text")
        .to_string()
}

/// A value of `name` in an engine's `/metrics`.
async fn engine_metric(engine: SocketAddr, name: &str) -> f64 {
    let (status, text) = admin_get(engine, "/metrics").await;
    assert_eq!(status, 200);
    metric_sum(&text, name, &[])
}

/// magpie's count of requests served as `decision` says.
fn decisions(magpie: &Magpie, decision: &str) -> f64 {
    let label = format!("decision=\"{decision}\"");
    metric_sum(
        &magpie.probe.metrics(),
        "magpie_disaggregation_requests_total",
        &[&label],
    )
}

/// Waits until magpie has read the usage of `n` answers from `backend`.
async fn usage_read(magpie: &Magpie, backend: &str, n: f64) {
    let label = format!("backend=\"{backend}\"");
    until("the answer's usage to be read", || {
        let text = magpie.probe.metrics();
        metric_sum(&text, "magpie_backend_completion_tokens_total", &[&label]) >= n * 4.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllms_protocol_prefills_on_the_prefill_pool_and_skips_it_for_a_short_next_turn() {
    let stop = CancellationToken::new();
    let prefill = engine("p1", EngineRole::Prefill, &stop).await;
    let decode = engine("d1", EngineRole::Decode, &stop).await;
    let section = "disaggregation:\n  protocol: vllm\n  skip_below_tokens: 64\n";
    let backends = [
        ("p1", prefill, ", role: prefill".to_string()),
        ("d1", decode, ", role: decode".to_string()),
    ];
    let magpie = Magpie::start(&yaml(section, &backends)).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let first = vec![user(&"Tell me about magpies. ".repeat(60))];
    let (response, body) = client.send(chat("c1", &first, false)).await;
    assert_eq!(response.status(), 200, "{body:?}");
    let said = answer_text(&body);
    assert_eq!(decisions(&magpie, "split"), 1.0);
    assert!(engine_metric(prefill, "vllm:prompt_tokens_total").await > 300.0);
    let moved = engine_metric(decode, "magpie_engine:kv_received_tokens_total").await;
    assert!(
        moved > 300.0,
        "the decode engine pulled the prompt's KV: {moved}"
    );
    usage_read(&magpie, "d1", 1.0).await;

    // The next turn adds a few tokens to what d1 holds: it goes there alone,
    // streamed, and nothing moves.
    let mut next = first.clone();
    next.push(json!({"role": "assistant", "content": said}));
    next.push(user("And crows?"));
    let (response, body) = client.send(chat("c1", &next, true)).await;
    assert_eq!(response.status(), 200);
    assert!(String::from_utf8_lossy(&body).contains("data: [DONE]"));
    assert_eq!(decisions(&magpie, "decode_holds"), 1.0);
    let prefilled = engine_metric(prefill, "vllm:prompt_tokens_total").await;
    assert!(prefilled < 1.5 * engine_metric(decode, "vllm:prompt_tokens_total").await);
    assert_eq!(
        engine_metric(decode, "magpie_engine:kv_received_tokens_total").await,
        moved
    );

    // Another conversation is split again; its prefill half shows in /table
    // and the access log's fields.
    let (response, _) = client.send(chat("c2", &first, true)).await;
    assert_eq!(response.status(), 200);
    assert_eq!(decisions(&magpie, "split"), 2.0);
    let admin = magpie.admin.expect("admin is on");
    let (_, table) = admin_get(admin, "/table").await;
    let table: Value = serde_json::from_str(&table).expect("JSON");
    assert_eq!(table["backends"][0]["name"], "d1");
    assert_eq!(table["backends"][0]["role"], "decode");
    assert_eq!(table["disaggregation"]["protocol"], "vllm");
    assert_eq!(
        table["disaggregation"]["prefill"]["backends"][0]["name"],
        "p1"
    );
    let roles = magpie.probe.metrics();
    assert_eq!(
        metric_sum(
            &roles,
            "magpie_backend_role",
            &["backend=\"p1\"", "role=\"prefill\""]
        ),
        1.0
    );
    magpie.stop().await;
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglangs_protocol_sends_both_halves_at_once_over_http2() {
    let stop = CancellationToken::new();
    let prefill = engine("p1", EngineRole::Prefill, &stop).await;
    let decode = engine("d1", EngineRole::Decode, &stop).await;
    let section = "disaggregation:\n  protocol: sglang\n";
    let port = prefill.port();
    let backends = [
        (
            "p1",
            prefill,
            format!(", role: prefill, bootstrap_port: {port}"),
        ),
        ("d1", decode, ", role: decode".to_string()),
    ];
    let magpie = Magpie::start(&yaml(section, &backends)).await;
    let (mut sender, _conn) = h2_connect(magpie.addr).await;
    let first = vec![user(&"Tell me about jays. ".repeat(60))];
    for stream in [false, true] {
        let request = chat(if stream { "s2" } else { "s1" }, &first, stream);
        let response = within("an HTTP/2 answer", sender.send_request(request))
            .await
            .expect("an answer");
        assert_eq!(response.status(), 200);
        let body = response.into_body().collect().await.expect("a body");
        assert!(!body.to_bytes().is_empty());
    }
    assert_eq!(decisions(&magpie, "split"), 2.0);
    let moved = engine_metric(decode, "magpie_engine:kv_received_tokens_total").await;
    assert!(
        moved > 300.0,
        "the decode engine pulled the prompt's KV: {moved}"
    );
    magpie.stop().await;
    stop.cancel();
}

/// A backend that takes connections and never answers, and the task that
/// holds them (they close when it is dropped).
async fn silent() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let silent = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let addr = silent.local_addr().expect("its address");
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    (addr, held)
}

/// magpie's requests in flight at `backend`.
fn in_flight(magpie: &Magpie, backend: &str) -> f64 {
    let label = format!("backend=\"{backend}\"");
    metric_sum(
        &magpie.probe.metrics(),
        "magpie_backend_requests_in_flight",
        &[&label],
    )
}

/// Waits until `done` holds, checking every few milliseconds.
async fn until(what: &str, done: impl Fn() -> bool) {
    within(what, async {
        while !done() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// An address nothing listens on.
async fn dead() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    listener.local_addr().expect("its address")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_prefill_backend_costs_one_connect_and_the_next_prefills() {
    let stop = CancellationToken::new();
    let live = engine("p-live", EngineRole::Prefill, &stop).await;
    let decode = engine("d1", EngineRole::Decode, &stop).await;
    let section = "disaggregation:\n  protocol: vllm\n";
    let backends = [
        ("p-dead", dead().await, ", role: prefill".to_string()),
        ("p-live", live, ", role: prefill".to_string()),
        ("d1", decode, ", role: decode".to_string()),
    ];
    let magpie = Magpie::start(&yaml(section, &backends)).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let first = vec![user(&"Tell me about rooks. ".repeat(60))];
    for n in 0..6 {
        let (response, _) = client.send(chat(&format!("r{n}"), &first, false)).await;
        assert_eq!(response.status(), 200);
    }
    assert_eq!(decisions(&magpie, "split"), 6.0);
    let text = magpie.probe.metrics();
    let failed = metric_sum(
        &text,
        "magpie_backend_connect_failures_total",
        &["backend=\"p-dead\""],
    );
    assert!(failed >= 1.0, "{text}");
    magpie.stop().await;
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_prefill_backend_the_decode_backend_prefills_alone() {
    let stop = CancellationToken::new();
    let decode = engine("d1", EngineRole::Decode, &stop).await;
    // One prefill backend refuses connections, the other never answers.
    let (silent_addr, _held) = silent().await;
    let section = "disaggregation:\n  protocol: vllm\n  prefill_timeout: 300ms\n";
    let backends = [
        ("p-dead", dead().await, ", role: prefill".to_string()),
        ("p-silent", silent_addr, ", role: prefill".to_string()),
        ("d1", decode, ", role: decode".to_string()),
    ];
    let magpie = Magpie::start(&yaml(section, &backends)).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let first = vec![user(&"Tell me about choughs. ".repeat(60))];
    let (response, body) = client.send(chat("c1", &first, false)).await;
    assert_eq!(response.status(), 200, "{body:?}");
    assert!(!answer_text(&body).is_empty());
    assert_eq!(decisions(&magpie, "prefill_failed"), 1.0);
    let moved = engine_metric(decode, "magpie_engine:kv_received_tokens_total").await;
    assert_eq!(moved, 0.0, "nothing was prefilled elsewhere");
    let text = magpie.probe.metrics();
    let timeouts = metric_sum(
        &text,
        "magpie_backend_timeouts_total",
        &["backend=\"p-silent\""],
    );
    assert_eq!(timeouts, 1.0, "{text}");
    magpie.stop().await;
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_decode_backend_after_the_prefill_is_a_clean_502() {
    let stop = CancellationToken::new();
    let prefill = engine("p1", EngineRole::Prefill, &stop).await;
    let section = "disaggregation:\n  protocol: vllm\n";
    let backends = [
        ("p1", prefill, ", role: prefill".to_string()),
        ("d-dead", dead().await, ", role: decode".to_string()),
    ];
    let magpie = Magpie::start(&yaml(section, &backends)).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let first = vec![user(&"Tell me about ravens. ".repeat(60))];
    let (response, _) = client.send(chat("c1", &first, false)).await;
    assert_eq!(response.status(), 502);
    assert_eq!(decisions(&magpie, "split"), 1.0);
    magpie.stop().await;
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_half_waits_in_the_queue_for_a_prefill_backends_room() {
    let stop = CancellationToken::new();
    let decode = engine("d1", EngineRole::Decode, &stop).await;
    let (silent_addr, _held) = silent().await;
    let section = "queue:\n  max_inflight: 1\n  timeout: 300ms\ndisaggregation:\n  protocol: vllm\n  prefill_timeout: 5s\n";
    let backends = [
        ("p-silent", silent_addr, ", role: prefill".to_string()),
        ("d1", decode, ", role: decode".to_string()),
    ];
    let magpie = Magpie::start(&yaml(section, &backends)).await;
    let first = vec![user(&"Tell me about nutcrackers. ".repeat(60))];
    // The first request's prefill half takes p-silent's one slot, and waits.
    let addr = magpie.addr;
    let request = chat("c1", &first, false);
    let waiting = tokio::spawn(async move {
        let mut client = KeepAlive::connect(addr).await;
        client.start(request).await
    });
    until("the prefill half to take its slot", || {
        in_flight(&magpie, "p-silent") >= 1.0
    })
    .await;
    // The next one's prefill half waits in the queue for that slot; past
    // queue.timeout its decode engine prefills it.
    let mut client = KeepAlive::connect(magpie.addr).await;
    let (response, _) = client.send(chat("c2", &first, false)).await;
    assert_eq!(response.status(), 200);
    assert_eq!(decisions(&magpie, "prefill_failed"), 1.0);
    let text = magpie.probe.metrics();
    let refused = metric_sum(&text, "magpie_queue_refused_total", &["reason=\"timeout\""]);
    assert_eq!(refused, 1.0, "{text}");
    assert!(!waiting.is_finished());
    waiting.abort();
    magpie.stop().await;
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefill_halves_take_turns_at_a_prefill_backends_one_slot() {
    let stop = CancellationToken::new();
    let config = EngineConfig {
        name: "p1".to_string(),
        role: EngineRole::Prefill,
        prefill_us_per_token: 200.0,
        ..EngineConfig::default()
    };
    let any: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let prefill = engine::start(config, any, stop.clone())
        .await
        .expect("it starts")
        .addr();
    let decode = engine("d1", EngineRole::Decode, &stop).await;
    let section = "queue:\n  max_inflight: 1\n  timeout: 10s\ndisaggregation:\n  protocol: vllm\n";
    let backends = [
        (
            "p1",
            prefill,
            ", role: prefill, max_inflight: 1".to_string(),
        ),
        ("d1", decode, ", role: decode, max_inflight: 8".to_string()),
    ];
    let magpie = Magpie::start(&yaml(section, &backends)).await;
    let addr = magpie.addr;
    let mut chats = Vec::new();
    for n in 0..3 {
        let first = vec![user(&format!("Tell me about jackdaw {n}. ").repeat(60))];
        chats.push(tokio::spawn(async move {
            let mut client = KeepAlive::connect(addr).await;
            client
                .send(chat(&format!("j{n}"), &first, false))
                .await
                .0
                .status()
        }));
    }
    for chat in chats {
        assert_eq!(chat.await.expect("the chat"), 200);
    }
    assert_eq!(decisions(&magpie, "split"), 3.0);
    let text = magpie.probe.metrics();
    let waited = metric_sum(&text, "magpie_queue_admitted_total", &["how=\"waited\""]);
    assert!(waited >= 1.0, "{text}");
    magpie.stop().await;
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_binds_a_waiting_prefill_half_to_the_new_prefill_pool() {
    let stop = CancellationToken::new();
    let decode = engine("d1", EngineRole::Decode, &stop).await;
    let fresh = engine("p-new", EngineRole::Prefill, &stop).await;
    let (silent_addr, _held) = silent().await;
    let section = "reload:\n  watch: false\nqueue:\n  max_inflight: 1\n  timeout: 10s\ndisaggregation:\n  protocol: vllm\n  prefill_timeout: 8s\n";
    let mut backends = vec![
        ("p-silent", silent_addr, ", role: prefill".to_string()),
        ("d1", decode, ", role: decode, max_inflight: 8".to_string()),
    ];
    let file = TempFile::new("magpie.yaml", &yaml(section, &backends));
    let magpie = Magpie::start_file(&file.path).await;
    let first = vec![user(&"Tell me about treecreepers. ".repeat(60))];
    let addr = magpie.addr;
    let mut asked = Vec::new();
    for n in 0..2 {
        let request = chat(&format!("t{n}"), &first, false);
        asked.push(tokio::spawn(async move {
            let mut client = KeepAlive::connect(addr).await;
            client.send(request).await.0.status()
        }));
        // One holds p-silent's slot, the other waits in the queue for it.
        until("the request to take its place", || {
            in_flight(&magpie, "p-silent") >= 1.0 && magpie.probe.queued() >= n
        })
        .await;
    }
    // p-new joins the prefill pool: the waiting half is bound to it (not to
    // the decode pool), and prefills there.
    backends.push(("p-new", fresh, ", role: prefill".to_string()));
    std::fs::write(&file.path, yaml(section, &backends)).expect("written");
    let mut reloader = magpie.probe.reloader(file.path.clone());
    within("the reload", reloader.reload(true))
        .await
        .expect("the reload applies");
    until("the waiting request to be split", || {
        decisions(&magpie, "split") >= 1.0
    })
    .await;
    assert!(engine_metric(fresh, "vllm:prompt_tokens_total").await > 300.0);
    assert_eq!(magpie.probe.queued(), 0);
    for asked in asked {
        asked.abort();
    }
    magpie.stop().await;
    stop.cancel();
}

/// `magpie demo --mode disaggregated`'s engines and config (the shipped
/// file): a long first turn is split, its short next turn is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_runs_the_shipped_file_in_front_of_both_pools() {
    use magpie_lab::demo::disaggregated;
    let stop = CancellationToken::new();
    let engines = disaggregated::start_engines(&stop)
        .await
        .expect("the engines start");
    let any: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let yaml = disaggregated::shipped_yaml(any, any, &engines);
    let magpie = Magpie::start(&yaml).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let first = vec![user(&"Tell me about shrikes. ".repeat(60))];
    let (response, body) = client.send(chat("demo", &first, false)).await;
    assert_eq!(response.status(), 200);
    let decode = response.headers()["x-magpie-backend"]
        .to_str()
        .expect("a name")
        .to_string();
    assert!(decode.starts_with("decode-"), "{decode}");
    usage_read(&magpie, &decode, 1.0).await;
    let mut next = first.clone();
    next.push(json!({"role": "assistant", "content": answer_text(&body)}));
    next.push(user("And wrens?"));
    let (response, _) = client.send(chat("demo", &next, false)).await;
    assert_eq!(response.headers()["x-magpie-backend"], decode.as_str());
    assert_eq!(decisions(&magpie, "split"), 1.0);
    assert_eq!(decisions(&magpie, "decode_holds"), 1.0);
    magpie.stop().await;
    stop.cancel();
}
