//! Hot reload through a real config file: under load, when broken, by the
//! ways editors and Kubernetes replace files, and what survives it.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use magpie_proxy::testing::{BackendProbe, Outcome};

use crate::support::*;

/// 200 connections stay open across 20 reloads that add and remove backends;
/// every transfer completes intact, and new connections made during the
/// reloads all succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_under_load_loses_nothing() {
    let names: Vec<String> = (0..8).map(|i| format!("b{i}")).collect();
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let backends = RawBackends::start(&name_refs, Behaviour::GreetEcho).await;
    // Reload i serves a window of five of the eight backends, sliding by one.
    let window = |i: usize| -> Vec<(String, std::net::SocketAddr)> {
        (0..5).map(|j| backends.list[(i + j) % 8].clone()).collect()
    };
    let settings = "key:\n  from: source_addr\nreload:\n  watch: false\n";
    let file = TempFile::new(
        "magpie.yaml",
        &config_yaml("127.0.0.1:0", settings, &window(0)),
    );
    let magpie = Magpie::start_file(&file.path).await;
    let mut reloader = magpie.probe.reloader(file.path.clone());

    // 200 connections, each with its first chunk echoed.
    let mut open = Vec::new();
    for i in 0..200u64 {
        let mut stream = connect(magpie.addr).await;
        let name = read_greeting(&mut stream).await;
        let chunk = pseudo_random(2048, i + 1);
        echo(&mut stream, &chunk).await;
        open.push((stream, name, i));
    }

    // New connections keep arriving while the reloads happen.
    let addr = magpie.addr;
    let newcomers = tokio::spawn(async move {
        for i in 0..100u64 {
            let mut stream = connect(addr).await;
            read_greeting(&mut stream).await;
            let chunk = pseudo_random(512, 10_000 + i);
            echo(&mut stream, &chunk).await;
            stream.shutdown().await.expect("half-close");
            let rest = read_until_closed(&mut stream).await.expect("orderly close");
            assert!(rest.is_empty());
            tokio::task::yield_now().await;
        }
    });

    for i in 1..=20 {
        std::fs::write(&file.path, config_yaml("127.0.0.1:0", settings, &window(i)))
            .expect("rewrite config");
        match reloader.reload(false).await {
            Ok(Outcome::Applied { version, .. }) => assert_eq!(version, i as u64 + 1),
            other => panic!("reload {i} did not apply: {other:?}"),
        }
    }
    within("new connections during reloads", newcomers)
        .await
        .expect("no new connection failed");

    // Every in-flight connection finishes its transfer intact, on its backend.
    for (mut stream, _name, i) in open {
        let chunk = pseudo_random(8192, 1_000 + i);
        echo(&mut stream, &chunk).await;
        stream.shutdown().await.expect("half-close");
        let rest = read_until_closed(&mut stream).await.expect("orderly close");
        assert!(
            rest.is_empty(),
            "connection {i} got {} stray bytes",
            rest.len()
        );
    }
    assert_eq!(magpie.probe.version(), 21);
    assert_eq!(reloads(&magpie, "ok"), 20);
    magpie.stop().await;
}

async fn echo(stream: &mut tokio::net::TcpStream, chunk: &[u8]) {
    within("an echo round trip", async {
        stream.write_all(chunk).await.expect("send a chunk");
        let mut back = vec![0u8; chunk.len()];
        stream.read_exact(&mut back).await.expect("read the echo");
        assert!(back == chunk, "echo differs");
    })
    .await;
}

