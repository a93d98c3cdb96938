//! `mode: udp`: flows of datagrams keyed by the client's address or a QUIC
//! connection ID, each with its own socket to its backend; answers come
//! back from the address the client sent to; a bounded flow table, idle
//! timeouts, `udp.responses`, health, reload, metrics and access log; DNS
//! through `dig` and a QUIC-shaped client that changes its address.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::support::*;
use magpie_core::key::{quic, source_ip_key};

/// Waits until `check` holds, polling every 5 ms.
async fn until(what: &str, check: impl Fn() -> bool) {
    within(what, async {
        while !check() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_client_address_is_a_flow_on_the_backend_its_key_owns() {
    let backends = UdpBackends::start("127.0.0.1", &["a", "b", "c"]).await;
    let magpie = Magpie::with("mode: udp\n", &backends.pairs()).await;
    for last in 2..12 {
        let ip = format!("127.0.0.{last}");
        let client = client_on(&ip).await;
        let want = magpie.primary(source_ip_key(ip.parse().expect("an IP")));
        for turn in 0..3 {
            let (answer, from) =
                exchange(&client, magpie.addr, format!("q{turn}").as_bytes()).await;
            assert_eq!(answer, format!("{want}:q{turn}"), "{ip}");
            assert_eq!(
                from, magpie.addr,
                "answers come from the address the client sent to"
            );
        }
    }
    assert_eq!((created(&magpie), open(&magpie)), (10, 10));
    let sent = magpie.metric("magpie_backend_datagrams_sent_total", &[]);
    assert_eq!(sent, 30);
    // Each flow's datagrams reached its backend from one socket of its own.
    for b in &backends.list {
        let peers = b.peers.lock().expect("not poisoned").clone();
        let distinct: std::collections::BTreeSet<_> = peers.iter().collect();
        assert_eq!(distinct.len() * 3, peers.len(), "{}", b.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_clients_and_backends() {
    let backends = UdpBackends::start("[::1]", &["a", "b"]).await;
    let magpie = Magpie::start(&config_yaml("[::1]:0", "mode: udp\n", &backends.pairs())).await;
    let client = client_on("[::1]").await;
    let want = magpie.primary(source_ip_key("::1".parse().expect("an IP")));
    let (answer, from) = exchange(&client, magpie.addr, b"six").await;
    assert_eq!((answer, from), (format!("{want}:six"), magpie.addr));
}

/// A QUIC long header (version 1 Initial) to connection ID `id`.
fn long_header(id: &[u8]) -> Vec<u8> {
    [&[0xc3, 0, 0, 0, 1, id.len() as u8][..], id, b"initial"].concat()
}

/// A QUIC short header to connection ID `id`.
fn short_header(id: &[u8]) -> Vec<u8> {
    [&[0x41][..], id, b"1-rtt"].concat()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quic_connection_keeps_its_backend_when_the_client_moves() {
    let backends = UdpBackends::start("127.0.0.1", &["a", "b", "c"]).await;
    let settings = "mode: udp\nkey:\n  from: quic\n  quic_cid_length: 8\n";
    let magpie = Magpie::with(settings, &backends.pairs()).await;
    let first = *b"client-0";
    let want = magpie.primary(quic::cid_key(&first));
    // The server's ID hashes elsewhere: only the flow table keeps the
    // connection on its backend.
    let server = (0..100u8)
        .map(|n| [b's', b'e', b'r', b'v', b'e', b'r', b'-', n])
        .find(|id| magpie.primary(quic::cid_key(id)) != want)
        .expect("an ID owned by another backend");
    let before = client_on("127.0.0.1").await;
    let (answer, _) = exchange(&before, magpie.addr, &long_header(&first)).await;
    assert_eq!(answered_by(&answer), want);
    // The server's own ID, in a long header from the same address: one flow.
    let (answer, _) = exchange(&before, magpie.addr, &long_header(&server)).await;
    assert_eq!(answered_by(&answer), want);
    // The client moves (a new port and IP) and sends 1-RTT packets to the
    // server's ID: a new flow, on the same backend, and the answer reaches
    // the new address. The server sees the connection come from a new
    // address (a socket of the new flow's own), so it can validate the
    // new path itself.
    let after = client_on("127.0.0.9").await;
    for _ in 0..2 {
        let (answer, from) = exchange(&after, magpie.addr, &short_header(&server)).await;
        assert_eq!((answered_by(&answer), from), (want.as_str(), magpie.addr));
    }
    let backend = backends.get(&want);
    let peers = backend.peers.lock().expect("not poisoned").clone();
    assert_eq!(peers.len(), 4);
    assert_eq!(
        (peers[0], peers[2]),
        (peers[1], peers[3]),
        "a socket per flow"
    );
    assert_ne!(
        peers[0], peers[2],
        "the moved client's flow has its own socket"
    );
    assert_eq!(created(&magpie), 2);
    // The old address keeps its own flow.
    let (answer, _) = exchange(&before, magpie.addr, &short_header(&server)).await;
    assert_eq!(answered_by(&answer), want);
    assert_eq!(created(&magpie), 2);
    // A datagram that is not QUIC falls back to the client's address.
    let stranger = client_on("127.0.0.3").await;
    let (answer, _) = exchange(&stranger, magpie.addr, &[]).await;
    let by_address = magpie.primary(source_ip_key("127.0.0.3".parse().expect("an IP")));
    assert_eq!(answered_by(&answer), by_address);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flow_table_is_bounded_and_idle_flows_end() {
    let backends = UdpBackends::start("127.0.0.1", &["a"]).await;
    // Long enough that a loaded machine does not idle the flows out
    // before the third is refused.
    let settings = "mode: udp\nmax_connections: 2\nidle_timeout: 1s\n";
    let magpie = Magpie::with(settings, &backends.pairs()).await;
    let (one, two, three) = (
        client_on("127.0.0.1").await,
        client_on("127.0.0.1").await,
        client_on("127.0.0.1").await,
    );
    exchange(&one, magpie.addr, b"1").await;
    exchange(&two, magpie.addr, b"2").await;
    three.send_to(b"3", magpie.addr).await.expect("sent");
    until("the third flow dropped", || {
        dropped(&magpie, "table_full") == 1
    })
    .await;
    assert_eq!(open(&magpie), 2);
    // Both flows idle out, and their backend's slots come back.
    until("idle flows ended", || ended(&magpie, "idle_timeout") == 2).await;
    assert_eq!(open(&magpie), 0);
    assert_eq!(magpie.backend("a").active(), 0);
    let (answer, _) = exchange(&three, magpie.addr, b"3").await;
    assert_eq!(answer, "a:3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_ends_after_its_responses_and_its_line_is_logged() {
    let backends = UdpBackends::start("127.0.0.1", &["a"]).await;
    let (log, settings) = one_response_logged();
    let magpie = Magpie::with(&settings, &backends.pairs()).await;
    let client = client_on("127.0.0.1").await;
    exchange(&client, magpie.addr, b"query").await;
    until("the flow ended", || ended(&magpie, "responses") == 1).await;
    magpie.stop().await;
    let text = std::fs::read_to_string(&log.path).expect("the log");
    let line: serde_json::Value = serde_json::from_str(text.trim()).expect("one JSON line");
    assert_eq!(line["status"], "responses", "{line}");
    assert_eq!(line["backend"], "a");
    assert_eq!(line["bytes_in"], 5);
    assert_eq!(line["bytes_out"], 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_health_takes_down_ends_its_flows_at_their_next_datagram() {
    let backends = UdpBackends::start("127.0.0.1", &["a", "b"]).await;
    let settings = "mode: udp\nhealth:\n  interval: 300ms\n  timeout: 300ms\n  rise: 1\n  fall: 1\n  datagram:\n    send: \"70 69 6e 67\"\n    expect: \"70 6f 6e 67\"\n";
    let magpie = Magpie::with(settings, &backends.pairs()).await;
    let ip = "127.0.0.1";
    let home = magpie.primary(source_ip_key(ip.parse().expect("an IP")));
    let other = if home == "a" { "b" } else { "a" };
    let client = client_on(ip).await;
    let (answer, _) = exchange(&client, magpie.addr, b"x").await;
    assert_eq!(answered_by(&answer), home);
    backends.kill(&home).await;
    let down = magpie.backend(&home);
    until("the probe to mark it down", || !down.is_up()).await;
    let (answer, _) = exchange(&client, magpie.addr, b"y").await;
    assert_eq!(answered_by(&answer), other);
    assert_eq!(ended(&magpie, "backend_down"), 1);
    assert_eq!(created(&magpie), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_live_flows_on_their_backend() {
    let backends = UdpBackends::start("127.0.0.1", &["a", "b", "c", "d"]).await;
    let pairs = backends.pairs();
    let settings = "mode: udp\nreload:\n  watch: false\n";
    let file = TempFile::new(
        "magpie.yaml",
        &config_yaml("127.0.0.1:0", settings, &pairs[..1]),
    );
    let magpie = Magpie::start_file(&file.path).await;
    let mut clients = Vec::new();
    for last in 2..10 {
        let client = client_on(&format!("127.0.0.{last}")).await;
        let (answer, _) = exchange(&client, magpie.addr, b"before").await;
        assert_eq!(answered_by(&answer), "a");
        clients.push(client);
    }
    std::fs::write(&file.path, config_yaml("127.0.0.1:0", settings, &pairs)).expect("written");
    let mut reloader = magpie.probe.reloader(file.path.clone());
    within("the reload", reloader.reload(true))
        .await
        .expect("the reload applies");
    let mut moved_in_table = 0;
    for (i, client) in clients.iter().enumerate() {
        let ip: std::net::IpAddr = format!("127.0.0.{}", i + 2).parse().expect("an IP");
        moved_in_table += usize::from(magpie.primary(source_ip_key(ip)) != "a");
        let (answer, _) = exchange(client, magpie.addr, b"after").await;
        assert_eq!(answered_by(&answer), "a", "a live flow stays");
    }
    assert!(moved_in_table > 0, "the new table moves some of these keys");
}

/// `dig` from the Debian package bind9-dnsutils.
fn dig() -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("dig"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "dig is not on PATH: install the Debian package bind9-dnsutils (script/test does)"
            )
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_queries_from_dig_reach_the_server_their_address_owns() {
    let (one, two) = (DnsServer::start().await, DnsServer::start().await);
    one.set_addresses("www.example", &["192.0.2.1".parse().expect("an IP")]);
    two.set_addresses("www.example", &["192.0.2.2".parse().expect("an IP")]);
    let pairs = [("one".to_string(), one.addr), ("two".to_string(), two.addr)];
    let magpie = Magpie::with("mode: udp\nudp:\n  responses: 1\n", &pairs).await;
    let dig = dig();
    for last in 2..8 {
        let source = format!("127.0.0.{last}");
        let port = magpie.addr.port().to_string();
        let args = [
            "-p",
            &port,
            "-b",
            &source,
            "@127.0.0.1",
            "www.example",
            "A",
            "+short",
            "+tries=1",
            "+time=5",
        ];
        let out = tokio::task::spawn_blocking({
            let dig = dig.clone();
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            move || Command::new(dig).args(args).output()
        })
        .await
        .expect("joined")
        .expect("dig runs");
        let answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let want = match magpie
            .primary(source_ip_key(source.parse().expect("an IP")))
            .as_str()
        {
            "one" => "192.0.2.1",
            _ => "192.0.2.2",
        };
        assert_eq!(
            answer,
            want,
            "dig from {source}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    until("every flow ended at its answer", || {
        ended(&magpie, "responses") == 6
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_flows_and_datagrams() {
    let backends = UdpBackends::start("127.0.0.1", &["a"]).await;
    let yaml = config_yaml_with_admin("127.0.0.1:0", "mode: udp\n", &backends.pairs());
    let magpie = Magpie::start(&yaml).await;
    let client = client_on("127.0.0.1").await;
    exchange(&client, magpie.addr, b"m").await;
    let admin: SocketAddr = magpie.admin.expect("admin is on");
    let (status, text) = admin_get(admin, "/metrics").await;
    assert_eq!(status, 200);
    for line in [
        "magpie_udp_flows_open 1",
        "magpie_udp_flows_created_total 1",
        "magpie_backend_datagrams_sent_total{backend=\"a\"",
        "magpie_backend_datagrams_received_total{backend=\"a\"",
        "magpie_udp_datagrams_dropped_total{reason=\"table_full\"} 0",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_port_counts_towards_passive_health() {
    let backends = UdpBackends::start("127.0.0.1", &["a", "b"]).await;
    // Active checks rarely (a probe every hour): only the data path sees it.
    let settings = "mode: udp\nhealth:\n  interval: 1h\n  timeout: 1s\n  passive_failures: 2\n  datagram:\n    send: \"70 69 6e 67\"\n";
    let magpie = Magpie::with(settings, &backends.pairs()).await;
    let ip = "127.0.0.1";
    let home = magpie.primary(source_ip_key(ip.parse().expect("an IP")));
    let other = if home == "a" { "b" } else { "a" };
    let client = client_on(ip).await;
    exchange(&client, magpie.addr, b"up").await;
    backends.kill(&home).await;
    let down = magpie.backend(&home);
    // Each datagram to the closed port comes back as ICMP port unreachable.
    within("passive health to mark it down", async {
        while down.is_up() {
            client.send_to(b"lost", magpie.addr).await.expect("sent");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(dropped(&magpie, "backend_refused") >= 2);
    let (answer, _) = exchange(&client, magpie.addr, b"again").await;
    assert_eq!(answered_by(&answer), other);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_another_port_of_each_backend() {
    // Each backend on its own loopback address, with a TCP health port.
    let (a, b) = (
        UdpBackends::start("127.0.0.2", &["a"]).await,
        UdpBackends::start("127.0.0.3", &["b"]).await,
    );
    let health_a = std::net::TcpListener::bind("127.0.0.2:0").expect("a health port");
    let port = health_a.local_addr().expect("bound").port();
    let _health_b = std::net::TcpListener::bind(("127.0.0.3", port)).expect("the same port on b");
    let pairs = [a.pairs(), b.pairs()].concat();
    let settings = format!(
        "mode: udp\nhealth:\n  port: {port}\n  interval: 300ms\n  timeout: 300ms\n  rise: 1\n  fall: 1\n"
    );
    let magpie = Magpie::with(&settings, &pairs).await;
    let (up_a, up_b) = (magpie.backend("a"), magpie.backend("b"));
    let checked = || {
        let ok = |b: &str| {
            magpie.backend_metric("magpie_backend_health_checks_total", b, &["result=\"ok\""])
        };
        ok("a") > 0 && ok("b") > 0
    };
    until("both health ports answered", checked).await;
    assert!(up_a.is_up() && up_b.is_up());
    drop(health_a);
    until("a's closed health port marks it down", || !up_a.is_up()).await;
    assert!(up_b.is_up());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_to_two_listen_addresses_is_two_flows_each_answered_from_its_own() {
    let backends = UdpBackends::start("127.0.0.1", &["a"]).await;
    let yaml = config_yaml("127.0.0.1:0", "mode: udp\n", &backends.pairs()).replace(
        "listen: \"127.0.0.1:0\"",
        "listen: [\"127.0.0.1:0\", \"127.0.0.2:0\"]",
    );
    let magpie = Magpie::start(&yaml).await;
    let listening = magpie.listening();
    let client = client_on("127.0.0.1").await;
    for turn in 0..2 {
        for &to in &listening {
            let (answer, from) = exchange(&client, to, format!("t{turn}").as_bytes()).await;
            assert_eq!(
                (answer, from),
                (format!("a:t{turn}"), to),
                "answered from {to}"
            );
        }
    }
    assert_eq!(created(&magpie), 2);
}

/// Flows created so far.
fn created(magpie: &Magpie) -> u64 {
    magpie.metric("magpie_udp_flows_created_total", &[])
}

/// Flows open now.
fn open(magpie: &Magpie) -> u64 {
    magpie.metric("magpie_udp_flows_open", &[])
}

/// Flows that ended for `reason`.
fn ended(magpie: &Magpie, reason: &str) -> u64 {
    let reason = format!("reason=\"{reason}\"");
    magpie.metric("magpie_udp_flows_ended_total", &[&reason])
}

/// Settings of flows that end after one answer, logged as JSON to the
/// returned file.
fn one_response_logged() -> (TempFile, String) {
    let log = TempFile::new("access.log", "");
    let settings = format!(
        "mode: udp\nudp:\n  responses: 1\naccess_log:\n  path: {}\n  format: json\n",
        log.path.display()
    );
    (log, settings)
}

/// Datagrams dropped for `reason`.
fn dropped(magpie: &Magpie, reason: &str) -> u64 {
    let reason = format!("reason=\"{reason}\"");
    magpie.metric("magpie_udp_datagrams_dropped_total", &[&reason])
}

/// `udp.responses` is exact: a backend that answers twice back to back has
/// one answer relayed per flow, the other counted as dropped (when it came
/// before the flow's socket closed), on every one of 20 flows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_are_exact_whatever_comes_back_to_back() {
    let backends = UdpBackends::start("127.0.0.1", &["a"]).await;
    let (log, settings) = one_response_logged();
    let magpie = Magpie::with(&settings, &backends.pairs()).await;
    for n in 0..20u8 {
        let client = client_on(&format!("127.0.0.{}", n + 2)).await;
        let (answer, _) = exchange(&client, magpie.addr, b"twice").await;
        assert_eq!(answer, "a:twice");
    }
    until("every flow ended", || ended(&magpie, "responses") == 20).await;
    magpie.probe.flush_access_log().await;
    let text = std::fs::read_to_string(&log.path).expect("the log");
    let lines: Vec<serde_json::Value> = (text.lines())
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 20);
    for line in &lines {
        assert_eq!(line["bytes_out"], "a:twice".len(), "{line}");
    }
    assert!(dropped(&magpie, "after_responses") <= 20);
    magpie.stop().await;
}

/// Answers dropped in magpie's own flow socket (its receive buffer full
/// during a burst) are counted: as many as the kernel says that socket
/// dropped (`/proc/net/udp`), once the burst's last datagram is relayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_dropped_in_a_flows_receive_buffer_are_counted() {
    let backends = UdpBackends::start("127.0.0.1", &["a"]).await;
    let magpie = Magpie::with("mode: udp\n", &backends.pairs()).await;
    let client = client_on("127.0.0.1").await;
    client
        .send_to(b"burst 20000", magpie.addr)
        .await
        .expect("sent");
    // The burst, then its end, which carries the socket's drop count.
    let mut buf = vec![0u8; 65_536];
    within("the burst's end", async {
        loop {
            let (n, _) = client.recv_from(&mut buf).await.expect("received");
            if &buf[..n] == b"a:end" {
                return;
            }
        }
    })
    .await;
    let kernel = socket_drops(backends.get("a").addr);
    assert_eq!(dropped(&magpie, "receive_buffer"), kernel);
    magpie.stop().await;
}

/// The datagrams the kernel dropped in the (IPv4, loopback) socket
/// connected to `peer`: magpie's flow socket towards that backend.
fn socket_drops(peer: SocketAddr) -> u64 {
    let remote = format!("0100007F:{:04X}", peer.port());
    let table = std::fs::read_to_string("/proc/net/udp").expect("/proc/net/udp");
    let line = (table.lines())
        .find(|l| l.split_whitespace().nth(2) == Some(remote.as_str()))
        .unwrap_or_else(|| panic!("no socket connected to {peer} in:\n{table}"));
    let drops = line.split_whitespace().last().expect("a drops column");
    drops.parse().expect("a count")
}
