//! Routes through the candidate walk: health, caps, engine load, slow
//! start, pins and spills remembered.

use super::*;
use crate::config::Config;

fn snapshot(extra: &str) -> Snapshot {
    let text = format!(
        "listen: 127.0.0.1:7000\n{extra}backends:\n  - {{name: a, addr: 127.0.0.1:8001}}\n  - {{name: b, addr: 127.0.0.1:8002}}\n  - {{name: c, addr: 127.0.0.1:8003}}\n"
    );
    let config = Config::parse(std::path::Path::new("t.yaml"), &text).unwrap();
    Snapshot::build(Arc::new(config), 1, &Default::default()).unwrap()
}

fn names(route: &Route) -> Vec<&str> {
    route.targets.iter().map(|b| b.name.as_str()).collect()
}

#[test]
fn down_backends_are_skipped_and_counted_only_for_traffic() {
    let s = snapshot("");
    let order: Vec<String> = s.candidates(42).map(|b| b.name.clone()).collect();
    let primary = s.backend(&order[0]).unwrap();
    primary.live.health.set_up(false);
    assert_eq!(names(&Route::preview(&s, 42)), [&order[1], &order[2]]);
    assert_eq!(primary.live.traffic.spills_total(), 0);
    assert_eq!(names(&Route::plan(&s, 42)), [&order[1], &order[2]]);
    assert_eq!(primary.live.traffic.spills_total(), 1);
}

#[test]
fn all_down_fails_open_or_refuses() {
    let s = snapshot("");
    for b in &s.backends {
        b.live.health.set_up(false);
    }
    let order: Vec<String> = s.candidates(7).map(|b| b.name.clone()).collect();
    assert_eq!(names(&Route::preview(&s, 7)), order);
    let s = snapshot("health: {when_all_down: refuse}\n");
    for b in &s.backends {
        b.live.health.set_up(false);
    }
    assert!(Route::preview(&s, 7).targets.is_empty());
}

#[test]
fn attempts_bound_the_targets() {
    let s = snapshot("connect: {attempts: 2}\n");
    assert_eq!(Route::plan(&s, 9).targets.len(), 2);
}

#[test]
fn a_backend_at_its_cap_is_skipped_and_reserve_rechecks() {
    let s = snapshot("placement: {bounded_load: 1.0, spill_min_excess: 0}\n");
    let order: Vec<String> = s.candidates(5).map(|b| b.name.clone()).collect();
    let primary = Arc::clone(s.backend(&order[0]).unwrap());
    // One active connection in a pool of three: cap = ceil(1 · 2 / 3) = 1.
    let _held = primary.live.reserve();
    let route = Route::plan(&s, 5);
    assert_eq!(route.first().unwrap().name, order[1]);
    assert_eq!(primary.live.traffic.spills_total(), 1);
    // Reserving on a full backend fails and counts another spill.
    assert!(route.reserve(&primary).is_none());
    assert_eq!(primary.live.traffic.spills_total(), 2);
    assert!(route.reserve(route.first().unwrap()).is_some());
    assert_eq!(route.how, How::SpilledAtCap);
}

/// Holds `n` active slots on `backend`.
fn hold(backend: &Backend, n: usize) -> Vec<ActiveGuard> {
    (0..n).map(|_| backend.live.reserve()).collect()
}

#[test]
fn a_key_spills_only_when_over_the_cap_and_the_absolute_excess() {
    let s = snapshot("placement: {bounded_load: 1.25}\n");
    assert_eq!(s.config.placement.spill_min_excess, 8);
    let order: Vec<String> = s.candidates(5).map(|b| b.name.clone()).collect();
    let primary = s.backend(&order[0]).unwrap();
    // 8 of 9 active on the primary: mean 10/3, cap 5, but 8 < 3.33 + 8.
    let _burst = hold(primary, 8);
    let _others = hold(s.backend(&order[1]).unwrap(), 1);
    let route = Route::plan(&s, 5);
    assert_eq!(
        (route.first().unwrap().name.as_str(), route.how),
        (order[0].as_str(), How::Primary)
    );
    // 12 of 13: mean 14/3 = 4.67, 12 >= ceil(12.67)? no: 12 < 13 still takes it.
    let _more = hold(primary, 4);
    assert_eq!(Route::plan(&s, 5).how, How::Primary);
    // 13 of 14: mean 5, spill_cap = max(7, 13) = 13: full.
    let _one = hold(primary, 1);
    let route = Route::plan(&s, 5);
    assert_eq!(route.how, How::SpilledAtCap);
    assert_ne!(route.first().unwrap().name, order[0]);
    // The atomic re-check uses the same bound.
    assert!(route.reserve(primary).is_none());
}

