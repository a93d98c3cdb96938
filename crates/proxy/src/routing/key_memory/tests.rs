use super::*;
use crate::config::Config;
use crate::routing::snapshot::Snapshot;

fn snapshot() -> Snapshot {
    let text = "listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n  - {name: b, addr: 127.0.0.1:8002}\n";
    let config = Config::parse(std::path::Path::new("t.yaml"), text).unwrap();
    Snapshot::build(Arc::new(config), 1, &Default::default()).unwrap()
}

fn decision(how: How) -> Decision {
    Decision {
        how,
        pin_lost: false,
        group: None,
        prompt_bytes: 0,
    }
}

fn tokens(prompt: u64, cached: u64) -> Tokens {
    Tokens { prompt, cached }
}

#[tokio::test(start_paused = true)]
async fn a_load_spill_is_remembered_until_its_ttl_and_pinned_use_keeps_it() {
    let s = snapshot();
    let (a, b) = (s.backend("a").unwrap(), s.backend("b").unwrap());
    let memory = KeyMemory::new(100, Duration::from_secs(60));
    assert_eq!(memory.routed(1, a, decision(How::Primary)), None);
    assert_eq!(memory.spilled_to(1), None);
    assert_eq!(
        memory.routed(1, b, decision(How::SpilledAtCap)),
        Some(MissCause::Spill)
    );
    assert_eq!(memory.spilled_to(1).as_deref(), Some("b"));
    tokio::time::advance(Duration::from_secs(50)).await;
    assert_eq!(memory.routed(1, b, decision(How::Pinned)), None);
    tokio::time::advance(Duration::from_secs(50)).await;
    assert_eq!(memory.spilled_to(1).as_deref(), Some("b"));
    tokio::time::advance(Duration::from_secs(11)).await;
    assert_eq!(memory.spilled_to(1), None);
    assert_eq!(memory.routed_total(How::Primary), 1);
    assert_eq!(memory.routed_total(How::SpilledAtCap), 1);
    assert_eq!(memory.routed_total(How::Pinned), 1);
}

#[test]
fn going_home_clears_the_spill_and_a_down_spill_is_not_sticky() {
    let s = snapshot();
    let (a, b) = (s.backend("a").unwrap(), s.backend("b").unwrap());
    let memory = KeyMemory::new(100, Duration::from_secs(60));
    memory.routed(1, b, decision(How::SpilledEngineFull));
    assert_eq!(
        memory.routed(1, a, decision(How::Primary)),
        Some(MissCause::Spill)
    );
    assert_eq!(memory.spilled_to(1), None);
    memory.routed(2, a, decision(How::Primary));
    assert_eq!(
        memory.routed(2, b, decision(How::SpilledDown)),
        Some(MissCause::BackendDown)
    );
    assert_eq!(memory.spilled_to(2), None);
}

#[test]
fn a_move_is_blamed_on_its_cause() {
    let s = snapshot();
    let (a, b) = (s.backend("a").unwrap(), s.backend("b").unwrap());
    let memory = KeyMemory::new(100, Duration::from_secs(60));
    memory.routed(1, a, decision(How::Primary));
    let lost = Decision {
        how: How::Primary,
        pin_lost: true,
        group: None,
        prompt_bytes: 0,
    };
    assert_eq!(memory.routed(1, b, lost), Some(MissCause::PinExpired));
    assert_eq!(
        memory.routed(1, a, decision(How::Primary)),
        Some(MissCause::TableChanged)
    );
    // The previous backend is down now: whatever the route says, that is why.
    b.live.health.set_up(false);
    memory.routed(2, b, decision(How::Primary));
    assert_eq!(
        memory.routed(2, a, decision(How::Primary)),
        Some(MissCause::BackendDown)
    );
}

