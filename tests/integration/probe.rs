//! `magpie probe`, the built binary, against a real admin endpoint.

use std::time::Duration;

use crate::support::*;

/// Runs `magpie probe URL` and returns its exit code and stderr.
async fn probe(url: &str) -> (Option<i32>, String) {
    let out = within(
        "magpie probe to exit",
        tokio::process::Command::new(magpie_bin())
            .args(["probe", "--timeout", "2s", url])
            .env_remove("RUST_LOG")
            .output(),
    )
    .await
    .expect("run magpie probe");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_exits_0_on_2xx_and_1_on_anything_else() {
    let backends = HttpBackends::start(&["a"]).await;
    let magpie = Magpie::start(&config_yaml_with_admin("127.0.0.1:0", "", &backends.list)).await;
    let admin = magpie.admin.expect("admin is on");

    let (code, stderr) = probe(&format!("http://{admin}/readyz")).await;
    assert_eq!(code, Some(0), "stderr: {stderr}");
    assert!(stderr.is_empty(), "a success prints nothing: {stderr}");

    let (code, stderr) = probe(&format!("http://{admin}/nope")).await;
    assert_eq!(code, Some(1), "stderr: {stderr}");
    assert!(stderr.contains("404"), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");

    let closed = dead_addr();
    let (code, stderr) = probe(&format!("http://{closed}/readyz")).await;
    assert_eq!(code, Some(1), "stderr: {stderr}");
    assert!(stderr.contains("cannot connect"), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");

    let (code, stderr) = probe(&format!("https://{admin}/readyz")).await;
    assert_eq!(code, Some(1), "stderr: {stderr}");
    assert!(stderr.contains("no TLS"), "stderr: {stderr}");

    magpie.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_gives_up_after_its_timeout() {
    // A listener that accepts (in the kernel's backlog) and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = silent
        .local_addr()
        .expect("a bound listener has an address");
    let started = std::time::Instant::now();
    let out = within(
        "magpie probe to time out",
        tokio::process::Command::new(magpie_bin())
            .args(["probe", "--timeout", "300ms", &format!("http://{addr}/")])
            .output(),
    )
    .await
    .expect("run magpie probe");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no answer within 300ms"),
        "stderr: {stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(silent);
}
