use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::config::{BackendConfig, Priority};
use crate::routing::keys::{GroupKey, TenantKey};
use crate::routing::llm::work::{Heads, Work};

fn backend(name: &str, port: u16, queue: &Arc<Queue>) -> Arc<Backend> {
    let config = BackendConfig::local(name, port);
    let live = Arc::new(Live::default());
    let hook: Arc<dyn SlotFreed> = queue.clone();
    live.waiters.set(hook).unwrap();
    Arc::new(Backend::new(&config, live))
}

/// Engine load limits: full for new keys over 8 waiting.
const LOAD_LIMITS: crate::config::LoadLimits = crate::config::LoadLimits {
    max_waiting: Some(8),
    max_kv_usage: 0.95,
    max_age: Duration::from_secs(5),
};

/// Backends "home" and "other", waited for through `queue`, and the two
/// as targets in that order.
fn home_and_other(queue: &Arc<Queue>) -> (Arc<Backend>, Arc<Backend>, Vec<Arc<Backend>>) {
    let home = backend("home", 1, queue);
    let other = backend("other", 2, queue);
    let targets = vec![Arc::clone(&home), Arc::clone(&other)];
    (home, other, targets)
}

/// `b`'s prefill rate learned from answers of `tokens` each in `ms`.
fn learned(b: &Backend, tokens: u64, ms: u64) {
    let at = |ms| Instant::now() + Duration::from_millis(ms);
    for i in 0..8 {
        (b.live.prefill_rate).answered(tokens, 0, at(i * ms), at(i * ms + ms));
    }
}

/// Backends b1 and b2, waited for through `queue`.
fn two_backends(queue: &Arc<Queue>) -> Vec<Arc<Backend>> {
    (1..=2)
        .map(|i| backend(&format!("b{i}"), i, queue))
        .collect()
}

fn config(max_inflight: u64) -> QueueConfig {
    QueueConfig {
        max_inflight,
        max_prefill_tokens: None,
        size: 4,
        max_body_bytes: 1000,
        timeout: Duration::from_secs(30),
        affinity_wait: Duration::from_secs(1),
        priority: Priority {
            header: Some("x-priority".into()),
            classes: vec!["interactive".into(), "default".into(), "batch".into()],
            default: 1,
            aging: Duration::from_secs(10),
            engine: None,
        },
        tenant: None,
        tenant_max_queued: None,
        tenant_across_classes: false,
    }
}

fn ask<'a>(targets: &'a [Arc<Backend>], q: &'a QueueConfig, class: usize) -> Ask<'a> {
    Ask {
        targets,
        sticky: true,
        pinned: false,
        places: false,
        class,
        tenant: TenantKey::NONE,
        bytes: 10,
        work: Work::default(),
        key: 1,
        queue: q,
        limits: SlotLimits::of(q, None),
        prefill: false,
        again: false,
    }
}

#[tokio::test(start_paused = true)]
async fn waits_for_its_home_then_spills_in_order() {
    let queue = Arc::new(Queue::default());
    let a = backend("a", 1, &queue);
    let b = backend("b", 2, &queue);
    let q = config(1);
    let targets = [Arc::clone(&a), Arc::clone(&b)];
    let first = queue
        .admit(ask(&targets, &q, 1), std::future::pending())
        .await
        .unwrap();
    assert_eq!(
        (first.backend.name.as_str(), first.how),
        ("a", Admit::AtOnce)
    );
    // a is full: the next request waits for it, then takes b.
    let started = Instant::now();
    let second = queue
        .admit(ask(&targets, &q, 1), std::future::pending())
        .await
        .unwrap();
    assert_eq!(
        (second.backend.name.as_str(), second.how),
        ("b", Admit::Spilled)
    );
    assert_eq!(started.elapsed(), q.affinity_wait);
    // Both are full: a request that is not sticky waits, and the first slot
    // given back (at a) goes to it.
    let queue2 = Arc::clone(&queue);
    let waiting = tokio::spawn(async move {
        let targets = targets;
        let q = config(1);
        let mut a = ask(&targets, &q, 1);
        a.sticky = false;
        queue2
            .admit(a, std::future::pending())
            .await
            .map(|x| x.backend.name.clone())
    });
    tokio::task::yield_now().await;
    assert_eq!(queue.len(), 1);
    drop(first);
    assert_eq!(waiting.await.unwrap().unwrap(), "a");
    assert_eq!(queue.stats.admitted_count(1, Admit::Spilled), 1);
    drop(second);
}

