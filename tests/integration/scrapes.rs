//! `/metrics` for large pools and many scrapers: gzip when the scraper asks,
//! pool totals above 256 backends (`metrics.per_backend: auto`), and one
//! rendering shared by the scrapes that arrive while it runs.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::engine_load::promtool_accepts;
use crate::support::*;

/// A pool of `n` backends on loopback ports nothing listens on (no health
/// checks, so nothing connects to them), with `settings` (YAML lines).
fn pool_yaml(n: usize, settings: &str) -> String {
    let backends: String = (0..n)
        .map(|i| format!("  - {{name: b{i}, addr: \"127.0.0.1:{}\"}}\n", 20_000 + i))
        .collect();
    format!("listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\n{settings}backends:\n{backends}")
}

/// An admin response: its status, head (lower-cased) and body bytes.
struct Answer {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|line| {
            let (n, v) = line.split_once(':')?;
            (n.trim() == name).then(|| v.trim())
        })
    }

    fn text(&self) -> String {
        String::from_utf8(self.body.clone()).expect("a plain body is UTF-8")
    }
}

/// `GET path` with `headers` (whole lines), read to the end.
async fn get(admin: SocketAddr, path: &str, headers: &str) -> Answer {
    within("an admin request", async {
        let mut stream = TcpStream::connect(admin).await.expect("connect to admin");
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: admin\r\n{headers}Connection: close\r\n\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .expect("send the request");
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.expect("read the answer");
        let end = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a response head");
        let head = String::from_utf8_lossy(&raw[..end]).to_lowercase();
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("a status");
        Answer {
            status,
            head,
            body: raw[end + 4..].to_vec(),
        }
    })
    .await
}

