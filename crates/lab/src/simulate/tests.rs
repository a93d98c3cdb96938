//! The lab end to end: every option, the JSON shape, and golden results
//! that pin the lab's conventions.

use super::experiment::{Key, plain_keys, salted_keys};
use super::place::{place, place_all};
use super::*;
use magpie_core::hash::h64;

fn args(keys: u64) -> SimulateArgs {
    SimulateArgs {
        keys,
        nodes: 10,
        ..SimulateArgs::default()
    }
}

fn report(a: &SimulateArgs) -> Report {
    run(&Experiment::from_args(a).unwrap()).unwrap()
}

fn row<'a>(r: &'a Report, scheme: &str) -> &'a Row {
    r.rows.iter().find(|x| x.scheme == scheme).unwrap()
}

#[test]
fn default_experiment_shows_the_classic_result() {
    let r = report(&args(20_000));
    assert_eq!((r.keys, r.nodes_before, r.nodes_after), (20_000, 10, 11));
    assert_eq!(r.rows.iter().map(|x| x.scheme).collect::<Vec<_>>(), SCHEMES);
    let ideal = 1.0 / 11.0;
    let m = row(&r, "mod-n");
    assert!(
        (m.moved - 10.0 / 11.0).abs() < 0.02,
        "mod-n moved {}",
        m.moved
    );
    assert!(!m.only_to_new);
    for s in ["ring-100", "ring-1000", "rendezvous", "jump", "maglev"] {
        let x = row(&r, s);
        assert!((x.moved - ideal).abs() < 0.02, "{s} moved {}", x.moved);
    }
    for s in [
        "ring-1",
        "ring-10",
        "ring-100",
        "ring-1000",
        "rendezvous",
        "jump",
    ] {
        assert!(row(&r, s).only_to_new, "{s}");
    }
    // More points, better balance; bounded-ring keeps its cap.
    assert!(row(&r, "ring-1").peak_before > row(&r, "ring-1000").peak_before);
    assert!(row(&r, "ring-1000").peak_before < 1.1);
    let b = row(&r, "bounded-ring");
    assert!(
        b.peak_before <= 1.10 + 1e-9 && b.peak_after <= 1.10 + 1e-9,
        "{b:?}"
    );
    assert!(row(&r, "maglev").peak_before < 1.05);
    assert!(r.warnings.is_empty());
}

#[test]
fn keys_option_sets_the_key_count() {
    let r = report(&args(3_000));
    assert_eq!(r.keys, 3_000);
    // Fractions are whole keys out of 3000.
    for x in &r.rows {
        let moved = x.moved * 3_000.0;
        assert!((moved - moved.round()).abs() < 1e-6, "{x:?}");
    }
    assert!(render(&r).contains("3000 keys (user:0 … user:2999)"));
    assert!(matches!(
        Experiment::from_args(&args(0)),
        Err(SimulateError::Keys(0))
    ));
}

#[test]
fn nodes_option_sets_the_pool_size() {
    let r = report(&SimulateArgs {
        nodes: 40,
        ..args(10_000)
    });
    assert_eq!(
        (r.nodes_before, r.nodes_after, r.node.as_str()),
        (40, 41, "40")
    );
    assert!((row(&r, "mod-n").moved - 40.0 / 41.0).abs() < 0.02);
    assert!((row(&r, "jump").moved - 1.0 / 41.0).abs() < 0.01);
    assert!(row(&r, "jump").only_to_new);
    for bad in [0, MAX_NODES + 1] {
        let a = SimulateArgs {
            nodes: bad,
            ..args(10)
        };
        assert!(matches!(
            Experiment::from_args(&a),
            Err(SimulateError::Nodes(_))
        ));
    }
}

