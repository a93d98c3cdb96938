//! For the `mode: http` tests: HTTP backends served by hyper, and a
//! keep-alive client that sends many requests over one connection.
//!
//! A backend answers by path:
//! * `GET /health`: the status the test set (200 at start);
//! * `POST /echo`: the request body streamed back;
//! * `GET /bytes/N`: N pseudo-random bytes (seed 7);
//! * `GET /stream`: one chunk, then a second once the test releases it
//!   ([`HyperBackends::release`]), then the end;
//! * `GET /slow`: one chunk, then the end once the test releases it;
//! * `POST /v1/chat/completions`: an OpenAI-shaped answer whose `usage`
//!   reports the prompt and cached tokens the request's `x-test-prompt` and
//!   `x-test-cached` headers ask for (its own totals are counted), as JSON,
//!   or as server-sent events split across frames with `x-test-stream`;
//! * anything else: `backend: NAME\n` and the `x-session-id` it saw.
//!
//! Each backend counts the requests in flight (max seen), so bounded-load
//! tests can check the caps at every instant, and keeps the `x-test-name`
//! of each request in the order they came, so queue tests can check the
//! order magpie let them through (not the order their answers were read).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::{pseudo_random, within};

type Body = BoxBody<Bytes, Infallible>;

/// One hyper backend's state, shared with the test.
pub struct HyperBackend {
    pub name: String,
    pub addr: SocketAddr,
    /// The status `/health` answers.
    pub health: AtomicU16,
    /// Requests in flight now, and the most seen at once.
    pub in_flight: AtomicU64,
    pub max_in_flight: AtomicU64,
    /// Requests served.
    pub served: AtomicU64,
    /// The `x-test-name` of each request that carried one, in arrival order.
    pub arrivals: Mutex<Vec<String>>,
    /// The prompt and cached tokens its chat answers reported.
    pub prompt_reported: AtomicU64,
    pub cached_reported: AtomicU64,
    /// `/stream` and `/slow` wait for a permit here before going on.
    gate: Semaphore,
    /// Responses whose body was dropped before its end (client gone).
    pub abandoned: AtomicU64,
    /// Stops this backend alone.
    own_stop: CancellationToken,
}

/// A set of hyper backends; they stop when dropped.
pub struct HyperBackends {
    pub list: Vec<Arc<HyperBackend>>,
    stop: CancellationToken,
}

impl HyperBackends {
    pub async fn start(names: &[&str]) -> HyperBackends {
        let stop = CancellationToken::new();
        let mut list = Vec::new();
        for name in names {
            list.push(
                start_one(
                    name,
                    "127.0.0.1:0".parse().expect("an address"),
                    stop.clone(),
                )
                .await,
            );
        }
        HyperBackends { list, stop }
    }

    /// (name, address) pairs, for configs.
    pub fn pairs(&self) -> Vec<(String, SocketAddr)> {
        self.list.iter().map(|b| (b.name.clone(), b.addr)).collect()
    }

    pub fn get(&self, name: &str) -> &Arc<HyperBackend> {
        self.list
            .iter()
            .find(|b| b.name == name)
            .unwrap_or_else(|| panic!("no backend {name}"))
    }

    /// Lets `n` waiting `/stream` or `/slow` responses go on, on every backend.
    pub fn release(&self, n: usize) {
        for b in &self.list {
            b.gate.add_permits(n);
        }
    }

    /// Stops one backend: its listener closes and its connections drop.
    pub fn kill(&mut self, name: &str) -> Arc<HyperBackend> {
        let i = self
            .list
            .iter()
            .position(|b| b.name == name)
            .unwrap_or_else(|| panic!("no backend {name}"));
        let b = self.list.remove(i);
        b.own_stop.cancel();
        b
    }
}

