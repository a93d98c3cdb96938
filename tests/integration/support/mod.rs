//! What every integration test needs: backends on `127.0.0.1:0`, magpie
//! started in-process from a YAML string, a small HTTP client, and the built
//! binary.
//!
//! Every wait that could hang goes through [`within`], so a broken proxy makes
//! a test fail with a message instead of stalling the suite.

#![allow(dead_code)]

mod admin;
mod backends;
mod client;
mod datagram;
mod dns;
mod engine;
pub mod http;
mod in_process;
mod process;
mod raw_backends;
mod redis;
mod tls;
mod tls_backends;
mod upstream;

pub use admin::*;
pub use backends::*;
pub use client::*;
pub use datagram::*;
pub use dns::*;
pub use engine::*;
pub use http::*;
pub use in_process::*;
pub use process::*;
pub use raw_backends::*;
pub use redis::*;
pub use tls::*;
pub use tls_backends::*;
pub use upstream::*;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// The safety net on every await that could hang.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Awaits `f`, failing the test with `what` if it takes longer than [`PATIENCE`].
pub async fn within<F: Future>(what: &str, f: F) -> F::Output {
    within_for(PATIENCE, what, f).await
}

/// [`within`] with an explicit limit.
pub async fn within_for<F: Future>(limit: Duration, what: &str, f: F) -> F::Output {
    match tokio::time::timeout(limit, f).await {
        Ok(out) => out,
        Err(_) => panic!("timed out after {limit:?}: {what}"),
    }
}

pub fn loopback(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

/// An address nobody listens on: bound to an ephemeral port, then released,
/// so connecting to it is refused.
pub fn dead_addr() -> SocketAddr {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port to learn a free one");
    listener
        .local_addr()
        .expect("a bound listener has an address")
}

/// A loopback port nothing listens on right now (for servers that must be
/// given a port, such as redis-server, or several addresses on one port).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `magpie check --config path`, run to its end.
pub fn magpie_check(path: &std::path::Path) -> std::process::Output {
    std::process::Command::new(magpie_bin())
        .args(["check", "--config"])
        .arg(path)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", magpie_bin()))
}
