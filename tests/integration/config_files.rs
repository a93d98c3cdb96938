//! The example configs, and `magpie check` on good and broken files.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use magpie_proxy::Snapshot;
use magpie_proxy::config::Config;

use crate::support::*;

fn config_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config"))
}

#[test]
fn every_file_in_config_parses_and_builds() {
    let mut checked = Vec::new();
    let entries = std::fs::read_dir(config_dir())
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", config_dir().display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if !path.is_file() {
            continue;
        }
        let config = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
        Snapshot::of(Arc::new(config)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        checked.push(
            path.file_name()
                .expect("a file has a name")
                .to_string_lossy()
                .to_string(),
        );
    }
    for required in [
        "magpie.yaml",
        "llm-sessions.yaml",
        "sidecar.yaml",
        "agents.yaml",
        "udp.yaml",
    ] {
        assert!(
            checked.iter().any(|c| c == required),
            "config/{required} is missing; found {checked:?}"
        );
    }
}

#[test]
fn the_reference_config_sets_every_section() {
    let config = Config::load(&config_dir().join("magpie.yaml")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.placement.bounded_load, Some(1.25));
    assert!(matches!(
        config.key,
        magpie_proxy::config::KeyConfig::Header { .. }
    ));
    assert!(config.drain_timeout.is_some());
    assert!(!config.proxy_protocol.accept_from.is_empty());
    assert!(config.proxy_protocol.send_v2);
    assert!(config.health.is_some());
    assert!(config.reload.poll_interval.is_some());
    assert!(config.backends.iter().all(|b| b.zone.is_some()));

    let llm =
        Config::load(&config_dir().join("llm-sessions.yaml")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(llm.placement.bounded_load, Some(1.25));
    assert_eq!(llm.mode, magpie_proxy::config::Mode::Http);
    assert!(matches!(
        &llm.key,
        magpie_proxy::config::KeyConfig::Header { name, body_field: Some(field), .. }
            if name == "x-session-id" && field.text == "prompt_cache_key"
    ));
    let health = llm.health.as_ref().expect("health is on");
    assert_eq!(health.http_path.as_deref(), Some("/health"));
    assert!(health.passive_status);
    let load = health.load.as_ref().expect("engine load is on");
    assert_eq!(load.preset, magpie_proxy::config::LoadPreset::Vllm);
    assert!(llm.sessions.is_some());
    let log = llm.access_log.as_ref().expect("the access log is on");
    assert_eq!(log.target, magpie_proxy::config::LogTarget::Stderr);
    assert_eq!(log.format, magpie_proxy::config::LogFormat::Json);
    assert_eq!(
        llm.http.keepalive_timeout,
        std::time::Duration::from_secs(600)
    );
    assert_eq!(
        llm.http,
        magpie_proxy::config::HttpConfig {
            expose_backend: true,
            keepalive_timeout: std::time::Duration::from_secs(600),
            ..Default::default()
        }
    );

    let agents = Config::load(&config_dir().join("agents.yaml")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(agents.group, Some(magpie_core::key::group::GroupBy::System));
    assert!(matches!(
        agents.key,
        magpie_proxy::config::KeyConfig::Conversation { .. }
    ));
    assert!(agents.sessions.is_some());
    assert_eq!(agents.placement.bounded_load, Some(1.25));
    let load = agents.health.as_ref().and_then(|h| h.load.as_ref());
    assert_eq!(
        load.map(|l| l.preset),
        Some(magpie_proxy::config::LoadPreset::Vllm)
    );

    let sidecar =
        Config::load(&config_dir().join("sidecar.yaml")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(sidecar.key, magpie_proxy::config::KeyConfig::SourceIp);
}

#[test]
fn check_on_a_broken_file_exits_1_and_names_file_line_and_column() {
    // A semantic problem on line 4, column 13 (the value).
    let file = TempFile::new(
        "broken.yaml",
        "listen: 127.0.0.1:7000\nadmin: off\nconnect:\n  attempts: 0\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
    );
    let out = magpie_check(&file.path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("broken.yaml:4:13: connect.attempts must be at least 1"),
        "stderr: {stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing on stdout for a broken file");

    // A syntax error: an unclosed flow sequence opened on line 5.
    let file = TempFile::new(
        "broken.yaml",
        "listen: 127.0.0.1:7000\nadmin: off\nbackends:\n  - name: a\n    addr: [127.0.0.1:8001\n",
    );
    let out = magpie_check(&file.path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    let place = stderr
        .split("broken.yaml:")
        .nth(1)
        .unwrap_or_else(|| panic!("the file is not named: {stderr}"));
    let mut fields = place.splitn(3, ':');
    let line: u64 = fields
        .next()
        .and_then(|l| l.parse().ok())
        .unwrap_or_else(|| panic!("no line number: {stderr}"));
    let column: u64 = fields
        .next()
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no column number: {stderr}"));
    assert!(line >= 5, "line {line}: {stderr}");
    assert!(column >= 1, "column {column}: {stderr}");
}

#[test]
fn check_on_a_good_file_exits_0_and_prints_the_fingerprint() {
    let path = config_dir().join("sidecar.yaml");
    let out = magpie_check(&path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let snapshot = Snapshot::of(Arc::new(config)).expect("the table builds");
    assert!(
        stdout.contains(&format!("fingerprint: {}", snapshot.fingerprint)),
        "stdout: {stdout}"
    );
    for name in ["worker-0", "worker-1", "worker-2"] {
        assert!(stdout.contains(name), "backend {name} not listed: {stdout}");
    }
}

#[test]
fn run_with_a_broken_file_exits_1_and_names_the_place() {
    let file = TempFile::new(
        "broken.yaml",
        "listen: 127.0.0.1:0\nadmin: off\nbackends:\n  - {name: a, addr: 127.0.0.1:8001, weight: 0}\n",
    );
    let out = Command::new(magpie_bin())
        .args(["run", "--config"])
        .arg(&file.path)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", magpie_bin()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("broken.yaml:4:") && stderr.contains("weight 0"),
        "stderr: {stderr}"
    );
}

/// What is not a regular config file is refused at once, with its kind: a
/// FIFO would block `check` (and every reload) forever, `/dev/zero` would be
/// read without end.
#[test]
fn special_files_are_refused_without_waiting() {
    let dir = TempFile::new("placeholder", "");
    let fifo = dir.path.with_file_name("fifo.yaml");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    for (path, said) in [
        (
            fifo.as_path(),
            "fifo.yaml: is a FIFO, not a regular file: a config must be a file",
        ),
        (
            Path::new("/dev/zero"),
            "/dev/zero: is a character device, not a regular file",
        ),
        (
            dir.path.parent().expect("dir"),
            "is a directory, not a regular file",
        ),
    ] {
        let out = magpie_check(path);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
        assert!(stderr.contains(said), "stderr: {stderr}");
    }
    // Over the size limit: a sparse file of 17 MiB.
    let big = dir.path.with_file_name("big.yaml");
    let file = std::fs::File::create(&big).expect("create");
    file.set_len(17 << 20).expect("set_len");
    let out = magpie_check(&big);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("big.yaml: is larger than 16 MiB (the most a config may be)"),
        "stderr: {stderr}"
    );
}

/// A large pool is fine (60,000 backends); a file with more than a million
/// YAML values is refused in a sentence with its place, not a parser's
/// internal counter.
#[test]
fn large_pools_pass_and_the_yaml_budget_is_said_in_words() {
    let pool = |n: usize| {
        let mut yaml = String::from(
            "listen: 127.0.0.1:7000\nadmin: off\nplacement: {table_size: 6000011}\nbackends:\n",
        );
        for i in 0..n {
            yaml.push_str(&format!(
                "  - {{name: b{i}, addr: 127.0.0.2:{}}}\n",
                1000 + i % 60000
            ));
        }
        yaml
    };
    let file = TempFile::new("large.yaml", &pool(60_000));
    let out = magpie_check(&file.path);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = TempFile::new("huge.yaml", &pool(200_001));
    let out = magpie_check(&file.path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("huge.yaml:200002:27: the file holds more than 1000000 YAML values, more than a config may have"),
        "stderr: {stderr}"
    );
}

/// A port in use is one sentence that names the config line and says why,
/// without repeating the OS error.
#[test]
fn a_port_in_use_names_the_line_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr");
    let file = TempFile::new(
        "busy.yaml",
        &format!(
            "admin: off\nlisten:\n  - {addr}\nbackends:\n  - {{name: a, addr: 127.0.0.1:1}}\n"
        ),
    );
    let out = Command::new(magpie_bin())
        .args(["run", "--config"])
        .arg(&file.path)
        .env("RUST_LOG", "error")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", magpie_bin()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    let expected = format!(
        "busy.yaml:3:5: cannot listen on {addr}: the address is already in use (another process listens on it)\n"
    );
    assert!(stderr.ends_with(&expected), "stderr: {stderr}");
    assert_eq!(stderr.matches("in use").count(), 1, "stderr: {stderr}");
}

/// Pins each example config's fingerprint and where a few keys go, through the
/// real binary (`check` and `lookup`), so that a change inside magpie that
/// remaps keys fails here loudly rather than in a fleet.
/// An example config file, its fingerprint, and (key, backend) pairs.
type Golden = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

#[test]
fn example_configs_route_as_pinned() {
    let golden: &[Golden] = &[
        (
            "magpie.yaml",
            "38bafd845ecd6a22e83bbba8bbcf8142",
            &[("alice", "app-1"), ("conv-7f3a", "app-2"), ("k3", "app-0")],
        ),
        (
            "llm-sessions.yaml",
            "cdf07154f338fce0d3fdbc8cba602c7e",
            &[
                ("alice", "gpu-0"),
                ("bob", "gpu-3"),
                ("session-42", "gpu-1"),
            ],
        ),
        (
            // Session keys: where a conversation without a group goes
            // (key.group_choices: 2 is in the fingerprint).
            "agents.yaml",
            "81fbb96e7e216f3bfc8e7310a71ecbaf",
            &[
                ("alice", "gpu-0"),
                ("bob", "gpu-0"),
                ("session-42", "gpu-1"),
            ],
        ),
        (
            "sidecar.yaml",
            "d84ece23554150e511da694ba7d81ba8",
            &[
                ("127.0.0.1", "worker-2"),
                ("10.1.2.3", "worker-0"),
                ("192.168.7.9", "worker-1"),
            ],
        ),
        (
            // Server names: any case, with or without the trailing dot.
            "tls-passthrough.yaml",
            "b6d85ae182a2dfbb578ebee5c070a768",
            &[
                ("api.example.com", "tls-0"),
                ("www.example.org", "tls-2"),
                ("WWW.Example.ORG.", "tls-2"),
            ],
        ),
    ];
    for (file, fingerprint, routes) in golden {
        let path = config_dir().join(file);
        let out = magpie_check(&path);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains(&format!("fingerprint: {fingerprint}")),
            "{file}: the fingerprint changed:\n{stdout}"
        );
        let mut args = vec!["lookup".to_string(), "--config".into()];
        args.push(path.to_string_lossy().into_owned());
        args.extend(routes.iter().map(|(k, _)| k.to_string()));
        let out = Command::new(magpie_bin())
            .args(&args)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", magpie_bin()));
        let stdout = String::from_utf8_lossy(&out.stdout);
        for (key, backend) in *routes {
            assert!(
                stdout
                    .lines()
                    .any(|l| l.starts_with(&format!("{key}\t{backend}\t"))),
                "{file}: key {key} no longer goes to {backend}:\n{stdout}"
            );
        }
    }
}

