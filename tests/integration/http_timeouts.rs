//! `mode: http` deadlines, through real sockets: towards backends
//! (`http.response_timeout`, `http.stream_idle_timeout`), for silent clients
//! (`http.first_byte_timeout`, `http.keepalive_timeout`) and stalled request
//! bodies (`http.body_timeout`), and the upstream
//! pool's own (`http.pool_idle_timeout`, `http.pool_max_idle_per_backend`,
//! a removed backend's idle connections closed on reload).

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use magpie_proxy::testing::Outcome;

use crate::support::*;

/// `mode: http` keyed by `x-session-id`, the `http` section's `lines` added.
fn http_settings(lines: &str) -> String {
    format!("mode: http\nkey:\n  from: header\n  header: x-session-id\nhttp:\n{lines}")
}

/// magpie in front of `backends`, with its admin endpoint for the metrics.
async fn start(settings: &str, backends: &[(String, std::net::SocketAddr)]) -> Magpie {
    Magpie::start(&config_yaml_with_admin("127.0.0.1:0", settings, backends)).await
}

/// `magpie_backend_timeouts_total` of `backend` for `kind`.
async fn timeouts(magpie: &Magpie, backend: &str, kind: &str) -> f64 {
    let (_, text) = admin_get(magpie.admin.expect("admin is on"), "/metrics").await;
    metric_sum(
        &text,
        "magpie_backend_timeouts_total",
        &[
            &format!("backend=\"{backend}\""),
            &format!("kind=\"{kind}\""),
        ],
    )
}