#[test]
fn remove_option_reports_where_the_keys_went() {
    let a = SimulateArgs {
        remove: Some("3".into()),
        ..args(10_000)
    };
    let r = report(&a);
    assert_eq!(
        (r.nodes_before, r.nodes_after, r.change),
        (10, 9, ChangeKind::Remove)
    );
    for x in &r.rows {
        let went = x.went_to.as_ref().unwrap();
        assert_eq!(went.len(), 9);
        assert!(went.iter().all(|w| w.node != "3"));
        let received: u64 = went.iter().map(|w| w.keys).sum();
        // Every key node 3 held went somewhere, and nothing else counts.
        let held = (x.moved * 10_000.0).round() as u64;
        if x.only_to_new {
            assert_eq!(received, held, "{}", x.scheme);
        } else {
            assert!(received <= held, "{}", x.scheme);
        }
    }
    // Names, not positions: ring and rendezvous move only node 3's keys;
    // jump renumbers buckets 4..9 and moves far more.
    for s in ["ring-100", "ring-1000", "rendezvous"] {
        let x = row(&r, s);
        assert!(x.only_to_new, "{s}");
        assert!((x.moved - 0.1).abs() < 0.02, "{s} {}", x.moved);
    }
    assert!(!row(&r, "jump").only_to_new);
    assert!(row(&r, "jump").moved > 0.3);
    assert!(row(&r, "maglev").moved < 0.1 + 0.02);
    // Rendezvous spreads the removed keys over all survivors.
    let went = row(&r, "rendezvous").went_to.as_ref().unwrap();
    assert!(went.iter().all(|w| w.keys > 50), "{went:?}");
    assert!(render(&r).contains("where node 3's keys went"));

    for bad in ["10", "03", "x", "-1"] {
        let a = SimulateArgs {
            remove: Some(bad.into()),
            ..args(10)
        };
        assert!(
            matches!(
                Experiment::from_args(&a),
                Err(SimulateError::NoSuchNode { .. })
            ),
            "{bad}"
        );
    }
    let one = SimulateArgs {
        nodes: 1,
        remove: Some("0".into()),
        ..args(10)
    };
    assert!(matches!(
        Experiment::from_args(&one),
        Err(SimulateError::RemoveLast)
    ));
}

#[test]
fn weight_option_gives_a_heavier_node_more_keys() {
    let a = SimulateArgs {
        weight: vec!["3=2".into()],
        ..args(20_000)
    };
    let r = report(&a);
    for s in ["ring-1000", "rendezvous", "maglev", "bounded-ring"] {
        let x = row(&r, s);
        assert_eq!(x.uses_weights, Some(true));
        let w = &x.weights[0];
        assert_eq!((w.node.as_str(), w.weight), ("3", 2));
        let units = w.units_before.unwrap();
        assert!((units - 2.0).abs() < 0.15, "{s}: {units}");
        assert!((w.units_after.unwrap() - 2.0).abs() < 0.15, "{s}");
    }
    let m = row(&r, "mod-n");
    assert_eq!(m.uses_weights, Some(false));
    // mod N ignores the weight: node 3 gets a plain 1/10, i.e. 1.1 units of 11.
    assert!((m.weights[0].units_before.unwrap() - 1.1).abs() < 0.1);
    assert!(render(&r).contains("(ignores weights)"));

    // The joining node can be weighted too, and weight 0 drains a node.
    let a = SimulateArgs {
        weight: vec!["10=2".into(), "0=0".into()],
        ..args(5_000)
    };
    let r = report(&a);
    let x = row(&r, "maglev");
    assert_eq!(x.weights[1].node, "10");
    assert_eq!(x.weights[1].keys_before, None);
    assert_eq!(x.weights[0].keys_before, Some(0));

    for bad in ["3", "3=x", "3=-1", "3=101", "11=2", "x=1"] {
        let a = SimulateArgs {
            weight: vec![bad.into()],
            ..args(10)
        };
        assert!(Experiment::from_args(&a).is_err(), "{bad}");
    }
    let twice = SimulateArgs {
        weight: vec!["1=2".into(), "1=3".into()],
        ..args(10)
    };
    assert!(matches!(
        Experiment::from_args(&twice),
        Err(SimulateError::WeightTwice(1))
    ));
    let all_zero = SimulateArgs {
        nodes: 1,
        remove: None,
        weight: vec!["0=0".into(), "1=0".into()],
        ..args(10)
    };
    assert!(matches!(
        Experiment::from_args(&all_zero),
        Err(SimulateError::Placement(PlacementError::AllWeightsZero))
    ));
}

