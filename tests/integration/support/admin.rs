//! The admin endpoint: raw requests and their status and body.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::within;

/// One request to the admin endpoint: (status, body).
pub async fn admin_request(admin: SocketAddr, raw: &str) -> (u16, String) {
    within("an admin request", async {
        let mut stream = TcpStream::connect(admin)
            .await
            .unwrap_or_else(|e| panic!("connect to admin {admin}: {e}"));
        stream
            .write_all(raw.as_bytes())
            .await
            .expect("send the admin request");
        let mut response = Vec::new();
        stream
            .read_to_end(&mut response)
            .await
            .expect("read the admin response");
        let text = String::from_utf8(response).expect("UTF-8 admin response");
        let (head, body) = text
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status in {head:?}"));
        (status, body.to_string())
    })
    .await
}

/// `GET path` on the admin endpoint: (status, body).
pub async fn admin_get(admin: SocketAddr, path: &str) -> (u16, String) {
    admin_request(
        admin,
        &format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n"),
    )
    .await
}

/// The address in an `admin=Some(..)` field of magpie's start log line.
pub fn admin_addr_in(line: &str) -> SocketAddr {
    let start = line
        .find("admin=Some(")
        .unwrap_or_else(|| panic!("no admin=Some(..) in {line:?}"))
        + "admin=Some(".len();
    let rest = &line[start..];
    let end = rest
        .find(')')
        .unwrap_or_else(|| panic!("unterminated admin field in {line:?}"));
    rest[..end]
        .parse()
        .unwrap_or_else(|e| panic!("bad admin address in {line:?}: {e}"))
}

/// The sum of every sample of metric `name` in a Prometheus text exposition
/// whose labels contain each of `labels` (`key="value"` strings).
pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = match series.split_once('{') {
                Some((m, rest)) => (m, rest),
                None => (series, ""),
            };
            (metric == name && labels.iter().all(|l| rest.contains(l)))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// Polls the admin `/metrics` until `done` holds; returns that text.
pub async fn until_metrics(admin: SocketAddr, what: &str, done: impl Fn(&str) -> bool) -> String {
    within(what, async {
        loop {
            let (_, text) = admin_get(admin, "/metrics").await;
            if done(&text) {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}
