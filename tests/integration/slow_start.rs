//! `placement.slow_start` through real sockets: a backend added by a
//! reload takes none of its keys at the start of its ramp (they stay where
//! the table without it would send them, counted as `slow_start`), while
//! without `slow_start` it takes them all at once; two magpies with the same
//! config send every key to the same backend.

use std::sync::Arc;

use magpie_core::key::text_key;
use magpie_proxy::ops::reload::{Outcome, Reloader};

use crate::support::*;

/// Starts magpie on `a` and `b` with `extra`, then reloads it with `c` added.
async fn added_c(backends: &HttpBackends, extra: &str) -> (Magpie, TempFile) {
    let settings = format!("{SESSION_KEY}reload:\n  watch: false\n{extra}");
    let yaml = |n| config_yaml_with_admin("127.0.0.1:0", &settings, &backends.list[..n]);
    let file = TempFile::new("magpie.yaml", &yaml(2));
    let magpie = Magpie::start_file(&file.path).await;
    std::fs::write(&file.path, yaml(3)).expect("add c");
    let mut reloader = Reloader::new(file.path.clone(), Arc::clone(&magpie.instance));
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
