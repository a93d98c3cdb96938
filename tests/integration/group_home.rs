//! `key.group_choices`: a group without a pin takes the least busy of its
//! first candidates (by requests awaiting their first byte of body), and
//! that backend stays the group's home: its later conversations go there,
//! also through another magpie sharing the redis store.

use crate::support::*;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use magpie_core::key::text_key;

fn by_tenant(extra: &str) -> String {
    format!(
        "mode: http\nkey:\n  from: header\n  header: x-session-id\n  group: {{header: x-tenant-id}}\n  group_choices: 2\nsessions:\n  ttl: 10m\n{extra}"
    )
}

/// A request of tenant `queued` that its first candidate holds with no byte
/// of body (an engine's queued request): the client, the response, and
/// that backend, once magpie counts it as awaiting.
async fn hold_quiet(magpie: &Magpie) -> (KeepAlive, hyper::Response<Incoming>, String) {
    let busy = magpie.candidates(text_key(b"queued"))[0].clone();
    let (client, response) = hold(magpie, "queued", "q", &busy, 1).await;
    (client, response, busy)
}

/// A request of `session` in `tenant` that `at` holds with no byte of body,
/// once magpie counts `n` requests awaiting there.
async fn hold(
    magpie: &Magpie,
    tenant: &str,
    session: &str,
    at: &str,
    n: u64,
) -> (KeepAlive, hyper::Response<Incoming>) {
    let mut client = KeepAlive::connect(magpie.addr).await;
    let request = get("/quiet")
        .header("x-tenant-id", tenant)
        .header("x-session-id", session)
        .body(Full::default())
        .expect("a request");
    let response = client.start(request).await;
    assert_eq!(response.status(), 200);
    awaiting(magpie, at, n).await;
    (client, response)
}

async fn awaiting(magpie: &Magpie, backend: &str, n: u64) {
    within("the awaiting count", async {
        while magpie.backend(backend).awaiting() != n {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// The `nth` tenant (from 0) whose first candidate is `first`.
fn tenant_on(magpie: &Magpie, first: &str, nth: usize) -> String {
    (0..500)
        .map(|i| format!("tenant-{i}"))
        .filter(|t| magpie.candidates(text_key(t.as_bytes()))[0] == first)
        .nth(nth)
        .expect("a tenant with that first candidate")
}

/// A tenant whose first two candidates are `first`, then `second`.
fn tenant_with(magpie: &Magpie, first: &str, second: &str) -> String {
    (0..2000)
        .map(|i| format!("pair-{i}"))
        .find(|t| {
            let c = magpie.candidates(text_key(t.as_bytes()));
            c[0] == first && c[1] == second
        })
        .expect("a tenant with those first two candidates")
}

/// The backend of `names` that is neither `a` nor `b`.
fn other_than<'a>(names: &[&'a str], a: &str, b: &str) -> &'a str {
    (names.iter().copied())
        .find(|n| *n != a && *n != b)
        .expect("a third backend")
}

/// A fast request of `session` in `tenant`: the backend that served it.
async fn ask(client: &mut KeepAlive, tenant: &str, session: &str) -> String {
    let request = get("/")
        .header("x-tenant-id", tenant)
        .header("x-session-id", session);
    client
        .served_by(request.body(Full::default()).expect("a request"))
        .await
}

/// The busy first candidate sends a new group to its second; the group's
/// later conversations follow it there, also once the first is idle again,
/// and `/route` and the metrics say so. With nothing awaiting, a new group
/// goes to the candidate that holds fewer groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_group_takes_the_less_busy_of_two_and_keeps_it() {
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let yaml = config_yaml_with_admin("127.0.0.1:0", &by_tenant(""), &backends.pairs());
    let magpie = Magpie::start(&yaml).await;
    let admin = magpie.admin.expect("admin is on");
    let (_quiet, response, busy) = hold_quiet(&magpie).await;
    let (_, metrics) = admin_get(admin, "/metrics").await;
    let gauge = "magpie_backend_requests_awaiting_first_byte";
    let on_busy = format!("backend=\"{busy}\"");
    assert_eq!(metric_sum(&metrics, gauge, &[&on_busy]), 1.0, "{metrics}");
    assert_eq!(metric_sum(&metrics, gauge, &[]), 1.0, "{metrics}");

    let tenant = tenant_on(&magpie, &busy, 0);
    let second = magpie.candidates(text_key(tenant.as_bytes()))[1].clone();
    let mut client = KeepAlive::connect(magpie.addr).await;
    assert_eq!(ask(&mut client, &tenant, "c-1").await, second);
    assert_eq!(ask(&mut client, &tenant, "c-2").await, second, "its home");

    // The busy backend answers; the group stays where it was placed.
    backends.release(1);
    let body = within("the quiet body", response.into_body().collect()).await;
    let text = body.expect("its body").to_bytes();
    assert_eq!(text, format!("late from {busy}\n").as_bytes());
    awaiting(&magpie, &busy, 0).await;
    assert_eq!(ask(&mut client, &tenant, "c-3").await, second);
    let (_, route) = admin_get(admin, &format!("/route?key=c-4&group={tenant}")).await;
    assert!(
        route.contains(&format!("\"home\": \"{second}\"")),
        "{route}"
    );
    assert!(
        route.contains(&format!("\"chosen\": \"{second}\"")),
        "{route}"
    );
    let second_rank = ["rank=\"2\""];
    let placements = magpie.backend_metric("magpie_group_placements_total", &second, &second_rank);
    assert_eq!(placements, 3);
    // Nothing awaits now: a new group goes to the candidate that served
    // fewer groups lately. The busy one and the second served one each, the
    // third none.
    let third = other_than(&["a", "b", "c"], &busy, &second);
    assert_eq!(
        magpie.backend_metric("magpie_backend_groups_seen", third, &[]),
        0
    );
    let fresh = tenant_with(&magpie, &second, third);
    assert_eq!(ask(&mut client, &fresh, "f-1").await, third);
    magpie.stop().await;
}

