//! `queue`: a backend at its `max_inflight` makes requests (mode http) and
//! connections (mode tcp) wait in a bounded queue; they leave it by class,
//! tenants in turn, for the backend that holds their cache; a full queue
//! answers 429, a wait past `queue.timeout` 503, both with `Retry-After`;
//! a client that goes away leaves the queue at once.

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::Response;
use hyper::body::Incoming;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use bytes::Bytes;
use magpie_core::key::group::{GroupBy, body_group_key};
use magpie_core::key::text_key;

use crate::support::*;

const QUEUE: &str = "mode: http\nqueue:\n  max_inflight: 1\n  timeout: 30s\n  priority:\n    header: x-priority\n    classes: [interactive, default, batch]\n";

/// Holds one `/slow` request at magpie's one backend: its slot is taken
/// until the backend is released.
async fn hold(magpie: &Magpie) -> (KeepAlive, Response<Incoming>) {
    let mut client = KeepAlive::connect(magpie.addr).await;
    let request = get("/slow").body(Full::default()).expect("a request");
    let mut response = client.start(request).await;
    within("the first chunk", response.body_mut().frame())
        .await
        .expect("a frame")
        .expect("a good frame");
    (client, response)
}

/// The names of the requests `a` received, in order.
fn arrivals(backends: &HyperBackends) -> Vec<String> {
    let a = backends.get("a");
    a.arrivals.lock().expect("not poisoned").clone()
}