/// A broken file on SIGHUP leaves the running table routing; the failure is
/// counted and logged with the file, line and column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_reload_keeps_the_running_table() {
    let backends = HttpBackends::start(&["a", "b", "c"]).await;
    let settings = format!("{SESSION_KEY}reload:\n  watch: false\n");
    let good = config_yaml_with_admin("127.0.0.1:0", &settings, &backends.list);
    let file = TempFile::new("magpie.yaml", &good);
    let path = file.path.to_str().expect("UTF-8 temp path");
    let mut child = Child::spawn(&["run", "--config", path]);
    let addr = child.listen_addr().await;
    let admin = child.admin_addr().await;
    let before = backend_of(&http_get(addr, Some("alice")).await);

    // Line 4 is broken: a field `key` does not have.
    let mut lines: Vec<&str> = good.lines().collect();
    assert_eq!(lines[2], "key:");
    lines.insert(3, "  bogus: 1");
    std::fs::write(&file.path, lines.join("\n")).expect("write the broken config");
    child.signal("-HUP");
    child.wait_for_line("reload failed").await;
    let place = child.wait_for_line("magpie.yaml:").await;
    assert!(
        place.contains("magpie.yaml:4:"),
        "error should name line 4: {place}"
    );

    assert_eq!(backend_of(&http_get(addr, Some("alice")).await), before);
    let metrics = admin_get(admin, "/metrics").await.1;
    assert!(
        metrics.contains("magpie_reloads_total{result=\"error\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("magpie_table_version 1"), "{metrics}");

    // A fixed file applies.
    std::fs::write(&file.path, &good).expect("restore the config");
    child.signal("-HUP");
    child.wait_for_line("reloaded").await;
    assert!(
        admin_get(admin, "/metrics")
            .await
            .1
            .contains("magpie_table_version 2")
    );
    child.signal("-TERM");
    let status = within("magpie to exit", child.process.wait())
        .await
        .expect("wait for magpie");
    assert!(status.success(), "{status}");
}

/// An editor's write-then-rename and a Kubernetes ConfigMap symlink swap are
/// both seen by the directory watch; a touch that changes nothing does not
/// rebuild.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_replacements_are_picked_up() {
    let backends = HttpBackends::start(&["a", "b", "c", "d"]).await;
    let yaml = |n: usize| config_yaml("127.0.0.1:0", SESSION_KEY, &backends.list[..n]);

    // Editor style: write a temporary file, rename it over the config.
    let file = TempFile::new("magpie.yaml", &yaml(2));
    let magpie = Magpie::start_file(&file.path).await;
    let mut versions = magpie.probe.versions();
    // A touch (same bytes) first: it must not produce a version.
    std::fs::write(&file.path, yaml(2)).expect("touch");
    let tmp = file.path.with_file_name(".magpie.yaml.swp");
    std::fs::write(&tmp, yaml(3)).expect("write the new version");
    std::fs::rename(&tmp, &file.path).expect("rename into place");
    within("the renamed file to be reloaded", versions.changed())
        .await
        .expect("magpie is running");
    assert_eq!(magpie.probe.version(), 2, "the touch must not have rebuilt");
    assert_eq!(magpie.probe.backends().len(), 3);
    magpie.stop().await;

    // ConfigMap style: magpie.yaml -> ..data/magpie.yaml, ..data -> ..v1.
    let root = TempFile::new("placeholder", "");
    let dir = root.path.parent().expect("temp dir").to_path_buf();
    std::fs::create_dir(dir.join("..v1")).expect("mkdir ..v1");
    std::fs::write(dir.join("..v1/magpie.yaml"), yaml(2)).expect("write v1");
    std::os::unix::fs::symlink("..v1", dir.join("..data")).expect("link ..data");
    std::os::unix::fs::symlink("..data/magpie.yaml", dir.join("magpie.yaml"))
        .expect("link magpie.yaml");
    let magpie = Magpie::start_file(&dir.join("magpie.yaml")).await;
    let mut versions = magpie.probe.versions();
    std::fs::create_dir(dir.join("..v2")).expect("mkdir ..v2");
    std::fs::write(dir.join("..v2/magpie.yaml"), yaml(4)).expect("write v2");
    std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).expect("link ..data_tmp");
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("swap ..data");
    within("the symlink swap to be reloaded", versions.changed())
        .await
        .expect("magpie is running");
    assert_eq!(magpie.probe.backends().len(), 4);
    magpie.stop().await;
}

