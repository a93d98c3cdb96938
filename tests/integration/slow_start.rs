//! `placement.slow_start` through real sockets: a backend added by a
//! reload takes none of its keys at the start of its ramp (they stay where
//! the table without it would send them, counted as `slow_start`), while
//! without `slow_start` it takes them all at once; two magpies with the same
//! config send every key to the same backend.

use magpie_core::key::text_key;
use magpie_proxy::testing::Outcome;

use crate::support::*;

/// Starts magpie on `a` and `b` with `extra`, then reloads it with `c` added.
async fn added_c(backends: &HttpBackends, extra: &str) -> (Magpie, TempFile) {
    let settings = format!("{SESSION_KEY}reload:\n  watch: false\n{extra}");
    let yaml = |n| config_yaml_with_admin("127.0.0.1:0", &settings, &backends.list[..n]);
    let file = TempFile::new("magpie.yaml", &yaml(2));
    let magpie = Magpie::start_file(&file.path).await;
    std::fs::write(&file.path, yaml(3)).expect("add c");
    let mut reloader = magpie.probe.reloader(file.path.clone());
    assert!(matches!(
        reloader.reload(true).await,
        Ok(Outcome::Applied { version: 2, .. })
    ));
    (magpie, file)
}

/// Sessions whose first candidate is now `c`.
fn keys_of_c(magpie: &Magpie) -> Vec<String> {
    (0..)
        .map(|i| format!("s{i}"))
        .filter(|k| magpie.candidates(text_key(k.as_bytes()))[0] == "c")
        .take(12)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_added_backend_takes_its_keys_over_its_ramp_and_at_once_without() {
    let backends = HttpBackends::start(&["a", "b", "c"]).await;
    let (slow, _file) = added_c(&backends, "placement:\n  slow_start: 1h\n").await;
    let (twin, _twin_file) = added_c(&backends, "placement:\n  slow_start: 1h\n").await;
    let keys = keys_of_c(&slow);
    for k in &keys {
        let without_c = slow.candidates(text_key(k.as_bytes()))[1].clone();
        let served = backend_of(&http_get(slow.addr, Some(k)).await);
        assert_eq!(served, without_c, "{k} stays off c at the ramp's start");
        assert_eq!(backend_of(&http_get(twin.addr, Some(k)).await), served);
    }
    let admin = slow.admin.expect("admin is on");
    let (_, text) = admin_get(admin, "/metrics").await;
    let how = metric_sum(
        &text,
        "magpie_requests_routed_total",
        &["how=\"slow_start\""],
    );
    assert_eq!(how, keys.len() as f64, "{text}");
    let (_, table) = admin_get(admin, "/table").await;
    let table: serde_json::Value = serde_json::from_str(&table).expect("JSON");
    let progress = |name: &str| {
        (table["backends"].as_array().expect("backends").iter())
            .find(|b| b["name"] == name)
            .map(|b| b["slow_start_progress"].clone())
    };
    assert!(
        progress("c")
            .and_then(|p| p.as_f64())
            .is_some_and(|p| p < 0.01)
    );
    assert_eq!(progress("a"), Some(serde_json::Value::Null));

    let (fast, _fast_file) = added_c(&backends, "").await;
    for k in &keys {
        assert_eq!(backend_of(&http_get(fast.addr, Some(k)).await), "c");
    }
    for m in [slow, twin, fast] {
        m.stop().await;
    }
}

/// Two magpies with their own health checks see a backend come back at
/// moments up to a check interval (plus its jitter) apart; over its ramp
/// they send a key differently only when its fraction falls between their
/// two progresses. Measured: the largest share of the backend's keys the
/// two route differently at one moment of the ramp.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_magpies_agree_on_a_revived_backends_keys_but_for_a_check_interval() {
    let others = HttpBackends::start(&["a", "b"]).await;
    let spare = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let c_addr = spare.local_addr().expect("its address");
    drop(spare);
    let c = HttpBackends::start_on(c_addr, &["c"]).await;
    let mut list = others.list.clone();
    list.extend(c.list.iter().cloned());
    let settings = format!(
        "mode: http\n{SESSION_KEY}health:\n  interval: 200ms\n  timeout: 200ms\n  rise: 1\n  fall: 2\nplacement:\n  slow_start: 4s\n"
    );
    let yaml = config_yaml("127.0.0.1:0", &settings, &list);
    let (one, two) = (Magpie::start(&yaml).await, Magpie::start(&yaml).await);
    let up_on_both = |up: bool| {
        let (one, two) = (&one, &two);
        async move {
            within("both magpies to see c's health change", async {
                while one.backend("c").is_up() != up || two.backend("c").is_up() != up {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            })
            .await;
        }
    };
    drop(c);
    up_on_both(false).await;
    let c = HttpBackends::start_on(c_addr, &["c"]).await;
    up_on_both(true).await;
    let keys: Vec<u64> = (0..20_000u64)
        .map(|i| magpie_core::hash::h64(&i.to_be_bytes()))
        .filter(|&k| one.candidates(k)[0] == "c")
        .collect();
    let to_c = |m: &Magpie, k: u64| m.probe.route(k).is_some_and(|b| b == "c");
    let mut worst = 0.0f64;
    let mut last_share = 0.0;
    // Sampled over the 4 s ramp and a little past it.
    for _ in 0..45 {
        let differ = keys
            .iter()
            .filter(|&&k| to_c(&one, k) != to_c(&two, k))
            .count();
        worst = worst.max(differ as f64 / keys.len() as f64);
        let share = keys.iter().filter(|&&k| to_c(&one, k)).count() as f64 / keys.len() as f64;
        assert!(share >= last_share, "the share of moved keys only grows");
        last_share = share;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    eprintln!(
        "slow start: at most {:.1}% of c's keys routed apart by two magpies",
        worst * 100.0
    );
    // One check interval (200 ms, with up to 10% jitter) of a 4 s ramp is
    // 5.5%; the rest is room for a loaded machine's scheduling.
    assert!(worst <= 0.10, "{worst}");
    assert_eq!(last_share, 1.0, "all moved after the ramp");
    drop(c);
    one.stop().await;
    two.stop().await;
}
