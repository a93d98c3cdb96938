//! `mode: http`'s HTTP/1.1 pass-through through raw sockets: pipelined
//! requests, bodies in the framing they came in (both ways), answers that
//! end with their connection, answers that come before their request's
//! body ended, `HEAD`, hop-by-hop headers, and the requests it hands over
//! to hyper. A raw backend reports the exact bytes it receives and on which
//! of its connections.

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::support::*;

const SETTINGS: &str =
    "mode: http\nkey:\n  from: header\n  header: x-session-id\nhttp:\n  expose_backend: true\n";

/// Reads one response of `len` body bytes after its head (known to the
/// test) from `s`: its head and body as text.
async fn response(s: &mut TcpStream, buf: &mut Vec<u8>, body: usize) -> (String, String) {
    let head_end = within(
        "a response head",
        read_until(s, buf, |b| find(b, b"\r\n\r\n").map(|at| at + 4)),
    )
    .await
    .expect("a head");
    let end = within(
        "a response body",
        read_until(s, buf, |b| {
            (b.len() >= head_end + body).then_some(head_end + body)
        }),
    )
    .await
    .expect("a body");
    let all: Vec<u8> = buf.drain(..end).collect();
    let head = String::from_utf8_lossy(&all[..head_end]).into_owned();
    let body = String::from_utf8_lossy(&all[head_end..]).into_owned();
    (head, body)
}