/// A config replaced by a FIFO is refused at once (the running table stays);
/// it never blocks the reload task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_in_place_of_the_config_fails_the_reload_at_once() {
    let backends = HttpBackends::start(&["a"]).await;
    let settings = format!("{SESSION_KEY}reload:\n  watch: false\n");
    let file = TempFile::new(
        "magpie.yaml",
        &config_yaml("127.0.0.1:0", &settings, &backends.list),
    );
    let magpie = Magpie::start_file(&file.path).await;
    std::fs::remove_file(&file.path).expect("remove");
    let made = std::process::Command::new("mkfifo")
        .arg(&file.path)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let mut reloader = magpie.probe.reloader(file.path.clone());
    let result = within("a reload of a FIFO", reloader.reload(true)).await;
    let error = result.expect_err("a FIFO is not a config").to_string();
    assert!(
        error.ends_with("magpie.yaml: is a FIFO, not a regular file: a config must be a file"),
        "{error}"
    );
    assert_eq!(magpie.probe.version(), 1);
    assert_eq!(reloads(&magpie, "error"), 1);
    magpie.stop().await;
}

/// magpie's own re-read of the file (open, read, close unwritten) is not a
/// change: after a reload, the file is left alone until something writes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_does_not_trigger_itself() {
    use notify::Watcher;
    let backends = HttpBackends::start(&["a", "b"]).await;
    let yaml = |n: usize| config_yaml("127.0.0.1:0", SESSION_KEY, &backends.list[..n]);
    let file = TempFile::new("magpie.yaml", &yaml(1));
    let magpie = Magpie::start_file(&file.path).await;
    let mut versions = magpie.probe.versions();
    std::fs::write(&file.path, yaml(2)).expect("write a change");
    within("the change to be reloaded", versions.changed())
        .await
        .expect("magpie is running");
    // From now on, any open of the file is magpie reading it again.
    let (tx, mut opens) = tokio::sync::mpsc::unbounded_channel();
    let mut spy = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(e) = event
            && matches!(
                e.kind,
                notify::EventKind::Access(notify::event::AccessKind::Open(_))
            )
        {
            let _ = tx.send(e);
        }
    })
    .expect("inotify");
    spy.watch(&file.path, notify::RecursiveMode::NonRecursive)
        .expect("watch the config file");
    // A self-triggering watch re-reads every ~150 ms; give it four chances.
    let reread = tokio::time::timeout(std::time::Duration::from_millis(700), opens.recv()).await;
    assert!(
        reread.is_err(),
        "magpie re-read an unchanged file: {reread:?}"
    );
    assert_eq!(reloads(&magpie, "error"), 0);
    magpie.stop().await;
}

/// Backends whose name and address are unchanged keep their counters (and
/// their open connections' count) across a reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchanged_backends_keep_their_live_state() {
    let backends = HttpBackends::start(&["a", "b", "c"]).await;
    let settings = format!("{SESSION_KEY}reload:\n  watch: false\n");
    let file = TempFile::new(
        "magpie.yaml",
        &config_yaml("127.0.0.1:0", &settings, &backends.list[..2]),
    );
    let magpie = Magpie::start_file(&file.path).await;
    for i in 0..20 {
        http_get(magpie.addr, Some(&format!("s{i}"))).await;
    }
    // One connection stays open across the reload.
    let mut held = connect(magpie.addr).await;
    let held_on = backend_of(&http_keepalive(&mut held, Some("held")).await);
    let before = counters(&magpie);
    assert_eq!(before.iter().map(|c| c.2).sum::<u64>(), 21);

    std::fs::write(
        &file.path,
        config_yaml("127.0.0.1:0", &settings, &backends.list),
    )
    .expect("add c");
    let mut reloader = magpie.probe.reloader(file.path.clone());
    assert!(matches!(
        reloader.reload(true).await,
        Ok(Outcome::Applied { version: 2, .. })
    ));
    let after = counters(&magpie);
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(b.0, a.0);
        assert!(b.1.same_state(&a.1), "{} keeps its live state", b.0);
        assert_eq!(b.2, a.2, "{} keeps its connection count", b.0);
        let received = magpie.backend_metric("magpie_backend_received_bytes_total", &a.0, &[]);
        assert!(received > 0, "{} keeps its byte count", b.0);
    }
    assert_eq!(after[2].0, "c");
    assert_eq!(after[2].2, 0, "c starts fresh");
    assert_eq!(
        magpie.backend(&held_on).active(),
        1,
        "the held connection is still counted"
    );
    assert_eq!(
        backend_of(&http_keepalive(&mut held, Some("held")).await),
        held_on
    );
    drop(held);
    magpie.stop().await;
}

