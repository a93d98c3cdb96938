//! `magpie demo` in mode http: three simulated inference engines
//! ([`crate::engine`]) behind magpie, keyed by session (header, body
//! field, or the conversation itself), with session pins, bounded load and
//! the engines' own load; and `magpie demo --load`, a short multi-turn
//! workload ([`crate::workload`]) through magpie as `config/llm-sessions.yaml`
//! ships ([`shipped_yaml`]) and through round robin over the same kind of
//! engines, then a scale-up from 3 to 4 replicas with and without session
//! pins.
//!
//! Every run starts fresh engines (empty caches), so the rows compare
//! routing alone. The engines are faster than `bench/llm`'s (a demo should
//! take seconds), with caches small enough that routing shows.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::Parser;
use tokio_util::sync::CancellationToken;

use super::SESSION_HEADER;
use crate::engine::{self, EngineConfig, EngineError};
use crate::workload::{self, Summary, WorkloadArgs, WorkloadError};

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("cannot start a demo engine: {0}")]
    Engine(#[from] EngineError),
    #[error("the demo workload failed: {0}")]
    Workload(#[from] WorkloadError),
    #[error("cannot start magpie: {0}")]
    Magpie(String),
    #[error("cannot write the demo's config in {dir}: {source}")]
    Config {
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// Starts `n` engines named `r1`, `r2`, ... on loopback; they stop with `stop`.
pub async fn start_engines(
    n: usize,
    stop: &CancellationToken,
) -> Result<Vec<(String, SocketAddr)>, EngineError> {
    let mut engines = Vec::new();
    for i in 1..=n {
        let config = engine_config(&format!("r{i}"));
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let engine = engine::start(config, loopback, stop.clone()).await?;
        engines.push((format!("r{i}"), engine.addr()));
    }
    Ok(engines)
}

/// A demo engine named `name`: faster than `bench/llm`'s (a demo should
/// take seconds), its cache small enough that routing shows.
pub fn engine_config(name: &str) -> EngineConfig {
    EngineConfig {
        name: name.to_string(),
        prefill_us_per_token: 40.0,
        decode_ms_per_token: 2.0,
        cache_blocks: 1500,
        ..EngineConfig::default()
    }
}

/// The demo's config: mode http, keyed by `x-session-id`, else the body's
/// `prompt_cache_key`, else the conversation's head; bounded load, engine
/// load from the engines' vLLM-style metrics, and pins when `sessions`.
pub fn config_yaml(
    listen: SocketAddr,
    admin: SocketAddr,
    engines: &[(String, SocketAddr)],
    sessions: bool,
) -> String {
    let sessions = if sessions {
        "sessions: {ttl: 30m}\n"
    } else {
        ""
    };
    let mut yaml = format!(
        "mode: http\nlisten: \"{listen}\"\nadmin: \"{admin}\"\nmax_connections: 1000\n\
         key:\n  from: conversation\n  header: {SESSION_HEADER}\n  body_field: prompt_cache_key\n\
         placement:\n  bounded_load: 1.25\n\
         health:\n  http_path: /health\n  load: {{preset: vllm, interval: 200ms}}\n\
         http:\n  expose_backend: true\n{sessions}backends:\n"
    );
    for (name, addr) in engines {
        yaml.push_str(&format!("  - name: {name}\n    addr: \"{addr}\"\n"));
    }
    yaml
}

/// `config/llm-sessions.yaml` as shipped: what `magpie demo --load` runs.
const SHIPPED: &str = include_str!("../../../../config/llm-sessions.yaml");

/// [`SHIPPED`] with the demo's addresses and `engines`, its access log left
/// out (a line per request on stderr), and without `sessions` its pins and
/// `key.group` (which needs them) left out too.
pub fn shipped_yaml(
    listen: SocketAddr,
    admin: SocketAddr,
    engines: &[(String, SocketAddr)],
    sessions: bool,
) -> String {
    let mut yaml = String::new();
    let mut skipping = false;
    for line in SHIPPED.lines() {
        if line.starts_with(|c: char| c.is_ascii_alphabetic()) {
            skipping =
                line.starts_with("access_log:") || (!sessions && line.starts_with("sessions:"));
        }
        let group = !sessions && line.trim_start().starts_with("group:");
        match line {
            _ if line.starts_with("backends:") => break,
            _ if line.starts_with("listen:") => yaml.push_str(&format!("listen: \"{listen}\"\n")),
            _ if line.starts_with("admin:") => yaml.push_str(&format!("admin: \"{admin}\"\n")),
            _ if skipping || group => {}
            _ => {
                yaml.push_str(line);
                yaml.push('\n');
            }
        }
    }
    yaml.push_str("backends:\n");
    for (name, addr) in engines {
        yaml.push_str(&format!("  - name: {name}\n    addr: \"{addr}\"\n"));
    }
    yaml
}

/// The workload of one `--load` run, `seconds` long at most.
fn workload(urls: &[String], key: &str, extra: &[String]) -> WorkloadArgs {
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: WorkloadArgs,
    }
    let urls = urls.join(",");
    let mut argv: Vec<String> = [
        "workload",
        "--url",
        &urls,
        "--key",
        key,
        "--conversations",
        "36",
        "--turns",
        "4",
        "--system-prompts",
        "6",
        "--system-tokens",
        "600",
        "--user-tokens",
        "120",
        "--max-tokens",
        "16",
        "--rate",
        "12",
        "--think-ms",
        "300",
        "--max-seconds",
        "20",
        "--connections",
        "16",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    argv.extend_from_slice(extra);
    Cli::parse_from(argv).args
}

/// One magpie run: fresh engines (and a spare), magpie from a config file in
/// `dir`, the workload through it; with `scale_up`, the spare is added half
/// way by rewriting the file (magpie reloads it).
async fn through_magpie(dir: &Path, sessions: bool, scale_up: bool) -> Result<Summary, DemoError> {
    let stop = CancellationToken::new();
    let mut engines = start_engines(4, &stop).await?;
    let spare = engines.pop().into_iter().collect::<Vec<_>>();
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let path = dir.join(format!("demo-{sessions}-{scale_up}.yaml"));
    let write = |path: &Path, text: String| {
        std::fs::write(path, text).map_err(|source| DemoError::Config {
            dir: dir.to_path_buf(),
            source,
        })
    };
    write(&path, shipped_yaml(any, any, &engines, sessions))?;
    let config =
        magpie_proxy::config::Config::load(&path).map_err(|e| DemoError::Magpie(e.to_string()))?;
    let running = magpie_proxy::app::start(config, stop.clone())
        .await
        .map_err(|e| DemoError::Magpie(e.to_string()))?;
    let url = format!("http://{}", running.listen[0]);
    let mut extra = Vec::new();
    if scale_up {
        let all: Vec<_> = engines.iter().chain(&spare).cloned().collect();
        let next = dir.join(format!("next-{sessions}.yaml"));
        write(&next, shipped_yaml(any, any, &all, sessions))?;
        let cmd = format!("cp '{}' '{}'", next.display(), path.display());
        extra = vec![
            "--scale-up-at".into(),
            "3".into(),
            "--scale-up-cmd".into(),
            cmd,
        ];
    }
    let summary = workload::run(&workload(&[url], "header", &extra)).await;
    stop.cancel();
    running.wait().await;
    Ok(summary?)
}

/// Round robin: the workload alternates over fresh engines itself.
async fn round_robin() -> Result<Summary, DemoError> {
    let stop = CancellationToken::new();
    let engines = start_engines(3, &stop).await?;
    let urls: Vec<String> = engines.iter().map(|(_, a)| format!("http://{a}")).collect();
    let summary = workload::run(&workload(&urls, "none", &[])).await;
    stop.cancel();
    Ok(summary?)
}

/// `magpie demo --load`: runs the comparison, saying on stderr what runs
/// now, and returns the table to print.
pub async fn load(dir: &Path) -> Result<String, DemoError> {
    let step = |what: &str| eprintln!("magpie demo --load: {what}");
    step("1/4 round robin over three fresh replicas");
    let rr = round_robin().await?;
    step(
        "2/4 magpie as config/llm-sessions.yaml ships (its addresses and access log aside) over three fresh replicas",
    );
    let mg = through_magpie(dir, true, false).await?;
    step(
        "3/4 the same without session pins (nor key.group, which needs them), a fourth replica added 3 s in",
    );
    let stateless = through_magpie(dir, false, true).await?;
    step("4/4 magpie with session pins, a fourth replica added 3 s in");
    let pinned = through_magpie(dir, true, true).await?;
    Ok(table(&rr, &mg, &stateless, &pinned))
}

fn table(rr: &Summary, mg: &Summary, stateless: &Summary, pinned: &Summary) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} conversations x {} turns, 6 shared system prompts, one keep-alive pool\n",
        mg.conversations, mg.turns
    );
    let _ = writeln!(
        out,
        "| router | prefix-cache hit ratio | prefill ÷ ideal | TTFT p50 / p99 | split conversations |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|");
    for (name, s) in [("round robin", rr), ("magpie", mg)] {
        let _ = writeln!(
            out,
            "| {name} | {:.3} | {:.2} | {:.0} / {:.0} ms | {} of {} |",
            s.hit_ratio,
            s.prefill_vs_ideal,
            s.ttft_p50_ms,
            s.ttft_p99_ms,
            s.split_conversations,
            s.multi_turn_conversations
        );
    }
    let moved = |s: &Summary| {
        s.scale_up.as_ref().map_or("–".to_string(), |u| {
            format!("{} of {}", u.moved, u.live_conversations)
        })
    };
    let _ = writeln!(
        out,
        "\nscale-up 3 -> 4 replicas: live conversations moved: {} without sessions, {} with sessions",
        moved(stateless),
        moved(pinned)
    );
    out
}
