//! What reading request bodies for keys may hold (`mode: http`): a key in
//! the first bytes of a large or slow body routes at once, and all requests
//! together hold at most `limits.key_buffer_bytes`, beyond which a request
//! is routed by its fallback key without waiting.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use magpie_core::key::FallbackReason;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;

/// `from: body` by `prompt_cache_key`, backends named in responses.
fn body_settings(extra: &str) -> String {
    format!(
        "mode: http\nhttp: {{expose_backend: true}}\nkey:\n  from: body\n  body_field: prompt_cache_key\n{extra}"
    )
}

/// The backend named in a raw HTTP/1.1 response head.
fn backend_header(head: &str) -> String {
    head.lines()
        .find_map(|l| l.strip_prefix("x-magpie-backend: "))
        .unwrap_or_else(|| panic!("no x-magpie-backend in {head:?}"))
        .trim()
        .to_string()
}

/// Reads a response head (up to the blank line) from `s`.
async fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = within("a response head", s.read(&mut byte))
            .await
            .expect("read");
        assert_eq!(n, 1, "closed before the head ended: {head:?}");
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// A POST to `/echo` of `len` bytes; returns its head.
fn post_head(len: usize) -> String {
    format!(
        "POST /echo HTTP/1.1\r\nhost: m\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_at_the_start_of_a_body_larger_than_max_bytes_routes_by_it() {
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let magpie = Magpie::with(&body_settings("  max_bytes: 65536\n"), &backends.pairs()).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let filler = "x".repeat(1 << 20);
    for s in 0..8 {
        let key = format!("conv-{s}");
        let json = format!(
            r#"{{"prompt_cache_key":"{key}","messages":[{{"role":"user","content":"{filler}"}}]}}"#
        );
        let request = Request::post("/echo")
            .header("host", "magpie")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(json.clone())))
            .expect("a request");
        let (response, body) = client.send(request).await;
        assert_eq!(response.status(), 200);
        let backend = response.headers()["x-magpie-backend"]
            .to_str()
            .expect("a name");
        assert_eq!(
            backend,
            magpie.primary(magpie_core::key::text_key(key.as_bytes())),
            "{key}"
        );
        // The backend got the body unchanged.
        assert_eq!(body.len(), json.len());
        assert!(
            body == json.as_bytes(),
            "{key}: the body changed on the way"
        );
    }
    assert_eq!(magpie.fallbacks(FallbackReason::TooLarge), 0);
    assert_eq!(held(&magpie), 0);
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_routes_as_soon_as_its_key_arrived() {
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    // A read_timeout far past the test's patience: only an early key helps.
    let magpie = Magpie::with(&body_settings("  read_timeout: 60s\n"), &backends.pairs()).await;
    let first = br#"{"prompt_cache_key":"slow-1","messages":[{"role":"user","content":""#;
    let rest = br#"hello"}]}"#;
    let mut s = connect(magpie.addr).await;
    s.write_all(post_head(first.len() + rest.len()).as_bytes())
        .await
        .expect("send");
    s.write_all(first).await.expect("send");
    // The backend echoes as it reads: the head comes back before the rest
    // of the body was sent.
    let head = read_head(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head:?}");
    assert_eq!(
        backend_header(&head),
        magpie.primary(magpie_core::key::text_key(b"slow-1"))
    );
    s.write_all(rest).await.expect("send");
    let mut echoed = Vec::new();
    let want = first.len() + rest.len();
    while echoed.len() < want + 20 && !String::from_utf8_lossy(&echoed).contains("]}") {
        let mut chunk = [0u8; 4096];
        let n = within("the echo", s.read(&mut chunk)).await.expect("read");
        assert_ne!(n, 0, "closed early");
        echoed.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&echoed);
    assert!(
        text.contains("slow-1") && text.contains("hello"),
        "{text:?}"
    );
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_key_buffer_budget_a_request_goes_by_its_fallback_at_once() {
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let settings = body_settings(
        "  max_bytes: 1048576\n  read_timeout: 60s\nlimits: {key_buffer_bytes: 65536}\n",
    );
    let magpie = Magpie::with(&settings, &backends.pairs()).await;
    // A: 59,000 bytes without the key yet, then it waits.
    let tail = br#""}],"prompt_cache_key":"held-a"}"#;
    let lead = br#"{"messages":[{"role":"user","content":""#;
    let pad = 59_000 - lead.len();
    let total_a = lead.len() + pad + tail.len();
    let mut a = connect(magpie.addr).await;
    a.write_all(post_head(total_a).as_bytes())
        .await
        .expect("send");
    a.write_all(lead).await.expect("send");
    a.write_all(&vec![b'x'; pad]).await.expect("send");
    within("magpie to hold A's bytes", async {
        while held(&magpie) < 59_000 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // B's 10,000 bytes do not fit beside them: routed by the fallback key
    // at once, its body passed on whole.
    let b_body = format!(
        r#"{{"messages":[{{"role":"user","content":"{}"}}],"prompt_cache_key":"late-b"}}"#,
        "y".repeat(10_000)
    );
    let mut b = connect(magpie.addr).await;
    b.write_all(post_head(b_body.len()).as_bytes())
        .await
        .expect("send");
    b.write_all(b_body.as_bytes()).await.expect("send");
    let head = read_head(&mut b).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head:?}");
    assert_eq!(magpie.fallbacks(FallbackReason::BufferBudget), 1);
    // A's last bytes still fit: A goes by its key.
    a.write_all(tail).await.expect("send");
    let head = read_head(&mut a).await;
    assert_eq!(
        backend_header(&head),
        magpie.primary(magpie_core::key::text_key(b"held-a"))
    );
    assert_eq!(magpie.fallbacks(FallbackReason::BufferBudget), 1);
    drop((a, b));
    within("the budget to be given back", async {
        while held(&magpie) > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    magpie.stop().await;
}

/// The body bytes all requests hold while reading them for keys.
fn held(magpie: &Magpie) -> u64 {
    magpie.metric("magpie_key_buffer_bytes", &[])
}
