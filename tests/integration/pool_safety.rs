//! A misbehaving backend never answers another client's request: a rogue
//! backend ([`Rogue`]) tries to slip a whole response in after its honest
//! one (late, after a `HEAD`, `204` or `304` that allow no body, or as the
//! answer to a request smuggled in a body it answered early), and the next
//! client with the same key, on a fresh connection, gets its own answer or
//! a clean `502`, never the injected one. Connections lent across clients
//! follow `http.reuse`; a connection whose request carried a body and got an
//! error answer is never lent again.

use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::support::*;

fn settings(reuse: &str) -> String {
    format!("mode: http\nkey:\n  from: header\n  header: x-session-id\nhttp:\n  reuse: {reuse}\n")
}

/// Sends `request` on a fresh connection and reads one answer: its status
/// and body (none after a `HEAD`, a `204` or a `304`).
async fn exchange(magpie: &Magpie, request: &str) -> (u16, String) {
    let mut stream = connect(magpie.addr).await;
    stream
        .write_all(request.as_bytes())
        .await
        .expect("send the request");
    let mut buf = Vec::new();
    let head_end = within(
        "an answer's head",
        read_until(&mut stream, &mut buf, |b| {
            find(b, b"\r\n\r\n").map(|at| at + 4)
        }),
    )
    .await
    .expect("a head");
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let status: u16 = head[9..12].parse().expect("a status");
    let bodiless = request.starts_with("HEAD") || status == 204 || status == 304;
    let length = if bodiless {
        0
    } else {
        head.lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|n| n.trim().parse::<usize>().ok())
            .unwrap_or(0)
    };
    let end = head_end + length;
    within(
        "an answer's body",
        read_until(&mut stream, &mut buf, |b| (b.len() >= end).then_some(end)),
    )
    .await
    .expect("a body");
    let body = String::from_utf8_lossy(&buf[head_end..end]).into_owned();
    (status, body)
}

/// What the attacker sends, keyed like the victim's request.
fn attack(kind: &str) -> String {
    let key = "x-session-id: k\r\nhost: t\r\n";
    match kind {
        "head-body" => format!("HEAD /head-body HTTP/1.1\r\n{key}\r\n"),
        "early" => {
            let smuggled = "GET /smuggled HTTP/1.1\r\nhost: t\r\n\r\n";
            format!(
                "POST /early HTTP/1.1\r\n{key}content-length: {}\r\n\r\n{smuggled}",
                smuggled.len()
            )
        }
        path => format!("GET /{path} HTTP/1.1\r\n{key}\r\n"),
    }
}

const VICTIM_GET: &str = "GET /mine HTTP/1.1\r\nx-session-id: k\r\nhost: t\r\n\r\n";
const VICTIM_POST: &str = "POST /mine HTTP/1.1\r\nx-session-id: k\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";

const KINDS: [&str; 5] = ["extra", "head-body", "no-content", "not-modified", "early"];

/// The victim's answer is its own, or magpie's `502`: never the rogue's.
fn own_or_502(kind: &str, (status, body): (u16, String)) {
    assert!(
        (status == 200 && body == "mine") || status == 502,
        "{kind}: the victim got {status} {body:?}"
    );
}

/// The injected bytes reach magpie's idle connection before the victim's
/// request: whatever the reuse policy, that connection is never lent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_on_an_idle_connection_are_never_anyones_answer() {
    for reuse in ["always", "safe"] {
        for kind in KINDS {
            let mut rogue = Rogue::start(Duration::ZERO).await;
            let magpie = Magpie::with(&settings(reuse), &rogue.pairs()).await;
            exchange(&magpie, &attack(kind)).await;
            rogue.wait_injected().await;
            own_or_502(kind, exchange(&magpie, VICTIM_GET).await);
            own_or_502(kind, exchange(&magpie, VICTIM_POST).await);
            // The operator sees which backend did it, and what: an early
            // answer's connection is not even kept for the bytes to come
            // (counted as what magpie saw first: the answer before the body
            // went out, the smuggled answer, or the error answer); the
            // others are found when a request would take them (with `safe`,
            // a client's first request never would).
            let reasons: &[&str] = match kind {
                "early" => &["early_answer", "unsolicited_bytes", "error_after_body"],
                _ => &["unsolicited_bytes"],
            };
            let discards: u64 = reasons
                .iter()
                .map(|r| {
                    let why = format!("reason=\"{r}\"");
                    magpie.metric("magpie_backend_pool_discards_total", &[&why])
                })
                .sum();
            if reuse == "always" || kind == "early" {
                assert!(discards >= 1, "{reuse}, {kind}: no discard counted");
            }
            magpie.stop().await;
        }
    }
}

