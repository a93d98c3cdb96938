//! The simulated engine through a real socket on 127.0.0.1:0.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::*;
use tokio::sync::mpsc;

/// Fast enough for tests: no prefill time, 1 ms decode steps.
fn quick(name: &str) -> EngineConfig {
    EngineConfig {
        name: name.into(),
        prefill_us_per_token: 0.0,
        decode_ms_per_token: 1.0,
        default_max_tokens: 8,
        ..EngineConfig::default()
    }
}

async fn engine(config: EngineConfig) -> (Engine, CancellationToken) {
    let stop = CancellationToken::new();
    let engine = start(config, "127.0.0.1:0".parse().unwrap(), stop.clone())
        .await
        .unwrap();
    (engine, stop)
}

/// One request on a fresh connection: status, x-engine, body.
async fn send(addr: SocketAddr, method: &str, path: &str, body: Bytes) -> (u16, String, String) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "engine")
        .header("content-type", "application/json")
        .body(Full::new(body))
        .unwrap();
    let response = sender.send_request(req).await.unwrap();
    let status = response.status().as_u16();
    let engine = response
        .headers()
        .get(ENGINE_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, engine, String::from_utf8_lossy(&body).into_owned())
}

async fn chat(addr: SocketAddr, request: &Value) -> Value {
    let (status, engine, body) = send(
        addr,
        "POST",
        "/v1/chat/completions",
        Bytes::from(request.to_string()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(engine, "r1");
    serde_json::from_str(&body).unwrap()
}

#[tokio::test]
async fn the_second_turn_finds_the_first_in_the_cache() {
    let (engine, stop) = engine(quick("r1")).await;
    let system = "You are a careful assistant. ".repeat(20);
    let mut messages = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": "What is a consistent hash?"}),
    ];
    let first = chat(engine.addr(), &json!({"model": "m", "messages": messages})).await;
    let prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(first["usage"]["completion_tokens"], 8);
    let answer = first["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(answer.len(), 8 * prompt::BYTES_PER_TOKEN);
    messages.push(json!({"role": "assistant", "content": answer}));
    messages.push(json!({"role": "user", "content": "And a bounded load?"}));
    let second = chat(
        engine.addr(),
        &json!({"model": "m", "messages": messages, "max_tokens": 3}),
    )
    .await;
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let whole_blocks = prompt / 16 * 16;
    assert!(whole_blocks > 0);
    // The answer's blocks were cached too: more than the first prompt's.
    assert!(
        cached > whole_blocks,
        "{cached} cached, first prompt {prompt}"
    );
    assert_eq!(cached % 16, 0);
    assert_eq!(second["usage"]["completion_tokens"], 3);
    let counts = engine.counts();
    assert_eq!(counts.finished, 2);
    assert_eq!(counts.cached_tokens, cached);
    assert_eq!(counts.generation_tokens, 11);
    stop.cancel();
}

#[tokio::test]
async fn a_stream_sends_a_token_per_event_then_usage_and_done() {
    let (engine, stop) = engine(quick("r1")).await;
    let request = json!({
        "messages": [{"role": "user", "content": "hi"}],
        "stream": true, "max_tokens": 5,
        "stream_options": {"include_usage": true},
    });
    let (status, name, body) = send(
        engine.addr(),
        "POST",
        "/v1/chat/completions",
        Bytes::from(request.to_string()),
    )
    .await;
    assert_eq!((status, name.as_str()), (200, "r1"));
    let events: Vec<&str> = body
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap())
        .collect();
    assert_eq!(events.len(), 5 + 3, "{body}");
    assert_eq!(*events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..7]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks[..5]
        .iter()
        .map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(text.len(), 20);
    assert_eq!(chunks[5]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[6]["choices"], json!([]));
    assert_eq!(chunks[6]["usage"]["completion_tokens"], 5);
    stop.cancel();
}

#[tokio::test]
async fn bad_requests_get_openai_errors() {
    let mut config = quick("r1");
    config.max_body_bytes = 4096;
    let (engine, stop) = engine(config).await;
    let addr = engine.addr();
    let cases: [(&str, &str, Bytes, u16); 6] = [
        (
            "POST",
            "/v1/chat/completions",
            Bytes::from_static(b"{not json"),
            400,
        ),
        (
            "POST",
            "/v1/chat/completions",
            Bytes::from_static(b"{\"messages\": []}"),
            400,
        ),
        (
            "POST",
            "/v1/chat/completions",
            Bytes::from(
                json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})
                    .to_string(),
            ),
            400,
        ),
        (
            "POST",
            "/v1/chat/completions",
            Bytes::from(vec![b' '; 5000]),
            413,
        ),
        ("GET", "/v1/chat/completions", Bytes::new(), 405),
        ("GET", "/nowhere", Bytes::new(), 404),
    ];
    for (method, path, body, want) in cases {
        let (status, name, body) = send(addr, method, path, body).await;
        assert_eq!(status, want, "{method} {path}: {body}");
        assert_eq!(name, "r1");
        let error: Value = serde_json::from_str(&body).unwrap();
        assert!(error["error"]["message"].is_string(), "{body}");
    }
    stop.cancel();
}

