//! Under a `queue`, a conversation's first request goes where it costs
//! least: the prefill work each backend holds plus what it would still have
//! to compute of the request, less its group's head where that group was
//! served lately (its own work counted again per request waiting there). A
//! long shared head keeps a conversation with its group's cache against
//! some load; a tiny one never outweighs it.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use hyper::body::Incoming;
use magpie_core::key::group::{GroupBy, body_group_key};
use magpie_core::key::text_key;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;

const SOONEST: &str = "mode: http\nkey:\n  from: header\n  header: x-session-id\n  group: system\nsessions:\n  ttl: 10m\nqueue:\n  max_inflight: 8\n  timeout: 30s\n";

/// The session [`hold_work`] holds work at `backend` with.
fn busy_session(magpie: &Magpie, backend: &str) -> String {
    let sessions = magpie.sessions_of(backend, "busy", 1);
    sessions
        .into_iter()
        .next()
        .expect("a session of that backend")
}

/// Holds `tokens` of prefill work at `backend`: a request whose answer's
/// head has come but no byte of its body (`/quiet`), of a session whose
/// primary is `backend` (pinned there by its first request, which went
/// there while nothing was held), 4 bytes a token.
async fn hold_work(
    magpie: &Magpie,
    backend: &str,
    tokens: usize,
) -> (KeepAlive, Response<Incoming>) {
    hold_turn(magpie, &busy_session(magpie, backend), tokens * 4).await
}

/// A turn of `session` with a body of `bytes` whose answer's head has come
/// but no byte of its body (`/quiet`): its work stays held.
async fn hold_turn(
    magpie: &Magpie,
    session: &str,
    bytes: usize,
) -> (KeepAlive, Response<Incoming>) {
    let request = hyper::Request::post("/quiet")
        .header("host", "magpie")
        .header("x-session-id", session)
        .body(Full::new(Bytes::from(vec![b'x'; bytes])))
        .expect("a request");
    let mut client = KeepAlive::connect(magpie.addr).await;
    let response = client.start(request).await;
    assert_eq!(response.status(), 200);
    (client, response)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_goes_where_its_first_token_comes_soonest() {
    let backends = HyperBackends::start(&["a", "b"]).await;
    let magpie = Magpie::with(SOONEST, &backends.pairs()).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let prefill = |b: &str| magpie.backend_metric("magpie_backend_prefill_tokens", b, &[]);

    // An agent with a head of 2,000 tokens: its first conversation goes to
    // its group's primary (nothing is cached anywhere, no work is held).
    let head = "h".repeat(8000);
    let long = |user: &str| chat_body(&head, user);
    let group = body_group_key(long("x").as_bytes(), &GroupBy::System).expect("a group");
    let order = magpie.candidates(group);
    assert_eq!(client.post_json(&long("one"), Some("one")).await, order[0]);
    // The primary holds 1,000 tokens of work: 1,000 + a few there against
    // 2,000 elsewhere, where the head is not cached. It stays.
    let held = hold_work(&magpie, &order[0], 1000).await;
    assert_eq!(prefill(&order[0]), 1000);
    assert_eq!(client.post_json(&long("two"), Some("two")).await, order[0]);
    // Another 2,000 held there (the same session's: 3,000 tokens less the
    // 1,000 its first left cached): the head no longer pays for the wait.
    let more = hold_work(&magpie, &order[0], 3000).await;
    assert_eq!(prefill(&order[0]), 3000);
    assert_eq!(
        client.post_json(&long("three"), Some("three")).await,
        order[1]
    );

    // A tiny head (one word) with a long first message: where its group was
    // served counts for almost nothing against the work held there.
    let tiny = |user: &str| chat_body("be brief", user);
    let document = "d".repeat(8000);
    let tiny_group = body_group_key(tiny("x").as_bytes(), &GroupBy::System).expect("a group");
    let tiny_order = magpie.candidates(tiny_group);
    let idle = (tiny_order.iter().find(|b| **b == order[1])).expect("both are candidates");
    assert_eq!(
        client.post_json(&tiny(&document), Some("four")).await,
        *idle
    );
    let placed = magpie.metric("magpie_queue_admitted_total", &["how=\"placed\""]);
    assert!(placed >= 1, "placed away from the table's first: {placed}");
    drop((held, more));
    backends.release(2);
    magpie.stop().await;
}

/// A first user message after `system` whose conversation's group
/// (`group: conversation`) has its first candidate at `magpie` elsewhere
/// than `backend`.
fn grouped_away(magpie: &Magpie, system: &str, backend: &str) -> String {
    (0..1000)
        .map(|i| format!("question {i}"))
        .find(|user| {
            let body = chat_body(system, user);
            let group = body_group_key(body.as_bytes(), &GroupBy::Conversation);
            magpie.candidates(group.expect("a group"))[0] != backend
        })
        .expect("a group of the other backend")
}

/// A conversation grouped by how it opens (`group: conversation`) shares
/// its system prompt with others of other groups: the engine that answered
/// one of them holds that prompt, and the next goes there, not to its own
/// group's primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_goes_where_its_system_prompt_was_answered_whatever_its_group() {
    let backends = HyperBackends::start(&["a", "b"]).await;
    let settings = SOONEST.replace("group: system", "group: conversation");
    let magpie = Magpie::with(&settings, &backends.pairs()).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let system = "s".repeat(8000);
    let first = client
        .post_json(&chat_body(&system, "one"), Some("one"))
        .await;
    let user = grouped_away(&magpie, &system, &first);
    assert_eq!(
        client
            .post_json(&chat_body(&system, &user), Some("two"))
            .await,
        first,
        "where its system prompt is cached"
    );
    magpie.stop().await;
}

