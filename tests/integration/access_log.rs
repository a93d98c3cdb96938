//! `access_log`: one line per request (mode http) or connection (mode tcp),
//! through real sockets, read back from the file magpie wrote.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use http_body_util::Full;
use serde_json::Value;

use crate::support::*;

/// Requests in the one-line-per-request test: the issue's 10,000.
const REQUESTS: usize = 10_000;
/// Keep-alive connections they are spread over.
const CLIENTS: usize = 8;

fn http_settings(log: &Path, extra: &str) -> String {
    format!(
        "mode: http\n{SESSION_KEY}access_log:\n  path: \"{}\"\n{extra}",
        log.display()
    )
}

/// Every line of the file at `path`, parsed as JSON.
fn json_lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn hex_key(session: &str) -> String {
    format!("{:016x}", magpie_core::key::text_key(session.as_bytes()))
}

/// `GET /r/{i}?user={session}` with `x-session-id: session`; the backend's name.
async fn get_numbered(client: &mut KeepAlive, i: usize, session: &str) -> String {
    let request = get(&format!("/r/{i}?user={session}")).header("x-session-id", session);
    client
        .served_by(request.body(Full::default()).expect("a request"))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_has_exactly_one_json_line_naming_its_backend() {
    let dir = TempFile::new("access.log", "");
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let magpie = Magpie::with(&http_settings(&dir.path, ""), &backends.pairs()).await;
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let addr = magpie.addr;
        tasks.push(tokio::spawn(async move {
            let mut client = KeepAlive::connect(addr).await;
            let mut served = Vec::new();
            for i in (c..REQUESTS).step_by(CLIENTS) {
                let session = format!("secret-user-{}", i % 97);
                served.push((i, get_numbered(&mut client, i, &session).await));
            }
            served
        }));
    }
    let mut expected = HashMap::new();
    for t in tasks {
        expected.extend(t.await.expect("a client task"));
    }
    within(
        "the access log to be flushed",
        magpie.probe.flush_access_log(),
    )
    .await;
    let lines = json_lines(&dir.path);
    assert_eq!(lines.len(), REQUESTS);
    let addrs: HashMap<String, String> = backends
        .pairs()
        .into_iter()
        .map(|(name, addr)| (name, addr.to_string()))
        .collect();
    let mut seen = HashMap::new();
    for line in &lines {
        let path = line["path"].as_str().expect("a path");
        let i: usize = path
            .strip_prefix("/r/")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("the query was not stripped: {line}"));
        assert!(seen.insert(i, ()).is_none(), "request {i} logged twice");
        assert_eq!(line["backend"], expected[&i].as_str(), "{line}");
        assert_eq!(
            line["key_hash"],
            hex_key(&format!("secret-user-{}", i % 97))
        );
        assert_eq!(line["status"], 200);
        assert_eq!(line["method"], "GET");
        assert_eq!(line["protocol"], "HTTP/1.1");
        assert_eq!(line["routed"], "primary");
        assert_eq!(line["listener"], magpie.addr.to_string());
        assert_eq!(line["backend_addr"], addrs[expected[&i].as_str()], "{line}");
        assert!(
            line["client"]
                .as_str()
                .is_some_and(|c| c.starts_with("127.0.0.1:"))
        );
        let time = line["time"].as_str().expect("a time");
        assert!(time.len() == 24 && time.ends_with('Z'), "{time}");
        assert!(line["bytes_out"].as_u64().is_some_and(|b| b > 0), "{line}");
        assert!(
            line["duration_ms"]
                .as_f64()
                .is_some_and(|d| d >= line["first_byte_ms"].as_f64().unwrap_or(f64::MAX)),
            "{line}"
        );
        assert!(line.get("key").is_none(), "log_keys is off: {line}");
    }
    let text = std::fs::read_to_string(&dir.path).expect("the log");
    assert!(
        !text.contains("secret-user"),
        "a raw key or query was written"
    );
    assert_eq!(
        magpie.metric("magpie_access_log_lines_total", &[]),
        REQUESTS as u64
    );
    assert_eq!(magpie.metric("magpie_access_log_dropped_total", &[]), 0);
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_keys_and_log_query_write_them_escaped() {
    let dir = TempFile::new("access.log", "");
    let backends = HyperBackends::start(&["a", "b"]).await;
    let extra = "  log_keys: true\n  log_query: true\n";
    let magpie = Magpie::with(&http_settings(&dir.path, extra), &backends.pairs()).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let key = r#"tenant "x" \ user"#;
    let request = get("/v1/models?q=%22a%22&b=1")
        .header("x-session-id", key)
        .body(Full::default())
        .expect("a request");
    assert_eq!(client.send(request).await.0.status(), 200);
    // Refused before any backend: magpie answers itself, and logs that too.
    let request = get("/twice")
        .header("host", "other")
        .body(Full::default())
        .expect("a request");
    let status = client.send(request).await.0.status();
    within(
        "the access log to be flushed",
        magpie.probe.flush_access_log(),
    )
    .await;
    let lines = json_lines(&dir.path);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["key"], key);
    assert_eq!(lines[0]["key_hash"], hex_key(key));
    assert_eq!(lines[0]["path"], "/v1/models?q=%22a%22&b=1");
    assert_eq!(lines[1]["status"], status.as_u16());
    assert_eq!(lines[1]["status"], 400);
    assert_eq!(lines[1]["path"], "/twice");
    assert!(lines[1].get("backend").is_none(), "{}", lines[1]);
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_select_and_order_a_text_line() {
    let dir = TempFile::new("access.log", "");
    let backends = HyperBackends::start(&["a"]).await;
    let extra = "  format: text\n  fields: [status, backend, method, path, cached_tokens]\n";
    let magpie = Magpie::with(&http_settings(&dir.path, extra), &backends.pairs()).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    get_numbered(&mut client, 7, "s").await;
    within(
        "the access log to be flushed",
        magpie.probe.flush_access_log(),
    )
    .await;
    let text = std::fs::read_to_string(&dir.path).expect("the log");
    assert_eq!(text, "200 a GET /r/7 -\n");
    magpie.stop().await;
}

