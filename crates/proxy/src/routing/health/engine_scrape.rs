//! Engine load scrapes: every `health.load.interval`, each backend's own
//! Prometheus text (`GET http://ADDR{path}`) is read for its queue and KV
//! cache gauges, and the values land in its [`EngineLoad`](super::EngineLoad).
//!
//! One task for the pool: it asks its [`Targets`] again every round, like
//! the active checks, so a reload that adds the section, adds backends or
//! removes them takes effect at the next round (a removed backend's
//! connection is dropped). Each backend is scraped over a kept-alive
//! HTTP/1.1 connection, side by side with the others, within
//! `health.load.timeout` for the whole exchange; an answer larger than
//! [`MAX_SCRAPE_BYTES`] is a failed scrape. A failed or slow scrape marks
//! nothing down and blocks no request: the data paths only read the last
//! good value, which counts until `max_age` and is ignored after. Failures
//! are counted by result on the backend and logged at most once every
//! [`FAILURE_LOG_EVERY`]. Where the preset says where an engine tells its
//! slots (`llama-server`'s `GET /props`, its `total_slots`), that is asked
//! too, over the same connection, while they are not known.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::client::conn::http1::SendRequest;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::engine_load::ScrapeResult;
use super::exposition::{self, Sample};
use super::{Target, Targets};
use crate::config::LoadConfig;
use crate::telemetry::throttle::Throttle;

/// The largest metrics answer read; vLLM's is tens of KiB.
pub(crate) const MAX_SCRAPE_BYTES: usize = 4 << 20;
/// Failed scrapes are logged at most this often (all are counted).
pub(crate) const FAILURE_LOG_EVERY: Duration = Duration::from_secs(10);
/// How often to look again for a `health.load` section when there is none.
const IDLE_RECHECK: Duration = Duration::from_secs(1);

