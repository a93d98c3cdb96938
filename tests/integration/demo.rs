//! `magpie demo`, run as a process.

use crate::support::*;

/// `magpie demo --load` runs its workload through magpie and through round
/// robin, and magpie keeps more of the prefix caches than round robin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_load_shows_magpie_keeping_the_caches() {
    let run = tokio::process::Command::new(magpie_bin())
        .args(["demo", "--load"])
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .output();
    let out = within_for(std::time::Duration::from_secs(120), "demo --load", run)
        .await
        .expect("run magpie demo --load");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ratio = |router: &str| -> f64 {
        let row = text
            .lines()
            .find(|l| l.starts_with(&format!("| {router} |")))
            .unwrap_or_else(|| panic!("no {router} row in:\n{text}"));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 7, "{row}");
        cells[2].parse().unwrap_or_else(|e| panic!("{row}: {e}"))
    };
    assert!(
        text.contains("| router | prefix-cache hit ratio | prefill ÷ ideal | TTFT p50 / p99 | split conversations |"),
        "{text}"
    );
    assert!(ratio("magpie") > ratio("round robin"), "{text}");
    assert!(text.contains("with sessions"), "{text}");
    assert!(
        text.contains("0 of "),
        "pins moved a live conversation:\n{text}"
    );
}