#[test]
fn a_miss_is_fewer_cached_tokens_than_the_previous_prompt() {
    let s = snapshot();
    let (a, b) = (s.backend("a").unwrap(), s.backend("b").unwrap());
    let memory = KeyMemory::new(100, Duration::from_secs(60));
    // Without a previous prompt nothing is a miss.
    assert_eq!(memory.served(1, "a", tokens(1000, 0), None), None);
    memory.routed(1, a, decision(How::Primary));
    assert_eq!(memory.served(1, "a", tokens(1000, 0), None), None);
    // The next turn found the whole previous prompt, less a partial block.
    assert_eq!(
        memory.served(1, "a", tokens(2000, 1000 - MISS_SLACK_TOKENS), None),
        None
    );
    // Same backend, a cache gone: the engine evicted it.
    assert_eq!(
        memory.served(1, "a", tokens(3000, 1000), None),
        Some(MissCause::Evicted)
    );
    // Another backend: the cause the move was given.
    let moved = memory.routed(1, b, decision(How::SpilledAtCap));
    assert_eq!(
        memory.served(1, "b", tokens(4000, 500), moved),
        Some(MissCause::Spill)
    );
    assert_eq!(memory.misses_total(MissCause::Evicted), 1);
    assert_eq!(memory.misses_total(MissCause::Spill), 1);
    let last = memory.last(1).unwrap();
    assert_eq!((last.backend.as_str(), last.how), ("b", How::SpilledAtCap));
    assert_eq!(last.prompt_tokens, Some(4000));
}

#[test]
fn the_memory_is_bounded() {
    let s = snapshot();
    let a = s.backend("a").unwrap();
    let memory = KeyMemory::new(SHARDS, Duration::from_secs(60));
    // Keys 1 and 2 share a shard of one slot.
    memory.routed(1, a, decision(How::Primary));
    memory.routed(2, a, decision(How::Primary));
    assert!(memory.last(1).is_none());
    assert!(memory.last(2).is_some());
    memory.configure(SHARDS * 2, Duration::from_secs(60));
    memory.routed(1, a, decision(How::Primary));
    assert!(memory.last(1).is_some() && memory.last(2).is_some());
}

#[test]
fn work_subtracts_what_the_previous_request_left_at_that_backend() {
    let s = snapshot();
    let (a, b) = (s.backend("a").unwrap(), s.backend("b").unwrap());
    let memory = KeyMemory::new(100, Duration::from_secs(60));
    // Unknown key: all of it, at four bytes a token, anywhere.
    let work = memory.work(1, 4000);
    assert_eq!((work.at(a), work.at(b)), (1000, 1000));
    let turn = Decision {
        prompt_bytes: 3000,
        ..decision(How::Primary)
    };
    memory.routed(1, a, turn);
    // Routed, usage not read yet: the new bytes at four a token.
    assert_eq!(memory.work(1, 4000).at(a), 250);
    // Its usage says 3000 bytes were 1000 tokens: three bytes a token.
    memory.served(1, "a", tokens(1000, 0), None);
    let work = memory.work(1, 4200);
    assert_eq!((work.at(a), work.at(b)), (400, 1400));
    // A shorter body (a new conversation under an old key) is never a
    // negative estimate.
    assert_eq!(memory.work(1, 100).at(a), 0);
    memory.routed(1, b, turn);
    assert_eq!(memory.work(1, 4000).at(a), 1333);
}

#[test]
fn an_opening_remembers_where_its_latest_request_went_apart_from_its_key() {
    let s = snapshot();
    let (a, b) = (s.backend("a").unwrap(), s.backend("b").unwrap());
    let memory = KeyMemory::new(100, Duration::from_secs(60));
    assert!(memory.opened_at(7).is_none());
    // The session key 7 went to a; the opening 7 (another key space) to b.
    memory.routed(7, a, decision(How::Primary));
    memory.opened(7, b, 2000);
    memory.opened(7, b, 3000);
    assert_eq!(
        memory.opened_at(7).map(|at| at.name.clone()),
        Some("b".into())
    );
    assert_eq!(memory.last(7).map(|l| l.backend), Some("a".to_string()));
    // Its work at b: what the latest request that opened so left there.
    let work = memory.work(opening_record(7), 4000);
    assert_eq!((work.at(a), work.at(b)), (1000, 250));
    assert_eq!(
        memory.routed_total(How::Primary),
        1,
        "an opening is not counted"
    );
}
