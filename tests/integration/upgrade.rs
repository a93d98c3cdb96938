//! Binary upgrade through the real binary: SIGUSR2 starts the binary anew
//! with the listening sockets and the session pins; the old process drains
//! and exits 0. Under a steady load of new connections none fails across
//! two upgrades in a row, a conversation pinned away from its table owner
//! stays where it is pinned, and a TCP stream open across the upgrade
//! finishes in the old process. A new process that fails leaves the old
//! one serving; one still starting when the old one is told to stop is
//! killed, and nothing is left listening or on disk.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use magpie_core::key::text_key;
use magpie_proxy::Snapshot;
use magpie_proxy::config::Config;

use crate::support::*;

fn settings() -> String {
    format!(
        "mode: http\n{SESSION_KEY}sessions:\n  ttl: 10m\nreload:\n  watch: false\nshutdown_grace: 10s\n"
    )
}

/// The table owner of session `key` under the config at `path`.
fn owner(path: &std::path::Path, key: &str) -> String {
    let config = Config::load(path).expect("the test config loads");
    let snapshot = Snapshot::of(Arc::new(config)).expect("builds");
    let first = snapshot.candidates(text_key(key.as_bytes())).next();
    first.expect("a candidate").name.clone()
}

/// Kills the process `pid` when dropped (the new magpie is no child of the test).
struct KillOnDrop(String);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.0])
            .status();
    }
}

/// The pid of the process the next hand-over went to, from the first
/// process's log (they all share its stderr).
async fn new_pid(log: &mut Child) -> String {
    let line = log.wait_for_line("handed over to the new process").await;
    (line.split_whitespace())
        .find_map(|f| f.strip_prefix("pid="))
        .expect("the new process's pid in the line")
        .to_string()
}

fn kill(pid: &str, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, pid])
        .status();
    assert!(status.is_ok_and(|s| s.success()), "kill {signal} {pid}");
}

/// Whether process `pid` still runs (a zombie of another parent counts).
fn alive(pid: &str) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
}

/// Each conversation of `moved` still goes to its pinned backend.
async fn pins_kept(
    addr: SocketAddr,
    sessions: &[String],
    pinned: &[String],
    moved: &[usize],
    when: &str,
) {
    for &i in moved {
        let served = backend_of(&http_get(addr, Some(&sessions[i])).await);
        assert_eq!(
            served, pinned[i],
            "{} keeps its pin across {when}",
            sessions[i]
        );
    }
}

