//! Active health checks: a TCP connect to every backend, or with
//! `health.http_path` an HTTP `GET` over a fresh connection whose status must
//! be in `health.expect_status`, at the backend's port or `health.port`; or
//! (mode udp, `health.datagram`) a probe datagram whose answer must start
//! with the expected bytes; every `interval` (plus up to 10% jitter, so a
//! fleet does not probe in step), with `timeout`, `rise` and `fall`. An
//! inference server whose engine hung keeps its port open; only the HTTP
//! check (`/health` on vLLM and SGLang) sees it.
//!
//! Down backends keep being probed, so they come back without needing
//! traffic. Checks run only when the config has a `health` section; the loop
//! asks its [`Targets`] again every round, so a reload that adds or removes
//! the section, or changes the backends, takes effect without a restart.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::state::CheckOutcome;
use super::{Target, Targets};
use crate::config::HealthConfig;
use crate::net::is_resource_exhaustion;
use crate::telemetry::stats::Exhausted;

/// How often to look again for a `health` section when there is none.
const IDLE_RECHECK: Duration = Duration::from_secs(1);

/// Probes the targets in force, round after round, until `shutdown`.
pub(crate) async fn run<P: Targets>(pool: Arc<P>, shutdown: CancellationToken) {
    let mut jitter = Jitter::new();
    loop {
        let round = pool.round();
        let wait = match round.health {
            None => IDLE_RECHECK,
            Some(health) => {
                let started = Instant::now();
                check_all(&*pool, round.targets, &health).await;
                (health.interval + jitter.up_to(health.interval / 10))
                    .saturating_sub(started.elapsed())
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// One round: every target probed side by side, each outcome recorded as it
/// comes in.
async fn check_all<P: Targets>(pool: &P, targets: Vec<Arc<P::Target>>, health: &HealthConfig) {
    let mut probes = JoinSet::new();
    for target in targets {
        let health = health.clone();
        probes.spawn(async move {
            let outcome = probe(&*target, &health).await;
            (target, outcome)
        });
    }
    while let Some(done) = probes.join_next().await {
        let Ok((target, outcome)) = done else {
            continue;
        };
        // magpie out of fds or memory says nothing about the backend.
        let Some(outcome) = outcome else {
            pool.stats().count_exhausted(Exhausted::HealthCheck);
            continue;
        };
        match target
            .health()
            .record_check(outcome, health.rise, health.fall)
        {
            Some(true) => info!(backend = %target.name(), "backend is up"),
            Some(false) => {
                warn!(backend = %target.name(), addr = %target.addr(), "backend is down: {} failed checks", health.fall)
            }
            None => {}
        }
    }
}

/// One check within `health.timeout`: a TCP connect (and, to a TLS
/// backend, the TLS handshake), or an HTTP `GET` of `health.http_path`
/// (over that TLS) whose status must be in `health.expect_status`. `None`
/// when magpie itself is out of file descriptors or memory: no verdict.
pub(crate) async fn probe(target: &impl Target, health: &HealthConfig) -> Option<CheckOutcome> {
    let addr = match health.port {
        Some(port) => std::net::SocketAddr::new(target.addr().ip(), port),
        None => target.addr(),
    };
    let check = async {
        if let Some(datagram) = &health.datagram {
            return datagram_check(addr, datagram).await;
        }
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let Some(tls) = target.tls() else {
            return match &health.http_path {
                None => Ok(CheckOutcome::Ok),
                Some(path) => http_check(stream, target, path, health).await,
            };
        };
        let stream = tls.handshake(stream, health.timeout).await?;
        match &health.http_path {
            None => Ok(CheckOutcome::Ok),
            Some(path) => http_check(stream, target, path, health).await,
        }
    };
    let name = target.name();
    match tokio::time::timeout(health.timeout, check).await {
        Ok(Ok(outcome)) => {
            if outcome != CheckOutcome::Ok {
                debug!(backend = %name, outcome = outcome.as_str(), "health check failed");
            }
            Some(outcome)
        }
        Ok(Err(e)) if is_resource_exhaustion(&e) => {
            debug!(backend = %name, error = %e, "health check skipped: magpie is out of resources");
            None
        }
        Ok(Err(e)) => {
            debug!(backend = %name, error = %e, "health check failed");
            Some(CheckOutcome::Failed)
        }
        Err(_) => {
            debug!(backend = %name, "health check timed out");
            Some(CheckOutcome::Timeout)
        }
    }
}

/// Sends `probe.send` to `addr` from a socket of its own and reads one
/// answer: it passes when the answer starts with `probe.expect`. A port
/// that is closed fails at once where the host says so (ICMP).
async fn datagram_check(
    addr: std::net::SocketAddr,
    probe: &crate::config::DatagramProbe,
) -> std::io::Result<CheckOutcome> {
    let socket = crate::net::connected_datagram(addr)?;
    socket.send(&probe.send).await?;
    let mut answer = vec![0; probe.expect.len().max(1) + 1];
    let n = socket.recv(&mut answer).await?;
    Ok(if answer[..n].starts_with(&probe.expect) {
        CheckOutcome::Ok
    } else {
        CheckOutcome::BadAnswer
    })
}

/// `GET path` over `stream` (HTTP/1.1, `Connection: close`); the status decides.
async fn http_check(
    stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    target: &impl Target,
    path: &str,
    health: &HealthConfig,
) -> std::io::Result<CheckOutcome> {
    use http_body_util::Empty;
    use hyper::header::{CONNECTION, HOST, USER_AGENT};

    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(std::io::Error::other)?;
    let driver = tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header(HOST, target.addr().to_string())
        .header(USER_AGENT, "magpie-health")
        .header(CONNECTION, "close")
        .body(Empty::<bytes::Bytes>::new())
        .map_err(std::io::Error::other)?;
    let response = sender
        .send_request(request)
        .await
        .map_err(std::io::Error::other);
    driver.abort();
    let status = response?.status().as_u16();
    Ok(if health.expect_status.contains(&status) {
        CheckOutcome::Ok
    } else {
        CheckOutcome::BadStatus
    })
}

/// A tiny xorshift for jitter; seeded from the clock, no crate needed.
struct Jitter(u64);

impl Jitter {
    fn new() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9e37_79b9_7f4a_7c15);
        Jitter(seed | 1)
    }

    fn up_to(&mut self, max: Duration) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let nanos = max.as_nanos() as u64;
        if nanos == 0 {
            Duration::ZERO
        } else {
            Duration::from_nanos(self.0 % nanos)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_range() {
        let mut j = Jitter::new();
        for _ in 0..1000 {
            assert!(j.up_to(Duration::from_millis(200)) < Duration::from_millis(200));
        }
        assert_eq!(j.up_to(Duration::ZERO), Duration::ZERO);
    }
}
