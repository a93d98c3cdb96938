//! `mode: http`: one key per request, through real sockets and real HTTP
//! clients (hyper's, over one keep-alive connection, as SDKs and gateways do).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;

/// `mode: http` keyed by `x-session-id`, `extra` YAML lines added.
fn http_settings(extra: &str) -> String {
    format!("mode: http\nkey:\n  from: header\n  header: x-session-id\n{extra}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_keep_alive_connection_carries_many_sessions() {
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let magpie = Magpie::with(&http_settings(""), &backends.pairs()).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let mut seen: HashMap<String, Vec<String>> = HashMap::new();
    // 20 sessions, two requests each, interleaved on one connection.
    for round in 0..2 {
        for s in 0..20 {
            let session = format!("conv-{s}");
            let backend = client.get_session(&session).await;
            seen.entry(session).or_default().push(backend);
        }
        assert_eq!(seen.values().map(Vec::len).sum::<usize>(), 20 * (round + 1));
    }
    let mut per_backend: HashMap<String, usize> = HashMap::new();
    for (session, backends_seen) in &seen {
        assert!(
            backends_seen.iter().all(|b| b == &backends_seen[0]),
            "{session} was split: {backends_seen:?}"
        );
        assert_eq!(
            backends_seen[0],
            magpie.primary(magpie_core::key::text_key(session.as_bytes())),
            "{session} is not on its table primary"
        );
        *per_backend.entry(backends_seen[0].clone()).or_default() += 1;
    }
    for name in ["a", "b", "c"] {
        let share = per_backend.get(name).copied().unwrap_or(0) as f64 / 20.0;
        assert!(
            (0.15..=0.5).contains(&share),
            "backend {name} took {share} of the sessions: {per_backend:?}"
        );
    }
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_from_json_bodies_and_header_precedence() {
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let primary = |m: &Magpie, k: &str| m.primary(magpie_core::key::text_key(k.as_bytes()));

    // Header first, body field when the header is absent.
    let magpie = Magpie::with(
        &http_settings("  body_field: prompt_cache_key\n"),
        &backends.pairs(),
    )
    .await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    for s in 0..12 {
        let key = format!("pck-{s}");
        let json = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"prompt_cache_key":"{key}"}}"#
        );
        assert_eq!(client.post_json(&json, None).await, primary(&magpie, &key));
        // The header wins over the body.
        let other = format!("hdr-{s}");
        assert_eq!(
            client.post_json(&json, Some(&other)).await,
            primary(&magpie, &other)
        );
    }
    magpie.stop().await;

    // A JSON pointer into a nested object.
    let settings = "mode: http\nkey:\n  from: body\n  body_field: /metadata/session_id\n";
    let magpie = Magpie::with(settings, &backends.pairs()).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    for s in 0..12 {
        let key = format!("nested-{s}");
        let json = format!(r#"{{"metadata":{{"user":"u","session_id":"{key}"}},"input":"x"}}"#);
        assert_eq!(client.post_json(&json, None).await, primary(&magpie, &key));
    }
    // No such field: the fallback key, counted.
    client.post_json(r#"{"metadata":{}}"#, None).await;
    assert_eq!(
        magpie.fallbacks(magpie_core::key::FallbackReason::MissingField),
        1
    );
    magpie.stop().await;
}

/// The client gets the first chunk while the backend still holds the second:
/// nothing is buffered on the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_responses_are_not_buffered() {
    let backends = HyperBackends::start(&["a"]).await;
    let magpie = Magpie::with(&http_settings(""), &backends.pairs()).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let response = client
        .start(get("/stream").body(Full::default()).expect("a request"))
        .await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    assert_eq!(&next_data(&mut body).await[..], b"first from a\n");
    // Only now may the backend send its second chunk.
    backends.release(1);
    let rest = within("the rest", body.collect())
        .await
        .expect("the rest")
        .to_bytes();
    assert_eq!(&rest[..], b"second\n");
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_bodies_pass_byte_for_byte_both_ways() {
    const SIZE: usize = 64 << 20;
    let backends = HyperBackends::start(&["a"]).await;
    let magpie = Magpie::with(&http_settings(""), &backends.pairs()).await;
    let mut client = KeepAlive::connect(magpie.addr).await;

    let sent = Bytes::from(pseudo_random(SIZE, 3));
    let request = Request::post("/echo")
        .header("host", "magpie")
        .header("x-session-id", "big")
        .body(Full::new(sent.clone()))
        .expect("a request");
    let (response, echoed) = within_for(
        Duration::from_secs(60),
        "a 64 MiB echo",
        client.send(request),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert!(
        echoed == sent,
        "the echoed body differs ({} bytes back)",
        echoed.len()
    );

    let request = get(&format!("/bytes/{SIZE}"))
        .body(Full::default())
        .expect("a request");
    let (response, got) = within_for(
        Duration::from_secs(60),
        "a 64 MiB download",
        client.send(request),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert!(
        got == pseudo_random(SIZE, 7),
        "the download differs ({} bytes)",
        got.len()
    );
    magpie.stop().await;
}

/// A backend dies: its sessions go to their second candidate, no other
/// session moves, and once health marks it down no request fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_backend_moves_only_its_sessions() {
    let mut backends = HyperBackends::start(&["a", "b", "c"]).await;
    let settings = http_settings(
        "health:\n  interval: 100ms\n  timeout: 50ms\n  fall: 1\n  rise: 1\n  http_path: /health\n",
    );
    let magpie = Magpie::with(&settings, &backends.pairs()).await;
    let sessions: Vec<String> = (0..30).map(|s| format!("s-{s}")).collect();
    let candidates: HashMap<String, Vec<String>> = sessions
        .iter()
        .map(|s| {
            (
                s.clone(),
                magpie.candidates(magpie_core::key::text_key(s.as_bytes())),
            )
        })
        .collect();
    let victim = candidates["s-0"][0].clone();
    backends.kill(&victim);
    let down = magpie.backend(&victim);
    within("the dead backend to be marked down", async {
        while down.is_up() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    for s in &sessions {
        let got = client.get_session(s).await;
        let c = &candidates[s];
        let expected = if c[0] == victim { &c[1] } else { &c[0] };
        assert_eq!(&got, expected, "session {s} (candidates {c:?})");
    }

    // A backend that accepts connections but whose /health says 503.
    let sick = candidates["s-0"]
        .iter()
        .find(|n| **n != victim)
        .expect("another backend")
        .clone();
    backends.get(&sick).health.store(503, Ordering::SeqCst);
    let sick_live = magpie.backend(&sick);
    within("the sick backend to be marked down", async {
        while sick_live.is_up() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let bad_status = ["result=\"bad_status\""];
    let checks = magpie.backend_metric("magpie_backend_health_checks_total", &sick, &bad_status);
    assert!(checks >= 1, "{checks}");
    magpie.stop().await;
}

/// Sixty concurrent streaming requests for one hot key with c = 1.25: the
/// caps bind, and no backend ever holds more than its cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_load_counts_requests_in_flight() {
    const N: usize = 60;
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let settings = format!(
        "{}placement:\n  bounded_load: 1.25\nconnect:\n  attempts: 3\n",
        http_settings("")
    );
    let magpie = Magpie::with(&settings, &backends.pairs()).await;
    let mut streams = Vec::new();
    for _ in 0..N {
        let mut client = KeepAlive::connect(magpie.addr).await;
        let response = client
            .start(
                get("/slow")
                    .header("x-session-id", "hot")
                    .body(Full::default())
                    .expect("a request"),
            )
            .await;
        assert_eq!(response.status(), 200);
        streams.push((client, response));
    }
    // The bound for the last request: the larger of ceil(1.25 · 60 / 3) = 25
    // and the mean plus the default spill_min_excess, 20 + 8.
    let cap = magpie_core::placement::bounded::spill_cap(1.25, 8, N as u64 - 1, 1, 3);
    assert_eq!(cap, 28);
    for b in &backends.list {
        let max = b.max_in_flight.load(Ordering::SeqCst);
        assert!(
            max <= cap,
            "backend {} held {max} at once (cap {cap})",
            b.name
        );
    }
    let in_flight: u64 = backends
        .list
        .iter()
        .map(|b| b.in_flight.load(Ordering::SeqCst))
        .sum();
    assert_eq!(in_flight, N as u64);
    let spills: u64 = magpie
        .active()
        .iter()
        .map(|(name, _)| {
            magpie.backend_metric("magpie_backend_spills_total", name, &["reason=\"at_cap\""])
        })
        .sum();
    assert!(spills > 0, "the caps never bound");
    backends.release(N);
    for (_, response) in streams {
        within("a slow response to end", response.into_body().collect())
            .await
            .expect("the body");
    }
    magpie.stop().await;
}

/// Pins keep live sessions where they are when a reload adds a backend; new
/// sessions use the new table; a pin unused for `ttl` is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_pins_survive_scale_up_and_expire() {
    let backends = HyperBackends::start(&["a", "b", "c", "d"]).await;
    let pairs = backends.pairs();
    let settings = http_settings("sessions:\n  ttl: 1s\n  max: 1000\nreload:\n  watch: false\n");
    let file = TempFile::new(
        "magpie.yaml",
        &config_yaml("127.0.0.1:0", &settings, &pairs[..3]),
    );
    let magpie = Magpie::start_file(&file.path).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let old: Vec<(String, String)> = {
        let mut v = Vec::new();
        for s in 0..40 {
            let key = format!("old-{s}");
            let b = client.get_session(&key).await;
            v.push((key, b));
        }
        v
    };
    // Scale up to four: reload through SIGHUP's code path.
    std::fs::write(&file.path, config_yaml("127.0.0.1:0", &settings, &pairs)).expect("rewrite");
    let mut reloader = magpie.probe.reloader(file.path.clone());
    reloader.reload(true).await.expect("the reload applies");
    assert_eq!(magpie.probe.backends().len(), 4);
    let mut moved_by_table = 0;
    for (key, before) in &old {
        assert_eq!(&client.get_session(key).await, before, "pinned {key} moved");
        if magpie.primary(magpie_core::key::text_key(key.as_bytes())) != *before {
            moved_by_table += 1;
        }
    }
    assert!(
        moved_by_table > 0,
        "no pinned key would have moved without its pin"
    );
    let mut on_d = 0;
    for s in 0..40 {
        if client.get_session(&format!("new-{s}")).await == "d" {
            on_d += 1;
        }
    }
    assert!(on_d > 0, "no new session reached the new backend");
    // Unused for longer than ttl: the pin is gone and the table decides.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (key, _) = old
        .iter()
        .find(|(k, b)| magpie.primary(magpie_core::key::text_key(k.as_bytes())) != *b)
        .expect("a key the table moved");
    assert_eq!(
        client.get_session(key).await,
        magpie.primary(magpie_core::key::text_key(key.as_bytes()))
    );
    magpie.stop().await;
}

/// What a hostile or broken client gets: a status, never a panic, and the
/// next client is served as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_its_status_and_harms_nobody() {
    let backends = HyperBackends::start(&["a", "b"]).await;
    let settings = "mode: http\nkey:\n  from: header\n  header: x-session-id\n  body_field: user\n  read_timeout: 300ms\n  max_bytes: 16777216\n";
    let magpie = Magpie::with(settings, &backends.pairs()).await;
    let raw = |bytes: Vec<u8>| async move {
        let mut s = connect(magpie.addr).await;
        s.write_all(&bytes).await.expect("send");
        let mut out = Vec::new();
        within("magpie to answer and close", s.read_to_end(&mut out))
            .await
            .ok();
        String::from_utf8_lossy(&out).into_owned()
    };
    // Not HTTP.
    let answer = raw(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n".to_vec()).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    // hyper answered it; it counts as a bad request all the same.
    let bad_requests = |m: &Magpie| m.client_failures("bad_request");
    assert_eq!(bad_requests(&magpie), 1);
    // A head larger than max_bytes (here a smaller limit, so that the head
    // arrives well within read_timeout).
    let small = Magpie::with(
        "mode: http\nkey:\n  from: header\n  header: x-session-id\n  max_bytes: 65536\n",
        &backends.pairs(),
    )
    .await;
    let mut big = b"GET / HTTP/1.1\r\nhost: m\r\nx-pad: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 1 << 20));
    big.extend_from_slice(b"\r\n\r\n");
    let mut s = connect(small.addr).await;
    // magpie may answer (and stop reading) before all of it was sent.
    if let Err(e) = s.write_all(&big).await {
        eprintln!("the oversized head was cut short: {e}");
    }
    let mut out = Vec::new();
    within("the 431", s.read_to_end(&mut out)).await.ok();
    let answer = String::from_utf8_lossy(&out);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");
    assert_eq!(bad_requests(&small), 1);
    small.stop().await;
    // A head that stops half-way: 408 after read_timeout.
    let mut s = connect(magpie.addr).await;
    s.write_all(b"GET / HTTP/1.1\r\nhost: m\r\n")
        .await
        .expect("send");
    let mut out = Vec::new();
    within("the 408", s.read_to_end(&mut out)).await.ok();
    let answer = String::from_utf8_lossy(&out);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    // A body that stops half-way while it is read for the key: 400, counted.
    let mut s = connect(magpie.addr).await;
    s.write_all(b"POST / HTTP/1.1\r\nhost: m\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"user\": ")
        .await
        .expect("send");
    s.shutdown().await.expect("half-close");
    let mut out = Vec::new();
    within("the 400", s.read_to_end(&mut out)).await.ok();
    let answer = String::from_utf8_lossy(&out);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    assert_eq!(bad_requests(&magpie), 2);
    // A CR/LF smuggled into the key's value is not a header.
    let answer =
        raw(b"GET / HTTP/1.1\r\nhost: m\r\nx-session-id: a\rx-evil: 1\r\n\r\n".to_vec()).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");

    let mut client = KeepAlive::connect(magpie.addr).await;
    // A body that is not JSON despite its type: the fallback key, counted.
    client.post_json("{not json", None).await;
    assert_eq!(
        magpie.fallbacks(magpie_core::key::FallbackReason::NotJson),
        1
    );
    // A 10 MB JSON body with the field at its end.
    let filler = "x".repeat(10 << 20);
    let json = format!(r#"{{"messages":[{{"content":"{filler}"}}],"user":"late-key"}}"#);
    assert_eq!(
        client.post_json(&json, None).await,
        magpie.primary(magpie_core::key::text_key(b"late-key"))
    );
    // A client that leaves mid-stream: the backend's response is abandoned
    // and counted, and its in-flight slot is given back.
    let response = client
        .start(
            get("/slow")
                .header("x-session-id", "leaver")
                .body(Full::default())
                .expect("a request"),
        )
        .await;
    let backend = magpie.backend(&magpie.primary(magpie_core::key::text_key(b"leaver")));
    assert_eq!(backend.active(), 1);
    drop(response);
    drop(client);
    within("the abandoned request to be released", async {
        while backend.active() > 0 || aborts(&magpie, backend.name()) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // And the next client is served as usual.
    let mut client = KeepAlive::connect(magpie.addr).await;
    assert_eq!(
        client.get_session("after").await,
        magpie.primary(magpie_core::key::text_key(b"after"))
    );
    magpie.stop().await;
}

/// `magpie demo` (mode http, simulated engines): the binary's own demo keys
/// each request, so sessions on one connection reach their own replicas,
/// by header or by the body's `prompt_cache_key`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_routes_per_request() {
    let mut child = Child::spawn(&["demo", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]);
    let addr = child.listen_addr().await;
    let admin = child.admin_addr().await;
    let mut client = KeepAlive::connect(addr).await;
    let chat = |header: Option<&str>, body_key: &str| {
        let body = format!(
            r#"{{"model": "m",{body_key} "messages": [{{"role": "user", "content": "hi"}}]}}"#
        );
        let mut builder = Request::post("/v1/chat/completions")
            .header("host", "magpie")
            .header("content-type", "application/json");
        if let Some(h) = header {
            builder = builder.header("x-session-id", h);
        }
        builder
            .body(Full::new(Bytes::from(body)))
            .expect("a request")
    };
    let served = |response: &hyper::Response<()>| -> String {
        let name = response.headers().get("x-magpie-backend");
        name.and_then(|v| v.to_str().ok())
            .expect("named")
            .to_string()
    };
    for session in ["alice", "bob", "carol", "dave", "erin", "frank"] {
        let (response, body) = client.send(chat(Some(session), "")).await;
        assert_eq!(response.status(), 200, "{body:?}");
        assert!(String::from_utf8_lossy(&body).contains("cached_tokens"));
        let (status, route) = admin_get(admin, &format!("/route?key={session}")).await;
        assert_eq!(status, 200);
        let route: serde_json::Value = serde_json::from_str(&route).expect("JSON");
        assert_eq!(route["chosen"], served(&response).as_str(), "{session}");
    }
    // And by the body, when there is no header.
    let (by_body, _) = client
        .send(chat(None, r#" "prompt_cache_key": "alice","#))
        .await;
    let (by_header, _) = client.send(chat(Some("alice"), "")).await;
    assert_eq!(served(&by_body), served(&by_header));
}

/// A trusted peer's PROXY header makes its source the client in mode http
/// too: with `key.from: source_ip`, every request of the connection is keyed
/// by the address the header names, and the bytes after the header are the
/// first request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_header_names_the_client_in_mode_http() {
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let settings = "mode: http\nproxy_protocol:\n  accept_from: [127.0.0.1]\n";
    let magpie = Magpie::with(settings, &backends.pairs()).await;
    for last in 1..=12u8 {
        let client: std::net::SocketAddr = format!("192.0.2.{last}:4000").parse().expect("literal");
        let mut stream = connect(magpie.addr).await;
        let mut sent = magpie_proxy::parsers::v2_header(client, magpie.addr);
        sent.extend_from_slice(b"GET / HTTP/1.1\r\nhost: m\r\nconnection: close\r\n\r\n");
        stream.write_all(&sent).await.expect("send");
        let mut out = Vec::new();
        within("the answer", stream.read_to_end(&mut out))
            .await
            .expect("read");
        let text = String::from_utf8_lossy(&out);
        let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
        assert_eq!(
            backend_in(body.as_bytes()),
            magpie.primary(magpie_core::key::source_ip_key(client.ip())),
            "{text}"
        );
    }
    magpie.stop().await;
}

/// HTTP/2 with prior knowledge: streams of one connection are keyed one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_streams_are_keyed_one_by_one() {
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let magpie = Magpie::with(&http_settings(""), &backends.pairs()).await;
    let (mut sender, _conn) = h2_connect(magpie.addr).await;
    for s in 0..12 {
        let session = format!("h2-{s}");
        let request = Request::get(format!("http://magpie/{s}"))
            .header("x-session-id", &session)
            .body(Full::<Bytes>::default())
            .expect("a request");
        let response = within("an HTTP/2 response", sender.send_request(request))
            .await
            .expect("a response");
        assert_eq!(response.status(), 200);
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        assert_eq!(
            backend_in(&body),
            magpie.primary(magpie_core::key::text_key(session.as_bytes()))
        );
    }
    magpie.stop().await;
}

/// Requests to `backend` whose client went away before their answer ended.
fn aborts(magpie: &Magpie, backend: &str) -> u64 {
    magpie.backend_metric("magpie_backend_client_aborts_total", backend, &[])
}