/// The injected bytes come while the victim's request is on its way: by
/// default a client connection's first request never takes a connection
/// another client used, whatever its method (a `GET` as much as an LLM chat
/// `POST`), and with `reuse: never` no request does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_first_request_by_default_and_any_with_never_keep_their_own_connection() {
    for reuse in ["safe", "never"] {
        for victim in [VICTIM_GET, VICTIM_POST] {
            for kind in KINDS {
                let rogue = Rogue::start(Duration::from_millis(300)).await;
                let magpie = Magpie::with(&settings(reuse), &rogue.pairs()).await;
                exchange(&magpie, &attack(kind)).await;
                own_or_502(kind, exchange(&magpie, victim).await);
                magpie.stop().await;
            }
        }
    }
}

/// An error answer to a request that carried a body (an early `413`, its
/// body unread and taken by the backend for a request of its own) ends that
/// connection, whatever the reuse policy: even with `always`, the next
/// client's request gets its own answer, and the discard is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_whose_body_got_an_error_answer_is_never_lent() {
    for victim in [VICTIM_GET, VICTIM_POST] {
        let rogue = Rogue::start(Duration::from_millis(300)).await;
        let magpie = Magpie::with(&settings("always"), &rogue.pairs()).await;
        let (status, _) = exchange(&magpie, &attack("early")).await;
        assert_eq!(status, 413);
        own_or_502("early", exchange(&magpie, victim).await);
        // One, as `error_after_body`, or as `early_answer` when the answer
        // came before magpie had sent the body on.
        let discards = magpie.metric("magpie_backend_pool_discards_total", &[]);
        assert_eq!(discards, 1);
        magpie.stop().await;
    }
}

/// A backend that answers a request's body with an error and closes
/// without saying it would: the connection is counted once among the
/// discards, as what magpie saw first (the close, or the error answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_answer_then_an_unannounced_close_is_counted_once() {
    let backend = ScriptedBackend::start().await;
    let magpie = Magpie::with(&settings("safe"), &backend.pairs()).await;
    let refused =
        "POST /refused HTTP/1.1\r\nx-session-id: k\r\nhost: t\r\ncontent-length: 2\r\n\r\n{}";
    for round in 1..=3 {
        let (status, body) = exchange(&magpie, refused).await;
        assert_eq!((status, body.as_str()), (413, "too large"));
        let discards = magpie.metric("magpie_backend_pool_discards_total", &[]);
        assert_eq!(
            discards, round,
            "{round} connections ended by an error answer"
        );
    }
    magpie.stop().await;
}

/// Sends `request` on `stream` and reads its answer (100 bytes of body, or
/// none after a `HEAD`): the number of the backend connection it came on.
async fn conn_of(stream: &mut tokio::net::TcpStream, request: &str) -> String {
    stream
        .write_all(request.as_bytes())
        .await
        .expect("send the request");
    let mut buf = Vec::new();
    let head_end = within(
        "an answer's head",
        read_until(stream, &mut buf, |b| find(b, b"\r\n\r\n").map(|at| at + 4)),
    )
    .await
    .expect("a head");
    let end = head_end + 100;
    within(
        "an answer's body",
        read_until(stream, &mut buf, |b| (b.len() >= end).then_some(end)),
    )
    .await
    .expect("a body");
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    head.lines()
        .find_map(|l| l.strip_prefix("x-conn: "))
        .expect("x-conn")
        .trim()
        .to_string()
}

const GET: &str = "GET / HTTP/1.1\r\nx-session-id: k\r\nhost: t\r\n\r\n";
const POST: &str = "POST / HTTP/1.1\r\nx-session-id: k\r\nhost: t\r\ncontent-length: 2\r\n\r\n{}";

/// Whose idle connection a request takes, policy by policy: a client's
/// first request takes another client's only as `http.reuse` allows, and a
/// client's later requests take its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_reuse_decides_whose_connection_a_request_takes() {
    // (policy, a first POST shares, a first GET shares)
    for (reuse, post_shares, get_shares) in [
        ("safe", false, false),
        ("always", true, true),
        ("never", false, false),
    ] {
        for (first, shares) in [(POST, post_shares), (GET, get_shares)] {
            let backend = ScriptedBackend::start().await;
            let magpie = Magpie::with(&settings(reuse), &backend.pairs()).await;
            let mut a = connect(magpie.addr).await;
            let a_conn = conn_of(&mut a, GET).await;
            let mut b = connect(magpie.addr).await;
            let b_conn = conn_of(&mut b, first).await;
            assert_eq!(
                b_conn == a_conn,
                shares,
                "reuse: {reuse}, a client's first {}",
                &first[..4]
            );
            // Its second request takes its own connection again.
            assert_eq!(conn_of(&mut b, POST).await, b_conn, "reuse: {reuse}");
            magpie.stop().await;
        }
    }
}
