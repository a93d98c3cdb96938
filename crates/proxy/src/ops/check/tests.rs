//! What `check` prints and warns about, for configs written to show each part.

use super::*;
use std::path::Path;
use std::sync::Arc;

fn snapshot(text: &str) -> Snapshot {
    let config = Config::parse(Path::new("t.yaml"), text).unwrap();
    Snapshot::build(Arc::new(config), 1, &Default::default()).unwrap()
}

#[test]
fn the_report_shows_the_engine_load_settings() {
    let s = snapshot(
        "mode: http\nlisten: 127.0.0.1:7000\nhealth: {load: {preset: vllm, max_waiting: 4}}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
    );
    let text = report("t.yaml", &s, Environment::default()).unwrap();
    let needle = "load:        GET /metrics every 1s (timeout 500ms, preset vllm); full for new keys above 4 waiting (vllm:num_requests_waiting) or 0.95 KV cache usage (vllm:kv_cache_usage_perc); running: vllm:num_requests_running; KV cache size: vllm:cache_config_info; values ignored after 5s";
    assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    let s = snapshot(
        "mode: http\nlisten: 127.0.0.1:7000\nhealth: {load: {preset: vllm}}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
    );
    let text = report("t.yaml", &s, Environment::default()).unwrap();
    let needle = "full for new keys above 0.95 KV cache usage (vllm:kv_cache_usage_perc; waiting is no limit); running";
    assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    let s = snapshot("listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n");
    let text = report("t.yaml", &s, Environment::default()).unwrap();
    assert!(text.contains("load:        off"), "{text}");
}

#[test]
fn the_report_shows_the_access_log_and_warns_of_a_missing_directory() {
    let s = snapshot(
        "mode: http\nlisten: 127.0.0.1:7000\naccess_log: {path: /nonexistent-magpie-dir/a.log, format: text, fields: [time, status], sample: 0.5}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
    );
    let text = report("t.yaml", &s, Environment::default()).unwrap();
    for needle in [
        "access log:  text to /nonexistent-magpie-dir/a.log, one line per request (50% sampled), fields time status; keys hashed, queries stripped; at most 8192 lines queued",
        "warning: access_log.path /nonexistent-magpie-dir/a.log: the directory /nonexistent-magpie-dir does not exist here, so magpie run would not start",
    ] {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }
    let s = snapshot("listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n");
    let text = report("t.yaml", &s, Environment::default()).unwrap();
    assert!(text.contains("access log:  off"), "{text}");
}

#[test]
fn the_report_shows_what_decides_routing() {
    let s = snapshot(
        "mode: http\nlisten: 127.0.0.1:7000\nkey: {from: header, header: x-id, body_field: prompt_cache_key}\nproxy_protocol: {accept_from: [10.0.0.0/8]}\nhealth: {http_path: /health}\nplacement: {bounded_load: 1.25}\nsessions: {ttl: 10m}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
    );
    let text = report("t.yaml", &s, Environment::default()).unwrap();
    for needle in [
        "mode:        http",
        "key:         header x-id, then body field prompt_cache_key, else source_ip",
        "proxy in:    required from 10.0.0.0/8",
        "proxy out:   none",
        "health:      HTTP GET /health (200-299) every 2s",
        "bounded:     1.25 x fair share",
        "sessions:    pins for 10m, at most 100000, in this process",
        "limits:      request heads up to 65536 bytes; bodies read for keys hold up to 67108864 bytes in total; an HTTP/2 client resetting over 100 dispatched streams a second gets GOAWAY",
        "warning: proxy_protocol.accept_from has 10.0.0.0/8",
    ] {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }
    assert!(!text.contains("loopback"), "{text}");
    assert!(!text.contains("copy:"), "copy is mode tcp's: {text}");
    let needle = "deadlines:   backend head 5m after the request (else 504), body gaps 5m (else cut); client first byte 10s, body gaps 1m (else 408), keep-alive idle 1m; pool 32 idle per backend for 4s";
    assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    assert!(!text.contains("idle_timeout is not used"), "{text}");
    let s = snapshot(
        "listen: 127.0.0.1:7000\nproxy_protocol: {accept_from: [10.0.0.5/32], send: v2}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
    );
    let text = report("t.yaml", &s, Environment::default()).unwrap();
    assert!(text.contains("proxy out:   v2"), "{text}");
    assert!(!text.contains("deadlines:"), "mode http's: {text}");
    assert!(
        text.contains("copy:        buffered (through userspace buffers)"),
        "{text}"
    );
    let s = snapshot(
        "listen: 127.0.0.1:7000\ncopy: auto\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
    );
    let text = report("t.yaml", &s, Environment::default()).unwrap();
    assert!(
        text.contains(
            "copy:        auto (buffered, then splice(2) once a direction has moved 256 KiB"
        ),
        "{text}"
    );
    assert!(
        !text.contains("accept_from has"),
        "a single load balancer is not wide: {text}"
    );
}

#[test]
fn the_report_shows_what_metrics_write_for_the_pool() {
    let pool = |n: usize, setting: &str| {
        let backends: String = (0..n)
            .map(|i| format!("  - {{name: b{i}, addr: \"127.0.0.1:{}\"}}\n", 20_000 + i))
            .collect();
        snapshot(&format!(
            "listen: 127.0.0.1:7000\n{setting}health: {{}}\nbackends:\n{backends}"
        ))
    };
    let text = report("t.yaml", &pool(2, ""), Environment::default()).unwrap();
    let needle = "metrics:     per_backend auto (per backend up to 256 backends, then pool totals): per backend for 2 backends";
    assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    let text = report("t.yaml", &pool(257, ""), Environment::default()).unwrap();
    assert!(text.contains("pool totals for 257 backends"), "{text}");
    assert!(!text.contains("warning: metrics"), "{text}");
    let on = pool(300, "metrics: {per_backend: on}\n");
    let text = report("t.yaml", &on, Environment::default()).unwrap();
    assert!(
        text.contains("per_backend on (always per backend): per backend for 300 backends"),
        "{text}"
    );
    assert!(
        text.contains("warning: metrics.per_backend is on with 300 backends: every /metrics scrape renders about 3.3 MB"),
        "{text}"
    );
    let off = pool(1, "metrics: {per_backend: off}\n");
    let text = report("t.yaml", &off, Environment::default()).unwrap();
    assert!(text.contains("pool totals for 1 backend\n"), "{text}");
}

