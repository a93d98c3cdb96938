use super::*;
use crate::config::Config;
use crate::routing::snapshot::Snapshot;

pub(crate) fn snapshot() -> Snapshot {
    let text = "listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n  - {name: b, addr: 127.0.0.1:8002}\n";
    let config = Config::parse(std::path::Path::new("t.yaml"), text).unwrap();
    Snapshot::build(Arc::new(config), 1, &Default::default()).unwrap()
}

pub(crate) fn decision(how: How) -> Decision {
    Decision {
        how,
        pin_lost: false,
        sent: Sent::default(),
    }
}

/// The session key `n`.
pub(crate) fn k(n: u64) -> SessionKey {
    SessionKey::new(n)
}

#[tokio::test(start_paused = true)]
async fn a_load_spill_is_remembered_until_its_ttl_and_pinned_use_keeps_it() {
    let s = snapshot();
    let (a, b) = (s.backend("a").unwrap(), s.backend("b").unwrap());
    let memory = KeyMemory::new(100, Duration::from_secs(60));
    assert_eq!(memory.routed(k(1), a, decision(How::Primary)), None);
    assert_eq!(memory.spilled_to(k(1)), None);
    assert_eq!(
        memory.routed(k(1), b, decision(How::SpilledAtCap)),
        Some(MissCause::Spill)
    );
    assert_eq!(memory.spilled_to(k(1)).as_deref(), Some("b"));
    tokio::time::advance(Duration::from_secs(50)).await;
    assert_eq!(memory.routed(k(1), b, decision(How::Pinned)), None);
    tokio::time::advance(Duration::from_secs(50)).await;
    assert_eq!(memory.spilled_to(k(1)).as_deref(), Some("b"));
    tokio::time::advance(Duration::from_secs(11)).await;
    assert_eq!(memory.spilled_to(k(1)), None);
    assert_eq!(memory.routed_total(How::Primary), 1);
    assert_eq!(memory.routed_total(How::SpilledAtCap), 1);
    assert_eq!(memory.routed_total(How::Pinned), 1);
}

#[test]
fn going_home_clears_the_spill_and_a_down_spill_is_not_sticky() {
    let s = snapshot();
    let (a, b) = (s.backend("a").unwrap(), s.backend("b").unwrap());
    let memory = KeyMemory::new(100, Duration::from_secs(60));
    memory.routed(k(1), b, decision(How::SpilledEngineFull));
    assert_eq!(
        memory.routed(k(1), a, decision(How::Primary)),
        Some(MissCause::Spill)
    );
    assert_eq!(memory.spilled_to(k(1)), None);
    memory.routed(k(2), a, decision(How::Primary));
    assert_eq!(
        memory.routed(k(2), b, decision(How::SpilledDown)),
        Some(MissCause::BackendDown)
    );
    assert_eq!(memory.spilled_to(k(2)), None);
}

#[test]
fn a_move_is_blamed_on_its_cause() {
    let s = snapshot();
    let (a, b) = (s.backend("a").unwrap(), s.backend("b").unwrap());
    let memory = KeyMemory::new(100, Duration::from_secs(60));
    memory.routed(k(1), a, decision(How::Primary));
    let lost = Decision {
        pin_lost: true,
        ..decision(How::Primary)
    };
    assert_eq!(memory.routed(k(1), b, lost), Some(MissCause::PinExpired));
    assert_eq!(
        memory.routed(k(1), a, decision(How::Primary)),
        Some(MissCause::TableChanged)
    );
    // The previous backend is down now: whatever the route says, that is why.
    b.live.health.set_up(false);
    memory.routed(k(2), b, decision(How::Primary));
    assert_eq!(
        memory.routed(k(2), a, decision(How::Primary)),
        Some(MissCause::BackendDown)
    );
}

#[test]
fn the_memory_is_bounded() {
    let s = snapshot();
    let a = s.backend("a").unwrap();
    let memory = KeyMemory::new(SHARDS, Duration::from_secs(60));
    // Keys 1 and 2 share a shard of one slot.
    memory.routed(k(1), a, decision(How::Primary));
    memory.routed(k(2), a, decision(How::Primary));
    assert!(memory.last(k(1)).is_none());
    assert!(memory.last(k(2)).is_some());
    memory.configure(SHARDS * 2, Duration::from_secs(60));
    memory.routed(k(1), a, decision(How::Primary));
    assert!(memory.last(k(1)).is_some() && memory.last(k(2)).is_some());
}
