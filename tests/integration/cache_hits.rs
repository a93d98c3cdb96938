//! Realized cache hits (mode http): the token counts engines report in each
//! answer's `usage`, JSON or streamed, are counted per backend exactly, and
//! a request that found less cached than its key's previous prompt is a
//! miss with a cause.

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use magpie_core::key;
use std::sync::atomic::Ordering;
use tokio::io::AsyncWriteExt;

use crate::support::*;

/// One chat turn of `session` whose answer reports `prompt` and `cached`
/// tokens; returns the backend that served it.
async fn turn(
    client: &mut KeepAlive,
    session: &str,
    prompt: u64,
    cached: u64,
    stream: bool,
) -> String {
    let mut builder = Request::post("/v1/chat/completions")
        .header("host", "magpie")
        .header("content-type", "application/json")
        .header("x-session-id", session)
        .header("x-test-prompt", prompt.to_string())
        .header("x-test-cached", cached.to_string());
    if stream {
        builder = builder.header("x-test-stream", "1");
    }
    let body = Full::new(Bytes::from_static(br#"{"model":"m","messages":[]}"#));
    let (response, body) = client.send(builder.body(body).expect("a request")).await;
    assert_eq!(response.status(), 200, "{body:?}");
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.contains("cached_tokens"),
        "the answer passed unchanged: {text}"
    );
    response
        .headers()
        .get("x-magpie-backend")
        .and_then(|v| v.to_str().ok())
        .expect("expose_backend names it")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_counts_match_the_engines_and_misses_have_causes() {
    let backends = HyperBackends::start(&["a", "b"]).await;
    let settings = format!("mode: http\n{SESSION_KEY}http:\n  expose_backend: true\n");
    let magpie = Magpie::start(&config_yaml_with_admin(
        "127.0.0.1:0",
        &settings,
        &backends.pairs(),
    ))
    .await;
    let admin = magpie.admin.expect("admin is on");
    let home = magpie.primary(key::text_key(b"s1"));
    let mut client = KeepAlive::connect(magpie.addr).await;

    // A first turn, then one that found the whole previous prompt cached.
    assert_eq!(turn(&mut client, "s1", 1000, 0, false).await, home);
    assert_eq!(turn(&mut client, "s1", 2000, 1000, true).await, home);
    // Same backend, most of it gone: the engine evicted it.
    assert_eq!(turn(&mut client, "s1", 3000, 100, true).await, home);
    // Its backend is down: the next turn goes elsewhere and misses.
    magpie.backend(&home).set_up(false);
    let away = turn(&mut client, "s1", 4000, 0, false).await;
    assert_ne!(away, home);
    // Back up: the key goes home, and misses again for the same reason.
    magpie.backend(&home).set_up(true);
    assert_eq!(turn(&mut client, "s1", 5000, 3000, true).await, home);

    let misses = |cause: &str| {
        let cause = format!("cause=\"{cause}\"");
        magpie.metric("magpie_cache_misses_total", &[&cause])
    };
    assert_eq!(misses("evicted"), 1);
    assert_eq!(misses("backend_down"), 2);
    assert_eq!(misses("spill"), 0);

    let (_, metrics) = admin_get(admin, "/metrics").await;
    for b in &backends.list {
        let label = format!("backend=\"{}\"", b.name);
        let exported = |name: &str| metric_sum(&metrics, name, &[label.as_str()]) as u64;
        let prompt = b.prompt_reported.load(Ordering::SeqCst);
        let cached = b.cached_reported.load(Ordering::SeqCst);
        assert!(prompt > 0, "{} served no chat", b.name);
        assert_eq!(
            exported("magpie_backend_prompt_tokens_total"),
            prompt,
            "{}",
            b.name
        );
        assert_eq!(
            exported("magpie_backend_cached_prompt_tokens_total"),
            cached,
            "{}",
            b.name
        );
        assert_eq!(
            exported("magpie_backend_completion_tokens_total"),
            3 * b.served.load(Ordering::SeqCst)
        );
    }
    let misses = |cause: &str| {
        let label = format!("cause=\"{cause}\"");
        metric_sum(&metrics, "magpie_cache_misses_total", &[label.as_str()])
    };
    assert_eq!(
        (misses("evicted"), misses("backend_down")),
        (1.0, 2.0),
        "{metrics}"
    );

    let (_, route) = admin_get(admin, "/route?key=s1").await;
    assert!(route.contains("\"prompt_tokens\": 5000"), "{route}");
    magpie.stop().await;
}

/// A chat turn of `session` through magpie at `to` whose answer streams
/// for long, from a raw client that leaves by closing the returned stream;
/// its answer's head names `at`.
async fn long_answer(to: std::net::SocketAddr, session: &str, at: &str) -> tokio::net::TcpStream {
    let body = r#"{"model":"m","stream":true,"max_tokens":8000,"messages":[{"role":"user","content":"go"}]}"#;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: magpie\r\nx-session-id: {session}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = connect(to).await;
    stream.write_all(head.as_bytes()).await.expect("send");
    let mut got = Vec::new();
    let ended = |b: &[u8]| find(b, b"\r\n\r\n");
    within(
        "the long answer's head",
        read_until(&mut stream, &mut got, ended),
    )
    .await;
    let text = String::from_utf8_lossy(&got).to_lowercase();
    assert!(text.contains(&format!("x-magpie-backend: {at}")), "{text}");
    stream
}

/// Under a `queue` with sessions, in front of two real `magpie engine`s
/// whose caches hold 1,024 tokens each: a later turn whose engine computed
/// that much since its conversation's last answer is placed as a first
/// request is (here away from a busy engine), counted as `evicted`, and its
/// pin follows; before that, the same turn stays at its busy engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_whose_engine_evicted_its_conversation_is_placed_anew_and_its_pin_follows() {
    let stop = tokio_util::sync::CancellationToken::new();
    let mut engines = Vec::new();
    for name in ["a", "b"] {
        let config = magpie_lab::engine::EngineConfig {
            name: name.to_string(),
            cache_blocks: 64,
            prefill_us_per_token: 1.0,
            decode_ms_per_token: 5.0,
            default_max_tokens: 4,
            ..magpie_lab::engine::EngineConfig::default()
        };
        let any = "127.0.0.1:0".parse().expect("an address");
        let engine = magpie_lab::engine::start(config, any, stop.clone())
            .await
            .expect("the engine starts");
        engines.push((name.to_string(), engine.addr()));
    }
    let settings = format!(
        "mode: http\n{SESSION_KEY}sessions:\n  ttl: 10m\nqueue:\n  max_inflight: 8\n  timeout: 30s\n\
         health:\n  load:\n    preset: vllm\n    interval: 100ms\n    timeout: 80ms\n\
         http:\n  expose_backend: true\n"
    );
    let magpie = Magpie::start(&config_yaml_with_admin("127.0.0.1:0", &settings, &engines)).await;
    let admin = magpie.admin.expect("admin is on");
    until_metrics(admin, "both caches' sizes", |t| {
        metric_sum(t, "magpie_backend_engine_kv_capacity_tokens", &[]) == 2048.0
    })
    .await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let chat = |session: &str, text: &str| {
        let body = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{text}"}}]}}"#);
        Request::post("/v1/chat/completions")
            .header("host", "magpie")
            .header("content-type", "application/json")
            .header("x-session-id", session)
            .body(Full::new(Bytes::from(body)))
            .expect("a request")
    };
    let served = |response: &hyper::Response<()>| {
        let name = response.headers().get("x-magpie-backend");
        name.and_then(|v| v.to_str().ok())
            .expect("named")
            .to_string()
    };
    let (response, _) = client.send(chat("s1", &"q".repeat(800))).await;
    let home = served(&response);
    let of_home = |prefix: &str| {
        let sessions = magpie.sessions_of(&home, prefix, 1);
        sessions
            .into_iter()
            .next()
            .expect("a session of that backend")
    };
    // A long answer streams at the home: it is busier than the other.
    let held = long_answer(magpie.addr, &of_home("busy"), &home).await;
    // Its cache holds the conversation: the turn stays.
    let (response, _) = client.send(chat("s1", &"q".repeat(1000))).await;
    assert_eq!(served(&response), home);
    drop(held);
    within("the long answer's end at its backend", async {
        while magpie.backend_metric("magpie_backend_requests_in_flight", &home, &[]) > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    // Two others' first requests, 1,400 tokens, computed there since.
    for session in ["fill-a", "fill-b"].map(of_home) {
        let (response, _) = client.send(chat(&session, &"f".repeat(2800))).await;
        assert_eq!(served(&response), home);
    }
    let held = long_answer(magpie.addr, &of_home("busier"), &home).await;
    let (response, _) = client.send(chat("s1", &"q".repeat(1200))).await;
    let away = served(&response);
    assert_ne!(away, home, "its cache is gone: placed where it costs least");
    assert_eq!(
        magpie.metric("magpie_requests_routed_total", &["how=\"evicted\""]),
        1
    );
    let misses = |cause: &str| {
        let cause = format!("cause=\"{cause}\"");
        magpie.metric("magpie_cache_misses_total", &[&cause])
    };
    assert_eq!((misses("evicted"), misses("pin_expired")), (1, 0));
    // The pin followed: the next turn stays where its cache now is.
    let (response, _) = client.send(chat("s1", &"q".repeat(1400))).await;
    assert_eq!(served(&response), away);
    drop(held);
    magpie.stop().await;
    stop.cancel();
}