/// Waits until `magpie_client_quiet_closes_total` says `n` connections
/// were closed for `reason`, and none for the other.
async fn quiet_closes(magpie: &Magpie, reason: &str, n: f64) {
    let admin = magpie.admin.expect("admin is on");
    let other = match reason {
        "first_byte_timeout" => "keepalive_timeout",
        _ => "first_byte_timeout",
    };
    let count = |text: &str, reason: &str| {
        let label = format!("reason=\"{reason}\"");
        metric_sum(text, "magpie_client_quiet_closes_total", &[&label])
    };
    let text = within("the quiet close to be counted", async {
        loop {
            let (_, text) = admin_get(admin, "/metrics").await;
            if count(&text, reason) >= n {
                return text;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(count(&text, reason), n, "{text}");
    assert_eq!(count(&text, other), 0.0, "{text}");
}

/// Waits until `backend` has no request in flight.
async fn released(magpie: &Magpie, backend: &str) {
    let b = magpie.backend(backend);
    within("the in-flight slot to be given back", async {
        while b.active() > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Reads `stream` until magpie closes it; `Err` if that was a reset.
async fn read_to_close(stream: &mut tokio::net::TcpStream) -> std::io::Result<Vec<u8>> {
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match within("magpie to close the connection", stream.read(&mut chunk)).await {
            Ok(0) => return Ok(got),
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(e),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_never_answers_gets_the_client_a_504_and_frees_its_slot() {
    let up = Upstream::start("a", Answer::Never).await;
    let magpie = start(&http_settings("  response_timeout: 200ms\n"), &[up.pair()]).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let started = Instant::now();
    let (response, body) = client
        .send(
            get("/")
                .header("x-session-id", "s")
                .body(Full::default())
                .expect("a request"),
        )
        .await;
    let waited = started.elapsed();
    let text = String::from_utf8_lossy(&body);
    assert_eq!(response.status(), 504, "{text}");
    assert_eq!(
        text,
        "magpie: backend a sent no response head within 200ms of the request\n"
    );
    assert!(waited >= Duration::from_millis(180), "{waited:?}");
    released(&magpie, "a").await;
    // Its connection is dropped, not pooled.
    up.wait_closed(1).await;
    assert_eq!(timeouts(&magpie, "a", "response").await, 1.0);
    assert_eq!(timeouts(&magpie, "a", "stream_idle").await, 0.0);
    // The client's connection goes on.
    let (response, _) = client
        .send(get("/").body(Full::default()).expect("a request"))
        .await;
    assert_eq!(response.status(), 504);
    // Counted as what they were, not as requests that found no backend.
    assert_eq!(magpie.client_failures("response_timeout"), 2);
    assert_eq!(magpie.client_failures("no_backend"), 0);
    magpie.stop().await;
}

/// A response timeout is a failed answer for passive health only with
/// `health.passive_status`, like a backend's own 504.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_timeout_counts_for_passive_health_only_with_passive_status() {
    for passive_status in [false, true] {
        let up = Upstream::start("a", Answer::Never).await;
        let settings = format!(
            "{}health:\n  interval: 1h\n  passive_failures: 1\n  passive_status: {passive_status}\n",
            http_settings("  response_timeout: 100ms\n")
        );
        let magpie = start(&settings, &[up.pair()]).await;
        let mut client = KeepAlive::connect(magpie.addr).await;
        let (response, _) = client
            .send(get("/").body(Full::default()).expect("a request"))
            .await;
        assert_eq!(response.status(), 504);
        assert_eq!(
            magpie.backend("a").is_up(),
            !passive_status,
            "passive_status: {passive_status}"
        );
        magpie.stop().await;
    }
}

/// A backend that sends its head and a chunk, then nothing: the client sees
/// the chunk, then a reset (never a clean end), and the slot is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_stream_is_cut_with_a_reset_after_stream_idle_timeout() {
    let up = Upstream::start("a", Answer::HeadThenStall).await;
    let magpie = start(
        &http_settings("  stream_idle_timeout: 200ms\n"),
        &[up.pair()],
    )
    .await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let response = client
        .start(get("/").body(Full::default()).expect("a request"))
        .await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    assert_eq!(&next_data(&mut body).await[..], b"first");
    let started = Instant::now();
    let end = within("the stream to be cut", body.frame()).await;
    assert!(
        matches!(end, Some(Err(_))),
        "the stream ended cleanly: {end:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(180));
    released(&magpie, "a").await;
    up.wait_closed(1).await;
    assert_eq!(timeouts(&magpie, "a", "stream_idle").await, 1.0);

    // On the wire: the head, the chunk, then a reset; no last chunk.
    let mut raw = connect(magpie.addr).await;
    raw.write_all(b"GET / HTTP/1.1\r\nhost: m\r\n\r\n")
        .await
        .expect("send");
    match read_to_close(&mut raw).await {
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        Ok(got) => panic!(
            "closed without a reset after {:?}",
            String::from_utf8_lossy(&got)
        ),
    }
    assert_eq!(timeouts(&magpie, "a", "stream_idle").await, 2.0);

    // HTTP/2: the stream is reset; the connection goes on.
    let (mut sender, _conn) = h2_connect(magpie.addr).await;
    for round in 0..2 {
        let request = hyper::Request::get("http://magpie/")
            .body(Full::<bytes::Bytes>::default())
            .expect("a request");
        let response = within("an HTTP/2 head", sender.send_request(request))
            .await
            .expect("a response");
        let mut body = response.into_body();
        within("the first chunk", body.frame())
            .await
            .expect("a frame")
            .expect("no error yet");
        let end = within("the stream to be reset", body.frame()).await;
        assert!(matches!(end, Some(Err(_))), "round {round}: {end:?}");
    }
    assert_eq!(timeouts(&magpie, "a", "stream_idle").await, 4.0);
    magpie.stop().await;
}

/// With `max_connections: 1`, a client that connects and sends nothing
/// holds the only slot until `first_byte_timeout`; then a real client gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_is_closed_after_first_byte_timeout_and_frees_its_slot() {
    let up = Upstream::start("a", Answer::Ok).await;
    let settings = format!(
        "max_connections: 1\n{}",
        http_settings("  first_byte_timeout: 200ms\n")
    );
    let magpie = start(&settings, &[up.pair()]).await;
    let started = Instant::now();
    let mut silent = connect(magpie.addr).await;
    let got = read_to_close(&mut silent).await.expect("an orderly close");
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(180) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    quiet_closes(&magpie, "first_byte_timeout", 1.0).await;
    // The slot is free: the next client is served (one that comes while the
    // closing connection's task is still ending is turned away; it tries
    // again).
    let served = within("a client to get the freed slot", async {
        loop {
            let mut s = connect(magpie.addr).await;
            s.write_all(b"GET / HTTP/1.1\r\nhost: m\r\nconnection: close\r\n\r\n")
                .await
                .expect("send");
            let mut out = Vec::new();
            if s.read_to_end(&mut out).await.is_ok() && !out.is_empty() {
                return String::from_utf8_lossy(&out).into_owned();
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
    assert!(served.ends_with("backend: a\n"), "{served}");
    magpie.stop().await;
}

/// A keep-alive client that idles after its response is closed after
/// `keepalive_timeout` (not the shorter `first_byte_timeout`: it has spoken).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_client_is_closed_after_keepalive_timeout() {
    let up = Upstream::start("a", Answer::Ok).await;
    let magpie = start(
        &http_settings("  keepalive_timeout: 500ms\n  first_byte_timeout: 100ms\n"),
        &[up.pair()],
    )
    .await;
    let mut s = connect(magpie.addr).await;
    s.write_all(b"GET / HTTP/1.1\r\nhost: m\r\n\r\n")
        .await
        .expect("send");
    let mut answer = Vec::new();
    while !answer.ends_with(b"backend: a\n") {
        let mut chunk = [0u8; 1024];
        let n = within("the answer", s.read(&mut chunk))
            .await
            .expect("read the answer");
        assert!(n > 0, "closed before the answer");
        answer.extend_from_slice(&chunk[..n]);
    }
    let idle_from = Instant::now();
    let rest = read_to_close(&mut s).await.expect("an orderly close");
    assert!(rest.is_empty());
    let idled = idle_from.elapsed();
    // Not at first_byte_timeout, nor at the head deadline (key.read_timeout,
    // 10s). (The clock counts whole milliseconds: allow a little early.)
    assert!(
        idled >= Duration::from_millis(450) && idled < Duration::from_secs(5),
        "closed after {idled:?}"
    );
    quiet_closes(&magpie, "keepalive_timeout", 1.0).await;
    magpie.stop().await;
}

/// HTTP/2: a connection with a stream open is not idle, however long the
/// stream takes; once none is open, it closes after `keepalive_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_idles_only_without_open_streams() {
    let backends = HyperBackends::start(&["a"]).await;
    let magpie = start(
        &http_settings(
            "  keepalive_timeout: 300ms
",
        ),
        &backends.pairs(),
    )
    .await;
    let (mut sender, conn) = h2_connect(magpie.addr).await;
    let h2_get = |path: &str| {
        hyper::Request::get(format!("http://magpie{path}"))
            .body(Full::<bytes::Bytes>::default())
            .expect("a request")
    };
    let slow = within(
        "the slow stream's head",
        sender.send_request(h2_get("/slow")),
    )
    .await
    .expect("a response");
    let mut slow = slow.into_body();
    within("the first chunk", slow.frame())
        .await
        .expect("a frame")
        .expect("no error");
    // Twice the keep-alive time with the stream open: still usable. (The
    // wait is what is tested, not a synchronisation.)
    tokio::time::sleep(Duration::from_millis(600)).await;
    let response = within("a second stream", sender.send_request(h2_get("/")))
        .await
        .expect("the connection is still open");
    assert_eq!(response.status(), 200);
    within("its body", response.into_body().collect())
        .await
        .expect("a body");
    backends.release(1);
    within("the slow stream's end", slow.collect())
        .await
        .expect("its end");
    let idle_from = Instant::now();
    // Closed by magpie, the client's connection ends (with an error or not).
    let ended = within("magpie to close the idle HTTP/2 connection", conn)
        .await
        .expect("the connection task");
    eprintln!("the HTTP/2 connection ended: {ended:?}");
    let idled = idle_from.elapsed();
    assert!(
        idled >= Duration::from_millis(250) && idled < Duration::from_secs(5),
        "closed after {idled:?}"
    );
    quiet_closes(&magpie, "keepalive_timeout", 1.0).await;
    magpie.stop().await;
}

/// An idle pooled connection is closed by the pool's timer, with no new
/// request to notice it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_upstream_connections_close_after_pool_idle_timeout() {
    let up = Upstream::start("a", Answer::Ok).await;
    let magpie = start(&http_settings("  pool_idle_timeout: 200ms\n"), &[up.pair()]).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    assert_eq!(client.get_session("s").await, "a");
    let idle_from = Instant::now();
    up.wait_closed(1).await;
    let idled = idle_from.elapsed();
    assert!(
        idled >= Duration::from_millis(150),
        "closed after {idled:?}"
    );
    // The next request opens a new connection.
    assert_eq!(client.get_session("s").await, "a");
    assert_eq!(up.accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
    magpie.stop().await;
}

/// Five requests at once need five connections; given back, only
/// `pool_max_idle_per_backend` of them stay, and those are reused (by new
/// client connections: `reuse: always`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_pool_max_idle_per_backend_connections_are_kept() {
    let up = Upstream::start("a", Answer::Ok).await;
    let magpie = start(
        &http_settings(
            "  pool_max_idle_per_backend: 2\n  pool_idle_timeout: 1h\n  reuse: always\n",
        ),
        &[up.pair()],
    )
    .await;
    let at_once = |n: usize| {
        let addr = magpie.addr;
        async move {
            let mut clients = Vec::new();
            for _ in 0..n {
                clients.push(KeepAlive::connect(addr).await);
            }
            let requests = clients.into_iter().map(|mut c| async move {
                let request = get(&format!("/hold/{n}")).body(Full::default());
                let (response, _) = c.send(request.expect("a request")).await;
                assert_eq!(response.status(), 200);
            });
            futures_join_all(requests).await;
        }
    };
    at_once(5).await;
    assert_eq!(up.accepted.load(std::sync::atomic::Ordering::SeqCst), 5);
    up.wait_closed(3).await;
    // The two kept serve two requests at once without a new connection.
    at_once(2).await;
    assert_eq!(up.accepted.load(std::sync::atomic::Ordering::SeqCst), 5);
    assert_eq!(up.closed.load(std::sync::atomic::Ordering::SeqCst), 3);
    magpie.stop().await;
}

/// A reload that removes a backend closes its idle pooled connections at
/// once; the kept backend's stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_backends_idle_connections_close_on_reload() {
    let a = Upstream::start("a", Answer::Ok).await;
    let b = Upstream::start("b", Answer::Ok).await;
    let settings = format!(
        "{}reload:\n  watch: false\n",
        http_settings("  pool_idle_timeout: 1h\n")
    );
    let file = TempFile::new(
        "magpie.yaml",
        &config_yaml("127.0.0.1:0", &settings, &[a.pair(), b.pair()]),
    );
    let magpie = Magpie::start_file(&file.path).await;
    let mut reloader = magpie.probe.reloader(file.path.clone());
    let on = |name: &str| {
        (0..)
            .map(|i| format!("s-{i}"))
            .find(|s| magpie.primary(magpie_core::key::text_key(s.as_bytes())) == name)
            .expect("some key goes to each backend")
    };
    let mut client = KeepAlive::connect(magpie.addr).await;
    assert_eq!(client.get_session(&on("a")).await, "a");
    assert_eq!(client.get_session(&on("b")).await, "b");
    std::fs::write(
        &file.path,
        config_yaml("127.0.0.1:0", &settings, &[a.pair()]),
    )
    .expect("rewrite the config");
    match reloader.reload(false).await {
        Ok(Outcome::Applied { removed, .. }) => assert_eq!(removed, ["b"]),
        other => panic!("the reload did not apply: {other:?}"),
    }
    b.wait_closed(1).await;
    assert_eq!(a.closed.load(std::sync::atomic::Ordering::SeqCst), 0);
    // a's pooled connection is still the one used.
    assert_eq!(client.get_session("anything").await, "a");
    assert_eq!(a.accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
    magpie.stop().await;
}

/// Awaits every future of `futures`, side by side.
async fn futures_join_all<F: std::future::Future<Output = ()> + Send + 'static>(
    futures: impl IntoIterator<Item = F>,
) {
    let tasks: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    for task in tasks {
        task.await.expect("a request task");
    }
}

/// A request body that stops arriving is cut after `http.body_timeout`,
/// through the pass-through (HTTP/1.1) and hyper's path (an HTTP/1.0
/// request, handed over): the client gets `408`, the slot it held (here
/// the queue's `max_inflight`) is given back for the next request, and the
/// backend is not blamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_body_is_cut_after_body_timeout_and_frees_its_slot() {
    let backends = HyperBackends::start(&["a"]).await;
    let settings = format!(
        "{}queue:\n  max_inflight: 2\n  timeout: 30s\n",
        http_settings("  body_timeout: 300ms\n")
    );
    let magpie = start(&settings, &backends.pairs()).await;
    let mut stalled = Vec::new();
    for version in ["1.1", "1.0"] {
        let mut stream = connect(magpie.addr).await;
        let head = format!(
            "POST / HTTP/{version}\r\nhost: m\r\nx-session-id: s\r\ncontent-length: 1000\r\n\r\n"
        );
        stream
            .write_all(head.as_bytes())
            .await
            .expect("send a head");
        stream
            .write_all(&[b'x'; 38])
            .await
            .expect("38 of 1000 bytes");
        stalled.push(stream);
    }
    let a = magpie.backend("a");
    within("both stalled requests to hold their slot", async {
        while a.active() < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // A third request waits for a slot: it gets one once the bodies are cut.
    let started = Instant::now();
    let mut client = KeepAlive::connect(magpie.addr).await;
    assert_eq!(client.get_session("next").await, "a");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the stalled bodies held the slots for {:?}",
        started.elapsed()
    );
    for stream in &mut stalled {
        let mut buf = Vec::new();
        let body_in = |b: &[u8]| find(b, b"http.body_timeout").map(|at| at + 17);
        within("the 408", read_until(stream, &mut buf, body_in))
            .await
            .expect("an answer");
        let answer = String::from_utf8_lossy(&buf);
        assert!(
            answer.starts_with("HTTP/1.") && answer.contains(" 408 "),
            "{answer:?}"
        );
    }
    assert_eq!(magpie.client_failures("body_timeout"), 2);
    let errors = ["code_class=\"error\""];
    let blamed = magpie.backend_metric("magpie_backend_requests_total", "a", &errors);
    assert_eq!(blamed, 0, "the backend was blamed");
    assert!(a.is_up());
    magpie.stop().await;
}
