//! llama.cpp as a backend through real sockets: fake engines that serve
//! `llama-server`'s own `/metrics` text and answers, as it wrote them
//! (tests/fixtures/llamacpp), magpie in mode http in front. The
//! `llamacpp` preset reads its queue (requests deferred: no slot free) and
//! what it is processing, and sees no KV cache; its answers' `usage`, or in
//! a stream its `timings`, give the realized hits.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use magpie_core::key::text_key;

use crate::engine_load::promtool_accepts;
use crate::support::*;

const METRICS: &str = include_str!("../fixtures/llamacpp/metrics.txt");
const CHAT: &str = include_str!("../fixtures/llamacpp/chat.json");
const STREAM: &str = include_str!("../fixtures/llamacpp/chat-stream.txt");
const PROPS: &str = include_str!("../fixtures/llamacpp/props.json");

/// llama-server's metrics with `deferred` requests waiting for a slot and
/// `processing` in slots.
fn metrics(deferred: u32, processing: u32) -> Metrics {
    let text = (METRICS.replace(
        "llamacpp:requests_deferred 0",
        &format!("llamacpp:requests_deferred {deferred}"),
    ))
    .replace(
        "llamacpp:requests_processing 0",
        &format!("llamacpp:requests_processing {processing}"),
    );
    Metrics::Text(text)
}

async fn start(engines: &FakeEngines) -> (Magpie, SocketAddr) {
    let settings = format!(
        "mode: http\n{SESSION_KEY}http:\n  expose_backend: true\nhealth:\n  load:\n    preset: llamacpp\n    interval: 100ms\n    timeout: 50ms\n    max_waiting: 8\n"
    );
    let yaml = config_yaml_with_admin("127.0.0.1:0", &settings, &engines.pairs());
    let magpie = Magpie::start(&yaml).await;
    let admin = magpie.admin.expect("admin is on");
    (magpie, admin)
}

