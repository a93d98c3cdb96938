//! `queue.priority.engine`: a request's class goes on in its body's
//! `priority` field, for engines that schedule by priority, over HTTP/1.1
//! (the pass-through, its `Content-Length` restated) and HTTP/2 alike; a
//! `priority` the client wrote is replaced, and a body that is not one JSON
//! object goes on untouched.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;

use crate::support::*;

const SETTINGS: &str = "mode: http\nkey:\n  from: header\n  header: x-session-id\nhealth:\n  interval: 1h\nqueue:\n  priority:\n    header: x-priority\n    classes: [interactive, batch]\n    default: batch\n    engine: {interactive: -10, batch: 30}\n";
const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n";

fn chat(class: Option<&str>, body: &str) -> Request<Full<Bytes>> {
    let mut request = Request::post("http://magpie/v1/chat/completions")
        .header("host", "magpie")
        .header("content-type", "application/json")
        .header("x-session-id", "s1");
    if let Some(class) = class {
        request = request.header("x-priority", class);
    }
    request
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a request")
}

/// The body of a request as the backend got it, after its head; checks
/// that its `Content-Length` is the body's.
fn body_of(request: &str) -> &str {
    let (head, body) = request.split_once("\r\n\r\n").expect("a head");
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .expect("a content-length");
    assert_eq!(
        length.parse::<usize>().expect("a number"),
        body.len(),
        "{request}"
    );
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_class_goes_on_in_the_body_over_http1() {
    let mut backend = Recorder::start(OK).await;
    let magpie = Magpie::with(SETTINGS, &backend.pairs()).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let body = r#"{"model":"m","priority":-99,"messages":[{"role":"user","content":"hi"}]}"#;
    let (response, _) = client.send(chat(Some("interactive"), body)).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        body_of(&backend.request().await),
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"priority":-10}"#
    );
    // No class named: the default class's value.
    client.send(chat(None, r#"{"model":"m"}"#)).await;
    assert_eq!(
        body_of(&backend.request().await),
        r#"{"model":"m","priority":30}"#
    );
    // Not one JSON object: as it came.
    client.send(chat(Some("interactive"), "[1, 2]")).await;
    assert_eq!(body_of(&backend.request().await), "[1, 2]");
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_class_goes_on_in_the_body_over_http2() {
    let backends = HyperBackends::start(&["a"]).await;
    let magpie = Magpie::with(SETTINGS, &backends.pairs()).await;
    let (mut sender, _conn) = h2_connect(magpie.addr).await;
    let mut request = chat(Some("batch"), r#"{"model":"m", "stream": true}"#);
    *request.uri_mut() = "http://magpie/echo".parse().expect("a URI");
    let response = within("an HTTP/2 answer", sender.send_request(request))
        .await
        .expect("an answer");
    assert_eq!(response.status(), 200);
    let echoed = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    assert_eq!(&echoed[..], br#"{"model":"m","stream":true,"priority":30}"#);
    magpie.stop().await;
}
