//! The workload against simulated engines on 127.0.0.1:0, in-process.

use clap::Parser;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::engine::{self, EngineConfig};

/// Later options override earlier ones, so a test can change a default.
#[derive(Parser)]
#[command(args_override_self = true)]
struct Cli {
    #[command(flatten)]
    args: WorkloadArgs,
}

fn args(urls: &[String], extra: &[&str]) -> WorkloadArgs {
    let url = urls.join(",");
    let mut argv = vec![
        "workload",
        "--url",
        &url,
        "--conversations",
        "6",
        "--turns",
        "3",
        "--system-prompts",
        "2",
        "--system-tokens",
        "200",
        "--user-tokens",
        "20",
        "--max-tokens",
        "8",
        "--rate",
        "1000",
        "--think-ms",
        "1",
        "--max-seconds",
        "30",
    ];
    argv.extend_from_slice(extra);
    Cli::parse_from(argv).args
}

async fn engines(n: usize, stop: &CancellationToken) -> Vec<String> {
    let mut urls = Vec::new();
    for i in 0..n {
        let config = EngineConfig {
            name: format!("r{i}"),
            prefill_us_per_token: 0.0,
            decode_ms_per_token: 0.0,
            ..EngineConfig::default()
        };
        let e = engine::start(config, "127.0.0.1:0".parse().unwrap(), stop.clone())
            .await
            .unwrap();
        urls.push(format!("http://{}", e.addr()));
    }
    urls
}

#[tokio::test]
async fn one_engine_one_connection_is_the_ideal() {
    let stop = CancellationToken::new();
    let urls = engines(1, &stop).await;
    let summary = run(&args(&urls, &["--connections", "1"])).await.unwrap();
    assert_eq!((summary.requests, summary.errors), (18, 0), "{summary}");
    assert!(summary.hit_ratio > 0.5, "{summary}");
    // Requests one at a time on one engine: it caches exactly what an
    // infinite shared cache would.
    assert_eq!(
        summary.uncached_tokens, summary.ideal_uncached_tokens,
        "{summary}"
    );
    assert_eq!(summary.split_conversations, 0);
    assert_eq!(summary.engines["r0"], 18);
    assert_eq!(summary.engines_prefill["r0"], summary.uncached_tokens);
    assert_eq!(summary.prefill_share_max_over_mean, 1.0);
    stop.cancel();
}

/// With tool definitions the engine renders them into the head, and the
/// workload's ideal renders them the same way.
#[tokio::test]
async fn tools_are_sent_and_the_ideal_counts_them() {
    let stop = CancellationToken::new();
    let urls = engines(1, &stop).await;
    let plain = run(&args(&urls, &["--connections", "1"])).await.unwrap();
    let stop2 = CancellationToken::new();
    let urls = engines(1, &stop2).await;
    let with_tools = args(&urls, &["--connections", "1", "--tool-tokens", "300"]);
    let summary = run(&with_tools).await.unwrap();
    assert_eq!(summary.errors, 0, "{summary}");
    assert_eq!(
        summary.uncached_tokens, summary.ideal_uncached_tokens,
        "{summary}"
    );
    // Every request's prompt grew by the tools (6 conversations x 3 turns).
    assert!(
        summary.prompt_tokens >= plain.prompt_tokens + 18 * 300,
        "{summary} against {plain}"
    );
    stop.cancel();
    stop2.cancel();
}

#[tokio::test]
async fn alternating_urls_split_conversations_and_cost_prefill() {
    let stop = CancellationToken::new();
    let urls = engines(2, &stop).await;
    // One conversation, so that its turns alone take the URLs in turn (with
    // several, which turn gets which URL depends on their interleaving).
    let one = [
        "--key",
        "none",
        "--no-stream",
        "--conversations",
        "1",
        "--turns",
        "6",
    ];
    let summary = run(&args(&urls, &one)).await.unwrap();
    assert_eq!((summary.requests, summary.errors), (6, 0), "{summary}");
    // Requests take the URLs in turn, whatever their conversation: it meets
    // both engines.
    assert_eq!(summary.split_conversations, 1, "{summary}");
    assert_eq!(summary.engines.len(), 2);
    assert!(summary.prefill_vs_ideal > 1.0, "{summary}");
    // Each engine's prefill is its prompts less its cache's hits: together
    // the run's, the busier above the mean.
    let computed: u64 = summary.engines_prefill.values().sum();
    assert_eq!(computed, summary.uncached_tokens, "{summary}");
    assert!(summary.prefill_share_max_over_mean > 1.0, "{summary}");
    stop.cancel();
}

#[tokio::test]
async fn the_scale_up_command_runs_and_moves_are_counted() {
    let stop = CancellationToken::new();
    let urls = engines(1, &stop).await;
    let extra = [
        "--scale-up-at",
        "0",
        "--scale-up-cmd",
        "true",
        "--think-ms",
        "200",
    ];
    let summary = run(&args(&urls, &extra)).await.unwrap();
    let s = summary.scale_up.as_ref().unwrap();
    assert_eq!(s.status, "ok");
    assert_eq!(s.moved, 0, "one engine: nothing can move");
    assert_eq!(summary.errors, 0, "{summary}");
    stop.cancel();
}

#[tokio::test]
async fn an_unreachable_url_is_counted_as_errors_not_a_hang() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let summary = run(&args(&[url], &[])).await.unwrap();
    assert_eq!(summary.requests, 6, "first turns only: {summary}");
    assert_eq!(summary.errors, 6);
}

