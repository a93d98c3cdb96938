//! The read-only admin HTTP endpoint (default `127.0.0.1:9090`).
//!
//! | path | answer |
//! |---|---|
//! | `GET /metrics` | Prometheus text format ([`crate::ops::metrics`]) |
//! | `GET /healthz` | 200 while the process runs |
//! | `GET /readyz` | 200 when a table is published and at least one backend is up, else 503; 503 from the first SIGTERM on (draining) |
//! | `GET /table` | JSON: version, fingerprint, algorithm, and every backend's name, address, weight, zone, up, active and share |
//! | `GET /route?key=K` | JSON: the candidates for `K` in order, and the one a connection would be sent to now |
//! | `GET /route?addr=A` | the same for a client at address `A` (in header and body modes: its fallback key) |
//! | `GET /route?key=K&group=G` | with `key.group`: the candidates of group `G` (a header group's value, or a body group's hash `0x…`), the session's pin and its rank among them; without `group=`, the group of the key's last request |
//!
//! No endpoint changes state. `/route` takes the key as text, the way
//! `magpie lookup` does: a header value in header mode, an IP in `source_ip`
//! mode, `ip:port` in `source_addr` mode.
//!
//! **Off the data path.** The endpoint runs on a thread of its own, with a
//! single-threaded tokio runtime of its own, at a lower scheduling priority
//! (nice [`NICE`]) than the data path: accepting, parsing, rendering
//! `/metrics` (tens of milliseconds of CPU for thousands of backends) and
//! writing its megabytes never take a turn of the data path's workers
//! (with one CPU, magpie's only worker), and when the CPU is short the
//! kernel runs the data path first. `/metrics` renders on a blocking thread
//! of that runtime, one rendering at a time, shared by every scrape waiting
//! for it ([`scrape`]).
//!
//! | module | owns |
//! |---|---|
//! | [`scrape`] | `/metrics`: one rendering at a time, shared; gzip when asked |
//! | [`json`] | `/table` and `/route`, and the query string they read |
//! | [`body`] | response bodies, handed to hyper 64 KiB at a time |

pub(crate) mod body;
pub(crate) mod json;
pub(crate) mod scrape;

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use self::body::Body;
use self::json::{json_response, queue_json, route_answer, table_json};
use self::scrape::Scrapes;
use crate::ops::metrics::Renderer;
use crate::routing::instance::Instance;
use crate::telemetry::stats::Exhausted;

/// How long a client may take to send a request head.
const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The admin thread's nice value (0 is the data path's; 19 the lowest
/// priority). With the CPU short, the kernel gives the admin thread about
/// a tenth of what the data path's threads get, and a data-path thread
/// that wakes takes the CPU from it at once; probes and scrapes still get
/// their turn.
pub(crate) const NICE: i32 = 10;

/// Serves the admin endpoint on `listener` until `shutdown`, on a thread of
/// its own (see the module's docs). Should that thread not start, serves
/// here instead, with a warning. Returns when the endpoint has stopped; a
/// panic of the admin thread comes out here (so a supervisor restarts it).
/// `prepared` is the thread's runtime and descriptor made at start, before
/// the listeners were announced (a restart after a panic makes new ones):
/// made later, a burst of clients could take the last descriptors first.
pub(crate) async fn serve(
    listener: Arc<std::net::TcpListener>,
    prepared: Option<Prepared>,
    instance: Arc<Instance>,
    shutdown: CancellationToken,
) {
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let prepared = match prepared {
        Some(p) => Ok(p),
        None => Prepared::new(&listener),
    };
    let started = prepared.and_then(|prepared| {
        let (instance, shutdown) = (Arc::clone(&instance), shutdown.clone());
        std::thread::Builder::new()
            .name("magpie-admin".to_string())
            .spawn(move || {
                run_thread(prepared, instance, shutdown);
                // Nobody waits only when the serving task itself was dropped.
                if done_tx.send(()).is_err() {
                    debug!("the admin thread ended after its task");
                }
            })
    });
    match started {
        Ok(_) => {
            if done_rx.await.is_err() {
                // The thread panicked (and the panic hook has logged and
                // counted it): panic here too, without counting it again.
                std::panic::resume_unwind(Box::new("the admin thread panicked"));
            }
        }
        Err(e) => {
            warn!(error = %e, "cannot start the admin thread; serving admin on the data path's runtime");
            match listener.try_clone().and_then(TcpListener::from_std) {
                Ok(here) => serve_here(Arc::new(here), instance, shutdown).await,
                Err(e) => {
                    tracing::error!(error = %e, "cannot register the admin listener; admin is off")
                }
            }
        }
    }
}

/// What the admin thread needs that takes descriptors: its runtime, and a
/// descriptor of the listener of its own for that runtime's reactor (the
/// listener is registered with no other: the data path's runtime never
/// hears of admin connections).
pub(crate) struct Prepared {
    runtime: tokio::runtime::Runtime,
    listener: std::net::TcpListener,
}

