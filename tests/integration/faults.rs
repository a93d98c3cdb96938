//! What magpie's own limits and its peers' failures must not break: running
//! out of file descriptors is magpie's problem, never a backend's, and never
//! a busy loop; an abort on one side is an abort on the other.

use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::support::*;

/// A file descriptor limit low enough to reach with a few dozen connections.
const FD_LIMIT: u32 = 48;

/// Idle admin connections the fd-limit test closes, one per client stuck in
/// the backlog, to free the one fd that client's accept needs.
const SPARE_ADMIN_CONNECTIONS: usize = 6;

async fn metrics(admin: std::net::SocketAddr) -> String {
    let (status, body) = admin_get(admin, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    body
}

/// At the fd limit a backend connect fails with EMFILE: that is counted as
/// magpie's resource exhaustion, the client is closed, and no backend is
/// blamed or marked down (passive health would otherwise take out every
/// healthy backend, and `when_all_down: refuse` would make it an outage).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_fds_on_connect_blames_no_backend() {
    let mut backends = RawBackends::start(&["a", "b", "c"], Behaviour::GreetEcho).await;
    let settings = "key:\n  from: source_addr\nreload:\n  watch: false\nhealth:\n  interval: 1h\n  passive_failures: 1\n  when_all_down: refuse\n";
    let file = TempFile::new(
        "magpie.yaml",
        &config_yaml_with_admin("127.0.0.1:0", settings, &backends.list),
    );
    let path = file.path.to_str().expect("UTF-8 path");
    let mut child = Child::spawn_with_fd_limit(FD_LIMIT, &["run", "--config", path]);
    let listen = child.listen_addr().await;
    let admin = child.admin_addr().await;
    // The first round of health checks opens a connection to each backend
    // at start: once all three closed, no fd comes free but the test's own.
    for _ in 0..3 {
        backends.next_report().await;
    }

    // A proxied connection costs magpie two fds, an idle admin connection
    // one: closing one when a client is stuck in the backlog (magpie logged
    // that it had no fd to accept it) frees exactly the fd that accept then
    // takes, leaving none for the backend connect. Whether the limit falls
    // on an accept or on a connect depends on the fds magpie holds besides;
    // the test takes either. An fd magpie held for a moment and gave back
    // while a client waited lets that client through with a spare gone, and
    // the next one sticks: another spare is closed for it.
    let mut spares = Vec::new();
    for _ in 0..SPARE_ADMIN_CONNECTIONS {
        spares.push(connect(admin).await);
    }
    let mut held = Vec::new();
    let mut refused = false;
    for _ in 0..FD_LIMIT {
        let mut stream = connect(listen).await;
        let greeting = {
            let greeting = try_read_greeting(&mut stream);
            tokio::pin!(greeting);
            loop {
                tokio::select! {
                    greeting = &mut greeting => break greeting,
                    _ = child.wait_for_line("accept failed"), if !spares.is_empty() => {
                        spares.pop();
                    }
                }
            }
        };
        match greeting {
            Some(_) => held.push(stream),
            None => {
                refused = true;
                break;
            }
        }
    }
    assert!(
        refused,
        "never reached the fd limit with {} connections",
        held.len()
    );
    drop(held);
    drop(spares);

    // Once magpie has closed the held connections' fds, every backend is
    // still up and unblamed. Until it has, a client may again be accepted
    // and find no fd for its backend: each try ends in a greeting or a close.
    within("a connection served once the fds came back", async {
        loop {
            let mut stream = connect(listen).await;
            if try_read_greeting(&mut stream).await.is_some() {
                break;
            }
        }
    })
    .await;
    let text = metrics(admin).await;
    assert!(
        metric_sum(
            &text,
            "magpie_resource_exhaustion_total",
            &["during=\"connect\""]
        ) >= 1.0,
        "{text}"
    );
    assert_eq!(
        metric_sum(&text, "magpie_backend_connect_failures_total", &[]),
        0.0,
        "{text}"
    );
    assert_eq!(metric_sum(&text, "magpie_backend_up", &[]), 3.0, "{text}");
    assert!(
        metric_sum(
            &text,
            "magpie_client_failures_total",
            &["reason=\"local_resources\""]
        ) >= 1.0,
        "{text}"
    );
    // The stuck-accept wait above may have read the connect's line already.
    let connect_line = "cannot open a connection: magpie is out of resources";
    if !child
        .lines_so_far()
        .iter()
        .any(|l| l.contains(connect_line))
    {
        child.wait_for_line(connect_line).await;
    }
}