/// Waits until `n` requests wait in magpie's queue.
async fn queued(magpie: &Magpie, n: usize) {
    within(&format!("{n} requests queued"), async {
        while magpie.probe.queued() != n {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
}

/// Sends `GET /` with `headers` and `x-test-name: name` on a connection of
/// its own, in the background; its name and status go to `done` when
/// answered. The backend keeps the names in the order magpie let them
/// through; answers may be read in another order.
fn send(
    magpie: &Magpie,
    name: &'static str,
    headers: &[(&'static str, &'static str)],
    done: &mpsc::UnboundedSender<(&'static str, u16, Option<String>)>,
) {
    let (addr, done) = (magpie.addr, done.clone());
    let mut request = get("/").header("x-test-name", name);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let request = request.body(Full::default()).expect("a request");
    tokio::spawn(async move {
        let mut client = KeepAlive::connect(addr).await;
        let (response, _) = client.send(request).await;
        let retry =
            (response.headers().get("retry-after")).map(|v| v.to_str().unwrap_or("").to_string());
        done.send((name, response.status().as_u16(), retry)).ok();
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_its_limit_requests_wait_and_leave_by_class() {
    let backends = HyperBackends::start(&["a"]).await;
    let magpie = Magpie::start(&config_yaml_with_admin(
        "127.0.0.1:0",
        QUEUE,
        &backends.pairs(),
    ))
    .await;
    let (_client, held) = hold(&magpie).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    // One at a time, so each is queued behind the one before.
    let order = [
        ("batch", "batch"),
        ("none", ""),
        ("interactive", "interactive"),
        ("unknown", "urgent"),
    ];
    for (n, (name, class)) in order.into_iter().enumerate() {
        send(&magpie, name, &[("x-priority", class)], &tx);
        queued(&magpie, n + 1).await;
    }
    let waiting = |class: &str| {
        let class = format!("class=\"{class}\"");
        magpie.metric("magpie_queue_waiting", &[&class])
    };
    let depths = [waiting("interactive"), waiting("default"), waiting("batch")];
    assert_eq!(depths, [1, 2, 1]);
    let (status, queue) = admin_get(magpie.admin.expect("admin is on"), "/queue").await;
    assert_eq!(status, 200);
    let queue: serde_json::Value = serde_json::from_str(&queue).expect("JSON");
    assert_eq!(queue["waiting"], 4);
    assert_eq!(queue["classes"][1]["waiting"], 2, "{queue}");
    assert_eq!(queue["backends"][0]["in_flight"], 1);
    assert_eq!(queue["backends"][0]["limit"], 1);
    backends.release(1);
    drop(held);
    let mut answered = Vec::new();
    for _ in 0..4 {
        let (name, status, _) = within("an answer", rx.recv()).await.expect("one");
        assert_eq!(status, 200, "{name}");
        answered.push(name);
    }
    answered.sort();
    assert_eq!(answered, ["batch", "interactive", "none", "unknown"]);
    // No class header and an unknown class are the default class, first in first out.
    assert_eq!(
        arrivals(&backends),
        ["interactive", "none", "unknown", "batch"]
    );
    assert_eq!(admitted(&magpie, "default", "waited"), 2);
    assert_eq!(admitted(&magpie, "interactive", "waited"), 1);
    assert!(magpie.metric("magpie_queue_wait_seconds_count", &[]) >= 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_and_a_long_wait_503() {
    let backends = HyperBackends::start(&["a"]).await;
    let settings = "mode: http\nqueue:\n  max_inflight: 1\n  size: 1\n  timeout: 300ms\n";
    let magpie = Magpie::with(settings, &backends.pairs()).await;
    let (_client, _held) = hold(&magpie).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    send(&magpie, "waits", &[], &tx);
    queued(&magpie, 1).await;
    send(&magpie, "refused", &[], &tx);
    let (name, status, retry) = within("the refusal", rx.recv()).await.expect("one");
    assert_eq!(
        (name, status, retry.as_deref()),
        ("refused", 429, Some("1"))
    );
    let (name, status, retry) = within("the timeout", rx.recv()).await.expect("one");
    assert_eq!((name, status, retry.as_deref()), ("waits", 503, Some("1")));
    assert_eq!(refused(&magpie, "default", "full"), 1);
    assert_eq!(refused(&magpie, "default", "timeout"), 1);
    assert_eq!(magpie.probe.queued(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_leaves_the_queue() {
    let backends = HyperBackends::start(&["a"]).await;
    let magpie = Magpie::with(QUEUE, &backends.pairs()).await;
    let (_client, _held) = hold(&magpie).await;
    let mut raw = TcpStream::connect(magpie.addr).await.expect("a connection");
    raw.write_all(b"GET / HTTP/1.1\r\nhost: m\r\n\r\n")
        .await
        .expect("sent");
    queued(&magpie, 1).await;
    drop(raw);
    queued(&magpie, 0).await;
    within("the refusal counted", async {
        while refused(&magpie, "default", "client_gone") != 1 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
}

/// Queued requests whose clients leave are noticed whatever their bodies'
/// size (what is past the key is not read while they wait: the socket
/// tells), counted, and never reach a backend: chat POSTs of 16 KiB over
/// the pass-through (HTTP/1.1) and over hyper's path (HTTP/1.0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_posts_whose_clients_leave_never_reach_the_backend() {
    let backends = HyperBackends::start(&["a"]).await;
    let settings = format!("{QUEUE}{SESSION_KEY}");
    let magpie = Magpie::with(&settings, &backends.pairs()).await;
    let (_client, held) = hold(&magpie).await;
    let body = format!("{{\"messages\":\"{}\"}}", "x".repeat(16 << 10));
    let mut clients = Vec::new();
    for n in 0..6 {
        let version = ["1.1", "1.0"][n % 2];
        let mut raw = TcpStream::connect(magpie.addr).await.expect("a connection");
        let head = format!(
            "POST / HTTP/{version}\r\nhost: m\r\nx-session-id: s-{n}\r\nx-test-name: gone-{n}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        raw.write_all(head.as_bytes()).await.expect("sent");
        raw.write_all(body.as_bytes()).await.expect("sent");
        clients.push(raw);
        queued(&magpie, n + 1).await;
    }
    drop(clients);
    queued(&magpie, 0).await;
    assert_eq!(refused(&magpie, "default", "client_gone"), 6);
    backends.release(1);
    drop(held);
    let (tx, mut rx) = mpsc::unbounded_channel();
    send(&magpie, "after", &[], &tx);
    let (name, status, _) = within("the next answer", rx.recv()).await.expect("one");
    assert_eq!((name, status), ("after", 200));
    let reached = arrivals(&backends);
    assert!(
        reached.iter().all(|n| !n.starts_with("gone")),
        "{reached:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_take_turns_so_a_burst_does_not_starve_a_trickle() {
    let backends = HyperBackends::start(&["a"]).await;
    let settings = "mode: http\nqueue:\n  max_inflight: 1\n  tenant:\n    header: x-tenant\n";
    let magpie = Magpie::with(settings, &backends.pairs()).await;
    let (_client, held) = hold(&magpie).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let sends = [
        ("noisy-1", "noisy"),
        ("noisy-2", "noisy"),
        ("noisy-3", "noisy"),
        ("quiet-1", "quiet"),
    ];
    for (n, (name, tenant)) in sends.into_iter().enumerate() {
        send(&magpie, name, &[("x-tenant", tenant)], &tx);
        queued(&magpie, n + 1).await;
    }
    backends.release(1);
    drop(held);
    let mut answered = Vec::new();
    for _ in 0..4 {
        answered.push(within("an answer", rx.recv()).await.expect("one").0);
    }
    answered.sort();
    assert_eq!(answered, ["noisy-1", "noisy-2", "noisy-3", "quiet-1"]);
    let order = arrivals(&backends);
    assert_eq!(order, ["noisy-1", "quiet-1", "noisy-2", "noisy-3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waits_for_its_home_then_spills_in_the_tables_order() {
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let settings =
        format!("mode: http\nqueue:\n  max_inflight: 1\n  affinity_wait: 200ms\n{SESSION_KEY}");
    let magpie = Magpie::with(&settings, &backends.pairs()).await;
    let candidates = magpie.candidates(magpie_core::key::text_key(b"s"));
    // Fill the key's home.
    let mut client = KeepAlive::connect(magpie.addr).await;
    let request = get("/slow")
        .header("x-session-id", "s")
        .body(Full::default())
        .expect("a request");
    let mut held = client.start(request).await;
    within("the first chunk", held.body_mut().frame())
        .await
        .expect("a frame")
        .expect("good");
    let mut other = KeepAlive::connect(magpie.addr).await;
    let got = within("the spill", other.get_session("s")).await;
    assert_eq!(
        got, candidates[1],
        "after the home wait, the next in the table's order"
    );
    assert_eq!(admitted(&magpie, "default", "spilled"), 1);
    assert!(magpie.metric_f64("magpie_queue_wait_seconds_sum", &[]) >= 0.2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_waiting_requests_and_binds_them_to_the_new_table() {
    let backends = HyperBackends::start(&["a", "b"]).await;
    let pairs = backends.pairs();
    let settings = format!("{QUEUE}reload:\n  watch: false\n");
    let file = TempFile::new(
        "magpie.yaml",
        &config_yaml("127.0.0.1:0", &settings, &pairs[..1]),
    );
    let magpie = Magpie::start_file(&file.path).await;
    let (_client, _held) = hold(&magpie).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    send(&magpie, "waits", &[], &tx);
    queued(&magpie, 1).await;
    // b joins: the waiting request is bound again, and b has room.
    std::fs::write(&file.path, config_yaml("127.0.0.1:0", &settings, &pairs)).expect("written");
    let mut reloader = magpie.probe.reloader(file.path.clone());
    within("the reload", reloader.reload(true))
        .await
        .expect("the reload applies");
    let (name, status, _) = within("the answer", rx.recv()).await.expect("one");
    assert_eq!((name, status), ("waits", 200));
    assert_eq!(magpie.probe.queued(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_tcp_connections_wait_for_room() {
    let backends = RawBackends::start(&["a"], Behaviour::GreetEcho).await;
    let settings = "mode: tcp\nqueue:\n  max_inflight: 1\n";
    let magpie = Magpie::with(settings, &backends.list).await;
    let mut first = TcpStream::connect(magpie.addr).await.expect("connected");
    first.write_all(b"one\n").await.expect("sent");
    let mut buf = [0u8; 64];
    let n = within("the echo", first.read(&mut buf))
        .await
        .expect("read");
    assert!(n > 0);
    let mut second = TcpStream::connect(magpie.addr).await.expect("connected");
    second.write_all(b"two\n").await.expect("sent");
    queued(&magpie, 1).await;
    drop(first);
    let n = within("the second's echo", second.read(&mut buf))
        .await
        .expect("read");
    assert!(n > 0, "the waiting connection was served");
    assert_eq!(magpie.probe.queued(), 0);
    // A waiting connection whose client closes leaves the queue, however
    // much it sent meanwhile (past what is read ahead, the socket tells).
    for sent in [6, 64 << 10] {
        let mut third = TcpStream::connect(magpie.addr).await.expect("connected");
        third.write_all(&vec![b'x'; sent]).await.expect("sent");
        queued(&magpie, 1).await;
        drop(third);
        queued(&magpie, 0).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_awaiting_prefill_holds_the_next_request_until_a_first_byte() {
    let backends = HyperBackends::start(&["a"]).await;
    let settings = "mode: http\nqueue:\n  max_inflight: 8\n  max_prefill_tokens: 100\n";
    let magpie = Magpie::start(&config_yaml_with_admin(
        "127.0.0.1:0",
        settings,
        &backends.pairs(),
    ))
    .await;
    // 4,000 bytes at four a token: 1,000 tokens awaiting their first byte.
    let mut client = KeepAlive::connect(magpie.addr).await;
    let long = hyper::Request::post("/quiet")
        .header("host", "magpie")
        .body(Full::new(bytes::Bytes::from(vec![b'x'; 4000])))
        .expect("a request");
    let mut quiet = client.start(long).await;
    assert_eq!(quiet.status(), 200);
    let prefill = magpie.backend_metric("magpie_backend_prefill_tokens", "a", &[]);
    assert_eq!(prefill, 1000);
    let (_, metrics) = admin_get(magpie.admin.expect("an admin address"), "/metrics").await;
    assert!(
        metrics.contains("magpie_backend_prefill_tokens{backend=\"a\",addr=")
            && metrics.contains("} 1000\n"),
        "{metrics}"
    );
    // Seven slots free, no work to spare: the next request waits.
    let (tx, mut rx) = mpsc::unbounded_channel();
    send(&magpie, "next", &[], &tx);
    queued(&magpie, 1).await;
    assert_eq!(magpie.backend("a").active(), 1);
    // The first byte of the long one's answer: its prefill is done.
    backends.release(1);
    within("the long one's first byte", quiet.body_mut().frame())
        .await
        .expect("a frame")
        .expect("a good frame");
    let (name, status, _) = within("the next one's answer", rx.recv())
        .await
        .expect("one");
    assert_eq!((name, status), ("next", 200));
    let prefill = magpie.backend_metric("magpie_backend_prefill_tokens", "a", &[]);
    assert_eq!(prefill, 0);
}

/// Waits until magpie has `n` requests in flight in all.
async fn in_flight(magpie: &Magpie, n: u64) {
    within(&format!("{n} in flight"), async {
        while magpie.active().iter().map(|(_, k)| k).sum::<u64>() != n {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
}

/// A request to `path` of session `session`, with a chat `body` if any.
fn chat_request(path: &str, session: &str, body: Option<&str>) -> hyper::Request<Full<Bytes>> {
    let builder = hyper::Request::post(path)
        .header("host", "magpie")
        .header("content-type", "application/json")
        .header("x-session-id", session);
    let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
    builder.body(Full::new(body)).expect("a request")
}

/// Holds a `/slow` request (its slot stays taken until the backend is
/// released or the client goes): the client, the response, and the
/// backend that took it.
async fn hold_slow(
    magpie: &Magpie,
    session: &str,
    body: Option<&str>,
) -> (KeepAlive, Response<Incoming>, String) {
    let mut client = KeepAlive::connect(magpie.addr).await;
    let mut response = client.start(chat_request("/slow", session, body)).await;
    let frame = within("the first chunk", response.body_mut().frame())
        .await
        .expect("a frame")
        .expect("a good frame");
    let text = String::from_utf8_lossy(frame.data_ref().expect("data")).into_owned();
    let name = (text.trim().strip_prefix("first from "))
        .unwrap_or_else(|| panic!("not a slow answer: {text:?}"))
        .to_string();
    (client, response, name)
}

/// Under a queue, a conversation's first request goes where the latest one
/// that opened alike went (its cache is there), not to its group's primary,
/// and waits for that backend as a turn waits for its pin, although others
/// have room: grouped by how they open, or by their instructions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_that_opens_alike_waits_for_where_the_latest_went() {
    opens_alike("conversation", &GroupBy::Conversation).await;
    opens_alike("system", &GroupBy::System).await;
}

async fn opens_alike(group_setting: &str, by: &GroupBy) {
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let settings = format!(
        "mode: http\nkey:\n  from: header\n  header: x-session-id\n  group: {group_setting}\nsessions:\n  ttl: 10m\nqueue:\n  max_inflight: 1\n  affinity_wait: 30s\n  timeout: 30s\n"
    );
    let magpie = Magpie::with(&settings, &backends.pairs()).await;
    let opening = r#"{"model":"m","messages":[{"role":"system","content":"summarize"},{"role":"user","content":"document 7"}]}"#;
    let group = body_group_key(opening.as_bytes(), by).expect("a group");
    let order = magpie.candidates(group);
    // The opening's primary is busy with a request of another key (no
    // body, no group: its session key places it).
    let other = (0..10_000)
        .map(|i| format!("other-{i}"))
        .find(|s| magpie.primary(text_key(s.as_bytes())) == order[0])
        .expect("a key of the opening's primary");
    let (busy, busy_response, at) = hold_slow(&magpie, &other, None).await;
    assert_eq!(at, order[0]);
    // So the first conversation that opens so takes the next with room.
    let mut client = KeepAlive::connect(magpie.addr).await;
    assert_eq!(client.post_json(opening, Some("first")).await, order[1]);
    drop((busy, busy_response));
    in_flight(&magpie, 0).await;
    // The primary has room again, and the next one goes where the first went.
    assert_eq!(client.post_json(opening, Some("second")).await, order[1]);
    // Where the first went is busy: the next one waits for it.
    let (held, held_response, at) = hold_slow(&magpie, "first", Some(opening)).await;
    assert_eq!(at, order[1]);
    let (addr, body) = (magpie.addr, opening.to_string());
    let third = tokio::spawn(async move {
        let mut client = KeepAlive::connect(addr).await;
        client.post_json(&body, Some("third")).await
    });
    within("the third to queue", async {
        while magpie.probe.queued() != 1 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    let active: std::collections::BTreeMap<String, u64> = magpie.active().into_iter().collect();
    assert_eq!(active[&order[1]], 1);
    assert_eq!(
        active[&order[0]] + active[&order[2]],
        0,
        "others have room: {active:?}"
    );
    drop((held, held_response));
    let landed = within("the third's answer", third)
        .await
        .expect("not panicked");
    assert_eq!(landed, order[1]);
    // The second and the third, each away from its table's first.
    let openings = magpie.metric("magpie_requests_routed_total", &["how=\"opening\""]);
    assert_eq!(openings, 2);
    magpie.stop().await;
}

/// Requests of `class` the queue admitted `how`.
fn admitted(magpie: &Magpie, class: &str, how: &str) -> u64 {
    let labels = [&format!("class=\"{class}\""), &format!("how=\"{how}\"")];
    magpie.metric("magpie_queue_admitted_total", &labels.map(String::as_str))
}

/// Requests of `class` the queue refused for `reason`.
fn refused(magpie: &Magpie, class: &str, reason: &str) -> u64 {
    let labels = [
        &format!("class=\"{class}\""),
        &format!("reason=\"{reason}\""),
    ];
    magpie.metric("magpie_queue_refused_total", &labels.map(String::as_str))
}