#[test]
fn nonsense_options_are_refused() {
    for extra in [
        &["--rate", "0"][..],
        &["--turns", "0"],
        &["--max-seconds", "nan"],
        &["--scale-up-at", "100", "--scale-up-cmd", "true"],
    ] {
        assert!(
            args(&["http://127.0.0.1:1".into()], extra)
                .validate()
                .is_err(),
            "{extra:?}"
        );
    }
    assert!(
        args(&["https://127.0.0.1:1".into()], &[])
            .validate()
            .is_err()
    );
    assert!(args(&["http://127.0.0.1:1".into()], &[]).validate().is_ok());
}

#[tokio::test]
async fn records_are_written_one_json_line_per_request() {
    let stop = CancellationToken::new();
    let urls = engines(1, &stop).await;
    let path = std::env::temp_dir().join(format!("magpie-records-{}.jsonl", std::process::id()));
    let path_arg = path.to_str().unwrap();
    main(&args(&urls, &["--records", path_arg, "--json"]))
        .await
        .unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 18);
    assert!(
        lines
            .iter()
            .all(|r| r["engine"] == "r0" && r["error"].is_null())
    );
    let turns: Vec<u64> = lines.iter().map(|r| r["turn"].as_u64().unwrap()).collect();
    assert_eq!(turns.iter().filter(|&&t| t == 0).count(), 6);
    std::fs::remove_file(&path).unwrap();
    stop.cancel();
}

/// A small trace in Mooncake's format: conversation A of three turns,
/// B of two (each extends the last turn's whole blocks), C alone with its
/// own system block; returns its path.
fn small_trace(name: &str) -> std::path::PathBuf {
    let lines = [
        (0, 1400, "[0, 1, 2]"),
        (10, 1300, "[0, 3, 4]"),
        (20, 1900, "[0, 1, 6, 7]"),
        (30, 1800, "[0, 3, 4, 8]"),
        (40, 2300, "[0, 1, 6, 7, 9]"),
        (50, 900, "[20, 21]"),
    ];
    let text: Vec<String> = (lines.iter())
        .map(|(ms, input, ids)| {
            format!(r#"{{"timestamp": {ms}, "input_length": {input}, "output_length": 40, "hash_ids": {ids}}}"#)
        })
        .collect();
    let path = std::env::temp_dir().join(format!("magpie-{name}-{}.jsonl", std::process::id()));
    std::fs::write(&path, text.join("\n")).unwrap();
    path
}

fn trace_args(url: &str, trace: &std::path::Path, extra: &[&str]) -> WorkloadArgs {
    let trace = trace.to_str().unwrap();
    let mut argv = vec![
        "workload",
        "--url",
        url,
        "--trace",
        trace,
        "--speedup",
        "100",
    ];
    argv.extend_from_slice(extra);
    Cli::parse_from(argv).args
}

/// One engine, one connection: the engine caches exactly what the ideal
/// cache holds, and the rendered ideal is the trace's own figure less the
/// chat template's markers.
#[tokio::test]
async fn a_trace_replays_its_conversations_turn_by_turn() {
    let stop = CancellationToken::new();
    let urls = engines(1, &stop).await;
    let path = small_trace("replay");
    let args = trace_args(
        &urls[0],
        &path,
        &["--connections", "1", "--token-scale", "4"],
    );
    let summary = run(&args).await.unwrap();
    assert_eq!((summary.requests, summary.errors), (6, 0), "{summary}");
    let trace = summary.trace.as_ref().unwrap();
    assert_eq!((trace.conversations, trace.max_turns), (3, 3));
    assert!((trace.ideal_hit_ratio - 5120.0 / 9600.0).abs() < 1e-9);
    // Below the trace's figure by the template's markers (about 20 tokens
    // a request, never cached whole) and the engine blocks a shared prefix
    // ends inside: small here, where prompts are a few hundred tokens.
    let gap = trace.ideal_hit_ratio - summary.ideal_hit_ratio;
    assert!((0.0..0.08).contains(&gap), "{summary}");
    assert_eq!(
        summary.uncached_tokens, summary.ideal_uncached_tokens,
        "{summary}"
    );
    // 1400 tokens ÷ 4, the chat template's markers besides.
    let first = summary.prompt_tokens;
    assert!(first > (9600 / 4) as u64, "{summary}");
    std::fs::remove_file(&path).unwrap();
    stop.cancel();
}

#[test]
fn a_trace_replaces_the_synthetic_options_and_is_checked() {
    let path = small_trace("options");
    let parse = |extra: &[&str]| {
        let trace = path.to_str().unwrap();
        let mut argv = vec!["workload", "--url", "http://127.0.0.1:1", "--trace", trace];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).map(|c| c.args)
    };
    assert!(parse(&["--turns", "3"]).is_err());
    assert!(parse(&["--token-scale", "3"]).unwrap().validate().is_err());
    assert!(parse(&["--speedup", "0"]).unwrap().validate().is_err());
    assert!(parse(&["--token-scale", "16"]).unwrap().validate().is_ok());
    let missing = parse(&[]).map(|mut a| {
        a.trace = Some("/nonexistent/trace.jsonl".into());
        a
    });
    let e = replay::Replay::load(&missing.unwrap()).err().unwrap();
    assert!(e.to_string().contains("/nonexistent/trace.jsonl"), "{e}");
    std::fs::remove_file(&path).unwrap();
}
