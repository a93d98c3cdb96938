//! For the `mode: udp` tests: UDP backends that answer each datagram with
//! `NAME:` and the datagram (a probe `ping` with `pong`; `twice` twice, back
//! to back; `burst N` with N answers of 1,200 bytes as fast as it can, then
//! `NAME:end` 200 ms later), and remember the addresses that sent to them;
//! and a client socket that sends and awaits answers.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

use super::within;

/// One UDP backend's state, shared with the test.
pub struct UdpBackend {
    pub name: String,
    pub addr: SocketAddr,
    /// Every address a datagram came from, in order (probes left out).
    pub peers: Mutex<Vec<SocketAddr>>,
    stop: CancellationToken,
    /// Fires once its socket is closed.
    closed: CancellationToken,
}

/// UDP echo backends; they stop when dropped.
pub struct UdpBackends {
    pub list: Vec<Arc<UdpBackend>>,
}

impl UdpBackends {
    /// Backends named `names`, on `ip` (port 0).
    pub async fn start(ip: &str, names: &[&str]) -> UdpBackends {
        let mut list = Vec::new();
        for name in names {
            let socket = UdpSocket::bind(format!("{ip}:0"))
                .await
                .expect("a backend socket");
            let backend = Arc::new(UdpBackend {
                name: name.to_string(),
                addr: socket.local_addr().expect("bound"),
                peers: Mutex::new(Vec::new()),
                stop: CancellationToken::new(),
                closed: CancellationToken::new(),
            });
            tokio::spawn(echo(socket, Arc::clone(&backend)));
            list.push(backend);
        }
        UdpBackends { list }
    }

    /// (name, address) pairs, for configs.
    pub fn pairs(&self) -> Vec<(String, SocketAddr)> {
        self.list.iter().map(|b| (b.name.clone(), b.addr)).collect()
    }

    pub fn get(&self, name: &str) -> &Arc<UdpBackend> {
        self.list
            .iter()
            .find(|b| b.name == name)
            .unwrap_or_else(|| panic!("no backend {name}"))
    }

    /// Closes one backend's socket, and waits until it is closed: its port
    /// is closed from now on, and nothing it received is answered any more.
    pub async fn kill(&self, name: &str) {
        let b = self.get(name);
        b.stop.cancel();
        within("the backend's socket to close", b.closed.cancelled()).await;
    }
}

impl Drop for UdpBackends {
    fn drop(&mut self) {
        for b in &self.list {
            b.stop.cancel();
        }
    }
}

async fn echo(socket: UdpSocket, b: Arc<UdpBackend>) {
    answer(&socket, &b).await;
    drop(socket);
    b.closed.cancel();
}

/// Answers `socket`'s datagrams until `b` is stopped.
async fn answer(socket: &UdpSocket, b: &UdpBackend) {
    let mut buf = vec![0u8; 65_536];
    loop {
        let (n, from) = tokio::select! {
            _ = b.stop.cancelled() => return,
            got = socket.recv_from(&mut buf) => match got {
                Ok(got) => got,
                Err(_) => continue,
            },
        };
        let answer = if &buf[..n] == b"ping" {
            b"pong".to_vec()
        } else {
            b.peers.lock().expect("not poisoned").push(from);
            [format!("{}:", b.name).as_bytes(), &buf[..n]].concat()
        };
        if let Some(burst) = buf[..n].strip_prefix(b"burst ") {
            let count: usize = String::from_utf8_lossy(burst).trim().parse().unwrap_or(0);
            send_burst(socket, from, count, &b.name).await;
            continue;
        }
        if &buf[..n] == b"twice" {
            let _ = socket.send_to(&answer, from).await;
        }
        let _ = socket.send_to(&answer, from).await;
    }
}

/// `count` answers of 1,200 bytes to `to` as fast as the socket takes them,
/// then `NAME:end` 200 ms later (a datagram that carries the receiver's
/// count of drops after the burst).
async fn send_burst(socket: &UdpSocket, to: SocketAddr, count: usize, name: &str) {
    let answer = vec![b'b'; 1200];
    for _ in 0..count {
        let _ = socket.send_to(&answer, to).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let _ = socket.send_to(format!("{name}:end").as_bytes(), to).await;
}

/// A client socket on `ip` (port 0).
pub async fn client_on(ip: &str) -> UdpSocket {
    UdpSocket::bind(format!("{ip}:0"))
        .await
        .expect("a client socket")
}

/// Sends `datagram` to `to` from `socket` and returns the answer's text and
/// the address it came from.
pub async fn exchange(socket: &UdpSocket, to: SocketAddr, datagram: &[u8]) -> (String, SocketAddr) {
    socket.send_to(datagram, to).await.expect("sent");
    let mut buf = vec![0u8; 65_536];
    let (n, from) = within("an answer through magpie", socket.recv_from(&mut buf))
        .await
        .expect("received");
    (String::from_utf8_lossy(&buf[..n]).into_owned(), from)
}

/// The name of the backend that answered (the text before `:`).
pub fn answered_by(answer: &str) -> &str {
    answer.split(':').next().unwrap_or("")
}
