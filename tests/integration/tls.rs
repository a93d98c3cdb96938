//! TLS termination on mode http listeners, through real sockets: HTTP/1.1
//! and HTTP/2 (by ALPN) to plain backends, keys still routed per request;
//! certificates chosen by SNI; a certificate renewed on disk while a
//! connection is open; expired certificates refused; a client that never
//! sends a ClientHello; handshakes counted by how they ended.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Version};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use magpie_proxy::config::Config;

use crate::support::*;

/// A config file in a fresh directory, with `listener` as the one `listen`
/// entry, mode http keyed by `x-session-id`, the admin endpoint on.
fn write_config(
    dir: &Path,
    listener: &str,
    extra: &str,
    backends: &[(String, std::net::SocketAddr)],
) -> PathBuf {
    let mut yaml = format!(
        "mode: http\nlisten:\n  - {listener}\nadmin: 127.0.0.1:0\n{SESSION_KEY}{extra}backends:\n"
    );
    for (name, addr) in backends {
        yaml.push_str(&format!("  - {{name: {name}, addr: \"{addr}\"}}\n"));
    }
    let path = dir.join("magpie.yaml");
    replace(&path, &yaml);
    path
}

/// A scratch directory (the one a [`TempFile`] lives in).
fn scratch() -> TempFile {
    TempFile::new("placeholder", "")
}

fn dir_of(file: &TempFile) -> &Path {
    file.path.parent().expect("a temp file has a directory")
}

/// magpie with one TLS listener that presents `a.test` from its own CA, in
/// front of the backend `a`; `extra` is more of the config.
struct Site {
    magpie: Magpie,
    ca: TestCa,
    _dir: TempFile,
    _backends: HyperBackends,
}

impl Site {
    async fn start(extra: &str) -> Site {
        let backends = HyperBackends::start(&["a"]).await;
        let ca = TestCa::new();
        let dir = scratch();
        ca.issue(&["a.test"]).write(dir_of(&dir), "site");
        let path = write_config(
            dir_of(&dir),
            "{addr: 127.0.0.1:0, tls: {cert: site.pem, key: site.key}}",
            extra,
            &backends.pairs(),
        );
        Site {
            magpie: Magpie::start_file(&path).await,
            ca,
            _dir: dir,
            _backends: backends,
        }
    }
}

/// `GET /` with `x-session-id: session`, over HTTP/1.1; the backend's name.
async fn get_h1(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    session: &str,
) -> String {
    let request = get("/")
        .header("x-session-id", session)
        .body(Full::default())
        .expect("a request");
    within("a response over TLS", async {
        sender.ready().await.expect("ready");
        let response = sender.send_request(request).await.expect("a response");
        answering_backend(response, Version::HTTP_11).await
    })
    .await
}

/// The backend that answered `response`, a `200` over `version`.
async fn answering_backend(
    response: hyper::Response<hyper::body::Incoming>,
    version: Version,
) -> String {
    assert_eq!(response.status(), 200);
    assert_eq!(response.version(), version);
    let body = response.into_body().collect().await.expect("a body");
    backend_in(&body.to_bytes())
}

/// The same over HTTP/2.
async fn get_h2(
    sender: &mut hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    session: &str,
) -> String {
    let request = Request::get("https://a.test/")
        .header("x-session-id", session)
        .body(Full::default())
        .expect("a request");
    within("a response over TLS", async {
        sender.ready().await.expect("ready");
        let response = sender.send_request(request).await.expect("a response");
        answering_backend(response, Version::HTTP_2).await
    })
    .await
}