#[test]
fn an_unknown_field_is_an_error_at_its_place() {
    let file = TempFile::new(
        "magpie.yaml",
        "listen: 127.0.0.1:7000\naccess_log:\n  path: stderr\n  fields: [time, latency]\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
    );
    let out = std::process::Command::new(magpie_bin())
        .args(["check", "--config"])
        .arg(&file.path)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run magpie check");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let place = format!("{}:4:18:", file.path.display());
    assert!(stderr.contains(&place), "{stderr}");
    assert!(stderr.contains("unknown field \"latency\""), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_connections_have_one_line_each() {
    let dir = TempFile::new("access.log", "");
    let backends = HttpBackends::start(&["a", "b", "c"]).await;
    let settings = format!(
        "{SESSION_KEY}access_log:\n  path: \"{}\"\n",
        dir.path.display()
    );
    let magpie = Magpie::with(&settings, &backends.list).await;
    let mut served = HashMap::new();
    for i in 0..50 {
        let session = format!("conn-{i}");
        let body = http_get(magpie.addr, Some(&session)).await;
        served.insert(hex_key(&session), backend_of(&body));
    }
    // The client saw the end; the connection's line follows its close.
    let lines = within("50 connection lines", async {
        loop {
            magpie.probe.flush_access_log().await;
            let lines = json_lines(&dir.path);
            if lines.len() >= 50 {
                return lines;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(lines.len(), 50);
    for line in &lines {
        let key = line["key_hash"].as_str().expect("a key hash");
        assert_eq!(line["backend"], served[key].as_str(), "{line}");
        assert_eq!(line["status"], "closed", "{line}");
        assert!(line["bytes_in"].as_u64().is_some_and(|b| b > 0), "{line}");
        assert!(line["bytes_out"].as_u64().is_some_and(|b| b > 0), "{line}");
        assert!(line.get("method").is_none() && line.get("path").is_none());
    }
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_drops_and_counts_instead_of_blocking() {
    let dir = TempFile::new("placeholder", "");
    let fifo = dir.path.with_file_name("access.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success());
    // Held open for reading and writing, and never read: once the pipe's
    // buffer is full, the writer's next write blocks.
    let mut stuck = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .expect("open the fifo");
    let backends = HyperBackends::start(&["a"]).await;
    let extra = "  queue: 1\n";
    let magpie = Magpie::with(&http_settings(&fifo, extra), &backends.pairs()).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let padding = "p".repeat(1000);
    let n = 2000;
    within("every request through a stuck log", async {
        for i in 0..n {
            get_numbered(&mut client, i, &padding).await;
        }
    })
    .await;
    let dropped = magpie.metric("magpie_access_log_dropped_total", &[]);
    assert!(dropped > 0, "nothing was dropped");
    // The pipe holds 64 KiB: at most some 60 lines of 1 KB went through.
    let lines = magpie.metric("magpie_access_log_lines_total", &[]);
    assert!(lines < n as u64 / 10, "{lines} written");
    // Unstick the writer so magpie can stop.
    std::thread::spawn(move || {
        let mut sink = [0u8; 1 << 16];
        while matches!(stuck.read(&mut sink), Ok(read) if read > 0) {}
    });
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopen_after_a_rename_writes_to_the_new_file() {
    let dir = TempFile::new("access.log", "");
    let rotated = dir.path.with_extension("log.1");
    let backends = HyperBackends::start(&["a"]).await;
    let magpie = Magpie::with(&http_settings(&dir.path, ""), &backends.pairs()).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    for i in 0..10 {
        get_numbered(&mut client, i, "s").await;
    }
    let log = &magpie.probe;
    within("the access log to be flushed", log.flush_access_log()).await;
    std::fs::rename(&dir.path, &rotated).expect("rotate");
    // What SIGUSR1 does.
    log.reopen_access_log();
    for i in 10..15 {
        get_numbered(&mut client, i, "s").await;
    }
    within("the access log to be flushed", log.flush_access_log()).await;
    assert_eq!(json_lines(&rotated).len(), 10);
    let fresh = json_lines(&dir.path);
    assert_eq!(fresh.len(), 5);
    assert_eq!(fresh[0]["path"], "/r/10");
    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr1_reopens_the_file_in_the_binary() {
    let log = TempFile::new("access.log", "");
    let rotated = log.path.with_extension("log.1");
    let backends = HyperBackends::start(&["a"]).await;
    let settings = http_settings(&log.path, "");
    let config = TempFile::new(
        "magpie.yaml",
        &config_yaml("127.0.0.1:0", &settings, &backends.pairs()),
    );
    let config_path = config.path.to_string_lossy().into_owned();
    let mut child = Child::spawn(&["run", "--config", &config_path]);
    let addr = child.listen_addr().await;
    let mut client = KeepAlive::connect(addr).await;
    for i in 0..3 {
        get_numbered(&mut client, i, "s").await;
    }
    // Another process's writes: the file is all there is to watch.
    within("three lines in the file", async {
        while json_lines(&log.path).len() < 3 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    std::fs::rename(&log.path, &rotated).expect("rotate");
    child.signal("-USR1");
    child.wait_for_line("access log reopened").await;
    for i in 3..5 {
        get_numbered(&mut client, i, "s").await;
    }
    drop(client);
    child.signal("-TERM");
    let status = within("magpie to exit", child.process.wait()).await;
    assert!(status.is_ok_and(|s| s.success()));
    // The exit waited for the last lines.
    assert_eq!(json_lines(&rotated).len(), 3);
    let fresh = json_lines(&log.path);
    assert_eq!(fresh.len(), 2, "{fresh:?}");
    assert_eq!(fresh[0]["path"], "/r/3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_the_path_writes_to_the_new_one() {
    let first = TempFile::new("first.log", "");
    let second = first.path.with_file_name("second.log");
    let backends = HyperBackends::start(&["a"]).await;
    let yaml = |log: &Path| config_yaml("127.0.0.1:0", &http_settings(log, ""), &backends.pairs());
    let file = TempFile::new("magpie.yaml", &yaml(&first.path));
    let magpie = Magpie::start_file(&file.path).await;
    let mut versions = magpie.probe.versions();
    let mut client = KeepAlive::connect(magpie.addr).await;
    get_numbered(&mut client, 0, "s").await;
    std::fs::write(&file.path, yaml(&second)).expect("write the new config");
    within("the reload", versions.changed())
        .await
        .expect("magpie is running");
    get_numbered(&mut client, 1, "s").await;
    within(
        "the access log to be flushed",
        magpie.probe.flush_access_log(),
    )
    .await;
    assert_eq!(json_lines(&first.path)[..].len(), 1);
    let moved = json_lines(&second);
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert_eq!(moved[0]["path"], "/r/1");
    magpie.stop().await;
}

/// A log that cannot be opened stops `magpie run` at start, naming the file,
/// as nginx does, instead of a counter of failed writes later.
#[tokio::test]
async fn a_log_that_cannot_be_opened_stops_the_start() {
    let dir = TempFile::new("magpie.yaml", "");
    let log = dir
        .path
        .with_extension("d")
        .join("missing")
        .join("access.log");
    let text = format!(
        "listen: 127.0.0.1:0\nadmin: off\naccess_log:\n  path: \"{}\"\nbackends:\n  - {{name: a, addr: 127.0.0.1:8001}}\n",
        log.display()
    );
    std::fs::write(&dir.path, text).expect("write config");
    let run = tokio::process::Command::new(magpie_bin())
        .args(["run", "--config"])
        .arg(&dir.path)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .output();
    let out = within("magpie to refuse to start", run)
        .await
        .expect("run magpie");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("cannot open the access log"), "{stderr}");
    assert!(stderr.contains(&log.display().to_string()), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_field_says_how_a_request_left_the_queue() {
    let dir = TempFile::new("access.log", "");
    let backends = HyperBackends::start(&["a"]).await;
    let extra = "  format: text\n  fields: [status, queue]\nqueue:\n  max_inflight: 1\n  size: 0\n";
    let magpie = Magpie::with(&http_settings(&dir.path, extra), &backends.pairs()).await;
    // One request holds the backend's one slot, admitted at once.
    let mut holder = KeepAlive::connect(magpie.addr).await;
    let mut held = holder
        .start(get("/slow").body(Full::default()).expect("a request"))
        .await;
    // The next finds no room and no place to wait: 429, `full`.
    let mut client = KeepAlive::connect(magpie.addr).await;
    let (refused, _) = client
        .send(get("/r/1").body(Full::default()).expect("a request"))
        .await;
    assert_eq!(refused.status(), 429);
    backends.release(1);
    use http_body_util::BodyExt as _;
    while let Some(frame) = within("the held answer", held.body_mut().frame()).await {
        frame.expect("a good frame");
    }
    within(
        "the access log to be flushed",
        magpie.probe.flush_access_log(),
    )
    .await;
    let text = std::fs::read_to_string(&dir.path).expect("the log");
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["200 at_once", "429 full"]);
    magpie.stop().await;
}
