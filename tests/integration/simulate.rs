//! `magpie simulate` from the built binary: the JSON report and bad options.

use std::process::Command;

#[test]
fn simulate_json_from_the_binary() {
    let out = Command::new(env!("CARGO_BIN_EXE_magpie"))
        .args(["simulate", "--json", "--keys", "20000"])
        .output()
        .expect("run magpie");
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["keys"], 20000);
    assert_eq!(v["nodes_before"], 10);
    assert_eq!(v["nodes_after"], 11);
    let rows = v["rows"].as_array().expect("rows");
    let ids: Vec<&str> = rows.iter().filter_map(|r| r["scheme"].as_str()).collect();
    assert_eq!(ids, magpie_lab::simulate::SCHEMES);
    let moved = |id: &str| {
        rows.iter()
            .find(|r| r["scheme"] == id)
            .and_then(|r| r["moved"].as_f64())
            .expect("moved")
    };
    assert!(moved("mod-n") > 0.85);
    assert!((moved("maglev") - 1.0 / 11.0).abs() < 0.02);
}

#[test]
fn simulate_rejects_bad_options_without_panicking() {
    let out = Command::new(env!("CARGO_BIN_EXE_magpie"))
        .args(["simulate", "--remove", "42"])
        .output()
        .expect("run magpie");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no such node"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
