//! `key.from: sni` in mode tcp: TLS passed through to real TLS backends,
//! keyed by the ClientHello's server name.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use magpie_core::key::sni::server_name_key;
use magpie_core::key::{self, FallbackReason};

use crate::support::*;

const SNI: &str = "key:\n  from: sni\n  read_timeout: 5s\n  fallback: source_ip\n";

/// Twenty server names, and a CA whose certificate for the backends
/// carries them all (and 127.0.0.1, for a client that sends no name).
fn names() -> Vec<String> {
    (0..20).map(|i| format!("svc-{i}.example.test")).collect()
}

async fn tls_backends(ca: &BackendCa) -> TlsEchoBackends {
    let names = names();
    let mut sans: Vec<&str> = names.iter().map(String::as_str).collect();
    sans.push("127.0.0.1");
    TlsEchoBackends::start(&["a", "b", "c"], ca.server_config(&sans, &[])).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_server_name_keeps_to_one_backend_through_a_full_handshake() {
    let ca = BackendCa::new("sni test CA");
    let mut backends = tls_backends(&ca).await;
    let magpie = Magpie::with(SNI, &backends.list).await;
    let mut reached: HashMap<String, String> = HashMap::new();
    for round in 0..3 {
        for (i, name) in names().iter().enumerate() {
            let stream = connect(magpie.addr).await;
            let (mut tls, backend) = tls_hello(stream, name, ca.client_config(), 1 << 20).await;
            assert_eq!(backends.next_accepted().await, backend);
            assert_eq!(
                backend,
                magpie.primary(server_name_key(name.as_bytes())),
                "{name}: not the server name's backend"
            );
            if let Some(before) = reached.insert(name.clone(), backend.clone()) {
                assert_eq!(before, backend, "{name} moved in round {round}");
            }
            // The handshake went through unchanged bytes; so does the data.
            let line = format!("round {round} client {i}\n");
            tls.write_all(line.as_bytes()).await.expect("send");
            let mut echoed = vec![0u8; line.len()];
            within("the echo", tls.read_exact(&mut echoed))
                .await
                .expect("read the echo");
            assert_eq!(echoed, line.as_bytes());
        }
    }
    let spread: std::collections::HashSet<_> = reached.values().collect();
    assert!(spread.len() >= 2, "20 names all on {spread:?}");
    for reason in FallbackReason::ALL {
        assert_eq!(magpie.fallbacks(reason), 0, "{reason:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hello_in_small_records_and_segments_still_routes_by_name() {
    let ca = BackendCa::new("sni test CA");
    let mut backends = tls_backends(&ca).await;
    let magpie = Magpie::with(SNI, &backends.list).await;
    let mut config = ca.client_config();
    // The smallest records rustls makes: the hello takes several.
    config.max_fragment_size = Some(64);
    for name in names().iter().take(5) {
        let stream = connect(magpie.addr).await;
        let (mut tls, backend) = tls_hello(stream, name, config.clone(), 7).await;
        assert_eq!(backends.next_accepted().await, backend);
        assert_eq!(backend, magpie.primary(server_name_key(name.as_bytes())));
        tls.write_all(b"ping\n").await.expect("send");
        let mut echoed = [0u8; 5];
        within("the echo", tls.read_exact(&mut echoed))
            .await
            .expect("read the echo");
        assert_eq!(&echoed, b"ping\n");
    }
    for reason in FallbackReason::ALL {
        assert_eq!(magpie.fallbacks(reason), 0, "{reason:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_server_name_and_no_tls_fall_back_to_the_address_and_are_counted() {
    let ca = BackendCa::new("sni test CA");
    let mut backends = tls_backends(&ca).await;
    let magpie = Magpie::with(SNI, &backends.list).await;
    for last in [2u8, 3, 4] {
        let source = loopback(last);
        let started = Instant::now();
        // An IP address as the server name: rustls sends no SNI.
        let stream = connect_from(source, magpie.addr).await;
        let (_tls, backend) = tls_hello(stream, "127.0.0.1", ca.client_config(), 1 << 20).await;
        assert_eq!(backends.next_accepted().await, backend);
        assert_eq!(backend, magpie.primary(key::source_ip_key(source)));

        // Not TLS at all: decided from the first byte, not the 5s timeout.
        let mut plain = connect_from(source, magpie.addr).await;
        plain
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("send");
        let backend = backends.next_accepted().await;
        assert_eq!(backend, magpie.primary(key::source_ip_key(source)));
        // The TLS backend refuses it; the client sees the connection end.
        let _ = within("the backend to close", read_until_closed(&mut plain)).await;
        assert!(started.elapsed() < Duration::from_secs(4));
    }
    assert_eq!(magpie.fallbacks(FallbackReason::NoSni), 3);
    assert_eq!(magpie.fallbacks(FallbackReason::NotTls), 3);
    assert_eq!(magpie.fallbacks(FallbackReason::Timeout), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_a_hello_falls_back_at_read_timeout_and_reaches_the_backend_intact() {
    let mut backends = RawBackends::start(&["a", "b", "c"], Behaviour::GreetEcho).await;
    let settings = "key:\n  from: sni\n  read_timeout: 100ms\n  fallback: source_ip\n";
    let magpie = Magpie::with(settings, &backends.list).await;
    let hello = first_flight("stalled.example.test");
    let half = &hello[..hello.len() / 2];
    for last in [2u8, 3] {
        let source = loopback(last);
        let mut client = connect_from(source, magpie.addr).await;
        let started = Instant::now();
        client.write_all(half).await.expect("send half a hello");
        let got = read_greeting(&mut client).await;
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(90),
            "{source}: routed after {waited:?}, before the 100ms read_timeout"
        );
        assert_eq!(got, magpie.primary(key::source_ip_key(source)));
        let mut echoed = vec![0u8; half.len()];
        within("the replayed bytes", client.read_exact(&mut echoed))
            .await
            .expect("read the echo");
        assert_eq!(echoed, half);
        drop(client);
        assert_eq!(backends.next_report().await.bytes, half);
    }
    assert_eq!(magpie.fallbacks(FallbackReason::Timeout), 2);
}

/// A rustls client's first flight for `name`.
fn first_flight(name: &str) -> Vec<u8> {
    let ca = BackendCa::new("unused");
    let server = rustls::pki_types::ServerName::try_from(name.to_string()).expect("a name");
    let mut client = rustls::ClientConnection::new(std::sync::Arc::new(ca.client_config()), server)
        .expect("a client");
    let mut flight = Vec::new();
    client.write_tls(&mut flight).expect("the hello");
    flight
}