/// `magpie_tls_handshakes_total` for `result` (and `version`, if given).
async fn handshakes(magpie: &Magpie, result: &str, version: Option<&str>) -> f64 {
    let (_, text) = admin_get(magpie.admin.expect("admin is on"), "/metrics").await;
    let result = format!("result=\"{result}\"");
    let version = version.map(|v| format!("version=\"{v}\""));
    let mut labels = vec![result.as_str()];
    labels.extend(version.as_deref());
    metric_sum(&text, "magpie_tls_handshakes_total", &labels)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_and_http2_by_alpn_reach_plain_backends_and_keys_still_route() {
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let ca = TestCa::new();
    let dir = scratch();
    ca.issue(&["a.test"]).write(dir_of(&dir), "site");
    // Relative to the config file's directory.
    let path = write_config(
        dir_of(&dir),
        "{addr: 127.0.0.1:0, tls: {cert: site.pem, key: site.key}}",
        "",
        &backends.pairs(),
    );
    let magpie = Magpie::start_file(&path).await;

    let h1 = tls_connect(magpie.addr, &ca.connector(&["http/1.1"]), "a.test").await;
    assert_eq!(h1.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let mut h1 = h1_over(h1).await;
    let h2 = tls_connect(magpie.addr, &ca.connector(&["h2", "http/1.1"]), "a.test").await;
    assert_eq!(h2.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let mut h2 = h2_over(h2).await;
    // No ALPN at all: HTTP/1.1.
    let mut plain = h1_over(tls_connect(magpie.addr, &ca.connector(&[]), "a.test").await).await;
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..30 {
        let session = format!("user-{i}");
        let by_h1 = get_h1(&mut h1, &session).await;
        assert_eq!(
            get_h2(&mut h2, &session).await,
            by_h1,
            "{session} over HTTP/2"
        );
        assert_eq!(
            get_h1(&mut plain, &session).await,
            by_h1,
            "{session} without ALPN"
        );
        seen.insert(by_h1);
    }
    assert!(seen.len() > 1, "keys spread over the backends: {seen:?}");
    assert_eq!(handshakes(&magpie, "ok", Some("1.3")).await, 3.0);
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_certificate_follows_the_server_name_and_the_first_is_the_default() {
    let backends = HyperBackends::start(&["a"]).await;
    let ca = TestCa::new();
    let dir = scratch();
    let first = ca.issue(&["a.test", "127.0.0.1"]);
    let second = ca.issue(&["*.b.test"]);
    first.write(dir_of(&dir), "first");
    second.write(dir_of(&dir), "second");
    let path = write_config(
        dir_of(&dir),
        "{addr: 127.0.0.1:0, tls: {certificates: [{cert: first.pem, key: first.key}, {cert: second.pem, key: second.key}]}}",
        "",
        &backends.pairs(),
    );
    let magpie = Magpie::start_file(&path).await;
    let connector = ca.connector(&[]);
    let by_name = tls_connect(magpie.addr, &connector, "a.test").await;
    assert_eq!(presented(&by_name), first.der);
    let wildcard = tls_connect(magpie.addr, &connector, "x.b.test").await;
    assert_eq!(presented(&wildcard), second.der);
    // An IP address is not sent as SNI: the default.
    let no_sni = tls_connect(magpie.addr, &connector, "127.0.0.1").await;
    assert_eq!(presented(&no_sni), first.der);
    // A name no certificate is for gets the default, which the client
    // refuses (and tells magpie so).
    let refused = try_tls_connect(magpie.addr, &connector, "c.test").await;
    assert!(
        refused.is_err(),
        "a certificate for the wrong name was accepted"
    );
    within("the refusal to be counted", async {
        while handshakes(&magpie, "bad_certificate", None).await < 1.0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let mut h1 = h1_over(wildcard).await;
    assert_eq!(get_h1(&mut h1, "s").await, "a");
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_certificate_reaches_new_handshakes_while_open_connections_keep_theirs() {
    let backends = HyperBackends::start(&["a"]).await;
    let ca = TestCa::new();
    let dir = scratch();
    let old = ca.issue(&["a.test"]);
    let (cert, key) = old.write(dir_of(&dir), "site");
    let listener = format!(
        "{{addr: 127.0.0.1:0, tls: {{cert: {}, key: {}}}}}",
        cert.display(),
        key.display()
    );
    let path = write_config(
        dir_of(&dir),
        &listener,
        "reload: {watch: true}\n",
        &backends.pairs(),
    );
    let magpie = Magpie::start_file(&path).await;
    let connector = ca.connector(&[]);
    let open = tls_connect(magpie.addr, &connector, "a.test").await;
    assert_eq!(presented(&open), old.der);
    let mut open = h1_over(open).await;
    assert_eq!(get_h1(&mut open, "s").await, "a");

    let new = ca.issue(&["a.test"]);
    new.write(dir_of(&dir), "site");
    within("a new handshake to get the renewed certificate", async {
        loop {
            let fresh = tls_connect(magpie.addr, &connector, "a.test").await;
            if presented(&fresh) == new.der {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // The connection opened before goes on with its session.
    assert_eq!(get_h1(&mut open, "s").await, "a");

    // A broken file is refused: counted, and the renewed certificate stays.
    let failed_before = magpie.metric("magpie_reloads_total", &["result=\"error\""]);
    replace(
        &cert,
        "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n",
    );
    within("the broken certificate to be refused", async {
        while magpie.metric("magpie_reloads_total", &["result=\"error\""]) == failed_before {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let after = tls_connect(magpie.addr, &connector, "a.test").await;
    assert_eq!(presented(&after), new.der);
    assert_eq!(get_h1(&mut h1_over(after).await, "s").await, "a");
    magpie.stop().await;
}

#[test]
fn check_prints_names_and_expiry_and_refuses_expired_or_mismatched_files() {
    let ca = TestCa::new();
    let dir = scratch();
    let (cert, _) = ca
        .issue(&["a.test", "*.a.test"])
        .write(dir_of(&dir), "good");
    let backends = [(
        "a".to_string(),
        "127.0.0.1:8001".parse().expect("an address"),
    )];
    let path = write_config(
        dir_of(&dir),
        "{addr: 127.0.0.1:0, tls: {cert: good.pem, key: good.key}}",
        "",
        &backends,
    );
    let out = magpie_check(&path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = format!(
        "tls:         127.0.0.1:0: {} for a.test, *.a.test (expires 4096-01-01T00:00:00Z, the default)",
        cert.display()
    );
    assert!(stdout.contains(&line), "{stdout}");

    let (expired, _) = ca.issue_expired(&["a.test"]).write(dir_of(&dir), "old");
    write_config(
        dir_of(&dir),
        "{addr: 127.0.0.1:0, tls: {cert: old.pem, key: old.key}}",
        "",
        &backends,
    );
    let out = magpie_check(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let expected = format!(
        "magpie.yaml:3:37: tls: certificate file {}: expired at 2020-01-01T00:00:00Z",
        expired.display()
    );
    assert!(stderr.contains(&expected), "{stderr}");

    // good.pem with old.key.
    write_config(
        dir_of(&dir),
        "{addr: 127.0.0.1:0, tls: {cert: good.pem, key: old.key}}",
        "",
        &backends,
    );
    let problems = Config::load(&path)
        .expect_err("a key of another certificate")
        .to_string();
    let key = dir_of(&dir).join("old.key");
    assert!(
        problems.contains(&format!(
            "tls: key file {}: is not the key of the certificate in",
            key.display()
        )),
        "{problems}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_sends_no_client_hello_is_closed_at_first_byte_timeout() {
    let Site {
        magpie,
        _dir,
        _backends,
        ..
    } = Site::start("http:\n  first_byte_timeout: 200ms\n").await;
    let started = Instant::now();
    let mut silent = connect(magpie.addr).await;
    let got = read_until_closed(&mut silent)
        .await
        .expect("an orderly close");
    assert!(got.is_empty(), "{got:?}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(180) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    assert_eq!(handshakes(&magpie, "timeout", None).await, 1.0);
    magpie.stop().await;
}

/// The first byte's deadline runs from the accept, the handshake included:
/// a client that took most of it to shake hands and then says nothing is
/// closed when it ends, not a whole `first_byte_timeout` after the
/// handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_handshake_counts_against_first_byte_timeout() {
    let Site {
        magpie, ca, _dir, ..
    } = Site::start("http:\n  first_byte_timeout: 1s\n").await;
    let started = Instant::now();
    let tcp = connect(magpie.addr).await;
    // The client's own slowness, which is what is tested.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let name = rustls::pki_types::ServerName::try_from("a.test").expect("a name");
    let connector = ca.connector(&["http/1.1"]);
    let mut tls = within("the handshake", connector.connect(name, tcp))
        .await
        .expect("a handshake");
    let mut rest = Vec::new();
    let read = within("magpie to close", tls.read_to_end(&mut rest)).await;
    let waited = started.elapsed();
    assert!(rest.is_empty(), "{read:?} {rest:?}");
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_millis(1450),
        "closed {waited:?} after the connect"
    );
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_are_counted_by_result_and_version() {
    let Site {
        magpie,
        ca,
        _dir,
        _backends,
    } = Site::start("").await;
    // TLS 1.2 and 1.3.
    let tls12 = ca.connector_for(&[], &[&rustls::version::TLS12]);
    let old = tls_connect(magpie.addr, &tls12, "a.test").await;
    assert_eq!(get_h1(&mut h1_over(old).await, "s").await, "a");
    tls_connect(magpie.addr, &ca.connector(&[]), "a.test").await;
    // Cleartext HTTP to a TLS listener.
    let mut plain = connect(magpie.addr).await;
    plain
        .write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .expect("send");
    read_until_closed(&mut plain).await.ok();
    // A client that trusts another CA refuses the certificate.
    let stranger = TestCa::new().connector(&[]);
    assert!(
        try_tls_connect(magpie.addr, &stranger, "a.test")
            .await
            .is_err()
    );
    // A client that closes half-way through.
    let mut closes = connect(magpie.addr).await;
    closes
        .write_all(&[0x16, 0x03, 0x01, 0x00, 0x50, 0x01])
        .await
        .expect("send");
    drop(closes);
    within("every handshake to be counted", async {
        loop {
            let counted = [
                handshakes(&magpie, "ok", Some("1.2")).await,
                handshakes(&magpie, "ok", Some("1.3")).await,
                handshakes(&magpie, "protocol", None).await,
                handshakes(&magpie, "bad_certificate", None).await,
                handshakes(&magpie, "closed", None).await,
            ];
            if counted == [1.0; 5] {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let (_, text) = admin_get(magpie.admin.expect("admin is on"), "/metrics").await;
    let expiry = metric_sum(
        &text,
        "magpie_tls_certificate_expiry_timestamp_seconds",
        &["name=\"a.test\""],
    );
    // rcgen's default notAfter: 4096-01-01.
    assert_eq!(expiry, 67_090_118_400.0);
    magpie.stop().await;
}

/// config/edge-tls/magpie.yaml, with certificates put where it says.
#[test]
fn the_edge_example_loads_once_its_certificates_are_in_place() {
    let example = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/edge-tls/magpie.yaml"
    ));
    let text = std::fs::read_to_string(example).expect("the example");
    let dir = scratch();
    let path = dir_of(&dir).join("magpie.yaml");
    replace(&path, &text);
    let missing = Config::load(&path)
        .expect_err("no certificates yet")
        .to_string();
    assert!(
        missing.contains("certs/example.com.pem: cannot read"),
        "{missing}"
    );
    let ca = TestCa::new();
    let certs = dir_of(&dir).join("certs");
    std::fs::create_dir_all(&certs).expect("a certs directory");
    ca.issue(&["example.com", "www.example.com"])
        .write(&certs, "example.com");
    ca.issue(&["api.example.com"])
        .write(&certs, "api.example.com");
    let config = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert!(config.tls[0].is_none(), "the first listener is cleartext");
    let tls = config.tls[1].as_ref().expect("the second terminates TLS");
    let names: Vec<_> = tls.certificates.iter().map(|c| c.names.clone()).collect();
    assert_eq!(
        names,
        [
            vec!["example.com", "www.example.com"],
            vec!["api.example.com"]
        ]
    );
    assert_eq!(
        tls.choose(Some("api.example.com"))
            .map(|c| c.names[0].as_str()),
        Some("api.example.com")
    );
    assert_eq!(
        tls.choose(None).map(|c| c.names[0].as_str()),
        Some("example.com")
    );
    let out = magpie_check(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