impl Drop for HyperBackends {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn start_one(name: &str, bind: SocketAddr, stop: CancellationToken) -> Arc<HyperBackend> {
    let listener = TcpListener::bind(bind)
        .await
        .unwrap_or_else(|e| panic!("cannot start backend {name}: {e}"));
    let addr = listener
        .local_addr()
        .expect("a bound listener has an address");
    let own_stop = stop.child_token();
    let backend = Arc::new(HyperBackend {
        name: name.to_string(),
        addr,
        health: AtomicU16::new(200),
        in_flight: AtomicU64::new(0),
        max_in_flight: AtomicU64::new(0),
        served: AtomicU64::new(0),
        arrivals: Mutex::new(Vec::new()),
        prompt_reported: AtomicU64::new(0),
        cached_reported: AtomicU64::new(0),
        gate: Semaphore::new(0),
        abandoned: AtomicU64::new(0),
        own_stop,
    });
    let b = Arc::clone(&backend);
    tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                _ = b.own_stop.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok((s, _)) => s,
                    Err(e) => { eprintln!("backend {}: accept: {e}", b.name); continue; }
                },
            };
            let b = Arc::clone(&b);
            tokio::spawn(async move {
                let service = {
                    let b = Arc::clone(&b);
                    service_fn(move |req| {
                        let b = Arc::clone(&b);
                        async move { Ok::<_, Infallible>(answer(req, b).await) }
                    })
                };
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    _ = b.own_stop.cancelled() => {}
                    r = conn => if let Err(e) = r { eprintln!("backend {}: connection: {e}", b.name) },
                }
            });
        }
    });
    backend
}

/// A response body fed through a channel; counts the backend's requests in
/// flight until it ends or is dropped.
struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
    backend: Arc<HyperBackend>,
    ended: bool,
}