/// `magpie check | head` and friends: a reader that goes away early is not an
/// error. Stdout here is a pipe whose read end is already closed, so the very
/// first write fails with EPIPE.
#[test]
fn commands_end_quietly_on_a_closed_stdout() {
    let config = config_dir().join("magpie.yaml");
    let config = config.to_string_lossy();
    let cases: [&[&str]; 4] = [
        &["check", "--config", &config],
        &["lookup", "--config", &config, "alice", "bob"],
        &["plan", "--json", &config, &config],
        &["simulate", "--keys", "1000"],
    ];
    for args in cases {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let out = Command::new(magpie_bin())
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", magpie_bin()));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// `magpie check` says what places a conversation with `key.group`, and
/// says nothing of groups without it.
#[test]
fn check_prints_the_group_setting() {
    let out = magpie_check(&config_dir().join("agents.yaml"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("\ngroup:       the body's model, instructions and tools: a conversation's first request goes where it costs least"),
        "{stdout}"
    );
    let out = magpie_check(&config_dir().join("llm-sessions.yaml"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("\ngroup:       the body's model, instructions and first user message"),
        "{stdout}"
    );
    let out = magpie_check(&config_dir().join("magpie.yaml"));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("group:"));
}

/// `magpie check` prints mode http's deadlines, and the example configs in
/// mode http use them rather than `idle_timeout`, which it warns about.
#[test]
fn check_prints_the_http_deadlines() {
    for file in ["llm-sessions.yaml", "agents.yaml"] {
        let out = magpie_check(&config_dir().join(file));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("\ndeadlines:   backend head 5m after the request (else 504), body gaps 5m (else cut); client first byte 10s, body gaps 1m (else 408), keep-alive idle 10m; pool 32 idle per backend for 4s, reuse safe\n"),
            "{file}: {stdout}"
        );
        assert!(!stdout.contains("idle_timeout"), "{file}: {stdout}");
    }
}

/// `plan --keys` reads a bounded regular file: a device is refused at once
/// with a one-line error, never read until memory runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_refuses_a_key_file_that_is_not_a_bounded_file() {
    let config = config_dir().join("magpie.yaml");
    let config = config.to_str().expect("a UTF-8 path");
    let run = tokio::process::Command::new(magpie_bin())
        .args(["plan", config, config, "--keys", "/dev/zero"])
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .output();
    let out = within("plan to refuse /dev/zero", run)
        .await
        .expect("run magpie plan");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--keys /dev/zero") && stderr.contains("a key file must be a file"),
        "{stderr}"
    );
}
