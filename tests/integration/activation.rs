//! systemd's socket activation through the real binary: magpie takes the
//! listening socket it is handed (`LISTEN_FDS`, fd 3) instead of binding
//! its own, so a restart behind a socket that outlives it refuses no
//! connection: what comes in between waits in the socket's backlog and is
//! served by the next magpie. A handed socket that the config does not
//! name is a start error. Mode udp takes a UDP socket the same way: what is
//! sent between two magpies waits in its receive buffer.

use std::net::TcpListener;

use tokio::net::TcpStream;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_behind_an_inherited_socket_refuses_no_connection() {
    let backends = RawBackends::start(&["a"], Behaviour::GreetEcho).await;
    let socket = TcpListener::bind("127.0.0.1:0").expect("bind a socket to hand over");
    let addr = socket.local_addr().expect("its address");
    let yaml = config_yaml(&addr.to_string(), "mode: tcp\n", &backends.list);
    let file = TempFile::new("magpie.yaml", &yaml);
    let path = file.path.to_str().expect("a UTF-8 temp path");
    let args = ["run", "--config", path];

    let mut first = Child::spawn_activated(&socket, &args);
    assert_eq!(
        first.listen_addr().await,
        addr,
        "the handed socket, not a new one"
    );
    let mut client = connect(addr).await;
    assert_eq!(read_greeting(&mut client).await, "a");
    drop(client);
    first.signal("-TERM");
    let status = first.process.wait().await.expect("the first magpie exits");
    assert!(status.success(), "{status}: {}", first.log.join("\n"));

    // No magpie runs: connections wait in the socket's backlog.
    let mut waiting = Vec::new();
    for _ in 0..5 {
        let stream = TcpStream::connect(addr).await;
        waiting.push(stream.expect("a connection between two magpies is not refused"));
    }
    let mut second = Child::spawn_activated(&socket, &args);
    assert_eq!(second.listen_addr().await, addr);
    for stream in &mut waiting {
        assert_eq!(
            read_greeting(stream).await,
            "a",
            "served by the next magpie"
        );
    }
    drop(waiting);
    second.signal("-TERM");
    let status = second
        .process
        .wait()
        .await
        .expect("the second magpie exits");
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_socket_the_config_does_not_name_is_a_start_error() {
    let backends = RawBackends::start(&["a"], Behaviour::GreetEcho).await;
    let socket = TcpListener::bind("127.0.0.1:0").expect("bind a socket to hand over");
    let addr = socket.local_addr().expect("its address");
    // Another address of the loopback net: no socket of it is handed over.
    let yaml = config_yaml("127.0.0.2:0", "mode: tcp\n", &backends.list);
    let file = TempFile::new("magpie.yaml", &yaml);
    let path = file.path.to_str().expect("a UTF-8 temp path");
    let mut child = Child::spawn_activated(&socket, &["run", "--config", path]);
    let line = child.wait_for_line("LISTEN_FDS passed sockets on").await;
    assert!(line.contains(&addr.to_string()), "{line}");
    let status = child.process.wait().await.expect("magpie exits");
    assert_eq!(status.code(), Some(1), "{}", child.log.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_udp_takes_a_handed_datagram_socket_and_what_waits_in_it() {
    let backends = UdpBackends::start("127.0.0.1", &["a"]).await;
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind a socket to hand over");
    let addr = socket.local_addr().expect("its address");
    let yaml = config_yaml(&addr.to_string(), "mode: udp\n", &backends.pairs());
    let file = TempFile::new("magpie.yaml", &yaml);
    let path = file.path.to_str().expect("a UTF-8 temp path");
    // Sent before any magpie runs: it waits in the socket.
    let client = client_on("127.0.0.1").await;
    client.send_to(b"early", addr).await.expect("sent");
    let mut child = Child::spawn_activated(&socket, &["run", "--config", path]);
    assert_eq!(child.listen_addr().await, addr, "the handed socket");
    let mut buf = [0u8; 64];
    let (n, from) = within("the early datagram's answer", client.recv_from(&mut buf))
        .await
        .expect("received");
    assert_eq!((&buf[..n], from), (&b"a:early"[..], addr));
    let (answer, _) = exchange(&client, addr, b"later").await;
    assert_eq!(answer, "a:later");
    child.signal("-TERM");
    let status = child.process.wait().await.expect("magpie exits");
    assert!(status.success(), "{status}: {}", child.log.join("\n"));
}
