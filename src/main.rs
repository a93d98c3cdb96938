//! The `magpie` command line. `anyhow` lives here only.

#![deny(unsafe_code)]

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use magpie_proxy::Snapshot;
use magpie_proxy::config::Config;

#[derive(Parser)]
#[command(
    name = "magpie",
    version,
    about = "A consistent-hash load balancer, per TCP connection or per HTTP request"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy from a config file.
    Run {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Validate a config file and print what it would build.
    Check {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Start three simulated inference replicas and magpie in front of them
    /// (mode http), or with --mode tcp three HTTP backends keyed per connection.
    Demo {
        /// http: one key per request (x-session-id, else the prompt_cache_key
        /// of a JSON body, else the conversation), in front of simulated
        /// engines; disaggregated: the same in front of two simulated prefill
        /// and two decode engines (config/disaggregated.yaml); tcp: one key
        /// per connection, in front of plain backends.
        #[arg(long, value_enum, default_value_t = DemoMode::Http)]
        mode: DemoMode,
        /// Run a short multi-turn workload through magpie and through round
        /// robin, then a scale-up, and print the comparison (about 30 s).
        #[arg(long)]
        load: bool,
        /// Where magpie listens.
        #[arg(long, default_value = "127.0.0.1:7000")]
        listen: SocketAddr,
        /// The admin/metrics endpoint.
        #[arg(long, default_value = magpie_proxy::config::DEFAULT_ADMIN)]
        admin: SocketAddr,
    },
    /// Print the backend a running magpie would choose for each key, all backends up.
    Lookup {
        #[arg(long, short)]
        config: PathBuf,
        /// Also print the candidate list, in order.
        #[arg(short, long)]
        verbose: bool,
        /// The keys are client addresses (ip or ip:port): print where such a
        /// client goes when its request carries no key (the fallback key in
        /// header and body modes).
        #[arg(long)]
        addr: bool,
        /// Keys as text: header values, or IPs or ip:port (source_ip), or ip:port (source_addr).
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Measure how hashing schemes move keys and balance load when a pool changes.
    Simulate(magpie_lab::simulate::SimulateArgs),
    /// Show what changing OLD into NEW would move, before reloading.
    Plan {
        old: PathBuf,
        new: PathBuf,
        /// A file with one key per line (e.g. session IDs): report how many move.
        #[arg(long)]
        keys: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// A simulated OpenAI-compatible inference engine (prefix cache, prefill and decode times).
    Engine(magpie_lab::engine::EngineArgs),
    /// Multi-turn chats against OpenAI-compatible URLs: cache hits, prefill against the ideal, TTFT, splits.
    Workload(Box<magpie_lab::workload::WorkloadArgs>),
    /// A UDP echo server, or a UDP load against one through a proxy (bench/udp).
    #[command(subcommand)]
    Datagrams(magpie_lab::datagrams::DatagramsCommand),
    /// GET an http://host:port/path URL; exit 0 on a 2xx answer, else 1 (for health checks).
    Probe {
        url: String,
        /// How long the connect and the answer may take together.
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
    },
}

/// `demo --mode`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum DemoMode {
    Tcp,
    Http,
    /// Two prefill and two decode engines, `config/disaggregated.yaml`.
    Disaggregated,
}

/// jemalloc, with a background thread that gives freed memory back to the
/// system within seconds (Cargo.toml says why this allocator).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Sockets systemd passed, read (and their variables cleared) while
    // this is the only thread.
    let inherited = match cli.command {
        Command::Run { .. } => Some(magpie_proxy::Inherited::from_env()),
        _ => None,
    };
    let purging = tikv_jemalloc_ctl::background_thread::write(true);
    init_logging(&cli.command);
    if let Err(error) = purging {
        tracing::warn!(%error, "the allocator's background thread did not start: freed memory goes back to the system only while magpie allocates");
    }
    magpie_proxy::install_panic_hook();
    let result = match cli.command {
        Command::Check { config } => check(&config),
        Command::Run { config } => (inherited.unwrap_or_else(|| Ok(Default::default())))
            .map_err(anyhow::Error::from)
            .and_then(|inherited| runtime().and_then(|rt| rt.block_on(run(config, inherited)))),
        Command::Demo {
            mode,
            load,
            listen,
            admin,
        } => runtime().and_then(|rt| {
            rt.block_on(async {
                match (mode, load) {
                    (_, true) => demo_load().await,
                    (DemoMode::Http, false) => llm_demo(listen, admin).await,
                    (DemoMode::Disaggregated, false) => pd_demo(listen, admin).await,
                    (DemoMode::Tcp, false) => {
                        demo(magpie_proxy::config::Mode::Tcp, listen, admin).await
                    }
                }
            })
        }),
        Command::Lookup {
            config,
            verbose,
            addr,
            keys,
        } => lookup(&config, Lookup { verbose, addr }, &keys),
        Command::Simulate(args) => magpie_lab::simulate::main(&args)
            .map(|()| ExitCode::SUCCESS)
            .map_err(anyhow::Error::from),
        Command::Plan {
            old,
            new,
            keys,
            json,
        } => plan(&old, &new, keys.as_deref(), json),
        Command::Engine(args) => runtime().and_then(|rt| {
            rt.block_on(async {
                let stop = shutdown_on_signals()?;
                magpie_lab::engine::main(&args, stop).await?;
                Ok(ExitCode::SUCCESS)
            })
        }),
        Command::Workload(args) => runtime().and_then(|rt| {
            rt.block_on(magpie_lab::workload::main(&args))?;
            Ok(ExitCode::SUCCESS)
        }),
        Command::Datagrams(command) => magpie_lab::datagrams::main(&command)
            .map(|()| ExitCode::SUCCESS)
            .map_err(anyhow::Error::from),
        Command::Probe { url, timeout } => Ok(magpie_proxy::probe::run(&url, timeout)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("magpie: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr, at `RUST_LOG`'s levels (info by default).
fn init_logging(command: &Command) {
    // The demo's comparison prints a table: four magpies starting and
    // stopping are not news there.
    let level = match command {
        Command::Demo { load: true, .. } => "warn",
        _ => "info",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// One worker thread per CPU magpie may run on. Given a single CPU (a
/// container limit, `taskset`), the runtime is a single-threaded one: the
/// same work without the cross-thread queues and wakeups of a scheduler that
/// has no other thread to hand work to.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut builder = if cpus == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    builder
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Writes a command's output to stdout. A closed stdout (`magpie check | head`)
/// ends the command quietly: the reader has what it wanted.
fn emit(text: &str) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(e) => Err(anyhow::Error::from(e).context("cannot write to stdout")),
        Ok(()) => Ok(ExitCode::SUCCESS),
    }
}

fn check(path: &std::path::Path) -> anyhow::Result<ExitCode> {
    let Some(snapshot) = build(path)? else {
        return Ok(ExitCode::FAILURE);
    };
    let env = magpie_proxy::check::Environment::detect();
    emit(&magpie_proxy::check::report(
        &path.display().to_string(),
        &snapshot,
        env,
    )?)
}

/// Loads and builds a config, or prints its errors.
fn build(path: &std::path::Path) -> anyhow::Result<Option<Snapshot>> {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{errors}");
            return Ok(None);
        }
    };
    // `dns` and `srv` entries are resolved as `run` would.
    let config = if config.discovery.is_some() {
        let discovery = magpie_proxy::Discovery::default();
        runtime()?
            .block_on(discovery.expand(config))
            .with_context(|| format!("{}", path.display()))?
    } else {
        config
    };
    let snapshot = Snapshot::of(Arc::new(config)).with_context(|| format!("{}", path.display()))?;
    Ok(Some(snapshot))
}

/// How `lookup` reads and prints its keys.
struct Lookup {
    verbose: bool,
    /// The keys are client addresses.
    addr: bool,
}

fn lookup(path: &std::path::Path, how: Lookup, keys: &[String]) -> anyhow::Result<ExitCode> {
    let Some(snapshot) = build(path)? else {
        return Ok(ExitCode::FAILURE);
    };
    let verbose = how.verbose;
    let mut out = String::new();
    for text in keys {
        let key = if how.addr {
            snapshot.config.key.key_of_address(text)?
        } else {
            snapshot.config.key.key_of_text(text)?
        };
        let mut candidates = snapshot.candidates(key);
        let Some(primary) = candidates.next() else {
            anyhow::bail!("the table has no backend for {text:?}");
        };
        writeln!(out, "{text}\t{}\t{}", primary.name, primary.addr)?;
        if verbose {
            writeln!(out, "  hash {key:#018x}; candidates in order:")?;
            writeln!(out, "    1. {} ({})", primary.name, primary.addr)?;
            for (i, b) in candidates.enumerate() {
                writeln!(out, "    {}. {} ({})", i + 2, b.name, b.addr)?;
            }
        }
    }
    emit(&out)
}

fn plan(
    old: &std::path::Path,
    new: &std::path::Path,
    keys: Option<&std::path::Path>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let (Some(old), Some(new)) = (build(old)?, build(new)?) else {
        return Ok(ExitCode::FAILURE);
    };
    let keys: Vec<String> = match keys {
        Some(path) => magpie_proxy::config::file::read_keys(path)
            .with_context(|| format!("--keys {}", path.display()))?
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect(),
        None => Vec::new(),
    };
    let report = magpie_lab::plan::compare(&old, &new, &keys)?;
    if json {
        emit(&format!("{}\n", serde_json::to_string_pretty(&report)?))
    } else {
        emit(&report.to_string())
    }
}

/// Cancels the returned token on SIGTERM or SIGINT.
fn shutdown_on_signals() -> anyhow::Result<CancellationToken> {
    use tokio::signal::unix::{SignalKind, signal};
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let t = token.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down (a second signal exits at once)"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down (a second signal exits at once)"),
        }
        t.cancel();
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::warn!(
            "second signal: exiting now with status {EXIT_CUT}; open connections are cut"
        );
        std::process::exit(i32::from(EXIT_CUT));
    });
    Ok(token)
}

