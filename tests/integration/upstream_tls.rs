//! Mode http to TLS backends (`backends[].tls`, `upstream_tls`): requests
//! over pooled TLS connections, certificates checked against a test CA,
//! handshake failures counted as connect failures, health checks over TLS.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::support::*;
use magpie_core::key::text_key;

/// A mode http config in front of `backends` (each `tls: true`), trusting
/// the CA in `ca`.
fn tls_config(ca: &TempFile, settings: &str, backends: &[&Arc<TlsHttpBackend>]) -> String {
    let mut yaml = format!(
        "mode: http\nlisten: 127.0.0.1:0\nadmin: off\nkey: {{from: header, header: x-session-id}}\nupstream_tls:\n  ca: {}\n{settings}backends:\n",
        ca.path.display()
    );
    for b in backends {
        yaml.push_str(&format!(
            "  - {{name: {}, addr: \"{}\", tls: true}}\n",
            b.name, b.addr
        ));
    }
    yaml
}

fn get_session(session: &str) -> hyper::Request<http_body_util::Full<bytes::Bytes>> {
    get("/v1/models")
        .header("x-session-id", session)
        .body(Default::default())
        .expect("a request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_reach_a_tls_backend_over_one_pooled_connection() {
    let ca = BackendCa::new("upstream CA");
    let ca_file = TempFile::new("ca.pem", &ca.pem());
    let a = TlsHttpBackend::start("a", ca.server_config(&["127.0.0.1"], &[b"http/1.1"])).await;
    let magpie = Magpie::start(&tls_config(&ca_file, "", &[&a])).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    for i in 0..5 {
        let (response, body) = client.send(get_session(&format!("s{i}"))).await;
        assert_eq!(response.status(), 200);
        assert_eq!(backend_in(&body), "a");
    }
    // One TCP connection and one handshake carried all five.
    assert_eq!(a.accepted.load(Ordering::SeqCst), 1);
    assert_eq!(a.handshakes.load(Ordering::SeqCst), 1);
    let failures = magpie.backend_metric("magpie_backend_connect_failures_total", "a", &[]);
    assert_eq!(failures, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_another_ca_is_a_connect_failure_of_its_own_kind() {
    let ca = BackendCa::new("upstream CA");
    let ca_file = TempFile::new("ca.pem", &ca.pem());
    let good = TlsHttpBackend::start("good", ca.server_config(&["127.0.0.1"], &[])).await;
    let stranger = BackendCa::new("another CA");
    let bad = TlsHttpBackend::start("bad", stranger.server_config(&["127.0.0.1"], &[])).await;
    let magpie = Magpie::start(&tls_config(&ca_file, "", &[&good, &bad])).await;
    let session = (0..200)
        .map(|i| format!("s{i}"))
        .find(|s| magpie.primary(text_key(s.as_bytes())) == "bad")
        .expect("a session whose primary is bad");
    let mut client = KeepAlive::connect(magpie.addr).await;
    let (response, body) = client.send(get_session(&session)).await;
    assert_eq!(response.status(), 200);
    assert_eq!(backend_in(&body), "good", "the next candidate answers");
    assert!(bad.accepted.load(Ordering::SeqCst) >= 1, "bad was tried");
    assert_eq!(bad.handshakes.load(Ordering::SeqCst), 0);
    assert_eq!(connect_failures(&magpie, "bad", "tls"), 1);
    assert_eq!(connect_failures(&magpie, "bad", "error"), 0);

    // With no other candidate, the client gets 502 as for a failed connect.
    let alone = Magpie::start(&tls_config(&ca_file, "", &[&bad])).await;
    let mut client = KeepAlive::connect(alone.addr).await;
    let (response, _) = client.send(get_session("s1")).await;
    assert_eq!(response.status(), 502);
    assert_eq!(connect_failures(&alone, "bad", "tls"), 1);
}

async fn until_up_is(magpie: &Magpie, name: &str, up: bool) {
    let started = Instant::now();
    let backend = magpie.backend(name);
    while backend.is_up() != up {
        assert!(
            started.elapsed() <= Duration::from_secs(5),
            "{name} not {} within 5s",
            if up { "up" } else { "down" }
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_go_over_tls() {
    let ca = BackendCa::new("upstream CA");
    let ca_file = TempFile::new("ca.pem", &ca.pem());
    let good = TlsHttpBackend::start("good", ca.server_config(&["127.0.0.1"], &[])).await;
    let stranger = BackendCa::new("another CA");
    let bad = TlsHttpBackend::start("bad", stranger.server_config(&["127.0.0.1"], &[])).await;
    let health =
        "health: {interval: 100ms, timeout: 100ms, http_path: /health, rise: 1, fall: 1}\n";
    let magpie = Magpie::start(&tls_config(&ca_file, health, &[&good, &bad])).await;
    until_up_is(&magpie, "bad", false).await;
    // good answered its checks over TLS: handshakes done, still up.
    let started = Instant::now();
    while good.handshakes.load(Ordering::SeqCst) < 2 {
        assert!(started.elapsed() < Duration::from_secs(5), "no TLS checks");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(magpie.backend("good").is_up());
    good.health.store(503, Ordering::SeqCst);
    until_up_is(&magpie, "good", false).await;
    good.health.store(200, Ordering::SeqCst);
    until_up_is(&magpie, "good", true).await;
}

/// `backend`'s failed connects for `reason`.
fn connect_failures(magpie: &Magpie, backend: &str, reason: &str) -> u64 {
    let reason = format!("reason=\"{reason}\"");
    magpie.backend_metric("magpie_backend_connect_failures_total", backend, &[&reason])
}