#[test]
fn hot_option_reports_request_load() {
    // Factor 1: request load is the key count.
    let flat = report(&SimulateArgs {
        hot: Some("0.01:1".into()),
        ..args(5_000)
    });
    for x in &flat.rows {
        assert!((x.load_peak_before.unwrap() - x.peak_before).abs() < 1e-9);
        assert!((x.load_peak_after.unwrap() - x.peak_after).abs() < 1e-9);
    }
    let hot = report(&SimulateArgs {
        hot: Some("0.01:100".into()),
        ..args(10_000)
    });
    assert_eq!(hot.hot.unwrap().every, 100);
    // 100 hot keys carry about half the load: a few of them decide the
    // peak, and even the best-balanced schemes get visibly uneven.
    for s in ["ring-1000", "rendezvous", "maglev"] {
        let x = row(&hot, s);
        assert!(
            x.load_peak_before.unwrap() > x.peak_before + 0.05,
            "{s}: {x:?}"
        );
    }
    // Caps on key counts do not cap request load.
    let b = row(&hot, "bounded-ring");
    assert!(b.peak_before <= BOUNDED_FACTOR + 1e-9);
    assert!(b.load_peak_before.unwrap() > BOUNDED_FACTOR + 0.02, "{b:?}");
    assert!(render(&hot).contains("hot keys: every 100th key"));
    for bad in ["0:5", "0.5", "2:3", "0.1:0.5", "x:1", "0.1:inf"] {
        let a = SimulateArgs {
            hot: Some(bad.into()),
            ..args(10)
        };
        assert!(
            matches!(Experiment::from_args(&a), Err(SimulateError::Hot(_))),
            "{bad}"
        );
    }
}

#[test]
fn salt_option_spreads_hot_keys() {
    let a = SimulateArgs {
        hot: Some("0.01:1000".into()),
        salt: Some(16),
        ..args(10_000)
    };
    let r = report(&a);
    assert_eq!(r.salt, Some(16));
    for s in ["ring-1000", "rendezvous", "jump", "maglev"] {
        let x = row(&r, s);
        let (plain, salted) = (
            x.load_peak_before.unwrap(),
            x.salted_load_peak_before.unwrap(),
        );
        assert!(salted < plain - 0.1, "{s}: {plain} -> {salted}");
        assert!(
            x.salted_load_peak_after.unwrap() < x.load_peak_after.unwrap(),
            "{s}"
        );
    }
    // Salting replaces each hot key by K sub-keys with the same total load.
    let e = Experiment::from_args(&a).unwrap();
    let plain = plain_keys(&e);
    let salted = salted_keys(&plain, e.hot.unwrap(), 16);
    assert_eq!(salted.len(), 10_000 + 100 * 15);
    let sum = |ks: &[Key]| ks.iter().map(|k| k.load).sum::<f64>();
    assert!((sum(&plain) - sum(&salted)).abs() < 1e-6);
    assert_eq!(salted[0].text, "user:0#s0");
    assert_eq!(salted[16].text, "user:1");

    let no_hot = SimulateArgs {
        salt: Some(4),
        ..args(10)
    };
    assert!(matches!(
        Experiment::from_args(&no_hot),
        Err(SimulateError::SaltWithoutHot)
    ));
    let zero = SimulateArgs {
        salt: Some(0),
        hot: Some("0.1:2".into()),
        ..args(10)
    };
    assert!(matches!(
        Experiment::from_args(&zero),
        Err(SimulateError::Salt(0))
    ));
}

#[test]
fn replicas_and_zones_option() {
    let with = |r: u32, z: u32| SimulateArgs {
        replicas: Some(r),
        zones: Some(z),
        ..args(10_000)
    };
    // Two zones by parity: a plain pair lands in one zone about 4 times
    // in 9, and the zone rule must then change it.
    let rep = report(&with(2, 2)).replicas.unwrap();
    assert!((rep.changed - 4.0 / 9.0).abs() < 0.05, "{rep:?}");
    // One zone per node: the rule never changes anything.
    let rep = report(&with(3, 10)).replicas.unwrap();
    assert_eq!(rep.changed_keys, 0);
    assert_eq!(rep.peak_plain, rep.peak_zoned);
    assert!(render(&report(&with(2, 5))).contains("zone rule changed the replica set"));

    for (r, z) in [(0, 2), (11, 20), (3, 2), (2, 0)] {
        assert!(Experiment::from_args(&with(r, z)).is_err(), "{r} {z}");
    }
    let alone = SimulateArgs {
        replicas: Some(2),
        ..args(10)
    };
    assert!(matches!(
        Experiment::from_args(&alone),
        Err(SimulateError::ReplicasWithoutZones)
    ));
}