/// A kept-alive connection to one backend; its driver stops when it drops.
struct Connection {
    sender: SendRequest<Empty<Bytes>>,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// The kept connections, by backend name and address.
type Kept = HashMap<(String, SocketAddr), Connection>;

/// Scrapes the targets in force, round after round, until `shutdown`.
pub(crate) async fn run<P: Targets>(pool: Arc<P>, shutdown: CancellationToken) {
    let mut kept = Kept::new();
    loop {
        let round = pool.round();
        let wait = match round.health.and_then(|h| h.load) {
            None => {
                kept.clear();
                IDLE_RECHECK
            }
            Some(load) => {
                let started = Instant::now();
                let interval = load.interval;
                scrape_all(&mut kept, round.targets, Arc::new(load)).await;
                interval.saturating_sub(started.elapsed())
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// One round: every target scraped side by side, each result recorded as it
/// comes in; the connections that stay usable are kept for the next round,
/// those of backends no longer in `targets` are dropped.
async fn scrape_all<T: Target>(kept: &mut Kept, targets: Vec<Arc<T>>, load: Arc<LoadConfig>) {
    let mut previous = std::mem::take(kept);
    let mut scrapes = JoinSet::new();
    for target in targets {
        let key = (target.name().to_string(), target.addr());
        let connection = previous.remove(&key);
        let load = Arc::clone(&load);
        scrapes.spawn(async move {
            let (result, connection) = scrape(&*target, connection, &load).await;
            record(&*target, result);
            (key, connection)
        });
    }
    drop(previous);
    while let Some(done) = scrapes.join_next().await {
        if let Ok((key, Some(connection))) = done {
            kept.insert(key, connection);
        }
    }
}

/// Writes a scrape's result to the target's engine load: the values of a
/// good one, the count of a failed one (and a throttled log line).
fn record(target: &impl Target, result: Result<Sample, ScrapeResult>) {
    static FAILED_LOG: Throttle = Throttle::new(FAILURE_LOG_EVERY);
    match result {
        Ok(sample) => target.engine().record(sample, Instant::now()),
        Err(why) => {
            target.engine().count(why);
            debug!(backend = %target.name(), result = why.as_str(), "engine load scrape failed");
            if let Some(held_back) = FAILED_LOG.allow() {
                warn!(backend = %target.name(), addr = %target.addr(), result = why.as_str(), held_back, "engine load scrape failed; its last value counts until health.load.max_age (magpie_engine_load_scrapes_total counts every one)");
            }
        }
    }
}

/// One scrape within `load.timeout`, over `kept` if it is still open; the
/// connection comes back when it can serve the next round.
async fn scrape(
    target: &impl Target,
    kept: Option<Connection>,
    load: &LoadConfig,
) -> (Result<Sample, ScrapeResult>, Option<Connection>) {
    match tokio::time::timeout(load.timeout, exchange(target, kept, load)).await {
        Ok(done) => done,
        Err(_) => (Err(ScrapeResult::Timeout), None),
    }
}

/// `GET path`, then the body read (bounded) and parsed.
async fn exchange(
    target: &impl Target,
    kept: Option<Connection>,
    load: &LoadConfig,
) -> (Result<Sample, ScrapeResult>, Option<Connection>) {
    let reused = kept.as_ref().is_some_and(|c| !c.sender.is_closed());
    let mut connection = match kept.filter(|_| reused) {
        Some(c) => c,
        None => match connect(target.addr()).await {
            Some(c) => c,
            None => return (Err(ScrapeResult::Connect), None),
        },
    };
    let mut response = ask(&mut connection, target, &load.path).await;
    if response.is_none() && reused {
        // The backend closed the kept connection as we used it: once more,
        // on a fresh one.
        connection = match connect(target.addr()).await {
            Some(c) => c,
            None => return (Err(ScrapeResult::Connect), None),
        };
        response = ask(&mut connection, target, &load.path).await;
    }
    let Some(response) = response else {
        return (Err(ScrapeResult::Connect), None);
    };
    if response.status() != hyper::StatusCode::OK {
        return (Err(ScrapeResult::Status), None);
    }
    let body = match Limited::new(response.into_body(), MAX_SCRAPE_BYTES)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return (Err(ScrapeResult::TooLarge), None);
        }
        Err(_) => return (Err(ScrapeResult::Connect), None),
    };
    let mut sample = exposition::read(&body, &load.gauges);
    if sample.is_empty() {
        return (Err(ScrapeResult::Parse), Some(connection));
    }
    let unknown = sample.slots.is_none() && target.engine().slots().is_none();
    if let Some(path) = load.gauges.slots_path.as_deref().filter(|_| unknown) {
        let (slots, kept) = ask_slots(connection, target, path).await;
        sample.slots = slots;
        return (Ok(sample), kept);
    }
    (Ok(sample), Some(connection))
}

/// The slots `GET path` tells (a JSON object's `total_slots`, at least 1),
/// and the connection if it can serve the next round. A failure tells
/// nothing and fails no scrape: the slots are asked again next round.
async fn ask_slots(
    mut connection: Connection,
    target: &impl Target,
    path: &str,
) -> (Option<f64>, Option<Connection>) {
    let Some(response) = ask(&mut connection, target, path).await else {
        return (None, None);
    };
    let ok = response.status() == hyper::StatusCode::OK;
    let Ok(body) = (Limited::new(response.into_body(), MAX_SCRAPE_BYTES).collect()).await else {
        return (None, None);
    };
    let slots = serde_json::from_slice::<serde_json::Value>(&body.to_bytes())
        .ok()
        .filter(|_| ok)
        .and_then(|props| props.get("total_slots")?.as_u64())
        .filter(|slots| *slots >= 1)
        .map(|slots| slots as f64);
    (slots, Some(connection))
}

/// A fresh HTTP/1.1 connection to `addr`, its driver spawned.
async fn connect(addr: SocketAddr) -> Option<Connection> {
    let stream = match tokio::net::TcpStream::connect(addr).await {
        Ok(stream) => stream,
        Err(e) => {
            debug!(%addr, error = %e, "engine load: connect failed");
            return None;
        }
    };
    if let Err(e) = stream.set_nodelay(true) {
        debug!(%addr, error = %e, "engine load: cannot set TCP_NODELAY");
    }
    let io = hyper_util::rt::TokioIo::new(stream);
    let (sender, connection) = match hyper::client::conn::http1::handshake(io).await {
        Ok(pair) => pair,
        Err(e) => {
            debug!(%addr, error = %e, "engine load: handshake failed");
            return None;
        }
    };
    let driver = tokio::spawn(async move {
        if let Err(e) = connection.await {
            debug!(%addr, error = %e, "engine load: connection ended");
        }
    });
    Some(Connection { sender, driver })
}

/// Sends `GET path` over `connection` and waits for the response head;
/// `None` when the connection failed (logged at debug level).
async fn ask(
    connection: &mut Connection,
    target: &impl Target,
    path: &str,
) -> Option<hyper::Response<hyper::body::Incoming>> {
    use hyper::header::{ACCEPT, HOST, USER_AGENT};
    let request = hyper::Request::get(path)
        .header(HOST, target.addr().to_string())
        .header(USER_AGENT, "magpie-load")
        .header(ACCEPT, "text/plain")
        .body(Empty::<Bytes>::new())
        .ok()?;
    let sent = async {
        connection.sender.ready().await?;
        connection.sender.send_request(request).await
    };
    sent.await
        .inspect_err(
            |e| debug!(backend = %target.name(), error = %e, "engine load: request failed"),
        )
        .ok()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::config::LoadPreset;
    use crate::routing::health::{EngineLoad, Health};

    struct Engine {
        addr: SocketAddr,
        health: Health,
        engine: EngineLoad,
    }

    impl Target for Engine {
        fn name(&self) -> &str {
            "e"
        }
        fn addr(&self) -> SocketAddr {
            self.addr
        }
        fn health(&self) -> &Health {
            &self.health
        }
        fn engine(&self) -> &EngineLoad {
            &self.engine
        }
    }

    /// A keep-alive server answering every request head with `answer`;
    /// counts the connections it accepted.
    async fn server(answer: Arc<Mutex<Vec<u8>>>, accepted: Arc<AtomicUsize>) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                let answer = Arc::clone(&answer);
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while let Ok(n @ 1..) = stream.read(&mut buf).await {
                        head.extend_from_slice(&buf[..n]);
                        if head.windows(4).any(|w| w == b"\r\n\r\n") {
                            head.clear();
                            let bytes = answer.lock().unwrap().clone();
                            if stream.write_all(&bytes).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        addr
    }

    fn ok(body: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    #[tokio::test]
    async fn scrapes_reuse_one_connection_and_fail_by_reason() {
        let answer = Arc::new(Mutex::new(ok("vllm:num_requests_waiting{m=\"x\"} 3\n")));
        let accepted = Arc::new(AtomicUsize::new(0));
        let addr = server(Arc::clone(&answer), Arc::clone(&accepted)).await;
        let target = Arc::new(Engine {
            addr,
            health: Health::default(),
            engine: EngineLoad::default(),
        });
        let load = Arc::new(LoadConfig {
            preset: LoadPreset::Vllm,
            path: "/metrics".to_string(),
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(2),
            gauges: LoadPreset::Vllm.gauges(),
            limits: crate::config::LoadLimits {
                max_waiting: Some(8),
                max_kv_usage: 0.95,
                max_age: Duration::from_secs(5),
            },
        });
        let mut kept = Kept::new();
        let round = async |kept: &mut Kept| {
            scrape_all(kept, vec![Arc::clone(&target)], Arc::clone(&load)).await
        };
        for _ in 0..3 {
            round(&mut kept).await;
        }
        assert_eq!(target.engine.scrapes(ScrapeResult::Ok), 3);
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one kept-alive connection"
        );
        let fresh = target.engine.fresh(Instant::now(), Duration::from_secs(5));
        assert_eq!(fresh.and_then(|s| s.waiting), Some(3.0));

        *answer.lock().unwrap() = ok("# nothing we read\nother 1\n");
        round(&mut kept).await;
        assert_eq!(target.engine.scrapes(ScrapeResult::Parse), 1);
        *answer.lock().unwrap() = b"HTTP/1.1 503 Busy\r\ncontent-length: 0\r\n\r\n".to_vec();
        round(&mut kept).await;
        assert_eq!(target.engine.scrapes(ScrapeResult::Status), 1);
        *answer.lock().unwrap() = ok(&"x".repeat(MAX_SCRAPE_BYTES + 1));
        round(&mut kept).await;
        assert_eq!(target.engine.scrapes(ScrapeResult::TooLarge), 1);
        // The last good value is still there; health was never touched.
        let fresh = target.engine.fresh(Instant::now(), Duration::from_secs(5));
        assert_eq!(fresh.and_then(|s| s.waiting), Some(3.0));
        assert!(target.health.is_up());

        // Nobody listening: a connect failure, and the kept entry is gone.
        let dead = Arc::new(Engine {
            addr: std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .unwrap(),
            health: Health::default(),
            engine: EngineLoad::default(),
        });
        scrape_all(&mut kept, vec![Arc::clone(&dead)], Arc::clone(&load)).await;
        assert_eq!(dead.engine.scrapes(ScrapeResult::Connect), 1);
        assert!(kept.is_empty(), "the removed backend's connection dropped");
    }
}
