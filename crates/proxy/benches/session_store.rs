//! What a shared session store costs a request: the routing decision of
//! `mode: http` with `sessions.store: local` against `store: redis` (a real
//! `redis-server` on loopback, started here), for keys seen before (a local
//! cache hit) and new keys (a miss: one store round trip with `redis`).
//! Prints p50 and p99 per case and each redis case's ratio to local.
//!
//! `cargo bench --bench session_store`; under `cargo test` it runs a few
//! hundred decisions per case as a smoke test. Without `redis-server` on
//! the PATH it says so and measures `local` only.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use magpie_proxy::config::Config;
use magpie_proxy::testing::Probe;

fn config(store: &str) -> Config {
    let text = format!(
        "mode: http\nlisten: 127.0.0.1:7000\nkey: {{from: header, header: x-session-id}}\nsessions:\n  ttl: 10m\n  max: 1000000\n{store}backends:\n  - {{name: a, addr: 127.0.0.1:8001}}\n  - {{name: b, addr: 127.0.0.1:8002}}\n  - {{name: c, addr: 127.0.0.1:8003}}\n  - {{name: d, addr: 127.0.0.1:8004}}\n"
    );
    Config::parse(Path::new("bench.yaml"), &text).expect("the bench config parses")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

/// Routes `n` keys from `first` on, twice: new (misses), then again (hits):
/// the routing decision's plan and its commit, as a request that got there.
async fn measure(magpie: &Probe, first: u64, n: u64) -> [Vec<Duration>; 2] {
    let mut out = [Vec::new(), Vec::new()];
    for round in out.iter_mut() {
        for key in first..first + n {
            let started = Instant::now();
            magpie.decide(key).await.expect("a target");
            round.push(started.elapsed());
        }
        round.sort();
    }
    out
}

type Row = (&'static str, &'static str, Vec<Duration>);

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let n = if full { 20_000 } else { 200 };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let local = Probe::of(config("")).expect("a table");
        let [local_miss, local_hit] = measure(&local, 0, n).await;
        let mut rows: Vec<Row> = vec![("local", "miss", local_miss), ("local", "hit", local_hit)];
        rows.extend(with_redis(n).await);
        print_rows(&rows, n);
    });
}

/// The redis rows, against a redis-server started on a free port (none
/// when it cannot start).
async fn with_redis(n: u64) -> Vec<Row> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let redis = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let mut redis = match redis {
        Err(e) => {
            println!("redis-server not available ({e}): measuring store: local only");
            return Vec::new();
        }
        Ok(redis) => redis,
    };
    let redis_config = config(&format!(
        "  store: redis\n  redis: {{addr: \"127.0.0.1:{port}\", timeout: 1s}}\n"
    ));
    let magpie = Probe::of(redis_config).expect("a table");
    let waited = Instant::now();
    while !magpie.store_connected() && waited.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        magpie.store_connected(),
        "redis-server did not accept a connection"
    );
    let [miss, hit] = measure(&magpie, 1 << 40, n).await;
    let fallbacks = metric(&magpie.metrics(), "magpie_session_store_fallbacks_total");
    assert_eq!(fallbacks, 0.0, "the store timed out during the bench");
    let _ = redis.kill();
    let _ = redis.wait();
    vec![("redis", "miss", miss), ("redis", "hit", hit)]
}

/// The value of the series `name` (without labels) in a `/metrics` text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .find_map(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no series {name}"))
}

/// Each row's percentiles, and their ratio to the local store's.
fn print_rows(rows: &[Row], n: u64) {
    let base = |keys: &str| {
        let local = rows
            .iter()
            .find(|(store, k, _)| *store == "local" && *k == keys);
        local.map(|(_, _, sorted)| sorted).expect("the local rows")
    };
    println!("routing decisions per case: {n}");
    println!(
        "{:<6} {:<5} {:>10} {:>10} {:>12} {:>12}",
        "store", "keys", "p50", "p99", "p50 / local", "p99 / local"
    );
    for (store, keys, sorted) in rows {
        let (p50, p99) = (percentile(sorted, 0.5), percentile(sorted, 0.99));
        println!(
            "{store:<6} {keys:<5} {:>10.1?} {:>10.1?} {:>12.1} {:>12.1}",
            p50,
            p99,
            p50.as_secs_f64() / percentile(base(keys), 0.5).as_secs_f64(),
            p99.as_secs_f64() / percentile(base(keys), 0.99).as_secs_f64(),
        );
    }
}
