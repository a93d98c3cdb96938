//! Slow, garbage and too many clients.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use magpie_core::key::{self, FallbackReason};

use crate::support::*;

const HEADER_100MS: &str =
    "key:\n  from: header\n  header: x-session-id\n  read_timeout: 100ms\n  fallback: source_ip\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_head_falls_back_after_read_timeout() {
    let mut backends = RawBackends::start(&["a", "b", "c"], Behaviour::GreetEcho).await;
    let magpie = Magpie::with(HEADER_100MS, &backends.list).await;
    let half = b"GET /v1/chat HTTP/1.1\r\nHost: x\r\nx-session-id: never-fin";

    for last in [2u8, 3, 4, 5] {
        let source = loopback(last);
        let mut client = connect_from(source, magpie.addr).await;
        let started = Instant::now();
        client.write_all(half).await.expect("send half a head");
        // The client stalls; only the fallback can get it a backend.
        let got = read_greeting(&mut client).await;
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(90),
            "{source}: routed after {waited:?}, before the 100ms read_timeout"
        );
        assert_eq!(
            got,
            magpie.primary(key::source_ip_key(source)),
            "{source}: not routed by the source-IP fallback key"
        );
        // The bytes read while waiting were replayed to the backend.
        let mut echoed = vec![0u8; half.len()];
        within(
            "the replayed bytes to echo back",
            client.read_exact(&mut echoed),
        )
        .await
        .expect("read the echo");
        assert_eq!(echoed, half);
        drop(client);
        let report = backends.next_report().await;
        assert_eq!(report.bytes, half);
    }
    assert_eq!(magpie.fallbacks(FallbackReason::Timeout), 4);
    assert_eq!(magpie.fallbacks(FallbackReason::NotHttp), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_first_bytes_fall_back_and_reach_the_backend_intact() {
    let mut backends = RawBackends::start(&["a", "b", "c"], Behaviour::GreetEcho).await;
    // A long read_timeout: not-HTTP must be decided from the bytes, not by waiting.
    let settings =
        "key:\n  from: header\n  header: x-session-id\n  read_timeout: 5s\n  fallback: source_ip\n";
    let magpie = Magpie::with(settings, &backends.list).await;
    // The start of a TLS ClientHello, then binary noise.
    let mut garbage = vec![
        0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
    ];
    garbage.extend(pseudo_random(3000, 7));

    for last in [2u8, 3, 4] {
        let source = loopback(last);
        let mut client = connect_from(source, magpie.addr).await;
        let started = Instant::now();
        client.write_all(&garbage).await.expect("send garbage");
        let got = read_greeting(&mut client).await;
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "not-HTTP bytes waited for the read_timeout"
        );
        assert_eq!(got, magpie.primary(key::source_ip_key(source)));
        let mut echoed = vec![0u8; garbage.len()];
        within("the garbage to echo back", client.read_exact(&mut echoed))
            .await
            .expect("read the echo");
        assert!(echoed == garbage, "the bytes changed on the way");
        client.shutdown().await.expect("shut down the write half");
        let rest = read_until_closed(&mut client).await.expect("clean close");
        assert!(rest.is_empty(), "unexpected trailing bytes {rest:?}");
        let report = backends.next_report().await;
        assert!(report.bytes == garbage, "the backend got other bytes");
    }
    assert_eq!(magpie.fallbacks(FallbackReason::NotHttp), 3);
    assert_eq!(magpie.fallbacks(FallbackReason::Timeout), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_closes_the_excess_client_at_once() {
    let backends = RawBackends::start(&["a"], Behaviour::GreetEcho).await;
    let magpie = Magpie::with("max_connections: 2\n", &backends.list).await;

    let mut first = connect(magpie.addr).await;
    let mut second = connect(magpie.addr).await;
    assert_eq!(read_greeting(&mut first).await, "a");
    assert_eq!(read_greeting(&mut second).await, "a");
    assert_eq!(magpie.metric("magpie_connections_rejected_total", &[]), 0);

    let mut third = connect(magpie.addr).await;
    match read_until_closed(&mut third).await {
        Ok(bytes) => assert!(
            bytes.is_empty(),
            "the third client reached a backend: {:?}",
            String::from_utf8_lossy(&bytes)
        ),
        Err(e) => eprintln!("third client closed with an error (accepted): {e}"),
    }
    assert_eq!(magpie.metric("magpie_connections_rejected_total", &[]), 1);
    assert_eq!(magpie.metric("magpie_connections_accepted_total", &[]), 3);

    // The two admitted connections still work.
    for stream in [&mut first, &mut second] {
        stream.write_all(b"ping").await.expect("send");
        let mut echo = [0u8; 4];
        within(
            "an echo on an admitted connection",
            stream.read_exact(&mut echo),
        )
        .await
        .expect("read the echo");
        assert_eq!(&echo, b"ping");
    }
    assert_eq!(magpie.backend("a").active(), 2);
}

/// A client whose request carries no key gets the fallback key; `lookup
/// --addr` and `/route?addr=` answer for such a client, through the real
/// binary, and name the backend that served it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_and_route_answer_for_a_fallback_client() {
    let backends = RawBackends::start(&["a", "b", "c", "d"], Behaviour::GreetEcho).await;
    let settings = format!("{SESSION_KEY}  fallback: source_ip\nreload:\n  watch: false\n");
    let file = TempFile::new(
        "magpie.yaml",
        &config_yaml_with_admin("127.0.0.1:0", &settings, &backends.list),
    );
    let path = file.path.to_str().expect("UTF-8 path");
    let mut child = Child::spawn(&["run", "--config", path]);
    let addr = child.listen_addr().await;
    let admin = child.admin_addr().await;
    for last in [5u8, 6, 7] {
        let source = loopback(last);
        let mut client = connect_from(source, addr).await;
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("a request without the header");
        let served_by = read_greeting(&mut client).await;

        let out = std::process::Command::new(magpie_bin())
            .args(["lookup", "--addr", "--config", path, &source.to_string()])
            .output()
            .expect("run lookup");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let named = stdout.split('\t').nth(1).unwrap_or_default();
        assert_eq!(named, served_by, "lookup --addr {source}: {stdout}");

        let (status, body) = admin_get(admin, &format!("/route?addr={source}:4321")).await;
        assert_eq!(status, 200, "{body}");
        let answer: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(answer["chosen"], served_by.as_str(), "{body}");
    }
}

/// A valid request with more than 64 header lines keeps its key (it used to
/// be taken for not-HTTP and fall back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_many_headers_keeps_its_key() {
    let backends = RawBackends::start(&["a", "b", "c", "d"], Behaviour::GreetEcho).await;
    let magpie = Magpie::with(SESSION_KEY, &backends.list).await;
    for session in ["s1", "s2", "s3", "s4"] {
        let mut request = String::from("GET / HTTP/1.1\r\nHost: x\r\n");
        for i in 0..150 {
            request.push_str(&format!("x-trace-{i}: {i}\r\n"));
        }
        request.push_str(&format!("x-session-id: {session}\r\n\r\n"));
        let mut client = connect(magpie.addr).await;
        client.write_all(request.as_bytes()).await.expect("send");
        let served_by = read_greeting(&mut client).await;
        assert_eq!(served_by, magpie.primary(key::text_key(session.as_bytes())));
    }
    assert_eq!(magpie.fallbacks(FallbackReason::NotHttp), 0);
    magpie.stop().await;
}