#[test]
fn loopback_in_a_container_and_no_health_are_warned_about() {
    let s = snapshot(
        "listen: 127.0.0.1:7000\nadmin: 127.0.0.1:9090\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
    );
    let w = warnings(
        &s,
        Environment {
            in_container: true,
            ..Environment::default()
        },
    );
    assert_eq!(
        w.iter().filter(|w| w.contains("loopback")).count(),
        2,
        "{w:?}"
    );
    assert!(w.iter().any(|w| w.contains("no health section")), "{w:?}");
    assert!(
        warnings(&s, Environment::default())
            .iter()
            .all(|w| !w.contains("loopback"))
    );
}

#[test]
fn idle_timeout_in_mode_http_is_warned_about() {
    let s = snapshot(
        "mode: http\nlisten: 127.0.0.1:7000\nidle_timeout: 10m\nhttp: {keepalive_timeout: 90s}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
    );
    let w = warnings(&s, Environment::default());
    assert!(
        w.iter().any(|w| w.starts_with(
            "idle_timeout is not used in mode http: a client connection idles for http.keepalive_timeout (1m 30s)"
        )),
        "{w:?}"
    );
    let s = snapshot(
        "listen: 127.0.0.1:7000\nidle_timeout: 10m\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
    );
    let w = warnings(&s, Environment::default());
    assert!(w.iter().all(|w| !w.contains("idle_timeout")), "{w:?}");
}

#[test]
fn tls_backends_are_marked_and_unchecked_certificates_warned_about() {
    let s = snapshot(
        "mode: http\nlisten: 127.0.0.1:7000\nupstream_tls: {verify: false}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001, tls: true}\n  - {name: b, addr: 127.0.0.1:8002}\n",
    );
    let text = report("t.yaml", &s, Environment::default()).unwrap();
    let a = text
        .lines()
        .find(|l| l.trim_start().starts_with("a "))
        .unwrap();
    let b = text
        .lines()
        .find(|l| l.trim_start().starts_with("b "))
        .unwrap();
    assert!(a.ends_with("  tls (certificate not checked)"), "{text}");
    assert!(!b.contains("tls"), "{text}");
    assert!(
        text.contains("warning: upstream_tls.verify is false"),
        "{text}"
    );
}

#[test]
fn the_report_shows_group_choices_and_warns_without_a_shared_store() {
    let text = |choices: &str, store: &str| {
        let s = snapshot(&format!(
            "mode: http\nlisten: 127.0.0.1:7000\nkey: {{from: header, header: x-s, group: system{choices}}}\nsessions: {{ttl: 10m{store}}}\nbackends:\n  - {{name: a, addr: 127.0.0.1:8001}}\n  - {{name: b, addr: 127.0.0.1:8002}}\n"
        ));
        report("t.yaml", &s, Environment::default()).unwrap()
    };
    let warning = "warning: key.group_choices 2 with sessions.store: local";
    let local = text(", group_choices: 2", "");
    assert!(
        local.contains("a new group's home is the least busy of its first 2 candidates"),
        "{local}"
    );
    assert!(local.contains(warning), "{local}");
    let redis = text(
        ", group_choices: 2",
        ", store: redis, redis: {addr: \"127.0.0.1:6379\"}",
    );
    assert!(!redis.contains("warning: key.group_choices"), "{redis}");
    let one = text("", "");
    assert!(
        one.contains("a group's home is its first candidate that takes it"),
        "{one}"
    );
    assert!(!one.contains("warning: key.group_choices"), "{one}");
}

#[test]
fn a_disaggregated_pool_shows_both_pools_and_their_roles() {
    let text = "mode: http\nlisten: 127.0.0.1:7000\nkey: {from: header, header: x-s}\ndisaggregation: {protocol: sglang, skip_below_tokens: 0}\nbackends:\n  - {name: p, addr: 127.0.0.1:8001, role: prefill, bootstrap_port: 8998}\n  - {name: d, addr: 127.0.0.1:8002, role: decode}\n  - {name: b, addr: 127.0.0.1:8003, bootstrap_port: 8999}\n";
    let config = Config::parse(std::path::Path::new("pd.yaml"), text).expect("it parses");
    let snapshot = Snapshot::of(std::sync::Arc::new(config)).expect("it builds");
    let out = report("pd.yaml", &snapshot, Environment::default()).expect("a report");
    assert!(
        out.contains("split:       prefill and decode pools, sglang protocol; every request split"),
        "{out}"
    );
    let decode = out
        .split("backends (decode pool: the table):")
        .nth(1)
        .expect("the decode pool");
    let (decode, prefill) = decode
        .split_once("prefill pool (")
        .expect("the prefill pool");
    assert!(
        decode.contains("  b ") && decode.contains("  d ") && !decode.contains("  p "),
        "{out}"
    );
    assert!(
        prefill.contains("  b ") && prefill.contains("  p ") && !prefill.contains("  d "),
        "{out}"
    );
    assert!(
        out.contains("role prefill") && out.contains("role decode"),
        "{out}"
    );
    assert!(out.contains("per backend for 3 backends"), "{out}");
}
