//! The admin endpoint and the operator commands: metrics that parse and
//! match docs/metrics.md both ways, `/route`, `lookup` and the proxy
//! agreeing, `plan`.

use std::process::Command;

use magpie_proxy::testing::metric_families as families;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_and_every_family_is_there_and_documented() {
    let backends = HttpBackends::start(&["a", "b"]).await;
    let magpie = Magpie::start(&config_yaml_with_admin(
        "127.0.0.1:0",
        SESSION_KEY,
        &backends.list,
    ))
    .await;
    let admin = magpie.admin.expect("admin is on");
    for i in 0..10 {
        http_get(magpie.addr, Some(&format!("s{i}"))).await;
    }
    let (status, text) = admin_get(admin, "/metrics").await;
    assert_eq!(status, 200);
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("text format parses");
    let reference =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md"))
            .expect("read docs/metrics.md");
    // The engine gauges exist only with a fresh scrape (health.load); the
    // engine load tests see them.
    let engine_gauges = [
        "magpie_backend_engine_waiting",
        "magpie_backend_engine_running",
        "magpie_backend_engine_kv_usage",
        "magpie_backend_engine_kv_capacity_tokens",
        "magpie_backend_engine_slots",
    ];
    for family in families() {
        let name = family.name;
        assert!(
            reference.contains(&format!("| `{name}")),
            "{name} has no row in docs/metrics.md"
        );
        // Only with a listener that terminates TLS: tests/integration/tls.rs
        // reads it.
        if engine_gauges.contains(&name)
            || name == "magpie_tls_certificate_expiry_timestamp_seconds"
        {
            continue;
        }
        assert!(
            scrape.docs.contains_key(name),
            "{name} has no HELP in:\n{text}"
        );
        assert!(
            scrape.samples.iter().any(|s| s.metric == name),
            "{name} has no sample"
        );
    }
    // And every row names a family magpie has.
    let known: Vec<&str> = families().iter().map(|f| f.name).collect();
    for line in reference.lines().filter(|l| l.starts_with("| `magpie_")) {
        let name = line[3..].split(['`', '{']).next().expect("a name");
        assert!(
            known.contains(&name),
            "docs/metrics.md has a row for {name}, which magpie does not export"
        );
    }
    let connections: f64 = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "magpie_backend_connections_total")
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
            ref other => panic!("unexpected value {other:?}"),
        })
        .sum();
    assert_eq!(connections, 10.0);
    // Every connect was timed; build and process families are there too.
    assert_eq!(
        metric_sum(&text, "magpie_backend_connect_seconds_count", &[]),
        10.0
    );
    assert_eq!(
        metric_sum(
            &text,
            "magpie_build_info",
            &[&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
    for process in [
        "process_open_fds",
        "process_max_fds",
        "process_resident_memory_bytes",
        "process_start_time_seconds",
    ] {
        assert!(
            metric_sum(&text, process, &[]) > 0.0,
            "{process} missing or zero"
        );
    }
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_answer_and_change_nothing() {
    let backends = HttpBackends::start(&["a", "b"]).await;
    let magpie = Magpie::start(&config_yaml_with_admin(
        "127.0.0.1:0",
        SESSION_KEY,
        &backends.list,
    ))
    .await;
    let admin = magpie.admin.expect("admin is on");
    assert_eq!(admin_get(admin, "/healthz").await.0, 200);
    assert_eq!(admin_get(admin, "/readyz").await.0, 200);
    let (status, table) = admin_get(admin, "/table").await;
    assert_eq!(status, 200);
    let table: serde_json::Value = serde_json::from_str(&table).expect("/table is JSON");
    assert_eq!(table["version"], 1);
    assert_eq!(table["algorithm"], "maglev");
    assert_eq!(table["fingerprint"], magpie.probe.fingerprint());
    assert_eq!(table["backends"][0]["name"], "a");
    let shares: f64 = table["backends"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|b| b["share"].as_f64().expect("a number"))
        .sum();
    assert!((shares - 1.0).abs() < 1e-9);
    assert_eq!(
        admin_request(
            admin,
            "POST /table HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .await
        .0,
        405
    );
    assert_eq!(admin_get(admin, "/nope").await.0, 404);
    assert_eq!(admin_get(admin, "/route").await.0, 400);
    for b in magpie.probe.backends() {
        b.set_up(false);
    }
    assert_eq!(admin_get(admin, "/readyz").await.0, 503);
    magpie.stop().await;
}

/// `/route`, `magpie lookup` and the proxy itself send each key to the same backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_lookup_and_proxy_agree() {
    let backends = HttpBackends::start(&["gpu-0", "gpu-1", "gpu-2", "gpu-3"]).await;
    let yaml = config_yaml_with_admin(
        "127.0.0.1:0",
        &format!("{SESSION_KEY}reload:\n  watch: false\n"),
        &backends.list,
    );
    let file = TempFile::new("magpie.yaml", &yaml);
    let magpie = Magpie::start_file(&file.path).await;
    let admin = magpie.admin.expect("admin is on");
    let keys: Vec<String> = (0..24).map(|i| format!("conversation-{i}")).collect();

    let mut args = vec![
        "lookup",
        "--config",
        file.path.to_str().expect("UTF-8 path"),
    ];
    args.extend(keys.iter().map(String::as_str));
    let out = Command::new(magpie_bin())
        .args(&args)
        .output()
        .expect("run magpie lookup");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let looked_up: Vec<String> = String::from_utf8(out.stdout)
        .expect("UTF-8")
        .lines()
        .map(|l| {
            l.split('\t')
                .nth(1)
                .expect("key, backend, addr")
                .to_string()
        })
        .collect();
    assert_eq!(looked_up.len(), keys.len());

    let mut seen = std::collections::HashSet::new();
    for (key, by_lookup) in keys.iter().zip(&looked_up) {
        let (status, route) = admin_get(admin, &format!("/route?key={key}")).await;
        assert_eq!(status, 200);
        let route: serde_json::Value = serde_json::from_str(&route).expect("/route is JSON");
        let by_route = route["chosen"].as_str().expect("a chosen backend");
        let by_proxy = backend_of(&http_get(magpie.addr, Some(key)).await);
        assert_eq!(by_route, by_lookup, "{key}");
        assert_eq!(by_proxy, *by_lookup, "{key}");
        assert_eq!(route["candidates"][0]["name"], by_route);
        seen.insert(by_proxy);
    }
    assert!(
        seen.len() >= 3,
        "24 keys should reach most of 4 backends: {seen:?}"
    );

    // `lookup -v` lists the candidates in the order /route gives them.
    let out = Command::new(magpie_bin())
        .args(["lookup", "-v", "--config", args[2], &keys[0]])
        .output()
        .expect("run magpie lookup -v");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    let listed: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().split_once(". "))
        .map(|(_, rest)| rest.split(' ').next().expect("a name"))
        .collect();
    let route: serde_json::Value =
        serde_json::from_str(&admin_get(admin, &format!("/route?key={}", keys[0])).await.1)
            .expect("/route is JSON");
    let routed: Vec<&str> = route["candidates"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|c| c["name"].as_str().expect("a name"))
        .collect();
    assert_eq!(listed, routed, "{text}");
    assert_eq!(listed.len(), 4);
    magpie.stop().await;
}

/// `magpie plan` reports about 1/(N+1) of the table moving when one backend
/// joins N, per slot and per listed key.
#[test]
fn plan_reports_one_in_n_plus_one() {
    let pool = |n: usize| {
        let mut yaml = String::from(
            "listen: 127.0.0.1:7000\nkey: {from: header, header: x-session-id}\nbackends:\n",
        );
        for i in 0..n {
            yaml.push_str(&format!(
                "  - {{name: gpu-{i}, addr: '127.0.0.1:{}'}}\n",
                9100 + i
            ));
        }
        yaml
    };
    let old = TempFile::new("old.yaml", &pool(10));
    let new = TempFile::new("new.yaml", &pool(11));
    let keys: String = (0..4000).map(|i| format!("session-{i}\n")).collect();
    let keys = TempFile::new("keys.txt", &keys);
    let out = Command::new(magpie_bin())
        .args([
            "plan",
            path(&old),
            path(&new),
            "--keys",
            path(&keys),
            "--json",
        ])
        .output()
        .expect("run magpie plan");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("plan --json is JSON");
    let moved = report["moved"].as_f64().expect("moved");
    let ideal = report["ideal"].as_f64().expect("ideal");
    let keys_moved = report["keys"]["share"].as_f64().expect("keys.share");
    let target = 1.0 / 11.0;
    assert!((ideal - target).abs() < 0.005, "ideal {ideal}");
    assert!(
        moved >= ideal - 1e-9 && moved < target + 0.02,
        "moved {moved}"
    );
    assert!(
        (keys_moved - moved).abs() < 0.02,
        "keys {keys_moved} vs slots {moved}"
    );
    assert_eq!(report["method"], "slots");

    let text = Command::new(magpie_bin())
        .args(["plan", path(&old), path(&new)])
        .output()
        .expect("run magpie plan");
    let text = String::from_utf8(text.stdout).expect("UTF-8");
    assert!(text.contains("of table slots change owner"), "{text}");
    assert!(text.contains("gpu-10"), "{text}");
}

fn path(f: &TempFile) -> &str {
    f.path.to_str().expect("UTF-8 temp path")
}
