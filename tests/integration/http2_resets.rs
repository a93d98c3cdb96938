//! HTTP/2 streams reset by the client after magpie dispatched them: each is
//! counted, and a connection that resets more than
//! `limits.h2_resets_per_second` within a second gets GOAWAY.

use std::time::Duration;

use http_body_util::Full;

use crate::support::*;

/// Waits (within the test's patience) until `what()` holds.
async fn until(label: &str, what: impl Fn() -> bool) {
    within(label, async {
        while !what() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_reset_after_dispatch_are_counted_and_too_many_get_goaway() {
    // A backend that never answers: every request stays dispatched until
    // the client resets its stream.
    let up = Upstream::start("a", Answer::Never).await;
    let settings = "mode: http\nkey:\n  from: header\n  header: x-session-id\nlimits: {h2_resets_per_second: 3}\n";
    let magpie = Magpie::with(settings, &[up.pair()]).await;
    let (mut sender, conn) = h2_connect(magpie.addr).await;
    for n in 1..=4u64 {
        let request = hyper::Request::get("http://magpie/")
            .header("x-session-id", format!("s-{n}"))
            .body(Full::<bytes::Bytes>::default())
            .expect("a request");
        let pending = tokio::spawn(sender.send_request(request));
        // The request reached the backend: magpie dispatched it.
        up.wait_accepted(n).await;
        // Dropping the response future resets the stream.
        pending.abort();
        until("the reset to be counted", || {
            magpie.metric("magpie_http2_client_resets_total", &[]) >= n
        })
        .await;
        if n <= 3 {
            assert_eq!(
                magpie.metric("magpie_http2_reset_goaways_total", &[]),
                0,
                "within the budget at {n}"
            );
        }
    }
    until("the GOAWAY to be counted", || {
        magpie.metric("magpie_http2_reset_goaways_total", &[]) == 1
    })
    .await;
    // GOAWAY with no stream left open: the client's connection ends.
    within("magpie to close the connection", conn)
        .await
        .expect("the connection task")
        .ok();
    magpie.stop().await;
}