/// The value of header `name` in a raw head.
fn header<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_answered_in_order_on_one_upstream_connection() {
    let mut backend = ScriptedBackend::start().await;
    let magpie = Magpie::with(SETTINGS, &backend.pairs()).await;
    let mut s = connect(magpie.addr).await;
    s.write_all(b"GET /one HTTP/1.1\r\nhost: m\r\nx-session-id: s1\r\n\r\nGET /two HTTP/1.1\r\nhost: m\r\nx-session-id: s2\r\n\r\n")
        .await
        .expect("send");
    let mut buf = Vec::new();
    let (first, body) = response(&mut s, &mut buf, 100).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first:?}");
    assert_eq!(body, "x".repeat(100));
    let (second, _) = response(&mut s, &mut buf, 100).await;
    assert!(second.starts_with("HTTP/1.1 200"), "{second:?}");
    assert!(backend.next().await.bytes.starts_with("GET /one "));
    let two = backend.next().await;
    assert!(two.bytes.starts_with("GET /two "));
    // The second went over the first's upstream connection, given back.
    assert_eq!(header(&first, "x-conn"), header(&second, "x-conn"));
    assert_eq!(two.conn, 0);
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_bodies_pass_as_they_came_both_ways() {
    let mut backend = ScriptedBackend::start().await;
    let magpie = Magpie::with(SETTINGS, &backend.pairs()).await;
    let mut s = connect(magpie.addr).await;
    let body = "4;ext=1\r\nwiki\r\n5\r\npedia\r\n0\r\nx-sum: 9\r\n\r\n";
    let request = format!(
        "POST /up HTTP/1.1\r\nhost: m\r\nx-session-id: c\r\ntransfer-encoding: chunked\r\n\r\n{body}"
    );
    // In three writes, the framing split across them.
    for part in [&request[..60], &request[60..75], &request[75..]] {
        s.write_all(part.as_bytes()).await.expect("send");
    }
    let mut buf = Vec::new();
    let (head, _) = response(&mut s, &mut buf, 100).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head:?}");
    let seen = backend.next().await;
    assert!(
        seen.bytes.ends_with(&format!("\r\n\r\n{body}")),
        "{:?}",
        seen.bytes
    );
    assert!(
        seen.bytes
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked\r\n")
    );
    // A chunked answer reaches the client byte for byte, trailer included,
    // and the connection carries the next request.
    s.write_all(b"GET /chunked HTTP/1.1\r\nhost: m\r\nx-session-id: c\r\n\r\n")
        .await
        .expect("send");
    let chunked = "3;x=y\r\nabc\r\n0\r\nx-trailer: t\r\n\r\n";
    let (head, got) = response(&mut s, &mut buf, chunked.len()).await;
    assert_eq!(header(&head, "transfer-encoding"), Some("chunked"));
    assert_eq!(got, chunked);
    s.write_all(b"GET /again HTTP/1.1\r\nhost: m\r\nx-session-id: c\r\n\r\n")
        .await
        .expect("send");
    let (head, _) = response(&mut s, &mut buf, 100).await;
    assert_eq!(header(&head, "x-conn"), Some("0"), "{head:?}");
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_ended_by_its_connection_ends_the_client_connection_too() {
    let backend = ScriptedBackend::start().await;
    let magpie = Magpie::with(SETTINGS, &backend.pairs()).await;
    let mut s = connect(magpie.addr).await;
    s.write_all(b"GET /until-close HTTP/1.1\r\nhost: m\r\nx-session-id: u\r\n\r\n")
        .await
        .expect("send");
    let got = within("magpie to close", read_until_closed(&mut s))
        .await
        .expect("a clean end");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text:?}");
    assert_eq!(header(&text, "connection"), Some("close"));
    assert!(
        text.ends_with("\r\n\r\nall of it, then the end"),
        "{text:?}"
    );
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_before_the_body_ended_is_passed_on_and_the_connection_closes() {
    let backend = ScriptedBackend::start().await;
    let magpie = Magpie::with(SETTINGS, &backend.pairs()).await;
    let mut s = connect(magpie.addr).await;
    s.write_all(b"POST /early HTTP/1.1\r\nhost: m\r\nx-session-id: e\r\ncontent-length: 1000000\r\n\r\nfirst bytes")
        .await
        .expect("send");
    let got = within("magpie to answer and close", read_until_closed(&mut s))
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 413"), "{text:?}");
    assert!(text.ends_with("too large"), "{text:?}");
    // Not counted against the backend: it answered.
    let errors = ["code_class=\"error\""];
    assert_eq!(
        magpie.backend_metric("magpie_backend_requests_total", "a", &errors),
        0
    );
    // Its connection is not kept: counted as an early answer.
    let early = ["reason=\"early_answer\""];
    let discards = magpie.backend_metric("magpie_backend_pool_discards_total", "a", &early);
    assert_eq!(discards, 1);
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_answer_has_no_body_whatever_its_length_says() {
    let backend = ScriptedBackend::start().await;
    let magpie = Magpie::with(SETTINGS, &backend.pairs()).await;
    let mut s = connect(magpie.addr).await;
    s.write_all(b"HEAD /h HTTP/1.1\r\nhost: m\r\nx-session-id: h\r\n\r\nGET /g HTTP/1.1\r\nhost: m\r\nx-session-id: h\r\n\r\n")
        .await
        .expect("send");
    let mut buf = Vec::new();
    let (head, _) = response(&mut s, &mut buf, 0).await;
    assert_eq!(header(&head, "content-length"), Some("100"));
    let (head, body) = response(&mut s, &mut buf, 100).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head:?}");
    assert_eq!(body.len(), 100);
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_headers_stay_with_their_hop() {
    let mut backend = ScriptedBackend::start().await;
    let magpie = Magpie::with(SETTINGS, &backend.pairs()).await;
    let mut s = connect(magpie.addr).await;
    s.write_all(b"GET /hop HTTP/1.1\r\nHost: m\r\nX-Session-Id: k\r\nConnection: keep-alive, X-Private\r\nKeep-Alive: timeout=9\r\nX-Private: secret\r\nTE: trailers\r\nX-Kept: yes\r\n\r\n")
        .await
        .expect("send");
    let mut buf = Vec::new();
    let (head, body) = response(&mut s, &mut buf, 2).await;
    assert_eq!(body, "ok");
    let seen = backend.next().await.bytes;
    assert_eq!(
        seen, "GET /hop HTTP/1.1\r\nHost: m\r\nX-Session-Id: k\r\nX-Kept: yes\r\n\r\n",
        "the backend got the fields as they came, but the hop's"
    );
    for gone in ["x-hop", "keep-alive", "connection"] {
        assert_eq!(header(&head, gone), None, "{gone} in {head:?}");
    }
    assert_eq!(header(&head, "x-kept"), Some("1"));
    assert_eq!(header(&head, "x-magpie-backend"), Some("a"));
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_pass_through_does_not_take_hyper_serves() {
    let mut backend = ScriptedBackend::start().await;
    let magpie = Magpie::with(SETTINGS, &backend.pairs()).await;
    // HTTP/1.0, on a connection that first carried a plain request.
    let mut s = connect(magpie.addr).await;
    s.write_all(b"GET /first HTTP/1.1\r\nhost: m\r\nx-session-id: p\r\n\r\n")
        .await
        .expect("send");
    let mut buf = Vec::new();
    let (head, _) = response(&mut s, &mut buf, 100).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head:?}");
    s.write_all(b"GET /old HTTP/1.0\r\nhost: m\r\nx-session-id: p\r\n\r\n")
        .await
        .expect("send");
    let got = within("an HTTP/1.0 answer and the end", read_until_closed(&mut s))
        .await
        .expect("a clean end");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.0 200"), "{text:?}");
    assert_eq!(
        backend.next().await.bytes.lines().next(),
        Some("GET /first HTTP/1.1")
    );
    assert_eq!(
        backend.next().await.bytes.lines().next(),
        Some("GET /old HTTP/1.1")
    );
    // Expect: 100-continue: hyper's interim answer, then the backend's.
    let mut s = connect(magpie.addr).await;
    s.write_all(b"POST /cont HTTP/1.1\r\nhost: m\r\nx-session-id: p\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\n")
        .await
        .expect("send");
    let mut buf = Vec::new();
    let (interim, _) = response(&mut s, &mut buf, 0).await;
    assert!(interim.starts_with("HTTP/1.1 100"), "{interim:?}");
    s.write_all(b"hello").await.expect("send");
    let (head, _) = response(&mut s, &mut buf, 100).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head:?}");
    assert!(backend.next().await.bytes.ends_with("\r\n\r\nhello"));
    magpie.stop().await;
}
