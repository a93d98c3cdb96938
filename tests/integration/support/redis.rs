//! A real `redis-server` on a free loopback port, stopped when dropped.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::within;

pub struct RedisServer {
    pub addr: SocketAddr,
    process: Option<Child>,
}

impl RedisServer {
    /// Starts `redis-server` (the Debian package `redis-server`) on a free
    /// port, with nothing written to disk, and waits until it answers PING.
    pub async fn start() -> RedisServer {
        let port = super::free_port();
        let mut server = RedisServer {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            process: None,
        };
        server.restart().await;
        server
    }

    /// Starts it (again) on the same port.
    pub async fn restart(&mut self) {
        let process = Command::new("redis-server")
            .args(["--port", &self.addr.port().to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run redis-server ({e}); install the Debian package redis-server")
            });
        self.process = Some(process);
        let addr = self.addr;
        within("redis-server to answer PING", async move {
            loop {
                if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await
                    && s.write_all(b"PING\r\n").await.is_ok()
                {
                    let mut reply = [0u8; 7];
                    if s.read_exact(&mut reply).await.is_ok() && &reply == b"+PONG\r\n" {
                        return;
                    }
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
        .await;
    }

    /// Kills it at once (no shutdown, like a crash).
    pub fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