#[test]
fn a_spilled_key_stays_until_its_primary_is_below_its_mean() {
    let s = snapshot("placement: {bounded_load: 2.0, spill_min_excess: 0}\n");
    let order: Vec<String> = s.candidates(5).map(|b| b.name.clone()).collect();
    let (primary, other) = (s.backend(&order[0]).unwrap(), s.backend(&order[2]).unwrap());
    let spilled = Some(order[2].as_str());
    // Without a record, the table's order.
    assert_eq!(Route::plan_remembered(&s, 5, None).how, How::Primary);
    // The primary has room (cap 2) but is at its mean (1): the key stays.
    let held = hold(primary, 1);
    let _o = hold(other, 1);
    let stay = Route::plan_remembered(&s, 5, spilled);
    assert_eq!(
        (stay.first().unwrap().name.as_str(), stay.how),
        (order[2].as_str(), How::Pinned)
    );
    // Below its mean again (0 active, mean 2/3): home.
    drop(held);
    let home = Route::plan_remembered(&s, 5, spilled);
    assert_eq!(
        (home.first().unwrap().name.as_str(), home.how),
        (order[0].as_str(), How::Primary)
    );
    // Where it spilled to is down: the table decides.
    let _h = hold(primary, 1);
    other.live.health.set_up(false);
    assert_ne!(
        Route::plan_remembered(&s, 5, spilled).first().unwrap().name,
        order[2]
    );
}

#[test]
fn a_pin_at_its_cap_keeps_its_key_until_twice_the_cap() {
    let s = snapshot("placement: {bounded_load: 1.0, spill_min_excess: 0}\n");
    let order: Vec<String> = s.candidates(5).map(|b| b.name.clone()).collect();
    let pin = Arc::clone(s.backend(&order[1]).unwrap());
    // 2 of 3 active on the pin: mean 1, cap 1; the pin is at its cap
    // but under twice it, so the key stays and no spill is counted.
    let held = hold(&pin, 2);
    let _other = hold(s.backend(&order[2]).unwrap(), 1);
    let route = Route::plan_pinned(&s, 5, &pin);
    assert_eq!(
        (route.first().unwrap().name.as_str(), route.how),
        (order[1].as_str(), How::Pinned)
    );
    assert_eq!(pin.live.traffic.spills_total(), 0);
    assert!(route.reserve(&pin).is_some());
    // 4 of 5: mean 5/3, cap 2, twice the cap 4: the key moves.
    let _more = hold(&pin, 2);
    let route = Route::plan_pinned(&s, 5, &pin);
    assert_ne!(route.first().unwrap().name, order[1]);
    assert_ne!(route.how, How::Pinned);
    assert!(pin.live.traffic.spills_total() >= 1);
    drop(held);
}

#[test]
fn passing_over_a_target_names_the_spill() {
    assert_eq!(How::Primary.passed_over(Spill::Down), How::SpilledDown);
    assert_eq!(How::Pinned.passed_over(Spill::AtCap), How::SpilledAtCap);
    assert_eq!(How::FallbackKey.passed_over(Spill::Down), How::FallbackKey);
    assert_eq!(
        How::SpilledAtCap.passed_over(Spill::Down),
        How::SpilledAtCap
    );
}