impl Prepared {
    pub(crate) fn new(listener: &std::net::TcpListener) -> std::io::Result<Prepared> {
        let own = listener.try_clone()?;
        own.set_nonblocking(true)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("magpie-admin-render")
            .build()?;
        Ok(Prepared {
            runtime,
            listener: own,
        })
    }
}

/// The admin thread: a lower priority, its own runtime, the endpoint.
fn run_thread(prepared: Prepared, instance: Arc<Instance>, shutdown: CancellationToken) {
    // On Linux the nice value is per thread, and threads started from this
    // one (the runtime's blocking threads that render) inherit it.
    if let Err(e) = rustix::process::setpriority_process(None, NICE) {
        warn!(error = %e, "cannot lower the admin thread's priority");
    }
    let Prepared { runtime, listener } = prepared;
    runtime.block_on(async move {
        match TcpListener::from_std(listener) {
            Ok(listener) => serve_here(Arc::new(listener), instance, shutdown).await,
            Err(e) => {
                tracing::error!(error = %e, "cannot register the admin listener; admin is off")
            }
        }
    });
}

/// Serves the admin endpoint on `listener` until `shutdown`, on the
/// runtime this runs on.
pub(crate) async fn serve_here(
    listener: Arc<TcpListener>,
    instance: Arc<Instance>,
    shutdown: CancellationToken,
) {
    let scrapes = Arc::new(Scrapes::new(Renderer::new(Arc::clone(&instance))));
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    crate::intake::listener::accept_failed(&e, &instance.stats, Exhausted::AdminAccept).await;
                    continue;
                }
            },
        };
        let instance = Arc::clone(&instance);
        let scrapes = Arc::clone(&scrapes);
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let (instance, scrapes) = (Arc::clone(&instance), Arc::clone(&scrapes));
                async move { Ok::<_, Infallible>(respond(&req, &instance, &scrapes).await) }
            });
            // A client that never finishes its request head does not hold a
            // task forever.
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                result = conn => if let Err(e) = result {
                    debug!(%peer, error = %e, "admin connection ended with an error");
                },
                _ = shutdown.cancelled() => {}
            }
        });
    }
}

/// Answers one request.
async fn respond<B>(req: &Request<B>, instance: &Instance, scrapes: &Scrapes) -> Response<Body> {
    let read = req.method() == Method::GET || req.method() == Method::HEAD;
    if read && req.uri().path() == "/metrics" {
        return scrapes.answer(req.headers()).await;
    }
    answer(req, instance)
}

/// Answers one request but `GET /metrics`. Pure apart from reading shared
/// state.
pub(crate) fn answer<B>(req: &Request<B>, instance: &Instance) -> Response<Body> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and HEAD: the admin endpoint is read-only\n",
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let snapshot = instance.snapshot.load_full();
    match req.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if instance.is_draining() => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: draining (shutting down)\n",
        ),
        "/readyz" => {
            let up = snapshot
                .backends
                .iter()
                .filter(|b| b.weight > 0 && b.live.health.is_up())
                .count();
            if up > 0 {
                text(
                    StatusCode::OK,
                    format!(
                        "ready: table version {}, {up} backends up\n",
                        snapshot.version
                    ),
                )
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not ready: no backend is up\n",
                )
            }
        }
        "/table" => json_response(StatusCode::OK, table_json(&snapshot)),
        "/route" => route_answer(req.uri().query().unwrap_or(""), &snapshot, instance),
        "/queue" => json_response(StatusCode::OK, queue_json(&snapshot, instance)),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; try /metrics, /healthz, /readyz, /table, /queue or /route?key=K\n",
        ),
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Body::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::snapshot::Snapshot;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn a_stalled_request_head_is_dropped() {
        let config = crate::config::Config::parse(
            std::path::Path::new("t.yaml"),
            "listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
        )
        .unwrap();
        let snapshot = Snapshot::build(Arc::new(config), 1, &Default::default()).unwrap();
        let instance = Arc::new(Instance::new(snapshot));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        tokio::spawn(serve_here(Arc::new(listener), instance, stop.clone()));
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\n")
            .await
            .unwrap();
        let started = tokio::time::Instant::now();
        let mut rest = Vec::new();
        // hyper answers a timed-out head with 408 or just closes; either way it ends.
        if let Err(e) = stream.read_to_end(&mut rest).await {
            eprintln!("the stalled connection ended with {e}");
        }
        assert!(
            started.elapsed() >= HEADER_READ_TIMEOUT,
            "{:?}",
            started.elapsed()
        );
        assert!(!String::from_utf8_lossy(&rest).contains("200 OK"));
        stop.cancel();
    }
}