/// Two magpies in front of `backends`, sharing pins and homes in `redis`,
/// once both are connected to it.
async fn sharing(redis: &RedisServer, backends: &HyperBackends) -> [Magpie; 2] {
    let store = format!(
        "  store: redis\n  redis: {{addr: \"{}\", timeout: 500ms}}\nreload:\n  watch: false\n",
        redis.addr
    );
    let settings = by_tenant("").replace("  ttl: 10m\n", &format!("  ttl: 10m\n{store}"));
    let magpies = [
        Magpie::with(&settings, &backends.pairs()).await,
        Magpie::with(&settings, &backends.pairs()).await,
    ];
    for m in &magpies {
        m.store_connected().await;
    }
    magpies
}

/// New groups' requests marked in the store as awaiting at `backend`.
async fn marks_on(redis: &RedisServer, backend: &str) -> i64 {
    marks_in(redis, "cold", backend).await
}

/// The marks in the store's set `kind` (`cold`, `first`) of `backend`.
async fn marks_in(redis: &RedisServer, kind: &str, backend: &str) -> i64 {
    let key = format!("magpie:{kind}:{backend}");
    match redis.command(&[b"ZCARD", key.as_bytes()]).await {
        redis::Value::Int(n) => n,
        other => panic!("ZCARD answered {other:?}"),
    }
}

