//! A real `redis-server` on a free loopback port, stopped when dropped, and
//! two magpies sharing it (`sessions.store: redis`).

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Magpie, TempFile, config_yaml, within};

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
            // `DEBUG SLEEP` stalls the server, as a busy host would.
            .args(["--enable-debug-command", "local"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run redis-server ({e}); install the Debian package redis-server (script/test does)")
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

    /// Runs one command on a fresh connection (to write what magpie must
    /// cope with, or to read what it wrote).
    pub async fn command(&self, args: &[&[u8]]) -> redis::Value {
        let client = redis::Client::open(format!("redis://{}/", self.addr)).expect("a redis url");
        within("a redis command", async {
            // No response timeout but `within`'s: `DEBUG SLEEP` answers late.
            let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
            let mut c = client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .expect("a connection to redis-server");
            let mut cmd = redis::cmd(std::str::from_utf8(args[0]).expect("a command name"));
            for a in &args[1..] {
                cmd.arg(*a);
            }
            cmd.query_async(&mut c).await.expect("the command runs")
        })
        .await
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

/// Settings of `mode: http` keyed by `x-session-id`, pins kept `ttl` unused
/// and shared in the store at `redis` (50 ms timeout), and `extra` lines.
pub fn store_settings_ttl(redis: SocketAddr, ttl: &str, extra: &str) -> String {
    format!(
        "mode: http\nkey:\n  from: header\n  header: x-session-id\nreload:\n  watch: false\nsessions:\n  ttl: {ttl}\n  store: redis\n  redis: {{addr: \"{redis}\", timeout: 50ms}}\n{extra}"
    )
}

/// [`store_settings_ttl`] with a 10-minute TTL.
pub fn store_settings(redis: SocketAddr, extra: &str) -> String {
    store_settings_ttl(redis, "10m", extra)
}

/// [`store_settings`] under a queue (8 requests in flight a backend), with
/// conversations grouped by how they open (`key.group: conversation`): a
/// chat body is read for its opening and whether it is a later turn.
pub fn store_settings_by_opening(redis: SocketAddr) -> String {
    let queue = "queue:\n  max_inflight: 8\n  timeout: 30s\n";
    store_settings(redis, queue).replace(
        "header: x-session-id\n",
        "header: x-session-id\n  group: conversation\n",
    )
}

/// The key magpie binds `session` under in the store (default prefix).
pub fn store_key(session: &str) -> Vec<u8> {
    format!(
        "magpie:{:016x}",
        magpie_core::key::text_key(session.as_bytes())
    )
    .into_bytes()
}

/// Two magpies on one store, each from its own file.
pub struct Fleet {
    files: [TempFile; 2],
    pub magpies: [Magpie; 2],
}

impl Fleet {
    pub async fn start(settings: &str, backends: &[(String, SocketAddr)]) -> Fleet {
        let files = [0, 1].map(|_| {
            TempFile::new(
                "magpie.yaml",
                &config_yaml("127.0.0.1:0", settings, backends),
            )
        });
        let magpies = [
            Magpie::start_file(&files[0].path).await,
            Magpie::start_file(&files[1].path).await,
        ];
        for m in &magpies {
            m.store_connected().await;
        }
        Fleet { files, magpies }
    }

    pub async fn reload(&self, settings: &str, backends: &[(String, SocketAddr)]) {
        for (file, magpie) in self.files.iter().zip(&self.magpies) {
            std::fs::write(&file.path, config_yaml("127.0.0.1:0", settings, backends))
                .expect("rewrite");
            (magpie.probe.reloader(file.path.clone()))
                .reload(true)
                .await
                .expect("the reload applies");
        }
    }
}

/// Magpie `m`'s round trips to its shared store that came to `result`
/// (`ok`, `error`, `timeout`, `skipped`).
pub fn store_ops(m: &Magpie, result: &str) -> u64 {
    let result = format!("result=\"{result}\"");
    m.metric("magpie_session_store_operations_total", &[&result])
}
