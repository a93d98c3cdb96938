//! The LLM policy's records in the key memory: cache misses told from
//! usage, work told from a key's history, openings kept apart from keys.

use std::sync::Arc;
use std::time::Duration;

use super::note::Sent;
use super::openings;
use super::usage::{self, MISS_SLACK_TOKENS, Tokens};
use super::work;
use crate::routing::backend::Backend;
use crate::routing::instance::Instance;
use crate::routing::key_memory::tests::{decision, k, snapshot};
use crate::routing::key_memory::{Decision, KeyMemory, MissCause};
use crate::routing::keys::OpeningKey;
use crate::routing::route::How;

fn tokens(prompt: u64, cached: u64) -> Tokens {
    Tokens { prompt, cached }
}

/// A decision `how` for a request whose body was `prompt_bytes` long.
fn decided(how: How, prompt_bytes: u64) -> Decision {
    Decision {
        sent: Sent {
            group: None,
            prompt_bytes,
        },
        ..decision(how)
    }
}

/// Where the latest request that opened as `opening` went.
fn openings_at(memory: &KeyMemory, opening: u64) -> Option<Arc<Backend>> {
    memory.kept_at(OpeningKey::new(opening).memory())
}

#[test]
fn a_miss_is_fewer_cached_tokens_than_the_previous_prompt() {
    let s = snapshot();
    let (a, b) = (s.backend("a").unwrap(), s.backend("b").unwrap());
    let memory = KeyMemory::new(100, Duration::from_secs(60));
    // Without a previous prompt nothing is a miss.
    assert_eq!(
        usage::served(&memory, k(1), "a", tokens(1000, 0), None),
        None
    );
    memory.routed(k(1), a, decision(How::Primary));
    assert_eq!(
        usage::served(&memory, k(1), "a", tokens(1000, 0), None),
        None
    );
    // The next turn found the whole previous prompt, less a partial block.
    assert_eq!(
        usage::served(
            &memory,
            k(1),
            "a",
            tokens(2000, 1000 - MISS_SLACK_TOKENS),
            None
        ),
        None
    );
    // Same backend, a cache gone: the engine evicted it.
    assert_eq!(
        usage::served(&memory, k(1), "a", tokens(3000, 1000), None),
        Some(MissCause::Evicted)
    );
    // Another backend: the cause the move was given.
    let moved = memory.routed(k(1), b, decision(How::SpilledAtCap));
    assert_eq!(
        usage::served(&memory, k(1), "b", tokens(4000, 500), moved),
        Some(MissCause::Spill)
    );
    assert_eq!(memory.misses_total(MissCause::Evicted), 1);
    assert_eq!(memory.misses_total(MissCause::Spill), 1);
    let last = memory.last(k(1)).unwrap();
    assert_eq!((last.backend.as_str(), last.how), ("b", How::SpilledAtCap));
    assert_eq!(last.prompt_tokens, Some(4000));
}

#[test]
fn work_subtracts_what_the_previous_request_left_at_that_backend() {
    let s = snapshot();
    let (a, b) = (s.backend("a").unwrap(), s.backend("b").unwrap());
    let memory = KeyMemory::new(100, Duration::from_secs(60));
    // Unknown key: all of it, at four bytes a token, anywhere.
    let work = work::work(&memory, k(1).memory(), 4000);
    assert_eq!((work.at(a), work.at(b)), (1000, 1000));
    let turn = decided(How::Primary, 3000);
    memory.routed(k(1), a, turn);
    // Routed, usage not read yet: the new bytes at four a token.
    assert_eq!(work::work(&memory, k(1).memory(), 4000).at(a), 250);
    // Its usage says 3000 bytes were 1000 tokens: three bytes a token.
    usage::served(&memory, k(1), "a", tokens(1000, 0), None);
    let work = work::work(&memory, k(1).memory(), 4200);
    assert_eq!((work.at(a), work.at(b)), (400, 1400));
    // A shorter body (a new conversation under an old key) is never a
    // negative estimate.
    assert_eq!(work::work(&memory, k(1).memory(), 100).at(a), 0);
    memory.routed(k(1), b, turn);
    assert_eq!(work::work(&memory, k(1).memory(), 4000).at(a), 1333);
}

