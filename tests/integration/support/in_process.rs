//! magpie started in-process from a YAML string or file, and the configs tests write.

use std::net::SocketAddr;
use std::path::Path;

use tokio_util::sync::CancellationToken;

use magpie_proxy::app::{self, Running};
use magpie_proxy::config::Config;
use magpie_proxy::testing::{BackendProbe, Probe};

use super::{metric_sum, within};

/// A running magpie; it shuts down when dropped.
pub struct Magpie {
    pub addr: SocketAddr,
    /// The admin endpoint, when the config turns it on.
    pub admin: Option<SocketAddr>,
    /// What the tests read of it that no metric shows, and what they do to it.
    pub probe: Probe,
    running: Option<Running>,
    shutdown: CancellationToken,
}

impl Magpie {
    /// Starts magpie from a complete YAML config.
    pub async fn start(yaml: &str) -> Magpie {
        let config = Config::parse(Path::new("test.yaml"), yaml)
            .unwrap_or_else(|e| panic!("test config rejected:\n{e}\n--- config ---\n{yaml}"));
        let shutdown = CancellationToken::new();
        let running = app::start(config, shutdown.clone())
            .await
            .unwrap_or_else(|e| panic!("magpie did not start: {e}"));
        Magpie::running(running, shutdown)
    }

    /// Starts magpie from a config file, which it then watches for reloads.
    pub async fn start_file(path: &Path) -> Magpie {
        let config = Config::load(path).unwrap_or_else(|e| panic!("test config rejected:\n{e}"));
        let shutdown = CancellationToken::new();
        let running = app::start(config, shutdown.clone())
            .await
            .unwrap_or_else(|e| panic!("magpie did not start: {e}"));
        Magpie::running(running, shutdown)
    }

    fn running(running: Running, shutdown: CancellationToken) -> Magpie {
        Magpie {
            addr: running.listen[0],
            admin: running.admin,
            probe: running.probe(),
            running: Some(running),
            shutdown,
        }
    }

    /// Starts magpie on `127.0.0.1:0` with `settings` (YAML lines) in front of `backends`.
    pub async fn with(settings: &str, backends: &[(String, SocketAddr)]) -> Magpie {
        Magpie::start(&config_yaml("127.0.0.1:0", settings, backends)).await
    }

    /// Every address it listens on, in the config's order.
    pub fn listening(&self) -> Vec<SocketAddr> {
        self.running
            .as_ref()
            .map_or_else(Vec::new, |r| r.listen.clone())
    }

    /// The backends for `key`, primary first, by name.
    pub fn candidates(&self, key: u64) -> Vec<String> {
        self.probe.candidates(key)
    }

    pub fn primary(&self, key: u64) -> String {
        self.candidates(key)
            .into_iter()
            .next()
            .expect("a snapshot always has a candidate")
    }

    /// `n` session keys (`PREFIX-i`, as `x-session-id` sends them) whose
    /// primary is `backend`.
    pub fn sessions_of(&self, backend: &str, prefix: &str, n: usize) -> Vec<String> {
        (0..100_000)
            .map(|i| format!("{prefix}-{i}"))
            .filter(|s| self.primary(magpie_core::key::text_key(s.as_bytes())) == backend)
            .take(n)
            .collect()
    }

    pub fn backend(&self, name: &str) -> BackendProbe {
        (self.probe.backend(name)).unwrap_or_else(|| panic!("no backend named {name}"))
    }

    /// Active connections per backend, in name order.
    pub fn active(&self) -> Vec<(String, u64)> {
        (self.probe.backends().iter())
            .map(|b| (b.name().to_string(), b.active()))
            .collect()
    }

    /// The sum of the series of the metric `name` whose labels include each
    /// of `labels` (`key="value"`), as `/metrics` shows it now. The metric
    /// must be one magpie exports.
    pub fn metric(&self, name: &str, labels: &[&str]) -> u64 {
        self.metric_f64(name, labels) as u64
    }

    /// [`Magpie::metric`] as it is exported (a histogram's `_sum`, a ratio).
    pub fn metric_f64(&self, name: &str, labels: &[&str]) -> f64 {
        let text = self.probe.metrics();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|base| text.contains(&format!("# TYPE {base} histogram")))
            .unwrap_or(name);
        let declared = format!("# TYPE {family} ");
        assert!(text.contains(&declared), "/metrics has no family {family}");
        metric_sum(&text, name, labels)
    }

    /// Clients that failed for `reason`
    /// (`magpie_client_failures_total{reason}`).
    pub fn client_failures(&self, reason: &str) -> u64 {
        let reason = format!("reason=\"{reason}\"");
        self.metric("magpie_client_failures_total", &[&reason])
    }

    /// Requests (or connections) that went by the fallback key for `reason`.
    pub fn fallbacks(&self, reason: magpie_core::key::FallbackReason) -> u64 {
        let reason = format!("reason=\"{}\"", reason.as_str());
        self.metric("magpie_key_fallbacks_total", &[&reason])
    }

    /// The sum of the per-backend metric `name` for backend `backend`
    /// whose other labels include each of `labels`.
    pub fn backend_metric(&self, name: &str, backend: &str, labels: &[&str]) -> u64 {
        let backend = format!("backend=\"{backend}\"");
        let all: Vec<&str> = std::iter::once(backend.as_str())
            .chain(labels.iter().copied())
            .collect();
        self.metric(name, &all)
    }

    /// Waits until its shared session store (`store: redis`) is connected.
    pub async fn store_connected(&self) {
        within("the store to connect", async {
            while !self.probe.store_connected() {
                tokio::task::yield_now().await;
            }
        })
        .await;
    }

    /// Stops accepting and waits until every connection is closed.
    /// Starts the drain (as SIGTERM does) without waiting for it.
    pub fn begin_shutdown(&self) {
        self.shutdown.cancel();
    }

    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(running) = self.running.take() {
            within("magpie to shut down", running.wait()).await;
        }
    }
}

impl Drop for Magpie {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A config: `listen`, admin off, `settings` (YAML lines, may be empty), `backends`.
pub fn config_yaml(listen: &str, settings: &str, backends: &[(String, SocketAddr)]) -> String {
    let mut yaml = format!("listen: \"{listen}\"\nadmin: off\n{settings}");
    if !yaml.ends_with('\n') {
        yaml.push('\n');
    }
    yaml.push_str("backends:\n");
    for (name, addr) in backends {
        yaml.push_str(&format!("  - name: {name}\n    addr: \"{addr}\"\n"));
    }
    yaml
}

/// [`config_yaml`] with the admin endpoint on `127.0.0.1:0`.
pub fn config_yaml_with_admin(
    listen: &str,
    settings: &str,
    backends: &[(String, SocketAddr)],
) -> String {
    config_yaml(listen, settings, backends).replace("admin: off", "admin: 127.0.0.1:0")
}

/// Header-mode settings keyed by `x-session-id`.
pub const SESSION_KEY: &str = "key:\n  from: header\n  header: x-session-id\n";
