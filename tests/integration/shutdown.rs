//! SIGTERM to the real binary: no new connections, the open transfer finishes,
//! exit status 0.

use std::io::ErrorKind;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;

const PART: usize = 512 * 1024;

/// Sends `data` and reads its echo at the same time (the echo can be larger
/// than the socket buffers).
async fn send_and_read_echo(stream: &mut TcpStream, data: &[u8]) {
    let (mut r, mut w) = stream.split();
    let mut echoed = vec![0u8; data.len()];
    let (sent, read) = within("a part of the transfer to echo back", async {
        tokio::join!(w.write_all(data), r.read_exact(&mut echoed))
    })
    .await;
    sent.expect("send a part");
    read.expect("read the echo of a part");
    assert!(echoed == data, "the echo differs from what was sent");
}

/// Nothing at `addr` serves through magpie: the connect is refused, or (the
/// port freed and at once bound again by another test's `127.0.0.1:0`
/// listener) what answers is not the backend magpie would have connected us
/// to, whose greeting comes at once.
async fn assert_not_served_at(addr: std::net::SocketAddr) {
    let mut stream = match TcpStream::connect(addr).await {
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => return,
        Err(e) => panic!("a connect after SIGTERM failed oddly: {e}"),
        Ok(stream) => stream,
    };
    let mut first = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut first)).await;
    if let Ok(Ok(n)) = read {
        assert!(
            !first[..n].starts_with(b"backend: "),
            "a new connection was served through magpie after SIGTERM"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_an_in_flight_transfer_finish_then_exits_0() {
    let mut backends = RawBackends::start(&["echo"], Behaviour::GreetEcho).await;
    let file = TempFile::new(
        "magpie.yaml",
        &config_yaml_with_admin("127.0.0.1:0", "shutdown_grace: 20s\n", &backends.list),
    );
    let path = file.path.to_str().expect("a UTF-8 temp path");
    let mut child = Child::spawn(&["run", "--config", path]);
    let addr = child.listen_addr().await;
    let admin = child.admin_addr().await;

    let data = pseudo_random(2 * PART, 42);
    let mut client = connect(addr).await;
    assert_eq!(read_greeting(&mut client).await, "echo");
    send_and_read_echo(&mut client, &data[..PART]).await;

    let pid = child.pid();
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("run kill");
    assert!(kill.success(), "kill -TERM {pid} failed");
    // Logged once the listeners are closed.
    child.wait_for_line("no new connections").await;

    assert_not_served_at(addr).await;

    // A slow client: it pauses well into the grace period before the rest.
    // This is the condition under test, not a wait for an event.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        child.process.try_wait().expect("poll magpie").is_none(),
        "magpie exited while a connection was open:\n{}",
        child.log.join("\n")
    );

    // The admin endpoint still answers during the drain, and shows it.
    let (status, metrics) = admin_get(admin, "/metrics").await;
    assert_eq!(status, 200);
    let active = metrics
        .lines()
        .find(|l| l.starts_with("magpie_backend_active_connections{backend=\"echo\""))
        .unwrap_or_else(|| panic!("no active gauge for echo:\n{metrics}"));
    assert!(
        active.ends_with(" 1"),
        "one connection is still active: {active}"
    );

    // The open connection keeps working after the signal.
    send_and_read_echo(&mut client, &data[PART..]).await;
    client.shutdown().await.expect("shut down the write half");
    let rest = read_until_closed(&mut client)
        .await
        .expect("an orderly close");
    assert!(rest.is_empty());
    let report = backends.next_report().await;
    assert_eq!(report.bytes.len(), data.len(), "bytes the backend received");
    assert!(report.bytes == data, "the backend received other bytes");

    let status = within("magpie to exit", child.process.wait())
        .await
        .expect("wait for magpie");
    assert!(
        status.success(),
        "magpie exited with {status}:\n{}",
        child.log.join("\n")
    );
}

/// magpie run as a process with `shutdown_grace`, one connection open through
/// it, then SIGTERM: it is draining. The last value holds what must outlive
/// the test's steps (the backend, the config file).
async fn draining_with_one_open_connection(
    grace: &str,
) -> (Child, TcpStream, (RawBackends, TempFile)) {
    let backends = RawBackends::start(&["echo"], Behaviour::GreetEcho).await;
    let file = TempFile::new(
        "magpie.yaml",
        &config_yaml(
            "127.0.0.1:0",
            &format!("shutdown_grace: {grace}\n"),
            &backends.list,
        ),
    );
    let path = file.path.to_str().expect("a UTF-8 temp path");
    let mut child = Child::spawn(&["run", "--config", path]);
    let addr = child.listen_addr().await;
    let mut client = connect(addr).await;
    assert_eq!(read_greeting(&mut client).await, "echo");
    child.signal("-TERM");
    child.wait_for_line("no new connections").await;
    (child, client, (backends, file))
}

/// When the grace period ends with a transfer still open, the transfer is
/// reset (a client without length framing must not take the cut for the
/// end), and magpie exits with status 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grace_over_resets_what_is_open_and_exits_2() {
    let (mut child, mut client, _held) = draining_with_one_open_connection("300ms").await;
    let ended = within(
        "the cut at the end of the grace",
        read_until_closed(&mut client),
    )
    .await;
    match ended {
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        other => panic!("the cut connection was not reset: {other:?}"),
    }
    let status = within("magpie to exit", child.process.wait())
        .await
        .expect("wait for magpie");
    assert_eq!(status.code(), Some(2), "{}", child.log.join("\n"));
    child.wait_for_line("cut=1").await;
}