impl ChannelBody {
    fn new(rx: mpsc::Receiver<Bytes>, backend: Arc<HyperBackend>) -> Self {
        let now = backend.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        backend.max_in_flight.fetch_max(now, Ordering::SeqCst);
        ChannelBody {
            rx,
            backend,
            ended: false,
        }
    }
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.rx.poll_recv(cx) {
            std::task::Poll::Ready(Some(b)) => std::task::Poll::Ready(Some(Ok(Frame::data(b)))),
            std::task::Poll::Ready(None) => {
                if !self.ended {
                    self.ended = true;
                    self.backend.in_flight.fetch_sub(1, Ordering::SeqCst);
                }
                std::task::Poll::Ready(None)
            }
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl Drop for ChannelBody {
    fn drop(&mut self) {
        if !self.ended {
            self.backend.in_flight.fetch_sub(1, Ordering::SeqCst);
            self.backend.abandoned.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn full(status: StatusCode, text: String) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(text)).boxed());
    *r.status_mut() = status;
    r
}

/// A streamed response whose chunks come from a task.
fn streamed(backend: Arc<HyperBackend>) -> (mpsc::Sender<Bytes>, Response<Body>) {
    let (tx, rx) = mpsc::channel(16);
    (tx, Response::new(ChannelBody::new(rx, backend).boxed()))
}

async fn answer(req: Request<Incoming>, b: Arc<HyperBackend>) -> Response<Body> {
    b.served.fetch_add(1, Ordering::SeqCst);
    if let Some(name) = req.headers().get("x-test-name") {
        let name = String::from_utf8_lossy(name.as_bytes()).into_owned();
        b.arrivals.lock().expect("not poisoned").push(name);
    }
    let path = req.uri().path().to_string();
    match path.as_str() {
        "/health" => {
            let code = b.health.load(Ordering::SeqCst);
            full(
                StatusCode::from_u16(code).unwrap_or(StatusCode::OK),
                format!("health of {}\n", b.name),
            )
        }
        "/echo" => {
            let (tx, response) = streamed(b);
            let mut body = req.into_body();
            tokio::spawn(async move {
                while let Some(Ok(frame)) = body.frame().await {
                    if let Ok(data) = frame.into_data()
                        && tx.send(data).await.is_err()
                    {
                        return;
                    }
                }
            });
            response
        }
        "/stream" | "/slow" => {
            let (tx, response) = streamed(Arc::clone(&b));
            let two = path == "/stream";
            tokio::spawn(async move {
                if tx
                    .send(Bytes::from(format!("first from {}\n", b.name)))
                    .await
                    .is_err()
                {
                    return;
                }
                match b.gate.acquire().await {
                    Ok(permit) => permit.forget(),
                    Err(_) => return,
                }
                if two {
                    tx.send(Bytes::from_static(b"second\n")).await.ok();
                }
            });
            response
        }
        "/quiet" => {
            // A head at once, and no byte of body until the gate opens: a
            // request an engine has queued.
            let (tx, response) = streamed(Arc::clone(&b));
            tokio::spawn(async move {
                match b.gate.acquire().await {
                    Ok(permit) => permit.forget(),
                    Err(_) => return,
                }
                tx.send(Bytes::from(format!("late from {}\n", b.name)))
                    .await
                    .ok();
            });
            response
        }
        "/v1/chat/completions" => chat(req, b).await,
        p if p.starts_with("/bytes/") => {
            let n: usize = p["/bytes/".len()..].parse().unwrap_or(0);
            let (tx, response) = streamed(b);
            tokio::spawn(async move {
                let data = Bytes::from(pseudo_random(n, 7));
                let mut at = 0;
                while at < data.len() {
                    let end = (at + 64 * 1024).min(data.len());
                    if tx.send(data.slice(at..end)).await.is_err() {
                        return;
                    }
                    at = end;
                }
            });
            response
        }
        _ => {
            let session = req
                .headers()
                .get("x-session-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("(none)")
                .to_string();
            // Read (and drop) the body, so keep-alive goes on.
            let mut body = req.into_body();
            while let Some(Ok(_)) = body.frame().await {}
            let mut r = full(
                StatusCode::OK,
                format!("backend: {}\nsession: {session}\n", b.name),
            );
            r.headers_mut()
                .insert("x-backend", b.name.parse().expect("a header value"));
            r
        }
    }
}

/// A chat completion whose usage reports what the request's test headers
/// ask for, as JSON or (with `x-test-stream`) as events split across frames.
async fn chat(req: Request<Incoming>, b: Arc<HyperBackend>) -> Response<Body> {
    let number = |name: &str| -> u64 {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let (prompt, cached) = (number("x-test-prompt"), number("x-test-cached"));
    let stream = req.headers().contains_key("x-test-stream");
    let mut body = req.into_body();
    while let Some(Ok(_)) = body.frame().await {}
    b.prompt_reported.fetch_add(prompt, Ordering::SeqCst);
    b.cached_reported.fetch_add(cached, Ordering::SeqCst);
    let usage = format!(
        r#"{{"prompt_tokens":{prompt},"completion_tokens":3,"total_tokens":{},"prompt_tokens_details":{{"cached_tokens":{cached}}}}}"#,
        prompt + 3
    );
    let name = b.name.clone();
    if !stream {
        let text = format!(
            r#"{{"id":"c1","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant","content":"from {name}"}}}}],"usage":{usage}}}"#
        );
        let mut r = full(StatusCode::OK, text);
        r.headers_mut().insert(
            "content-type",
            "application/json".parse().expect("a header value"),
        );
        return r;
    }
    let (tx, mut response) = streamed(b);
    response.headers_mut().insert(
        "content-type",
        "text/event-stream".parse().expect("a header value"),
    );
    tokio::spawn(async move {
        let last = format!(r#"data: {{"choices":[],"usage":{usage}}}"#);
        let (head, tail) = last.split_at(last.len() / 2);
        let frames = [
            format!(
                "data: {{\"choices\":[{{\"delta\":{{\"content\":\"from {name}\"}}}}],\"usage\":null}}\n\n"
            ),
            head.to_string(),
            format!("{tail}\n\n"),
            "data: [DONE]\n\n".to_string(),
        ];
        for frame in frames {
            if tx.send(Bytes::from(frame)).await.is_err() {
                return;
            }
        }
    });
    response
}

// ---------------------------------------------------------------------------
// A keep-alive client.

/// One HTTP/1.1 client connection to `to`; requests go one after another.
pub struct KeepAlive {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl KeepAlive {
    pub async fn connect(to: SocketAddr) -> KeepAlive {
        let stream = within("connect to magpie", TcpStream::connect(to))
            .await
            .unwrap_or_else(|e| panic!("connect to {to}: {e}"));
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("HTTP handshake");
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                eprintln!("client connection: {e}");
            }
        });
        KeepAlive { sender }
    }

    /// Sends `request` and returns the response head and its whole body.
    pub async fn send(&mut self, request: Request<Full<Bytes>>) -> (Response<()>, Bytes) {
        within("a response through magpie", async {
            self.sender.ready().await.expect("the connection is ready");
            let response = self.sender.send_request(request).await.expect("a response");
            let (parts, body) = response.into_parts();
            let body = body.collect().await.expect("the whole body").to_bytes();
            (Response::from_parts(parts, ()), body)
        })
        .await
    }

    /// Sends `request` and returns the response with its body still streaming.
    pub async fn start(&mut self, request: Request<Full<Bytes>>) -> Response<Incoming> {
        within("a response head through magpie", async {
            self.sender.ready().await.expect("the connection is ready");
            self.sender.send_request(request).await.expect("a response")
        })
        .await
    }

    /// Sends `request`, expects a 200 and returns the backend's name.
    pub async fn served_by(&mut self, request: Request<Full<Bytes>>) -> String {
        let (response, body) = self.send(request).await;
        assert_eq!(response.status(), 200, "{body:?}");
        backend_in(&body)
    }

    /// `GET /` with `x-session-id: session`; returns the backend's name.
    pub async fn get_session(&mut self, session: &str) -> String {
        let request = get("/").header("x-session-id", session);
        self.served_by(request.body(Full::default()).expect("a request"))
            .await
    }

    /// `POST /` with a JSON body; returns the backend's name.
    pub async fn post_json(&mut self, json: &str, header: Option<&str>) -> String {
        let mut builder = Request::post("/")
            .header("host", "magpie")
            .header("content-type", "application/json");
        if let Some(h) = header {
            builder = builder.header("x-session-id", h);
        }
        let request = builder
            .body(Full::new(Bytes::from(json.to_string())))
            .expect("a request");
        let (response, body) = self.send(request).await;
        assert_eq!(response.status(), 200, "{body:?}");
        backend_in(&body)
    }
}

/// An HTTP/2 connection with prior knowledge to `to`: a sender for its
/// streams, and the task that drives it (it ends with the connection).
pub async fn h2_connect(
    to: SocketAddr,
) -> (
    hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    tokio::task::JoinHandle<hyper::Result<()>>,
) {
    let stream = within("connect to magpie", TcpStream::connect(to))
        .await
        .unwrap_or_else(|e| panic!("connect to {to}: {e}"));
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .expect("an HTTP/2 handshake");
    (sender, tokio::spawn(conn))
}

/// The next data frame of a streamed response body, which must come (within
/// the test's patience) and be data.
pub async fn next_data(body: &mut Incoming) -> Bytes {
    within("the next chunk", body.frame())
        .await
        .expect("a frame")
        .expect("no error")
        .into_data()
        .expect("data")
}

/// A chat body: `system` as its instructions, then one user message.
pub fn chat_body(system: &str, user: &str) -> String {
    format!(
        r#"{{"model":"m","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"{user}"}}]}}"#
    )
}

/// A request builder for `GET path` with a Host header.
pub fn get(path: &str) -> hyper::http::request::Builder {
    Request::get(path).header("host", "magpie")
}

/// The `NAME` of a `backend: NAME` first line.
pub fn backend_in(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    text.lines()
        .next()
        .and_then(|l| l.strip_prefix("backend: "))
        .unwrap_or_else(|| panic!("not a backend answer: {text:?}"))
        .to_string()
}
