//! DNS discovery against a name server started by the test: backends follow
//! the records, unchanged ones keep their live state, and a failed, empty or
//! silent answer keeps the last good set.

use std::net::{IpAddr, SocketAddr};

use crate::support::*;

fn ip(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

/// Demo HTTP backends named b1, b2, ... on 127.0.0.1, .2, ... all on `port`.
async fn backends_on(port: u16, count: u8) -> Vec<HttpBackends> {
    let mut all = Vec::new();
    for last in 1..=count {
        let bind = SocketAddr::new(ip(last), port);
        all.push(HttpBackends::start_on(bind, &[&format!("b{last}")]).await);
    }
    all
}

fn config(dns: SocketAddr, entry: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\nadmin: off\nkey: {{from: source_addr}}\ndiscovery: {{interval: 100ms, resolver: \"{dns}\"}}\nbackends:\n  - {entry}\n"
    )
}

fn names(magpie: &Magpie) -> Vec<String> {
    (magpie.probe.backends().iter())
        .map(|b| b.name().to_string())
        .collect()
}

async fn next_version(magpie: &Magpie, what: &str) {
    let mut versions = magpie.probe.versions();
    within(what, versions.changed())
        .await
        .expect("magpie is running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_backends_follow_their_records_and_survive_bad_answers() {
    let port = free_port();
    let _backends = backends_on(port, 3).await;
    let dns = DnsServer::start().await;
    dns.set_addresses("pool.test", &[ip(2), ip(1)]);
    let magpie = Magpie::start(&config(dns.addr, &format!("{{dns: \"pool.test:{port}\"}}"))).await;
    assert_eq!(
        names(&magpie),
        [format!("127.0.0.1:{port}"), format!("127.0.0.2:{port}")]
    );
    for _ in 0..4 {
        let body = http_get(magpie.addr, None).await;
        assert!(body.contains("b1") || body.contains("b2"), "{body}");
    }
    let first = magpie.backend(&format!("127.0.0.1:{port}"));

    // A third address: published like a reload; the others keep their state.
    dns.set_addresses("pool.test", &[ip(1), ip(2), ip(3)]);
    next_version(&magpie, "the new address to be published").await;
    assert_eq!(names(&magpie).len(), 3);
    assert!(first.same_state(&magpie.backend(&format!("127.0.0.1:{port}"))));

    // The name disappears, then the server goes silent: the set stays.
    let version = magpie.probe.version();
    let failed = || magpie.metric("magpie_discovery_lookups_total", &["result=\"error\""]);
    let failed_before = failed();
    dns.set_addresses("pool.test", &[]);
    within("two failed lookups", async {
        while failed() < failed_before + 2 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    dns.set_addresses("pool.test", &[ip(1), ip(2), ip(3)]);
    dns.set_silent(true);
    let failed_before = failed();
    within("a timed-out lookup", async {
        while failed() == failed_before {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(
        magpie.probe.version(),
        version,
        "a bad answer changed the pool"
    );
    assert_eq!(names(&magpie).len(), 3);
    let body = http_get(magpie.addr, None).await;
    assert!(body.contains('b'), "{body}");

    // Answers again, with one address gone.
    dns.set_silent(false);
    dns.set_addresses("pool.test", &[ip(3)]);
    within("the shrunk set to be published", async {
        while names(&magpie).len() != 1 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(http_get(magpie.addr, None).await.contains("b3"));
    magpie.stop().await;
}

/// SRV records name the backends `target:port` and weight them; only the
/// lowest priority value is used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn srv_records_give_names_ports_and_weights() {
    let port = free_port();
    let _backends = backends_on(port, 3).await;
    let dns = DnsServer::start().await;
    dns.set_services(
        "_http._tcp.pool.test",
        &[
            (10, 2, port, "a.test"),
            (10, 1, port, "b.test"),
            (20, 5, port, "c.test"),
        ],
    );
    dns.set_addresses("a.test", &[ip(1)]);
    dns.set_addresses("b.test", &[ip(2)]);
    dns.set_addresses("c.test", &[ip(3)]);
    let magpie = Magpie::start(&config(dns.addr, "{srv: _http._tcp.pool.test}")).await;
    let got: Vec<(String, SocketAddr, u32)> = (magpie.probe.backends().iter())
        .map(|b| (b.name().to_string(), b.addr(), b.weight()))
        .collect();
    assert_eq!(
        got,
        [
            (format!("a.test:{port}"), SocketAddr::new(ip(1), port), 2),
            (format!("b.test:{port}"), SocketAddr::new(ip(2), port), 1),
        ]
    );
    magpie.stop().await;
}

/// With no answer at all, magpie does not start, and says which entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_first_answer_no_start() {
    let dns = DnsServer::start().await;
    let text = config(dns.addr, "{dns: \"missing.test:8000\"}");
    let parsed =
        magpie_proxy::config::Config::parse(std::path::Path::new("t.yaml"), &text).expect("valid");
    let started =
        magpie_proxy::app::start(parsed, tokio_util::sync::CancellationToken::new()).await;
    let error = started.err().expect("no backend, no start").to_string();
    assert!(error.contains("dns missing.test:8000"), "{error}");
    assert!(error.contains("no earlier answer"), "{error}");
}

/// `magpie check` resolves `dns` entries as `run` would, and shows them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_resolves_and_shows_discovery() {
    let dns = DnsServer::start().await;
    dns.set_addresses("pool.test", &[ip(7), ip(6)]);
    let file = TempFile::new(
        "magpie.yaml",
        &config(dns.addr, "{dns: \"pool.test:8000\"}"),
    );
    let out = tokio::process::Command::new(magpie_bin())
        .args(["check", "--config"])
        .arg(&file.path)
        .output()
        .await
        .expect("run check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("discovery:   dns pool.test:8000 every 100ms"),
        "{stdout}"
    );
    assert!(
        stdout.contains("127.0.0.6:8000") && stdout.contains("127.0.0.7:8000"),
        "{stdout}"
    );
}

/// A discovered address that is magpie's own listener is left out every
/// round, and said once a minute per entry, not at every lookup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_self_loop_warning_is_throttled_per_entry() {
    let port = free_port();
    let dns = DnsServer::start().await;
    dns.set_addresses("pool.test", &[ip(1), ip(2)]);
    let yaml = format!(
        "listen: 127.0.0.1:{port}\nadmin: 127.0.0.1:0\nkey: {{from: source_addr}}\ndiscovery: {{interval: 100ms, resolver: \"{}\"}}\nbackends:\n  - {{dns: \"pool.test:{port}\"}}\n",
        dns.addr
    );
    let file = TempFile::new("magpie.yaml", &yaml);
    let path = file.path.to_str().expect("a UTF-8 temp path");
    let mut child = Child::spawn(&["run", "--config", path]);
    let admin = child.admin_addr().await;
    // Ten discovery rounds, each of which finds the loop again.
    within("ten discovery rounds", async {
        loop {
            let (_, text) = admin_get(admin, "/metrics").await;
            let ok = metric_sum(&text, "magpie_discovery_lookups_total", &["result=\"ok\""]);
            if ok >= 10.0 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    let warned = child
        .lines_so_far()
        .iter()
        .filter(|l| l.contains("reaches magpie's own listener"))
        .count();
    assert_eq!(warned, 1, "{}", child.log.join("\n"));
}