/// A second SIGTERM (or SIGINT) during the drain exits at once, status 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once_with_status_2() {
    let (mut child, client, _held) = draining_with_one_open_connection("1h").await;
    child.signal("-INT");
    let status = within("magpie to exit at the second signal", child.process.wait())
        .await
        .expect("wait for magpie");
    assert_eq!(status.code(), Some(2), "{}", child.log.join("\n"));
    drop(client);
}

/// From the first SIGTERM on `/readyz` answers 503 (a load balancer stops
/// sending new connections) while `/healthz` stays 200 until the exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_while_draining_and_healthz_stays_200() {
    let backends = RawBackends::start(&["echo"], Behaviour::GreetEcho).await;
    let file = TempFile::new(
        "magpie.yaml",
        &config_yaml_with_admin("127.0.0.1:0", "shutdown_grace: 1h\n", &backends.list),
    );
    let path = file.path.to_str().expect("a UTF-8 temp path");
    let mut child = Child::spawn(&["run", "--config", path]);
    let addr = child.listen_addr().await;
    let admin = child.admin_addr().await;
    assert_eq!(admin_get(admin, "/readyz").await.0, 200);
    let mut client = connect(addr).await;
    assert_eq!(read_greeting(&mut client).await, "echo");
    child.signal("-TERM");
    child.wait_for_line("no new connections").await;
    let (status, body) = admin_get(admin, "/readyz").await;
    assert_eq!(
        (status, body.trim()),
        (503, "not ready: draining (shutting down)")
    );
    assert_eq!(admin_get(admin, "/healthz").await.0, 200);
    child.signal("-INT");
    within("magpie to exit at the second signal", child.process.wait())
        .await
        .expect("wait for magpie");
    drop(client);
}

/// A connection accepted just before the drain, whose request comes after
/// it began, is answered: its request was on its way, not refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_accepted_before_the_drain_gets_its_first_request_answered() {
    let backends = HttpBackends::start(&["a"]).await;
    // An address of its own: once magpie frees its port, another test's
    // `127.0.0.1:0` listener may take it at once, and connects that it
    // answers would hold this test past the grace.
    let listen = "127.0.0.9:0";
    let magpie = Magpie::start(&config_yaml(listen, "mode: http\n", &backends.list)).await;
    let accepted = magpie.metric("magpie_connections_accepted_total", &[]);
    let stream = connect(magpie.addr).await;
    within("magpie to accept the connection", async {
        while magpie.metric("magpie_connections_accepted_total", &[]) == accepted {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    magpie.begin_shutdown();
    within("the listener to close", async {
        while TcpStream::connect(magpie.addr).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let body = http_exchange_closing(stream, Some("late")).await;
    assert_eq!(backend_of(&body), "a");
    magpie.stop().await;
}