/// New connections, one request each, until `stop`: (answered, failed).
fn steady_load(addr: SocketAddr, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<(u64, u64)> {
    tokio::spawn(async move {
        let (ok, failed) = (AtomicU64::new(0), AtomicU64::new(0));
        // Bounded: at most 20,000 requests or 60 s.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        for i in 0..20_000u64 {
            if stop.load(Ordering::Relaxed) || tokio::time::Instant::now() > deadline {
                break;
            }
            let session = format!("load-{}", i % 50);
            let answer = tokio::time::timeout(Duration::from_secs(10), async {
                let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
                Some(http_exchange_closing(stream, Some(&session)).await)
            });
            match answer.await {
                Ok(Some(body)) if body.contains("backend: ") => ok.fetch_add(1, Ordering::Relaxed),
                _ => failed.fetch_add(1, Ordering::Relaxed),
            };
        }
        (ok.into_inner(), failed.into_inner())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr2_hands_over_sockets_and_pins_and_loses_nothing() {
    let backends = HttpBackends::start(&["a", "b", "c"]).await;
    let yaml = |n| config_yaml("127.0.0.1:0", &settings(), &backends.list[..n]);
    let file = TempFile::new("magpie.yaml", &yaml(2));
    let path = file.path.to_str().expect("a UTF-8 temp path");
    let mut old = Child::spawn(&["run", "--config", path]);
    let addr = old.listen_addr().await;
    // Conversations pinned while the pool is a and b.
    let sessions: Vec<String> = (0..40).map(|i| format!("conv-{i}")).collect();
    let mut pinned = Vec::new();
    for s in &sessions {
        pinned.push(backend_of(&http_get(addr, Some(s)).await));
    }
    // c joins: the table moves some of them, their pins keep them.
    std::fs::write(&file.path, yaml(3)).expect("add c");
    old.signal("-HUP");
    old.wait_for_line("version=2").await;
    let moved: Vec<usize> = (0..sessions.len())
        .filter(|&i| owner(&file.path, &sessions[i]) == "c")
        .collect();
    assert!(
        !moved.is_empty(),
        "some conversations now belong to c in the table"
    );
    for &i in &moved {
        assert_eq!(
            backend_of(&http_get(addr, Some(&sessions[i])).await),
            pinned[i]
        );
    }

    let stop = Arc::new(AtomicBool::new(false));
    let load = steady_load(addr, Arc::clone(&stop));
    old.signal("-USR2");
    let first = new_pid(&mut old).await;
    let _first = KillOnDrop(first.clone());
    let status = old.process.wait().await.expect("the old process exits");
    assert!(status.success(), "{status}: {}", old.log.join("\n"));
    // The new process serves: the pinned conversations stay where they were.
    pins_kept(addr, &sessions, &pinned, &moved, "the upgrade").await;
    // And again: the new process hands over to a third, pins and all.
    kill(&first, "-USR2");
    let second = new_pid(&mut old).await;
    let _second = KillOnDrop(second);
    within("the first new process to exit", async {
        while alive(&first) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    pins_kept(addr, &sessions, &pinned, &moved, "two upgrades").await;
    stop.store(true, Ordering::Relaxed);
    let (answered, failed) = load.await.expect("the load task");
    eprintln!("steady load across the upgrade: {answered} answered, {failed} failed");
    assert_eq!(failed, 0, "{answered} answered");
    assert!(answered > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_process_that_fails_leaves_the_old_one_serving() {
    let backends = HttpBackends::start(&["a", "b"]).await;
    let yaml = config_yaml("127.0.0.1:0", &settings(), &backends.list);
    let file = TempFile::new("magpie.yaml", &yaml);
    let path = file.path.to_str().expect("a UTF-8 temp path");
    let mut old = Child::spawn(&["run", "--config", path]);
    let addr = old.listen_addr().await;
    // The new binary will not start: its config is broken.
    std::fs::write(&file.path, "listen: [").expect("break the config");
    old.signal("-USR2");
    old.wait_for_line("binary upgrade failed, this process keeps serving")
        .await;
    assert!(http_get(addr, Some("s")).await.contains("backend: "));
    assert!(
        old.process.try_wait().expect("poll").is_none(),
        "still running"
    );
    old.signal("-TERM");
    let status = old.process.wait().await.expect("exits");
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_stream_open_across_the_upgrade_finishes_in_the_old_process() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    async fn echo(stream: &mut tokio::net::TcpStream, chunk: &[u8]) {
        stream.write_all(chunk).await.expect("send");
        let mut back = vec![0u8; chunk.len()];
        stream.read_exact(&mut back).await.expect("the echo");
        assert_eq!(back, chunk);
    }
    let backends = RawBackends::start(&["a"], Behaviour::GreetEcho).await;
    let yaml = config_yaml(
        "127.0.0.1:0",
        "mode: tcp\nshutdown_grace: 10s\n",
        &backends.list,
    );
    let file = TempFile::new("magpie.yaml", &yaml);
    let path = file.path.to_str().expect("a UTF-8 temp path");
    let mut old = Child::spawn(&["run", "--config", path]);
    let addr = old.listen_addr().await;
    let mut stream = connect(addr).await;
    assert_eq!(read_greeting(&mut stream).await, "a");
    echo(&mut stream, b"before the upgrade").await;
    old.signal("-USR2");
    let pid = new_pid(&mut old).await;
    let _new = KillOnDrop(pid);
    // New connections reach the new process; the open stream goes on.
    let mut fresh = connect(addr).await;
    assert_eq!(read_greeting(&mut fresh).await, "a");
    echo(&mut stream, b"after the upgrade, on the same stream").await;
    assert!(
        old.process.try_wait().expect("poll").is_none(),
        "the old one drains"
    );
    drop(stream);
    drop(fresh);
    let status = old.process.wait().await.expect("the old process exits");
    assert!(
        status.success(),
        "{status}: the stream finished within the grace"
    );
}

/// A streamed answer in flight and an idle keep-alive client, across the
/// upgrade: the stream ends whole in the old process, the keep-alive
/// client's next request (sent within the drain's first moment) is
/// answered there with `connection: close`, and the next connection
/// reaches the new process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_and_a_keep_alive_client_cross_the_upgrade() {
    use http_body_util::{BodyExt, Full};
    let backends = HyperBackends::start(&["a"]).await;
    let yaml = config_yaml("127.0.0.1:0", &settings(), &backends.pairs());
    let file = TempFile::new("magpie.yaml", &yaml);
    let path = file.path.to_str().expect("a UTF-8 temp path");
    let mut old = Child::spawn(&["run", "--config", path]);
    let addr = old.listen_addr().await;
    let mut streaming = KeepAlive::connect(addr).await;
    let request = get("/stream").body(Full::default()).expect("a request");
    let response = streaming.start(request).await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = body
        .frame()
        .await
        .expect("a first chunk")
        .expect("no error");
    assert!(first.is_data());
    let mut idle = KeepAlive::connect(addr).await;
    assert_eq!(idle.get_session("kept").await, "a");

    old.signal("-USR2");
    let pid = new_pid(&mut old).await;
    let _new = KillOnDrop(pid);
    // The keep-alive client's next request: answered, and told to close.
    let request = get("/")
        .header("x-session-id", "kept")
        .body(Full::default());
    let (head, text) = idle.send(request.expect("a request")).await;
    assert_eq!(head.status(), 200, "{text:?}");
    assert_eq!(
        head.headers().get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
    // The stream goes on to its end.
    backends.release(1);
    let rest = body
        .collect()
        .await
        .expect("the rest of the stream")
        .to_bytes();
    assert!(!rest.is_empty(), "the second chunk");
    drop(streaming);
    assert_eq!(KeepAlive::connect(addr).await.get_session("new").await, "a");
    let status = old.process.wait().await.expect("the old process exits");
    assert!(status.success(), "{status}: nothing was cut");
}

/// Mode udp: the datagram socket is handed over like a listener. Clients
/// that keep sending across the upgrade lose no datagram and keep their
/// backend; the old process relays the answers on their way and exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_udp_flows_cross_the_upgrade_without_a_lost_datagram() {
    let backends = UdpBackends::start("127.0.0.1", &["a", "b", "c"]).await;
    let yaml = config_yaml(
        "127.0.0.1:0",
        "mode: udp\nshutdown_grace: 10s\n",
        &backends.pairs(),
    );
    let file = TempFile::new("magpie.yaml", &yaml);
    let path = file.path.to_str().expect("a UTF-8 temp path");
    let mut old = Child::spawn(&["run", "--config", path]);
    let addr = old.listen_addr().await;
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let load = {
        let (stop, rounds) = (Arc::clone(&stop), Arc::clone(&rounds));
        tokio::spawn(async move {
            let mut clients = Vec::new();
            for last in 2..10 {
                clients.push((client_on(&format!("127.0.0.{last}")).await, None));
            }
            let mut lost = 0u64;
            // Bounded: at most 5,000 rounds or 60 s.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            for round in 0..5_000u64 {
                if stop.load(Ordering::Relaxed) || tokio::time::Instant::now() > deadline {
                    break;
                }
                for (client, first) in &mut clients {
                    let datagram = format!("r{round}");
                    client
                        .send_to(datagram.as_bytes(), addr)
                        .await
                        .expect("sent");
                    let mut buf = [0u8; 64];
                    let got =
                        tokio::time::timeout(Duration::from_secs(1), client.recv_from(&mut buf))
                            .await;
                    let Ok(Ok((n, _))) = got else {
                        lost += 1;
                        continue;
                    };
                    let answer = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let by = answered_by(&answer).to_string();
                    assert_eq!(answer, format!("{by}:{datagram}"));
                    assert_eq!(
                        first.get_or_insert(by.clone()),
                        &by,
                        "a client keeps its backend"
                    );
                }
                rounds.fetch_add(1, Ordering::Relaxed);
            }
            lost
        })
    };
    let at_least = |n: u64| {
        let rounds = Arc::clone(&rounds);
        async move {
            within("the load to go on", async {
                while rounds.load(Ordering::Relaxed) < n {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await;
        }
    };
    at_least(20).await;
    old.signal("-USR2");
    let pid = new_pid(&mut old).await;
    let _new = KillOnDrop(pid);
    let status = within("the old process to drain", old.process.wait())
        .await
        .expect("the old process exits");
    assert!(status.success(), "{status}");
    let after = rounds.load(Ordering::Relaxed);
    at_least(after + 20).await;
    stop.store(true, Ordering::Relaxed);
    let lost = load.await.expect("the load ran");
    assert_eq!(lost, 0, "no datagram lost across the upgrade");
}

/// An upgrade still pending when the old process is told to stop is
/// abandoned: the new binary (here one that hangs while starting, holding
/// the listening sockets it was handed) is killed, nothing is left
/// listening, and the hand-over directory is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_pending_at_sigterm_is_abandoned_and_leaves_nothing() {
    use std::os::unix::fs::PermissionsExt;
    let backends = HttpBackends::start(&["a", "b"]).await;
    let yaml = config_yaml("127.0.0.1:0", &settings(), &backends.list);
    let file = TempFile::new("magpie.yaml", &yaml);
    let path = file.path.to_str().expect("a UTF-8 temp path");
    // magpie runs as `exe`, a link to the built binary: the upgrade starts
    // whatever `exe` is then.
    let exe_file = TempFile::new("magpie", "");
    let exe = exe_file.path.clone();
    std::fs::remove_file(&exe).expect("make room for the link");
    std::os::unix::fs::symlink(magpie_bin(), &exe).expect("link the binary");
    let tmp = TempFile::new("placeholder", "");
    let tmp_dir = tmp.path.parent().expect("a directory").to_path_buf();
    let mut command = tokio::process::Command::new(&exe);
    command
        .args(["run", "--config", path])
        .env("TMPDIR", &tmp_dir);
    let mut old = Child::spawn_command(command);
    let addr = old.listen_addr().await;
    // The new binary hangs while starting.
    std::fs::remove_file(&exe).expect("unlink");
    std::fs::write(&exe, "#!/bin/sh\nexec sleep 600\n").expect("a hanging binary");
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    old.signal("-USR2");
    let line = old.wait_for_line("the new process started").await;
    let pid = (line.split_whitespace())
        .find_map(|f| f.strip_prefix("pid="))
        .expect("the new process's pid in the line")
        .to_string();
    let _hung = KillOnDrop(pid.clone());
    assert!(alive(&pid), "the new process runs");
    old.signal("-TERM");
    let status = within("the old process to exit", old.process.wait())
        .await
        .expect("exits");
    assert!(status.success(), "{status}");
    assert!(!alive(&pid), "the hung new process still runs");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "something still listens on {addr}"
    );
    let left: Vec<_> = std::fs::read_dir(&tmp_dir)
        .expect("the temp directory")
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with("magpie-upgrade-"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