async fn no_marks(redis: &RedisServer, kind: &str, backend: &str) {
    within("the marks to go", async {
        while marks_in(redis, kind, backend).await != 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// Through a shared redis store: a new group's request that awaits its
/// first byte on one magpie keeps the other magpie's new groups off that
/// backend until it answers, the home either one chose is where both send
/// the group's conversations, and new groups go where the fleet placed
/// fewer homes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn magpies_sharing_a_store_agree_on_homes_and_see_each_others_new_groups() {
    let redis = RedisServer::start().await;
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let magpies = sharing(&redis, &backends).await;
    let (_quiet, response, busy) = hold_quiet(&magpies[0]).await;
    assert_eq!(marks_on(&redis, &busy).await, 1);
    // Magpie 1 has nothing in flight, but sees magpie 0's new group.
    let tenant = tenant_on(&magpies[1], &busy, 0);
    let second = magpies[1].candidates(text_key(tenant.as_bytes()))[1].clone();
    let mut other = KeepAlive::connect(magpies[1].addr).await;
    assert_eq!(ask(&mut other, &tenant, "c-1").await, second);
    let mut first = KeepAlive::connect(magpies[0].addr).await;
    assert_eq!(
        ask(&mut first, &tenant, "c-2").await,
        second,
        "the shared home"
    );
    assert_eq!(
        ask(&mut first, &tenant, "c-1").await,
        second,
        "the shared pin"
    );

    // Its first byte removes the mark: new groups take the busy one again.
    backends.release(1);
    within("the quiet body", response.into_body().collect())
        .await
        .expect("its body");
    within("the mark to go", async {
        while marks_on(&redis, &busy).await != 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // The store counts homes for the whole fleet: the busy and the second
    // backend hold one each (the queued tenant, and this one), the third
    // none.
    let third = other_than(&["a", "b", "c"], &busy, &second);
    let even = tenant_with(&magpies[1], &busy, &second);
    assert_eq!(ask(&mut other, &even, "e-1").await, busy);
    let fewer = tenant_with(&magpies[1], &busy, third);
    assert_eq!(ask(&mut other, &fewer, "f-1").await, third);
    for m in magpies {
        m.stop().await;
    }
}

/// Two groups with homes on `x` and `y`, placed through `magpie` by fast
/// requests: the tenants.
async fn homes_on(magpie: &Magpie, x: &str, y: &str) -> (String, String) {
    let mut client = KeepAlive::connect(magpie.addr).await;
    let g = tenant_on(magpie, x, 0);
    assert_eq!(ask(&mut client, &g, "g-1").await, x);
    let h = tenant_on(magpie, y, 0);
    assert_eq!(ask(&mut client, &h, "h-1").await, y);
    (g, h)
}

/// One magpie ranks a new group's candidates by conversations' first
/// requests awaiting before requests awaiting of any kind: a new prompt in
/// a group may bring its head to prefill again, a later turn does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_group_avoids_a_conversations_first_request_before_later_turns() {
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let magpie = Magpie::with(&by_tenant(""), &backends.pairs()).await;
    let (g, h) = homes_on(&magpie, "a", "b").await;
    // On a: a new conversation of g. On b: two later turns of h's.
    let _opening = hold(&magpie, &g, "g-2", "a", 1).await;
    let _turn = hold(&magpie, &h, "h-1", "b", 1).await;
    let _again = hold(&magpie, &h, "h-1", "b", 2).await;
    let load = |name: &str| magpie.backend(name).awaiting_openings();
    assert_eq!((load("a"), load("b")), (1, 0));
    let fresh = tenant_with(&magpie, "a", "b");
    let mut client = KeepAlive::connect(magpie.addr).await;
    assert_eq!(ask(&mut client, &fresh, "f-1").await, "b");
    backends.release(3);
    magpie.stop().await;
}

/// Through a shared store, a conversation's first request in a group with
/// a home is marked where it awaits, so another magpie's new groups keep
/// off that backend as the first one's would; the mark goes at the first
/// byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn magpies_sharing_a_store_see_each_others_first_requests() {
    let redis = RedisServer::start().await;
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let magpies = sharing(&redis, &backends).await;
    let (g, _) = homes_on(&magpies[0], "a", "b").await;
    for backend in ["a", "b"] {
        no_marks(&redis, "cold", backend).await;
        no_marks(&redis, "first", backend).await;
    }
    let (_client, response) = hold(&magpies[0], &g, "g-2", "a", 1).await;
    assert_eq!(marks_in(&redis, "first", "a").await, 1);
    assert_eq!(marks_in(&redis, "cold", "a").await, 0);
    // Magpie 1 has nothing in flight; a and b hold a home each.
    let fresh = tenant_with(&magpies[1], "a", "b");
    let mut other = KeepAlive::connect(magpies[1].addr).await;
    assert_eq!(ask(&mut other, &fresh, "f-1").await, "b");

    backends.release(1);
    within("the quiet body", response.into_body().collect())
        .await
        .expect("its body");
    no_marks(&redis, "first", "a").await;
    for m in magpies {
        m.stop().await;
    }
}
