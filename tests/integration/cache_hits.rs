//! Realized cache hits (mode http): the token counts engines report in each
//! answer's `usage`, JSON or streamed, are counted per backend exactly, and
//! a request that found less cached than its key's previous prompt is a
//! miss with a cause.

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use magpie_core::key;
use std::sync::atomic::Ordering;

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