/// The keys whose first candidate is `name`, of the first `n` keys.
fn owned_by(s: &Snapshot, name: &str, n: u64) -> Vec<u64> {
    (0..n)
        .map(|i| magpie_core::hash::h64(&i.to_be_bytes()))
        .filter(|&k| s.candidates(k).next().is_some_and(|b| b.name == name))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_backend_back_up_takes_its_keys_over_the_slow_start_ramp() {
    let s = snapshot("placement: {slow_start: 60s}\n");
    let other = snapshot("placement: {slow_start: 60s}\n");
    let keys = owned_by(&s, "a", 3000);
    assert!(keys.len() > 800, "{}", keys.len());
    // Back from down: the ramp starts now, on both instances.
    for snap in [&s, &other] {
        let a = snap.backend("a").unwrap();
        a.live.health.set_up(false);
        a.live.health.set_up(true);
    }
    let to_a = |snap: &Snapshot| -> Vec<u64> {
        (keys.iter().copied())
            .filter(|&k| Route::preview(snap, k).first().unwrap().name == "a")
            .collect()
    };
    assert!(to_a(&s).is_empty(), "none moved at the start");
    let held = Route::plan(&s, keys[0]);
    assert_eq!(held.how, How::SlowStart);
    assert_eq!(
        held.first().unwrap().name,
        s.candidates(keys[0]).nth(1).unwrap().name
    );
    tokio::time::advance(Duration::from_secs(15)).await;
    let quarter = to_a(&s);
    let share = quarter.len() as f64 / keys.len() as f64;
    assert!((0.2..0.3).contains(&share), "{share}");
    assert_eq!(quarter, to_a(&other), "two instances move the same keys");
    tokio::time::advance(Duration::from_secs(15)).await;
    let half = to_a(&s);
    assert!(
        quarter.iter().all(|k| half.contains(k)),
        "a moved key stays moved"
    );
    tokio::time::advance(Duration::from_secs(30)).await;
    assert_eq!(to_a(&s), keys, "all of them at the end");
    // Off: a revived backend takes every key at once.
    let off = snapshot("");
    let a = off.backend("a").unwrap();
    a.live.health.set_up(false);
    a.live.health.set_up(true);
    assert_eq!(to_a(&off), keys);
}

#[tokio::test(start_paused = true)]
async fn a_backend_added_by_a_reload_ramps_and_a_kept_one_does_not() {
    let text = |names: &[&str]| {
        let mut t = "listen: 127.0.0.1:7000\nplacement: {slow_start: 10s}\nbackends:\n".to_string();
        for (i, n) in names.iter().enumerate() {
            t.push_str(&format!(
                "  - {{name: {n}, addr: 127.0.0.1:{}}}\n",
                8001 + i
            ));
        }
        Arc::new(Config::parse(std::path::Path::new("t.yaml"), &t).unwrap())
    };
    let first = Snapshot::build(text(&["a", "b"]), 1, &Default::default()).unwrap();
    let carry = first.live_states();
    let second = Snapshot::build(text(&["a", "b", "c"]), 2, &carry).unwrap();
    let now = tokio::time::Instant::now();
    assert_eq!(
        second.backend("a").unwrap().live.health.since_joined(now),
        None
    );
    assert_eq!(
        second.backend("c").unwrap().live.health.since_joined(now),
        Some(Duration::ZERO)
    );
    let keys = owned_by(&second, "c", 2000);
    assert!(
        keys.iter()
            .all(|&k| Route::preview(&second, k).how == How::SlowStart)
    );
    tokio::time::advance(Duration::from_secs(10)).await;
    assert!(
        keys.iter()
            .all(|&k| Route::preview(&second, k).how == How::Primary)
    );
}

#[tokio::test(start_paused = true)]
async fn slow_start_leaves_pins_alone() {
    let s = snapshot("placement: {slow_start: 60s}\n");
    let a = s.backend("a").unwrap();
    a.live.health.set_up(false);
    a.live.health.set_up(true);
    let key = owned_by(&s, "a", 3000)[0];
    // Its own key, held back from a, but pinned to a: stays on a.
    let route = Route::plan_pinned(&s, key, a);
    assert_eq!(
        (route.first().unwrap().name.as_str(), route.how),
        ("a", How::Pinned)
    );
    // A key pinned elsewhere stays there too.
    let b = s.backend("b").unwrap();
    let route = Route::plan_pinned(&s, key, b);
    assert_eq!(
        (route.first().unwrap().name.as_str(), route.how),
        ("b", How::Pinned)
    );
}
