//! Engine load (`health.load`) through real sockets: fake vLLM engines
//! whose `/metrics` the tests change, magpie in mode http in front of them.
//! A full engine takes no new keys (the spill is counted as engine_full;
//! without `max_waiting` only its KV cache fills it),
//! pinned keys stay unless it is far over, a scrape that hangs or answers
//! garbage marks nothing down and delays no request, and a value older than
//! `max_age` is ignored. Under `queue`, an engine takes no more prefill
//! than its cache keeps unheld, and a shared head counts where it was
//! answered lately however much was computed there since. Every wait polls
//! magpie's own `/metrics` until the scrape shows what the test set, within
//! the suite's patience.

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use magpie_core::key::group::{GroupBy, body_group_key};
use magpie_core::key::text_key;

use crate::support::*;

/// Mode http keyed by `x-session-id`, scraping every 100ms.
fn settings(extra: &str) -> String {
    format!(
        "mode: http\n{SESSION_KEY}health:\n  load:\n    preset: vllm\n    interval: 100ms\n    timeout: 50ms\n    max_waiting: 8\n    max_age: 1s\n{extra}"
    )
}

async fn start(engines: &FakeEngines, extra: &str) -> (Magpie, SocketAddr) {
    let yaml = config_yaml_with_admin("127.0.0.1:0", &settings(extra), &engines.pairs());
    let magpie = Magpie::start(&yaml).await;
    let admin = magpie.admin.expect("admin is on");
    (magpie, admin)
}

fn waiting_of(text: &str, backend: &str) -> Option<f64> {
    let series = format!("magpie_backend_engine_waiting{{backend=\"{backend}\"");
    text.contains(&series).then(|| {
        metric_sum(
            text,
            "magpie_backend_engine_waiting",
            &[&format!("backend=\"{backend}\"")],
        )
    })
}

/// Waits until magpie's metrics show `waiting` for `backend`.
async fn until_waiting(admin: SocketAddr, backend: &str, waiting: f64) -> String {
    until_metrics(
        admin,
        &format!("{backend} to show {waiting} waiting"),
        |t| waiting_of(t, backend) == Some(waiting),
    )
    .await
}

