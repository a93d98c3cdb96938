//! PROXY protocol: in from trusted peers only, v2 out to backends.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use magpie_core::key;
use magpie_proxy::parsers::{self as proxy_protocol, Origin};

use crate::support::*;

const TRUST_LOCALHOST: &str = "proxy_protocol:\n  accept_from: [127.0.0.1]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v2_from_a_trusted_peer_makes_the_client_address_the_key() {
    let mut backends = RawBackends::start(&["a", "b", "c"], Behaviour::GreetEcho).await;
    let magpie = Magpie::with(TRUST_LOCALHOST, &backends.list).await;
    let own_primary = magpie.primary(key::source_ip_key(loopback(1)));

    let mut chosen = BTreeSet::new();
    for last in 1..=9u8 {
        let client: SocketAddr = format!("192.0.2.{last}:40000").parse().expect("literal");
        let expected = magpie.primary(key::source_ip_key(client.ip()));
        let mut stream = connect(magpie.addr).await;
        let mut sent = proxy_protocol::v2_header(client, magpie.addr);
        sent.extend_from_slice(b"payload");
        stream.write_all(&sent).await.expect("send header and data");
        assert_eq!(read_greeting(&mut stream).await, expected, "for {client}");
        // Only the data after the header reaches the backend.
        let mut echo = [0u8; 7];
        within("the echo", stream.read_exact(&mut echo))
            .await
            .expect("read the echo");
        assert_eq!(&echo, b"payload");
        drop(stream);
        assert_eq!(backends.next_report().await.bytes, b"payload");
        chosen.insert(expected);
    }
    assert!(
        chosen.iter().any(|name| *name != own_primary),
        "every 192.0.2.x address maps where 127.0.0.1 does ({own_primary}); the test cannot tell"
    );
    assert_eq!(magpie.client_failures("proxy_protocol"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_peer_sending_a_proxy_header_is_refused() {
    let mut backends = RawBackends::start(&["a"], Behaviour::Silent).await;
    let magpie = Magpie::with(TRUST_LOCALHOST, &backends.list).await;

    // 127.0.0.2 is not trusted: its PROXY header claims to be 192.0.2.1.
    // Ten such clients are refused before any backend is connected.
    for _ in 0..10 {
        let mut liar = connect_from(loopback(2), magpie.addr).await;
        let mut sent =
            proxy_protocol::v2_header("192.0.2.1:5000".parse().expect("literal"), magpie.addr);
        sent.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        liar.write_all(&sent).await.expect("send the forged header");
        match read_until_closed(&mut liar).await {
            Ok(bytes) => assert!(bytes.is_empty(), "got {bytes:?}"),
            Err(e) => eprintln!("refused with an error (accepted): {e}"),
        }
    }
    assert_eq!(magpie.client_failures("proxy_protocol"), 10);
    assert_eq!(
        magpie.backend_metric("magpie_backend_connections_total", "a", &[]),
        0,
        "a refused client reached the backend"
    );

    // The same peer without a PROXY header is served as usual.
    let mut honest = connect_from(loopback(2), magpie.addr).await;
    honest.write_all(b"plain data").await.expect("send");
    honest.shutdown().await.expect("shut down the write half");
    read_until_closed(&mut honest)
        .await
        .expect("an orderly close");
    // The first connection the backend ever saw is the honest one.
    assert_eq!(backends.next_report().await.bytes, b"plain data");
    assert_eq!(magpie.client_failures("proxy_protocol"), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_v2_gives_the_backend_the_client_and_listen_addresses() {
    let mut backends = RawBackends::start(&["a"], Behaviour::Silent).await;
    let magpie = Magpie::with("proxy_protocol:\n  send: v2\n", &backends.list).await;

    let mut client = connect_from(loopback(3), magpie.addr).await;
    let client_addr = client.local_addr().expect("client address");
    client.write_all(b"after the header").await.expect("send");
    client.shutdown().await.expect("shut down the write half");
    read_until_closed(&mut client)
        .await
        .expect("an orderly close");

    let got = backends.next_report().await.bytes;
    let parsed = proxy_protocol::parse(&got)
        .unwrap_or_else(|e| panic!("no valid PROXY header ({e}) in {got:?}"))
        .unwrap_or_else(|| panic!("incomplete PROXY header in {got:?}"));
    assert_eq!(&got[..12], b"\r\n\r\n\0\r\nQUIT\n", "not a v2 signature");
    assert_eq!(
        parsed.origin,
        Origin::Proxied {
            source: client_addr,
            destination: magpie.addr,
        }
    );
    assert_eq!(&got[parsed.length..], b"after the header");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_header_then_an_http_request_is_keyed_by_the_session_header() {
    let backends = HttpBackends::start(&["a", "b", "c"]).await;
    let settings = format!("{TRUST_LOCALHOST}{SESSION_KEY}");
    let magpie = Magpie::with(&settings, &backends.list).await;

    for (i, session) in ["alice", "bob", "carol", "dave"].into_iter().enumerate() {
        let client: SocketAddr = format!("192.0.2.{}:5000", i + 1).parse().expect("literal");
        // v1 and v2 in turn; the request follows the header in the same write.
        let mut sent = if i % 2 == 0 {
            proxy_protocol::v2_header(client, magpie.addr)
        } else {
            format!(
                "PROXY TCP4 {} {} {} {}\r\n",
                client.ip(),
                magpie.addr.ip(),
                client.port(),
                magpie.addr.port()
            )
            .into_bytes()
        };
        sent.extend_from_slice(request(Some(session), true).as_bytes());
        let mut stream = connect(magpie.addr).await;
        stream.write_all(&sent).await.expect("send");
        let response = read_until_closed(&mut stream).await.expect("a response");
        let text = String::from_utf8_lossy(&response);
        // A demo backend answers 400 to anything that is not HTTP, so a 200
        // shows the PROXY header was taken off before the request was replayed.
        assert!(text.starts_with("HTTP/1.1 200"), "{session}: {text}");
        assert_eq!(
            backend_of(&text),
            magpie.primary(key::text_key(session.as_bytes())),
            "{session} not keyed by its header"
        );
        assert_eq!(session_of(&text), session);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_peer_without_a_header_is_refused() {
    let mut backends = RawBackends::start(&["a"], Behaviour::Silent).await;
    let settings = "proxy_protocol:\n  accept_from: [127.0.0.1]\n  header_timeout: 100ms\n";
    let magpie = Magpie::with(settings, &backends.list).await;

    // Plain bytes where a header must be: refused at once.
    let mut plain = connect(magpie.addr).await;
    plain
        .write_all(b"GET / HTTP/1.1\r\n\r\n")
        .await
        .expect("send");
    match read_until_closed(&mut plain).await {
        Ok(bytes) => assert!(bytes.is_empty(), "got {bytes:?}"),
        Err(e) => eprintln!("refused with an error (accepted): {e}"),
    }
    assert_eq!(magpie.client_failures("proxy_protocol"), 1);

    // Silence: refused when header_timeout passes.
    let mut silent = connect(magpie.addr).await;
    let started = std::time::Instant::now();
    match read_until_closed(&mut silent).await {
        Ok(bytes) => assert!(bytes.is_empty(), "got {bytes:?}"),
        Err(e) => eprintln!("refused with an error (accepted): {e}"),
    }
    let waited = started.elapsed();
    assert!(
        waited >= std::time::Duration::from_millis(90),
        "refused after {waited:?}, before header_timeout"
    );
    assert_eq!(magpie.client_failures("proxy_protocol"), 2);
    // Neither reached a backend.
    assert!(backends.reports_so_far().is_empty());
    let connections = magpie.backend_metric("magpie_backend_connections_total", "a", &[]);
    assert_eq!(connections, 0);
}