#[test]
fn an_opening_remembers_where_its_latest_request_went_apart_from_its_key() {
    let s = snapshot();
    let (a, b) = (s.backend("a").unwrap(), s.backend("b").unwrap());
    let memory = KeyMemory::new(100, Duration::from_secs(60));
    assert!(openings_at(&memory, 7).is_none());
    // The session key 7 went to a; the opening 7 (another key space) to b.
    memory.routed(k(7), a, decision(How::Primary));
    openings::opened(&memory, OpeningKey::new(7), b, 2000);
    openings::opened(&memory, OpeningKey::new(7), b, 3000);
    assert_eq!(
        openings_at(&memory, 7).map(|at| at.name.clone()),
        Some("b".into())
    );
    assert_eq!(memory.last(k(7)).map(|l| l.backend), Some("a".to_string()));
    // Its work at b: what the latest request that opened so left there.
    let work = work::work(&memory, OpeningKey::new(7).memory(), 4000);
    assert_eq!((work.at(a), work.at(b)), (1000, 250));
    assert_eq!(
        memory.routed_total(How::Primary),
        1,
        "an opening is not counted"
    );
}

#[test]
fn work_is_told_from_what_the_fleet_says_the_previous_request_sent() {
    let s = snapshot();
    let (a, b) = (s.backend("a").unwrap(), s.backend("b").unwrap());
    let memory = KeyMemory::new(100, Duration::from_secs(60));
    let sent = |prompt_bytes| Sent {
        group: None,
        prompt_bytes,
    };
    // Another magpie served the previous turn, 3000 bytes, at a.
    memory.sent_elsewhere(k(1), a, sent(3000));
    let work = work::work(&memory, k(1).memory(), 4000);
    assert_eq!((work.at(a), work.at(b)), (250, 1000));
    assert_eq!(memory.routed_total(How::Pinned), 0, "nothing is counted");
    // This magpie's own note is as recent: kept.
    memory.sent_elsewhere(k(1), b, sent(2000));
    assert_eq!(work::work(&memory, k(1).memory(), 4000).at(a), 250);
    // Its usage said three bytes a token; a later turn through the other
    // magpie keeps the ratio.
    usage::served(&memory, k(1), "a", tokens(1000, 0), None);
    memory.sent_elsewhere(k(1), a, sent(3600));
    let work = work::work(&memory, k(1).memory(), 4200);
    assert_eq!((work.at(a), work.at(b)), (200, 1400));
}

#[tokio::test(start_paused = true)]
async fn a_turn_whose_engine_computed_a_cache_full_since_its_answer_is_all_work_there() {
    let instance = Arc::new(Instance::new(snapshot()));
    let s = instance.snapshot.load_full();
    let (a, b) = (s.backend("a").unwrap(), s.backend("b").unwrap());
    let memory = &instance.key_memory;
    let compute = |at: &Backend, tokens| {
        let (_slot, work) = at.live.try_reserve_work(8, tokens, None, None).unwrap();
        work.answered();
    };
    let turn = decided(How::Pinned, 4000);
    memory.routed(k(1), a, turn);
    compute(a, 500);
    // Its answer read at a: 1000 prompt tokens (four bytes a token).
    let tally = usage::Tally {
        instance: Arc::clone(&instance),
        key: k(1),
        moved: None,
    };
    tally.served(a, tokens(1000, 0), 20);
    // Nothing is judged evicted while the engine has not said its size.
    compute(a, 9_000);
    assert!(!work::evicted(memory, k(1).memory(), a));
    let sample = crate::parsers::Sample {
        kv_capacity: Some(10_000.0),
        ..Default::default()
    };
    a.live.engine.record(sample, tokio::time::Instant::now());
    b.live.engine.record(sample, tokio::time::Instant::now());
    // 9,000 computed at a since: less than its cache, the turn is warm.
    assert!(!work::evicted(memory, k(1).memory(), a));
    assert_eq!(work::work(memory, k(1).memory(), 4400).at(a), 100);
    // 1,000 more fill it: gone from a, all its work there as anywhere.
    compute(a, 1_000);
    assert!(work::evicted(memory, k(1).memory(), a));
    assert!(!work::evicted(memory, k(1).memory(), b), "not served at b");
    let work = work::work(memory, k(1).memory(), 4400);
    assert_eq!((work.at(a), work.at(b)), (1100, 1100));
    // Answered again at a: warm there again.
    tally.served(a, tokens(1100, 0), 20);
    assert!(!work::evicted(memory, k(1).memory(), a));
}
