//! `mode: http` framing and normalisation (RFC 9110, 9112, 9113): what a
//! client may not send is refused by magpie itself and never reaches a
//! backend; what HTTP/2 carries differently is put the HTTP/1.1 way. A raw
//! backend reports the exact bytes it receives.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;

const SETTINGS: &str = "mode: http\nkey:\n  from: header\n  header: x-session-id\nhealth:\n  interval: 1h\n  passive_failures: 1\n  passive_status: true\n";

const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n";

/// Sends `bytes` on a new connection, half-closes, and reads all magpie says.
async fn exchange(magpie: &Magpie, bytes: &[u8]) -> String {
    let mut s = connect(magpie.addr).await;
    s.write_all(bytes).await.expect("send");
    let mut out = Vec::new();
    within("magpie to answer and close", s.read_to_end(&mut out))
        .await
        .ok();
    String::from_utf8_lossy(&out).into_owned()
}

fn bad_requests(magpie: &Magpie) -> u64 {
    magpie.client_failures("bad_request")
}

/// The backend was not blamed: no error counted, no passive failure.
fn not_blamed(magpie: &Magpie) {
    let errors = ["code_class=\"error\""];
    let requests = magpie.backend_metric("magpie_backend_requests_total", "a", &errors);
    assert_eq!(requests, 0);
    assert!(magpie.backend("a").is_up(), "marked down");
    assert_eq!(magpie.client_failures("no_backend"), 0);
}

/// A chunk size that is not hex, in a body read for its key (nothing sent
/// yet) and in one already streaming to the backend: the client gets `400`,
/// never a `200`; the backend's connection is dropped and it is not blamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_chunked_body_gets_400_and_spares_the_backend() {
    let mut backend = Recorder::start(OK).await;
    let magpie = Magpie::with(SETTINGS, &backend.pairs()).await;
    let body_keyed = "mode: http\nkey:\n  from: body\n  body_field: user\nhealth:\n  interval: 1h\n  passive_failures: 1\n  passive_status: true\n";
    let keyed = Magpie::with(body_keyed, &backend.pairs()).await;
    // Read for the key: refused before anything is sent.
    let answer = exchange(
        &keyed,
        b"POST / HTTP/1.1\r\nhost: m\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n3\r\n{\"u\r\nzz\r\nser\":1}\r\n0\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    assert_eq!(bad_requests(&keyed), 1);
    backend.nothing_yet();
    not_blamed(&keyed);
    keyed.stop().await;

    // Streaming: the head and first chunk are at the backend when the bad
    // chunk comes.
    let mut s = connect(magpie.addr).await;
    s.write_all(b"POST / HTTP/1.1\r\nhost: m\r\nx-session-id: s\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        .await
        .expect("send");
    match backend.next().await {
        Recorded::Head(head) => assert!(head.starts_with("post / http/1.1\r\n"), "{head:?}"),
        other => panic!("no head first: {other:?}"),
    }
    s.write_all(b"zz\r\nworld\r\n0\r\n\r\n")
        .await
        .expect("send");
    let mut out = Vec::new();
    within("magpie to answer and close", s.read_to_end(&mut out))
        .await
        .ok();
    let answer = String::from_utf8_lossy(&out);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    match backend.next().await {
        Recorded::Closed(partial) => assert!(!partial.contains("world"), "{partial:?}"),
        other => panic!("the backend connection stayed: {other:?}"),
    }
    assert_eq!(bad_requests(&magpie), 1);
    not_blamed(&magpie);
    magpie.stop().await;
}

/// Two `Host` lines: `400`, never forwarded (RFC 9112 §3.2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_host_headers_get_400() {
    let mut backend = Recorder::start(OK).await;
    let magpie = Magpie::with(SETTINGS, &backend.pairs()).await;
    let answer = exchange(
        &magpie,
        b"GET / HTTP/1.1\r\nhost: a.example\r\nhost: b.example\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    assert!(answer.contains("magpie: "), "{answer:?}");
    backend.nothing_yet();
    assert_eq!(bad_requests(&magpie), 1);
    // One Host is served as usual.
    let answer = exchange(
        &magpie,
        b"GET / HTTP/1.1\r\nhost: a.example\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert!(backend.request().await.contains("host: a.example\r\n"));
    magpie.stop().await;
}

/// A transfer coding magpie does not implement before `chunked` gets `501`
/// (RFC 9112 §6.1); one where `chunked` is not last (`identity`) leaves the
/// length unknown: `400`. Neither reaches the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_codings_other_than_chunked_are_refused() {
    let mut backend = Recorder::start(OK).await;
    let magpie = Magpie::with(SETTINGS, &backend.pairs()).await;
    // hyper itself answers those whose last coding is not chunked; each
    // refusal counts as a bad request all the same.
    let cases: [(&str, &str, u64); 5] = [
        ("transfer-encoding: gzip, chunked\r\n", "501", 1),
        (
            "transfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n",
            "501",
            2,
        ),
        ("transfer-encoding: chunked, chunked\r\n", "400", 3),
        ("transfer-encoding: identity\r\n", "400", 4),
        ("transfer-encoding: chunked, gzip\r\n", "400", 5),
    ];
    for (te, status, counted) in cases {
        let request = format!(
            "POST / HTTP/1.1\r\nhost: m\r\nx-session-id: s\r\n{te}\r\n5\r\nhello\r\n0\r\n\r\n"
        );
        let answer = exchange(&magpie, request.as_bytes()).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{te:?}: {answer:?}"
        );
        backend.nothing_yet();
        assert_eq!(bad_requests(&magpie), counted, "{te:?}");
    }
    // `chunked` alone is forwarded.
    let answer = exchange(
        &magpie,
        b"POST / HTTP/1.1\r\nhost: m\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert!(backend.request().await.contains("hello"));
    magpie.stop().await;
}

/// magpie does not tunnel: `CONNECT` gets `405` (with `Allow`); an
/// authority-form target on another method is malformed: `400`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_gets_405_and_authority_form_targets_400() {
    let mut backend = Recorder::start(OK).await;
    let magpie = Magpie::with(SETTINGS, &backend.pairs()).await;
    let answer = exchange(
        &magpie,
        b"CONNECT a.example:443 HTTP/1.1\r\nhost: a.example:443\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer:?}");
    assert!(answer.contains("\r\nallow: GET, "), "{answer:?}");
    backend.nothing_yet();
    let answer = exchange(
        &magpie,
        b"GET a.example:443 HTTP/1.1\r\nhost: a.example:443\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    assert!(answer.contains("magpie: "), "{answer:?}");
    backend.nothing_yet();
    assert_eq!(bad_requests(&magpie), 2);
    magpie.stop().await;
}

/// An HTTP/2 connection with prior knowledge, and a way to send on it.
async fn h2(magpie: &Magpie) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    h2_connect(magpie.addr).await.0
}