#[tokio::test]
async fn health_models_info_and_metrics_answer() {
    let (engine, stop) = engine(quick("r1")).await;
    let addr = engine.addr();
    let (status, _, _) = send(addr, "GET", "/health", Bytes::new()).await;
    assert_eq!(status, 200);
    let (_, _, models) = send(addr, "GET", "/v1/models", Bytes::new()).await;
    assert!(models.contains("\"magpie-sim\""), "{models}");
    for path in ["/server_info", "/model_info"] {
        let (status, _, info) = send(addr, "GET", path, Bytes::new()).await;
        let info: Value = serde_json::from_str(&info).unwrap();
        assert_eq!((status, &info["model_path"]), (200, &json!("magpie-sim")));
    }
    let request = json!({"prompt": "x".repeat(100), "max_tokens": 2});
    let (status, _, text) = send(
        addr,
        "POST",
        "/v1/completions",
        Bytes::from(request.to_string()),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let (_, _, metrics) = send(addr, "GET", "/metrics", Bytes::new()).await;
    let labels = "{engine=\"0\",model_name=\"magpie-sim\"}";
    for line in [
        format!("vllm:prompt_tokens_total{labels} 25"),
        format!("vllm:generation_tokens_total{labels} 2"),
        format!("vllm:prefix_cache_queries_total{labels} 25"),
        format!("vllm:prefix_cache_hits_total{labels} 0"),
        format!("vllm:num_requests_waiting{labels} 0"),
        format!("vllm:kv_cache_usage_perc{labels} 0.000000"),
        "vllm:cache_config_info{block_size=\"16\",enable_prefix_caching=\"True\",engine=\"0\",model_name=\"magpie-sim\",num_gpu_blocks=\"2000\"} 1.0".to_string(),
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in\n{metrics}"
        );
    }
    stop.cancel();
}

#[tokio::test]
async fn prefills_queue_one_at_a_time() {
    // 10 ms of prefill each (2,000 tokens at 5 µs): the third of three
    // concurrent requests waits for two prefills.
    let config = EngineConfig {
        prefill_us_per_token: 5.0,
        ..quick("r1")
    };
    let (engine, stop) = engine(config).await;
    let request = json!({"prompt": "y".repeat(8000), "max_tokens": 1}).to_string();
    let begun = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let body = Bytes::from(request.clone());
        tasks.push(tokio::spawn(send(
            engine.addr(),
            "POST",
            "/v1/completions",
            body,
        )));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().0, 200);
    }
    // The same prompt: the second and third find all but the last block cached.
    let counts = engine.counts();
    assert_eq!(counts.prompt_tokens, 6000);
    assert_eq!(counts.cached_tokens, 2 * (2000 - 16));
    assert!(begun.elapsed() >= std::time::Duration::from_millis(10));
    stop.cancel();
}

