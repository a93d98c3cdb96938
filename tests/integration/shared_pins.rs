//! Session pins shared through a real `redis-server`: two magpies agree on
//! pinned keys through scale-up, a dead backend is re-bound once for both,
//! and a dead store costs no request anything but its timeout.

use magpie_core::key::text_key;

use crate::support::*;

/// 40 conversations, each started on one magpie and continued on the other
/// after both scaled from 3 to 4 backends: every one stays on its backend,
/// though the table alone would have moved some; new ones reach the 4th.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_magpies_keep_every_conversation_through_scale_up() {
    let redis = RedisServer::start().await;
    let backends = HyperBackends::start(&["a", "b", "c", "d"]).await;
    let pairs = backends.pairs();
    let settings = store_settings(redis.addr, "");
    let fleet = Fleet::start(&settings, &pairs[..3]).await;
    let mut clients = [
        KeepAlive::connect(fleet.magpies[0].addr).await,
        KeepAlive::connect(fleet.magpies[1].addr).await,
    ];
    let mut placed = Vec::new();
    for s in 0..40 {
        let key = format!("conv-{s}");
        let first = clients[s % 2].get_session(&key).await;
        for _ in 0..2 {
            assert_eq!(clients[s % 2].get_session(&key).await, first);
        }
        placed.push((key, first));
    }
    fleet.reload(&settings, &pairs).await;
    let mut moved_by_table = 0;
    for (s, (key, before)) in placed.iter().enumerate() {
        // The other magpie has never seen this conversation.
        let other = (s + 1) % 2;
        for _ in 0..2 {
            assert_eq!(
                &clients[other].get_session(key).await,
                before,
                "{key} moved"
            );
        }
        if fleet.magpies[other].primary(text_key(key.as_bytes())) != *before {
            moved_by_table += 1;
        }
    }
    assert!(
        moved_by_table > 0,
        "no conversation would have moved without shared pins"
    );
    let mut on_d = 0;
    for s in 0..40 {
        let key = format!("new-{s}");
        let got = clients[s % 2].get_session(&key).await;
        assert_eq!(clients[(s + 1) % 2].get_session(&key).await, got);
        on_d += usize::from(got == "d");
    }
    assert!(on_d > 0, "no new conversation reached the new backend");
    let ops: u64 = fleet.magpies.iter().map(|m| store_ops(m, "ok")).sum();
    assert!(ops >= 80, "store round trips: {ops}");
}

/// The store dies mid-run: no request fails, new keys go by the table
/// (counted), and the store is not asked while it backs off; back up, new
/// keys are bound again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_store_costs_no_request() {
    let mut redis = RedisServer::start().await;
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let fleet = Fleet::start(&store_settings(redis.addr, ""), &backends.pairs()).await;
    let magpie = &fleet.magpies[0];
    let mut client = KeepAlive::connect(magpie.addr).await;
    for s in 0..10 {
        client.get_session(&format!("before-{s}")).await;
    }
    redis.kill();
    // Every request is answered (get_session asserts 200), pinned or not.
    for s in 0..10 {
        client.get_session(&format!("before-{s}")).await;
        let key = format!("during-{s}");
        assert_eq!(
            client.get_session(&key).await,
            magpie.primary(text_key(key.as_bytes()))
        );
    }
    let fallbacks = magpie.metric("magpie_session_store_fallbacks_total", &[]);
    assert!(fallbacks >= 1, "no fallback counted");
    assert!(
        store_ops(magpie, "error") + store_ops(magpie, "timeout") >= 1,
        "no failed round trip counted"
    );
    assert!(!magpie.probe.store_connected());
    assert_eq!(magpie.metric("magpie_session_store_up", &[]), 0);

    redis.restart().await;
    within("the store to reconnect", async {
        while !magpie.probe.store_connected() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    let ok_before = store_ops(magpie, "ok");
    // Past the back-off, a new key is bound in the store again.
    within("a new key to be bound in the store", async {
        let mut s = 0;
        while store_ops(magpie, "ok") == ok_before {
            client.get_session(&format!("after-{s}")).await;
            s += 1;
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// A backend with pinned conversations dies: each of them is re-bound once,
/// and both magpies send it to the same new backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_backend_is_rebound_once_for_both() {
    let redis = RedisServer::start().await;
    let mut backends = HyperBackends::start(&["a", "b", "c"]).await;
    let extra = "health:\n  interval: 100ms\n  timeout: 100ms\n  rise: 1\n  fall: 1\n";
    let fleet = Fleet::start(&store_settings(redis.addr, extra), &backends.pairs()).await;
    let mut clients = [
        KeepAlive::connect(fleet.magpies[0].addr).await,
        KeepAlive::connect(fleet.magpies[1].addr).await,
    ];
    let mut on_b = Vec::new();
    for s in 0..30 {
        let key = format!("conv-{s}");
        if clients[0].get_session(&key).await == "b" {
            on_b.push(key);
        }
    }
    assert!(!on_b.is_empty(), "no conversation on b");
    backends.kill("b");
    for m in &fleet.magpies {
        let b = m.backend("b");
        within("both magpies to see b down", async {
            while b.is_up() {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
        .await;
    }
    for key in &on_b {
        let first = clients[0].get_session(key).await;
        assert_ne!(first, "b");
        assert_eq!(
            clients[1].get_session(key).await,
            first,
            "{key}: the magpies disagree"
        );
        assert_eq!(clients[0].get_session(key).await, first);
    }
    let replaced: u64 = (fleet.magpies.iter())
        .map(|m| m.metric("magpie_session_bindings_replaced_total", &[]))
        .sum();
    assert_eq!(
        replaced,
        on_b.len() as u64,
        "each dead binding is replaced exactly once"
    );
}