async fn run(path: PathBuf, inherited: magpie_proxy::Inherited) -> anyhow::Result<ExitCode> {
    let config = match Config::load(&path) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{errors}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let shutdown = shutdown_on_signals()?;
    let running = magpie_proxy::app::start_with(config, shutdown, inherited).await?;
    let drained = running.wait().await;
    if drained.is_clean() {
        Ok(ExitCode::SUCCESS)
    } else {
        tracing::warn!(
            cut = drained.cut,
            "exiting with status {EXIT_CUT}: connections were cut"
        );
        Ok(ExitCode::from(EXIT_CUT))
    }
}

/// Exit status when open connections were cut: the shutdown grace ran out,
/// or a second SIGTERM/SIGINT asked for an immediate exit. (1 is a config or
/// start error; 0 a clean shutdown.)
const EXIT_CUT: u8 = 2;

/// `magpie demo --load`: the comparison, printed as a table.
async fn demo_load() -> anyhow::Result<ExitCode> {
    let dir = std::env::temp_dir().join(format!("magpie-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let table = magpie_lab::demo::llm::load(&dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    emit(&table?)
}

/// `magpie demo`: three simulated inference replicas behind magpie in mode
/// http, and what to try.
async fn llm_demo(listen: SocketAddr, admin: SocketAddr) -> anyhow::Result<ExitCode> {
    let shutdown = shutdown_on_signals()?;
    let engines = magpie_lab::demo::llm::start_engines(3, &shutdown).await?;
    let yaml = magpie_lab::demo::llm::config_yaml(listen, admin, &engines, true);
    let running = start_demo(&yaml, shutdown).await?;
    let (at, admin) = (running.listen[0], running.admin.unwrap_or(admin));
    let chat = |extra: &str, body_key: &str| {
        format!(
            "  curl -s http://{at}/v1/chat/completions -H 'content-type: application/json' {extra}\\\n    -d '{{\"model\": \"m\",{body_key} \"messages\": [{{\"role\": \"system\", \"content\": \"You are terse.\"}}, {{\"role\": \"user\", \"content\": \"hi\"}}]}}'"
        )
    };
    let mut out = String::new();
    writeln!(
        out,
        "magpie demo: three simulated inference replicas (prefix caches, vLLM-style /metrics) behind magpie on {at}, mode http.\n"
    )?;
    writeln!(out, "The config it runs:\n\n{yaml}")?;
    writeln!(
        out,
        "Try (the answer's x-magpie-backend header names the replica; usage.prompt_tokens_details.cached_tokens shows its cache):\n"
    )?;
    writeln!(out, "{}", chat("-H 'x-session-id: conv-1' -i ", ""))?;
    writeln!(out, "{}", chat("-i ", " \"prompt_cache_key\": \"conv-2\","))?;
    writeln!(
        out,
        "{}   # no key: the conversation's head is the key",
        chat("-i ", "")
    )?;
    writeln!(
        out,
        "  curl -s 'http://{admin}/route?key=conv-1'        # where conv-1 goes, and why"
    )?;
    writeln!(
        out,
        "  curl -s http://{admin}/metrics | grep -E 'tokens_total|routed_total'   # realized hits per replica\n"
    )?;
    writeln!(
        out,
        "magpie demo --load compares magpie with round robin on a short multi-turn workload."
    )?;
    writeln!(out, "Press Ctrl-C to stop.")?;
    emit(&out)?;
    running.wait().await;
    Ok(ExitCode::SUCCESS)
}

/// magpie running a demo's `yaml` until `shutdown`.
async fn start_demo(
    yaml: &str,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<magpie_proxy::app::Running> {
    let config =
        Config::parse(std::path::Path::new("<demo>"), yaml).map_err(|e| anyhow::anyhow!("{e}"))?;
    magpie_proxy::app::start(config, shutdown)
        .await
        .context("cannot start magpie (a port taken? choose others with --listen and --admin)")
}

async fn pd_demo(listen: SocketAddr, admin: SocketAddr) -> anyhow::Result<ExitCode> {
    use magpie_lab::demo::disaggregated;
    let shutdown = shutdown_on_signals()?;
    let engines = disaggregated::start_engines(&shutdown).await?;
    let yaml = disaggregated::shipped_yaml(listen, admin, &engines);
    let running = start_demo(&yaml, shutdown).await?;
    let (at, admin) = (running.listen[0], running.admin.unwrap_or(admin));
    let mut out = String::new();
    writeln!(
        out,
        "magpie demo: two simulated prefill engines and two decode engines behind magpie on {at}, config/disaggregated.yaml as it ships.\n"
    )?;
    writeln!(out, "The config it runs:\n\n{yaml}")?;
    writeln!(
        out,
        "Try (the first turn is split: its prefill on a prefill engine, its KV pulled by the conversation's decode engine; a short next turn goes to that decode engine alone):\n"
    )?;
    let long = "Tell me about magpies. ".repeat(80);
    writeln!(
        out,
        "  curl -s http://{at}/v1/chat/completions -H 'content-type: application/json' -H 'x-session-id: conv-1' -i \\\n    -d '{{\"model\": \"m\", \"messages\": [{{\"role\": \"user\", \"content\": \"{long}\"}}]}}'"
    )?;
    writeln!(
        out,
        "  curl -s http://{admin}/metrics | grep -E 'disaggregation_requests_total|backend_role'"
    )?;
    writeln!(out, "  curl -s http://{admin}/table    # both pools\n")?;
    writeln!(out, "Press Ctrl-C to stop.")?;
    emit(&out)?;
    running.wait().await;
    Ok(ExitCode::SUCCESS)
}

async fn demo(
    mode: magpie_proxy::config::Mode,
    listen: SocketAddr,
    admin: SocketAddr,
) -> anyhow::Result<ExitCode> {
    use magpie_proxy::config::Mode;
    let shutdown = shutdown_on_signals()?;
    let mut backends = Vec::new();
    for name in ["demo-a", "demo-b", "demo-c"] {
        let addr =
            magpie_lab::demo::tcp::start_backend(name, "127.0.0.1:0".parse()?, shutdown.clone())
                .await
                .with_context(|| format!("cannot start demo backend {name}"))?;
        backends.push((name.to_string(), addr));
    }
    let yaml = magpie_lab::demo::tcp::config_yaml(mode, listen, admin, &backends);
    let config =
        Config::parse(std::path::Path::new("<demo>"), &yaml).map_err(|e| anyhow::anyhow!("{e}"))?;
    let running = magpie_proxy::app::start(config, shutdown)
        .await
        .context("cannot start magpie (a port taken? choose others with --listen and --admin)")?;
    let at = running.listen[0];
    let mut out = String::new();
    let keyed = match mode {
        Mode::Tcp | Mode::Udp => "each connection keyed by its x-session-id header",
        Mode::Http => {
            "each request keyed by its x-session-id header, else the prompt_cache_key of its JSON body"
        }
    };
    writeln!(
        out,
        "magpie demo: three HTTP backends behind magpie on {at}, {keyed}.\n"
    )?;
    writeln!(out, "The config it runs:\n\n{yaml}")?;
    writeln!(
        out,
        "Try (the same session always lands on the same backend):\n"
    )?;
    writeln!(out, "  curl -s -H 'x-session-id: alice' http://{at}/")?;
    writeln!(out, "  curl -s -H 'x-session-id: bob'   http://{at}/")?;
    writeln!(
        out,
        "  for i in $(seq 1 9); do curl -s -H \"x-session-id: user-$i\" http://{at}/ | head -1; done"
    )?;
    if mode == Mode::Http {
        writeln!(
            out,
            "  curl -s http://{at}/ -H 'content-type: application/json' -d '{{\"prompt_cache_key\": \"alice\"}}'"
        )?;
        writeln!(
            out,
            "  curl -s -H 'x-session-id: a' http://{at}/ -: -H 'x-session-id: b' http://{at}/   # one connection, two sessions"
        )?;
    }
    writeln!(
        out,
        "  curl -s http://{at}/        # no key: keyed by your source IP\n"
    )?;
    writeln!(out, "Press Ctrl-C to stop.")?;
    emit(&out)?;
    running.wait().await;
    Ok(ExitCode::SUCCESS)
}