#[test]
fn json_has_the_fixed_shape_and_ids() {
    let r = report(&args(2_000));
    let text = serde_json::to_string(&r).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["keys"], 2_000);
    assert_eq!(v["nodes_before"], 10);
    assert_eq!(v["nodes_after"], 11);
    let rows = v["rows"].as_array().unwrap();
    let ids: Vec<&str> = rows.iter().map(|x| x["scheme"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [
            "mod-n",
            "ring-1",
            "ring-10",
            "ring-100",
            "ring-1000",
            "rendezvous",
            "jump",
            "bounded-ring",
            "maglev"
        ]
    );
    for x in rows {
        assert!(x["moved"].as_f64().unwrap() > 0.0);
        assert!(x["only_to_new"].is_boolean());
        assert!(x["peak_before"].as_f64().unwrap() >= 1.0);
        assert!(x["peak_after"].as_f64().unwrap() >= 1.0);
        // Options not given leave no trace.
        assert!(x.get("went_to").is_none() && x.get("load_peak_before").is_none());
    }
    let table = render(&r);
    for id in SCHEMES {
        assert!(table.lines().any(|l| l.starts_with(id)), "{id}");
    }
}

/// The lab follows the fixed conventions; values from an independent
/// Python transcription over `hashlib.blake2b(digest_size=8)`.
#[test]
fn lab_conventions_golden() {
    let e = Experiment::from_args(&args(10)).unwrap();
    let (pool, _) = e.pools().unwrap();
    let keys: Vec<Key> = ["user:0", "user:1", "user:42", "user:99999", "session-abc"]
        .iter()
        .map(|t| Key {
            text: t.to_string(),
            hash: h64(t.as_bytes()),
            load: 1.0,
        })
        .collect();
    let got = |s: &str| {
        let id = SchemeId::ALL
            .into_iter()
            .find(|id| id.as_str() == s)
            .unwrap();
        place(id, &pool, &keys).unwrap()
    };
    assert_eq!(got("mod-n"), [1, 8, 2, 8, 3]);
    assert_eq!(got("jump"), [2, 1, 9, 3, 3]);
    assert_eq!(got("rendezvous"), [4, 4, 8, 9, 0]);
    assert_eq!(got("ring-100"), [8, 0, 6, 6, 4]);
}

/// Placing all schemes side by side gives what placing each scheme on each
/// pool one at a time gives: joins, removals, weights (0 included) and a
/// hot, salted key list.
#[test]
fn side_by_side_equals_one_at_a_time() {
    let cases = [
        args(3_000),
        SimulateArgs {
            remove: Some("3".into()),
            ..args(3_000)
        },
        SimulateArgs {
            weight: vec!["2=3".into(), "5=0".into(), "10=2".into()],
            ..args(3_000)
        },
    ];
    for a in cases {
        let e = Experiment::from_args(&a).unwrap();
        let (before, after) = e.pools().unwrap();
        let plain = plain_keys(&e);
        let hot = Hot {
            fraction: 0.01,
            factor: 10.0,
            every: 100,
        };
        for keys in [plain.clone(), salted_keys(&plain, hot, 4)] {
            let all = place_all(&before, &after, &keys).unwrap();
            assert_eq!(all.len(), SchemeId::ALL.len());
            for (id, (a, b)) in SchemeId::ALL.into_iter().zip(all) {
                assert_eq!(a, place(id, &before, &keys).unwrap(), "{id} before");
                assert_eq!(b, place(id, &after, &keys).unwrap(), "{id} after");
            }
        }
    }
}