/// Each backend, its live state and its connections so far, in name order.
fn counters(magpie: &Magpie) -> Vec<(String, BackendProbe, u64)> {
    (magpie.probe.backends().into_iter())
        .map(|b| {
            let name = b.name().to_string();
            let connections = magpie.backend_metric("magpie_backend_connections_total", &name, &[]);
            (name, b, connections)
        })
        .collect()
}

/// Reloads so far with `result` (`ok`, `error`).
fn reloads(magpie: &Magpie, result: &str) -> u64 {
    let result = format!("result=\"{result}\"");
    magpie.metric("magpie_reloads_total", &[&result])
}

/// A removed backend's connections drain; with `drain_timeout` they are
/// closed once it passes, and the backend's metric series then disappear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_backends_drain_then_close_after_drain_timeout() {
    let backends = RawBackends::start(&["a", "b"], Behaviour::GreetEcho).await;
    let settings = "key:\n  from: source_addr\nreload:\n  watch: false\ndrain_timeout: 300ms\n";
    let file = TempFile::new(
        "magpie.yaml",
        &config_yaml("127.0.0.1:0", settings, &backends.list),
    );
    let magpie = Magpie::start_file(&file.path).await;
    // Open connections until one lands on each backend.
    let mut on = std::collections::HashMap::new();
    for _ in 0..64 {
        let mut stream = connect(magpie.addr).await;
        let name = read_greeting(&mut stream).await;
        on.entry(name).or_insert(stream);
        if on.len() == 2 {
            break;
        }
    }
    let (mut on_a, mut on_b) = (
        on.remove("a").expect("one on a"),
        on.remove("b").expect("one on b"),
    );

    std::fs::write(
        &file.path,
        config_yaml("127.0.0.1:0", settings, &backends.list[..1]),
    )
    .expect("remove b");
    let mut reloader = magpie.probe.reloader(file.path.clone());
    match reloader.reload(false).await {
        Ok(Outcome::Applied { removed, .. }) => assert_eq!(removed, vec!["b".to_string()]),
        other => panic!("reload did not apply: {other:?}"),
    }
    // Still draining: b's connection works, and b is still exported.
    echo(&mut on_b, b"still here").await;
    assert_eq!(magpie.probe.retired(), 1);
    // Then drain_timeout closes it (an orderly close or a reset both end it).
    let mut rest = Vec::new();
    within(
        "the drained connection to close",
        on_b.read_to_end(&mut rest),
    )
    .await
    .ok();
    // The connection's slot is given back before its socket closes.
    assert!(magpie.probe.retired() == 0, "b drained, so it is forgotten");
    // The connection to a, which stayed, is untouched.
    echo(&mut on_a, b"unaffected").await;
    drop(on_a);
    magpie.stop().await;
}