/// The text without the lines that change from one rendering to the next
/// (the process's own figures, and the renderings' count and time).
fn steady(text: &str) -> String {
    text.lines()
        .filter(|l| !l.contains("process_") && !l.contains("magpie_admin_metrics_render"))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_gzipped_when_asked_and_decode_to_the_plain_text() {
    let magpie = Magpie::start(&pool_yaml(3, "")).await;
    let admin = magpie.admin.expect("admin is on");

    let plain = get(admin, "/metrics", "").await;
    assert_eq!(plain.status, 200);
    assert_eq!(plain.header("content-encoding"), None, "{}", plain.head);
    assert_eq!(
        plain.header("vary"),
        Some("accept-encoding"),
        "{}",
        plain.head
    );
    let length: usize = plain
        .header("content-length")
        .expect("a length")
        .parse()
        .unwrap();
    assert_eq!(length, plain.body.len());
    let text = plain.text();
    assert!(text.contains("magpie_backend_up{backend=\"b0\""), "{text}");

    let gzipped = get(
        admin,
        "/metrics",
        "Accept-Encoding: deflate, gzip;q=0.8\r\n",
    )
    .await;
    assert_eq!(gzipped.status, 200);
    assert_eq!(
        gzipped.header("content-encoding"),
        Some("gzip"),
        "{}",
        gzipped.head
    );
    assert_eq!(gzipped.header("vary"), Some("accept-encoding"));
    assert!(
        gzipped.body.len() < plain.body.len() / 3,
        "{} bytes",
        gzipped.body.len()
    );
    let mut decoded = String::new();
    flate2::read::GzDecoder::new(&gzipped.body[..])
        .read_to_string(&mut decoded)
        .expect("the body is gzip");
    assert_eq!(steady(&decoded), steady(&text));
    assert!(!steady(&text).is_empty());

    // gzip refused (q=0), or not named: plain text.
    for refused in [
        "Accept-Encoding: gzip;q=0, identity\r\n",
        "Accept-Encoding: br\r\n",
    ] {
        let answer = get(admin, "/metrics", refused).await;
        assert_eq!(answer.header("content-encoding"), None, "{refused}");
        assert!(answer.text().starts_with("# HELP"), "{refused}");
    }
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_backend_auto_writes_series_up_to_256_backends_then_totals() {
    let magpie = Magpie::start(&pool_yaml(256, "")).await;
    let text = admin_get(magpie.admin.expect("admin is on"), "/metrics")
        .await
        .1;
    let weights = text
        .lines()
        .filter(|l| l.starts_with("magpie_backend_weight{backend=\""))
        .count();
    assert_eq!(weights, 256, "one series per backend at 256");
    assert!(text.contains("magpie_backend_up{backend=\"b255\",addr=\"127.0.0.1:20255\"} 1"));
    promtool_accepts(&text);
    magpie.stop().await;

    let magpie = Magpie::start(&pool_yaml(257, "")).await;
    let text = admin_get(magpie.admin.expect("admin is on"), "/metrics")
        .await
        .1;
    assert!(
        !text.contains("backend=\""),
        "no per-backend series above 256:\n{text}"
    );
    assert!(!text.contains("addr=\""), "{text}");
    for line in [
        "magpie_backend_weight 257",
        "magpie_backend_up 257",
        "magpie_table_backends 257",
        "magpie_backend_connections_total 0",
        "magpie_backend_connect_failures_total{reason=\"refused\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} not in:\n{text}");
    }
    assert!(
        text.len() < 100_000,
        "totals are small: {} bytes",
        text.len()
    );
    promtool_accepts(&text);
    magpie.stop().await;

    // `on` keeps them however large the pool.
    let magpie = Magpie::start(&pool_yaml(257, "metrics: {per_backend: on}\n")).await;
    let text = admin_get(magpie.admin.expect("admin is on"), "/metrics")
        .await
        .1;
    assert!(
        text.contains("magpie_backend_weight{backend=\"b256\""),
        "{text}"
    );
    magpie.stop().await;
}

/// The `magpie_admin_metrics_renders_total` a body was rendered as.
fn rendering_of(text: &str) -> u64 {
    let line = text
        .lines()
        .find(|l| l.starts_with("magpie_admin_metrics_renders_total "))
        .unwrap_or_else(|| panic!("no renders_total in {} bytes", text.len()));
    line.rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no count in {line:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrapes_that_arrive_during_a_rendering_share_it() {
    // Per-backend series for 600 backends: a rendering long enough for
    // twenty scrapes sent at once to arrive while it runs.
    let magpie = Magpie::start(&pool_yaml(600, "metrics: {per_backend: on}\n")).await;
    let admin = magpie.admin.expect("admin is on");
    let before = rendering_of(&get(admin, "/metrics", "").await.text());
    let scrapes: Vec<_> = (0..20)
        .map(|i| {
            let gzip = if i % 2 == 0 {
                "Accept-Encoding: gzip\r\n"
            } else {
                ""
            };
            tokio::spawn(async move { get(admin, "/metrics", gzip).await })
        })
        .collect();
    let mut served: BTreeMap<u64, usize> = BTreeMap::new();
    for scrape in scrapes {
        let answer = scrape.await.expect("a scrape task");
        assert_eq!(answer.status, 200);
        let text = match answer.header("content-encoding") {
            Some("gzip") => {
                let mut text = String::new();
                flate2::read::GzDecoder::new(&answer.body[..])
                    .read_to_string(&mut text)
                    .expect("gzip");
                text
            }
            _ => answer.text(),
        };
        *served.entry(rendering_of(&text)).or_default() += 1;
    }
    let after = rendering_of(&get(admin, "/metrics", "").await.text());
    // Every rendering between the two was served to someone, and twenty
    // scrapes took fewer renderings than scrapes.
    assert!(
        served.keys().all(|&r| before < r && r < after),
        "{served:?}"
    );
    assert_eq!(served.len() as u64, after - before - 1, "{served:?}");
    assert!(served.len() < 20, "each scrape rendered alone: {served:?}");
    assert!(served.values().any(|&n| n >= 2), "{served:?}");
    magpie.stop().await;
}