async fn h2_send(
    sender: &mut hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    request: Request<Full<Bytes>>,
) -> u16 {
    let response = within("an HTTP/2 response", sender.send_request(request))
        .await
        .expect("a response");
    let status = response.status().as_u16();
    response.into_body().collect().await.expect("a body");
    status
}

/// HTTP/2 splits cookies into fields of their own; an HTTP/1.1 backend gets
/// them joined with `; ` in one header (RFC 9113 §8.2.3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_cookies_are_joined_into_one_header() {
    let mut backend = Recorder::start(OK).await;
    let magpie = Magpie::with(SETTINGS, &backend.pairs()).await;
    let mut sender = h2(&magpie).await;
    let request = Request::get("http://magpie/")
        .header("cookie", "a=1")
        .header("cookie", "b=2")
        .header("cookie", "c=3")
        .body(Full::default())
        .expect("a request");
    assert_eq!(h2_send(&mut sender, request).await, 200);
    let seen = backend.request().await;
    assert_eq!(seen.matches("cookie:").count(), 1, "{seen}");
    assert!(seen.contains("cookie: a=1; b=2; c=3\r\n"), "{seen}");
    magpie.stop().await;
}

/// On HTTP/2, `:authority` names the target: a differing `Host` gives way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_authority_wins_over_a_differing_host() {
    let mut backend = Recorder::start(OK).await;
    let magpie = Magpie::with(SETTINGS, &backend.pairs()).await;
    let mut sender = h2(&magpie).await;
    let request = Request::get("http://right.example/")
        .header("host", "wrong.example")
        .body(Full::default())
        .expect("a request");
    assert_eq!(h2_send(&mut sender, request).await, 200);
    let seen = backend.request().await;
    assert_eq!(seen.matches("host:").count(), 1, "{seen}");
    assert!(seen.contains("host: right.example\r\n"), "{seen}");
    magpie.stop().await;
}

/// A `101` nobody asked for: the client gets `502`, the backend's
/// connection is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unasked_for_101_gets_502() {
    let mut backend = Recorder::start(
        "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
    )
    .await;
    let magpie = Magpie::with(SETTINGS, &backend.pairs()).await;
    let answer = exchange(
        &magpie,
        b"GET / HTTP/1.1\r\nhost: m\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 502"), "{answer:?}");
    assert!(answer.contains("magpie: "), "{answer:?}");
    // The request reached a backend, which failed it.
    assert_eq!(magpie.client_failures("backend_failed"), 1);
    assert_eq!(magpie.client_failures("no_backend"), 0);
    backend.request().await;
    assert!(matches!(backend.next().await, Recorded::Closed(_)));
    magpie.stop().await;
}
