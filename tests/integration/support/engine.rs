//! Fake inference engines for the engine load tests: hyper servers on
//! `127.0.0.1:0` whose `GET /metrics` serves vLLM-style Prometheus text with
//! values the test sets (or hangs, or answers garbage), and which answer
//! every other request with `backend: NAME`, or with the answer the test
//! set for its kind (streamed or not); a request for `/held` is answered
//! only once the test lets it go ([`FakeEngine::release`]), one for
//! `/props` with what the test set ([`FakeEngine::set_props`]).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// What `GET /metrics` does.
#[derive(Debug, Clone)]
pub enum Metrics {
    Text(String),
    /// Never answers.
    Hang,
    /// Answers 200 with something that is not Prometheus text.
    Garbage,
}

pub struct FakeEngine {
    pub name: String,
    pub addr: SocketAddr,
    metrics: Mutex<Metrics>,
    /// What other requests get: (content type, body), for a body that asks
    /// `"stream":true` and for one that does not.
    answers: Mutex<Option<[EngineAnswer; 2]>>,
    /// `GET /metrics` requests seen.
    pub scrapes: AtomicU64,
    /// What `GET /props` answers (404 while unset).
    props: Mutex<Option<String>>,
    /// `/held` requests wait for a permit here.
    gate: Semaphore,
    /// `/held` requests waiting for one now.
    pub held: AtomicU64,
}

/// An answer's content type and body.
pub type EngineAnswer = (&'static str, String);

impl FakeEngine {
    /// vLLM's gauges with these values, for two models (summed by magpie).
    pub fn report(&self, waiting: u32, kv_usage: f64) {
        let (first, second) = (waiting / 2, waiting - waiting / 2);
        let text = format!(
            "# HELP vllm:num_requests_waiting Number of requests waiting.\n\
             # TYPE vllm:num_requests_waiting gauge\n\
             vllm:num_requests_waiting{{engine=\"0\",model_name=\"m\"}} {first}.0\n\
             vllm:num_requests_waiting{{engine=\"0\",model_name=\"lora\"}} {second}.0\n\
             # TYPE vllm:num_requests_running gauge\n\
             vllm:num_requests_running{{engine=\"0\",model_name=\"m\"}} 1.0\n\
             # TYPE vllm:kv_cache_usage_perc gauge\n\
             vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"m\"}} {kv_usage}\n"
        );
        self.set(Metrics::Text(text));
    }

    /// Answers `GET /props` with `json`.
    pub fn set_props(&self, json: &str) {
        *self.props.lock().expect("the props lock") = Some(json.to_string());
    }

    /// Returns once at least `n` `/held` requests wait here.
    pub async fn until_held(&self, n: u64) {
        super::within("requests held at the engine", async {
            while self.held.load(Ordering::SeqCst) < n {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await;
    }

    /// Lets `n` waiting `/held` requests be answered.
    pub fn release(&self, n: usize) {
        self.gate.add_permits(n);
    }

    pub fn set(&self, metrics: Metrics) {
        *self.metrics.lock().expect("the metrics lock") = metrics;
    }

    /// Answers a request whose body asks `"stream":true` with `streamed`,
    /// any other with `whole`.
    pub fn answer_with(&self, streamed: EngineAnswer, whole: EngineAnswer) {
        *self.answers.lock().expect("the answers lock") = Some([streamed, whole]);
    }
}

/// A set of fake engines; they stop when dropped.
pub struct FakeEngines {
    pub list: Vec<Arc<FakeEngine>>,
    stop: CancellationToken,
}

impl FakeEngines {
    /// Engines that report an idle queue and cache.
    pub async fn start(names: &[&str]) -> FakeEngines {
        let stop = CancellationToken::new();
        let mut list = Vec::new();
        for name in names {
            let listener = TcpListener::bind("127.0.0.1:0")
                .await
                .unwrap_or_else(|e| panic!("cannot start engine {name}: {e}"));
            let engine = Arc::new(FakeEngine {
                name: name.to_string(),
                addr: listener.local_addr().expect("a bound address"),
                metrics: Mutex::new(Metrics::Garbage),
                answers: Mutex::new(None),
                scrapes: AtomicU64::new(0),
                props: Mutex::new(None),
                gate: Semaphore::new(0),
                held: AtomicU64::new(0),
            });
            engine.report(0, 0.1);
            tokio::spawn(serve(listener, Arc::clone(&engine), stop.clone()));
            list.push(engine);
        }
        FakeEngines { list, stop }
    }

    /// (name, address) pairs, for configs.
    pub fn pairs(&self) -> Vec<(String, SocketAddr)> {
        self.list.iter().map(|e| (e.name.clone(), e.addr)).collect()
    }

    pub fn get(&self, name: &str) -> &Arc<FakeEngine> {
        self.list
            .iter()
            .find(|e| e.name == name)
            .unwrap_or_else(|| panic!("no engine {name}"))
    }
}

impl Drop for FakeEngines {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn serve(listener: TcpListener, engine: Arc<FakeEngine>, stop: CancellationToken) {
    loop {
        let stream = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => s,
                Err(e) => { eprintln!("engine {}: accept: {e}", engine.name); continue; }
            },
        };
        let (engine, stop) = (Arc::clone(&engine), stop.clone());
        tokio::spawn(async move {
            let service = {
                let engine = Arc::clone(&engine);
                service_fn(move |req| answer(req, Arc::clone(&engine)))
            };
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = stop.cancelled() => {}
                r = conn => if let Err(e) = r { eprintln!("engine {}: connection: {e}", engine.name) },
            }
        });
    }
}

async fn answer(
    req: Request<hyper::body::Incoming>,
    engine: Arc<FakeEngine>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.uri().path() == "/metrics" {
        engine.scrapes.fetch_add(1, Ordering::SeqCst);
        let metrics = engine.metrics.lock().expect("the metrics lock").clone();
        let text = match metrics {
            Metrics::Text(text) => text,
            Metrics::Hang => std::future::pending().await,
            Metrics::Garbage => "<html><body>502 Bad Gateway {{{\u{0}".to_string(),
        };
        return Ok(Response::new(Full::new(Bytes::from(text))));
    }
    if req.uri().path() == "/props" {
        let props = engine.props.lock().expect("the props lock").clone();
        let response = match props {
            Some(json) => Response::new(Full::new(Bytes::from(json))),
            None => Response::builder()
                .status(404)
                .body(Full::new(Bytes::from_static(b"not found")))
                .expect("an answer"),
        };
        return Ok(response);
    }
    if req.uri().path() == "/held" {
        engine.held.fetch_add(1, Ordering::SeqCst);
        if let Ok(permit) = engine.gate.acquire().await {
            permit.forget();
        }
        engine.held.fetch_sub(1, Ordering::SeqCst);
    }
    let mut body = req.into_body();
    let mut streams = false;
    while let Some(Ok(frame)) = body.frame().await {
        if let Some(data) = frame.data_ref() {
            streams |= data.windows(13).any(|w| w == b"\"stream\":true");
        }
    }
    let answers = engine.answers.lock().expect("the answers lock").clone();
    let Some([streamed, whole]) = answers else {
        let text = format!("backend: {}\n", engine.name);
        return Ok(Response::new(Full::new(Bytes::from(text))));
    };
    let (content_type, body) = if streams { streamed } else { whole };
    let response = Response::builder()
        .header("content-type", content_type)
        .header("x-engine", engine.name.as_str())
        .body(Full::new(Bytes::from(body)))
        .expect("an answer");
    Ok(response)
}