/// A backend removed and put back before its `drain_timeout` passed is a
/// member like any other: the old drain timer neither closes its open
/// connections nor the ones made after it fired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_put_back_before_its_drain_timeout_keeps_serving() {
    let backends = RawBackends::start(&["a", "b"], Behaviour::GreetEcho).await;
    let settings = "key:\n  from: source_addr\nreload:\n  watch: false\ndrain_timeout: 300ms\n";
    let both = config_yaml("127.0.0.1:0", settings, &backends.list);
    let file = TempFile::new("magpie.yaml", &both);
    let magpie = Magpie::start_file(&file.path).await;
    let mut on_b = None;
    for _ in 0..64 {
        let mut stream = connect(magpie.addr).await;
        if read_greeting(&mut stream).await == "b" {
            on_b = Some(stream);
            break;
        }
    }
    let mut on_b = on_b.expect("a connection on b");
    let mut reloader = magpie.probe.reloader(file.path.clone());
    std::fs::write(
        &file.path,
        config_yaml("127.0.0.1:0", settings, &backends.list[..1]),
    )
    .expect("remove b");
    assert!(matches!(
        reloader.reload(false).await,
        Ok(Outcome::Applied { .. })
    ));
    std::fs::write(&file.path, &both).expect("put b back");
    assert!(matches!(
        reloader.reload(false).await,
        Ok(Outcome::Applied { .. })
    ));
    // Past the first drain timer: the open connection is still served.
    let mut byte = [0u8; 1];
    let closed =
        tokio::time::timeout(std::time::Duration::from_millis(800), on_b.read(&mut byte)).await;
    assert!(closed.is_err(), "b's connection ended: {closed:?}");
    echo(&mut on_b, b"still served").await;
    // New connections to b are served too.
    let mut served_by_b = 0;
    for _ in 0..64 {
        let mut stream = connect(magpie.addr).await;
        if read_greeting(&mut stream).await == "b" {
            echo(&mut stream, b"new on b").await;
            served_by_b += 1;
        }
    }
    assert!(served_by_b > 0, "no new connection reached b");
    drop(on_b);
    magpie.stop().await;
}

/// `idle_timeout` closes a connection with no traffic in either direction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed() {
    let backends = RawBackends::start(&["a"], Behaviour::GreetEcho).await;
    let magpie = Magpie::with("idle_timeout: 300ms\n", &backends.list).await;
    let mut stream = connect(magpie.addr).await;
    read_greeting(&mut stream).await;
    let started = std::time::Instant::now();
    let rest = read_until_closed(&mut stream)
        .await
        .expect("an orderly close");
    assert!(rest.is_empty());
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(250),
        "closed too early"
    );
    within("the close to be counted", async {
        while magpie.backend_metric("magpie_backend_idle_closes_total", "a", &[]) == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let durations = "magpie_backend_connection_duration_seconds_count";
    assert_eq!(magpie.backend_metric(durations, "a", &[]), 1);
    magpie.stop().await;
}

/// With the directory watch off, `reload.poll_interval` still finds a change;
/// a changed `listen` is kept as it runs (it needs a restart), and the rest of
/// the change applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_reloads_and_listen_changes_wait_for_a_restart() {
    let backends = HttpBackends::start(&["a", "b"]).await;
    let settings = format!("{SESSION_KEY}reload:\n  watch: false\n  poll_interval: 100ms\n");
    let file = TempFile::new(
        "magpie.yaml",
        &config_yaml("127.0.0.1:0", &settings, &backends.list[..1]),
    );
    let magpie = Magpie::start_file(&file.path).await;
    let mut versions = magpie.probe.versions();
    let listening = magpie.probe.listen();
    std::fs::write(
        &file.path,
        config_yaml("127.0.0.1:1", &settings, &backends.list),
    )
    .expect("rewrite the config");
    within("the poll to find the change", versions.changed())
        .await
        .expect("magpie is running");
    assert_eq!(magpie.probe.backends().len(), 2, "the backend list applied");
    assert_eq!(magpie.probe.listen(), listening, "listen stays as it runs");
    // And it still serves where it listened.
    http_get(magpie.addr, Some("s")).await;
    magpie.stop().await;
}