#[test]
fn nonsense_options_are_refused() {
    let bad = [
        EngineConfig {
            block_tokens: 0,
            ..EngineConfig::default()
        },
        EngineConfig {
            prefill_us_per_token: f64::NAN,
            ..EngineConfig::default()
        },
        EngineConfig {
            decode_ms_per_token: -1.0,
            ..EngineConfig::default()
        },
        EngineConfig {
            default_max_tokens: 10,
            max_tokens_limit: 5,
            ..EngineConfig::default()
        },
        EngineConfig {
            name: "r 1".into(),
            ..EngineConfig::default()
        },
    ];
    for config in bad {
        assert!(config.validate().is_err(), "{config:?}");
    }
    assert!(EngineConfig::default().validate().is_ok());
}

/// A job of `tokens` prompt tokens (distinct blocks from `seed`) at
/// `priority`, one token long, and where its events go.
fn job(tokens: usize, seed: u64, priority: i64) -> (gpu::Job, mpsc::UnboundedReceiver<gpu::Event>) {
    let (events, progress) = mpsc::unbounded_channel();
    let blocks: Vec<u64> = (0..tokens as u64 / 16).map(|i| seed + i).collect();
    let job = gpu::Job {
        prompt_tokens: tokens,
        prompt_blocks: blocks.len(),
        blocks,
        max_tokens: 1,
        priority,
        events,
        lease: None,
        imported_blocks: 0,
    };
    (job, progress)
}

/// Whether a short request of priority 0, sent while a long one of
/// priority 10 prefills, has its first token first.
async fn short_goes_first(priority: bool) -> bool {
    let config = EngineConfig {
        prefill_us_per_token: 5.0,
        priority,
        ..quick("r1")
    };
    let (jobs, rx) = mpsc::channel(8);
    let counters = Arc::new(gpu::Counters::default());
    let stop = CancellationToken::new();
    tokio::spawn(gpu::run(config, rx, Arc::clone(&counters), stop.clone()));
    // 40,000 tokens: 200 ms of prefill, in chunks of 512 (2.56 ms).
    let (long, mut long_events) = job(40_000, 1 << 20, 10);
    jobs.send(gpu::Msg::Job(long)).await.unwrap();
    // The long one is in prefill once the GPU counts it.
    while counters.prompt_tokens.load(Ordering::Relaxed) == 0 {
        tokio::task::yield_now().await;
    }
    let (short, mut short_events) = job(1_000, 1 << 40, 0);
    jobs.send(gpu::Msg::Job(short)).await.unwrap();
    let short_first = tokio::select! {
        _ = short_events.recv() => true,
        _ = long_events.recv() => false,
    };
    stop.cancel();
    short_first
}

#[tokio::test(start_paused = true)]
async fn a_higher_priority_takes_the_gpu_between_chunks() {
    assert!(short_goes_first(true).await);
    // First in, first out without --priority, whatever the body says.
    assert!(!short_goes_first(false).await);
}

/// A chat body of a long shared system prompt and `user`'s question.
fn pd_chat(user: &str) -> Value {
    let system = "You route each conversation to its cache. ".repeat(40);
    json!({"model": "m", "max_tokens": 4, "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": user},
    ]})
}