fn scrapes(text: &str, backend: &str, result: &str) -> f64 {
    metric_sum(
        text,
        "magpie_engine_load_scrapes_total",
        &[
            &format!("backend=\"{backend}\""),
            &format!("result=\"{result}\""),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_engine_takes_no_new_keys_and_pins_move_only_when_far_over() {
    let engines = FakeEngines::start(&["a", "b", "c"]).await;
    let (magpie, admin) = start(&engines, "sessions:\n  ttl: 10m\n").await;
    until_waiting(admin, "a", 0.0).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    // Pinned while a was idle.
    let pinned = magpie.sessions_of("a", "pinned", 10);
    for k in &pinned {
        assert_eq!(client.get_session(k).await, "a");
    }

    // Over max_waiting (8), not far over (32): new keys go elsewhere.
    engines.get("a").report(10, 0.5);
    let text = until_waiting(admin, "a", 10.0).await;
    promtool_accepts(&text);
    for k in magpie.sessions_of("a", "new", 10) {
        let second = magpie.candidates(text_key(k.as_bytes()))[1].clone();
        assert_eq!(client.get_session(&k).await, second, "{k} is a new key");
    }
    let (_, text) = admin_get(admin, "/metrics").await;
    let spills = metric_sum(
        &text,
        "magpie_backend_spills_total",
        &["backend=\"a\"", "reason=\"engine_full\""],
    );
    assert_eq!(spills, 10.0, "engine_full spills on a");
    for k in &pinned {
        assert_eq!(client.get_session(k).await, "a", "{k} is pinned to a");
    }
    // A pin that keeps its key is no spill; each decision says why.
    let (_, text) = admin_get(admin, "/metrics").await;
    let engine_full = ["backend=\"a\"", "reason=\"engine_full\""];
    let spills = metric_sum(&text, "magpie_backend_spills_total", &engine_full);
    assert_eq!(spills, 10.0, "pinned requests counted as spills");
    let routed = |how: &str| {
        let label = format!("how=\"{how}\"");
        metric_sum(&text, "magpie_requests_routed_total", &[label.as_str()])
    };
    assert_eq!(routed("spilled_engine_full"), 10.0, "{text}");
    assert_eq!(routed("pinned"), 10.0, "{text}");

    // A full KV cache counts the same; far over, even pins move.
    engines.get("a").report(0, 0.97);
    until_metrics(admin, "a's KV cache at 0.97", |t| {
        metric_sum(t, "magpie_backend_engine_kv_usage", &["backend=\"a\""]) == 0.97
    })
    .await;
    let k = &magpie.sessions_of("a", "kv", 1)[0];
    assert_ne!(client.get_session(k).await, "a");
    assert_eq!(client.get_session(&pinned[0]).await, "a");
    engines.get("a").report(40, 0.5);
    until_waiting(admin, "a", 40.0).await;
    for k in &pinned {
        assert_ne!(client.get_session(k).await, "a", "a is far over: {k} moves");
    }
    assert!(magpie.backend("a").is_up(), "load never marks down");
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_max_waiting_a_long_queue_keeps_new_keys_and_a_full_kv_cache_does_not() {
    let engines = FakeEngines::start(&["a", "b"]).await;
    let settings = format!(
        "mode: http\n{SESSION_KEY}health:\n  load:\n    preset: vllm\n    interval: 100ms\n    timeout: 50ms\n"
    );
    let yaml = config_yaml_with_admin("127.0.0.1:0", &settings, &engines.pairs());
    let magpie = Magpie::start(&yaml).await;
    let admin = magpie.admin.expect("admin is on");
    let mut client = KeepAlive::connect(magpie.addr).await;
    engines.get("a").report(1_000, 0.5);
    until_waiting(admin, "a", 1_000.0).await;
    for k in magpie.sessions_of("a", "queued", 10) {
        assert_eq!(
            client.get_session(&k).await,
            "a",
            "{k}: a queue is no limit"
        );
    }
    engines.get("a").report(1_000, 0.97);
    until_metrics(admin, "a's KV cache at 0.97", |t| {
        metric_sum(t, "magpie_backend_engine_kv_usage", &["backend=\"a\""]) == 0.97
    })
    .await;
    for k in magpie.sessions_of("a", "kv", 10) {
        assert_eq!(
            client.get_session(&k).await,
            "b",
            "{k}: a's KV cache is full"
        );
    }
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_or_garbled_scrape_marks_nothing_down_and_delays_nothing() {
    let engines = FakeEngines::start(&["a", "b"]).await;
    let (magpie, admin) = start(&engines, "").await;
    until_waiting(admin, "a", 0.0).await;
    let keys = magpie.sessions_of("a", "k", 20);
    let mut client = KeepAlive::connect(magpie.addr).await;

    engines.get("a").set(Metrics::Hang);
    until_metrics(admin, "a's scrapes to time out", |t| {
        scrapes(t, "a", "timeout") >= 3.0
    })
    .await;
    for k in &keys {
        let answered = within_for(
            Duration::from_secs(1),
            "a request while scrapes hang",
            client.get_session(k),
        );
        assert_eq!(answered.await, "a");
    }

    engines.get("a").set(Metrics::Garbage);
    until_metrics(admin, "a's scrapes to fail to parse", |t| {
        scrapes(t, "a", "parse") >= 3.0
    })
    .await;
    for k in &keys {
        assert_eq!(client.get_session(k).await, "a");
    }
    let (_, text) = admin_get(admin, "/metrics").await;
    assert_eq!(
        metric_sum(&text, "magpie_backend_up", &["backend=\"a\""]),
        1.0
    );
    assert!(scrapes(&text, "b", "ok") >= 3.0, "b is scraped all along");
    assert_eq!(
        scrapes(&text, "b", "timeout") + scrapes(&text, "b", "parse"),
        0.0
    );
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_value_is_ignored_after_max_age() {
    let engines = FakeEngines::start(&["a", "b"]).await;
    let (magpie, admin) = start(&engines, "").await;
    let keys = magpie.sessions_of("a", "k", 5);
    let mut client = KeepAlive::connect(magpie.addr).await;
    engines.get("a").report(100, 0.5);
    until_waiting(admin, "a", 100.0).await;
    for k in &keys {
        assert_eq!(client.get_session(k).await, "b", "a is full");
    }
    // No more good scrapes: the last value counts until max_age (1s), then
    // the gauge goes and a takes its keys again.
    engines.get("a").set(Metrics::Hang);
    let text = until_metrics(admin, "a's value to age out", |t| {
        waiting_of(t, "a").is_none()
    })
    .await;
    assert!(scrapes(&text, "a", "timeout") >= 1.0);
    for k in &keys {
        assert_eq!(
            client.get_session(k).await,
            "a",
            "a's stale value is ignored"
        );
    }
    magpie.stop().await;
}

/// `promtool check metrics` takes magpie's exposition with the engine
/// (or group) families in it.
pub(crate) fn promtool_accepts(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}); install the Debian package prometheus (script/test does)")
        });
    child
        .stdin
        .take()
        .expect("promtool's stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool ends");
    assert!(
        out.status.success(),
        "promtool check metrics:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two real `magpie engine`s of different cache sizes: magpie learns each
/// one's KV cache size from its `/metrics` (vLLM's `cache_config_info`,
/// blocks × block size) and shows it in its metrics and `/table`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kv_cache_size_is_learned_from_an_engines_metrics() {
    let stop = tokio_util::sync::CancellationToken::new();
    let mut backends = Vec::new();
    for (name, blocks) in [("small", 500), ("large", 3000)] {
        let config = magpie_lab::engine::EngineConfig {
            name: name.to_string(),
            cache_blocks: blocks,
            ..magpie_lab::engine::EngineConfig::default()
        };
        let any: SocketAddr = "127.0.0.1:0".parse().expect("an address");
        let engine = magpie_lab::engine::start(config, any, stop.clone())
            .await
            .expect("the engine starts");
        backends.push((name.to_string(), engine.addr()));
    }
    let yaml = config_yaml_with_admin("127.0.0.1:0", &settings(""), &backends);
    let magpie = Magpie::start(&yaml).await;
    let admin = magpie.admin.expect("admin is on");
    let capacity = |t: &str, b: &str| {
        let label = format!("backend=\"{b}\"");
        metric_sum(t, "magpie_backend_engine_kv_capacity_tokens", &[&label])
    };
    let text = until_metrics(admin, "both caches' sizes", |t| {
        capacity(t, "small") > 0.0 && capacity(t, "large") > 0.0
    })
    .await;
    assert_eq!(capacity(&text, "small"), 500.0 * 16.0);
    assert_eq!(capacity(&text, "large"), 3000.0 * 16.0);
    promtool_accepts(&text);
    let (_, table) = admin_get(admin, "/table").await;
    let table: serde_json::Value = serde_json::from_str(&table).expect("JSON");
    let sizes: Vec<_> = (table["backends"].as_array().expect("backends").iter())
        .map(|b| (b["name"].clone(), b["engine_kv_capacity_tokens"].clone()))
        .collect();
    assert!(
        sizes.contains(&("large".into(), 48000.0.into())),
        "{sizes:?}"
    );
    magpie.stop().await;
    stop.cancel();
}

/// vLLM's gauges for an engine with nothing waiting, a KV cache of 125
/// blocks of 16 tokens (2,000) and `kv_usage` of it held.
fn cache_metrics(kv_usage: f64) -> Metrics {
    Metrics::Text(format!(
        "# TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{engine=\"0\",model_name=\"m\"}} 0.0\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"m\"}} {kv_usage}\n\
         # TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"125\"}} 1.0\n"
    ))
}

/// Under `queue`, an engine takes no more prefill than its KV cache keeps
/// of what its running requests do not hold (its size less its usage):
/// with half of 2,000 tokens held, a request of about 100 tokens waits in
/// magpie while one of 1,500 awaits its first byte there, and goes in once
/// that one's prefill is over; with a tenth held, the same goes in at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_takes_no_more_prefill_than_its_cache_keeps_unheld() {
    let engines = FakeEngines::start(&["a"]).await;
    let a = engines.get("a");
    a.set(cache_metrics(0.5));
    let (magpie, admin) = start(&engines, "queue:\n  max_inflight: 8\n  timeout: 30s\n").await;
    let usage = |t: &str| metric_sum(t, "magpie_backend_engine_kv_usage", &[]);
    until_metrics(admin, "the cache's size and use", |t| {
        metric_sum(t, "magpie_backend_engine_kv_capacity_tokens", &[]) == 2000.0 && usage(t) == 0.5
    })
    .await;
    // Bodies of 6,000 and 400 bytes: 1,500 and 100 tokens at four a token.
    let held = |session: &str, bytes: usize| {
        let request = Request::post("/held")
            .header("x-session-id", session)
            .body(Full::new(Bytes::from("x".repeat(bytes))))
            .expect("a request");
        let addr = magpie.addr;
        tokio::spawn(async move { KeepAlive::connect(addr).await.served_by(request).await })
    };
    let waited = || magpie.metric("magpie_queue_admitted_total", &["how=\"waited\""]);
    let long = held("long", 6000);
    a.until_held(1).await;
    let short = held("short", 400);
    until_metrics(admin, "the short request waiting in magpie", |t| {
        metric_sum(t, "magpie_queue_waiting", &[]) == 1.0
    })
    .await;
    assert_eq!(a.held.load(std::sync::atomic::Ordering::SeqCst), 1);
    a.release(1);
    assert_eq!(long.await.expect("the long request"), "a");
    a.until_held(1).await;
    assert_eq!(waited(), 1);
    a.release(1);
    assert_eq!(short.await.expect("the short request"), "a");
    // A tenth held: 1,800 tokens of room, the short one goes in beside it.
    a.set(cache_metrics(0.1));
    until_metrics(admin, "the cache's use falling", |t| usage(t) == 0.1).await;
    let (long, short) = (held("long-2", 6000), held("short-2", 400));
    a.until_held(2).await;
    assert_eq!(waited(), 1, "nothing waited");
    a.release(2);
    for request in [long, short] {
        assert_eq!(request.await.expect("a request"), "a");
    }
    magpie.stop().await;
}

/// A request of `session` to `path` with `body` (`/held` waits at the
/// engine until the test lets it go), on a connection of its own.
fn post(
    magpie: &Magpie,
    path: &str,
    session: &str,
    body: String,
) -> tokio::task::JoinHandle<String> {
    let request = Request::post(path)
        .header("x-session-id", session)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a request");
    let addr = magpie.addr;
    tokio::spawn(async move { KeepAlive::connect(addr).await.served_by(request).await })
}

/// A shared head is the last of its chain an engine's cache lets go, so
/// under `queue` it counts at the engine that answered it lately however
/// much that engine computed since. An 800-token system head answered at
/// its group's first candidate, which then computes 1,800 tokens of another
/// conversation (more than the 1,500 its cache keeps unheld): a new
/// conversation with that head still goes there with 200 tokens held ahead
/// of it (200 + 20 to compute against 820 at the idle one), and goes to
/// the idle one with 1,200 held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_head_counts_where_it_was_answered_however_much_was_computed_since() {
    let engines = FakeEngines::start(&["a", "b"]).await;
    for engine in &engines.list {
        engine.set(cache_metrics(0.25));
    }
    let extra = "sessions:\n  ttl: 10m\nqueue:\n  max_inflight: 8\n  timeout: 30s\n";
    let grouped = settings(extra).replace(
        "header: x-session-id\n",
        "header: x-session-id\n  group: system\n",
    );
    let yaml = config_yaml_with_admin("127.0.0.1:0", &grouped, &engines.pairs());
    let magpie = Magpie::start(&yaml).await;
    let admin = magpie.admin.expect("admin is on");
    until_metrics(admin, "both caches' sizes and use", |t| {
        metric_sum(t, "magpie_backend_engine_kv_capacity_tokens", &[]) == 4000.0
            && metric_sum(t, "magpie_backend_engine_kv_usage", &[]) == 0.5
    })
    .await;
    let head = "h".repeat(3200);
    let group = body_group_key(chat_body(&head, "x").as_bytes(), &GroupBy::System);
    let order = magpie.candidates(group.expect("a group"));
    let (home, other) = (order[0].clone(), order[1].clone());
    let served = |session: &str, user: &str| post(&magpie, "/", session, chat_body(&head, user));
    assert_eq!(served("one", "one").await.expect("one"), home);
    // 1,800 tokens of a conversation without the head computed there.
    let bulk = magpie.sessions_of(&home, "bulk", 1).remove(0);
    let turn = |path: &str, bytes: usize| post(&magpie, path, &bulk, "x".repeat(bytes));
    assert_eq!(turn("/", 7200).await.expect("bulk"), home);
    let prefill = || magpie.backend_metric("magpie_backend_prefill_tokens", &home, &[]);
    // Its next turn, 200 tokens more, held there before its first byte.
    let second = turn("/held", 8000);
    engines.get(&home).until_held(1).await;
    assert_eq!(prefill(), 200);
    assert_eq!(served("two", "two").await.expect("two"), home);
    // Its third held there too, 1,000 tokens past the answered first (the
    // second's answer has not begun): the head no longer pays for the wait.
    let third = turn("/held", 11_200);
    engines.get(&home).until_held(2).await;
    assert_eq!(prefill(), 1200);
    assert_eq!(served("three", "three").await.expect("three"), other);
    engines.get(&home).release(2);
    for held in [second, third] {
        assert_eq!(held.await.expect("a held turn"), home);
    }
    magpie.stop().await;
}