/// At the fd limit a pending admin connection cannot be accepted; the admin
/// accept loop backs off like the data path's instead of retrying millions of
/// times a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_fds_the_admin_accept_loop_backs_off() {
    let backends = RawBackends::start(&["a"], Behaviour::GreetEcho).await;
    // Header mode: a client that sends nothing holds one fd and no backend
    // connection until its read_timeout.
    let settings = format!("{SESSION_KEY}  read_timeout: 1m\nreload:\n  watch: false\n");
    let file = TempFile::new(
        "magpie.yaml",
        &config_yaml_with_admin("127.0.0.1:0", &settings, &backends.list),
    );
    let path = file.path.to_str().expect("UTF-8 path");
    let mut child = Child::spawn_with_fd_limit(FD_LIMIT, &["run", "--config", path]);
    let listen = child.listen_addr().await;
    let admin = child.admin_addr().await;

    // More silent clients than fds: the rest wait in the backlog.
    let mut silent = Vec::new();
    for _ in 0..FD_LIMIT + 8 {
        silent.push(connect(listen).await);
    }
    child.wait_for_line("during=\"accept\"").await;
    // The admin endpoint runs on a thread of its own and may win a
    // descriptor freed for a moment: silent admin connections take any
    // such, so that the scrape below cannot be accepted.
    let mut idle_admin = Vec::new();
    for _ in 0..16 {
        idle_admin.push(connect(admin).await);
    }
    // An admin connection magpie cannot accept while the fds are gone.
    let mut scrape = tokio::net::TcpStream::connect(admin)
        .await
        .expect("admin backlog");
    scrape
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await
        .expect("request into the backlog");
    child.wait_for_line("during=\"admin_accept\"").await;
    // Let it sit at the limit for a while; a spinning loop fails millions of
    // accepts in this time, a backing-off one about ten per second per listener.
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(silent);
    drop(idle_admin);
    let body = String::from_utf8(
        within("the queued admin request", read_until_closed(&mut scrape))
            .await
            .expect("admin answer"),
    )
    .expect("UTF-8");
    let errors = metric_sum(&body, "magpie_accept_errors_total", &[]);
    assert!(errors >= 1.0, "{body}");
    assert!(
        errors < 200.0,
        "{errors} failed accepts in about half a second: the loop spins"
    );
    assert!(
        metric_sum(
            &body,
            "magpie_resource_exhaustion_total",
            &["during=\"admin_accept\""]
        ) >= 1.0,
        "{body}"
    );
}

/// A backend that sends a little and then resets: the client gets the bytes
/// and then a reset, not a clean end (which, without length framing, would
/// read as a complete answer). Counted per backend, by the side that reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_reset_reaches_the_client_as_a_reset() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let backend = vec![("r".to_string(), listener.local_addr().expect("addr"))];
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.expect("accept");
        stream.write_all(b"partial").await.expect("write");
        // Let the bytes leave before the reset.
        tokio::time::sleep(Duration::from_millis(50)).await;
        socket2::SockRef::from(&stream)
            .set_linger(Some(Duration::ZERO))
            .expect("linger 0");
    });
    let magpie = Magpie::with("", &backend).await;
    let mut client = connect(magpie.addr).await;
    let mut got = Vec::new();
    let ended = within("the reset", async {
        let mut buf = [0u8; 64];
        loop {
            match tokio::io::AsyncReadExt::read(&mut client, &mut buf).await {
                Ok(0) => return Ok(()),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => return Err(e),
            }
        }
    })
    .await;
    assert_eq!(got, b"partial");
    match ended {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("the client saw {other:?}, not a reset"),
    }
    let resets = |by: &str| {
        let by = format!("by=\"{by}\"");
        magpie.backend_metric("magpie_backend_resets_total", "r", &[&by])
    };
    assert_eq!(resets("backend"), 1);
    assert_eq!(resets("client"), 0);
    magpie.stop().await;
}

/// A client that resets: the backend sees a reset too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reset_reaches_the_backend_as_a_reset() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let backend = vec![("r".to_string(), listener.local_addr().expect("addr"))];
    let (tx, seen) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.expect("accept");
        let mut buf = [0u8; 64];
        let mut first = [0u8; 5];
        tokio::io::AsyncReadExt::read_exact(&mut stream, &mut first)
            .await
            .expect("hello");
        let end = loop {
            match tokio::io::AsyncReadExt::read(&mut stream, &mut buf).await {
                Ok(0) => break Ok(()),
                Ok(_) => {}
                Err(e) => break Err(e.kind()),
            }
        };
        let _ = tx.send(end);
    });
    let magpie = Magpie::with("", &backend).await;
    let mut client = connect(magpie.addr).await;
    client.write_all(b"hello").await.expect("send");
    // The bytes are through once the backend's connection is counted.
    within("the connection to be established", async {
        while magpie.backend_metric("magpie_backend_sent_bytes_total", "r", &[]) < 5 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    socket2::SockRef::from(&client)
        .set_linger(Some(Duration::ZERO))
        .expect("linger 0");
    drop(client);
    let end = within("the backend to see the end", seen)
        .await
        .expect("backend reports");
    assert_eq!(end, Err(std::io::ErrorKind::ConnectionReset));
    assert_eq!(
        magpie.backend_metric("magpie_backend_resets_total", "r", &["by=\"client\""]),
        1
    );
    magpie.stop().await;
}