fn gauge(text: &str, name: &str, backend: &str) -> f64 {
    metric_sum(text, name, &[&format!("backend=\"{backend}\"")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_preset_reads_its_queue_and_keeps_new_keys_off_a_full_engine() {
    let engines = FakeEngines::start(&["a", "b", "c"]).await;
    for e in &engines.list {
        e.set(metrics(0, 1));
    }
    let (magpie, admin) = start(&engines).await;
    let text = until_metrics(admin, "a scrape of every engine", |t| {
        ["a", "b", "c"]
            .iter()
            .all(|b| gauge(t, "magpie_backend_engine_running", b) == 1.0)
    })
    .await;
    promtool_accepts(&text);
    // It reports nothing of its KV cache: no usage, no size.
    assert!(
        !text.contains("magpie_backend_engine_kv_usage{backend=\"a\""),
        "{text}"
    );
    assert!(!text.contains("magpie_backend_engine_kv_capacity_tokens{backend=\"a\""));
    // Nothing deferred, no `/props` (404): its slots are not known, and
    // its queue is read all the same.
    assert!(!text.contains("magpie_backend_engine_slots{"), "{text}");

    // Ten requests deferred (over max_waiting: 8): new keys go elsewhere.
    // Two processing while some wait: the engine runs two at once.
    engines.get("a").set(metrics(10, 2));
    let text = until_metrics(admin, "a's 10 deferred", |t| {
        gauge(t, "magpie_backend_engine_waiting", "a") == 10.0
    })
    .await;
    assert_eq!(gauge(&text, "magpie_backend_engine_slots", "a"), 2.0);
    assert!(!text.contains("magpie_backend_engine_slots{backend=\"b\""));
    let mut client = KeepAlive::connect(magpie.addr).await;
    let new: Vec<String> = (0..)
        .map(|i| format!("new-{i}"))
        .filter(|k| magpie.primary(text_key(k.as_bytes())) == "a")
        .take(5)
        .collect();
    for k in &new {
        let second = magpie.candidates(text_key(k.as_bytes()))[1].clone();
        assert_eq!(client.get_session(k).await, second, "{k} is a new key");
    }
    let full = ["backend=\"a\"", "reason=\"engine_full\""];
    assert_eq!(magpie.metric("magpie_backend_spills_total", &full), 5);
    magpie.stop().await;
}

/// A chat request, streamed or not; returns the backend that answered.
async fn chat(client: &mut KeepAlive, session: &str, stream: bool) -> String {
    let body = format!(r#"{{"model":"m","messages":[],"stream":{stream}}}"#);
    let request = Request::post("/v1/chat/completions")
        .header("host", "magpie")
        .header("content-type", "application/json")
        .header("x-session-id", session)
        .body(Full::new(Bytes::from(body)))
        .expect("a request");
    let (response, body) = client.send(request).await;
    assert_eq!(response.status(), 200, "{body:?}");
    let expected = if stream { STREAM } else { CHAT };
    assert_eq!(
        &body[..],
        expected.as_bytes(),
        "the answer passed unchanged"
    );
    let backend = response.headers().get("x-magpie-backend");
    backend
        .and_then(|v| v.to_str().ok())
        .expect("named")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realized_hits_come_from_its_usage_and_from_a_streams_timings() {
    let engines = FakeEngines::start(&["a", "b"]).await;
    for e in &engines.list {
        e.set(metrics(0, 0));
        e.answer_with(
            ("text/event-stream", STREAM.to_string()),
            ("application/json", CHAT.to_string()),
        );
    }
    let (magpie, admin) = start(&engines).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    // A whole answer (usage: 281 prompt tokens, none cached), then a
    // stream (no usage; timings: 280 of 281 cached), same conversation.
    let home = chat(&mut client, "s1", false).await;
    assert_eq!(chat(&mut client, "s1", true).await, home);
    let text = until_metrics(admin, "both answers counted", |t| {
        gauge(t, "magpie_backend_completion_tokens_total", &home) == 8.0
    })
    .await;
    let count = |name: &str| gauge(&text, name, &home);
    assert_eq!(count("magpie_backend_prompt_tokens_total"), 562.0, "{text}");
    assert_eq!(count("magpie_backend_cached_prompt_tokens_total"), 280.0);
    magpie.stop().await;
}

/// Waits until `n` requests are held at `engine`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_request_goes_where_the_engine_has_a_slot_free() {
    let engines = FakeEngines::start(&["a", "b"]).await;
    // a runs two requests at once (`total_slots` in its `/props`); b does
    // not tell.
    engines.get("a").set_props(PROPS);
    for e in &engines.list {
        e.set(metrics(0, 0));
    }
    let settings = format!(
        "mode: http\n{SESSION_KEY}sessions:\n  ttl: 10m\nqueue:\n  max_inflight: 8\nhttp:\n  expose_backend: true\nhealth:\n  load:\n    preset: llamacpp\n    interval: 100ms\n    timeout: 50ms\n"
    );
    let yaml = config_yaml_with_admin("127.0.0.1:0", &settings, &engines.pairs());
    let magpie = Magpie::start(&yaml).await;
    let admin = magpie.admin.expect("admin is on");
    until_metrics(admin, "a's slots learned", |t| {
        gauge(t, "magpie_backend_engine_slots", "a") == 2.0
    })
    .await;
    let keys: Vec<String> = (0..)
        .map(|i| format!("conversation-{i}"))
        .filter(|k| magpie.primary(text_key(k.as_bytes())) == "a")
        .take(4)
        .collect();
    // The first two go to a, their table's first, and are held there.
    let mut held = Vec::new();
    for key in &keys[..2] {
        let mut holder = KeepAlive::connect(magpie.addr).await;
        let request = get("/held")
            .header("x-session-id", key)
            .body(Full::default())
            .expect("a request");
        held.push(tokio::spawn(async move { holder.served_by(request).await }));
        engines.get("a").until_held(held.len() as u64).await;
    }
    // a's two slots are taken: the next conversation goes where one is free.
    let mut client = KeepAlive::connect(magpie.addr).await;
    assert_eq!(client.get_session(&keys[2]).await, "b");
    engines.get("a").release(2);
    for held in held {
        assert_eq!(held.await.expect("a held request"), "a");
    }
    // Its slots free again, a takes the next.
    assert_eq!(client.get_session(&keys[3]).await, "a");
    magpie.stop().await;
}