async fn post(addr: SocketAddr, body: &Value) -> Value {
    let bytes = Bytes::from(body.to_string());
    let (status, _, body) = send(addr, "POST", "/v1/chat/completions", bytes).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[tokio::test]
async fn vllm_a_decode_engine_pulls_what_the_prefill_engine_computed() {
    let (prefill, stop_p) = engine(quick("p")).await;
    let (decode, stop_d) = engine(quick("d")).await;
    let request = pd_chat("What is Maglev?");
    let mut first = request.clone();
    first["max_tokens"] = json!(1);
    first["kv_transfer_params"] = json!({"do_remote_decode": true});
    let answered = post(prefill.addr(), &first).await;
    let params = answered["kv_transfer_params"].clone();
    assert_eq!(params["do_remote_prefill"], true, "{answered}");
    assert_eq!(params["remote_port"], prefill.addr().port());
    assert_eq!(prefill.counts().leases, 1);
    let prompt = answered["usage"]["prompt_tokens"].as_u64().unwrap();
    let mut second = request.clone();
    second["kv_transfer_params"] = params;
    let answer = post(decode.addr(), &second).await;
    assert_eq!(answer["usage"]["completion_tokens"], 4);
    // Every whole block moved; the decode engine computed the last ones.
    let (d, p) = (decode.counts(), prefill.counts());
    assert_eq!(d.kv_received_tokens, prompt / 16 * 16);
    assert_eq!(d.cached_tokens, prompt / 16 * 16);
    assert_eq!(p.leases, 0, "the pull lets the blocks go");
    // Again: the decode engine's cache holds the prompt, nothing moves.
    let again = post(prefill.addr(), &first).await;
    second["kv_transfer_params"] = again["kv_transfer_params"].clone();
    post(decode.addr(), &second).await;
    assert_eq!(decode.counts().kv_received_tokens, d.kv_received_tokens);
    // The prefill engine gone: the decode engine prefills the prompt itself.
    stop_p.cancel();
    let before = decode.counts();
    second["messages"][1]["content"] = json!("Another question?");
    let answer = post(decode.addr(), &second).await;
    assert_eq!(answer["usage"]["completion_tokens"], 4);
    let after = decode.counts();
    assert_eq!(after.kv_received_tokens, before.kv_received_tokens);
    assert_eq!(after.finished, before.finished + 1);
    stop_d.cancel();
}

#[tokio::test]
async fn sglang_both_halves_meet_by_their_room_whichever_comes_first() {
    let role = |name, role| EngineConfig {
        role,
        ..quick(name)
    };
    let (prefill, stop_p) = engine(role("p", transfer::Role::Prefill)).await;
    let (decode, stop_d) = engine(role("d", transfer::Role::Decode)).await;
    let mut request = pd_chat("What is a bootstrap room?");
    request["bootstrap_host"] = json!("127.0.0.1");
    request["bootstrap_port"] = json!(prefill.addr().port());
    request["bootstrap_room"] = json!(u64::MAX >> 1);
    // The decode half first: it waits for the prefill's blocks.
    let decoding = tokio::spawn({
        let (addr, request) = (decode.addr(), request.clone());
        async move { post(addr, &request).await }
    });
    let prefilled = post(prefill.addr(), &request).await;
    assert_eq!(prefilled["usage"]["completion_tokens"], 1);
    let answer = decoding.await.unwrap();
    assert_eq!(answer["usage"]["completion_tokens"], 4);
    let prompt = answer["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(decode.counts().kv_received_tokens, prompt / 16 * 16);
    assert_eq!(prefill.counts().leases, 0);
    // An engine of neither role serves the whole request.
    let (whole, stop_w) = engine(quick("w")).await;
    assert_eq!(
        post(whole.addr(), &request).await["usage"]["completion_tokens"],
        4
    );
    stop_w.cancel();
    stop_p.cancel();
    stop_d.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_lease_nobody_pulls_lets_its_blocks_go() {
    let config = EngineConfig {
        kv_lease: std::time::Duration::from_secs(2),
        ..quick("p")
    };
    let (prefill, stop) = engine(config).await;
    let mut first = pd_chat("Held for a pull?");
    first["kv_transfer_params"] = json!({"do_remote_decode": true});
    post(prefill.addr(), &first).await;
    assert_eq!(prefill.counts().leases, 1);
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    // The GPU let go at the lease's time (its gauges publish on its next turn).
    post(prefill.addr(), &pd_chat("Anything")).await;
    assert_eq!(prefill.counts().leases, 0);
    stop.cancel();
}