#[tokio::test(start_paused = true)]
async fn slots_go_by_class_and_the_queue_is_bounded() {
    let queue = Arc::new(Queue::default());
    let a = backend("a", 1, &queue);
    let q = Arc::new(config(1));
    let targets: Arc<[Arc<Backend>]> = Arc::from(vec![Arc::clone(&a)]);
    let held = queue
        .admit(ask(&targets, &q, 1), std::future::pending())
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for (name, class) in [
        ("batch", 2),
        ("default", 1),
        ("interactive", 0),
        ("batch-2", 2),
    ] {
        let (queue, q, targets, tx) = (
            Arc::clone(&queue),
            Arc::clone(&q),
            Arc::clone(&targets),
            tx.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let got = queue
                .admit(ask(&targets, &q, class), std::future::pending())
                .await;
            // Hold the slot until the test has seen who got it.
            tx.send(name).unwrap();
            tokio::time::sleep(Duration::from_millis(1)).await;
            drop(got);
        }));
        tokio::task::yield_now().await;
    }
    assert_eq!(queue.len(), 4);
    // Full: the fifth is refused at once.
    let refused = queue
        .admit(ask(&targets, &q, 0), std::future::pending())
        .await;
    assert_eq!(refused.err(), Some(Refusal::Full));
    drop(held);
    let mut order = Vec::new();
    for _ in 0..4 {
        order.push(rx.recv().await.unwrap());
    }
    assert_eq!(order, ["interactive", "default", "batch", "batch-2"]);
    assert_eq!(queue.stats.refused_count(0, Refusal::Full), 1);
    assert_eq!(queue.stats.bytes(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_timeout_or_a_client_gone_leaves_the_queue() {
    let queue = Arc::new(Queue::default());
    let a = backend("a", 1, &queue);
    let q = config(1);
    let targets = [Arc::clone(&a)];
    let _held = queue
        .admit(ask(&targets, &q, 1), std::future::pending())
        .await
        .unwrap();
    let started = Instant::now();
    let timed_out = queue
        .admit(ask(&targets, &q, 1), std::future::pending())
        .await;
    assert_eq!(timed_out.err(), Some(Refusal::TimedOut));
    assert_eq!(started.elapsed(), q.timeout);
    assert!(queue.is_empty());
    let gone = queue
        .admit(
            ask(&targets, &q, 1),
            tokio::time::sleep(Duration::from_millis(5)),
        )
        .await;
    assert_eq!(gone.err(), Some(Refusal::ClientGone));
    assert!(queue.is_empty());
    assert_eq!(queue.stats.bytes(), 0);
    // A dropped request leaves too.
    let dropped = tokio::time::timeout(
        Duration::from_millis(5),
        queue.admit(ask(&targets, &q, 1), std::future::pending()),
    )
    .await;
    assert!(dropped.is_err());
    assert!(queue.is_empty());
}

#[tokio::test(start_paused = true)]
async fn at_shutdown_every_waiting_request_is_refused_by_the_close() {
    let queue = Arc::new(Queue::default());
    let a = backend("a", 1, &queue);
    let q = config(1);
    let targets = [Arc::clone(&a)];
    let _held = queue
        .admit(ask(&targets, &q, 1), std::future::pending())
        .await
        .unwrap();
    let close = Instant::now() + Duration::from_secs(2);
    let waiting = queue.admit(ask(&targets, &q, 1), std::future::pending());
    let closer = async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        queue.close_by(close);
        std::future::pending::<()>().await;
    };
    let refused = tokio::select! {
        r = waiting => r,
        () = closer => unreachable!(),
    };
    assert_eq!(refused.err(), Some(Refusal::TimedOut));
    assert_eq!(
        Instant::now(),
        close,
        "refused at the close, not at queue.timeout"
    );
}

#[tokio::test(start_paused = true)]
async fn work_at_its_limit_holds_a_request_until_a_prefill_ends() {
    let queue = Arc::new(Queue::default());
    let a = backend("a", 1, &queue);
    let targets = vec![Arc::clone(&a)];
    let mut q = config(8);
    q.max_prefill_tokens = Some(1000);
    // A backend with no work takes any request, however large.
    let mut long = ask(&targets, &q, 1);
    long.work = Work::cold(5000);
    let first = queue.admit(long, std::future::pending()).await.unwrap();
    assert_eq!(a.live.load.prefill_tokens(), 5000);
    let Admitted {
        slot: first,
        work: prefill,
        ..
    } = first;
    let waiting = tokio::spawn({
        let (queue, targets, q) = (Arc::clone(&queue), targets.clone(), q.clone());
        async move {
            let mut next = ask(&targets, &q, 1);
            next.work = Work::cold(700);
            let admitted = queue.admit(next, std::future::pending()).await;
            admitted.map(|a| (a.how, a.work))
        }
    });
    while queue.is_empty() {
        tokio::task::yield_now().await;
    }
    // Its slots are free (one of eight taken), its work is not.
    assert_eq!(a.live.load.active(), 1);
    drop(prefill);
    let (how, work) = waiting.await.unwrap().unwrap();
    assert_eq!(how, Admit::Waited);
    // The slot handed out carries the request's own work.
    assert_eq!(a.live.load.prefill_tokens(), 700);
    drop(work);
    assert_eq!(a.live.load.prefill_tokens(), 0);
    drop(first);
}

#[tokio::test(start_paused = true)]
async fn a_new_conversation_goes_where_there_is_least_work() {
    let queue = Arc::new(Queue::default());
    let targets: Vec<_> = (1..=3)
        .map(|i| backend(&format!("b{i}"), i, &queue))
        .collect();
    let q = config(8);
    let _busy = targets[0].live.try_reserve_work(8, 900, None, None);
    let _less = targets[1].live.try_reserve_work(8, 300, None, None);
    let mut opening = ask(&targets, &q, 1);
    opening.sticky = false;
    opening.places = true;
    let admitted = queue.admit(opening, std::future::pending()).await.unwrap();
    assert_eq!(admitted.backend.name, "b3");
    // Equal work keeps the table's order; not placing, the first with room.
    let mut later = ask(&targets, &q, 1);
    later.sticky = false;
    let admitted = queue.admit(later, std::future::pending()).await.unwrap();
    assert_eq!(admitted.backend.name, "b1");
}

#[tokio::test(start_paused = true)]
async fn past_its_affinity_wait_a_request_spills_only_where_it_pays() {
    let queue = Arc::new(Queue::default());
    let (home, other, targets) = home_and_other(&queue);
    let q = config(1);
    // Home is full, and holds 500 tokens of prefill; the other is full too.
    let _home_slot = home.live.try_reserve_work(1, 500, None, None).unwrap();
    let other_slot = other.live.try_reserve_work(1, 0, None, None).unwrap();
    // 4,000 tokens anywhere, 100 at home where its cache is.
    let waiting = tokio::spawn({
        let (queue, targets, q) = (Arc::clone(&queue), targets.clone(), q.clone());
        let warm = Arc::clone(&home);
        async move {
            let mut turn = ask(&targets, &q, 1);
            turn.work = Work {
                tokens: 4000,
                warm_at: Some((warm, 100)),
                head: None,
                system_head: None,
                class: None,
            };
            let admitted = queue.admit(turn, std::future::pending()).await;
            admitted.map(|a| (a.backend.name.clone(), a.how))
        }
    });
    while queue.is_empty() {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The other frees up past the wait, but 0 + 4,000 there is later than
    // 500 + 100 at home: it keeps waiting.
    let busy = other.live.try_reserve_work(1, 0, None, None);
    assert!(busy.is_none());
    drop(other_slot);
    tokio::task::yield_now().await;
    assert_eq!(queue.len(), 1, "a spill that loses the cache does not pay");
    drop(_home_slot);
    let (name, how) = waiting.await.unwrap().unwrap();
    assert_eq!((name.as_str(), how), ("home", Admit::Waited));
}

/// Where a conversation's first request of 100 tokens, nothing of it
/// cached anywhere, is placed.
async fn placed(queue: &Arc<Queue>, targets: &[Arc<Backend>], q: &QueueConfig) -> String {
    placed_cold(queue, targets, q, 100).await
}

/// Where a conversation's first request of `tokens`, no head known, goes.
async fn placed_cold(
    queue: &Arc<Queue>,
    targets: &[Arc<Backend>],
    q: &QueueConfig,
    tokens: u64,
) -> String {
    let mut ask = opening(targets, q, tokens, 0);
    ask.work = Work::cold(tokens);
    let admitted = queue.admit(ask, std::future::pending()).await.unwrap();
    admitted.backend.name.clone()
}

/// A conversation's first request of `tokens`, of group 7 whose head is
/// `head` tokens.
fn opening<'a>(targets: &'a [Arc<Backend>], q: &'a QueueConfig, tokens: u64, head: u64) -> Ask<'a> {
    let mut opening = ask(targets, q, 1);
    opening.sticky = false;
    opening.places = true;
    let heads = Heads {
        group_bytes: head * 4,
        system: None,
    };
    opening.work = Work::cold(tokens).of_group(Some(GroupKey::new(7)), heads);
    opening
}

#[tokio::test(start_paused = true)]
async fn a_new_conversation_goes_where_its_first_token_comes_soonest() {
    let queue = Arc::new(Queue::default());
    let targets = two_backends(&queue);
    targets[0].live.served_group(GroupKey::new(7));
    let q = config(8);
    let placed = |tokens, head| {
        let (queue, targets, q) = (Arc::clone(&queue), targets.clone(), q.clone());
        async move {
            let ask = opening(&targets, &q, tokens, head);
            let admitted = queue.admit(ask, std::future::pending()).await.unwrap();
            (admitted.backend.name.clone(), admitted.how)
        }
    };
    // b1 holds 1,000 tokens of work and the group's head of 3,000: 1,000 +
    // 200 there against 3,200 at b2.
    let held = targets[0]
        .live
        .try_reserve_work(8, 1000, None, None)
        .unwrap();
    assert_eq!(placed(3200, 3000).await, ("b1".into(), Admit::AtOnce));
    // A head of 100 tokens: 1,000 + 3,100 against 3,200, load wins.
    assert_eq!(placed(3200, 100).await, ("b2".into(), Admit::Placed));
    drop(held);
    // With 4,000 tokens held at b1, even the long head loses.
    let _held = targets[0]
        .live
        .try_reserve_work(8, 4000, None, None)
        .unwrap();
    assert_eq!(placed(3200, 3000).await, ("b2".into(), Admit::Placed));
    // No group anywhere: the least work, as before.
    let fresh = Work::cold(3200);
    assert_eq!(fresh.at(&targets[0]), fresh.at(&targets[1]));
}

#[tokio::test(start_paused = true)]
async fn under_load_a_cached_head_counts_for_the_requests_queued_behind() {
    let queue = Arc::new(Queue::default());
    let targets = two_backends(&queue);
    targets[0].live.served_group(GroupKey::new(7));
    let q = config(8);
    let queued = |b: &Arc<Backend>, n: usize, tokens: u64| {
        let each = tokens / n as u64;
        (0..n)
            .map(|_| {
                let waiting = b
                    .live
                    .await_first_byte(crate::routing::backend::Awaiting::Turn);
                (
                    waiting,
                    b.live.try_reserve_work(8, each, None, None).unwrap(),
                )
            })
            .collect::<Vec<_>>()
    };
    // b1 holds the head and 6,000 tokens in 3 requests; b2 2,000 in 2. The
    // first token comes sooner at b2 (2,000 + 3,200 against 6,000 + 200),
    // but its 3,200 tokens there would delay the two requests that, at this
    // load, come to queue behind it by the 3,000 that b1's cache saves,
    // counted for each.
    let _b1 = queued(&targets[0], 3, 6000);
    let _b2 = queued(&targets[1], 2, 2000);
    let ask = opening(&targets, &q, 3200, 3000);
    let admitted = queue.admit(ask, std::future::pending()).await.unwrap();
    assert_eq!(admitted.backend.name, "b1");
}

#[tokio::test(start_paused = true)]
async fn work_no_cache_saves_counts_once_not_once_per_answer_streaming() {
    let queue = Arc::new(Queue::default());
    let targets = two_backends(&queue);
    let q = config(8);
    // No cache holds any of the 4,000 tokens of the request: its first
    // token comes at 5,000 tokens at b1 against 7,000 at b2, and wherever
    // it goes it costs those behind it alike. (No answer came yet, so
    // nothing says how much the conversations in flight will send again:
    // the next test.)
    let _held = streams_at_b1_work_at_b2(&targets);
    assert_eq!(placed_cold(&queue, &targets, &q, 4000).await, "b1");
}

/// b1 holds 1,000 tokens of work and streams five answers besides; b2
/// holds 3,000 and streams none (while the guards live).
fn streams_at_b1_work_at_b2(targets: &[Arc<Backend>]) -> Vec<(ActiveGuard, Option<WorkGuard>)> {
    let streams = (0..5).map(|_| (targets[0].live.reserve(), None));
    let work = [(&targets[0], 1000), (&targets[1], 3000)]
        .into_iter()
        .map(|(b, tokens)| {
            let (slot, work) = b.live.try_reserve_work(8, tokens, None, None).unwrap();
            (slot, Some(work))
        });
    streams.chain(work).collect()
}

#[tokio::test(start_paused = true)]
async fn a_new_conversation_counts_the_turns_that_come_back_ahead_of_its_next() {
    // As above: b1 holds 1,000 tokens of work and streams five answers,
    // b2 holds 3,000; a request of 4,000 no cache holds. Both engines
    // answered requests of `turn` tokens at 10,000 a second: the six
    // conversations in flight at b1 will send turns of about that ahead of
    // this one's next, the one at b2 one. Short turns: 1,000 + 4,000 + 600
    // at b1 against 3,000 + 4,000 + 100 at b2 (counting the 4,000 again
    // for each would send it to b2). Long ones: 1,000 + 4,000 + 6,000
    // against 3,000 + 4,000 + 1,000.
    for (turn, expected) in [(100, "b1"), (1000, "b2")] {
        let queue = Arc::new(Queue::default());
        let targets = two_backends(&queue);
        let q = config(8);
        let _held = streams_at_b1_work_at_b2(&targets);
        let t0 = tokio::time::Instant::now();
        for i in 0..10u64 {
            let at = |ms: u64| t0 + Duration::from_millis(i * 1000 + ms);
            for b in &targets {
                b.live.prefill_rate.answered(turn, 0, at(0), at(turn / 10));
            }
        }
        let placed = placed_cold(&queue, &targets, &q, 4000).await;
        assert_eq!(placed, expected, "turns of {turn}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_new_conversation_goes_where_its_system_head_was_answered_whatever_its_group() {
    let queue = Arc::new(Queue::default());
    let targets = two_backends(&queue);
    let q = config(8);
    let system = Heads {
        group_bytes: 3100 * 4,
        system: Some((99, 3000 * 4)),
    };
    let work = |group| Work::cold(3200).of_group(Some(GroupKey::new(group)), system);
    // b1 answered a conversation of group 1 with this system head, and
    // holds 1,000 tokens of work: a conversation of group 2 costs 1,000 +
    // 200 there against 3,200 at b2.
    let (_slot, answered) = targets[0]
        .live
        .try_reserve_work(8, 3200, None, None)
        .unwrap();
    answered.with_system_head(Some(99)).answered();
    let _held = targets[0]
        .live
        .try_reserve_work(8, 1000, None, None)
        .unwrap();
    let mut ask = opening(&targets, &q, 3200, 0);
    ask.work = work(2);
    let admitted = queue.admit(ask, std::future::pending()).await.unwrap();
    assert_eq!(admitted.backend.name, "b1");
    // Its group's own head, were it held, counts as well.
    assert_eq!(work(2).at(&targets[0]), 200);
    assert_eq!(work(2).at(&targets[1]), 3200);
}

/// A head shared by a group counts where the group was served lately,
/// however much the engine computed since: engines free a finished
/// request's blocks tail first and each conversation of the group touches
/// its head again, so it is the last of its chain to go. (Judged as a
/// conversation is, gone once the cache's unheld room was computed, it was
/// forgotten while still cached, and a group's conversations spread by
/// load.) It stops counting once the group was not served for two periods.
#[tokio::test(start_paused = true)]
async fn a_head_counts_where_its_group_was_served_lately_however_much_was_computed_since() {
    let queue = Arc::new(Queue::default());
    let b = backend("b1", 1, &queue);
    let group = GroupKey::new(7);
    let heads = Heads {
        group_bytes: 3000 * 4,
        system: None,
    };
    let work = Work::cold(3200).of_group(Some(group), heads);
    let compute = |tokens| {
        let (_slot, work) = b.live.try_reserve_work(8, tokens, None, None).unwrap();
        work.answered();
    };
    assert_eq!(work.at(&b), 3200);
    b.live.served_group(group);
    assert_eq!(work.at(&b), 200);
    // The engine says its cache holds 10,000 tokens, nine tenths held by
    // running requests; 12,000 computed since the group was served.
    let sample = crate::parsers::Sample {
        kv_capacity: Some(10_000.0),
        kv_usage: Some(0.9),
        ..Default::default()
    };
    b.live.engine.record(sample, tokio::time::Instant::now());
    compute(12_000);
    assert_eq!(work.at(&b), 200);
    tokio::time::advance(2 * crate::routing::backend::recent::RECENT_PERIOD).await;
    assert_eq!(work.at(&b), 3200);
}

#[tokio::test(start_paused = true)]
async fn a_new_conversation_waits_for_the_soonest_rather_than_take_a_later_one_with_room() {
    let queue = Arc::new(Queue::default());
    let targets = two_backends(&queue);
    targets[0].live.served_group(GroupKey::new(7));
    let mut q = config(8);
    // One prefill at a time.
    q.max_prefill_tokens = Some(1);
    let prefill = targets[0]
        .live
        .try_reserve_work(8, 500, Some(1), None)
        .unwrap();
    let waiting = tokio::spawn({
        let (queue, targets, q) = (Arc::clone(&queue), targets.clone(), q.clone());
        async move {
            let ask = opening(&targets, &q, 3200, 3000);
            let admitted = queue.admit(ask, std::future::pending()).await;
            admitted.map(|a| (a.backend.name.clone(), a.how))
        }
    });
    while queue.is_empty() {
        tokio::task::yield_now().await;
    }
    // b2 has room, but 3,200 there is later than 500 + 200 at b1.
    let other = targets[1]
        .live
        .try_reserve_work(8, 0, Some(1), None)
        .unwrap();
    drop(other);
    tokio::task::yield_now().await;
    assert_eq!(queue.len(), 1, "a later first token is not taken for room");
    drop(prefill);
    let (name, how) = waiting.await.unwrap().unwrap();
    assert_eq!((name.as_str(), how), ("b1", Admit::Waited));
}

#[tokio::test(start_paused = true)]
async fn work_ahead_is_weighed_by_each_backends_learned_prefill_rate() {
    let queue = Arc::new(Queue::default());
    let targets = two_backends(&queue);
    let q = config(8);
    let _b1 = targets[0]
        .live
        .try_reserve_work(8, 4000, None, None)
        .unwrap();
    let _b2 = targets[1]
        .live
        .try_reserve_work(8, 2500, None, None)
        .unwrap();
    // Nothing learned: 2,600 tokens ahead at b2 against 4,100 at b1.
    assert_eq!(placed(&queue, &targets, &q).await, "b2");
    // b1 prefills 2,000 tokens a second, b2 1,000 (ten answers each, one
    // at a time): 2.05 s at b1 against 2.6 s at b2.
    let t0 = tokio::time::Instant::now();
    for i in 0..10u64 {
        let at = |ms: u64| t0 + Duration::from_millis(i * 1000 + ms);
        targets[0]
            .live
            .prefill_rate
            .answered(1000, 0, at(0), at(500));
        targets[1]
            .live
            .prefill_rate
            .answered(1000, 0, at(0), at(1000));
    }
    assert_eq!(placed(&queue, &targets, &q).await, "b1");
}

#[tokio::test(start_paused = true)]
async fn a_pinned_request_enters_an_engine_full_for_new_keys_but_not_far_over() {
    let queue = Arc::new(Queue::default());
    let targets = two_backends(&queue);
    let q = config(8);
    // b1's engine has 10 requests waiting: over 8 (full for new keys),
    // not over 32 (far over).
    let sample = crate::routing::health::exposition::Sample {
        waiting: Some(10.0),
        running: Some(4.0),
        kv_usage: Some(0.5),
        kv_capacity: None,
        slots: None,
    };
    targets[0]
        .live
        .engine
        .record(sample, tokio::time::Instant::now());
    let limits = LOAD_LIMITS;
    let admit = |pinned: bool| {
        let (queue, targets, q) = (Arc::clone(&queue), targets.clone(), q.clone());
        async move {
            let mut ask = ask(&targets, &q, 1);
            ask.limits = SlotLimits::of(&q, Some(&limits));
            ask.pinned = pinned;
            ask.sticky = pinned;
            ask.places = !pinned;
            let admitted = queue.admit(ask, std::future::pending()).await.unwrap();
            admitted.backend.name.clone()
        }
    };
    // A live conversation stays on its engine.
    assert_eq!(admit(true).await, "b1");
    // A new one goes to the engine that is not full.
    assert_eq!(admit(false).await, "b2");
}

#[tokio::test(start_paused = true)]
async fn a_new_conversation_does_not_wait_for_a_cheaper_engine_full_for_new_keys() {
    let queue = Arc::new(Queue::default());
    let targets = two_backends(&queue);
    targets[0].live.served_group(GroupKey::new(7));
    // b1 holds the group's head, so it is the cheaper, but its engine has
    // 10 requests waiting (over 8): it takes no new conversation until a
    // scrape says otherwise.
    let sample = crate::routing::health::exposition::Sample {
        waiting: Some(10.0),
        ..Default::default()
    };
    let now = tokio::time::Instant::now();
    targets[0].live.engine.record(sample, now);
    let limits = LOAD_LIMITS;
    let q = config(8);
    let mut ask = opening(&targets, &q, 3200, 3000);
    ask.limits = SlotLimits::of(&q, Some(&limits));
    let admitted = queue.admit(ask, std::future::pending()).await.unwrap();
    assert_eq!(
        (admitted.backend.name.as_str(), admitted.how),
        ("b2", Admit::Placed)
    );
    assert_eq!(admitted.waited, Duration::ZERO);
}

/// Admits a request of `class` (its work counted by class when `by_class`)
/// to `targets` in the background: where it went, and its room.
fn admit_in_class(
    queue: &Arc<Queue>,
    targets: &[Arc<Backend>],
    q: &QueueConfig,
    class: usize,
    by_class: bool,
) -> tokio::task::JoinHandle<Result<Admitted, Refusal>> {
    let (queue, targets, q) = (Arc::clone(queue), targets.to_vec(), q.clone());
    tokio::spawn(async move {
        let mut ask = ask(&targets, &q, class);
        ask.work = Work::cold(300).in_class(by_class.then_some(class));
        queue.admit(ask, std::future::pending()).await
    })
}

#[tokio::test(start_paused = true)]
async fn where_engines_take_the_class_a_higher_class_goes_in_beside_a_lower_ones_prefill() {
    let queue = Arc::new(Queue::default());
    let targets = vec![backend("a", 1, &queue)];
    let mut q = config(8);
    q.max_prefill_tokens = Some(1);
    q.priority.engine = Some(vec![0, 1, 2]);
    // A batch request prefills at a.
    let batch = targets[0]
        .live
        .try_reserve_work(8, 500, Some(1), Some(2))
        .unwrap();
    // An interactive one goes in beside it: the engine puts it first.
    let interactive = admit_in_class(&queue, &targets, &q, 0, true)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(interactive.how, Admit::AtOnce);
    // Another batch request waits for both, another interactive one for
    // the first interactive only.
    let batch_2 = admit_in_class(&queue, &targets, &q, 2, true);
    let interactive_2 = admit_in_class(&queue, &targets, &q, 0, true);
    while queue.len() < 2 {
        tokio::task::yield_now().await;
    }
    drop(interactive);
    let interactive_2 = interactive_2.await.unwrap().unwrap();
    assert_eq!(interactive_2.how, Admit::Waited);
    assert_eq!(queue.len(), 1, "the batch request still waits");
    drop((batch, interactive_2));
    assert_eq!(batch_2.await.unwrap().unwrap().how, Admit::Waited);
    // Where engines do not take the class, the interactive request waits
    // for the batch one's prefill.
    let batch = targets[0]
        .live
        .try_reserve_work(8, 500, Some(1), None)
        .unwrap();
    let interactive = admit_in_class(&queue, &targets, &q, 0, false);
    while queue.is_empty() {
        tokio::task::yield_now().await;
    }
    drop(batch);
    assert_eq!(interactive.await.unwrap().unwrap().how, Admit::Waited);
}

#[tokio::test(start_paused = true)]
async fn a_new_conversation_weighs_the_answers_streaming_at_each_backend() {
    let queue = Arc::new(Queue::default());
    let targets = two_backends(&queue);
    let q = config(8);
    // b1 streams two answers (in flight, past their first byte); b2 none.
    // The request costs alike at both: the one with fewer in flight.
    let _streaming = [
        targets[0].live.try_reserve_work(8, 0, None, None),
        targets[0].live.try_reserve_work(8, 0, None, None),
    ];
    let ask = opening(&targets, &q, 1000, 0);
    let admitted = queue.admit(ask, std::future::pending()).await.unwrap();
    assert_eq!(admitted.backend.name, "b2");
}

#[tokio::test(start_paused = true)]
async fn a_first_request_goes_where_a_slot_is_free_while_any_target_has_one() {
    let queue = Arc::new(Queue::default());
    let targets = two_backends(&queue);
    let q = config(8);
    // b2 holds 2,000 tokens of work, b1 none: b1 is the cheaper.
    let _ahead = targets[1]
        .live
        .try_reserve_work(8, 2000, None, None)
        .unwrap();
    let running = targets[0].live.reserve();
    assert_eq!(
        placed(&queue, &targets, &q).await,
        "b1",
        "no slot count learned: cost alone"
    );
    // b1's engine said it runs 1 request at once (one running while one
    // waited), and 1 is in flight there: its slot is taken.
    let sample = crate::routing::health::exposition::Sample {
        waiting: Some(1.0),
        running: Some(1.0),
        slots: Some(1.0),
        ..Default::default()
    };
    let now = tokio::time::Instant::now();
    targets[0].live.engine.record(sample, now);
    assert_eq!(targets[0].live.engine.slots(), Some(1));
    assert_eq!(
        placed(&queue, &targets, &q).await,
        "b2",
        "b2 has a free slot"
    );
    // A later scrape without anyone waiting tells nothing of the slots.
    targets[0].live.engine.record(Default::default(), now);
    assert_eq!(targets[0].live.engine.slots(), Some(1));
    // Both engines' slots taken: the cheaper again.
    targets[1].live.engine.record(sample, now);
    assert_eq!(
        placed(&queue, &targets, &q).await,
        "b1",
        "no free slot anywhere: cost alone"
    );
    drop(running);
    assert_eq!(placed(&queue, &targets, &q).await, "b1");
}

/// A request past its affinity wait whose spill to `other` pays only while
/// its own slot there is not counted (at `other` 50 tokens ahead of its 100,
/// and one turn of 1,000 coming back once it holds a slot there: 1,150,
/// against 1,100 at its home) is judged before its slot is taken: it takes
/// the slot given back, once. Judged after, it did not, the slot went back,
/// which handed it out again, without end, until the stack overflowed.
#[tokio::test(start_paused = true)]
async fn a_slot_given_back_goes_to_a_request_judged_before_it_holds_the_slot() {
    let queue = Arc::new(Queue::default());
    let (home, other, targets) = home_and_other(&queue);
    // Both learned: 10,000 tokens a second, 1,000 a request.
    targets.iter().for_each(|b| learned(b, 1000, 100));
    let q = config(1);
    let _home_slot = home.live.try_reserve_work(1, 0, None, None).unwrap();
    let (other_slot, _other_work) = other.live.try_reserve_work(1, 50, None, None).unwrap();
    let waiting = tokio::spawn({
        let (queue, targets, q) = (Arc::clone(&queue), targets.clone(), q.clone());
        async move {
            let mut turn = ask(&targets, &q, 1);
            turn.work = Work::cold(100);
            let admitted = queue.admit(turn, std::future::pending()).await;
            admitted.map(|a| (a.backend.name.clone(), a.how))
        }
    });
    while queue.is_empty() {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(queue.len(), 1, "both are full");
    drop(other_slot);
    let (name, how) = waiting.await.unwrap().unwrap();
    assert_eq!((name.as_str(), how), ("other", Admit::Spilled));
}

/// A slot held at `backend`, and its work.
type Held = (Arc<Backend>, ActiveGuard, WorkGuard);

/// Many random queues, each from its own seed: three full backends with
/// learned rates and work held, eight requests of random work, caches,
/// targets' order and stickiness waiting past their affinity wait; slots
/// given back one at a time, in random order. After each, no waiting
/// request takes the backend where it was given back while that backend
/// has room: it went to a request that takes it, or there is none. Every
/// request is admitted in the end.
#[tokio::test(start_paused = true)]
async fn a_slot_given_back_goes_to_a_waiting_request_whenever_one_takes_it() {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    for _ in 0..40 {
        let queue = Arc::new(Queue::default());
        let backends: Vec<_> = (1..=3)
            .map(|i| backend(&format!("b{i}"), i, &queue))
            .collect();
        for b in &backends {
            learned(b, 500 + next(2000), 20 + next(200));
        }
        let mut q = config(1);
        q.size = 16;
        let mut held: Vec<Held> = (backends.iter())
            .map(|b| {
                let (slot, work) = b.live.try_reserve_work(1, next(3000), None, None).unwrap();
                (Arc::clone(b), slot, work)
            })
            .collect();
        let mut requests = Vec::new();
        for _ in 0..8 {
            let mut targets = backends.clone();
            targets.rotate_left(next(3) as usize);
            let tokens = 100 + next(4000);
            let warm = Some((Arc::clone(&targets[next(3) as usize]), next(tokens)));
            let sticky = next(2) == 0;
            let (queue, q) = (Arc::clone(&queue), q.clone());
            requests.push(tokio::spawn(async move {
                let mut a = ask(&targets, &q, 1);
                a.work = Work {
                    warm_at: warm,
                    ..Work::cold(tokens)
                };
                a.sticky = sticky;
                let admitted = queue.admit(a, std::future::pending()).await;
                admitted.map(|x| (x.backend, x.slot, x.work))
            }));
        }
        while queue.len() < 8 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        for _ in 0..64 {
            if requests.is_empty() && held.is_empty() {
                break;
            }
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
            let (done, still): (Vec<_>, Vec<_>) =
                requests.into_iter().partition(|r| r.is_finished());
            requests = still;
            for r in done {
                held.push(r.await.unwrap().unwrap());
            }
            assert!(!held.is_empty(), "requests wait while every slot is free");
            let (b, slot, work) = held.swap_remove(next(held.len() as u64) as usize);
            drop((slot, work));
            let state = queue.lock();
            let now = Instant::now();
            let taker = (state.waiting).find(|w| w.takes(&b.live, now, &state.limits).map(|_| ()));
            let room = b.live.load.active() < 1;
            assert!(
                !(room && taker.is_some()),
                "{} has room and a taker",
                b.name
            );
        }
        assert!(
            requests.is_empty() && held.is_empty(),
            "every request admitted"
        );
    }
}
