//! Slow, garbage and too many clients.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use magpie::key::{self, FallbackReason};

use crate::support::*;

const HEADER_100MS: &str =
    "key:\n  from: header\n  header: x-session-id\n  read_timeout: 100ms\n  fallback: source_ip\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_head_falls_back_after_read_timeout() {
    let mut backends = RawBackends::start(&["a", "b", "c"], Behaviour::GreetEcho).await;
    let magpie = Magpie::with(HEADER_100MS, &backends.list).await;
    let stats = &magpie.shared.stats;
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
    assert_eq!(stats.fallbacks(FallbackReason::Timeout), 4);
    assert_eq!(stats.fallbacks(FallbackReason::NotHttp), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_first_bytes_fall_back_and_reach_the_backend_intact() {
    let mut backends = RawBackends::start(&["a", "b", "c"], Behaviour::GreetEcho).await;
    // A long read_timeout: not-HTTP must be decided from the bytes, not by waiting.
    let settings =
        "key:\n  from: header\n  header: x-session-id\n  read_timeout: 5s\n  fallback: source_ip\n";
    let magpie = Magpie::with(settings, &backends.list).await;
    let stats = &magpie.shared.stats;
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
    assert_eq!(stats.fallbacks(FallbackReason::NotHttp), 3);
    assert_eq!(stats.fallbacks(FallbackReason::Timeout), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_closes_the_excess_client_at_once() {
    let backends = RawBackends::start(&["a"], Behaviour::GreetEcho).await;
    let magpie = Magpie::with("max_connections: 2\n", &backends.list).await;
    let stats = &magpie.shared.stats;

    let mut first = connect(magpie.addr).await;
    let mut second = connect(magpie.addr).await;
    assert_eq!(read_greeting(&mut first).await, "a");
    assert_eq!(read_greeting(&mut second).await, "a");
    assert_eq!(stats.rejected(), 0);

    let mut third = connect(magpie.addr).await;
    match read_until_closed(&mut third).await {
        Ok(bytes) => assert!(
            bytes.is_empty(),
            "the third client reached a backend: {:?}",
            String::from_utf8_lossy(&bytes)
        ),
        Err(e) => eprintln!("third client closed with an error (accepted): {e}"),
    }
    assert_eq!(stats.rejected(), 1);
    assert_eq!(stats.accepted(), 3);

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
    assert_eq!(magpie.backend("a").live.active(), 2);
}