/// What the store binds `session` to, once it binds it.
async fn bound(redis: &RedisServer, session: &str) -> String {
    within("the binding", async {
        loop {
            if let redis::Value::BulkString(name) =
                redis.command(&[b"GET", &store_key(session)]).await
            {
                return String::from_utf8(name).expect("UTF-8");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
}

/// A queue for two magpies sharing a store.
const QUEUE: &str = "queue:\n  max_inflight: 8\n  timeout: 30s\n";

/// [`pair`] with conversations grouped by how they open
/// ([`store_settings_by_opening`]).
async fn pair_by_opening() -> (RedisServer, HyperBackends, Fleet) {
    let redis = RedisServer::start().await;
    let backends = HyperBackends::start(&["a", "b"]).await;
    let fleet = Fleet::start(&store_settings_by_opening(redis.addr), &backends.pairs()).await;
    (redis, backends, fleet)
}

/// Two magpies sharing a store, under `queue`, in front of backends a and b.
async fn pair(queue: &str) -> (RedisServer, HyperBackends, Fleet) {
    let redis = RedisServer::start().await;
    let backends = HyperBackends::start(&["a", "b"]).await;
    let fleet = Fleet::start(&store_settings(redis.addr, queue), &backends.pairs()).await;
    (redis, backends, fleet)
}

/// Two magpies sharing a store, under a queue: a conversation's pin is
/// bound where its first request went (where its first token came soonest,
/// not the table's first), so its next turn through the other magpie goes
/// there too; a turn that spills off its pin moves the pin for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_magpies_bind_a_conversation_where_it_was_placed_and_moved() {
    let queue = "queue:\n  max_inflight: 8\n  max_prefill_tokens: 2000\n  affinity_wait: 0s\n  timeout: 30s\n";
    let (redis, backends, fleet) = pair(queue).await;
    let [one, two] = &fleet.magpies;
    let session = "conversation";
    let order = one.candidates(text_key(session.as_bytes()));
    let mut via_one = KeepAlive::connect(one.addr).await;
    let mut via_two = KeepAlive::connect(two.addr).await;
    // The table's first holds 1,000 tokens of work: the conversation's
    // first request (no work) goes to the other, and is bound there.
    let first = hold_work(one, &order[0], 1000).await;
    assert_eq!(via_one.post_json("{}", Some(session)).await, order[1]);
    assert_eq!(bound(&redis, session).await, order[1]);
    // Its next turn, through the other magpie, follows its pin.
    assert_eq!(via_two.post_json("{}", Some(session)).await, order[1]);
    // Its pin's backend is full (3,000 tokens held through this magpie,
    // 2,000 the limit): a turn spills to the first, which has room, and the
    // pin moves there.
    let second = hold_work(two, &order[1], 3000).await;
    assert_eq!(via_two.post_json("{}", Some(session)).await, order[0]);
    within("the pin to move", async {
        while bound(&redis, session).await != order[0] {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    // The other magpie reads the move: the next turn goes there too.
    assert_eq!(via_one.post_json("{}", Some(session)).await, order[0]);
    drop((first, second));
    backends.release(1);
}

/// A backend's prefill rate is learned from its answers (their work over the
/// time until each one's first byte), shown once eight answers came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backends_prefill_rate_is_learned_from_its_answers() {
    let backends = HyperBackends::start(&["a"]).await;
    let magpie = Magpie::with(SOONEST, &backends.pairs()).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let rate = || {
        let labels = ["backend=\"a\""];
        magpie.metric_f64("magpie_backend_prefill_rate_tokens_per_second", &labels)
    };
    let document = "d".repeat(4000);
    for i in 0..8 {
        assert_eq!(rate(), 0.0, "not before eight answers");
        let session = format!("s{i}");
        client
            .post_json(&chat_body("s", &document), Some(&session))
            .await;
    }
    assert!(rate() > 0.0, "learned: {}", rate());
}

/// Two magpies sharing a store, under a queue, count each other's work: a
/// new conversation through one goes past the engine the other filled, and
/// the work stops counting once its first byte came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_magpies_count_each_others_work() {
    let (_redis, backends, fleet) = pair(QUEUE).await;
    let [one, two] = &fleet.magpies;
    let session = "fresh";
    let order = two.candidates(text_key(session.as_bytes()));
    let fleet_work = |b: &str| two.backend_metric("magpie_backend_fleet_prefill_tokens", b, &[]);
    let held = hold_work(one, &order[0], 1000).await;
    counted(fleet_work, &order[0], 1000).await;
    let mut client = KeepAlive::connect(two.addr).await;
    assert_eq!(client.post_json("{}", Some(session)).await, order[1]);
    drop(held);
    backends.release(1);
    counted(fleet_work, &order[0], 0).await;
}

/// A conversation that opens through one magpie right after the other
/// placed one counts that work at once, read with its own lookup, not a
/// period later: the binding that placed it wrote its magpie's work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_request_reads_the_work_the_other_magpie_just_placed() {
    let (redis, backends, fleet) = pair(QUEUE).await;
    let [one, two] = &fleet.magpies;
    let session = "fresh";
    let order = two.candidates(text_key(session.as_bytes()));
    let held = hold_work(one, &order[0], 1000).await;
    bound(&redis, &busy_session(one, &order[0])).await;
    let mut client = KeepAlive::connect(two.addr).await;
    assert_eq!(client.post_json("{}", Some(session)).await, order[1]);
    let fleet_work = two.backend_metric("magpie_backend_fleet_prefill_tokens", &order[0], &[]);
    assert_eq!(fleet_work, 1000);
    drop(held);
    backends.release(1);
}

/// Every pin lookup writes the work its magpie holds, not only a binding
/// or the share every period: a later turn through one magpie (whose
/// answer binds nothing) carries the work held there to the store, and a
/// new conversation through the other counts it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_turns_lookup_writes_the_work_its_magpie_holds() {
    let (redis, backends, fleet) = pair(QUEUE).await;
    let [one, two] = &fleet.magpies;
    let order = two.candidates(text_key(b"fresh"));
    let busy = busy_session(one, &order[0]);
    let mut via_one = KeepAlive::connect(one.addr).await;
    // Bound first, so that the turn that holds the work binds nothing.
    assert_eq!(via_one.post_json("{}", Some(&busy)).await, order[0]);
    bound(&redis, &busy).await;
    let held = hold_work(one, &order[0], 1000).await;
    assert_eq!(via_one.post_json("{}", Some(&busy)).await, order[0]);
    let mut via_two = KeepAlive::connect(two.addr).await;
    assert_eq!(via_two.post_json("{}", Some("fresh")).await, order[1]);
    // The work held (the turn's prompt less what its previous one left).
    let own = one.backend_metric("magpie_backend_prefill_tokens", &order[0], &[]);
    let fleet_work = two.backend_metric("magpie_backend_fleet_prefill_tokens", &order[0], &[]);
    assert!(own > 900 && fleet_work == own, "{fleet_work} of {own}");
    drop(held);
    backends.release(1);
}

/// A turn through the other magpie than its previous one's counts as work
/// only what it adds to the prompt: its lookup brings the bytes the
/// previous turn sent, as a magpie alone knows from its own note.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_through_the_other_magpie_counts_only_what_it_adds() {
    let (redis, backends, fleet) = pair(QUEUE).await;
    let [one, two] = &fleet.magpies;
    let session = "conversation";
    let first = "x".repeat(4000);
    let mut via_one = KeepAlive::connect(one.addr).await;
    let at = via_one.post_json(&first, Some(session)).await;
    assert_eq!(bound(&redis, session).await, at);
    // 400 bytes more, at four a token: 100 tokens, not the 1,100 of the
    // whole prompt.
    let held = hold_turn(two, session, 4400).await;
    assert_eq!(
        two.backend_metric("magpie_backend_prefill_tokens", &at, &[]),
        100
    );
    drop(held);
    backends.release(1);
}

/// Waits until `fleet_work(b)` reads `tokens`.
async fn counted(fleet_work: impl Fn(&str) -> u64, b: &str, tokens: u64) {
    within("the fleet's work", async {
        while fleet_work(b) != tokens {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// A conversation that opens like one the other magpie placed lately (the
/// same model, instructions and first user message) goes where that one
/// went, though this magpie never served it: the script that bound the
/// first conversation kept where it went by how it opens, and the second
/// one's lookup read that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_goes_where_one_that_opens_alike_went_through_the_other_magpie() {
    let (redis, backends, fleet) = pair_by_opening().await;
    let [one, two] = &fleet.magpies;
    let body = chat_body("s", "the same question");
    let group = body_group_key(body.as_bytes(), &GroupBy::Conversation).expect("a group");
    let order = one.candidates(group);
    // Work held through the second magpie sends the first conversation
    // off the table's first.
    let held = hold_work(two, &order[0], 1000).await;
    let fleet_work = |b: &str| one.backend_metric("magpie_backend_fleet_prefill_tokens", b, &[]);
    counted(fleet_work, &order[0], 1000).await;
    let mut via_one = KeepAlive::connect(one.addr).await;
    assert_eq!(via_one.post_json(&body, Some("first")).await, order[1]);
    assert_eq!(bound(&redis, "first").await, order[1]);
    drop(held);
    backends.release(1);
    let own_work = |b: &str| two.backend_metric("magpie_backend_prefill_tokens", b, &[]);
    counted(own_work, &order[0], 0).await;
    let mut via_two = KeepAlive::connect(two.addr).await;
    assert_eq!(via_two.post_json(&body, Some("second")).await, order[1]);
    let moved = two.metric("magpie_requests_routed_total", &["how=\"opening\""]);
    assert_eq!(moved, 1, "not routed by how it opens");
}

/// Two conversations that open at one instant through two magpies do not
/// land together. The store stalls while they come, so both lookups wait
/// there and both magpies place on the same idle view: the table's first.
/// The round trip each makes once placed runs after the other's in the
/// store, and the later one finds the earlier's work there and is placed
/// again, at the other backend (counted as moved); or, where the store read the
/// later lookup only after the earlier's round trip, that lookup already
/// sees the work. Before, both went to the table's first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_conversations_placed_at_one_instant_through_two_magpies_go_apart() {
    let redis = RedisServer::start().await;
    let backends = HyperBackends::start(&["a", "b"]).await;
    // A store slower than the stall below still answers in time.
    let settings = store_settings(redis.addr, QUEUE).replace("timeout: 50ms", "timeout: 5s");
    let fleet = Fleet::start(&settings, &backends.pairs()).await;
    let [one, two] = &fleet.magpies;
    let [s1, s2] = [1, 2].map(|n| {
        (0..1000)
            .map(|i| format!("fresh-{n}-{i}"))
            .find(|s| one.candidates(text_key(s.as_bytes()))[0] == "a")
            .expect("a session whose table's first is a")
    });
    // Each magpie counts the other as live once it shared its work.
    within("both magpies in the fleet", async {
        while redis.command(&[b"ZCARD", b"magpie:fleet"]).await != redis::Value::Int(2) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let stall = stall(&redis).await;
    let (held_one, held_two) = tokio::join!(hold_turn(one, &s1, 4000), hold_turn(two, &s2, 4000));
    stall.await.expect("DEBUG SLEEP runs");
    let work = |b: &str| {
        let own = |m: &Magpie| m.backend_metric("magpie_backend_prefill_tokens", b, &[]);
        own(one) + own(two)
    };
    assert_eq!((work("a"), work("b")), (1000, 1000), "one at each");
    let moved = |m: &Magpie| m.metric("magpie_fleet_moved_placements_total", &[]);
    assert!(moved(one) + moved(two) <= 1, "moved once at most");
    drop((held_one, held_two));
    backends.release(2);
}

/// Stalls `redis` for half a second (`DEBUG SLEEP`) and returns once it
/// is stalled (a PING on a fresh connection goes unanswered for 20 ms):
/// what comes in meanwhile is read at once when it wakes, before any
/// answer goes out. The task ends with the stall.
async fn stall(redis: &RedisServer) -> tokio::task::JoinHandle<()> {
    let addr = redis.addr;
    let stall = tokio::spawn(async move {
        let client = redis::Client::open(format!("redis://{addr}/")).expect("a redis url");
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        let mut c = (client
            .get_multiplexed_async_connection_with_config(&config)
            .await)
            .expect("a connection to redis-server");
        let mut sleep = redis::cmd("DEBUG");
        sleep.arg("SLEEP").arg("0.5");
        let slept: redis::RedisResult<()> = sleep.query_async(&mut c).await;
        slept.expect("DEBUG SLEEP answers");
    });
    within("redis-server to stall", async move {
        loop {
            let mut ping = TcpStream::connect(addr).await.expect("a connection");
            ping.write_all(b"PING\r\n").await.expect("PING sent");
            let mut pong = [0u8; 7];
            let answer = ping.read_exact(&mut pong);
            if tokio::time::timeout(Duration::from_millis(20), answer)
                .await
                .is_err()
            {
                return;
            }
        }
    })
    .await;
    stall
}

/// Waits until every magpie of the store last wrote no work anywhere (the
/// work written with a binding counts its request until the next write).
async fn fleet_idle(redis: &RedisServer) {
    within("the fleet's work to be written as none", async {
        loop {
            let redis::Value::Array(keys) = redis.command(&[b"KEYS", b"magpie:work:*"]).await
            else {
                panic!("KEYS answers an array");
            };
            let mut idle = !keys.is_empty();
            for key in keys {
                let redis::Value::BulkString(key) = key else {
                    panic!("a key name");
                };
                let value = redis.command(&[b"GET", &key]).await;
                idle &= matches!(value, redis::Value::BulkString(ref v) if v.is_empty());
            }
            if idle {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// A conversation that shares its system prompt with one the other magpie
/// placed goes where that one went, though this magpie never served the
/// prompt: the script that bound the first conversation kept where it went
/// by its head, and the second one's lookup read that. Its own group's
/// first candidate is the other backend, where all 2,000 tokens of the
/// prompt would be computed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_goes_where_the_other_magpie_served_its_system_prompt() {
    let (redis, _backends, fleet) = pair_by_opening().await;
    let [one, two] = &fleet.magpies;
    let system = "s".repeat(8000);
    let mut via_one = KeepAlive::connect(one.addr).await;
    let first = via_one
        .post_json(&chat_body(&system, "one"), Some("one"))
        .await;
    assert_eq!(bound(&redis, "one").await, first);
    fleet_idle(&redis).await;
    let user = grouped_away(one, &system, &first);
    let mut via_two = KeepAlive::connect(two.addr).await;
    assert_eq!(
        via_two
            .post_json(&chat_body(&system, &user), Some("two"))
            .await,
        first,
        "where the other magpie's conversation left its system prompt"
    );
}
